//! The alloc's record: what is persisted at every step, so that a restarted agent picks the
//! alloc up where it was.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fmt,
    path::PathBuf,
    time::SystemTime,
};

use berth_devices::{assignment::DeviceAssignment, model::ContainerEdits};
use berth_drivers::{ExitResult, TaskHandle};
use berth_job::{GroupSpec, JobSpec, JobType};
use serde::{Deserialize, Serialize};

use crate::error::AllocError;

/// The version of [`AllocRecord`]s written by this build.
pub const RECORD_VERSION: u32 = 1;

/// Most events an alloc keeps (the oldest go first) when the runner's config does not say.
pub const DEFAULT_MAX_EVENTS: usize = 100;

/// Names of the built-in hooks, as [`HookProgress`] and [`TaskRecord`] record them.
pub mod hook_names {
    /// Prerun: waits for the allocs this one replaces.
    pub const UPSTREAM_ALLOCS: &str = "upstream_allocs";
    /// Prerun: claims the group's volumes. Postrun: releases them.
    pub const CSI: &str = "csi";
    /// Prestart: the task's directory and log files.
    pub const TASK_DIR: &str = "task_dir";
    /// Prestart: bind mounts of the claimed volumes.
    pub const VOLUME_MOUNTS: &str = "volume_mounts";
    /// Prestart: the task's devices (reserved once, then the same env, mounts and device
    /// nodes at every start).
    pub const DEVICES: &str = "devices";
}

/// What the alloc is: a job's group, placed once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSpec {
    /// The alloc's id; a path segment (it names the alloc's directory).
    pub alloc_id: String,
    /// The job's id.
    pub job_id: String,
    /// The job's type: a batch task that exits 0 is done, a service task is restarted.
    pub job_type: JobType,
    /// The group this alloc runs.
    pub group: GroupSpec,
    /// Which copy of the group (0-based, below its count); picks `per_alloc` volumes.
    pub index: u32,
    /// The devices each task was assigned when the alloc was placed, by task name.
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<DeviceAssignment>>,
}

impl AllocSpec {
    /// The alloc `index` of group `group` of `job`.
    pub fn from_job(
        job: &JobSpec,
        group: &str,
        alloc_id: impl Into<String>,
        index: u32,
    ) -> Result<Self, AllocError> {
        let spec = job.group(group).ok_or_else(|| AllocError::NoGroup {
            job_id: job.id.clone(),
            group: group.to_owned(),
        })?;
        Ok(Self {
            alloc_id: alloc_id.into(),
            job_id: job.id.clone(),
            job_type: job.job_type,
            group: spec.clone(),
            index,
            devices: BTreeMap::new(),
        })
    }
}

/// Whether the alloc should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DesiredState {
    /// Run it.
    Run,
    /// Stop its tasks and release its volumes.
    Stop,
}

/// How the alloc is doing on this node (Nomad's client status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientStatus {
    /// Its prerun hooks (upstream allocs, volume claims) have not finished.
    Pending,
    /// Its tasks were started.
    Running,
    /// Every task finished (exited successfully, or stopped as asked).
    Complete,
    /// A prerun hook or a task failed.
    Failed,
}

impl ClientStatus {
    /// Complete or failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }

    /// `pending`, `running`, `complete` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Complete => "complete",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for ClientStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskRunState {
    /// Not started yet, or waiting to be restarted.
    Pending,
    /// Its prestart hooks run or its driver is starting it (no handle yet).
    Starting,
    /// Its process runs; the record holds its handle.
    Running,
    /// It exited, was stopped or failed, and will not be started again.
    Dead,
}

impl fmt::Display for TaskRunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pending => "pending",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Dead => "dead",
        })
    }
}

/// One group volume of the alloc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeState {
    /// berth's id of the volume claimed (`source`, or `source[index]` with `per_alloc`).
    pub volume_id: String,
    /// Claimed for reading only.
    pub read_only: bool,
    /// A claim was sent (answered or not): the postrun hook releases it.
    pub claim_sent: bool,
    /// The claim succeeded and was not released since.
    pub claimed: bool,
    /// Where the volume is mounted on the host (the claim's answer).
    pub target: Option<PathBuf>,
}

/// When the current restart interval started and how many restarts it counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartWindow {
    /// Start of the interval (wall clock, so it survives the agent).
    pub start: Option<SystemTime>,
    /// Failures counted in it.
    pub count: u32,
}

/// One task of the alloc.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Where it is.
    pub state: TaskRunState,
    /// The driver's handle of its process while it runs: written before anything else is done
    /// with a started process, so a restarted agent can recover it.
    pub handle: Option<TaskHandle>,
    /// How many times it was restarted.
    pub restarts: u32,
    /// It failed for good (restart attempts used up, or it could not be set up).
    pub failed: bool,
    /// Its process was lost while the agent was down: it is restarted (under its restart
    /// policy) only once the agent has contacted the servers.
    #[serde(default)]
    pub lost: bool,
    /// How its last process ended.
    pub last_exit: Option<ExitResult>,
    /// When its current (or last) process started.
    pub started_at: Option<SystemTime>,
    /// When it became dead.
    pub finished_at: Option<SystemTime>,
    /// The restart policy's bookkeeping.
    pub restart_window: RestartWindow,
    /// Prestart hooks done for the current process.
    pub prestart_done: BTreeSet<String>,
    /// Poststart hooks done for the current process.
    pub poststart_done: BTreeSet<String>,
    /// What the task gets for its devices: the device manager's answer at its first start,
    /// persisted before that start and reused for every later one.
    #[serde(default)]
    pub device_edits: Option<ContainerEdits>,
}

impl TaskRecord {
    fn new() -> Self {
        Self {
            state: TaskRunState::Pending,
            handle: None,
            restarts: 0,
            failed: false,
            lost: false,
            last_exit: None,
            started_at: None,
            finished_at: None,
            restart_window: RestartWindow::default(),
            prestart_done: BTreeSet::new(),
            poststart_done: BTreeSet::new(),
            device_edits: None,
        }
    }
}

/// Which alloc hooks are done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookProgress {
    /// Prerun hooks done ([`hook_names`]).
    pub prerun: BTreeSet<String>,
    /// Postrun hooks done.
    pub postrun: BTreeSet<String>,
    /// Every task was destroyed in its driver.
    pub destroyed: bool,
}

/// What an [`AllocEvent`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The runner was made for the alloc.
    Received,
    /// The alloc waits for earlier allocs to finish.
    UpstreamWaiting,
    /// The earlier allocs finished.
    UpstreamDone,
    /// Waiting for earlier allocs timed out or failed; the alloc goes on.
    UpstreamGaveUp,
    /// A volume claim failed and will be tried again.
    VolumeClaimRetrying,
    /// A volume was claimed.
    VolumeClaimed,
    /// A volume claim failed for good: the alloc fails.
    VolumeClaimFailed,
    /// A volume release failed and will be tried again.
    VolumeReleaseRetrying,
    /// A volume was released.
    VolumeReleased,
    /// A volume release failed for good; it stays claimed in the record.
    VolumeReleaseFailed,
    /// A task hook failed.
    HookFailed,
    /// The task's process started.
    Started,
    /// The task could not be started.
    StartFailed,
    /// The task's process was re-attached after an agent restart.
    Recovered,
    /// The task's process could not be re-attached (it is gone).
    RecoverFailed,
    /// The task waits for the agent to contact the servers before it is restarted.
    WaitingForServers,
    /// The task's process exited.
    Exited,
    /// The task will be restarted.
    Restarting,
    /// The task will not be restarted: it failed.
    NotRestarting,
    /// The task is being stopped.
    Killing,
    /// The driver sent a signal to the task.
    Signaled,
    /// The driver sent `SIGKILL` to the task.
    Killed,
    /// The driver dropped some of the task's events.
    EventsDropped,
    /// The task could not be stopped or destroyed cleanly.
    StopFailed,
    /// The task was forgotten by its driver.
    Destroyed,
    /// A stop of the alloc was asked for.
    AllocStopping,
    /// Every task finished.
    AllocComplete,
    /// The alloc failed.
    AllocFailed,
    /// The task's CSI plugin answered its probe and was registered.
    PluginRegistered,
    /// The task's CSI plugin was deregistered (the task stopped or exited).
    PluginDeregistered,
    /// The task's CSI plugin became healthy.
    PluginHealthy,
    /// The task's CSI plugin became unhealthy.
    PluginUnhealthy,
    /// The task's CSI plugin was not ready within its `health_timeout`: the task is
    /// restarted under its restart policy.
    PluginNotReady,
    /// The task's devices were reserved (the answer is kept for every later start).
    DevicesReserved,
    /// The task's devices could not be reserved or prepared.
    DevicesFailed,
    /// A note about how the task's devices or resources were applied (a driver without
    /// isolation gets env only; a cgroup that could not be used).
    DeviceNote,
    /// The alloc's devices were released.
    DevicesReleased,
    /// A note of the task's driver about how it ran the task.
    DriverNote,
    /// Consul ACL tokens were derived from the alloc's workload identities.
    ConsulTokensDerived,
    /// Consul ACL tokens could not be derived: the alloc fails.
    ConsulTokensFailed,
    /// The alloc's Consul ACL tokens were revoked.
    ConsulTokensRevoked,
    /// A Consul ACL token could not be revoked.
    ConsulRevokeFailed,
    /// A secret was written into the task's secrets directory (never its value).
    SecretWritten,
}

/// Something that happened to the alloc or one of its tasks. Never holds mount flags or
/// secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocEvent {
    /// When.
    pub time: SystemTime,
    /// The task it is about; `None` for the alloc itself.
    pub task: Option<String>,
    /// What happened.
    pub kind: EventKind,
    /// A human-readable line about it.
    pub message: String,
}

impl AllocEvent {
    /// An event now.
    pub fn new(task: Option<&str>, kind: EventKind, message: impl Into<String>) -> Self {
        Self {
            time: SystemTime::now(),
            task: task.map(str::to_owned),
            kind,
            message: message.into(),
        }
    }
}

/// Everything persisted of an alloc, under its id (`Table::ALLOCS` in the agent's store).
///
/// `group` holds the volume requests' mount flags in the clear (a restarted agent claims with
/// them); `Debug` hides them, and nothing of the record that reaches events or
/// [`AllocStatus`](crate::AllocStatus) carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocRecord {
    /// [`RECORD_VERSION`].
    pub version: u32,
    /// The alloc's id.
    pub alloc_id: String,
    /// The job's id.
    pub job_id: String,
    /// The job's type.
    pub job_type: JobType,
    /// The group it runs.
    pub group: GroupSpec,
    /// Its index in the group.
    pub index: u32,
    /// The devices each task was assigned at placement, by task name (held until the alloc
    /// is finished).
    #[serde(default)]
    pub devices: BTreeMap<String, Vec<DeviceAssignment>>,
    /// Run or stop.
    pub desired: DesiredState,
    /// How it is doing.
    pub client_status: ClientStatus,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// The group's volumes by name.
    pub volumes: BTreeMap<String, VolumeState>,
    /// The group's tasks by name.
    pub tasks: BTreeMap<String, TaskRecord>,
    /// Alloc hooks done.
    pub hooks: HookProgress,
    /// The latest events, oldest first.
    pub events: VecDeque<AllocEvent>,
    /// Events dropped to keep the list bounded.
    pub events_dropped: u64,
}

impl AllocRecord {
    /// The record of a new alloc: desired run, pending, nothing claimed or started.
    pub fn new(spec: &AllocSpec) -> Self {
        let volumes = spec
            .group
            .volumes
            .iter()
            .map(|(name, req)| {
                (
                    name.clone(),
                    VolumeState {
                        volume_id: req.source_for(spec.index),
                        read_only: req.read_only,
                        claim_sent: false,
                        claimed: false,
                        target: None,
                    },
                )
            })
            .collect();
        let tasks = spec
            .group
            .tasks
            .iter()
            .map(|t| (t.name.clone(), TaskRecord::new()))
            .collect();
        Self {
            version: RECORD_VERSION,
            alloc_id: spec.alloc_id.clone(),
            job_id: spec.job_id.clone(),
            job_type: spec.job_type,
            group: spec.group.clone(),
            index: spec.index,
            devices: spec.devices.clone(),
            desired: DesiredState::Run,
            client_status: ClientStatus::Pending,
            failure: None,
            volumes,
            tasks,
            hooks: HookProgress::default(),
            events: VecDeque::new(),
            events_dropped: 0,
        }
    }

    /// Adds `event` in time order, keeping at most `max` events (the oldest go).
    pub fn push_event(&mut self, event: AllocEvent, max: usize) {
        let at = self
            .events
            .iter()
            .rposition(|e| e.time <= event.time)
            .map_or(0, |i| i + 1);
        self.events.insert(at, event);
        while self.events.len() > max.max(1) {
            self.events.pop_front();
            self.events_dropped += 1;
        }
    }

    /// The task called `name`.
    pub fn task(&self, name: &str) -> Option<&TaskRecord> {
        self.tasks.get(name)
    }

    /// Whether the alloc is done with: torn down (postrun and destroy hooks done).
    pub fn is_finished(&self) -> bool {
        self.client_status.is_terminal()
            && self.hooks.destroyed
            && self.hooks.postrun.contains(hook_names::CSI)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn event_at(secs: u64, message: &str) -> AllocEvent {
        AllocEvent {
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            task: None,
            kind: EventKind::Received,
            message: message.into(),
        }
    }

    fn record() -> AllocRecord {
        let job = JobSpec::parse_hcl(
            std::path::Path::new("j.hcl"),
            r#"
job "j" {
  group "g" {
    count = 2
    volume "data" {
      type        = "csi"
      source      = "vol"
      access_mode = "single-node-writer"
      per_alloc   = true
    }
    task "t" {
      driver = "raw_exec"
      config { command = "true" }
    }
  }
}
"#,
        )
        .expect("job");
        AllocRecord::new(&AllocSpec::from_job(&job, "g", "a1", 1).expect("spec"))
    }

    #[test]
    fn new_record_picks_per_alloc_sources() {
        let rec = record();
        assert_eq!(rec.volumes["data"].volume_id, "vol[1]");
        assert!(!rec.volumes["data"].claim_sent);
        assert_eq!(rec.tasks["t"].state, TaskRunState::Pending);
        assert_eq!(rec.desired, DesiredState::Run);
        assert_eq!(rec.client_status, ClientStatus::Pending);
        let json = serde_json::to_string(&rec).expect("encode");
        let back: AllocRecord = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, rec);
    }

    #[test]
    fn events_stay_in_time_order_and_bounded() {
        let mut rec = record();
        rec.push_event(event_at(2, "b"), 3);
        rec.push_event(event_at(1, "a"), 3);
        rec.push_event(event_at(3, "c"), 3);
        rec.push_event(event_at(3, "d"), 3);
        let messages: Vec<_> = rec.events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(messages, ["b", "c", "d"]);
        assert_eq!(rec.events_dropped, 1);
    }

    #[test]
    fn unknown_group_is_refused() {
        let job = JobSpec::parse_hcl(
            std::path::Path::new("j.hcl"),
            "job \"j\" {\n group \"g\" {\n task \"t\" {\n driver = \"raw_exec\"\n config { command = \"true\" }\n }\n }\n}\n",
        )
        .expect("job");
        let err = AllocSpec::from_job(&job, "nope", "a", 0).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }
}
