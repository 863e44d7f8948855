//! Two nodes, each with its own etcd connection and lease, race for one single-node-writer
//! volume: exactly one claim wins every time, and the loser's refusal names the rule. A stale
//! view never decides, and a claim and its release write the volume twice each. Against a
//! real etcd (and a real berth-hostpath as the controller).

mod common;

use std::{path::Path, sync::Arc, time::Duration};

use berth_controlplane::{
    Claim, ClaimMode, ClaimState, ControlPlane, ControlPlaneError, ControllerAccess, Controllers,
    NodeClaim, Origin, Plane, PublicationState, VolumeRecord,
};
use berth_csi::{
    CapacityRange, CreateVolume,
    model::{AccessMode, AttachmentMode, MountOptions, VolumeCapability},
};
use berth_fleet::{Etcd, EtcdCatalog, EtcdSettings, Membership, WatchedDir};
use berth_testkit::{EtcdCluster, HostpathPlugin};
use berth_volume::{Operation, StoredMountOptions, VolumeSpec};
use tokio_util::sync::CancellationToken;

/// A plugin with no controller: claims need no controller step.
struct NodeOnly;

impl Controllers for NodeOnly {
    fn controller(&self, _plugin_id: &str) -> ControllerAccess {
        ControllerAccess::NodeOnly
    }
}

struct Node<C: Controllers = NodeOnly> {
    id: String,
    plane: Plane<C>,
    membership: Arc<Membership>,
}

async fn node(cluster: &EtcdCluster, id: &str, shutdown: &CancellationToken) -> Node {
    node_with_view(cluster, id, shutdown, true).await
}

/// A node; with `follow` false its view of the catalog never follows etcd and holds only the
/// node's own writes (a view that trails other nodes for as long as the test wants).
async fn node_with_view(
    cluster: &EtcdCluster,
    id: &str,
    shutdown: &CancellationToken,
    follow: bool,
) -> Node {
    node_with(cluster, id, shutdown, follow, NodeOnly).await
}

/// [`node_with_view`] with `controllers` for the plugin's controller side.
async fn node_with<C: Controllers>(
    cluster: &EtcdCluster,
    id: &str,
    shutdown: &CancellationToken,
    follow: bool,
    controllers: C,
) -> Node<C> {
    let settings = EtcdSettings::new(cluster.endpoints()).unwrap();
    let etcd = Etcd::connect(&settings).await.unwrap();
    let membership = Membership::new(etcd.clone(), id.into(), settings.lease_ttl);
    let volumes = WatchedDir::new(EtcdCatalog::dir(&etcd));
    if follow {
        tokio::spawn(Arc::clone(&volumes).run(etcd.clone(), shutdown.clone()));
        volumes.wait_synced(shutdown).await;
    }
    let snapshot: berth_fleet::Snapshot = {
        let id = id.to_string();
        Arc::new(move || berth_api::nodes::FleetNode {
            id: id.clone(),
            name: id.clone(),
            ..Default::default()
        })
    };
    tokio::spawn(Arc::clone(&membership).run(snapshot, shutdown.clone()));
    let mut registered = membership.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        registered.wait_for(Option::is_some),
    )
    .await
    .expect("registered in time")
    .unwrap();
    let catalog = EtcdCatalog::new(etcd, volumes, Arc::clone(&membership));
    Node {
        id: id.into(),
        plane: Plane::new(Arc::new(catalog), controllers),
        membership,
    }
}

fn record() -> VolumeRecord {
    record_of("ext-1")
}

/// The volume's record, for the provider's volume `external_id`.
fn record_of(external_id: &str) -> VolumeRecord {
    let spec = VolumeSpec::parse_hcl(
        Operation::Register,
        Path::new("v.hcl"),
        r#"
id          = "shared"
name        = "shared"
type        = "csi"
plugin_id   = "hp"
external_id = "ext-1"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#,
    )
    .unwrap();
    VolumeRecord::from_spec(
        &spec,
        Origin::Registered,
        external_id.to_string().try_into().unwrap(),
        0,
        Default::default(),
        Vec::new(),
        0,
    )
}

/// Puts the volume into the catalog as `volume register` would (no controller), when it is
/// not there yet.
async fn put_record(etcd: &Etcd, fence: &berth_fleet::Fence) -> berth_fleet::Outcome {
    etcd.put_if(&etcd.key(&["volumes", "shared"]), &record(), 0, Some(fence))
        .await
        .unwrap()
}

/// The volume's record as etcd holds it now.
async fn stored(etcd: &Etcd) -> VolumeRecord {
    etcd.get::<VolumeRecord>(&etcd.key(&["volumes", "shared"]))
        .await
        .unwrap()
        .expect("the volume is in the catalog")
        .value
}

fn claim<C: Controllers>(node: &Node<C>, alloc: &str) -> NodeClaim {
    NodeClaim {
        volume_id: "shared".into(),
        claim: Claim {
            alloc_id: alloc.into(),
            node_id: node.id.clone(),
            mode: ClaimMode::Write,
            access_mode: AccessMode::SingleNodeWriter,
            attachment_mode: AttachmentMode::FileSystem,
        },
        csi_node_id: node.id.clone(),
        mount_options: StoredMountOptions::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_race_fifty_times_for_one_writer_volume_and_one_wins_each_time() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shutdown = CancellationToken::new();
    let a = node(&cluster, "node-a", &shutdown).await;
    let b = node(&cluster, "node-b", &shutdown).await;
    // The volume goes into the catalog as `volume register` would put it (no controller).
    let etcd = Etcd::connect(&EtcdSettings::new(cluster.endpoints()).unwrap())
        .await
        .unwrap();
    let fence = a.membership.fence().unwrap();
    let put = put_record(&etcd, &fence).await;
    assert!(matches!(put, berth_fleet::Outcome::Done(_)), "{put:?}");
    // The same write again finds the key there: nothing is written twice.
    let again = put_record(&etcd, &fence).await;
    assert_eq!(again, berth_fleet::Outcome::Changed);

    let mut wins = [0usize; 2];
    for round in 0..50 {
        let (ra, rb) = tokio::join!(
            a.plane.claim(claim(&a, &format!("a-{round}"))),
            b.plane.claim(claim(&b, &format!("b-{round}"))),
        );
        let (winner, loser_err) = match (ra, rb) {
            (Ok(_), Err(e)) => (&a, e),
            (Err(e), Ok(_)) => (&b, e),
            (ra, rb) => panic!("round {round}: not exactly one winner: {ra:?} / {rb:?}"),
        };
        assert!(
            matches!(loser_err, ControlPlaneError::Refused { .. }),
            "round {round}: {loser_err}"
        );
        assert!(
            loser_err.to_string().contains("single-node-writer"),
            "{loser_err}"
        );
        wins[usize::from(winner.id == "node-b")] += 1;
        // The record holds the winner's claim only.
        let stored = stored(&etcd).await;
        assert_eq!(
            stored.claims.len(),
            1,
            "round {round}: {:?}",
            stored.claims.keys()
        );
        let alloc = stored.claims.keys().next().unwrap().clone();
        assert!(alloc.starts_with(if winner.id == "node-a" { "a-" } else { "b-" }));
        winner.plane.begin_release("shared", &alloc).await.unwrap();
        winner.plane.finish_release("shared", &alloc).await.unwrap();
    }
    assert_eq!(wins[0] + wins[1], 50);
    eprintln!("wins: node-a {} node-b {}", wins[0], wins[1]);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_registration_lapsed_changes_nothing() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shutdown = CancellationToken::new();
    let a = node(&cluster, "node-a", &shutdown).await;
    let etcd = Etcd::connect(&EtcdSettings::new(cluster.endpoints()).unwrap())
        .await
        .unwrap();
    let fence = a.membership.fence().unwrap();
    put_record(&etcd, &fence).await;
    // The lease is revoked behind the node's back (as when it expires during a pause).
    etcd.client().lease_revoke(fence.lease).await.unwrap();
    let err = a.plane.claim(claim(&a, "a-1")).await.unwrap_err();
    assert!(matches!(err, ControlPlaneError::Backend(_)), "{err}");
    assert!(err.to_string().contains("lapsed"), "{err}");
    let stored = stored(&etcd).await;
    assert!(stored.claims.is_empty(), "{:?}", stored.claims);
    // It registers again with a new lease, and then its claims go through.
    let mut lease = a.membership.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        lease.wait_for(|l| l.is_some_and(|l| l != fence.lease)),
    )
    .await
    .expect("registered again in time")
    .unwrap();
    a.plane.claim(claim(&a, "a-1")).await.unwrap();
    shutdown.cancel();
}

/// A node decides first on its own view of the volume and writes only if the stored record
/// is still the one it saw: a stale view never overwrites another node's change, and a refusal
/// or an allowance decided on a stale view is decided again on the stored record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_of_a_volume_never_decides_a_claim() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shutdown = CancellationToken::new();
    let a = node_with_view(&cluster, "node-a", &shutdown, false).await;
    let b = node(&cluster, "node-b", &shutdown).await;
    let etcd = Etcd::connect(&EtcdSettings::new(cluster.endpoints()).unwrap())
        .await
        .unwrap();
    let fence = b.membership.fence().unwrap();
    let put = put_record(&etcd, &fence).await;
    assert!(matches!(put, berth_fleet::Outcome::Done(_)), "{put:?}");
    let allocs = |r: &VolumeRecord| r.claims.keys().cloned().collect::<Vec<_>>();

    // Node a claims and releases; its view holds its own last write (no claims).
    a.plane.claim(claim(&a, "a-1")).await.unwrap();
    a.plane.confirm("shared", "a-1").await.unwrap();
    a.plane.begin_release("shared", "a-1").await.unwrap();
    a.plane.finish_release("shared", "a-1").await.unwrap();
    // Behind that view, node b claims: a's view (no claims) would allow a's claim, the stored
    // record refuses it, and b's claim stays.
    b.plane.claim(claim(&b, "b-1")).await.unwrap();
    let err = a.plane.claim(claim(&a, "a-2")).await.unwrap_err();
    assert!(matches!(err, ControlPlaneError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("single-node-writer"), "{err}");
    assert_eq!(allocs(&stored(&etcd).await), ["b-1"]);

    // Node b releases behind a's view: a's claim lands on the stored record, not on its view.
    b.plane.begin_release("shared", "b-1").await.unwrap();
    b.plane.finish_release("shared", "b-1").await.unwrap();
    a.plane.claim(claim(&a, "a-3")).await.unwrap();
    assert_eq!(allocs(&stored(&etcd).await), ["a-3"]);

    // Node b frees node a's claim (as for a node that is down): a's view still shows a-3,
    // which would refuse a-4, and the stored record allows it.
    let freed = b.plane.free_node("shared", "node-a").await.unwrap();
    assert_eq!(freed, ["a-3"]);
    assert!(stored(&etcd).await.claims.is_empty());
    a.plane.claim(claim(&a, "a-4")).await.unwrap();
    let last = stored(&etcd).await;
    assert_eq!(allocs(&last), ["a-4"]);
    assert_eq!(last.claims["a-4"].claim.node_id, "node-a");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_its_release_write_the_volume_twice_each_even_when_a_write_decides_again() {
    let cluster = EtcdCluster::single().expect("etcd");
    let shutdown = CancellationToken::new();
    let (_plugin, local) = common::local(HostpathPlugin::builder().nodeid("hp-node")).await;
    let vol = local
        .client
        .create_volume(&CreateVolume {
            name: "shared".into(),
            capacity: CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            },
            capabilities: vec![VolumeCapability::mount(
                AccessMode::SingleNodeWriter,
                MountOptions::default(),
            )],
            ..Default::default()
        })
        .await
        .unwrap();
    // Node a's view holds only its own writes, so its confirm below is decided again on a
    // fresh read once another writer has changed the volume.
    let a = node_with(&cluster, "node-a", &shutdown, false, local).await;
    let etcd = Etcd::connect(&EtcdSettings::new(cluster.endpoints()).unwrap())
        .await
        .unwrap();
    let key = etcd.key(&["volumes", "shared"]);
    let mut rec = record_of(&vol.external_id.to_string());
    rec.context = vol.context.clone();
    let put = etcd.put_if(&key, &rec, 0, None).await.unwrap();
    assert!(matches!(put, berth_fleet::Outcome::Done(_)), "{put:?}");

    // How many times the volume's key was written so far (etcd's per-key version).
    let writes = async || {
        let got = etcd.client().get(key.as_str(), None).await.unwrap();
        got.kvs().first().map_or(0, |kv| kv.version())
    };
    assert_eq!(writes().await, 1);

    let mut req = claim(&a, "a-1");
    req.csi_node_id = "hp-node".into();
    let grant = a.plane.claim(req).await.unwrap();
    assert_eq!(writes().await, 2, "one write for the claim's intent");
    assert!(
        !grant.publish_context.is_empty(),
        "berth-hostpath names the node"
    );
    // The controller's answer is not a transaction of its own: etcd holds the intent.
    let p = stored(&etcd).await.publications["node-a"].clone();
    assert_eq!(p.state, PublicationState::Publishing);
    assert!(p.publish_context.is_empty());

    // Another writer changes the volume behind a's view.
    let now = etcd.get::<VolumeRecord>(&key).await.unwrap().unwrap();
    let put = etcd
        .put_if(&key, &now.value, now.mod_revision, None)
        .await
        .unwrap();
    assert!(matches!(put, berth_fleet::Outcome::Done(_)), "{put:?}");

    // The confirm finds its view stale, decides on the stored record, and still carries the
    // controller's answer.
    a.plane.confirm("shared", "a-1").await.unwrap();
    let last = stored(&etcd).await;
    assert_eq!(last.claims["a-1"].state, ClaimState::Claimed);
    let p = &last.publications["node-a"];
    assert_eq!(p.state, PublicationState::Published);
    assert_eq!(p.publish_context, grant.publish_context);
    assert_eq!(writes().await, 4, "the other writer's, then the confirm");

    // Releasing the node's last claim marks the publication in the same write, and freeing
    // it is the only other one.
    let released = a.plane.begin_release("shared", "a-1").await.unwrap();
    assert!(released.is_some());
    let begun = stored(&etcd).await;
    assert_eq!(begun.claims["a-1"].state, ClaimState::Releasing);
    assert_eq!(
        begun.publications["node-a"].state,
        PublicationState::Unpublishing
    );
    assert_eq!(writes().await, 5);
    a.plane.finish_release("shared", "a-1").await.unwrap();
    let freed = stored(&etcd).await;
    assert!(freed.claims.is_empty() && freed.publications.is_empty());
    assert_eq!(writes().await, 6);
    shutdown.cancel();
}
