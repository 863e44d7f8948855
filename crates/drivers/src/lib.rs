//! Task drivers: run a task's process and report on it (Nomad's `drivers` and
//! `drivermanager`, rebuilt).
//!
//! - [`Driver`]: the one trait every driver implements; async methods return boxed futures
//!   ([`DriverFuture`]) so drivers live as `Arc<dyn Driver>`.
//! - [`RawExecDriver`] (`raw_exec`): a plain host process in its own process group.
//! - [`ExecDriver`] (`exec`): the same in a root of its own (its own mount and PID
//!   namespaces) with bind mounts and device nodes ([`TaskDevice`]), in its own cgroup v2 when
//!   the host allows, and with its device access limited to its own nodes by a cgroup v1
//!   `devices` cgroup where the host has that controller.
//! - [`DockerDriver`] (`docker`): Nomad's docker task config ([`ContainerConfig`]) run as a
//!   container through podman and runc.
//! - [`DriverManager`]: fingerprints and health of the drivers, and task events routed to
//!   per-task handlers (held back until a handler registers). Besides what happens to a task,
//!   drivers send [`TaskEventKind::Note`] events: facts of its set-up its events should show.
//!
//! [`Capabilities`] say what a driver honours of a [`TaskConfig`]: a driver without
//! `bind_mounts` or `device_nodes` refuses a task that asks for them (`raw_exec` runs a plain
//! host process, with neither).
//!
//! [`Driver::exec`] runs a command inside a running task ([`ExecRequest`], [`ExecSession`]):
//! `exec` enters its namespaces, root and cgroup, `docker` runs `podman exec`, `raw_exec` runs
//! a plain process in the task's working directory, each as the task's user with its
//! environment.
//!
//! A task's output goes where its [`TaskLogs`] say: two files, nowhere, or through log
//! collectors ([`logs`]) that rotate it into numbered files and outlive the agent.
//!
//! Tasks survive the agent: a [`TaskHandle`] (pid, process start time, boot id) is what the
//! agent persists, and [`Driver::recover`] re-attaches a new driver instance to the running
//! process. A recovered process is not the agent's child, so its exit is seen (through a
//! pidfd, or by polling `/proc`) but its exit status is unknown.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cgroup;
mod devices;
mod docker;
mod driver;
mod error;
mod event;
mod exec;
pub mod logs;
mod manager;
mod procfs;
mod raw_exec;
mod root;
mod router;
mod supervisor;
mod task;
mod task_exec;

pub use cgroup::CgroupSetting;
pub use devices::DevicesCgroupSetting;
pub use docker::{
    ContainerConfig, DOCKER, DockerConfig, DockerDriver, NetworkMode, TmpfsMount, Ulimit,
};
pub use driver::{Capabilities, Driver, DriverFuture, Fingerprint, FsIsolation, Health};
pub use error::DriverError;
pub use event::{EventSink, TaskEvent, TaskEventKind};
pub use exec::{DEFAULT_CHROOT_ENV, EXEC, ExecConfig, ExecDriver};
pub use logs::{LogCollector, LogRotation, RotatedOutput, TaskLogs};
pub use manager::{DriverManager, DriverManagerBuilder, DuplicateDriver, ManagerConfig};
/// Signals, as taken by [`Driver::stop`] and [`Driver::signal`].
pub use nix::sys::signal::Signal;
pub use raw_exec::{RAW_EXEC, RawExecDriver};
pub use supervisor::ProcessConfig;
pub use task::{
    BindMount, ExitResult, HANDLE_VERSION, PidMode, Propagation, Resources, TaskConfig, TaskDevice,
    TaskDirs, TaskHandle, TaskId, TaskState, TaskStats, TaskStatus,
};
pub use task_exec::{
    ExecInput, ExecOutput, ExecProcess, ExecRequest, ExecSession, MAX_EXEC_ARG_BYTES,
    MAX_EXEC_ARGS, Resizer, TerminalSize,
};
