//! What devices are: groups of instances that share a vendor, a type and a name (Nomad's
//! `NodeDeviceResource`), their health and locality, their statistics, and what a task gets
//! for the instances reserved for it ([`ContainerEdits`]).

use std::{
    collections::BTreeMap,
    fmt,
    os::unix::ffi::OsStrExt as _,
    path::{Component, Path, PathBuf},
};

use berth_input::Quoted;
use serde::{Deserialize, Serialize};

use crate::attribute::Attribute;

/// Names a device group: `vendor/type/name` (`nvidia/gpu/Tesla K80`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DeviceGroupId {
    /// The vendor (`nvidia`, `example.com`).
    pub vendor: String,
    /// The type (`gpu`, `fpga`).
    pub device_type: String,
    /// The name, or model (`Tesla K80`).
    pub name: String,
}

impl fmt::Display for DeviceGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.vendor, self.device_type, self.name)
    }
}

/// Where a device instance sits in the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locality {
    /// The PCI bus id (Nomad plugins report it); empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pci_bus_id: String,
    /// The NUMA nodes the instance is attached to (Kubernetes plugins report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<i64>,
}

/// One device instance of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInstance {
    /// The plugin's id of the instance: stable across restarts of the plugin, unique in its
    /// group, non-empty.
    pub id: String,
    /// Whether it can be given to a task.
    pub healthy: bool,
    /// Why it is (un)healthy, in the plugin's words; may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_description: String,
    /// Where it sits, when the plugin says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<Locality>,
}

/// A group of device instances that share a vendor, a type, a name and attributes, as one
/// plugin reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceGroup {
    /// The vendor; non-empty.
    pub vendor: String,
    /// The type; non-empty.
    pub device_type: String,
    /// The name; non-empty.
    pub name: String,
    /// Attributes constraints and affinities read (`${device.attr.<key>}`).
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
    /// The instances.
    pub instances: Vec<DeviceInstance>,
}

impl DeviceGroup {
    /// The group's `vendor/type/name`.
    pub fn id(&self) -> DeviceGroupId {
        DeviceGroupId {
            vendor: self.vendor.clone(),
            device_type: self.device_type.clone(),
            name: self.name.clone(),
        }
    }
}

/// One statistic (Nomad's `StatValue`): a number as numerator over an optional denominator
/// (`used / total`), a string or a bool, with a unit and a description.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatValue {
    /// Float numerator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float_numerator: Option<f64>,
    /// Float denominator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub float_denominator: Option<f64>,
    /// Integer numerator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int_numerator: Option<i64>,
    /// Integer denominator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int_denominator: Option<i64>,
    /// A string value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// A bool value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bool: Option<bool>,
    /// The unit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
    /// What it measures.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub desc: String,
}

impl StatValue {
    /// The numerator as a float, when the value is a number (what a gauge exports).
    pub fn number(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.float_numerator
            .or_else(|| self.int_numerator.map(|n| n as f64))
    }
}

/// As Nomad's CLI prints a stat: `3 / 8 GiB`, `71 C`, `true`.
impl fmt::Display for StatValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut wrote = true;
        if let Some(n) = self.float_numerator {
            write!(f, "{n}")?;
            if let Some(d) = self.float_denominator {
                write!(f, " / {d}")?;
            }
        } else if let Some(n) = self.int_numerator {
            write!(f, "{n}")?;
            if let Some(d) = self.int_denominator {
                write!(f, " / {d}")?;
            }
        } else if let Some(s) = &self.string {
            f.write_str(s)?;
        } else if let Some(b) = self.bool {
            write!(f, "{b}")?;
        } else {
            wrote = false;
        }
        if wrote && !self.unit.is_empty() {
            write!(f, " {}", self.unit)?;
        }
        Ok(())
    }
}

/// Nested statistics (Nomad's `StatObject`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatObject {
    /// Nested objects by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nested: BTreeMap<String, StatObject>,
    /// Values by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, StatValue>,
}

/// The latest statistics of one instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceStats {
    /// The one most telling value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<StatValue>,
    /// Everything the plugin reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<StatObject>,
    /// When the plugin collected them (milliseconds since the epoch; 0 when it did not say).
    #[serde(default)]
    pub timestamp_ms: u64,
}

/// The statistics of one group's instances, from one stats message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    /// The group.
    pub group: DeviceGroupId,
    /// Statistics by instance id.
    pub instances: BTreeMap<String, InstanceStats>,
}

/// A host path mounted into a task for its devices (libraries, tools, device state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMount {
    /// Where it is on the host (absolute).
    pub host_path: PathBuf,
    /// Where the task sees it (absolute).
    pub task_path: PathBuf,
    /// Read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// A device node given to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// The node on the host (absolute).
    pub host_path: PathBuf,
    /// Where the task sees it (absolute).
    pub task_path: PathBuf,
    /// Cgroup permissions: one or more of `r`, `w`, `m`; `rwm` when the plugin says nothing;
    /// empty for a node the task may see but not open (CDI's `none`).
    pub permissions: String,
}

/// What a task gets for its devices: environment, mounts and device nodes, merged from the
/// plugins' answers (Nomad's `ContainerReservation`, Kubernetes' `ContainerAllocateResponse`)
/// and the CDI specs of the CDI devices named in them. Persisted with the alloc, so a task
/// restarted after an agent restart gets the same ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerEdits {
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host paths to mount.
    #[serde(default)]
    pub mounts: Vec<DeviceMount>,
    /// Device nodes.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Fully qualified CDI device names (`vendor.com/class=name`) still to resolve from the
    /// CDI spec directories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

impl ContainerEdits {
    /// Adds `other` to these edits: its env wins on the same key; mounts and device nodes are
    /// appended, skipping exact duplicates; CDI names likewise.
    pub fn merge(&mut self, other: ContainerEdits) {
        self.env.extend(other.env);
        for m in other.mounts {
            if !self.mounts.contains(&m) {
                self.mounts.push(m);
            }
        }
        for d in other.device_nodes {
            if !self.device_nodes.contains(&d) {
                self.device_nodes.push(d);
            }
        }
        for c in other.cdi_devices {
            if !self.cdi_devices.contains(&c) {
                self.cdi_devices.push(c);
            }
        }
    }

    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.mounts.is_empty()
            && self.device_nodes.is_empty()
            && self.cdi_devices.is_empty()
    }

    /// Whether a task can be given these edits, whoever made them (a plugin's answer, a CDI
    /// spec): env names non-empty without `=` or NUL, env values without NUL; the host and
    /// task paths of every mount and device node absolute, without NUL and without `..`;
    /// device node permissions only `r`, `w` and `m`, each at most once. The error names the
    /// first entry found wrong and quotes its value (escaped and cut), e.g.
    /// `mount 0: task_path "x" is not an absolute path`. CDI names are not looked at.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(format!(
                    "env name {} must be non-empty, without '=' or NUL",
                    Quoted(name)
                ));
            }
            if value.contains('\0') {
                return Err(format!("env {}: the value holds a NUL byte", Quoted(name)));
            }
        }
        for (i, m) in self.mounts.iter().enumerate() {
            check_path(&m.host_path).map_err(|e| format!("mount {i}: host_path {e}"))?;
            check_path(&m.task_path).map_err(|e| format!("mount {i}: task_path {e}"))?;
        }
        for (i, d) in self.device_nodes.iter().enumerate() {
            check_path(&d.host_path).map_err(|e| format!("device {i}: host_path {e}"))?;
            check_path(&d.task_path).map_err(|e| format!("device {i}: task_path {e}"))?;
            let mut seen = [false; 3];
            for c in d.permissions.chars() {
                let slot = match c {
                    'r' => 0,
                    'w' => 1,
                    'm' => 2,
                    _ => usize::MAX,
                };
                if slot == usize::MAX || std::mem::replace(&mut seen[slot], true) {
                    return Err(format!(
                        "device {i}: permissions {} may only hold r, w and m, each at most once",
                        Quoted(&d.permissions)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An absolute path without NUL and without `..`; else what is wrong, after the quoted path.
fn check_path(p: &Path) -> Result<(), String> {
    let shown = || Quoted(&p.to_string_lossy()).to_string();
    if p.as_os_str().as_bytes().contains(&0) {
        return Err(format!("{} holds a NUL byte", shown()));
    }
    if !p.is_absolute() {
        return Err(format!("{} is not an absolute path", shown()));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{} holds \"..\"", shown()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_both_and_the_later_env() {
        let node = |p: &str| DeviceNode {
            host_path: p.into(),
            task_path: p.into(),
            permissions: "rw".into(),
        };
        let mut a = ContainerEdits {
            env: BTreeMap::from([("A".into(), "1".into()), ("B".into(), "1".into())]),
            device_nodes: vec![node("/dev/x")],
            ..Default::default()
        };
        a.merge(ContainerEdits {
            env: BTreeMap::from([("B".into(), "2".into())]),
            device_nodes: vec![node("/dev/x"), node("/dev/y")],
            cdi_devices: vec!["example.com/device=dev0".into()],
            ..Default::default()
        });
        assert_eq!(a.env["A"], "1");
        assert_eq!(a.env["B"], "2");
        assert_eq!(a.device_nodes.len(), 2);
        assert_eq!(a.cdi_devices.len(), 1);
        assert!(!a.is_empty());
        assert!(ContainerEdits::default().is_empty());
    }

    #[test]
    fn edits_are_checked_naming_the_entry() {
        let good = ContainerEdits {
            env: BTreeMap::from([("A".into(), "1".into())]),
            mounts: vec![DeviceMount {
                host_path: "/h".into(),
                task_path: "/t".into(),
                read_only: true,
            }],
            device_nodes: vec![DeviceNode {
                host_path: "/dev/null".into(),
                task_path: "/dev/x".into(),
                permissions: "rw".into(),
            }],
            cdi_devices: Vec::new(),
        };
        assert_eq!(good.check(), Ok(()));
        let mut none = good.clone();
        none.device_nodes[0].permissions = String::new();
        assert_eq!(none.check(), Ok(()), "CDI's none: visible, not openable");
        assert_eq!(ContainerEdits::default().check(), Ok(()));

        type Spoil = fn(&mut ContainerEdits);
        let cases: [(Spoil, &str); 12] = [
            (
                |e| e.mounts[0].task_path = "x".into(),
                "mount 0: task_path \"x\" is not an absolute path",
            ),
            (
                |e| e.mounts[0].task_path = PathBuf::new(),
                "mount 0: task_path \"\" is not an absolute path",
            ),
            (
                |e| e.mounts[0].host_path = "/var/../etc".into(),
                "mount 0: host_path \"/var/../etc\" holds \"..\"",
            ),
            (
                |e| e.mounts[0].host_path = "/a\0b".into(),
                "mount 0: host_path \"/a\\0b\" holds a NUL byte",
            ),
            (
                |e| e.device_nodes[0].host_path = "dev/null".into(),
                "device 0: host_path \"dev/null\" is not an absolute path",
            ),
            (
                |e| e.device_nodes[0].task_path = "/dev/../x".into(),
                "device 0: task_path \"/dev/../x\" holds \"..\"",
            ),
            (
                |e| e.device_nodes[0].permissions = "rx".into(),
                "device 0: permissions \"rx\" may only hold r, w and m, each at most once",
            ),
            (
                |e| e.device_nodes[0].permissions = "rwr".into(),
                "device 0: permissions \"rwr\" may only hold r, w and m, each at most once",
            ),
            (
                |e| {
                    e.env.insert("A=B".into(), String::new());
                },
                "env name \"A=B\" must be non-empty, without '=' or NUL",
            ),
            (
                |e| {
                    e.env.insert(String::new(), String::new());
                },
                "env name \"\" must be non-empty, without '=' or NUL",
            ),
            (
                |e| {
                    e.env.insert("Z".into(), "a\0".into());
                },
                "env \"Z\": the value holds a NUL byte",
            ),
            (
                |e| e.mounts[0].task_path = "/t\u{1b}[0m/../x".into(),
                "mount 0: task_path \"/t\\u{1b}[0m/../x\" holds \"..\"",
            ),
        ];
        for (spoil, want) in cases {
            let mut e = good.clone();
            spoil(&mut e);
            assert_eq!(e.check(), Err(want.to_string()));
        }
    }

    #[test]
    fn stats_print_as_nomad_does() {
        let v = StatValue {
            int_numerator: Some(3),
            int_denominator: Some(8),
            unit: "GiB".into(),
            ..Default::default()
        };
        assert_eq!(v.to_string(), "3 / 8 GiB");
        assert_eq!(v.number(), Some(3.0));
        assert_eq!(StatValue::default().to_string(), "");
    }
}
