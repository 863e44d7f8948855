//! Placement of a job's groups on a node: every alloc the job asks for, or a refusal that says
//! every reason it cannot run there. Pure logic over what the caller knows of the node and the
//! volume catalog; nothing is claimed or written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use berth_job::{GroupSpec, JobSpec};
use serde::{Deserialize, Serialize};

use crate::{
    catalog::VolumeRecord,
    claims::{Claim, ClaimMode},
};

/// Whether a task driver can run tasks on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFact {
    /// Healthy after its last fingerprint.
    pub healthy: bool,
    /// Why not, when it is not.
    pub reason: String,
}

/// What the node's registry says of a CSI plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginFact {
    /// It has a node instance.
    pub node: bool,
    /// That node instance is healthy.
    pub healthy: bool,
}

/// What placement needs to know of the node.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// berth's node id.
    pub node_id: String,
    /// Task drivers by name.
    pub drivers: BTreeMap<String, DriverFact>,
    /// CSI plugins by id.
    pub plugins: BTreeMap<String, PluginFact>,
}

/// One alloc to run: a group's `index`-th copy, and the volume each of its volume blocks uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocPlan {
    /// The alloc's id (a path segment).
    pub alloc_id: String,
    /// The job.
    pub job_id: String,
    /// The group.
    pub group: String,
    /// Which copy of the group (0-based).
    pub index: u32,
    /// Volume block name → berth's volume id.
    pub volumes: BTreeMap<String, String>,
}

/// One reason a job cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Where in the job, e.g. `group web, task app`.
    pub at: String,
    /// What is missing or in the way.
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.reason)
    }
}

/// Why a job was not placed: every reason found (nothing was placed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {job_id:?} cannot be placed: {}", .refusals.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct PlacementError {
    /// The job.
    pub job_id: String,
    /// Every reason, in job order.
    pub refusals: Vec<Refusal>,
}

/// Places every group of `job` on the node described by `node`, each group `count` times.
///
/// Refused, with every reason, when a task's driver is unknown or unhealthy; a volume is not
/// in the catalog, does not offer the requested access and attachment mode, or is served by a
/// plugin with no healthy node instance here (unless a task of this job runs that plugin); or
/// the claims the allocs would take break the volume's access mode together with the claims
/// it already has. `new_alloc_id(group, index)` names each alloc.
pub fn place(
    job: &JobSpec,
    node: &NodeFacts,
    volume: impl Fn(&str) -> Option<VolumeRecord>,
    mut new_alloc_id: impl FnMut(&str, u32) -> String,
) -> Result<Vec<AllocPlan>, PlacementError> {
    let mut refusals = Vec::new();
    let plugins_of_job: BTreeSet<&str> = job
        .groups
        .iter()
        .flat_map(|g| g.tasks.iter())
        .filter_map(|t| t.csi_plugin.as_ref())
        .map(|p| p.id.as_str())
        .collect();
    // Claims the planned allocs add, per volume, on top of the catalog's.
    let mut planned: BTreeMap<String, crate::claims::ClaimSet> = BTreeMap::new();
    let mut plans = Vec::new();
    for group in &job.groups {
        check_drivers(group, node, &mut refusals);
        for index in 0..group.count {
            let alloc_id = new_alloc_id(&group.name, index);
            let mut volumes = BTreeMap::new();
            for (name, req) in &group.volumes {
                let at = format!("group {}, volume {name}", group.name);
                let volume_id = req.source_for(index);
                volumes.insert(name.clone(), volume_id.clone());
                let Some(vol) = volume(&volume_id) else {
                    push_once(
                        &mut refusals,
                        &at,
                        format!("no volume {volume_id:?} is registered"),
                    );
                    continue;
                };
                if !plugins_of_job.contains(vol.plugin_id.as_str()) {
                    match node.plugins.get(&vol.plugin_id) {
                        Some(p) if p.node && p.healthy => {}
                        Some(p) if p.node => push_once(
                            &mut refusals,
                            &at,
                            format!(
                                "CSI plugin {:?} of volume {volume_id:?} is not healthy on this node",
                                vol.plugin_id
                            ),
                        ),
                        _ => push_once(
                            &mut refusals,
                            &at,
                            format!(
                                "no CSI node plugin {:?} (for volume {volume_id:?}) runs on this node",
                                vol.plugin_id
                            ),
                        ),
                    }
                }
                let set = match planned.get_mut(&volume_id) {
                    Some(set) => set,
                    None => match vol.claim_set() {
                        Ok(set) => planned.entry(volume_id.clone()).or_insert(set),
                        Err(e) => {
                            push_once(&mut refusals, &at, e.to_string());
                            continue;
                        }
                    },
                };
                let claim = Claim {
                    alloc_id: alloc_id.clone(),
                    node_id: node.node_id.clone(),
                    mode: if req.read_only {
                        ClaimMode::Read
                    } else {
                        ClaimMode::Write
                    },
                    access_mode: req.access_mode,
                    attachment_mode: req.attachment_mode,
                };
                if let Err(e) = set.claim(&vol.capability_pairs(), claim) {
                    push_once(
                        &mut refusals,
                        &at,
                        format!("volume {volume_id:?} cannot be claimed for copy {index}: {e}"),
                    );
                }
            }
            plans.push(AllocPlan {
                alloc_id,
                job_id: job.id.clone(),
                group: group.name.clone(),
                index,
                volumes,
            });
        }
    }
    if refusals.is_empty() {
        Ok(plans)
    } else {
        Err(PlacementError {
            job_id: job.id.clone(),
            refusals,
        })
    }
}

fn check_drivers(group: &GroupSpec, node: &NodeFacts, refusals: &mut Vec<Refusal>) {
    for task in &group.tasks {
        let at = format!("group {}, task {}", group.name, task.name);
        match node.drivers.get(&task.driver) {
            Some(d) if d.healthy => {}
            Some(d) => push_once(
                refusals,
                &at,
                format!(
                    "driver {:?} is not healthy on this node: {}",
                    task.driver, d.reason
                ),
            ),
            None => push_once(
                refusals,
                &at,
                format!(
                    "unknown driver {:?} (this node has {})",
                    task.driver,
                    node.drivers.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ),
        }
    }
}

/// Adds a refusal unless the same one is there (a group of count n repeats its reasons).
fn push_once(refusals: &mut Vec<Refusal>, at: &str, reason: String) {
    if !refusals.iter().any(|r| r.at == at && r.reason == reason) {
        refusals.push(Refusal {
            at: at.to_string(),
            reason,
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

    use berth_csi::model::{AccessMode, AttachmentMode, ExternalId};

    use super::*;
    use crate::catalog::{Origin, StoredCapability, StoredSecrets};

    fn job(text: &str) -> JobSpec {
        JobSpec::parse_hcl(Path::new("job.hcl"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn node() -> NodeFacts {
        NodeFacts {
            node_id: "n1".into(),
            drivers: [
                (
                    "raw_exec".to_string(),
                    DriverFact {
                        healthy: true,
                        reason: String::new(),
                    },
                ),
                (
                    "exec".to_string(),
                    DriverFact {
                        healthy: false,
                        reason: "not root".into(),
                    },
                ),
            ]
            .into(),
            plugins: [(
                "hp".to_string(),
                PluginFact {
                    node: true,
                    healthy: true,
                },
            )]
            .into(),
        }
    }

    pub(crate) fn volume(id: &str, mode: AccessMode) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            name: id.into(),
            plugin_id: "hp".into(),
            external_id: ExternalId::new(format!("ext-{id}")).unwrap(),
            origin: Origin::Registered,
            capabilities: vec![StoredCapability {
                access_mode: mode,
                attachment_mode: AttachmentMode::FileSystem,
            }],
            mount_options: Default::default(),
            parameters: BTreeMap::new(),
            context: BTreeMap::new(),
            secrets: StoredSecrets::default(),
            topology: Vec::new(),
            capacity_bytes: 0,
            created_ms: 0,
            claims: BTreeMap::new(),
            publications: BTreeMap::new(),
            controller_publish: false,
            created_by: None,
        }
    }

    fn ids() -> impl FnMut(&str, u32) -> String {
        |g: &str, i: u32| format!("{g}-{i}")
    }

    const WRITER: &str = r#"
job "web" {
  group "app" {
    count = 2
    volume "data" {
      type = "csi"
      source = "vol"
      access_mode = "single-node-multi-writer"
    }
    task "main" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      volume_mount {
        volume = "data"
        destination = "/data"
      }
    }
  }
}
"#;

    #[test]
    fn places_every_copy_with_its_volumes() {
        let plans = place(
            &job(WRITER),
            &node(),
            |id| (id == "vol").then(|| volume("vol", AccessMode::SingleNodeMultiWriter)),
            ids(),
        )
        .unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[1].alloc_id, "app-1");
        assert_eq!(plans[0].volumes["data"], "vol");
    }

    #[test]
    fn refuses_with_every_reason() {
        let text = WRITER
            .replace("raw_exec", "exec")
            .replace("single-node-multi-writer", "single-node-writer");
        let e = place(
            &job(&text),
            &node(),
            |id| (id == "vol").then(|| volume("vol", AccessMode::SingleNodeWriter)),
            ids(),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("driver \"exec\" is not healthy on this node: not root"),
            "{text}"
        );
        assert!(text.contains("cannot be claimed for copy 1"), "{text}");
        assert_eq!(e.refusals.len(), 2, "{e:?}");
    }

    #[test]
    fn unknown_driver_volume_and_plugin() {
        let text = WRITER.replace("raw_exec", "qemu");
        let e = place(&job(&text), &node(), |_| None, ids()).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("unknown driver \"qemu\" (this node has exec, raw_exec)"),
            "{s}"
        );
        assert!(s.contains("no volume \"vol\" is registered"), "{s}");
        let mut n = node();
        n.plugins.clear();
        let e = place(
            &job(WRITER),
            &n,
            |_| Some(volume("vol", AccessMode::SingleNodeMultiWriter)),
            ids(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no CSI node plugin \"hp\""), "{e}");
    }

    #[test]
    fn a_plugin_run_by_the_job_itself_is_not_required_up_front() {
        let text = format!(
            "{}\n{}",
            WRITER.trim_end().trim_end_matches('}'),
            r#"
  group "plugin" {
    task "hp" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      csi_plugin {
        id = "hp"
        type = "monolith"
      }
    }
  }
}
"#
        );
        let mut n = node();
        n.plugins.clear();
        let plans = place(
            &job(&text),
            &n,
            |_| Some(volume("vol", AccessMode::SingleNodeMultiWriter)),
            ids(),
        )
        .unwrap();
        assert_eq!(plans.len(), 3);
    }
}
