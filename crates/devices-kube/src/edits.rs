//! A plugin's `ContainerAllocateResponse` as berth's [`ContainerEdits`]: env, mounts, device
//! nodes and CDI device names, checked as every plugin's edits are
//! ([`ContainerEdits::check`]), and CDI names parsed. Annotations have no place in a berth task
//! and are ignored.

use berth_devices::{
    cdi::QualifiedName,
    model::{ContainerEdits, DeviceMount, DeviceNode},
};

use crate::proto::v1beta1::ContainerAllocateResponse;

/// The permissions of a device node the plugin gives none for.
pub const DEFAULT_PERMISSIONS: &str = "rwm";

/// The edits `resp` asks for, or what is wrong with it (the first problem found; mounts and
/// device nodes named in berth's words, `mount 0: task_path …` for `mounts[0].container_path`).
pub(crate) fn container_edits(resp: ContainerAllocateResponse) -> Result<ContainerEdits, String> {
    let mut edits = ContainerEdits {
        env: resp.envs.into_iter().collect(),
        mounts: resp
            .mounts
            .into_iter()
            .map(|m| DeviceMount {
                host_path: m.host_path.into(),
                task_path: m.container_path.into(),
                read_only: m.read_only,
            })
            .collect(),
        device_nodes: resp
            .devices
            .into_iter()
            .map(|d| DeviceNode {
                host_path: d.host_path.into(),
                task_path: d.container_path.into(),
                permissions: if d.permissions.is_empty() {
                    DEFAULT_PERMISSIONS.to_string()
                } else {
                    d.permissions
                },
            })
            .collect(),
        cdi_devices: Vec::new(),
    };
    edits.check()?;
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
        assert_eq!(e.device_nodes[0].task_path, std::path::Path::new("/dev/w0"));
        assert_eq!(e.cdi_devices, ["example.com/widget=w0"]);
    }

    /// A change that spoils a response.
    type Change = fn(&mut ContainerAllocateResponse);

    #[test]
    fn refuses_what_a_task_cannot_get() {
        let cases: Vec<(Change, &str)> = vec![
            (
                |r| r.mounts[0].container_path = "w/0".into(),
                "mount 0: task_path \"w/0\" is not an absolute path",
            ),
            (
                |r| r.mounts[0].host_path = String::new(),
                "mount 0: host_path \"\" is not an absolute path",
            ),
            (
                |r| r.mounts[0].container_path = "/w/../../etc".into(),
                "mount 0: task_path \"/w/../../etc\" holds \"..\"",
            ),
            // Kubernetes plugins are held to what Nomad's are: no `..` on the host side either.
            (
                |r| r.mounts[0].host_path = "/var/w/../../etc".into(),
                "mount 0: host_path \"/var/w/../../etc\" holds \"..\"",
            ),
            (
                |r| r.devices[0].host_path = "null".into(),
                "device 0: host_path \"null\" is not an absolute path",
            ),
            (
                |r| r.devices[0].container_path = String::new(),
                "device 0: task_path \"\" is not an absolute path",
            ),
            (
                |r| r.devices[0].permissions = "rx".into(),
                "device 0: permissions \"rx\" may only hold r, w and m",
            ),
            (
                |r| r.devices[0].permissions = "rr".into(),
                "device 0: permissions \"rr\" may only hold r, w and m, each at most once",
            ),
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
