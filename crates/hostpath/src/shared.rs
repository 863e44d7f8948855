//! `--shared`: several copies, one per node, share one state directory, as the nodes of a
//! cluster share a network storage backend. What differs from a copy alone:
//!
//! - locking ([`statelock::acquire_shared`](crate::statelock::acquire_shared)): one copy per
//!   node id, and never a copy without `--shared` at the same time;
//! - the state ([`Store::load_shared`]): read again from the file under a lock the copies share
//!   before every read and change;
//! - the known nodes: each copy records its node id in the state when it starts; the controller
//!   publishes to any of them, and volumes are accessible from all of them;
//! - the fault switch's files are the node's own, in `<statedir>/nodes/<nodeid>/`.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
};

use berth_csi::pb;
use tonic::Status;

use crate::{
    RunError,
    plugin::{Plugin, TOPOLOGY_KEY, node_topology},
    state::{State, StateError, Store},
};

/// Longest node id, in bytes.
pub(crate) const MAX_NODE_ID_LEN: usize = 128;

/// The directory, in the state directory, that holds one directory per node.
pub(crate) const NODES_DIR: &str = "nodes";

/// Checks that `node_id` can name the files of its node in a shared state directory: 1 to
/// [`MAX_NODE_ID_LEN`] bytes, no `/` or NUL, not `.` or `..`.
pub(crate) fn check_node_id(node_id: &str) -> Result<(), RunError> {
    let reason = if node_id.is_empty() || node_id.len() > MAX_NODE_ID_LEN {
        format!("{node_id:?} must be 1 to {MAX_NODE_ID_LEN} bytes long")
    } else if node_id.contains(['/', '\0']) {
        format!("{node_id:?} must not contain '/' or NUL: with --shared it names files")
    } else if node_id == "." || node_id == ".." {
        format!("{node_id:?} is not a usable node id: with --shared it names files")
    } else {
        return Ok(());
    };
    Err(RunError::InvalidFlag {
        flag: "nodeid",
        reason,
    })
}

/// `<statedir>/nodes/<nodeid>`: the node's own files (the fault switch's).
pub(crate) fn node_dir(statedir: &Path, node_id: &str) -> PathBuf {
    statedir.join(NODES_DIR).join(node_id)
}

/// Creates [`node_dir`] (0700) if it is missing.
pub(crate) fn create_node_dir(statedir: &Path, node_id: &str) -> Result<PathBuf, RunError> {
    let dir = node_dir(statedir, node_id);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|source| RunError::StateDir {
            path: dir.clone(),
            source,
        })?;
    Ok(dir)
}

/// Records `node_id` among the nodes of the shared state, so that the other copies' controllers
/// publish to it.
pub(crate) async fn register_node(store: &Store, node_id: &str) -> Result<(), StateError> {
    if store.read(|s| s.nodes.contains(node_id)).await? {
        return Ok(());
    }
    store
        .update(|s| {
            s.nodes.insert(node_id.to_owned());
            Ok::<_, StateError>(())
        })
        .await
}

impl Plugin {
    /// The topologies volumes are accessible from, as `state` says: this node's; with
    /// `--shared`, every recorded node's.
    pub(crate) fn volume_topologies(&self, state: &State) -> Vec<HashMap<String, String>> {
        if self.settings.shared {
            state.nodes.iter().map(|n| node_topology(n)).collect()
        } else {
            vec![self.topology()]
        }
    }

    /// `topologies` (from [`volume_topologies`](Self::volume_topologies)) as CSI topologies.
    pub(crate) fn topologies_pb(topologies: &[HashMap<String, String>]) -> Vec<pb::Topology> {
        topologies
            .iter()
            .map(|segments| pb::Topology {
                segments: segments.clone(),
            })
            .collect()
    }

    /// Says which nodes `topologies` (from [`volume_topologies`](Self::volume_topologies))
    /// describe, for error messages.
    pub(crate) fn describe_nodes(&self, topologies: &[HashMap<String, String>]) -> String {
        if !self.settings.shared {
            return format!("this node ({TOPOLOGY_KEY}={})", self.settings.node_id);
        }
        let nodes: Vec<&str> = topologies
            .iter()
            .filter_map(|t| t.get(TOPOLOGY_KEY).map(String::as_str))
            .collect();
        format!(
            "a node sharing this state directory ({TOPOLOGY_KEY}={})",
            nodes.join("|")
        )
    }

    /// `NOT_FOUND` unless `node` is a node the controller publishes to: this plugin's own;
    /// with `--shared`, any node recorded in the state.
    pub(crate) async fn require_known_node(&self, node: &str) -> Result<(), Status> {
        if !self.settings.shared {
            if node == self.settings.node_id {
                return Ok(());
            }
            return Err(Status::not_found(format!(
                "node {node} does not exist; this plugin serves node {}",
                self.settings.node_id
            )));
        }
        let known = self
            .store
            .read(|s| {
                (!s.nodes.contains(node))
                    .then(|| s.nodes.iter().cloned().collect::<Vec<_>>().join(", "))
            })
            .await?;
        match known {
            None => Ok(()),
            Some(nodes) => Err(Status::not_found(format!(
                "node {node} does not exist; the nodes sharing this state directory are: {nodes}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_must_name_files() {
        for good in [
            "n1",
            "node.example.com",
            "a b",
            &"x".repeat(MAX_NODE_ID_LEN),
        ] {
            assert!(check_node_id(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/",
            "a\0b",
            &"x".repeat(MAX_NODE_ID_LEN + 1),
        ] {
            let err = check_node_id(bad).unwrap_err();
            assert!(err.to_string().contains("--nodeid"), "{err}");
        }
    }
}
