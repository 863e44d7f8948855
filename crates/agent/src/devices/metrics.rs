//! Device metrics, read from the device manager at every scrape: plugins' state, each
//! instance's health and holder, and its latest statistic.

use std::sync::Arc;

use berth_devices::{manager::DeviceManager, view::PluginState};
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
        let view = self.manager.view();
        {
            let mut m = encoder.encode_descriptor(
                "device_plugin_ready",
                "Whether a device plugin is up and has reported its devices (1) or not (0)",
                None,
                MetricType::Gauge,
            )?;
            for p in &view.plugins {
                let labels = vec![("plugin", p.id.to_string())];
                let ready = p.state == PluginState::Ready && p.fingerprinted;
                ConstGauge::new(i64::from(ready)).encode(m.encode_family(&labels)?)?;
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "device_plugin_starts",
                "How many times a device plugin instance was started or registered",
                None,
                MetricType::Gauge,
            )?;
            for p in &view.plugins {
                let labels = vec![("plugin", p.id.to_string())];
                let starts = i64::try_from(p.attachments).unwrap_or(i64::MAX);
                ConstGauge::new(starts).encode(m.encode_family(&labels)?)?;
            }
        }
        let instances = view.groups.iter().flat_map(|g| {
            g.instances.iter().map(move |i| {
                (
                    vec![
                        ("plugin", g.plugin.to_string()),
                        (
                            "device",
                            format!("{}/{}/{}", g.vendor, g.device_type, g.name),
                        ),
                        ("instance", i.id.clone()),
                    ],
                    i,
                )
            })
        });
        let instances: Vec<_> = instances.collect();
        {
            let mut m = encoder.encode_descriptor(
                "device_healthy",
                "Whether a device instance can be given to tasks (1) or not (0)",
                None,
                MetricType::Gauge,
            )?;
            for (labels, i) in &instances {
                ConstGauge::new(i64::from(i.healthy)).encode(m.encode_family(labels)?)?;
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "device_reserved",
                "Whether a device instance is held by an alloc (1) or free (0)",
                None,
                MetricType::Gauge,
            )?;
            for (labels, i) in &instances {
                ConstGauge::new(i64::from(i.reserved_by.is_some()))
                    .encode(m.encode_family(labels)?)?;
            }
        }
        {
            let mut m = encoder.encode_descriptor(
                "device_stat",
                "The latest summary statistic a device plugin reported for an instance, in its unit",
                None,
                MetricType::Gauge,
            )?;
            for (labels, i) in &instances {
                let Some(summary) = i.stats.as_ref().and_then(|s| s.summary.as_ref()) else {
                    continue;
                };
                let Some(value) = summary.number() else {
                    continue;
                };
                let mut labels = labels.clone();
                labels.push(("unit", summary.unit.clone()));
                ConstGauge::new(value).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
