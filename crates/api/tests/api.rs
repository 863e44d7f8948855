//! The API served on a real unix socket and loopback TCP port, driven through [`Client`] and,
//! where the raw answer matters, through plain HTTP/1.1 on the socket.

mod fake;

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::Path,
    sync::atomic::Ordering,
    time::Duration,
};

use berth_api::{
    Client, ClientError, ConnectFailure, EventLine, Listeners, METRICS_CONTENT_TYPE, PluginType,
    RegisterRequest, ServeError,
};
use fake::{METRICS, Served};

const WAIT: Duration = Duration::from_secs(10);

/// A raw HTTP/1.1 exchange on the socket: (status, lower-cased head, body).
async fn raw(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let answer = fake::raw(socket, method, path, body.as_bytes()).await;
    (answer.status, answer.head, answer.body)
}

fn register_request(id: &str, socket: &str) -> RegisterRequest {
    RegisterRequest {
        id: id.into(),
        plugin_type: PluginType::Node,
        socket: socket.into(),
        instance: Some("task-1".into()),
    }
}

#[tokio::test]
async fn every_route_over_unix_and_tcp() {
    let served = Served::start(16);
    for address in [served.unix_address(), served.tcp_address()] {
        let client = Client::new(&address).expect("address");

        let list = client.plugins().await.expect("plugins");
        let ids: Vec<_> = list.plugins.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["alpha", "zeta"], "sorted by id over {address}");

        let alpha = client.plugin("alpha").await.expect("alpha");
        assert_eq!(alpha.plugin_type, PluginType::Monolith);

        let missing = client.plugin("nope x").await.unwrap_err();
        assert!(missing.is_not_found(), "{missing:?}");
        assert_eq!(missing.to_string(), r#"no plugin "nope x""#);
        let invalid = client.plugin("nope/x y").await.unwrap_err();
        assert_eq!(invalid.status(), Some(400), "{invalid:?}");
        assert_eq!(
            invalid.to_string(),
            r#"invalid plugin id "nope/x y": must not contain '/'"#
        );

        let node = client.node().await.expect("node");
        assert_eq!(
            (node.id.as_str(), node.hostname.as_str()),
            ("node-1", "host-1")
        );

        assert_eq!(client.metrics().await.expect("metrics"), METRICS);

        let status = client
            .register(&register_request("new", "/run/new.sock"))
            .await
            .expect("register");
        assert_eq!(status.instances[0].instance, "task-1");
        assert_eq!(client.plugin("new").await.expect("new").id, "new");

        let conflict = client
            .register(&RegisterRequest {
                plugin_type: PluginType::Controller,
                ..register_request("new", "/run/new.sock")
            })
            .await
            .unwrap_err();
        assert_eq!(conflict.status(), Some(409), "{conflict:?}");

        client
            .deregister("new", "task-1")
            .await
            .expect("deregister");
        assert!(client.plugin("new").await.unwrap_err().is_not_found());
        let gone = client.deregister("new", "task-1").await.unwrap_err();
        assert!(gone.is_not_found(), "{gone:?}");
        assert_eq!(gone.to_string(), r#"no instance "task-1" of plugin "new""#);
    }
    served.stop().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let served = Served::start(16);
    let (status, head, body) = raw(&served.socket, "GET", "/v1/nope", "").await;
    assert_eq!(status, 404);
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(body, r#"{"error":"no route GET /v1/nope"}"#);

    let (status, _, body) = raw(&served.socket, "GET", "/v1/plugin/csi/ghost", "").await;
    assert_eq!(status, 404);
    assert_eq!(body, r#"{"error":"no plugin \"ghost\""}"#);

    let (status, _, body) = raw(&served.socket, "PUT", "/v1/node", "").await;
    assert_eq!(status, 405);
    assert_eq!(body, r#"{"error":"method PUT is not allowed on /v1/node"}"#);

    let (status, _, body) = raw(
        &served.socket,
        "DELETE",
        "/v1/plugin/csi/a/instances/..",
        "",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid instance name"), "{body}");
    assert_eq!(served.agent.deregister_calls.load(Ordering::SeqCst), 0);
    served.stop().await;
}

#[tokio::test]
async fn bad_registrations_are_refused_naming_the_field_and_change_nothing() {
    let served = Served::start(16);
    let before = served.agent.plugins.lock().unwrap().clone();
    let long_socket = format!("/{}", "s".repeat(200));
    let cases = [
        (
            r#"{"id": 5, "type": "node", "socket": "/s"}"#.to_string(),
            "field `id`",
        ),
        (
            r#"{"id": "p", "type": "nod", "socket": "/s"}"#.into(),
            "field `type`",
        ),
        (
            r#"{"id": "p", "type": "node"}"#.into(),
            "missing field `socket`",
        ),
        (
            r#"{"id": "p", "type": "node", "socket": "/s", "sockets": 1}"#.into(),
            "field `sockets`: unknown field, expected one of `id`, `type`, `socket`, `instance`",
        ),
        ("not json".into(), "expected ident at line 1 column 2"),
        (
            r#"{"id": "p", "type": "node", "socket": "/s"} trailing"#.into(),
            "trailing characters",
        ),
        ("".into(), "EOF"),
        (
            r#"{"id": "a/b", "type": "node", "socket": "/s"}"#.into(),
            "id: invalid plugin id \\\"a/b\\\"",
        ),
        (
            r#"{"id": "p", "type": "node", "socket": "/s", "instance": ".."}"#.into(),
            "instance: invalid instance name",
        ),
        (
            r#"{"id": "p", "type": "node", "socket": "rel.sock"}"#.into(),
            "socket: must be an absolute path",
        ),
        (
            format!(r#"{{"id": "p", "type": "node", "socket": "{long_socket}"}}"#),
            "must fit in 107 bytes",
        ),
    ];
    for (body, says) in cases {
        let (status, head, answer) = raw(&served.socket, "POST", "/v1/plugins", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(answer.starts_with(r#"{"error":""#), "{answer}");
        assert!(answer.contains(says), "{body}: {answer} lacks {says}");
    }

    let client = Client::new(&served.unix_address()).unwrap();
    let err = client
        .register(&register_request("p", "relative.sock"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert_eq!(err.to_string(), "socket: must be an absolute path");

    assert_eq!(served.agent.register_calls.load(Ordering::SeqCst), 0);
    assert_eq!(*served.agent.plugins.lock().unwrap(), before);
    served.stop().await;
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let served = Served::start(16);
    let (status, head, body) = raw(&served.socket, "GET", "/v1/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        head.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
        "{head}"
    );
    assert!(METRICS_CONTENT_TYPE.starts_with("text/plain; version=0.0.4"));
    assert_eq!(body, METRICS);
    served.stop().await;
}

#[tokio::test]
async fn events_arrive_in_order_and_end_at_shutdown() {
    let served = Served::start(64);
    let client = Client::new(&served.tcp_address()).unwrap();
    let mut events = client.events().await.expect("events");
    // The agent subscribed before it answered: nothing sent from here on is missed.
    for seq in 1..=20 {
        served.agent.emit(seq, format!("event {seq}"));
    }
    for seq in 1..=20 {
        match events.next().await {
            Some(Ok(EventLine::Event(e))) => {
                assert_eq!((e.seq, e.reason), (seq, format!("event {seq}")));
            }
            other => panic!("event {seq}: {other:?}"),
        }
    }
    served.stop().await;
    assert!(
        tokio::time::timeout(WAIT, events.next())
            .await
            .expect("the stream ends in time")
            .is_none(),
        "the stream ends when the server shuts down"
    );
}

/// On a single-threaded runtime nothing runs between the sends: the server's reader is lagged
/// by exactly what did not fit, deterministically.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_that_falls_behind_is_told_how_many_events_it_lost() {
    let served = Served::start(8);
    let mut events = Client::new(&served.unix_address())
        .unwrap()
        .events()
        .await
        .expect("events");
    for seq in 1..=1000 {
        served.agent.emit(seq, String::new());
    }
    assert_eq!(
        events.next().await.expect("a line").expect("lagged"),
        EventLine::Lagged(992)
    );
    for seq in 993..=1000 {
        match events.next().await {
            Some(Ok(EventLine::Event(e))) => assert_eq!(e.seq, seq),
            other => panic!("event {seq}: {other:?}"),
        }
    }
    served.agent.emit(1001, String::new());
    match events.next().await {
        Some(Ok(EventLine::Event(e))) => assert_eq!(e.seq, 1001, "the stream goes on"),
        other => panic!("event 1001: {other:?}"),
    }
    served.stop().await;
}

/// A reader that does not read at all while big events pour in: the socket fills up, the
/// server's writer stalls, and still every send returns at once; the reader later sees each
/// event or a count of the ones it lost, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_never_blocks_the_sender() {
    const SENT: u64 = 1000;
    let served = Served::start(16);
    let mut events = Client::new(&served.unix_address())
        .unwrap()
        .events()
        .await
        .expect("events");
    let reason = "r".repeat(16 * 1024);
    let started = tokio::time::Instant::now();
    for seq in 1..=SENT {
        served.agent.emit(seq, reason.clone());
    }
    // 16 MiB of events against a socket buffer of a few hundred KiB.
    assert!(
        started.elapsed() < WAIT,
        "sending took {:?}",
        started.elapsed()
    );

    let (mut seen, mut lost, mut last, mut lag_lines) = (0, 0, 0, 0);
    while last < SENT {
        match tokio::time::timeout(WAIT, events.next()).await {
            Ok(Some(Ok(EventLine::Event(e)))) => {
                assert!(e.seq > last, "in order: {} after {last}", e.seq);
                seen += 1;
                last = e.seq;
            }
            Ok(Some(Ok(EventLine::Lagged(n)))) => {
                lost += n;
                lag_lines += 1;
            }
            other => panic!("after event {last}: {other:?}"),
        }
    }
    assert!(lag_lines > 0, "the stalled reader lost events");
    assert_eq!(
        seen + lost,
        SENT,
        "every event is either seen or counted as lost"
    );
    served.stop().await;
}

#[tokio::test]
async fn socket_is_0600_in_a_0700_dir_and_removed_after_shutdown() {
    let served = Served::start(16);
    let meta = std::fs::symlink_metadata(&served.socket).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let dir_mode = std::fs::metadata(served.data_dir())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dir_mode & 0o777, 0o700);

    let address = served.unix_address();
    let socket = served.socket.clone();
    let _dir = served.stop().await;
    assert!(!socket.exists(), "the socket is removed on exit");

    let err = Client::new(&address).unwrap().plugins().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ClientError::Connect {
                failure: ConnectFailure::NoSocket,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "cannot reach the agent at {address}: socket does not exist (is `berth agent` \
             running?)"
        )
    );
}

#[tokio::test]
async fn only_loopback_tcp_is_served_and_nothing_is_bound_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("berth.sock");
    for addr in ["0.0.0.0:0", "[::]:0", "192.0.2.1:4646"] {
        let err = Listeners::bind(&socket, Some(addr.parse().unwrap())).unwrap_err();
        assert!(matches!(err, ServeError::NotLoopback { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with(&format!("refusing to serve the API on {addr}")),
            "{err}"
        );
        assert!(!socket.exists(), "nothing bound for {addr}");
    }
    let v6 = Listeners::bind(&socket, Some("[::1]:0".parse().unwrap()));
    // Hosts without IPv6 refuse to bind ::1; that is a bind error, never a loopback refusal.
    if let Err(err) = &v6 {
        assert!(matches!(err, ServeError::BindTcp { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn a_stale_socket_is_replaced_but_a_live_one_or_a_file_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("berth.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "a stale socket file");
    let listeners = Listeners::bind(&socket, None).expect("the stale socket is replaced");

    let err = Listeners::bind(&socket, None).unwrap_err();
    assert!(matches!(err, ServeError::InUse { .. }), "{err:?}");
    assert!(
        err.to_string().contains("another process is serving on"),
        "{err}"
    );
    assert!(socket.exists(), "the live socket is left alone");
    drop(listeners);
    assert!(
        !socket.exists(),
        "dropping unserved listeners removes the socket"
    );

    std::fs::write(&socket, "precious").unwrap();
    let err = Listeners::bind(&socket, None).unwrap_err();
    assert!(matches!(err, ServeError::NotASocket { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "precious");

    let long = dir.path().join("l".repeat(120));
    let err = Listeners::bind(&long, None).unwrap_err();
    assert!(
        matches!(err, ServeError::SocketPathTooLong { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_bad_tcp_bind_leaves_no_socket_behind() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let socket = dir.path().join("berth.sock");
    let err = Listeners::bind(&socket, Some(taken.local_addr().unwrap())).unwrap_err();
    assert!(matches!(err, ServeError::BindTcp { .. }), "{err:?}");
    assert!(!socket.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_from_another_sites_page_is_refused_before_anything_runs() {
    use axum::body::Body;
    use tower::ServiceExt as _;
    let view = std::sync::Arc::new(fake::FakeAgent::new(16));
    let router = berth_api::router(std::sync::Arc::clone(&view));
    let send = |origin: Option<&str>| {
        let mut req = axum::http::Request::post("/v1/jobs").header("host", "127.0.0.1:4646");
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        router.clone().oneshot(req.body(Body::from("{}")).unwrap())
    };
    let refused = send(Some("http://evil.example")).await.unwrap();
    assert_eq!(refused.status(), 403);
    let same = send(Some("http://127.0.0.1:4646")).await.unwrap();
    assert_ne!(same.status(), 403);
    let cli = send(None).await.unwrap();
    assert_ne!(cli.status(), 403);
}
