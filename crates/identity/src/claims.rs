//! The claims of a workload identity, named exactly as Nomad names them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize};

/// Region written into the subject when none is set (Nomad's default region).
pub const DEFAULT_REGION: &str = "global";
/// Namespace used when none (or an empty one) is set.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Identity name used when none is set (Nomad's default task identity).
pub const DEFAULT_IDENTITY_NAME: &str = "default";
/// The audience Nomad's default Consul auth method expects.
pub const CONSUL_AUDIENCE: &str = "consul.io";

/// The JWT claims of a workload identity.
///
/// Serialized names are Nomad's: `nomad_namespace`, `nomad_job_id`, `nomad_allocation_id`,
/// `nomad_task` and `nomad_service` (each left out when unset), and the registered `sub`, `aud`
/// (always an array), `iat`, `nbf`, `exp` (only with a ttl) and `jti`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub nomad_namespace: String,
    pub nomad_job_id: String,
    pub nomad_allocation_id: String,
    /// The task, for a task identity; `None` for a service identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nomad_task: Option<String>,
    /// The service, for a service identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nomad_service: Option<String>,
    /// `<region>:<namespace>:<job id>:<group>:<workload id>:<identity name>`.
    pub sub: String,
    #[serde(deserialize_with = "one_or_many")]
    pub aud: Vec<String>,
    /// Issued at, seconds since the Unix epoch.
    pub iat: u64,
    /// Not before, seconds since the Unix epoch (equal to `iat`).
    pub nbf: u64,
    /// Expiry, seconds since the Unix epoch; absent when the identity has no ttl.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// A random UUID, different for every token.
    pub jti: String,
}

impl Claims {
    /// When the token expires, if it has a ttl.
    pub fn expires_at(&self) -> Option<SystemTime> {
        self.exp.map(|secs| UNIX_EPOCH + Duration::from_secs(secs))
    }

    /// Whether `audience` is one of the token's audiences.
    pub fn has_audience(&self, audience: &str) -> bool {
        self.aud.iter().any(|a| a == audience)
    }
}

/// Accepts `aud` as an array (what we write) or as a single string (what other issuers may write).
fn one_or_many<'de, D: Deserializer<'de>>(de: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(de)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Workload {
    Task(String),
    Service(String),
}

/// Builds the [`Claims`] of one task or service identity.
///
/// ```
/// # use std::time::{Duration, SystemTime};
/// # use berth_identity::{ClaimsBuilder, CONSUL_AUDIENCE};
/// let claims = ClaimsBuilder::task("web", "frontend", "8d2b…", "nginx")
///     .identity("consul_default")
///     .audience(CONSUL_AUDIENCE)
///     .ttl(Some(Duration::from_secs(3600)))
///     .build(SystemTime::now());
/// assert_eq!(claims.sub, "global:default:web:frontend:nginx:consul_default");
/// ```
#[derive(Debug, Clone)]
pub struct ClaimsBuilder {
    region: String,
    namespace: String,
    job_id: String,
    group: String,
    alloc_id: String,
    workload: Workload,
    identity: String,
    audiences: Vec<String>,
    ttl: Option<Duration>,
}

impl ClaimsBuilder {
    fn new(job_id: &str, group: &str, alloc_id: &str, workload: Workload) -> Self {
        Self {
            region: DEFAULT_REGION.to_owned(),
            namespace: DEFAULT_NAMESPACE.to_owned(),
            job_id: job_id.to_owned(),
            group: group.to_owned(),
            alloc_id: alloc_id.to_owned(),
            workload,
            identity: DEFAULT_IDENTITY_NAME.to_owned(),
            audiences: Vec::new(),
            ttl: None,
        }
    }

    /// A task identity: sets `nomad_task`; the task is the subject's workload id.
    pub fn task(job_id: &str, group: &str, alloc_id: &str, task: &str) -> Self {
        Self::new(job_id, group, alloc_id, Workload::Task(task.to_owned()))
    }

    /// A service identity: sets `nomad_service`, never `nomad_task`; the service is the
    /// subject's workload id.
    pub fn service(job_id: &str, group: &str, alloc_id: &str, service: &str) -> Self {
        Self::new(
            job_id,
            group,
            alloc_id,
            Workload::Service(service.to_owned()),
        )
    }

    /// The region in the subject (default `global`).
    pub fn region(mut self, region: &str) -> Self {
        self.region = region.to_owned();
        self
    }

    /// The namespace; an empty one means `default`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = if namespace.is_empty() {
            DEFAULT_NAMESPACE.to_owned()
        } else {
            namespace.to_owned()
        };
        self
    }

    /// The identity's name, the last segment of the subject (default `default`).
    pub fn identity(mut self, name: &str) -> Self {
        self.identity = name.to_owned();
        self
    }

    /// Adds one audience (kept once, in order of first appearance).
    pub fn audience(mut self, audience: &str) -> Self {
        if !self.audiences.iter().any(|a| a == audience) {
            self.audiences.push(audience.to_owned());
        }
        self
    }

    /// Replaces the audiences.
    pub fn audiences<I, S>(mut self, audiences: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.audiences.clear();
        for audience in audiences {
            self = self.audience(audience.as_ref());
        }
        self
    }

    /// How long the token is valid; `None` writes no `exp`.
    pub fn ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// The claims as of `now`, with a fresh random `jti`. Sub-second ttls round up.
    pub fn build(&self, now: SystemTime) -> Claims {
        let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let exp = self.ttl.map(|ttl| {
            let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
            iat.saturating_add(secs)
        });
        let (task, service, workload_id) = match &self.workload {
            Workload::Task(task) => (non_empty(task), None, task.as_str()),
            Workload::Service(service) => (None, non_empty(service), service.as_str()),
        };
        let sub = [
            self.region.as_str(),
            &self.namespace,
            &self.job_id,
            &self.group,
            workload_id,
            &self.identity,
        ]
        .join(":");
        Claims {
            nomad_namespace: self.namespace.clone(),
            nomad_job_id: self.job_id.clone(),
            nomad_allocation_id: self.alloc_id.clone(),
            nomad_task: task,
            nomad_service: service,
            sub,
            aud: self.audiences.clone(),
            iat,
            nbf: iat,
            exp,
            jti: uuid::Uuid::new_v4().to_string(),
        }
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn task_claims_follow_nomad() {
        let c = ClaimsBuilder::task("example", "cache", "a1", "redis")
            .audience(CONSUL_AUDIENCE)
            .ttl(Some(Duration::from_millis(1500)))
            .build(at(1_000));
        assert_eq!(c.sub, "global:default:example:cache:redis:default");
        assert_eq!(c.nomad_namespace, "default");
        assert_eq!(c.nomad_task.as_deref(), Some("redis"));
        assert_eq!(c.nomad_service, None);
        assert_eq!((c.iat, c.nbf, c.exp), (1_000, 1_000, Some(1_002)));
        assert_eq!(c.aud, vec!["consul.io".to_owned()]);
    }

    #[test]
    fn service_claims_have_no_task_and_name_the_service() {
        let c = ClaimsBuilder::service("example", "cache", "a1", "redis-db")
            .namespace("prod")
            .region("eu")
            .identity("consul-service_redis-db")
            .build(at(5));
        assert_eq!(
            c.sub,
            "eu:prod:example:cache:redis-db:consul-service_redis-db"
        );
        assert_eq!(c.nomad_task, None);
        assert_eq!(c.nomad_service.as_deref(), Some("redis-db"));
        assert_eq!(c.exp, None);
    }

    #[test]
    fn empty_namespace_means_default_and_audiences_are_deduplicated() {
        let c = ClaimsBuilder::task("j", "g", "a", "t")
            .namespace("")
            .audiences(["x", "y", "x"])
            .build(at(0));
        assert_eq!(c.nomad_namespace, "default");
        assert_eq!(c.aud, vec!["x".to_owned(), "y".to_owned()]);
    }

    #[test]
    fn jti_is_a_fresh_uuid_v4() {
        let b = ClaimsBuilder::task("j", "g", "a", "t");
        let (one, two) = (b.build(at(0)).jti, b.build(at(0)).jti);
        assert_ne!(one, two);
        assert_eq!(one.len(), 36);
        assert_eq!(&one[14..15], "4");
        assert!(matches!(&one[19..20], "8" | "9" | "a" | "b"));
    }

    #[test]
    fn a_single_string_audience_is_accepted_on_input() {
        let json = r#"{"nomad_namespace":"default","nomad_job_id":"j","nomad_allocation_id":"a",
            "sub":"s","aud":"consul.io","iat":1,"nbf":1,"jti":"x"}"#;
        let c: Claims = serde_json::from_str(json).unwrap();
        assert_eq!(c.aud, vec!["consul.io".to_owned()]);
        assert!(c.has_audience("consul.io"));
    }
}
