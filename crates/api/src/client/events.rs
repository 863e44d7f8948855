//! Reading newline-delimited JSON: `GET /v1/events` ([`EventLine`]s) and
//! `GET /v1/event/stream` ([`StreamLine`](crate::stream::StreamLine)s).

use futures::Stream;
use http_body_util::BodyExt as _;
use hyper::{Method, body::Incoming};
use serde::de::DeserializeOwned;

use super::{ClientError, ConnTask};
use crate::types::EventLine;

/// Longest line a [`LineStream`] accepts, in bytes.
pub const MAX_EVENT_LINE: usize = 1 << 20;

/// The agent's live events (`GET /v1/events`).
pub type EventStream = LineStream<EventLine>;

/// The agent's event stream (`GET /v1/event/stream`).
pub type StreamReader = LineStream<crate::stream::StreamLine>;

/// A response read line by line, each line one `T`. Holds its connection: dropping it
/// disconnects.
#[derive(Debug)]
pub struct LineStream<T> {
    address: String,
    path: String,
    body: Incoming,
    buf: Vec<u8>,
    done: bool,
    /// The newest event index when the agent answered (its `x-berth-index` header).
    index: Option<u64>,
    _conn: ConnTask,
    _line: std::marker::PhantomData<fn() -> T>,
}

impl LineStream<crate::stream::StreamLine> {
    /// Reads on until an event for which `matches` holds; `None` when the stream ends first.
    pub async fn first_event(
        &mut self,
        mut matches: impl FnMut(&crate::stream::StreamEvent) -> bool,
    ) -> Result<Option<crate::stream::StreamEvent>, ClientError> {
        while let Some(line) = self.next().await {
            if let crate::stream::StreamLine::Events { events, .. } = line?
                && let Some(e) = events.into_iter().find(&mut matches)
            {
                return Ok(Some(e));
            }
        }
        Ok(None)
    }
}

impl<T: DeserializeOwned + Send> LineStream<T> {
    pub(super) fn new(
        address: String,
        path: String,
        index: Option<u64>,
        body: Incoming,
        conn: ConnTask,
    ) -> Self {
        Self {
            address,
            path,
            body,
            buf: Vec::new(),
            done: false,
            index,
            _conn: conn,
            _line: std::marker::PhantomData,
        }
    }

    /// The newest event index when the agent answered, when it said.
    pub fn index(&self) -> Option<u64> {
        self.index
    }

    /// The next line; `None` once the agent has ended the stream (it shuts down) or after an
    /// error has been returned. Cancel-safe: dropping the future loses no line.
    pub async fn next(&mut self) -> Option<Result<T, ClientError>> {
        if self.done {
            return None;
        }
        let line = self.next_line().await;
        if !matches!(line, Some(Ok(_))) {
            self.done = true;
        }
        line
    }

    /// The lines as a [`Stream`].
    pub fn into_stream(self) -> impl Stream<Item = Result<T, ClientError>> + Send {
        futures::stream::unfold(self, |mut events| async move {
            events.next().await.map(|line| (line, events))
        })
    }

    async fn next_line(&mut self) -> Option<Result<T, ClientError>> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = &line[..end];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(
                    serde_json::from_slice(line).map_err(|source| ClientError::Decode {
                        address: self.address.clone(),
                        method: Method::GET,
                        path: self.path.clone(),
                        source,
                    }),
                );
            }
            if self.buf.len() > MAX_EVENT_LINE {
                return Some(Err(
                    self.broken(format!("a line is longer than {MAX_EVENT_LINE} bytes"))
                ));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(source)) => {
                    return Some(Err(ClientError::Http {
                        address: self.address.clone(),
                        method: Method::GET,
                        path: self.path.clone(),
                        source,
                    }));
                }
                None if self.buf.iter().all(u8::is_ascii_whitespace) => return None,
                None => return Some(Err(self.broken("it ended in the middle of a line".into()))),
            }
        }
    }

    fn broken(&self, reason: String) -> ClientError {
        ClientError::EventStream {
            address: self.address.clone(),
            reason,
        }
    }
}
