//! The first prerun hook: wait for the allocs this one replaces (Nomad's previous-alloc
//! watcher), so that they release their volumes before this one claims them.

use std::fmt;

use crate::{BoxFuture, record::AllocSpec};

/// Waiting for upstream allocs failed; the alloc goes on anyway (as after a timeout).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct UpstreamError {
    /// What went wrong.
    pub message: String,
}

/// Knows which allocs an alloc waits for, and waits for them to finish.
pub trait UpstreamWatcher: Send + Sync + fmt::Debug {
    /// Ids of the allocs `alloc` waits for; empty when there is nothing to wait for (then
    /// [`wait`](Self::wait) is not called and no event is made).
    fn upstream(&self, alloc: &AllocSpec) -> Vec<String>;

    /// Returns once every upstream alloc is terminal. The runner bounds it with its
    /// `upstream_timeout` and cancels it when the alloc is stopped or the agent shuts down.
    fn wait<'a>(&'a self, alloc: &'a AllocSpec) -> BoxFuture<'a, Result<(), UpstreamError>>;
}

/// Waits for nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoUpstream;

impl UpstreamWatcher for NoUpstream {
    fn upstream(&self, _alloc: &AllocSpec) -> Vec<String> {
        Vec::new()
    }

    fn wait<'a>(&'a self, _alloc: &'a AllocSpec) -> BoxFuture<'a, Result<(), UpstreamError>> {
        Box::pin(async { Ok(()) })
    }
}
