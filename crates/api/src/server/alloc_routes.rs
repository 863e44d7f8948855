//! The alloc routes over a [`JobView`]: a task's log as a byte stream, and a command run in a
//! task over an upgraded connection (see [`crate::allocs`] for the framing).

use std::sync::Arc;

use axum::{
    Extension, Router,
    body::{Body, Bytes},
    extract::{Path, Request, State, rejection::PathRejection},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures::StreamExt as _;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{ApiError, extract::query, routes::Draining};
use crate::{
    LOGS_CONTENT_TYPE,
    allocs::{EXEC_PROTOCOL, ExecRequest, ExecSession, Frame, LogsRequest, MAX_FRAME_PAYLOAD},
};

/// Most exec sessions the agent runs at once (an upgraded connection no longer holds one of
/// the server's connection slots); beyond it the route answers 503.
pub const MAX_EXEC_SESSIONS: usize = 64;

/// The exec sessions of a server: tracked, so that a drain waits for them (they end when it
/// starts), and counted.
#[derive(Debug, Clone)]
pub(super) struct Sessions {
    tracker: TaskTracker,
    slots: Arc<Semaphore>,
}

impl Sessions {
    pub(super) fn new() -> Self {
        Self {
            tracker: TaskTracker::new(),
            slots: Arc::new(Semaphore::new(MAX_EXEC_SESSIONS)),
        }
    }

    /// Stops taking sessions and waits for those running to end.
    pub(super) async fn close_and_wait(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// The number of sessions running.
    pub(super) fn len(&self) -> usize {
        self.tracker.len()
    }
}

/// The alloc routes; merged into [`super::router`].
pub(super) fn routes<V: super::AgentView>() -> Router<Arc<V>> {
    Router::new()
        .route("/v1/client/fs/logs/{alloc_id}", get(logs::<V>))
        .route("/v1/client/allocation/{alloc_id}/exec", post(exec::<V>))
}

type Id = Result<Path<String>, PathRejection>;

/// The draining token, or one that never fires (a router served some other way).
fn stop_token(draining: Option<Extension<Draining>>) -> CancellationToken {
    draining.map_or_else(CancellationToken::new, |Extension(Draining(t))| t)
}

/// `GET /v1/client/fs/logs/{alloc_id}`: the raw bytes of the task's log, streamed; a `follow`
/// stream ends when the view's stream does or the server drains.
async fn logs<V: super::AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
    draining: Option<Extension<Draining>>,
    req: Request,
) -> Result<Response, ApiError> {
    let alloc_id = super::job_routes::alloc_id(&*view, id)?;
    let q = query(
        req.uri().query(),
        &["task", "type", "origin", "offset", "follow", "lines"],
    )?;
    let logs = LogsRequest::from_query(alloc_id, &q)?;
    let stream = view.alloc_logs(logs).await?;
    let stop = stop_token(draining);
    let body = stream
        .map(|chunk| chunk.map(Bytes::from))
        .take_until(stop.cancelled_owned());
    Ok((
        [(header::CONTENT_TYPE, LOGS_CONTENT_TYPE)],
        Body::from_stream(body),
    )
        .into_response())
}

/// Whether the request asks to upgrade to [`EXEC_PROTOCOL`].
fn asks_for_upgrade(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(EXEC_PROTOCOL));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    upgrade && connection
}

/// `POST /v1/client/allocation/{alloc_id}/exec`: starts the command, answers `101 Switching
/// Protocols`, then carries its streams in frames until it exits (or the client leaves, or the
/// server drains: then it is killed).
async fn exec<V: super::AgentView>(
    State(view): State<Arc<V>>,
    id: Id,
    sessions: Option<Extension<Sessions>>,
    draining: Option<Extension<Draining>>,
    mut req: Request,
) -> Result<Response, ApiError> {
    let alloc_id = super::job_routes::alloc_id(&*view, id)?;
    if !asks_for_upgrade(req.headers()) {
        return Err(ApiError::BadRequest(format!(
            "this route runs a command over an upgraded connection: send `Connection: Upgrade` \
             and `Upgrade: {EXEC_PROTOCOL}`"
        )));
    }
    let q = query(
        req.uri().query(),
        &["task", "command", "tty", "cols", "rows"],
    )?;
    let exec = ExecRequest::from_query(alloc_id, &q)?;
    let permit = match &sessions {
        Some(Extension(s)) => Some(s.slots.clone().try_acquire_owned().map_err(|_| {
            ApiError::Unavailable(format!(
                "{MAX_EXEC_SESSIONS} exec sessions run already; try again later"
            ))
        })?),
        None => None,
    };
    let upgrade = hyper::upgrade::on(&mut req);
    let session = view.alloc_exec(exec).await?;
    let stop = stop_token(draining);
    let run = async move {
        match upgrade.await {
            Ok(io) => run_session(TokioIo::new(io), session, stop, permit).await,
            // The client left before the switch: dropping the session kills the command.
            Err(e) => tracing::debug!(error = %e, "exec: the connection was not upgraded"),
        }
    };
    match sessions {
        Some(Extension(s)) => drop(s.tracker.spawn(run)),
        None => drop(tokio::spawn(run)),
    }
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, EXEC_PROTOCOL)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// How a session ended, for the log.
#[derive(Debug)]
enum End {
    /// The command exited and the client has every frame.
    Exited,
    /// The client closed the connection (or broke the framing) before the command exited.
    ClientGone,
    /// The server drains.
    Draining,
}

/// Carries one session: the client's frames to the command, its output and its exit to the
/// client. Whatever way it ends, the command and what it started are gone afterwards.
async fn run_session<S>(
    io: S,
    session: ExecSession,
    stop: CancellationToken,
    _permit: Option<OwnedSemaphorePermit>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin,
{
    let (mut from_client, mut to_client) = tokio::io::split(io);
    let ExecSession {
        mut stdin,
        stdout,
        stderr,
        resize,
        exit,
    } = session;
    let (tx, mut rx) = mpsc::channel::<Frame>(16);

    // The command's outputs and its exit, as frames, the exit last.
    let outputs = {
        let tx = tx.clone();
        async move {
            let out = forward(stdout, Frame::Stdout, tx.clone());
            let err = async {
                if let Some(err) = stderr {
                    forward(err, Frame::Stderr, tx.clone()).await;
                }
            };
            let (code, (), ()) = tokio::join!(exit, out, err);
            let last = match code {
                Ok(code) => Frame::Exit(code),
                Err(e) => Frame::Error(format!("waiting for the command failed: {e}")),
            };
            let _ = tx.send(last).await;
        }
    };
    drop(tx);
    let writer = async move {
        while let Some(frame) = rx.recv().await {
            let last = matches!(frame, Frame::Exit(_) | Frame::Error(_));
            if to_client.write_all(&frame.encode()).await.is_err() {
                return false;
            }
            if last {
                let _ = to_client.flush().await;
                let _ = to_client.shutdown().await;
                return true;
            }
        }
        false
    };
    // The client's frames: input, its end, resizes. Returns when the client is gone.
    let input = async move {
        let mut open = true;
        loop {
            match Frame::read(&mut from_client).await {
                Ok(Some(Frame::Stdin(data))) => {
                    if open && stdin.write_all(&data).await.is_err() {
                        // The command closed its input: what comes later is dropped.
                        open = false;
                    }
                }
                Ok(Some(Frame::CloseStdin)) => {
                    if open {
                        let _ = stdin.shutdown().await;
                        open = false;
                    }
                }
                Ok(Some(Frame::Resize { cols, rows })) => {
                    if cols > 0 && rows > 0 {
                        let _ = resize(cols, rows);
                    }
                }
                // Frames only the agent sends, a broken stream, or its end.
                Ok(Some(_)) | Ok(None) | Err(_) => return,
            }
        }
    };
    let done = async {
        let ((), delivered) = tokio::join!(outputs, writer);
        delivered
    };
    let end = tokio::select! {
        delivered = done => if delivered { End::Exited } else { End::ClientGone },
        () = input => End::ClientGone,
        () = stop.cancelled() => End::Draining,
    };
    // Everything of the session is dropped here: the exit future's drop kills the command.
    tracing::debug!(end = ?end, "exec session ended");
}

/// Sends what `reader` yields as frames made by `make` until its end (or the receiver's).
async fn forward(
    mut reader: crate::allocs::ExecReader,
    make: fn(Vec<u8>) -> Frame,
    tx: mpsc::Sender<Frame>,
) {
    let mut buf = vec![0u8; MAX_FRAME_PAYLOAD];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(make(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}
