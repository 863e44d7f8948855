//! How the routes take their input: ids from the path and the query, and JSON bodies. Each
//! helper checks what it hands out, so a handler calls the agent only with checked input.

use std::collections::BTreeMap;

use axum::extract::{Path, Request, path::ErrorKind, rejection::PathRejection};
use serde::de::DeserializeOwned;

use super::{ApiError, Refusal, body, json};
use crate::{
    jobs::JobRunRequest,
    types::{InvalidField, RegisterRequest},
    volumes::{
        ClaimRequest, DetachRequest, ExpandRequest, ReleaseRequest, SnapshotCreateRequest,
        SnapshotDeleteRequest, VolumeSpecRequest,
    },
};

/// The one `{id}` of a route, checked as a path segment ([`berth_sys::validate_path_segment`]);
/// `kind` (`volume id`…) names it in errors.
pub(super) fn path_id(
    kind: &'static str,
    id: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let Path(id) = id.map_err(|e| path_error(kind, e))?;
    segment(kind, &id)?;
    Ok(id)
}

/// The two ids of a route, `kinds` in order, each checked as [`path_id`] checks one.
pub(super) fn path_ids(
    kinds: [&'static str; 2],
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String), ApiError> {
    let Path((a, b)) = ids.map_err(|e| path_error(&kinds.join(" and "), e))?;
    segment(kinds[0], &a)?;
    segment(kinds[1], &b)?;
    Ok((a, b))
}

/// A path-segment id anywhere (path, query); the error quotes it escaped and cut.
pub(super) fn segment(kind: &'static str, id: &str) -> Result<(), ApiError> {
    berth_sys::validate_path_segment(kind, id).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// A path parameter that axum could not decode; never repeats it.
fn path_error(what: &str, e: PathRejection) -> ApiError {
    match e {
        PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
            ErrorKind::InvalidUtf8InPathParam { .. } => {
                ApiError::BadRequest(format!("invalid {what}: not UTF-8 once percent-decoded"))
            }
            _ => ApiError::BadRequest(format!("invalid {what} in the path")),
        },
        _ => ApiError::Internal(format!("the route has no {what}")),
    }
}

/// The one id of `ids` that is `id` or starts with it (Nomad's id prefixes). Several are a 400
/// listing them (at most 20), so the caller can pick; none leaves `id` as given, for the view
/// to judge.
pub(super) fn resolve_prefix(
    what: &'static str,
    id: &str,
    ids: impl IntoIterator<Item = String>,
) -> Result<String, ApiError> {
    let mut matches: Vec<String> = Vec::new();
    for candidate in ids {
        if candidate == id {
            return Ok(candidate);
        }
        if candidate.starts_with(id) {
            matches.push(candidate);
        }
    }
    match matches.len() {
        1 => Ok(matches.remove(0)),
        0 => Ok(id.to_owned()),
        n => {
            matches.sort_unstable();
            let shown: Vec<&str> = matches.iter().take(20).map(String::as_str).collect();
            Err(ApiError::BadRequest(format!(
                "{what} id prefix {} matches {n} {what}s: {}{}",
                berth_input::quoted(id),
                shown.join(", "),
                if n > shown.len() { ", …" } else { "" }
            )))
        }
    }
}

/// The query parameters of a route that knows `allowed` names: each at most once. Any other
/// name is refused without being repeated (names are the client's text, like values), and so
/// is a query that is not UTF-8 once percent-decoded.
pub(super) fn query(
    raw: Option<&str>,
    allowed: &[&'static str],
) -> Result<BTreeMap<&'static str, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (known, value) in query_pairs(raw, allowed)? {
        if out.insert(known, value).is_some() {
            return Err(ApiError::BadRequest(format!(
                "query parameter `{known}` is given more than once"
            )));
        }
    }
    Ok(out)
}

/// Like [`query`], but the names in `repeatable` may come more than once (their values in
/// order).
pub(super) fn query_repeated(
    raw: Option<&str>,
    allowed: &[&'static str],
    repeatable: &[&'static str],
) -> Result<BTreeMap<&'static str, Vec<String>>, ApiError> {
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for (known, value) in query_pairs(raw, allowed)? {
        let values = out.entry(known).or_default();
        if !values.is_empty() && !repeatable.contains(&known) {
            return Err(ApiError::BadRequest(format!(
                "query parameter `{known}` is given more than once"
            )));
        }
        values.push(value);
    }
    Ok(out)
}

/// The decoded `(name, value)` pairs of a query, each name one of `allowed`.
fn query_pairs(
    raw: Option<&str>,
    allowed: &[&'static str],
) -> Result<Vec<(&'static str, String)>, ApiError> {
    let mut out = Vec::new();
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (decode_component(name)?, decode_component(value)?);
        let Some(known) = allowed.iter().find(|a| **a == name) else {
            let names: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
            return Err(ApiError::BadRequest(format!(
                "unknown query parameter; this route takes {}",
                names.join(", ")
            )));
        };
        out.push((*known, value));
    }
    Ok(out)
}

/// One `application/x-www-form-urlencoded` component: `+` is a space, `%XX` a byte; the bytes
/// must be UTF-8 (no lossy decoding: an id is used as sent or refused).
fn decode_component(text: &str) -> Result<String, ApiError> {
    let bad = || ApiError::BadRequest("the query string cannot be decoded as UTF-8".into());
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = rest.get(..2).ok_or_else(bad)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return Err(bad());
                }
                let hex = std::str::from_utf8(hex).map_err(|_| bad())?;
                bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
                rest = &rest[2..];
            }
            _ => bytes.push(b),
        }
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

/// A request body type: what errors call it and what it must satisfy beyond its shape.
pub(super) trait Body: DeserializeOwned {
    /// What errors call it, e.g. `claim request`.
    const WHAT: &'static str;
    /// Its `validate`.
    fn check(&self) -> Result<(), InvalidField>;
}

macro_rules! bodies {
    ($($ty:ty => $what:literal),+ $(,)?) => {
        $(impl Body for $ty {
            const WHAT: &'static str = $what;
            fn check(&self) -> Result<(), InvalidField> {
                self.validate()
            }
        })+
    };
}

bodies!(
    RegisterRequest => "registration",
    VolumeSpecRequest => "volume spec request",
    ClaimRequest => "claim request",
    ReleaseRequest => "release request",
    DetachRequest => "detach request",
    ExpandRequest => "expand request",
    SnapshotCreateRequest => "snapshot request",
    SnapshotDeleteRequest => "snapshot delete request",
    JobRunRequest => "job run request",
    crate::jobs::AllocActionRequest => "alloc request",
    crate::nodes::DrainRequest => "drain request",
    crate::acl::TokenCreateRequest => "token create request",
);

/// The request's JSON body as a `T` that passed [`Body::check`]. 413 when it is too large, 408
/// when it is too slow, 400 naming the field (never a value) when it does not parse or check.
pub(super) async fn json_body<T: Body>(req: Request) -> Result<T, Refusal> {
    let bytes = read(req).await?;
    checked(&bytes)
}

/// Like [`json_body`], with `T::default()` for an empty body.
pub(super) async fn json_body_or_default<T: Body + Default>(req: Request) -> Result<T, Refusal> {
    let bytes = read(req).await?;
    if bytes.is_empty() {
        return Ok(T::default());
    }
    checked(&bytes)
}

async fn read(req: Request) -> Result<axum::body::Bytes, Refusal> {
    let (parts, body) = req.into_parts();
    body::read(&parts.headers, body).await
}

fn checked<T: Body>(bytes: &[u8]) -> Result<T, Refusal> {
    let value: T = json::parse(T::WHAT, bytes)?;
    value.check()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_resolve_to_the_one_id_they_start() {
        let ids = || ["web-a1".to_string(), "web-a2".into(), "db-1".into()];
        assert_eq!(resolve_prefix("alloc", "db", ids()).unwrap(), "db-1");
        assert_eq!(resolve_prefix("alloc", "web-a1", ids()).unwrap(), "web-a1");
        assert_eq!(resolve_prefix("alloc", "zz", ids()).unwrap(), "zz");
        let e = resolve_prefix("alloc", "web", ids())
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "alloc id prefix \"web\" matches 2 allocs: web-a1, web-a2"
        );
        let exact = ["a".to_string(), "ab".into()];
        assert_eq!(resolve_prefix("job", "a", exact).unwrap(), "a");
    }

    #[test]
    fn query_components_decode_strictly() {
        assert_eq!(decode_component("a+b%2Fc%C3%A9").unwrap(), "a b/cé");
        for bad in ["%FF", "%C3", "%", "%4", "%G1", "%+1"] {
            assert!(decode_component(bad).is_err(), "{bad}");
        }
        let q = query(Some("force=true&&x"), &["force", "x"]).unwrap();
        assert_eq!(q.get("force").map(String::as_str), Some("true"));
        assert_eq!(q.get("x").map(String::as_str), Some(""));
        assert!(query(None, &["force"]).unwrap().is_empty());
    }
}
