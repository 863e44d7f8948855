//! The volume manager against a real berth-hostpath process: every mount lives in the plugin's
//! own mount namespace and is checked in its mountinfo.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use berth_csi::{
    CapacityRange, CreateVolume, CsiClient, Endpoint, RetryPolicy, Rpc,
    model::{
        AccessMode, AttachmentMode, ExternalId, MountFlags, MountOptions, NodeCapabilities,
        NodeCapability, Secrets,
    },
};
use berth_state::{Store, Table};
use berth_testkit::HostpathPlugin;
use berth_volume::{PluginDir, Usage, UsageKey};
use berth_volumemgr::{
    MountRequest, ProcMountTable, PublishState, ReconcileAction, StageState, Step, StepHook,
    UsageRecord, VolumeError, VolumeManager,
};

const PLUGIN: &str = "hostpath";

struct Env {
    plugin: HostpathPlugin,
    store: Arc<Store>,
    data: PathBuf,
    _state_dir: tempfile::TempDir,
}

async fn env(stage: bool) -> Env {
    env_with(stage, true).await
}

/// `strict`: the plugin refuses any request where berth skipped a duty of the CO.
async fn env_with(stage: bool, strict: bool) -> Env {
    let plugin = HostpathPlugin::builder()
        .attach(false)
        .stage(stage)
        .strict(strict)
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
        self.manager_caps(client, caps)
    }

    fn manager_caps(&self, client: CsiClient, caps: NodeCapabilities) -> VolumeManager {
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

/// The volume's one staging directory for a usage (shared by its read-only and read-write
/// usages).
fn staging(mgr: &VolumeManager, volume_id: &str, key: UsageKey) -> Result<PathBuf, ()> {
    Ok(mgr
        .paths()
        .volume_staging_dir(volume_id)
        .expect("volume id")
        .join(berth_volumemgr::staging_dir_name(key)))
}

fn no_secrets(_: &str) -> Secrets {
    Secrets::default()
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
    let staging = staging(&mgr, "vol1", key).unwrap();

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

    mgr.unmount("vol1", "a1").await.expect("unmount a1");
    assert!(!env.mounted(&t1));
    assert!(env.mounted(&t2), "a2 still published");
    assert_eq!(env.mounts_at(&staging), 1, "still staged");
    let rec = mgr.record("vol1", key).unwrap().expect("record");
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert_eq!(
        rec.allocs,
        BTreeMap::from([("a2".to_string(), PublishState::Published)])
    );

    mgr.unmount("vol1", "a2").await.expect("unmount a2");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
    // Nothing left to do is success.
    mgr.unmount("vol1", "a2").await.expect("unmount again");
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
    let report = mgr.reconcile(&no_secrets, &|_, _| false).await;
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
    mgr.unmount("v", "a1").await.expect("unmount a1");
    assert!(!env.mounted(&t1));
    assert!(env.mounted(&t2));
    assert!(env.mounted(&staging(&mgr, "v", key).unwrap()));
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
        shared_staging: true,
    };
    env.store.put(Table::USAGES, &rec.key(), &rec).expect("put");
    let mgr = env.manager().await;
    let report = mgr.reconcile(&no_secrets, &|_, _| false).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.actions.len(), 2, "{:?}", report.actions);
    let target = mgr.paths().publish("v", "a1", key).unwrap();
    assert!(env.mounted(&target));
    assert!(env.mounted(&staging(&mgr, "v", key).unwrap()));
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
    let err = mgr.unmount("v", "a1").await.expect_err("unpublish fails");
    assert!(
        matches!(&err, VolumeError::Csi { alloc_id: Some(a), .. } if a == "a1"),
        "{err:?}"
    );
    let rec = mgr.record("v", key).unwrap().expect("record kept");
    assert_eq!(rec.allocs["a1"], PublishState::Unpublishing);
    assert_eq!(rec.staging, Some(StageState::Staged));
    assert!(env.mounted(&target));

    env.plugin.set_faults(&[]);
    let report = mgr.reconcile(&no_secrets, &|_, _| false).await;
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
    assert!(!env.mounted(&staging(&mgr, "v", key).unwrap()));
    assert_eq!(env.mounts_under_data(), vec![target]);
    let rec = mgr.record("v", key).unwrap().expect("record");
    assert_eq!(rec.staging, None);
    mgr.unmount("v", "a1").await.expect("unmount");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn read_only_and_read_write_usages_share_the_volumes_one_staging() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("twousages").await;
    let rw = usage(false);
    let ro = Usage {
        read_only: true,
        ..rw.clone()
    };
    let t_rw = mgr
        .mount(req("v", &ext, "a1", rw.clone()))
        .await
        .expect("rw");
    let t_ro = mgr
        .mount(req("v", &ext, "a2", ro.clone()))
        .await
        .expect("ro");
    // One staging path per volume (CSI): both usages publish from it.
    let s = staging(&mgr, "v", rw.key()).unwrap();
    assert_eq!(s, staging(&mgr, "v", ro.key()).unwrap());
    assert_eq!(env.mounts_at(&s), 1, "staged once");
    assert!(!env.plugin.mount_at(&t_rw).expect("rw target").read_only);
    assert!(env.plugin.mount_at(&t_ro).expect("ro target").read_only);
    assert_eq!(env.records().len(), 2);
    assert_eq!(
        env.plugin
            .mountinfo()
            .iter()
            .filter(|m| m
                .mount_point
                .starts_with(mgr.paths().root().join("staging")))
            .count(),
        1,
        "no second staging"
    );
    // The writer goes first: the reader still publishes from the staging, so it stays.
    mgr.unmount("v", "a1").await.expect("unmount rw");
    assert!(env.mounted(&s) && env.mounted(&t_ro) && !env.mounted(&t_rw));
    mgr.unmount("v", "a2").await.expect("unmount ro");
    assert!(!env.mounted(&s));
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn a_second_staging_of_a_volume_is_refused_while_its_staging_is_in_use() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("onestaging").await;
    let plain = usage(false);
    let t1 = mgr
        .mount(req("v", &ext, "a1", plain.clone()))
        .await
        .expect("a1");
    let mounts = env.mounts_under_data();
    let before = env.records();
    // Other mount options, another access mode: each would need a second staging path.
    let other_mode = Usage {
        access_mode: AccessMode::SingleNodeMultiWriter,
        ..plain.clone()
    };
    for u in [with_flags(plain.clone(), &["password=hunter2"]), other_mode] {
        let err = mgr
            .mount(req("v", &ext, "a2", u))
            .await
            .expect_err("one staging per volume");
        assert!(matches!(err, VolumeError::Conflict { .. }), "{err:?}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    assert_eq!(env.mounts_under_data(), mounts, "nothing mounted");
    assert_eq!(env.records(), before, "nothing changed");
    // The same options share it.
    let t3 = mgr
        .mount(req("v", &ext, "a3", plain.clone()))
        .await
        .expect("a3");
    assert_eq!(env.mounts_at(&staging(&mgr, "v", plain.key()).unwrap()), 1);
    assert_eq!(
        mgr.allocs().unwrap(),
        BTreeMap::from([(
            "v".to_string(),
            BTreeSet::from(["a1".to_string(), "a3".to_string()])
        )])
    );
    // Once nothing uses the staging, other options take the volume's one staging.
    mgr.unmount("v", "a1").await.expect("unmount a1");
    mgr.unmount("v", "a3").await.expect("unmount a3");
    assert!(!env.mounted(&t1) && !env.mounted(&t3));
    let flagged = with_flags(plain.clone(), &["noatime"]);
    let t4 = mgr.mount(req("v", &ext, "a4", flagged)).await.expect("a4");
    let recs = mgr.usages_of("v").expect("usages");
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].mount_options.mount_flags, ["noatime"]);
    assert!(env.mounted(&t4));
    mgr.unmount("v", "a4").await.expect("unmount a4");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
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
        let err = mgr.unmount(vol, alloc).await.expect_err("refused");
        assert!(matches!(err, VolumeError::InvalidPath { .. }), "{err:?}");
    }
    assert!(env.records().is_empty());
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
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

fn with_flags(mut u: Usage, flags: &[&str]) -> Usage {
    u.mount_options.mount_flags = MountFlags::new(flags.iter().map(|f| (*f).to_string()).collect());
    u
}

#[tokio::test]
async fn without_staging_other_mount_options_get_their_own_variant() {
    let env = env(false).await;
    let mgr = env.manager().await;
    let ext = env.volume("variants").await;
    let plain = usage(false);
    let secret = with_flags(plain.clone(), &["password=hunter2"]);
    let k0 = plain.key();
    let k1 = k0.with_variant(1);
    assert_eq!(k1.dir_name(), format!("{}.1", k0.dir_name()));

    let t1 = mgr
        .mount(req("v", &ext, "a1", plain.clone()))
        .await
        .expect("a1");
    let t2 = mgr
        .mount(req("v", &ext, "a2", secret.clone()))
        .await
        .expect("a2: other options are a second variant, not a conflict");
    assert_eq!(t1, mgr.paths().publish("v", "a1", k0).unwrap());
    assert_eq!(t2, mgr.paths().publish("v", "a2", k1).unwrap());
    assert!(env.mounted(&t1) && env.mounted(&t2));
    // Flags never reach a path.
    for m in env.mounts_under_data() {
        assert!(!m.to_string_lossy().contains("hunter2"), "{}", m.display());
    }
    let recs = mgr.usages_of("v").expect("usages");
    assert_eq!(
        recs.iter().map(|r| r.usage).collect::<Vec<_>>(),
        vec![k0, k1]
    );
    assert_eq!(recs[1].mount_options.mount_flags, ["password=hunter2"]);
    let (rec, target) = mgr.alloc_target("v", "a2").unwrap().expect("a2's target");
    assert_eq!((rec.usage, target), (k1, t2.clone()));
    assert!(mgr.alloc_target("v", "nobody").unwrap().is_none());

    // Releasing variant 0 leaves variant 1 mounted; variant 0 is then free again.
    mgr.unmount("v", "a1").await.expect("unmount a1");
    assert!(!env.mounted(&t1) && env.mounted(&t2));
    let t3 = mgr
        .mount(req("v", &ext, "a3", plain.clone()))
        .await
        .expect("a3");
    assert_eq!(t3, mgr.paths().publish("v", "a3", k0).unwrap());
    // One alloc in two variants is unmounted from both.
    let t4 = mgr
        .mount(req("v", &ext, "a3", secret.clone()))
        .await
        .expect("a3 again, other options");
    assert_eq!(t4, mgr.paths().publish("v", "a3", k1).unwrap());
    mgr.unmount("v", "a3").await.expect("unmount a3");
    assert!(!env.mounted(&t3) && !env.mounted(&t4) && env.mounted(&t2));
    mgr.unmount("v", "a2").await.expect("unmount a2");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
    assert!(mgr.allocs().unwrap().is_empty());
}

#[tokio::test]
async fn another_external_id_for_the_same_volume_is_a_conflict() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("conflict-1").await;
    let other = env.volume("conflict-2").await;
    mgr.mount(req("v", &ext, "a1", usage(false)))
        .await
        .expect("mount");
    // Even for another usage: one volume id is one provider volume.
    for u in [usage(false), usage(true)] {
        let err = mgr
            .mount(req("v", &other, "a2", u))
            .await
            .expect_err("conflict");
        assert!(
            matches!(
                err,
                VolumeError::Conflict {
                    what: "external id",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    assert_eq!(env.records().len(), 1);
}

#[tokio::test]
async fn reconcile_asks_for_secrets_only_for_what_it_drives_again() {
    let env = env(true).await;
    let ext = env.volume("secrets").await;
    let u = usage(false);
    let key = u.key();
    let asked = std::sync::Mutex::new(Vec::<String>::new());
    let secrets = |volume_id: &str| {
        asked.lock().unwrap().push(volume_id.to_string());
        Secrets::new(BTreeMap::from([(
            "token".to_string(),
            "s3cret".to_string(),
        )]))
    };
    // An interrupted stage and publish of one volume, a published-and-mounted one of another.
    let kept = env.manager().await;
    kept.mount(req("other", &env.volume("kept").await, "a9", u.clone()))
        .await
        .expect("mount other");
    let rec = UsageRecord {
        plugin_id: PLUGIN.into(),
        volume_id: "v".into(),
        external_id: ext.clone(),
        usage: key.with_variant(3),
        mount_options: (&u.mount_options).into(),
        staging: Some(StageState::Staging),
        allocs: BTreeMap::from([
            ("a1".to_string(), PublishState::Publishing),
            ("a2".to_string(), PublishState::Publishing),
        ]),
        publish_context: BTreeMap::new(),
        volume_context: BTreeMap::new(),
        // Written before one staging per volume: staged at the usage's own path.
        shared_staging: false,
    };
    env.store.put(Table::USAGES, &rec.key(), &rec).expect("put");

    let mgr = env.manager().await;
    let report = mgr.reconcile(&secrets, &|_, _| false).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    // Asked once for the volume it drove again (stage + two publishes), never for the kept one.
    assert_eq!(*asked.lock().unwrap(), ["v"]);
    let target = mgr.paths().publish("v", "a1", key.with_variant(3)).unwrap();
    assert!(target.ends_with(format!("{}.3", key.dir_name())));
    assert!(env.mounted(&target));

    // Everything in place: nothing to drive, nothing asked.
    asked.lock().unwrap().clear();
    let report = mgr.reconcile(&secrets, &|_, _| false).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(
        report
            .actions
            .iter()
            .all(|a| matches!(a, ReconcileAction::Kept { .. })),
        "{:?}",
        report.actions
    );
    assert!(asked.lock().unwrap().is_empty());
}

#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<Step>>);

impl StepHook for Recorder {
    fn at(&self, step: Step) {
        self.0.lock().unwrap().push(step);
    }
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
            .into_iter()
            .map(|s| s.to_string())
            .collect()
    }
}

#[tokio::test]
async fn the_hook_sees_every_step_in_order() {
    let env = env(true).await;
    let ext = env.volume("hook").await;
    let hook = Arc::new(Recorder::default());
    let mgr = env
        .manager()
        .await
        .with_hook(Arc::clone(&hook) as Arc<dyn StepHook>);
    mgr.mount(req("v", &ext, "a1", usage(false)))
        .await
        .expect("mount");
    mgr.unmount("v", "a1").await.expect("unmount");
    assert_eq!(
        hook.take(),
        [
            "NodeStageVolume:before",
            "NodeStageVolume:after",
            "NodePublishVolume:before",
            "NodePublishVolume:after",
            "NodeUnpublishVolume:before",
            "NodeUnpublishVolume:after",
            "NodeUnstageVolume:before",
            "NodeUnstageVolume:after",
        ]
    );

    // A failed RPC: before, but no after.
    env.plugin.set_faults(&["NodeStageVolume:INTERNAL"]);
    mgr.mount(req("v", &ext, "a1", usage(false)))
        .await
        .expect_err("stage fails");
    assert_eq!(hook.take(), ["NodeStageVolume:before"]);
    env.plugin.set_faults(&[]);

    // Reconcile drives the interrupted stage through the same steps.
    let report = mgr.reconcile(&no_secrets, &|_, _| false).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(
        hook.take(),
        ["NodeStageVolume:before", "NodeStageVolume:after"]
    );
    // And unmount releases the unused staging.
    mgr.unmount("v", "a1").await.expect("release");
    assert_eq!(
        hook.take(),
        ["NodeUnstageVolume:before", "NodeUnstageVolume:after"]
    );
    assert!(env.records().is_empty());
}

#[tokio::test]
async fn stats_of_a_published_alloc() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("stats").await;
    let target = mgr
        .mount(req("v", &ext, "a1", usage(false)))
        .await
        .expect("mount");
    std::fs::write(env.plugin.in_ns(&target).join("f"), vec![0u8; 4096]).expect("write");
    let stats = mgr.stats("v", "a1").await.expect("stats").expect("some");
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == "bytes")
        .expect("bytes");
    assert_eq!(bytes.total, 1 << 30);
    assert!(bytes.used >= 4096, "{bytes:?}");
    assert_eq!(stats.abnormal, None);
    // Nothing published for that alloc, or no such volume: nothing to report.
    assert!(mgr.stats("v", "a2").await.expect("stats").is_none());
    assert!(mgr.stats("w", "a1").await.expect("stats").is_none());
    assert!(matches!(
        mgr.stats("v", "..").await,
        Err(VolumeError::InvalidPath { .. })
    ));

    // A plugin without GET_VOLUME_STATS: none, without an RPC.
    let client = env.client();
    let caps: NodeCapabilities = client
        .node_capabilities()
        .await
        .expect("caps")
        .iter()
        .filter(|c| *c != NodeCapability::GetVolumeStats)
        .collect();
    let mgr = env.manager_caps(client, caps);
    env.plugin.set_faults(&["NodeGetVolumeStats:INTERNAL"]);
    assert!(mgr.stats("v", "a1").await.expect("stats").is_none());
}

#[tokio::test]
async fn expand_every_published_target() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("expand").await;
    let plain = usage(false);
    mgr.mount(req("v", &ext, "a1", plain.clone()))
        .await
        .expect("a1");
    mgr.mount(req("v", &ext, "a2", plain.clone()))
        .await
        .expect("a2");
    let reader = Usage {
        read_only: true,
        ..plain
    };
    mgr.mount(req("v", &ext, "a3", reader)).await.expect("a3");
    let within = CapacityRange {
        required_bytes: 1 << 20,
        limit_bytes: 0,
    };
    assert_eq!(
        mgr.expand("v", within, &Secrets::default())
            .await
            .expect("expand"),
        vec![1 << 30; 3]
    );
    // Nothing published: nothing to expand.
    assert!(
        mgr.expand("w", within, &Secrets::default())
            .await
            .expect("expand")
            .is_empty()
    );
    // More than the provider's volume has: the plugin's error, naming an alloc.
    let beyond = CapacityRange {
        required_bytes: 2 << 30,
        limit_bytes: 0,
    };
    let err = mgr
        .expand("v", beyond, &Secrets::default())
        .await
        .expect_err("out of range");
    assert!(
        matches!(
            &err,
            VolumeError::Csi {
                alloc_id: Some(_),
                ..
            }
        ),
        "{err:?}"
    );

    // A plugin without EXPAND_VOLUME: nothing, without an RPC.
    let client = env.client();
    let caps: NodeCapabilities = client
        .node_capabilities()
        .await
        .expect("caps")
        .iter()
        .filter(|c| *c != NodeCapability::ExpandVolume)
        .collect();
    let mgr = env.manager_caps(client, caps);
    assert!(
        mgr.expand("v", beyond, &Secrets::default())
            .await
            .expect("no expand")
            .is_empty()
    );
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: T) {}
    fn check(mgr: &VolumeManager, ext: &ExternalId) {
        send(mgr.mount(req("v", ext, "a", usage(false))));
        send(mgr.unmount("v", "a"));
        send(mgr.reconcile(&no_secrets, &|_, _| false));
        send(mgr.stats("v", "a"));
        send(mgr.expand("v", CapacityRange::default(), &Secrets::default()));
    }
    let _ = check;
}

#[tokio::test]
async fn a_plugin_view_translates_every_path_sent_to_the_plugin() {
    // The view is not a real bind of the root here, so the directories berth makes are not at
    // the paths the plugin is sent: a plugin that makes them itself (not strict) stands in.
    let env = env_with(true, false).await;
    // The plugin sees the root elsewhere (as a task does, through a bind mount).
    let view = env.plugin.tmp().join("plugin-view");
    let mgr = env.manager().await.with_plugin_view(&view);
    let ext = env.volume("viewed").await;
    let target = mgr
        .mount(req("v", &ext, "a1", usage(false)))
        .await
        .expect("mount");
    // The target handed back is the agent's; the plugin mounted at the paths it was sent.
    assert!(target.starts_with(&env.data), "{}", target.display());
    let rest = target
        .strip_prefix(mgr.paths().root())
        .expect("under the root");
    let seen: Vec<PathBuf> = env
        .plugin
        .mountinfo()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(&view))
        .collect();
    assert_eq!(seen.len(), 2, "one staging and one target: {seen:?}");
    assert!(seen.contains(&view.join(rest)), "{seen:?}");
    assert!(seen.iter().any(|p| p.starts_with(view.join("staging/v"))));
    assert!(env.mounts_under_data().is_empty());
    assert!(mgr.stats("v", "a1").await.expect("stats").is_some());
    mgr.unmount("v", "a1").await.expect("unmount");
    assert!(
        !env.plugin
            .mountinfo()
            .iter()
            .any(|m| m.mount_point.starts_with(&view)),
        "unpublish and unstage were sent the plugin's paths"
    );
    assert!(env.records().is_empty());
}

/// Permission bits of a path.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[tokio::test]
async fn berth_makes_and_removes_the_directories_the_spec_puts_on_the_co() {
    // The plugin is strict: it refuses NodeStageVolume without the staging directory and
    // NodePublishVolume without the target's parent, and makes neither.
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("dirs").await;
    let u = usage(false);
    let staging = staging(&mgr, "v", u.key()).unwrap();
    let t1 = mgr
        .mount(req("v", &ext, "a1", u.clone()))
        .await
        .expect("a1");
    let t2 = mgr
        .mount(req("v", &ext, "a2", u.clone()))
        .await
        .expect("a2");
    // kubelet's mode for the staging directory and the target's parent, every level made.
    assert_eq!(mode(&staging), berth_volumemgr::CO_DIR_MODE);
    assert_eq!(
        mode(staging.parent().unwrap()),
        berth_volumemgr::CO_DIR_MODE
    );
    for t in [&t1, &t2] {
        let parent = t.parent().unwrap();
        assert_eq!(
            mode(parent),
            berth_volumemgr::CO_DIR_MODE,
            "{}",
            parent.display()
        );
        assert_eq!(mode(parent.parent().unwrap()), berth_volumemgr::CO_DIR_MODE);
        assert!(env.mounted(t));
    }
    assert!(env.mounted(&staging));

    // After NodeUnpublishVolume: the target (the plugin's), then the alloc's directories.
    let alloc1 = mgr.paths().alloc_dir("a1").unwrap();
    mgr.unmount("v", "a1").await.expect("unmount a1");
    assert!(
        !t1.exists() && !alloc1.exists(),
        "{} is left",
        alloc1.display()
    );
    assert!(
        staging.exists() && env.mounted(&staging),
        "a2 still uses it"
    );

    // After NodeUnstageVolume: the staging directory and the volume's directory.
    mgr.unmount("v", "a2").await.expect("unmount a2");
    assert!(!staging.exists(), "{} is left", staging.display());
    assert!(!staging.parent().unwrap().exists());
    assert!(!mgr.paths().alloc_dir("a2").unwrap().exists());
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn a_record_left_staged_after_its_twin_unstaged_is_staged_again_before_use() {
    let env = env(true).await;
    let mgr = env.manager().await;
    let ext = env.volume("leftover").await;
    let rw = usage(false);
    let ro = Usage {
        read_only: true,
        ..rw.clone()
    };
    mgr.mount(req("v", &ext, "a1", rw.clone()))
        .await
        .expect("rw");
    let staged = mgr.record("v", rw.key()).unwrap().expect("rw record");
    mgr.unmount("v", "a1").await.expect("unmount rw");
    let staging = staging(&mgr, "v", rw.key()).unwrap();
    assert!(!env.mounted(&staging), "the last user unstaged it");
    // A read-only twin left behind (say, by a store restored from before the unstage): unused,
    // and saying staged where nothing is mounted.
    let twin = UsageRecord {
        usage: ro.key(),
        allocs: BTreeMap::new(),
        ..staged
    };
    env.store
        .put(Table::USAGES, &twin.key(), &twin)
        .expect("put");

    let target = mgr
        .mount(req("v", &ext, "a2", ro.clone()))
        .await
        .expect("the twin is staged again, not trusted");
    assert!(env.mounted(&staging) && env.mounted(&target));
    mgr.unmount("v", "a2").await.expect("unmount ro");
    assert_eq!(env.mounts_under_data(), Vec::<PathBuf>::new());
    assert!(env.records().is_empty());
}
