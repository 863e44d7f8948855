//! A one-shot probe: start a binary as a Nomad plugin, ask what it is (`PluginInfo`), stop
//! it. The agent uses it to tell device plugins from other plugins in its `plugin_dir`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_sys::slot::{PluginSlot, SlotError};
use tokio_util::sync::CancellationToken;

use crate::{
    client::{CallError, NomadClient, PluginInfo},
    launch::{self, LaunchError, LaunchSpec},
};

/// The log file of a probe in its directory (the slot's files sit beside it).
pub const INSPECT_LOG: &str = "inspect.log";

/// Timeouts and environment of a probe.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    /// How long the handshake line may take.
    pub start_timeout: Duration,
    /// The deadline of `PluginInfo` and of `Shutdown`.
    pub call_timeout: Duration,
    /// How long the plugin gets to exit before its group is killed.
    pub stop_grace: Duration,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
}

impl Default for InspectOptions {
    /// 10 s to start, 5 s per call, 2 s to exit, no extra environment.
    fn default() -> Self {
        Self {
            start_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(5),
            stop_grace: Duration::from_secs(2),
            env: BTreeMap::new(),
        }
    }
}

/// Why a probe found nothing.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The probe's slot cannot be claimed.
    #[error(transparent)]
    Slot(#[from] SlotError),
    /// The binary did not start as a go-plugin plugin with Nomad's handshake.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// It started but did not answer `PluginInfo`.
    #[error(transparent)]
    Call(#[from] CallError),
}

/// [`inspect_with`] with the default options.
pub async fn inspect(
    command: &Path,
    args: &[String],
    dir: &Path,
) -> Result<PluginInfo, InspectError> {
    inspect_with(command, args, dir, &InspectOptions::default()).await
}

/// Starts `command` with `args` as a Nomad plugin, reads its `PluginInfo` and stops it.
/// `dir` is the probe's own private directory (socket dir, [`INSPECT_LOG`], slot files; not
/// a running instance's). Whatever happens, nothing it started is left running when this
/// returns: the process group is stopped, then the slot stops anything still marked as the
/// probe's. Whatever kind of plugin it is, its info is returned (the caller decides).
pub async fn inspect_with(
    command: &Path,
    args: &[String],
    dir: &Path,
    options: &InspectOptions,
) -> Result<PluginInfo, InspectError> {
    let name = command.file_name().map_or_else(
        || command.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let log = dir.join(INSPECT_LOG);
    let mut slot = PluginSlot::new(&format!("nomad-inspect:{name}"), &log);
    slot.claim(options.stop_grace).await?;
    let spec = LaunchSpec {
        name: name.clone(),
        command: command.to_path_buf(),
        args: args.to_vec(),
        env: options.env.clone(),
        socket_dir: dir.join(crate::instance::SOCKET_DIR),
        log: PathBuf::from(&log),
        ports: (14000, 14512),
        start_timeout: options.start_timeout,
    };
    let result = probe(&spec, &slot, options).await;
    let stuck = slot.release(options.stop_grace).await;
    if !stuck.is_empty() {
        tracing::error!(plugin = %name, pids = ?stuck, "probed plugin processes survive SIGKILL");
    }
    result
}

async fn probe(
    spec: &LaunchSpec,
    slot: &PluginSlot,
    options: &InspectOptions,
) -> Result<PluginInfo, InspectError> {
    let process = launch::launch(spec, slot, &CancellationToken::new()).await?;
    let client = NomadClient::new(&spec.name, process.address(), options.call_timeout);
    let info = client.plugin_info().await;
    process
        .stop(Some(&client), options.call_timeout, options.stop_grace)
        .await;
    slot.forget();
    Ok(info?)
}
