//! The test-only fault switch: `<RpcName>:<ACTION>[:<COUNT>]` specs from flags, the environment
//! and a control file in the state directory (see the crate documentation).

use std::{
    collections::BTreeMap,
    fmt, io,
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Arc, Mutex},
    time::Duration,
};

use berth_csi::Rpc;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

/// Exit code of the `exit` action.
pub const EXIT_CODE: i32 = 75;

/// Name of the control file in the state directory.
pub const CONTROL_FILE: &str = "faults";

/// Name of the file, in the state directory, that keeps the used counts.
pub const COUNTERS_FILE: &str = "faults.state.json";

const CODES: &[(&str, Code)] = &[
    ("CANCELLED", Code::Cancelled),
    ("UNKNOWN", Code::Unknown),
    ("INVALID_ARGUMENT", Code::InvalidArgument),
    ("DEADLINE_EXCEEDED", Code::DeadlineExceeded),
    ("NOT_FOUND", Code::NotFound),
    ("ALREADY_EXISTS", Code::AlreadyExists),
    ("PERMISSION_DENIED", Code::PermissionDenied),
    ("RESOURCE_EXHAUSTED", Code::ResourceExhausted),
    ("FAILED_PRECONDITION", Code::FailedPrecondition),
    ("ABORTED", Code::Aborted),
    ("OUT_OF_RANGE", Code::OutOfRange),
    ("UNIMPLEMENTED", Code::Unimplemented),
    ("INTERNAL", Code::Internal),
    ("UNAVAILABLE", Code::Unavailable),
    ("DATA_LOSS", Code::DataLoss),
    ("UNAUTHENTICATED", Code::Unauthenticated),
];

/// The name of a gRPC code as fault specs and the call log spell it: `OK`, `UNAVAILABLE`, …
pub fn code_name(code: Code) -> &'static str {
    if code == Code::Ok {
        return "OK";
    }
    CODES
        .iter()
        .find(|(_, c)| *c == code)
        .map_or("UNKNOWN", |(name, _)| name)
}

/// The gRPC code named `name` (as [`code_name`] spells it).
pub fn code_from_name(name: &str) -> Option<Code> {
    if name == "OK" {
        return Some(Code::Ok);
    }
    CODES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// What a matching fault does to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail with this code and a message saying the failure is injected.
    Fail(Code),
    /// Wait, then answer normally.
    Delay(Duration),
    /// Never answer; the call ends when the client goes away (or the plugin shuts down).
    Hang,
    /// Exit the process at once with [`EXIT_CODE`], without answering.
    Exit,
}

/// One parsed `<RpcName>:<ACTION>[:<COUNT>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpec {
    /// The method it applies to; `None` for `*` (every method).
    pub rpc: Option<Rpc>,
    /// What it does.
    pub action: FaultAction,
    /// How many matching calls it applies to; `None` for every call.
    pub count: Option<u64>,
    text: String,
}

/// A spec that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault spec {spec:?}: {reason}")]
pub struct FaultSpecError {
    /// The spec as written.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FaultSpec {
    /// The spec as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this spec applies to calls of `rpc`.
    pub fn matches(&self, rpc: Rpc) -> bool {
        self.rpc.is_none_or(|r| r == rpc)
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for FaultSpec {
    type Err = FaultSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let text = spec.trim();
        let err = |reason: String| FaultSpecError {
            spec: text.to_owned(),
            reason,
        };
        let mut parts = text.split(':');
        let (Some(rpc), Some(action)) = (parts.next(), parts.next()) else {
            return Err(err("expected <RpcName>:<ACTION>[:<COUNT>]".to_owned()));
        };
        let count = parts.next();
        if parts.next().is_some() {
            return Err(err("too many ':' separated parts".to_owned()));
        }
        let rpc = match rpc {
            "*" => None,
            name => match Rpc::ALL.into_iter().find(|r| r.to_string() == name) {
                Some(rpc) => Some(rpc),
                None => {
                    return Err(err(format!(
                        "unknown RPC name {name:?} (a CSI method name such as NodeStageVolume, \
                         or *)"
                    )));
                }
            },
        };
        let action = match action {
            "hang" => FaultAction::Hang,
            "exit" => FaultAction::Exit,
            a if a.starts_with("delay=") => {
                let d = &a["delay=".len()..];
                FaultAction::Delay(
                    humantime::parse_duration(d)
                        .map_err(|e| err(format!("bad delay {d:?}: {e}")))?,
                )
            }
            a => match CODES.iter().find(|(name, _)| *name == a) {
                Some((_, code)) => FaultAction::Fail(*code),
                None => {
                    return Err(err(format!(
                        "unknown action {a:?} (a gRPC code such as UNAVAILABLE, delay=<duration>, \
                         hang or exit)"
                    )));
                }
            },
        };
        let count = match count {
            None => None,
            Some(c) => match c.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(err(format!("count {c:?} is not a positive integer"))),
            },
        };
        Ok(Self {
            rpc,
            action,
            count,
            text: text.to_owned(),
        })
    }
}

/// Parses the control file: one spec per line, blank lines and `#` comments ignored.
pub fn parse_control_file(text: &str) -> Result<Vec<FaultSpec>, FaultSpecError> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(FaultSpec::from_str)
        .collect()
}

/// The fault switch could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FaultsError {
    /// The control file does not parse.
    #[error("fault control file {}", path.display())]
    ControlFile {
        /// The control file.
        path: PathBuf,
        /// The bad spec.
        #[source]
        source: FaultSpecError,
    },
    /// The control file or the counters could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The counters file is not valid JSON.
    #[error("fault counters {} are corrupt", path.display())]
    Counters {
        /// The counters file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

/// Used counts, persisted so counted faults stay used up across restarts.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Counters {
    /// By "flag#<index> <spec>".
    flags: BTreeMap<String, u64>,
    /// The control file content the `file` counts belong to.
    file_text: String,
    /// By "line#<index> <spec>".
    file: BTreeMap<String, u64>,
}

#[derive(Debug)]
struct Inner {
    counters: Counters,
    file_specs: Vec<FaultSpec>,
}

/// What [`Faults::find`] found for a call.
#[derive(Debug)]
enum Found {
    /// No spec applies.
    Nothing,
    /// This uncounted spec applies.
    Spec(FaultSpec),
    /// A counted spec applies; counting it means persisting the count.
    Counted,
}

/// The live fault switch of a plugin instance.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    flags: Arc<Vec<FaultSpec>>,
    control_path: PathBuf,
    counters_path: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

impl Faults {
    /// Loads the counters and checks the control file; a malformed control file is an error.
    pub(crate) fn load(flags: Vec<FaultSpec>, statedir: &Path) -> Result<Self, FaultsError> {
        let control_path = statedir.join(CONTROL_FILE);
        let counters_path = statedir.join(COUNTERS_FILE);
        let counters = match std::fs::read(&counters_path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| FaultsError::Counters {
                    path: counters_path.clone(),
                    source,
                })?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Counters::default(),
            Err(source) => {
                return Err(FaultsError::Read {
                    path: counters_path,
                    source,
                });
            }
        };
        let faults = Self {
            flags: Arc::new(flags),
            control_path,
            counters_path,
            inner: Arc::new(Mutex::new(Inner {
                counters,
                file_specs: Vec::new(),
            })),
        };
        faults.take(None)?;
        Ok(faults)
    }

    /// Re-reads the control file, then finds the first spec that matches `rpc` and is not used
    /// up, and counts it as used (persisting the count before returning). `None` for `rpc`
    /// only refreshes.
    fn take(&self, rpc: Option<Rpc>) -> Result<Option<FaultSpec>, FaultsError> {
        match self.find(rpc, true)? {
            Found::Spec(spec) => Ok(Some(spec)),
            Found::Nothing | Found::Counted => Ok(None),
        }
    }

    /// [`take`](Self::take), except that without `persist` a counted spec is neither counted nor
    /// returned: the answer is [`Found::Counted`], for the caller to `take` off the async
    /// threads (persisting blocks on the disk).
    fn find(&self, rpc: Option<Rpc>, persist: bool) -> Result<Found, FaultsError> {
        let text = match std::fs::read_to_string(&self.control_path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(source) => {
                return Err(FaultsError::Read {
                    path: self.control_path.clone(),
                    source,
                });
            }
        };
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let specs = parse_control_file(&text).map_err(|source| FaultsError::ControlFile {
            path: self.control_path.clone(),
            source,
        })?;
        if inner.counters.file_text != text {
            inner.counters.file_text = text;
            inner.counters.file.clear();
        }
        inner.file_specs = specs;
        let Some(rpc) = rpc else {
            return Ok(Found::Nothing);
        };

        let flagged = self
            .flags
            .iter()
            .enumerate()
            .map(|(i, s)| (true, i, s.clone()));
        let filed = inner
            .file_specs
            .clone()
            .into_iter()
            .enumerate()
            .map(|(i, s)| (false, i, s));
        for (is_flag, i, spec) in flagged.chain(filed) {
            if !spec.matches(rpc) {
                continue;
            }
            let Some(limit) = spec.count else {
                return Ok(Found::Spec(spec));
            };
            let key = if is_flag {
                format!("flag#{i} {spec}")
            } else {
                format!("line#{i} {spec}")
            };
            let map = if is_flag {
                &mut inner.counters.flags
            } else {
                &mut inner.counters.file
            };
            let used = map.entry(key).or_insert(0);
            if *used >= limit {
                continue;
            }
            if !persist {
                return Ok(Found::Counted);
            }
            *used += 1;
            self.persist(&inner.counters);
            return Ok(Found::Spec(spec));
        }
        Ok(Found::Nothing)
    }

    fn persist(&self, counters: &Counters) {
        let result = serde_json::to_vec_pretty(counters)
            .map_err(io::Error::other)
            .and_then(|bytes| {
                berth_sys::write_atomic(&self.counters_path, &bytes).map_err(io::Error::other)
            });
        if let Err(e) = result {
            tracing::warn!(path = %self.counters_path.display(), error = %e,
                "could not persist fault counters");
        }
    }

    /// Applies the fault configured for a call of `rpc`, if any: `Err` for an injected failure,
    /// `Ok` once a delay has passed or when no fault applies. `hang` and `delay` end early with
    /// `UNAVAILABLE` when `shutdown` fires; `exit` never returns.
    ///
    /// The control file is read on the calling thread (a small read, or none when it is
    /// missing); only a counted fault, whose count is persisted, goes to the blocking pool.
    pub(crate) async fn apply(&self, rpc: Rpc, shutdown: &CancellationToken) -> Result<(), Status> {
        let taken = match self.find(Some(rpc), false) {
            Ok(Found::Nothing) => return Ok(()),
            Ok(Found::Spec(spec)) => Ok(Some(spec)),
            Ok(Found::Counted) => {
                let this = self.clone();
                tokio::task::spawn_blocking(move || this.take(Some(rpc)))
                    .await
                    .map_err(|e| Status::internal(format!("fault switch task failed: {e}")))?
            }
            Err(e) => Err(e),
        };
        let spec = match taken {
            Ok(Some(spec)) => spec,
            Ok(None) => return Ok(()),
            Err(e) => return Err(Status::internal(crate::error::chain(&e))),
        };
        let shutting_down = || Status::unavailable("the plugin is shutting down");
        match spec.action {
            FaultAction::Fail(code) => {
                tracing::info!(rpc = %rpc, fault = %spec, "injecting failure");
                Err(Status::new(
                    code,
                    format!("injected fault {spec} (test fault switch)"),
                ))
            }
            FaultAction::Delay(d) => {
                tracing::info!(rpc = %rpc, fault = %spec, "injecting delay");
                tokio::select! {
                    () = tokio::time::sleep(d) => Ok(()),
                    () = shutdown.cancelled() => Err(shutting_down()),
                }
            }
            FaultAction::Hang => {
                tracing::info!(rpc = %rpc, fault = %spec, "injecting hang");
                let _log_end = HangEnd(rpc);
                shutdown.cancelled().await;
                Err(shutting_down())
            }
            FaultAction::Exit => {
                tracing::warn!(rpc = %rpc, fault = %spec, code = EXIT_CODE, "injected exit");
                std::process::exit(EXIT_CODE)
            }
        }
    }
}

/// Logs the end of a hung call: dropped when its client goes away, or at shutdown.
struct HangEnd(Rpc);

impl Drop for HangEnd {
    fn drop(&mut self) {
        tracing::info!(rpc = %self.0, "hung call ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> FaultSpec {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn reason(s: &str) -> String {
        s.parse::<FaultSpec>().unwrap_err().reason
    }

    #[test]
    fn parses_every_action() {
        let s = spec("NodeUnpublishVolume:UNAVAILABLE:3");
        assert_eq!(s.rpc, Some(Rpc::NodeUnpublishVolume));
        assert_eq!(s.action, FaultAction::Fail(Code::Unavailable));
        assert_eq!(s.count, Some(3));

        assert_eq!(
            spec("Probe:INVALID_ARGUMENT").action,
            FaultAction::Fail(Code::InvalidArgument)
        );
        assert_eq!(spec("Probe:INVALID_ARGUMENT").count, None);
        assert_eq!(
            spec("*:delay=250ms").action,
            FaultAction::Delay(Duration::from_millis(250))
        );
        assert_eq!(
            spec("*:delay=2s:1").action,
            FaultAction::Delay(Duration::from_secs(2))
        );
        assert_eq!(spec("*:hang").rpc, None);
        assert_eq!(spec("NodeStageVolume:exit:1").action, FaultAction::Exit);
        assert_eq!(spec("  Probe:hang  ").as_str(), "Probe:hang");
    }

    #[test]
    fn every_rpc_name_parses() {
        for rpc in Rpc::ALL {
            assert_eq!(spec(&format!("{rpc}:hang")).rpc, Some(rpc));
        }
        assert!(reason("nodestagevolume:hang").contains("unknown RPC name"));
    }

    #[test]
    fn every_code_name_parses() {
        for (name, code) in CODES {
            assert_eq!(
                spec(&format!("Probe:{name}")).action,
                FaultAction::Fail(*code)
            );
        }
    }

    #[test]
    fn code_names_round_trip() {
        for (name, code) in CODES.iter().copied().chain([("OK", Code::Ok)]) {
            assert_eq!(code_name(code), name);
            assert_eq!(code_from_name(name), Some(code));
        }
        assert_eq!(code_from_name("unavailable"), None);
    }

    #[test]
    fn matches_by_name_or_star() {
        assert!(spec("Probe:hang").matches(Rpc::Probe));
        assert!(!spec("Probe:hang").matches(Rpc::NodeGetInfo));
        assert!(spec("*:hang").matches(Rpc::NodeGetInfo));
    }

    #[test]
    fn rejects_malformed_specs() {
        assert!(reason("Probe").contains("expected <RpcName>:<ACTION>"));
        assert!(reason("").contains("expected"));
        assert!(reason("Prob:UNAVAILABLE").contains("unknown RPC name \"Prob\""));
        assert!(reason("Probe:OK").contains("unknown action \"OK\""));
        assert!(reason("Probe:unavailable").contains("unknown action"));
        assert!(reason("Probe:delay=soon").contains("bad delay"));
        assert!(reason("Probe:hang:0").contains("not a positive integer"));
        assert!(reason("Probe:hang:-1").contains("not a positive integer"));
        assert!(reason("Probe:hang:1:2").contains("too many"));
        let e = "Probe:NOPE".parse::<FaultSpec>().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid fault spec \"Probe:NOPE\""),
            "{e}"
        );
    }

    #[test]
    fn control_file_skips_blanks_and_comments() {
        let specs =
            parse_control_file("# test\n\nProbe:UNAVAILABLE:1\n  *:delay=1ms \n").expect("parses");
        assert_eq!(specs.len(), 2);
        let e = parse_control_file("Probe:hang\nbad\n").unwrap_err();
        assert_eq!(e.spec, "bad");
    }

    #[test]
    fn counts_are_used_up_in_order_and_persisted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let flags = vec![spec("Probe:UNAVAILABLE:2"), spec("*:NOT_FOUND:1")];
        let f = Faults::load(flags.clone(), dir.path()).expect("load");
        let code = |f: &Faults, rpc| f.take(Some(rpc)).expect("take").map(|s| s.action);
        assert_eq!(
            code(&f, Rpc::Probe),
            Some(FaultAction::Fail(Code::Unavailable))
        );
        assert_eq!(
            code(&f, Rpc::Probe),
            Some(FaultAction::Fail(Code::Unavailable))
        );
        assert_eq!(
            code(&f, Rpc::Probe),
            Some(FaultAction::Fail(Code::NotFound))
        );
        assert_eq!(code(&f, Rpc::Probe), None);

        // A new instance with the same flags finds them used up.
        let f = Faults::load(flags, dir.path()).expect("reload");
        assert_eq!(code(&f, Rpc::Probe), None);
    }

    #[test]
    fn control_file_counts_restart_when_it_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Faults::load(Vec::new(), dir.path()).expect("load");
        let take = |f: &Faults| f.take(Some(Rpc::NodeGetInfo)).expect("take").is_some();
        assert!(!take(&f));
        let control = dir.path().join(CONTROL_FILE);
        std::fs::write(&control, "NodeGetInfo:ABORTED:1\n").expect("write");
        assert!(take(&f));
        assert!(!take(&f));
        std::fs::write(&control, "NodeGetInfo:ABORTED:1\n# again\n").expect("write");
        assert!(take(&f));
        assert!(!take(&f));

        std::fs::write(&control, "NodeGetInfo:SOMETIMES\n").expect("write");
        let err = f.take(Some(Rpc::NodeGetInfo)).unwrap_err();
        assert!(matches!(err, FaultsError::ControlFile { .. }), "{err:?}");
        assert!(Faults::load(Vec::new(), dir.path()).is_err());
    }
}
