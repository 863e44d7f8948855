//! How failed volume steps become API errors.

use berth_csi::{Code, CsiError};

use super::*;

/// The API error for a plugin's refusal of a call ([`CsiError::is_refusal`]): a 4xx that names
/// the plugin, the call and the plugin's reason. `None` for any other failure.
fn refusal(text: String, source: &CsiError) -> Option<ApiError> {
    if !source.is_refusal() {
        return None;
    }
    Some(match source.code() {
        Code::InvalidArgument | Code::OutOfRange => ApiError::BadRequest(text),
        Code::AlreadyExists | Code::FailedPrecondition => ApiError::Conflict(text),
        _ => ApiError::Unprocessable(text),
    })
}

pub(super) fn cp_error(e: ControlPlaneError) -> ApiError {
    cp_api_error(&e)
}

fn cp_api_error(e: &ControlPlaneError) -> ApiError {
    if let ControlPlaneError::Csi { source, .. } = e
        && let Some(api) = refusal(e.to_string(), source)
    {
        return api;
    }
    match e {
        ControlPlaneError::NoVolume(_) => ApiError::NotFound(e.to_string()),
        ControlPlaneError::Invalid(_) => ApiError::BadRequest(e.to_string()),
        ControlPlaneError::Refused { .. } | ControlPlaneError::Conflict(_) => {
            ApiError::Conflict(e.to_string())
        }
        ControlPlaneError::Unavailable { .. } | ControlPlaneError::Backend(_) => {
            ApiError::Unavailable(e.to_string())
        }
        ControlPlaneError::Csi { .. } | ControlPlaneError::Store(_) => {
            ApiError::Internal(error_chain(e))
        }
    }
}

pub(super) fn vol_error(e: &VolumeError) -> ApiError {
    if let VolumeError::Csi { source, .. } = e
        && let Some(api) = refusal(e.to_string(), source)
    {
        return api;
    }
    match e {
        VolumeError::InvalidPath { .. } => ApiError::BadRequest(error_chain(e)),
        VolumeError::Conflict { .. } => ApiError::Conflict(error_chain(e)),
        _ => ApiError::Internal(error_chain(e)),
    }
}

/// An error and its sources, `: `-joined. Every error in these chains is already free of
/// secrets and mount flags.
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// A failed step of a claim or release, for the background retry.
#[derive(Debug)]
pub(super) enum StepError {
    Cp(ControlPlaneError),
    Node(VolumeError),
    Api(ApiError),
}

impl StepError {
    /// What the API answers for it (not yet scrubbed of the volume's secrets).
    pub(super) fn text(&self) -> String {
        match self {
            Self::Cp(e) => cp_api_error(e).to_string(),
            Self::Node(e) => vol_error(e).to_string(),
            Self::Api(e) => e.to_string(),
        }
    }

    /// Whether trying again may help.
    pub(super) fn is_retryable(&self) -> bool {
        match self {
            Self::Cp(
                ControlPlaneError::Unavailable { .. }
                | ControlPlaneError::Store(_)
                | ControlPlaneError::Backend(_),
            ) => true,
            Self::Cp(ControlPlaneError::Csi { source, .. }) => source.is_retryable(),
            Self::Cp(_) => false,
            Self::Node(VolumeError::Csi { source, .. }) => source.is_retryable(),
            Self::Node(
                VolumeError::Cancelled { .. }
                | VolumeError::Store { .. }
                | VolumeError::Dir { .. }
                | VolumeError::MountTable(_),
            ) => true,
            Self::Node(_) => false,
            Self::Api(e) => matches!(e, ApiError::Unavailable(_) | ApiError::Internal(_)),
        }
    }

    pub(super) fn into_api(self) -> ApiError {
        match self {
            Self::Cp(e) => cp_api_error(&e),
            Self::Node(e) => vol_error(&e),
            Self::Api(e) => e,
        }
    }
}
