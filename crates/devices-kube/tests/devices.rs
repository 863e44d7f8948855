//! A registered plugin's devices reach the manager: mapping, topology, health, bad entries.

mod common;

use berth_devices::{attribute::Attribute, plugin::PluginEvent};
use berth_devices_kube::NUMA_ATTRIBUTE;
use common::*;

#[tokio::test]
async fn a_registered_plugin_is_attached_and_reports_its_devices() {
    let dirs = Dirs::new();
    let (agent, plugin, generation) =
        agent_and_plugin(&dirs, &["--count", "4", "--numa", "2"], 4).await;

    // attach, then Ready, then the devices, all of one generation.
    let events = agent.sink.events(&widget(), 0);
    assert!(
        matches!(&events[0], (g, PluginEvent::Ready { detail }) if *g == generation
            && detail.contains("berth-widget.sock")),
        "{events:?}"
    );
    assert_eq!(agent.sink.attaches(&widget()), [generation]);

    let (_, group) = agent
        .sink
        .wait_devices(&widget(), 0, "devices", healthy(4))
        .await;
    assert_eq!(group.vendor, "example.com");
    assert_eq!(group.device_type, "widget");
    assert_eq!(group.name, "widget");
    let ids: Vec<&str> = group.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["widget-0", "widget-1", "widget-2", "widget-3"]);
    let numa: Vec<Vec<i64>> = group
        .instances
        .iter()
        .map(|i| i.locality.as_ref().expect("locality").numa_nodes.clone())
        .collect();
    assert_eq!(numa, [vec![0], vec![1], vec![0], vec![1]]);
    assert_eq!(group.attributes[NUMA_ATTRIBUTE], Attribute::string("0,1"));
    assert!(
        plugin.calls_named("ListAndWatch").len() >= 2,
        "start and send"
    );
}

#[tokio::test]
async fn without_topology_there_is_no_locality_and_no_numa_attribute() {
    let dirs = Dirs::new();
    let (agent, _plugin, _) = agent_and_plugin(&dirs, &["--count", "1"], 1).await;
    let (_, group) = agent
        .sink
        .wait_devices(&widget(), 0, "devices", healthy(1))
        .await;
    assert_eq!(group.instances[0].locality, None);
    assert!(group.attributes.is_empty());
}

#[tokio::test]
async fn health_follows_the_plugin() {
    let dirs = Dirs::new();
    let (agent, plugin, generation) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;

    let since = agent.sink.len();
    plugin.set_faults("unhealthy");
    let (g, group) = agent
        .sink
        .wait_devices(&widget(), since, "an unhealthy list", |g| {
            g.instances.len() == 2 && g.instances.iter().all(|i| !i.healthy)
        })
        .await;
    assert_eq!(g, generation, "same connection, same generation");
    assert_eq!(group.instances[0].health_description, "Unhealthy");

    let since = agent.sink.len();
    plugin.set_faults("");
    agent
        .sink
        .wait_devices(&widget(), since, "healthy again", healthy(2))
        .await;
}

#[tokio::test]
async fn devices_with_unusable_ids_are_passed_on_for_the_manager_to_report() {
    let dirs = Dirs::new();
    let (agent, plugin, _) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let since = agent.sink.len();
    plugin.set_faults("invalid");
    // The plugin sends three devices, one with an empty id: all three go to the manager,
    // which drops the bad one and reports it (berth-devices' manager tests cover that).
    let (_, group) = agent
        .sink
        .wait_devices(&widget(), since, "the list after the invalid one", |g| {
            g.instances.len() == 3
        })
        .await;
    assert_eq!(
        group.instances.iter().filter(|i| i.id.is_empty()).count(),
        1
    );
    assert!(
        plugin
            .calls_named("ListAndWatch")
            .iter()
            .any(|c| c["event"] == "send" && c["devices"] == 3),
        "the plugin did send the invalid device: {:?}",
        plugin.calls()
    );
    let events = agent.sink.events(&widget(), 0);
    assert!(
        !events
            .iter()
            .any(|(_, e)| matches!(e, PluginEvent::Down { .. })),
        "an invalid entry does not take the plugin down: {events:?}"
    );
}

#[tokio::test]
async fn a_directory_of_devices_is_followed() {
    let dirs = Dirs::new();
    let devs = dirs.state("devs");
    std::fs::create_dir_all(&devs).expect("mkdir");
    std::fs::write(devs.join("gpu-a"), "").expect("write");
    let (agent, _plugin, _) = agent_and_plugin(
        &dirs,
        &[
            "--dir",
            devs.to_str().expect("utf-8"),
            "--list-period",
            "100ms",
        ],
        1,
    )
    .await;
    let since = agent.sink.len();
    std::fs::write(devs.join("gpu-b"), "").expect("write");
    let (_, group) = agent
        .sink
        .wait_devices(&widget(), since, "the new device", healthy(2))
        .await;
    let ids: Vec<&str> = group.instances.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["gpu-a", "gpu-b"]);
}
