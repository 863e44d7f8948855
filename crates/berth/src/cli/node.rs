//! `berth node …`: this node as the agent sees it, and the fleet's nodes.

use berth_api::{
    NodeStatus,
    nodes::{FleetNode, NodeList},
};
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
    /// Without an id: in a fleet, every node with its status (ready, draining, down);
    /// otherwise this node's ids, computed class, CSI node plugins and devices. With an id
    /// (or a unique prefix of one): that node.
    Status {
        /// A node id, or a unique prefix of one.
        id: Option<String>,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
    /// Stops placing new work on a node of the fleet (`--disable`: places it again).
    Drain {
        /// A node id, or a unique prefix of one.
        id: String,
        /// Clear the drain instead of setting it.
        #[arg(long)]
        disable: bool,
        /// Print the API's JSON document instead.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `berth node …` against the agent at `address`.
pub async fn run(address: &api_client::AgentAddress, args: NodeArgs) -> anyhow::Result<()> {
    let client = api_client::connect(address)?;
    match args.command {
        NodeCommand::Status { id: None, json } => {
            let list = client.nodes().await?;
            if !list.fleet {
                let node = client.node().await?;
                return if json {
                    output::json(&node)
                } else {
                    print_node(&node)
                };
            }
            if json {
                output::json(&list)
            } else {
                print_fleet(&list)
            }
        }
        NodeCommand::Status { id: Some(id), json } => {
            let node = client.fleet_node(&id).await?;
            if json {
                output::json(&node)
            } else {
                print_fleet_node(&node)
            }
        }
        NodeCommand::Drain { id, disable, json } => {
            let node = client.drain_node(&id, !disable).await?;
            if json {
                output::json(&node)
            } else {
                say!(
                    "node {} ({}): {}",
                    node.id,
                    output::escape(&node.name),
                    node.status.as_str()
                )
            }
        }
    }
}

/// The first 8 characters of an id, as Nomad shows them in lists.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        output::escape(s).into_owned()
    }
}

fn print_fleet(list: &NodeList) -> anyhow::Result<()> {
    if list.nodes.is_empty() {
        say!("no nodes")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .nodes
        .iter()
        .map(|n| {
            let drivers: Vec<&str> = n
                .drivers
                .iter()
                .filter(|d| d.healthy)
                .map(|d| d.name.as_str())
                .collect();
            vec![
                short(&n.id).to_string(),
                or_dash(&n.name),
                or_dash(&n.datacenter),
                or_dash(&n.node_class),
                n.status.as_str().into(),
                if n.drain { "true" } else { "false" }.into(),
                or_dash(&drivers.join(",")),
                n.csi_plugins.len().to_string(),
            ]
        })
        .collect();
    output::table(
        &[
            "ID",
            "NAME",
            "DC",
            "CLASS",
            "STATUS",
            "DRAIN",
            "DRIVERS",
            "CSI PLUGINS",
        ],
        &rows,
    )
}

fn print_fleet_node(n: &FleetNode) -> anyhow::Result<()> {
    output::fields(&[
        ("id", n.id.clone()),
        ("name", or_dash(&n.name)),
        ("hostname", or_dash(&n.hostname)),
        ("status", n.status.as_str().into()),
        ("drain", n.drain.to_string()),
        ("datacenter", or_dash(&n.datacenter)),
        ("class", or_dash(&n.node_class)),
        ("computed class", or_dash(&n.computed_class)),
        (
            "csi controllers",
            or_dash(
                &n.csi_controllers
                    .iter()
                    .map(|c| c.plugin_id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ),
    ])?;
    say!()?;
    let rows: Vec<Vec<String>> = n
        .drivers
        .iter()
        .map(|d| {
            vec![
                d.name.clone(),
                health_word(d.healthy).into(),
                or_dash(&d.description),
            ]
        })
        .collect();
    if rows.is_empty() {
        say!("no drivers")?;
    } else {
        output::table(&["DRIVER", "HEALTHY", "DETAIL"], &rows)?;
    }
    say!()?;
    let status = NodeStatus {
        csi_plugins: n.csi_plugins.clone(),
        ..NodeStatus::default()
    };
    print_csi(&status)?;
    say!()?;
    let rows: Vec<Vec<String>> = n
        .devices
        .iter()
        .map(|d| vec![d.id.clone(), format!("{}/{}", d.healthy, d.total)])
        .collect();
    if rows.is_empty() {
        say!("no devices")
    } else {
        output::table(&["DEVICE", "HEALTHY/TOTAL"], &rows)
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
