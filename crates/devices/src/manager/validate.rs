//! Checks a plugin's device list before the manager keeps it: whatever a plugin sends is
//! data, possibly broken. An invalid group or instance is dropped with a reason; the rest is
//! kept.

use std::collections::BTreeSet;

use berth_input::Quoted;

use crate::model::DeviceGroup;

/// Longest vendor, type, name, instance id or attribute key kept.
pub const MAX_NAME_BYTES: usize = 256;
/// Most instances one group may have.
pub const MAX_INSTANCES: usize = 4096;
/// Most groups one plugin may report.
pub const MAX_GROUPS: usize = 256;

fn bad_text(what: &str, s: &str) -> Option<String> {
    if s.is_empty() {
        Some(format!("empty {what}"))
    } else if s.len() > MAX_NAME_BYTES {
        Some(format!("{what} longer than {MAX_NAME_BYTES} bytes"))
    } else if s.chars().any(berth_sys::is_unprintable) {
        Some(format!("{what} {} holds control characters", Quoted(s)))
    } else {
        None
    }
}

/// The groups of `groups` that are valid, with the invalid instances dropped, and a line per
/// problem found. Valid means: vendor, type and name non-empty, printable and at most
/// [`MAX_NAME_BYTES`], no `/` in vendor and type (they are separated by `/` in requests);
/// instance ids non-empty, printable, bounded and unique in the group; attribute keys
/// likewise; a vendor/type/name reported once per plugin.
pub fn validate(groups: Vec<DeviceGroup>) -> (Vec<DeviceGroup>, Vec<String>) {
    let mut problems = Vec::new();
    let mut kept: Vec<DeviceGroup> = Vec::new();
    let total = groups.len();
    for (i, mut g) in groups.into_iter().enumerate() {
        if i >= MAX_GROUPS {
            problems.push(format!(
                "{} groups sent, more than {MAX_GROUPS}: the rest dropped",
                total
            ));
            break;
        }
        let at = format!(
            "group {i} ({}/{}/{})",
            Quoted(&g.vendor),
            Quoted(&g.device_type),
            Quoted(&g.name)
        );
        let mut group_problem = None;
        for (what, value) in [
            ("vendor", &g.vendor),
            ("type", &g.device_type),
            ("name", &g.name),
        ] {
            if let Some(p) = bad_text(what, value) {
                group_problem = Some(p);
                break;
            }
            if what != "name" && value.contains('/') {
                group_problem = Some(format!("{what} {} holds a '/'", Quoted(value)));
                break;
            }
        }
        if group_problem.is_none() {
            group_problem = g
                .attributes
                .keys()
                .find_map(|k| bad_text("attribute name", k));
        }
        if group_problem.is_none()
            && kept
                .iter()
                .any(|k| k.vendor == g.vendor && k.device_type == g.device_type && k.name == g.name)
        {
            group_problem = Some("reported twice".into());
        }
        if let Some(p) = group_problem {
            problems.push(format!("{at}: {p}; group dropped"));
            continue;
        }
        if g.instances.len() > MAX_INSTANCES {
            problems.push(format!(
                "{at}: {} instances, more than {MAX_INSTANCES}: the rest dropped",
                g.instances.len()
            ));
            g.instances.truncate(MAX_INSTANCES);
        }
        let mut seen = BTreeSet::new();
        let mut instances = Vec::with_capacity(g.instances.len());
        for (j, mut inst) in std::mem::take(&mut g.instances).into_iter().enumerate() {
            if let Some(p) = bad_text("instance id", &inst.id) {
                problems.push(format!("{at}: instance {j}: {p}; instance dropped"));
                continue;
            }
            if !seen.insert(inst.id.clone()) {
                problems.push(format!(
                    "{at}: instance {}: id reported twice; the second dropped",
                    Quoted(&inst.id)
                ));
                continue;
            }
            // The plugin's words are shown in status and events: escaped and cut there, but
            // never unbounded here.
            if inst.health_description.len() > 1024 {
                let mut cut = 1024;
                while !inst.health_description.is_char_boundary(cut) {
                    cut -= 1;
                }
                inst.health_description.truncate(cut);
            }
            instances.push(inst);
        }
        g.instances = instances;
        kept.push(g);
    }
    (kept, problems)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::DeviceInstance;

    fn inst(id: &str) -> DeviceInstance {
        DeviceInstance {
            id: id.into(),
            healthy: true,
            health_description: String::new(),
            locality: None,
        }
    }

    fn group(vendor: &str, ids: &[&str]) -> DeviceGroup {
        DeviceGroup {
            vendor: vendor.into(),
            device_type: "gpu".into(),
            name: "k80".into(),
            attributes: BTreeMap::new(),
            instances: ids.iter().map(|i| inst(i)).collect(),
        }
    }

    #[test]
    fn invalid_entries_are_dropped_with_reasons() {
        let (kept, problems) = validate(vec![
            group("", &["a"]),
            group("nvidia", &["a", "", "a", "b"]),
            group("nvidia", &["c"]),
            group("amd/x", &["d"]),
            group("bad\u{1b}", &["e"]),
        ]);
        assert_eq!(kept.len(), 1, "{kept:?}");
        let ids: Vec<&str> = kept[0].instances.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        let all = problems.join("\n");
        assert!(
            all.contains("group 0 (\"\"/\"gpu\"/\"k80\"): empty vendor; group dropped"),
            "{all}"
        );
        assert!(
            all.contains("instance 1: empty instance id; instance dropped"),
            "{all}"
        );
        assert!(all.contains("id reported twice"), "{all}");
        assert!(
            all.contains("group 2") && all.contains("reported twice; group dropped"),
            "{all}"
        );
        assert!(all.contains("holds a '/'"), "{all}");
        assert!(
            all.contains("control characters") && !all.contains('\u{1b}'),
            "{all}"
        );
    }

    #[test]
    fn a_valid_list_passes_unchanged() {
        let groups = vec![group("nvidia", &["a", "b"]), group("amd", &["c"])];
        let (kept, problems) = validate(groups.clone());
        assert_eq!(kept, groups);
        assert!(problems.is_empty());
        let (kept, problems) = validate(Vec::new());
        assert!(kept.is_empty() && problems.is_empty());
    }
}
