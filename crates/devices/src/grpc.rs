//! gRPC over unix sockets, as both device plugin protocols speak it.

use std::{io, path::Path};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::Channel;

/// A lazily connecting, reconnecting plaintext gRPC channel to the unix socket at `path`
/// (HTTP/2 without TLS, as go-plugin and kubelet's device plugins speak it). Nothing is
/// dialed until the first call.
pub fn unix_channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            UnixStream::connect(&path)
                .await
                .map(TokioIo::new)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        }
    });
    // The URI is required by the API and unused: the connector ignores it.
    tonic::transport::Endpoint::from_static("http://device-plugin.invalid")
        .connect_with_connector_lazy(connector)
}
