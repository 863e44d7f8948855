//! The status columns an operator used to Nomad expects, on a real agent running
//! berth-hostpath (a monolith): SCHEDULABLE and the healthy/expected instances of volumes and
//! plugins, the claiming allocs' group and status, an alloc's node, times, mounts and a running
//! task's resource use; `-short`, `-verbose`, `-type csi`. No mount flag or secret is printed.

mod agent_support;

use agent_support::{
    AgentProcess, berth,
    jobs::{run_job, volume_job, wait_alloc},
};
use berth_api::{
    jobs::ClientStatus,
    volumes::{SpecFormat, VolumeSpecRequest},
};

const PLUGIN: &str = "hp";
const FLAG_CANARY: &str = "canary-flag-4711";
const SECRET_CANARY: &str = "canary-secret-0815";

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs berth and expects success; stdout, checked for the canaries.
async fn ok(agent: &AgentProcess, args: &[&str]) -> String {
    let out = berth(agent, args).await;
    let all = text(&out);
    assert!(out.status.success(), "berth {args:?}: {all}");
    assert!(
        !all.contains(FLAG_CANARY) && !all.contains(SECRET_CANARY),
        "berth {args:?} printed a secret: {all}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of `key` in `key  value` field lines.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .filter(|rest| rest.starts_with("  "))
                .map(str::trim)
        })
        .unwrap_or_else(|| panic!("no field {key:?} in:\n{out}"))
}

/// The cells of the table row that starts with `first`, under `header`'s columns.
fn row<'a>(out: &'a str, first: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{out}"))
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[tokio::test]
async fn volume_plugin_alloc_and_job_status_show_nomads_columns() {
    let agent = AgentProcess::start_with_hostpath(PLUGIN, &[]).await;
    let client = agent.client();
    let spec = format!(
        "id = \"vol\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\ncapacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n\
         mount_options {{\n  mount_flags = [\"{FLAG_CANARY}\"]\n}}\n\
         secrets {{\n  k = \"{SECRET_CANARY}\"\n}}\n"
    );
    client
        .create_volume(&VolumeSpecRequest {
            spec,
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create volume");
    let dest = agent.tmp.path().join("data");
    let job = volume_job("web", "service", "vol", &dest, "exec sleep 3600");
    run_job(&client, job).await.expect("job run");
    let alloc = wait_alloc(&agent, "web", |a| {
        a.client_status == ClientStatus::Running && a.tasks.values().all(|t| t.pid.is_some())
    })
    .await;
    let alloc_id = alloc.alloc_id.as_str();

    // Volume list: schedulable, with its access mode.
    let out = ok(&agent, &["volume", "status"]).await;
    assert!(out.lines().next().unwrap().contains("SCHEDULABLE"), "{out}");
    let cells = row(&out, "vol");
    assert!(cells.contains(&"yes"), "{out}");
    assert!(cells.contains(&"single-node-writer"), "{out}");

    // One volume: plugin facts, healthy counts, modes, the claiming alloc's group and status.
    let out = ok(&agent, &["volume", "status", "-type", "csi", "vol"]).await;
    assert_eq!(field(&out, "provider"), "hostpath.csi.berth.dev", "{out}");
    assert_ne!(field(&out, "version"), "-", "{out}");
    assert_eq!(field(&out, "schedulable"), "yes", "{out}");
    assert_eq!(field(&out, "controllers healthy"), "1/1", "{out}");
    assert_eq!(field(&out, "nodes healthy"), "1/1", "{out}");
    assert_eq!(field(&out, "access mode"), "single-node-writer", "{out}");
    assert_eq!(field(&out, "attachment mode"), "file-system", "{out}");
    assert!(out.contains("TASK GROUP"), "{out}");
    let claim = row(&out, alloc_id);
    assert_eq!(&claim[1..4], ["g", "run", "running"], "{out}");
    assert!(
        claim[4].ends_with(" ago") && claim[5].ends_with(" ago"),
        "{out}"
    );
    let short = ok(&agent, &["volume", "status", "-short", "vol"]).await;
    assert_eq!(field(&short, "nodes healthy"), "1/1", "{short}");
    assert!(
        !short.contains(alloc_id) && !short.contains("ALLOC"),
        "{short}"
    );

    // Plugins: H/E columns and fields.
    let out = ok(&agent, &["plugin", "status", "-type", "csi"]).await;
    assert!(
        out.contains("CONTROLLERS") && out.contains("NODES"),
        "{out}"
    );
    let cells = row(&out, PLUGIN);
    assert_eq!(cells.iter().filter(|c| **c == "1/1").count(), 2, "{out}");
    let out = ok(&agent, &["plugin", "status", PLUGIN]).await;
    assert_eq!(field(&out, "controllers healthy"), "1/1", "{out}");
    assert_eq!(field(&out, "nodes healthy"), "1/1", "{out}");
    // Run by the agent's config, not by an alloc.
    assert!(out.contains("no allocs run this plugin"), "{out}");
    let short = ok(&agent, &["plugin", "status", "-short", PLUGIN]).await;
    assert!(!short.contains("INSTANCE"), "{short}");

    // The alloc: node, times, mounts, and the running task's use.
    let node = client.node().await.expect("node");
    let out = ok(&agent, &["alloc", "status", alloc_id]).await;
    assert!(field(&out, "node").contains(&node.id[..8]), "{out}");
    assert!(field(&out, "created").contains(" ago ("), "{out}");
    assert!(field(&out, "modified").contains(" ago ("), "{out}");
    assert!(field(&out, "started at").contains(" ago ("), "{out}");
    assert_eq!(field(&out, "finished at"), "-", "{out}");
    assert_eq!(
        field(&out, "volume mounts"),
        format!("data → {} (rw)", dest.display()),
        "{out}"
    );
    let usage = field(&out, "usage");
    assert!(
        usage.starts_with("cpu ") && usage.contains(" process"),
        "{out}"
    );
    let memory = usage
        .split(", ")
        .find_map(|p| p.strip_prefix("memory "))
        .expect("memory");
    assert!(!memory.is_empty() && memory != "0B", "{out}");
    let verbose = ok(&agent, &["alloc", "status", "-verbose", alloc_id]).await;
    assert!(field(&verbose, "node").contains(&node.id), "{verbose}");
    let short = ok(&agent, &["alloc", "status", "-short", alloc_id]).await;
    assert!(
        !short.contains("TASK") && !short.contains("usage"),
        "{short}"
    );
    let stats = client.alloc_stats(alloc_id).await.expect("stats");
    let main = &stats.tasks["main"];
    assert!(main.rss_bytes > 0 && main.pids >= 1, "{stats:?}");
    // An id prefix works as for the alloc itself.
    let by_prefix = client
        .alloc_stats(&alloc_id[..alloc_id.len() - 2])
        .await
        .expect("stats by prefix");
    assert_eq!(by_prefix.alloc_id, alloc_id);

    // The job: -verbose adds each alloc's tasks; -short has no alloc table.
    let out = ok(&agent, &["job", "status", "-verbose", "web"]).await;
    assert!(out.contains("LAST EXIT"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with(alloc_id) && l.contains("main") && l.contains("running")),
        "{out}"
    );
    let short = ok(&agent, &["job", "status", "-short", "web"]).await;
    assert!(!short.contains(alloc_id), "{short}");

    // After the stop, a task that is not running shows no use.
    ok(&agent, &["job", "stop", "web"]).await;
    let stopped = wait_alloc(&agent, "web", |a| a.client_status.is_terminal()).await;
    let out = ok(&agent, &["alloc", "status", &stopped.alloc_id]).await;
    assert_eq!(field(&out, "usage"), "-", "{out}");
    assert!(field(&out, "finished at").contains(" ago ("), "{out}");
}

#[tokio::test]
async fn a_type_other_than_csi_is_a_usage_error_and_sends_nothing() {
    // An address where nothing would answer: a request sent would fail differently.
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("api.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let address = format!("unix://{}", socket.display());
    for args in [
        ["volume", "status", "-type", "nfs"],
        ["plugin", "status", "--type", "nfs"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["--address", &address])
            .args(args)
            .env_remove("BERTH_ADDR")
            .output()
            .expect("run berth");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("nfs") && err.contains("csi"), "{err}");
    }
    assert_eq!(
        listener.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "berth connected to the agent"
    );
}
