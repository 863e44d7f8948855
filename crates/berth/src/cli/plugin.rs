//! `berth plugin …`: the CSI plugins registered with the agent.

use std::time::SystemTime;

use berth_api::{Fingerprint, PluginList, PluginStatus};
use berth_csi::model::{PluginCapabilities, VolumeExpansion};
use clap::{Args, Subcommand};

use crate::say;

use super::{
    api_client::{self, ago, health_word, list, yes_no},
    output,
};

/// Plugins registered with the agent.
#[derive(Debug, Args)]
pub struct PluginArgs {
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Every plugin in a table, or one plugin in detail.
    Status {
        /// A plugin id: show this plugin in detail.
        id: Option<String>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `berth plugin …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: PluginArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        PluginCommand::Status { id: None, json } => {
            let plugins = client.plugins().await?;
            if json {
                output::json(&plugins)
            } else {
                print_list(&plugins)
            }
        }
        PluginCommand::Status { id: Some(id), json } => {
            let plugin = client.plugin(&id).await?;
            if json {
                output::json(&plugin)
            } else {
                print_one(&plugin, SystemTime::now())
            }
        }
    }
}

fn print_list(list: &PluginList) -> anyhow::Result<()> {
    if list.plugins.is_empty() {
        say!("no plugins registered")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .plugins
        .iter()
        .map(|p| {
            let fp = p.fingerprint.as_ref();
            vec![
                p.id.clone(),
                p.plugin_type.to_string(),
                health_word(p.health.healthy).into(),
                fp.map_or("-".into(), |f| f.provider.clone()),
                fp.map_or("-".into(), |f| f.version.clone()),
                p.instances.len().to_string(),
            ]
        })
        .collect();
    output::table(
        &["ID", "TYPE", "HEALTHY", "PROVIDER", "VERSION", "INSTANCES"],
        &rows,
    )
}

fn print_one(p: &PluginStatus, now: SystemTime) -> anyhow::Result<()> {
    let fp = p.fingerprint.as_ref();
    let mut rows = vec![
        ("id", p.id.clone()),
        ("type", p.plugin_type.to_string()),
        ("health", health_word(p.health.healthy).into()),
        ("description", p.health.description.clone()),
        ("last transition", ago(p.health.last_transition_ms, now)),
        ("provider", fp.map_or("-".into(), |f| f.provider.clone())),
        ("version", fp.map_or("-".into(), |f| f.version.clone())),
        (
            "fingerprinted",
            fp.map_or("not yet".into(), |f| ago(f.taken_ms, now)),
        ),
        (
            "plugin capabilities",
            fp.map_or("-".into(), |f| plugin_capabilities(&f.plugin_capabilities)),
        ),
    ];
    if p.plugin_type.is_controller() {
        rows.push(("controller capabilities", controller_capabilities(fp)));
    }
    if p.plugin_type.is_node() {
        let info = fp.and_then(|f| f.node_info.as_ref());
        rows.push(("node capabilities", node_capabilities(fp)));
        rows.push(("node id", info.map_or("-".into(), |i| i.node_id.clone())));
        rows.push((
            "max volumes",
            info.map_or("-".into(), |i| max_volumes(i.max_volumes_per_node)),
        ));
        rows.push((
            "topology",
            info.and_then(|i| i.accessible_topology.as_ref())
                .map_or("-".into(), output::map),
        ));
    }
    output::fields(&rows)?;
    say!()?;
    let instances: Vec<Vec<String>> = p
        .instances
        .iter()
        .map(|i| {
            vec![
                i.instance.clone(),
                i.source.to_string(),
                i.socket.display().to_string(),
                yes_no(i.active).into(),
                health_word(i.health.healthy).into(),
            ]
        })
        .collect();
    output::table(
        &["INSTANCE", "SOURCE", "SOCKET", "ACTIVE", "HEALTHY"],
        &instances,
    )
}

/// A CSI volume limit: 0 means the plugin gave none.
pub fn max_volumes(n: i64) -> String {
    if n == 0 {
        "no limit".into()
    } else {
        n.to_string()
    }
}

fn plugin_capabilities(caps: &PluginCapabilities) -> String {
    let mut names = Vec::new();
    for (has, name) in [
        (caps.controller_service, "controller-service"),
        (
            caps.volume_accessibility_constraints,
            "volume-accessibility-constraints",
        ),
        (caps.group_controller_service, "group-controller-service"),
        (caps.snapshot_metadata_service, "snapshot-metadata-service"),
    ] {
        if has {
            names.push(name.to_string());
        }
    }
    match caps.volume_expansion {
        Some(VolumeExpansion::Online) => names.push("volume-expansion=online".into()),
        Some(VolumeExpansion::Offline) => names.push("volume-expansion=offline".into()),
        None => {}
    }
    list(names)
}

fn controller_capabilities(fp: Option<&Fingerprint>) -> String {
    match fp.and_then(|f| f.controller_capabilities.as_ref()) {
        Some(caps) => list(caps.iter().map(|c| c.to_string()).collect()),
        None => "-".into(),
    }
}

fn node_capabilities(fp: Option<&Fingerprint>) -> String {
    match fp.and_then(|f| f.node_capabilities.as_ref()) {
        Some(caps) => list(caps.iter().map(|c| c.to_string()).collect()),
        None => "-".into(),
    }
}
