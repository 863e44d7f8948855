//! Devices on this node (Nomad's `devicemanager`, rebuilt, and kubelet's device manager beside
//! it): GPUs, FPGAs, USB devices and other accelerators found by device plugins, their health
//! and statistics, and which tasks they are reserved for.
//!
//! This crate holds what does not depend on a plugin protocol:
//!
//! - [`model`]: device groups (vendor, type, name, attributes) and their instances, statistics,
//!   and [`ContainerEdits`](model::ContainerEdits), what a task gets for its devices (env,
//!   mounts, device nodes);
//! - [`attribute`]: Nomad's typed attributes with units (`4 GiB`, `1.5 GHz`), read from text
//!   and compared across units ([`units`] holds the unit table);
//! - [`request`]: device requests (a task's `device` blocks: name, count, constraints,
//!   affinities), whether a device group fits one, and how its affinities score a group;
//! - [`plugin`]: the narrow interface between the device manager and plugin instances of any
//!   protocol ([`PluginSink`](plugin::PluginSink), [`PluginOps`](plugin::PluginOps)); the
//!   protocols live in `berth-devices-nomad` (Nomad's device plugins over go-plugin) and
//!   `berth-devices-kube` (the Kubernetes device plugin API v1beta1).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod assignment;
pub mod attribute;
pub mod cdi;
pub mod class;
pub mod grpc;
pub mod manager;
pub mod model;
pub mod plugin;
pub mod request;
pub mod units;
pub mod view;

use std::{future::Future, pin::Pin};

/// The future returned by the async methods of this crate's traits: boxed so the traits are
/// dyn-compatible, `Send` so it runs on any runtime thread.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use berth_sys::now_ms;
