//! The `podman create` command line of a task: checked first, so that a config podman would
//! read differently than meant (a comma in a mount path, a newline in an env value) is
//! refused by field before anything is made.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use crate::{
    docker::config::{ContainerConfig, Ulimit},
    task::{BindMount, PidMode, Propagation, TaskConfig},
};

/// The resource limit names podman takes.
const ULIMITS: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

/// The files of one container start, in the task's private `.container` directory.
#[derive(Debug, Clone)]
pub(crate) struct StartFiles {
    /// podman writes the container's id here.
    pub cidfile: PathBuf,
    /// The OCI runtime writes the container's first process's pid here.
    pub pidfile: PathBuf,
    /// The task's environment, read by podman at create and removed right after.
    pub envfile: PathBuf,
}

impl StartFiles {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cidfile: dir.join("cid"),
            pidfile: dir.join("pid"),
            envfile: dir.join("env"),
        }
    }
}

/// What the driver adds to every container.
#[derive(Debug, Clone)]
pub(crate) struct Defaults {
    /// `ulimit`s a task does not set: `nofile` and `nproc` at what the agent may give (podman's
    /// own defaults are above it and would fail).
    pub ulimits: BTreeMap<String, Ulimit>,
    /// The most any `ulimit` may be, by name.
    pub ceilings: BTreeMap<String, u64>,
}

/// `(field, reason)` of the first bad field.
pub(crate) type Bad = (String, String);

/// The arguments after `podman <globals>`: `create … <image> [command…]`.
pub(crate) fn create_args(
    task: &TaskConfig,
    container: &ContainerConfig,
    image: &str,
    name: &str,
    files: &StartFiles,
    defaults: &Defaults,
    dirs: &[(PathBuf, &str)],
) -> Result<Vec<String>, Bad> {
    let mut a: Vec<String> = vec!["create".into()];
    fn flag(a: &mut Vec<String>, k: &str, v: String) {
        a.push(k.into());
        a.push(v);
    }
    flag(&mut a, "--name", name.into());
    // Never a registry: an image podman lacks fails the create at once.
    flag(&mut a, "--pull", "never".into());
    flag(&mut a, "--cidfile", text(&files.cidfile));
    flag(&mut a, "--pidfile", text(&files.pidfile));
    flag(&mut a, "--env-file", text(&files.envfile));
    // The container's stdout and stderr are `podman start`'s, which the driver points at the
    // task's log files: no log copy, and nothing lost while the agent is down.
    flag(&mut a, "--log-driver", "passthrough".into());
    flag(&mut a, "--network", container.network_mode.as_str().into());
    flag(&mut a, "--label", format!("berth.task_id={}", task.id));
    if let Some((alloc, task_name)) = task.id.alloc_and_task() {
        flag(&mut a, "--label", format!("berth.alloc_id={alloc}"));
        flag(&mut a, "--label", format!("berth.task={task_name}"));
    }
    for (k, v) in &container.labels {
        if k.is_empty() || k.contains(['=', '\n', '\0']) || v.contains(['\n', '\0']) {
            return Err((
                format!("labels[{k:?}]"),
                "a label name must be non-empty, without '=', and neither may hold a newline"
                    .into(),
            ));
        }
        if k.starts_with("berth.") {
            return Err((
                format!("labels[{k:?}]"),
                "labels starting with berth. are the agent's own".into(),
            ));
        }
        flag(&mut a, "--label", format!("{k}={v}"));
    }
    if let Some(user) = &task.user {
        flag(&mut a, "--user", user.clone());
    }
    if task.privileged {
        a.push("--privileged".into());
    }
    if task.pid_mode == PidMode::Host {
        flag(&mut a, "--pid", "host".into());
    }
    if let Some(ipc) = &container.ipc_mode {
        if !["host", "none", "private", "shareable"].contains(&ipc.as_str()) {
            return Err((
                "ipc_mode".into(),
                format!("{ipc:?}: expected host, none, private or shareable"),
            ));
        }
        flag(&mut a, "--ipc", ipc.clone());
    }
    if container.init {
        a.push("--init".into());
    }
    if let Some(bytes) = task.resources.memory_max_bytes {
        flag(&mut a, "--memory", format!("{bytes}b"));
    }
    for (i, cap) in container.cap_add.iter().enumerate() {
        flag(
            &mut a,
            "--cap-add",
            capability(cap).map_err(|r| (format!("cap_add[{i}]"), r))?,
        );
    }
    for (i, cap) in container.cap_drop.iter().enumerate() {
        flag(
            &mut a,
            "--cap-drop",
            capability(cap).map_err(|r| (format!("cap_drop[{i}]"), r))?,
        );
    }
    let mut limits = defaults.ulimits.clone();
    for (name, limit) in &container.ulimits {
        let field = format!("ulimit.{name}");
        if !ULIMITS.contains(&name.as_str()) {
            return Err((
                field,
                format!("not a limit podman sets ({})", ULIMITS.join(", ")),
            ));
        }
        if limit.soft > limit.hard {
            return Err((
                field,
                format!(
                    "soft limit {} is above hard limit {}",
                    limit.soft, limit.hard
                ),
            ));
        }
        if let Some(ceiling) = defaults.ceilings.get(name)
            && limit.hard > *ceiling
        {
            return Err((
                field,
                format!(
                    "{} is above what this agent may give ({ceiling}: its own hard limit)",
                    limit.hard
                ),
            ));
        }
        limits.insert(name.clone(), *limit);
    }
    for (name, limit) in &limits {
        flag(
            &mut a,
            "--ulimit",
            format!("{name}={}:{}", limit.soft, limit.hard),
        );
    }
    if let Some(dir) = &container.work_dir {
        if !dir.is_absolute() {
            return Err((
                "work_dir".into(),
                format!("{} is not absolute", dir.display()),
            ));
        }
        flag(&mut a, "--workdir", text(dir));
    }
    if let Some(entry) = &container.entrypoint {
        if entry.is_empty() {
            return Err(("entrypoint".into(), "must not be empty".into()));
        }
        // podman reads a JSON array as the whole entrypoint.
        flag(
            &mut a,
            "--entrypoint",
            serde_json::to_string(entry).expect("strings serialize"),
        );
    }
    // The task's directories at Nomad's paths, then the agent's mounts (volumes, plugin
    // directories), then the task's own.
    for (source, destination) in dirs {
        flag(
            &mut a,
            "--mount",
            bind_spec(source, Path::new(destination), false, Propagation::Private)
                .map_err(|r| ("dirs".to_string(), r))?,
        );
    }
    for (field, mounts) in [
        ("mounts", &task.mounts),
        ("host_volumes", &container.host_volumes),
    ] {
        for (i, m) in mounts.iter().enumerate() {
            flag(
                &mut a,
                "--mount",
                mount_spec(m).map_err(|r| (format!("{field}[{i}]"), r))?,
            );
        }
    }
    for (i, t) in container.tmpfs.iter().enumerate() {
        let field = format!("tmpfs[{i}]");
        let dest = path_option(&t.destination).map_err(|r| (field.clone(), r))?;
        if !t.destination.is_absolute() {
            return Err((field, "destination must be absolute".into()));
        }
        let mut spec = format!("type=tmpfs,destination={dest}");
        if let Some(size) = t.size_bytes {
            let _ = write!(spec, ",tmpfs-size={size}");
        }
        if let Some(mode) = t.mode {
            let _ = write!(spec, ",tmpfs-mode={mode:o}");
        }
        if t.read_only {
            spec.push_str(",ro=true");
        }
        flag(&mut a, "--mount", spec);
    }
    for (i, d) in task.devices.iter().enumerate() {
        let field = format!("devices[{i}]");
        let host = text(&d.host_path);
        let inside = text(&d.task_path);
        if host.contains(':') || inside.contains(':') {
            return Err((field, "a device path must not contain ':'".into()));
        }
        let perms = if d.permissions.is_empty() {
            "r".to_string()
        } else {
            d.permissions.clone()
        };
        flag(&mut a, "--device", format!("{host}:{inside}:{perms}"));
    }
    a.push(image.into());
    if !task.command.is_empty() {
        a.push(task.command.clone());
        a.extend(task.args.iter().cloned());
    } else {
        a.extend(task.args.iter().cloned());
    }
    Ok(a)
}

/// The env file podman reads: one `NAME=value` a line. A value with a newline cannot be
/// written in it and is refused (by name: the value may be a secret).
pub(crate) fn env_file(env: &BTreeMap<String, String>) -> Result<String, Bad> {
    let mut out = String::new();
    for (k, v) in env {
        if v.contains(['\n', '\r']) {
            return Err((
                format!("env[{k:?}]"),
                "a container's environment value cannot hold a newline".into(),
            ));
        }
        let _ = writeln!(out, "{k}={v}");
    }
    Ok(out)
}

fn mount_spec(m: &BindMount) -> Result<String, String> {
    bind_spec(&m.source, &m.destination, m.read_only, m.propagation)
}

fn bind_spec(
    source: &Path,
    destination: &Path,
    read_only: bool,
    propagation: Propagation,
) -> Result<String, String> {
    let src = path_option(source)?;
    let dst = path_option(destination)?;
    let propagation = match propagation {
        Propagation::Private => "rprivate",
        Propagation::HostToTask => "rslave",
        Propagation::Bidirectional => "rshared",
    };
    let mut spec =
        format!("type=bind,source={src},destination={dst},bind-propagation={propagation}");
    if read_only {
        spec.push_str(",ro=true");
    }
    Ok(spec)
}

/// A path as a `--mount` option value: one without `,` (the option separator).
fn path_option(path: &Path) -> Result<String, String> {
    let s = text(path);
    if s.contains(',') {
        return Err(format!("{s}: a mount path must not contain ','"));
    }
    Ok(s)
}

fn capability(name: &str) -> Result<String, String> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{name:?} is not a capability name"));
    }
    Ok(if bare == "ALL" {
        bare.to_string()
    } else {
        format!("CAP_{bare}")
    })
}

fn text(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        docker::config::{NetworkMode, TmpfsMount},
        task::{TaskDevice, TaskId},
    };

    fn task() -> TaskConfig {
        let mut t = TaskConfig::new(
            TaskId::for_alloc("a1", "web").unwrap(),
            "",
            "/",
            "/l/out",
            "/l/err",
        );
        t.args = vec!["-x".into()];
        t
    }

    fn defaults() -> Defaults {
        Defaults {
            ulimits: BTreeMap::from([(
                "nofile".into(),
                Ulimit {
                    soft: 1024,
                    hard: 20000,
                },
            )]),
            ceilings: BTreeMap::from([("nofile".into(), 20000)]),
        }
    }

    fn args(t: &TaskConfig, c: &ContainerConfig) -> Result<Vec<String>, Bad> {
        create_args(
            t,
            c,
            "img",
            "web-a1",
            &StartFiles::in_dir(Path::new("/t/.container")),
            &defaults(),
            &[(PathBuf::from("/t/local"), "/local")],
        )
    }

    #[test]
    fn a_full_command_line() {
        let mut t = task();
        t.privileged = true;
        t.pid_mode = PidMode::Host;
        t.user = Some("nobody".into());
        t.resources.memory_max_bytes = Some(64 << 20);
        t.mounts.push(BindMount {
            source: "/csi/root".into(),
            destination: "/csi".into(),
            read_only: false,
            propagation: Propagation::Bidirectional,
        });
        t.devices.push(TaskDevice {
            host_path: "/dev/fuse".into(),
            task_path: "/dev/fuse".into(),
            permissions: "rw".into(),
        });
        let c = ContainerConfig {
            image: "x".into(),
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
            network_mode: NetworkMode::None,
            tmpfs: vec![TmpfsMount {
                destination: "/scratch".into(),
                size_bytes: Some(4096),
                mode: Some(0o1777),
                read_only: false,
            }],
            cap_add: vec!["sys_admin".into()],
            cap_drop: vec!["ALL".into()],
            ulimits: BTreeMap::from([("nproc".into(), Ulimit { soft: 10, hard: 20 })]),
            work_dir: Some("/w".into()),
            labels: BTreeMap::from([("team".into(), "storage".into())]),
            ipc_mode: Some("host".into()),
            init: true,
            ..Default::default()
        };
        let line = args(&t, &c).unwrap().join(" ");
        for part in [
            "create --name web-a1 --pull never --cidfile /t/.container/cid",
            "--log-driver passthrough --network none",
            "--label berth.task_id=a1.web --label berth.alloc_id=a1 --label berth.task=web --label team=storage",
            "--user nobody --privileged --pid host --ipc host --init --memory 67108864b",
            "--cap-add CAP_SYS_ADMIN --cap-drop ALL",
            "--ulimit nofile=1024:20000 --ulimit nproc=10:20",
            "--workdir /w --entrypoint [\"/bin/sh\",\"-c\"]",
            "--mount type=bind,source=/t/local,destination=/local,bind-propagation=rprivate",
            "--mount type=bind,source=/csi/root,destination=/csi,bind-propagation=rshared",
            "--mount type=tmpfs,destination=/scratch,tmpfs-size=4096,tmpfs-mode=1777",
            "--device /dev/fuse:/dev/fuse:rw img -x",
        ] {
            assert!(line.contains(part), "{part:?} not in {line}");
        }
    }

    #[test]
    fn command_then_args() {
        let mut t = task();
        t.command = "/bin/echo".into();
        let a = args(&t, &ContainerConfig::default()).unwrap();
        assert_eq!(a[a.len() - 3..], ["img", "/bin/echo", "-x"]);
    }

    #[test]
    fn bad_fields_are_named() {
        let field = |t: TaskConfig, c: ContainerConfig| args(&t, &c).unwrap_err().0;
        let mut c = ContainerConfig::default();
        c.ulimits.insert(
            "nofile".into(),
            Ulimit {
                soft: 1,
                hard: 1 << 20,
            },
        );
        assert_eq!(field(task(), c), "ulimit.nofile");
        let mut c = ContainerConfig::default();
        c.ulimits
            .insert("nofiles".into(), Ulimit { soft: 1, hard: 1 });
        assert_eq!(field(task(), c), "ulimit.nofiles");
        let mut c = ContainerConfig::default();
        c.ulimits.insert("core".into(), Ulimit { soft: 2, hard: 1 });
        assert_eq!(field(task(), c), "ulimit.core");
        let c = ContainerConfig {
            cap_add: vec!["NET ADMIN".into()],
            ..Default::default()
        };
        assert_eq!(field(task(), c), "cap_add[0]");
        let mut t = task();
        t.mounts.push(BindMount {
            source: "/a,b".into(),
            destination: "/x".into(),
            read_only: true,
            propagation: Propagation::Private,
        });
        assert_eq!(field(t, ContainerConfig::default()), "mounts[0]");
        let c = ContainerConfig {
            labels: BTreeMap::from([("berth.task_id".into(), "x".into())]),
            ..Default::default()
        };
        assert_eq!(field(task(), c), "labels[\"berth.task_id\"]");
        let c = ContainerConfig {
            ipc_mode: Some("container:x".into()),
            ..Default::default()
        };
        assert_eq!(field(task(), c), "ipc_mode");
    }

    #[test]
    fn env_values_with_newlines_are_refused_by_name() {
        let env = BTreeMap::from([("A".to_string(), "1".to_string())]);
        assert_eq!(env_file(&env).unwrap(), "A=1\n");
        let env = BTreeMap::from([("TOKEN".to_string(), "s3cr3t\nx".to_string())]);
        let (field, reason) = env_file(&env).unwrap_err();
        assert_eq!(field, "env[\"TOKEN\"]");
        assert!(!reason.contains("s3cr3t"));
    }
}
