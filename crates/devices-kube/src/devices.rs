//! A `ListAndWatch` message as berth's device model: one group per resource, one instance per
//! device. What the plugin sends is data: ids are passed on as they are, so that the device
//! manager checks them and reports what it drops (empty, duplicate, too long, unprintable)
//! where operators see it; the number of devices and NUMA nodes kept is bounded here, and
//! health text is escaped and cut.

use std::collections::{BTreeMap, BTreeSet};

use berth_devices::{
    attribute::Attribute,
    model::{DeviceGroup, DeviceInstance, Locality},
    plugin::PluginId,
};

use crate::{
    proto::{HEALTHY, v1beta1::ListAndWatchResponse},
    text::{MAX_HEALTH, escape_cut},
    validate::ResourceName,
};

/// Most devices kept from one message; the rest are dropped.
pub(crate) const MAX_DEVICES: usize = 16_384;

/// Most NUMA nodes kept per device.
const MAX_NUMA_NODES: usize = 64;

/// The group attribute listing the NUMA nodes of the group's instances (`0,1`).
pub const NUMA_ATTRIBUTE: &str = "numa_nodes";

/// The group `resource`'s plugin reports in `msg`: vendor = the resource's domain, type and
/// name = the part after `/`. Instances keep the plugin's order and their ids as sent (the
/// manager validates them); devices beyond [`MAX_DEVICES`] are dropped.
pub(crate) fn group(
    plugin: &PluginId,
    resource: &ResourceName,
    msg: ListAndWatchResponse,
) -> DeviceGroup {
    let mut dropped: Vec<String> = Vec::new();
    let mut instances = Vec::new();
    let mut numa_all = BTreeSet::new();
    let total = msg.devices.len();
    for (i, device) in msg.devices.into_iter().enumerate() {
        if i >= MAX_DEVICES {
            dropped.push(format!(
                "{} devices beyond the first {MAX_DEVICES}",
                total - i
            ));
            break;
        }
        let numa: BTreeSet<i64> = device
            .topology
            .iter()
            .flat_map(|t| t.nodes.iter().map(|n| n.id))
            .take(MAX_NUMA_NODES)
            .collect();
        numa_all.extend(numa.iter().copied());
        let healthy = device.health == HEALTHY;
        instances.push(DeviceInstance {
            id: device.id,
            healthy,
            health_description: if healthy {
                String::new()
            } else if device.health.is_empty() {
                "no health reported".into()
            } else {
                escape_cut(&device.health, MAX_HEALTH)
            },
            locality: (!numa.is_empty()).then(|| Locality {
                pci_bus_id: String::new(),
                numa_nodes: numa.into_iter().collect(),
            }),
        });
    }
    if !dropped.is_empty() {
        tracing::warn!(
            plugin = %plugin,
            dropped = %dropped.join("; "),
            "ignoring devices the plugin listed that cannot be used"
        );
    }
    let mut attributes = BTreeMap::new();
    if !numa_all.is_empty() {
        let list: Vec<String> = numa_all.iter().map(i64::to_string).collect();
        attributes.insert(
            NUMA_ATTRIBUTE.to_string(),
            Attribute::string(list.join(",")),
        );
    }
    DeviceGroup {
        vendor: resource.domain().to_string(),
        device_type: resource.kind().to_string(),
        name: resource.kind().to_string(),
        attributes,
        instances,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::v1beta1::{Device, NumaNode, TopologyInfo};

    fn device(id: &str, health: &str, numa: &[i64]) -> Device {
        Device {
            id: id.into(),
            health: health.into(),
            topology: (!numa.is_empty()).then(|| TopologyInfo {
                nodes: numa.iter().map(|&id| NumaNode { id }).collect(),
            }),
        }
    }

    #[test]
    fn maps_resource_health_and_topology() {
        let resource = ResourceName::parse("example.com/widget").expect("valid");
        let plugin = PluginId::kubernetes(resource.as_str());
        let g = group(
            &plugin,
            &resource,
            ListAndWatchResponse {
                devices: vec![
                    device("w-0", "Healthy", &[1]),
                    device("w-1", "Unhealthy", &[0, 1, 0]),
                    device("w-2", "melting\n", &[]),
                    device("", "Healthy", &[]),
                    device("w-0", "Healthy", &[]),
                    device("bad\u{1b}", "Healthy", &[]),
                    device(&"x".repeat(300), "Healthy", &[]),
                ],
            },
        );
        assert_eq!(
            (g.vendor.as_str(), g.device_type.as_str(), g.name.as_str()),
            ("example.com", "widget", "widget")
        );
        // Ids go to the manager as sent: it drops and reports the bad ones.
        let ids: Vec<&str> = g.instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids.len(), 7);
        assert_eq!(&ids[..5], ["w-0", "w-1", "w-2", "", "w-0"]);
        assert!(g.instances[0].healthy);
        assert!(!g.instances[1].healthy);
        assert_eq!(g.instances[1].health_description, "Unhealthy");
        assert_eq!(g.instances[2].health_description, "melting\\n");
        assert_eq!(
            g.instances[1]
                .locality
                .as_ref()
                .map(|l| l.numa_nodes.clone()),
            Some(vec![0, 1])
        );
        assert_eq!(g.instances[2].locality, None);
        assert_eq!(g.attributes[NUMA_ATTRIBUTE], Attribute::string("0,1"));
    }

    #[test]
    fn no_topology_no_attribute() {
        let resource = ResourceName::parse("example.com/widget").expect("valid");
        let g = group(
            &PluginId::kubernetes(resource.as_str()),
            &resource,
            ListAndWatchResponse {
                devices: vec![device("w-0", "Healthy", &[])],
            },
        );
        assert!(g.attributes.is_empty());
        let empty = group(
            &PluginId::kubernetes(resource.as_str()),
            &resource,
            ListAndWatchResponse::default(),
        );
        assert!(empty.instances.is_empty());
    }
}
