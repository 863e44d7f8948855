//! What an alloc runner is made with: the node's drivers and volumes, the store, and options.

use std::{fmt, path::PathBuf, sync::Arc, time::Duration};

use berth_drivers::LogCollector;
use rand::Rng as _;
use tokio::sync::watch;

use crate::{
    device_host::{DeviceHost, NoDevices},
    drivers::TaskDrivers,
    record::DEFAULT_MAX_EVENTS,
    store::AllocStore,
    upstream::{NoUpstream, UpstreamWatcher},
    volume_host::VolumeHost,
};

/// Bounded, jittered exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Most attempts (at least 1).
    pub attempts: u32,
    /// Wait after the first failure.
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Backoff {
    /// The wait after failed attempt `attempt` (1-based): `initial × 2^(attempt-1)`, at most
    /// `max`, then a random part of it taken off (up to half) so that runners retrying
    /// together spread out.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        let full = self.initial.saturating_mul(factor).min(self.max);
        let half = full / 2;
        let nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        full - Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }
}

/// Options of the alloc runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Retries of a volume claim that failed retryably.
    pub claim_retry: Backoff,
    /// Retries of a volume release that failed retryably.
    pub release_retry: Backoff,
    /// Waits between `SIGKILL`s of a task whose process outlived its stop (stuck in the
    /// kernel, say). Retried until it dies, so `attempts` is not used: the alloc's volumes
    /// stay mounted as long as a process may use them.
    pub kill_retry: Backoff,
    /// How long to wait for upstream allocs before going on without them.
    pub upstream_timeout: Duration,
    /// Most events an alloc keeps.
    pub max_events: usize,
    /// Task starts that run at once on the node.
    pub start_slots: StartSlots,
}

/// How many task starts (the driver's start until the handle is persisted; prestart hooks run
/// before, outside the slots) run at once; the others wait their turn in order. Starting a task is mostly CPU
/// (processes, namespaces, cgroups): with the CPU shared by every start at once, all of a
/// job's allocs would come up together at the end; in turns, the first ones run early and the
/// last no later. Clones share the slots.
#[derive(Clone)]
pub struct StartSlots {
    slots: Option<Arc<tokio::sync::Semaphore>>,
    size: usize,
}

impl StartSlots {
    /// `n` starts at once (at least one).
    pub fn new(n: usize) -> Self {
        let size = n.max(1);
        Self {
            slots: Some(Arc::new(tokio::sync::Semaphore::new(size))),
            size,
        }
    }

    /// No limit.
    pub fn unlimited() -> Self {
        Self {
            slots: None,
            size: 0,
        }
    }

    /// Two per core of this machine.
    pub fn per_core() -> Self {
        Self::new(2 * std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Waits for a slot; held until the permit is dropped. `None` without a limit.
    pub async fn acquire(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.slots {
            Some(s) => Arc::clone(s).acquire_owned().await.ok(),
            None => None,
        }
    }
}

impl fmt::Debug for StartSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.slots {
            Some(_) => write!(f, "StartSlots({})", self.size),
            None => f.write_str("StartSlots(unlimited)"),
        }
    }
}

impl PartialEq for StartSlots {
    fn eq(&self, other: &Self) -> bool {
        self.size == other.size
    }
}

impl Eq for StartSlots {}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            claim_retry: Backoff {
                attempts: 6,
                initial: Duration::from_secs(1),
                max: Duration::from_secs(30),
            },
            release_retry: Backoff {
                attempts: 6,
                initial: Duration::from_secs(1),
                max: Duration::from_secs(30),
            },
            kill_retry: Backoff {
                attempts: u32::MAX,
                initial: Duration::from_secs(1),
                max: Duration::from_secs(30),
            },
            upstream_timeout: Duration::from_secs(5 * 60),
            max_events: DEFAULT_MAX_EVENTS,
            start_slots: StartSlots::per_core(),
        }
    }
}

/// What an alloc runner uses. Cheap to clone; one set serves every alloc of the node.
#[derive(Clone)]
pub struct AllocDeps {
    /// Task drivers by name.
    pub drivers: Arc<dyn TaskDrivers>,
    /// The node's volume side.
    pub volumes: Arc<dyn VolumeHost>,
    /// The node's device side.
    pub devices: Arc<dyn DeviceHost>,
    /// Where records are persisted.
    pub store: Arc<dyn AllocStore>,
    /// Who knows the allocs an alloc waits for.
    pub upstream: Arc<dyn UpstreamWatcher>,
    /// Directory of the allocs' directories: an alloc's is `<allocs_dir>/<alloc id>`.
    pub allocs_dir: PathBuf,
    /// Opened (`true`) by the agent once it has synced with the control plane. A recovered
    /// task whose process is gone is restarted only after that.
    pub servers_contacted: watch::Receiver<bool>,
    /// Options.
    pub config: RunnerConfig,
    /// With it, a task's stdout and stderr go through log collectors that rotate them as its
    /// `logs` block says (`logs/<task>.stdout.0`…); without it, they are appended to
    /// `logs/<task>.stdout` and `.stderr`. Either way `logs { disabled = true }` throws them
    /// away.
    pub log_collector: Option<LogCollector>,
}

impl fmt::Debug for AllocDeps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocDeps")
            .field("drivers", &self.drivers)
            .field("volumes", &self.volumes)
            .field("devices", &self.devices)
            .field("store", &self.store)
            .field("upstream", &self.upstream)
            .field("allocs_dir", &self.allocs_dir)
            .field("servers_contacted", &*self.servers_contacted.borrow())
            .field("config", &self.config)
            .field("log_collector", &self.log_collector)
            .finish()
    }
}

impl AllocDeps {
    /// Dependencies with no devices, no upstream allocs, the servers-contacted gate open, no
    /// log collector, and default options.
    pub fn new(
        drivers: Arc<dyn TaskDrivers>,
        volumes: Arc<dyn VolumeHost>,
        store: Arc<dyn AllocStore>,
        allocs_dir: impl Into<PathBuf>,
    ) -> Self {
        let (_, servers_contacted) = watch::channel(true);
        Self {
            drivers,
            volumes,
            devices: Arc::new(NoDevices),
            store,
            upstream: Arc::new(NoUpstream),
            allocs_dir: allocs_dir.into(),
            servers_contacted,
            config: RunnerConfig::default(),
            log_collector: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_max_with_at_most_half_off() {
        let b = Backoff {
            attempts: 10,
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        for (attempt, full) in [(1, 100), (2, 200), (3, 400), (4, 500), (30, 500)] {
            let full = Duration::from_millis(full);
            for _ in 0..20 {
                let d = b.delay(attempt);
                assert!(d <= full && d >= full / 2, "attempt {attempt}: {d:?}");
            }
        }
    }
}

#[cfg(test)]
mod start_slots_tests {
    use super::*;

    #[tokio::test]
    async fn slots_limit_starts_and_hand_over_in_order() {
        let slots = StartSlots::new(2);
        let a = slots.acquire().await.expect("a slot");
        let b = slots.acquire().await.expect("a slot");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waiters: Vec<_> = (0..3)
            .map(|n| {
                let (slots, tx) = (slots.clone(), tx.clone());
                tokio::spawn(async move {
                    let held = slots.acquire().await;
                    tx.send(n).expect("send");
                    held
                })
            })
            .collect();
        // Every waiter is queued before a slot frees.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(
            rx.try_recv().is_err(),
            "a third start ran with two slots held"
        );
        drop(a);
        let first = waiters.into_iter().next().expect("waiter");
        let held = first.await.expect("waiter");
        assert_eq!(rx.recv().await, Some(0), "the first to wait goes first");
        drop((b, held));
        let mut rest = vec![rx.recv().await, rx.recv().await];
        rest.sort();
        assert_eq!(rest, vec![Some(1), Some(2)]);
        assert!(StartSlots::unlimited().acquire().await.is_none());
        assert_eq!(StartSlots::new(0), StartSlots::new(1));
    }
}
