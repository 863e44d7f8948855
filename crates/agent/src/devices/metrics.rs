//! Device metrics, read from the device manager at every scrape: plugins' state, each
//! instance's health and holder, and its latest statistic.

use std::sync::Arc;

use berth_devices::manager::DeviceManager;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, gauge::ConstGauge},
};

/// Exports the device manager's view.
#[derive(Debug)]
pub struct DeviceCollector {
    manager: Arc<DeviceManager>,
}

impl DeviceCollector {
    /// Over `manager`.
    pub fn new(manager: Arc<DeviceManager>) -> Self {
        Self { manager }
    }
}

impl Collector for DeviceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let m = self.manager.metrics();
        let gauge = |encoder: &mut DescriptorEncoder<'_>,
                     name: &str,
                     help: &str,
                     rows: &mut dyn Iterator<Item = (Vec<(&'static str, String)>, GaugeValue)>|
         -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, value) in rows {
                match value {
                    GaugeValue::Int(v) => {
                        ConstGauge::new(v).encode(family.encode_family(&labels)?)?
                    }
                    GaugeValue::Float(v) => {
                        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
                    }
                }
            }
            Ok(())
        };
        let plugin = |p: &berth_devices::view::PluginMetrics| vec![("plugin", p.plugin.clone())];
        gauge(
            &mut encoder,
            "device_plugin_ready",
            "Whether a device plugin is up and has reported its devices (1) or not (0)",
            &mut m
                .plugins
                .iter()
                .map(|p| (plugin(p), GaugeValue::Int(i64::from(p.ready)))),
        )?;
        gauge(
            &mut encoder,
            "device_plugin_starts",
            "How many times a device plugin instance was started or registered",
            &mut m.plugins.iter().map(|p| {
                (
                    plugin(p),
                    GaugeValue::Int(i64::try_from(p.attachments).unwrap_or(i64::MAX)),
                )
            }),
        )?;
        let instance = |i: &berth_devices::view::InstanceMetrics| {
            vec![
                ("plugin", i.plugin.clone()),
                ("device", i.device.clone()),
                ("instance", i.instance.clone()),
            ]
        };
        gauge(
            &mut encoder,
            "device_healthy",
            "Whether a device instance can be given to tasks (1) or not (0)",
            &mut m
                .instances
                .iter()
                .map(|i| (instance(i), GaugeValue::Int(i64::from(i.healthy)))),
        )?;
        gauge(
            &mut encoder,
            "device_reserved",
            "Whether a device instance is held by an alloc (1) or free (0)",
            &mut m
                .instances
                .iter()
                .map(|i| (instance(i), GaugeValue::Int(i64::from(i.reserved)))),
        )?;
        gauge(
            &mut encoder,
            "device_stat",
            "The latest summary statistic a device plugin reported for an instance, in its unit",
            &mut m.instances.iter().filter_map(|i| {
                let (value, unit) = i.summary.clone()?;
                let mut labels = instance(i);
                labels.push(("unit", unit));
                Some((labels, GaugeValue::Float(value)))
            }),
        )?;
        Ok(())
    }
}

/// A gauge's value: counts and flags are integers, statistics floats.
enum GaugeValue {
    Int(i64),
    Float(f64),
}
