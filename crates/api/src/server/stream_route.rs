//! `GET /v1/event/stream`: the agent's event window, then live events, as newline-delimited
//! JSON [`StreamLine`]s.

use std::{sync::Arc, time::Duration};

use axum::{
    Extension,
    body::{Body, Bytes},
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{AgentView, ApiError, extract::query_repeated, routes::Draining};
use crate::stream::{DEFAULT_HEARTBEAT, EventSource, HEARTBEAT_RANGE, StreamLine, TopicFilter};

/// Most events one line carries.
const EVENTS_PER_LINE: usize = 256;

/// The query of the stream: which events, from where, how often to heartbeat.
#[derive(Debug)]
struct StreamQuery {
    filter: TopicFilter,
    after: Option<u64>,
    heartbeat: Duration,
}

fn parse_query(raw: Option<&str>) -> Result<StreamQuery, ApiError> {
    let q = query_repeated(raw, &["topic", "index", "heartbeat"], &["topic"])?;
    let filter = TopicFilter::parse(
        q.get("topic")
            .into_iter()
            .flatten()
            .map(String::as_str)
            .filter(|t| !t.is_empty()),
    )?;
    let after = match q.get("index").and_then(|v| v.first()) {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::BadRequest(
                "query parameter `index`: expected the last index seen, a whole number".into(),
            )
        })?),
    };
    let heartbeat = match q.get("heartbeat").and_then(|v| v.first()) {
        None => DEFAULT_HEARTBEAT,
        Some(v) => parse_duration(v)
            .filter(|d| (HEARTBEAT_RANGE.0..=HEARTBEAT_RANGE.1).contains(d))
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "query parameter `heartbeat`: expected a duration from {} ms to {} s, \
                     like 500ms or 10s",
                    HEARTBEAT_RANGE.0.as_millis(),
                    HEARTBEAT_RANGE.1.as_secs()
                ))
            })?,
    };
    Ok(StreamQuery {
        filter,
        after,
        heartbeat,
    })
}

/// `250ms`, `10s`, `2m`.
fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        _ => None,
    }
}

/// Where one reader is.
struct Reader {
    source: Arc<dyn EventSource>,
    last: tokio::sync::watch::Receiver<u64>,
    cursor: u64,
    filter: TopicFilter,
    heartbeat: Duration,
    sent_at: Instant,
    stop: Option<CancellationToken>,
}

impl Reader {
    /// The next line, or `None` once the server drains or the agent's window is gone.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            // Mark the current index seen before reading, so an event appended after the read
            // wakes the wait below.
            self.last.borrow_and_update();
            let read = self.source.read_after(self.cursor, EVENTS_PER_LINE);
            if let Some(missed) = read.missed {
                self.cursor = missed.to;
                return Some(self.line(&StreamLine::Missed { missed }));
            }
            if let Some(newest) = read.events.last() {
                self.cursor = newest.index;
                let shown: Vec<&crate::stream::Published> = read
                    .events
                    .iter()
                    .filter(|e| self.filter.matches(e))
                    .collect();
                let Some(last_shown) = shown.last().map(|e| e.index) else {
                    continue;
                };
                self.sent_at = Instant::now();
                let json: Vec<&[u8]> = shown.iter().map(|e| &e.json[..]).collect();
                return Some(events_line(last_shown, &json));
            }
            let deadline = self.sent_at + self.heartbeat;
            let stop = self.stop.clone();
            tokio::select! {
                biased;
                () = async { if let Some(s) = &stop { s.cancelled().await } else { std::future::pending().await } } => return None,
                changed = self.last.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Some(self.line(&StreamLine::Heartbeat {}));
                }
            }
        }
    }

    fn line(&mut self, line: &StreamLine) -> Bytes {
        self.sent_at = Instant::now();
        let mut bytes = serde_json::to_vec(line).unwrap_or_else(|_| b"{}".to_vec());
        bytes.push(b'\n');
        Bytes::from(bytes)
    }
}

/// `{"Index":N,"Events":[…]}` from events serialized once.
fn events_line(index: u64, events: &[&[u8]]) -> Bytes {
    let mut out = Vec::with_capacity(32 + events.iter().map(|e| e.len() + 1).sum::<usize>());
    out.extend_from_slice(format!("{{\"Index\":{index},\"Events\":[").as_bytes());
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.extend_from_slice(b"]}\n");
    Bytes::from(out)
}

/// The route. Without `index`, the stream starts with the first event after the response
/// head; with `index=N`, with the first event after `N` the window still holds (a `Missed`
/// line first names any it no longer holds).
pub(super) async fn event_stream<V: AgentView>(
    State(view): State<Arc<V>>,
    RawQuery(raw): RawQuery,
    draining: Option<Extension<Draining>>,
) -> Result<Response, ApiError> {
    let q = parse_query(raw.as_deref())?;
    let source = view
        .event_source()
        .ok_or_else(|| ApiError::NotFound("this agent keeps no event stream".into()))?;
    let mut last = source.watch_last();
    let newest = *last.borrow_and_update();
    let cursor = q.after.unwrap_or(newest);
    let reader = Reader {
        source,
        last,
        cursor,
        filter: q.filter,
        heartbeat: q.heartbeat,
        sent_at: Instant::now(),
        stop: draining.map(|Extension(Draining(token))| token),
    };
    let lines = futures::stream::unfold(reader, |mut r| async move {
        let line = r.next_line().await?;
        Some((Ok::<_, std::convert::Infallible>(line), r))
    });
    Ok((
        [
            (header::CONTENT_TYPE, crate::EVENTS_CONTENT_TYPE.to_string()),
            (
                header::HeaderName::from_static(crate::INDEX_HEADER),
                newest.to_string(),
            ),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::MissedRange;

    #[test]
    fn queries_are_checked_by_parameter() {
        let q = parse_query(Some(
            "topic=Job:web&topic=Allocation&index=7&heartbeat=250ms",
        ))
        .unwrap();
        assert_eq!(q.after, Some(7));
        assert_eq!(q.heartbeat, Duration::from_millis(250));
        assert_eq!(q.filter.terms(), ["Job:web", "Allocation:*"]);
        let e = parse_query(Some("index=x")).unwrap_err().to_string();
        assert!(e.contains("`index`"), "{e}");
        let e = parse_query(Some("heartbeat=1ms")).unwrap_err().to_string();
        assert!(e.contains("`heartbeat`"), "{e}");
        let e = parse_query(Some("index=1&index=2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than once"), "{e}");
        let e = parse_query(Some("topic=Nope")).unwrap_err().to_string();
        assert!(e.contains("not a topic"), "{e}");
        assert!(parse_query(Some("tpoic=Job")).is_err());
    }

    #[test]
    fn events_lines_join_serialized_events() {
        let line = events_line(5, &[b"{\"a\":1}", b"{\"b\":2}"]);
        assert_eq!(
            &line[..],
            b"{\"Index\":5,\"Events\":[{\"a\":1},{\"b\":2}]}\n"
        );
        assert_eq!(
            serde_json::to_string(&StreamLine::Missed {
                missed: MissedRange { from: 1, to: 2 }
            })
            .unwrap(),
            r#"{"Missed":{"From":1,"To":2}}"#
        );
    }
}
