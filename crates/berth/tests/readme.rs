//! The README works when pasted.
//!
//! [`readme_examples_work_when_pasted_in_order`] runs every ```` ```sh ```` block of README.md
//! that an `<!-- readme-test -->` comment marks, in README order, in one bash shell (so
//! variables, `PATH` and the working directory carry over from block to block, as in a
//! terminal), in a private mount namespace, from the root of the clone:
//!
//! - `<!-- readme-test: agent -->` marks the block that starts the agent. It must end with
//!   `berth agent --dev`; the test runs that command in the background, waits (bounded) for the
//!   `export BERTH_ADDR=…` line it prints and runs that line, as a reader pastes it into a
//!   second shell. At the end the agent is stopped with SIGTERM (Ctrl-C in its shell), must
//!   exit 0 and must have removed its data dir.
//! - `<!-- readme-test: needs=curl -->` runs its block only when `curl` is installed.
//! - `cargo build` lines are not run: the test runs the binaries it was built with, which the
//!   README's `$PWD/target/debug` names.
//!
//! The shell stops at the first command that fails (`set -e -o pipefail`), and the test says
//! which block and README line it was. Unmarked blocks are not run, so a new section never
//! breaks this test; it is covered once its block is marked.
//!
//! The other tests check what the README's "Using the CLI" says about every command.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use berth_testkit::{HostpathPlugin, bin_path, eventually};

/// How long the whole README may take.
const README_TIMEOUT: Duration = Duration::from_secs(100);

/// Sections that must keep at least one marked block (so markers cannot vanish unnoticed).
const COVERED_SECTIONS: [&str; 7] = [
    "Running the agent",
    "Talking to a plugin: `berth csi`",
    "Volumes",
    "Jobs",
    "Devices",
    "Run a fleet on one machine",
    "Access control",
];

/// What a marker asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// Run the block.
    Run,
    /// The block that starts the agent.
    Agent,
}

/// One marked ```` ```sh ```` block of the README.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    kind: Kind,
    /// Tools the block needs; it is skipped when one is missing.
    needs: Vec<String>,
    /// The heading of the section it is in.
    section: String,
    /// README line number (1-based) of the block's first line of code.
    first_line: usize,
    lines: Vec<String>,
}

/// The marked blocks of `readme`, in order. An error names the README line of a malformed
/// marker or block.
fn marked_blocks(readme: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with('#') && !line.starts_with("#!") {
            section = line.trim_start_matches('#').trim().to_string();
        }
        let Some(marker) = line
            .strip_prefix("<!-- readme-test")
            .and_then(|m| m.strip_suffix("-->"))
        else {
            // A fence starts a block to skip whole (a `#` in it is no heading).
            if line.starts_with("```") {
                i += 1;
                while i < lines.len() && !lines[i].trim().starts_with("```") {
                    i += 1;
                }
            }
            i += 1;
            continue;
        };
        let at = i + 1;
        let mut kind = Kind::Run;
        let mut needs = Vec::new();
        let options = marker.trim().trim_start_matches(':').trim();
        for option in options.split_whitespace() {
            match option.split_once('=') {
                None if option == "agent" => kind = Kind::Agent,
                Some(("needs", tools)) => needs.extend(tools.split(',').map(String::from)),
                _ => {
                    return Err(format!(
                        "README.md:{at}: unknown readme-test option {option:?}"
                    ));
                }
            }
        }
        if lines.get(i + 1).map(|l| l.trim()) != Some("```sh") {
            return Err(format!(
                "README.md:{at}: a readme-test marker must be followed at once by a ```sh block"
            ));
        }
        let first_line = i + 3;
        let mut code = Vec::new();
        i += 2;
        loop {
            match lines.get(i) {
                None => return Err(format!("README.md:{at}: the marked block never ends")),
                Some(l) if l.trim() == "```" => break,
                Some(l) => code.push(l.to_string()),
            }
            i += 1;
        }
        blocks.push(Block {
            kind,
            needs,
            section: section.clone(),
            first_line,
            lines: code,
        });
        i += 1;
    }
    Ok(blocks)
}

/// Where a line of the generated script comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// The test's own set-up or tear-down, described.
    Harness(&'static str),
    /// Block `block` (an index), README line `line`.
    Readme { block: usize, line: usize },
}

/// The command that ends the agent block.
const AGENT_COMMAND: &str = "berth agent --dev";

/// Runs before the README: stop at the first failure and say where; trace every command's line
/// (so a hang can be placed); start the agent and stop it.
const PRELUDE: &str = r#"set -eE -o pipefail
exec 8>>"$README_TRACE"
readme_failed() { [ -e "$README_FAILED" ] || echo "$1 $2" > "$README_FAILED"; }
trap 'readme_rc=$?; readme_failed "$LINENO" "$readme_rc"; exit "$readme_rc"' ERR
readme_agent() {
  berth agent --dev >"$README_AGENT_OUT" 2>"$README_AGENT_LOG" &
  README_AGENT_PID=$!
  echo "$README_AGENT_PID" >"$README_AGENT_PIDFILE"
  local i line
  for i in $(seq 300); do
    line=$(grep '^  export BERTH_ADDR=' "$README_AGENT_OUT" || true)
    if [ -n "$line" ]; then
      eval "$line"
      return 0
    fi
    if ! kill -0 "$README_AGENT_PID" 2>/dev/null; then
      echo "berth agent --dev exited before it printed BERTH_ADDR" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "berth agent --dev printed no BERTH_ADDR within 30s" >&2
  return 1
}
readme_stop_agent() {
  kill -TERM "$README_AGENT_PID"
  local i
  for i in $(seq 300); do
    kill -0 "$README_AGENT_PID" 2>/dev/null || break
    sleep 0.1
  done
  wait "$README_AGENT_PID"
  local data
  data=$(dirname "${BERTH_ADDR#unix://}")
  if [ -e "$data" ]; then
    echo "berth agent --dev left its data dir $data" >&2
    return 1
  fi
}
trap 'echo "$LINENO" >&8' DEBUG
"#;

/// The script that runs `blocks`, and the origin of each of its lines. `bin_dir` is where the
/// binaries under test are: it stands for the README's `$PWD/target/debug`.
fn script(blocks: &[Block], bin_dir: &Path) -> (String, Vec<Origin>) {
    let mut text = String::new();
    let mut origins = Vec::new();
    let mut push = |text: &mut String, line: &str, origin: Origin| {
        text.push_str(line);
        text.push('\n');
        origins.push(origin);
    };
    for line in PRELUDE.lines() {
        push(&mut text, line, Origin::Harness("the test's set-up"));
    }
    let bin = bin_dir.display().to_string();
    for (b, block) in blocks.iter().enumerate() {
        let missing: Vec<&String> = block.needs.iter().filter(|t| !installed(t)).collect();
        if !missing.is_empty() {
            eprintln!(
                "README.md:{}: block skipped, {missing:?} not installed",
                block.first_line
            );
            continue;
        }
        for (n, line) in block.lines.iter().enumerate() {
            let origin = Origin::Readme {
                block: b,
                line: block.first_line + n,
            };
            let code = line.split(" #").next().unwrap_or(line).trim();
            let run = if code.starts_with("cargo build") {
                format!(": {line:?} is not run: the test runs the binaries it was built with")
            } else if block.kind == Kind::Agent && code == AGENT_COMMAND {
                "readme_agent".to_string()
            } else {
                line.replace("$PWD/target/debug", &bin)
                    .replace("./target/debug", &bin)
            };
            push(&mut text, &run, origin);
        }
    }
    push(
        &mut text,
        "trap - DEBUG",
        Origin::Harness("the test's tear-down"),
    );
    push(
        &mut text,
        "readme_stop_agent",
        Origin::Harness("stopping the agent with SIGTERM (Ctrl-C in its shell)"),
    );
    (text, origins)
}

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn readme() -> String {
    std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md")
}

/// What the README run leaves behind, removed however the test ends: the agent and the tasks
/// it started, and the mount points the `exec` driver made on the host.
struct Cleanup {
    tmp: PathBuf,
    made_on_host: Vec<&'static str>,
}

/// The directories the README's jobs use as mount points (see "Known limits").
const HOST_MOUNT_POINTS: [&str; 4] = ["/data", "/csi", "/local/csi", "/local"];

impl Drop for Cleanup {
    fn drop(&mut self) {
        // The agent first, gently: with --dev it stops its jobs and plugin and removes its
        // data dir. Bounded; whatever is left is killed below.
        let agent = std::fs::read_to_string(self.tmp.join("agent.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .map(nix::unistd::Pid::from_raw);
        if let Some(pid) = agent
            && nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok()
        {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while nix::sys::signal::kill(pid, None).is_ok() && std::time::Instant::now() < deadline
            {
                std::thread::sleep(berth_testkit::POLL_INTERVAL);
            }
        }
        // Everything the README started inherited TMPDIR; tasks are found by their alloc dir.
        kill_processes_with_env(&format!("TMPDIR={}", self.tmp.display()));
        if let Some(data) = agent_data_dir(&self.tmp) {
            berth_testkit::kill_tasks_under(&data.join("allocs"));
        }
        for dir in &self.made_on_host {
            // Only if empty: never anything that holds data.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// SIGKILLs every process whose environment holds `var` (`NAME=value`) exactly.
fn kill_processes_with_env(var: &str) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == var.as_bytes()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The agent's data dir, from the `export BERTH_ADDR=unix://<dir>/berth.sock` it printed.
fn agent_data_dir(tmp: &Path) -> Option<PathBuf> {
    let out = std::fs::read_to_string(tmp.join("agent.out")).ok()?;
    let line = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("export BERTH_ADDR=unix://"))?;
    Path::new(line).parent().map(Path::to_path_buf)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `PATH` without the directory of the binaries under test: the README must put them there.
fn fresh_path(bin_dir: &Path) -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| Path::new(d) != bin_dir)
        .collect::<Vec<_>>()
        .join(":")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_examples_work_when_pasted_in_order() {
    let readme = readme();
    let blocks = marked_blocks(&readme).unwrap_or_else(|e| panic!("{e}"));
    let agent_blocks: Vec<&Block> = blocks.iter().filter(|b| b.kind == Kind::Agent).collect();
    assert_eq!(agent_blocks.len(), 1, "one block must start the agent");
    assert_eq!(blocks[0].kind, Kind::Agent, "the agent starts first");
    let last = blocks[0]
        .lines
        .iter()
        .rev()
        .map(|l| l.split(" #").next().unwrap_or(l).trim())
        .find(|l| !l.is_empty());
    assert_eq!(last, Some(AGENT_COMMAND), "the agent block ends with it");
    let sections: BTreeSet<&str> = blocks.iter().map(|b| b.section.as_str()).collect();
    for section in COVERED_SECTIONS {
        assert!(
            sections.contains(section),
            "README section {section:?} has no marked block (sections with one: {sections:?})"
        );
    }

    let berth = bin_path("berth");
    let bin_dir = berth.parent().expect("bin dir").to_path_buf();
    assert!(
        bin_dir.join("berth-hostpath").is_file(),
        "berth-hostpath is not built next to berth: `cargo build --bin berth-hostpath`"
    );
    let (text, origins) = script(&blocks, &bin_dir);

    // Short: the agent's sockets live under it.
    let tmp = tempfile::Builder::new()
        .prefix("rd")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let t = tmp.path();
    let cleanup = Cleanup {
        tmp: t.to_path_buf(),
        made_on_host: HOST_MOUNT_POINTS
            .into_iter()
            .filter(|d| !Path::new(d).exists())
            .collect(),
    };
    let script_path = t.join("readme.sh");
    std::fs::write(&script_path, &text).expect("write script");
    let output = std::fs::File::create(t.join("output")).expect("output file");
    let mut child = berth_testkit::private_ns_command(Path::new("bash"))
        .arg(&script_path)
        .current_dir(workspace_root())
        .env("PATH", fresh_path(&bin_dir))
        .env("TMPDIR", t)
        .env("README_TRACE", t.join("trace"))
        .env("README_FAILED", t.join("failed"))
        .env("README_AGENT_OUT", t.join("agent.out"))
        .env("README_AGENT_LOG", t.join("agent.log"))
        .env("README_AGENT_PIDFILE", t.join("agent.pid"))
        .env_remove("BERTH_ADDR")
        .env_remove("CSI_ENDPOINT")
        .env_remove("BERTH_LOG")
        .env_remove("BERTH_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("output"))
        .stderr(output)
        .spawn()
        .expect("start bash");
    let finished = eventually(README_TIMEOUT, || {
        std::future::ready(child.try_wait().expect("wait").is_some())
    })
    .await;
    if !finished {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait");

    let read = |name: &str| std::fs::read_to_string(t.join(name)).unwrap_or_default();
    let failed_at = read("failed");
    let passed = finished && status.success() && failed_at.is_empty();
    if !passed {
        // The failing line, else (a hang) the last line started.
        let (line, why) = match failed_at.split_whitespace().collect::<Vec<_>>()[..] {
            [line, rc] => (line.parse().ok(), format!("failed with exit code {rc}")),
            _ if !finished => (
                read("trace").lines().last().and_then(|l| l.parse().ok()),
                format!("did not finish within {README_TIMEOUT:?}"),
            ),
            _ => (None, format!("the shell exited with {status}")),
        };
        let place = match line.and_then(|l: usize| origins.get(l - 1)) {
            Some(Origin::Readme { block, line }) => {
                let b = &blocks[*block];
                format!(
                    "README.md:{line} (the block at line {} in section {:?}):\n    {}\n{}",
                    b.first_line,
                    b.section,
                    readme.lines().nth(line - 1).unwrap_or_default(),
                    b.lines.join("\n")
                )
            }
            Some(Origin::Harness(what)) => (*what).to_string(),
            None => "an unknown line".into(),
        };
        let mut msg = String::new();
        let _ = write!(
            msg,
            "the README {why} at {place}\n\n--- output (last lines) ---\n{}\n\n--- agent log \
             (last lines) ---\n{}",
            tail(&read("output"), 60),
            tail(&read("agent.log"), 30)
        );
        drop(cleanup);
        panic!("{msg}");
    }
    assert!(
        agent_data_dir(t).is_some(),
        "the agent printed no BERTH_ADDR"
    );
    eprintln!("{}", read("output"));
    drop(cleanup);
}

#[test]
fn marked_blocks_are_found_with_their_section_and_lines() {
    let readme = "# a\n\ntext\n\n<!-- readme-test: agent -->\n```sh\nx\nberth agent --dev\n```\n\n\
                  ```sh\n# not a heading\nnot marked\n```\n\n## b\n<!-- readme-test -->\n```sh\n\
                  y # z\n```\n<!-- readme-test: needs=curl,jq -->\n```sh\nc\n```\n";
    let blocks = marked_blocks(readme).expect("parses");
    assert_eq!(
        blocks,
        [
            Block {
                kind: Kind::Agent,
                needs: vec![],
                section: "a".into(),
                first_line: 7,
                lines: vec!["x".into(), "berth agent --dev".into()],
            },
            Block {
                kind: Kind::Run,
                needs: vec![],
                section: "b".into(),
                first_line: 19,
                lines: vec!["y # z".into()],
            },
            Block {
                kind: Kind::Run,
                needs: vec!["curl".into(), "jq".into()],
                section: "b".into(),
                first_line: 23,
                lines: vec!["c".into()],
            },
        ]
    );
    assert_eq!(readme.lines().nth(18), Some("y # z"));

    for (bad, why) in [
        (
            "<!-- readme-test -->\ntext\n",
            "README.md:1: a readme-test marker must be followed",
        ),
        (
            "<!-- readme-test -->\n```sh\nx\n",
            "README.md:1: the marked block never ends",
        ),
        (
            "x\n<!-- readme-test: often -->\n```sh\n```\n",
            "README.md:2: unknown readme-test",
        ),
    ] {
        let err = marked_blocks(bad).expect_err(bad);
        assert!(err.starts_with(why), "{err}");
    }
}

#[test]
fn the_script_maps_every_line_back_to_the_readme() {
    let blocks = marked_blocks(
        "<!-- readme-test: agent -->\n```sh\ncargo build --bin berth\nexport PATH=$PWD/target/debug:$PATH\nberth agent --dev   # runs\n```\n<!-- readme-test -->\n```sh\nberth plugin status\n```\n",
    )
    .expect("parses");
    let (text, origins) = script(&blocks, Path::new("/bins"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), origins.len());
    let at = |readme_line| {
        origins
            .iter()
            .position(|o| matches!(o, Origin::Readme { line, .. } if *line == readme_line))
            .map(|i| lines[i])
    };
    assert!(at(3).expect("line 3").starts_with(": \"cargo build"));
    assert_eq!(at(4), Some("export PATH=/bins:$PATH"));
    assert_eq!(at(5), Some("readme_agent"));
    assert_eq!(at(9), Some("berth plugin status"));
    assert_eq!(lines.last(), Some(&"readme_stop_agent"));
}

/// Runs `berth` with `args` and `env`, stdin from `stdin`; bounded, killed when late.
async fn berth(args: &[&str], env: &[(&str, &str)], stdin: Option<Vec<u8>>) -> Output {
    let mut cmd = Command::new(bin_path("berth"));
    cmd.args(args)
        .env_remove("BERTH_ADDR")
        .env_remove("CSI_ENDPOINT")
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run berth");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        // berth may stop reading at its bound: a broken pipe here is expected.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    let mut done = false;
    let ok = eventually(Duration::from_secs(20), || {
        done = done || child.try_wait().expect("wait").is_some();
        std::future::ready(done)
    })
    .await;
    if !ok {
        let _ = child.kill();
        panic!("berth {args:?} did not return within 20s");
    }
    child.wait_with_output().expect("output")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn address_is_refused_where_it_means_nothing_and_a_bad_one_is_named() {
    for args in [
        &["agent", "--address", "unix:///x.sock"][..],
        &["--address", "unix:///x.sock", "agent", "--dev"],
    ] {
        let o = berth(args, &[], None).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("api { socket"), "{}", stderr(&o));
    }
    let o = berth(&["csi", "--address", "unix:///x.sock", "info"], &[], None).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--endpoint"), "{}", stderr(&o));

    // BERTH_ADDR in the agent's environment is no --address.
    let o = berth(
        &["agent", "--config", "/nonexistent/agent.hcl"],
        &[("BERTH_ADDR", "unix:///x.sock")],
        None,
    )
    .await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: cannot read --config /nonexistent/agent.hcl"),
        "{}",
        stderr(&o)
    );

    let o = berth(&["plugin", "status"], &[("BERTH_ADDR", "ftp://x")], None).await;
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("error: BERTH_ADDR: invalid agent address \"ftp://x\""),
        "{}",
        stderr(&o)
    );
    let o = berth(
        &["--address", "ftp://y", "plugin", "status"],
        &[("BERTH_ADDR", "ftp://x")],
        None,
    )
    .await;
    assert!(
        stderr(&o).starts_with("error: --address: invalid agent address \"ftp://y\""),
        "{}",
        stderr(&o)
    );
}

#[tokio::test]
async fn spec_files_are_regular_files_of_at_most_1_mib() {
    // No agent: the file is refused before anything is sent.
    let env = [("BERTH_ADDR", "unix:///nonexistent/berth.sock")];
    let tmp = tempfile::tempdir().expect("tmp");
    let fifo = tmp.path().join("spec.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let fifo = fifo.to_str().expect("utf8");
    let dir = tmp.path().to_str().expect("utf8");
    for (args, kind) in [
        (vec!["volume", "create", "/dev/zero"], "a character device"),
        (vec!["volume", "register", fifo], "a FIFO"),
        (vec!["job", "run", dir], "a directory"),
    ] {
        let o = berth(&args, &env, None).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        let path = args[2];
        assert_eq!(
            stderr(&o),
            format!(
                "error: {path}: is {kind}, not a regular file (give a file, or - for standard \
                 input)\n"
            )
        );
    }
    let big = vec![b'#'; (1 << 20) + 1];
    for args in [["job", "run", "-"], ["volume", "create", "-"]] {
        let o = berth(&args, &env, Some(big.clone())).await;
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).starts_with(
                "error: <stdin>: larger than 1 MiB, the most berth reads from one file; a spec \
                 goes to the agent's API"
            ),
            "{}",
            stderr(&o)
        );
    }
    let big_file = tmp.path().join("big.hcl");
    std::fs::write(&big_file, &big).expect("write");
    let o = berth(
        &["job", "run", big_file.to_str().expect("utf8")],
        &env,
        None,
    )
    .await;
    assert!(stderr(&o).contains("larger than 1 MiB"), "{}", stderr(&o));
    // One byte less is read and sent: the error is then about the agent.
    let o = berth(&["job", "run", "-"], &env, Some(big[1..].to_vec())).await;
    assert!(
        stderr(&o).starts_with("error: cannot reach the agent"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test]
async fn a_reader_that_stops_early_ends_the_command_quietly() {
    let plugin = HostpathPlugin::builder().spawn().await;
    for args in [&["info"][..], &["capabilities"], &["--json", "node-info"]] {
        // The read end is closed before berth writes: its first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let o = Command::new(bin_path("berth"))
            .arg("csi")
            .args(["--endpoint", &plugin.endpoint()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run berth");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
}
