//! The Kubernetes device plugin API v1beta1, served as kubelet serves it, so that device
//! plugins written for Kubernetes work with berth unchanged.
//!
//! [`KubeDevices`] serves kubelet's `Registration` service on `<dir>/kubelet.sock`. For each
//! valid `Register` it follows the plugin in a task of its own:
//!
//! 1. dials `<dir>/<endpoint>` and asks `GetDevicePluginOptions` (the options used; a
//!    difference from those sent with `Register` is logged);
//! 2. attaches the plugin to the device manager
//!    ([`PluginSink::attach`](berth_devices::plugin::PluginSink::attach) with
//!    [`PluginId::kubernetes`](berth_devices::plugin::PluginId::kubernetes)`(resource_name)`)
//!    and reports `Ready`;
//! 3. follows `ListAndWatch`: each message becomes `Devices` with one group (vendor = the
//!    resource's domain, type and name = the part after `/`; NUMA nodes as each instance's
//!    locality and as the group attribute `numa_nodes`);
//! 4. checks every `liveness_interval` that the plugin still answers `GetDevicePluginOptions`;
//! 5. when the stream ends or a check fails: `Down`, then re-dials with the restart policy's
//!    backoff for as long as the plugin's socket exists (a plugin restarted in place comes
//!    back without registering again); once the socket is gone: `Down` without a retry, and
//!    the plugin must register again.
//!
//! The manager's calls ([`PluginOps`](berth_devices::plugin::PluginOps)) go to the current
//! connection: `reserve` is `Allocate` (one container request), `preferred` is
//! `GetPreferredAllocation` when the plugin offers it, `pre_start` is `PreStartContainer` when
//! the plugin asks for it. Every answer is checked; everything a plugin sends is treated as
//! untrusted data.
//!
//! The crate also builds `berth-kube-device`, an example plugin written as Kubernetes plugins
//! are (see its `--help`), used by the tests.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod devices;
mod edits;
mod error;
mod instance;
mod ops;
pub mod proto;
mod registration;
mod validate;

pub use devices::NUMA_ATTRIBUTE;
pub use edits::DEFAULT_PERMISSIONS;
pub use error::KubeError;
pub use registration::{KubeConfig, KubeDevices};
pub use validate::{MAX_SOCKET_PATH, RegisterError, ResourceName};
