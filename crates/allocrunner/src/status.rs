//! What the API shows of an alloc: its tasks, volumes and events, without its spec. Mount flags
//! show only as `[REDACTED]`.

use std::{collections::BTreeMap, path::PathBuf, time::SystemTime};

use berth_csi::model::{AccessMode, AttachmentMode};
use berth_drivers::ExitResult;
use serde::{Deserialize, Serialize};

use crate::record::{AllocEvent, AllocRecord, ClientStatus, DesiredState, TaskRunState};

/// An alloc's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocStatus {
    /// The alloc.
    pub alloc_id: String,
    /// Its job.
    pub job_id: String,
    /// Its group's name.
    pub group: String,
    /// Its index in the group.
    pub index: u32,
    /// Run or stop.
    pub desired: DesiredState,
    /// How it is doing.
    pub client_status: ClientStatus,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// Its tasks by name.
    pub tasks: BTreeMap<String, TaskSummary>,
    /// Its volumes by name.
    pub volumes: BTreeMap<String, VolumeSummary>,
    /// Its latest events, oldest first.
    pub events: Vec<AllocEvent>,
    /// Older events dropped.
    pub events_dropped: u64,
}

/// A task's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSummary {
    /// Its driver.
    pub driver: String,
    /// Where it is.
    pub state: TaskRunState,
    /// Pid of its process while it runs.
    pub pid: Option<u32>,
    /// Restarts so far.
    pub restarts: u32,
    /// It failed for good.
    pub failed: bool,
    /// Its process was lost while the agent was down and waits to be restarted.
    pub lost: bool,
    /// How its last process ended.
    pub last_exit: Option<ExitResult>,
    /// When its current (or last) process started.
    pub started_at: Option<SystemTime>,
    /// When it became dead.
    pub finished_at: Option<SystemTime>,
    /// Its devices, per `device` block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<TaskDeviceSummary>,
    /// Its `volume_mount` blocks: which group volume appears where (no mount flag).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<TaskMountSummary>,
}

/// One `volume_mount` of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskMountSummary {
    /// The group volume's name.
    pub volume: String,
    /// Where it appears in the task.
    pub destination: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The devices one `device` block of a task holds, and what the task gets for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDeviceSummary {
    /// The block's label (`nvidia/gpu`).
    pub request: String,
    /// The devices, as `vendor/type/name/id` (CDI: the qualified name).
    pub devices: Vec<String>,
    /// Names of the env variables the task gets from its devices (values are not shown);
    /// empty before its first start.
    #[serde(default)]
    pub env: Vec<String>,
    /// Mounts it gets (`host → task`, `(ro)` when read-only).
    #[serde(default)]
    pub mounts: Vec<String>,
    /// Device nodes it gets (`host → task (perms)`).
    #[serde(default)]
    pub device_nodes: Vec<String>,
    /// The latest statistic of each device (its summary), when the agent has one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stats: BTreeMap<String, String>,
}

/// A volume's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSummary {
    /// berth's volume id.
    pub volume_id: String,
    /// Claimed for reading only.
    pub read_only: bool,
    /// The access mode the alloc claims it with.
    pub access_mode: AccessMode,
    /// `file-system` or `block-device`.
    pub attachment_mode: AttachmentMode,
    /// The filesystem type the request asks for; empty for the volume's.
    #[serde(default)]
    pub fs_type: String,
    /// `[REDACTED]` when the request sets mount flags, absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_flags: Option<String>,
    /// Claimed now.
    pub claimed: bool,
    /// Where it is mounted on the host.
    pub target: Option<PathBuf>,
}

/// What a task's status says of its devices: the assignments, and (once reserved) what the
/// task gets, on the first block's line (the answer covers every block of the task).
fn device_summaries(
    assignments: &[berth_devices::assignment::DeviceAssignment],
    edits: Option<&berth_devices::model::ContainerEdits>,
) -> Vec<TaskDeviceSummary> {
    assignments
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let edits = edits.filter(|_| i == 0);
            TaskDeviceSummary {
                request: a.request.clone(),
                devices: a.device_names(),
                env: edits
                    .map(|e| e.env.keys().cloned().collect())
                    .unwrap_or_default(),
                mounts: edits
                    .map(|e| {
                        e.mounts
                            .iter()
                            .map(|m| {
                                format!(
                                    "{} → {}{}",
                                    m.host_path.display(),
                                    m.task_path.display(),
                                    if m.read_only { " (ro)" } else { "" }
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                device_nodes: edits
                    .map(|e| {
                        e.device_nodes
                            .iter()
                            .map(|d| {
                                format!(
                                    "{} → {} ({})",
                                    d.host_path.display(),
                                    d.task_path.display(),
                                    d.permissions
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                stats: BTreeMap::new(),
            }
        })
        .collect()
}

/// A task's `volume_mount` blocks as the status shows them: read-only when the mount or the
/// group's volume says so.
fn mount_summaries(
    task: &berth_job::TaskSpec,
    group: &berth_job::GroupSpec,
) -> Vec<TaskMountSummary> {
    task.volume_mounts
        .iter()
        .map(|m| TaskMountSummary {
            volume: m.volume.clone(),
            destination: m.destination.to_string(),
            read_only: m.read_only || group.volumes.get(&m.volume).is_some_and(|v| v.read_only),
        })
        .collect()
}

impl AllocStatus {
    /// The status shown for `record`.
    pub fn from_record(record: &AllocRecord) -> Self {
        let specs: BTreeMap<&str, &berth_job::TaskSpec> = record
            .group
            .tasks
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        Self {
            alloc_id: record.alloc_id.clone(),
            job_id: record.job_id.clone(),
            group: record.group.name.clone(),
            index: record.index,
            desired: record.desired,
            client_status: record.client_status,
            failure: record.failure.clone(),
            tasks: record
                .tasks
                .iter()
                .map(|(name, t)| {
                    (
                        name.clone(),
                        TaskSummary {
                            driver: specs
                                .get(name.as_str())
                                .map_or_else(String::new, |t| t.driver.clone()),
                            state: t.state,
                            pid: t.handle.as_ref().map(|h| h.pid),
                            restarts: t.restarts,
                            failed: t.failed,
                            lost: t.lost,
                            last_exit: t.last_exit,
                            started_at: t.started_at,
                            finished_at: t.finished_at,
                            devices: device_summaries(
                                record.devices.get(name).map(Vec::as_slice).unwrap_or(&[]),
                                t.device_edits.as_ref(),
                            ),
                            volume_mounts: specs
                                .get(name.as_str())
                                .map(|t| mount_summaries(t, &record.group))
                                .unwrap_or_default(),
                        },
                    )
                })
                .collect(),
            volumes: record
                .volumes
                .iter()
                .map(|(name, v)| {
                    let req = record.group.volumes.get(name);
                    let options = req.map(|r| &r.mount_options);
                    (
                        name.clone(),
                        VolumeSummary {
                            volume_id: v.volume_id.clone(),
                            read_only: v.read_only,
                            access_mode: req
                                .map_or(AccessMode::SingleNodeWriter, |r| r.access_mode),
                            attachment_mode: req
                                .map_or(AttachmentMode::FileSystem, |r| r.attachment_mode),
                            fs_type: options.map(|o| o.fs_type.clone()).unwrap_or_default(),
                            mount_flags: options
                                .filter(|o| !o.mount_flags.is_empty())
                                .map(|_| berth_csi::REDACTED.to_owned()),
                            claimed: v.claimed,
                            target: v.target.clone(),
                        },
                    )
                })
                .collect(),
            events: record.events.iter().cloned().collect(),
            events_dropped: record.events_dropped,
        }
    }

    /// The events of task `task` (`None`: of the alloc itself), oldest first.
    pub fn events_of<'a>(&'a self, task: Option<&'a str>) -> impl Iterator<Item = &'a AllocEvent> {
        self.events
            .iter()
            .filter(move |e| e.task.as_deref() == task)
    }
}
