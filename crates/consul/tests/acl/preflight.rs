//! Waiting for a fresh token to replicate.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::support::logged_in;

#[tokio::test]
async fn preflight_waits_out_three_not_found_answers() {
    let (fake, client, token) = logged_in(|fake| fake.token_self_not_found(3)).await;

    client
        .preflight(
            &token,
            Duration::from_secs(10),
            Duration::from_millis(20),
            &CancellationToken::new(),
        )
        .await
        .expect("usable after the fourth check");
    assert_eq!(fake.token_self_count(token.secret_id.expose()), 4);
}

#[tokio::test]
async fn preflight_past_its_timeout_fails_with_consuls_403() {
    let (fake, client, token) = logged_in(|_| {}).await;
    fake.fail_token_self(403, "ACL not found");

    let err = client
        .preflight(
            &token,
            Duration::from_secs(1),
            Duration::from_millis(100),
            &CancellationToken::new(),
        )
        .await
        .expect_err("never usable");
    assert_eq!(
        err.to_string(),
        "consul GET /v1/acl/token/self: 403 Forbidden: ACL not found"
    );
    assert!(err.is_acl_not_found());
    assert!(fake.token_self_count(token.secret_id.expose()) >= 2);
}

#[tokio::test]
async fn preflight_of_a_usable_token_checks_once() {
    let (fake, client, token) = logged_in(|_| {}).await;
    client
        .preflight(
            &token,
            Duration::from_secs(10),
            Duration::from_millis(100),
            &CancellationToken::new(),
        )
        .await
        .expect("usable");
    assert_eq!(fake.token_self_count(token.secret_id.expose()), 1);
}

#[tokio::test]
async fn cancelled_preflight_reports_cancellation() {
    let (fake, client, token) = logged_in(|_| {}).await;
    fake.fail_token_self(403, "ACL not found");
    let cancel = CancellationToken::new();
    cancel.cancel();

    let err = client
        .preflight(
            &token,
            Duration::from_secs(10),
            Duration::from_millis(100),
            &cancel,
        )
        .await
        .expect_err("cancelled");
    assert!(err.is_cancelled(), "{err:?}");
    assert_eq!(err.to_string(), "consul token preflight check: cancelled");
}

#[tokio::test]
async fn preflight_recovers_when_token_self_stops_failing() {
    let (fake, client, token) = logged_in(|_| {}).await;
    fake.fail_token_self(500, "rpc error making call: No cluster leader");
    let secret = token.secret_id.expose().to_owned();

    let check = {
        let client = client.clone();
        let token = token.clone();
        tokio::spawn(async move {
            client
                .preflight(
                    &token,
                    Duration::from_secs(20),
                    Duration::from_millis(20),
                    &CancellationToken::new(),
                )
                .await
        })
    };
    berth_testkit::assert_eventually!(
        Duration::from_secs(10),
        || async { fake.token_self_count(&secret) >= 2 },
        "preflight retries"
    );
    fake.clear_token_self_failure();
    check
        .await
        .expect("no panic")
        .expect("usable once Consul answers");
}
