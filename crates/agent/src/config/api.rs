//! The `api { socket, address, socket_group, tls { cert_file, key_file } }` and
//! `acl { enabled }` blocks: where the API listens, who may open its socket, and whether
//! requests need a token.

use std::{net::SocketAddr, path::PathBuf};

use berth_input::{Quoted, Shown};
use serde::Deserialize;

use super::Config;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApi {
    socket: Option<PathBuf>,
    address: Option<String>,
    socket_group: Option<String>,
    tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAcl {
    enabled: Option<bool>,
}

/// `api { tls { … } }`: the TCP listener serves HTTPS with this certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTls {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// Its PEM private key.
    pub key_file: PathBuf,
}

/// `api { socket_group = "…" }`, resolved when the config is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketGroup {
    /// The group's name.
    pub name: String,
    /// Its gid.
    pub gid: u32,
}

/// Fills the API and ACL settings of `cfg`; `Err((field, message))`. A TCP address that is not
/// loopback needs both `api.tls` and `acl { enabled = true }`.
pub(super) fn api_block(
    cfg: &mut Config,
    api: Option<RawApi>,
    acl: Option<RawAcl>,
) -> Result<(), (String, String)> {
    cfg.acl_enabled = acl.and_then(|a| a.enabled).unwrap_or(false);
    let Some(api) = api else {
        return Ok(());
    };
    let absolute = |field: &str, p: &PathBuf| {
        if p.is_absolute() {
            Ok(())
        } else {
            Err((
                field.to_string(),
                format!("{} must be an absolute path", Shown(&p.to_string_lossy())),
            ))
        }
    };
    if let Some(s) = api.socket {
        absolute("api.socket", &s)?;
        cfg.api_socket = Some(s);
    }
    if let Some(t) = api.tls {
        let cert_file = t.cert_file.ok_or_else(|| {
            (
                "api.tls.cert_file".to_string(),
                "is required with api.tls (a PEM certificate chain)".to_string(),
            )
        })?;
        let key_file = t.key_file.ok_or_else(|| {
            (
                "api.tls.key_file".to_string(),
                "is required with api.tls (the certificate's PEM private key)".to_string(),
            )
        })?;
        absolute("api.tls.cert_file", &cert_file)?;
        absolute("api.tls.key_file", &key_file)?;
        cfg.api_tls = Some(ApiTls {
            cert_file,
            key_file,
        });
    }
    if let Some(name) = api.socket_group {
        cfg.api_socket_group = Some(resolve_group(&name)?);
    }
    if let Some(a) = api.address {
        let addr: SocketAddr = a.parse().map_err(|_| {
            (
                "api.address".to_string(),
                format!("{} is not an address like 127.0.0.1:4747", Quoted(&a)),
            )
        })?;
        if !addr.ip().is_loopback() {
            let missing: Vec<&str> = [
                (cfg.api_tls.is_none(), "api { tls { cert_file, key_file } }"),
                (!cfg.acl_enabled, "acl { enabled = true }"),
            ]
            .into_iter()
            .filter_map(|(missing, what)| missing.then_some(what))
            .collect();
            if !missing.is_empty() {
                return Err((
                    "api.address".to_string(),
                    format!(
                        "{addr} is not a loopback address: serving the API beyond this host \
                         needs {}",
                        missing.join(" and ")
                    ),
                ));
            }
        }
        cfg.api_address = Some(addr);
    }
    if cfg.api_tls.is_some() && cfg.api_address.is_none() {
        return Err((
            "api.tls".to_string(),
            "TLS is for the TCP listener: set api.address too (the unix socket stays plain)"
                .to_string(),
        ));
    }
    Ok(())
}

/// The gid of group `name`; an unknown group is an error naming `api.socket_group`.
fn resolve_group(name: &str) -> Result<SocketGroup, (String, String)> {
    let field = || "api.socket_group".to_string();
    if name.is_empty() || name.len() > 256 || name.contains('\0') {
        return Err((field(), "must be a group name".to_string()));
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(SocketGroup {
            name: name.to_string(),
            gid: g.gid.as_raw(),
        }),
        Ok(None) => Err((field(), format!("no group {} on this host", Quoted(name)))),
        Err(e) => Err((
            field(),
            format!("cannot look up group {}: {e}", Quoted(name)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{Config, ConfigError};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/berth/agent.hcl"), text)
    }

    const TLS: &str = "  tls {\n    cert_file = \"/etc/berth/api.crt\"\n    key_file = \"/etc/berth/api.key\"\n  }\n";

    #[test]
    fn acl_is_off_unless_enabled() {
        assert!(!parse("").unwrap().acl_enabled);
        assert!(!parse("acl {\n}\n").unwrap().acl_enabled);
        assert!(parse("acl {\n  enabled = true\n}\n").unwrap().acl_enabled);
        let err = parse("acl {\n  enable = true\n}\n").unwrap_err();
        assert!(err.field.starts_with("acl"), "{err}");
    }

    #[test]
    fn an_address_beyond_loopback_needs_tls_and_acls() {
        let open = "api {\n  address = \"0.0.0.0:4646\"\n";
        for (text, missing) in [
            (format!("{open}}}\n"), vec!["tls", "acl"]),
            (format!("{open}{TLS}}}\n"), vec!["acl"]),
            (
                format!("acl {{\n  enabled = true\n}}\n{open}}}\n"),
                vec!["tls"],
            ),
        ] {
            let err = parse(&text).unwrap_err();
            assert_eq!(err.field, "api.address", "{err}");
            assert!(err.line.is_some(), "{err}");
            assert!(err.to_string().contains("not a loopback address"), "{err}");
            for m in missing {
                assert!(err.message.contains(m), "{m}: {err}");
            }
        }
        let cfg = parse(&format!("acl {{\n  enabled = true\n}}\n{open}{TLS}}}\n")).unwrap();
        assert_eq!(cfg.api_address, Some("0.0.0.0:4646".parse().unwrap()));
        let tls = cfg.api_tls.unwrap();
        assert_eq!(tls.cert_file, Path::new("/etc/berth/api.crt"));
        assert_eq!(tls.key_file, Path::new("/etc/berth/api.key"));
        // Loopback needs neither, and may have TLS.
        let cfg = parse(&format!(
            "api {{\n  address = \"127.0.0.1:4646\"\n{TLS}}}\n"
        ))
        .unwrap();
        assert!(cfg.api_tls.is_some() && !cfg.acl_enabled);
    }

    #[test]
    fn tls_files_are_required_absolute_and_go_with_an_address() {
        for (tls, field) in [
            (
                "  tls {\n    cert_file = \"/a.crt\"\n  }\n",
                "api.tls.key_file",
            ),
            (
                "  tls {\n    key_file = \"/a.key\"\n  }\n",
                "api.tls.cert_file",
            ),
            (
                "  tls {\n    cert_file = \"a.crt\"\n    key_file = \"/a.key\"\n  }\n",
                "api.tls.cert_file",
            ),
            (
                "  tls {\n    cert_file = \"/a.crt\"\n    key_file = \"a.key\"\n  }\n",
                "api.tls.key_file",
            ),
        ] {
            let err =
                parse(&format!("api {{\n  address = \"127.0.0.1:1\"\n{tls}}}\n")).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
        let err = parse(&format!("api {{\n{TLS}}}\n")).unwrap_err();
        assert_eq!(err.field, "api.tls", "{err}");
    }

    #[test]
    fn the_socket_group_is_resolved_or_refused() {
        let cfg = parse("api {\n  socket_group = \"root\"\n}\n").unwrap();
        let group = cfg.api_socket_group.unwrap();
        assert_eq!((group.name.as_str(), group.gid), ("root", 0));
        for name in ["no-such-group-zq7", ""] {
            let err = parse(&format!("api {{\n  socket_group = \"{name}\"\n}}\n")).unwrap_err();
            assert_eq!(err.field, "api.socket_group", "{err}");
            assert_eq!(err.line, Some(1), "{err}");
        }
    }
}
