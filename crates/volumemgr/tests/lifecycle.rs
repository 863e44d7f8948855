//! The volume manager against a real berth-hostpath process: every mount lives in the plugin's
//! own mount namespace and is checked in its mountinfo.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use berth_csi::{
    CreateVolume, CsiClient, Endpoint, RetryPolicy, Rpc,
    model::{AccessMode, AttachmentMode, ExternalId, MountOptions, Secrets},
};
use berth_state::{Store, Table};
use berth_testkit::HostpathPlugin;
use berth_volume::{PluginDir, Usage};
use berth_volumemgr::{
    MountRequest, ProcMountTable, PublishState, ReconcileAction, StageState, UsageRecord,
    VolumeError, VolumeManager,
};

const PLUGIN: &str = "hostpath";

struct Env {
    plugin: HostpathPlugin,
    store: Arc<Store>,
    data: PathBuf,
    _state_dir: tempfile::TempDir,
}

async fn env(stage: bool) -> Env {
    let plugin = HostpathPlugin::builder()
        .attach(false)
        .stage(stage)
        .spawn()
        .await;
    let state_dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(Store::open(state_dir.path().join("state.redb")).expect("store"));
    let data = plugin.tmp().join("data");
    Env {
        plugin,
        store,
        data,
        _state_dir: state_dir,
    }
}

impl Env {
    fn client(&self) -> CsiClient {
        CsiClient::new(Endpoint::parse(&self.plugin.endpoint()).expect("endpoint"))
    }

    async fn manager_with(&self, client: CsiClient) -> VolumeManager {
        let caps = client.node_capabilities().await.expect("node caps");
        let mounts = ProcMountTable::at(format!("/proc/{}/mountinfo", self.plugin.pid()));
        VolumeManager::new(
            Arc::clone(&self.store),
            client,
            PLUGIN,
            PluginDir::Monolith,
            &self.data,
            caps,
            Arc::new(mounts),
        )
        .expect("manager")
    }

    async fn manager(&self) -> VolumeManager {
        self.manager_with(self.client()).await
    }

    async fn volume(&self, name: &str) -> ExternalId {
        let cap = usage(false).capability();
        let vol = self
            .client()
            .create_volume(&CreateVolume {
                name: name.into(),
                capabilities: vec![cap],
                ..Default::default()
            })
            .await
            .expect("create volume");
        vol.external_id
    }

    fn mounted(&self, path: &Path) -> bool {
        self.plugin.mount_at(path).is_some()
    }

    fn mounts_at(&self, path: &Path) -> usize {
        self.plugin
            .mountinfo()
            .iter()
            .filter(|m| m.mount_point == path)
            .count()
    }

    fn mounts_under_data(&self) -> Vec<PathBuf> {
        self.plugin
            .mountinfo()
            .into_iter()
            .filter(|m| m.mount_point.starts_with(&self.data))
            .map(|m| m.mount_point)
            .collect()
    }

    fn records(&self) -> Vec<(String, UsageRecord)> {
        self.store.list(Table::USAGES).expect("list")
    }
}

fn usage(read_only: bool) -> Usage {
    Usage {
        read_only,
        attachment_mode: AttachmentMode::FileSystem,
        access_mode: if read_only {
            AccessMode::MultiNodeReaderOnly
        } else {
            AccessMode::MultiNodeMultiWriter
        },
        mount_options: MountOptions::default(),
    }
}

fn req(volume_id: &str, ext: &ExternalId, alloc_id: &str, usage: Usage) -> MountRequest {
    MountRequest {
        volume_id: volume_id.into(),
        external_id: ext.clone(),
        alloc_id: alloc_id.into(),
        usage,
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
        secrets: Secrets::default(),
    }
}

#[tokio::test]
async fn two_allocs_share_one_staging_and_release_in_order() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("shared").await;
    let u = usage(false);
    let key = u.key();
    let staging = mgr.paths().staging("vol1", key).unwrap();

    let t1 = mgr
        .mount(req("vol1", &ext, "a1", u.clone()))
        .await
        .expect("mount a1");
    let t2 = mgr
        .mount(req("vol1", &ext, "a2", u.clone()))
        .await
        .expect("mount a2");
    assert_ne!(t1, t2);
    assert_eq!(t1, mgr.paths().publish("vol1", "a1", key).unwrap());
    assert_eq!(env.mounts_at(&staging), 1, "staged once");
    assert!(env.mounted(&t1) && env.mounted(&t2));
    std::fs::write(env.plugin.in_ns(&t1).join("hello"), b"from a1").expect("write");
    assert_eq!(
        std::fs::read(env.plugin.in_ns(&t2).join("hello")).expect("read"),
        b"from a1"
    );

    // Mounting again is answered from the record: no RPC (a failing plugin does not matter).
    env.plugin
        .set_faults(&["NodePublishVolume:INTERNAL", "NodeStageVolume:INTERNAL"]);
    assert_eq!(
        mgr.mount(req("vol1", &ext, "a1", u.clone()))
            .await
            .expect("again"),
        t1
    );
    env.plugin.set_faults(&[]);

    mgr.unmount("vol1", "a1", key).await.expect("unmount a1");
    assert!(!env.mounted(&t1));
    assert!(env.mounted(&t2), "a2 still published");
    assert_eq!(env.mounts_at(&staging), 1, "still staged");
    let rec = mgr.record("vol1", key).unwrap().expect("record");
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert_eq!(
        rec.allocs,
        BTreeMap::from([("a2".to_string(), PublishState::Published)])
    );

    mgr.unmount("vol1", "a2", key).await.expect("unmount a2");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
    // Nothing left to do is success.
    mgr.unmount("vol1", "a2", key).await.expect("unmount again");
}

#[tokio::test]
async fn a_new_manager_on_the_same_store_keeps_the_other_alloc() {
    let env = env(true).await;
    let ext = env.volume("restart").await;
    let u = usage(false);
    let key = u.key();
    let (t1, t2) = {
        let mgr = env.manager().await;
        let t1 = mgr
            .mount(req("v", &ext, "a1", u.clone()))
            .await
            .expect("a1");
        let t2 = mgr
            .mount(req("v", &ext, "a2", u.clone()))
            .await
            .expect("a2");
        (t1, t2)
    };
    let mgr = env.manager().await;
    let report = mgr.reconcile().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        report.actions,
        vec![
            ReconcileAction::Kept {
                volume_id: "v".into(),
                alloc_id: "a1".into(),
                usage: key
            },
            ReconcileAction::Kept {
                volume_id: "v".into(),
                alloc_id: "a2".into(),
                usage: key
            },
        ]
    );
    mgr.unmount("v", "a1", key).await.expect("unmount a1");
    assert!(!env.mounted(&t1));
    assert!(env.mounted(&t2));
    assert!(env.mounted(&mgr.paths().staging("v", key).unwrap()));
    let rec = mgr.record("v", key).unwrap().expect("record");
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert_eq!(rec.allocs.len(), 1);
}

#[tokio::test]
async fn reconcile_finishes_an_interrupted_publish() {
    let env = env(true).await;
    let ext = env.volume("crash").await;
    let u = usage(false);
    let key = u.key();
    // As if the agent died after persisting its intents, before any RPC.
    let rec = UsageRecord {
        plugin_id: PLUGIN.into(),
        volume_id: "v".into(),
        external_id: ext.clone(),
        usage: key,
        mount_options: (&u.mount_options).into(),
        staging: Some(StageState::Staging),
        allocs: BTreeMap::from([("a1".to_string(), PublishState::Publishing)]),
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
    };
    env.store.put(Table::USAGES, &rec.key(), &rec).expect("put");
    let mgr = env.manager().await;
    let report = mgr.reconcile().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.actions.len(), 2, "{:?}", report.actions);
    let target = mgr.paths().publish("v", "a1", key).unwrap();
    assert!(env.mounted(&target));
    assert!(env.mounted(&mgr.paths().staging("v", key).unwrap()));
    let rec = mgr.record("v", key).unwrap().expect("record");
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert_eq!(rec.allocs["a1"], PublishState::Published);
}

#[tokio::test]
async fn a_failed_unpublish_stays_pending_until_reconcile_finishes_it() {
    let env = env(true).await;
    let ext = env.volume("unpub").await;
    let u = usage(false);
    let key = u.key();
    let short = RetryPolicy {
        attempt_timeout: Duration::from_secs(2),
        overall_timeout: Duration::from_millis(500),
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(50),
        ..Rpc::NodeUnpublishVolume.policy()
    };
    let client = CsiClient::builder(Endpoint::parse(&env.plugin.endpoint()).expect("endpoint"))
        .policy(Rpc::NodeUnpublishVolume, short)
        .build();
    let mgr = env.manager_with(client).await;
    let target = mgr
        .mount(req("v", &ext, "a1", u.clone()))
        .await
        .expect("mount");

    env.plugin.set_faults(&["NodeUnpublishVolume:UNAVAILABLE"]);
    let err = mgr
        .unmount("v", "a1", key)
        .await
        .expect_err("unpublish fails");
    assert!(
        matches!(&err, VolumeError::Csi { alloc_id: Some(a), .. } if a == "a1"),
        "{err:?}"
    );
    let rec = mgr.record("v", key).unwrap().expect("record kept");
    assert_eq!(rec.allocs["a1"], PublishState::Unpublishing);
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert!(env.mounted(&target));

    env.plugin.set_faults(&[]);
    let report = mgr.reconcile().await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        report.actions,
        vec![
            ReconcileAction::Unpublished {
                volume_id: "v".into(),
                alloc_id: "a1".into(),
                usage: key
            },
            ReconcileAction::Released {
                volume_id: "v".into(),
                usage: key
            },
        ]
    );
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn a_plugin_without_staging_publishes_directly() {
    let env = env(false).await;
    let mgr = env.manager().await;
    let ext = env.volume("nostage").await;
    let u = usage(false);
    let key = u.key();
    let target = mgr.mount(req("v", &ext, "a1", u)).await.expect("mount");
    assert!(env.mounted(&target));
    assert!(!env.mounted(&mgr.paths().staging("v", key).unwrap()));
    assert_eq!(env.mounts_under_data(), vec![target]);
    let rec = mgr.record("v", key).unwrap().expect("record");
    assert_eq!(rec.staging, None);
    mgr.unmount("v", "a1", key).await.expect("unmount");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn two_usages_of_one_volume_get_two_stagings() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("twousages").await;
    let (rw, ro) = (usage(false), usage(true));
    let t_rw = mgr
        .mount(req("v", &ext, "a1", rw.clone()))
        .await
        .expect("rw");
    let t_ro = mgr
        .mount(req("v", &ext, "a2", ro.clone()))
        .await
        .expect("ro");
    let s_rw = mgr.paths().staging("v", rw.key()).unwrap();
    let s_ro = mgr.paths().staging("v", ro.key()).unwrap();
    assert_ne!(s_rw, s_ro);
    assert!(env.mounted(&s_rw) && env.mounted(&s_ro));
    assert!(!env.plugin.mount_at(&t_rw).expect("rw target").read_only);
    assert!(env.plugin.mount_at(&t_ro).expect("ro target").read_only);
    assert_eq!(env.records().len(), 2);
    mgr.unmount("v", "a2", ro.key()).await.expect("unmount ro");
    assert!(!env.mounted(&s_ro));
    assert!(env.mounted(&s_rw) && env.mounted(&t_rw));
    mgr.unmount("v", "a1", rw.key()).await.expect("unmount rw");
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn a_refused_id_changes_nothing() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("refused").await;
    for (vol, alloc) in [("a/b", "a1"), ("v", ".."), ("", "a1")] {
        let err = mgr
            .mount(req(vol, &ext, alloc, usage(false)))
            .await
            .expect_err("refused");
        assert!(matches!(err, VolumeError::InvalidPath { .. }), "{err:?}");
        let err = mgr
            .unmount(vol, alloc, usage(false).key())
            .await
            .expect_err("refused");
        assert!(matches!(err, VolumeError::InvalidPath { .. }), "{err:?}");
    }
    assert!(env.records().is_empty());
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn other_mount_options_for_a_used_usage_are_refused_without_showing_them() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("conflict").await;
    let u = usage(false);
    mgr.mount(req("v", &ext, "a1", u.clone()))
        .await
        .expect("mount");
    let mut other = u.clone();
    other.mount_options.mount_flags =
        berth_csi::model::MountFlags::new(vec!["password=hunter2".into()]);
    let err = mgr
        .mount(req("v", &ext, "a2", other))
        .await
        .expect_err("conflict");
    assert!(matches!(err, VolumeError::Conflict { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("hunter2"));
}

#[tokio::test]
async fn a_cancelled_call_is_reported_as_cancelled_and_left_pending() {
    let env = env(true).await;
    let ext = env.volume("cancel").await;
    let token = tokio_util::sync::CancellationToken::new();
    let client = CsiClient::builder(Endpoint::parse(&env.plugin.endpoint()).expect("endpoint"))
        .cancellation(token.clone())
        .build();
    let mgr = env.manager_with(client).await;
    token.cancel();
    let u = usage(false);
    let err = mgr
        .mount(req("v", &ext, "a1", u.clone()))
        .await
        .expect_err("cancelled");
    assert!(err.is_cancelled(), "{err:?}");
    let rec = mgr.record("v", u.key()).unwrap().expect("intent kept");
    assert_eq!(rec.staging, Some(StageState::Staging));
    assert!(rec.allocs.is_empty());
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
}
