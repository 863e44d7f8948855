//! Key rotation, driven by explicit times.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_identity::{
    CONSUL_AUDIENCE, ClaimsBuilder, MemoryKeyStore, Rotation, Signer, StoredKeySet, VerifyError,
};

const HOUR: Duration = Duration::from_secs(3600);

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn rotation() -> Rotation {
    Rotation {
        rotate_every: 24 * HOUR,
        keep_retired_for: 2 * HOUR,
    }
}

/// A token without ttl, so only the keys decide whether it verifies.
fn token(signer: &Signer, now: SystemTime) -> String {
    let claims = ClaimsBuilder::task("web", "frontend", "alloc-1", "nginx")
        .audience(CONSUL_AUDIENCE)
        .build(now);
    signer.sign(&claims).unwrap()
}

fn kid_of(token: &str) -> String {
    jsonwebtoken::decode_header(token).unwrap().kid.unwrap()
}

fn jwks_kids(signer: &Signer) -> Vec<String> {
    signer
        .jwks()
        .keys
        .iter()
        .map(|k| k.common.key_id.clone().unwrap())
        .collect()
}

#[test]
fn nothing_rotates_before_rotate_every() {
    let store = MemoryKeyStore::new();
    let signer = Signer::open_at(store.clone(), rotation(), t0()).unwrap();
    let first = signer.active_kid();
    let report = signer
        .rotate_if_due(t0() + 24 * HOUR - Duration::from_millis(1))
        .unwrap();
    assert!(!report.changed());
    assert_eq!(signer.active_kid(), first);
    assert_eq!(store.save_count(), 1, "only the first key was saved");
}

#[test]
fn a_token_signed_before_rotation_still_verifies_after_it() {
    let signer = Signer::open_at(MemoryKeyStore::new(), rotation(), t0()).unwrap();
    let old = token(&signer, t0());
    let first = signer.active_kid();

    let later = t0() + 24 * HOUR;
    let report = signer.rotate_if_due(later).unwrap();
    let second = report.new_kid.clone().unwrap();
    assert_ne!(second, first);
    assert!(report.dropped.is_empty());

    assert_eq!(kid_of(&old), first);
    assert!(signer.verify_at(&old, CONSUL_AUDIENCE, later).is_ok());
    assert_eq!(jwks_kids(&signer), vec![second, first]);
}

#[test]
fn new_tokens_carry_the_new_kid() {
    let signer = Signer::open_at(MemoryKeyStore::new(), rotation(), t0()).unwrap();
    let later = t0() + 25 * HOUR;
    let report = signer.rotate_if_due(later).unwrap();
    let fresh = token(&signer, later);
    assert_eq!(Some(kid_of(&fresh)), report.new_kid);
    assert_eq!(kid_of(&fresh), signer.active_kid());
    assert!(signer.verify_at(&fresh, CONSUL_AUDIENCE, later).is_ok());
}

#[test]
fn a_retired_key_leaves_the_jwks_after_keep_retired_for() {
    let signer = Signer::open_at(MemoryKeyStore::new(), rotation(), t0()).unwrap();
    let old = token(&signer, t0());
    let first = signer.active_kid();
    let rotated_at = t0() + 24 * HOUR;
    let second = signer.rotate_if_due(rotated_at).unwrap().new_kid.unwrap();

    let almost = rotated_at + 2 * HOUR - Duration::from_millis(1);
    assert!(!signer.rotate_if_due(almost).unwrap().changed());
    assert!(jwks_kids(&signer).contains(&first));

    let gone = rotated_at + 2 * HOUR;
    let report = signer.rotate_if_due(gone).unwrap();
    assert_eq!(report.new_kid, None);
    assert_eq!(report.dropped, vec![first.clone()]);
    assert_eq!(jwks_kids(&signer), vec![second]);
    assert_eq!(
        signer.verify_at(&old, CONSUL_AUDIENCE, gone),
        Err(VerifyError::UnknownKey { kid: first })
    );
}

#[test]
fn rotation_is_saved_before_it_is_used() {
    let store = MemoryKeyStore::new();
    let signer = Signer::open_at(store.clone(), rotation(), t0()).unwrap();
    let report = signer.rotate_if_due(t0() + 30 * HOUR).unwrap();
    let stored = StoredKeySet::from_bytes(&store.bytes().unwrap()).unwrap();
    assert_eq!(Some(stored.active().kid().to_owned()), report.new_kid);
    assert_eq!(stored.keys().len(), 2);

    let reopened = Signer::open_at(store, rotation(), t0() + 31 * HOUR).unwrap();
    assert_eq!(reopened.active_kid(), signer.active_kid());
    assert_eq!(reopened.jwks(), signer.jwks());
}

#[test]
fn rotate_now_always_makes_a_new_key() {
    let signer = Signer::open_at(MemoryKeyStore::new(), rotation(), t0()).unwrap();
    let first = signer.active_kid();
    let report = signer.rotate_now(t0()).unwrap();
    assert_ne!(report.new_kid.unwrap(), first);
    assert_eq!(signer.jwks().keys.len(), 2);
}

#[test]
fn a_clock_that_goes_back_rotates_nothing() {
    let signer = Signer::open_at(MemoryKeyStore::new(), rotation(), t0()).unwrap();
    assert!(!signer.rotate_if_due(t0() - 48 * HOUR).unwrap().changed());
}
