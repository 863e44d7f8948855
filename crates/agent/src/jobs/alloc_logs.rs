//! `GET /v1/client/fs/logs/{alloc_id}`: a task's stdout or stderr, read across its numbered
//! files in order (or its one file, without a collector), from where the request says, and,
//! when followed, as it is written: into the next file when the collector rotates, across the
//! task's restarts (the next collector appends to the newest file), until the alloc is
//! terminal and every byte was sent.
//!
//! A followed log waits for changes through an inotify watch of the logs directory and the
//! alloc's record changes, with a bounded poll as a safety net (and the only way when the
//! watch cannot be made).

use std::{
    io::{self, SeekFrom},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use berth_api::{
    allocs::{LogOrigin, LogStream, LogType, LogsRequest},
    server::ApiError,
};
use berth_drivers::logs::{collector_pid, rotated_files};
use notify::Watcher as _;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

use super::Jobs;

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// How often a followed log looks for changes without being told (the safety net).
const SAFETY_POLL: Duration = Duration::from_secs(1);

/// How often it looks when no watch could be made.
const FALLBACK_POLL: Duration = Duration::from_millis(250);

impl Jobs {
    /// The task's log as [`LogsRequest`] says (see the module docs). 404 for an alloc this
    /// node does not have or a task it does not have; 400 when the task is left out of an
    /// alloc with several.
    pub async fn logs(self: &Arc<Self>, req: LogsRequest) -> Result<LogStream, ApiError> {
        let status = self.alloc_status(&req.alloc_id).ok_or_else(|| {
            ApiError::NotFound(format!("no alloc {:?} on this node", req.alloc_id))
        })?;
        let task = pick_task(&status, req.task.as_deref())?;
        let alloc_dir = self.deps.allocs_dir.join(&req.alloc_id);
        let base = alloc_dir.join("logs").join(format!(
            "{task}.{}",
            match req.log_type {
                LogType::Stdout => "stdout",
                LogType::Stderr => "stderr",
            }
        ));
        let start = start_position(&base, &req)
            .await
            .map_err(|e| ApiError::Internal(format!("reading the log {}: {e}", base.display())))?;
        let reader = Reader {
            jobs: Arc::clone(self),
            alloc_id: req.alloc_id.clone(),
            base,
            at: start,
            file: None,
            follow: req.follow,
            wake: None,
            done: false,
        };
        Ok(Box::pin(futures::stream::unfold(
            reader,
            |mut r| async move { r.next_chunk().await.map(|c| (c, r)) },
        )))
    }
}

/// The task `asked` of `status`, or its only task.
pub(super) fn pick_task<'a>(
    status: &'a berth_allocrunner::AllocStatus,
    asked: Option<&str>,
) -> Result<&'a str, ApiError> {
    let names: Vec<&str> = status.tasks.keys().map(String::as_str).collect();
    match asked {
        Some(t) => names.iter().copied().find(|n| *n == t).ok_or_else(|| {
            ApiError::NotFound(format!(
                "alloc {:?} has no task {t:?} (its tasks: {})",
                status.alloc_id,
                names.join(", ")
            ))
        }),
        None if names.len() == 1 => Ok(names[0]),
        None => Err(ApiError::BadRequest(format!(
            "alloc {:?} has {} tasks ({}): name one (task)",
            status.alloc_id,
            names.len(),
            names.join(", ")
        ))),
    }
}

/// A place in the stream: file `index` (`None`: the plain file of a task without a
/// collector) at byte `pos`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct At {
    index: Option<u64>,
    pos: u64,
}

/// The stream's files now, oldest first, with their lengths: the numbered files, else the
/// plain file when there is one.
async fn segments(base: &Path) -> io::Result<Vec<(Option<u64>, PathBuf, u64)>> {
    let mut out = Vec::new();
    for (index, path) in rotated_files(base)? {
        match tokio::fs::metadata(&path).await {
            Ok(m) => out.push((Some(index), path, m.len())),
            // Deleted by the collector meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if out.is_empty()
        && let Ok(m) = tokio::fs::metadata(base).await
        && m.is_file()
    {
        out.push((None, base.to_path_buf(), m.len()));
    }
    Ok(out)
}

/// Where the stream starts: `offset` bytes after the first byte kept, or before the last one
/// written, or the start of the last `lines` lines.
async fn start_position(base: &Path, req: &LogsRequest) -> io::Result<At> {
    let segs = segments(base).await?;
    let total: u64 = segs.iter().map(|(_, _, len)| len).sum();
    let from_start = match (req.lines, req.origin) {
        (Some(n), _) => last_lines_start(&segs, n).await?,
        (None, LogOrigin::Start) => req.offset.min(total),
        (None, LogOrigin::End) => total.saturating_sub(req.offset),
    };
    // The stream's position `from_start` as (file, byte in it).
    let mut left = from_start;
    for (i, (index, _, len)) in segs.iter().enumerate() {
        if left < *len || i + 1 == segs.len() {
            return Ok(At {
                index: *index,
                pos: left.min(*len),
            });
        }
        left -= len;
    }
    // No file yet: the first one the collector makes.
    Ok(At {
        index: Some(0),
        pos: 0,
    })
}

/// The position (from the stream's start) of the first byte of its last `n` lines: the byte
/// after the `n`th newline from the end, a newline ending the stream not counted.
async fn last_lines_start(segs: &[(Option<u64>, PathBuf, u64)], n: u64) -> io::Result<u64> {
    let total: u64 = segs.iter().map(|(_, _, len)| len).sum();
    if n == 0 {
        return Ok(total);
    }
    let mut end_of_file = total;
    let mut seen = 0u64;
    let mut skip_final_newline = true;
    let mut buf = vec![0u8; CHUNK];
    for (_, path, len) in segs.iter().rev() {
        let file_start = end_of_file - len;
        let mut file = match tokio::fs::File::open(path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                end_of_file = file_start;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut upto = *len;
        while upto > 0 {
            let from = upto.saturating_sub(CHUNK as u64);
            let want = (upto - from) as usize;
            file.seek(SeekFrom::Start(from)).await?;
            let chunk = &mut buf[..want];
            file.read_exact(chunk).await?;
            for (i, b) in chunk.iter().enumerate().rev() {
                if skip_final_newline {
                    skip_final_newline = false;
                    if *b == b'\n' {
                        continue;
                    }
                }
                if *b == b'\n' {
                    seen += 1;
                    if seen == n {
                        return Ok(file_start + from + i as u64 + 1);
                    }
                }
            }
            upto = from;
        }
        end_of_file = file_start;
    }
    Ok(0)
}

/// What wakes a followed log: the watch of the logs directory (kept alive here), the alloc's
/// record changes.
struct Wake {
    _watcher: Option<notify::RecommendedWatcher>,
    changed: Arc<tokio::sync::Notify>,
    records: tokio::sync::watch::Receiver<u64>,
    poll: Duration,
}

impl Wake {
    fn new(dir: &Path, records: tokio::sync::watch::Receiver<u64>) -> Self {
        let changed = Arc::new(tokio::sync::Notify::new());
        let notify = Arc::clone(&changed);
        let watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
            notify.notify_one();
        })
        .and_then(|mut w| {
            w.watch(dir, notify::RecursiveMode::NonRecursive)?;
            Ok(w)
        });
        let (watcher, poll) = match watcher {
            Ok(w) => (Some(w), SAFETY_POLL),
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "following a log by polling");
                (None, FALLBACK_POLL)
            }
        };
        Self {
            _watcher: watcher,
            changed,
            records,
            poll,
        }
    }

    /// Waits for a change (bounded by the poll interval).
    async fn wait(&mut self) {
        tokio::select! {
            () = self.changed.notified() => {}
            _ = self.records.changed() => {}
            () = tokio::time::sleep(self.poll) => {}
        }
    }
}

struct Reader {
    jobs: Arc<Jobs>,
    alloc_id: String,
    base: PathBuf,
    at: At,
    /// The file at `at`, open.
    file: Option<tokio::fs::File>,
    follow: bool,
    wake: Option<Wake>,
    done: bool,
}

impl Reader {
    /// The next bytes; `None` at the end of the stream.
    async fn next_chunk(&mut self) -> Option<io::Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        loop {
            match self.read_here().await {
                Ok(Some(bytes)) => return Some(Ok(bytes)),
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            // At the end of the current file: a newer one means the collector moved on (after
            // it finished this one), so what is left here is read first.
            match self.next_file().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            if !self.follow {
                self.done = true;
                return None;
            }
            // Ended: the alloc is terminal and nothing writes the stream any more; one last
            // look catches bytes written between the read and the check.
            if self.finished() {
                match self.read_here().await {
                    Ok(Some(bytes)) => return Some(Ok(bytes)),
                    Ok(None) => {}
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
                if matches!(self.next_file().await, Ok(true)) {
                    continue;
                }
                self.done = true;
                return None;
            }
            if self.wake.is_none() {
                let dir = self.base.parent().unwrap_or(Path::new("/")).to_path_buf();
                self.wake = Some(Wake::new(&dir, self.jobs.subscribe()));
                // Anything written before the watch began is read now.
                continue;
            }
            if let Some(w) = self.wake.as_mut() {
                w.wait().await;
            }
        }
    }

    /// Bytes at the current place; `Ok(None)` at its end (or when its file does not exist
    /// yet).
    async fn read_here(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.file.is_none() {
            let path = match self.at.index {
                Some(i) => berth_drivers::logs::rotated_path(&self.base, i),
                None => self.base.clone(),
            };
            let mut file = match tokio::fs::File::open(&path).await {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            file.seek(SeekFrom::Start(self.at.pos)).await?;
            self.file = Some(file);
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(None);
        };
        let mut buf = vec![0u8; CHUNK];
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        self.at.pos += n as u64;
        Ok(Some(buf))
    }

    /// Moves to the oldest file newer than the current one, when there is one (after reading
    /// what was added to the current one meanwhile: returns `true` then too, to read it).
    async fn next_file(&mut self) -> io::Result<bool> {
        let segs = segments(&self.base).await?;
        let newer = match self.at.index {
            Some(i) => segs
                .iter()
                .filter_map(|(idx, _, _)| *idx)
                .find(|idx| *idx > i),
            // A plain file never rotates; numbered files appear only with a new collector.
            None => segs.iter().filter_map(|(idx, _, _)| *idx).next(),
        };
        let Some(next) = newer else {
            return Ok(false);
        };
        if self.read_pending().await? {
            return Ok(true);
        }
        self.at = At {
            index: Some(next),
            pos: 0,
        };
        self.file = None;
        Ok(true)
    }

    /// Whether the current file grew past the current place.
    async fn read_pending(&mut self) -> io::Result<bool> {
        let Some(file) = self.file.as_ref() else {
            return Ok(false);
        };
        Ok(file.metadata().await?.len() > self.at.pos)
    }

    /// Whether the stream is over: the alloc is terminal (or gone) and no collector writes
    /// it.
    fn finished(&self) -> bool {
        let terminal = self
            .jobs
            .alloc_status(&self.alloc_id)
            .is_none_or(|s| s.client_status.is_terminal());
        terminal && !matches!(collector_pid(&self.base), Ok(Some(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn start(dir: &Path, files: &[(&str, &str)], req: LogsRequest) -> At {
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        start_position(&dir.join("t.stdout"), &req).await.unwrap()
    }

    fn at(index: u64, pos: u64) -> At {
        At {
            index: Some(index),
            pos,
        }
    }

    #[tokio::test]
    async fn start_positions_count_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let files = [("t.stdout.3", "a\nb\n"), ("t.stdout.4", "c\nd\ne")];
        let req = |origin, offset, lines| LogsRequest {
            origin,
            offset,
            lines,
            ..Default::default()
        };
        let d = dir.path();
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 0, None)).await,
            at(3, 0)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 5, None)).await,
            at(4, 1)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 99, None)).await,
            at(4, 5)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::End, 2, None)).await,
            at(4, 3)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::End, 99, None)).await,
            at(3, 0)
        );
        // The last lines: "e" has no newline and counts as one.
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 0, Some(1))).await,
            at(4, 4)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 0, Some(3))).await,
            at(4, 0)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 0, Some(4))).await,
            at(3, 2)
        );
        assert_eq!(
            start(d, &files, req(LogOrigin::Start, 0, Some(9))).await,
            at(3, 0)
        );
        // A newline ending the stream ends the last line; it starts no new one.
        std::fs::write(d.join("t.stdout.4"), "c\nd\ne\n").unwrap();
        assert_eq!(
            start(d, &[], req(LogOrigin::Start, 0, Some(1))).await,
            at(4, 4)
        );
        assert_eq!(
            start(d, &[], req(LogOrigin::Start, 0, Some(2))).await,
            at(4, 2)
        );
    }

    #[tokio::test]
    async fn a_task_without_a_collector_has_one_plain_file() {
        let dir = tempfile::tempdir().unwrap();
        let req = LogsRequest {
            origin: LogOrigin::End,
            offset: 2,
            ..Default::default()
        };
        let got = start(dir.path(), &[("t.stdout", "hello\n")], req).await;
        assert_eq!(
            got,
            At {
                index: None,
                pos: 4
            }
        );
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            start(empty.path(), &[], LogsRequest::default()).await,
            at(0, 0),
            "no file yet: the first one"
        );
    }
}
