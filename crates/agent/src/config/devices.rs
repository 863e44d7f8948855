//! The device part of the agent config: Nomad's `plugin_dir` and `plugin "<name>" { args,
//! config { … } }` blocks (device plugins the agent launches), and berth's `devices { … }`
//! block (the Kubernetes device-plugin directory, CDI spec directories, the stats interval).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use berth_input::{Quoted, Shown};
use serde::Deserialize;

/// How often device statistics are collected when the config does not say (Nomad's default).
pub const DEFAULT_STATS_INTERVAL: Duration = Duration::from_secs(1);
/// The device-plugin directory under the data dir when the config does not say.
pub const DEFAULT_KUBELET_DIR: &str = "device-plugins";

/// A Nomad device plugin the agent launches: `plugin "<name>" { args, config { … } }`, the
/// binary `<plugin_dir>/<name>`. `Debug` shows the keys of `config`, never its values.
#[derive(Clone, PartialEq, Eq)]
pub struct NomadPluginDecl {
    /// The block's label: the binary's file name in `plugin_dir`.
    pub name: String,
    /// Arguments.
    pub args: Vec<String>,
    /// The `config` block as data (an object; empty when absent). The plugin's schema is
    /// applied to it when the plugin runs.
    pub config: serde_json::Value,
}

impl std::fmt::Debug for NomadPluginDecl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NomadPluginDecl")
            .field("name", &self.name)
            .field("args", &self.args)
            .field(
                "config",
                &berth_devices_nomad::instance::config_keys(&self.config),
            )
            .finish()
    }
}

/// The device settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicesConfig {
    /// `plugin_dir`: where Nomad plugin binaries are.
    pub plugin_dir: Option<PathBuf>,
    /// The `plugin` blocks without a `type` (those with one are CSI plugins), in file order.
    pub nomad_plugins: Vec<NomadPluginDecl>,
    /// `devices.kubelet_dir`: where Kubernetes device plugins find `kubelet.sock`; `None`:
    /// `<data_dir>/device-plugins`.
    pub kubelet_dir: Option<PathBuf>,
    /// `devices.kubernetes`: serve the Registration service (default true).
    pub kubernetes: bool,
    /// `devices.cdi_spec_dirs`, lowest priority first.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// `devices.stats_interval`.
    pub stats_interval: Duration,
}

impl Default for DevicesConfig {
    fn default() -> Self {
        Self {
            plugin_dir: None,
            nomad_plugins: Vec::new(),
            kubelet_dir: None,
            kubernetes: true,
            cdi_spec_dirs: berth_devices::cdi::DEFAULT_SPEC_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            stats_interval: DEFAULT_STATS_INTERVAL,
        }
    }
}

impl DevicesConfig {
    /// The device-plugin directory for a data dir.
    pub fn kubelet_dir(&self, data_dir: &Path) -> PathBuf {
        self.kubelet_dir
            .clone()
            .unwrap_or_else(|| data_dir.join(DEFAULT_KUBELET_DIR))
    }
}

/// `devices { … }` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDevices {
    kubelet_dir: Option<PathBuf>,
    kubernetes: Option<bool>,
    cdi_spec_dirs: Option<Vec<PathBuf>>,
    stats_interval: Option<String>,
}

/// Checks `devices { … }` and `plugin_dir` into `out`. `Err((field, message))`.
pub(super) fn devices_block(
    out: &mut DevicesConfig,
    plugin_dir: Option<PathBuf>,
    raw: Option<RawDevices>,
) -> Result<(), (String, String)> {
    let absolute = |field: &str, p: &Path| -> Result<(), (String, String)> {
        if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
            return Err((
                field.to_string(),
                format!(
                    "{} must be an absolute path without ..",
                    Shown(&p.to_string_lossy())
                ),
            ));
        }
        Ok(())
    };
    if let Some(d) = plugin_dir {
        absolute("plugin_dir", &d)?;
        out.plugin_dir = Some(d);
    }
    let Some(raw) = raw else {
        return Ok(());
    };
    if let Some(d) = raw.kubelet_dir {
        absolute("devices.kubelet_dir", &d)?;
        // The registration socket must fit in a unix socket path.
        let len = d.join("kubelet.sock").as_os_str().len();
        if len > berth_sys::MAX_SOCKET_PATH {
            return Err((
                "devices.kubelet_dir".into(),
                format!(
                    "{} is too long: kubelet.sock in it would take {len} bytes, more than the \
                     {} of a unix socket path",
                    Shown(&d.to_string_lossy()),
                    berth_sys::MAX_SOCKET_PATH
                ),
            ));
        }
        out.kubelet_dir = Some(d);
    }
    if let Some(k) = raw.kubernetes {
        out.kubernetes = k;
    }
    if let Some(dirs) = raw.cdi_spec_dirs {
        for (i, d) in dirs.iter().enumerate() {
            absolute(&format!("devices.cdi_spec_dirs[{i}]"), d)?;
        }
        out.cdi_spec_dirs = dirs;
    }
    if let Some(s) = raw.stats_interval {
        out.stats_interval =
            super::duration(&s).map_err(|m| ("devices.stats_interval".into(), m))?;
    }
    Ok(())
}

/// A `plugin "<name>"` block without `type` (its name already checked as a path segment):
/// a Nomad plugin in `plugin_dir`. `Err((field, message))`.
pub(super) fn nomad_plugin(
    name: &str,
    args: Vec<String>,
    config: Option<serde_json::Value>,
) -> Result<NomadPluginDecl, (String, String)> {
    // The name was checked as a path segment with every plugin block's.
    let field = |f: &str| format!("plugin {}.{f}", Quoted(name));
    let config = match config {
        None => serde_json::Value::Object(serde_json::Map::new()),
        Some(v @ serde_json::Value::Object(_)) => v,
        // hcl gives several `config` blocks as a list.
        Some(serde_json::Value::Array(_)) => {
            return Err((field("config"), "given more than once".into()));
        }
        Some(_) => return Err((field("config"), "must be a block".into())),
    };
    Ok(NomadPluginDecl {
        name: name.to_string(),
        args,
        config,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, crate::config::ConfigError> {
        Config::parse(Path::new("/etc/berth/agent.hcl"), text)
    }

    #[test]
    fn nomad_plugins_and_the_devices_block_are_read() {
        let cfg = parse(
            r#"
plugin_dir = "/opt/berth/plugins"

plugin "hostpath" {
  type   = "node"
  socket = "/run/csi.sock"
}

plugin "nomad-device-example" {
  args = ["-v"]
  config {
    dir         = "/tmp/devices"
    list_period = "1s"
    nested {
      a = 1
    }
  }
}

plugin "bare" {}

devices {
  kubelet_dir    = "/var/lib/kubelet/device-plugins"
  cdi_spec_dirs  = ["/etc/cdi", "/run/cdi"]
  stats_interval = "2s"
}
"#,
        )
        .unwrap();
        assert_eq!(cfg.plugins.len(), 1, "the CSI plugin stays a CSI plugin");
        let d = &cfg.devices;
        assert_eq!(
            d.plugin_dir.as_deref(),
            Some(Path::new("/opt/berth/plugins"))
        );
        assert_eq!(d.nomad_plugins.len(), 2);
        assert_eq!(d.nomad_plugins[0].name, "nomad-device-example");
        assert_eq!(d.nomad_plugins[0].args, ["-v"]);
        assert_eq!(
            d.nomad_plugins[0].config,
            serde_json::json!({"dir": "/tmp/devices", "list_period": "1s", "nested": {"a": 1}})
        );
        assert_eq!(d.nomad_plugins[1].name, "bare");
        assert_eq!(d.nomad_plugins[1].config, serde_json::json!({}));
        assert_eq!(
            d.kubelet_dir(Path::new("/data")),
            Path::new("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(
            d.cdi_spec_dirs,
            [Path::new("/etc/cdi"), Path::new("/run/cdi")]
        );
        assert_eq!(d.stats_interval, Duration::from_secs(2));

        let defaults = parse("").unwrap().devices;
        assert_eq!(defaults, DevicesConfig::default());
        assert_eq!(
            defaults.kubelet_dir(Path::new("/data")),
            Path::new("/data/device-plugins")
        );
        assert_eq!(defaults.stats_interval, Duration::from_secs(1));
        assert!(defaults.kubernetes);
    }

    #[test]
    fn bad_device_settings_name_the_field() {
        for (text, what) in [
            (
                "plugin \"x\" {\n  config {\n    a = 1\n  }\n}\n",
                "agent.hcl:1: plugin \"x\": a plugin without type is a Nomad device plugin: set plugin_dir",
            ),
            (
                "plugin_dir = \"rel\"\n",
                "plugin_dir: rel must be an absolute path",
            ),
            (
                "plugin_dir = \"/p\"\nplugin \"x\" {\n  command = \"/bin/x\"\n}\n",
                "agent.hcl:2: plugin \"x\".type: a CSI plugin needs type",
            ),
            (
                "plugin \"x\" {\n  type = \"node\"\n  socket = \"/x.sock\"\n  config {\n    a = 1\n  }\n}\n",
                "plugin \"x\".config: config goes with Nomad device plugins",
            ),
            (
                "plugin_dir = \"/p\"\nplugin \"../x\" {}\n",
                "plugin \"../x\"",
            ),
            (
                "devices {\n  stats_interval = \"soon\"\n}\n",
                "devices.stats_interval",
            ),
            (
                "devices {\n  cdi_spec_dirs = [\"/etc/cdi\", \"cdi\"]\n}\n",
                "devices.cdi_spec_dirs[1]",
            ),
            (
                &format!("devices {{\n  kubelet_dir = \"/{}\"\n}}\n", "d".repeat(100)),
                "devices.kubelet_dir",
            ),
            ("devices {\n  colour = 1\n}\n", "unknown field"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }
}
