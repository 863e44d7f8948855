//! Nomad's device plugin protocol, natively: berth launches a Nomad device plugin binary as
//! Nomad's client does (go-plugin's handshake, its own process group in berth's plugin slot),
//! checks what it is, applies its configuration schema to the user's config and sets it, then
//! follows its `Fingerprint` and `Stats` streams and reports what it learns to the device
//! manager through [`berth_devices::plugin::PluginSink`]; `Reserve` goes through
//! [`NomadOps`]. Unlike Nomad, a plugin is never given up on: every failure (exit, hang,
//! fingerprint error, configuration refused) is reported as `Down` and retried with backoff.
//!
//! - [`instance`]: [`NomadPlugin`], one supervised plugin;
//! - [`launch`] and [`handshake`]: starting a plugin and reading its handshake line;
//! - [`client`]: the calls, each with a deadline;
//! - [`hclspec`] and [`msgpack`]: the schema applied to the config, and its encoding;
//! - [`convert`]: Nomad's messages in berth's device model; [`ops`]: `Reserve`;
//! - [`layout`]: each plugin's directory under the agent's devices root, and stopping what a
//!   killed agent left running there;
//! - [`proto`]: the generated bindings.
//!
//! Binaries found in `plugin_dir` without a `plugin` block run as
//! [`NomadPlugin`]s too, [marked as found](NomadPluginConfig::found_in_plugin_dir): one that
//! is not a device plugin stops by itself, telling the device manager nothing.
//!
//! The crate also builds `berth-nomad-device`, an example device plugin (files in a directory
//! as devices) that speaks the protocol as a go-plugin server does, for tests.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod convert;
pub mod handshake;
pub mod hclspec;
pub mod instance;
pub mod launch;
pub mod layout;
pub mod msgpack;
pub mod ops;
pub mod proto;
mod text;

pub use client::{CallError, CallFailure, NomadClient, NotADevicePlugin, PluginInfo, PluginKind};
pub use handshake::{DEVICE_API_VERSION, PluginAddress};
pub use instance::{ConfigInvalid, NomadPlugin, NomadPluginConfig};
pub use launch::{LaunchError, LaunchSpec, PluginProcess};
pub use layout::{plugin_dir, stop_leftovers};
pub use ops::NomadOps;
