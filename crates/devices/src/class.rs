//! The node's computed class (Nomad's `ComputedClass`): a hash over what makes nodes
//! interchangeable for placement — datacenter, node class, node pool, attributes and meta
//! (keys under `unique.` left out), and the device groups' vendor, type, name and attributes
//! (`unique.` attributes left out; instances, their health and statistics never count). Two
//! nodes with the same class are equally feasible for any job; a node's class stays the same
//! across agent restarts and device health changes.

use std::collections::BTreeMap;

use crate::{attribute::AttrValue, model::DeviceGroup};

/// What the computed class is made of.
#[derive(Debug, Clone, Copy)]
pub struct ClassInput<'a> {
    /// `datacenter`.
    pub datacenter: &'a str,
    /// `node_class` (empty: none).
    pub node_class: &'a str,
    /// The node pool (`default`).
    pub node_pool: &'a str,
    /// Node attributes (`attr.*`).
    pub attributes: &'a BTreeMap<String, String>,
    /// Node meta (`meta.*`).
    pub meta: &'a BTreeMap<String, String>,
    /// The device groups.
    pub devices: &'a [DeviceGroup],
}

/// Keys Nomad leaves out of the class.
const UNIQUE: &str = "unique.";

/// A 64-bit FNV-1a hash fed with length-prefixed fields, so that no two different inputs
/// are written the same way.
struct Hasher(u64);

impl Hasher {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, b: &[u8]) {
        for byte in b {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn field(&mut self, b: &[u8]) {
        self.bytes(&(b.len() as u64).to_le_bytes());
        self.bytes(b);
    }

    fn map<'a>(&mut self, tag: &str, entries: impl Iterator<Item = (&'a str, String)>) {
        self.field(tag.as_bytes());
        let kept: Vec<(&str, String)> = entries.filter(|(k, _)| !k.starts_with(UNIQUE)).collect();
        self.bytes(&(kept.len() as u64).to_le_bytes());
        for (k, v) in kept {
            self.field(k.as_bytes());
            self.field(v.as_bytes());
        }
    }
}

/// The computed class: `v1:<decimal hash>`, as Nomad writes it.
pub fn computed_class(input: &ClassInput<'_>) -> String {
    let mut h = Hasher::new();
    h.field(input.datacenter.as_bytes());
    h.field(input.node_class.as_bytes());
    h.field(input.node_pool.as_bytes());
    h.map(
        "attributes",
        input
            .attributes
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone())),
    );
    h.map(
        "meta",
        input.meta.iter().map(|(k, v)| (k.as_str(), v.clone())),
    );
    // In a stable order, whatever order plugins report in; a group reported by two plugins
    // counts once.
    let mut groups: Vec<(String, String, String, BTreeMap<&str, String>)> = input
        .devices
        .iter()
        .map(|g| {
            let attrs = g
                .attributes
                .iter()
                .map(|(k, a)| {
                    let value = match &a.value {
                        AttrValue::Float(x) => format!("f:{x}"),
                        AttrValue::Int(x) => format!("i:{x}"),
                        AttrValue::String(s) => format!("s:{s}"),
                        AttrValue::Bool(b) => format!("b:{b}"),
                    };
                    (k.as_str(), format!("{value}|{}", a.unit))
                })
                .collect();
            (
                g.vendor.clone(),
                g.device_type.clone(),
                g.name.clone(),
                attrs,
            )
        })
        .collect();
    groups.sort();
    groups.dedup();
    h.field(b"devices");
    h.bytes(&(groups.len() as u64).to_le_bytes());
    for (vendor, device_type, name, attrs) in groups {
        h.field(vendor.as_bytes());
        h.field(device_type.as_bytes());
        h.field(name.as_bytes());
        h.map("attributes", attrs.into_iter());
    }
    format!("v1:{}", h.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attribute::Attribute, model::DeviceInstance};

    fn group(name: &str, healthy: bool, memory: i64) -> DeviceGroup {
        DeviceGroup {
            vendor: "nvidia".into(),
            device_type: "gpu".into(),
            name: name.into(),
            attributes: BTreeMap::from([
                ("memory".into(), Attribute::int(memory, "GiB")),
                ("unique.serial".into(), Attribute::string(name)),
            ]),
            instances: vec![DeviceInstance {
                id: format!("{name}-0"),
                healthy,
                health_description: String::new(),
                locality: None,
            }],
        }
    }

    fn class(attrs: &BTreeMap<String, String>, devices: &[DeviceGroup]) -> String {
        computed_class(&ClassInput {
            datacenter: "dc1",
            node_class: "",
            node_pool: "default",
            attributes: attrs,
            meta: &BTreeMap::new(),
            devices,
        })
    }

    #[test]
    fn health_instances_order_and_unique_keys_do_not_count() {
        let attrs = BTreeMap::from([
            ("kernel.name".to_string(), "linux".to_string()),
            ("unique.hostname".to_string(), "a".to_string()),
        ]);
        let base = class(&attrs, &[group("k80", true, 12), group("t4", true, 16)]);
        assert!(base.starts_with("v1:"), "{base}");
        // Health, instance ids, order and unique.* keys leave it alone.
        let mut sick = vec![group("t4", false, 16), group("k80", false, 12)];
        sick[0].instances[0].id = "other".into();
        sick[0]
            .attributes
            .insert("unique.serial".into(), Attribute::string("zz"));
        let mut other_host = attrs.clone();
        other_host.insert("unique.hostname".into(), "b".into());
        assert_eq!(class(&other_host, &sick), base);
        // What matters changes it.
        assert_ne!(class(&attrs, &[group("k80", true, 12)]), base);
        assert_ne!(
            class(&attrs, &[group("k80", true, 24), group("t4", true, 16)]),
            base
        );
        let mut kernel = attrs.clone();
        kernel.insert("kernel.name".into(), "freebsd".into());
        assert_ne!(
            class(&kernel, &[group("k80", true, 12), group("t4", true, 16)]),
            base
        );
        // Deterministic: a fixed input gives this value in every run and build (a change of
        // the hash is a change of every node's class, and must be deliberate).
        assert_eq!(
            class(&BTreeMap::new(), &[group("k80", true, 12)]),
            "v1:5239753518404078482"
        );
    }
}
