//! What kubelet checks in a `Register`, checked the same way: the API version, the resource
//! name (an extended resource name) and the endpoint (a socket file in the plugin directory).

use std::{
    fmt,
    os::unix::{ffi::OsStrExt as _, fs::FileTypeExt as _},
    path::{Path, PathBuf},
};

use berth_input::Quoted;

use crate::proto::{KUBELET_SOCKET, SUPPORTED_VERSIONS, v1beta1::RegisterRequest};

pub use berth_sys::MAX_SOCKET_PATH;

/// Longest domain of a resource name: with the quota prefix `requests.` the whole must still be
/// a DNS-1123 subdomain (253 bytes).
const MAX_DOMAIN: usize = 253 - "requests.".len();

/// Longest name part of a resource name (a Kubernetes qualified name's name).
const MAX_NAME: usize = 63;

/// Why a `Register` is refused. Each names the request field it is about and quotes its value
/// (escaped and cut); the message is what the plugin gets back: `InvalidArgument` for bad
/// input, `Unavailable` for an endpoint socket that does not exist yet
/// ([`is_transient`](Self::is_transient)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// `version` is not one this agent speaks.
    #[error("version {}: not supported (supported: {})", Quoted(version), SUPPORTED_VERSIONS.join(", "))]
    Version {
        /// The version sent.
        version: String,
    },
    /// `resource_name` is not an extended resource name.
    #[error("resource_name {}: {reason}", Quoted(name))]
    ResourceName {
        /// The name sent.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// `endpoint` is not a socket in the plugin directory.
    #[error("endpoint {}: {reason}", Quoted(endpoint))]
    Endpoint {
        /// The endpoint sent.
        endpoint: String,
        /// What is wrong.
        reason: String,
    },
    /// Nothing is at `endpoint` (yet): the plugin registered before it served, or its socket
    /// was removed meanwhile (an agent starting removes every socket in the directory). Worth
    /// another try once the plugin serves.
    #[error(
        "endpoint {}: socket {} does not exist (a plugin serves before it registers)",
        Quoted(endpoint),
        socket.display()
    )]
    SocketMissing {
        /// The endpoint sent.
        endpoint: String,
        /// `<dir>/<endpoint>`.
        socket: PathBuf,
    },
}

impl RegisterError {
    /// The request field the error is about: `version`, `resource_name` or `endpoint`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Version { .. } => "version",
            Self::ResourceName { .. } => "resource_name",
            Self::Endpoint { .. } | Self::SocketMissing { .. } => "endpoint",
        }
    }

    /// Whether the same `Register` may succeed later without changing anything: the endpoint's
    /// socket is missing. Every other error is bad input.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::SocketMissing { .. })
    }
}

/// A valid extended resource name, `domain/name` (`example.com/widget`): not in the
/// `kubernetes.io` domain, not starting with `requests.`, the domain a DNS-1123 subdomain and
/// the name a qualified name's name (kubelet's `IsExtendedResourceName`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName {
    full: String,
    slash: usize,
}

impl ResourceName {
    /// Checks `name`. The error is a [`RegisterError::ResourceName`].
    pub fn parse(name: &str) -> Result<Self, RegisterError> {
        let fail = |reason: String| RegisterError::ResourceName {
            name: name.to_string(),
            reason,
        };
        let Some((domain, kind)) = name.split_once('/') else {
            return Err(fail(
                "must be domain/name, an extended resource name (e.g. example.com/widget)".into(),
            ));
        };
        if kind.contains('/') {
            return Err(fail("must hold exactly one '/'".into()));
        }
        if name.contains("kubernetes.io/") {
            return Err(fail(
                "the kubernetes.io domain is reserved for built-in resources".into(),
            ));
        }
        if name.starts_with("requests.") {
            return Err(fail(
                "must not start with \"requests.\" (reserved for resource quotas)".into(),
            ));
        }
        check_domain(domain).map_err(fail)?;
        check_name(kind).map_err(fail)?;
        Ok(Self {
            full: name.to_string(),
            slash: domain.len(),
        })
    }

    /// The whole name.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The domain (`example.com`): the device group's vendor.
    pub fn domain(&self) -> &str {
        &self.full[..self.slash]
    }

    /// The name after the `/` (`widget`): the device group's type and name.
    pub fn kind(&self) -> &str {
        &self.full[self.slash + 1..]
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

/// A DNS-1123 subdomain short enough to take the `requests.` prefix.
fn check_domain(domain: &str) -> Result<(), String> {
    if domain.is_empty() {
        return Err("the domain before '/' is empty".into());
    }
    if domain.len() > MAX_DOMAIN {
        return Err(format!(
            "the domain is {} bytes long, more than {MAX_DOMAIN}",
            domain.len()
        ));
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    if !domain.split('.').all(label_ok) {
        return Err(format!(
            "the domain {} is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.'; \
             every label starts and ends with a letter or a digit)",
            Quoted(domain)
        ));
    }
    Ok(())
}

/// The name part of a Kubernetes qualified name.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name after '/' is empty".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "the name after '/' is {} bytes long, more than {MAX_NAME}",
            name.len()
        ));
    }
    let b = name.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !inner_ok || !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Err(format!(
            "the name {} must hold letters, digits, '-', '_' and '.', and start and end with a \
             letter or a digit",
            Quoted(name)
        ));
    }
    Ok(())
}

/// A `Register` that passed every check.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    /// The resource.
    pub resource: ResourceName,
    /// The endpoint, as sent.
    pub endpoint: String,
    /// `<dir>/<endpoint>`.
    pub socket: PathBuf,
    /// The options sent with it (those of `GetDevicePluginOptions` are the ones used).
    pub options: Option<crate::proto::v1beta1::DevicePluginOptions>,
}

/// Checks a `Register` for the plugin directory `dir`, in kubelet's order: version, resource
/// name, endpoint. Looks at the endpoint's file but changes nothing.
pub(crate) fn check_register(
    dir: &Path,
    req: &RegisterRequest,
) -> Result<Registration, RegisterError> {
    if !SUPPORTED_VERSIONS.contains(&req.version.as_str()) {
        return Err(RegisterError::Version {
            version: req.version.clone(),
        });
    }
    let resource = ResourceName::parse(&req.resource_name)?;
    let socket = check_endpoint(dir, &req.endpoint)?;
    Ok(Registration {
        resource,
        endpoint: req.endpoint.clone(),
        socket,
        options: req.options,
    })
}

/// The socket `dir/endpoint`, when `endpoint` is a plain file name there naming an existing unix
/// socket other than the registration socket, with a path short enough to connect to.
fn check_endpoint(dir: &Path, endpoint: &str) -> Result<PathBuf, RegisterError> {
    let fail = |reason: String| RegisterError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    if endpoint.is_empty() {
        return Err(fail(format!(
            "must name the plugin's socket in {}",
            dir.display()
        )));
    }
    if endpoint.contains('/') {
        return Err(fail(format!(
            "must be a file name in {}, not a path",
            dir.display()
        )));
    }
    berth_sys::validate_path_segment("endpoint", endpoint).map_err(|e| fail(e.rule.to_string()))?;
    if endpoint == KUBELET_SOCKET {
        return Err(fail("is the registration socket itself".into()));
    }
    let socket = dir.join(endpoint);
    let len = socket.as_os_str().as_bytes().len();
    if len > MAX_SOCKET_PATH {
        return Err(fail(format!(
            "socket path {} is {len} bytes; a unix socket path must fit in {MAX_SOCKET_PATH} bytes",
            socket.display()
        )));
    }
    match std::fs::symlink_metadata(&socket) {
        Ok(m) if m.file_type().is_socket() => Ok(socket),
        Ok(_) => Err(fail(format!("{} is not a unix socket", socket.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(RegisterError::SocketMissing {
            endpoint: endpoint.to_string(),
            socket,
        }),
        Err(e) => Err(fail(format!("cannot inspect {}: {e}", socket.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(name: &str) -> String {
        match ResourceName::parse(name) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn extended_resource_names_are_accepted() {
        for name in [
            "example.com/widget",
            "nvidia.com/gpu",
            "a/b",
            "vendor-1.example.org/Big_Thing.v2",
            &format!("{}/x", "a".repeat(MAX_DOMAIN)),
            &format!("example.com/{}", "n".repeat(MAX_NAME)),
        ] {
            let r = ResourceName::parse(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r.as_str(), name);
        }
        let r = ResourceName::parse("example.com/widget").expect("valid");
        assert_eq!((r.domain(), r.kind()), ("example.com", "widget"));
    }

    #[test]
    fn other_names_are_refused_naming_the_field() {
        for (name, part) in [
            ("widget", "must be domain/name"),
            ("kubernetes.io/widget", "kubernetes.io"),
            ("foo.kubernetes.io/widget", "kubernetes.io"),
            ("requests.example.com/widget", "requests."),
            ("example.com/a/b", "exactly one '/'"),
            ("/widget", "domain before '/' is empty"),
            ("example.com/", "name after '/' is empty"),
            ("Example.com/widget", "DNS-1123"),
            ("-example.com/widget", "DNS-1123"),
            ("example..com/widget", "DNS-1123"),
            ("example.com/-widget", "start and end"),
            ("example.com/wid get", "start and end"),
            (
                &format!("{}/x", "a".repeat(MAX_DOMAIN + 1)),
                "more than 244",
            ),
            (
                &format!("example.com/{}", "n".repeat(MAX_NAME + 1)),
                "more than 63",
            ),
        ] {
            let r = reason(name);
            assert!(r.starts_with("resource_name \""), "{name}: {r}");
            assert!(r.contains(part), "{name}: {r}");
        }
        assert!(reason("example.com/w\nx").contains(r#"w\nx"#));
    }

    #[test]
    fn endpoints_must_be_sockets_in_the_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _l = std::os::unix::net::UnixListener::bind(dir.path().join("p.sock")).expect("bind");
        std::fs::write(dir.path().join("file"), "").expect("write");
        assert_eq!(
            check_endpoint(dir.path(), "p.sock").expect("valid"),
            dir.path().join("p.sock")
        );
        for (endpoint, part) in [
            ("", "must name"),
            ("../p.sock", "not a path"),
            ("sub/p.sock", "not a path"),
            ("..", "'.' or '..'"),
            ("a\0b", "NUL"),
            ("kubelet.sock", "registration socket itself"),
            ("file", "is not a unix socket"),
            ("missing.sock", "does not exist"),
            (&"x".repeat(120), "must fit in 107 bytes"),
        ] {
            let e = check_endpoint(dir.path(), endpoint).expect_err(endpoint);
            assert_eq!(e.field(), "endpoint");
            assert_eq!(e.is_transient(), endpoint == "missing.sock", "{e}");
            assert!(e.to_string().starts_with("endpoint \""), "{e}");
            assert!(e.to_string().contains(part), "{endpoint:?}: {e}");
        }
    }

    #[test]
    fn versions_are_checked_first() {
        let req = RegisterRequest {
            version: "v1alpha".into(),
            endpoint: "../x".into(),
            resource_name: "bad".into(),
            options: None,
        };
        let e = check_register(Path::new("/tmp"), &req).expect_err("bad version");
        assert_eq!(e.field(), "version");
        assert_eq!(
            e.to_string(),
            r#"version "v1alpha": not supported (supported: v1beta1)"#
        );
    }
}
