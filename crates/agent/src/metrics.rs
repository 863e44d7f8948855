//! Prometheus metrics: plugin health, probe latency, CSI RPCs by method and code; device
//! plugins' state, device health, holders and latest statistics (read from the device manager
//! at each scrape).

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use berth_csi::{CallObserver, Code, Rpc};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstanceLabels {
    plugin: String,
    instance: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    plugin: String,
    method: String,
    code: String,
}

/// The agent's metrics. Cheap to update from any task.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    healthy: Family<InstanceLabels, Gauge>,
    probe_seconds: Family<PluginLabels, Histogram>,
    rpcs: Family<RpcLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::with_devices(None)
    }

    /// Empty metrics, with the devices of `devices` exported at every scrape.
    pub fn with_devices(devices: Option<Arc<berth_devices::manager::DeviceManager>>) -> Self {
        let mut registry = Registry::with_prefix("berth");
        if let Some(manager) = devices {
            registry.register_collector(Box::new(crate::devices::metrics::DeviceCollector::new(
                manager,
            )));
        }
        let healthy = Family::<InstanceLabels, Gauge>::default();
        let probe_seconds = Family::<PluginLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ])
        });
        let rpcs = Family::<RpcLabels, Counter>::default();
        registry.register(
            "plugin_healthy",
            "Whether a CSI plugin instance is healthy (1) or not (0)",
            healthy.clone(),
        );
        registry.register(
            "csi_probe_duration_seconds",
            "CSI Probe round-trip time",
            probe_seconds.clone(),
        );
        registry.register(
            "csi_rpcs",
            "CSI RPC attempts by plugin, method and result code",
            rpcs.clone(),
        );
        Self {
            registry,
            healthy,
            probe_seconds,
            rpcs,
        }
    }

    /// Sets the health gauge of one instance.
    pub fn set_healthy(&self, plugin: &str, instance: &str, healthy: bool) {
        self.healthy
            .get_or_create(&InstanceLabels {
                plugin: plugin.into(),
                instance: instance.into(),
            })
            .set(i64::from(healthy));
    }

    /// Forgets a deregistered instance.
    pub fn remove_instance(&self, plugin: &str, instance: &str) {
        self.healthy.remove(&InstanceLabels {
            plugin: plugin.into(),
            instance: instance.into(),
        });
    }

    /// A [`CallObserver`] that counts the RPCs of `plugin`'s client.
    pub fn observer(self: &Arc<Self>, plugin: &str) -> Arc<dyn CallObserver> {
        Arc::new(RpcObserver {
            plugin: plugin.to_string(),
            metrics: Arc::clone(self),
            probe_ok: OnceLock::new(),
        })
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

struct RpcObserver {
    plugin: String,
    metrics: Arc<Metrics>,
    /// The series a successful Probe updates, looked up on the first one: the health loop
    /// makes one a second per plugin, and the lookup costs more than the update.
    probe_ok: OnceLock<(Counter, Histogram)>,
}

impl CallObserver for RpcObserver {
    fn on_attempt(&self, rpc: Rpc, _attempt: u32, outcome: Result<(), Code>, latency: Duration) {
        if rpc == Rpc::Probe && outcome.is_ok() {
            let (count, seconds) = self.probe_ok.get_or_init(|| {
                let count = self.metrics.rpcs.get_or_create(&RpcLabels {
                    plugin: self.plugin.clone(),
                    method: rpc.to_string(),
                    code: "OK".into(),
                });
                let seconds = self.metrics.probe_seconds.get_or_create(&PluginLabels {
                    plugin: self.plugin.clone(),
                });
                (count.clone(), seconds.clone())
            });
            count.inc();
            seconds.observe(latency.as_secs_f64());
            return;
        }
        let code = match outcome {
            Ok(()) => "OK".to_string(),
            Err(c) => berth_csi::code_name(c),
        };
        self.metrics
            .rpcs
            .get_or_create(&RpcLabels {
                plugin: self.plugin.clone(),
                method: rpc.to_string(),
                code,
            })
            .inc();
        if rpc == Rpc::Probe {
            self.metrics
                .probe_seconds
                .get_or_create(&PluginLabels {
                    plugin: self.plugin.clone(),
                })
                .observe(latency.as_secs_f64());
        }
    }
}
