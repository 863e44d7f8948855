//! The `control_plane { etcd { … } }` block: a fleet on etcd instead of the embedded control
//! plane.

use std::path::PathBuf;

use berth_fleet::{EtcdSettings, TlsFiles, settings::LostClaims};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawControlPlane {
    etcd: Option<RawEtcd>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    #[serde(default)]
    endpoints: Vec<String>,
    prefix: Option<String>,
    lease_ttl: Option<String>,
    lost_after: Option<String>,
    lost_claims: Option<RawLostClaims>,
    compact_every: Option<String>,
    gc_after: Option<String>,
    tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLostClaims {
    after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

const FIELD: &str = "control_plane.etcd";

/// The etcd settings of the block, checked; `Err((field, message))`. The endpoints may be
/// left out (`--etcd` gives them); the agent refuses to start without any.
pub(super) fn etcd_settings(
    raw: Option<RawControlPlane>,
) -> Result<Option<EtcdSettings>, (String, String)> {
    let Some(etcd) = raw.and_then(|r| r.etcd) else {
        return Ok(None);
    };
    let mut s = EtcdSettings::defaults(etcd.endpoints);
    if let Some(prefix) = etcd.prefix {
        s.prefix = prefix;
    }
    if let Some(ttl) = etcd.lease_ttl {
        s.lease_ttl = super::duration(&ttl).map_err(|m| (format!("{FIELD}.lease_ttl"), m))?;
    }
    if let Some(d) = etcd.lost_after {
        s.lost_after = super::duration(&d).map_err(|m| (format!("{FIELD}.lost_after"), m))?;
    }
    if let Some(d) = etcd.compact_every {
        s.compact_every = super::duration(&d).map_err(|m| (format!("{FIELD}.compact_every"), m))?;
    }
    if let Some(d) = etcd.gc_after {
        s.gc_after = super::duration(&d).map_err(|m| (format!("{FIELD}.gc_after"), m))?;
    }
    if let Some(after) = etcd.lost_claims.and_then(|l| l.after) {
        s.lost_claims = if after == "manual" {
            LostClaims::Manual
        } else {
            LostClaims::After(super::duration(&after).map_err(|m| {
                (
                    format!("{FIELD}.lost_claims.after"),
                    format!("{m}, or \"manual\""),
                )
            })?)
        };
    }
    if let Some(t) = etcd.tls {
        for (name, p) in [
            ("ca_file", &t.ca_file),
            ("cert_file", &t.cert_file),
            ("key_file", &t.key_file),
        ] {
            if let Some(p) = p
                && !p.is_absolute()
            {
                return Err((
                    format!("{FIELD}.tls.{name}"),
                    format!(
                        "{} must be an absolute path",
                        berth_input::Shown(&p.to_string_lossy())
                    ),
                ));
            }
        }
        s.tls = Some(TlsFiles {
            ca_file: t.ca_file,
            cert_file: t.cert_file,
            key_file: t.key_file,
        });
    }
    if s.endpoints.is_empty() {
        // `--etcd` may give them; every other field is checked now (with an endpoint of the
        // scheme TLS settings want: `--etcd` is checked against them once given).
        let scheme = if s.tls.is_some() { "https" } else { "http" };
        let with_one = EtcdSettings {
            endpoints: vec![format!("{scheme}://127.0.0.1:2379")],
            ..s.clone()
        };
        check(&with_one)?;
    } else {
        check(&s)?;
    }
    Ok(Some(s))
}

/// Checks settings from the file or from `--etcd`; the field is named in full.
pub fn check(s: &EtcdSettings) -> Result<(), (String, String)> {
    s.check().map_err(|e| match e.split_once(": ") {
        Some((field, m)) => (format!("{FIELD}.{field}"), m.to_string()),
        None => (FIELD.to_string(), e),
    })
}
