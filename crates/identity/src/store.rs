//! Where the key set lives between runs.

use std::fmt;
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::KeyStoreError;

/// Persistence of the serialized key set (one opaque value holding private keys).
///
/// Implementations must keep the bytes private to the agent and must make `save` atomic:
/// after a crash, `load` returns either the previous bytes or the new ones, never a mix.
pub trait KeyStore: Send + Sync {
    /// The saved bytes, or `None` if nothing was ever saved.
    fn load(&self) -> Result<Option<Vec<u8>>, KeyStoreError>;

    /// Replaces the saved bytes. Once it returns `Ok`, they survive a crash.
    fn save(&self, bytes: &[u8]) -> Result<(), KeyStoreError>;
}

impl<T: KeyStore + ?Sized> KeyStore for Arc<T> {
    fn load(&self) -> Result<Option<Vec<u8>>, KeyStoreError> {
        (**self).load()
    }

    fn save(&self, bytes: &[u8]) -> Result<(), KeyStoreError> {
        (**self).save(bytes)
    }
}

#[derive(Default)]
struct MemoryState {
    bytes: Option<Vec<u8>>,
    fail_saves: bool,
    saves: usize,
}

/// An in-memory [`KeyStore`] for tests. Clones share the same contents, so a test can keep a
/// handle while a [`Signer`](crate::Signer) owns another.
#[derive(Clone, Default)]
pub struct MemoryKeyStore {
    state: Arc<Mutex<MemoryState>>,
}

impl MemoryKeyStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that already holds `bytes` (for instance a corrupt key set).
    pub fn with_bytes(bytes: Vec<u8>) -> Self {
        let store = Self::default();
        store.lock().bytes = Some(bytes);
        store
    }

    /// What the store holds now.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        self.lock().bytes.clone()
    }

    /// Makes every later `save` fail (`true`) or succeed again (`false`).
    pub fn fail_saves(&self, fail: bool) {
        self.lock().fail_saves = fail;
    }

    /// How many saves succeeded.
    pub fn save_count(&self) -> usize {
        self.lock().saves
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl KeyStore for MemoryKeyStore {
    fn load(&self) -> Result<Option<Vec<u8>>, KeyStoreError> {
        Ok(self.bytes())
    }

    fn save(&self, bytes: &[u8]) -> Result<(), KeyStoreError> {
        let mut state = self.lock();
        if state.fail_saves {
            return Err(KeyStoreError::Backend {
                what: "memory store refuses saves".to_owned(),
                source: Box::new(std::io::Error::other("save failure injected by the test")),
            });
        }
        state.bytes = Some(bytes.to_vec());
        state.saves += 1;
        Ok(())
    }
}

impl fmt::Debug for MemoryKeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("MemoryKeyStore")
            .field("stored_len", &state.bytes.as_ref().map(Vec::len))
            .field("fail_saves", &state.fail_saves)
            .field("saves", &state.saves)
            .finish()
    }
}

/// A [`KeyStore`] over one file, mode 0600, replaced atomically (write a sibling temporary
/// file, fsync it, rename it over the target, fsync the directory). The directory must exist.
#[derive(Debug, Clone)]
pub struct FileKeyStore {
    path: PathBuf,
}

impl FileKeyStore {
    /// A store at `path`. Nothing is touched until `load` or `save`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file this store reads and writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> KeyStoreError {
        let path = path.to_path_buf();
        move |source| KeyStoreError::Io { path, op, source }
    }

    fn write_temp(tmp: &Path, bytes: &[u8]) -> Result<(), KeyStoreError> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(Self::io(tmp, "create"))?;
        file.set_permissions(Permissions::from_mode(0o600))
            .map_err(Self::io(tmp, "chmod"))?;
        file.write_all(bytes).map_err(Self::io(tmp, "write"))?;
        file.sync_all().map_err(Self::io(tmp, "sync"))
    }
}

impl KeyStore for FileKeyStore {
    fn load(&self) -> Result<Option<Vec<u8>>, KeyStoreError> {
        match fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::io(&self.path, "read")(e)),
        }
    }

    fn save(&self, bytes: &[u8]) -> Result<(), KeyStoreError> {
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = self
            .path
            .file_name()
            .ok_or_else(|| {
                Self::io(&self.path, "name")(std::io::Error::new(
                    ErrorKind::InvalidInput,
                    "the key store path has no file name",
                ))
            })?
            .to_string_lossy();
        let suffix = crate::keys::hex(&rand::random::<[u8; 6]>());
        let tmp = dir.join(format!(".{name}.{suffix}.tmp"));
        let written = Self::write_temp(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &self.path).map_err(Self::io(&self.path, "rename")));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(Self::io(dir, "sync directory"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_is_empty_then_keeps_what_was_saved_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileKeyStore::new(dir.path().join("identity.json"));
        assert_eq!(store.load().unwrap(), None);
        store.save(b"one").unwrap();
        store.save(b"two").unwrap();
        assert_eq!(store.load().unwrap().as_deref(), Some(&b"two"[..]));
        let mode = fs::metadata(store.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn file_store_save_into_a_missing_directory_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileKeyStore::new(dir.path().join("missing").join("identity.json"));
        let err = store.save(b"x").unwrap_err();
        assert!(
            matches!(err, KeyStoreError::Io { op: "create", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("missing"));
    }

    #[test]
    fn memory_store_debug_shows_only_the_length() {
        let store = MemoryKeyStore::with_bytes(b"secret-bytes".to_vec());
        let shown = format!("{store:?}");
        assert!(!shown.contains("secret"));
        assert!(shown.contains("12"));
    }
}
