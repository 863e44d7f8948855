//! Reading request bodies: at most [`MAX_BODY_BYTES`], within [`BODY_READ_TIMEOUT`]. Every
//! route that takes a body reads it here; nothing else reads one.

use std::time::Duration;

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, header},
};
use http_body_util::{BodyExt as _, LengthLimitError, Limited};

use super::{ApiError, Refusal};

/// Largest request body, in bytes; a larger one is answered 413 without being read further.
/// Room for a spec of [`crate::volumes::MAX_SPEC_BYTES`] escaped in a JSON string.
pub const MAX_BODY_BYTES: usize = 2 * crate::volumes::MAX_SPEC_BYTES;

/// How long a client may take to send its request body once the head is in; a slower one is
/// answered 408.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The whole body. A `Content-Length` over [`MAX_BODY_BYTES`] is refused before any of it is
/// read; a body that grows past the limit is refused as soon as it does.
pub(super) async fn read(headers: &HeaderMap, body: Body) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(Refusal::TooLarge);
    }
    let collected = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(body, MAX_BODY_BYTES).collect(),
    )
    .await
    .map_err(|_| Refusal::TooSlow)?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(Refusal::TooLarge),
        Err(_) => Err(Refusal::Api(ApiError::BadRequest(
            "the request body could not be read".into(),
        ))),
    }
}
