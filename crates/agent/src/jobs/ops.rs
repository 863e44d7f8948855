//! The operator's job and alloc calls beyond run and stop: plan, the kept spec, purge, and
//! stop, restart and signal of one alloc.

use std::sync::Arc;

use berth_api::{
    jobs::{AllocActionResponse, AllocStatus, JobPlan, JobRunRequest, JobSpecView, PlannedAlloc},
    server::ApiError,
};
use berth_controlplane::placement;
use berth_drivers::Signal;
use berth_state::Table;

use super::{JobRecord, Jobs};

/// How long a purge waits for the job's allocs to finish before it gives up (they stay, as a
/// stopped job's do).
const PURGE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

impl Jobs {
    /// Every job id in the store (its keys only).
    pub fn job_ids(&self) -> Vec<String> {
        self.store.keys(Table::JOBS).unwrap_or_default()
    }

    /// Every alloc id in the store (its keys only: no record is read).
    pub fn alloc_ids(&self) -> Vec<String> {
        self.store.keys(Table::ALLOCS).unwrap_or_default()
    }

    /// `POST /v1/jobs/plan`: what [`Jobs::run`] would place for `req`, and every reason it
    /// would not; nothing is written, taken or started.
    pub async fn plan(&self, req: JobRunRequest) -> Result<JobPlan, ApiError> {
        let spec = self.parse(&req, true).await?;
        let running: Vec<String> = match self.load(&spec.id)? {
            Some(old) if !old.stopped => old
                .allocs
                .iter()
                .filter(|a| {
                    self.alloc_status(a)
                        .is_some_and(|st| !st.client_status.is_terminal())
                })
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let facts = self.node_facts();
        let mut failures = Vec::new();
        let allocs = match placement::place(
            &spec,
            &facts,
            |id| self.volumes.catalog_volume(id),
            |group, index| format!("{group}[{index}]"),
        ) {
            Ok(plans) => plans
                .into_iter()
                .map(|p| PlannedAlloc {
                    group: p.group,
                    index: p.index,
                    volumes: p.volumes,
                })
                .collect(),
            Err(e) => {
                failures.extend(e.refusals.iter().map(ToString::to_string));
                Vec::new()
            }
        };
        failures.extend(self.device_reasons(&spec).await);
        if !running.is_empty() {
            failures.push(format!(
                "job {:?} is already running ({} alloc(s)); stop it first",
                spec.id,
                running.len()
            ));
        }
        Ok(JobPlan {
            job_id: spec.id.clone(),
            job_type: spec.job_type.as_str().to_owned(),
            placeable: failures.is_empty(),
            allocs: if failures.is_empty() {
                allocs
            } else {
                Vec::new()
            },
            failures,
            running,
        })
    }

    /// `GET /v1/job/{id}/spec`: the kept spec, with every mount flag redacted.
    pub fn spec_view(&self, id: &str) -> Result<JobSpecView, ApiError> {
        let rec = self
            .load(id)?
            .ok_or_else(|| ApiError::NotFound(format!("no job {id:?}")))?;
        let mut spec =
            serde_json::to_value(&rec.spec).map_err(|e| ApiError::Internal(e.to_string()))?;
        redact_mount_flags(&mut spec);
        Ok(JobSpecView {
            id: rec.spec.id,
            spec,
        })
    }

    /// Forgets job `id` and its allocs once every alloc has finished (tasks dead, volumes
    /// released); runs in the background after a stop with `purge`.
    pub fn purge_when_finished(self: &Arc<Self>, id: &str) {
        let jobs = Arc::clone(self);
        let id = id.to_owned();
        let mut changed = self.subscribe();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let deadline = tokio::time::Instant::now() + PURGE_WAIT;
            loop {
                let Ok(Some(rec)) = jobs.load(&id) else {
                    return;
                };
                if !rec.stopped {
                    // Run again meanwhile: not purged.
                    return;
                }
                if jobs.all_finished(&rec) {
                    jobs.purge_now(&id, &rec);
                    return;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep_until(deadline) => {
                        tracing::warn!(job_id = %id, "the job's allocs did not finish; it is not purged");
                        return;
                    }
                    r = changed.changed() => if r.is_err() { return },
                }
            }
        });
    }

    fn all_finished(&self, rec: &JobRecord) -> bool {
        rec.allocs.iter().all(|a| match self.allocs.get(a) {
            Ok(Some(r)) => r.is_finished(),
            Ok(None) => true,
            Err(_) => false,
        })
    }

    fn purge_now(&self, id: &str, rec: &JobRecord) {
        for a in &rec.allocs {
            if let Err(e) = self.allocs.delete(a) {
                tracing::warn!(alloc_id = %a, error = %e, "cannot forget the alloc");
                return;
            }
            self.runners
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(a);
        }
        if let Err(e) = self.store.delete(Table::JOBS, id) {
            tracing::warn!(job_id = %id, error = %e, "cannot forget the job");
            return;
        }
        tracing::info!(job_id = %id, "job purged");
        self.publish_job("JobPurged", rec);
    }

    /// Stops one alloc of this node (its tasks stop, then its volumes are released).
    pub fn stop_one(&self, alloc_id: &str) -> Result<AllocStatus, ApiError> {
        let runner = self.runner(alloc_id).ok_or_else(|| {
            ApiError::NotFound(format!("no alloc {alloc_id:?} runs on this node"))
        })?;
        runner.stop();
        Ok(runner.status())
    }

    /// Restarts an alloc's running tasks (or `task`), not counting against their policy.
    pub fn restart_one(
        &self,
        alloc_id: &str,
        task: Option<&str>,
    ) -> Result<AllocActionResponse, ApiError> {
        let runner = self.runner(alloc_id).ok_or_else(|| {
            ApiError::NotFound(format!("no alloc {alloc_id:?} runs on this node"))
        })?;
        let tasks = runner
            .restart(task)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        if tasks.is_empty() {
            return Err(ApiError::Conflict(format!(
                "alloc {alloc_id:?} has no running task{} to restart",
                task.map(|t| format!(" {t:?}")).unwrap_or_default()
            )));
        }
        Ok(AllocActionResponse {
            alloc_id: alloc_id.to_owned(),
            tasks,
        })
    }

    /// Sends `signal` (`SIGHUP`, `HUP`, `1`) to an alloc's running tasks (or `task`).
    pub fn signal_one(
        &self,
        alloc_id: &str,
        task: Option<&str>,
        signal: &str,
    ) -> Result<AllocActionResponse, ApiError> {
        let sig = parse_signal(signal)?;
        let runner = self.runner(alloc_id).ok_or_else(|| {
            ApiError::NotFound(format!("no alloc {alloc_id:?} runs on this node"))
        })?;
        let tasks = runner
            .signal(task, sig)
            .map_err(|e| ApiError::BadRequest(e.to_string()))?;
        if tasks.is_empty() {
            return Err(ApiError::Conflict(format!(
                "alloc {alloc_id:?}: no running task{} took {sig}",
                task.map(|t| format!(" {t:?}")).unwrap_or_default()
            )));
        }
        Ok(AllocActionResponse {
            alloc_id: alloc_id.to_owned(),
            tasks,
        })
    }
}

/// `SIGHUP`, `HUP`, `hup` or a number.
fn parse_signal(s: &str) -> Result<Signal, ApiError> {
    let bad = || {
        ApiError::BadRequest(format!(
            "`signal`: {} is not a signal (like SIGHUP, HUP or 1)",
            berth_input::quoted(s)
        ))
    };
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>().map_err(|_| bad())
}

/// Replaces every `mount_flags` value in `v` with `[REDACTED]`.
fn redact_mount_flags(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                if k == "mount_flags" {
                    let empty = child.as_array().is_some_and(Vec::is_empty);
                    if !empty {
                        *child = serde_json::Value::String(berth_csi::REDACTED.to_owned());
                    }
                } else {
                    redact_mount_flags(child);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_mount_flags),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_read_by_name_or_number() {
        assert_eq!(parse_signal("SIGHUP").unwrap(), Signal::SIGHUP);
        assert_eq!(parse_signal("hup").unwrap(), Signal::SIGHUP);
        assert_eq!(parse_signal("15").unwrap(), Signal::SIGTERM);
        let e = parse_signal("SIGNOPE").unwrap_err().to_string();
        assert!(e.contains("`signal`") && e.contains("\"SIGNOPE\""), "{e}");
    }

    #[test]
    fn mount_flags_are_redacted_wherever_they_are() {
        let mut v = serde_json::json!({
            "groups": [{"volumes": {"d": {"mount_options": {"mount_flags": ["password=x"], "fs_type": "ext4"}}}}],
            "mount_flags": []
        });
        redact_mount_flags(&mut v);
        let text = v.to_string();
        assert!(!text.contains("password"), "{text}");
        assert!(
            text.contains("[REDACTED]") && text.contains("ext4"),
            "{text}"
        );
    }
}
