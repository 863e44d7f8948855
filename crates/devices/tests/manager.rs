//! The device manager over plugin instances reporting through its sink: validation, health,
//! events, placement (all or nothing, never one instance twice), reservation and release.
//! The plugins here are in-process stand-ins for the sink's other side; the protocol crates
//! test the manager's partners with real plugin processes.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use berth_devices::{
    BoxFuture,
    assignment::AssignedSource,
    attribute::Attribute,
    manager::{
        DeviceManager, DeviceObserver, DeviceRecords, ManagerConfig, NoRecords, TaskRequests,
    },
    model::{ContainerEdits, DeviceGroup, DeviceInstance, DeviceNode},
    plugin::{Generation, PluginError, PluginEvent, PluginId, PluginOps, PluginSink},
    request::{DeviceRequest, RequestInput},
    view::{DeviceEvent, DeviceEventKind, PluginState},
};

#[derive(Debug, Default)]
struct Events(Mutex<Vec<DeviceEvent>>);

impl DeviceObserver for Events {
    fn on_event(&self, event: DeviceEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Events {
    fn take(&self) -> Vec<DeviceEvent> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A plugin's other side: answers reserve with an env var and a node per id, and prefers
/// the last ids when asked.
#[derive(Debug, Default)]
struct Ops {
    prefer_last: bool,
    reserved: Mutex<Vec<Vec<String>>>,
}

impl PluginOps for Ops {
    fn reserve<'a>(
        &'a self,
        device_ids: &'a [String],
    ) -> BoxFuture<'a, Result<ContainerEdits, PluginError>> {
        self.reserved.lock().unwrap().push(device_ids.to_vec());
        let edits = ContainerEdits {
            env: BTreeMap::from([("DEVICES".into(), device_ids.join(","))]),
            device_nodes: device_ids
                .iter()
                .map(|id| DeviceNode {
                    host_path: format!("/dev/{id}").into(),
                    task_path: format!("/dev/{id}").into(),
                    permissions: "rw".into(),
                })
                .collect(),
            ..Default::default()
        };
        Box::pin(async move { Ok(edits) })
    }

    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        _: &'a [String],
        size: usize,
    ) -> BoxFuture<'a, Result<Option<Vec<String>>, PluginError>> {
        let answer = self
            .prefer_last
            .then(|| available[available.len() - size..].to_vec());
        Box::pin(async move { Ok(answer) })
    }
}

fn instance(id: &str, healthy: bool) -> DeviceInstance {
    DeviceInstance {
        id: id.into(),
        healthy,
        health_description: if healthy {
            String::new()
        } else {
            "too hot".into()
        },
        locality: None,
    }
}

fn gpus(name: &str, memory_gib: i64, ids: &[(&str, bool)]) -> DeviceGroup {
    DeviceGroup {
        vendor: "nvidia".into(),
        device_type: "gpu".into(),
        name: name.into(),
        attributes: BTreeMap::from([("memory".into(), Attribute::int(memory_gib, "GiB"))]),
        instances: ids.iter().map(|(id, h)| instance(id, *h)).collect(),
    }
}

fn request(name: &str, count: u32, constraint: Option<(&str, &str, &str)>) -> DeviceRequest {
    let mut input = RequestInput {
        name: name.into(),
        count: Some(u64::from(count)),
        ..Default::default()
    };
    if let Some((a, op, v)) = constraint {
        input
            .constraints
            .push(berth_devices::request::ConstraintInput {
                attribute: a.into(),
                operator: Some(op.into()),
                value: v.into(),
            });
    }
    DeviceRequest::build(&input).expect("a valid request")
}

struct Setup {
    manager: Arc<DeviceManager>,
    events: Arc<Events>,
    plugin: PluginId,
    generation: Generation,
    ops: Arc<Ops>,
}

impl Setup {
    /// Tells the manager `event` of the plugin's current generation.
    fn send(&self, event: PluginEvent) {
        self.manager.event(&self.plugin, self.generation, event);
    }
}

fn setup(groups: Vec<DeviceGroup>, prefer_last: bool) -> Setup {
    setup_as(PluginId::nomad("gpus"), groups, prefer_last)
}

/// [`setup`] with a plugin of another id (a preferred allocation is a Kubernetes plugin's).
fn setup_as(plugin: PluginId, groups: Vec<DeviceGroup>, prefer_last: bool) -> Setup {
    let events = Arc::new(Events::default());
    let manager = Arc::new(DeviceManager::new(
        ManagerConfig::default(),
        events.clone(),
        Arc::new(NoRecords),
    ));
    let ops = Arc::new(Ops {
        prefer_last,
        ..Default::default()
    });
    let generation = manager.attach(&plugin, ops.clone());
    manager.event(
        &plugin,
        generation,
        PluginEvent::Ready {
            detail: "v1".into(),
        },
    );
    manager.event(&plugin, generation, PluginEvent::Devices(groups));
    Setup {
        manager,
        events,
        plugin,
        generation,
        ops,
    }
}

fn task<'a>(alloc_id: &'a str, requests: &'a [DeviceRequest]) -> TaskRequests<'a> {
    TaskRequests {
        alloc_id,
        task: "t",
        at: "group g, task t",
        requests,
    }
}

#[tokio::test]
async fn healthy_free_instances_are_placed_once_and_reserved() {
    let s = setup(
        vec![gpus(
            "k80",
            12,
            &[("g0", true), ("g1", true), ("g2", false)],
        )],
        false,
    );
    let kinds: Vec<DeviceEventKind> = s.events.take().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            DeviceEventKind::PluginReady,
            DeviceEventKind::DevicesChanged
        ]
    );
    let reqs = [request("nvidia/gpu", 1, None)];
    let a = s.manager.place(&[task("a1", &reqs)]).await.expect("placed");
    let b = s.manager.place(&[task("a2", &reqs)]).await.expect("placed");
    let ids_a = &a[&("a1".into(), "t".into())][0].ids;
    let ids_b = &b[&("a2".into(), "t".into())][0].ids;
    assert_eq!(ids_a, &["g0"]);
    assert_eq!(ids_b, &["g1"], "never the same instance twice");
    // The unhealthy one is never given: a third alloc is refused with every reason.
    let err = s.manager.place(&[task("a3", &reqs)]).await.unwrap_err();
    let all = err.join("\n");
    assert!(
        all.contains("group g, task t, device \"nvidia/gpu\": nvidia/gpu/k80: 0 healthy free instance(s) of 3, 1 needed"),
        "{all}"
    );
    assert!(
        all.contains("g0 held by alloc a1") && all.contains("g2 unhealthy: too hot"),
        "{all}"
    );
    let view = s.manager.view();
    let held: Vec<Option<String>> = view.groups[0]
        .instances
        .iter()
        .map(|i| i.reserved_by.clone())
        .collect();
    assert_eq!(held, [Some("a1".into()), Some("a2".into()), None]);

    // Reserve asks the plugin for exactly the assigned ids.
    let edits = s
        .manager
        .reserve("a1", &a[&("a1".into(), "t".into())])
        .await
        .expect("reserve");
    assert_eq!(edits.env["DEVICES"], "g0");
    assert_eq!(
        s.ops.reserved.lock().unwrap().as_slice(),
        [vec!["g0".to_string()]]
    );
    // Only the holder gets them: the plugin is not asked for another alloc.
    let err = s
        .manager
        .reserve("a2", &a[&("a1".into(), "t".into())])
        .await
        .unwrap_err();
    assert!(err.contains("held by alloc a1, not by alloc a2"), "{err}");
    assert_eq!(s.ops.reserved.lock().unwrap().len(), 1);

    assert_eq!(s.manager.release("a1"), 1);
    let again = s.manager.place(&[task("a4", &reqs)]).await.expect("placed");
    assert_eq!(again[&("a4".into(), "t".into())][0].ids, ["g0"]);
}

#[tokio::test]
async fn a_placement_is_all_or_nothing() {
    let s = setup(vec![gpus("k80", 12, &[("g0", true), ("g1", true)])], false);
    let one = [request("gpu", 1, None)];
    let two = [request("gpu", 2, None)];
    // Two tasks asking for three in all: refused, and nothing is held afterwards.
    let err = s
        .manager
        .place(&[task("a1", &one), task("a2", &two)])
        .await
        .unwrap_err();
    assert!(
        err.join("\n")
            .contains("1 healthy free instance(s) of 2, 2 needed"),
        "{err:?}"
    );
    assert!(s.manager.holders().is_empty());
    assert!(
        s.manager.view().groups[0]
            .instances
            .iter()
            .all(|i| i.reserved_by.is_none())
    );
    // Asking for more than there are at all.
    let five = [request("nvidia/gpu/k80", 5, None)];
    let err = s.manager.place(&[task("a3", &five)]).await.unwrap_err();
    assert!(
        err.join("\n")
            .contains("2 healthy free instance(s) of 2, 5 needed"),
        "{err:?}"
    );
    assert!(s.manager.holders().is_empty());
}

#[tokio::test]
async fn names_constraints_and_affinities_choose_the_group() {
    let s = setup(
        vec![
            gpus("k80", 12, &[("k0", true)]),
            gpus("t4", 16, &[("t0", true)]),
        ],
        false,
    );
    let big = [request(
        "nvidia/gpu",
        1,
        Some(("${device.attr.memory}", ">=", "16384 MiB")),
    )];
    let chosen = s.manager.place(&[task("a1", &big)]).await.expect("placed");
    assert_eq!(chosen[&("a1".into(), "t".into())][0].ids, ["t0"]);
    // No group fits: each says why.
    let huge = [request(
        "nvidia/gpu",
        1,
        Some(("${device.attr.memory}", ">", "1 TiB")),
    )];
    let err = s
        .manager
        .place(&[task("a2", &huge)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(err.contains("nvidia/gpu/k80: constraint"), "{err}");
    assert!(err.contains("nvidia/gpu/t4: constraint"), "{err}");
    // Unknown device: named as such, listing what the node has.
    let fpga = [request("xilinx/fpga", 1, None)];
    let err = s
        .manager
        .place(&[task("a3", &fpga)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(
        err.contains("no such device on this node (it has nvidia/gpu/k80, nvidia/gpu/t4)"),
        "{err}"
    );
    // Without an affinity the first group in name order is chosen (k80); an affinity for
    // the t4 wins over that.
    s.manager.release("a1");
    let plain = [request("gpu", 1, None)];
    let chosen = s
        .manager
        .place(&[task("a0", &plain)])
        .await
        .expect("placed");
    assert_eq!(chosen[&("a0".into(), "t".into())][0].ids, ["k0"]);
    s.manager.release("a0");
    let mut input = RequestInput {
        name: "gpu".into(),
        ..Default::default()
    };
    input
        .affinities
        .push(berth_devices::request::AffinityInput {
            attribute: "${device.model}".into(),
            operator: Some("=".into()),
            value: "t4".into(),
            weight: Some(50),
        });
    let liked = [DeviceRequest::build(&input).unwrap()];
    let chosen = s
        .manager
        .place(&[task("a4", &liked)])
        .await
        .expect("placed");
    assert_eq!(chosen[&("a4".into(), "t".into())][0].ids, ["t0"]);
}

#[tokio::test]
async fn the_plugins_preferred_allocation_is_used() {
    let s = setup_as(
        PluginId::kubernetes("nvidia.com/gpu"),
        vec![gpus("k80", 12, &[("g0", true), ("g1", true), ("g2", true)])],
        true,
    );
    let two = [request("gpu", 2, None)];
    let chosen = s.manager.place(&[task("a1", &two)]).await.expect("placed");
    assert_eq!(chosen[&("a1".into(), "t".into())][0].ids, ["g1", "g2"]);
}

#[tokio::test]
async fn health_changes_and_plugin_state_decide_what_may_be_given() {
    let s = setup(vec![gpus("k80", 12, &[("g0", true)])], false);
    s.events.take();
    s.send(PluginEvent::Devices(vec![gpus(
        "k80",
        12,
        &[("g0", false)],
    )]));
    let events = s.events.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, DeviceEventKind::DeviceUnhealthy);
    assert_eq!(events[0].device.as_deref(), Some("nvidia/gpu/k80/g0"));
    assert!(events[0].message.contains("too hot"), "{events:?}");
    let reqs = [request("gpu", 1, None)];
    assert!(s.manager.place(&[task("a1", &reqs)]).await.is_err());

    s.send(PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true)])]));
    assert_eq!(s.events.take()[0].kind, DeviceEventKind::DeviceHealthy);
    // The plugin goes down: its devices stay listed, unusable, with the reason.
    s.send(PluginEvent::Down {
        reason: "exited (signal 9)".into(),
        retry_in: Some(std::time::Duration::from_millis(500)),
    });
    let view = s.manager.view();
    assert_eq!(view.plugins[0].state, PluginState::Down);
    assert!(!view.groups[0].instances[0].healthy);
    assert!(
        view.groups[0].instances[0]
            .health_description
            .contains("its plugin is down: exited (signal 9)"),
        "{view:?}"
    );
    let err = s
        .manager
        .place(&[task("a1", &reqs)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(err.contains("its plugin is down"), "{err}");
    assert!(s.manager.reserve("a1", &[]).await.unwrap().is_empty());

    // A new instance: events of the old generation are dropped.
    let g2 = s.manager.attach(&s.plugin, s.ops.clone());
    s.send(PluginEvent::Devices(Vec::new()));
    assert_eq!(
        s.manager.view().groups.len(),
        1,
        "a stale instance changes nothing"
    );
    s.manager.event(
        &s.plugin,
        g2,
        PluginEvent::Ready {
            detail: "v2".into(),
        },
    );
    s.manager.event(
        &s.plugin,
        g2,
        PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true)])]),
    );
    assert!(s.manager.place(&[task("a1", &reqs)]).await.is_ok());
}

#[tokio::test]
async fn an_invalid_device_list_is_reported_and_its_entries_never_given() {
    let s = setup(Vec::new(), false);
    s.events.take();
    let mut bad = gpus("k80", 12, &[("", true), ("g1", true)]);
    bad.instances.push(instance("g1", true));
    let mut empty_vendor = gpus("t4", 16, &[("t0", true)]);
    empty_vendor.vendor.clear();
    s.send(PluginEvent::Devices(vec![bad, empty_vendor]));
    let events = s.events.take();
    let invalid = events
        .iter()
        .find(|e| e.kind == DeviceEventKind::FingerprintInvalid)
        .expect("reported");
    assert!(
        invalid.message.contains("empty instance id"),
        "{}",
        invalid.message
    );
    assert!(
        invalid.message.contains("empty vendor"),
        "{}",
        invalid.message
    );
    let view = s.manager.view();
    assert_eq!(view.groups.len(), 1);
    let ids: Vec<&str> = view.groups[0]
        .instances
        .iter()
        .map(|i| i.id.as_str())
        .collect();
    assert_eq!(ids, ["g1"]);
    assert_eq!(
        view.plugins[0].invalid.len(),
        3,
        "{:?}",
        view.plugins[0].invalid
    );
    let two = [request("gpu", 2, None)];
    assert!(s.manager.place(&[task("a1", &two)]).await.is_err());
    assert!(s.manager.holders().is_empty());
}

#[tokio::test]
async fn an_empty_device_list_is_an_answer_at_once() {
    let s = setup(Vec::new(), false);
    let view = s.manager.view();
    assert_eq!(view.plugins[0].state, PluginState::Ready);
    assert!(view.plugins[0].fingerprinted);
    let events = s.events.take();
    assert!(
        events
            .iter()
            .any(|e| e.kind == DeviceEventKind::DevicesChanged && e.message == "no devices"),
        "{events:?}"
    );
    // A job without devices never waits for devices; one with devices is told why not.
    assert!(
        s.manager
            .place(&[task("a1", &[])])
            .await
            .unwrap()
            .is_empty()
    );
    let reqs = [request("gpu", 1, None)];
    let err = s
        .manager
        .place(&[task("a1", &reqs)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(err.contains("it has no devices"), "{err}");
}

#[derive(Debug, Default)]
struct Kept(Mutex<BTreeMap<PluginId, Vec<DeviceGroup>>>);

impl DeviceRecords for Kept {
    fn load(&self) -> Vec<(PluginId, Vec<DeviceGroup>)> {
        self.0.lock().unwrap().clone().into_iter().collect()
    }
    fn save(&self, plugin: &PluginId, groups: &[DeviceGroup]) {
        self.0
            .lock()
            .unwrap()
            .insert(plugin.clone(), groups.to_vec());
    }
    fn remove(&self, plugin: &PluginId) {
        self.0.lock().unwrap().remove(plugin);
    }
}

#[tokio::test]
async fn the_last_device_list_and_reservations_survive_a_restart() {
    let kept = Arc::new(Kept::default());
    let plugin = PluginId::nomad("gpus");
    let first = DeviceManager::new(
        ManagerConfig::default(),
        Arc::new(Events::default()),
        kept.clone(),
    );
    let g = first.attach(&plugin, Arc::new(Ops::default()));
    first.event(
        &plugin,
        g,
        PluginEvent::Ready {
            detail: String::new(),
        },
    );
    first.event(
        &plugin,
        g,
        PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true), ("g1", true)])]),
    );
    let reqs = [request("gpu", 1, None)];
    let chosen = first.place(&[task("a1", &reqs)]).await.unwrap();
    let class_before = first.groups();
    // A clean shutdown: the plugin is removed from the live view, its list stays stored.
    first.event(
        &plugin,
        g,
        PluginEvent::Removed {
            reason: "the agent shuts down".into(),
        },
    );
    assert!(first.groups().is_empty());

    // The next agent shows the last known devices (not usable until the plugin reports),
    // and gets the reservations back from the allocs.
    let second = DeviceManager::new(
        ManagerConfig::default(),
        Arc::new(Events::default()),
        kept.clone(),
    );
    assert_eq!(second.groups(), class_before);
    let view = second.view();
    assert_eq!(view.plugins[0].state, PluginState::Restored);
    assert!(!view.groups[0].instances[0].healthy);
    assert!(
        second
            .restore("a1", &chosen[&("a1".into(), "t".into())])
            .is_empty()
    );
    let g = second.attach(&plugin, Arc::new(Ops::default()));
    second.event(
        &plugin,
        g,
        PluginEvent::Ready {
            detail: String::new(),
        },
    );
    second.event(
        &plugin,
        g,
        PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true), ("g1", true)])]),
    );
    let next = second.place(&[task("a2", &reqs)]).await.unwrap();
    assert_eq!(
        next[&("a2".into(), "t".into())][0].ids,
        ["g1"],
        "g0 is still a1's"
    );
    // A restored plugin that is not configured any more goes, with its devices.
    let third = DeviceManager::new(
        ManagerConfig::default(),
        Arc::new(Events::default()),
        kept.clone(),
    );
    third.forget_restored(|_| false);
    assert!(third.groups().is_empty());
    assert!(kept.load().is_empty());
}

#[tokio::test]
async fn cdi_devices_named_in_a_job_resolve_from_the_spec_dirs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("example.json"),
        r#"{
  "cdiVersion": "0.6.0",
  "kind": "example.com/device",
  "devices": [
    {"name": "dev0", "containerEdits": {"env": ["DEV=0"], "deviceNodes": [{"path": "/dev/example0", "hostPath": "/dev/null"}]}}
  ]
}"#,
    )
    .unwrap();
    let manager = DeviceManager::new(
        ManagerConfig {
            cdi_dirs: vec![dir.path().to_path_buf(), Path::new("/nonexistent").into()],
        },
        Arc::new(Events::default()),
        Arc::new(NoRecords),
    );
    let reqs = [request("example.com/device=dev0", 1, None)];
    let chosen = manager.place(&[task("a1", &reqs)]).await.expect("placed");
    let a = &chosen[&("a1".into(), "t".into())];
    assert_eq!(a[0].source, AssignedSource::Cdi);
    let edits = manager.reserve("a1", a).await.expect("resolved");
    assert_eq!(edits.env["DEV"], "0");
    assert_eq!(edits.device_nodes[0].host_path, Path::new("/dev/null"));
    assert_eq!(edits.device_nodes[0].task_path, Path::new("/dev/example0"));
    // Held: a second alloc is refused; an unknown name says so.
    let err = manager
        .place(&[task("a2", &reqs)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(err.contains("held by alloc a1"), "{err}");
    let other = [request("example.com/device=dev9", 1, None)];
    let err = manager
        .place(&[task("a3", &other)])
        .await
        .unwrap_err()
        .join("\n");
    assert!(err.contains("dev9"), "{err}");
}

#[tokio::test]
async fn attribute_changes_are_events_and_unregistered_plugins_expire() {
    let s = setup(vec![gpus("k80", 12, &[("g0", true)])], false);
    s.events.take();
    s.send(PluginEvent::Devices(vec![gpus("k80", 24, &[("g0", true)])]));
    let events = s.events.take();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, DeviceEventKind::DevicesChanged);

    // A Kubernetes plugin whose socket went: it must register again, or go after the grace.
    let kube = PluginId::kubernetes("example.com/widget");
    let g = s.manager.attach(&kube, s.ops.clone());
    s.manager.event(
        &kube,
        g,
        PluginEvent::Ready {
            detail: String::new(),
        },
    );
    s.manager.event(
        &kube,
        g,
        PluginEvent::Devices(vec![DeviceGroup {
            vendor: "example.com".into(),
            device_type: "widget".into(),
            name: "widget".into(),
            attributes: BTreeMap::new(),
            instances: vec![instance("w0", true)],
        }]),
    );
    s.manager.expire_unregistered(std::time::Duration::ZERO);
    assert_eq!(s.manager.view().groups.len(), 2, "a ready plugin stays");
    s.manager.event(
        &kube,
        g,
        PluginEvent::Down {
            reason: "its socket is gone".into(),
            retry_in: None,
        },
    );
    s.manager
        .expire_unregistered(std::time::Duration::from_secs(3600));
    assert_eq!(
        s.manager.view().groups.len(),
        2,
        "within the grace it stays"
    );
    s.manager.expire_unregistered(std::time::Duration::ZERO);
    let view = s.manager.view();
    assert_eq!(view.groups.len(), 1, "{view:?}");
    assert_eq!(view.plugins.len(), 1);
    // Nomad plugins are the agent's to restart: never expired this way.
    s.send(PluginEvent::Down {
        reason: "exited".into(),
        retry_in: None,
    });
    s.manager.expire_unregistered(std::time::Duration::ZERO);
    assert_eq!(s.manager.view().plugins.len(), 1);
}

#[tokio::test]
async fn statistics_and_invalid_reports_are_bounded() {
    let s = setup(Vec::new(), false);
    let many: Vec<DeviceGroup> = (0..40)
        .map(|i| {
            let mut g = gpus(&format!("m{i}"), 1, &[("", true)]);
            g.vendor.clear();
            g
        })
        .collect();
    s.events.take();
    s.send(PluginEvent::Devices(many));
    let view = s.manager.view();
    assert_eq!(view.plugins[0].invalid.len(), 17, "16 problems and a count");
    assert!(view.plugins[0].invalid[16].contains("and 24 more"));

    s.send(PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true)])]));
    let mut huge = berth_devices::model::StatObject::default();
    for i in 0..10_000 {
        huge.attributes.insert(
            format!("v{i}"),
            berth_devices::model::StatValue {
                string: Some("x".repeat(10_000)),
                ..Default::default()
            },
        );
    }
    let stats = berth_devices::model::InstanceStats {
        summary: None,
        stats: Some(huge),
        timestamp_ms: 1,
    };
    s.send(PluginEvent::Stats(vec![berth_devices::model::GroupStats {
        group: gpus("k80", 12, &[]).id(),
        instances: BTreeMap::from([("g0".to_string(), stats)]),
    }]));
    let view = s.manager.view();
    let kept = view.groups[0].instances[0]
        .stats
        .clone()
        .unwrap()
        .stats
        .unwrap();
    assert_eq!(kept.attributes.len(), 256);
    assert!(
        kept.attributes
            .values()
            .all(|v| v.string.as_ref().unwrap().len() == 256)
    );
}

/// A plugin whose preferred allocation waits until released (to change the world meanwhile).
#[derive(Debug)]
struct SlowOps {
    asked: tokio::sync::Notify,
    answer: tokio::sync::Notify,
}

impl PluginOps for SlowOps {
    fn reserve<'a>(
        &'a self,
        _: &'a [String],
    ) -> BoxFuture<'a, Result<ContainerEdits, PluginError>> {
        Box::pin(async { Ok(ContainerEdits::default()) })
    }

    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        _: &'a [String],
        size: usize,
    ) -> BoxFuture<'a, Result<Option<Vec<String>>, PluginError>> {
        Box::pin(async move {
            self.asked.notify_one();
            self.answer.notified().await;
            Ok(Some(available[..size].to_vec()))
        })
    }
}

#[tokio::test]
async fn what_changed_while_a_plugin_was_asked_is_not_taken() {
    let manager = Arc::new(DeviceManager::new(
        ManagerConfig::default(),
        Arc::new(Events::default()),
        Arc::new(NoRecords),
    ));
    let plugin = PluginId::kubernetes("example.com/gpu");
    let ops = Arc::new(SlowOps {
        asked: tokio::sync::Notify::new(),
        answer: tokio::sync::Notify::new(),
    });
    let g = manager.attach(&plugin, ops.clone());
    manager.event(
        &plugin,
        g,
        PluginEvent::Ready {
            detail: String::new(),
        },
    );
    manager.event(
        &plugin,
        g,
        PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", true)])]),
    );
    let placing = {
        let manager = Arc::clone(&manager);
        tokio::spawn(async move {
            let reqs = [request("gpu", 1, None)];
            manager.place(&[task("a1", &reqs)]).await
        })
    };
    ops.asked.notified().await;
    // While the plugin is asked, the device turns unhealthy.
    manager.event(
        &plugin,
        g,
        PluginEvent::Devices(vec![gpus("k80", 12, &[("g0", false)])]),
    );
    ops.answer.notify_one();
    let err = placing.await.unwrap().unwrap_err().join("\n");
    assert!(err.contains("changed while this job was placed"), "{err}");
    assert!(manager.holders().is_empty());
}
