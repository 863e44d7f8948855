//! Controller RPCs routed through etcd to the node that runs the controller, against a real
//! etcd and a real berth-hostpath: the asking node has no controller; the serving node runs
//! the request on its plugin and answers. A request waits for a serving node that is not
//! running yet; a request past its deadline is answered without being run.

mod common;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use berth_api::nodes::{FleetNode, NodeController};
use berth_controlplane::{ControllerAccess, ControllerHandle, Controllers, StoredSecrets};
use berth_csi::{
    CapacityRange, Code, ControllerPublish, CreateVolume,
    model::{
        AccessMode, ControllerCapabilities, ControllerCapability, MountOptions, Secrets,
        VolumeCapability,
    },
};
use berth_fleet::{
    Etcd, EtcdSettings, Membership, Router,
    routing::{Call, ControllerRequest, ControllerResult},
};
use berth_testkit::{EtcdCluster, HostpathPlugin};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

struct Node {
    router: Router,
    etcd: Etcd,
}

/// Node `id` registered in the fleet (`controllers` in its record) with its router's mirrors
/// running.
async fn node(
    cluster: &EtcdCluster,
    id: &str,
    controllers: Vec<NodeController>,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Node {
    let mut settings = EtcdSettings::new(cluster.endpoints()).unwrap();
    settings.prefix = "/r".into();
    let etcd = Etcd::connect(&settings).await.unwrap();
    let membership = Membership::new(etcd.clone(), id.into(), settings.lease_ttl);
    tasks.spawn(Arc::clone(membership.node_dir()).run(etcd.clone(), shutdown.clone()));
    tasks.spawn(Arc::clone(membership.alive_dir()).run(etcd.clone(), shutdown.clone()));
    let snapshot: berth_fleet::Snapshot = {
        let id = id.to_string();
        Arc::new(move || FleetNode {
            id: id.clone(),
            name: id.clone(),
            csi_controllers: controllers.clone(),
            ..Default::default()
        })
    };
    tasks.spawn(Arc::clone(&membership).run(snapshot, shutdown.clone()));
    let mut registered = membership.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        registered.wait_for(Option::is_some),
    )
    .await
    .expect("registered in time")
    .unwrap();
    let router = Router::new(etcd.clone(), membership, id.into());
    router.mirrors(tasks, shutdown);
    Node { router, etcd }
}

async fn plugin(tmp: &std::path::Path) -> (HostpathPlugin, common::Local) {
    common::local(
        HostpathPlugin::builder()
            .socket(tmp.join("hp.sock"))
            .statedir(tmp.join("state"))
            .nodeid("n1")
            .call_log(tmp.join("calls")),
    )
    .await
}

fn controllers(caps: &ControllerCapabilities) -> Vec<NodeController> {
    vec![NodeController {
        plugin_id: "hp".into(),
        instance: "hp-1".into(),
        capabilities: caps.clone(),
    }]
}

/// The asking node's remote handle of plugin `hp`, once it sees the serving node.
async fn remote(asker: &Node) -> ControllerHandle {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let ControllerAccess::Healthy(h) = asker.router.controller("hp") {
            return h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the asking node never saw the controller"
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
}

fn writer() -> VolumeCapability {
    VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default())
}

fn calls(tmp: &std::path::Path) -> String {
    std::fs::read_to_string(tmp.join("calls")).unwrap_or_default()
}

async fn keys_under(etcd: &Etcd, dir: &str) -> usize {
    etcd.list::<serde_json::Value>(&etcd.dir(dir))
        .await
        .unwrap()
        .0
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_rpcs_run_on_the_node_that_has_the_controller() {
    let cluster = EtcdCluster::single().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (_hp, local) = plugin(tmp.path()).await;
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let server = node(&cluster, "b", controllers(&local.caps), &tasks, &shutdown).await;
    let asker = node(&cluster, "a", Vec::new(), &tasks, &shutdown).await;
    tasks.spawn(
        server
            .router
            .clone()
            .serve(Arc::new(local), tasks.clone(), shutdown.clone()),
    );

    let h = remote(&asker).await;
    assert_eq!(h.instance, "hp-1@b");
    assert!(
        h.capabilities
            .has(ControllerCapability::PublishUnpublishVolume)
    );
    let secret = "routing-canary-secret";
    let secrets = Secrets::new(BTreeMap::from([("token".to_string(), secret.to_string())]));
    let vol = h
        .client
        .create_volume(&CreateVolume {
            name: "routed".into(),
            capacity: CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            },
            capabilities: vec![writer()],
            secrets: secrets.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateVolume through the serving node");
    let context = h
        .client
        .controller_publish(&ControllerPublish {
            external_id: vol.external_id.clone(),
            node_id: "n1".into(),
            capability: writer(),
            read_only: false,
            volume_context: vol.context.clone(),
            secrets: secrets.clone(),
        })
        .await
        .expect("ControllerPublishVolume through the serving node");
    assert!(context.is_empty() || !context.values().any(|v| v == secret));

    // The plugin's refusal comes back with its code, and names the serving node.
    let err = h
        .client
        .controller_publish(&ControllerPublish {
            external_id: vol.external_id.clone(),
            node_id: "no-such-node".into(),
            capability: writer(),
            read_only: false,
            volume_context: vol.context.clone(),
            secrets: secrets.clone(),
        })
        .await
        .expect_err("an unknown node is refused");
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.to_string().contains("on node b"), "{err}");
    assert!(!err.to_string().contains(secret), "{err}");

    h.client
        .controller_unpublish(&vol.external_id, "n1", &secrets)
        .await
        .expect("ControllerUnpublishVolume");
    h.client
        .delete_volume(&vol.external_id, &secrets)
        .await
        .expect("DeleteVolume");

    let log = calls(tmp.path());
    for rpc in [
        "CreateVolume",
        "ControllerPublishVolume",
        "ControllerUnpublishVolume",
        "DeleteVolume",
    ] {
        assert!(log.contains(rpc), "{rpc} not made by the plugin:\n{log}");
    }
    assert_eq!(server.router.stats().served, 5);
    assert_eq!(asker.router.stats().sent, 5);
    // Nothing is left behind: requests are deleted when answered, answers when collected.
    assert_eq!(keys_under(&server.etcd, "controller").await, 0);
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_node_and_an_expired_one_is_not_run() {
    let cluster = EtcdCluster::single().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (_hp, local) = plugin(tmp.path()).await;
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let server = node(&cluster, "b", controllers(&local.caps), &tasks, &shutdown).await;
    let asker = node(&cluster, "a", Vec::new(), &tasks, &shutdown).await;

    // A request written long ago by a node that gave up: never run.
    let stale = ControllerRequest {
        from: "a".into(),
        plugin_id: "hp".into(),
        call: Call::DeleteVolume {
            external_id: berth_csi::model::ExternalId::new("stale-volume".to_string()).unwrap(),
            secrets: StoredSecrets::default(),
        },
        deadline_ms: 1,
    };
    server
        .etcd
        .put(
            &server.etcd.key(&["controller", "requests", "b", "stale"]),
            &stale,
            None,
        )
        .await
        .unwrap();

    // The serving node does not serve yet: the request waits in etcd.
    let h = remote(&asker).await;
    let ask = tokio::spawn(async move {
        h.client
            .create_volume(&CreateVolume {
                name: "later".into(),
                capabilities: vec![writer()],
                ..Default::default()
            })
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while keys_under(&server.etcd, "controller/requests/b").await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never reached etcd"
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    assert!(!calls(tmp.path()).contains("CreateVolume"));

    // The node comes: it answers what waited.
    tasks.spawn(
        server
            .router
            .clone()
            .serve(Arc::new(local), tasks.clone(), shutdown.clone()),
    );
    let vol = tokio::time::timeout(Duration::from_secs(30), ask)
        .await
        .expect("answered once the node serves")
        .unwrap()
        .expect("CreateVolume");
    assert!(!vol.external_id.as_str().is_empty());
    let stale_result = server
        .etcd
        .get::<ControllerResult>(&server.etcd.key(&["controller", "results", "a", "stale"]))
        .await
        .unwrap()
        .expect("the stale request was answered")
        .value;
    let err = stale_result.outcome.expect_err("not run");
    assert_eq!(err.code, Code::DeadlineExceeded as i32);
    let log = calls(tmp.path());
    assert!(
        !log.contains("DeleteVolume"),
        "an expired request ran:\n{log}"
    );
    assert_eq!(keys_under(&server.etcd, "controller/requests").await, 0);
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
}
