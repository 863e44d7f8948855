//! Which devices the plugin prefers: those asked for first, then devices on the same NUMA node
//! (the node of the first required device, or the one with the most devices available), lowest
//! ids first.

use std::collections::BTreeMap;

use crate::state::natural;

/// `size` ids out of `available`, starting with `must_include`. The caller checked that the
/// request makes sense.
pub fn prefer(
    available: &[String],
    must_include: &[String],
    size: usize,
    numa_of: impl Fn(&str) -> Option<i64>,
) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for id in must_include {
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    let mut rest: Vec<&String> = available.iter().filter(|id| !chosen.contains(id)).collect();
    rest.sort_by(|a, b| natural(a, b));
    rest.dedup();
    let node = match must_include.first() {
        Some(first) => numa_of(first),
        None => {
            let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
            for id in &rest {
                if let Some(n) = numa_of(id) {
                    *counts.entry(n).or_default() += 1;
                }
            }
            // The most devices; the lowest node among equals.
            counts
                .into_iter()
                .max_by(|(na, ca), (nb, cb)| ca.cmp(cb).then(nb.cmp(na)))
                .map(|(n, _)| n)
        }
    };
    // Stable: ids stay in natural order within each side.
    rest.sort_by_key(|id| node.is_some() && numa_of(id) != node);
    let missing = size.saturating_sub(chosen.len());
    chosen.extend(rest.into_iter().take(missing).cloned());
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    fn numa(id: &str) -> Option<i64> {
        id.rsplit('-').next()?.parse::<i64>().ok().map(|n| n % 2)
    }

    #[test]
    fn same_node_lowest_ids() {
        let avail = ids(&["w-0", "w-1", "w-2", "w-3", "w-4"]);
        // w-0, w-2, w-4 are on node 0 (the most devices).
        assert_eq!(prefer(&avail, &[], 2, numa), ids(&["w-0", "w-2"]));
        // Including w-3 (node 1) pulls node 1's devices first.
        assert_eq!(
            prefer(&avail, &ids(&["w-3"]), 2, numa),
            ids(&["w-3", "w-1"])
        );
        assert_eq!(
            prefer(&avail, &ids(&["w-3"]), 3, numa),
            ids(&["w-3", "w-1", "w-0"])
        );
        // Without topology: lowest ids.
        let avail = ids(&["w-10", "w-2", "w-1"]);
        assert_eq!(prefer(&avail, &[], 2, |_| None), ids(&["w-1", "w-2"]));
    }
}
