//! The listener under connection floods, on a real unix socket: it serves a bounded number of
//! connections at once, closes connections that do not send their request head in time (or to
//! make room), leaves the rest in the kernel's backlog, and still answers real requests. Its
//! file descriptors are counted from `/proc` (server ends only: see [`fake::server_fds`]).

mod fake;

use std::{path::Path, time::Duration};

use berth_api::{Client, server::MAX_CONNECTIONS};
use fake::{RAW_WAIT, Served, read_answer, server_fds};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
};

/// A request head without its final empty line: the server waits for the rest.
const HALF_SENT: &[u8] = b"GET /v1/node HTTP/1.1\r\nHost: x\r\n";

async fn half_sent(socket: &Path) -> UnixStream {
    let mut stream = UnixStream::connect(socket).await.expect("connect");
    stream.write_all(HALF_SENT).await.expect("write");
    stream
}

/// Waits (bounded) until the server has closed `stream`.
async fn closed_by_server(stream: &mut UnixStream) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(RAW_WAIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the server did not close the connection");
}

/// Polls (bounded) until `pred` holds.
async fn eventually(what: &str, pred: impl Fn() -> bool) {
    berth_testkit::assert_eventually!(RAW_WAIT, || async { pred() }, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_and_half_sent_connections_neither_starves_requests_nor_fds() {
    let served = Served::start(16);
    // The listener, the connections served, and the one accepted beyond them.
    let bound = MAX_CONNECTIONS + 2;
    let mut flood = Vec::new();
    for i in 0..MAX_CONNECTIONS + 150 {
        flood.push(half_sent(&served.socket).await);
        if i % 50 == 0 {
            let fds = server_fds(&served.socket);
            assert!(fds <= bound, "{fds} server fds after {i} connections");
        }
    }
    for _ in 0..50 {
        flood.push(UnixStream::connect(&served.socket).await.expect("connect"));
    }
    let fds = server_fds(&served.socket);
    assert!(fds <= bound, "{fds} server fds");

    let client = Client::new(&served.unix_address()).unwrap();
    let node = tokio::time::timeout(RAW_WAIT, client.node())
        .await
        .expect("an answer despite the flood")
        .expect("node");
    assert_eq!(node.id, "node-1");
    let fds = server_fds(&served.socket);
    assert!(fds <= bound, "{fds} server fds");

    // Every flood connection is closed: to make room, or at its head read timeout.
    for stream in &mut flood {
        closed_by_server(stream).await;
    }
    eventually("the server holds only its listener", || {
        server_fds(&served.socket) == 1
    })
    .await;
    served.stop().await;
}

#[tokio::test]
async fn the_oldest_connection_without_a_request_makes_room_for_a_new_one() {
    let served = Served::start_with(16, |l| {
        l.with_max_connections(2)
            .with_head_read_timeout(Duration::from_secs(600))
    });
    let mut oldest = half_sent(&served.socket).await;
    eventually("the first is accepted", || server_fds(&served.socket) == 2).await;
    let mut younger = half_sent(&served.socket).await;
    eventually("the second is accepted", || server_fds(&served.socket) == 3).await;

    let client = Client::new(&served.unix_address()).unwrap();
    let node = tokio::time::timeout(RAW_WAIT, client.node())
        .await
        .expect("an answer")
        .expect("node");
    assert_eq!(node.id, "node-1");
    closed_by_server(&mut oldest).await;

    // The younger one was left alone: it finishes its request and is answered.
    younger.write_all(b"\r\n").await.expect("finish the head");
    let answer = read_answer(&mut younger).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    served.stop().await;
}

#[tokio::test]
async fn a_connection_that_does_not_send_its_head_in_time_is_closed() {
    let served = Served::start_with(16, |l| l.with_head_read_timeout(Duration::from_millis(200)));
    let mut silent = UnixStream::connect(&served.socket).await.expect("connect");
    let mut slow = half_sent(&served.socket).await;
    let mut trickle = UnixStream::connect(&served.socket).await.expect("connect");
    trickle.write_all(b"GET /v1/no").await.expect("write");
    for stream in [&mut silent, &mut slow, &mut trickle] {
        closed_by_server(stream).await;
    }
    eventually("the server holds only its listener", || {
        server_fds(&served.socket) == 1
    })
    .await;
    // A client that sends its request at once is served.
    let client = Client::new(&served.unix_address()).unwrap();
    assert_eq!(client.node().await.expect("node").id, "node-1");
    served.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn busy_connections_are_kept_and_the_rest_wait_in_the_backlog() {
    let served = Served::start_with(64, |l| l.with_max_connections(2));
    let client = Client::new(&served.unix_address()).unwrap();
    // Two event streams: requests in flight, never closed to make room.
    let first = client.events().await.expect("events");
    let mut second = client.events().await.expect("events");
    assert_eq!(server_fds(&served.socket), 3);

    let mut waiting = Vec::new();
    for _ in 0..10 {
        let mut stream = UnixStream::connect(&served.socket).await.expect("connect");
        stream
            .write_all(b"GET /v1/node HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        waiting.push(stream);
    }
    // One accepted beyond the limit, waiting for a slot; the other nine in the backlog (more
    // accepted would pass 4 and never come back to it while the streams hold their slots).
    eventually("one accepted beyond the limit", || {
        server_fds(&served.socket) == 4
    })
    .await;

    // An event stream ends: its slot serves the waiting requests, one after another.
    drop(first);
    served.agent.emit(1, "wake the writer".into());
    for stream in &mut waiting {
        let answer = read_answer(stream).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    // The other stream was never interrupted.
    match second.next().await {
        Some(Ok(berth_api::EventLine::Event(e))) => assert_eq!(e.seq, 1),
        other => panic!("{other:?}"),
    }
    served.agent.emit(2, "still there".into());
    match second.next().await {
        Some(Ok(berth_api::EventLine::Event(e))) => assert_eq!(e.seq, 2),
        other => panic!("{other:?}"),
    }
    eventually("the listener and the stream", || {
        server_fds(&served.socket) == 2
    })
    .await;
    served.stop().await;
}
