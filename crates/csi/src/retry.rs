//! The retry policy of every CSI RPC, in one table.
//!
//! Every CSI RPC is idempotent by spec, so each one retries `UNAVAILABLE`,
//! `RESOURCE_EXHAUSTED` and `DEADLINE_EXCEEDED`; those that act on one volume or snapshot also
//! retry `ABORTED` ("an operation is pending for it"). List calls do not, because there
//! `ABORTED` means a stale paging token. Where the spec's recovery column says the caller must
//! change something first, the call fails at once: `RESOURCE_EXHAUSTED` from CreateVolume (no
//! capacity in the requested topology), ControllerPublishVolume (the node has its maximum of
//! volumes) and CreateSnapshot (no space); every `INVALID_ARGUMENT`, `NOT_FOUND`,
//! `ALREADY_EXISTS`, `FAILED_PRECONDITION` and `OUT_OF_RANGE` is never retried. Delays grow
//! exponentially with jitter, each attempt has its own deadline, and the overall deadline bounds
//! the whole call.

use std::{fmt, time::Duration};

use rand::Rng as _;
use tonic::Code;

/// Declares [`Rpc`], [`Rpc::ALL`] and [`Rpc::path`] from one list, so they cannot drift.
macro_rules! rpcs {
    ($($service:ident { $($name:ident),+ $(,)? })+) => {
        /// Every RPC of the Identity, Controller and Node services.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)]
        pub enum Rpc {
            $($($name,)+)+
        }

        impl Rpc {
            /// Every RPC, in service order.
            pub const ALL: [Rpc; [$($(Rpc::$name),+),+].len()] = [$($(Rpc::$name,)+)+];

            /// The RPC's gRPC path, e.g. `/csi.v1.Identity/Probe`.
            pub const fn path(self) -> &'static str {
                match self {
                    $($(Rpc::$name => {
                        concat!("/csi.v1.", stringify!($service), "/", stringify!($name))
                    })+)+
                }
            }
        }
    };
}

rpcs!(
    Identity {
        GetPluginInfo,
        GetPluginCapabilities,
        Probe,
    }
    Controller {
        CreateVolume,
        DeleteVolume,
        ControllerPublishVolume,
        ControllerUnpublishVolume,
        ValidateVolumeCapabilities,
        ListVolumes,
        GetCapacity,
        ControllerGetCapabilities,
        CreateSnapshot,
        DeleteSnapshot,
        ListSnapshots,
        GetSnapshot,
        ControllerExpandVolume,
        ControllerGetVolume,
        ControllerModifyVolume,
    }
    Node {
        NodeStageVolume,
        NodeUnstageVolume,
        NodePublishVolume,
        NodeUnpublishVolume,
        NodeGetVolumeStats,
        NodeExpandVolume,
        NodeGetCapabilities,
        NodeGetInfo,
    }
);

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// How one RPC is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Deadline of a single attempt (also sent to the plugin as `grpc-timeout`).
    pub attempt_timeout: Duration,
    /// Deadline of the whole call, retries and waits included.
    pub overall_timeout: Duration,
    /// Wait before the second attempt; doubles after each retry, with jitter.
    pub initial_backoff: Duration,
    /// Upper bound of one wait.
    pub max_backoff: Duration,
    /// Whether `ABORTED` (operation pending) is retried.
    pub retry_aborted: bool,
    /// Whether `RESOURCE_EXHAUSTED` is retried (not where the spec says the caller must free
    /// something first).
    pub retry_exhausted: bool,
    /// Whether `NOT_FOUND` means the work is already done (unpublish, unstage, delete).
    pub not_found_is_done: bool,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn policy(
    attempt: u64,
    overall: u64,
    retry_aborted: bool,
    not_found_is_done: bool,
) -> RetryPolicy {
    RetryPolicy {
        attempt_timeout: secs(attempt),
        overall_timeout: secs(overall),
        initial_backoff: Duration::from_millis(100),
        max_backoff: secs(5),
        retry_aborted,
        retry_exhausted: true,
        not_found_is_done,
    }
}

/// [`policy`] for a call whose `RESOURCE_EXHAUSTED` the caller must act on before a retry.
const fn refuses_when_exhausted(policy: RetryPolicy) -> RetryPolicy {
    RetryPolicy {
        retry_exhausted: false,
        ..policy
    }
}

impl Rpc {
    /// The default policy of this RPC: the one table.
    pub const fn policy(self) -> RetryPolicy {
        use Rpc::*;
        //                                   attempt s, overall s, ABORTED, NOT_FOUND = done
        match self {
            Probe => RetryPolicy {
                attempt_timeout: secs(1),
                overall_timeout: secs(2),
                initial_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                retry_aborted: false,
                retry_exhausted: true,
                not_found_is_done: false,
            },
            GetPluginInfo => policy(5, 15, false, false),
            GetPluginCapabilities => policy(5, 15, false, false),
            ControllerGetCapabilities => policy(5, 15, false, false),
            NodeGetCapabilities => policy(5, 15, false, false),
            NodeGetInfo => policy(5, 15, false, false),
            CreateVolume => refuses_when_exhausted(policy(120, 300, true, false)),
            DeleteVolume => policy(120, 300, true, true),
            ControllerPublishVolume => refuses_when_exhausted(policy(60, 180, true, false)),
            ControllerUnpublishVolume => policy(60, 180, true, true),
            ValidateVolumeCapabilities => policy(30, 60, true, false),
            ListVolumes => policy(30, 60, false, false),
            GetCapacity => policy(30, 60, false, false),
            CreateSnapshot => refuses_when_exhausted(policy(120, 300, true, false)),
            DeleteSnapshot => policy(120, 300, true, true),
            ListSnapshots => policy(30, 60, false, false),
            GetSnapshot => policy(30, 60, true, false),
            ControllerExpandVolume => policy(120, 300, true, false),
            ControllerGetVolume => policy(30, 60, true, false),
            ControllerModifyVolume => policy(120, 300, true, false),
            NodeStageVolume => policy(60, 180, true, false),
            NodeUnstageVolume => policy(60, 180, true, true),
            NodePublishVolume => policy(60, 180, true, false),
            NodeUnpublishVolume => policy(60, 180, true, true),
            NodeGetVolumeStats => policy(10, 30, true, false),
            NodeExpandVolume => policy(120, 300, true, false),
        }
    }
}

impl RetryPolicy {
    /// This policy cut to one attempt of at most `timeout`, for a caller whose own loop is
    /// the retry: the first wait (at least half the initial backoff) lies past the deadline.
    pub fn single_attempt(self, timeout: Duration) -> Self {
        Self {
            attempt_timeout: timeout,
            overall_timeout: timeout,
            initial_backoff: timeout * 2,
            max_backoff: timeout * 2,
            ..self
        }
    }

    /// Whether a failure with `code` is tried again (time permitting).
    pub fn retries(&self, code: Code) -> bool {
        match code {
            Code::Unavailable | Code::DeadlineExceeded => true,
            Code::ResourceExhausted => self.retry_exhausted,
            Code::Aborted => self.retry_aborted,
            _ => false,
        }
    }

    /// The wait after failed attempt number `attempt` (1-based): exponential, capped, with
    /// "equal jitter" (a random point in the upper half of the step).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let step = self
            .initial_backoff
            .saturating_mul(
                1u32.checked_shl(attempt.saturating_sub(1))
                    .unwrap_or(u32::MAX),
            )
            .min(self.max_backoff);
        let half = step / 2;
        let jitter_ns = rand::rng().random_range(0..=half.as_nanos().min(u64::MAX as u128) as u64);
        half + Duration::from_nanos(jitter_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_attempt_policy_waits_past_its_deadline_and_keeps_the_rest() {
        let base = Rpc::NodeUnpublishVolume.policy();
        let one = base.single_attempt(Duration::from_secs(2));
        assert_eq!(one.attempt_timeout, Duration::from_secs(2));
        assert_eq!(one.overall_timeout, Duration::from_secs(2));
        // Jitter takes at most half off the first wait: it still ends after the deadline.
        assert!(one.initial_backoff / 2 >= one.overall_timeout);
        assert_eq!(
            (one.retry_aborted, one.not_found_is_done),
            (base.retry_aborted, base.not_found_is_done)
        );
    }

    #[test]
    fn transient_codes_retry_everywhere_and_aborted_only_where_pending() {
        let p = Rpc::NodeStageVolume.policy();
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::Aborted,
        ] {
            assert!(p.retries(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::Internal,
        ] {
            assert!(!p.retries(code), "{code:?}");
        }
        assert!(!Rpc::ListVolumes.policy().retries(Code::Aborted));
        assert!(Rpc::ListVolumes.policy().retries(Code::Unavailable));
    }

    #[test]
    fn resource_exhausted_fails_fast_where_the_caller_must_act() {
        use Rpc::*;
        for rpc in [CreateVolume, ControllerPublishVolume, CreateSnapshot] {
            assert!(!rpc.policy().retries(Code::ResourceExhausted), "{rpc}");
            assert!(rpc.policy().retries(Code::Unavailable), "{rpc}");
            assert!(rpc.policy().retries(Code::Aborted), "{rpc}");
        }
        for rpc in Rpc::ALL {
            for code in [
                Code::InvalidArgument,
                Code::NotFound,
                Code::AlreadyExists,
                Code::FailedPrecondition,
                Code::OutOfRange,
                Code::Unimplemented,
                Code::PermissionDenied,
                Code::Unauthenticated,
            ] {
                assert!(!rpc.policy().retries(code), "{rpc} {code:?}");
            }
        }
        assert!(NodeStageVolume.policy().retries(Code::ResourceExhausted));
    }

    #[test]
    fn not_found_means_done_only_for_teardown() {
        use Rpc::*;
        let done = [
            NodeUnpublishVolume,
            NodeUnstageVolume,
            ControllerUnpublishVolume,
            DeleteVolume,
            DeleteSnapshot,
        ];
        for rpc in done {
            assert!(rpc.policy().not_found_is_done, "{rpc}");
        }
        for rpc in [
            NodeStageVolume,
            NodePublishVolume,
            ControllerPublishVolume,
            CreateVolume,
        ] {
            assert!(!rpc.policy().not_found_is_done, "{rpc}");
        }
    }

    #[test]
    fn backoff_grows_with_jitter_and_is_capped() {
        let p = Rpc::NodeStageVolume.policy();
        for attempt in 1..40 {
            let step = (p.initial_backoff * 2u32.saturating_pow(attempt - 1)).min(p.max_backoff);
            let d = p.backoff(attempt);
            assert!(
                d >= step / 2 && d <= step,
                "attempt {attempt}: {d:?} vs {step:?}"
            );
        }
        let many: std::collections::HashSet<_> = (0..20).map(|_| p.backoff(5)).collect();
        assert!(many.len() > 1, "jitter must vary the delay");
    }

    #[test]
    fn every_attempt_fits_its_overall_deadline() {
        use Rpc::*;
        for rpc in Rpc::ALL {
            let p = rpc.policy();
            assert!(p.attempt_timeout < p.overall_timeout, "{rpc}");
        }
        assert!(Probe.policy().attempt_timeout <= Duration::from_secs(1));
    }
}
