//! Where a job's allocs may run and where they prefer to: Nomad's job- and group-level
//! `constraint`, `affinity` and `spread` blocks, checked when read and kept for the fleet's
//! scheduler to evaluate against each node.
//!
//! Sides are text: a literal, or text with `${attr.<key>}`, `${meta.<key>}`,
//! `${node.unique.id}`, `${node.unique.name}`, `${node.datacenter}`, `${node.region}` or
//! `${node.class}` references, kept as written (`${…}`) for the scheduler to fill per node.

use berth_devices::request::Operand;
use serde::{Deserialize, Serialize};

/// The references a node rule may use.
pub const NODE_REFERENCES: &str = "${attr.<key>}, ${meta.<key>}, ${node.unique.id}, \
     ${node.unique.name}, ${node.datacenter}, ${node.region} or ${node.class}";

/// Nomad's default priority.
pub const DEFAULT_PRIORITY: u8 = 50;
/// A spread's default weight.
pub const DEFAULT_SPREAD_WEIGHT: u8 = 50;

/// One `constraint` block of a job or group: a node is eligible only when it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum NodeConstraint {
    /// `attribute operator value`.
    Attribute {
        /// The left side (non-empty).
        attribute: String,
        /// How the sides compare.
        operator: Operand,
        /// The right side; empty exactly when `operator` takes no value.
        #[serde(default)]
        value: String,
    },
    /// `operator = "distinct_hosts"` (or `distinct_hosts = true`): no two allocs of the job
    /// (of the group, for a group's constraint) on one node.
    DistinctHosts,
    /// `operator = "distinct_property"`: at most `limit` allocs (default 1) per value of
    /// `attribute`.
    DistinctProperty {
        /// The property (non-empty).
        attribute: String,
        /// Allocs per value (at least 1).
        limit: u32,
    },
}

/// One `affinity` block of a job or group: nodes where it holds are preferred (positive
/// weight) or avoided (negative).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeAffinity {
    /// The left side (non-empty).
    pub attribute: String,
    /// How the sides compare (never `is_set` or `is_not_set`).
    pub operator: Operand,
    /// The right side (non-empty).
    pub value: String,
    /// -100 to 100, not 0; 50 when not given.
    pub weight: i8,
}

/// One `spread` block of a job or group: allocs are spread over the values of `attribute`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spread {
    /// The property (non-empty), e.g. `${node.datacenter}`.
    pub attribute: String,
    /// 1 to 100; 50 when not given.
    pub weight: u8,
    /// `target "<value>" { percent = n }` blocks; percents add up to at most 100. Without
    /// targets, allocs spread evenly over the values seen.
    #[serde(default)]
    pub targets: Vec<SpreadTarget>,
}

/// A spread's share for one value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpreadTarget {
    /// The value (the block's label).
    pub value: String,
    /// Percent of the allocs, 0 to 100.
    pub percent: u8,
}

/// The placement rules of a job or of a group (a group's apply on top of its job's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rules {
    /// `constraint` blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<NodeConstraint>,
    /// `affinity` blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinities: Vec<NodeAffinity>,
    /// `spread` blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spreads: Vec<Spread>,
}

impl Rules {
    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty() && self.affinities.is_empty() && self.spreads.is_empty()
    }
}

/// Whether a node rule may use `${name}`: one of [`NODE_REFERENCES`] (`attr.` and `meta.` with a
/// non-empty key).
pub fn is_node_reference(name: &str) -> bool {
    match name {
        "node.unique.id" | "node.unique.name" | "node.datacenter" | "node.region"
        | "node.class" => true,
        _ => name
            .strip_prefix("attr.")
            .or_else(|| name.strip_prefix("meta."))
            .is_some_and(|key| !key.is_empty()),
    }
}

/// The names of the `${…}` references in a side, in order (`${meta.rack}` gives `meta.rack`);
/// an error for a `${` without its `}`.
pub fn side_references(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("has a ${ without its closing }".into());
        };
        out.push(&after[..end]);
        rest = &after[end + 1..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        for ok in [
            "attr.kernel.name",
            "meta.rack",
            "node.unique.id",
            "node.unique.name",
            "node.datacenter",
            "node.region",
            "node.class",
        ] {
            assert!(is_node_reference(ok), "{ok}");
        }
        for bad in [
            "attr.",
            "meta.",
            "node.id",
            "NOMAD_ALLOC_ID",
            "device.model",
            "",
        ] {
            assert!(!is_node_reference(bad), "{bad}");
        }
        assert_eq!(
            side_references("${attr.a}-x-${meta.b}").unwrap(),
            ["attr.a", "meta.b"]
        );
        assert!(side_references("plain").unwrap().is_empty());
        assert!(side_references("x ${meta.b").is_err());
    }
}
