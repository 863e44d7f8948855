//! `berth plugin …`: the CSI plugins registered with the agent.

use std::{collections::BTreeSet, time::SystemTime};

use berth_api::{Client, Fingerprint, PluginList, PluginStatus, Source, jobs::AllocStatus};
use berth_csi::model::{PluginCapabilities, VolumeExpansion};
use clap::{Args, Subcommand};

use crate::say;

use super::{
    api_client::{self, KindArg, ago, health_word, list, ratio, yes_no},
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
        /// The kind of plugin: csi, the only one berth has (Nomad's `-type csi`).
        #[arg(long = "type", value_enum)]
        kind: Option<KindArg>,
        /// Print the summary fields only, without the tables.
        #[arg(long)]
        short: bool,
        /// Show the allocs' times in full.
        #[arg(long)]
        verbose: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `berth plugin …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: PluginArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        PluginCommand::Status { id: None, json, .. } => {
            let plugins = client.plugins().await?;
            if json {
                output::json(&plugins)
            } else {
                print_list(&plugins)
            }
        }
        PluginCommand::Status {
            id: Some(id),
            json,
            short,
            verbose,
            ..
        } => {
            let plugin = client.plugin(&id).await?;
            if json {
                return output::json(&plugin);
            }
            let now = SystemTime::now();
            print_one(&plugin, short, now)?;
            if short {
                return Ok(());
            }
            let allocs = plugin_allocs(&client, &plugin).await?;
            say!()?;
            if allocs.is_empty() {
                return say!("no allocs run this plugin");
            }
            let rows: Vec<Vec<String>> = allocs
                .iter()
                .map(|a| {
                    let mut row = vec![a.alloc_id.clone()];
                    row.extend(api_client::alloc_cells(Some(a), now, verbose));
                    row
                })
                .collect();
            let mut header = vec!["ID"];
            header.extend(api_client::ALLOC_COLUMNS);
            output::table(&header, &rows)
        }
    }
}

/// The allocs whose task runs `plugin`: an instance a task registered is named
/// `<alloc id>.<task>`, matched against the tasks of every job's allocs.
async fn plugin_allocs(client: &Client, plugin: &PluginStatus) -> anyhow::Result<Vec<AllocStatus>> {
    let names: BTreeSet<&str> = plugin
        .instances
        .iter()
        .filter(|i| i.source == Source::Task)
        .map(|i| i.instance.as_str())
        .collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let jobs = match client.jobs().await {
        Ok(j) => j.jobs,
        // An agent that serves no jobs runs no plugin task.
        Err(e) if e.is_not_found() => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::new();
    for job in jobs {
        let status = match client.job(&job.id).await {
            Ok(s) => s,
            // Purged meanwhile.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        for a in status.allocs {
            if a.tasks
                .keys()
                .any(|t| names.contains(format!("{}.{t}", a.alloc_id).as_str()))
            {
                found.push(a);
            }
        }
    }
    Ok(found)
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
            let ((ch, ce), (nh, ne)) = api_client::plugin_roles(p);
            vec![
                p.id.clone(),
                p.plugin_type.to_string(),
                health_word(p.health.healthy).into(),
                fp.map_or("-".into(), |f| f.provider.clone()),
                fp.map_or("-".into(), |f| f.version.clone()),
                ratio(ch, ce),
                ratio(nh, ne),
                p.instances.len().to_string(),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "TYPE",
            "HEALTHY",
            "PROVIDER",
            "VERSION",
            "CONTROLLERS",
            "NODES",
            "INSTANCES",
        ],
        &rows,
    )
}

fn print_one(p: &PluginStatus, short: bool, now: SystemTime) -> anyhow::Result<()> {
    let fp = p.fingerprint.as_ref();
    let ((ch, ce), (nh, ne)) = api_client::plugin_roles(p);
    let mut rows = vec![
        ("id", p.id.clone()),
        ("type", p.plugin_type.to_string()),
        ("health", health_word(p.health.healthy).into()),
        ("controllers healthy", ratio(ch, ce)),
        ("nodes healthy", ratio(nh, ne)),
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
    if short {
        return Ok(());
    }
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
