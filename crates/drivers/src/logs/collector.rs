//! The log collector: a small process (`berth logmon …`, or the `berth-logmon` binary) that
//! reads one output stream of a task from its FIFO and writes it into numbered files, rotating
//! them by size and deleting the oldest (Nomad's logmon).
//!
//! It runs in a session of its own, so it outlives the agent (the task never writes into a
//! FIFO without a reader, which would kill it with `SIGPIPE`), and it ends when the stream
//! does: once every writer of the FIFO has closed it. While it lives it holds a write lock on
//! the stream's lock file, so one collector at most reads a stream, and the agent can tell
//! whether one runs ([`super::collector_pid`]).
//!
//! It tells whoever started it how its start went on its standard output, one line: `ready`
//! once the lock is held, the FIFO is open for reading and the newest file is open, or
//! `error: <why>`.

use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io::{self, Read as _, Write as _},
    os::{
        fd::AsFd,
        unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use nix::{
    libc,
    poll::{PollFd, PollFlags, PollTimeout, poll},
};

use super::files::{fifo_path, holder, lock_path, rotated_files, rotated_path, try_lock};

/// How long a collector waits for the stream's lock before it ends the collector holding it
/// (one left reading for a process of the task's previous run that still holds the FIFO).
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long it waits for the lock after ending that collector.
const LOCK_WAIT_AFTER_KILL: Duration = Duration::from_secs(2);

/// How often the lock is tried while waiting for it.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// How long one `poll` of the FIFO waits: the bound on noticing that the last writer left
/// when the kernel does not report it (a collector started while the writer was already
/// there).
const POLL_WAIT_MS: u16 = 1000;

/// How long a collector waits for the first writer before it gives up (its starter died
/// before the task started).
const FIRST_WRITER_WAIT: Duration = Duration::from_secs(60);

/// Bytes read from the FIFO at a time (a pipe holds 64 KiB by default).
const READ_SIZE: usize = 64 * 1024;

/// What a collector is told, as its command line says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectorArgs {
    /// The stream's base path: files are `<base>.0`, `<base>.1`…; the FIFO and lock file sit
    /// beside them.
    pub base: PathBuf,
    /// Most files kept (at least 1).
    pub max_files: u32,
    /// Size of a file before the next one is started, in MiB (at least 1).
    pub max_file_size_mb: u32,
    /// Mode of the files it creates.
    pub mode: u32,
}

impl CollectorArgs {
    /// The arguments, as [`CollectorArgs::parse`] reads them.
    pub fn to_args(&self) -> Vec<OsString> {
        vec![
            "--base".into(),
            self.base.clone().into(),
            "--max-files".into(),
            self.max_files.to_string().into(),
            "--max-file-size".into(),
            self.max_file_size_mb.to_string().into(),
            "--mode".into(),
            format!("{:o}", self.mode).into(),
        ]
    }

    /// Reads `--base PATH --max-files N --max-file-size MIB --mode OCTAL` (every one
    /// required, once); the error names the argument.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut base = None;
        let mut max_files = None;
        let mut max_size = None;
        let mut mode = None;
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let flag = flag.to_string_lossy().into_owned();
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |what: &str, radix: u32| {
                value
                    .to_str()
                    .and_then(|v| u32::from_str_radix(v, radix).ok())
                    .ok_or_else(|| format!("{what}: not a number"))
            };
            let slot_taken = match flag.as_str() {
                "--base" => base.replace(PathBuf::from(&value)).is_some(),
                "--max-files" => max_files.replace(number(&flag, 10)?).is_some(),
                "--max-file-size" => max_size.replace(number(&flag, 10)?).is_some(),
                "--mode" => mode.replace(number(&flag, 8)?).is_some(),
                other => return Err(format!("unknown argument {other:?}")),
            };
            if slot_taken {
                return Err(format!("{flag} is given twice"));
            }
        }
        let args = Self {
            base: base.ok_or("--base is required")?,
            max_files: max_files.ok_or("--max-files is required")?,
            max_file_size_mb: max_size.ok_or("--max-file-size is required")?,
            mode: mode.ok_or("--mode is required")?,
        };
        if !args.base.is_absolute() || args.base.file_name().is_none() {
            return Err("--base must be an absolute path to a file name".into());
        }
        if args.max_files == 0 {
            return Err("--max-files must be at least 1".into());
        }
        if args.max_file_size_mb == 0 {
            return Err("--max-file-size must be at least 1".into());
        }
        if args.mode & !0o777 != 0 {
            return Err("--mode must be permission bits (at most 777)".into());
        }
        Ok(args)
    }
}

/// The collector process's `main`: parses `args`, starts, says `ready` (or `error: …`) on its
/// standard output, and copies the stream until its last writer leaves. Exit code 0 at the
/// stream's end, 1 when it could not start, 2 for bad arguments.
pub fn collector_main(args: Vec<OsString>) -> ExitCode {
    let mut out = io::stdout();
    let args = match CollectorArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            return ExitCode::from(2);
        }
    };
    // Out of the starter's session and process group: a signal to the agent's group (a
    // terminal's Ctrl-C) never reaches it. Fails only for a group leader, which it is not.
    let _ = nix::unistd::setsid();
    let collector = match Collector::open(&args) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            return ExitCode::from(1);
        }
    };
    // The starter may be gone already; the stream is collected all the same.
    let _ = out.write_all(b"ready\n").and_then(|()| out.flush());
    collector.run();
    ExitCode::SUCCESS
}

/// A started collector: the lock held, the FIFO open, the newest file open.
struct Collector {
    /// Held for the collector's life: closing any descriptor of the lock file would drop the
    /// lock.
    _lock: File,
    fifo: File,
    files: Rotator,
}

impl Collector {
    fn open(args: &CollectorArgs) -> Result<Self, String> {
        let lock_file = lock_path(&args.base);
        let fifo_file = fifo_path(&args.base);
        let lock = open_with_mode(&lock_file, 0o600, false)
            .map_err(|e| format!("opening {}: {e}", lock_file.display()))?;
        acquire(&lock, &fifo_file).map_err(|e| format!("locking {}: {e}", lock_file.display()))?;
        let files = Rotator::open(args)
            .map_err(|e| format!("opening the newest file of {}: {e}", args.base.display()))?;
        // Non-blocking: the open never waits for a writer, and reads tell "no writer now"
        // (end of file) from "no data yet" (EAGAIN).
        let fifo = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo_file)
            .map_err(|e| format!("opening {}: {e}", fifo_file.display()))?;
        let is_fifo = fifo
            .metadata()
            .map_err(|e| format!("inspecting {}: {e}", fifo_file.display()))?
            .file_type()
            .is_fifo();
        if !is_fifo {
            return Err(format!("{} is not a FIFO", fifo_file.display()));
        }
        Ok(Self {
            _lock: lock,
            fifo,
            files,
        })
    }

    /// Copies the FIFO into the files until the stream ends: no writer is left after one was
    /// seen (or none came within [`FIRST_WRITER_WAIT`]). Write failures (a full disk) lose
    /// the bytes concerned, never stop the reading: a stalled reader would block the task.
    fn run(mut self) {
        let mut buf = vec![0u8; READ_SIZE];
        let started = Instant::now();
        let mut writer_seen = false;
        loop {
            let mut fds = [PollFd::new(self.fifo.as_fd(), PollFlags::POLLIN)];
            let hung_up = match poll(&mut fds, PollTimeout::from(POLL_WAIT_MS)) {
                Ok(_) => fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLHUP)),
                Err(nix::errno::Errno::EINTR) => false,
                Err(_) => return,
            };
            match self.fifo.read(&mut buf) {
                Ok(0) => {
                    // No writer now: the end, once one has been there.
                    if writer_seen || hung_up || started.elapsed() > FIRST_WRITER_WAIT {
                        return;
                    }
                }
                Ok(n) => {
                    writer_seen = true;
                    self.files.write(&buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => writer_seen = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// Takes the stream's lock, waiting up to [`LOCK_WAIT`] for a collector holding it to end;
/// then ends that collector (only a process whose command line names this FIFO) and waits
/// [`LOCK_WAIT_AFTER_KILL`] more.
fn acquire(lock: &File, fifo: &Path) -> io::Result<()> {
    if wait_for_lock(lock, LOCK_WAIT)? {
        return Ok(());
    }
    if let Some(pid) = holder(lock)?
        && reads_fifo(pid, fifo)
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    if wait_for_lock(lock, LOCK_WAIT_AFTER_KILL)? {
        return Ok(());
    }
    let who = holder(lock)?.map_or_else(|| "another process".into(), |p| format!("pid {p}"));
    Err(io::Error::other(format!(
        "{who} still collects this stream after {}",
        berth_sys::short_duration(LOCK_WAIT + LOCK_WAIT_AFTER_KILL)
    )))
}

fn wait_for_lock(lock: &File, wait: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + wait;
    loop {
        if try_lock(lock)? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(LOCK_POLL);
    }
}

/// Whether `pid`'s command line names `fifo` as its stream (the collector of that stream).
fn reads_fifo(pid: u32, fifo: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let Some(base) = fifo
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix('.'))
        .and_then(|n| n.strip_suffix(".fifo"))
    else {
        return false;
    };
    let base = fifo.with_file_name(base);
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2)
        .any(|w| w[0] == b"--base" && w[1] == base.as_os_str().as_encoded_bytes())
}

/// Opens `path` for appending (created with `mode` if missing, or only with `create_new`),
/// and gives it exactly `mode` whatever the umask.
fn open_with_mode(path: &Path, mode: u32, append: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    if append {
        options.append(true);
    } else {
        options.read(true).write(true);
    }
    let file = options.create(true).mode(mode).open(path)?;
    if file.metadata()?.permissions().mode() & 0o7777 != mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(file)
}

/// The stream's numbered files: appends to the newest, starts the next one when it reaches
/// the size limit, and deletes the oldest beyond the count limit.
#[derive(Debug)]
struct Rotator {
    base: PathBuf,
    max_files: u64,
    max_size: u64,
    mode: u32,
    index: u64,
    /// `None` after a failed open or write: reopened at the next write.
    file: Option<File>,
    size: u64,
}

impl Rotator {
    /// Opens the newest file (index 0 when there is none) for appending, and deletes files
    /// beyond the count limit.
    fn open(args: &CollectorArgs) -> io::Result<Self> {
        let newest = rotated_files(&args.base)?.last().map_or(0, |(i, _)| *i);
        let mut r = Self {
            base: args.base.clone(),
            max_files: u64::from(args.max_files),
            max_size: u64::from(args.max_file_size_mb) * 1024 * 1024,
            mode: args.mode,
            index: newest,
            file: None,
            size: 0,
        };
        r.reopen()?;
        r.purge();
        Ok(r)
    }

    fn reopen(&mut self) -> io::Result<()> {
        let file = open_with_mode(&rotated_path(&self.base, self.index), self.mode, true)?;
        self.size = file.metadata()?.len();
        self.file = Some(file);
        Ok(())
    }

    /// Starts the next file.
    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        self.index += 1;
        self.reopen()?;
        self.purge();
        Ok(())
    }

    /// Deletes every file more than `max_files` behind the current one.
    fn purge(&self) {
        let Ok(files) = rotated_files(&self.base) else {
            return;
        };
        for (index, path) in files {
            if index + self.max_files <= self.index {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Appends `data`, splitting it where a file reaches the size limit.
    fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.size >= self.max_size && self.rotate().is_err() {
                return;
            }
            if self.file.is_none() && self.reopen().is_err() {
                return;
            }
            let room = usize::try_from(self.max_size - self.size).unwrap_or(usize::MAX);
            let n = room.min(data.len());
            let Some(file) = self.file.as_mut() else {
                return;
            };
            if file.write_all(&data[..n]).is_err() {
                self.file = None;
                return;
            }
            self.size += n as u64;
            data = &data[n..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path, max_files: u32) -> CollectorArgs {
        CollectorArgs {
            base: dir.join("t.stdout"),
            max_files,
            max_file_size_mb: 1,
            mode: 0o640,
        }
    }

    #[test]
    fn arguments_round_trip_and_errors_name_the_argument() {
        let a = args(Path::new("/x"), 3);
        assert_eq!(CollectorArgs::parse(a.to_args()).unwrap(), a);
        let bad = |v: &[&str]| CollectorArgs::parse(v.iter().map(OsString::from)).unwrap_err();
        assert_eq!(bad(&["--base"]), "--base needs a value");
        assert!(
            bad(&[
                "--base",
                "/x",
                "--max-files",
                "0",
                "--max-file-size",
                "1",
                "--mode",
                "600"
            ])
            .contains("--max-files")
        );
        assert!(
            bad(&[
                "--base",
                "rel",
                "--max-files",
                "1",
                "--max-file-size",
                "1",
                "--mode",
                "600"
            ])
            .contains("--base")
        );
        assert!(bad(&["--mode", "9"]).contains("--mode"));
        assert!(bad(&["--bogus", "1"]).contains("bogus"));
        assert_eq!(
            bad(&["--mode", "600", "--mode", "600"]),
            "--mode is given twice"
        );
    }

    #[test]
    fn rotation_splits_at_the_limit_and_keeps_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(dir.path(), 2);
        let mut r = Rotator::open(&a).unwrap();
        let mib = 1024 * 1024;
        // 2.5 MiB in chunks that do not divide a MiB.
        let chunk: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut written = Vec::new();
        while written.len() < 5 * mib / 2 {
            r.write(&chunk);
            written.extend_from_slice(&chunk);
        }
        let files = rotated_files(&a.base).unwrap();
        let indices: Vec<u64> = files.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, [1, 2], "file 0 was deleted");
        let one = std::fs::read(&files[0].1).unwrap();
        let two = std::fs::read(&files[1].1).unwrap();
        assert_eq!(one.len(), mib);
        assert_eq!(two.len(), written.len() - 2 * mib);
        assert_eq!(one, written[mib..2 * mib]);
        assert_eq!(two, written[2 * mib..]);
        let mode = std::fs::metadata(&files[1].1).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);

        // A new collector appends to the newest file, and goes on numbering from it.
        drop(r);
        let mut r = Rotator::open(&a).unwrap();
        r.write(b"more\n");
        let two_now = std::fs::read(rotated_path(&a.base, 2)).unwrap();
        assert!(two_now.ends_with(b"more\n"));
        assert_eq!(two_now.len(), two.len() + 5);
    }
}
