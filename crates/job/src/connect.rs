//! Consul Connect and workload identities in a job spec: a group's `service` blocks, a task's
//! `kind` and its `identity` blocks, as Nomad writes them. The model only: nothing here talks
//! to Consul.

use std::{fmt, str::FromStr, time::Duration};

use berth_input::Quoted;
use serde::{Deserialize, Serialize};

use crate::{duration::go_form_opt, spec::GroupSpec};

/// The name of the identity every task has; an `identity` block without `name` configures it.
pub const DEFAULT_IDENTITY_NAME: &str = "default";
/// The audience of the default identity (Nomad's; it cannot be changed).
pub const DEFAULT_IDENTITY_AUD: &str = "nomadproject.io";
/// Most characters in a service name (one DNS label).
pub const MAX_SERVICE_NAME_CHARS: usize = 63;
/// Most characters in an identity name.
pub const MAX_IDENTITY_NAME_CHARS: usize = 128;

/// A group's `service` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSpec {
    /// `name`, with `${NOMAD_JOB_NAME}` and `${NOMAD_GROUP_NAME}` filled in; it passes
    /// [`check_service_name`] and is unique in its group.
    pub name: String,
    /// `port`: a port label or number, as written (non-empty).
    #[serde(default)]
    pub port: Option<String>,
    /// `tags`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// `provider`; `consul` when not given. Every service of a group has the same one.
    #[serde(default)]
    pub provider: ServiceProvider,
    /// `connect`; only with the `consul` provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectSpec>,
    /// `identity`: the service's own workload identity (Nomad 1.7+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<ServiceIdentity>,
}

impl ServiceSpec {
    /// Whether it has `connect { sidecar_service { … } }`: a `connect-proxy:<name>` task may
    /// front it.
    pub fn has_sidecar(&self) -> bool {
        self.connect
            .as_ref()
            .is_some_and(|c| c.sidecar_service.is_some())
    }

    /// Whether it has `connect { native = true }`: a `connect-native:<name>` task may serve it.
    pub fn is_connect_native(&self) -> bool {
        self.connect.as_ref().is_some_and(|c| c.native)
    }
}

/// `service.provider`: where the service is registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceProvider {
    /// Consul's catalog (the default).
    #[default]
    Consul,
    /// Nomad's own service registry (no Connect).
    Nomad,
}

impl ServiceProvider {
    /// `consul` or `nomad`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Consul => "consul",
            Self::Nomad => "nomad",
        }
    }
}

impl fmt::Display for ServiceProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ServiceProvider {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "consul" => Ok(Self::Consul),
            "nomad" => Ok(Self::Nomad),
            _ => Err(format!(
                "unknown provider {} (expected consul or nomad)",
                Quoted(s)
            )),
        }
    }
}

/// A service's `connect` block. Exactly one of `native` and `sidecar_service` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectSpec {
    /// `native = true`: the service's task speaks Connect itself.
    #[serde(default)]
    pub native: bool,
    /// `sidecar_service { … }`: a sidecar proxy fronts the service.
    #[serde(default)]
    pub sidecar_service: Option<SidecarService>,
}

/// `connect.sidecar_service`: how the sidecar proxy's own service is registered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarService {
    /// `port`: a port label or number, as written (non-empty); Consul picks one when not given.
    #[serde(default)]
    pub port: Option<String>,
    /// `tags`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// A service's `identity` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceIdentity {
    /// `aud`: the token's audiences, in order; none is empty.
    #[serde(default)]
    pub aud: Vec<String>,
    /// `ttl`: how long a token lives (more than 0); it does not expire when not given.
    #[serde(default, with = "go_form_opt", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
}

/// A task's `identity` block: one of its workload identities and how the task receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadIdentity {
    /// `name`; [`DEFAULT_IDENTITY_NAME`] when not given. Letters, digits, `-` and `_`, at
    /// most [`MAX_IDENTITY_NAME_CHARS`]; unique in its task.
    pub name: String,
    /// `aud`, in order; none is empty. Always `[`[`DEFAULT_IDENTITY_AUD`]`]` for the default
    /// identity.
    #[serde(default)]
    pub aud: Vec<String>,
    /// `env`: the token is in the task's `NOMAD_TOKEN` (default identity) or
    /// `NOMAD_TOKEN_<name>`.
    #[serde(default)]
    pub env: bool,
    /// `file`: the token is written in the task's secrets dir.
    #[serde(default)]
    pub file: bool,
    /// `filepath`: where the file goes instead, relative to the task dir (no `..`); only
    /// with `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filepath: Option<String>,
    /// `ttl` (more than 0; never on the default identity); the token does not expire when
    /// not given.
    #[serde(default, with = "go_form_opt", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// `change_mode`: what happens to the task when the token is renewed.
    #[serde(default)]
    pub change_mode: IdentityChangeMode,
    /// `change_signal`, upper-cased (`SIGHUP`): set exactly when `change_mode` is `signal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_signal: Option<String>,
}

impl WorkloadIdentity {
    /// Whether this is the task's default identity.
    pub fn is_default(&self) -> bool {
        self.name == DEFAULT_IDENTITY_NAME
    }
}

/// `identity.change_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityChangeMode {
    /// Nothing (the default).
    #[default]
    Noop,
    /// The task is restarted.
    Restart,
    /// The task gets `change_signal`.
    Signal,
}

impl IdentityChangeMode {
    /// `noop`, `restart` or `signal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Noop => "noop",
            Self::Restart => "restart",
            Self::Signal => "signal",
        }
    }
}

impl FromStr for IdentityChangeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "noop" => Ok(Self::Noop),
            "restart" => Ok(Self::Restart),
            "signal" => Ok(Self::Signal),
            _ => Err(format!(
                "unknown change mode {} (expected noop, restart or signal)",
                Quoted(s)
            )),
        }
    }
}

/// A task's `kind`: the Connect role it plays for one service of its group. Written (and
/// stored) as `<prefix>:<service>`, e.g. `connect-proxy:count-api`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum TaskKind {
    /// `connect-proxy:<service>`: the sidecar proxy of a service with `connect {
    /// sidecar_service {} }`.
    ConnectProxy(String),
    /// `connect-native:<service>`: the task of a service with `connect { native = true }`.
    ConnectNative(String),
    /// `connect-ingress:<service>`: an ingress gateway.
    ConnectIngress(String),
    /// `connect-terminating:<service>`: a terminating gateway.
    ConnectTerminating(String),
    /// `connect-mesh:<service>`: a mesh gateway.
    ConnectMesh(String),
}

/// The kinds' prefixes, as written before the `:`.
pub const TASK_KIND_PREFIXES: [&str; 5] = [
    "connect-proxy",
    "connect-native",
    "connect-ingress",
    "connect-terminating",
    "connect-mesh",
];

impl TaskKind {
    /// The prefix (`connect-proxy`…).
    pub fn prefix(&self) -> &'static str {
        match self {
            Self::ConnectProxy(_) => TASK_KIND_PREFIXES[0],
            Self::ConnectNative(_) => TASK_KIND_PREFIXES[1],
            Self::ConnectIngress(_) => TASK_KIND_PREFIXES[2],
            Self::ConnectTerminating(_) => TASK_KIND_PREFIXES[3],
            Self::ConnectMesh(_) => TASK_KIND_PREFIXES[4],
        }
    }

    /// The service named after the `:`.
    pub fn service(&self) -> &str {
        match self {
            Self::ConnectProxy(s)
            | Self::ConnectNative(s)
            | Self::ConnectIngress(s)
            | Self::ConnectTerminating(s)
            | Self::ConnectMesh(s) => s,
        }
    }

    /// Whether it is a gateway (ingress, terminating or mesh).
    pub fn is_gateway(&self) -> bool {
        matches!(
            self,
            Self::ConnectIngress(_) | Self::ConnectTerminating(_) | Self::ConnectMesh(_)
        )
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.prefix(), self.service())
    }
}

/// A `kind` that is not one of [`TASK_KIND_PREFIXES`] followed by `:` and a service name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskKindError {
    /// The part before the `:` (or the whole text, without one) is not a known prefix.
    #[error(
        "unknown kind {} (expected connect-proxy:<service>, connect-native:<service>, \
         connect-ingress:<service>, connect-terminating:<service> or connect-mesh:<service>)",
        Quoted(.0)
    )]
    Unknown(String),
    /// Nothing after the `:`.
    #[error("{prefix}: names no service ({prefix}:<service>)")]
    NoService {
        /// The prefix given.
        prefix: &'static str,
    },
    /// The service after the `:` is not a service name.
    #[error("{prefix}:<service>: {reason}")]
    BadService {
        /// The prefix given.
        prefix: &'static str,
        /// What is wrong with the name.
        reason: ServiceNameError,
    },
}

impl FromStr for TaskKind {
    type Err = TaskKindError;
    fn from_str(s: &str) -> Result<Self, TaskKindError> {
        let unknown = || TaskKindError::Unknown(s.to_owned());
        let (prefix, service) = s.split_once(':').ok_or_else(unknown)?;
        let prefix = TASK_KIND_PREFIXES
            .into_iter()
            .find(|p| *p == prefix)
            .ok_or_else(unknown)?;
        if service.is_empty() {
            return Err(TaskKindError::NoService { prefix });
        }
        check_service_name(service)
            .map_err(|reason| TaskKindError::BadService { prefix, reason })?;
        let service = service.to_owned();
        Ok(match prefix {
            "connect-proxy" => Self::ConnectProxy(service),
            "connect-native" => Self::ConnectNative(service),
            "connect-ingress" => Self::ConnectIngress(service),
            "connect-terminating" => Self::ConnectTerminating(service),
            _ => Self::ConnectMesh(service),
        })
    }
}

impl TryFrom<String> for TaskKind {
    type Error = TaskKindError;
    fn try_from(s: String) -> Result<Self, TaskKindError> {
        s.parse()
    }
}

impl From<TaskKind> for String {
    fn from(k: TaskKind) -> String {
        k.to_string()
    }
}

/// A service name that breaks Nomad's rule (RFC 1123 label).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceNameError {
    /// Nothing.
    #[error("is empty")]
    Empty,
    /// Over [`MAX_SERVICE_NAME_CHARS`].
    #[error(
        "{} is {chars} characters long; a service name has at most {MAX_SERVICE_NAME_CHARS}",
        Quoted(.name)
    )]
    TooLong {
        /// The name.
        name: String,
        /// Its length in characters.
        chars: usize,
    },
    /// A character other than a letter, a digit or `-`, or a `-` at either end.
    #[error(
        "{} is not a service name: ASCII letters, digits and dashes, starting and ending \
         with a letter or digit (RFC 1123)",
        Quoted(.name)
    )]
    Invalid {
        /// The name.
        name: String,
    },
}

/// Checks a service name as Nomad does: 1 to [`MAX_SERVICE_NAME_CHARS`] ASCII letters, digits
/// and dashes, neither first nor last a dash.
pub fn check_service_name(name: &str) -> Result<(), ServiceNameError> {
    if name.is_empty() {
        return Err(ServiceNameError::Empty);
    }
    let chars = name.chars().count();
    if chars > MAX_SERVICE_NAME_CHARS {
        return Err(ServiceNameError::TooLong {
            name: name.to_owned(),
            chars,
        });
    }
    let ok = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        return Err(ServiceNameError::Invalid {
            name: name.to_owned(),
        });
    }
    Ok(())
}

impl GroupSpec {
    /// The service called `name`.
    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The tasks that need a Consul service identity (SI) token, as `(service, task)` pairs in
    /// task order: every task with a `kind` (each kind is a Connect role: a sidecar proxy, a
    /// native task or a gateway, all of which Nomad gives an SI token), with the service its
    /// kind names. For a proxy or a native task that service is one of the group's.
    pub fn consul_si_token_tasks(&self) -> Vec<(&str, &str)> {
        self.tasks
            .iter()
            .filter_map(|t| Some((t.kind.as_ref()?.service(), t.name.as_str())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_read_and_write_back() {
        for s in [
            "connect-proxy:count-api",
            "connect-native:a",
            "connect-ingress:in-gw",
            "connect-terminating:t1",
            "connect-mesh:m",
        ] {
            let k: TaskKind = s.parse().unwrap();
            assert_eq!(k.to_string(), s);
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<TaskKind>(&json).unwrap(), k);
        }
        let k: TaskKind = "connect-mesh:m".parse().unwrap();
        assert!(k.is_gateway() && k.service() == "m");
        assert!(matches!(
            "connect-proxy".parse::<TaskKind>(),
            Err(TaskKindError::Unknown(_))
        ));
        assert!(matches!(
            "sidecar:x".parse::<TaskKind>(),
            Err(TaskKindError::Unknown(_))
        ));
        assert_eq!(
            "connect-proxy:".parse::<TaskKind>(),
            Err(TaskKindError::NoService {
                prefix: "connect-proxy"
            })
        );
        assert!(matches!(
            "connect-proxy:a:b".parse::<TaskKind>(),
            Err(TaskKindError::BadService { .. })
        ));
        assert!(serde_json::from_str::<TaskKind>("\"lead\"").is_err());
    }

    #[test]
    fn service_names_follow_rfc_1123() {
        for ok in ["a", "count-api", "A1", "9001", &"x".repeat(63)] {
            assert_eq!(check_service_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(check_service_name(""), Err(ServiceNameError::Empty));
        assert!(matches!(
            check_service_name(&"x".repeat(64)),
            Err(ServiceNameError::TooLong { chars: 64, .. })
        ));
        for bad in ["-a", "a-", "a_b", "a.b", "a b", "é"] {
            assert!(
                matches!(
                    check_service_name(bad),
                    Err(ServiceNameError::Invalid { .. })
                ),
                "{bad}"
            );
        }
    }
}
