//! Forms of Nomad's job files berth reads: HCL2 variables, locals and functions with values
//! from -var and var files, runtime references kept for the node (with their lines), the JSON
//! form's templates, and the errors: every problem at once, each with its line.

use std::{collections::BTreeSet, path::Path};

use berth_input::Syntax;
use berth_job::{JobSpec, NodeKeys, ParseOptions, Part, PidMode, PropagationMode, VarFile};

/// The 1-based line of the first line holding `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .expect("in the text")
        + 1
}

fn parse(text: &str, opts: &ParseOptions) -> Result<JobSpec, berth_job::SpecErrors> {
    JobSpec::parse_with(Path::new("/jobs/j.hcl"), text, Syntax::Hcl, opts)
}

const JOB: &str = r#"
variable "image_tag" {
  type    = string
  default = "v1"
}
variable "replicas" {
  type    = number
  default = 1
}
variable "flags" {
  type    = list(string)
  default = ["-a"]
}
variable "labels" {
  type    = map(string)
  default = { team = "storage" }
}
locals {
  tag   = upper(var.image_tag)
  args  = concat(var.flags, ["--tag=${local.tag}"])
  names = [for n in ["x", "y"] : "${n}-${var.image_tag}"]
}
job "forms" {
  region    = "eu"
  namespace = "ops"
  meta {
    owner = lookup(var.labels, "team", "none")
  }
  group "g" {
    count = var.replicas
    volume "data" {
      type        = "csi"
      source      = "vol"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "exec"
      user   = "nobody"
      config {
        command  = "/bin/${local.names[0] == "x-v1" ? "sh" : "false"}"
        args     = local.args
        pid_mode = "host"
      }
      env {
        WHERE = "${NOMAD_ALLOC_DIR}/data in ${attr.unique.hostname}"
        LEN   = length(local.names)
        JOINED = join(",", local.names)
        FMT    = format("%s-%d", "n", 3)
      }
      volume_mount {
        volume           = "data"
        destination      = "/srv/${NOMAD_TASK_NAME}"
        propagation_mode = "host-to-task"
      }
    }
  }
}
"#;

#[test]
fn variables_locals_and_functions_are_evaluated_with_var_and_var_files() {
    let spec = parse(JOB, &ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (spec.region.as_deref(), spec.namespace.as_deref()),
        (Some("eu"), Some("ops"))
    );
    let g = &spec.groups[0];
    assert_eq!(g.count, 1);
    let t = &g.tasks[0];
    assert_eq!(t.command, "/bin/sh");
    assert_eq!(t.args, ["-a", "--tag=V1"]);
    assert_eq!(t.user.as_deref(), Some("nobody"));
    assert_eq!(t.pid_mode, Some(PidMode::Host));
    assert_eq!(t.meta["owner"], "storage");
    assert_eq!(t.env["LEN"], "2");
    assert_eq!(t.env["JOINED"], "x-v1,y-v1");
    assert_eq!(t.env["FMT"], "n-3");
    assert_eq!(
        t.env["WHERE"].parts(),
        [
            Part::Var("NOMAD_ALLOC_DIR".into()),
            Part::Lit("/data in ".into()),
            Part::Var("attr.unique.hostname".into())
        ]
    );
    assert_eq!(t.env["WHERE"].line(), Some(line_of(JOB, "WHERE =")));
    let m = &t.volume_mounts[0];
    assert_eq!(m.propagation, PropagationMode::HostToTask);
    assert_eq!(m.destination.to_string(), "/srv/${NOMAD_TASK_NAME}");

    // Var files, then -var (which wins); a non-string -var is an HCL value.
    let opts = ParseOptions {
        vars: vec![
            ("replicas".into(), "3".into()),
            ("image_tag".into(), "v9".into()),
        ],
        var_files: vec![
            VarFile {
                name: "/v/a.hcl".into(),
                text: "image_tag = \"v2\"\nflags = [\"-b\", \"-c\"]\n".into(),
            },
            VarFile {
                name: "/v/b.json".into(),
                text: r#"{"labels": {"team": "edge"}}"#.into(),
            },
        ],
        ..Default::default()
    };
    let spec = parse(JOB, &opts).unwrap_or_else(|e| panic!("{e}"));
    let t = &spec.groups[0].tasks[0];
    assert_eq!(spec.groups[0].count, 3);
    assert_eq!(t.args, ["-b", "-c", "--tag=V9"]);
    assert_eq!(t.meta["owner"], "edge");
}

#[test]
fn bad_variables_are_refused_with_their_file_and_line() {
    let cases: [(ParseOptions, &str); 4] = [
        (
            ParseOptions {
                vars: vec![("nope".into(), "1".into())],
                ..Default::default()
            },
            "-var: nope: variable \"nope\" is not declared",
        ),
        (
            ParseOptions {
                var_files: vec![VarFile {
                    name: "/v/bad.hcl".into(),
                    text: "image_tag = \"x\"\nreplicas = \"many\"\n".into(),
                }],
                ..Default::default()
            },
            "/v/bad.hcl:2: replicas: variable \"replicas\" must be number",
        ),
        (
            ParseOptions {
                vars: vec![("flags".into(), "notalist".into())],
                ..Default::default()
            },
            "-var: flags: variable \"flags\" must be a list",
        ),
        (
            ParseOptions {
                var_files: vec![VarFile {
                    name: "/v/blocks.hcl".into(),
                    text: "x {\n}\n".into(),
                }],
                ..Default::default()
            },
            "/v/blocks.hcl:1",
        ),
    ];
    for (opts, want) in cases {
        let e = parse(JOB, &opts).unwrap_err().to_string();
        assert!(e.contains(want), "wanted {want:?} in: {e}");
    }
    let e = parse(
        "variable \"v\" {\n  type = string\n}\nlocals {\n  a = local.b\n  b = local.a\n  c = nosuch(1)\n}\njob \"j\" {\n}\n",
        &ParseOptions::default(),
    )
    .unwrap_err()
    .to_string();
    for want in [
        "j.hcl:1: variable[v]",
        "has no value",
        "j.hcl:5: locals.a",
        "j.hcl:7: locals.c",
    ] {
        assert!(e.contains(want), "wanted {want:?} in: {e}");
    }
}

#[test]
fn runtime_references_are_checked_where_they_stand() {
    let node = NodeKeys {
        attrs: BTreeSet::from(["unique.hostname".to_string()]),
        meta: BTreeSet::new(),
    };
    let opts = ParseOptions {
        node: Some(node),
        drivers: Some(BTreeSet::from(["exec".to_string(), "raw_exec".to_string()])),
        ..Default::default()
    };
    parse(JOB, &opts).unwrap_or_else(|e| panic!("{e}"));
    let bad = JOB
        .replace("${attr.unique.hostname}", "${attr.kernel.nope}")
        .replace(
            "destination      = \"/srv/${NOMAD_TASK_NAME}\"",
            "destination = \"/srv/${NOMAD_TSK}\"",
        );
    let e = parse(&bad, &opts).unwrap_err();
    let all = e.to_string();
    assert_eq!(e.len(), 2, "{all}");
    for want in [
        format!(
            "j.hcl:{}: job.group[g].task[t].env.WHERE: unknown variable attr.kernel.nope",
            line_of(&bad, "WHERE =")
        ),
        format!(
            "j.hcl:{}: job.group[g].task[t].volume_mount[0].destination: unknown variable NOMAD_TSK",
            line_of(&bad, "NOMAD_TSK")
        ),
    ] {
        assert!(all.contains(&want), "wanted {want:?} in:\n{all}");
    }
    let source = JOB.replace(
        "source      = \"vol\"",
        "source      = \"vol-${NOMAD_ALLOC_INDEX}\"",
    );
    let e = parse(&source, &opts).unwrap_err().to_string();
    let want = format!(
        "j.hcl:{}: job.group[g].volume[data].source: runtime variables",
        line_of(&source, "vol-${")
    );
    assert!(e.contains(&want), "wanted {want:?} in:\n{e}");
    // A driver the node lacks is said first, and its config is not judged.
    let docker = JOB.replace("driver = \"exec\"", "driver = \"docker\"");
    let e = parse(&docker, &opts).unwrap_err().to_string();
    assert!(
        e.contains("driver \"docker\" is not available on this node: exec, raw_exec"),
        "{e}"
    );
    assert!(!e.contains("pid_mode"), "{e}");
    // CSI_ENDPOINT belongs to plugin tasks.
    let e = parse(&JOB.replace("${NOMAD_ALLOC_DIR}", "${CSI_ENDPOINT}"), &opts).unwrap_err();
    assert!(
        e.to_string()
            .contains("only a task with a csi_plugin block"),
        "{e}"
    );
}

#[test]
fn json_strings_are_templates_and_volume_specs_are_pointed_elsewhere() {
    let json = r#"{"job": {"j": {"group": {"g": {"task": {"t": {
        "driver": "raw_exec",
        "config": {"command": "/bin/echo", "args": ["${NOMAD_JOB_ID}", "$${LITERAL}", "${upper(\"x\")}"]}
    }}}}}}}"#;
    let spec = JobSpec::parse_with(
        Path::new("j.json"),
        json,
        Syntax::Json,
        &ParseOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let args = &spec.groups[0].tasks[0].args;
    assert_eq!(args[0].parts(), [Part::Var("NOMAD_JOB_ID".into())]);
    assert_eq!(args[1], "${LITERAL}");
    assert_eq!(args[2], "X");
    let e = parse(
        "id = \"v\"\ntype = \"csi\"\nplugin_id = \"p\"\n",
        &ParseOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("this is a volume spec: use `berth volume register`"),
        "{e}"
    );
    // Many problems: all of them, up to the cap.
    let many: String = (0..30)
        .map(|i| format!("  group \"g{i}\" {{\n    count = 0\n    task \"t\" {{\n      driver = \"exec\"\n      config {{ command = \"x\" }}\n    }}\n  }}\n"))
        .collect();
    let e = parse(
        &format!("job \"j\" {{\n{many}}}\n"),
        &ParseOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.len(), berth_job::MAX_REPORTED);
    assert!(e.to_string().ends_with("… and 10 more"), "{e}");
}

#[test]
fn untyped_variables_keep_their_defaults() {
    let text = "variable \"n\" {\n  default = 3\n}\nvariable \"s\" {\n  default = \"x\"\n}\njob \"j\" {\n  group \"g\" {\n    count = var.n\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/${var.s}\"\n      }\n    }\n  }\n}\n";
    let spec = parse(text, &ParseOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.groups[0].count, 3);
    assert_eq!(spec.groups[0].tasks[0].command, "/bin/x");
}
