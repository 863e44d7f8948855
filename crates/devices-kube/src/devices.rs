//! A `ListAndWatch` message as berth's device model: one group per resource, one instance per
//! device. What the plugin sends is data, passed on as it is (as Nomad's conversion does), so
//! that the device manager checks it, bounds it and reports what it drops (empty, duplicate,
//! too long or unprintable ids; too many devices; overlong health text) where operators see
//! it. Only the NUMA nodes of one device, which the manager does not look at, are bounded here.

use std::collections::{BTreeMap, BTreeSet};

use berth_devices::{
    attribute::Attribute,
    model::{DeviceGroup, DeviceInstance, Locality},
};

use crate::{
    proto::{HEALTHY, v1beta1::ListAndWatchResponse},
    validate::ResourceName,
};

/// Most NUMA nodes kept per device.
const MAX_NUMA_NODES: usize = 64;

/// The group attribute listing the NUMA nodes of the group's instances (`0,1`).
pub const NUMA_ATTRIBUTE: &str = "numa_nodes";

/// The group `resource`'s plugin reports in `msg`: vendor = the resource's domain, type and
/// name = the part after `/`. Instances keep the plugin's order, their ids as sent and, when
/// unhealthy, the plugin's health string as their health description (the manager validates
/// and bounds both).
pub(crate) fn group(resource: &ResourceName, msg: ListAndWatchResponse) -> DeviceGroup {
    let mut instances = Vec::with_capacity(msg.devices.len());
    let mut numa_all = BTreeSet::new();
    for device in msg.devices {
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
                device.health
            },
            locality: (!numa.is_empty()).then(|| Locality {
                pci_bus_id: String::new(),
                numa_nodes: numa.into_iter().collect(),
            }),
        });
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
        let g = group(
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
        // Health text too, as sent: the manager bounds it.
        assert_eq!(g.instances[2].health_description, "melting\n");
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
            &resource,
            ListAndWatchResponse {
                devices: vec![device("w-0", "Healthy", &[])],
            },
        );
        assert!(g.attributes.is_empty());
        let empty = group(&resource, ListAndWatchResponse::default());
        assert!(empty.instances.is_empty());
    }
}
