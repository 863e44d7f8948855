//! The error of a CSI call: which RPC, which code, whether a retry may help, and whether
//! `NOT_FOUND` means the work is already done.

use std::time::Duration;

use tonic::Code;

use crate::{endpoint::EndpointError, model::ModelError, retry::Rpc};

/// A failed CSI call. Messages from the plugin are scrubbed of the call's secrets and mount
/// flags, stripped of control characters and bounded in length before they land here.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// The plugin answered with an error the policy does not retry.
    #[error("{rpc} failed with {} after {attempts} attempt(s): {message}", code_name(*code))]
    Rpc {
        /// The RPC.
        rpc: Rpc,
        /// The gRPC status code.
        code: Code,
        /// The plugin's message, sanitized.
        message: String,
        /// Attempts made.
        attempts: u32,
        /// Whether `NOT_FOUND` here means "already done" (unpublish, unstage, delete).
        already_done: bool,
    },
    /// Retryable failures went on until the overall deadline.
    #[error("{rpc} gave up after {attempts} attempt(s) in {elapsed:?} (overall deadline {deadline:?}); last: {}: {message}", code_name(*code))]
    Exhausted {
        /// The RPC.
        rpc: Rpc,
        /// Code of the last attempt.
        code: Code,
        /// Message of the last attempt, sanitized.
        message: String,
        /// Attempts made.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
        /// The overall deadline.
        deadline: Duration,
    },
    /// The caller cancelled the call; the plugin may or may not have acted on it.
    #[error("{rpc} was cancelled after {attempts} attempt(s)")]
    Cancelled {
        /// The RPC.
        rpc: Rpc,
        /// Attempts started.
        attempts: u32,
    },
    /// The socket is unusable in a way no retry fixes (or it stayed so until the deadline).
    #[error("{rpc}: {source}")]
    Endpoint {
        /// The RPC.
        rpc: Rpc,
        /// What is wrong with the socket.
        #[source]
        source: EndpointError,
    },
    /// The request was refused before it was sent.
    #[error("{rpc}: invalid request: {source}")]
    InvalidRequest {
        /// The RPC.
        rpc: Rpc,
        /// Which field, and why.
        #[source]
        source: ModelError,
    },
    /// The plugin's answer does not make sense.
    #[error("{rpc}: invalid response from plugin: {source}")]
    InvalidResponse {
        /// The RPC.
        rpc: Rpc,
        /// Which field, and why.
        #[source]
        source: ModelError,
    },
}

pub(crate) fn code_name(code: Code) -> String {
    // `Code::Unavailable` → `UNAVAILABLE`
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

impl CsiError {
    /// The RPC that failed.
    pub fn rpc(&self) -> Rpc {
        match self {
            Self::Rpc { rpc, .. }
            | Self::Exhausted { rpc, .. }
            | Self::Cancelled { rpc, .. }
            | Self::Endpoint { rpc, .. }
            | Self::InvalidRequest { rpc, .. }
            | Self::InvalidResponse { rpc, .. } => *rpc,
        }
    }

    /// The gRPC code this amounts to.
    pub fn code(&self) -> Code {
        match self {
            Self::Rpc { code, .. } | Self::Exhausted { code, .. } => *code,
            Self::Cancelled { .. } => Code::Cancelled,
            Self::Endpoint { .. } => Code::Unavailable,
            Self::InvalidRequest { .. } => Code::InvalidArgument,
            Self::InvalidResponse { .. } => Code::Internal,
        }
    }

    /// Whether trying the same call again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Rpc { rpc, code, .. } => rpc.policy().retries(*code),
            Self::Exhausted { .. } => true,
            Self::Endpoint { source, .. } => source.is_transient(),
            Self::Cancelled { .. } | Self::InvalidRequest { .. } | Self::InvalidResponse { .. } => {
                false
            }
        }
    }

    /// True when the plugin said `NOT_FOUND` to a teardown call (unpublish, unstage, delete):
    /// the thing is already gone, which is what the caller wanted.
    pub fn is_already_done(&self) -> bool {
        matches!(
            self,
            Self::Rpc {
                already_done: true,
                ..
            }
        )
    }

    /// True when the call was cancelled by the caller.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }
}

/// Longest plugin message kept.
const MAX_MESSAGE: usize = 1024;

/// Removes every sensitive value from a plugin's message, strips control characters and bounds
/// its length.
pub(crate) fn sanitize(message: &str, sensitive: &[String]) -> String {
    let mut out = message.to_string();
    // Longest first, so a value that contains another is replaced whole.
    let mut values: Vec<&String> = sensitive.iter().filter(|v| !v.is_empty()).collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for v in values {
        out = out.replace(v.as_str(), crate::REDACTED);
    }
    let mut out: String = out
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_scrubs_values_controls_and_length() {
        let s = sanitize(
            "bad pw hunter2\nand hunter22 flag uid=7",
            &["hunter2".into(), "hunter22".into(), "uid=7".into()],
        );
        assert_eq!(s, "bad pw [REDACTED] and [REDACTED] flag [REDACTED]");
        let long = sanitize(&"é".repeat(2000), &[]);
        assert!(long.len() <= MAX_MESSAGE + '…'.len_utf8());
    }

    #[test]
    fn display_names_rpc_code_and_attempts() {
        let e = CsiError::Rpc {
            rpc: Rpc::NodeStageVolume,
            code: Code::InvalidArgument,
            message: "volume_id missing".into(),
            attempts: 1,
            already_done: false,
        };
        assert_eq!(
            e.to_string(),
            "NodeStageVolume failed with INVALID_ARGUMENT after 1 attempt(s): volume_id missing"
        );
        assert!(!e.is_retryable() && !e.is_already_done());
    }
}
