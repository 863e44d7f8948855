//! The restart policy (Nomad's restart tracker): `attempts` restarts within `interval`, each
//! after `delay`; then `fail`, or (`delay` mode) wait for the interval to end.

use std::time::{Duration, SystemTime};

use berth_drivers::ExitResult;
use berth_job::{RestartMode, RestartPolicy};

use crate::record::RestartWindow;

/// What to do after a task's process ended (or could not start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A batch task exited successfully: it is done.
    Done,
    /// Start it again after `delay`; `attempt` counts the restarts in the current interval.
    Restart { delay: Duration, attempt: u32 },
    /// Attempts used up in `fail` mode: the task fails.
    Fail,
}

/// Decides after an exit (`None`: the process never started or its end is unknown), and
/// updates `window`.
pub(crate) fn decide(
    policy: &RestartPolicy,
    window: &mut RestartWindow,
    now: SystemTime,
    batch: bool,
    exit: Option<&ExitResult>,
) -> Decision {
    if batch && exit.is_some_and(ExitResult::success) {
        return Decision::Done;
    }
    let in_window = window.start.is_some_and(|start| {
        now.duration_since(start)
            .is_ok_and(|elapsed| elapsed < policy.interval)
    });
    if !in_window {
        window.start = Some(now);
        window.count = 0;
    }
    window.count += 1;
    if window.count <= policy.attempts {
        return Decision::Restart {
            delay: policy.delay,
            attempt: window.count,
        };
    }
    match policy.mode {
        RestartMode::Fail => Decision::Fail,
        RestartMode::Delay => {
            // Wait out the interval; the next failure after it starts a new one.
            let end = window.start.unwrap_or(now) + policy.interval;
            Decision::Restart {
                delay: end
                    .duration_since(now)
                    .unwrap_or_default()
                    .max(policy.delay),
                attempt: window.count,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mode: RestartMode) -> RestartPolicy {
        RestartPolicy {
            attempts: 2,
            interval: Duration::from_secs(60),
            delay: Duration::from_secs(1),
            mode,
        }
    }

    fn code(c: i32) -> ExitResult {
        ExitResult {
            exit_code: Some(c),
            signal: None,
            oom_killed: false,
        }
    }

    #[test]
    fn fail_mode_fails_after_attempts_and_counts_again_after_the_interval() {
        let p = policy(RestartMode::Fail);
        let mut w = RestartWindow::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let restart = |attempt| Decision::Restart {
            delay: Duration::from_secs(1),
            attempt,
        };
        assert_eq!(decide(&p, &mut w, t0, false, Some(&code(1))), restart(1));
        assert_eq!(
            decide(&p, &mut w, t0 + Duration::from_secs(5), false, None),
            restart(2)
        );
        assert_eq!(
            decide(
                &p,
                &mut w,
                t0 + Duration::from_secs(10),
                false,
                Some(&code(0))
            ),
            Decision::Fail
        );
        let mut w = RestartWindow::default();
        decide(&p, &mut w, t0, false, None);
        decide(&p, &mut w, t0, false, None);
        assert_eq!(
            decide(&p, &mut w, t0 + Duration::from_secs(61), false, None),
            restart(1)
        );
    }

    #[test]
    fn delay_mode_waits_for_the_interval_to_end() {
        let p = policy(RestartMode::Delay);
        let mut w = RestartWindow::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        decide(&p, &mut w, t0, false, None);
        decide(&p, &mut w, t0, false, None);
        assert_eq!(
            decide(&p, &mut w, t0 + Duration::from_secs(20), false, None),
            Decision::Restart {
                delay: Duration::from_secs(40),
                attempt: 3
            }
        );
    }

    #[test]
    fn batch_success_is_done_service_success_restarts() {
        let p = policy(RestartMode::Fail);
        let mut w = RestartWindow::default();
        let now = SystemTime::now();
        assert_eq!(
            decide(&p, &mut w, now, true, Some(&code(0))),
            Decision::Done
        );
        assert_eq!(w, RestartWindow::default());
        assert!(matches!(
            decide(&p, &mut w, now, false, Some(&code(0))),
            Decision::Restart { .. }
        ));
        assert!(matches!(
            decide(&p, &mut w, now, true, Some(&ExitResult::UNKNOWN)),
            Decision::Restart { .. }
        ));
    }
}
