//! `volume delete` never reports success unless the plugin instance that serves holds the
//! volume: DeleteVolume answers OK for a volume a plugin does not have, so another instance of
//! the plugin (one with its own backend) would "delete" nothing and orphan the data. Two real
//! berth-hostpath processes registered as two instances of one plugin.

mod agent_support;

use std::time::Duration;

use agent_support::AgentProcess;
use berth_api::{
    Client, PluginType, RegisterRequest,
    volumes::{SpecFormat, VolumeSpecRequest},
};

const PLUGIN: &str = "hp";

async fn register(agent: &AgentProcess, instance: &str, socket: &std::path::Path) {
    agent
        .client()
        .register(&RegisterRequest {
            id: PLUGIN.into(),
            plugin_type: PluginType::Monolith,
            socket: socket.to_path_buf(),
            instance: Some(instance.into()),
        })
        .await
        .expect("register");
    let instance = instance.to_string();
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), move |p| {
            p.instances
                .iter()
                .any(|i| i.instance == instance && i.active && i.health.healthy)
        })
        .await;
}

async fn ids(client: &Client) -> Vec<String> {
    let list = client.volumes().await.expect("volumes");
    list.volumes.into_iter().map(|v| v.id).collect()
}

#[tokio::test]
async fn delete_through_an_instance_without_the_volume_keeps_it() {
    let agent = AgentProcess::start("").await;
    let client = agent.client();
    let one = agent_support::hostpath_at(&agent.tmp.path().join("one.sock")).await;
    let two = agent_support::hostpath_at(&agent.tmp.path().join("two.sock")).await;
    register(&agent, "two", two.socket()).await;
    register(&agent, "one", one.socket()).await;
    client
        .create_volume(&VolumeSpecRequest {
            spec: format!(
                "id = \"v\"\nname = \"v\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
                 capability {{\n  access_mode = \"single-node-writer\"\n  \
                 attachment_mode = \"file-system\"\n}}\n"
            ),
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create through instance one");
    let data = one.statedir().join("volumes");
    assert_eq!(std::fs::read_dir(&data).expect("volumes dir").count(), 1);

    // Instance one goes away; two serves the plugin now and has no such volume.
    client
        .deregister(PLUGIN, "one")
        .await
        .expect("deregister one");
    let err = client.delete_volume("v").await.expect_err("kept");
    assert_eq!(err.status(), Some(409), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("instance \"one\"") && text.contains("deregister"),
        "{text}"
    );
    assert_eq!(ids(&client).await, ["v"], "the volume is still known");
    assert_eq!(std::fs::read_dir(&data).expect("volumes dir").count(), 1);

    // With its owner back, delete deletes the data.
    register(&agent, "one", one.socket()).await;
    client
        .delete_volume("v")
        .await
        .expect("delete through its owner");
    assert!(ids(&client).await.is_empty());
    berth_testkit::assert_eventually!(Duration::from_secs(5), || async {
        std::fs::read_dir(&data).expect("volumes dir").count() == 0
    });
}
