//! The node's volume side, as the alloc runner sees it: claim a volume for an alloc (it comes
//! back mounted at a target on the host) and release it.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use berth_csi::model::{AccessMode, AttachmentMode, MountOptions};

use crate::BoxFuture;

/// How an alloc uses a volume it claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeUse {
    /// Claim for reading only.
    pub read_only: bool,
    /// The group's access mode.
    pub access_mode: AccessMode,
    /// The group's attachment mode.
    pub attachment_mode: AttachmentMode,
    /// The group's mount options (`Debug` hides the flags).
    pub mount_options: MountOptions,
}

/// A claim or release failed.
///
/// The message is shown in the alloc's events and status: the implementation must keep mount
/// flags and secrets out of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct VolumeHostError {
    /// Trying again may succeed (the plugin is unavailable, a step is pending…).
    pub retryable: bool,
    /// What went wrong.
    pub message: String,
}

impl VolumeHostError {
    /// A failure worth retrying.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            retryable: true,
            message: message.into(),
        }
    }

    /// A failure that retrying will not fix.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            message: message.into(),
        }
    }
}

/// The agent's volume code: claims (control-plane claim, stage, publish) and releases.
///
/// Both operations must be idempotent for one (volume, alloc): a runner that was interrupted
/// (agent restart, cancellation) sends a claim again or releases a claim whose answer it never
/// saw. A release of a volume the alloc does not hold succeeds.
pub trait VolumeHost: Send + Sync + fmt::Debug {
    /// Claims `volume_id` for `alloc_id` and mounts it; returns the host path where it is
    /// mounted (the source of the tasks' bind mounts).
    fn claim<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
        usage: VolumeUse,
    ) -> BoxFuture<'a, Result<PathBuf, VolumeHostError>>;

    /// Unmounts and releases the claim of `alloc_id` on `volume_id`.
    fn release<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
    ) -> BoxFuture<'a, Result<(), VolumeHostError>>;
}

/// A call made to a [`FakeVolumeHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeCall {
    /// A claim.
    Claim {
        /// The volume.
        volume_id: String,
        /// The alloc.
        alloc_id: String,
        /// How it is used.
        usage: VolumeUse,
    },
    /// A release.
    Release {
        /// The volume.
        volume_id: String,
        /// The alloc.
        alloc_id: String,
    },
}

impl VolumeCall {
    /// The volume the call is about.
    pub fn volume_id(&self) -> &str {
        match self {
            Self::Claim { volume_id, .. } | Self::Release { volume_id, .. } => volume_id,
        }
    }

    /// Whether it is a claim.
    pub fn is_claim(&self) -> bool {
        matches!(self, Self::Claim { .. })
    }
}

type Observer = Arc<dyn Fn(&VolumeCall) + Send + Sync>;

/// An in-memory [`VolumeHost`] for tests: records every call, answers claims with a directory
/// `<root>/<volume id>/<alloc id>` (created on claim) or a target set with
/// [`set_target`](Self::set_target), and fails calls on demand.
#[derive(Default)]
pub struct FakeVolumeHost {
    root: PathBuf,
    inner: Mutex<FakeInner>,
    observer: Mutex<Option<Observer>>,
}

#[derive(Debug, Default)]
struct FakeInner {
    calls: Vec<VolumeCall>,
    targets: BTreeMap<String, PathBuf>,
    claim_failures: BTreeMap<String, VecDeque<VolumeHostError>>,
    release_failures: BTreeMap<String, VecDeque<VolumeHostError>>,
    held: BTreeSet<(String, String)>,
}

impl fmt::Debug for FakeVolumeHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeVolumeHost")
            .field("root", &self.root)
            .field("inner", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl FakeVolumeHost {
    /// A host whose claims mount under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, FakeInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims of `volume_id` answer `target` (created on claim).
    pub fn set_target(&self, volume_id: &str, target: impl Into<PathBuf>) {
        self.lock().targets.insert(volume_id.into(), target.into());
    }

    /// The next `n` claims of `volume_id` fail (retryably or not) with `message`.
    pub fn fail_claims(&self, volume_id: &str, n: usize, retryable: bool, message: &str) {
        let error = VolumeHostError {
            retryable,
            message: message.into(),
        };
        self.lock()
            .claim_failures
            .entry(volume_id.into())
            .or_default()
            .extend(std::iter::repeat_n(error, n));
    }

    /// The next `n` releases of `volume_id` fail (retryably or not) with `message`.
    pub fn fail_releases(&self, volume_id: &str, n: usize, retryable: bool, message: &str) {
        let error = VolumeHostError {
            retryable,
            message: message.into(),
        };
        self.lock()
            .release_failures
            .entry(volume_id.into())
            .or_default()
            .extend(std::iter::repeat_n(error, n));
    }

    /// Calls `observer` with every call, as it is made (before it is answered).
    pub fn observe(&self, observer: impl Fn(&VolumeCall) + Send + Sync + 'static) {
        *self.observer.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(observer));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<VolumeCall> {
        self.lock().calls.clone()
    }

    /// How many claims were made so far.
    pub fn claim_count(&self) -> usize {
        self.lock().calls.iter().filter(|c| c.is_claim()).count()
    }

    /// `(volume id, alloc id)` of the claims held now (claimed and not released).
    pub fn held(&self) -> BTreeSet<(String, String)> {
        self.lock().held.clone()
    }

    fn record(&self, call: VolumeCall) {
        let observer = self
            .observer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(observer) = observer {
            observer(&call);
        }
        self.lock().calls.push(call);
    }

    fn do_claim(
        &self,
        volume_id: &str,
        alloc_id: &str,
        usage: VolumeUse,
    ) -> Result<PathBuf, VolumeHostError> {
        self.record(VolumeCall::Claim {
            volume_id: volume_id.into(),
            alloc_id: alloc_id.into(),
            usage,
        });
        let mut inner = self.lock();
        if let Some(error) = inner
            .claim_failures
            .get_mut(volume_id)
            .and_then(VecDeque::pop_front)
        {
            return Err(error);
        }
        let target = inner
            .targets
            .get(volume_id)
            .cloned()
            .unwrap_or_else(|| self.root.join(volume_id).join(alloc_id));
        std::fs::create_dir_all(&target)
            .map_err(|e| VolumeHostError::fatal(format!("creating {}: {e}", target.display())))?;
        inner.held.insert((volume_id.into(), alloc_id.into()));
        Ok(target)
    }

    fn do_release(&self, volume_id: &str, alloc_id: &str) -> Result<(), VolumeHostError> {
        self.record(VolumeCall::Release {
            volume_id: volume_id.into(),
            alloc_id: alloc_id.into(),
        });
        let mut inner = self.lock();
        if let Some(error) = inner
            .release_failures
            .get_mut(volume_id)
            .and_then(VecDeque::pop_front)
        {
            return Err(error);
        }
        inner.held.remove(&(volume_id.into(), alloc_id.into()));
        Ok(())
    }
}

impl VolumeHost for FakeVolumeHost {
    fn claim<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
        usage: VolumeUse,
    ) -> BoxFuture<'a, Result<PathBuf, VolumeHostError>> {
        Box::pin(async move { self.do_claim(volume_id, alloc_id, usage) })
    }

    fn release<'a>(
        &'a self,
        volume_id: &'a str,
        alloc_id: &'a str,
    ) -> BoxFuture<'a, Result<(), VolumeHostError>> {
        Box::pin(async move { self.do_release(volume_id, alloc_id) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> VolumeUse {
        VolumeUse {
            read_only: false,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
            mount_options: MountOptions::default(),
        }
    }

    #[tokio::test]
    async fn fake_records_fails_on_demand_and_tracks_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = FakeVolumeHost::new(dir.path());
        host.fail_claims("v", 1, true, "busy");
        let err = host.claim("v", "a", usage()).await.unwrap_err();
        assert!(err.retryable);
        assert_eq!(err.to_string(), "busy");
        let target = host.claim("v", "a", usage()).await.expect("claim");
        assert_eq!(target, dir.path().join("v/a"));
        assert!(target.is_dir());
        assert_eq!(host.held().len(), 1);
        host.fail_releases("v", 1, false, "stuck");
        assert!(!host.release("v", "a").await.unwrap_err().retryable);
        host.release("v", "a").await.expect("release");
        assert!(host.held().is_empty());
        assert_eq!(host.claim_count(), 2);
        assert_eq!(host.calls().len(), 4);
    }
}
