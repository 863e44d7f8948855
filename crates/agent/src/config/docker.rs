//! `plugin "docker" { config { … } }`: the settings of the `docker` task driver (Nomad's
//! block for its docker driver; berth runs it through podman).

use std::path::PathBuf;

use berth_drivers::DockerConfig;
use serde::Deserialize;

use berth_input::{Quoted, serde_message};

/// The driver's settings, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDocker {
    podman: Option<PathBuf>,
    runtime: Option<String>,
    allow_privileged: Option<bool>,
    volumes: Option<RawVolumes>,
    storage_root: Option<PathBuf>,
    run_root: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVolumes {
    enabled: Option<bool>,
}

/// The `docker` driver's settings from the `plugin "docker"` block's `config` (`None`: every
/// default). `Err((field, message))`.
pub(super) fn docker_plugin(
    args: &[String],
    config: Option<serde_json::Value>,
) -> Result<DockerConfig, (String, String)> {
    let field = |f: &str| format!("plugin {}.{f}", Quoted("docker"));
    if !args.is_empty() {
        return Err((
            field("args"),
            "the docker driver is built in: it takes config only".into(),
        ));
    }
    let raw: RawDocker = match config {
        None => RawDocker::default(),
        Some(serde_json::Value::Array(_)) => {
            return Err((field("config"), "given more than once".into()));
        }
        Some(v @ serde_json::Value::Object(_)) => {
            serde_path_to_error::deserialize(v).map_err(|e| {
                let path = e.path().to_string();
                (
                    field(&format!("config.{path}")),
                    serde_message(&e.inner().to_string()),
                )
            })?
        }
        Some(_) => return Err((field("config"), "must be a block".into())),
    };
    let mut out = DockerConfig::default();
    if let Some(p) = raw.podman {
        out.podman = p;
    }
    if let Some(r) = raw.runtime {
        if r.is_empty() || r.contains(['/', '\0']) && !r.starts_with('/') {
            return Err((
                field("config.runtime"),
                "a runtime name (runc) or an absolute path".into(),
            ));
        }
        out.runtime = r;
    }
    out.allow_privileged = raw.allow_privileged.unwrap_or(false);
    out.volumes_enabled = raw.volumes.and_then(|v| v.enabled).unwrap_or(false);
    for (name, dir) in [
        ("storage_root", &raw.storage_root),
        ("run_root", &raw.run_root),
    ] {
        if let Some(d) = dir
            && !d.is_absolute()
        {
            return Err((
                field(&format!("config.{name}")),
                format!("{} is not an absolute path", d.display()),
            ));
        }
    }
    out.storage_root = raw.storage_root;
    out.run_root = raw.run_root;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, crate::config::ConfigError> {
        Config::parse(Path::new("/etc/berth/agent.hcl"), text)
    }

    #[test]
    fn the_docker_block_is_read() {
        let cfg = parse(
            r#"
plugin "docker" {
  config {
    allow_privileged = true
    runtime          = "runc"
    volumes {
      enabled = true
    }
    storage_root = "/srv/podman"
  }
}
"#,
        )
        .unwrap();
        assert!(cfg.docker.allow_privileged && cfg.docker.volumes_enabled);
        assert_eq!(
            cfg.docker.storage_root.as_deref(),
            Some(Path::new("/srv/podman"))
        );
        assert!(!parse("").unwrap().docker.allow_privileged);
        assert!(!parse("").unwrap().docker.volumes_enabled);
    }

    #[test]
    fn bad_docker_settings_name_the_field_and_line() {
        let e = parse("\n\nplugin \"docker\" {\n  config {\n    allow_privilege = true\n  }\n}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains(":3:") && e.contains("allow_privilege"), "{e}");
        let e = parse("plugin \"docker\" {\n  config {\n    storage_root = \"rel\"\n  }\n}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.storage_root") && e.contains(":1:"),
            "{e}"
        );
        let e = parse("plugin \"docker\" {\n  args = [\"x\"]\n}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("args"), "{e}");
    }
}
