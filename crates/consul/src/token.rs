//! Consul's ACL token, as its HTTP API answers it.

use serde::{Deserialize, Deserializer, Serialize};

use crate::Secret;

/// An ACL token as `POST /v1/acl/login` and `GET /v1/acl/token/self` answer it, with Consul's
/// field names. Unknown fields are ignored and missing (or `null`) ones take their defaults, so
/// answers of other Consul versions and of Enterprise decode. `Debug` shows the AccessorID but
/// never the SecretID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclToken {
    /// The token's public id: safe to log.
    #[serde(rename = "AccessorID", default, deserialize_with = "null_as_default")]
    pub accessor_id: String,
    /// The token itself: sent as `X-Consul-Token`, never logged.
    #[serde(rename = "SecretID", default, deserialize_with = "null_as_default")]
    pub secret_id: Secret,
    /// Consul's description (for a login token: `token created via login: {meta as JSON}`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub description: String,
    /// Policies linked to the token.
    #[serde(default, deserialize_with = "null_as_default")]
    pub policies: Vec<AclLink>,
    /// Roles linked to the token.
    #[serde(default, deserialize_with = "null_as_default")]
    pub roles: Vec<AclLink>,
    /// Service identities (a binding rule of type `service` makes one).
    #[serde(default, deserialize_with = "null_as_default")]
    pub service_identities: Vec<ServiceIdentity>,
    /// Node identities.
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_identities: Vec<NodeIdentity>,
    /// True for a token valid only in its datacenter (every login token is).
    #[serde(default, deserialize_with = "null_as_default")]
    pub local: bool,
    /// The auth method that made the token (empty for tokens made otherwise).
    #[serde(default, deserialize_with = "null_as_default")]
    pub auth_method: String,
    /// When the token expires (RFC 3339), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<String>,
    /// When the token was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time: Option<String>,
    /// Consul's hash of the token's contents (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Raft index of the token's creation.
    #[serde(default, deserialize_with = "null_as_default")]
    pub create_index: u64,
    /// Raft index of the token's last change.
    #[serde(default, deserialize_with = "null_as_default")]
    pub modify_index: u64,
    /// Namespace (Consul Enterprise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Admin partition (Consul Enterprise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
}

impl AclToken {
    /// The service names of the token's service identities.
    pub fn service_names(&self) -> impl Iterator<Item = &str> {
        self.service_identities
            .iter()
            .map(|identity| identity.service_name.as_str())
    }
}

/// A link from a token to a policy or a role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AclLink {
    /// The policy's or role's id.
    #[serde(rename = "ID", default, deserialize_with = "null_as_default")]
    pub id: String,
    /// Its name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
}

/// A service identity: the token may act as this service (and its sidecar proxy).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceIdentity {
    /// The service's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub service_name: String,
    /// Datacenters where it applies (empty: all).
    #[serde(default, deserialize_with = "null_as_default")]
    pub datacenters: Vec<String>,
}

/// A node identity: the token may act as this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeIdentity {
    /// The node's name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub node_name: String,
    /// The node's datacenter.
    #[serde(default, deserialize_with = "null_as_default")]
    pub datacenter: String,
}

/// Go encodes a nil slice (and nothing else here) as `null`: read it as the default.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGIN_ANSWER: &str = r#"{
        "AccessorID": "6a1253d2-1785-24fd-91c2-f8e78c745511",
        "SecretID": "45a3bd52-07c7-47a4-52fd-0745e0cfe967",
        "Description": "token created via login: {\"requested_by\":\"nomad_service_web\"}",
        "Roles": null,
        "ServiceIdentities": [{"ServiceName": "web"}],
        "Local": true,
        "AuthMethod": "nomad-workloads",
        "CreateTime": "2024-05-01T10:00:00.000000001Z",
        "Hash": "UuiRkOQPRCvoRZHRtUxxbrmwZ5crYrOdZ0Z1FTFbTbA=",
        "CreateIndex": 36,
        "ModifyIndex": 36,
        "SomethingNew": {"nested": [1, 2]}
    }"#;

    #[test]
    fn decodes_a_login_answer_ignoring_unknown_fields() {
        let token: AclToken = serde_json::from_str(LOGIN_ANSWER).expect("decodes");
        assert_eq!(token.accessor_id, "6a1253d2-1785-24fd-91c2-f8e78c745511");
        assert_eq!(
            token.secret_id.expose(),
            "45a3bd52-07c7-47a4-52fd-0745e0cfe967"
        );
        assert!(token.local);
        assert!(token.roles.is_empty());
        assert!(token.policies.is_empty());
        assert_eq!(token.service_names().collect::<Vec<_>>(), ["web"]);
        assert_eq!(token.auth_method, "nomad-workloads");
        assert_eq!(token.create_index, 36);
        assert_eq!(token.namespace, None);
    }

    #[test]
    fn debug_shows_the_accessor_but_not_the_secret() {
        let token: AclToken = serde_json::from_str(LOGIN_ANSWER).expect("decodes");
        let debug = format!("{token:?}");
        assert!(
            debug.contains("6a1253d2-1785-24fd-91c2-f8e78c745511"),
            "{debug}"
        );
        assert!(debug.contains("[REDACTED]"), "{debug}");
        assert!(!debug.contains("45a3bd52"), "{debug}");
    }
}
