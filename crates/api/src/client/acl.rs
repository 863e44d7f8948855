//! The ACL calls (`/v1/acl/…`). The answers that carry a secret ([`NewToken`]) are the only
//! ones; nothing here logs them.

use hyper::Method;

use super::{Client, ClientError, encode, encode_segment};
use crate::acl::{AclToken, AclTokenList, NewToken, Policy, TokenCreateRequest};

impl Client {
    /// `POST /v1/acl/bootstrap`: the first management token, with its secret; 409 once the
    /// agent has been bootstrapped.
    pub async fn acl_bootstrap(&self) -> Result<NewToken, ClientError> {
        self.call_json(Method::POST, "/v1/acl/bootstrap".into(), None)
            .await
    }

    /// `GET /v1/acl/tokens`: every token, without secrets.
    pub async fn acl_tokens(&self) -> Result<AclTokenList, ClientError> {
        self.call_json(Method::GET, "/v1/acl/tokens".into(), None)
            .await
    }

    /// `POST /v1/acl/tokens`: a new token with `policies`, with its secret.
    pub async fn acl_create_token(
        &self,
        name: &str,
        policies: &[Policy],
    ) -> Result<NewToken, ClientError> {
        let path = "/v1/acl/tokens".to_string();
        let req = TokenCreateRequest {
            name: name.to_string(),
            policies: policies.to_vec(),
        };
        let body = encode(&Method::POST, &path, &req)?;
        self.call_json(Method::POST, path, Some(body)).await
    }

    /// `DELETE /v1/acl/token/{accessor}`.
    pub async fn acl_delete_token(&self, accessor_id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/acl/token/{}", encode_segment(accessor_id));
        self.call(Method::DELETE, path, None).await.map(drop)
    }

    /// `GET /v1/acl/token/self`: the token this client sends.
    pub async fn acl_token_self(&self) -> Result<AclToken, ClientError> {
        self.call_json(Method::GET, "/v1/acl/token/self".into(), None)
            .await
    }
}
