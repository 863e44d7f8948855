//! CDI spec versions: which ones berth reads, and which one the fields of a spec need.

use super::spec::{CdiEdits, RawSpec};

/// The released versions of the spec format, oldest first.
const RELEASED: [&str; 10] = [
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

/// The oldest version berth (like CDI's own loader) reads: 0.1.0 and 0.2.0 predate it.
const EARLIEST: usize = 2;

/// The oldest version berth reads.
pub const OLDEST_READ: &str = RELEASED[EARLIEST];
/// The newest version berth reads.
pub const NEWEST_READ: &str = RELEASED[RELEASED.len() - 1];

/// A version's rank (higher is newer), or `None` for one berth does not read. A leading `v`
/// is allowed.
pub(crate) fn rank(version: &str) -> Option<usize> {
    let bare = version.strip_prefix('v').unwrap_or(version);
    RELEASED[EARLIEST..]
        .iter()
        .position(|v| *v == bare)
        .map(|i| i + EARLIEST)
}

/// The version a rank stands for.
pub(crate) fn name(rank: usize) -> &'static str {
    RELEASED.get(rank).copied().unwrap_or(NEWEST_READ)
}

/// The oldest version the fields of `spec` need, with the first field that needs it (empty
/// when nothing needs more than the oldest version).
pub(crate) fn required(spec: &RawSpec) -> (usize, String) {
    let mut need = Need {
        rank: EARLIEST,
        field: String::new(),
    };
    if !spec.annotations.is_empty() {
        need.at_least("0.6.0", "annotations");
    }
    // Dots in the class came with 0.6.0.
    if spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'))
    {
        need.at_least("0.6.0", "kind");
    }
    edits(&mut need, "containerEdits", &spec.container_edits);
    for (i, d) in spec.devices.iter().enumerate() {
        if d.name.starts_with(|c: char| c.is_ascii_digit()) {
            need.at_least("0.5.0", &format!("devices[{i}].name"));
        }
        if !d.annotations.is_empty() {
            need.at_least("0.6.0", &format!("devices[{i}].annotations"));
        }
        edits(
            &mut need,
            &format!("devices[{i}].containerEdits"),
            &d.container_edits,
        );
    }
    (need.rank, need.field)
}

struct Need {
    rank: usize,
    field: String,
}

impl Need {
    /// Raises the need to `version` because of `field`, unless it is already that high.
    fn at_least(&mut self, version: &str, field: &str) {
        let rank = RELEASED.iter().position(|v| *v == version).unwrap_or(0);
        if rank > self.rank {
            self.rank = rank;
            self.field = field.to_string();
        }
    }
}

fn edits(need: &mut Need, at: &str, e: &CdiEdits) {
    for (i, m) in e.mounts.iter().enumerate() {
        if !m.mount_type.is_empty() {
            need.at_least("0.4.0", &format!("{at}.mounts[{i}].type"));
        }
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        if !n.host_path.is_empty() {
            need.at_least("0.5.0", &format!("{at}.deviceNodes[{i}].hostPath"));
        }
    }
    if !e.additional_gids.is_empty() {
        need.at_least("0.7.0", &format!("{at}.additionalGids"));
    }
    if let Some(rdt) = &e.intel_rdt {
        need.at_least("0.7.0", &format!("{at}.intelRdt"));
        if rdt.schemata.is_some() {
            need.at_least("1.1.0", &format!("{at}.intelRdt.schemata"));
        }
        if rdt.enable_monitoring {
            need.at_least("1.1.0", &format!("{at}.intelRdt.enableMonitoring"));
        }
    }
    if !e.net_devices.is_empty() {
        need.at_least("1.1.0", &format!("{at}.netDevices"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_versions_rank_in_order() {
        assert_eq!(rank("0.3.0"), Some(2));
        assert_eq!(rank("v1.1.0"), Some(9));
        assert!(rank("1.1.0") > rank("1.0.0"));
        for unknown in ["0.1.0", "0.2.0", "1.2.0", "1.1", "", "vv1.1.0", " 1.1.0"] {
            assert_eq!(rank(unknown), None, "{unknown:?}");
        }
        assert_eq!(name(5), "0.6.0");
        assert_eq!((OLDEST_READ, NEWEST_READ), ("0.3.0", "1.1.0"));
    }
}
