//! CDI container edits turned into berth's [`ContainerEdits`], the part berth's task drivers
//! can apply, and a refusal naming the field for the rest.

use std::path::{Path, PathBuf};

use berth_input::Quoted;

use super::spec::CdiEdits;
use crate::model::{ContainerEdits, DeviceMount, DeviceNode};

/// A field berth's drivers cannot honour: its path and why.
#[derive(Debug)]
pub(crate) struct Unsupported {
    pub(crate) field: String,
    pub(crate) reason: String,
}

fn unsupported(field: String, reason: impl Into<String>) -> Unsupported {
    Unsupported {
        field,
        reason: reason.into(),
    }
}

/// Checks that berth can apply all of `e` (found at field path `at`). Nothing is applied when
/// any of it is unsupported.
pub(crate) fn check(at: &str, e: &CdiEdits) -> Result<(), Unsupported> {
    if !e.hooks.is_empty() {
        return Err(unsupported(
            format!("{at}.hooks"),
            "OCI hooks are not supported: berth's task drivers run none",
        ));
    }
    // CDI ignores a group of 0.
    if e.additional_gids.iter().any(|g| *g != 0) {
        return Err(unsupported(
            format!("{at}.additionalGids"),
            "extra groups for the task's process are not supported by berth's task drivers",
        ));
    }
    if e.intel_rdt.is_some() {
        return Err(unsupported(
            format!("{at}.intelRdt"),
            "Intel RDT settings are not supported by berth's task drivers",
        ));
    }
    if !e.net_devices.is_empty() {
        return Err(unsupported(
            format!("{at}.netDevices"),
            "moving network interfaces into a task is not supported by berth's task drivers",
        ));
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        for (field, set) in [
            ("uid", n.uid.is_some()),
            ("gid", n.gid.is_some()),
            ("fileMode", n.file_mode.is_some()),
        ] {
            if set {
                return Err(unsupported(
                    format!("{at}.deviceNodes[{i}].{field}"),
                    "berth gives a task the host's device node as it is, and cannot set its \
                     owner (uid, gid) or mode (fileMode)",
                ));
            }
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let bind_type = matches!(m.mount_type.as_str(), "" | "bind" | "none");
        let bind_option = m.options.iter().any(|o| o == "bind" || o == "rbind");
        if !bind_type && !bind_option {
            return Err(unsupported(
                format!("{at}.mounts[{i}].type"),
                format!(
                    "{} mounts are not supported: berth only bind-mounts host paths",
                    Quoted(&m.mount_type)
                ),
            ));
        }
    }
    Ok(())
}

/// Adds `e` (already [`check`]ed) to `out`. Env entries set their variable (a later one
/// wins); a device node or a mount replaces an earlier one at the same place in the task, as
/// CDI's own injection does.
pub(crate) fn apply(out: &mut ContainerEdits, e: &CdiEdits) {
    for entry in &e.env {
        if let Some((name, value)) = entry.split_once('=') {
            out.env.insert(name.to_string(), value.to_string());
        }
    }
    for n in &e.device_nodes {
        let host = if n.host_path.is_empty() {
            &n.path
        } else {
            &n.host_path
        };
        let node = DeviceNode {
            host_path: PathBuf::from(host),
            task_path: PathBuf::from(&n.path),
            permissions: permissions(&n.permissions),
        };
        match out
            .device_nodes
            .iter_mut()
            .find(|d| d.task_path == node.task_path)
        {
            Some(old) => *old = node,
            None => out.device_nodes.push(node),
        }
    }
    for m in &e.mounts {
        // The last of `ro` and `rw` decides, as mount(8) reads options.
        let read_only = m
            .options
            .iter()
            .rev()
            .find(|o| *o == "ro" || *o == "rw")
            .is_some_and(|o| o == "ro");
        let mount = DeviceMount {
            host_path: PathBuf::from(&m.host_path),
            task_path: PathBuf::from(&m.container_path),
            read_only,
        };
        match out
            .mounts
            .iter_mut()
            .find(|d| d.task_path == mount.task_path)
        {
            Some(old) => *old = mount,
            None => out.mounts.push(mount),
        }
    }
}

/// Orders mounts so a mount comes after any mount on a parent of its place (fewer path
/// components first; the order is otherwise kept).
pub(crate) fn order_mounts(out: &mut ContainerEdits) {
    out.mounts.sort_by_key(|m| depth(&m.task_path));
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// CDI's permissions in berth's form: empty is `rwm`, `none` is no access at all (the node
/// is in the task, but the device cgroup lets nothing through), anything else is its letters
/// once each, in `rwm` order.
pub(crate) fn permissions(cdi: &str) -> String {
    match cdi {
        "" => "rwm".into(),
        "none" => String::new(),
        p => ['r', 'w', 'm']
            .into_iter()
            .filter(|c| p.contains(*c))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{CdiDeviceNode, CdiMount};

    #[test]
    fn permissions_keep_cdi_meaning() {
        assert_eq!(permissions(""), "rwm");
        assert_eq!(permissions("none"), "");
        assert_eq!(permissions("wr"), "rw");
        assert_eq!(permissions("mmr"), "rm");
    }

    #[test]
    fn later_edits_replace_earlier_ones_at_the_same_place() {
        let node = |path: &str, host: &str| CdiDeviceNode {
            path: path.into(),
            host_path: host.into(),
            ..Default::default()
        };
        let mount = |host: &str, at: &str, options: &[&str]| CdiMount {
            host_path: host.into(),
            container_path: at.into(),
            options: options.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut out = ContainerEdits::default();
        apply(
            &mut out,
            &CdiEdits {
                env: vec!["A=1".into(), "B=x=y".into()],
                device_nodes: vec![node("/dev/a", ""), node("/dev/b", "/dev/b0")],
                mounts: vec![
                    mount("/h/deep", "/usr/lib/x/y", &["ro", "bind"]),
                    mount("/h/lib", "/usr/lib", &["rbind", "ro", "rw"]),
                ],
                ..Default::default()
            },
        );
        apply(
            &mut out,
            &CdiEdits {
                env: vec!["A=2".into()],
                device_nodes: vec![node("/dev/b", "/dev/b1")],
                ..Default::default()
            },
        );
        order_mounts(&mut out);
        assert_eq!(out.env["A"], "2");
        assert_eq!(out.env["B"], "x=y");
        assert_eq!(out.device_nodes.len(), 2);
        assert_eq!(out.device_nodes[0].host_path, Path::new("/dev/a"));
        assert_eq!(out.device_nodes[0].permissions, "rwm");
        assert_eq!(out.device_nodes[1].host_path, Path::new("/dev/b1"));
        assert_eq!(out.mounts[0].task_path, Path::new("/usr/lib"));
        assert!(!out.mounts[0].read_only);
        assert!(out.mounts[1].read_only);
    }

    #[test]
    fn what_drivers_cannot_do_is_named() {
        let mut e = CdiEdits {
            additional_gids: vec![0],
            ..Default::default()
        };
        check("containerEdits", &e).unwrap();
        e.mounts.push(CdiMount {
            host_path: "/h".into(),
            container_path: "/t".into(),
            mount_type: "tmpfs".into(),
            options: vec![],
        });
        let u = check("containerEdits", &e).unwrap_err();
        assert_eq!(u.field, "containerEdits.mounts[0].type");
        assert!(
            u.reason.contains("\"tmpfs\" mounts are not supported"),
            "{}",
            u.reason
        );
        e.mounts[0].options.push("rbind".into());
        check("containerEdits", &e).unwrap();
        e.device_nodes.push(CdiDeviceNode {
            path: "/dev/x".into(),
            gid: Some(44),
            ..Default::default()
        });
        let u = check("x", &e).unwrap_err();
        assert_eq!(u.field, "x.deviceNodes[0].gid");
    }
}
