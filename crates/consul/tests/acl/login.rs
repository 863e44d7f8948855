//! Login, token/self and logout, and how refusals read.

use std::collections::BTreeMap;

use berth_consul::{Client, ConsulConfig, ConsulError, StatusCode};
use berth_testkit::LoginOutcome;
use serde_json::json;

use crate::support::{
    Signer, consul_trusting, logged_in, now, service_claims, service_meta, task_claims,
};

#[tokio::test]
async fn login_with_a_service_jwt_gets_a_token_with_that_service_identity() {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    let jwt = signer.sign(&service_claims("web-http"));

    let token = client
        .login("nomad-workloads", &jwt, service_meta("web-http"))
        .await
        .expect("login");

    assert_eq!(token.service_names().collect::<Vec<_>>(), ["web-http"]);
    assert!(token.local);
    assert_eq!(token.auth_method, "nomad-workloads");
    assert!(token.roles.is_empty() && token.policies.is_empty());
    assert_eq!(
        token.description,
        r#"token created via login: {"requested_by":"nomad_service_web-http"}"#
    );
    assert_eq!(token.accessor_id.len(), 36);
    assert_ne!(token.accessor_id, token.secret_id.expose());

    let logins = fake.logins();
    assert_eq!(logins.len(), 1);
    assert_eq!(logins[0].auth_method, "nomad-workloads");
    assert_eq!(logins[0].bearer_token, jwt);
    assert_eq!(logins[0].meta, service_meta("web-http"));
    let claims = logins[0].claims.as_ref().expect("decoded claims");
    assert_eq!(claims["nomad_service"], "web-http");
    assert_eq!(
        logins[0].outcome,
        LoginOutcome::Issued {
            accessor_id: token.accessor_id.clone()
        }
    );
    let live = fake.live_tokens();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].secret_id, token.secret_id.expose());
    assert_eq!(live[0].service_name.as_deref(), Some("web-http"));

    client
        .token_self(&token)
        .await
        .expect("the token is usable");
    assert_eq!(fake.token_self_count(token.secret_id.expose()), 1);
}

#[tokio::test]
async fn login_with_a_task_jwt_gets_a_token_without_identities() {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    let meta = BTreeMap::from([("requested_by".to_owned(), "nomad_task_web".to_owned())]);

    let token = client
        .login("nomad-workloads", &signer.sign(&task_claims("web")), meta)
        .await
        .expect("login");

    assert!(token.service_identities.is_empty());
    assert!(token.roles.is_empty() && token.policies.is_empty());
    assert_eq!(
        token.description,
        r#"token created via login: {"requested_by":"nomad_task_web"}"#
    );
    assert_eq!(fake.live_tokens()[0].service_name, None);
}

#[tokio::test]
async fn login_refused_with_403_or_500_shows_the_status_and_consuls_text() {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    let jwt = signer.sign(&service_claims("web"));

    fake.fail_logins(403, "rpc error making call: Permission denied\n", 1);
    let err = client
        .login("nomad-workloads", &jwt, service_meta("web"))
        .await
        .expect_err("refused");
    assert_eq!(err.status(), Some(StatusCode::FORBIDDEN));
    assert_eq!(
        err.to_string(),
        "consul POST /v1/acl/login: 403 Forbidden: rpc error making call: Permission denied"
    );

    fake.fail_logins(500, "rpc error making call: No cluster leader", 2);
    for _ in 0..2 {
        let err = client
            .login("nomad-workloads", &jwt, service_meta("web"))
            .await
            .expect_err("refused");
        assert_eq!(
            err.to_string(),
            "consul POST /v1/acl/login: 500 Internal Server Error: rpc error making call: No \
             cluster leader"
        );
        assert!(!err.is_acl_not_found());
    }

    // The failures are used up: the next login works, and every attempt was recorded.
    client
        .login("nomad-workloads", &jwt, service_meta("web"))
        .await
        .expect("login");
    let outcomes: Vec<_> = fake.logins().into_iter().map(|l| l.outcome).collect();
    assert_eq!(outcomes.len(), 4);
    assert_eq!(
        outcomes[0],
        LoginOutcome::Refused {
            status: 403,
            body: "rpc error making call: Permission denied\n".to_owned()
        }
    );
    assert!(matches!(outcomes[3], LoginOutcome::Issued { .. }));
}

/// Logs in with `jwt` and returns the refusal's text.
async fn refusal(client: &Client, auth_method: &str, jwt: &str) -> ConsulError {
    client
        .login(auth_method, jwt, BTreeMap::new())
        .await
        .expect_err("refused")
}

#[tokio::test]
async fn unknown_auth_method_is_refused_as_acl_not_found() {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    let err = refusal(&client, "nope", &signer.sign(&service_claims("web"))).await;
    assert_eq!(
        err.to_string(),
        "consul POST /v1/acl/login: 403 Forbidden: ACL not found: auth method \"nope\" not found"
    );
    assert!(err.is_acl_not_found());
    assert!(fake.live_tokens().is_empty());
}

#[tokio::test]
async fn wrong_audience_is_refused() {
    let signer = Signer::generate("key-1");
    let (_fake, client) = consul_trusting(&signer);
    let mut claims = service_claims("web");
    claims["aud"] = json!(["vault.io"]);
    let err = refusal(&client, "nomad-workloads", &signer.sign(&claims)).await;
    assert_eq!(
        err.to_string(),
        "consul POST /v1/acl/login: 500 Internal Server Error: error validating claims: aud \
         claim does not match any bound audience"
    );
}

#[tokio::test]
async fn unknown_kid_and_foreign_key_are_refused() {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    let want = "consul POST /v1/acl/login: 500 Internal Server Error: error verifying token: \
                failed to verify id token signature";

    let unknown_kid = signer.sign_as("key-2", &service_claims("web"));
    assert_eq!(
        refusal(&client, "nomad-workloads", &unknown_kid)
            .await
            .to_string(),
        want
    );

    // Signed by another key that claims the trusted key's id.
    let forger = Signer::generate("key-1");
    let forged = forger.sign(&service_claims("web"));
    assert_eq!(
        refusal(&client, "nomad-workloads", &forged)
            .await
            .to_string(),
        want
    );
    assert!(fake.live_tokens().is_empty());
    assert_eq!(fake.logins().len(), 2);
}

#[tokio::test]
async fn expired_malformed_and_unbound_jwts_are_refused() {
    let signer = Signer::generate("key-1");
    let (_fake, client) = consul_trusting(&signer);

    let mut expired = service_claims("web");
    expired["iat"] = json!(now() - 7200);
    expired["nbf"] = json!(now() - 7200);
    expired["exp"] = json!(now() - 3600);
    let err = refusal(&client, "nomad-workloads", &signer.sign(&expired)).await;
    assert!(
        err.to_string().ends_with(
            "500 Internal Server Error: error validating claims: go-jose/go-jose/jwt: \
             validation failed, token is expired (exp)"
        ),
        "{err}"
    );

    let err = refusal(&client, "nomad-workloads", "not-a-jwt").await;
    assert!(
        err.to_string().ends_with(
            "error verifying token: oidc: malformed jwt: go-jose/go-jose: compact JWS \
                        format must have three parts"
        ),
        "{err}"
    );

    // Verified, but neither a service nor a task: no binding rule matches.
    let mut unbound = service_claims("web");
    unbound
        .as_object_mut()
        .expect("object")
        .remove("nomad_service");
    let err = refusal(&client, "nomad-workloads", &signer.sign(&unbound)).await;
    assert_eq!(
        err.to_string(),
        "consul POST /v1/acl/login: 403 Forbidden: Permission denied"
    );
}

#[tokio::test]
async fn logout_destroys_the_token() {
    let (fake, client, token) = logged_in(|_| {}).await;

    client.logout(&token).await.expect("logout");
    assert!(fake.live_tokens().is_empty());

    let err = client.token_self(&token).await.expect_err("gone");
    assert_eq!(
        err.to_string(),
        "consul GET /v1/acl/token/self: 403 Forbidden: ACL not found"
    );
    assert!(err.is_acl_not_found());

    let err = client.logout(&token).await.expect_err("already gone");
    assert_eq!(
        err.to_string(),
        "consul POST /v1/acl/logout: 403 Forbidden: ACL not found"
    );
    let logouts = fake.logouts();
    assert_eq!(logouts.len(), 2);
    assert!(logouts[0].removed && !logouts[1].removed);
    assert_eq!(logouts[0].secret_id, token.secret_id.expose());
}

#[tokio::test]
async fn connection_refused_names_the_address() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let client = Client::new(&ConsulConfig {
        address: format!("127.0.0.1:{port}"),
        ..ConsulConfig::default()
    })
    .expect("valid");
    let err = client
        .login("nomad-workloads", "a.b.c", BTreeMap::new())
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, ConsulError::Connect { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("consul POST /v1/acl/login: cannot connect to 127.0.0.1:{port}")
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn ssl_is_refused_until_supported() {
    for config in [
        ConsulConfig {
            ssl: true,
            ..ConsulConfig::default()
        },
        ConsulConfig {
            address: "https://consul.example:8501".to_owned(),
            ..ConsulConfig::default()
        },
    ] {
        let err = Client::new(&config).expect_err("no TLS yet");
        assert!(matches!(err, ConsulError::SslUnsupported { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("consul.ssl: ssl is not supported yet"),
            "{err}"
        );
    }
}

#[test]
fn a_bad_config_names_the_field() {
    let err = Client::new(&ConsulConfig {
        address: "127.0.0.1".to_owned(),
        ..ConsulConfig::default()
    })
    .expect_err("no port");
    assert_eq!(
        err.to_string(),
        "consul.address: \"127.0.0.1\" has no port (want host:port, e.g. 127.0.0.1:8500)"
    );
}
