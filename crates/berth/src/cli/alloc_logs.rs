//! `berth alloc logs [-f] [--stderr] [--tail] [-n N | -c BYTES] ALLOC [TASK]`: a task's
//! stdout (or stderr), printed as the task wrote it.

use anyhow::Context as _;
use berth_api::allocs::{LogOrigin, LogType, LogsRequest};
use clap::Args;

use super::{UsageError, api_client, job::parse_id, output};

/// What `--tail` shows without `-n` or `-c`: Nomad's 10 lines.
const DEFAULT_TAIL_LINES: u64 = 10;

/// A task's log. Nomad's single-dash forms (`-f`, `-stderr`, `-tail`, `-n`, `-c`, `-task`)
/// work too.
#[derive(Debug, Args)]
pub(super) struct LogsArgs {
    /// Keep printing what the task writes, across its restarts, until the alloc is done.
    #[arg(short = 'f', long)]
    follow: bool,
    /// Print its standard error instead of its standard output.
    #[arg(long)]
    stderr: bool,
    /// Start near the end: the last 10 lines, or as -n or -c say.
    #[arg(long)]
    tail: bool,
    /// The last N lines (implies --tail).
    #[arg(short = 'n', long = "lines", value_name = "N")]
    lines: Option<u64>,
    /// The last BYTES bytes (implies --tail).
    #[arg(
        short = 'c',
        long = "bytes",
        value_name = "BYTES",
        conflicts_with = "lines"
    )]
    bytes: Option<u64>,
    /// The task, as a flag (Nomad's -task).
    #[arg(long = "task", value_name = "TASK")]
    task_flag: Option<String>,
    /// The alloc id.
    #[arg(value_parser = parse_id)]
    alloc: String,
    /// The task; may be left out when the alloc has one task.
    task: Option<String>,
}

impl LogsArgs {
    /// The API request these flags make.
    fn request(&self) -> Result<LogsRequest, UsageError> {
        let task = match (&self.task, &self.task_flag) {
            (Some(a), Some(b)) if a != b => {
                return Err(UsageError(format!(
                    "the task is given twice, as {a:?} and as --task {b:?}"
                )));
            }
            (Some(t), _) | (None, Some(t)) => Some(t.clone()),
            (None, None) => None,
        };
        let mut req = LogsRequest {
            alloc_id: self.alloc.clone(),
            task,
            log_type: if self.stderr {
                LogType::Stderr
            } else {
                LogType::Stdout
            },
            follow: self.follow,
            ..Default::default()
        };
        match (self.bytes, self.lines) {
            (Some(bytes), _) => {
                req.origin = LogOrigin::End;
                req.offset = bytes;
            }
            (None, Some(n)) => req.lines = Some(n),
            (None, None) if self.tail => req.lines = Some(DEFAULT_TAIL_LINES),
            (None, None) => {}
        }
        Ok(req)
    }
}

/// Prints the log's bytes to standard output as they arrive.
pub(super) async fn run(address: &api_client::AgentAddress, args: LogsArgs) -> anyhow::Result<()> {
    let req = args.request()?;
    let client = api_client::connect(address)?;
    let mut log = client.alloc_logs(&req).await?;
    while let Some(chunk) = log.next().await {
        let chunk = chunk.context("reading the log")?;
        output::raw(&chunk)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut LogsArgs)) -> LogsArgs {
        let mut a = LogsArgs {
            follow: false,
            stderr: false,
            tail: false,
            lines: None,
            bytes: None,
            task_flag: None,
            alloc: "a1".into(),
            task: None,
        };
        f(&mut a);
        a
    }

    #[test]
    fn flags_make_the_request() {
        let r = args(|_| {}).request().unwrap();
        assert_eq!((r.origin, r.offset, r.lines), (LogOrigin::Start, 0, None));
        let r = args(|a| a.tail = true).request().unwrap();
        assert_eq!(r.lines, Some(10));
        let r = args(|a| a.lines = Some(5)).request().unwrap();
        assert_eq!(r.lines, Some(5));
        let r = args(|a| {
            a.tail = true;
            a.bytes = Some(100);
            a.stderr = true;
        })
        .request()
        .unwrap();
        assert_eq!(
            (r.origin, r.offset, r.lines, r.log_type),
            (LogOrigin::End, 100, None, LogType::Stderr)
        );
        let r = args(|a| a.task_flag = Some("web".into()))
            .request()
            .unwrap();
        assert_eq!(r.task.as_deref(), Some("web"));
        let e = args(|a| {
            a.task = Some("a".into());
            a.task_flag = Some("b".into());
        })
        .request()
        .unwrap_err();
        assert!(e.0.contains("twice"), "{e}");
    }
}
