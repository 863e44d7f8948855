//! The csi hook: claims the group's volumes before the tasks start (prerun) and releases them
//! once every task is dead (postrun). Each claim is persisted before it is sent and after it
//! is answered.

use std::future::Future;

use berth_job::GroupSpec;
use berth_sys::short_duration;
use tokio_util::sync::CancellationToken;

use crate::{
    config::Backoff,
    record::{AllocEvent, EventKind},
    shared::Shared,
    volume_host::{VolumeHost, VolumeUse},
};

/// Why a prerun hook did not finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PrerunEnd {
    /// The agent is shutting down.
    Cancelled,
    /// A stop of the alloc was asked for.
    Stopped,
    /// The hook failed; the alloc fails.
    Failed(String),
}

/// Runs `fut` unless the agent shuts down or the alloc is stopped first.
pub(crate) async fn interruptible<T>(
    fut: impl Future<Output = T>,
    cancel: &CancellationToken,
    stop: &CancellationToken,
) -> Result<T, PrerunEnd> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(PrerunEnd::Cancelled),
        () = stop.cancelled() => Err(PrerunEnd::Stopped),
        v = fut => Ok(v),
    }
}

/// Claims every volume of `group` not claimed yet (a recovered alloc keeps its claims),
/// retrying retryable failures with `retry`. The first volume that cannot be claimed fails
/// the hook; what was claimed stays recorded for the postrun release.
pub(crate) async fn claim_volumes(
    shared: &Shared,
    host: &dyn VolumeHost,
    retry: Backoff,
    group: &GroupSpec,
    cancel: &CancellationToken,
    stop: &CancellationToken,
) -> Result<(), PrerunEnd> {
    let alloc_id = shared.alloc_id.clone();
    let attempts = retry.attempts.max(1);
    for (name, req) in &group.volumes {
        let Some(vol) = shared.read(|rec| rec.volumes.get(name).cloned()) else {
            return Err(PrerunEnd::Failed(format!(
                "volume {name} has no state in the alloc's record"
            )));
        };
        if vol.claimed && vol.target.is_some() {
            continue;
        }
        let volume_id = vol.volume_id;
        // Written before the claim is sent: if the agent stops before the answer, the
        // postrun hook still releases it.
        let _ = shared.update(|rec| {
            if let Some(v) = rec.volumes.get_mut(name) {
                v.claim_sent = true;
            }
        });
        let usage = VolumeUse {
            read_only: req.read_only,
            access_mode: req.access_mode,
            attachment_mode: req.attachment_mode,
            mount_options: req.csi_mount_options(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let claimed = interruptible(
                host.claim(&volume_id, &alloc_id, usage.clone()),
                cancel,
                stop,
            )
            .await?;
            match claimed {
                Ok(target) => {
                    let message = format!(
                        "volume {name} ({volume_id}) claimed{}, mounted at {}",
                        if req.read_only { " read-only" } else { "" },
                        target.display()
                    );
                    let _ = shared.update_with(
                        AllocEvent::new(None, EventKind::VolumeClaimed, message),
                        |rec| {
                            if let Some(v) = rec.volumes.get_mut(name) {
                                v.claimed = true;
                                v.target = Some(target);
                            }
                        },
                    );
                    break;
                }
                Err(e) if e.retryable && attempt < attempts => {
                    let delay = retry.delay(attempt);
                    shared.event(
                        None,
                        EventKind::VolumeClaimRetrying,
                        format!(
                            "claim of volume {name} ({volume_id}) failed (attempt {attempt} of {attempts}): {e}; retrying in {}",
                            short_duration(delay)
                        ),
                    );
                    interruptible(tokio::time::sleep(delay), cancel, stop).await?;
                }
                Err(e) => {
                    let why = if e.retryable {
                        format!("failed {attempts} times, the last time with: {e}")
                    } else {
                        format!("was refused: {e}")
                    };
                    let message = format!("claim of volume {name} ({volume_id}) {why}");
                    // An answered failure holds nothing (the volume side undoes a claim that
                    // failed half-way): no release is owed.
                    let _ = shared.update_with(
                        AllocEvent::new(None, EventKind::VolumeClaimFailed, message.clone()),
                        |rec| {
                            if let Some(v) = rec.volumes.get_mut(name) {
                                v.claim_sent = false;
                            }
                        },
                    );
                    return Err(PrerunEnd::Failed(message));
                }
            }
        }
    }
    Ok(())
}

/// Releases every volume a claim was sent for, retrying retryable failures with `retry`.
/// `Ok(true)` when all are released; a volume whose release failed for good stays recorded
/// (`Ok(false)`), so a later run of the hook tries again. `Err` when the agent shuts down.
pub(crate) async fn release_volumes(
    shared: &Shared,
    host: &dyn VolumeHost,
    retry: Backoff,
    cancel: &CancellationToken,
) -> Result<bool, ()> {
    let alloc_id = shared.alloc_id.clone();
    let attempts = retry.attempts.max(1);
    let never = CancellationToken::new();
    let held: Vec<(String, String)> = shared.read(|rec| {
        rec.volumes
            .iter()
            .filter(|(_, v)| v.claim_sent || v.claimed)
            .map(|(name, v)| (name.clone(), v.volume_id.clone()))
            .collect()
    });
    let mut all = true;
    for (name, volume_id) in held {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let released = interruptible(host.release(&volume_id, &alloc_id), cancel, &never)
                .await
                .map_err(|_| ())?;
            match released {
                Ok(()) => {
                    let _ = shared.update_with(
                        AllocEvent::new(
                            None,
                            EventKind::VolumeReleased,
                            format!("volume {name} ({volume_id}) released"),
                        ),
                        |rec| {
                            if let Some(v) = rec.volumes.get_mut(&name) {
                                v.claim_sent = false;
                                v.claimed = false;
                                v.target = None;
                            }
                        },
                    );
                    break;
                }
                Err(e) if e.retryable && attempt < attempts => {
                    let delay = retry.delay(attempt);
                    shared.event(
                        None,
                        EventKind::VolumeReleaseRetrying,
                        format!(
                            "release of volume {name} ({volume_id}) failed (attempt {attempt} of {attempts}): {e}; retrying in {}",
                            short_duration(delay)
                        ),
                    );
                    interruptible(tokio::time::sleep(delay), cancel, &never)
                        .await
                        .map_err(|_| ())?;
                }
                Err(e) => {
                    shared.event(
                        None,
                        EventKind::VolumeReleaseFailed,
                        format!(
                            "release of volume {name} ({volume_id}) failed: {e}; it stays claimed"
                        ),
                    );
                    all = false;
                    break;
                }
            }
        }
    }
    Ok(all)
}
