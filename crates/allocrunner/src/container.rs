//! A `docker` task's spec turned into what the driver runs: its templates are literal by now
//! (the alloc was rendered), relative host paths are placed in the task directory.

use std::path::{Component, Path, PathBuf};

use berth_drivers::{
    BindMount, ContainerConfig, NetworkMode, Propagation, TaskDevice, TmpfsMount, Ulimit,
};
use berth_job::{BindPropagation, DockerMount, DockerNetwork, DockerTask, Template};

/// The container config of `spec` and the device nodes it asks for; `task_dir` is where its
/// relative host paths lie. `Err` says which field and why.
pub(crate) fn container_config(
    spec: &DockerTask,
    task_dir: &Path,
) -> Result<(ContainerConfig, Vec<TaskDevice>), String> {
    let literal = |t: &Template, field: &str| -> Result<String, String> {
        t.as_literal().map(str::to_owned).ok_or_else(|| {
            format!("config.{field} still holds a variable ({t}): the alloc was not rendered")
        })
    };
    let mut c = ContainerConfig {
        image: literal(&spec.image, "image")?,
        network_mode: match spec.network_mode {
            DockerNetwork::Bridge => NetworkMode::Bridge,
            DockerNetwork::None => NetworkMode::None,
            DockerNetwork::Host => NetworkMode::Host,
        },
        cap_add: spec.cap_add.clone(),
        cap_drop: spec.cap_drop.clone(),
        ulimits: spec
            .ulimits
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Ulimit {
                        soft: v.soft,
                        hard: v.hard,
                    },
                )
            })
            .collect(),
        labels: spec.labels.clone(),
        ipc_mode: spec.ipc_mode.map(|m| m.as_str().to_owned()),
        init: spec.init,
        ..ContainerConfig::default()
    };
    if let Some(entry) = &spec.entrypoint {
        c.entrypoint = Some(
            entry
                .iter()
                .map(|t| literal(t, "entrypoint"))
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(w) = &spec.work_dir {
        c.work_dir = Some(PathBuf::from(literal(w, "work_dir")?));
    }
    for (i, v) in spec.volumes.iter().enumerate() {
        let field = format!("config.volumes[{i}]");
        let text = literal(v, &field)?;
        let vol = berth_job::parse_docker_volume(&text).map_err(|e| format!("{field}: {e}"))?;
        c.host_volumes.push(BindMount {
            source: host_path(&vol.source, task_dir).map_err(|e| format!("{field}: {e}"))?,
            destination: vol.target,
            read_only: vol.read_only,
            propagation: Propagation::Private,
        });
    }
    for (i, m) in spec.mounts.iter().enumerate() {
        let field = format!("config.mount[{i}]");
        match m {
            DockerMount::Bind {
                source,
                target,
                readonly,
                propagation,
            } => c.host_volumes.push(BindMount {
                source: host_path(&literal(source, &field)?, task_dir)
                    .map_err(|e| format!("{field}.source: {e}"))?,
                destination: PathBuf::from(literal(target, &field)?),
                read_only: *readonly,
                propagation: match propagation {
                    BindPropagation::Rprivate | BindPropagation::Private => Propagation::Private,
                    BindPropagation::Rslave | BindPropagation::Slave => Propagation::HostToTask,
                    BindPropagation::Rshared | BindPropagation::Shared => {
                        Propagation::Bidirectional
                    }
                },
            }),
            DockerMount::Tmpfs {
                target,
                readonly,
                size,
                mode,
            } => c.tmpfs.push(TmpfsMount {
                destination: PathBuf::from(literal(target, &field)?),
                size_bytes: *size,
                mode: *mode,
                read_only: *readonly,
            }),
        }
    }
    let devices = spec
        .devices
        .iter()
        .map(|d| TaskDevice {
            host_path: d.host_path.clone().into(),
            task_path: d.container_path.clone().into(),
            permissions: d.cgroup_permissions.clone(),
        })
        .collect();
    Ok((c, devices))
}

/// A `volumes` or bind `mount` source on the host: an absolute path as it is, a relative one
/// in the task directory (as Nomad places them); never with `..`.
fn host_path(source: &str, task_dir: &Path) -> Result<PathBuf, String> {
    let path = Path::new(source);
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{source}: must not contain '..'"));
    }
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(task_dir.join(
        path.components()
            .filter(|c| *c != Component::CurDir)
            .collect::<PathBuf>(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_sources_lie_in_the_task_dir() {
        let t = Path::new("/allocs/a/web");
        assert_eq!(
            host_path("local/x", t).unwrap(),
            Path::new("/allocs/a/web/local/x")
        );
        assert_eq!(
            host_path(".//local/x", t).unwrap(),
            Path::new("/allocs/a/web/local/x")
        );
        assert_eq!(host_path("/srv/x", t).unwrap(), Path::new("/srv/x"));
        assert!(host_path("../x", t).is_err());
        assert!(host_path("/srv/../etc", t).is_err());
    }
}
