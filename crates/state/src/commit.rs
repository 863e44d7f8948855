//! Group commit: every write of the store goes through one thread of its own, which takes
//! whatever writes are waiting, applies them in one redb transaction and commits it once, so
//! writers that arrive together share one fsync instead of queueing on one each.
//!
//! Each [`Batch`] is still all-or-nothing and durable before its writer is answered; batches of
//! one group are applied in the order they arrived. A batch that fails is answered with its own
//! error and does not fail the others of its group (they are committed again without it).
//!
//! A [deferred](Batch::deferred) batch is the exception: it is answered once it is written and
//! readable, without an fsync of its own, and becomes durable with the next durable commit: a
//! writer's, or the commit thread's own once it has been idle for [`FLUSH_AFTER`] (or has
//! committed [`MAX_DEFERRED`] deferred transactions in a row, or the store closes).
//! Transactions are committed in order, so a crash keeps a prefix of them: it may lose the
//! deferred batches of the last few milliseconds, never a batch that a durable commit
//! followed. Callers use it for a result that a crash may lose because recovery redoes the
//! idempotent step after the intent before it.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread::JoinHandle,
};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::{StateError, Table, db_err};

/// Most batches one transaction takes; the rest wait for the next one.
const MAX_GROUP: usize = 512;

/// Most deferred transactions in a row: the next one is durable, so what a crash may lose (and
/// what redb holds for the next durable commit) stays bounded.
const MAX_DEFERRED: u32 = 64;

/// How long deferred writes wait for a durable commit to come: when none has come by then, the
/// commit thread makes them durable itself, so a crash loses at most this much of them.
const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

/// Changes of any tables, committed together: all of them or none.
#[derive(Debug, Default)]
pub struct Batch {
    ops: Vec<Op>,
    /// The first record that did not encode: reported by the commit, which then writes nothing.
    bad: Option<(Table, String, serde_json::Error)>,
    /// Answered before it is durable (see [`Batch::deferred`]).
    deferred: bool,
}

#[derive(Debug)]
enum Op {
    Put {
        table: Table,
        key: String,
        bytes: Vec<u8>,
    },
    Delete {
        table: Table,
        key: String,
    },
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `value` under `key` of `table`, replacing what is there.
    pub fn put<T: Serialize + ?Sized>(&mut self, table: Table, key: &str, value: &T) -> &mut Self {
        match serde_json::to_vec(value) {
            Ok(bytes) => self.ops.push(Op::Put {
                table,
                key: key.to_string(),
                bytes,
            }),
            Err(e) => {
                self.bad.get_or_insert((table, key.to_string(), e));
            }
        }
        self
    }

    /// Removes `key` from `table` (nothing when it is not there).
    pub fn delete(&mut self, table: Table, key: &str) -> &mut Self {
        self.ops.push(Op::Delete {
            table,
            key: key.to_string(),
        });
        self
    }

    /// Makes the batch deferred: its commit answers once the batch is written and readable,
    /// without waiting for an fsync; it is durable once a later durable commit is (at most
    /// [`FLUSH_AFTER`] later when the store is idle). A crash before that may lose it, with
    /// every deferred batch after it, never one that a durable commit followed.
    pub fn deferred(&mut self) -> &mut Self {
        self.deferred = true;
        self
    }

    /// Whether the batch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.bad.is_none()
    }
}

/// What a committed [`Batch`] found: for each of its deletes, in order, whether the key was
/// there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// One entry per delete of the batch.
    pub removed: Vec<bool>,
}

/// Where the commit thread is, for crash tests: called in the commit thread with the group it
/// is committing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPoint {
    /// Every batch of the group applied, the transaction not yet committed: none of them is
    /// durable.
    Before,
    /// The transaction committed (durable), no writer answered yet.
    After,
}

/// What the commit thread is committing at a [`CommitPoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitGroup {
    /// Batches in the transaction (more than one: writers shared it).
    pub batches: usize,
    /// The tables it changes, each once.
    pub tables: Vec<Table>,
}

/// A hook at a [`CommitPoint`].
pub type CommitHook = Arc<dyn Fn(CommitPoint, &CommitGroup) + Send + Sync>;

type HookRef<'a> = Option<&'a (dyn Fn(CommitPoint, &CommitGroup) + Send + Sync)>;

/// Counters of the commit thread since the store opened.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    submitted: AtomicU64,
    commits: AtomicU64,
    durable: AtomicU64,
    batches: AtomicU64,
}

impl Counters {
    /// Counts a committed transaction of `batches`; `pending` counts the deferred ones since
    /// the last durable one.
    fn committed(&self, durability: Durability, batches: usize, pending: &mut u32) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.batches.fetch_add(batches as u64, Ordering::Relaxed);
        match durability {
            Durability::Durable => {
                self.durable.fetch_add(1, Ordering::Relaxed);
                *pending = 0;
            }
            Durability::Deferred => *pending += 1,
        }
    }
}

/// How many transactions the store committed, and how many batches they carried.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions committed.
    pub commits: u64,
    /// Of them, the durable ones (each one fsync of the file); the others held only deferred
    /// batches.
    pub durable: u64,
    /// Batches written by them.
    pub batches: u64,
}

struct Request {
    batch: Batch,
    done: oneshot::Sender<Result<Committed, StateError>>,
}

/// The sending side of the commit thread; joined when the store is dropped.
pub(crate) struct Committer {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    path: PathBuf,
}

impl Committer {
    pub(crate) fn start(
        db: Arc<redb::Database>,
        path: &Path,
        hook: Option<CommitHook>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Request>();
        let counters = Arc::new(Counters::default());
        let thread = {
            let counters = Arc::clone(&counters);
            let path = path.to_path_buf();
            std::thread::Builder::new()
                .name("berth-store-commit".into())
                .spawn(move || run(&db, &path, &rx, &counters, hook.as_deref()))?
        };
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            counters,
            path: path.to_path_buf(),
        })
    }

    /// Queues `batch`; the receiver answers once it is durable (or failed).
    pub(crate) fn submit(&self, batch: Batch) -> oneshot::Receiver<Result<Committed, StateError>> {
        let (done, rx) = oneshot::channel();
        self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.tx {
            // A send fails only when the thread is gone; the dropped `done` says so below.
            let _ = tx.send(Request { batch, done });
        }
        rx
    }

    #[cfg(test)]
    pub(crate) fn submitted(&self) -> u64 {
        self.counters.submitted.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            durable: self.counters.durable.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
        }
    }

    /// The answer of a batch whose thread went away without one.
    pub(crate) fn gone(&self) -> StateError {
        StateError::Db {
            path: self.path.clone(),
            action: "commit".into(),
            source: Box::new(redb::Error::Io(std::io::Error::other(
                "the store's commit thread has stopped",
            ))),
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // The thread ends once the channel is closed and every queued batch is answered; the
        // database closes with it, so the file can be opened again at once.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    db: &redb::Database,
    path: &Path,
    rx: &mpsc::Receiver<Request>,
    counters: &Counters,
    hook: HookRef<'_>,
) {
    // Deferred transactions committed since the last durable commit.
    let mut pending = 0u32;
    loop {
        let first = if pending == 0 {
            rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(FLUSH_AFTER)
        };
        let first = match first {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                flush(db, path, counters, hook, &mut pending);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        commit_group(db, path, group, counters, hook, &mut pending);
    }
    // Closed: what was deferred becomes durable now.
    flush(db, path, counters, hook, &mut pending);
}

/// Makes the deferred writes durable (one empty durable commit), if there are any.
fn flush(
    db: &redb::Database,
    path: &Path,
    counters: &Counters,
    hook: HookRef<'_>,
    pending: &mut u32,
) {
    if *pending == 0 {
        return;
    }
    match write(db, path, &[], hook, Durability::Durable) {
        Ok(_) => counters.committed(Durability::Durable, 0, pending),
        Err(e) => tracing::warn!(error = %e, "cannot make deferred writes durable"),
    }
}

/// Whether a transaction waits for its fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Durable,
    Deferred,
}

impl Durability {
    /// Durable when any of the batches is, or when `pending` deferred transactions came
    /// before.
    fn of(batches: &[&Batch], pending: u32) -> Self {
        if pending < MAX_DEFERRED && batches.iter().all(|b| b.deferred) {
            Self::Deferred
        } else {
            Self::Durable
        }
    }
}

/// Commits the group in one transaction; when that fails, each batch alone, so each gets its
/// own answer.
fn commit_group(
    db: &redb::Database,
    path: &Path,
    group: Vec<Request>,
    counters: &Counters,
    hook: HookRef<'_>,
    pending: &mut u32,
) {
    let (bad, good): (Vec<Request>, Vec<Request>) =
        group.into_iter().partition(|r| r.batch.bad.is_some());
    for r in bad {
        let (table, key, source) = r.batch.bad.expect("partitioned on it");
        let _ = r.done.send(Err(StateError::Record {
            path: path.to_path_buf(),
            table,
            key,
            source,
        }));
    }
    if good.is_empty() {
        return;
    }
    // Only syncs ([`Store::sync`]: empty batches) with nothing deferred waiting: nothing to
    // make durable.
    if *pending == 0 && good.iter().all(|r| r.batch.is_empty()) {
        for r in good {
            let _ = r.done.send(Ok(Committed::default()));
        }
        return;
    }
    let batches: Vec<&Batch> = good.iter().map(|r| &r.batch).collect();
    let durability = Durability::of(&batches, *pending);
    match write(db, path, &batches, hook, durability) {
        Ok(results) => {
            counters.committed(durability, good.len(), pending);
            for (r, res) in good.into_iter().zip(results) {
                let _ = r.done.send(Ok(res));
            }
        }
        Err(_) if good.len() > 1 => {
            for r in good {
                let durability = Durability::of(&[&r.batch], *pending);
                let res = write(db, path, &[&r.batch], hook, durability).map(|mut v| v.remove(0));
                if res.is_ok() {
                    counters.committed(durability, 1, pending);
                }
                let _ = r.done.send(res);
            }
        }
        Err(e) => {
            let r = good.into_iter().next().expect("one batch");
            let _ = r.done.send(Err(e));
        }
    }
}

/// One transaction with every batch; what each one's deletes found.
fn write(
    db: &redb::Database,
    path: &Path,
    batches: &[&Batch],
    hook: HookRef<'_>,
    durability: Durability,
) -> Result<Vec<Committed>, StateError> {
    let action = || match batches {
        [] => "make deferred writes durable".to_string(),
        [b] => describe(b),
        _ => format!("commit {} batches together", batches.len()),
    };
    let err = |e: redb::Error| db_err(path, &action(), e);
    let mut txn = db.begin_write().map_err(|e| err(e.into()))?;
    if durability == Durability::Deferred {
        txn.set_durability(redb::Durability::None)
            .map_err(|e| err(redb::Error::from(e)))?;
    }
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let mut done = Committed::default();
        for op in &b.ops {
            match op {
                Op::Put { table, key, bytes } => {
                    let mut t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
                    t.insert(key.as_str(), bytes.as_slice())
                        .map_err(|e| err(e.into()))?;
                }
                Op::Delete { table, key } => {
                    let mut t = txn.open_table(table.def()).map_err(|e| err(e.into()))?;
                    let was = t.remove(key.as_str()).map_err(|e| err(e.into()))?;
                    done.removed.push(was.is_some());
                }
            }
        }
        out.push(done);
    }
    let group = hook.filter(|_| !batches.is_empty()).map(|_| {
        let mut tables: Vec<Table> = Vec::new();
        for op in batches.iter().flat_map(|b| &b.ops) {
            let (Op::Put { table, .. } | Op::Delete { table, .. }) = op;
            if !tables.contains(table) {
                tables.push(*table);
            }
        }
        CommitGroup {
            batches: batches.len(),
            tables,
        }
    });
    if let (Some(h), Some(g)) = (hook, &group) {
        h(CommitPoint::Before, g);
    }
    txn.commit().map_err(|e| err(e.into()))?;
    if let (Some(h), Some(g)) = (hook, &group) {
        h(CommitPoint::After, g);
    }
    Ok(out)
}

/// What a lone batch does, for its error: `write <table>/<key>` or `delete <table>/<key>` for
/// one change, a count otherwise.
fn describe(b: &Batch) -> String {
    match b.ops.as_slice() {
        [Op::Put { table, key, .. }] => format!("write {table}/{key}"),
        [Op::Delete { table, key }] => format!("delete {table}/{key}"),
        ops => format!("write {} changes", ops.len()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use crate::Store;

    use super::*;

    struct NotJson;
    impl Serialize for NotJson {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refuses to encode"))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writers_share_commits_and_each_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        // The hook holds the first commit until every writer has queued, so they must share.
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let hook: CommitHook = {
            let gate = Arc::clone(&gate);
            Arc::new(move |point, _: &CommitGroup| {
                if point == CommitPoint::Before {
                    let (open, cv) = &*gate;
                    let g = open.lock().unwrap();
                    drop(cv.wait_while(g, |open| !*open).unwrap());
                }
            })
        };
        let store = Arc::new(Store::open_with_hook(&path, Some(hook)).unwrap());
        let writers: Vec<_> = (0..64)
            .map(|n| {
                let s = Arc::clone(&store);
                tokio::spawn(async move {
                    let mut b = Batch::new();
                    b.put(Table::ALLOCS, &format!("a{n:02}"), &n).put(
                        Table::USAGES,
                        &format!("u{n:02}"),
                        &(n * 2),
                    );
                    s.commit(b).await
                })
            })
            .collect();
        // The first group is held in its commit; the gate opens once every writer has queued.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.committer.submitted() < 64 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writers never queued"
            );
            tokio::task::yield_now().await;
        }
        {
            let (open, cv) = &*gate;
            *open.lock().unwrap() = true;
            cv.notify_all();
        }
        for w in writers {
            w.await.unwrap().unwrap();
        }
        let stats = store.commit_stats();
        assert_eq!(stats.batches, 64);
        assert!(
            stats.commits <= 2,
            "64 writers took {} commits",
            stats.commits
        );
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.list::<u32>(Table::ALLOCS).unwrap().len(), 64);
        assert_eq!(store.get::<u32>(Table::USAGES, "u31").unwrap(), Some(62));
    }

    #[tokio::test]
    async fn a_sync_makes_deferred_batches_durable_and_costs_nothing_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = Store::open(&path).unwrap();
        store.sync().await.unwrap();
        assert_eq!(
            store.commit_stats(),
            CommitStats::default(),
            "nothing to sync"
        );
        let mut b = Batch::new();
        b.put(Table::ALLOCS, "a1", &1u32).deferred();
        store.commit(b).await.unwrap();
        // Durable when the sync returns (the idle flush comes later, unless this thread was
        // held up: then it did the same work and the sync finds nothing left).
        store.sync().await.unwrap();
        let synced = store.commit_stats();
        assert_eq!(
            (synced.commits, synced.durable),
            (2, 1),
            "one durable commit"
        );
        store.sync().await.unwrap();
        assert_eq!(store.commit_stats(), synced, "nothing left to sync");
    }

    #[tokio::test]
    async fn a_bad_batch_fails_alone_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state.redb")).unwrap();
        let mut bad = Batch::new();
        bad.put(Table::ALLOCS, "kept-out", &1u32)
            .put(Table::ALLOCS, "x", &NotJson);
        let mut good = Batch::new();
        good.put(Table::ALLOCS, "in", &2u32);
        let (b, g) = tokio::join!(store.commit(bad), store.commit(good));
        let err = b.unwrap_err();
        assert!(
            err.to_string().contains("allocs") && err.to_string().contains("\"x\""),
            "{err}"
        );
        g.unwrap();
        assert_eq!(store.keys(Table::ALLOCS).unwrap(), vec!["in".to_string()]);
    }

    #[tokio::test]
    async fn deletes_report_what_they_found_and_tables_change_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = Store::open(&path).unwrap();
        store.put(Table::VOLUMES, "v", &1u32).unwrap();
        let mut b = Batch::new();
        b.delete(Table::VOLUMES, "v")
            .delete(Table::VOLUMES, "none")
            .put(Table::USAGES, "p/v/u", &3u32);
        let done = store.commit(b).await.unwrap();
        assert_eq!(done.removed, vec![true, false]);
        assert!(store.commit(Batch::new()).await.unwrap().removed.is_empty());
        drop(store);
        let store = Store::open(&path).unwrap();
        assert!(store.get::<u32>(Table::VOLUMES, "v").unwrap().is_none());
        assert_eq!(store.get::<u32>(Table::USAGES, "p/v/u").unwrap(), Some(3));
    }
}
