//! Alloc runners and task runners (Nomad's `allocrunner` and `taskrunner`, rebuilt): what
//! runs one placed group on this node, through ordered hooks, with every step persisted.
//!
//! # Order
//!
//! An [`AllocRunner`] runs, in order:
//!
//! 1. prerun hooks: `upstream_allocs` (wait, bounded, for the allocs this one replaces:
//!    [`UpstreamWatcher`]), then `csi` (claim every group volume through the [`VolumeHost`];
//!    `per_alloc` volumes as `source[index]`; retryable failures retried with a bounded,
//!    jittered backoff; a failure fails the alloc), then the [`AllocHook`]s added for the
//!    alloc (a failure fails the alloc);
//! 2. a task runner per task: prestart hooks (`task_dir`: `<alloc dir>/<task>/` and
//!    `<alloc dir>/logs/<task>.stdout|stderr` (with a log collector
//!    ([`AllocDeps::log_collector`]), the base of the rotated `<task>.stdout.0`…); `volume_mounts`: each `volume_mount` as a bind
//!    mount of the volume's target, read-only when the mount or the volume is; `devices`: the
//!    devices the task was assigned at placement, reserved through the [`DeviceHost`] at its
//!    first start — the answer persisted before the start and reused for every later one —
//!    their env merged into the task's (the devices' win, as in Nomad), their mounts added
//!    after the volume mounts, their device nodes given to drivers that take them; then the
//!    [`TaskHook`]s added for the task), start through the task's driver (its handle
//!    persisted before anything else), poststart hooks, then supervision: an exit goes to the
//!    restart policy (attempts within an interval, a delay, then `fail` or `delay`), a batch
//!    task that exits 0 is done;
//! 3. when a stop is asked for ([`AllocRunner::stop`]), a task fails for good, or every task
//!    is dead: stop (each running task gets `SIGTERM`, then `SIGKILL` after its
//!    `kill_timeout`), postrun (the [`AllocHook`]s, then `csi`: release the volumes, once
//!    every task is dead), destroy
//!    (forget every task in its driver).
//!
//! # Persistence and recovery
//!
//! The [`AllocRecord`] (spec, desired state, volume claims and targets, task states and
//! handles, restart counts, which hooks are done, the latest events) is written through an
//! [`AllocStore`] at every step: [`StateAllocStore`] keeps it in the agent's store
//! (`Table::ALLOCS`, keyed by alloc id). After an agent restart, [`AllocRunner::recover`]
//! re-attaches every running task with its driver's `recover`, without restarting it, and
//! does not claim volumes again. A task whose process is gone is restarted under its restart
//! policy only once the agent opens its "servers contacted" gate
//! ([`AllocDeps::servers_contacted`]).
//!
//! # Events
//!
//! Events of the alloc and its tasks ([`AllocEvent`]) are kept in the record, bounded, oldest
//! dropped first; the driver's signal and kill events are copied in when the drivers come from
//! a [`DriverManager`](berth_drivers::DriverManager). They never hold mount flags or secrets:
//! volume errors are shown as the [`VolumeHost`] words them, which must keep those out.
//!
//! An alloc's directory is `<allocs dir>/<alloc id>/`: a working directory per task and
//! `logs/` (so a task named `logs` works in the logs directory). Every directory is 0700.
//!
//! An alloc's directory is laid out as Nomad's: `alloc/` (with `data/` and `tmp/`) shared by
//! its tasks, and per task `<task>/` with `local/`, `secrets/` and `tmp/` (a driver that gives
//! the task a root of its own, `exec`, makes those in the root itself).
//!
//! # Variables
//!
//! [`render_alloc`] fills an alloc's `${…}` references once, when it is placed: Nomad's
//! runtime variables ([`nomad_vars`]), `CSI_ENDPOINT`, the node's `attr.*`, `node.*` and
//! `meta.*` ([`NodeVars`]) and the task's own `env` keys; it also adds the `NOMAD_*`
//! variables to each task's `env`. A runner refuses to start a task whose spec still holds a
//! reference. Tasks also get `BERTH_ALLOC_ID`, `BERTH_ALLOC_INDEX`, `BERTH_JOB_ID`,
//! `BERTH_GROUP_NAME`, `BERTH_TASK_NAME`, `BERTH_ALLOC_DIR` and `BERTH_TASK_DIR` (host paths)
//! in their environment, unless their `env` sets them.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod alloc_runner;
mod config;
mod container;
mod csi_hook;
mod device_host;
mod devices_hook;
mod drivers;
mod error;
mod hooks;
mod record;
mod render;
mod restart;
mod shared;
mod status;
mod store;
mod task_runner;
mod upstream;
mod volume_host;

pub use alloc_runner::AllocRunner;
pub use config::{AllocDeps, Backoff, RunnerConfig, StartSlots};
pub use device_host::{DeviceCall, DeviceHost, FakeDeviceHost, NoDevices};
pub use drivers::TaskDrivers;
pub use error::AllocError;
pub use hooks::{AllocContext, AllocHook, HookError, TaskContext, TaskEvents, TaskHook};
pub use record::{
    AllocEvent, AllocRecord, AllocSpec, ClientStatus, DEFAULT_MAX_EVENTS, DesiredState, EventKind,
    HookProgress, RECORD_VERSION, RestartWindow, TaskRecord, TaskRunState, VolumeState, hook_names,
};
pub use render::{NodeVars, RenderEnv, RenderError, TaskPaths, nomad_vars, render_alloc};
pub use status::{AllocStatus, TaskDeviceSummary, TaskMountSummary, TaskSummary, VolumeSummary};
pub use store::{AllocStore, AllocStoreError, MemoryAllocStore, StateAllocStore};
pub use upstream::{NoUpstream, UpstreamError, UpstreamWatcher};
pub use volume_host::{FakeVolumeHost, VolumeCall, VolumeHost, VolumeHostError, VolumeUse};

/// The future returned by the async methods of this crate's traits: boxed so the traits are
/// dyn-compatible, `Send` so it runs on any runtime thread (the same type as the device
/// traits').
pub use berth_devices::BoxFuture;
