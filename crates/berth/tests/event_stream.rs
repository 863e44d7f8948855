//! The event stream on a real agent: a reader that reconnects with its last index gets every
//! event in between, in order, exactly once, across an agent kill -9 too; idle streams
//! heartbeat; a reader too far behind is told what it missed; filters; no secret in any event.

mod agent_support;

use std::time::Duration;

use agent_support::{
    AgentProcess, berth, hostpath_config,
    jobs::{run_job, volume_job, wait_alloc},
};
use berth_api::{
    Client,
    jobs::ClientStatus,
    stream::{StreamEvent, StreamLine, Topic, TopicFilter},
    volumes::{SpecFormat, VolumeSpecRequest},
};

const PLUGIN: &str = "hp";
const SECRET: &str = "canary-secret-5f1d";
const FLAG: &str = "canary-flag-93ab";

/// Reads lines until `until` holds for the events read so far (at most `limit`), returning the
/// events in the order received.
async fn read_events(
    client: &Client,
    filter: &TopicFilter,
    after: Option<u64>,
    until: impl Fn(&[StreamEvent]) -> bool,
) -> Vec<StreamEvent> {
    let mut stream = client
        .event_stream(filter, after, Some(Duration::from_millis(200)))
        .await
        .expect("event stream");
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !until(&got) {
        let line = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("timed out; events so far: {got:#?}"))
            .expect("the stream goes on")
            .expect("a line");
        match line {
            StreamLine::Events { index, events } => {
                assert_eq!(events.last().map(|e| e.index), Some(index));
                got.extend(events);
            }
            StreamLine::Heartbeat {} => {}
            StreamLine::Missed { missed } => panic!("missed {missed:?}"),
        }
    }
    got
}

fn has(events: &[StreamEvent], topic: Topic, kind: &str, key: &str) -> bool {
    events
        .iter()
        .any(|e| e.topic == topic && e.kind == kind && e.key == key)
}

fn volume_spec(id: &str) -> String {
    format!(
        "id = \"{id}\"\nname = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{PLUGIN}\"\n\
         capacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n\
         mount_options {{\n  mount_flags = [\"noatime\", \"password={FLAG}\"]\n}}\n\
         secrets {{\n  token = \"{SECRET}\"\n}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_reconnects_gets_every_event_once_in_order_across_an_agent_restart() {
    let mut agent = AgentProcess::start_with_hostpath(PLUGIN, &[]).await;
    let client = agent.client();
    let all = TopicFilter::default();

    // A reader from the start that stays connected until the restart.
    let first = read_events(&client, &all, Some(0), |ev| {
        has(ev, Topic::CsiPlugin, "PluginHealthy", PLUGIN)
    })
    .await;
    assert_eq!(first[0].index, 1, "the window starts at the first event");
    let seen = first.last().expect("events").index;

    // Changes while the reader is away: a volume with secrets, a job that claims it, runs and
    // is stopped.
    client
        .create_volume(&VolumeSpecRequest {
            spec: volume_spec("v1"),
            format: SpecFormat::Hcl,
            file: Some("v1.hcl".into()),
        })
        .await
        .expect("create volume");
    let dir = agent.tmp.path().join("m");
    run_job(
        &client,
        volume_job("j1", "service", "v1", &dir, "echo up; exec sleep 600"),
    )
    .await
    .expect("job run");
    wait_alloc(&agent, "j1", |a| a.client_status == ClientStatus::Running).await;
    client.stop_job("j1").await.expect("stop");
    wait_alloc(&agent, "j1", |a| a.client_status.is_terminal()).await;

    // The reader comes back with its last index: everything since, in order, once.
    let resumed = read_events(&client, &all, Some(seen), |ev| {
        has(ev, Topic::CsiVolume, "VolumeReleased", "v1")
    })
    .await;
    let indexes: Vec<u64> = resumed.iter().map(|e| e.index).collect();
    let expected: Vec<u64> = (seen + 1..=seen + resumed.len() as u64).collect();
    assert_eq!(
        indexes, expected,
        "consecutive, from the one after the last seen"
    );
    for (topic, kind, key) in [
        (Topic::CsiVolume, "VolumeRegistered", "v1"),
        (Topic::Job, "JobRegistered", "j1"),
        (Topic::CsiVolume, "VolumeClaimed", "v1"),
        (Topic::Job, "JobDeregistered", "j1"),
        (Topic::CsiVolume, "VolumeReleased", "v1"),
    ] {
        assert!(
            has(&resumed, topic, kind, key),
            "{kind} {key}: {resumed:#?}"
        );
    }
    let alloc_types: Vec<&str> = resumed
        .iter()
        .filter(|e| e.topic == Topic::Allocation)
        .map(|e| e.kind.as_str())
        .collect();
    for kind in ["AllocationUpdated", "TaskStarted", "TaskKilling"] {
        assert!(alloc_types.contains(&kind), "{kind} in {alloc_types:?}");
    }

    // The agent dies; the events it had shown survive it, and new ones go on from there.
    let last_before = resumed.last().expect("events").index;
    agent.kill9();
    agent.respawn();
    agent.wait_ready().await;
    let client = agent.client();
    let after_restart = read_events(&client, &all, Some(seen), |ev| {
        ev.iter().any(|e| e.index > last_before)
    })
    .await;
    let again: Vec<u64> = after_restart.iter().map(|e| e.index).collect();
    let expected: Vec<u64> = (seen + 1..=seen + after_restart.len() as u64).collect();
    assert_eq!(again, expected, "no gap and no repeat across the restart");
    assert_eq!(
        after_restart[..resumed.len()],
        resumed[..],
        "the same events as before the restart"
    );
    assert!(
        has_any_key(
            &after_restart[resumed.len()..],
            Topic::Node,
            "NodeRegistration"
        ),
        "the restarted agent's own events follow: {:#?}",
        &after_restart[resumed.len()..]
    );

    // No secret or mount flag in any event, nor in what `berth events` prints.
    let everything = read_events(&client, &all, Some(0), |ev| {
        ev.last().is_some_and(|e| e.index >= last_before)
    })
    .await;
    let text = serde_json::to_string(&everything).expect("json");
    for canary in [SECRET, FLAG] {
        assert!(!text.contains(canary), "{canary} in the events");
    }
    let printed = berth(&agent, &["events", "-json"]).await;
    assert!(printed.status.success(), "{printed:?}");
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.lines().count() as u64 >= last_before, "{printed}");
    for canary in [SECRET, FLAG] {
        assert!(!printed.contains(canary), "{canary} printed");
    }
}

/// `has` with an empty key matches any key.
fn has_any_key(events: &[StreamEvent], topic: Topic, kind: &str) -> bool {
    events.iter().any(|e| e.topic == topic && e.kind == kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_heartbeats_and_what_left_the_window() {
    let config = format!(
        "events {{\n  window = 5\n}}\n{}",
        hostpath_config(PLUGIN, &[])
    );
    let agent = AgentProcess::start_in_namespace(&config).await;
    agent
        .wait_plugin(PLUGIN, Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let client = agent.client();

    // Idle: a filter that matches nothing gets heartbeats only.
    let quiet = TopicFilter::parse(["Job:none"]).expect("filter");
    let mut stream = client
        .event_stream(&quiet, Some(0), Some(Duration::from_millis(100)))
        .await
        .expect("stream");
    for _ in 0..3 {
        let line = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("a heartbeat within 5 s")
            .expect("open")
            .expect("line");
        assert_eq!(line, StreamLine::Heartbeat {});
    }
    drop(stream);

    // More than the window: a reader from 0 is told which it missed, then gets the rest.
    for i in 0..4 {
        client
            .create_volume(&VolumeSpecRequest {
                spec: volume_spec(&format!("w{i}")),
                format: SpecFormat::Hcl,
                file: None,
            })
            .await
            .expect("create");
    }
    let mut stream = client
        .event_stream(&TopicFilter::default(), Some(0), None)
        .await
        .expect("stream");
    let newest = stream.index().expect("index header");
    let first = stream.next().await.expect("open").expect("line");
    let StreamLine::Missed { missed } = first else {
        panic!("expected a Missed line, got {first:?}");
    };
    // The window holds the newest 5 (more may have come since the answer's head).
    assert_eq!(missed.from, 1);
    assert!(missed.to >= newest - 5, "{missed:?}, newest {newest}");
    let StreamLine::Events { events, .. } = stream.next().await.expect("open").expect("line")
    else {
        panic!("events");
    };
    assert_eq!(events.first().map(|e| e.index), Some(missed.to + 1));

    // Filters: by topic and key, live: a volume's events by its id only.
    let mut only = client
        .event_stream(
            &TopicFilter::parse(["CSIVolume:w9"]).expect("filter"),
            None,
            Some(Duration::from_millis(100)),
        )
        .await
        .expect("stream");
    for id in ["w8", "w9"] {
        client
            .create_volume(&VolumeSpecRequest {
                spec: volume_spec(id),
                format: SpecFormat::Hcl,
                file: None,
            })
            .await
            .expect("create");
    }
    let vols = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), only.next())
            .await
            .expect("a line within 10 s")
            .expect("open")
            .expect("line");
        if let StreamLine::Events { events, .. } = line {
            break events;
        }
    };
    assert!(
        vols.iter()
            .all(|e| e.topic == Topic::CsiVolume && e.key == "w9"),
        "{vols:#?}"
    );
    assert!(has_any_key(&vols, Topic::CsiVolume, "VolumeRegistered"));

    // Bad queries are refused by parameter.
    let bad = client
        .event_stream(
            &TopicFilter::default(),
            None,
            Some(Duration::from_millis(1)),
        )
        .await
        .expect_err("1 ms heartbeat");
    assert_eq!(bad.status(), Some(400));
    assert!(bad.to_string().contains("`heartbeat`"), "{bad}");
    let out = berth(&agent, &["events", "-topic", "Volumes"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"Volumes\" is not a topic"),
        "{out:?}"
    );
}
