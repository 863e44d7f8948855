//! The podman command line, as the `docker` driver uses it: one short-lived `podman` process
//! per operation, every one with the same global flags (OCI runtime, storage), each bounded
//! by a deadline.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use serde::Deserialize;
use tokio::process::Command;

/// How long a podman command that does not run a container may take.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A podman command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PodmanError {
    /// The program could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// It ran longer than its deadline and was killed.
    #[error("podman {verb} did not finish within {}", berth_sys::short_duration(*waited))]
    Timeout {
        /// The subcommand.
        verb: String,
        /// The deadline.
        waited: Duration,
    },
    /// It exited with a failure.
    #[error("podman {verb} failed ({code}): {message}")]
    Failed {
        /// The subcommand.
        verb: String,
        /// Its exit code (or -1 when killed by a signal).
        code: i32,
        /// Its error output, on one line.
        message: String,
    },
}

/// The podman program and the global flags every call gets.
#[derive(Debug, Clone)]
pub(crate) struct Podman {
    program: PathBuf,
    globals: Vec<OsString>,
}

impl Podman {
    /// podman at `program`, running containers with `runtime`; `root` and `run_root` replace
    /// its storage directories when given (its temporary directory goes under `run_root`).
    pub fn new(
        program: &Path,
        runtime: &str,
        root: Option<&Path>,
        run_root: Option<&Path>,
    ) -> Self {
        let mut globals: Vec<OsString> = vec!["--runtime".into(), runtime.into()];
        if let Some(root) = root {
            globals.push("--root".into());
            globals.push(root.into());
        }
        if let Some(run) = run_root {
            globals.push("--runroot".into());
            globals.push(run.into());
            globals.push("--tmpdir".into());
            globals.push(run.join("libpod").into());
        }
        Self {
            program: program.to_path_buf(),
            globals,
        }
    }

    /// The program.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The global flags every call gets.
    pub fn globals(&self) -> &[OsString] {
        &self.globals
    }

    /// A command `podman <globals> <args…>` with stdin from `/dev/null`, in its own process
    /// group (a signal to the agent's group never reaches it), killed when dropped.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.globals)
            .args(args.into_iter().map(Into::into))
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        cmd
    }

    /// Runs `podman <args…>` to its end (at most `timeout`) and returns its standard output.
    pub async fn run<I, S>(&self, args: I, timeout: Duration) -> Result<String, PodmanError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let verb = args
            .first()
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut cmd = self.command(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|source| PodmanError::Spawn {
            program: self.program.display().to_string(),
            source,
        })?;
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(source)) => {
                return Err(PodmanError::Spawn {
                    program: self.program.display().to_string(),
                    source,
                });
            }
            Err(_) => {
                return Err(PodmanError::Timeout {
                    verb,
                    waited: timeout,
                });
            }
        };
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        Err(PodmanError::Failed {
            verb,
            code: out.status.code().unwrap_or(-1),
            message: error_text(&out.stderr),
        })
    }

    /// The state of container `id`; `None` when podman has no such container.
    pub async fn inspect(&self, id: &str) -> Result<Option<ContainerState>, PodmanError> {
        match self
            .run(
                ["container", "inspect", "--format", "{{json .State}}", id],
                COMMAND_TIMEOUT,
            )
            .await
        {
            Ok(out) => serde_json::from_str::<ContainerState>(out.trim())
                .map(Some)
                .map_err(|e| PodmanError::Failed {
                    verb: "container inspect".into(),
                    code: 0,
                    message: format!("unreadable answer: {e}"),
                }),
            Err(PodmanError::Failed { message, .. }) if message.contains("no such container") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Removes container `id` (killing it first if it runs) and its anonymous volumes; a
    /// container already gone counts as removed.
    pub async fn remove(&self, id: &str) -> Result<(), PodmanError> {
        self.run(
            ["rm", "--force", "--ignore", "--volumes", "--time", "0", id],
            COMMAND_TIMEOUT,
        )
        .await
        .map(drop)
    }
}

/// What `podman container inspect` says of a container's state (the fields berth reads).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct ContainerState {
    /// Whether it runs.
    #[serde(default)]
    pub running: bool,
    /// Host pid of its first process (0 when not running).
    #[serde(default)]
    pub pid: u32,
    /// Exit code, once exited.
    #[serde(default)]
    pub exit_code: i32,
    /// Whether the OOM killer killed it.
    #[serde(default, rename = "OOMKilled")]
    pub oom_killed: bool,
}

/// The last lines of a podman error output, joined on one line (podman writes `Error: …`).
pub(crate) fn error_text(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let start = lines.len().saturating_sub(3);
    let joined = lines[start..].join(" / ");
    if joined.is_empty() {
        "no error output".into()
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_keeps_the_last_lines() {
        assert_eq!(error_text(b""), "no error output");
        assert_eq!(error_text(b"a\n\nError: b\nc\nd\n"), "Error: b / c / d");
    }

    #[test]
    fn state_reads_podman_json() {
        let s: ContainerState = serde_json::from_str(
            r#"{"OciVersion":"1.0.2","Status":"exited","Running":false,"Pid":0,"ExitCode":3,"OOMKilled":true}"#,
        )
        .unwrap();
        assert_eq!(s.exit_code, 3);
        assert!(s.oom_killed && !s.running);
    }

    #[test]
    fn globals_carry_runtime_and_storage() {
        let p = Podman::new(
            Path::new("/usr/bin/podman"),
            "runc",
            Some(Path::new("/s")),
            Some(Path::new("/r")),
        );
        let g: Vec<String> = p
            .globals
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            g,
            [
                "--runtime",
                "runc",
                "--root",
                "/s",
                "--runroot",
                "/r",
                "--tmpdir",
                "/r/libpod"
            ]
        );
    }
}
