//! Plugins come and go: re-registration, crashes, restarts in place, hangs, graceful stops,
//! and the agent's own shutdown.

mod common;

use berth_devices::plugin::{PluginError, PluginEvent, PluginId};
use common::*;

#[tokio::test]
async fn a_second_registration_replaces_the_instance() {
    let dirs = Dirs::new();
    let (agent, first, g1) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let since = agent.sink.len();

    // The same resource from another socket (a rolling update of the plugin).
    let second = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s2"),
        &["--count", "3", "--socket", "second.sock"],
    );
    let (g2, _) = agent
        .sink
        .wait_devices(&widget(), since, "the new instance's devices", healthy(3))
        .await;
    assert!(g2 > g1, "{g2:?} > {g1:?}");
    assert_eq!(agent.sink.attaches(&widget()), [g1, g2]);

    // The old instance's stream was closed, and it said nothing more.
    berth_testkit::assert_eventually!(
        WAIT,
        || async {
            first
                .calls_named("ListAndWatch")
                .iter()
                .any(|c| c["event"] == "end")
        },
        "the first plugin's ListAndWatch ends"
    );
    let late: Vec<_> = agent
        .sink
        .events(&widget(), since)
        .into_iter()
        .filter(|(g, _)| *g == g1)
        .collect();
    assert!(late.is_empty(), "events of the replaced instance: {late:?}");

    // Calls go to the new instance.
    let (g, ops) = agent.sink.ops(&widget());
    assert_eq!(g, g2);
    ops.reserve(&["widget-2".to_string()])
        .await
        .expect("Allocate");
    assert_eq!(second.calls_named("Allocate").len(), 1);
    assert!(first.calls_named("Allocate").is_empty());
}

#[tokio::test]
async fn a_crashed_plugin_is_down_until_it_is_restarted() {
    let dirs = Dirs::new();
    let (agent, mut plugin, g1) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let since = agent.sink.len();
    plugin.set_faults("crash");
    assert_eq!(
        plugin.wait().await.code(),
        Some(2),
        "the crash fault exits 2"
    );
    let (g, reason, retry_in) = agent
        .sink
        .wait_down(&widget(), since, "Down after the crash", |_, _| true)
        .await;
    assert_eq!(g, g1);
    assert!(reason.contains("ListAndWatch"), "{reason}");
    // Its socket is still there (nobody removed it): berth keeps re-dialing.
    assert!(retry_in.is_some(), "{reason}");
    let (_, ops) = agent.sink.ops(&widget());
    assert!(matches!(
        ops.reserve(&["widget-0".to_string()]).await,
        Err(PluginError::Unavailable { .. })
    ));

    // The operator (here, the test) restarts it.
    plugin.set_faults("");
    let since = agent.sink.len();
    let _plugin = Plugin::spawn(&dirs.kubelet(), &dirs.state("s"), &["--count", "2"]);
    let (g2, _) = agent
        .sink
        .wait_devices(&widget(), since, "devices back", healthy(2))
        .await;
    assert!(g2 > g1);
}

#[tokio::test]
async fn a_plugin_restarted_in_place_is_found_again_without_registering() {
    let dirs = Dirs::new();
    let (agent, mut plugin, g1) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    plugin.set_faults("crash");
    plugin.wait().await;
    let since = agent.sink.len();
    agent
        .sink
        .wait_down(&widget(), since, "Down after the crash", |_, r| r.is_some())
        .await;

    plugin.set_faults("");
    let registers = plugin.calls_named("Register").len();
    let since = agent.sink.len();
    let again = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s"),
        &["--count", "2", "--no-register"],
    );
    let (g2, _) = agent
        .sink
        .wait_devices(&widget(), since, "devices back by re-dialing", healthy(2))
        .await;
    assert!(g2 > g1);
    assert_eq!(
        again.calls_named("Register").len(),
        registers,
        "it did not register again"
    );
}

#[tokio::test]
async fn a_hung_plugin_is_caught_by_the_liveness_check() {
    let dirs = Dirs::new();
    let (agent, plugin, g1) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    let since = agent.sink.len();
    plugin.set_faults("hang");
    let (g, reason, retry_in) = agent
        .sink
        .wait_down(&widget(), since, "Down after the hang", |_, _| true)
        .await;
    assert_eq!(g, g1);
    assert!(reason.contains("stopped answering"), "{reason}");
    assert!(retry_in.is_some());
    let (_, ops) = agent.sink.ops(&widget());
    assert!(matches!(
        ops.reserve(&["widget-0".to_string()]).await,
        Err(PluginError::Unavailable { .. })
    ));

    // Re-dialing goes on; once the plugin answers again it is back.
    let since = agent.sink.len();
    plugin.set_faults("");
    let (g2, _) = agent
        .sink
        .wait_devices(&widget(), since, "devices back after the hang", healthy(2))
        .await;
    assert!(g2 > g1);
}

#[tokio::test]
async fn a_stopped_plugin_is_down_until_it_registers_again() {
    let dirs = Dirs::new();
    let (agent, mut plugin, g1) = agent_and_plugin(&dirs, &["--count", "2"], 2).await;
    // Another plugin, whose liveness checks (one every 300 ms) show time passing.
    let gadget = PluginId::kubernetes("example.com/gadget");
    let clock = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s2"),
        &["--resource", "example.com/gadget", "--count", "1"],
    );
    agent
        .sink
        .wait_devices(&gadget, 0, "the gadget's devices", healthy(1))
        .await;
    let since = agent.sink.len();
    assert!(plugin.stop().await.success());
    let (g, reason, retry_in) = agent
        .sink
        .wait_down(&widget(), since, "Down without retry", |_, r| r.is_none())
        .await;
    assert_eq!(g, g1);
    assert_eq!(retry_in, None);
    assert!(reason.contains("is gone"), "{reason}");
    assert!(reason.contains("register again"), "{reason}");

    // Nothing more happens until it comes back: no re-dial, no event, while the other plugin
    // is checked four more times (longer than the longest re-dial backoff, 500 ms).
    let quiet = agent.sink.len();
    let checks = clock.calls_named("GetDevicePluginOptions").len();
    berth_testkit::assert_eventually!(
        WAIT,
        || async { clock.calls_named("GetDevicePluginOptions").len() >= checks + 4 },
        "four liveness checks of the other plugin"
    );
    let events = agent.sink.events(&widget(), quiet);
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(agent.sink.attaches(&widget()), [g1]);

    let _plugin = Plugin::spawn(&dirs.kubelet(), &dirs.state("s"), &["--count", "2"]);
    let (g2, _) = agent
        .sink
        .wait_devices(
            &widget(),
            quiet,
            "devices after registering again",
            healthy(2),
        )
        .await;
    // The first thing after the quiet time is the new attachment.
    let next = agent.sink.records().into_iter().skip(quiet).find(|r| {
        matches!(r, Record::Attach { plugin, .. } | Record::Event { plugin, .. } if *plugin == widget())
    });
    assert!(
        matches!(next, Some(Record::Attach { generation, .. }) if generation == g2 && g2 > g1),
        "{next:?}"
    );
}

#[tokio::test]
async fn shutdown_removes_every_plugin_and_the_registration_socket() {
    let dirs = Dirs::new();
    let (agent, widget_plugin, g1) = agent_and_plugin(&dirs, &["--count", "1"], 1).await;
    let gadget = PluginId::kubernetes("example.com/gadget");
    let _gadget_plugin = Plugin::spawn(
        &dirs.kubelet(),
        &dirs.state("s2"),
        &["--resource", "example.com/gadget", "--count", "1"],
    );
    let (g2, _) = agent
        .sink
        .wait_devices(&gadget, 0, "the gadget's devices", healthy(1))
        .await;

    let sink = std::sync::Arc::clone(&agent.sink);
    agent.stop().await.expect("clean shutdown");
    assert!(!dirs.kubelet().join("kubelet.sock").exists());
    for (plugin, generation) in [(widget(), g1), (gadget, g2)] {
        let events = sink.events(&plugin, 0);
        let last = events.last().expect("events");
        assert!(
            matches!(last, (g, PluginEvent::Removed { .. }) if *g == generation),
            "{plugin}: {events:?}"
        );
    }
    // The plugin's stream ended with the agent.
    berth_testkit::assert_eventually!(
        WAIT,
        || async {
            widget_plugin
                .calls_named("ListAndWatch")
                .iter()
                .any(|c| c["event"] == "end")
        },
        "the plugin's ListAndWatch ends"
    );
}
