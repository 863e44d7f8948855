//! The alloc stream routes over a real server and client: a log streamed as it is written,
//! ended by its view or by the server's drain; a command run over the upgraded exec
//! connection (input, outputs, exit code), killed when the client leaves or the server drains;
//! and refusals that name the field before the view is called.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use berth_api::{
    AgentView, ApiError, Client, Event, Listeners, NodeStatus, PluginStatus, RegisterRequest,
    allocs::{ExecRequest, ExecSession, Frame, LogStream, LogType, LogsRequest},
};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// A view whose logs come from a channel the test feeds, and whose exec runs `sh -c` on the
/// host (the command's words joined).
#[derive(Debug, Default)]
struct StreamAgent {
    logs: Mutex<Option<mpsc::Receiver<Vec<u8>>>>,
    asked: Mutex<Vec<LogsRequest>>,
    execs: AtomicUsize,
    pids: Mutex<Vec<u32>>,
}

impl berth_api::VolumeView for StreamAgent {}

impl berth_api::JobView for StreamAgent {
    async fn alloc_logs(&self, req: LogsRequest) -> Result<LogStream, ApiError> {
        if req.alloc_id == "missing" {
            return Err(ApiError::NotFound("no alloc \"missing\"".into()));
        }
        self.asked.lock().unwrap().push(req);
        let rx = self.logs.lock().unwrap().take().expect("one log request");
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok(b), rx))
        })))
    }

    async fn alloc_exec(&self, req: ExecRequest) -> Result<ExecSession, ApiError> {
        self.execs.fetch_add(1, Ordering::SeqCst);
        if req.task.as_deref() == Some("stopped") {
            return Err(ApiError::Conflict("task \"stopped\" is not running".into()));
        }
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(req.command.join(" "))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        self.pids.lock().unwrap().push(child.id().unwrap());
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut stdin = Some(stdin);
        Ok(ExecSession {
            stdin: Box::pin(ClosingWriter(stdin.take())),
            stdout: Box::pin(stdout),
            stderr: Some(Box::pin(stderr)),
            resize: Box::new(|_, _| Ok(())),
            exit: Box::pin(async move {
                let status = child.wait().await?;
                Ok(status.code().unwrap_or(128))
            }),
        })
    }
}

/// A pipe whose shutdown closes it.
struct ClosingWriter(Option<tokio::process::ChildStdin>);

impl tokio::io::AsyncWrite for ClosingWriter {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.0 = None;
        std::task::Poll::Ready(Ok(()))
    }
}

impl AgentView for StreamAgent {
    fn plugins(&self) -> Vec<PluginStatus> {
        Vec::new()
    }
    fn plugin(&self, _id: &str) -> Option<PluginStatus> {
        None
    }
    fn node(&self) -> NodeStatus {
        NodeStatus::default()
    }
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        broadcast::channel(1).1
    }
    fn metrics(&self) -> String {
        String::new()
    }
    async fn register(&self, _req: RegisterRequest) -> Result<PluginStatus, ApiError> {
        Err(ApiError::NotFound("no".into()))
    }
    async fn deregister(&self, _id: &str, _instance: &str) -> Result<(), ApiError> {
        Err(ApiError::NotFound("no".into()))
    }
}

struct Served {
    agent: Arc<StreamAgent>,
    socket: PathBuf,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("berth.sock");
        let listeners = Listeners::bind(&socket, None)
            .unwrap()
            .with_drain_timeout(Duration::from_secs(5));
        let agent = Arc::new(StreamAgent::default());
        let shutdown = CancellationToken::new();
        let task =
            tokio::spawn(listeners.serve(berth_api::router(agent.clone()), shutdown.clone()));
        Self {
            agent,
            socket,
            shutdown,
            task,
            _dir: dir,
        }
    }

    fn client(&self) -> Client {
        Client::new(&format!("unix://{}", self.socket.display())).unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the server drains within 10s")
            .unwrap();
    }
}

const WAIT: Duration = Duration::from_secs(10);

fn logs(alloc: &str) -> LogsRequest {
    LogsRequest {
        alloc_id: alloc.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_followed_log_streams_bytes_as_they_come_until_the_view_ends_it() {
    let served = Served::start();
    let (tx, rx) = mpsc::channel(4);
    *served.agent.logs.lock().unwrap() = Some(rx);
    tx.send(b"first\n".to_vec()).await.unwrap();
    let mut req = logs("a1");
    req.task = Some("web".into());
    req.log_type = LogType::Stderr;
    req.follow = true;
    let mut stream = served.client().alloc_logs(&req).await.expect("logs");
    let got = tokio::time::timeout(WAIT, stream.next()).await.unwrap();
    assert_eq!(&got.unwrap().unwrap()[..], b"first\n");
    // Later bytes arrive on the open response.
    tx.send(vec![0, 1, 2, 255]).await.unwrap();
    let got = tokio::time::timeout(WAIT, stream.next()).await.unwrap();
    assert_eq!(&got.unwrap().unwrap()[..], [0, 1, 2, 255]);
    drop(tx);
    assert!(
        tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .is_none()
    );
    let asked = served.agent.asked.lock().unwrap().clone();
    assert_eq!(asked, [req]);
    served.stop().await;
}

#[tokio::test]
async fn a_drain_ends_a_followed_log() {
    let served = Served::start();
    let (tx, rx) = mpsc::channel(4);
    *served.agent.logs.lock().unwrap() = Some(rx);
    tx.send(b"x".to_vec()).await.unwrap();
    let mut req = logs("a1");
    req.follow = true;
    let mut stream = served.client().alloc_logs(&req).await.expect("logs");
    assert!(stream.next().await.unwrap().is_ok());
    served.shutdown.cancel();
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("ended");
    assert!(end.is_none(), "{end:?}");
    drop(tx);
    served.stop().await;
}

#[tokio::test]
async fn bad_log_requests_name_the_field_and_never_reach_the_view() {
    let served = Served::start();
    let client = served.client();
    let err = |req: LogsRequest| {
        let client = client.clone();
        async move { client.alloc_logs(&req).await.unwrap_err() }
    };
    let e = err(logs("..")).await;
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("alloc id"), "{e}");
    let mut bad_task = logs("a1");
    bad_task.task = Some("a/b".into());
    let e = err(bad_task).await;
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("`task`"), "{e}");
    let mut both = logs("a1");
    both.lines = Some(3);
    both.offset = 5;
    let e = err(both).await;
    assert!(e.to_string().contains("`lines`"), "{e}");
    assert!(served.agent.asked.lock().unwrap().is_empty());
    let e = err(logs("missing")).await;
    assert_eq!(e.status(), Some(404));
    served.stop().await;
}

fn exec(command: &str) -> ExecRequest {
    ExecRequest {
        alloc_id: "a1".into(),
        task: None,
        command: vec![command.into()],
        tty: None,
    }
}

/// Reads frames until the exit; stdout, stderr, exit code.
async fn collect(frames: &mut berth_api::client::ExecFrames) -> (Vec<u8>, Vec<u8>, i32) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    loop {
        let frame = tokio::time::timeout(WAIT, frames.next())
            .await
            .expect("a frame")
            .expect("readable");
        match frame {
            Some(Frame::Stdout(d)) => out.extend(d),
            Some(Frame::Stderr(d)) => err.extend(d),
            Some(Frame::Exit(code)) => {
                assert!(
                    frames.next().await.unwrap().is_none(),
                    "exit is the last frame"
                );
                return (out, err, code);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn exec_carries_input_outputs_and_the_exit_code() {
    let served = Served::start();
    let client = served.client();
    let mut s = client
        .alloc_exec(&exec("cat; echo bye >&2; exit 3"))
        .await
        .expect("exec");
    s.input
        .send(&Frame::Stdin(b"hello ".to_vec()))
        .await
        .unwrap();
    s.input
        .send(&Frame::Resize { cols: 80, rows: 24 })
        .await
        .unwrap();
    s.input
        .send(&Frame::Stdin(b"world\n".to_vec()))
        .await
        .unwrap();
    s.input.send(&Frame::CloseStdin).await.unwrap();
    let (out, err, code) = collect(&mut s.frames).await;
    assert_eq!(out, b"hello world\n");
    assert_eq!(err, b"bye\n");
    assert_eq!(code, 3);
    served.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_or_a_drain_kills_the_command() {
    let served = Served::start();
    let client = served.client();
    let alive =
        |pid: u32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();

    let s = client.alloc_exec(&exec("exec sleep 1000")).await.unwrap();
    let pid = served.agent.pids.lock().unwrap()[0];
    drop(s);
    berth_testkit::assert_eventually!(WAIT, || async { !alive(pid) }, "pid {pid} still runs");

    let mut s = client.alloc_exec(&exec("exec sleep 1000")).await.unwrap();
    let pid = served.agent.pids.lock().unwrap()[1];
    served.shutdown.cancel();
    let end = tokio::time::timeout(WAIT, s.frames.next())
        .await
        .expect("ended");
    assert!(matches!(end, Ok(None)), "{end:?}");
    berth_testkit::assert_eventually!(WAIT, || async { !alive(pid) }, "pid {pid} still runs");
    served.stop().await;
}

#[tokio::test]
async fn bad_exec_requests_are_refused_before_the_view_is_called() {
    let served = Served::start();
    let client = served.client();
    let mut empty = exec("x");
    empty.command.clear();
    let e = client.alloc_exec(&empty).await.unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(e.to_string().contains("`command`"), "{e}");
    let mut bad = exec("x");
    bad.alloc_id = "a b/..".into();
    let e = client.alloc_exec(&bad).await.unwrap_err();
    assert!(e.to_string().contains("alloc id"), "{e}");
    assert_eq!(served.agent.execs.load(Ordering::SeqCst), 0);

    // Without the upgrade headers the route says what it needs.
    let raw = {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::UnixStream::connect(&served.socket)
            .await
            .unwrap();
        s.write_all(
            b"POST /v1/client/allocation/a1/exec?command=%5B%22ls%22%5D HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).await.unwrap();
        answer
    };
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert!(raw.contains("Upgrade: berth-exec"), "{raw}");
    assert_eq!(served.agent.execs.load(Ordering::SeqCst), 0);

    // The view's refusal keeps its status.
    let mut stopped = exec("ls");
    stopped.task = Some("stopped".into());
    let e = client.alloc_exec(&stopped).await.unwrap_err();
    assert_eq!(e.status(), Some(409));
    served.stop().await;
}
