//! Command line and environment of `berth-hostpath`.

use std::{io::IsTerminal as _, path::PathBuf};

use clap::{ArgAction, Parser, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::faults::FaultSpec;

/// Default `--drivername`.
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi.berth.dev";

/// Default `--statedir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/berth-hostpath";

/// The exit codes, shown by `-h` and `--help`.
macro_rules! exit_help {
    () => {
        "\
Exit codes:
  0   stopped by SIGTERM or SIGINT
  1   error (the message says what failed)
  2   invalid flags, --log-level or RUST_LOG
  73  another berth-hostpath holds --statedir (it is locked while a copy runs: flock on
      <statedir>/lock, which holds that copy's pid), or with --shared another copy runs with
      the same --nodeid (flock on <statedir>/lock.<nodeid>), or copies with and without
      --shared were mixed; nothing was touched
  75  an exit fault fired (tests only: --fault)"
    };
}

const EXIT_HELP: &str = exit_help!();

const LONG_HELP: &str = concat!(
    exit_help!(),
    "

Modes (MODE, default all):
  all         serve the Identity, Controller and Node services
  node        serve Identity and Node only: Controller RPCs answer UNIMPLEMENTED and
              GetPluginCapabilities does not list CONTROLLER_SERVICE (a CO's node plugin)
  controller  serve Identity and Controller only: Node RPCs answer UNIMPLEMENTED (a CO's
              controller plugin)
  The mode comes first or anywhere among the flags, as in `node --endpoint=…`.

Strict mode (--strict):
  Refuse, instead of covering for it, a request where the CO skipped a duty the CSI spec puts
  on it: INVALID_ARGUMENT when a field holds what the spec rules out, FAILED_PRECONDITION when
  a step the CO owes is missing. Without --strict the plugin is forgiving (it creates missing
  staging directories and target parents, and removes them again).
    NodeStageVolume       staging_target_path is an existing directory (the CO creates it; the
                          plugin never creates or removes it); one staging path per volume
    NodeUnstageVolume     every target published from that staging path is unpublished
    NodePublishVolume     the parent of target_path exists; target_path itself does not,
                          unless this plugin made it; no second publication with another
                          volume_capability
    NodeStageVolume, NodePublishVolume
                          publish_context is what ControllerPublishVolume returned (empty
                          without attach); volume_context is the volume's (empty)
    NodeGetVolumeStats, NodeExpandVolume
                          staging_target_path is set exactly when staging is on, and the
                          volume is staged there
    ControllerPublishVolume
                          readonly is false (no PUBLISH_READONLY); volume_context is empty
    ControllerUnpublishVolume
                          nothing of the volume is mounted on this node any more
    ValidateVolumeCapabilities
                          volume_context is empty

Shared mode (--shared):
  Several copies, one per node, each with its own --nodeid (required), share one --statedir as
  nodes share a network storage backend: a volume created through any copy can be staged and
  published through every copy. Each copy holds <statedir>/lock.<nodeid> (exit code 73 while
  another copy has that node id) and a shared lock on <statedir>/lock, so copies with and
  without --shared never use one state directory at once. Every read and change of state.json
  reads the file again under <statedir>/state.lock, so each copy decides on what the others
  wrote. Each copy records its node id in the state when it starts; then:
    ControllerPublishVolume
                          accepts every recorded node id (NOT_FOUND for any other)
    ControllerUnpublishVolume
                          from a node the volume is not published to (recorded or not) is
                          done at once
    CreateVolume, ControllerGetVolume, ListVolumes
                          volumes are accessible from every recorded node
                          (accessible_topology lists them all)
    DeleteVolume, ControllerUnpublishVolume in strict mode
                          see the mounts of their own node only
  Volumes are directories (--backing=image is refused: two nodes mounting one ext4 image
  would corrupt it). The fault control file and its used counts, and the node's staging and
  publication records, are per node: <statedir>/nodes/<nodeid>/faults,
  <statedir>/nodes/<nodeid>/faults.state.json and <statedir>/nodes/<nodeid>/node.journal.

Fault injection (for tests only):
  --fault SPEC, BERTH_HOSTPATH_FAULTS=SPEC,SPEC…, or <statedir>/faults (one SPEC per line, read
  again on every RPC so a test can change faults in a running plugin; blank lines and # comments
  are ignored).

  SPEC = <RpcName>:<ACTION>[:<COUNT>]
    RpcName  a CSI method name (Probe, NodeStageVolume, …) or * for every method
    ACTION   a gRPC code in SCREAMING_SNAKE (UNAVAILABLE, NOT_FOUND, …): fail with it, saying the
             failure is injected
             delay=<duration> (250ms, 2s…): wait, then answer normally
             hang: never answer (ends when the client goes away)
             exit: exit at once with code 75, without answering
    COUNT    only the first COUNT matching calls (default: every call)

  The first spec that matches a call and is not used up applies (flags first, then the file).
  Used counts are kept in <statedir>/faults.state.json, so NodeStageVolume:exit:1 exits once,
  not again after a restart; changing the control file starts its counts afresh.

Call log (for tests only):
  --call-log FILE or BERTH_HOSTPATH_CALL_LOG=FILE: after every RPC, before answering, append one
  line `<RpcName> <volume_id or -> <CODE>` to FILE (CODE is OK or a gRPC code as above; a call
  whose caller went away shows as CANCELLED). Only the volume id is written from the request."
);

/// What volumes are made of (`--backing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backing {
    /// A directory `<statedir>/volumes/<id>`, staged and published by bind mounts.
    Dir,
    /// A sparse file `<statedir>/volumes/<id>.img` holding an ext4 filesystem of the volume's
    /// capacity, mounted onto the staging path through a loop device.
    Image,
}

/// Which CSI services are served (the positional `MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Identity, Controller and Node.
    #[default]
    All,
    /// Identity and Node only.
    Node,
    /// Identity and Controller only.
    Controller,
}

impl Mode {
    /// Whether the Controller service is served (and advertised).
    pub fn serves_controller(self) -> bool {
        matches!(self, Self::All | Self::Controller)
    }

    /// Whether the Node service is served.
    pub fn serves_node(self) -> bool {
        matches!(self, Self::All | Self::Node)
    }
}

/// `--logtostderr` was given something other than `true`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogToStderrError {
    /// `false`: there is nowhere else to log.
    #[error(
        "berth-hostpath always logs to stderr and has nowhere else to log; only true is accepted"
    )]
    False,
    /// Not a boolean.
    #[error("{0:?} is not a boolean (true or false)")]
    NotBool(String),
}

/// How log lines are written (to stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per event.
    Json,
}

/// Configuration of a plugin instance; parsed from flags and environment by the binary, or
/// built directly to run the plugin in-process.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "berth-hostpath",
    version,
    about = "A single-node CSI plugin (Identity, Controller and Node services) that serves \
             directories (bind-mounted) or ext4 image files (mounted through loop devices) under \
             its state directory as volumes.",
    after_help = EXIT_HELP,
    after_long_help = LONG_HELP
)]
pub struct Config {
    /// Which services to serve: all, node (Identity and Node) or controller (Identity and
    /// Controller); see the section below.
    #[arg(value_enum, value_name = "MODE", default_value_t = Mode::All)]
    pub mode: Mode,

    /// CSI endpoint: unix:///absolute/path.sock, unix:/absolute/path.sock, or an absolute socket
    /// path (at most 107 bytes).
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,

    /// Node id reported by NodeGetInfo and accepted by ControllerPublishVolume [default: the
    /// host name; required with --shared].
    #[arg(long)]
    pub nodeid: Option<String>,

    /// Directory for state.json, node.journal, volumes/ and snapshots/; one running copy per
    /// directory, or one per node id with --shared (see exit code 73).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub statedir: PathBuf,

    /// Plugin name reported by GetPluginInfo.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub drivername: String,

    /// Total capacity in bytes that volumes may take (suffixes K, M, G, T, Ki, Mi, Gi, Ti)
    /// [default: unlimited; GetCapacity reports the free space of the state directory].
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,

    /// Largest volume CreateVolume and ControllerExpandVolume accept, in bytes.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub max_volume_size: Option<u64>,

    /// Volumes that may be controller-published to this node at once (0 = no limit).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_volumes_per_node: u32,

    /// Advertise and implement NodeStageVolume / NodeUnstageVolume.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub enable_stage: bool,

    /// Advertise and implement ControllerPublishVolume / ControllerUnpublishVolume.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub enable_attach: bool,

    /// What a volume is: `dir`, a directory bind-mounted onto the staging and target paths; or
    /// `image`, a sparse ext4 image file of the volume's capacity, mounted onto the staging path
    /// through a loop device (as block drivers do) and bind-mounted from there. `image` needs
    /// --enable-stage, e2fsprogs (mkfs.ext4, dumpe2fs, e2fsck, resize2fs) and util-linux
    /// (mount, losetup). NodeExpandVolume grows a staged filesystem only with CAP_SYS_RESOURCE;
    /// without it the filesystem grows when the volume is next staged.
    #[arg(long, value_enum, default_value_t = Backing::Dir)]
    pub backing: Backing,

    /// Refuse requests where the CO skipped a duty the CSI spec puts on it (see the section
    /// below).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub strict: bool,

    /// Share --statedir with other copies, one per node, each with its own --nodeid (required)
    /// (see the section below).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true", requires_if("true", "nodeid"))]
    pub shared: bool,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,

    /// Log level or tracing filter directives [default: RUST_LOG if set, else from --v, else
    /// info].
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// klog verbosity, accepted for the flags Kubernetes CSI images take: 0-3 logs at info,
    /// 4-5 at debug, 6 and up at trace; used only without --log-level and RUST_LOG.
    #[arg(long = "v", value_name = "N")]
    pub verbosity: Option<u8>,

    /// klog's flag, accepted for the flags Kubernetes CSI images take: berth-hostpath always
    /// logs to stderr, so false is refused.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true", value_parser = parse_logtostderr)]
    pub logtostderr: bool,

    /// Inject a fault (test only; repeatable); see the section below.
    #[arg(
        long = "fault",
        value_name = "SPEC",
        env = "BERTH_HOSTPATH_FAULTS",
        value_delimiter = ','
    )]
    pub faults: Vec<FaultSpec>,

    /// Append one line `<RpcName> <volume_id or -> <CODE>` per RPC to FILE (test only); see the
    /// section below.
    #[arg(long, value_name = "FILE", env = "BERTH_HOSTPATH_CALL_LOG")]
    pub call_log: Option<PathBuf>,
}

impl Config {
    /// A configuration with every default, serving on `endpoint` with state in `statedir`.
    pub fn new(endpoint: impl Into<String>, statedir: impl Into<PathBuf>) -> Self {
        Self {
            mode: Mode::All,
            endpoint: endpoint.into(),
            nodeid: None,
            statedir: statedir.into(),
            drivername: DEFAULT_DRIVER_NAME.to_owned(),
            capacity: None,
            max_volume_size: None,
            max_volumes_per_node: 0,
            enable_stage: true,
            enable_attach: true,
            backing: Backing::Dir,
            strict: false,
            shared: false,
            log_format: LogFormat::Human,
            log_level: None,
            verbosity: None,
            logtostderr: true,
            faults: Vec::new(),
            call_log: None,
        }
    }

    /// The log filter: `--log-level`, else `RUST_LOG`, else the level `--v` maps to, else
    /// `info`. A bare level keeps the gRPC and HTTP/2 libraries at `info` so that `debug` shows
    /// the plugin's RPCs, not frames.
    pub fn log_filter(&self) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
        EnvFilter::try_new(self.filter_directives(std::env::var("RUST_LOG").ok()))
    }

    /// The directives of [`Self::log_filter`], given the value of `RUST_LOG`.
    fn filter_directives(&self, rust_log: Option<String>) -> String {
        let directives = match (&self.log_level, rust_log) {
            (Some(level), _) => level.clone(),
            (None, Some(env)) if !env.is_empty() => return env,
            (None, _) => self.verbosity.map_or("info", klog_level).to_owned(),
        };
        let bare_level = !directives.contains(['=', ',']);
        if bare_level {
            format!("{directives},h2=info,hyper=info,hyper_util=info,tower=info,tonic=info")
        } else {
            directives
        }
    }

    /// Installs the global `tracing` subscriber for this configuration (stderr).
    pub fn init_tracing(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(self.log_filter()?)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        match self.log_format {
            LogFormat::Human => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        }
    }
}

/// The log level for klog verbosity `v` (`--v`).
fn klog_level(v: u8) -> &'static str {
    match v {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    }
}

/// Parses `--logtostderr`'s value: only `true` is accepted.
fn parse_logtostderr(text: &str) -> Result<bool, LogToStderrError> {
    match text {
        "true" => Ok(true),
        "false" => Err(LogToStderrError::False),
        _ => Err(LogToStderrError::NotBool(text.to_owned())),
    }
}

/// Parses a byte count: digits with an optional suffix K, M, G, T (powers of 1000) or
/// Ki, Mi, Gi, Ti (powers of 1024).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (e.g. 1048576, 512Mi, 10G)"))?;
    let unit: u64 = match suffix {
        "" => 1,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown suffix {suffix:?} (K, M, G, T, Ki, Mi, Gi, Ti)"
            ));
        }
    };
    n.checked_mul(unit)
        .filter(|&b| i64::try_from(b).is_ok())
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("berth-hostpath").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let c = parse(&["--endpoint", "unix:///run/x.sock"]).expect("parses");
        assert_eq!(c.statedir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(c.drivername, DEFAULT_DRIVER_NAME);
        assert!(c.enable_stage && c.enable_attach);
        assert!(!c.strict);
        assert!(!c.shared);
        assert_eq!(c.backing, Backing::Dir);
        assert_eq!(c.capacity, None);
        assert!(c.faults.is_empty());
        assert_eq!(c.call_log, None);
        assert_eq!(c.mode, Mode::All);
        assert_eq!(c.verbosity, None);
        assert!(c.logtostderr);
    }

    #[test]
    fn backing_flag() {
        let c = parse(&["--endpoint=/x.sock", "--backing=image"]).expect("parses");
        assert_eq!(c.backing, Backing::Image);
        assert!(parse(&["--endpoint=/x.sock", "--backing=lvm"]).is_err());
    }

    #[test]
    fn call_log_flag() {
        let c = parse(&["--endpoint=/x.sock", "--call-log", "/tmp/calls"]).expect("parses");
        assert_eq!(c.call_log, Some(PathBuf::from("/tmp/calls")));
    }

    #[test]
    fn booleans_take_values() {
        let c = parse(&[
            "--endpoint=/x.sock",
            "--enable-stage=false",
            "--enable-attach",
            "false",
        ])
        .expect("parses");
        assert!(!c.enable_stage && !c.enable_attach);
        let c = parse(&["--endpoint=/x.sock", "--enable-stage"]).expect("parses");
        assert!(c.enable_stage);
        assert!(parse(&["--endpoint=/x.sock", "--enable-stage=maybe"]).is_err());
        assert!(
            parse(&["--endpoint=/x.sock", "--strict"])
                .expect("parses")
                .strict
        );
        assert!(
            !parse(&["--endpoint=/x.sock", "--strict=false"])
                .expect("parses")
                .strict
        );
    }

    #[test]
    fn shared_needs_a_node_id() {
        assert!(!parse(&["--endpoint=/x.sock"]).expect("parses").shared);
        let c = parse(&["--endpoint=/x.sock", "--shared", "--nodeid=n1"]).expect("parses");
        assert!(c.shared);
        let c = parse(&["--endpoint=/x.sock", "--nodeid", "n1", "--shared=true"]).expect("parses");
        assert!(c.shared);
        assert!(
            !parse(&["--endpoint=/x.sock", "--shared=false"])
                .expect("no node id needed when off")
                .shared
        );
        for args in [
            &["--endpoint=/x.sock", "--shared"][..],
            &["--endpoint=/x.sock", "--shared=true"],
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
            assert!(err.to_string().contains("--nodeid"), "{err}");
        }
    }

    #[test]
    fn faults_are_validated_by_the_parser() {
        let c = parse(&[
            "--endpoint=/x.sock",
            "--fault",
            "Probe:UNAVAILABLE:2",
            "--fault=*:hang",
        ])
        .expect("parses");
        assert_eq!(c.faults.len(), 2);
        let err = parse(&["--endpoint=/x.sock", "--fault", "Probe:SOMETIMES"]).unwrap_err();
        assert!(err.to_string().contains("Probe:SOMETIMES"), "{err}");
    }

    #[test]
    fn kubernetes_csi_hostpath_arguments() {
        let c = parse(&[
            "--drivername=csi-hostpath",
            "--v=5",
            "--endpoint=unix:///csi/csi.sock",
            "--nodeid=node-0",
        ])
        .expect("parses");
        assert_eq!(c.mode, Mode::All);
        assert_eq!(c.drivername, "csi-hostpath");
        assert_eq!(c.verbosity, Some(5));
        assert_eq!(c.endpoint, "unix:///csi/csi.sock");
        assert_eq!(c.nodeid.as_deref(), Some("node-0"));
        assert!(c.logtostderr);
    }

    #[test]
    fn aws_ebs_csi_driver_arguments() {
        let c = parse(&[
            "node",
            "--endpoint=unix:///csi/csi.sock",
            "--logtostderr",
            "--v=5",
        ])
        .expect("parses");
        assert_eq!(c.mode, Mode::Node);
        assert_eq!(c.endpoint, "unix:///csi/csi.sock");
        assert!(c.logtostderr);
        assert_eq!(c.verbosity, Some(5));
    }

    #[test]
    fn modes() {
        let mode = |args: &[&str]| parse(args).map(|c| c.mode);
        assert_eq!(mode(&["--endpoint=/x.sock"]).expect("parses"), Mode::All);
        assert_eq!(
            mode(&["controller", "--endpoint=/x.sock"]).expect("parses"),
            Mode::Controller
        );
        assert_eq!(
            mode(&["--endpoint", "/x.sock", "node"]).expect("parses"),
            Mode::Node
        );
        assert_eq!(
            mode(&["all", "--endpoint=/x.sock"]).expect("parses"),
            Mode::All
        );
        assert!(mode(&["monolith", "--endpoint=/x.sock"]).is_err());
        assert_eq!(Config::new("/x.sock", "/s").mode, Mode::All);
        assert!(Mode::All.serves_controller() && Mode::All.serves_node());
        assert!(!Mode::Node.serves_controller() && Mode::Node.serves_node());
        assert!(Mode::Controller.serves_controller() && !Mode::Controller.serves_node());
    }

    #[test]
    fn logtostderr_accepts_only_true() {
        for args in [
            &["--endpoint=/x.sock"][..],
            &["--endpoint=/x.sock", "--logtostderr"],
            &["--endpoint=/x.sock", "--logtostderr=true"],
        ] {
            assert!(parse(args).expect("parses").logtostderr, "{args:?}");
        }
        let err = parse(&["--endpoint=/x.sock", "--logtostderr=false"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(err.to_string().contains("always logs to stderr"), "{err}");
        let err = parse(&["--endpoint=/x.sock", "--logtostderr=yes"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn verbosity_flag() {
        let v = |args: &[&str]| parse(args).map(|c| c.verbosity);
        assert_eq!(v(&["--endpoint=/x.sock"]).expect("parses"), None);
        assert_eq!(
            v(&["--endpoint=/x.sock", "--v", "2"]).expect("parses"),
            Some(2)
        );
        assert!(v(&["--endpoint=/x.sock", "--v=-1"]).is_err());
        assert!(v(&["--endpoint=/x.sock", "--v=256"]).is_err());
    }

    #[test]
    fn verbosity_maps_to_a_level() {
        for (v, level) in [
            (0, "info"),
            (3, "info"),
            (4, "debug"),
            (5, "debug"),
            (6, "trace"),
            (255, "trace"),
        ] {
            assert_eq!(klog_level(v), level, "--v={v}");
        }
    }

    #[test]
    fn log_filter_directives() {
        let libs = "h2=info,hyper=info,hyper_util=info,tower=info,tonic=info";
        let config = |level: Option<&str>, v: Option<u8>| Config {
            log_level: level.map(str::to_owned),
            verbosity: v,
            ..Config::new("/x.sock", "/s")
        };
        let env = |s: &str| Some(s.to_owned());
        assert_eq!(
            config(None, None).filter_directives(None),
            format!("info,{libs}")
        );
        assert_eq!(
            config(None, Some(5)).filter_directives(None),
            format!("debug,{libs}")
        );
        assert_eq!(
            config(None, Some(6)).filter_directives(env("")),
            format!("trace,{libs}"),
            "an empty RUST_LOG is not set"
        );
        assert_eq!(
            config(None, Some(1)).filter_directives(None),
            format!("info,{libs}")
        );
        // --log-level and RUST_LOG win over --v.
        assert_eq!(
            config(Some("warn"), Some(6)).filter_directives(env("trace")),
            format!("warn,{libs}")
        );
        assert_eq!(
            config(None, Some(6)).filter_directives(env("berth_hostpath=warn")),
            "berth_hostpath=warn"
        );
        assert_eq!(
            config(Some("info,tonic=debug"), Some(0)).filter_directives(None),
            "info,tonic=debug"
        );
        for v in [0, 4, 6] {
            EnvFilter::try_new(config(None, Some(v)).filter_directives(None))
                .expect("a valid filter");
        }
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("2Ki"), Ok(2048));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("3Gi"), Ok(3 << 30));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("1.5G").is_err());
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("99999999Ti").is_err());
    }
}
