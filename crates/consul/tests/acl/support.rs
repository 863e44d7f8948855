//! Signing keys, JWTs with Nomad's claims, and a fake Consul that trusts the keys.

use std::{
    collections::BTreeMap,
    time::{SystemTime, UNIX_EPOCH},
};

use berth_consul::{AclToken, Client, ConsulConfig};
use berth_testkit::{FakeConsul, FakeConsulConfig};
use jsonwebtoken::{
    Algorithm, EncodingKey, Header,
    jwk::{Jwk, JwkSet},
};
use ring::{
    rand::SystemRandom,
    signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair},
};
use serde_json::{Value, json};

/// An ES256 signing key with its key id.
pub struct Signer {
    key: EncodingKey,
    kid: String,
    jwk: Jwk,
}

impl Signer {
    /// A fresh P-256 key.
    pub fn generate(kid: &str) -> Self {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .expect("a P-256 key");
        let key = EncodingKey::from_ec_der(pkcs8.as_ref());
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256).expect("its public JWK");
        jwk.common.key_id = Some(kid.to_owned());
        Self {
            key,
            kid: kid.to_owned(),
            jwk,
        }
    }

    /// The JWKS (JSON text) holding this key's public half.
    pub fn jwks(&self) -> String {
        serde_json::to_string(&JwkSet {
            keys: vec![self.jwk.clone()],
        })
        .expect("a JWK set encodes")
    }

    /// `claims` signed with this key, its `kid` in the header.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// `claims` signed with this key under another `kid`.
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.key).expect("signs")
    }
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        .try_into()
        .expect("fits")
}

/// Claims of a Nomad workload identity for Consul, valid for an hour.
fn workload_claims(extra: Value) -> Value {
    let now = now();
    let mut claims = json!({
        "aud": ["consul.io"],
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
        "jti": "3f5bd1b2-7a6c-4f57-9c5a-3d0f1c2b4e6a",
        "nomad_namespace": "default",
        "nomad_job_id": "shop",
        "nomad_allocation_id": "5e5c5c29-4e36-45c6-8d6f-5b2f0c7c0a1e",
        "sub": "global:default:shop:web",
    });
    let (Value::Object(claims_map), Value::Object(extra)) = (&mut claims, extra) else {
        panic!("claims are objects");
    };
    claims_map.extend(extra);
    claims
}

/// A service identity's claims.
pub fn service_claims(service: &str) -> Value {
    workload_claims(json!({ "nomad_service": service }))
}

/// A task identity's claims.
pub fn task_claims(task: &str) -> Value {
    workload_claims(json!({ "nomad_task": task }))
}

/// A fake Consul trusting `signer`'s key with Nomad's defaults, and a client of it.
pub fn consul_trusting(signer: &Signer) -> (FakeConsul, Client) {
    let jwks = signer.jwks();
    let fake = FakeConsul::start(FakeConsulConfig::new(move || Ok(jwks.clone())))
        .expect("fake consul starts");
    let client = client_of(&fake);
    (fake, client)
}

pub fn client_of(fake: &FakeConsul) -> Client {
    Client::new(&ConsulConfig {
        address: fake.address(),
        ..ConsulConfig::default()
    })
    .expect("a valid config")
}

/// The meta Nomad sends for a service's login.
pub fn service_meta(service: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(
        "requested_by".to_owned(),
        format!("nomad_service_{service}"),
    )])
}

/// A fake Consul trusting a fresh key, a client of it, and a token for service `web`; `prepare`
/// runs on the fake before the login.
pub async fn logged_in(prepare: impl FnOnce(&FakeConsul)) -> (FakeConsul, Client, AclToken) {
    let signer = Signer::generate("key-1");
    let (fake, client) = consul_trusting(&signer);
    prepare(&fake);
    let token = client
        .login(
            "nomad-workloads",
            &signer.sign(&service_claims("web")),
            service_meta("web"),
        )
        .await
        .expect("login");
    (fake, client, token)
}
