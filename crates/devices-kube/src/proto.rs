//! The Kubernetes device plugin API v1beta1: generated messages, clients and servers
//! ([`v1beta1`]), and the protocol's constants.

use std::time::Duration;

/// Generated messages, `Registration` and `DevicePlugin` clients and servers (package
/// `v1beta1`, from `proto/deviceplugin_v1beta1.proto`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version this crate speaks, as plugins send it in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";

/// Every version a `Register` may name.
pub const SUPPORTED_VERSIONS: &[&str] = &[VERSION];

/// The name of the registration socket in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// Where kubelet keeps device plugin sockets, and where plugins look for `kubelet.sock`.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";

/// `Device.health` of a device that can be given out.
pub const HEALTHY: &str = "Healthy";

/// `Device.health` of a device that cannot.
pub const UNHEALTHY: &str = "Unhealthy";

/// Kubelet's deadline for `PreStartContainer`.
pub const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
