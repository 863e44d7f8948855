//! The driver manager: holds the drivers, fingerprints them, keeps their health, and routes
//! their task events to per-task handlers.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    driver::{Driver, Fingerprint, Health},
    error::DriverError,
    event::{EventSink, TaskEvent},
    router::Router,
    task::{TaskHandle, TaskId},
};

/// Options of the [`DriverManager`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// Time between fingerprints of a healthy driver.
    pub fingerprint_interval: Duration,
    /// Time between fingerprints of a driver that is not healthy.
    pub retry_interval: Duration,
    /// How long one fingerprint may take before it counts as unhealthy.
    pub fingerprint_timeout: Duration,
    /// Most events held back per task until its handler registers (or reads); beyond that the
    /// oldest are dropped, counted and replaced by one [`Dropped`](crate::TaskEventKind::Dropped)
    /// event.
    pub held_events_per_task: usize,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            fingerprint_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(5),
            fingerprint_timeout: Duration::from_secs(10),
            held_events_per_task: 64,
        }
    }
}

/// Two drivers with one name were added.
#[derive(Debug, thiserror::Error)]
#[error("a driver named {name:?} is already registered")]
pub struct DuplicateDriver {
    /// The name.
    pub name: String,
}

/// Collects the drivers of a [`DriverManager`]:
/// `let mut b = DriverManager::builder(config, &cancel); let sink = b.event_sink();
/// b.add(Arc::new(RawExecDriver::new(sink, ..)))?; let manager = b.start();`
pub struct DriverManagerBuilder {
    config: ManagerConfig,
    router: Arc<Router>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    drivers: BTreeMap<String, Arc<dyn Driver>>,
}

impl fmt::Debug for DriverManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverManagerBuilder")
            .field("config", &self.config)
            .field("drivers", &self.drivers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl DriverManagerBuilder {
    /// The sink to build drivers with: their events reach the manager's handlers.
    pub fn event_sink(&self) -> EventSink {
        EventSink::router(self.router.clone())
    }

    /// Adds a driver; names must be unique.
    pub fn add(&mut self, driver: Arc<dyn Driver>) -> Result<(), DuplicateDriver> {
        let name = driver.name().to_owned();
        if self.drivers.contains_key(&name) {
            return Err(DuplicateDriver { name });
        }
        self.drivers.insert(name, driver);
        Ok(())
    }

    /// Starts fingerprinting (the first round at once, in parallel) and returns the manager.
    /// Until a driver's first fingerprint it is `Undetected`; [`DriverManager::ready`] waits
    /// for the first round. Everything stops when the token given to
    /// [`DriverManager::builder`] (or [`DriverManager::shutdown`]) fires.
    pub fn start(self) -> DriverManager {
        let Self {
            config,
            router,
            tracker,
            cancel,
            drivers,
        } = self;
        let initial = drivers
            .keys()
            .map(|name| (name.clone(), Fingerprint::undetected()))
            .collect();
        let (states, _) = watch::channel(initial);
        let (ready, _) = watch::channel(false);
        let manager = DriverManager {
            inner: Arc::new(Inner {
                config,
                drivers,
                states,
                ready,
                router,
                tracker,
                cancel,
            }),
        };
        let inner = manager.inner.clone();
        manager.inner.tracker.spawn(inner.run());
        manager
    }
}

/// Holds the task drivers, fingerprints each at start and then on an interval (sooner while
/// not healthy), keeps their health, and routes task events to per-task handlers.
///
/// Events of a task go to the handler registered for it; until one is (or while its channel is
/// full) they are held back, in order, at most [`ManagerConfig::held_events_per_task`] per
/// task (older ones beyond that are dropped, counted and reported by a `Dropped` event).
#[derive(Debug, Clone)]
pub struct DriverManager {
    inner: Arc<Inner>,
}

struct Inner {
    config: ManagerConfig,
    drivers: BTreeMap<String, Arc<dyn Driver>>,
    states: watch::Sender<BTreeMap<String, Fingerprint>>,
    ready: watch::Sender<bool>,
    router: Arc<Router>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverManager")
            .field("drivers", &self.drivers.keys().collect::<Vec<_>>())
            .field("states", &*self.states.borrow())
            .finish_non_exhaustive()
    }
}

impl DriverManager {
    /// A builder. The manager stops when `cancel` fires. Must be called within a tokio
    /// runtime.
    pub fn builder(config: ManagerConfig, cancel: &CancellationToken) -> DriverManagerBuilder {
        let tracker = TaskTracker::new();
        let cancel = cancel.child_token();
        DriverManagerBuilder {
            router: Arc::new(Router::new(
                config.held_events_per_task,
                tracker.clone(),
                cancel.clone(),
            )),
            config,
            tracker,
            cancel,
            drivers: BTreeMap::new(),
        }
    }

    /// The driver called `name`.
    pub fn driver(&self, name: &str) -> Option<Arc<dyn Driver>> {
        self.inner.drivers.get(name).cloned()
    }

    /// Names of the drivers, sorted.
    pub fn driver_names(&self) -> Vec<String> {
        self.inner.drivers.keys().cloned().collect()
    }

    /// Health of the driver called `name` (`None` for no such driver).
    pub fn health(&self, name: &str) -> Option<Health> {
        self.inner.states.borrow().get(name).map(|fp| fp.health)
    }

    /// The latest fingerprint of the driver called `name`.
    pub fn fingerprint(&self, name: &str) -> Option<Fingerprint> {
        self.inner.states.borrow().get(name).cloned()
    }

    /// The latest fingerprints of all drivers, updated after every fingerprint that changed
    /// something.
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<String, Fingerprint>> {
        self.inner.states.subscribe()
    }

    /// Waits until every driver has been fingerprinted once (returns at once after that, or
    /// when the manager is shut down).
    pub async fn ready(&self) {
        let mut rx = self.inner.ready.subscribe();
        tokio::select! {
            _ = rx.wait_for(|ready| *ready) => {}
            () = self.inner.cancel.cancelled() => {}
        }
    }

    /// Sends the events of `task_id` to `handler` from now on, starting with those held back
    /// for it, in order. Replaces an earlier handler of the task. A handler whose receiver is
    /// dropped is forgotten; events are then held back again.
    pub fn register_handler(&self, task_id: &TaskId, handler: mpsc::Sender<TaskEvent>) {
        self.inner.router.register(task_id, handler);
    }

    /// Forgets the handler of `task_id` and the events still held back for it. Call when the
    /// task is done with (also when no handler was ever registered).
    pub fn deregister_handler(&self, task_id: &TaskId) {
        self.inner.router.deregister(task_id);
    }

    /// Events of `task_id` waiting for delivery.
    pub fn held_back_events(&self, task_id: &TaskId) -> usize {
        self.inner.router.held_back(task_id)
    }

    /// Events dropped so far because too many were held back for their task.
    pub fn dropped_events(&self) -> u64 {
        self.inner.router.dropped_total()
    }

    /// Recovers a task with the driver named in its handle.
    pub async fn recover(&self, handle: TaskHandle) -> Result<(), DriverError> {
        let Some(driver) = self.driver(&handle.driver) else {
            return Err(DriverError::WrongDriver {
                task_id: handle.task_id,
                found: handle.driver,
                expected: self.driver_names().join("|"),
            });
        };
        driver.recover(handle).await
    }

    /// Stops fingerprinting and event flushes, waits for them, then shuts the drivers down
    /// (tasks keep running).
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        for driver in self.inner.drivers.values() {
            driver.shutdown().await;
        }
    }
}

impl Inner {
    async fn fingerprint(
        driver: Arc<dyn Driver>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Option<Fingerprint> {
        tokio::select! {
            r = tokio::time::timeout(timeout, driver.fingerprint()) => Some(r.unwrap_or_else(|_| {
                Fingerprint::new(Health::Unhealthy, format!("fingerprint did not finish within {}", berth_sys::short_duration(timeout)))
            })),
            () = cancel.cancelled() => None,
        }
    }

    /// Records a fingerprint; logs a change of health after the first round.
    fn record(&self, name: &str, fp: Fingerprint, log_change: bool) {
        self.states.send_if_modified(|states| {
            let slot = states.entry(name.to_owned()).or_insert_with(Fingerprint::undetected);
            if *slot == fp {
                return false;
            }
            if log_change && slot.health != fp.health {
                tracing::info!(driver = name, from = %slot.health, to = %fp.health, description = %fp.description, "driver health changed");
            }
            *slot = fp;
            true
        });
    }

    fn summary(&self) -> String {
        self.states
            .borrow()
            .iter()
            .map(|(name, fp)| match fp.health {
                Health::Healthy => format!("{name}: healthy"),
                other => format!("{name}: {other} ({})", fp.description),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    async fn run(self: Arc<Self>) {
        let timeout = self.config.fingerprint_timeout;
        let mut first = JoinSet::new();
        for (name, driver) in &self.drivers {
            let (name, driver, cancel) = (name.clone(), driver.clone(), self.cancel.clone());
            first.spawn(async move { (name, Self::fingerprint(driver, timeout, cancel).await) });
        }
        while let Some(joined) = first.join_next().await {
            match joined {
                Ok((name, Some(fp))) => self.record(&name, fp, false),
                Ok((_, None)) => return,
                Err(e) => tracing::error!(error = %e, "a driver's fingerprint panicked"),
            }
        }
        tracing::info!(drivers = %self.summary(), "drivers fingerprinted");
        self.ready.send_replace(true);
        for (name, driver) in &self.drivers {
            let inner = self.clone();
            let (name, driver) = (name.clone(), driver.clone());
            self.tracker
                .spawn(async move { inner.keep_fingerprinting(name, driver).await });
        }
    }

    /// Re-fingerprints one driver: every `fingerprint_interval` while healthy, every
    /// `retry_interval` otherwise. Checks for cancellation before each attempt.
    async fn keep_fingerprinting(self: Arc<Self>, name: String, driver: Arc<dyn Driver>) {
        loop {
            let healthy =
                self.states.borrow().get(&name).map(|fp| fp.health) == Some(Health::Healthy);
            let delay = if healthy {
                self.config.fingerprint_interval
            } else {
                self.config.retry_interval
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.cancel.cancelled() => return,
            }
            if self.cancel.is_cancelled() {
                return;
            }
            let fp = Self::fingerprint(
                driver.clone(),
                self.config.fingerprint_timeout,
                self.cancel.clone(),
            )
            .await;
            match fp {
                Some(fp) => self.record(&name, fp, true),
                None => return,
            }
        }
    }
}
