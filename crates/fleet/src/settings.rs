//! How an agent reaches the fleet's etcd: `control_plane { etcd { … } }` in the agent config,
//! or `--etcd URL,…`.

use std::{path::PathBuf, time::Duration};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/berth";
/// The default time to live of a node's lease.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// The shortest lease etcd grants that keepalives at a third of it can hold.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(3);
/// How long a down node's allocs wait before they are lost, by default.
pub const DEFAULT_LOST_AFTER: Duration = Duration::from_secs(15);
/// The longest `lost_after`.
pub const MAX_LOST_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The longest `gc_after`.
pub const MAX_GC_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest prefix: keys stay far below etcd's request limit.
pub const MAX_PREFIX: usize = 128;

/// Client certificates for an etcd that requires TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the servers' certificates (PEM).
    pub ca_file: Option<PathBuf>,
    /// This agent's client certificate (PEM).
    pub cert_file: Option<PathBuf>,
    /// Its key (PEM).
    pub key_file: Option<PathBuf>,
}

/// The settings of the etcd control plane, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Client URLs (`http://host:port` or `https://host:port`).
    pub endpoints: Vec<String>,
    /// Every key berth writes starts with it (`/berth`): several fleets can share one etcd.
    pub prefix: String,
    /// TLS, when the endpoints are `https://`.
    pub tls: Option<TlsFiles>,
    /// A node's lease TTL; it is kept alive every third of it.
    pub lease_ttl: Duration,
    /// How long the leader waits after a node's lease expired before it marks the node's
    /// allocs lost and places them elsewhere.
    pub lost_after: Duration,
    /// What becomes of the claims of a node that is down.
    pub lost_claims: LostClaims,
    /// How often the leader compacts etcd's history (and how much it keeps).
    pub compact_every: Duration,
    /// How long finished allocs and stopped jobs stay in etcd (and in `job status`).
    pub gc_after: Duration,
}

/// What becomes of the volume claims of a node that is down (`lost_claims { after = … }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostClaims {
    /// Once the node has been down this long, the leader runs ControllerUnpublishVolume for it
    /// (the node's own steps are skipped: it cannot run them) and frees its claims.
    After(Duration),
    /// Only an operator frees them (`berth volume detach --node`), as kubelet's caution wants:
    /// a node that is only cut off may still write to the volume.
    Manual,
}

/// How long a down node's claims are kept by default.
pub const DEFAULT_LOST_CLAIMS_AFTER: Duration = Duration::from_secs(30);

impl Default for LostClaims {
    fn default() -> Self {
        Self::After(DEFAULT_LOST_CLAIMS_AFTER)
    }
}

impl EtcdSettings {
    /// Settings with the defaults for all but the endpoints, checked.
    pub fn new(endpoints: Vec<String>) -> Result<Self, String> {
        let s = Self::defaults(endpoints);
        s.check()?;
        Ok(s)
    }

    /// Settings with the defaults for all but the endpoints, not checked yet.
    pub fn defaults(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: DEFAULT_PREFIX.into(),
            tls: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            lost_after: DEFAULT_LOST_AFTER,
            lost_claims: LostClaims::default(),
            compact_every: crate::compaction::DEFAULT_COMPACT_EVERY,
            gc_after: crate::gc::DEFAULT_GC_AFTER,
        }
    }

    /// Checks every field; the error names the field (`endpoints[1]`, `prefix`, …).
    pub fn check(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("endpoints: at least one etcd client URL is needed".into());
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            check_endpoint(e).map_err(|why| format!("endpoints[{i}]: {why}"))?;
        }
        let https = self.endpoints.iter().any(|e| e.starts_with("https://"));
        let http = self.endpoints.iter().any(|e| e.starts_with("http://"));
        if https && http {
            return Err("endpoints: mixes http:// and https:// URLs; use one scheme".into());
        }
        if self.tls.is_some() && !https {
            return Err("tls: set, but the endpoints are http:// URLs; use https://".into());
        }
        check_prefix(&self.prefix).map_err(|why| format!("prefix: {why}"))?;
        if self.lease_ttl < MIN_LEASE_TTL {
            return Err(format!(
                "lease_ttl: {:?} is shorter than the least, {:?}",
                self.lease_ttl, MIN_LEASE_TTL
            ));
        }
        if self.lost_after > MAX_LOST_AFTER {
            return Err(format!(
                "lost_after: {:?} is longer than the most, {:?}",
                self.lost_after, MAX_LOST_AFTER
            ));
        }
        if self.compact_every > MAX_LOST_AFTER {
            return Err(format!(
                "compact_every: {:?} is longer than the most, {MAX_LOST_AFTER:?}",
                self.compact_every
            ));
        }
        if self.gc_after > MAX_GC_AFTER {
            return Err(format!(
                "gc_after: {:?} is longer than the most, {MAX_GC_AFTER:?}",
                self.gc_after
            ));
        }
        if let LostClaims::After(d) = self.lost_claims
            && d > MAX_LOST_AFTER
        {
            return Err(format!(
                "lost_claims.after: {d:?} is longer than the most, {MAX_LOST_AFTER:?}"
            ));
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err("tls: cert_file and key_file go together".into());
        }
        Ok(())
    }

    /// How often the lease is kept alive: a third of its TTL.
    pub fn keepalive_interval(&self) -> Duration {
        self.lease_ttl / 3
    }
}

fn check_endpoint(e: &str) -> Result<(), String> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| format!("{e:?} is not an http:// or https:// URL"))?;
    let host_port = rest.strip_suffix('/').unwrap_or(rest);
    if host_port.is_empty() || host_port.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!("{e:?}: give only a host and port"));
    }
    let (host, port) = host_port
        .rsplit_once(':')
        .ok_or_else(|| format!("{e:?}: the port is missing (etcd's is usually 2379)"))?;
    if host.is_empty() {
        return Err(format!("{e:?}: the host is missing"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{e:?}: {port:?} is not a port")),
    }
}

fn check_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with '/'"));
    }
    if p.len() > 1 && p.ends_with('/') {
        return Err(format!("{p:?} must not end with '/'"));
    }
    if p.len() > MAX_PREFIX {
        return Err(format!("longer than {MAX_PREFIX} bytes"));
    }
    if p.chars().any(|c| c.is_control() || c.is_whitespace()) || p.contains("//") {
        return Err(format!(
            "{p:?} holds a space, a control character or an empty segment"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    type Change = Box<dyn FnOnce(&mut EtcdSettings)>;

    fn with(f: impl FnOnce(&mut EtcdSettings)) -> Result<(), String> {
        let mut s = EtcdSettings::new(vec!["http://127.0.0.1:2379".into()]).unwrap();
        f(&mut s);
        s.check()
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.endpoints.clear()), "endpoints:"),
            (
                Box::new(|s| s.endpoints.push("127.0.0.1:2379".into())),
                "endpoints[1]:",
            ),
            (
                Box::new(|s| s.endpoints = vec!["http://etcd".into()]),
                "endpoints[0]: \"http://etcd\": the port is missing",
            ),
            (
                Box::new(|s| s.endpoints = vec!["http://h:99999".into()]),
                "is not a port",
            ),
            (
                Box::new(|s| s.endpoints.push("https://h:2379".into())),
                "mixes",
            ),
            (
                Box::new(|s| s.endpoints = vec!["http://u:p@h:2379".into()]),
                "only a host and port",
            ),
            (Box::new(|s| s.prefix = "berth".into()), "prefix:"),
            (Box::new(|s| s.prefix = "/berth/".into()), "prefix:"),
            (Box::new(|s| s.prefix = "/a b".into()), "prefix:"),
            (Box::new(|s| s.prefix = "/a//b".into()), "prefix:"),
            (
                Box::new(|s| s.prefix = format!("/{}", "a".repeat(200))),
                "prefix:",
            ),
            (
                Box::new(|s| s.lease_ttl = Duration::from_secs(1)),
                "lease_ttl:",
            ),
            (
                Box::new(|s| s.gc_after = MAX_GC_AFTER + Duration::from_secs(1)),
                "gc_after:",
            ),
            (
                Box::new(|s| {
                    s.tls = Some(TlsFiles {
                        ca_file: None,
                        cert_file: None,
                        key_file: None,
                    })
                }),
                "tls:",
            ),
        ];
        for (change, want) in cases {
            let err = with(change).unwrap_err();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        }
    }

    #[test]
    fn good_settings_pass() {
        with(|_| {}).unwrap();
        with(|s| s.prefix = "/".into()).unwrap();
        with(|s| {
            s.endpoints = vec!["https://a:2379".into(), "https://b:2379/".into()];
            s.tls = Some(TlsFiles {
                ca_file: Some("/ca.pem".into()),
                cert_file: Some("/c.pem".into()),
                key_file: Some("/k.pem".into()),
            });
        })
        .unwrap();
        assert_eq!(
            EtcdSettings::new(vec!["http://h:1".into()])
                .unwrap()
                .keepalive_interval(),
            DEFAULT_LEASE_TTL / 3
        );
    }
}
