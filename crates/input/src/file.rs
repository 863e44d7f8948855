//! Reading user files without surprises: only regular files (a FIFO or a device would block or
//! never end), and never more than a bound.

use std::{
    fs::{File, Metadata},
    io::{self, Read},
    os::unix::fs::FileTypeExt as _,
    path::Path,
};

/// What a non-regular file is, in words; `None` for a regular file.
pub fn not_regular_kind(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

/// Why [`open_regular`] refused a path.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// It is not a regular file (checked before it is opened, and again after).
    #[error("is {0}, not a regular file")]
    NotRegular(&'static str),
    /// The system refused.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Opens `path` only if it is a regular file: its type is checked before the open (so a FIFO
/// or a device is never opened) and on the open file (the path may have changed in between).
/// Also returns its size.
pub fn open_regular(path: &Path) -> Result<(File, u64), OpenError> {
    if let Some(kind) = not_regular_kind(&std::fs::metadata(path)?) {
        return Err(OpenError::NotRegular(kind));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if let Some(kind) = not_regular_kind(&meta) {
        return Err(OpenError::NotRegular(kind));
    }
    Ok((file, meta.len()))
}

/// Up to `limit` bytes of `reader`; `None` when there is more (at most one byte more is read).
pub fn read_bounded(reader: impl Read, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened() {
        for (path, kind) in [("/dev/zero", "a character device"), ("/", "a directory")] {
            match open_regular(Path::new(path)) {
                Err(OpenError::NotRegular(k)) => assert_eq!(k, kind, "{path}"),
                other => panic!("{path}: {other:?}"),
            }
        }
        let err = crate::read_text(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn reads_stop_one_byte_past_the_bound() {
        assert_eq!(read_bounded(&b"abc"[..], 3).unwrap(), Some(b"abc".to_vec()));
        assert_eq!(read_bounded(&b"abcd"[..], 3).unwrap(), None);
        assert_eq!(read_bounded(io::repeat(b'x'), 10).unwrap(), None);
    }
}
