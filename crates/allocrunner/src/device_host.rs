//! The node's device side, as the alloc runner sees it: what a task gets for the devices its
//! alloc was assigned when it was placed (env, mounts, device nodes), the call made before
//! each start, and the release of an alloc's devices when it ends.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Mutex, MutexGuard},
};

use berth_devices::{assignment::DeviceAssignment, model::ContainerEdits};

use crate::BoxFuture;

/// The agent's device code (the device manager behind it).
///
/// [`reserve`](Self::reserve) is called once per task, before its first start; the runner
/// persists the answer with the alloc before the task starts and reuses it for every restart,
/// also after an agent restart, so a task always gets the same devices with the same env,
/// mounts and device nodes. Messages of errors are shown in the alloc's events: no secrets.
pub trait DeviceHost: Send + Sync + fmt::Debug {
    /// Prepares the devices of `assignments` for task `task` of `alloc_id` and says what the
    /// task gets (Nomad's `Reserve`, Kubernetes' `Allocate`, CDI specs).
    fn reserve<'a>(
        &'a self,
        alloc_id: &'a str,
        task: &'a str,
        assignments: &'a [DeviceAssignment],
    ) -> BoxFuture<'a, Result<ContainerEdits, String>>;

    /// Before every start of a task holding `assignments` (Kubernetes' `PreStartContainer`
    /// where a plugin asks for it). `Ok` carries notes for the task's events (a step skipped,
    /// and why).
    fn pre_start<'a>(
        &'a self,
        assignments: &'a [DeviceAssignment],
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        let _ = assignments;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The devices `task` of `alloc_id` holds, from its persisted record (an agent restart):
    /// they stay taken until the alloc ends.
    fn restore(&self, alloc_id: &str, task: &str, assignments: &[DeviceAssignment]);

    /// The alloc ended (its tasks are destroyed): its devices are free. Idempotent.
    fn release(&self, alloc_id: &str);
}

/// A node without devices: a task assigned devices cannot get them.
#[derive(Debug, Default)]
pub struct NoDevices;

impl DeviceHost for NoDevices {
    fn reserve<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a [DeviceAssignment],
    ) -> BoxFuture<'a, Result<ContainerEdits, String>> {
        Box::pin(async { Err("this node has no device manager".to_owned()) })
    }

    fn restore(&self, _: &str, _: &str, _: &[DeviceAssignment]) {}

    fn release(&self, _: &str) {}
}

/// A call made to a [`FakeDeviceHost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceCall {
    /// `reserve`.
    Reserve {
        /// The alloc.
        alloc_id: String,
        /// The task.
        task: String,
        /// The devices, as `vendor/type/name/id`.
        devices: Vec<String>,
    },
    /// `pre_start`.
    PreStart {
        /// The devices.
        devices: Vec<String>,
    },
    /// `restore`.
    Restore {
        /// The alloc.
        alloc_id: String,
        /// The task.
        task: String,
    },
    /// `release`.
    Release {
        /// The alloc.
        alloc_id: String,
    },
}

/// An in-memory [`DeviceHost`] for tests: answers `reserve` with the edits set for a task
/// (empty by default), records every call, and fails reserves on demand.
#[derive(Debug, Default)]
pub struct FakeDeviceHost {
    inner: Mutex<FakeInner>,
}

#[derive(Debug, Default)]
struct FakeInner {
    calls: Vec<DeviceCall>,
    edits: BTreeMap<String, ContainerEdits>,
    failures: BTreeMap<String, String>,
}

impl FakeDeviceHost {
    fn lock(&self) -> MutexGuard<'_, FakeInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves for `task` answer `edits`.
    pub fn set_edits(&self, task: &str, edits: ContainerEdits) {
        self.lock().edits.insert(task.to_owned(), edits);
    }

    /// Reserves for `task` fail with `message` (until cleared with an empty message).
    pub fn fail_reserve(&self, task: &str, message: &str) {
        let mut inner = self.lock();
        if message.is_empty() {
            inner.failures.remove(task);
        } else {
            inner.failures.insert(task.to_owned(), message.to_owned());
        }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<DeviceCall> {
        self.lock().calls.clone()
    }
}

fn names(assignments: &[DeviceAssignment]) -> Vec<String> {
    assignments
        .iter()
        .flat_map(DeviceAssignment::device_names)
        .collect()
}

impl DeviceHost for FakeDeviceHost {
    fn reserve<'a>(
        &'a self,
        alloc_id: &'a str,
        task: &'a str,
        assignments: &'a [DeviceAssignment],
    ) -> BoxFuture<'a, Result<ContainerEdits, String>> {
        let answer = {
            let mut inner = self.lock();
            inner.calls.push(DeviceCall::Reserve {
                alloc_id: alloc_id.to_owned(),
                task: task.to_owned(),
                devices: names(assignments),
            });
            match inner.failures.get(task) {
                Some(m) => Err(m.clone()),
                None => Ok(inner.edits.get(task).cloned().unwrap_or_default()),
            }
        };
        Box::pin(async move { answer })
    }

    fn pre_start<'a>(
        &'a self,
        assignments: &'a [DeviceAssignment],
    ) -> BoxFuture<'a, Result<Vec<String>, String>> {
        self.lock().calls.push(DeviceCall::PreStart {
            devices: names(assignments),
        });
        Box::pin(async { Ok(Vec::new()) })
    }

    fn restore(&self, alloc_id: &str, task: &str, _: &[DeviceAssignment]) {
        self.lock().calls.push(DeviceCall::Restore {
            alloc_id: alloc_id.to_owned(),
            task: task.to_owned(),
        });
    }

    fn release(&self, alloc_id: &str) {
        self.lock().calls.push(DeviceCall::Release {
            alloc_id: alloc_id.to_owned(),
        });
    }
}
