//! The node's records (`node.journal`): they survive a `kill -9` of the plugin at any point
//! while its mounts live on, a write cut short is dropped, a damaged line refuses the start and
//! names the line, and records kept in `state.json` by earlier versions are taken over.

mod common;

use std::{
    ffi::OsString,
    fs,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use berth_csi::{
    Endpoint,
    pb::{self, volume_capability::access_mode::Mode},
};
use berth_testkit::{HostpathPlugin, MountNamespace, SpawnError, bin_path, eventually};
use common::*;
use tonic::Code;

const NODE_FILE: &str = "node.journal";
const READY: Duration = Duration::from_secs(10);

/// berth-hostpath run in a mount namespace that outlives it, so that a copy killed with
/// SIGKILL leaves its mounts to the next one. Killed and reaped on drop.
struct NsPlugin {
    ns: MountNamespace,
    dir: tempfile::TempDir,
    args: Vec<OsString>,
    child: Option<Child>,
}

impl NsPlugin {
    async fn start(extra: &[&str]) -> Self {
        let ns = MountNamespace::new().expect("mount namespace");
        let dir = tempfile::Builder::new()
            .prefix("bh")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let mut args: Vec<OsString> = vec![
            format!(
                "--endpoint=unix://{}",
                dir.path().join("csi.sock").display()
            )
            .into(),
            "--statedir".into(),
            dir.path().join("statedir").into(),
            "--nodeid".into(),
            "node-1".into(),
            "--enable-attach=false".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        let mut plugin = Self {
            ns,
            dir,
            args,
            child: None,
        };
        plugin.spawn().await;
        plugin
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("csi.sock")
    }

    async fn spawn(&mut self) {
        let stderr = fs::File::create(self.dir.path().join("stderr")).expect("stderr file");
        let child = self
            .ns
            .command(bin_path("berth-hostpath"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn berth-hostpath");
        self.child = Some(child);
        let socket = self.socket();
        let up = eventually(READY, || {
            let socket = socket.clone();
            async move { UnixStream::connect(&socket).is_ok() }
        })
        .await;
        let stderr = fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default();
        assert!(up, "berth-hostpath did not come up:\n{stderr}");
    }

    /// SIGKILL, then a new copy in the same namespace.
    async fn kill_and_restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn clients(&self) -> Clients {
        let endpoint = Endpoint::from_path(self.socket()).expect("endpoint");
        let channel = berth_csi::channel(&endpoint);
        Clients {
            identity: pb::identity_client::IdentityClient::new(channel.clone()),
            controller: pb::controller_client::ControllerClient::new(channel.clone()),
            node: pb::node_client::NodeClient::new(channel),
        }
    }
}

impl Drop for NsPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test]
async fn records_survive_a_kill_9_while_the_mounts_live_on() {
    // Strict: the plugin disowns a target directory it has no record of making.
    let mut plugin = NsPlugin::start(&["--strict"]).await;
    let mut c = plugin.clients();
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.dir.path().join("staging");
    let target = plugin.dir.path().join("target");
    fs::create_dir(&staging).expect("the CO makes the staging directory");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    let publish = node_publish_req(&id, Some(&staging), &target, rw(), false);
    ok(c.node.node_publish_volume(publish.clone()).await);

    plugin.kill_and_restart().await;
    let mut c = plugin.clients();
    assert!(
        plugin.ns.mount_at(&target).is_some(),
        "the mounts outlive the plugin"
    );

    // The records say how the volume was staged and published: other requests conflict
    // (without the records, the writable mounts would be replaced by read-only ones, as asked),
    // the same ones are done.
    let reader = mount_cap(Mode::SingleNodeReaderOnly);
    fails(
        c.node
            .node_stage_volume(stage_req(&id, &staging, reader))
            .await,
        Code::AlreadyExists,
    );
    let read_only = node_publish_req(&id, Some(&staging), &target, rw(), true);
    fails(
        c.node.node_publish_volume(read_only).await,
        Code::AlreadyExists,
    );
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    ok(c.node.node_publish_volume(publish).await);

    // The record that the plugin made the target: it removes it.
    ok(c.node
        .node_unpublish_volume(node_unpublish_req(&id, &target))
        .await);
    assert!(plugin.ns.mount_at(&target).is_none());
    assert!(!target.exists(), "the plugin's own target directory goes");
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert!(plugin.ns.mount_at(&staging).is_none());
    assert!(staging.is_dir(), "the CO's staging directory stays");
}

fn journal_path(plugin: &HostpathPlugin) -> PathBuf {
    plugin.statedir().join(NODE_FILE)
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .expect("append");
}

#[tokio::test]
async fn a_write_cut_short_is_dropped_and_a_damaged_line_refuses_the_start() {
    let mut plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    let journal = journal_path(&plugin);

    // What a kill in the middle of a write leaves: part of a line.
    append(&journal, b"0123456789abcdef {\"volume\":\"vol-");
    plugin.restart().await;
    let mut c = clients(&plugin).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
    let text = fs::read_to_string(&journal).expect("journal");
    assert!(text.ends_with('\n') && !text.contains("vol-\""), "{text}");
    // The staging record was kept: the plugin made the directory, and removes it.
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert!(!staging.exists());

    // A damaged whole line on this boot is not a crash's doing: the plugin refuses to start,
    // names the file and line, and leaves the file as it is.
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    let text = fs::read_to_string(&journal).expect("journal");
    let damaged = text.replacen("staging", "stagin9", 1);
    assert_ne!(damaged, text);
    let line = damaged
        .lines()
        .position(|l| l.contains("stagin9"))
        .expect("the damaged line")
        + 1;
    fs::write(&journal, &damaged).expect("write");
    let err = plugin.try_restart().await.expect_err("refuses to start");
    let SpawnError::Exited { status, stderr } = err else {
        panic!("expected an exit: {err}");
    };
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:{line}", journal.display())) && stderr.contains("checksum"),
        "{stderr}"
    );
    assert_eq!(fs::read_to_string(&journal).expect("journal"), damaged);

    // Without the file the plugin starts with no records (what the mount table says still
    // holds).
    fs::remove_file(&journal).expect("remove");
    plugin.restart().await;
    let mut c = clients(&plugin).await;
    ok(c.identity.probe(pb::ProbeRequest {}).await);
}

#[tokio::test]
async fn records_kept_in_the_state_file_by_earlier_versions_are_taken_over() {
    let mut plugin = HostpathPlugin::builder().attach(false).spawn().await;
    let mut c = clients(&plugin).await;
    let id = create(&mut c, "v").await.volume_id;
    let staging = plugin.tmp().join("staging");
    let target = plugin.tmp().join("target");
    plugin.kill();

    // The state file as earlier versions wrote it, with the node records in the volume.
    let state_path = plugin.statedir().join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(&state_path).expect("state")).expect("json");
    let capability = serde_json::json!({
        "access_mode": "SINGLE_NODE_WRITER", "fs_type": "", "mount_group": ""
    });
    let volume = &mut state["volumes"][&id];
    volume["staged"] = serde_json::json!({
        staging.display().to_string(): {"capability": capability, "created_dir": true}
    });
    volume["published"] = serde_json::json!({});
    volume["created_targets"] = serde_json::json!([target.display().to_string()]);
    fs::write(&state_path, serde_json::to_vec(&state).expect("json")).expect("write");
    fs::remove_file(journal_path(&plugin)).expect("no node file yet");

    plugin.restart().await;
    let journal = fs::read_to_string(journal_path(&plugin)).expect("journal");
    assert!(
        journal.contains(&staging.display().to_string())
            && journal.contains(&target.display().to_string()),
        "{journal}"
    );
    // The plugin acts on them: the staging directory, there already, is one it made (says the
    // record), so it goes at unstage.
    fs::create_dir(&staging).expect("mkdir");
    let mut c = clients(&plugin).await;
    ok(c.node
        .node_stage_volume(stage_req(&id, &staging, rw()))
        .await);
    ok(c.node.node_unstage_volume(unstage_req(&id, &staging)).await);
    assert!(!staging.exists(), "recorded as made by the plugin");

    // Deleting the volume drops its records.
    ok(c.controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await);
    plugin.restart().await;
    let journal = fs::read_to_string(journal_path(&plugin)).expect("journal");
    assert!(!journal.contains(&id), "{journal}");
}
