//! A plugin's `ContainerAllocateResponse` as berth's [`ContainerEdits`]: env, mounts, device
//! nodes and CDI device names, each checked. Annotations have no place in a berth task and are
//! ignored.

use std::path::{Component, Path, PathBuf};

use berth_devices::{
    cdi::QualifiedName,
    model::{ContainerEdits, DeviceMount, DeviceNode},
};
use berth_input::Quoted;

use crate::proto::v1beta1::ContainerAllocateResponse;

/// The permissions of a device node the plugin gives none for.
pub const DEFAULT_PERMISSIONS: &str = "rwm";

/// The edits `resp` asks for, or what is wrong with it (the first problem found).
pub(crate) fn container_edits(resp: ContainerAllocateResponse) -> Result<ContainerEdits, String> {
    let mut edits = ContainerEdits::default();
    for (key, value) in resp.envs {
        if key.is_empty() || key.contains(['=', '\0']) {
            return Err(format!(
                "env name {} must be non-empty without '=' or NUL",
                Quoted(&key)
            ));
        }
        if value.contains('\0') {
            return Err(format!("env {} has a NUL byte in its value", Quoted(&key)));
        }
        edits.env.insert(key, value);
    }
    for (i, m) in resp.mounts.into_iter().enumerate() {
        edits.mounts.push(DeviceMount {
            host_path: host_path(&m.host_path).map_err(|e| format!("mounts[{i}].host_path {e}"))?,
            task_path: task_path(&m.container_path)
                .map_err(|e| format!("mounts[{i}].container_path {e}"))?,
            read_only: m.read_only,
        });
    }
    for (i, d) in resp.devices.into_iter().enumerate() {
        edits.device_nodes.push(DeviceNode {
            host_path: host_path(&d.host_path)
                .map_err(|e| format!("devices[{i}].host_path {e}"))?,
            task_path: task_path(&d.container_path)
                .map_err(|e| format!("devices[{i}].container_path {e}"))?,
            permissions: permissions(&d.permissions)
                .map_err(|e| format!("devices[{i}].permissions {e}"))?,
        });
    }
    for (i, c) in resp.cdi_devices.into_iter().enumerate() {
        QualifiedName::parse(&c.name).map_err(|e| format!("cdi_devices[{i}].name {e}"))?;
        if !edits.cdi_devices.contains(&c.name) {
            edits.cdi_devices.push(c.name);
        }
    }
    if !resp.annotations.is_empty() {
        tracing::debug!(
            annotations = resp.annotations.len(),
            "ignoring the container annotations a device plugin returned: berth tasks have none"
        );
    }
    Ok(edits)
}

/// An absolute host path without NUL.
fn host_path(p: &str) -> Result<PathBuf, String> {
    if p.is_empty() {
        return Err("is empty".into());
    }
    if p.contains('\0') {
        return Err(format!("{} has a NUL byte", Quoted(p)));
    }
    if !p.starts_with('/') {
        return Err(format!("{} is not absolute", Quoted(p)));
    }
    Ok(PathBuf::from(p))
}

/// An absolute path in the task that stays inside it: no `..`.
fn task_path(p: &str) -> Result<PathBuf, String> {
    let path = host_path(p)?;
    if Path::new(p).components().any(|c| c == Component::ParentDir) {
        return Err(format!("{} must not hold '..'", Quoted(p)));
    }
    Ok(path)
}

/// Cgroup device permissions: one or more of `r`, `w`, `m`, each once; empty means `rwm`.
fn permissions(p: &str) -> Result<String, String> {
    if p.is_empty() {
        return Ok(DEFAULT_PERMISSIONS.to_string());
    }
    let mut seen = [false; 3];
    for c in p.chars() {
        let slot = match c {
            'r' => 0,
            'w' => 1,
            'm' => 2,
            _ => return Err(format!("{} may only hold r, w and m", Quoted(p))),
        };
        if seen[slot] {
            return Err(format!("{} repeats {c:?}", Quoted(p)));
        }
        seen[slot] = true;
    }
    Ok(p.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::proto::v1beta1::{CdiDevice, DeviceSpec, Mount};

    fn resp() -> ContainerAllocateResponse {
        ContainerAllocateResponse {
            envs: HashMap::from([("A".into(), "1".into())]),
            mounts: vec![Mount {
                container_path: "/w/0".into(),
                host_path: "/var/w/0".into(),
                read_only: true,
            }],
            devices: vec![DeviceSpec {
                container_path: "/dev/w0".into(),
                host_path: "/dev/null".into(),
                permissions: String::new(),
            }],
            annotations: HashMap::from([("k".into(), "v".into())]),
            cdi_devices: vec![CdiDevice {
                name: "example.com/widget=w0".into(),
            }],
        }
    }

    #[test]
    fn converts_every_part() {
        let e = container_edits(resp()).expect("valid");
        assert_eq!(e.env["A"], "1");
        assert_eq!(
            e.mounts,
            [DeviceMount {
                host_path: "/var/w/0".into(),
                task_path: "/w/0".into(),
                read_only: true
            }]
        );
        assert_eq!(e.device_nodes[0].permissions, "rwm");
        assert_eq!(e.device_nodes[0].task_path, Path::new("/dev/w0"));
        assert_eq!(e.cdi_devices, ["example.com/widget=w0"]);
    }

    /// A change that spoils a response.
    type Change = fn(&mut ContainerAllocateResponse);

    #[test]
    fn refuses_what_a_task_cannot_get() {
        let cases: Vec<(Change, &str)> = vec![
            (
                |r| r.mounts[0].container_path = "w/0".into(),
                "mounts[0].container_path \"w/0\" is not absolute",
            ),
            (
                |r| r.mounts[0].host_path = String::new(),
                "mounts[0].host_path is empty",
            ),
            (
                |r| r.mounts[0].container_path = "/w/../../etc".into(),
                "must not hold '..'",
            ),
            (
                |r| r.devices[0].host_path = "null".into(),
                "devices[0].host_path \"null\" is not absolute",
            ),
            (
                |r| r.devices[0].container_path = String::new(),
                "devices[0].container_path is empty",
            ),
            (
                |r| r.devices[0].permissions = "rx".into(),
                "may only hold r, w and m",
            ),
            (|r| r.devices[0].permissions = "rr".into(), "repeats"),
            (
                |r| r.cdi_devices[0].name = "nonsense".into(),
                "cdi_devices[0].name",
            ),
            (
                |r| {
                    r.envs.insert("A=B".into(), String::new());
                },
                "env name \"A=B\"",
            ),
            (
                |r| {
                    r.envs.insert("Z".into(), "a\0".into());
                },
                "NUL",
            ),
        ];
        for (change, want) in cases {
            let mut r = resp();
            change(&mut r);
            let err = container_edits(r).expect_err(want);
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }
}
