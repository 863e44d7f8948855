//! Job specs as `berth job run` reads them: the full form in HCL and JSON, defaults, every
//! validation error with its field and line, and mount flags kept out of errors and Debug.

use std::{collections::BTreeMap, path::Path, time::Duration};

use berth_csi::model::{AccessMode, AttachmentMode};
use berth_job::*;
use berth_volume::StoredMountOptions;

/// A mount flag that must never show in an error or in Debug output.
const FLAG: &str = "password=FLAGSECRET";

const FULL_HCL: &str = r#"# Every field berth reads.
job "full" {
  type        = "batch"
  datacenters = ["dc1", "dc2"]
  priority    = 70

  group "storage" {
    count = 3

    volume "data" {
      type            = "csi"
      source          = "vol-1"
      access_mode     = "multi-node-multi-writer"
      attachment_mode = "file-system"
      read_only       = false
      per_alloc       = true

      mount_options {
        fs_type     = "ext4"
        mount_flags = ["noatime", "password=FLAGSECRET"]
      }
    }

    volume "raw" {
      type            = "csi"
      source          = "raw-1"
      access_mode     = "single-node-reader-only"
      attachment_mode = "block-device"
      read_only       = true
    }

    restart {
      attempts = 5
      interval = "10m"
      delay    = "30s"
      mode     = "delay"
    }

    task "app" {
      driver = "exec"

      config {
        command = "/bin/app"
        args    = ["--port", "8080", "--endpoint=$${CSI_ENDPOINT}"]
      }

      env {
        PORT  = "8080"
        DEBUG = true
        RATIO = 1.5
      }

      volume_mount {
        volume      = "data"
        destination = "/srv/data/"
        read_only   = true
      }

      volume_mount {
        volume      = "raw"
        destination = "/dev/raw"
      }

      resources {
        cpu    = 500
        memory = 256
      }

      kill_timeout = "1m30s"

      restart {
        attempts = 1
      }
    }

    task "plugin" {
      driver = "raw_exec"

      config {
        command = "csi-driver"
      }

      csi_plugin {
        id                     = "ebs"
        type                   = "node"
        mount_dir              = "/csi"
        stage_publish_base_dir = "/local/csi"
        health_timeout         = "1m"
      }
    }
  }

  group "second" {
    task "t" {
      driver = "exec"
      config {
        command = "true"
      }
    }
  }
}
"#;

/// The same job in HCL's JSON form, mixing the forms it allows: one block as an object or a
/// list of objects, labelled blocks as an object of labels or a list of them.
const FULL_JSON: &str = r#"{
  "job": {
    "full": {
      "type": "batch",
      "datacenters": ["dc1", "dc2"],
      "priority": 70,
      "group": [
        {
          "storage": {
            "count": 3,
            "volume": {
              "data": {
                "type": "csi",
                "source": "vol-1",
                "access_mode": "multi-node-multi-writer",
                "attachment_mode": "file-system",
                "read_only": false,
                "per_alloc": true,
                "mount_options": [
                  { "fs_type": "ext4", "mount_flags": ["noatime", "password=FLAGSECRET"] }
                ]
              },
              "raw": [
                {
                  "type": "csi",
                  "source": "raw-1",
                  "access_mode": "single-node-reader-only",
                  "attachment_mode": "block-device",
                  "read_only": true
                }
              ]
            },
            "restart": { "attempts": 5, "interval": "10m", "delay": "30s", "mode": "delay" },
            "task": {
              "app": {
                "driver": "exec",
                "config": {
                  "command": "/bin/app",
                  "args": ["--port", "8080", "--endpoint=$${CSI_ENDPOINT}"]
                },
                "env": { "PORT": "8080", "DEBUG": true, "RATIO": 1.5 },
                "volume_mount": [
                  { "volume": "data", "destination": "/srv/data/", "read_only": true },
                  { "volume": "raw", "destination": "/dev/raw" }
                ],
                "resources": [{ "cpu": 500, "memory": 256 }],
                "kill_timeout": "1m30s",
                "restart": { "attempts": 1 }
              },
              "plugin": {
                "driver": "raw_exec",
                "config": { "command": "csi-driver" },
                "csi_plugin": {
                  "id": "ebs",
                  "type": "node",
                  "mount_dir": "/csi",
                  "stage_publish_base_dir": "/local/csi",
                  "health_timeout": "1m"
                }
              }
            }
          }
        },
        { "second": { "task": { "t": { "driver": "exec", "config": { "command": "true" } } } } }
      ]
    }
  }
}"#;

fn hcl(text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(Path::new("/jobs/job.hcl"), text)
}

fn json(text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(Path::new("/jobs/job.json"), text)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn full_expected() -> JobSpec {
    let group_restart = RestartPolicy {
        attempts: 5,
        interval: secs(600),
        delay: secs(30),
        mode: RestartMode::Delay,
    };
    let data = VolumeRequest {
        name: "data".into(),
        source: "vol-1".into(),
        access_mode: AccessMode::MultiNodeMultiWriter,
        attachment_mode: AttachmentMode::FileSystem,
        read_only: false,
        per_alloc: true,
        mount_options: StoredMountOptions {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into(), FLAG.into()],
            volume_mount_group: String::new(),
        },
    };
    let raw = VolumeRequest {
        name: "raw".into(),
        source: "raw-1".into(),
        access_mode: AccessMode::SingleNodeReaderOnly,
        attachment_mode: AttachmentMode::BlockDevice,
        read_only: true,
        per_alloc: false,
        mount_options: StoredMountOptions::default(),
    };
    let app = TaskSpec {
        name: "app".into(),
        driver: "exec".into(),
        command: "/bin/app".into(),
        args: vec![
            "--port".into(),
            "8080".into(),
            "--endpoint=${CSI_ENDPOINT}".into(),
        ],
        env: BTreeMap::from([
            ("DEBUG".into(), "true".into()),
            ("PORT".into(), "8080".into()),
            ("RATIO".into(), "1.5".into()),
        ]),
        volume_mounts: vec![
            VolumeMount {
                volume: "data".into(),
                destination: "/srv/data".into(),
                read_only: true,
                propagation: PropagationMode::Private,
                selinux_label: None,
            },
            VolumeMount {
                volume: "raw".into(),
                destination: "/dev/raw".into(),
                // The group's volume is read-only.
                read_only: true,
                propagation: PropagationMode::Private,
                selinux_label: None,
            },
        ],
        resources: Resources {
            cpu_mhz: 500,
            memory_mb: 256,
        },
        devices: vec![],
        kill_timeout: secs(90),
        restart: RestartPolicy {
            attempts: 1,
            ..group_restart
        },
        user: None,
        pid_mode: None,
        meta: BTreeMap::new(),
        csi_plugin: None,
        kind: None,
        identities: vec![],
        docker: None,
        logs: LogConfig::default(),
    };
    let plugin = TaskSpec {
        name: "plugin".into(),
        driver: "raw_exec".into(),
        command: "csi-driver".into(),
        args: vec![],
        env: BTreeMap::new(),
        volume_mounts: vec![],
        resources: Resources::default(),
        devices: vec![],
        kill_timeout: DEFAULT_KILL_TIMEOUT,
        restart: group_restart,
        user: None,
        pid_mode: None,
        meta: BTreeMap::new(),
        csi_plugin: Some(CsiPluginSpec {
            id: "ebs".into(),
            plugin_type: CsiPluginType::Node,
            mount_dir: "/csi".into(),
            stage_publish_base_dir: "/local/csi".into(),
            health_timeout: secs(60),
        }),
        kind: None,
        identities: vec![],
        docker: None,
        logs: LogConfig::default(),
    };
    let second = GroupSpec {
        rules: Default::default(),
        name: "second".into(),
        count: 1,
        volumes: BTreeMap::new(),
        restart: RestartPolicy::default_for(JobType::Batch),
        tasks: vec![TaskSpec {
            name: "t".into(),
            driver: "exec".into(),
            command: "true".into(),
            args: vec![],
            env: BTreeMap::new(),
            volume_mounts: vec![],
            resources: Resources::default(),
            devices: vec![],
            kill_timeout: DEFAULT_KILL_TIMEOUT,
            restart: RestartPolicy::default_for(JobType::Batch),
            user: None,
            pid_mode: None,
            meta: BTreeMap::new(),
            csi_plugin: None,
            kind: None,
            identities: vec![],
            docker: None,
            logs: LogConfig::default(),
        }],
        services: vec![],
    };
    JobSpec {
        priority: 70,
        datacenters: vec!["dc1".into(), "dc2".into()],
        rules: Default::default(),
        id: "full".into(),
        job_type: JobType::Batch,
        groups: vec![
            GroupSpec {
                rules: Default::default(),
                name: "storage".into(),
                count: 3,
                volumes: BTreeMap::from([("data".into(), data), ("raw".into(), raw)]),
                restart: group_restart,
                tasks: vec![app, plugin],
                services: vec![],
            },
            second,
        ],
        region: None,
        namespace: None,
    }
}

#[test]
fn full_example_parses_the_same_from_hcl_and_json() {
    let want = full_expected();
    let from_hcl = hcl(FULL_HCL).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_hcl, want);
    let from_json = json(FULL_JSON).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(from_json, want);

    // Helpers on the result.
    let g = want.group("storage").unwrap();
    assert_eq!(g.task("plugin").unwrap().driver, "raw_exec");
    assert!(want.group("nope").is_none() && g.task("nope").is_none());
    assert_eq!(g.volumes["data"].source_for(2), "vol-1[2]");
    assert_eq!(g.volumes["raw"].source_for(2), "raw-1");
    let mo = g.volumes["data"].csi_mount_options();
    assert_eq!(mo.fs_type, "ext4");
    assert_eq!(mo.mount_flags.expose(), ["noatime", FLAG]);
    let t = g
        .task("plugin")
        .unwrap()
        .csi_plugin
        .as_ref()
        .unwrap()
        .plugin_type;
    assert!(t.is_node() && !t.is_controller());
    assert_eq!(
        berth_volume::PluginDir::from(t),
        berth_volume::PluginDir::Node
    );
}

#[test]
fn canonical_json_round_trips_and_keeps_the_flags() {
    let spec = hcl(FULL_HCL).unwrap();
    let stored = serde_json::to_string(&spec).unwrap();
    // The flags are stored (a restart must mount with them); durations are Go strings.
    assert!(stored.contains(FLAG), "{stored}");
    assert!(stored.contains(r#""kill_timeout":"1m30s""#), "{stored}");
    assert!(stored.contains(r#""interval":"10m""#), "{stored}");
    assert!(stored.contains(r#""job_type":"batch""#), "{stored}");
    assert!(stored.contains(r#""plugin_type":"node""#), "{stored}");
    assert!(
        stored.contains(r#""access_mode":"multi-node-multi-writer""#),
        "{stored}"
    );
    let back: JobSpec = serde_json::from_str(&stored).unwrap();
    assert_eq!(back, spec);
    // A bad duration in a stored record is an error, not a default.
    let bad = stored.replace("\"1m30s\"", "\"soon\"");
    let e = serde_json::from_str::<JobSpec>(&bad).unwrap_err();
    assert!(e.to_string().contains("\"soon\""), "{e}");
}

#[test]
fn mount_flags_never_show_in_debug() {
    for spec in [hcl(FULL_HCL).unwrap(), json(FULL_JSON).unwrap()] {
        let out = format!("{spec:?} {spec:#?}");
        assert!(!out.contains("FLAGSECRET"), "{out}");
        assert!(
            out.contains("ext4") && out.contains(berth_csi::REDACTED),
            "{out}"
        );
    }
}

#[test]
fn defaults_are_applied() {
    let spec = hcl(r#"
job "min" {
  group "g" {
    volume "v" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/true"
      }
      csi_plugin {
        id   = "p"
        type = "monolith"
      }
    }
  }
}
"#)
    .unwrap();
    assert_eq!(spec.id, "min");
    assert_eq!(spec.job_type, JobType::Service);
    assert_eq!(spec.priority, rules::DEFAULT_PRIORITY);
    assert!(spec.datacenters.is_empty() && spec.rules.is_empty());
    assert!(spec.groups[0].rules.is_empty());
    let g = &spec.groups[0];
    assert_eq!(g.count, 1);
    let service = RestartPolicy {
        attempts: 2,
        interval: secs(30 * 60),
        delay: secs(15),
        mode: RestartMode::Fail,
    };
    assert_eq!(g.restart, service);
    assert_eq!(RestartPolicy::default_for(JobType::Service), service);
    assert_eq!(
        RestartPolicy::default_for(JobType::Batch),
        RestartPolicy {
            attempts: 3,
            interval: secs(24 * 3600),
            ..service
        }
    );
    let v = &g.volumes["v"];
    assert_eq!(v.attachment_mode, AttachmentMode::FileSystem);
    assert!(!v.read_only && !v.per_alloc);
    assert_eq!(v.mount_options, StoredMountOptions::default());
    let t = &g.tasks[0];
    assert!(t.args.is_empty() && t.env.is_empty() && t.volume_mounts.is_empty());
    assert_eq!(t.kill_timeout, secs(5));
    assert_eq!(t.restart, service);
    assert_eq!(
        t.resources,
        Resources {
            cpu_mhz: 100,
            memory_mb: 300
        }
    );
    assert_eq!(
        t.csi_plugin,
        Some(CsiPluginSpec {
            id: "p".into(),
            plugin_type: CsiPluginType::Monolith,
            mount_dir: "/csi".into(),
            stage_publish_base_dir: "/local/csi".into(),
            health_timeout: secs(30),
        })
    );

    // A task's restart block changes only the fields it gives.
    let spec = hcl(r#"
job "j" {
  type = "batch"
  group "g" {
    restart {
      delay = "1s"
    }
    task "t" {
      driver = "exec"
      config {
        command = "x"
      }
      restart {
        mode     = "delay"
        interval = "1h"
      }
    }
  }
}
"#)
    .unwrap();
    let g = &spec.groups[0];
    assert_eq!(
        g.restart,
        RestartPolicy {
            attempts: 3,
            interval: secs(24 * 3600),
            delay: secs(1),
            mode: RestartMode::Fail
        }
    );
    assert_eq!(
        g.tasks[0].restart,
        RestartPolicy {
            attempts: 3,
            interval: secs(3600),
            delay: secs(1),
            mode: RestartMode::Delay
        }
    );
}

/// A job with one group "web" and one task "app"; `group` and `task` are put inside them.
fn job(group: &str, task: &str) -> String {
    format!(
        r#"job "j" {{
  group "web" {{
{group}
    task "app" {{
      driver = "exec"
      config {{
        command = "/bin/app"
      }}
{task}
    }}
  }}
}}
"#
    )
}

const VOLUME: &str = r#"    volume "data" {
      type        = "csi"
      source      = "demo"
      access_mode = "single-node-writer"
    }
"#;

fn plugin(body: &str) -> String {
    job(
        "",
        &format!(
            "      csi_plugin {{\n        id = \"p\"\n        type = \"node\"\n{body}      }}\n"
        ),
    )
}

#[test]
fn every_rule_names_the_field_and_the_line() {
    let long_flags: Vec<String> = (0..400).map(|i| format!("\"{FLAG}{i}\"")).collect();
    // (spec, field, text on the reported line (None: no line), what the message says)
    let cases: Vec<(String, &str, Option<&str>, &str)> = vec![
        // names
        (
            job("", "").replace("job \"j\"", "job \"a/b\""),
            "job",
            Some("job \"a/b\""),
            "invalid job id \"a/b\": must not contain '/'",
        ),
        (
            job("", "").replace("group \"web\"", "group \"..\""),
            "job.group[\"..\"]",
            Some("group \"..\""),
            "invalid group name",
        ),
        (
            job("", "").replace("task \"app\"", "task \"a\\u0000b\""),
            "job.group[web].task[\"a\\0b\"]",
            Some("task \"a"),
            "invalid task name",
        ),
        (
            job(&VOLUME.replace("volume \"data\"", "volume \"d/x\""), ""),
            "job.group[web].volume[\"d/x\"]",
            Some("volume \"d/x\""),
            "invalid volume name",
        ),
        (
            job(&VOLUME.replace("\"demo\"", "\"a/b\""), ""),
            "job.group[web].volume[data].source",
            Some("source"),
            "invalid volume id",
        ),
        (
            plugin("").replace("id = \"p\"", "id = \"..\""),
            "job.group[web].task[app].csi_plugin.id",
            Some("id = \"..\""),
            "invalid plugin id",
        ),
        // duplicates
        (
            format!(
                "{}\n{}",
                job("", "").trim_end().trim_end_matches('}'),
                "  group \"web\" {\n    task \"x\" {\n      driver = \"exec\"\n      config {\n        command = \"x\"\n      }\n    }\n  }\n}\n"
            ),
            "job.group[web]",
            Some("  group \"web\" {\n    task \"x\""),
            "duplicate group name \"web\" (first at line 2)",
        ),
        (
            job("", "    }\n    task \"app\" {\n      driver = \"exec\"\n      config {\n        command = \"y\"\n      }"),
            "job.group[web].task[app]",
            Some("    task \"app\" {\n      driver = \"exec\"\n      config {\n        command = \"y\""),
            "duplicate task name \"app\" (first at line 4)",
        ),
        (
            job(&format!("{VOLUME}{}", VOLUME.replace("\"data\" {", "\"data\" { # again")), ""),
            "job.group[web].volume[data]",
            Some("# again"),
            "duplicate volume name \"data\"",
        ),
        (
            job(&format!("{VOLUME}{}", VOLUME.replace("\"data\" {", "\"copy\" {").replace("\"demo\"", "\"demo\" # again")), ""),
            "job.group[web].volume[copy].source",
            Some("# again"),
            "alloc 0 would claim volume \"demo\" twice, here and in volume \"data\"",
        ),
        (
            // per_alloc "d" gives alloc 1 the volume "d[1]", which the other block names.
            job(
                &format!(
                    "    count = 2\n{}{}",
                    VOLUME.replace("\"demo\"", "\"d\"\n      per_alloc = true"),
                    VOLUME.replace("\"data\" {", "\"one\" {").replace("\"demo\"", "\"d[1]\" # same")
                ),
                "",
            ),
            "job.group[web].volume[one].source",
            Some("# same"),
            "alloc 1 would claim volume \"d[1]\" twice",
        ),
        // volume_mount
        (
            job(VOLUME, "      volume_mount {\n        volume = \"logs\"\n        destination = \"/logs\"\n      }\n"),
            "job.group[web].task[app].volume_mount[0].volume",
            Some("volume = \"logs\""),
            "no volume \"logs\" in this group (the group declares \"data\")",
        ),
        (
            job("", "      volume_mount {\n        volume = \"data\"\n        destination = \"/data\"\n      }\n"),
            "job.group[web].task[app].volume_mount[0].volume",
            Some("volume = \"data\""),
            "the group declares no volume",
        ),
        (
            job(VOLUME, "      volume_mount {\n        volume = \"data\"\n        destination = \"/a\"\n      }\n      volume_mount {\n        volume = \"data\"\n        destination = \"data\"\n      }\n"),
            "job.group[web].task[app].volume_mount[1].destination",
            Some("destination = \"data\""),
            "\"data\" is not an absolute path",
        ),
        (
            job(VOLUME, "      volume_mount {\n        volume = \"data\"\n        destination = \"/srv/../etc\"\n      }\n"),
            "job.group[web].task[app].volume_mount[0].destination",
            Some("destination = \"/srv/../etc\""),
            "must not contain \"..\"",
        ),
        (
            job(VOLUME, "      volume_mount {\n        volume = \"data\"\n        destination = \"/a\"\n      }\n      volume_mount {\n        volume = \"data\"\n        destination = \"/a/\"\n      }\n"),
            "job.group[web].task[app].volume_mount[1].destination",
            Some("destination = \"/a/\""),
            "same destination as volume_mount[0]",
        ),
        (
            job(VOLUME, "      volume_mount {\n        volume = \"data\"\n      }\n"),
            "job.group[web].task[app].volume_mount[0].destination",
            Some("volume_mount {"),
            "is required",
        ),
        // csi_plugin directories
        (
            plugin("        mount_dir = \"/local/csi/sock\"\n"),
            "job.group[web].task[app].csi_plugin.mount_dir",
            Some("mount_dir"),
            "/local/csi/sock lies inside stage_publish_base_dir /local/csi",
        ),
        (
            plugin("        mount_dir = \"/x/\"\n        stage_publish_base_dir = \"/x\"\n"),
            "job.group[web].task[app].csi_plugin.mount_dir",
            Some("mount_dir"),
            "/x lies inside stage_publish_base_dir /x (or is it)",
        ),
        (
            plugin("        stage_publish_base_dir = \"/csi/volumes\"\n"),
            "job.group[web].task[app].csi_plugin.stage_publish_base_dir",
            Some("stage_publish_base_dir"),
            "/csi/volumes lies inside mount_dir /csi",
        ),
        (
            plugin("        mount_dir = \"csi\"\n"),
            "job.group[web].task[app].csi_plugin.mount_dir",
            Some("mount_dir"),
            "\"csi\" is not an absolute path",
        ),
        (
            plugin("        stage_publish_base_dir = \"local/csi\"\n"),
            "job.group[web].task[app].csi_plugin.stage_publish_base_dir",
            Some("stage_publish_base_dir"),
            "not an absolute path",
        ),
        (
            plugin("        type = \"sidecar\"\n").replace("        type = \"node\"\n", ""),
            "job.group[web].task[app].csi_plugin.type",
            Some("sidecar"),
            "unknown plugin type \"sidecar\" (expected node, controller or monolith)",
        ),
        (
            plugin("        health_timeout = \"0s\"\n"),
            "job.group[web].task[app].csi_plugin.health_timeout",
            Some("health_timeout"),
            "must be more than 0",
        ),
        // groups
        (
            "job \"j\" {\n  group \"web\" {\n    count = 2\n  }\n}\n".into(),
            "job.group[web].task",
            Some("group \"web\""),
            "a group has at least one task",
        ),
        (
            "job \"j\" {\n  type = \"batch\"\n}\n".into(),
            "job.group",
            Some("job \"j\""),
            "a job has at least one group",
        ),
        (
            job("    count = 0\n", ""),
            "job.group[web].count",
            Some("count = 0"),
            "0 is less than 1",
        ),
        (
            job("    count = 101\n", ""),
            "job.group[web].count",
            Some("count = 101"),
            "101 is more than 100",
        ),
        (
            job("    count = 1.5\n", ""),
            "job.group[web].count",
            Some("count = 1.5"),
            "1.5 is not a whole number",
        ),
        (
            job("    count = \"2\"\n", ""),
            "job.group[web].count",
            Some("count = \"2\""),
            "expected a whole number, found a string",
        ),
        // unknown fields, at every level
        (
            "colour = \"blue\"\njob \"j\" {}\n".into(),
            "colour",
            Some("colour"),
            "unknown field; expected one of: job",
        ),
        (
            job("", "").replace("job \"j\" {", "job \"j\" {\n  update = \"eu\"\n  vault = 50"),
            "job.update",
            Some("update"),
            "unknown field (also unknown: \"vault\"); expected one of: type, datacenters, group, \
             region, namespace, priority, meta, constraint, affinity, spread",
        ),
        (
            job("    spread {\n      attribute = \"${node.datacenter}\"\n    }\n", "      affinity {\n      }\n"),
            "job.group[web].task[app].affinity",
            Some("affinity {"),
            "unknown field; expected one of: config, env",
        ),
        (
            job("    network {\n      mode = \"bridge\"\n    }\n", ""),
            "job.group[web].network",
            Some("network {"),
            "unknown field",
        ),
        (
            job("", "      vault {\n      }\n"),
            "job.group[web].task[app].vault",
            Some("vault"),
            "unknown field; expected one of: config, env, volume_mount, resources, kill_timeout, restart, csi_plugin, user, meta",
        ),
        (
            job("", "").replace("command = \"/bin/app\"", "command = \"/bin/app\"\n        image = \"redis\""),
            "job.group[web].task[app].config.image",
            Some("image"),
            "expected one of: command, args",
        ),
        (
            job(&VOLUME.replace("access_mode", "sticky = true\n      access_mode"), ""),
            "job.group[web].volume[data].sticky",
            Some("sticky"),
            "unknown field",
        ),
        (
            job(&VOLUME.replace("    }\n", "      mount_options {\n        mount_flags = [\"password=FLAGSECRET\"]\n        owner = \"me\"\n      }\n    }\n"), ""),
            "job.group[web].volume[data].mount_options",
            Some("owner"),
            "unknown field (not repeated: it could be a mount flag); expected one of: fs_type, mount_flags",
        ),
        (
            job("    restart {\n      render_templates = \"yes\"\n    }\n", ""),
            "job.group[web].restart.render_templates",
            Some("render_templates"),
            "expected true or false",
        ),
        (
            job("    volume \"data\" {\n      type = \"csi\"\n      source = \"v\"\n      access_mode = \"single-node-writer\"\n    }\n", "      volume_mount {\n        volume = \"data\"\n        destination = \"/a\"\n        propagation_mode = \"rslave\"\n      }\n"),
            "job.group[web].task[app].volume_mount[0].propagation_mode",
            Some("propagation_mode"),
            "expected private, host-to-task or bidirectional",
        ),
        (
            job("", "      resources {\n        cores = 2\n      }\n"),
            "job.group[web].task[app].resources.cores",
            Some("cores"),
            "expected one of: cpu, memory",
        ),
        (
            plugin("        socket = \"x\"\n"),
            "job.group[web].task[app].csi_plugin.socket",
            Some("socket"),
            "unknown field",
        ),
        // driver and config
        (
            job("", "").replace("driver = \"exec\"", "driver = \"\""),
            "job.group[web].task[app].driver",
            Some("driver = \"\""),
            "must not be empty",
        ),
        (
            job("", "").replace("      driver = \"exec\"\n", ""),
            "job.group[web].task[app].driver",
            Some("task \"app\""),
            "is required",
        ),
        (
            job("", "").replace("      config {\n        command = \"/bin/app\"\n      }\n", ""),
            "job.group[web].task[app].config",
            Some("task \"app\""),
            "is required",
        ),
        (
            job("", "").replace("command = \"/bin/app\"", "args = [\"x\"]"),
            "job.group[web].task[app].config.command",
            Some("config {"),
            "is required",
        ),
        (
            job("", "").replace("command = \"/bin/app\"", "command = \"/bin/app\"\n        args = [\"-v\", [3]]"),
            "job.group[web].task[app].config.args[1]",
            Some("args"),
            "expected a string, found a list",
        ),
        (
            job("", "      env {\n        A = [\"x\"]\n      }\n"),
            "job.group[web].task[app].env.A",
            Some("A = "),
            "expected a string, found a list",
        ),
        (
            job("", "      env = {\n        \"A=B\" = \"x\"\n      }\n"),
            "job.group[web].task[app].env[\"A=B\"]",
            Some("\"A=B\""),
            "is not a valid variable name",
        ),
        // resources
        (
            job("", "      resources {\n        memory = 5\n      }\n"),
            "job.group[web].task[app].resources.memory",
            Some("memory = 5"),
            "5 is less than 10",
        ),
        (
            job("", "      resources {\n        cpu = 0\n      }\n"),
            "job.group[web].task[app].resources.cpu",
            Some("cpu = 0"),
            "0 is less than 1",
        ),
        (
            job("", "      resources {\n        cpu = -5\n      }\n"),
            "job.group[web].task[app].resources.cpu",
            Some("cpu = -5"),
            "-5 is less than 1",
        ),
        (
            job("", "      resources {\n        cpu = 5000000000\n      }\n"),
            "job.group[web].task[app].resources.cpu",
            Some("cpu = 5000000000"),
            "is more than 4294967295",
        ),
        // durations
        (
            job("", "      kill_timeout = \"5 seconds\"\n"),
            "job.group[web].task[app].kill_timeout",
            Some("kill_timeout"),
            "\"5 seconds\" is not a duration: unknown unit",
        ),
        (
            job("", "      kill_timeout = 5\n"),
            "job.group[web].task[app].kill_timeout",
            Some("kill_timeout"),
            "expected a duration string such as \"30s\"",
        ),
        (
            job("    restart {\n      interval = \"-1m\"\n    }\n", ""),
            "job.group[web].restart.interval",
            Some("interval"),
            "must not be negative",
        ),
        (
            job("    restart {\n      delay = \"15\"\n    }\n", ""),
            "job.group[web].restart.delay",
            Some("delay"),
            "a number needs a unit",
        ),
        (
            plugin("        health_timeout = \"1m30\"\n"),
            "job.group[web].task[app].csi_plugin.health_timeout",
            Some("health_timeout"),
            "a number needs a unit",
        ),
        // restart rules
        (
            job("    restart {\n      mode = \"retry\"\n    }\n", ""),
            "job.group[web].restart.mode",
            Some("mode"),
            "unknown restart mode \"retry\" (expected fail or delay)",
        ),
        (
            job("    restart {\n      attempts = 0\n      mode = \"delay\"\n    }\n", ""),
            "job.group[web].restart",
            Some("restart {"),
            "ambiguous",
        ),
        (
            job("", "      restart {\n        attempts = 10\n        delay = \"5m\"\n      }\n"),
            "job.group[web].task[app].restart",
            Some("restart {"),
            "10 attempts with a delay of 5m do not fit in an interval of 30m",
        ),
        (
            job("    restart {\n      attempts = -1\n    }\n", ""),
            "job.group[web].restart.attempts",
            Some("attempts"),
            "-1 is less than 0",
        ),
        // volumes
        (
            job(&VOLUME.replace("\"csi\"", "\"host\""), ""),
            "job.group[web].volume[data].type",
            Some("\"host\""),
            "\"host\": berth handles CSI volumes only",
        ),
        (
            job(&VOLUME.replace("      type        = \"csi\"\n", ""), ""),
            "job.group[web].volume[data].type",
            Some("volume \"data\""),
            "is required (type = \"csi\")",
        ),
        (
            job(&VOLUME.replace("single-node-writer", "exclusive"), ""),
            "job.group[web].volume[data].access_mode",
            Some("exclusive"),
            "unknown access mode \"exclusive\"",
        ),
        (
            job(&VOLUME.replace("access_mode = \"single-node-writer\"", "access_mode = \"single-node-writer\"\n      attachment_mode = \"nfs\""), ""),
            "job.group[web].volume[data].attachment_mode",
            Some("nfs"),
            "unknown attachment mode \"nfs\" (expected file-system or block-device)",
        ),
        (
            job(&VOLUME.replace("      access_mode = \"single-node-writer\"\n", ""), ""),
            "job.group[web].volume[data].access_mode",
            Some("volume \"data\""),
            "is required",
        ),
        (
            job(&VOLUME.replace("single-node-writer", "multi-node-reader-only"), ""),
            "job.group[web].volume[data].read_only",
            Some("volume \"data\""),
            "must be true for a multi-node-reader-only volume",
        ),
        (
            job(&VOLUME.replace("access_mode = \"single-node-writer\"", "access_mode = \"single-node-writer\"\n      attachment_mode = \"block-device\"\n      mount_options {\n        fs_type = \"xfs\"\n      }"), ""),
            "job.group[web].volume[data].mount_options",
            Some("mount_options {"),
            "file-system volumes only",
        ),
        (
            job(&VOLUME.replace("\"demo\"", "\"demo\"\n      per_alloc = true"), "").replace("group \"web\" {", "group \"web\" {\n    count = 3"),
            "job.group[web].volume[data].per_alloc",
            None,
            "",
        ),
        (
            job(&VOLUME.replace("\"demo\"", &format!("\"{}\"\n      per_alloc = true", "d".repeat(126))), ""),
            "job.group[web].volume[data].source",
            Some("source"),
            "invalid per-alloc volume id",
        ),
        (
            job(&VOLUME.replace("    }\n", &format!("      mount_options {{\n        mount_flags = [{}]\n      }}\n    }}\n", long_flags.join(", "))), ""),
            "job.group[web].volume[data].mount_options.mount_flags",
            Some("mount_flags"),
            "mount flags take",
        ),
        (
            job(&VOLUME.replace("    }\n", "      mount_options {\n        mount_flags = \"password=FLAGSECRET\"\n      }\n    }\n"), ""),
            "job.group[web].volume[data].mount_options.mount_flags",
            Some("mount_flags"),
            "expected a list of strings, found a string",
        ),
        // job
        (
            job("", "").replace("job \"j\" {", "job \"j\" {\n  type = \"sysbatch\""),
            "job.type",
            Some("type = \"sysbatch\""),
            "berth runs service, batch and system jobs only",
        ),
        (
            job("", "").replace("job \"j\" {", "job \"j\" {\n  type = \"cron\""),
            "job.type",
            Some("type = \"cron\""),
            "unknown job type \"cron\" (expected service, batch or system)",
        ),
        (
            job("    count = 2\n", "").replace("job \"j\" {", "job \"j\" {\n  type = \"system\""),
            "job.group[web].count",
            Some("count = 2"),
            "is 2, but count cannot exceed 1 with the system scheduler",
        ),
        (
            job("", "").replace("job \"j\" {", "job \"j\" {\n  priority = 0"),
            "job.priority",
            Some("priority = 0"),
            "0 is less than 1",
        ),
        (
            format!("{}{}", job("", ""), job("", "").replace("job \"j\"", "job \"k\"")),
            "job",
            Some("job \"k\""),
            "a spec holds exactly one job",
        ),
        ("# nothing\n".into(), "job", None, "is required"),
        (
            "job {\n}\n".into(),
            "job",
            Some("job {"),
            "needs one label, its id: job \"<id>\" { … }",
        ),
        (
            job("", "").replace("group \"web\"", "group"),
            "job.group",
            Some("  group {"),
            "needs one label, its name",
        ),
        (
            job("", "").replace("task \"app\"", "task \"app\" \"x\""),
            "job.group[web].task",
            Some("task \"app\" \"x\""),
            "needs one label",
        ),
        (
            job("    restart \"r\" {\n    }\n", ""),
            "job.group[web].restart[0]",
            Some("restart \"r\""),
            "this block takes no label",
        ),
        (
            job("    restart {\n    }\n    restart {\n    }\n", ""),
            "job.group[web].restart[1]",
            Some("    restart {\n    }\n\n    task"),
            "declared more than once (first at line 3)",
        ),
        // variables and runtime references
        (
            job("    count = var.n\n", ""),
            "job.group[web].count",
            Some("count"),
            "cannot evaluate",
        ),
        (
            job("", "").replace("\"/bin/app\"", "\"${NOMAD_TASK_DIR}/app\""),
            "",
            None,
            "",
        ),
        (
            job("", "").replace("\"/bin/app\"", "\"${NOMAD_TSK_DIR}/app\""),
            "job.group[web].task[app].config.command",
            Some("command"),
            "unknown variable NOMAD_TSK_DIR",
        ),
        (
            job("    count = \"${NOMAD_ALLOC_INDEX}\"\n", ""),
            "job.group[web].count",
            Some("count"),
            "not interpolated here",
        ),
        (
            job("", "").replace("group \"web\" {", "group \"web\" {\n    task = local.tasks"),
            "job.group[web].task",
            Some("task = local"),
            "cannot evaluate",
        ),
    ];
    for (text, field, line, what) in cases {
        let result = hcl(&text);
        if what.is_empty() {
            // Not an error: the control case.
            result.unwrap_or_else(|e| panic!("{text}\n{e}"));
            continue;
        }
        let e = match result {
            Ok(s) => panic!("{text}\nparsed: {s:?}"),
            Err(e) => e,
        };
        let shown = e.to_string();
        assert_eq!(e.field, field, "{text}\n{shown}");
        let want_line = line.map(|needle| {
            text.find(needle)
                .map(|at| text[..at].matches('\n').count() + 1)
                .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"))
        });
        assert_eq!(e.line, want_line, "{text}\n{shown}");
        let prefix = match e.line {
            Some(l) => format!("/jobs/job.hcl:{l}: {field}: "),
            None => format!("/jobs/job.hcl: {field}: "),
        };
        assert!(shown.starts_with(&prefix), "{shown}\nshould start {prefix}");
        assert!(shown.contains(what), "{text}\n{shown}\nshould say {what:?}");
        assert!(!shown.contains("FLAGSECRET"), "{shown}");
    }
}

#[test]
fn json_errors_name_the_field() {
    let cases = [
        (
            FULL_JSON.replace("\"count\": 3", "\"count\": 0"),
            "job.group[storage].count",
            "0 is less than 1",
        ),
        (
            FULL_JSON.replace("\"destination\": \"/dev/raw\"", "\"destination\": \"dev\""),
            "job.group[storage].task[app].volume_mount[1].destination",
            "not an absolute path",
        ),
        (
            FULL_JSON.replace("\"volume\": \"raw\"", "\"volume\": \"cache\""),
            "job.group[storage].task[app].volume_mount[1].volume",
            "no volume \"cache\" in this group (the group declares \"data\", \"raw\")",
        ),
        (
            FULL_JSON.replace("\"count\": 3", "\"count\": 3, \"count\": 4"),
            "job.group[storage].count",
            "given more than once",
        ),
        (
            FULL_JSON.replace("\"second\": {", "\"storage\": {"),
            "job.group[storage]",
            "duplicate group name \"storage\"",
        ),
        (
            FULL_JSON.replace("\"plugin\": {", "\"app\": {"),
            "job.group[storage].task[app]",
            "duplicate task name \"app\"",
        ),
        (
            FULL_JSON.replace("\"kill_timeout\": \"1m30s\"", "\"kill_timeout\": 90000000000"),
            "job.group[storage].task[app].kill_timeout",
            "expected a duration string",
        ),
        (
            FULL_JSON.replace("\"fs_type\": \"ext4\"", "\"fs_type\": \"ext4\", \"flags\": []"),
            "job.group[storage].volume[data].mount_options",
            "unknown field",
        ),
        (
            FULL_JSON.replace("\"password=FLAGSECRET\"", "\"password=FLAGSECRET\\u0000\""),
            "job.group[storage].volume[data].mount_options.mount_flags[1]",
            "contains a NUL byte",
        ),
        (
            FULL_JSON.replace("\"mount_dir\": \"/csi\"", "\"mount_dir\": \"/local/csi\""),
            "job.group[storage].task[plugin].csi_plugin.mount_dir",
            "lies inside stage_publish_base_dir",
        ),
        (
            FULL_JSON.replace("\"task\": { \"t\"", "\"task\": { }, \"x\": { \"t\""),
            "job.group[second].x",
            "unknown field",
        ),
        (
            r#"{"job": {"j": {"group": {"g": {"task": {"t": {"driver": "exec", "config": {"command": "x"}}}}}}}, "Job": {}}"#.to_string(),
            "Job",
            "unknown field; expected one of: job",
        ),
        (
            r#"{"Job": {"ID": "x", "TaskGroups": []}}"#.to_string(),
            "Job",
            "this is Nomad's API form of a job",
        ),
        (
            r#"{"job": [{"a": {}}, {"b": {}}]}"#.to_string(),
            "job",
            "exactly one job",
        ),
        (r#"{"job": "x"}"#.to_string(), "job", "needs one label"),
        (r#"[1]"#.to_string(), "", "a job spec is an object"),
    ];
    for (text, field, what) in cases {
        let e = match json(&text) {
            Ok(s) => panic!("{text}\nparsed: {s:?}"),
            Err(e) => e,
        };
        assert_eq!((e.field.as_str(), e.line), (field, None), "{text}\n{e}");
        assert!(e.message.contains(what), "{e}\nshould say {what:?}");
        assert!(!e.to_string().contains("FLAGSECRET"), "{e}");
    }
    // A syntax error: its line, no field.
    let e = json("{\n  \"job\": {\n    \"j\": [\"password=FLAGSECRET\" }\n}").unwrap_err();
    assert_eq!((e.field.as_str(), e.line), ("", Some(3)), "{e}");
    assert!(!e.to_string().contains("FLAGSECRET"), "{e}");
}

#[test]
fn syntax_errors_give_the_line_and_never_the_source() {
    let text = FULL_HCL.replace(
        "mount_flags = [\"noatime\", \"password=FLAGSECRET\"]",
        "mount_flags = [\"noatime\", \"password=FLAGSECRET\"]]",
    );
    let want = text.lines().position(|l| l.contains("FLAGSECRET")).unwrap() + 1;
    let e = hcl(&text).unwrap_err();
    assert_eq!((e.field.as_str(), e.line), ("", Some(want)), "{e}");
    let shown = e.to_string();
    assert!(
        shown.starts_with(&format!("/jobs/job.hcl:{want}: column ")),
        "{shown}"
    );
    assert!(!shown.contains("FLAGSECRET"), "{shown}");

    // hcl finds a repeated attribute itself.
    let e = hcl(&job("    count = 1\n    count = 2\n", "")).unwrap_err();
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("redefined attribute"), "{e}");
}

#[test]
fn mount_flags_never_show_in_errors() {
    let big: Vec<String> = (0..400).map(|i| format!("\"{FLAG}{i}\"")).collect();
    let flags = "[\"noatime\", \"password=FLAGSECRET\"]";
    let cases = [
        FULL_HCL.replace(flags, &format!("[{}]", big.join(", "))),
        FULL_HCL.replace(flags, "[[\"password=FLAGSECRET\"]]"),
        FULL_HCL.replace(flags, "\"password=FLAGSECRET\""),
        FULL_HCL.replace(flags, "[\"password=${FLAGSECRET}\"]"),
        FULL_HCL.replace(flags, "[\"password=FLAGSECRET\\q\"]"),
        FULL_HCL.replace(flags, "{ \"password=FLAGSECRET\" = 1 }"),
        FULL_HCL.replace("fs_type     = \"ext4\"", "fs_type = 4"),
        FULL_HCL.replace(
            "mount_flags = ",
            "\"password=FLAGSECRET\" = 1\n        mount_flags = ",
        ),
        FULL_HCL.replace("access_mode     = \"multi-node-multi-writer\"", ""),
    ];
    for text in cases {
        let e = hcl(&text).expect_err(&text);
        let out = format!("{e} {e:?}");
        assert!(!out.contains("FLAGSECRET"), "leaked: {out}");
    }
}

#[test]
fn truncated_specs_fail_cleanly() {
    // Every prefix of the samples: no panic, and no flag in the error.
    for (file, text) in [("/j/full.hcl", FULL_HCL), ("/j/full.json", FULL_JSON)] {
        for (cut, _) in text.char_indices() {
            if let Err(e) = JobSpec::parse(Path::new(file), &text[..cut]) {
                let out = format!("{e} {e:?}");
                assert!(!out.contains("FLAGSECRET"), "{file} cut at {cut}: {out}");
            }
        }
    }
}

#[test]
fn load_reads_the_file_and_picks_the_format() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("job.nomad.hcl");
    let j = dir.path().join("job.json");
    std::fs::write(&h, FULL_HCL).unwrap();
    std::fs::write(&j, FULL_JSON).unwrap();
    assert_eq!(JobSpec::load(&h).unwrap(), JobSpec::load(&j).unwrap());
    // JSON text in a .hcl file is read as HCL (and fails there).
    assert!(JobSpec::parse(&h, FULL_JSON).is_err());
    let e = JobSpec::load(&dir.path().join("missing.hcl")).unwrap_err();
    assert!(e.message.starts_with("cannot read"), "{e}");
}

fn example(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

#[test]
fn example_hostpath_plugin_parses() {
    let spec = JobSpec::load(&example("hostpath-plugin.hcl")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.id, "hostpath-plugin");
    assert_eq!(spec.job_type, JobType::Service);
    let t = &spec.groups[0].tasks[0];
    assert_eq!(
        (t.driver.as_str(), t.command.as_literal().unwrap()),
        ("exec", "berth-hostpath")
    );
    assert_eq!(t.args, ["--statedir=state", "--strict"]);
    let p = t.csi_plugin.as_ref().unwrap();
    assert_eq!(p.id, "hostpath");
    assert_eq!(p.plugin_type, CsiPluginType::Monolith);
    assert_eq!(p.mount_dir, "/csi");
    assert_eq!(p.stage_publish_base_dir, "/local/csi");
    assert_eq!(p.health_timeout, Duration::from_secs(30));
}

#[test]
fn example_writer_parses() {
    let spec = JobSpec::load(&example("writer.hcl")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.id, "writer");
    assert_eq!(spec.job_type, JobType::Batch);
    let g = &spec.groups[0];
    let v = &g.volumes["data"];
    assert_eq!(v.source, "demo");
    assert_eq!(v.access_mode, AccessMode::SingleNodeWriter);
    assert_eq!(v.attachment_mode, AttachmentMode::FileSystem);
    let t = &g.tasks[0];
    assert_eq!(t.command, "/bin/sh");
    assert_eq!(
        t.args,
        [
            "-c",
            "echo hello > /data/hello.txt && echo wrote /data/hello.txt"
        ]
    );
    assert_eq!(
        t.volume_mounts,
        [VolumeMount {
            volume: "data".into(),
            destination: "/data".into(),
            read_only: false,
            propagation: PropagationMode::Private,
            selinux_label: None,
        }]
    );
}
