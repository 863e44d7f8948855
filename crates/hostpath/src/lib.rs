//! `berth-hostpath`: a single-node CSI plugin (Identity, Controller and Node services in one
//! process) that berth ships for single-node use and for tests.
//!
//! A volume is a directory `<statedir>/volumes/<id>`; a snapshot is a copy of one in
//! `<statedir>/snapshots/<id>`. NodeStageVolume bind-mounts the volume directory onto the staging
//! path, NodePublishVolume bind-mounts the staged path (or the volume directory when staging is
//! disabled) onto the target path, read-only when asked. Whether something is mounted is always
//! asked of the kernel: a `statx` of the path (is it a mount root, and is the volume's directory
//! its root), and the real mount table when that cannot tell. What the plugin knows of its volumes
//! and snapshots is in `<statedir>/state.json`, rewritten atomically (and synced) on every change,
//! so it survives restarts and crashes of the machine. What the node knows of its stagings and
//! publications (their capabilities, and which directories the plugin made) is appended, one line
//! per change, to `node.journal` in the node's directory before the RPC is answered: it survives a
//! kill of the plugin at any point, and needs no sync, as the machine's crash takes every mount
//! with it (with `--strict`, the record that the plugin made a target directory is synced). A
//! damaged line of it refuses the start, naming the line, unless the machine restarted since it was
//! written. Operations on one volume or snapshot are serialized; different ones run in parallel.
//! One copy of the plugin runs per state directory: it holds an exclusive `flock` on
//! `<statedir>/lock` (see [`statelock`]), unless every copy has `--shared` (below).
//!
//! With `--backing=image` a volume is instead a sparse file `<statedir>/volumes/<id>.img` of
//! the volume's capacity holding an ext4 filesystem (made by `mkfs.ext4` at CreateVolume; a
//! snapshot or clone is a sparse copy). NodeStageVolume mounts it straight onto the staging path
//! (which it never creates) through an autoclear loop device, with the capability's mount flags,
//! growing the filesystem first if it is smaller than its image; NodePublishVolume bind-mounts
//! the staging path onto the target path; NodeUnstageVolume's unmount frees the loop device.
//! ControllerExpandVolume grows the image, NodeExpandVolume the mounted filesystem
//! (`resize2fs`, which needs CAP_SYS_RESOURCE); NodeGetVolumeStats reports the filesystem's
//! own figures. Image backing needs staging, e2fsprogs and util-linux.
//!
//! Topology: one segment, `topology.hostpath.csi.berth.dev/node` = the node id.
//!
//! The positional mode ([`Mode`]) picks the services served: `all` (the default), `node`
//! (Identity and Node; CONTROLLER_SERVICE is not advertised) or `controller` (Identity and
//! Controller). RPCs of a service left out answer `UNIMPLEMENTED`. `--v` and `--logtostderr`
//! are accepted so that the argument lists of Kubernetes CSI images run unchanged.
//!
//! # Strict mode
//!
//! With `--strict` the plugin refuses (`INVALID_ARGUMENT` or `FAILED_PRECONDITION`) every
//! request in which the CO skipped a duty the CSI spec puts on it and the plugin can see it
//! (the staging directory and the target's parent exist, ordering, contexts…; the list is in
//! `--help`). Without it the plugin covers for such a CO: it creates a missing staging directory
//! or target parent itself and removes it again.
//!
//! # Shared mode
//!
//! With `--shared`, several copies, one per node, each with its own `--nodeid` (required; it
//! names files, so it holds no `/` or NUL and is not `.` or `..`), share one state directory as
//! the nodes of a cluster share a network storage backend: a volume created through any copy
//! can be staged and published through every copy, each in its own mount namespace.
//! - Each copy holds an exclusive `flock` on `<statedir>/lock.<nodeid>` (a second copy with
//!   that node id exits with code 73) and a shared one on `<statedir>/lock`, so copies with and
//!   without `--shared` never run on one state directory at once (exit code 73 too). Leftovers
//!   of interrupted operations are removed only by a copy that starts alone.
//! - Every read and every change of `state.json` reads the file again under an `flock` on
//!   `<statedir>/state.lock` (shared to read, exclusive from the read to the rename of the new
//!   file), so every copy decides on what the others wrote.
//! - Each copy records its node id in the state when it starts. ControllerPublishVolume
//!   accepts any recorded node id (`NOT_FOUND` for others); ControllerUnpublishVolume of a
//!   node the volume is not published to is done (`OK`), as the spec allows. Volumes are
//!   accessible from every recorded node (`accessible_topology` lists them all). DeleteVolume
//!   refuses a volume published to any node, but sees the mounts of its own node only, as does
//!   the strict check of ControllerUnpublishVolume.
//! - The fault switch's control file and used counts, and the staging and publication records,
//!   are the node's own: `<statedir>/nodes/<nodeid>/faults`,
//!   `<statedir>/nodes/<nodeid>/faults.state.json` and `<statedir>/nodes/<nodeid>/node.journal`.
//! - Volumes are directories: `--backing=image` is refused, as two nodes mounting one ext4
//!   image would corrupt it.
//!
//! # Fault switch (tests only)
//!
//! Faults are given with `--fault SPEC` (repeatable), `BERTH_HOSTPATH_FAULTS=SPEC,SPEC…`, or the
//! control file `<statedir>/faults` (one spec per line, blank lines and `#` comments ignored),
//! which is read again on every RPC so a test can change faults in a running plugin.
//!
//! `SPEC = <RpcName>:<ACTION>[:<COUNT>]`:
//! - `RpcName`: a CSI method name (`Probe`, `NodeUnpublishVolume`, …) or `*` for every method;
//! - `ACTION`: a gRPC code name in SCREAMING_SNAKE (`UNAVAILABLE`, `NOT_FOUND`, …) to fail with
//!   (the message says the failure is injected); `delay=<duration>` (`250ms`, `2s`) to wait and
//!   then answer normally; `hang` to never answer (the call ends when the client goes away);
//!   `exit` to exit the process at once with code [`faults::EXIT_CODE`] (75), without answering;
//! - `COUNT`: apply to the first COUNT matching calls only (default: every call).
//!
//! For each call the first spec that matches and is not used up applies, flags before the file.
//! Used counts are persisted in `<statedir>/faults.state.json` before the fault acts, so
//! `NodeStageVolume:exit:1` exits once, not again after a restart. When the control file's
//! content changes, its counts start afresh. A malformed spec on the command line or in the
//! environment stops the plugin from starting (the error names the spec); a malformed control
//! file stops it from starting, and while it runs makes every RPC fail with `INTERNAL`.
//!
//! # Call log (tests only)
//!
//! With `--call-log FILE` or `BERTH_HOSTPATH_CALL_LOG=FILE`, every RPC appends one line
//! `<RpcName> <volume_id or -> <CODE>` to `FILE` before it is answered; [`calllog::read`] parses
//! it (see [`calllog`]).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Implements a generated CSI service trait by routing every method through
/// [`plugin::Plugin::rpc`] (span, logging, fault switch, deadline, tracked task). Each line:
/// `method(Request) -> Response = Rpc [field naming the volume, if any] |plugin, request| body;`
macro_rules! csi_service {
    (@id $request:ident) => { String::new() };
    (@id $request:ident $field:ident) => { $request.get_ref().$field.clone() };
    ($service:ty: $trait:path {
        $( $method:ident($req:ty) -> $resp:ty = $rpc:ident $([$field:ident])?
            |$p:pat_param, $r:pat_param| $body:expr; )*
    }) => {
        #[tonic::async_trait]
        impl $trait for $service {
            $(
                async fn $method(
                    &self,
                    request: tonic::Request<$req>,
                ) -> Result<tonic::Response<$resp>, tonic::Status> {
                    let span_id = csi_service!(@id request $($field)?);
                    self.0
                        .rpc(berth_csi::Rpc::$rpc, &span_id, request, |$p, $r| async move { $body })
                        .await
                }
            )*
        }
    };
}

pub mod calllog;
mod caps;
pub mod config;
mod controller;
pub mod endpoint;
mod error;
pub mod faults;
mod files;
mod identity;
mod image;
mod locks;
mod node;
mod nodestate;
mod plugin;
mod shared;
mod state;
pub mod statelock;
mod strict;

use std::{fs, os::unix::fs::DirBuilderExt as _, path::Path, sync::Arc, time::Duration};

use berth_csi::pb::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use berth_sys::{LinuxMounter, Mounter};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::{
    calllog::CallLog,
    controller::ControllerService,
    faults::Faults,
    identity::IdentityService,
    node::NodeService,
    nodestate::NodeState,
    plugin::{Plugin, Settings},
    state::Store,
};
pub use crate::{
    config::{Backing, Config, LogFormat, Mode},
    error::RunError,
    nodestate::NodeStateError,
    plugin::{PUBLISH_CONTEXT_NODE_KEY, TOPOLOGY_KEY},
    state::StateError,
};

/// How long in-flight RPCs may run after shutdown is requested.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Runs the plugin with real mounts until `shutdown` is cancelled, then drains in-flight RPCs
/// (for at most [`SHUTDOWN_GRACE`]) and removes the socket. Fails before serving if the
/// configuration, the state directory or the socket cannot be used, and at once, before it
/// touches either, if another process holds the state directory's lock
/// ([`statelock`]; the binary then exits with [`statelock::EXIT_STATEDIR_IN_USE`]). The lock is
/// held until this returns.
///
/// Running in-process is possible, but an `exit` fault exits the whole process.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RunError> {
    run_with_mounter(config, shutdown, Arc::new(LinuxMounter)).await
}

/// [`run`] with another [`Mounter`] (e.g. a recording fake).
pub async fn run_with_mounter(
    config: Config,
    shutdown: CancellationToken,
    mounter: Arc<dyn Mounter>,
) -> Result<(), RunError> {
    let endpoint = endpoint::parse(&config.endpoint)?;
    validate_driver_name(&config.drivername)?;
    let node_id = match config.nodeid.clone() {
        Some(id) => id,
        None if config.shared => {
            return Err(RunError::InvalidFlag {
                flag: "nodeid",
                reason: "it is required with --shared: every copy sharing a state directory \
                         serves a node of its own"
                    .to_owned(),
            });
        }
        None => berth_sys::hostname().map_err(RunError::Hostname)?,
    };
    if node_id.is_empty() || node_id.len() > 128 {
        return Err(RunError::InvalidFlag {
            flag: "nodeid",
            reason: format!("{node_id:?} must be 1 to 128 bytes long"),
        });
    }
    if config.shared {
        shared::check_node_id(&node_id)?;
    }
    if config.backing == Backing::Image && !config.enable_stage {
        return Err(RunError::InvalidFlag {
            flag: "backing",
            reason: "image needs --enable-stage: the image's filesystem is mounted onto the \
                     staging path"
                .to_owned(),
        });
    }
    if config.backing == Backing::Image && config.shared {
        return Err(RunError::InvalidFlag {
            flag: "backing",
            reason: "image cannot be shared (--shared): each node would mount the same ext4 \
                     image through a loop device of its own, and corrupt it"
                .to_owned(),
        });
    }
    let statedir = create_statedir(&config.statedir)?;
    // Before anything else in the state directory or the socket is touched.
    let mut lock = if config.shared {
        statelock::acquire_shared(&statedir, &node_id)?
    } else {
        statelock::acquire(&statedir)?
    };
    prepare_statedir(&statedir, lock.is_exclusive())?;
    let state_file = statedir.join("state.json");
    let (store, node_dir) = if config.shared {
        let node_dir = shared::create_node_dir(&statedir, &node_id)?;
        lock.share()?;
        let store = Store::load_shared(&state_file, &statedir.join(state::STATE_LOCK_FILE))?;
        shared::register_node(&store, &node_id).await?;
        (store, node_dir)
    } else {
        (Store::load(&state_file)?, statedir.clone())
    };
    let (seed, volumes) = store.read(nodestate::seed_and_volumes).await?;
    let node = NodeState::load(&node_dir.join(nodestate::NODE_FILE), seed, |id| {
        volumes.contains(id)
    })?;
    let faults = Faults::load(config.faults.clone(), &node_dir)?;
    let call_log = match &config.call_log {
        None => None,
        Some(path) => Some(CallLog::open(path).map_err(|source| RunError::CallLog {
            path: path.clone(),
            source,
        })?),
    };
    let settings = Settings {
        driver_name: config.drivername.clone(),
        node_id,
        statedir,
        capacity: config.capacity,
        max_volume_size: config.max_volume_size,
        max_volumes_per_node: config.max_volumes_per_node,
        stage: config.enable_stage,
        attach: config.enable_attach,
        backing: config.backing,
        strict: config.strict,
        shared: config.shared,
        mode: config.mode,
    };
    let plugin = Arc::new(
        Plugin::new(settings, store, node, mounter, faults, shutdown.clone())
            .map_err(RunError::Mounts)?
            .with_call_log(call_log),
    );

    let listener = endpoint::listen(&endpoint)?;
    tracing::info!(
        socket = %endpoint.path().display(),
        driver = %plugin.settings.driver_name,
        node_id = %plugin.settings.node_id,
        statedir = %plugin.settings.statedir.display(),
        stage = plugin.settings.stage,
        attach = plugin.settings.attach,
        strict = plugin.settings.strict,
        shared = plugin.settings.shared,
        mode = ?plugin.settings.mode,
        backing = ?plugin.settings.backing,
        "serving CSI"
    );
    let server = tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(
            plugin::stamp_arrival as fn(_) -> _,
        ))
        .add_service(IdentityServer::new(IdentityService(Arc::clone(&plugin))))
        // A service left out answers every RPC of its own with UNIMPLEMENTED.
        .add_optional_service(
            config
                .mode
                .serves_controller()
                .then(|| ControllerServer::new(ControllerService(Arc::clone(&plugin)))),
        )
        .add_optional_service(
            config
                .mode
                .serves_node()
                .then(|| NodeServer::new(NodeService(Arc::clone(&plugin)))),
        )
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener),
            shutdown.clone().cancelled_owned(),
        );
    let result = tokio::select! {
        result = server => result.map_err(RunError::Serve),
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "in-flight RPCs did not finish; stopping");
            Ok(())
        }
    };
    endpoint::remove_socket(endpoint.path());
    // Operations whose callers are gone still finish (bounded by the grace period).
    plugin.tasks.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, plugin.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "operations still running; stopping anyway");
    }
    tracing::info!("stopped");
    result
}

/// Creates the state directory (0700) if it is missing and returns its absolute path.
fn create_statedir(dir: &Path) -> Result<std::path::PathBuf, RunError> {
    let err = |source| RunError::StateDir {
        path: dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    dir.canonicalize().map_err(err)
}

/// Creates `volumes/` and `snapshots/` in the (locked) state directory and, if this copy holds
/// it `alone` (always without `--shared`), removes leftovers of interrupted operations.
fn prepare_statedir(dir: &Path, alone: bool) -> Result<(), RunError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    for sub in ["volumes", "snapshots"] {
        let path = dir.join(sub);
        builder.create(&path).map_err(|source| RunError::StateDir {
            path: path.clone(),
            source,
        })?;
        if !alone {
            continue;
        }
        files::remove_leftovers(&path).map_err(|e| RunError::StateDir {
            path: e.path.clone(),
            source: e.source,
        })?;
    }
    Ok(())
}

/// The CSI rules for a plugin name: at most 63 characters, alphanumerics, `-` and `.`, starting
/// and ending with an alphanumeric.
fn validate_driver_name(name: &str) -> Result<(), RunError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(RunError::InvalidFlag {
            flag: "drivername",
            reason: format!(
                "{name:?} must be 1 to 63 characters: letters, digits, '-' and '.', starting and \
                 ending with a letter or digit"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        assert!(validate_driver_name("hostpath.csi.berth.dev").is_ok());
        for bad in ["", "-x", "x.", "a_b", &"a".repeat(64)] {
            assert!(validate_driver_name(bad).is_err(), "{bad:?}");
        }
    }
}
