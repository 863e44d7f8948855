//! Signing and verifying identities through the published JWKS.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_identity::{
    CONSUL_AUDIENCE, Claims, ClaimsBuilder, MemoryKeyStore, Rotation, Signer, VerifyError,
};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn signer() -> Signer {
    Signer::open_at(MemoryKeyStore::new(), Rotation::default(), t0()).unwrap()
}

fn task_claims(now: SystemTime) -> Claims {
    ClaimsBuilder::task(
        "example",
        "cache",
        "5b3a8c1e-0000-4000-8000-000000000001",
        "redis",
    )
    .identity("consul_default")
    .audience(CONSUL_AUDIENCE)
    .ttl(Some(Duration::from_secs(3600)))
    .build(now)
}

/// The claims part of a token as raw JSON, without checking anything.
fn payload(token: &str) -> serde_json::Map<String, serde_json::Value> {
    jsonwebtoken::dangerous::insecure_decode::<serde_json::Map<String, serde_json::Value>>(token)
        .unwrap()
        .claims
}

fn names(map: &serde_json::Map<String, serde_json::Value>) -> BTreeSet<&str> {
    map.keys().map(String::as_str).collect()
}

#[test]
fn sign_then_verify_through_the_jwks_json() {
    let signer = signer();
    let claims = task_claims(SystemTime::now());
    let token = signer.sign(&claims).unwrap();

    // What a relying party (Consul) does: fetch the JWKS JSON, pick the key by kid.
    let served = serde_json::to_string(&signer.jwks_json()).unwrap();
    let jwks: JwkSet = serde_json::from_str(&served).unwrap();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    let jwk = jwks.find(header.kid.as_deref().unwrap()).unwrap();
    let key = DecodingKey::from_jwk(jwk).unwrap();
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[CONSUL_AUDIENCE]);
    let decoded = jsonwebtoken::decode::<Claims>(&token, &key, &validation).unwrap();
    assert_eq!(decoded.claims, claims);

    assert_eq!(signer.verify(&token, CONSUL_AUDIENCE).unwrap(), claims);
}

#[test]
fn header_is_es256_jwt_with_the_active_kid() {
    let signer = signer();
    let token = signer.sign(&task_claims(t0())).unwrap();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.alg, Algorithm::ES256);
    assert_eq!(header.typ.as_deref(), Some("JWT"));
    assert_eq!(header.kid, Some(signer.active_kid()));
}

#[test]
fn jwks_json_has_the_shape_consul_expects() {
    let signer = signer();
    let jwks = signer.jwks_json();
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    let key = keys[0].as_object().unwrap();
    assert_eq!(
        names(key),
        BTreeSet::from(["kty", "crv", "x", "y", "kid", "alg", "use"])
    );
    assert_eq!(key["kty"], "EC");
    assert_eq!(key["crv"], "P-256");
    assert_eq!(key["alg"], "ES256");
    assert_eq!(key["use"], "sig");
    assert_eq!(key["kid"], signer.active_kid().as_str());
    for coordinate in ["x", "y"] {
        let text = key[coordinate].as_str().unwrap();
        // 32 bytes, base64url without padding.
        assert_eq!(text.len(), 43, "{coordinate}");
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
    }
    assert_eq!(berth_identity::JWKS_PATH, "/.well-known/jwks.json");
}

#[test]
fn task_claims_json_has_exactly_nomads_names() {
    let signer = signer();
    let token = signer.sign(&task_claims(t0())).unwrap();
    let json = payload(&token);
    assert_eq!(
        names(&json),
        BTreeSet::from([
            "nomad_namespace",
            "nomad_job_id",
            "nomad_allocation_id",
            "nomad_task",
            "sub",
            "aud",
            "iat",
            "nbf",
            "exp",
            "jti",
        ])
    );
    assert_eq!(json["nomad_namespace"], "default");
    assert_eq!(json["nomad_job_id"], "example");
    assert_eq!(json["nomad_task"], "redis");
    assert_eq!(
        json["sub"],
        "global:default:example:cache:redis:consul_default"
    );
    assert_eq!(json["aud"], serde_json::json!(["consul.io"]));
    let iat = json["iat"].as_u64().unwrap();
    assert_eq!(iat, 1_700_000_000);
    assert_eq!(json["nbf"].as_u64(), Some(iat));
    assert_eq!(json["exp"].as_u64(), Some(iat + 3600));
}

#[test]
fn service_claims_json_omits_nomad_task_and_exp_without_ttl() {
    let signer = signer();
    let claims = ClaimsBuilder::service("example", "cache", "alloc-1", "redis-db")
        .namespace("prod")
        .identity("consul-service_redis-db")
        .audience(CONSUL_AUDIENCE)
        .build(t0());
    let token = signer.sign(&claims).unwrap();
    let json = payload(&token);
    assert_eq!(
        names(&json),
        BTreeSet::from([
            "nomad_namespace",
            "nomad_job_id",
            "nomad_allocation_id",
            "nomad_service",
            "sub",
            "aud",
            "iat",
            "nbf",
            "jti",
        ])
    );
    assert_eq!(json["nomad_service"], "redis-db");
    assert_eq!(
        json["sub"],
        "global:prod:example:cache:redis-db:consul-service_redis-db"
    );
    let verified = signer.verify_at(&token, CONSUL_AUDIENCE, t0()).unwrap();
    assert_eq!(verified.nomad_task, None);
    assert_eq!(verified.exp, None);
}

#[test]
fn every_token_gets_its_own_jti() {
    let signer = signer();
    let builder = ClaimsBuilder::task("j", "g", "a", "t").audience(CONSUL_AUDIENCE);
    let one = payload(&signer.sign(&builder.build(t0())).unwrap());
    let two = payload(&signer.sign(&builder.build(t0())).unwrap());
    assert_ne!(one["jti"], two["jti"]);
}

#[test]
fn wrong_audience_is_refused() {
    let signer = signer();
    let token = signer.sign(&task_claims(t0())).unwrap();
    assert_eq!(
        signer.verify_at(&token, "vault.io", t0()),
        Err(VerifyError::WrongAudience {
            expected: "vault.io".to_owned()
        })
    );
}

#[test]
fn tampered_payload_is_refused() {
    let signer = signer();
    let honest = signer.sign(&task_claims(t0())).unwrap();
    let other = ClaimsBuilder::task("other-job", "cache", "alloc-2", "redis")
        .audience(CONSUL_AUDIENCE)
        .build(t0());
    let other = signer.sign(&other).unwrap();

    // The payload of one genuine token under the header and signature of another.
    let honest_parts: Vec<&str> = honest.split('.').collect();
    let other_parts: Vec<&str> = other.split('.').collect();
    let spliced = [honest_parts[0], other_parts[1], honest_parts[2]].join(".");
    assert_eq!(
        signer.verify_at(&spliced, CONSUL_AUDIENCE, t0()),
        Err(VerifyError::BadSignature)
    );

    // One character of the payload changed.
    let mut payload: Vec<u8> = honest_parts[1].bytes().collect();
    let middle = payload.len() / 2;
    payload[middle] = if payload[middle] == b'A' { b'B' } else { b'A' };
    let flipped = [
        honest_parts[0],
        std::str::from_utf8(&payload).unwrap(),
        honest_parts[2],
    ]
    .join(".");
    assert_eq!(
        signer.verify_at(&flipped, CONSUL_AUDIENCE, t0()),
        Err(VerifyError::BadSignature)
    );

    assert!(signer.verify_at(&honest, CONSUL_AUDIENCE, t0()).is_ok());
}

#[test]
fn token_of_another_signer_is_refused() {
    let stranger = signer();
    let token = stranger.sign(&task_claims(t0())).unwrap();
    let signer = signer();
    assert_eq!(
        signer.verify_at(&token, CONSUL_AUDIENCE, t0()),
        Err(VerifyError::UnknownKey {
            kid: stranger.active_kid()
        })
    );
}

#[test]
fn unsigned_and_garbage_tokens_are_refused() {
    let signer = signer();
    let token = signer.sign(&task_claims(t0())).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    // {"alg":"none","typ":"JWT"}
    let none_header = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0";
    let unsigned = format!("{none_header}.{}.", parts[1]);
    assert!(signer.verify_at(&unsigned, CONSUL_AUDIENCE, t0()).is_err());
    let without_signature = format!("{}.{}.", parts[0], parts[1]);
    assert!(
        signer
            .verify_at(&without_signature, CONSUL_AUDIENCE, t0())
            .is_err()
    );
    assert_eq!(
        signer.verify_at("not a token", CONSUL_AUDIENCE, t0()),
        Err(VerifyError::Malformed)
    );
}
