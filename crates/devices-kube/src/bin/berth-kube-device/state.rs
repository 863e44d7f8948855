//! The plugin's devices and faults, as one snapshot every call and every stream reads: from
//! `--count` or `--dir`, spread over `--numa` nodes, with the fault switch applied.

use std::{
    cmp::Ordering,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_devices_kube::proto::{
    HEALTHY, UNHEALTHY,
    v1beta1::{Device, NumaNode, TopologyInfo},
};
use tokio::{sync::watch, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::faults::Faults;

/// How often the fault file is re-read.
pub const FAULT_PERIOD: Duration = Duration::from_millis(200);

/// Exit status of the `crash` fault.
pub const CRASH_EXIT: i32 = 2;

/// One device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dev {
    pub id: String,
    pub numa: Option<i64>,
}

/// What the plugin has now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub devices: Vec<Dev>,
    pub faults: Faults,
}

impl Snapshot {
    /// The list `ListAndWatch` sends.
    pub fn reported(&self) -> Vec<Device> {
        let health = if self.faults.unhealthy {
            UNHEALTHY
        } else {
            HEALTHY
        };
        let mut list: Vec<Device> = self
            .devices
            .iter()
            .map(|d| Device {
                id: d.id.clone(),
                health: health.into(),
                topology: d.numa.map(|id| TopologyInfo {
                    nodes: vec![NumaNode { id }],
                }),
            })
            .collect();
        if self.faults.invalid {
            list.push(Device {
                id: String::new(),
                health: HEALTHY.into(),
                topology: None,
            });
        }
        list
    }

    /// Whether `id` is listed (`None`: unknown) and healthy in the reported list.
    pub fn healthy(&self, id: &str) -> Option<bool> {
        self.devices
            .iter()
            .any(|d| d.id == id)
            .then_some(!self.faults.unhealthy)
    }

    /// The NUMA node of `id`.
    pub fn numa_of(&self, id: &str) -> Option<i64> {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .and_then(|d| d.numa)
    }
}

/// Where the devices come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// `<kind>-0` … `<kind>-<n-1>`.
    Count { kind: String, n: usize },
    /// One device per entry of the directory, named as the entry.
    Dir(PathBuf),
}

/// What `ListAndWatch` last sent, per registration: a registration (each `Register` the
/// plugin makes) starts with nothing sent, and only streams opened since count.
#[derive(Debug, Default)]
struct Sent {
    registration: u64,
    list: Option<Vec<Device>>,
}

/// The owner of the snapshot, and of what was last sent.
#[derive(Debug)]
pub struct State {
    source: Source,
    numa: u32,
    fault_file: PathBuf,
    env_faults: Faults,
    tx: watch::Sender<Snapshot>,
    sent: Mutex<Sent>,
}

impl State {
    pub fn new(source: Source, numa: u32, fault_file: PathBuf, env_faults: Faults) -> Self {
        let state = Self {
            source,
            numa,
            fault_file,
            env_faults,
            tx: watch::Sender::new(Snapshot::default()),
            sent: Mutex::new(Sent::default()),
        };
        state.refresh_list();
        state.refresh_faults();
        state
    }

    pub fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.tx.subscribe()
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, Sent> {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a new registration (called before every `Register`): nothing is sent on it yet,
    /// and streams opened before it no longer count. Returns its number.
    pub fn new_registration(&self) -> u64 {
        let mut sent = self.sent();
        sent.registration += 1;
        sent.list = None;
        sent.registration
    }

    /// The registration streams opened now belong to.
    pub fn registration(&self) -> u64 {
        self.sent().registration
    }

    /// A stream of `registration` is sending `list`; ignored when a newer registration began.
    pub fn record_sent(&self, registration: u64, list: &[Device]) {
        let mut sent = self.sent();
        if sent.registration == registration {
            sent.list = Some(list.to_vec());
        }
    }

    /// What `ListAndWatch` last sent on the current registration, if anything.
    pub fn last_sent(&self) -> Option<Vec<Device>> {
        self.sent().list.clone()
    }

    /// Re-reads the fault file and returns the snapshot. Exits the process on `crash`.
    pub fn refresh_faults(&self) -> Snapshot {
        let faults = Faults::read(&self.fault_file, self.env_faults);
        if faults.crash {
            tracing::error!("fault crash: exiting with status {CRASH_EXIT}");
            std::process::exit(CRASH_EXIT);
        }
        self.tx.send_if_modified(|s| {
            let changed = s.faults != faults;
            s.faults = faults;
            changed
        });
        self.tx.borrow().clone()
    }

    /// Re-lists the devices.
    pub fn refresh_list(&self) {
        let ids = match &self.source {
            Source::Count { kind, n } => (0..*n).map(|i| format!("{kind}-{i}")).collect(),
            Source::Dir(dir) => list_dir(dir),
        };
        let numa = self.numa;
        let devices: Vec<Dev> = ids
            .into_iter()
            .enumerate()
            .map(|(i, id)| Dev {
                id,
                numa: (numa > 0).then(|| i64::try_from(i % numa as usize).unwrap_or(0)),
            })
            .collect();
        self.tx.send_if_modified(|s| {
            let changed = s.devices != devices;
            if changed {
                tracing::info!(devices = devices.len(), "device list changed");
            }
            s.devices = devices;
            changed
        });
    }

    /// Re-reads faults every [`FAULT_PERIOD`] and the device list every `list_period`, until
    /// `shutdown`.
    pub async fn run(self: Arc<Self>, list_period: Duration, shutdown: CancellationToken) {
        let mut faults = tokio::time::interval(FAULT_PERIOD);
        faults.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut list = tokio::time::interval(list_period);
        list.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = faults.tick() => { self.refresh_faults(); }
                _ = list.tick() => self.refresh_list(),
            }
        }
    }
}

/// The device ids in `dir`: every entry whose name is a usable id (not hidden, a valid path
/// segment), in natural order.
fn list_dir(dir: &Path) -> Vec<String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list the device directory");
            return Vec::new();
        }
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && berth_sys::validate_path_segment("device id", n).is_ok())
        .collect();
    ids.sort_by(|a, b| natural(a, b));
    ids
}

/// Orders ids by their text before the trailing number, then by that number (`w-2` < `w-10`).
pub fn natural(a: &str, b: &str) -> Ordering {
    let split = |s: &str| {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (head, tail) = s.split_at(s.len() - digits);
        (head.to_string(), tail.parse::<u128>().ok())
    };
    split(a).cmp(&split(b)).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order() {
        let mut v = vec!["w-10", "w-2", "w-1", "a", "w-", "x-0"];
        v.sort_by(|a, b| natural(a, b));
        assert_eq!(v, ["a", "w-", "w-1", "w-2", "w-10", "x-0"]);
    }
}
