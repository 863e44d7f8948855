//! Waiting on a fleet's node list.

use std::time::Duration;

use berth_api::nodes::{NodeList, NodeState};

use super::{AgentProcess, poll_api};

/// Polls `agent`'s node list until `pred` holds (at most 20 s; the failure names `what`).
pub async fn wait_nodes(
    agent: &AgentProcess,
    what: &str,
    pred: impl Fn(&NodeList) -> bool,
) -> NodeList {
    poll_api(
        agent,
        what,
        tokio::time::Instant::now() + Duration::from_secs(20),
        |c| async move { c.nodes().await.expect("GET /v1/nodes") },
        pred,
    )
    .await
}

/// Waits until exactly `n` nodes are ready.
pub async fn ready_nodes(agent: &AgentProcess, n: usize) -> NodeList {
    wait_nodes(agent, "ready nodes", move |l| {
        l.nodes
            .iter()
            .filter(|x| x.status == NodeState::Ready)
            .count()
            == n
    })
    .await
}
