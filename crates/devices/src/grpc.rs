//! gRPC over unix sockets, as both device plugin protocols speak it: the channel, and what a
//! failed call means to the device manager.

use std::{io, path::Path, time::Duration};

use berth_input::shown_within;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::{Code, Status, transport::Channel};

use crate::plugin::{PluginError, PluginId};

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

/// Most characters of a plugin's error message kept (escaped) in a [`PluginError`] or a line
/// about a failed call.
pub const MAX_MESSAGE_CHARS: usize = 512;

/// Whether `status` says a deadline passed: the plugin's (or a proxy's) `DeadlineExceeded`,
/// or tonic's own enforcement of the request's deadline, which it reports as `Cancelled` with
/// [`tonic::TimeoutExpired`]'s text (the error itself is dropped on the way).
pub fn is_deadline(status: &Status) -> bool {
    match status.code() {
        Code::DeadlineExceeded => true,
        Code::Cancelled => status.message() == tonic::TimeoutExpired(()).to_string(),
        _ => false,
    }
}

/// A status as one line for an error, an event or a log: `Code: message`, the message
/// escaped and cut to [`MAX_MESSAGE_CHARS`]; the code's description when the message is
/// empty.
pub fn status_line(status: &Status) -> String {
    let message = status.message().trim();
    if message.is_empty() {
        format!("{:?}: {}", status.code(), status.code().description())
    } else {
        format!(
            "{:?}: {}",
            status.code(),
            shown_within(message, MAX_MESSAGE_CHARS)
        )
    }
}

/// What a call `call` to `plugin`, sent with deadline `after`, failing with `status` means to
/// the device manager: a deadline that passed ([`is_deadline`]) is
/// [`Timeout`](PluginError::Timeout) after `after`; the transport's `Unavailable` and
/// `Cancelled` are [`Unavailable`](PluginError::Unavailable) (the plugin cannot be reached);
/// any other code is the plugin's answer, [`Refused`](PluginError::Refused) with its message
/// (escaped and cut) and the code.
pub fn plugin_error(
    plugin: &PluginId,
    call: &str,
    after: Duration,
    status: &Status,
) -> PluginError {
    if is_deadline(status) {
        return PluginError::Timeout {
            plugin: plugin.clone(),
            call: call.to_string(),
            after,
        };
    }
    match status.code() {
        Code::Unavailable | Code::Cancelled => PluginError::Unavailable {
            plugin: plugin.clone(),
            reason: format!("{call}: {}", status_line(status)),
        },
        code => {
            let message = status.message().trim();
            PluginError::Refused {
                plugin: plugin.clone(),
                call: call.to_string(),
                message: if message.is_empty() {
                    format!("{} ({code:?})", code.description())
                } else {
                    format!("{} ({code:?})", shown_within(message, MAX_MESSAGE_CHARS))
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin() -> PluginId {
        PluginId::nomad("p")
    }

    #[test]
    fn deadlines_are_recognised_whoever_enforced_them() {
        assert!(is_deadline(&Status::deadline_exceeded("too slow")));
        assert!(is_deadline(&Status::cancelled(
            tonic::TimeoutExpired(()).to_string()
        )));
        assert!(!is_deadline(&Status::cancelled("the caller went away")));
        assert!(!is_deadline(&Status::unavailable("Timeout expired")));
    }

    #[test]
    fn statuses_become_one_escaped_line() {
        assert_eq!(
            status_line(&Status::not_found("no\ndevice\u{202e}")),
            "NotFound: no\\ndevice\\u{202e}"
        );
        assert_eq!(
            status_line(&Status::internal("  ")),
            "Internal: Internal error"
        );
        let long = status_line(&Status::internal("x".repeat(10_000)));
        assert_eq!(
            long.chars().count(),
            "Internal: ".len() + MAX_MESSAGE_CHARS + 1
        );
    }

    #[test]
    fn each_status_maps_to_what_the_manager_needs() {
        let after = Duration::from_secs(3);
        let tonic_timeout = Status::cancelled(tonic::TimeoutExpired(()).to_string());
        for status in [Status::deadline_exceeded("slow"), tonic_timeout] {
            assert_eq!(
                plugin_error(&plugin(), "Reserve", after, &status),
                PluginError::Timeout {
                    plugin: plugin(),
                    call: "Reserve".into(),
                    after
                }
            );
        }
        for status in [
            Status::unavailable("connection refused"),
            Status::cancelled("h2 reset"),
        ] {
            let e = plugin_error(&plugin(), "Reserve", after, &status);
            assert!(
                matches!(&e, PluginError::Unavailable { reason, .. } if reason.starts_with("Reserve: ")),
                "{e}"
            );
        }
        assert_eq!(
            plugin_error(&plugin(), "Allocate", after, &Status::not_found("a\nb")),
            PluginError::Refused {
                plugin: plugin(),
                call: "Allocate".into(),
                message: "a\\nb (NotFound)".into()
            }
        );
        let e = plugin_error(&plugin(), "Allocate", after, &Status::internal(""));
        assert!(
            matches!(&e, PluginError::Refused { message, .. } if message == "Internal error (Internal)"),
            "{e}"
        );
    }
}
