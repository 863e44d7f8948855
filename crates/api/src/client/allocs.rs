//! The alloc stream calls: a task's log as bytes (`GET /v1/client/fs/logs/{alloc_id}`), and a
//! command run in a task over an upgraded connection (`POST
//! /v1/client/allocation/{alloc_id}/exec`, framed as [`crate::allocs`] says). The response
//! head is bounded by the client's timeout; the streams themselves by nothing.

use http_body_util::{BodyExt as _, Full};
use hyper::{
    Method, StatusCode,
    body::{Bytes, Incoming},
    header,
    upgrade::Upgraded,
};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt as _, ReadHalf, WriteHalf};

use super::{Client, ClientError, ConnTask, encode_segment};
use crate::allocs::{EXEC_PROTOCOL, ExecRequest, Frame, LogsRequest};

/// A query value or path segment, percent-encoded (see the client's path encoding).
pub(crate) fn encode_component(value: &str) -> String {
    encode_segment(value)
}

/// A task's log as it arrives. Holds its connection: dropping it disconnects.
#[derive(Debug)]
pub struct LogBytes {
    address: String,
    path: String,
    body: Incoming,
    _conn: ConnTask,
}

impl LogBytes {
    /// The next bytes; `None` once the agent ended the stream.
    pub async fn next(&mut self) -> Option<Result<Bytes, ClientError>> {
        loop {
            match self.body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Some(Ok(data));
                    }
                }
                Err(source) => {
                    return Some(Err(ClientError::Http {
                        address: self.address.clone(),
                        method: Method::GET,
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
        }
    }
}

/// A command running in a task: its frames from the agent, and a way to send it frames.
#[derive(Debug)]
pub struct ExecStream {
    /// Frames from the agent.
    pub frames: ExecFrames,
    /// Frames to the agent.
    pub input: ExecInput,
}

/// The frames the agent sends for a command: output, then its exit.
#[derive(Debug)]
pub struct ExecFrames {
    address: String,
    path: String,
    read: ReadHalf<TokioIo<Upgraded>>,
    _conn: ConnTask,
}

impl ExecFrames {
    /// The next frame; `Ok(None)` when the agent closed the stream (after [`Frame::Exit`], or
    /// without it when the agent shut down).
    pub async fn next(&mut self) -> Result<Option<Frame>, ClientError> {
        Frame::read(&mut self.read)
            .await
            .map_err(|source| ClientError::Stream {
                address: self.address.clone(),
                path: self.path.clone(),
                source,
            })
    }
}

/// Sends frames (input, its end, resizes) to a command.
#[derive(Debug)]
pub struct ExecInput {
    address: String,
    path: String,
    write: WriteHalf<TokioIo<Upgraded>>,
}

impl ExecInput {
    /// Sends one frame.
    pub async fn send(&mut self, frame: &Frame) -> Result<(), ClientError> {
        let sent = async {
            self.write.write_all(&frame.encode()).await?;
            self.write.flush().await
        };
        sent.await.map_err(|source| ClientError::Stream {
            address: self.address.clone(),
            path: self.path.clone(),
            source,
        })
    }
}

impl Client {
    /// `GET /v1/client/fs/logs/{alloc_id}`: the task's log from where `req` says, as the
    /// agent sends it; a `follow` stream goes on until the alloc is terminal and everything
    /// was sent. A bad request is a 400 naming the parameter, an unknown alloc or task a 404.
    pub async fn alloc_logs(&self, req: &LogsRequest) -> Result<LogBytes, ClientError> {
        let path = format!(
            "/v1/client/fs/logs/{}?{}",
            encode_segment(&req.alloc_id),
            req.query()
        );
        let (response, conn) = self
            .timed(
                self.timeout,
                &Method::GET,
                &path,
                self.send(Method::GET, &path, None),
            )
            .await?;
        let response = self.check_status(&Method::GET, &path, response).await?;
        Ok(LogBytes {
            address: self.name.clone(),
            path,
            body: response.into_body(),
            _conn: conn,
        })
    }

    /// `POST /v1/client/allocation/{alloc_id}/exec`: starts the command and returns its
    /// stream once the connection is upgraded. Refusals (bad command, unknown alloc or task,
    /// a task that does not run) are the agent's errors, as for any call.
    pub async fn alloc_exec(&self, req: &ExecRequest) -> Result<ExecStream, ClientError> {
        let path = format!(
            "/v1/client/allocation/{}/exec?{}",
            encode_segment(&req.alloc_id),
            req.query()
        );
        let method = Method::POST;
        let (io, conn) = self
            .timed(self.timeout, &method, &path, self.upgrade(&path))
            .await?;
        let (read, write) = tokio::io::split(io);
        Ok(ExecStream {
            frames: ExecFrames {
                address: self.name.clone(),
                path: path.clone(),
                read,
                _conn: conn,
            },
            input: ExecInput {
                address: self.name.clone(),
                path,
                write,
            },
        })
    }

    /// Connects, asks for an upgrade to [`EXEC_PROTOCOL`] and waits for it.
    async fn upgrade(&self, path: &str) -> Result<(TokioIo<Upgraded>, ConnTask), ClientError> {
        let method = Method::POST;
        let (stream, host) = self.connect().await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| self.http_error(&method, path, source))?;
        let task = tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "agent API connection ended with an error");
            }
        });
        let conn = ConnTask(task);
        let request = self
            .request_head(&method, path, &host)?
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, EXEC_PROTOCOL);
        let request =
            request
                .body(Full::new(Bytes::new()))
                .map_err(|source| ClientError::BuildRequest {
                    method: method.clone(),
                    path: path.to_string(),
                    source,
                })?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|source| self.http_error(&method, path, source))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let response = self.check_status(&method, path, response).await?;
            return Err(ClientError::Stream {
                address: self.name.clone(),
                path: path.to_string(),
                source: std::io::Error::other(format!(
                    "the agent answered {} instead of switching to {EXEC_PROTOCOL}",
                    response.status()
                )),
            });
        }
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|source| self.http_error(&method, path, source))?;
        Ok((TokioIo::new(upgraded), conn))
    }
}
