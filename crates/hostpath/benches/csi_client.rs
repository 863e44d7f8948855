//! Benchmark: Probe round trip, and a full node stage → publish → unpublish → unstage cycle,
//! through berth's client and through the bare generated tonic stubs, against the real
//! berth-hostpath process. Client and bare samples are interleaved so drift hits both alike;
//! the report gives medians and the client/bare ratio.
//!
//! `cargo bench -p berth-hostpath --bench csi_client [-- --samples N]`

use std::time::{Duration, Instant};

use berth_csi::{
    CreateVolume, CsiClient, Endpoint, NodePublish, NodeStage,
    model::{AccessMode, ExternalId, MountOptions, Secrets, VolumeCapability},
    pb::{self, identity_client::IdentityClient, node_client::NodeClient},
};
use berth_testkit::HostpathPlugin;

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn report(name: &str, samples: &mut [Duration]) -> Duration {
    let m = median(samples);
    println!(
        "{name:<34} median {:>9.1} µs   p90 {:>9.1} µs   n={}",
        m.as_secs_f64() * 1e6,
        percentile(samples, 0.9).as_secs_f64() * 1e6,
        samples.len()
    );
    m
}

struct Paths {
    staging: String,
    target: String,
}

async fn client_cycle(c: &CsiClient, id: &ExternalId, cap: &VolumeCapability, p: &Paths) {
    c.node_stage(&NodeStage {
        external_id: id.clone(),
        staging_path: p.staging.clone().into(),
        capability: cap.clone(),
        publish_context: Default::default(),
        volume_context: Default::default(),
        secrets: Secrets::default(),
    })
    .await
    .expect("stage");
    c.node_publish(&NodePublish {
        external_id: id.clone(),
        staging_path: Some(p.staging.clone().into()),
        target_path: p.target.clone().into(),
        capability: cap.clone(),
        read_only: false,
        publish_context: Default::default(),
        volume_context: Default::default(),
        secrets: Secrets::default(),
    })
    .await
    .expect("publish");
    c.node_unpublish(id, p.target.as_ref())
        .await
        .expect("unpublish");
    c.node_unstage(id, p.staging.as_ref())
        .await
        .expect("unstage");
}

async fn bare_cycle(
    n: &mut NodeClient<tonic::transport::Channel>,
    id: &str,
    cap: &pb::VolumeCapability,
    p: &Paths,
) {
    n.node_stage_volume(pb::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("stage");
    n.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging.clone(),
        target_path: p.target.clone(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("publish");
    n.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: p.target.clone(),
    })
    .await
    .expect("unpublish");
    n.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: p.staging.clone(),
    })
    .await
    .expect("unstage");
}

fn samples_arg() -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--samples")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let samples = samples_arg();
    // attach off: no ControllerPublish needed before staging.
    let plugin = HostpathPlugin::builder()
        .attach(false)
        .log_level("warn")
        .spawn()
        .await;
    let endpoint = Endpoint::parse(&plugin.endpoint()).expect("endpoint");
    let client = CsiClient::new(endpoint.clone());
    let channel = berth_csi::channel(&endpoint);
    let mut identity = IdentityClient::new(channel.clone());
    let mut node = NodeClient::new(channel);

    let cap = VolumeCapability::mount(AccessMode::SingleNodeWriter, MountOptions::default());
    let vol = client
        .create_volume(&CreateVolume {
            name: "bench".into(),
            capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .await
        .expect("create");
    let id = vol.external_id;
    let pb_cap = cap.to_pb();
    let client_paths = Paths {
        staging: plugin.tmp().join("c-staging").display().to_string(),
        target: plugin.tmp().join("c-target").display().to_string(),
    };
    let bare_paths = Paths {
        staging: plugin.tmp().join("b-staging").display().to_string(),
        target: plugin.tmp().join("b-target").display().to_string(),
    };

    // Warm up both paths (connection, page cache, allocator).
    for _ in 0..20 {
        client.probe().await.expect("probe");
        identity.probe(pb::ProbeRequest {}).await.expect("probe");
        client_cycle(&client, &id, &cap, &client_paths).await;
        bare_cycle(&mut node, id.as_str(), &pb_cap, &bare_paths).await;
    }

    let (mut probe_c, mut probe_b, mut cycle_c, mut cycle_b) = (vec![], vec![], vec![], vec![]);
    for _ in 0..samples {
        let t = Instant::now();
        client.probe().await.expect("probe");
        probe_c.push(t.elapsed());
        let t = Instant::now();
        identity.probe(pb::ProbeRequest {}).await.expect("probe");
        probe_b.push(t.elapsed());
        let t = Instant::now();
        client_cycle(&client, &id, &cap, &client_paths).await;
        cycle_c.push(t.elapsed());
        let t = Instant::now();
        bare_cycle(&mut node, id.as_str(), &pb_cap, &bare_paths).await;
        cycle_b.push(t.elapsed());
    }

    println!("berth-hostpath over a unix socket, {samples} interleaved samples each");
    let pc = report("probe, berth client", &mut probe_c);
    let pb_ = report("probe, bare tonic stub", &mut probe_b);
    let cc = report("stage/publish/unpublish/unstage, client", &mut cycle_c);
    let cb = report("stage/publish/unpublish/unstage, bare", &mut cycle_b);
    println!(
        "ratio client/bare: probe {:.3}, cycle {:.3}",
        pc.as_secs_f64() / pb_.as_secs_f64(),
        cc.as_secs_f64() / cb.as_secs_f64()
    );
}
