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
    #[error("{rpc} gave up after {attempts} attempt(s) in {} (overall deadline {}); last: {}: {message}", berth_sys::short_duration(*elapsed), berth_sys::short_duration(*deadline), code_name(*code))]
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

/// The spec's name of a code: `UNAVAILABLE`, `NOT_FOUND`, `OK`.
pub fn code_name(code: Code) -> String {
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

    /// True when the plugin refused the call for a reason the caller must fix before trying
    /// again (the spec's recovery column): `INVALID_ARGUMENT`, `NOT_FOUND` (unless it means
    /// "already done"), `ALREADY_EXISTS`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`,
    /// `RESOURCE_EXHAUSTED` where it is not retried, `UNIMPLEMENTED`, `PERMISSION_DENIED`,
    /// `UNAUTHENTICATED`. Such a call was made once and not retried.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::Rpc {
                rpc,
                code,
                already_done,
                ..
            } => {
                !already_done
                    && !rpc.policy().retries(*code)
                    && matches!(
                        code,
                        Code::InvalidArgument
                            | Code::NotFound
                            | Code::AlreadyExists
                            | Code::FailedPrecondition
                            | Code::OutOfRange
                            | Code::ResourceExhausted
                            | Code::Unimplemented
                            | Code::PermissionDenied
                            | Code::Unauthenticated
                    )
            }
            _ => false,
        }
    }

    /// For a refusal ([`CsiError::is_refusal`]), what the caller is told:
    /// `plugin "<plugin_id>" refused <Rpc><about>: <the plugin's message> (<CODE>)`; `None` for
    /// any other failure.
    pub fn refusal_text(&self, plugin_id: &str, about: &str) -> Option<String> {
        match self {
            Self::Rpc {
                rpc, code, message, ..
            } if self.is_refusal() => Some(format!(
                "plugin {plugin_id:?} refused {rpc}{about}: {message} ({})",
                code_name(*code)
            )),
            _ => None,
        }
    }

    /// True when the call was cancelled by the caller.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Cancelled { .. })
    }
}

/// Longest plugin message kept.
const MAX_MESSAGE: usize = 1024;

/// Values shorter than this are only redacted where they stand as a whole word, so a flag like
/// `ro` does not blank out every "error" in a message.
const MIN_ANYWHERE: usize = 4;

/// Removes every sensitive value (secret values, mount flags) from a message, strips control
/// characters and bounds its length. The client already does this to plugin messages with the
/// values of the call; callers use it for texts built from several calls.
pub fn sanitize(message: &str, sensitive: &[String]) -> String {
    let mut out = message.to_string();
    // Longest first, so a value that contains another is replaced whole.
    let mut values: Vec<&String> = sensitive.iter().filter(|v| !v.is_empty()).collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    for v in values {
        out = if v.chars().count() >= MIN_ANYWHERE {
            out.replace(v.as_str(), crate::REDACTED)
        } else {
            replace_words(&out, v)
        };
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

/// Replaces `word` where no letter or digit touches it on either side.
fn replace_words(text: &str, word: &str) -> String {
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    for (at, _) in text.match_indices(word) {
        if at < rest {
            continue;
        }
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if !is_word(before) && !is_word(after) {
            out.push_str(&text[rest..at]);
            out.push_str(crate::REDACTED);
            rest = at + word.len();
        }
    }
    out.push_str(&text[rest..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc_err(rpc: Rpc, code: Code, already_done: bool) -> CsiError {
        CsiError::Rpc {
            rpc,
            code,
            message: "m".into(),
            attempts: 1,
            already_done,
        }
    }

    #[test]
    fn refusals_are_what_the_caller_must_fix() {
        use Rpc::*;
        assert!(rpc_err(CreateVolume, Code::ResourceExhausted, false).is_refusal());
        assert!(rpc_err(NodeStageVolume, Code::FailedPrecondition, false).is_refusal());
        assert!(rpc_err(ValidateVolumeCapabilities, Code::NotFound, false).is_refusal());
        assert!(!rpc_err(NodeUnstageVolume, Code::NotFound, true).is_refusal());
        assert!(!rpc_err(NodeStageVolume, Code::Internal, false).is_refusal());
        assert!(!rpc_err(NodeStageVolume, Code::Unavailable, false).is_refusal());
        assert_eq!(
            rpc_err(CreateVolume, Code::OutOfRange, false).refusal_text("hp", " for volume \"v\""),
            Some("plugin \"hp\" refused CreateVolume for volume \"v\": m (OUT_OF_RANGE)".into())
        );
        assert_eq!(
            rpc_err(NodeStageVolume, Code::Internal, false).refusal_text("hp", ""),
            None
        );
    }

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
    fn short_values_are_redacted_as_whole_words_only() {
        let s = sanitize(
            "error: ro refused (ro,x) for pw ab",
            &["ro".into(), "ab".into()],
        );
        assert_eq!(
            s,
            "error: [REDACTED] refused ([REDACTED],x) for pw [REDACTED]"
        );
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
