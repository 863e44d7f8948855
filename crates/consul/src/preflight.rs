//! Waiting for a fresh token to become usable.

use std::time::Duration;

use rand::Rng as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{AclToken, Client, ConsulError};

/// The shortest pause between two checks, whatever `base_interval` says.
const MIN_INTERVAL: Duration = Duration::from_millis(1);

impl Client {
    /// Waits until Consul accepts `token` (a fresh login token may answer `403 ACL not found`
    /// until it has replicated), as Nomad's client does before handing a token to a task.
    ///
    /// Checks with [`Client::token_self`] at once, then after pauses drawn between
    /// `base_interval` and twice that, each check bounded by the time left. Ok at the first
    /// success; after `timeout`, the last error Consul answered (or a
    /// [`ConsulError::Timeout`] when no check got an answer); when `cancel` fires,
    /// [`ConsulError::Cancelled`].
    pub async fn preflight(
        &self,
        token: &AclToken,
        timeout: Duration,
        base_interval: Duration,
        cancel: &CancellationToken,
    ) -> Result<(), ConsulError> {
        let base = base_interval.max(MIN_INTERVAL);
        let deadline = Instant::now() + timeout;
        let mut last: Option<ConsulError> = None;
        loop {
            let check = tokio::time::timeout_at(deadline, self.token_self(token));
            let outcome = tokio::select! {
                () = cancel.cancelled() => return Err(cancelled()),
                outcome = check => outcome,
            };
            match outcome {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(error)) => last = Some(error),
                Err(_elapsed) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let pause = jittered(base).min(deadline - now);
            tokio::select! {
                () = cancel.cancelled() => return Err(cancelled()),
                () = tokio::time::sleep(pause) => {}
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        Err(last.unwrap_or_else(|| ConsulError::Timeout {
            method: "GET",
            path: "/v1/acl/token/self",
            address: self.address().to_owned(),
            timeout,
        }))
    }
}

fn cancelled() -> ConsulError {
    ConsulError::Cancelled {
        operation: "token preflight check",
    }
}

/// A pause drawn uniformly between `base` and `2 * base`.
fn jittered(base: Duration) -> Duration {
    let nanos = u64::try_from(base.as_nanos()).unwrap_or(u64::MAX / 2);
    base + Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stay_between_base_and_twice_base() {
        let base = Duration::from_millis(100);
        for _ in 0..1000 {
            let pause = jittered(base);
            assert!(pause >= base && pause <= 2 * base, "{pause:?}");
        }
    }
}
