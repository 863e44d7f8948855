//! Where discovered plugins go: the agent's side of the registration directory.

use std::future::Future;

use crate::DiscoveredPlugin;

/// Receives the plugins found in a [`RegistrationDir`](crate::RegistrationDir).
///
/// Calls for one registration socket never overlap, and for one socket `deregister` always
/// follows a successful `register` of the same [`DiscoveredPlugin`] (compared by value).
/// Calls for different sockets may run concurrently, and two sockets may announce the same
/// plugin name: the sink decides what that means (e.g. refuse the second one).
///
/// The watcher never drops a sink call half-way, not even at shutdown: a sink that may block
/// should watch its own shutdown signal.
pub trait Sink: Send + Sync + 'static {
    /// Register; Err(reason) is reported back to the registrar.
    ///
    /// Called once per registration socket that passed the checks, until that socket is gone
    /// or replaced. On `Err`, the socket is not tried again until it is replaced.
    fn register(
        &self,
        plugin: &DiscoveredPlugin,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// The registration socket went away.
    ///
    /// Called once for a registered plugin whose socket was removed or replaced by another
    /// (in which case the new socket is registered afterwards). Not called at shutdown.
    fn deregister(&self, plugin: &DiscoveredPlugin) -> impl Future<Output = ()> + Send;
}
