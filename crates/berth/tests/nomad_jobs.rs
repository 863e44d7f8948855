//! Nomad's job files, unchanged, on a real agent: runtime variables, node attributes and meta,
//! HCL2 variables with `-var` and `-var-file`, the JSON form and propagation modes reach the
//! task (it writes what it got into its CSI volume, and the test reads the volume); bad forms
//! are refused with file:line and change nothing; and `exec` tasks see only a root of their
//! own.

mod agent_support;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use agent_support::{
    AgentProcess, client_config, hostpath_config,
    jobs::{create_volume, wait_alloc},
};
use berth_api::{
    Client, ClientError,
    jobs::{ClientStatus, JobRunRequest, JobVar, VarFile},
    volumes::SpecFormat,
};

const PLUGIN: &str = "hp";

/// The repository's root (examples live there).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nomad")
        .join(name)
}

/// An agent with berth-hostpath, a node name, class and meta, and the volume `demo`; the
/// volume's directory on the host.
async fn start() -> (AgentProcess, PathBuf) {
    let config = format!(
        "{}name = \"corpus-node\"\ndatacenter = \"dc1\"\n{}",
        hostpath_config(PLUGIN, &["--enable-stage"]),
        client_config("  node_class = \"edge\"\n  meta { rack = \"r7\" }\n")
    );
    let agent = AgentProcess::start_in_namespace(&config).await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let external = create_volume(&agent.client(), PLUGIN, "demo").await;
    let dir = agent.tmp.path().join("hp/volumes").join(external);
    (agent, dir)
}

/// Runs `file` (read as the CLI reads it) with `vars` and `var_files`.
async fn run_file(
    client: &Client,
    file: &Path,
    vars: &[(&str, &str)],
    var_files: &[&Path],
) -> Result<berth_api::jobs::JobStatus, ClientError> {
    let format = if file.extension().is_some_and(|e| e == "json") {
        SpecFormat::Json
    } else {
        SpecFormat::Hcl
    };
    client
        .run_job(&JobRunRequest {
            spec: std::fs::read_to_string(file).expect("read spec"),
            format,
            file: Some(file.display().to_string()),
            vars: vars
                .iter()
                .map(|(k, v)| JobVar {
                    name: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            var_files: var_files
                .iter()
                .map(|f| VarFile {
                    name: f.display().to_string(),
                    text: std::fs::read_to_string(f).expect("read var file"),
                })
                .collect(),
        })
        .await
}

/// Waits until every alloc of job `id` finished, and asserts they completed.
async fn complete(agent: &AgentProcess, id: &str) -> berth_api::jobs::AllocStatus {
    let a = wait_alloc(agent, id, |a| a.client_status.is_terminal()).await;
    assert_eq!(
        a.client_status,
        ClientStatus::Complete,
        "{a:#?}\n{}",
        agent.log()
    );
    a
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn runtime_variables_attributes_and_meta_reach_the_task() {
    let (agent, volume) = start().await;
    let client = agent.client();
    let node = client.node().await.expect("node");
    let file = repo().join("examples/nomad/jobs/runtime-vars.hcl");
    run_file(&client, &file, &[], &[]).await.expect("job run");
    let alloc = complete(&agent, "runtime-vars").await;

    let args = lines(&volume.join("runtime-vars/args.txt"));
    let expected = [
        alloc.alloc_id.as_str(),
        "0",
        "runtime-vars.echo[0]",
        "runtime-vars",
        "echo",
        "echo",
        "/alloc",
        "/local",
        "/secrets",
        "dc1",
        "global",
        "default",
        "linux",
        node.hostname.as_str(),
        "1",
        "corpus-node",
        "dc1",
        "edge",
        "r7",
        "hello from echo in dc1",
        "literal ${NOMAD_TASK_NAME}",
    ];
    assert_eq!(args, expected);

    let env: BTreeMap<String, String> = lines(&volume.join("runtime-vars/env.txt"))
        .into_iter()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.into(), v.into())))
        .collect();
    for (k, v) in [
        ("NOMAD_ALLOC_ID", alloc.alloc_id.as_str()),
        ("NOMAD_TASK_NAME", "echo"),
        ("NOMAD_TASK_DIR", "/local"),
        ("NOMAD_ALLOC_DIR", "/alloc"),
        ("NOMAD_SECRETS_DIR", "/secrets"),
        ("NOMAD_JOB_NAME", "runtime-vars"),
        ("NOMAD_MEMORY_LIMIT", "64"),
        ("NOMAD_CPU_LIMIT", "100"),
        ("GREETING", "hello from echo in dc1"),
        ("STATIC", "plain"),
    ] {
        assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}: {env:?}");
    }

    // The JSON form is read the same way.
    let file = repo().join("examples/nomad/jobs/runtime-vars.json");
    run_file(&client, &file, &[], &[])
        .await
        .expect("json job run");
    complete(&agent, "runtime-vars-json").await;
    assert_eq!(
        lines(&volume.join("json/args.txt")),
        ["runtime-vars-json", "echo", "linux"]
    );
}

#[tokio::test]
async fn hcl2_variables_locals_and_functions_with_var_and_var_file() {
    let (agent, volume) = start().await;
    let spec = repo().join("examples/nomad/jobs/hcl2-vars.hcl");
    let vars = repo().join("examples/nomad/jobs/hcl2-vars.vars.hcl");
    // Through the CLI, with Nomad's single-dash flags.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--address")
        .arg(format!("unix://{}", agent.socket().display()))
        .args(["job", "run", "-var-file"])
        .arg(&vars)
        .args(["-var", "shout=true"])
        .arg(&spec)
        .output()
        .await
        .expect("berth job run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    complete(&agent, "hcl2-vars").await;
    assert_eq!(
        lines(&volume.join("hcl2-vars/bonjour.txt")),
        ["BONJOUR, ADA AND GRACE (2 names)"]
    );

    // Defaults without a var file; -var wins over a var file.
    let client = agent.client();
    client.stop_job("hcl2-vars").await.expect("stop");
    wait_alloc(&agent, "hcl2-vars", |a| a.client_status.is_terminal()).await;
    run_file(&client, &spec, &[("greeting", "Hi")], &[&vars])
        .await
        .expect("run with -var");
    // The task's shell creates the file before it writes the line: wait for the whole line.
    berth_testkit::assert_eventually!(Duration::from_secs(30), || async {
        std::fs::read_to_string(volume.join("hcl2-vars/hi.txt")).is_ok_and(|s| s.ends_with('\n'))
    });
    assert_eq!(
        lines(&volume.join("hcl2-vars/hi.txt")),
        ["Hi, ada and grace (2 names)"]
    );
}

#[tokio::test]
async fn propagation_modes_user_and_lenient_fields() {
    let (agent, volume) = start().await;
    let client = agent.client();
    run_file(&client, &corpus("propagation.hcl"), &[], &[])
        .await
        .expect("job run");
    complete(&agent, "propagation").await;
    let info = lines(&volume.join("propagation/mountinfo.txt"));
    assert_eq!(info.len(), 2, "{info:?}");
    // The optional fields of mountinfo (before ` - `): a private mount has no `master:` or
    // `shared:`; host-to-task never shares the task's mounts back (the volume's mount on the
    // host is not shared, so there is no `master:` either).
    for line in &info {
        let optional = line.split(" - ").next().unwrap_or_default();
        assert!(
            !optional.contains("shared:") && !optional.contains("master:"),
            "{info:?}"
        );
    }
    assert_eq!(lines(&volume.join("propagation/uid.txt")), ["0"]);
}

#[tokio::test]
async fn exec_tasks_see_only_a_root_of_their_own() {
    let before = root_entries();
    let (agent, volume) = start().await;
    let client = agent.client();
    let data_dir = agent.data_dir.display().to_string();
    run_file(
        &client,
        &corpus("isolation.hcl"),
        &[("data_dir", &data_dir)],
        &[],
    )
    .await
    .expect("job run");
    complete(&agent, "isolation").await;

    let bins = berth_testkit::bin_path("berth-hostpath");
    let bins_top = bins
        .components()
        .nth(1)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap();
    let allowed = [
        "alloc", "local", "secrets", "tmp", "proc", "dev", "sys", "bin", "etc", "lib", "lib32",
        "lib64", "run", "sbin", "usr", "data",
    ];
    for (me, other) in [("a", "b"), ("b", "a")] {
        let out = volume.join("isolation").join(me);
        let root = lines(&out.join("root.txt"));
        for entry in &root {
            assert!(
                allowed.contains(&entry.as_str()) || *entry == bins_top,
                "{me} sees /{entry} in its root: {root:?}"
            );
        }
        assert!(root.contains(&"secrets".to_owned()) && root.contains(&"data".to_owned()));
        // As Nomad's exec: nobody, unless the job names a user.
        assert_eq!(lines(&out.join("uid.txt")), ["65534"]);
        assert_eq!(lines(&out.join("datadir.txt")), ["hidden"]);
        for line in lines(&out.join("writes.txt")) {
            assert!(line.ends_with("refused"), "{me}: {line}");
        }
        assert_eq!(
            lines(&out.join("own-secret.txt")),
            [format!("secret-of-{me}")]
        );
        assert!(
            lines(&out.join("others-secret.txt")).is_empty(),
            "{me} read {other}'s secret"
        );
        // A PID namespace of its own: its shell and the few commands it runs.
        let pids: usize = lines(&out.join("pids.txt"))[0].parse().unwrap();
        assert!(pids < 10, "{me} sees {pids} processes");
    }
    // Nothing a task did shows on the host, and its secrets never reached the disk.
    assert_eq!(root_entries(), before);
    let alloc_dir = agent
        .data_dir
        .join("allocs")
        .join(&client.job("isolation").await.unwrap().allocs[0].alloc_id);
    for t in ["a", "b"] {
        assert!(
            !alloc_dir.join(t).join("secrets/token").exists(),
            "{t}'s secret is on the host's disk"
        );
    }
}

fn root_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Bad forms: each is refused with the file and line (and every problem at once), and nothing
/// is placed.
#[tokio::test]
async fn bad_forms_name_file_and_line_and_change_nothing() {
    let (agent, _volume) = start().await;
    let client = agent.client();
    let cases: [(&str, &[&str]); 6] = [
        (
            "job \"bad\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/echo\"\n        args = [\"${NOMAD_NOPE}\"]\n      }\n    }\n  }\n}\n",
            &["bad.hcl:7", "NOMAD_NOPE"],
        ),
        (
            "job \"bad\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/echo\"\n        args = [\"${attr.no.such.thing}\"]\n      }\n    }\n  }\n}\n",
            &["bad.hcl:7", "attr.no.such.thing"],
        ),
        (
            "job \"bad\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"docker\"\n      config {\n        image = \"redis:7\"\n        ports = [\"db\"]\n      }\n    }\n  }\n}\n",
            &["bad.hcl:7", "config.ports: unknown field"],
        ),
        (
            "variable \"v\" {\n  type = string\n}\njob \"bad\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"exec\"\n      config {\n        command = var.v\n      }\n    }\n  }\n}\n",
            &["bad.hcl:1", "\"v\""],
        ),
        (
            "id = \"vol\"\nname = \"vol\"\ntype = \"csi\"\nplugin_id = \"hp\"\n",
            &["berth volume register", "berth volume create"],
        ),
        (
            // Two problems in two tasks: both reported.
            "job \"bad\" {\n  group \"g\" {\n    task \"t1\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/echo\"\n        args = [\"${meta.nope}\"]\n      }\n    }\n    task \"t2\" {\n      driver = \"exec\"\n      config {\n        command = \"/bin/echo\"\n        colour = \"red\"\n      }\n    }\n  }\n}\n",
            &["bad.hcl:7", "meta.nope", "bad.hcl:14", "colour"],
        ),
    ];
    for (text, wanted) in cases {
        let err = client
            .run_job(&JobRunRequest {
                spec: text.into(),
                format: SpecFormat::Hcl,
                file: Some("bad.hcl".into()),
                ..Default::default()
            })
            .await
            .expect_err(text)
            .to_string();
        for w in wanted {
            assert!(err.contains(w), "{text}\nwanted {w:?} in: {err}");
        }
    }
    // An undeclared -var, and a var file with a type error.
    let spec = repo().join("examples/nomad/jobs/hcl2-vars.hcl");
    let err = run_file(&client, &spec, &[("nope", "1")], &[])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope"), "{err}");
    let bad_vars = agent.tmp.path().join("bad.vars.hcl");
    std::fs::write(&bad_vars, "greeting = \"x\"\ncopies = \"many\"\n").unwrap();
    let err = run_file(&client, &spec, &[], &[&bad_vars])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad.vars.hcl:2") && err.contains("copies"),
        "{err}"
    );
    // Nothing was placed.
    assert!(client.jobs().await.unwrap().jobs.is_empty());
    let allocs = agent.data_dir.join("allocs");
    assert!(
        !allocs.exists() || std::fs::read_dir(&allocs).unwrap().next().is_none(),
        "an alloc directory was made"
    );
}
