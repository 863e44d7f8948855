//! No SecretID, agent token or JWT in any error or Debug output.

use std::{collections::BTreeMap, error::Error as _, time::Duration};

use berth_consul::{Client, ConsulConfig, ConsulError, Secret};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{Signer, consul_trusting, service_claims, service_meta};

const AGENT_TOKEN: &str = "agent-token-canary-8c1f";

/// Everything an error can print: Display, Debug, and its whole source chain.
fn printed(err: &ConsulError) -> String {
    let mut out = format!("{err}\n{err:?}");
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(&format!("\n{cause}\n{cause:?}"));
        source = cause.source();
    }
    out
}

#[tokio::test]
async fn secrets_never_reach_errors_or_debug_output() {
    let signer = Signer::generate("key-1");
    let (fake, _) = consul_trusting(&signer);
    let config = ConsulConfig {
        address: fake.address(),
        token: Some(Secret::new(AGENT_TOKEN)),
        ..ConsulConfig::default()
    };
    let client = Client::new(&config).expect("valid");
    let jwt = signer.sign(&service_claims("web"));
    let token = client
        .login("nomad-workloads", &jwt, service_meta("web"))
        .await
        .expect("login");
    let secret = token.secret_id.expose().to_owned();

    let mut outputs = vec![
        format!("{token:?}"),
        format!("{token:#?}"),
        format!("{client:?}"),
        format!("{config:?}"),
        format!("{:?}", token.secret_id),
        format!("{}", token.secret_id),
    ];
    client.logout(&token).await.expect("logout");
    outputs.push(printed(&client.token_self(&token).await.expect_err("gone")));
    outputs.push(printed(&client.logout(&token).await.expect_err("gone")));
    outputs.push(printed(
        &client
            .preflight(
                &token,
                Duration::from_millis(300),
                Duration::from_millis(50),
                &CancellationToken::new(),
            )
            .await
            .expect_err("gone"),
    ));
    // Refused logins carrying a real JWT.
    outputs.push(printed(
        &client
            .login("nope", &jwt, BTreeMap::new())
            .await
            .expect_err("unknown method"),
    ));
    let mut foreign = service_claims("web");
    foreign["aud"] = json!("elsewhere");
    let foreign_jwt = signer.sign(&foreign);
    outputs.push(printed(
        &client
            .login("nomad-workloads", &foreign_jwt, BTreeMap::new())
            .await
            .expect_err("wrong audience"),
    ));
    // A login whose answer is not a token.
    fake.fail_logins(
        200,
        format!("{{\"SecretID\": 7, \"Other\": \"{secret}\"}}"),
        1,
    );
    outputs.push(printed(
        &client
            .login("nomad-workloads", &jwt, BTreeMap::new())
            .await
            .expect_err("not a token"),
    ));

    for output in &outputs {
        for (what, canary) in [
            ("SecretID", secret.as_str()),
            ("agent token", AGENT_TOKEN),
            ("JWT", jwt.as_str()),
            ("JWT", foreign_jwt.as_str()),
        ] {
            assert!(!output.contains(canary), "{what} printed in:\n{output}");
        }
    }
    assert!(outputs[0].contains(&token.accessor_id));
    assert!(outputs[0].contains("[REDACTED]"));
}
