//! Reading `GET /v1/events`: newline-delimited JSON, one [`EventLine`] per line.

use futures::Stream;
use http_body_util::BodyExt as _;
use hyper::{Method, body::Incoming};

use super::{ClientError, ConnTask};
use crate::types::EventLine;

/// Longest line [`EventStream`] accepts, in bytes.
pub const MAX_EVENT_LINE: usize = 1 << 20;

const PATH: &str = "/v1/events";

/// The agent's live events, read line by line. Holds its connection: dropping it disconnects.
#[derive(Debug)]
pub struct EventStream {
    address: String,
    body: Incoming,
    buf: Vec<u8>,
    done: bool,
    _conn: ConnTask,
}

impl EventStream {
    pub(super) fn new(address: String, body: Incoming, conn: ConnTask) -> Self {
        Self {
            address,
            body,
            buf: Vec::new(),
            done: false,
            _conn: conn,
        }
    }

    /// The next line; `None` once the agent has ended the stream (it shuts down) or after an
    /// error has been returned. Cancel-safe: dropping the future loses no line.
    pub async fn next(&mut self) -> Option<Result<EventLine, ClientError>> {
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
    pub fn into_stream(self) -> impl Stream<Item = Result<EventLine, ClientError>> + Send {
        futures::stream::unfold(self, |mut events| async move {
            events.next().await.map(|line| (line, events))
        })
    }

    async fn next_line(&mut self) -> Option<Result<EventLine, ClientError>> {
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
                        path: PATH.into(),
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
                        path: PATH.into(),
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
