//! Benchmark: `berth agent` with 100 registered CSI plugins, idle.
//!
//! Serves 100 counting fake CSI plugins (Identity + Node) on 100 unix sockets in this process,
//! starts the real agent with all of them declared, waits until every one is healthy, then for
//! `--seconds` (default 60) measures the agent's CPU time and RSS and counts the RPCs each
//! plugin receives. Expected: one Probe per plugin per interval and nothing else (no duplicate
//! loops). Then measures how long after a plugin's socket starts accepting the agent shows it
//! healthy (median of `--late` runs).
//!
//! `cargo bench -p berth --bench agent_idle [-- --seconds 60 --interval 1s --plugins 100]`

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use berth_api::{Client, PluginType, RegisterRequest};
use berth_csi::pb;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[derive(Default)]
struct Counts {
    probe: AtomicU64,
    other: AtomicU64,
}

#[derive(Clone)]
struct Fake(Arc<Counts>);

#[tonic::async_trait]
impl pb::identity_server::Identity for Fake {
    async fn get_plugin_info(
        &self,
        _: Request<pb::GetPluginInfoRequest>,
    ) -> Result<Response<pb::GetPluginInfoResponse>, Status> {
        self.0.other.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::GetPluginInfoResponse {
            name: "fake.csi.bench".into(),
            vendor_version: "1".into(),
            manifest: Default::default(),
        }))
    }
    async fn get_plugin_capabilities(
        &self,
        _: Request<pb::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<pb::GetPluginCapabilitiesResponse>, Status> {
        self.0.other.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::GetPluginCapabilitiesResponse::default()))
    }
    async fn probe(
        &self,
        _: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeResponse>, Status> {
        self.0.probe.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::ProbeResponse { ready: Some(true) }))
    }
}

macro_rules! other {
    ($self:ident) => {{
        $self.0.other.fetch_add(1, Ordering::Relaxed);
        Err(Status::unimplemented("fake"))
    }};
}

#[tonic::async_trait]
impl pb::node_server::Node for Fake {
    async fn node_stage_volume(
        &self,
        _: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        other!(self)
    }
    async fn node_unstage_volume(
        &self,
        _: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        other!(self)
    }
    async fn node_publish_volume(
        &self,
        _: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        other!(self)
    }
    async fn node_unpublish_volume(
        &self,
        _: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        other!(self)
    }
    async fn node_get_volume_stats(
        &self,
        _: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        other!(self)
    }
    async fn node_expand_volume(
        &self,
        _: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        other!(self)
    }
    async fn node_get_capabilities(
        &self,
        _: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        self.0.other.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::NodeGetCapabilitiesResponse::default()))
    }
    async fn node_get_info(
        &self,
        _: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        self.0.other.fetch_add(1, Ordering::Relaxed);
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id: "bench-node".into(),
            ..Default::default()
        }))
    }
}

fn serve(socket: &Path) -> Arc<Counts> {
    let counts = Arc::new(Counts::default());
    let listener = tokio::net::UnixListener::bind(socket).expect("bind");
    let fake = Fake(Arc::clone(&counts));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::identity_server::IdentityServer::new(fake.clone()))
            .add_service(pb::node_server::NodeServer::new(fake))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    counts
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let plugins: usize = arg("--plugins").and_then(|v| v.parse().ok()).unwrap_or(100);
    let seconds: u64 = arg("--seconds").and_then(|v| v.parse().ok()).unwrap_or(60);
    let interval = arg("--interval").map_or(Duration::from_secs(1), |v| {
        humantime::parse_duration(&v).expect("--interval")
    });
    let late_runs: usize = arg("--late").and_then(|v| v.parse().ok()).unwrap_or(20);

    let tmp = tempfile::Builder::new()
        .prefix("bb")
        .tempdir_in("/tmp")
        .expect("tmp");
    let socks = tmp.path().join("s");
    std::fs::create_dir_all(&socks).expect("mkdir");
    let mut config = format!(
        "health {{\n  interval = \"{}\"\n  failures = 3\n}}\n",
        humantime::format_duration(interval)
    );
    let mut counts = Vec::new();
    for i in 0..plugins {
        let socket = socks.join(format!("p{i}.sock"));
        counts.push(serve(&socket));
        config += &format!(
            "plugin \"p{i}\" {{\n  type = \"node\"\n  socket = \"{}\"\n}}\n",
            socket.display()
        );
    }
    let cfg = tmp.path().join("agent.hcl");
    std::fs::write(&cfg, config).expect("config");
    let data = tmp.path().join("data");
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["--log-level", "warn", "agent", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::null())
        .spawn()
        .expect("agent");
    let pid = child.id();
    let _agent = Agent(child);
    let client =
        Client::new(&format!("unix://{}", data.join("berth.sock").display())).expect("client");

    let start = Instant::now();
    loop {
        if let Ok(l) = client.plugins().await
            && l.plugins.len() == plugins
            && l.plugins.iter().all(|p| p.health.healthy)
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "plugins did not all turn healthy"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "{plugins} plugins healthy {:.0} ms after the agent started",
        start.elapsed().as_secs_f64() * 1e3
    );

    // Let start-up settle, then measure an idle window.
    tokio::time::sleep(interval * 2).await;
    let probes0: Vec<u64> = counts
        .iter()
        .map(|c| c.probe.load(Ordering::Relaxed))
        .collect();
    let other0: u64 = counts.iter().map(|c| c.other.load(Ordering::Relaxed)).sum();
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    let mut rss = Vec::new();
    while t0.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(rss_kib(pid) as f64);
    }
    let window = t0.elapsed();
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / 100.0;
    let intervals = window.as_secs_f64() / interval.as_secs_f64();
    let mut per_interval: Vec<f64> = counts
        .iter()
        .zip(&probes0)
        .map(|(c, p0)| (c.probe.load(Ordering::Relaxed) - p0) as f64 / intervals)
        .collect();
    let other = counts
        .iter()
        .map(|c| c.other.load(Ordering::Relaxed))
        .sum::<u64>()
        - other0;
    let min = per_interval.iter().copied().fold(f64::MAX, f64::min);
    let max = per_interval.iter().copied().fold(0.0, f64::max);
    println!(
        "idle window {:.1} s, health interval {interval:?}",
        window.as_secs_f64()
    );
    println!(
        "agent CPU: {cpu:.2} s = {:.2}% of one core",
        100.0 * cpu / window.as_secs_f64()
    );
    println!(
        "agent RSS: median {:.1} MiB, max {:.1} MiB",
        median(&mut rss.clone()) / 1024.0,
        rss.iter().copied().fold(0.0, f64::max) / 1024.0
    );
    println!(
        "Probes per plugin per interval: median {:.2}, min {min:.2}, max {max:.2}",
        median(&mut per_interval)
    );
    println!("other RPCs during the window (all plugins): {other}");

    // Time from a socket accepting to the plugin healthy in the API.
    let mut lat = Vec::new();
    for i in 0..late_runs {
        let socket = socks.join(format!("late{i}.sock"));
        client
            .register(&RegisterRequest {
                id: format!("late{i}"),
                plugin_type: PluginType::Node,
                socket: socket.clone(),
                instance: None,
            })
            .await
            .expect("register");
        // Let the agent fail its first check, so the plugin is waiting, as a late plugin would be.
        let id = format!("late{i}");
        loop {
            if client
                .plugin(&id)
                .await
                .is_ok_and(|p| p.health.last_transition_ms > 0)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        serve(&socket);
        let t = Instant::now();
        loop {
            if client.plugin(&id).await.is_ok_and(|p| p.health.healthy) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "late plugin never healthy"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        client
            .deregister(&id, &berth_api_instance(&client, &id).await)
            .await
            .expect("deregister");
    }
    let mut sorted = lat.clone();
    println!(
        "socket accepting → healthy in the API: median {:.1} ms, max {:.1} ms (n={late_runs}, interval {interval:?})",
        median(&mut sorted),
        lat.iter().copied().fold(0.0, f64::max)
    );
}

async fn berth_api_instance(client: &Client, id: &str) -> String {
    client.plugin(id).await.expect("plugin").instances[0]
        .instance
        .clone()
}
