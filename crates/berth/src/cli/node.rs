//! `berth node …`: this node as the agent sees it.

use berth_api::NodeStatus;
use berth_devices::view::DevicesView;
use clap::{Args, Subcommand};

use crate::say;

use super::{
    api_client::{self, health_word},
    output,
    plugin::max_volumes,
};

/// This node as the agent sees it.
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    command: NodeCommand,
}

#[derive(Debug, Subcommand)]
enum NodeCommand {
    /// The node's ids, computed class, what its CSI node plugins report, and its devices.
    Status {
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `berth node …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: NodeArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        NodeCommand::Status { json } => {
            let node = client.node().await?;
            if json {
                output::json(&node)
            } else {
                print_node(&node)
            }
        }
    }
}

fn print_node(node: &NodeStatus) -> anyhow::Result<()> {
    output::fields(&[
        ("id", node.id.clone()),
        ("hostname", node.hostname.clone()),
        (
            "computed class",
            if node.computed_class.is_empty() {
                "-".into()
            } else {
                node.computed_class.clone()
            },
        ),
    ])?;
    say!()?;
    print_csi(node)?;
    say!()?;
    print_devices(&node.devices)
}

fn print_csi(node: &NodeStatus) -> anyhow::Result<()> {
    if node.csi_plugins.is_empty() {
        say!("no CSI node plugins")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = node
        .csi_plugins
        .iter()
        .map(|p| {
            vec![
                p.plugin_id.clone(),
                health_word(p.healthy).into(),
                p.csi_node_id.clone().unwrap_or_else(|| "-".into()),
                max_volumes(p.max_volumes),
                output::map(&p.topology),
            ]
        })
        .collect();
    output::table(
        &[
            "PLUGIN",
            "HEALTHY",
            "CSI NODE ID",
            "MAX VOLUMES",
            "TOPOLOGY",
        ],
        &rows,
    )
}

/// Device plugins, then one row per device instance (its group's attributes on the group's
/// first row).
fn print_devices(devices: &DevicesView) -> anyhow::Result<()> {
    if devices.plugins.is_empty() {
        say!("no device plugins")?;
        say!()?;
        return print_cdi(devices);
    }
    let rows: Vec<Vec<String>> = devices
        .plugins
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.state.as_str().into(),
                if p.detail.is_empty() {
                    "-".into()
                } else {
                    p.detail.clone()
                },
                p.reason.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    output::table(&["DEVICE PLUGIN", "STATE", "DETAIL", "LAST ERROR"], &rows)?;
    let invalid: Vec<String> = devices
        .plugins
        .iter()
        .flat_map(|p| p.invalid.iter().map(move |i| format!("{}: {i}", p.id)))
        .collect();
    for line in invalid {
        say!("invalid entry dropped: {}", output::escape(&line))?;
    }
    say!()?;
    print_cdi(devices)?;
    if devices.groups.is_empty() {
        say!("no devices")?;
        return Ok(());
    }
    let mut rows = Vec::new();
    for g in &devices.groups {
        let attrs: Vec<String> = g
            .attributes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let name = g.id().to_string();
        if g.instances.is_empty() {
            rows.push(vec![
                name.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                attrs.join(", "),
            ]);
        }
        for (i, inst) in g.instances.iter().enumerate() {
            let mut health = health_word(inst.healthy).to_string();
            if !inst.health_description.is_empty() {
                health = format!("{health}: {}", inst.health_description);
            }
            let locality = inst.locality.as_ref().map_or_else(
                || "-".into(),
                |l| {
                    let mut parts = Vec::new();
                    if !l.pci_bus_id.is_empty() {
                        parts.push(format!("pci {}", l.pci_bus_id));
                    }
                    if !l.numa_nodes.is_empty() {
                        let nodes: Vec<String> =
                            l.numa_nodes.iter().map(ToString::to_string).collect();
                        parts.push(format!("numa {}", nodes.join(",")));
                    }
                    parts.join("; ")
                },
            );
            let stats = inst
                .stats
                .as_ref()
                .and_then(|s| s.summary.as_ref())
                .map_or_else(|| "-".into(), ToString::to_string);
            rows.push(vec![
                if i == 0 { name.clone() } else { String::new() },
                inst.id.clone(),
                health,
                locality,
                inst.reserved_by.clone().unwrap_or_else(|| "-".into()),
                stats,
                if i == 0 {
                    attrs.join(", ")
                } else {
                    String::new()
                },
            ]);
        }
    }
    output::table(
        &[
            "DEVICE",
            "INSTANCE",
            "HEALTH",
            "LOCALITY",
            "ALLOC",
            "STATS",
            "ATTRIBUTES",
        ],
        &rows,
    )
}

/// CDI devices the spec directories define, and the spec files refused.
fn print_cdi(devices: &DevicesView) -> anyhow::Result<()> {
    if devices.cdi_devices.is_empty() && devices.cdi_errors.is_empty() {
        return Ok(());
    }
    if !devices.cdi_devices.is_empty() {
        say!(
            "CDI devices: {}",
            output::escape(&devices.cdi_devices.join(", "))
        )?;
    }
    for e in &devices.cdi_errors {
        say!("CDI spec refused: {}", output::escape(e))?;
    }
    say!()?;
    Ok(())
}
