//! Between Nomad's device messages and berth's device model: device groups (with their
//! attributes and locality), statistics, and what `Reserve` answers (container edits).
//! Conversions are faithful: checking what the plugin reports (empty ids, empty vendors) is
//! the manager's job. The one thing the model cannot hold, an attribute without a value, is
//! left out with a warning.

use std::collections::BTreeMap;

use berth_devices::{
    attribute::{AttrValue, Attribute},
    model::{
        ContainerEdits, DeviceGroup, DeviceGroupId, DeviceInstance, DeviceMount, DeviceNode,
        GroupStats, InstanceStats, Locality, StatObject, StatValue,
    },
    plugin::{PluginError, PluginId},
};

use crate::proto::{device as pb, structs};

/// A `Fingerprint` message as the plugin's whole device list.
pub fn device_groups(plugin: &str, resp: pb::FingerprintResponse) -> Vec<DeviceGroup> {
    resp.device_group
        .into_iter()
        .map(|g| {
            let mut attributes = BTreeMap::new();
            for (key, a) in g.attributes {
                match attribute(&a) {
                    Some(a) => {
                        attributes.insert(key, a);
                    }
                    None => tracing::warn!(
                        plugin,
                        group = %format!("{}/{}/{}", g.vendor, g.device_type, g.device_name),
                        attribute = %key,
                        "the plugin sent an attribute without a value; it is left out"
                    ),
                }
            }
            DeviceGroup {
                vendor: g.vendor,
                device_type: g.device_type,
                name: g.device_name,
                attributes,
                instances: g
                    .devices
                    .into_iter()
                    .map(|d| DeviceInstance {
                        id: d.id,
                        healthy: d.healthy,
                        health_description: d.health_description,
                        locality: d.hw_locality.filter(|l| !l.pci_bus_id.is_empty()).map(|l| {
                            Locality {
                                pci_bus_id: l.pci_bus_id,
                                numa_nodes: Vec::new(),
                            }
                        }),
                    })
                    .collect(),
            }
        })
        .collect()
}

/// A proto attribute in the model; `None` when it carries no value.
pub fn attribute(a: &structs::Attribute) -> Option<Attribute> {
    use structs::attribute::Value;
    let value = match a.value.as_ref()? {
        Value::FloatVal(x) => AttrValue::Float(*x),
        Value::IntVal(i) => AttrValue::Int(*i),
        Value::StringVal(s) => AttrValue::String(s.clone()),
        Value::BoolVal(b) => AttrValue::Bool(*b),
    };
    Some(Attribute {
        value,
        unit: a.unit.clone(),
    })
}

/// A model attribute as the proto one.
pub fn attribute_to_proto(a: &Attribute) -> structs::Attribute {
    use structs::attribute::Value;
    structs::Attribute {
        value: Some(match &a.value {
            AttrValue::Float(x) => Value::FloatVal(*x),
            AttrValue::Int(i) => Value::IntVal(*i),
            AttrValue::String(s) => Value::StringVal(s.clone()),
            AttrValue::Bool(b) => Value::BoolVal(*b),
        }),
        unit: a.unit.clone(),
    }
}

/// A `Stats` message in the model.
pub fn group_stats(resp: pb::StatsResponse) -> Vec<GroupStats> {
    resp.groups
        .into_iter()
        .map(|g| GroupStats {
            group: DeviceGroupId {
                vendor: g.vendor,
                device_type: g.r#type,
                name: g.name,
            },
            instances: g
                .instance_stats
                .into_iter()
                .map(|(id, s)| {
                    let stats = InstanceStats {
                        summary: s.summary.map(stat_value),
                        stats: s.stats.map(stat_object),
                        timestamp_ms: s.timestamp.map_or(0, |t| timestamp_ms(&t)),
                    };
                    (id, stats)
                })
                .collect(),
        })
        .collect()
}

fn stat_value(v: structs::StatValue) -> StatValue {
    StatValue {
        float_numerator: v.float_numerator_val,
        float_denominator: v.float_denominator_val,
        int_numerator: v.int_numerator_val,
        int_denominator: v.int_denominator_val,
        string: v.string_val,
        bool: v.bool_val,
        unit: v.unit,
        desc: v.desc,
    }
}

fn stat_object(o: structs::StatObject) -> StatObject {
    StatObject {
        nested: o
            .nested
            .into_iter()
            .map(|(k, v)| (k, stat_object(v)))
            .collect(),
        attributes: o
            .attributes
            .into_iter()
            .map(|(k, v)| (k, stat_value(v)))
            .collect(),
    }
}

/// Milliseconds since the epoch (0 before it).
fn timestamp_ms(t: &prost_types::Timestamp) -> u64 {
    let secs = u64::try_from(t.seconds).unwrap_or(0);
    let millis = u64::try_from(t.nanos).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis)
}

/// A `Reserve` answer as container edits, checked as every plugin's edits are
/// ([`ContainerEdits::check`]: absolute paths without `..`, valid env names, permissions of
/// `r`, `w`, `m`); empty permissions mean `rwm`. Anything wrong breaks the protocol
/// ([`PluginError::BadAnswer`]).
pub fn container_edits(
    plugin: &PluginId,
    resp: pb::ReserveResponse,
) -> Result<ContainerEdits, PluginError> {
    let Some(res) = resp.container_res else {
        return Ok(ContainerEdits::default());
    };
    let edits = ContainerEdits {
        env: res.envs.into_iter().collect(),
        mounts: res
            .mounts
            .into_iter()
            .map(|m| DeviceMount {
                host_path: m.host_path.into(),
                task_path: m.task_path.into(),
                read_only: m.read_only,
            })
            .collect(),
        device_nodes: res
            .devices
            .into_iter()
            .map(|d| DeviceNode {
                host_path: d.host_path.into(),
                task_path: d.task_path.into(),
                permissions: if d.permissions.is_empty() {
                    "rwm".to_string()
                } else {
                    d.permissions
                },
            })
            .collect(),
        cdi_devices: Vec::new(),
    };
    edits.check().map_err(|reason| PluginError::BadAnswer {
        plugin: plugin.clone(),
        call: "Reserve".to_string(),
        reason,
    })?;
    Ok(edits)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn fingerprints_convert_faithfully() {
        let resp = pb::FingerprintResponse {
            device_group: vec![pb::DeviceGroup {
                vendor: String::new(),
                device_type: "gpu".into(),
                device_name: "K80".into(),
                devices: vec![
                    pb::DetectedDevice {
                        id: "a".into(),
                        healthy: true,
                        health_description: String::new(),
                        hw_locality: Some(pb::DeviceLocality {
                            pci_bus_id: "0000:03:00.0".into(),
                        }),
                    },
                    pb::DetectedDevice {
                        id: String::new(),
                        healthy: false,
                        health_description: "hot".into(),
                        hw_locality: Some(pb::DeviceLocality::default()),
                    },
                ],
                attributes: HashMap::from([
                    (
                        "memory".to_string(),
                        attribute_to_proto(&Attribute::int(4, "GiB")),
                    ),
                    ("none".to_string(), structs::Attribute::default()),
                ]),
            }],
        };
        let groups = device_groups("p", resp);
        assert_eq!(groups.len(), 1);
        let g = &groups[0];
        assert_eq!(g.vendor, "", "kept as sent: validation is the manager's");
        assert_eq!(g.attributes["memory"], Attribute::int(4, "GiB"));
        assert!(!g.attributes.contains_key("none"));
        assert_eq!(
            g.instances[0].locality.as_ref().unwrap().pci_bus_id,
            "0000:03:00.0"
        );
        assert_eq!(g.instances[1].id, "");
        assert!(!g.instances[1].healthy);
        assert_eq!(g.instances[1].locality, None);
        for a in [
            Attribute::float(1.5, "GHz"),
            Attribute::string("x"),
            Attribute::bool(true),
        ] {
            assert_eq!(attribute(&attribute_to_proto(&a)), Some(a));
        }
    }

    #[test]
    fn stats_convert() {
        let resp = pb::StatsResponse {
            groups: vec![pb::DeviceGroupStats {
                vendor: "v".into(),
                r#type: "t".into(),
                name: "n".into(),
                instance_stats: HashMap::from([(
                    "a".to_string(),
                    pb::DeviceStats {
                        summary: Some(structs::StatValue {
                            int_numerator_val: Some(3),
                            unit: "bytes".into(),
                            ..Default::default()
                        }),
                        stats: Some(structs::StatObject {
                            nested: HashMap::from([(
                                "x".to_string(),
                                structs::StatObject::default(),
                            )]),
                            attributes: HashMap::from([(
                                "mode".to_string(),
                                structs::StatValue {
                                    string_val: Some("-rw-r--r--".into()),
                                    ..Default::default()
                                },
                            )]),
                        }),
                        timestamp: Some(prost_types::Timestamp {
                            seconds: 2,
                            nanos: 5_000_000,
                        }),
                    },
                )]),
            }],
        };
        let stats = group_stats(resp);
        assert_eq!(stats[0].group.to_string(), "v/t/n");
        let a = &stats[0].instances["a"];
        assert_eq!(a.summary.as_ref().unwrap().to_string(), "3 bytes");
        assert_eq!(a.timestamp_ms, 2005);
        let s = a.stats.as_ref().unwrap();
        assert!(s.nested.contains_key("x"));
        assert_eq!(s.attributes["mode"].string.as_deref(), Some("-rw-r--r--"));
    }

    #[test]
    fn reservations_become_edits_and_bad_paths_are_refused() {
        let id = PluginId::nomad("p");
        let res = |mounts: Vec<pb::Mount>, devices: Vec<pb::DeviceSpec>| pb::ReserveResponse {
            container_res: Some(pb::ContainerReservation {
                envs: HashMap::from([("A".to_string(), "1".to_string())]),
                mounts,
                devices,
            }),
        };
        let edits = container_edits(
            &id,
            res(
                vec![pb::Mount {
                    task_path: "/t".into(),
                    host_path: "/h".into(),
                    read_only: true,
                }],
                vec![pb::DeviceSpec {
                    task_path: "/dev/x".into(),
                    host_path: "/dev/null".into(),
                    permissions: String::new(),
                }],
            ),
        )
        .unwrap();
        assert_eq!(edits.env["A"], "1");
        assert!(edits.mounts[0].read_only);
        assert_eq!(edits.device_nodes[0].permissions, "rwm");
        assert_eq!(
            container_edits(&id, pb::ReserveResponse::default()).unwrap(),
            ContainerEdits::default()
        );
        let err = container_edits(
            &id,
            res(
                vec![pb::Mount {
                    task_path: String::new(),
                    host_path: "/h".into(),
                    read_only: false,
                }],
                vec![],
            ),
        )
        .unwrap_err();
        assert!(
            matches!(&err, PluginError::BadAnswer { reason, .. } if reason == "mount 0: task_path \"\" is not an absolute path"),
            "{err}"
        );
        // Device nodes are checked as every converter's answer is (`ContainerEdits::check`).
        for (task_path, host_path, permissions, want) in [
            ("/dev/../etc/x", "/dev/null", "rw", "holds \"..\""),
            (
                "/dev/x",
                "dev/null",
                "rw",
                "device 0: host_path \"dev/null\"",
            ),
            ("/dev/x", "/dev/null", "rx", "permissions \"rx\""),
        ] {
            let spec = pb::DeviceSpec {
                task_path: task_path.into(),
                host_path: host_path.into(),
                permissions: permissions.into(),
            };
            let err = container_edits(&id, res(vec![], vec![spec])).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }
}
