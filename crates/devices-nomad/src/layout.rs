//! Where Nomad device plugins live on disk under the agent's devices root, and stopping what
//! a killed agent left running there.
//!
//! `<root>/nomad/<name>/` is the private directory of the plugin `name` (its `plugin.log`, the
//! slot's `plugin.lock` and `plugin.pid`, its socket directory `sock/`): one per plugin name,
//! whether it was declared in the config or found in `plugin_dir`.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_devices::plugin::PluginId;
use berth_sys::slot::PluginSlot;

use crate::instance::LOG_FILE;

/// The directory under the devices root that holds one directory per Nomad plugin.
pub const NOMAD_DIR: &str = "nomad";

/// Where agents before this layout probed binaries of `plugin_dir` (`<root>/inspect/<name>`,
/// log `inspect.log`, slot id `nomad-inspect:<name>`). Only [`stop_leftovers`] looks there.
const LEGACY_INSPECT_DIR: &str = "inspect";

/// The private directory of the Nomad plugin `name` under the devices root `root`:
/// `<root>/nomad/<name>`, the `dir` of its
/// [`NomadPluginConfig`](crate::instance::NomadPluginConfig). `name` must be a valid path
/// segment (the agent's config checks plugin names).
pub fn plugin_dir(root: &Path, name: &str) -> PathBuf {
    root.join(NOMAD_DIR).join(name)
}

/// Stops whatever an earlier agent left running in the slots of Nomad plugins under `root`
/// that are not in `keep` (plugins no longer configured nor in `plugin_dir`): each slot is
/// claimed (its processes get SIGTERM, then after `grace` SIGKILL) and released. Also stops
/// the probes agents of an earlier layout left under `<root>/inspect/` and removes that
/// directory. Plugins in `keep` are left alone: their own run claims their slot. Failures are
/// logged; nothing here stops the agent.
pub async fn stop_leftovers(root: &Path, keep: &BTreeSet<String>, grace: Duration) {
    for (name, dir) in subdirs(&root.join(NOMAD_DIR)) {
        if keep.contains(&name) {
            continue;
        }
        let id = PluginId::nomad(name.clone()).to_string();
        release(&id, &dir.join(LOG_FILE), grace).await;
    }
    let legacy = root.join(LEGACY_INSPECT_DIR);
    let mut clean = true;
    for (name, dir) in subdirs(&legacy) {
        let id = format!("nomad-inspect:{name}");
        clean &= release(&id, &dir.join("inspect.log"), grace).await;
    }
    if clean
        && legacy.is_dir()
        && let Err(e) = std::fs::remove_dir_all(&legacy)
    {
        tracing::warn!(dir = %legacy.display(), error = %e, "cannot remove the directory of earlier plugin probes");
    }
}

/// The directories directly in `dir` whose names are UTF-8, by name.
fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
        .collect();
    out.sort();
    out
}

/// Claims and releases the slot `id` whose log is `log`; whether nothing of it runs now.
async fn release(id: &str, log: &Path, grace: Duration) -> bool {
    let mut slot = PluginSlot::new(id, log);
    match slot.claim(grace).await {
        Ok(()) => {
            let stuck = slot.release(grace).await;
            if !stuck.is_empty() {
                tracing::error!(plugin = %id, pids = ?stuck, "processes of a plugin no longer run survive SIGKILL");
            }
            stuck.is_empty()
        }
        Err(e) => {
            tracing::warn!(plugin = %id, error = %e, "cannot stop what is left of a plugin no longer run");
            false
        }
    }
}
