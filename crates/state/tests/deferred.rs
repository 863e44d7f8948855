//! Deferred batches across a real kill -9: the test binary runs itself again as a writer that
//! is killed with SIGKILL once it has written, and the store is opened again afterwards.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
};

use berth_state::{Batch, Store, Table};

/// Set in the child: the store it writes.
const CHILD_ENV: &str = "BERTH_STATE_DEFERRED_CHILD";

fn batch(key: &str, value: u32, deferred: bool) -> Batch {
    let mut b = Batch::new();
    b.put(Table::ALLOCS, key, &value);
    if deferred {
        b.deferred();
    }
    b
}

/// The child's writes: a durable record, a deferred one, a durable one, a deferred one; it
/// prints the commit counts, then waits until the idle commit thread made the last one
/// durable, says so, and waits to be killed.
#[tokio::test]
async fn child_writes_then_waits_to_be_killed() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = Store::open(Path::new(&path)).unwrap();
    store.commit(batch("base", 1, false)).await.unwrap();
    store
        .commit(batch("deferred-then-durable", 2, true))
        .await
        .unwrap();
    // Readable at once.
    assert_eq!(
        store
            .get::<u32>(Table::ALLOCS, "deferred-then-durable")
            .unwrap(),
        Some(2)
    );
    store.commit(batch("durable", 3, false)).await.unwrap();
    store.commit(batch("deferred-last", 4, true)).await.unwrap();
    let stats = store.commit_stats();
    println!("written {} {}", stats.commits, stats.durable);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.commit_stats().durable == stats.durable {
        assert!(std::time::Instant::now() < deadline, "never made durable");
        tokio::task::yield_now().await;
    }
    println!("flushed");
    std::io::stdout().flush().unwrap();
    // Killed here, with the store open.
    loop {
        std::thread::park();
    }
}

/// Kills (SIGKILL) and reaps the child when dropped, on success or panic.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_kill_9_keeps_deferred_writes_once_a_durable_commit_or_the_idle_flush_followed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let mut child = Killed(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_writes_then_waits_to_be_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut text = String::new();
    let mut line = String::new();
    while !text.contains("flushed") {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before it wrote: {text}");
        text.push_str(&line);
    }
    drop(child);
    // The harness prints its own words first, on the same line.
    let counts: Vec<u64> = text
        .split_once("written ")
        .and_then(|(_, rest)| rest.lines().next())
        .expect("the counts")
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    // Of the four transactions, the two deferred ones waited for no fsync.
    assert_eq!(
        counts[0] - counts[1],
        2,
        "deferred transactions: {counts:?}"
    );

    let store = Store::open(&path).unwrap();
    let get = |k: &str| store.get::<u32>(Table::ALLOCS, k).unwrap();
    assert_eq!(get("base"), Some(1));
    // A durable commit came after it: durable with that one.
    assert_eq!(get("deferred-then-durable"), Some(2));
    assert_eq!(get("durable"), Some(3));
    // The idle commit thread made it durable before the kill.
    assert_eq!(get("deferred-last"), Some(4));
}

#[tokio::test]
async fn a_closed_store_makes_its_deferred_writes_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let store = Store::open(&path).unwrap();
    store.commit(batch("d", 7, true)).await.unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.get::<u32>(Table::ALLOCS, "d").unwrap(), Some(7));
}

#[tokio::test]
async fn deferred_writes_in_a_row_are_made_durable_now_and_then() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("state.redb")).unwrap();
    let start = store.commit_stats();
    for n in 0..200u32 {
        store
            .commit(batch(&format!("k{n:03}"), n, true))
            .await
            .unwrap();
    }
    let end = store.commit_stats();
    let durable = end.durable - start.durable;
    // One in every 65 at least (more when the thread found itself idle in between).
    assert!(durable >= 3, "{durable} durable of 200");
}
