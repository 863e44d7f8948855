//! The `config` block of a `driver = "docker"` task (its `command`, `args` and `pid_mode` are
//! read with every driver's): Nomad's docker options that berth runs, each checked; literal
//! paths now, templated ones when the alloc is placed. With the node known, what its docker
//! driver does not allow (privileged containers, host paths) is refused.

use std::collections::BTreeMap;

use berth_input::Quoted;

use super::{Cx, Fields, Res, string};
use crate::{
    docker::{
        BindPropagation, DOCKER_PRIVILEGED_ATTR, DOCKER_VOLUMES_ATTR, DockerDevice, DockerMount,
        DockerTask, DockerUlimit, ULIMIT_NAMES, check_bind_source, check_cgroup_permissions,
        check_container_path, normalize_capability, parse_docker_volume,
    },
    input::V,
    path::FieldPath,
    template::{Part, Template},
};

/// What `config` holds for docker, besides `command`, `args` and `pid_mode` (read by the
/// caller).
pub(super) fn config(cx: &Cx<'_>, c: &mut Fields) -> Res<DockerTask> {
    let p = c.path.clone();
    let line = c.line_of("image");
    let image = c.template(cx, "image")?.ok_or_else(|| {
        cx.err(
            &p.key("image"),
            c.line,
            "is required (the image to run, such as \"docker.io/library/redis:7\")",
        )
    })?;
    if image.as_literal().is_some_and(|s| s.trim().is_empty()) {
        return Err(cx.err(&p.key("image"), line, "must not be empty"));
    }
    let entrypoint = c.templates(cx, "entrypoint")?;

    let line = c.line_of("privileged");
    let privileged = c.bool(cx, "privileged")?.unwrap_or(false);
    if privileged && !node_allows(cx, DOCKER_PRIVILEGED_ATTR) {
        return Err(cx.err(
            &p.key("privileged"),
            line,
            format!(
                "this node's docker driver does not run privileged containers (it has no \
                 attribute {DOCKER_PRIVILEGED_ATTR}): that needs allow_privileged = true in the \
                 agent's plugin \"docker\" {{ config {{ … }} }}"
            ),
        ));
    }

    let line = c.line_of("network_mode");
    let network_mode = match c.string(cx, "network_mode")? {
        None => Default::default(),
        Some(s) => s
            .parse()
            .map_err(|e: String| cx.err(&p.key("network_mode"), line, e))?,
    };
    let line = c.line_of("ipc_mode");
    let ipc_mode = c
        .string(cx, "ipc_mode")?
        .map(|s| s.parse())
        .transpose()
        .map_err(|e: String| cx.err(&p.key("ipc_mode"), line, e))?;

    let volumes = c.templates(cx, "volumes")?.unwrap_or_default();
    for (i, v) in volumes.iter().enumerate() {
        let Some(text) = v.as_literal() else {
            continue;
        };
        let here = p.key("volumes").at(i);
        let parsed = parse_docker_volume(text).map_err(|e| cx.err(&here, v.line(), e))?;
        host_path(cx, &here, v.line(), &parsed.source)?;
    }

    let mut mounts = Vec::new();
    for m in c.blocks(cx, "mount")? {
        mounts.push(mount(cx, m)?);
    }

    let mut devices = Vec::new();
    for d in c.blocks(cx, "devices")? {
        devices.push(device(cx, d)?);
    }

    let cap_add = capabilities(cx, c, "cap_add")?;
    let cap_drop = capabilities(cx, c, "cap_drop")?;
    let ulimits = match c.block(cx, "ulimit")? {
        Some(u) => ulimits(cx, u)?,
        None => BTreeMap::new(),
    };

    let line = c.line_of("work_dir");
    let work_dir = c.template(cx, "work_dir")?;
    if let Some(w) = work_dir.as_ref().and_then(Template::as_literal)
        && !w.starts_with('/')
    {
        return Err(cx.err(
            &p.key("work_dir"),
            line,
            format!("{} is not an absolute path", Quoted(w)),
        ));
    }
    let labels = match c.block(cx, "labels")? {
        Some(l) => labels(cx, l)?,
        None => BTreeMap::new(),
    };
    let init = c.bool(cx, "init")?.unwrap_or(false);

    Ok(DockerTask {
        image,
        entrypoint,
        privileged,
        network_mode,
        volumes,
        mounts,
        devices,
        cap_add,
        cap_drop,
        ulimits,
        work_dir,
        labels,
        ipc_mode,
        init,
    })
}

/// The templates of `d` with their fields under `config`, for the reference checks.
pub(super) fn templates<'a>(
    d: &'a DockerTask,
    config: &FieldPath,
) -> Vec<(FieldPath, &'a Template)> {
    let mut out = vec![(config.key("image"), &d.image)];
    for (i, e) in d.entrypoint.iter().flatten().enumerate() {
        out.push((config.key("entrypoint").at(i), e));
    }
    for (i, v) in d.volumes.iter().enumerate() {
        out.push((config.key("volumes").at(i), v));
    }
    for (i, m) in d.mounts.iter().enumerate() {
        let here = config.key("mount").at(i);
        match m {
            DockerMount::Bind { source, target, .. } => {
                out.push((here.key("source"), source));
                out.push((here.key("target"), target));
            }
            DockerMount::Tmpfs { target, .. } => out.push((here.key("target"), target)),
        }
    }
    if let Some(w) = &d.work_dir {
        out.push((config.key("work_dir"), w));
    }
    out
}

/// Whether the node allows what `attr` stands for; true when the node is not known.
fn node_allows(cx: &Cx<'_>, attr: &str) -> bool {
    cx.opts.node.as_ref().is_none_or(|n| n.attrs.contains(attr))
}

/// A literal host path of a `volumes` entry or bind mount: an absolute one needs the node's
/// docker volumes (when the node is known); a relative one lies in the task directory.
fn host_path(cx: &Cx<'_>, path: &FieldPath, line: Option<usize>, source: &str) -> Res<()> {
    if source.starts_with('/') && !node_allows(cx, DOCKER_VOLUMES_ATTR) {
        return Err(cx.err(
            path,
            line,
            format!(
                "host path {}: this node's docker driver mounts no host paths (it has no \
                 attribute {DOCKER_VOLUMES_ATTR}): that needs volumes {{ enabled = true }} in \
                 the agent's plugin \"docker\" {{ config {{ … }} }}; a path relative to the task \
                 directory (local/…) is always allowed",
                Quoted(source)
            ),
        ));
    }
    Ok(())
}

/// A literal container path (a mount's target): absolute, without `..`; kept normalized.
fn container_path(cx: &Cx<'_>, path: &FieldPath, t: Template) -> Res<Template> {
    let Some(text) = t.as_literal() else {
        return Ok(t);
    };
    let p = check_container_path(text)
        .map_err(|why| cx.err(path, t.line(), format!("{} {why}", Quoted(text))))?;
    Ok(Template::from_parts(
        vec![Part::Lit(p.display().to_string())],
        t.line(),
    ))
}

/// One `mount` block: `bind` or `tmpfs`.
fn mount(cx: &Cx<'_>, mut m: Fields) -> Res<DockerMount> {
    let p = m.path.clone();
    // The type first: a named volume is refused for its type, not for its fields.
    let line = m.line_of("type");
    let ty = m.string(cx, "type")?;
    let bind = match ty.as_deref() {
        Some("bind") => true,
        Some("tmpfs") => false,
        None => {
            return Err(cx.err(
                &p.key("type"),
                m.line,
                "is required: Nomad's default type is \"volume\" (a docker named volume), which \
                 berth does not run; write type = \"bind\" (a host path) or \"tmpfs\"",
            ));
        }
        Some("volume") => {
            return Err(cx.err(
                &p.key("type"),
                line,
                "\"volume\": berth runs no docker named volumes; use type = \"bind\" or \
                 \"tmpfs\", or a CSI volume of the group with a volume_mount block",
            ));
        }
        Some(other) => {
            return Err(cx.err(
                &p.key("type"),
                line,
                format!("{}: expected bind or tmpfs", Quoted(other)),
            ));
        }
    };
    m.deny_unknown(
        cx,
        &[
            "type",
            "source",
            "target",
            "readonly",
            "bind_options",
            "tmpfs_options",
        ],
    )?;
    let target = m.template(cx, "target")?.ok_or_else(|| {
        cx.err(
            &p.key("target"),
            m.line,
            "is required (an absolute path in the container)",
        )
    })?;
    let target = container_path(cx, &p.key("target"), target)?;
    let readonly = m.bool(cx, "readonly")?.unwrap_or(false);
    let bind_options = m.block(cx, "bind_options")?;
    let tmpfs_options = m.block(cx, "tmpfs_options")?;
    if bind {
        if let Some(t) = tmpfs_options {
            return Err(cx.err(&t.path, t.line, "goes with type = \"tmpfs\" only"));
        }
        let source = m.template(cx, "source")?.ok_or_else(|| {
            cx.err(
                &p.key("source"),
                m.line,
                "is required (a host path; a relative one lies in the task directory)",
            )
        })?;
        if let Some(text) = source.as_literal() {
            let here = p.key("source");
            check_bind_source(text)
                .map_err(|why| cx.err(&here, source.line(), format!("{}: {why}", Quoted(text))))?;
            host_path(cx, &here, source.line(), text)?;
        }
        let propagation = match bind_options {
            None => BindPropagation::default(),
            Some(mut b) => {
                b.deny_unknown(cx, &["propagation"])?;
                let line = b.line_of("propagation");
                match b.string(cx, "propagation")? {
                    None => BindPropagation::default(),
                    Some(s) => s
                        .parse()
                        .map_err(|e: String| cx.err(&b.path.key("propagation"), line, e))?,
                }
            }
        };
        Ok(DockerMount::Bind {
            source,
            target,
            readonly,
            propagation,
        })
    } else {
        if let Some(b) = bind_options {
            return Err(cx.err(&b.path, b.line, "goes with type = \"bind\" only"));
        }
        if let Some(n) = m.value(cx, "source")? {
            return Err(cx.err(&p.key("source"), n.line, "a tmpfs mount takes no source"));
        }
        let (mut size, mut mode) = (None, None);
        if let Some(mut t) = tmpfs_options {
            t.deny_unknown(cx, &["size", "mode"])?;
            size = whole(cx, &mut t, "size", 1, u64::MAX, "bytes")?;
            mode = whole(cx, &mut t, "mode", 0, 0o7777, "permission bits")?
                .map(|m| u32::try_from(m).unwrap_or(0o7777));
        }
        Ok(DockerMount::Tmpfs {
            target,
            readonly,
            size,
            mode,
        })
    }
}

/// A whole number in `min..=max` (`what` says what it counts, in errors).
fn whole(
    cx: &Cx<'_>,
    f: &mut Fields,
    key: &str,
    min: u64,
    max: u64,
    what: &str,
) -> Res<Option<u64>> {
    let path = f.path.key(key);
    let Some(n) = f.value(cx, key)? else {
        return Ok(None);
    };
    let V::Num(num) = &n.v else {
        return Err(cx.wrong(&path, &n, &format!("a whole number ({what})")));
    };
    match num.as_u64() {
        Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
        Some(v) if v < min => Err(cx.err(&path, n.line, format!("{v} is less than {min}"))),
        Some(v) => Err(cx.err(
            &path,
            n.line,
            format!("{v} is more than {max} (as octal {max:o})"),
        )),
        None => Err(cx.err(
            &path,
            n.line,
            format!("{num} is not a whole number of at least {min} ({what})"),
        )),
    }
}

/// One `devices` item.
fn device(cx: &Cx<'_>, mut d: Fields) -> Res<DockerDevice> {
    d.deny_unknown(cx, &["host_path", "container_path", "cgroup_permissions"])?;
    let p = d.path.clone();
    let mut path = |key: &str, required: bool| -> Res<Option<String>> {
        let line = d.line_of(key);
        let s = d.string(cx, key)?;
        if required && s.is_none() {
            return Err(cx.err(
                &p.key(key),
                d.line,
                "is required (a device node, such as \"/dev/fuse\")",
            ));
        }
        if let Some(s) = &s {
            check_container_path(s)
                .map_err(|why| cx.err(&p.key(key), line, format!("{} {why}", Quoted(s))))?;
        }
        Ok(s)
    };
    let host_path = path("host_path", true)?.unwrap_or_default();
    let container_path = path("container_path", false)?.unwrap_or_else(|| host_path.clone());
    let line = d.line_of("cgroup_permissions");
    let cgroup_permissions =
        check_cgroup_permissions(&d.string(cx, "cgroup_permissions")?.unwrap_or_default())
            .map_err(|e| cx.err(&p.key("cgroup_permissions"), line, e))?;
    Ok(DockerDevice {
        host_path,
        container_path,
        cgroup_permissions,
    })
}

/// `cap_add` or `cap_drop`: names, normalized.
fn capabilities(cx: &Cx<'_>, c: &mut Fields, key: &str) -> Res<Vec<String>> {
    let line = c.line_of(key);
    let path = c.path.key(key);
    let names = c.strings(cx, key)?.unwrap_or_default();
    names
        .iter()
        .enumerate()
        .map(|(i, n)| normalize_capability(n).map_err(|e| cx.err(&path.at(i), line, e)))
        .collect()
}

/// `ulimit { nofile = "2048:4096", nproc = 512 }`.
fn ulimits(cx: &Cx<'_>, u: Fields) -> Res<BTreeMap<String, DockerUlimit>> {
    let mut out = BTreeMap::new();
    for (name, n) in u.items {
        let here = u.path.key(&name);
        if !ULIMIT_NAMES.contains(&name.as_str()) {
            return Err(cx.err(
                &here,
                n.line,
                format!(
                    "unknown ulimit; expected one of: {}",
                    ULIMIT_NAMES.join(", ")
                ),
            ));
        }
        let line = n.line;
        let text = match n.v {
            V::Num(x) => x.to_string(),
            _ => string(cx, &here, n)?,
        };
        let limit: DockerUlimit = text.parse().map_err(|e: String| cx.err(&here, line, e))?;
        if out.insert(name, limit).is_some() {
            return Err(cx.err(&here, line, "given more than once"));
        }
    }
    Ok(out)
}

/// `labels { a = "b" }`: strings (numbers and bools become their text).
fn labels(cx: &Cx<'_>, l: Fields) -> Res<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (k, n) in l.items {
        let here = l.path.key(&k);
        if k.is_empty() {
            return Err(cx.err(&here, n.line, "a label name must not be empty"));
        }
        let line = n.line;
        let v = match n.v {
            V::Num(x) => x.to_string(),
            V::Bool(b) => b.to_string(),
            _ => string(cx, &here, n)?,
        };
        if out.insert(k, v).is_some() {
            return Err(cx.err(&here, line, "given more than once"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_their_fields() {
        let d = DockerTask {
            image: "i".into(),
            entrypoint: Some(vec!["e".into()]),
            privileged: false,
            network_mode: Default::default(),
            volumes: vec!["a:/b".into()],
            mounts: vec![
                DockerMount::Bind {
                    source: "s".into(),
                    target: "/t".into(),
                    readonly: false,
                    propagation: Default::default(),
                },
                DockerMount::Tmpfs {
                    target: "/u".into(),
                    readonly: false,
                    size: None,
                    mode: None,
                },
            ],
            devices: vec![],
            cap_add: vec![],
            cap_drop: vec![],
            ulimits: BTreeMap::new(),
            work_dir: Some("/w".into()),
            labels: BTreeMap::new(),
            ipc_mode: None,
            init: false,
        };
        let config = FieldPath::root().key("config");
        let names: Vec<String> = templates(&d, &config)
            .into_iter()
            .map(|(p, _)| p.to_string())
            .collect();
        assert_eq!(
            names,
            [
                "config.image",
                "config.entrypoint[0]",
                "config.volumes[0]",
                "config.mount[0].source",
                "config.mount[0].target",
                "config.mount[1].target",
                "config.work_dir",
            ]
        );
    }
}
