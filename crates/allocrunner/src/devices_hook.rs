//! The `devices` prestart hook: what a task gets for the devices it was assigned when its
//! alloc was placed. Reserved once (the answer persisted before the task's first start, so
//! every restart — after an agent restart too — gets the same env, mounts and device nodes),
//! prepared before every start, then merged into the task's config: env added (the devices'
//! values win, as Nomad's device hook does), mounts appended after the volume mounts (never
//! replacing them), device nodes given to drivers that take them.

use std::path::Path;

use berth_devices::model::ContainerEdits;
use berth_drivers::{BindMount, Capabilities, Propagation, TaskConfig, TaskDevice};

/// Applies `edits` to `config` for a driver with `caps`. Returns notes for the task's events
/// (what was not applied, and why). Fails when a device mount would land where another mount
/// of the task is.
pub(crate) fn apply(
    config: &mut TaskConfig,
    edits: &ContainerEdits,
    caps: &Capabilities,
    driver: &str,
) -> Result<Vec<String>, String> {
    let mut notes = Vec::new();
    config
        .env
        .extend(edits.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if !caps.bind_mounts {
        if !edits.mounts.is_empty() || !edits.device_nodes.is_empty() {
            notes.push(format!(
                "{driver} runs the task on the host without isolation: its devices give it their environment only; {} mount(s) and {} device node(s) not applied (use exec for them)",
                edits.mounts.len(),
                edits.device_nodes.len()
            ));
        }
        return Ok(notes);
    }
    for m in &edits.mounts {
        let dest = normalize(&m.task_path);
        if let Some(other) = config
            .mounts
            .iter()
            .find(|o| normalize(&o.destination) == dest)
        {
            return Err(format!(
                "a device mount at {} collides with the task's mount of {} there",
                dest.display(),
                other.source.display()
            ));
        }
        config.mounts.push(BindMount {
            source: m.host_path.clone(),
            destination: dest,
            read_only: m.read_only,
            propagation: Propagation::Private,
        });
    }
    if caps.device_nodes {
        for d in &edits.device_nodes {
            let task_path = normalize(&d.task_path);
            if let Some(other) = config.devices.iter().find(|o| o.task_path == task_path) {
                if other.host_path == d.host_path {
                    // Two devices of one task naming the same node (CDI edits shared by two
                    // devices): one bind is enough.
                    continue;
                }
                return Err(format!(
                    "device nodes {} and {} are both given at {}",
                    other.host_path.display(),
                    d.host_path.display(),
                    task_path.display()
                ));
            }
            config.devices.push(TaskDevice {
                host_path: d.host_path.clone(),
                task_path,
                permissions: d.permissions.clone(),
            });
        }
    } else if !edits.device_nodes.is_empty() {
        notes.push(format!(
            "{driver} cannot give a task device nodes: {} not applied",
            edits.device_nodes.len()
        ));
    }
    Ok(notes)
}

/// `p` without `.` components or a trailing `/` (as mounts compare destinations).
fn normalize(p: &Path) -> std::path::PathBuf {
    p.components().collect()
}

/// One line about `edits` for the reservation's event: counts and names, never values that
/// could be long (env values stay out).
pub(crate) fn describe(devices: &[String], edits: &ContainerEdits) -> String {
    let mut env: Vec<&str> = edits.env.keys().map(String::as_str).collect();
    env.sort_unstable();
    format!(
        "reserved {}: env {}; {} mount(s); {} device node(s)",
        devices.join(", "),
        if env.is_empty() {
            "none".to_owned()
        } else {
            env.join(", ")
        },
        edits.mounts.len(),
        edits.device_nodes.len()
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use berth_devices::model::{DeviceMount, DeviceNode};
    use berth_drivers::{FsIsolation, TaskId};

    use super::*;

    fn caps(isolated: bool) -> Capabilities {
        Capabilities {
            fs_isolation: if isolated {
                FsIsolation::Chroot
            } else {
                FsIsolation::None
            },
            send_signals: true,
            exec: false,
            bind_mounts: isolated,
            resource_limits: isolated,
            device_nodes: isolated,
        }
    }

    fn config() -> TaskConfig {
        let mut c = TaskConfig::new(
            TaskId::new("a.t").unwrap(),
            "/bin/true",
            "/",
            "/tmp/out",
            "/tmp/err",
        );
        c.env.insert("GPU".into(), "task".into());
        c.env.insert("KEEP".into(), "1".into());
        c.mounts.push(BindMount {
            source: "/vol".into(),
            destination: "/data".into(),
            read_only: false,
            propagation: Propagation::Private,
        });
        c
    }

    fn edits() -> ContainerEdits {
        ContainerEdits {
            env: BTreeMap::from([("GPU".into(), "0".into())]),
            mounts: vec![DeviceMount {
                host_path: "/usr/lib/gpu".into(),
                task_path: "/usr/lib/gpu/".into(),
                read_only: true,
            }],
            device_nodes: vec![
                DeviceNode {
                    host_path: "/dev/gpu0".into(),
                    task_path: "/dev/gpu0".into(),
                    permissions: "rw".into(),
                },
                DeviceNode {
                    host_path: "/dev/gpu0".into(),
                    task_path: "/dev/./gpu0".into(),
                    permissions: "rw".into(),
                },
            ],
            cdi_devices: Vec::new(),
        }
    }

    #[test]
    fn edits_add_to_volume_mounts_and_env() {
        let mut c = config();
        let notes = apply(&mut c, &edits(), &caps(true), "exec").unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(c.env["GPU"], "0", "the device's value wins, as in Nomad");
        assert_eq!(c.env["KEEP"], "1");
        let dests: Vec<_> = c.mounts.iter().map(|m| m.destination.clone()).collect();
        assert_eq!(dests, [Path::new("/data"), Path::new("/usr/lib/gpu")]);
        assert!(c.mounts[1].read_only);
        assert_eq!(c.devices.len(), 1, "the same node once");
        assert_eq!(c.devices[0].task_path, Path::new("/dev/gpu0"));
    }

    #[test]
    fn raw_exec_gets_env_only_and_a_note() {
        let mut c = config();
        let notes = apply(&mut c, &edits(), &caps(false), "raw_exec").unwrap();
        assert_eq!(c.env["GPU"], "0");
        assert_eq!(c.mounts.len(), 1);
        assert!(c.devices.is_empty());
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("raw_exec runs the task on the host"),
            "{notes:?}"
        );
        assert!(
            notes[0].contains("1 mount(s) and 2 device node(s)"),
            "{notes:?}"
        );
    }

    #[test]
    fn two_device_nodes_at_one_path_are_refused() {
        let mut c = config();
        let mut e = edits();
        e.device_nodes[1].host_path = "/dev/gpu1".into();
        let err = apply(&mut c, &e, &caps(true), "exec").unwrap_err();
        assert!(
            err.contains("/dev/gpu0 and /dev/gpu1 are both given at /dev/gpu0"),
            "{err}"
        );
    }

    #[test]
    fn a_device_mount_on_a_volume_mount_is_refused() {
        let mut c = config();
        let mut e = edits();
        e.mounts[0].task_path = "/data/".into();
        let err = apply(&mut c, &e, &caps(true), "exec").unwrap_err();
        assert!(err.contains("collides"), "{err}");
    }
}
