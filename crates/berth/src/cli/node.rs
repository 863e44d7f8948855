//! `berth node …`: this node as the agent sees it.

use berth_api::NodeStatus;
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
    /// The node's ids and what its CSI node plugins report.
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
    output::fields(&[("id", node.id.clone()), ("hostname", node.hostname.clone())])?;
    say!()?;
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
