//! What a task's `${…}` references stand for, and an alloc's spec with every reference filled
//! in: Nomad's runtime variables (`NOMAD_ALLOC_ID`, `NOMAD_TASK_DIR`…), `CSI_ENDPOINT`, the
//! node's `attr.*`, `node.*` and `meta.*`, and the task's own `env` keys.
//!
//! An alloc is rendered once, when it is placed: the stored spec holds the values, so a task
//! restarted after an agent restart sees what it saw before. Each task also gets the `NOMAD_*`
//! variables in its environment (its `env` wins).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use berth_job::{DockerMount, DockerTask, DockerVolume, JobSpec, TaskSpec, Template};
use serde::{Deserialize, Serialize};

use crate::record::AllocSpec;

/// The node as jobs see it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVars {
    /// `node.unique.id`.
    pub id: String,
    /// `node.unique.name`.
    pub name: String,
    /// `node.datacenter` and `NOMAD_DC`.
    pub datacenter: String,
    /// `node.region`, and `NOMAD_REGION` for jobs that name none.
    pub region: String,
    /// `node.class`.
    pub class: String,
    /// `attr.<key>`: what the agent fingerprints (`unique.hostname`, `kernel.name`,
    /// `cpu.arch`, `os.name`, `driver.<name>`…).
    pub attrs: BTreeMap<String, String>,
    /// `meta.<key>`: the operator's.
    pub meta: BTreeMap<String, String>,
}

impl NodeVars {
    /// The value of a `node.*`, `attr.*` or `meta.*` reference.
    fn lookup(&self, name: &str) -> Option<String> {
        if let Some(key) = name.strip_prefix("attr.") {
            return self.attrs.get(key).cloned();
        }
        if let Some(key) = name.strip_prefix("meta.") {
            return self.meta.get(key).cloned();
        }
        match name {
            "node.unique.id" => Some(self.id.clone()),
            "node.unique.name" => Some(self.name.clone()),
            "node.datacenter" => Some(self.datacenter.clone()),
            "node.region" => Some(self.region.clone()),
            "node.class" => Some(self.class.clone()),
            _ => None,
        }
    }
}

/// What rendering needs to know of the node and its drivers.
pub struct RenderEnv<'a> {
    /// The node.
    pub node: &'a NodeVars,
    /// Where alloc directories go (`<allocs dir>/<alloc id>`).
    pub allocs_dir: &'a Path,
    /// Whether a driver gives its tasks a root of their own (then a task sees its
    /// directories as `/alloc`, `/local`, `/secrets`).
    pub chroot: &'a dyn Fn(&str) -> bool,
    /// `CSI_ENDPOINT` of a plugin task: (alloc id, task, its rendered `mount_dir`).
    pub csi_endpoint: &'a dyn Fn(&str, &TaskSpec, &Path) -> String,
}

impl std::fmt::Debug for RenderEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderEnv")
            .field("node", &self.node.id)
            .field("allocs_dir", &self.allocs_dir)
            .finish_non_exhaustive()
    }
}

/// A reference that cannot be filled, or a rendered value that is not allowed where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RenderError {
    /// The spec line, when known.
    pub line: Option<usize>,
    /// Where: `job.group[g].task[t].config.args[0]`.
    pub field: String,
    /// What is wrong; never a rendered value of `env`.
    pub message: String,
}

/// The directories of a task: on the host, and as the task sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPaths {
    /// `<allocs dir>/<alloc id>`.
    pub alloc_root: PathBuf,
    /// `<alloc root>/alloc`: shared by the alloc's tasks.
    pub alloc_dir: PathBuf,
    /// `<alloc root>/<task>`: the task's own.
    pub task_dir: PathBuf,
    /// `NOMAD_ALLOC_DIR`, `NOMAD_TASK_DIR` (`local/`) and `NOMAD_SECRETS_DIR` as the task
    /// sees them.
    pub seen: [String; 3],
}

impl TaskPaths {
    /// The paths of task `task` of alloc `alloc_id`; `chroot`: its driver gives it a root.
    pub fn new(allocs_dir: &Path, alloc_id: &str, task: &str, chroot: bool) -> Self {
        let alloc_root = allocs_dir.join(alloc_id);
        let alloc_dir = alloc_root.join("alloc");
        let task_dir = alloc_root.join(task);
        let seen = if chroot {
            ["/alloc".into(), "/local".into(), "/secrets".into()]
        } else {
            [
                alloc_dir.display().to_string(),
                task_dir.join("local").display().to_string(),
                task_dir.join("secrets").display().to_string(),
            ]
        };
        Self {
            alloc_root,
            alloc_dir,
            task_dir,
            seen,
        }
    }
}

/// Nomad's runtime variables of one task.
pub fn nomad_vars(
    job: &JobSpec,
    alloc: &AllocSpec,
    task: &TaskSpec,
    node: &NodeVars,
    paths: &TaskPaths,
) -> BTreeMap<String, String> {
    let [alloc_dir, task_dir, secrets_dir] = paths.seen.clone();
    let group = &alloc.group.name;
    [
        ("NOMAD_ALLOC_ID", alloc.alloc_id.clone()),
        ("NOMAD_ALLOC_INDEX", alloc.index.to_string()),
        (
            "NOMAD_ALLOC_NAME",
            format!("{}.{group}[{}]", job.id, alloc.index),
        ),
        ("NOMAD_ALLOC_DIR", alloc_dir),
        ("NOMAD_TASK_DIR", task_dir),
        ("NOMAD_SECRETS_DIR", secrets_dir),
        ("NOMAD_JOB_ID", job.id.clone()),
        ("NOMAD_JOB_NAME", job.id.clone()),
        ("NOMAD_GROUP_NAME", group.clone()),
        ("NOMAD_TASK_NAME", task.name.clone()),
        ("NOMAD_DC", node.datacenter.clone()),
        (
            "NOMAD_REGION",
            job.region.clone().unwrap_or_else(|| node.region.clone()),
        ),
        (
            "NOMAD_NAMESPACE",
            job.namespace.clone().unwrap_or_else(|| "default".into()),
        ),
        ("NOMAD_CPU_LIMIT", task.resources.cpu_mhz.to_string()),
        ("NOMAD_MEMORY_LIMIT", task.resources.memory_mb.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// `alloc` (placed from `job`) with every template of its tasks filled in, and the `NOMAD_*`
/// variables added to each task's `env` where it sets none. Every problem is returned, in
/// task order.
pub fn render_alloc(
    job: &JobSpec,
    alloc: &AllocSpec,
    env: &RenderEnv<'_>,
) -> Result<AllocSpec, Vec<RenderError>> {
    let mut out = alloc.clone();
    let mut errors = Vec::new();
    let base = format!("job.group[{}]", alloc.group.name);
    for task in &mut out.group.tasks {
        let chroot = (env.chroot)(&task.driver);
        let paths = TaskPaths::new(env.allocs_dir, &alloc.alloc_id, &task.name, chroot);
        let vars = nomad_vars(job, alloc, task, env.node, &paths);
        let at = format!("{base}.task[{}]", task.name);
        if let Err(mut e) = render_task(task, &alloc.alloc_id, &vars, env, &at) {
            errors.append(&mut e);
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Fills one task's templates in place.
fn render_task(
    task: &mut TaskSpec,
    alloc_id: &str,
    vars: &BTreeMap<String, String>,
    env: &RenderEnv<'_>,
    at: &str,
) -> Result<(), Vec<RenderError>> {
    let mut errors = Vec::new();
    let mut fail = |t: &Template, field: String, message: String| {
        errors.push(RenderError {
            line: t.line(),
            field,
            message,
        });
    };

    // Plugin directories first: CSI_ENDPOINT is made from mount_dir.
    let mut endpoint = None;
    if let Some(plugin) = task.csi_plugin.clone() {
        let plain = |name: &str| vars.get(name).cloned().or_else(|| env.node.lookup(name));
        let mount = render_one(&plugin.mount_dir, &plain);
        let stage = render_one(&plugin.stage_publish_base_dir, &plain);
        match (mount, stage) {
            (Ok(m), Ok(s)) => match berth_job::check_plugin_dirs(&m, &s) {
                Ok((m, s)) => {
                    endpoint = Some((env.csi_endpoint)(alloc_id, task, &m));
                    let p = task.csi_plugin.as_mut().expect("cloned above");
                    p.mount_dir = Template::literal(m.display().to_string());
                    p.stage_publish_base_dir = Template::literal(s.display().to_string());
                }
                Err(m) => fail(&plugin.mount_dir, format!("{at}.csi_plugin"), m),
            },
            (Err(m), _) => fail(&plugin.mount_dir, format!("{at}.csi_plugin.mount_dir"), m),
            (_, Err(m)) => fail(
                &plugin.stage_publish_base_dir,
                format!("{at}.csi_plugin.stage_publish_base_dir"),
                m,
            ),
        }
    }

    // Env values see the runtime variables, CSI_ENDPOINT and the node, not each other.
    let plain = |name: &str| {
        vars.get(name)
            .cloned()
            .or_else(|| (name == "CSI_ENDPOINT").then(|| endpoint.clone()).flatten())
            .or_else(|| env.node.lookup(name))
    };
    let mut rendered_env = BTreeMap::new();
    for (k, v) in &task.env {
        match render_one(v, &plain) {
            Ok(s) => {
                rendered_env.insert(k.clone(), s);
            }
            Err(m) => fail(v, format!("{at}.env.{k}"), m),
        }
    }
    let full = |name: &str| plain(name).or_else(|| rendered_env.get(name).cloned());

    match render_one(&task.command, &full) {
        Ok(s) => task.command = Template::literal(s),
        Err(m) => fail(&task.command, format!("{at}.config.command"), m),
    }
    for (i, a) in task.args.iter_mut().enumerate() {
        match render_one(a, &full) {
            Ok(s) => *a = Template::literal(s),
            Err(m) => fail(a, format!("{at}.config.args[{i}]"), m),
        }
    }
    if let Some(d) = task.docker.as_mut() {
        render_docker(d, &full, &plain, &format!("{at}.config"), &mut fail);
    }
    let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, m) in task.volume_mounts.iter_mut().enumerate() {
        let field = format!("{at}.volume_mount[{i}].destination");
        let rendered =
            render_one(&m.destination, &full).and_then(|s| berth_job::check_destination(&s));
        match rendered {
            Ok(p) => {
                if let Some(first) = seen.get(&p) {
                    fail(
                        &m.destination,
                        field,
                        format!("same destination as volume_mount[{first}]"),
                    );
                    continue;
                }
                seen.insert(p.clone(), i);
                m.destination = Template::literal(p.display().to_string());
            }
            Err(msg) => fail(&m.destination, field, msg),
        }
    }

    for (k, v) in vars {
        rendered_env.entry(k.clone()).or_insert_with(|| v.clone());
    }
    task.env = rendered_env
        .into_iter()
        .map(|(k, v)| (k, Template::literal(v)))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Said instead of a rendered value that holds an `env` value (rule 7).
const NOT_REPEATED: &str = "(the value is not repeated: it holds an env value)";

/// Fills a docker task's templates in place (`full` fills them; what `plain` cannot fill came
/// from `env`) and checks what they became: the image is not empty, every `volumes` entry
/// parses, mount targets are absolute without `..`, bind sources have no `..` and `work_dir`
/// is absolute. A value made with an `env` value is not repeated in an error.
fn render_docker(
    d: &mut DockerTask,
    full: &dyn Fn(&str) -> Option<String>,
    plain: &dyn Fn(&str) -> Option<String>,
    config: &str,
    fail: &mut dyn FnMut(&Template, String, String),
) {
    let secret = |t: &Template| t.vars().any(|v| plain(v).is_none());
    let shown = |t: &Template, s: &str, why: &str, sep: &str| {
        if secret(t) {
            format!("{why} {NOT_REPEATED}")
        } else {
            format!("{s:?}{sep}{why}")
        }
    };

    match render_one(&d.image, full) {
        Ok(s) if s.trim().is_empty() => fail(
            &d.image,
            format!("{config}.image"),
            "is empty once its variables are filled".into(),
        ),
        Ok(s) => d.image = Template::literal(s),
        Err(m) => fail(&d.image, format!("{config}.image"), m),
    }
    for (i, e) in d.entrypoint.iter_mut().flatten().enumerate() {
        match render_one(e, full) {
            Ok(s) => *e = Template::literal(s),
            Err(m) => fail(e, format!("{config}.entrypoint[{i}]"), m),
        }
    }
    for (i, v) in d.volumes.iter_mut().enumerate() {
        let field = format!("{config}.volumes[{i}]");
        let checked = render_one(v, full).and_then(|s| {
            let parsed = if secret(v) {
                DockerVolume::parse(&s).map_err(|why| format!("{why} {NOT_REPEATED}"))
            } else {
                berth_job::parse_docker_volume(&s)
            };
            parsed.map(|_| s)
        });
        match checked {
            Ok(s) => *v = Template::literal(s),
            Err(m) => fail(v, field, m),
        }
    }
    for (i, m) in d.mounts.iter_mut().enumerate() {
        let here = format!("{config}.mount[{i}]");
        let (source, target) = match m {
            DockerMount::Bind { source, target, .. } => (Some(source), target),
            DockerMount::Tmpfs { target, .. } => (None, target),
        };
        let rendered = render_one(target, full).and_then(|s| {
            berth_job::check_container_path(&s).map_err(|why| shown(target, &s, why, " "))
        });
        match rendered {
            Ok(p) => *target = Template::literal(p.display().to_string()),
            Err(msg) => fail(target, format!("{here}.target"), msg),
        }
        if let Some(source) = source {
            let rendered = render_one(source, full).and_then(|s| {
                berth_job::check_bind_source(&s)
                    .map(|()| s.clone())
                    .map_err(|why| shown(source, &s, why, ": "))
            });
            match rendered {
                Ok(s) => *source = Template::literal(s),
                Err(msg) => fail(source, format!("{here}.source"), msg),
            }
        }
    }
    if let Some(w) = d.work_dir.as_mut() {
        let rendered = render_one(w, full).and_then(|s| {
            if s.starts_with('/') {
                Ok(s)
            } else {
                Err(shown(w, &s, "is not an absolute path", " "))
            }
        });
        match rendered {
            Ok(s) => *w = Template::literal(s),
            Err(msg) => fail(w, format!("{config}.work_dir"), msg),
        }
    }
}

fn render_one(t: &Template, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    t.render(lookup).map_err(|name| {
        let hint = if name.starts_with("attr.") {
            " (this node has no such attribute: `berth node status --json` lists them)"
        } else if name.starts_with("meta.") {
            " (this node's client.meta has no such key)"
        } else if name == "CSI_ENDPOINT" {
            " (only a task with a csi_plugin block has it)"
        } else {
            ""
        };
        format!("unknown variable {name}{hint}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The task of a one-task docker job whose `config` holds `config`; its `env` has `SUB`
    /// (a path in the task directory) and `UP` (one out of it).
    fn docker_task(config: &str) -> TaskSpec {
        let text = format!(
            "job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"docker\"\n      env {{\n        SUB = \"local/sub\"\n        UP  = \"../ENVUP\"\n      }}\n      config {{\n{config}      }}\n    }}\n  }}\n}}\n"
        );
        let spec =
            JobSpec::parse(Path::new("/jobs/j.hcl"), &text).unwrap_or_else(|e| panic!("{e}"));
        spec.groups[0].tasks[0].clone()
    }

    fn render(task: &mut TaskSpec) -> Result<(), Vec<RenderError>> {
        let node = NodeVars {
            attrs: BTreeMap::from([("unique.hostname".into(), "h1".into())]),
            ..Default::default()
        };
        let env = RenderEnv {
            node: &node,
            allocs_dir: Path::new("/allocs"),
            chroot: &|_| true,
            csi_endpoint: &|_, _, _| String::new(),
        };
        let vars = BTreeMap::from([
            ("NOMAD_TASK_DIR".to_string(), "/local".to_string()),
            ("NOMAD_ALLOC_INDEX".to_string(), "3".to_string()),
        ]);
        render_task(task, "a1", &vars, &env, "job.group[g].task[t]")
    }

    #[test]
    fn docker_templates_are_filled() {
        let mut t = docker_task(
            r#"        image      = "reg/${attr.unique.hostname}:v${NOMAD_ALLOC_INDEX}"
        entrypoint = ["${NOMAD_TASK_DIR}/run"]
        volumes    = ["${SUB}:/sub:ro", "${NOMAD_TASK_DIR}/x:/x"]
        work_dir   = "${NOMAD_TASK_DIR}"
        mount {
          type   = "bind"
          source = "${SUB}"
          target = "/m/${NOMAD_ALLOC_INDEX}/"
        }
        mount {
          type   = "tmpfs"
          target = "/t/${NOMAD_ALLOC_INDEX}"
        }
"#,
        );
        render(&mut t).unwrap();
        let d = t.docker.unwrap();
        assert_eq!(d.image, "reg/h1:v3");
        assert_eq!(d.entrypoint.unwrap(), ["/local/run"]);
        assert_eq!(d.volumes, ["local/sub:/sub:ro", "/local/x:/x"]);
        assert_eq!(d.work_dir.unwrap(), "/local");
        assert_eq!(
            d.mounts,
            [
                DockerMount::Bind {
                    source: "local/sub".into(),
                    target: "/m/3".into(),
                    readonly: false,
                    propagation: Default::default(),
                },
                DockerMount::Tmpfs {
                    target: "/t/3".into(),
                    readonly: false,
                    size: None,
                    mode: None,
                },
            ]
        );
        assert_eq!(t.command, "", "the image's own command");
    }

    #[test]
    fn rendered_docker_values_are_checked() {
        let at = "job.group[g].task[t].config";
        let mount = |source: &str, target: &str| {
            format!(
                "        mount {{\n          type = \"bind\"\n          source = \"{source}\"\n          target = \"{target}\"\n        }}\n"
            )
        };
        // (config, field, what the message says)
        let cases = [
            (
                "        volumes = [\"${UP}:/x\"]\n".to_string(),
                "volumes[0]",
                "the source must stay inside the task directory (no \"..\") (the value is not \
                 repeated: it holds an env value)",
            ),
            (
                "        volumes = [\"up/${NOMAD_ALLOC_INDEX}\"]\n".into(),
                "volumes[0]",
                "\"up/3\": expected \"source:target\"",
            ),
            (
                mount("local", "${NOMAD_ALLOC_INDEX}"),
                "mount[0].target",
                "\"3\" is not an absolute path",
            ),
            (
                mount("local", "/a/${UP}"),
                "mount[0].target",
                "must not contain \"..\" (the value is not repeated",
            ),
            (
                mount("${UP}", "/a"),
                "mount[0].source",
                "must stay inside the task directory (no \"..\") (the value is not repeated",
            ),
            (
                mount("/srv/${NOMAD_TASK_DIR}/../x", "/a"),
                "mount[0].source",
                "\"/srv//local/../x\": the source must not contain \"..\"",
            ),
            (
                "        work_dir = \"x${NOMAD_ALLOC_INDEX}\"\n".into(),
                "work_dir",
                "\"x3\" is not an absolute path",
            ),
            (
                "        image = \"${attr.nope}\"\n".into(),
                "image",
                "unknown variable attr.nope",
            ),
        ];
        for (config, field, what) in cases {
            let config = if config.contains("image") {
                config
            } else {
                format!("        image = \"redis\"\n{config}")
            };
            let mut t = docker_task(&config);
            let errors = render(&mut t).unwrap_err();
            assert_eq!(errors.len(), 1, "{config}\n{errors:?}");
            let e = &errors[0];
            assert_eq!(e.field, format!("{at}.{field}"), "{config}");
            assert!(e.line.is_some(), "{e:?}");
            assert!(
                e.message.contains(what),
                "{config}\n{}\nshould say {what:?}",
                e.message
            );
            assert!(!e.message.contains("ENVUP"), "{e:?}");
        }
    }
}
