//! `driver = "docker"` tasks: Nomad's docker `config` keys parsed into [`DockerTask`], every
//! rule's error with its field and line, the checks against the node's docker driver, and
//! Nomad's CSI plugin jobs that run on it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use berth_job::*;

fn hcl(text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(Path::new("/jobs/docker.hcl"), text)
}

fn with_node(text: &str, attrs: &[&str]) -> Result<JobSpec, SpecErrors> {
    let opts = ParseOptions {
        node: Some(NodeKeys {
            attrs: attrs.iter().map(|a| a.to_string()).collect(),
            meta: BTreeSet::new(),
        }),
        ..Default::default()
    };
    JobSpec::parse_with(
        Path::new("/jobs/docker.hcl"),
        text,
        berth_input::Syntax::Hcl,
        &opts,
    )
}

fn task(spec: &JobSpec) -> &TaskSpec {
    &spec.groups[0].tasks[0]
}

fn docker(spec: &JobSpec) -> &DockerTask {
    task(spec).docker.as_ref().expect("a docker task")
}

/// A job whose task `app` runs `driver` with `config` (its body) and `extra` task fields.
fn job_with(driver: &str, config: &str, extra: &str) -> String {
    format!(
        r#"job "j" {{
  group "g" {{
    task "app" {{
      driver = "{driver}"
      config {{
{config}      }}
{extra}    }}
  }}
}}
"#
    )
}

/// A docker task with `image = "redis"` and `config` (more of its body).
fn job(config: &str) -> String {
    job_with(
        "docker",
        &format!("        image = \"redis\"\n{config}"),
        "",
    )
}

const EVERY_KEY: &str = r#"job "j" {
  group "g" {
    task "app" {
      driver = "docker"

      env {
        CONF = "redis.conf"
      }

      config {
        image      = "docker.io/library/redis:${NOMAD_JOB_NAME}"
        command    = "redis-server"
        args       = ["--port", "6379", "${CONF}"]
        entrypoint = ["/bin/tini", "--"]
        privileged = true

        network_mode = "host"

        volumes = [
          "local/conf:/etc/redis:ro",
          "/srv/data:/data:rw",
          "${NOMAD_TASK_DIR}/extra:/extra",
        ]

        mount {
          type     = "bind"
          source   = "./local/certs"
          target   = "/certs/"
          readonly = true

          bind_options {
            propagation = "rslave"
          }
        }

        mount {
          type   = "tmpfs"
          target = "/scratch"

          tmpfs_options {
            size = 100000
            mode = 1023
          }
        }

        devices = [
          {
            host_path = "/dev/fuse"
          },
          {
            host_path          = "/dev/sda"
            container_path     = "/dev/xvda"
            cgroup_permissions = "r"
          },
        ]

        cap_add  = ["sys_admin", "CAP_NET_RAW"]
        cap_drop = ["all"]

        ulimit {
          nofile = "2048:4096"
          nproc  = "512"
          core   = 0
        }

        work_dir = "/data"

        labels {
          team = "storage"
          tier = 1
        }

        pid_mode = "host"
        ipc_mode = "shareable"
        init     = true
      }
    }
  }
}
"#;

/// [`EVERY_KEY`] in HCL's JSON form, with `ulimit` and `labels` as attributes.
const EVERY_KEY_JSON: &str = r#"{"job": {"j": {"group": {"g": {"task": {"app": {
  "driver": "docker",
  "env": {"CONF": "redis.conf"},
  "config": {
    "image": "docker.io/library/redis:${NOMAD_JOB_NAME}",
    "command": "redis-server",
    "args": ["--port", "6379", "${CONF}"],
    "entrypoint": ["/bin/tini", "--"],
    "privileged": true,
    "network_mode": "host",
    "volumes": ["local/conf:/etc/redis:ro", "/srv/data:/data:rw", "${NOMAD_TASK_DIR}/extra:/extra"],
    "mount": [
      {"type": "bind", "source": "./local/certs", "target": "/certs/", "readonly": true,
       "bind_options": {"propagation": "rslave"}},
      {"type": "tmpfs", "target": "/scratch", "tmpfs_options": {"size": 100000, "mode": 1023}}
    ],
    "devices": [
      {"host_path": "/dev/fuse"},
      {"host_path": "/dev/sda", "container_path": "/dev/xvda", "cgroup_permissions": "r"}
    ],
    "cap_add": ["sys_admin", "CAP_NET_RAW"],
    "cap_drop": ["all"],
    "ulimit": {"nofile": "2048:4096", "nproc": "512", "core": 0},
    "work_dir": "/data",
    "labels": {"team": "storage", "tier": 1},
    "pid_mode": "host",
    "ipc_mode": "shareable",
    "init": true
  }
}}}}}}}"#;

#[test]
fn every_key_is_parsed() {
    let spec = hcl(EVERY_KEY).unwrap_or_else(|e| panic!("{e}"));
    let t = task(&spec);
    assert_eq!(t.driver, "docker");
    assert_eq!(t.command, "redis-server");
    assert_eq!(t.args[..2], ["--port", "6379"]);
    assert_eq!(t.args[2].vars().collect::<Vec<_>>(), ["CONF"]);
    assert_eq!(t.pid_mode, Some(PidMode::Host));
    let d = docker(&spec);
    assert_eq!(
        d.image.parts(),
        [
            Part::Lit("docker.io/library/redis:".into()),
            Part::Var("NOMAD_JOB_NAME".into())
        ]
    );
    assert_eq!(
        d.entrypoint,
        Some(vec![
            Template::literal("/bin/tini"),
            Template::literal("--")
        ])
    );
    assert!(d.privileged);
    assert_eq!(d.network_mode, DockerNetwork::Host);
    assert_eq!(
        d.volumes[..2],
        ["local/conf:/etc/redis:ro", "/srv/data:/data:rw"]
    );
    assert_eq!(
        d.volumes[2].vars().collect::<Vec<_>>(),
        ["NOMAD_TASK_DIR"],
        "kept for the node to fill"
    );
    assert_eq!(
        d.mounts,
        [
            DockerMount::Bind {
                source: "./local/certs".into(),
                target: "/certs".into(),
                readonly: true,
                propagation: BindPropagation::Rslave,
            },
            DockerMount::Tmpfs {
                target: "/scratch".into(),
                readonly: false,
                size: Some(100_000),
                mode: Some(1023),
            },
        ]
    );
    assert_eq!(
        d.devices,
        [
            DockerDevice {
                host_path: "/dev/fuse".into(),
                container_path: "/dev/fuse".into(),
                cgroup_permissions: "rwm".into(),
            },
            DockerDevice {
                host_path: "/dev/sda".into(),
                container_path: "/dev/xvda".into(),
                cgroup_permissions: "r".into(),
            },
        ]
    );
    assert_eq!(d.cap_add, ["SYS_ADMIN", "NET_RAW"]);
    assert_eq!(d.cap_drop, ["ALL"]);
    assert_eq!(
        d.ulimits,
        BTreeMap::from([
            ("core".into(), DockerUlimit { soft: 0, hard: 0 }),
            (
                "nofile".into(),
                DockerUlimit {
                    soft: 2048,
                    hard: 4096
                }
            ),
            (
                "nproc".into(),
                DockerUlimit {
                    soft: 512,
                    hard: 512
                }
            ),
        ])
    );
    assert_eq!(d.work_dir, Some(Template::literal("/data")));
    assert_eq!(
        d.labels,
        BTreeMap::from([
            ("team".into(), "storage".into()),
            ("tier".into(), "1".into())
        ])
    );
    assert_eq!(d.ipc_mode, Some(DockerIpc::Shareable));
    assert!(d.init);

    // The JSON form, with ulimit and labels as attributes, reads the same.
    let json = JobSpec::parse(Path::new("/jobs/docker.json"), EVERY_KEY_JSON)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json, spec);
    // So does HCL with ulimit and labels as attributes.
    let attrs = EVERY_KEY
        .replace("ulimit {", "ulimit = {")
        .replace("labels {", "labels = {");
    assert_eq!(hcl(&attrs).unwrap_or_else(|e| panic!("{e}")), spec);

    // The stored form round-trips.
    let stored = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<JobSpec>(&stored).unwrap(), spec);
}

#[test]
fn defaults_and_other_drivers() {
    let spec = hcl(&job("")).unwrap_or_else(|e| panic!("{e}"));
    let t = task(&spec);
    assert_eq!(t.command, "", "no command: the image's own");
    assert!(t.args.is_empty());
    assert_eq!(t.pid_mode, None);
    assert_eq!(
        t.docker,
        Some(DockerTask {
            image: "redis".into(),
            entrypoint: None,
            privileged: false,
            network_mode: DockerNetwork::Bridge,
            volumes: vec![],
            mounts: vec![],
            devices: vec![],
            cap_add: vec![],
            cap_drop: vec![],
            ulimits: BTreeMap::new(),
            work_dir: None,
            labels: BTreeMap::new(),
            ipc_mode: None,
            init: false,
        })
    );
    for mode in ["bridge", "default", ""] {
        let spec = hcl(&job(&format!("        network_mode = \"{mode}\"\n"))).unwrap();
        assert_eq!(docker(&spec).network_mode, DockerNetwork::Bridge, "{mode}");
    }
    let spec = hcl(&job("        network_mode = \"none\"\n")).unwrap();
    assert_eq!(docker(&spec).network_mode, DockerNetwork::None);
    // A mount's propagation defaults to rprivate.
    let spec = hcl(&job(
        "        mount {\n          type = \"bind\"\n          source = \"local\"\n          target = \"/l\"\n        }\n",
    ))
    .unwrap();
    assert!(matches!(
        docker(&spec).mounts[0],
        DockerMount::Bind {
            propagation: BindPropagation::Rprivate,
            readonly: false,
            ..
        }
    ));

    // Other drivers are as they were: no docker part, and none stored.
    let exec = job_with("exec", "        command = \"/bin/app\"\n", "");
    let spec = hcl(&exec).unwrap();
    assert_eq!(task(&spec).docker, None);
    assert!(!serde_json::to_string(&spec).unwrap().contains("docker"));
}

#[test]
fn every_rule_names_the_field_and_the_line() {
    let config = "job.group[g].task[app].config";
    let mount = |body: &str| format!("        mount {{\n{body}        }}\n");
    // (spec, field under config, text on the reported line, what the message says)
    let cases: Vec<(String, &str, &str, &str)> = vec![
        (
            job("        shm_size = 1024\n        dns_servers = []\n"),
            "shm_size",
            "shm_size",
            "unknown field (also unknown: \"dns_servers\"); expected one of: image, command, args",
        ),
        (
            job_with("docker", "        args = [\"x\"]\n", ""),
            "image",
            "config {",
            "is required",
        ),
        (
            job_with("docker", "        image = \" \"\n", ""),
            "image",
            "image",
            "must not be empty",
        ),
        (
            job_with("docker", "", ""),
            "image",
            "config {",
            "is required",
        ),
        (
            job("        command = \"\"\n"),
            "command",
            "command",
            "must not be empty (leave it out to run the image's own command)",
        ),
        (
            job("        entrypoint = \"/bin/sh\"\n"),
            "entrypoint",
            "entrypoint",
            "expected a list of strings",
        ),
        (
            job("        privileged = \"yes\"\n"),
            "privileged",
            "privileged",
            "expected true or false",
        ),
        (
            job("        network_mode = \"container:web\"\n"),
            "network_mode",
            "network_mode",
            "berth runs none, host and bridge",
        ),
        (
            job("        network_mode = \"my-net\"\n"),
            "network_mode",
            "network_mode",
            "berth runs none, host and bridge",
        ),
        (
            job("        ipc_mode = \"container:x\"\n"),
            "ipc_mode",
            "ipc_mode",
            "expected host, none, private or shareable",
        ),
        (
            job("        pid_mode = \"container:x\"\n"),
            "pid_mode",
            "pid_mode",
            "expected private or host",
        ),
        (
            job("        work_dir = \"data\"\n"),
            "work_dir",
            "work_dir",
            "\"data\" is not an absolute path",
        ),
        // volumes
        (
            job(
                "        volumes = [\n          \"local/a:/a\",\n          \"../x:/x\",\n        ]\n",
            ),
            "volumes[1]",
            "../x",
            "\"../x:/x\": the source must stay inside the task directory",
        ),
        (
            job("        volumes = [\"/srv/../etc:/etc\"]\n"),
            "volumes[0]",
            "volumes",
            "the source must not contain \"..\"",
        ),
        (
            job("        volumes = [\"local/a:a\"]\n"),
            "volumes[0]",
            "volumes",
            "the target (after the ':') is not an absolute path",
        ),
        (
            job("        volumes = [\"local/a:/a:z\"]\n"),
            "volumes[0]",
            "volumes",
            "must be ro or rw",
        ),
        (
            job("        volumes = [\"/a\"]\n"),
            "volumes[0]",
            "volumes",
            "expected \"source:target\"",
        ),
        // mount
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"a\"\n          target = \"/a\"\n          consistency = \"cached\"\n",
            )),
            "mount[0].consistency",
            "consistency",
            "unknown field; expected one of: type, source, target, readonly, bind_options, tmpfs_options",
        ),
        (
            job(&mount(
                "          type = \"volume\"\n          source = \"data\"\n          target = \"/a\"\n          volume_options {\n            no_copy = true\n          }\n",
            )),
            "mount[0].type",
            "type = \"volume\"",
            "berth runs no docker named volumes",
        ),
        (
            job(&mount(
                "          source = \"data\"\n          target = \"/a\"\n",
            )),
            "mount[0].type",
            "mount {",
            "is required: Nomad's default type is \"volume\"",
        ),
        (
            job(&mount(
                "          type = \"npipe\"\n          target = \"/a\"\n",
            )),
            "mount[0].type",
            "npipe",
            "expected bind or tmpfs",
        ),
        (
            job(&format!(
                "{}{}",
                mount("          type = \"tmpfs\"\n          target = \"/t\"\n"),
                mount(
                    "          type = \"bind\"\n          source = \"/srv/../x\"\n          target = \"/a\"\n"
                )
            )),
            "mount[1].source",
            "/srv/../x",
            "\"/srv/../x\": the source must not contain \"..\"",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"local/../../x\"\n          target = \"/a\"\n",
            )),
            "mount[0].source",
            "source",
            "must stay inside the task directory",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"local\"\n          target = \"a\"\n",
            )),
            "mount[0].target",
            "target",
            "\"a\" is not an absolute path",
        ),
        (
            job(&mount(
                "          type = \"tmpfs\"\n          target = \"/a/../b\"\n",
            )),
            "mount[0].target",
            "target",
            "must not contain \"..\"",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          target = \"/a\"\n",
            )),
            "mount[0].source",
            "mount {",
            "is required",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"a\"\n",
            )),
            "mount[0].target",
            "mount {",
            "is required",
        ),
        (
            job(&mount(
                "          type = \"tmpfs\"\n          source = \"a\"\n          target = \"/a\"\n",
            )),
            "mount[0].source",
            "source",
            "a tmpfs mount takes no source",
        ),
        (
            job(&mount(
                "          type = \"tmpfs\"\n          target = \"/a\"\n          bind_options {\n            propagation = \"shared\"\n          }\n",
            )),
            "mount[0].bind_options",
            "bind_options",
            "goes with type = \"bind\" only",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"a\"\n          target = \"/a\"\n          bind_options {\n            propagation = \"both\"\n          }\n",
            )),
            "mount[0].bind_options.propagation",
            "propagation",
            "expected rprivate, private, rslave, slave, rshared or shared",
        ),
        (
            job(&mount(
                "          type = \"tmpfs\"\n          target = \"/a\"\n          tmpfs_options {\n            size = 0\n          }\n",
            )),
            "mount[0].tmpfs_options.size",
            "size",
            "0 is less than 1",
        ),
        (
            job(&mount(
                "          type = \"tmpfs\"\n          target = \"/a\"\n          tmpfs_options {\n            mode = 10000\n          }\n",
            )),
            "mount[0].tmpfs_options.mode",
            "mode",
            "10000 is more than 4095",
        ),
        // devices
        (
            job(
                "        devices = [{ host_path = \"/dev/fuse\", cgroup_permissions = \"rwx\" }]\n",
            ),
            "devices[0].cgroup_permissions",
            "devices",
            "\"rwx\": expected some of r, w and m, each at most once",
        ),
        (
            job(
                "        devices = [\n          { host_path = \"/dev/fuse\" },\n          { host_path = \"/dev/sda\", cgroup_permissions = \"rr\" },\n        ]\n",
            ),
            "devices[1].cgroup_permissions",
            "rr",
            "each at most once",
        ),
        (
            job("        devices = [{ container_path = \"/dev/fuse\" }]\n"),
            "devices[0].host_path",
            "devices",
            "is required",
        ),
        (
            job("        devices = [{ host_path = \"fuse\" }]\n"),
            "devices[0].host_path",
            "devices",
            "\"fuse\" is not an absolute path",
        ),
        (
            job("        devices = [{ host_path = \"/dev/fuse\", major = 10 }]\n"),
            "devices[0].major",
            "devices",
            "unknown field",
        ),
        // capabilities
        (
            job("        cap_add = [\"NET_ADMIN\", \"net-raw\"]\n"),
            "cap_add[1]",
            "cap_add",
            "\"net-raw\" is not a capability name",
        ),
        (
            job("        cap_drop = [\"CAP_\"]\n"),
            "cap_drop[0]",
            "cap_drop",
            "is not a capability name",
        ),
        // ulimit
        (
            job(
                "        ulimit {\n          nproc  = \"512\"\n          nofile = \"4096:2048\"\n        }\n",
            ),
            "ulimit.nofile",
            "nofile",
            "soft limit 4096 is more than hard limit 2048",
        ),
        (
            job("        ulimit {\n          nofile = \"lots\"\n        }\n"),
            "ulimit.nofile",
            "nofile",
            "\"lots\": expected \"N\" or \"soft:hard\"",
        ),
        (
            job("        ulimit {\n          files = \"1024\"\n        }\n"),
            "ulimit.files",
            "files",
            "unknown ulimit; expected one of: core, cpu",
        ),
        (
            job("        ulimit {\n          nofile = -1\n        }\n"),
            "ulimit.nofile",
            "nofile",
            "expected \"N\" or \"soft:hard\"",
        ),
        // labels
        (
            job("        labels {\n          team = [\"a\"]\n        }\n"),
            "labels.team",
            "team",
            "expected a string",
        ),
        // references
        (
            job("        work_dir = \"${NOMAD_TASK_DIRR}/x\"\n"),
            "work_dir",
            "work_dir",
            "unknown variable NOMAD_TASK_DIRR",
        ),
        (
            job("        volumes = [\"${NOPE}:/x\"]\n"),
            "volumes[0]",
            "volumes",
            "unknown variable NOPE",
        ),
        (
            job(&mount(
                "          type = \"bind\"\n          source = \"local\"\n          target = \"/${CSI_ENDPOINT}\"\n",
            )),
            "mount[0].target",
            "target",
            "only a task with a csi_plugin block has CSI_ENDPOINT",
        ),
        (
            job_with("docker", "        image = \"${REGISTRY}/redis\"\n", ""),
            "image",
            "image",
            "unknown variable REGISTRY",
        ),
        (
            job("        entrypoint = [\"/bin/${NOMAD_TASKNAME}\"]\n"),
            "entrypoint[0]",
            "entrypoint",
            "unknown variable NOMAD_TASKNAME",
        ),
        (
            job("        labels {\n          alloc = \"${NOMAD_ALLOC_ID}\"\n        }\n"),
            "labels.alloc",
            "alloc",
            "not interpolated here",
        ),
    ];
    for (text, field, needle, what) in cases {
        let e = match hcl(&text) {
            Ok(s) => panic!("{text}\nparsed: {s:?}"),
            Err(e) => e,
        };
        let shown = e.to_string();
        let field = format!("{config}.{field}");
        assert_eq!(e.field, field, "{text}\n{shown}");
        let at = text
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"));
        let want_line = text[..at].matches('\n').count() + 1;
        assert_eq!(e.line, Some(want_line), "{text}\n{shown}");
        let prefix = format!("/jobs/docker.hcl:{want_line}: {field}: ");
        assert!(shown.starts_with(&prefix), "{shown}\nshould start {prefix}");
        assert!(shown.contains(what), "{text}\n{shown}\nshould say {what:?}");
    }
}

#[test]
fn json_errors_name_the_field() {
    let cases = [
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "docker", "config": {"image": "x", "mount": [{"type": "bind", "source": "a", "target": "/a"}, {"type": "volume", "target": "/b"}]}}}}}}}}"#,
            "job.group[g].task[t].config.mount[1].type",
            "berth runs no docker named volumes",
        ),
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "docker", "config": {"image": "x", "ulimit": {"nofile": "2:1"}}}}}}}}}"#,
            "job.group[g].task[t].config.ulimit.nofile",
            "soft limit 2 is more than hard limit 1",
        ),
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "docker", "config": {"image": "x", "devices": [{"host_path": "/dev/fuse", "cgroup_permissions": "q"}]}}}}}}}}"#,
            "job.group[g].task[t].config.devices[0].cgroup_permissions",
            "expected some of r, w and m",
        ),
    ];
    for (text, field, what) in cases {
        let e = JobSpec::parse(Path::new("/jobs/j.json"), text).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.line, None, "{e}");
        assert!(e.to_string().contains(what), "{e}\nshould say {what:?}");
    }
}

#[test]
fn privileged_needs_the_node_to_allow_it() {
    let text = job("        privileged = true\n");
    // No node given: not checked.
    assert!(docker(&hcl(&text).unwrap()).privileged);
    let e = with_node(&text, &["driver.docker"]).unwrap_err();
    let e = e.first();
    assert_eq!(e.field, "job.group[g].task[app].config.privileged");
    let line = text[..text.find("privileged").unwrap()]
        .matches('\n')
        .count()
        + 1;
    assert_eq!(e.line, Some(line));
    assert!(
        e.message.contains("allow_privileged = true")
            && e.message.contains("plugin \"docker\" { config { … } }"),
        "{e}"
    );
    let spec = with_node(&text, &["driver.docker", DOCKER_PRIVILEGED_ATTR]).unwrap();
    assert!(docker(&spec).privileged);
    // Not privileged: nothing to allow.
    with_node(&job("        privileged = false\n"), &[]).unwrap();
}

#[test]
fn host_paths_need_the_node_to_allow_them() {
    let host_volume = job("        volumes = [\"local/a:/a\", \"/srv/data:/data\"]\n");
    let host_mount = job(
        "        mount {\n          type = \"bind\"\n          source = \"/srv/data\"\n          target = \"/data\"\n        }\n",
    );
    for (text, field) in [
        (&host_volume, "job.group[g].task[app].config.volumes[1]"),
        (&host_mount, "job.group[g].task[app].config.mount[0].source"),
    ] {
        // No node given: not checked.
        hcl(text).unwrap_or_else(|e| panic!("{e}"));
        let e = with_node(text, &[]).unwrap_err();
        let e = e.first();
        assert_eq!(e.field, field, "{e}");
        assert!(
            e.message.contains("volumes { enabled = true }")
                && e.message.contains("plugin \"docker\""),
            "{e}"
        );
        with_node(text, &[DOCKER_VOLUMES_ATTR]).unwrap_or_else(|e| panic!("{e}"));
    }
    // Paths in the task directory are always allowed, as in Nomad; a tmpfs has no host path.
    let relative = job(
        "        volumes = [\"local/a:/a\", \"./secrets/b:/b:ro\", \"data:/data\"]\n        mount {\n          type = \"bind\"\n          source = \"local/c\"\n          target = \"/c\"\n        }\n        mount {\n          type = \"tmpfs\"\n          target = \"/t\"\n        }\n",
    );
    with_node(&relative, &[]).unwrap_or_else(|e| panic!("{e}"));
    // A templated source is checked when the alloc is placed.
    with_node(
        &job("        volumes = [\"${NOMAD_TASK_DIR}/x:/x\"]\n"),
        &[],
    )
    .unwrap();
}

#[test]
fn other_drivers_keep_their_config() {
    let cases = [
        (
            job_with(
                "exec",
                "        command = \"/bin/app\"\n        image = \"redis\"\n",
                "",
            ),
            "job.group[g].task[app].config.image",
            "unknown field; expected one of: command, args, pid_mode",
        ),
        (
            job_with(
                "raw_exec",
                "        command = \"/bin/app\"\n        privileged = true\n",
                "",
            ),
            "job.group[g].task[app].config.privileged",
            "unknown field; expected one of: command, args",
        ),
        (
            job_with("exec", "        args = [\"x\"]\n", ""),
            "job.group[g].task[app].config.command",
            "is required",
        ),
    ];
    for (text, field, what) in cases {
        let e = hcl(&text).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(what), "{e}");
    }
    let e = hcl(&job_with("exec", "", "")).unwrap_err();
    assert_eq!(e.field, "job.group[g].task[app].config.command");
}

#[test]
fn errors_never_show_env_values() {
    let text = job_with(
        "docker",
        "        image = \"${TOKEN}\"\n        network_mode = \"container:x\"\n",
        "      env {\n        TOKEN = \"ENVSECRET\"\n      }\n",
    );
    let e = hcl(&text).unwrap_err();
    assert_eq!(e.field, "job.group[g].task[app].config.network_mode");
    assert!(!e.to_string().contains("ENVSECRET"), "{e}");
}

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/nomad/jobs")
        .join(name)
}

#[test]
fn nomads_csi_plugin_jobs_parse() {
    let spec = JobSpec::load(&example("csi-hostpath-plugin.hcl")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.id, "csi-plugin");
    assert_eq!(spec.job_type, JobType::System);
    assert_eq!(spec.datacenters, ["dc1"]);
    let t = task(&spec);
    assert_eq!((t.name.as_str(), t.driver.as_str()), ("plugin", "docker"));
    assert_eq!(t.command, "");
    assert_eq!(t.args[..2], ["--drivername=csi-hostpath", "--v=5"]);
    assert_eq!(
        t.args[2].parts(),
        [
            Part::Lit("--endpoint=".into()),
            Part::Var("CSI_ENDPOINT".into())
        ]
    );
    assert_eq!(
        t.args[3].parts(),
        [
            Part::Lit("--nodeid=node-".into()),
            Part::Var("NOMAD_ALLOC_INDEX".into())
        ]
    );
    let d = docker(&spec);
    assert_eq!(d.image, "localhost/berth-hostpath:latest");
    assert!(d.privileged);
    let p = t.csi_plugin.as_ref().unwrap();
    assert_eq!(
        (p.id.as_str(), p.plugin_type),
        ("hostpath-plugin0", CsiPluginType::Monolith)
    );
    assert_eq!(p.mount_dir, "/csi");
    assert_eq!(
        t.resources,
        Resources {
            cpu_mhz: 256,
            memory_mb: 128
        }
    );

    let spec = JobSpec::load(&example("csi-ebs-node-plugin.hcl")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.id, "plugin-aws-ebs-nodes");
    assert_eq!(spec.job_type, JobType::System);
    assert_eq!(spec.rules.constraints.len(), 1);
    assert_eq!(spec.groups[0].name, "nodes");
    let t = task(&spec);
    assert_eq!((t.name.as_str(), t.driver.as_str()), ("plugin", "docker"));
    assert_eq!(t.args[0], "node");
    assert_eq!(
        t.args[1].parts(),
        [
            Part::Lit("--endpoint=".into()),
            Part::Var("CSI_ENDPOINT".into())
        ]
    );
    assert_eq!(t.args[2..], ["--logtostderr", "--v=5"]);
    let d = docker(&spec);
    assert_eq!(d.image, "localhost/berth-hostpath:latest");
    assert!(d.privileged);
    let p = t.csi_plugin.as_ref().unwrap();
    assert_eq!(
        (p.id.as_str(), p.plugin_type),
        ("aws-ebs0", CsiPluginType::Node)
    );
    assert_eq!(p.mount_dir, "/csi");
    assert_eq!(
        t.resources,
        Resources {
            cpu_mhz: 500,
            memory_mb: 256
        }
    );
}
