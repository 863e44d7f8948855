//! What a registrar announces, and the checks it must pass before berth registers it.

use std::path::{Path, PathBuf};

use berth_csi::{Endpoint, EndpointError};
use berth_sys::InvalidId;

use crate::pb;

/// The only plugin type berth registers (`PluginInfo.type`).
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// How many characters of a registrar-supplied string a message repeats.
const SHOWN_CHARS: usize = 64;
/// How many announced versions a message repeats.
const SHOWN_VERSIONS: usize = 8;

/// A CSI plugin announced by a registrar and accepted by berth's checks.
///
/// Guarantees: `name` is usable as one path segment ([`berth_sys::validate_path_segment`]);
/// `endpoint` is an absolute path that fits in a unix socket address
/// ([`berth_csi::MAX_SOCKET_PATH`]); `versions` holds at least one CSI 1.x version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DiscoveredPlugin {
    /// The CSI driver name (`PluginInfo.name`).
    pub name: String,
    /// The CSI socket (`PluginInfo.endpoint`; the registration socket itself when that is empty).
    pub endpoint: PathBuf,
    /// The socket in the registration directory the plugin was announced on.
    pub registration_socket: PathBuf,
    /// The versions the registrar announced (`PluginInfo.supported_versions`), as sent.
    pub versions: Vec<String>,
}

/// Why an announced plugin is refused. The message is what the registrar is told.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InvalidPlugin {
    /// `type` is not `CSIPlugin`.
    #[error("plugin type {found:?} is not supported: berth registers only {CSI_PLUGIN_TYPE:?}")]
    Type {
        /// The announced type (at most 64 characters of it).
        found: String,
    },
    /// `name` cannot be a path segment (empty, `/`, NUL, `.`/`..`, too long).
    #[error("{0}")]
    Name(#[source] InvalidId),
    /// `endpoint` is not an absolute unix socket path that fits in a socket address.
    #[error("plugin endpoint rejected: {0}")]
    Endpoint(#[source] EndpointError),
    /// No announced version is a CSI 1.x version.
    #[error("no supported version is 1.x (announced: {announced}); berth speaks CSI 1.x")]
    Versions {
        /// The announced versions, quoted (at most 8 of them).
        announced: String,
    },
}

impl DiscoveredPlugin {
    /// Checks what `registration_socket`'s registrar announced, as kubelet's CSI handler does:
    /// type `CSIPlugin`, a name that is a safe path segment, an absolute socket path
    /// (`/abs` or `unix:///abs`; empty means the registration socket) and a 1.x version.
    pub fn from_info(
        info: &pb::PluginInfo,
        registration_socket: &Path,
    ) -> Result<Self, InvalidPlugin> {
        if info.r#type != CSI_PLUGIN_TYPE {
            return Err(InvalidPlugin::Type {
                found: shown(&info.r#type),
            });
        }
        berth_sys::validate_path_segment("plugin name", &info.name).map_err(InvalidPlugin::Name)?;
        let endpoint = if info.endpoint.is_empty() {
            Endpoint::from_path(registration_socket)
        } else {
            Endpoint::parse(&info.endpoint)
        }
        .map_err(InvalidPlugin::Endpoint)?;
        if !info.supported_versions.iter().any(|v| is_csi_v1(v)) {
            return Err(InvalidPlugin::Versions {
                announced: shown_versions(&info.supported_versions),
            });
        }
        Ok(Self {
            name: info.name.clone(),
            endpoint: endpoint.path().to_path_buf(),
            registration_socket: registration_socket.to_path_buf(),
            versions: info.supported_versions.clone(),
        })
    }
}

/// True for `1`, `1.x`, `1.x.y` (optionally with a leading `v` and a `-pre`/`+build` suffix).
fn is_csi_v1(version: &str) -> bool {
    let v = version.trim();
    let v = v.strip_prefix('v').unwrap_or(v);
    let core = v.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    parts.next() == Some("1")
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn shown(s: &str) -> String {
    s.chars().take(SHOWN_CHARS).collect()
}

fn shown_versions(versions: &[String]) -> String {
    if versions.is_empty() {
        return "none".into();
    }
    let mut out: Vec<String> = versions
        .iter()
        .take(SHOWN_VERSIONS)
        .map(|v| format!("{:?}", shown(v)))
        .collect();
    if versions.len() > SHOWN_VERSIONS {
        out.push(format!("… {} more", versions.len() - SHOWN_VERSIONS));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const REG: &str = "/run/berth/plugins_registry/x-reg.sock";

    fn info(kind: &str, name: &str, endpoint: &str, versions: &[&str]) -> pb::PluginInfo {
        pb::PluginInfo {
            r#type: kind.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn check(i: &pb::PluginInfo) -> Result<DiscoveredPlugin, InvalidPlugin> {
        DiscoveredPlugin::from_info(i, Path::new(REG))
    }

    #[test]
    fn accepts_what_node_driver_registrar_sends() {
        let p = check(&info(
            "CSIPlugin",
            "hostpath.csi.k8s.io",
            "/var/lib/kubelet/plugins/hostpath/csi.sock",
            &["1.0.0"],
        ))
        .expect("valid");
        assert_eq!(
            p,
            DiscoveredPlugin {
                name: "hostpath.csi.k8s.io".into(),
                endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock".into(),
                registration_socket: REG.into(),
                versions: vec!["1.0.0".into()],
            }
        );
    }

    #[test]
    fn endpoint_forms() {
        let uri = check(&info(
            "CSIPlugin",
            "a",
            "unix:///run/a/csi.sock",
            &["1.0.0"],
        ));
        assert_eq!(uri.expect("uri").endpoint, Path::new("/run/a/csi.sock"));
        let empty = check(&info("CSIPlugin", "a", "", &["1.0.0"])).expect("empty");
        assert_eq!(
            empty.endpoint,
            Path::new(REG),
            "empty endpoint = the registration socket"
        );

        for bad in ["csi.sock", "unix://csi.sock", "tcp://127.0.0.1:9000"] {
            let err = check(&info("CSIPlugin", "a", bad, &["1.0.0"])).expect_err(bad);
            assert!(matches!(err, InvalidPlugin::Endpoint(_)), "{bad}: {err:?}");
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
        let long = format!("/{}", "x".repeat(berth_csi::MAX_SOCKET_PATH));
        let err = check(&info("CSIPlugin", "a", &long, &["1.0.0"])).expect_err("too long");
        assert!(err.to_string().contains("must fit in 107 bytes"), "{err}");
    }

    #[test]
    fn type_and_name_are_checked() {
        let err = check(&info("DevicePlugin", "a", "/a.sock", &["1.0.0"])).expect_err("type");
        assert_eq!(
            err.to_string(),
            "plugin type \"DevicePlugin\" is not supported: berth registers only \"CSIPlugin\""
        );
        for (name, rule) in [
            ("", "must not be empty"),
            ("a/b", "must not contain '/'"),
            ("..", "must not be '.' or '..'"),
            ("a\0b", "NUL"),
        ] {
            let err = check(&info("CSIPlugin", name, "/a.sock", &["1.0.0"])).expect_err(name);
            let msg = err.to_string();
            assert!(
                msg.contains("plugin name") && msg.contains(rule),
                "{name:?}: {msg}"
            );
        }
    }

    #[test]
    fn versions_need_a_1x() {
        for ok in ["1.0.0", "v1.2.3", "1", "1.10", "1.0.0-rc1", " 1.0.0"] {
            assert!(is_csi_v1(ok), "{ok}");
        }
        for bad in ["0.3.0", "2.0.0", "10.0", "1.x", "v", "", "1..0", "one"] {
            assert!(!is_csi_v1(bad), "{bad}");
        }
        let p = check(&info("CSIPlugin", "a", "/a.sock", &["0.3.0", "1.0.0"])).expect("mixed");
        assert_eq!(p.versions, ["0.3.0", "1.0.0"]);

        let err = check(&info("CSIPlugin", "a", "/a.sock", &["0.3.0", "2.0.0"])).expect_err("v");
        assert_eq!(
            err.to_string(),
            "no supported version is 1.x (announced: \"0.3.0\", \"2.0.0\"); berth speaks CSI 1.x"
        );
        let err = check(&info("CSIPlugin", "a", "/a.sock", &[])).expect_err("none");
        assert!(err.to_string().contains("announced: none"), "{err}");
    }

    #[test]
    fn registrar_strings_are_bounded_in_messages() {
        let long = "t".repeat(1000);
        let err = check(&info(&long, "a", "/a.sock", &["1.0.0"])).expect_err("type");
        assert!(err.to_string().len() < 200, "{err}");
        let many: Vec<String> = (0..100).map(|i| format!("{}.0", i + 2)).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let err = check(&info("CSIPlugin", "a", "/a.sock", &many)).expect_err("versions");
        assert!(err.to_string().contains("… 92 more"), "{err}");
    }
}
