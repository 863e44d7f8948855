//! Keeping the key set in a store: reopening, corruption, and keeping secrets out of sight.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_identity::{
    CONSUL_AUDIENCE, ClaimsBuilder, FileKeyStore, IdentityError, KeyStore, MemoryKeyStore,
    Rotation, Signer, StoredKeySet,
};

fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn stored_json(store: &MemoryKeyStore) -> serde_json::Value {
    serde_json::from_slice(&store.bytes().unwrap()).unwrap()
}

/// The base64 PKCS#8 of every stored key, straight from the stored JSON.
fn stored_secrets(store: &MemoryKeyStore) -> Vec<String> {
    stored_json(store)["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["pkcs8"].as_str().unwrap().to_owned())
        .collect()
}

/// The secret, and a stretch of it past the PKCS#8 header every P-256 key shares.
fn secret_views(secret: &str) -> [&str; 2] {
    [secret, &secret[52..88]]
}

#[test]
fn stored_json_has_the_documented_shape() {
    let store = MemoryKeyStore::new();
    let signer = Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap();
    let json = stored_json(&store);
    assert_eq!(json["version"], 1);
    let keys = json["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    let key = keys[0].as_object().unwrap();
    let mut names: Vec<&str> = key.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["created_ms", "kid", "pkcs8"]);
    assert_eq!(key["kid"], signer.active_kid().as_str());
    assert_eq!(key["created_ms"], 1_700_000_000_000u64);

    signer.rotate_now(t0() + Duration::from_secs(1)).unwrap();
    let json = stored_json(&store);
    assert_eq!(json["keys"][0]["retired_ms"], 1_700_000_001_000u64);
    assert!(json["keys"][1].get("retired_ms").is_none());
}

#[test]
fn reopening_the_same_store_keeps_the_keys() {
    let store = MemoryKeyStore::new();
    let first = Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap();
    let token = first
        .sign(
            &ClaimsBuilder::task("j", "g", "a", "t")
                .audience(CONSUL_AUDIENCE)
                .build(t0()),
        )
        .unwrap();
    let before = store.bytes();

    let second = Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap();
    assert_eq!(second.active_kid(), first.active_kid());
    assert_eq!(second.jwks(), first.jwks());
    assert!(second.verify_at(&token, CONSUL_AUDIENCE, t0()).is_ok());
    assert_eq!(store.bytes(), before, "reopening writes nothing");
    assert_eq!(store.save_count(), 1);
}

#[test]
fn file_store_keeps_the_keys_across_reopen_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("identity-keys.json");
    let first = Signer::open_at(FileKeyStore::new(&path), Rotation::default(), t0()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    first.rotate_now(t0()).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let second = Signer::open_at(FileKeyStore::new(&path), Rotation::default(), t0()).unwrap();
    assert_eq!(second.active_kid(), first.active_kid());
    assert_eq!(second.jwks(), first.jwks());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn debug_of_signer_and_stored_key_set_shows_no_key_bytes() {
    let store = MemoryKeyStore::new();
    let signer = Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap();
    signer.rotate_now(t0()).unwrap();
    let secrets = stored_secrets(&store);
    assert_eq!(secrets.len(), 2);
    let set = StoredKeySet::from_bytes(&store.bytes().unwrap()).unwrap();

    let shown = [
        format!("{signer:?}"),
        format!("{signer:#?}"),
        format!("{set:?}"),
        format!("{set:#?}"),
        format!("{:?}", signer.key_set()),
        format!("{store:?}"),
    ];
    for text in &shown {
        for secret in &secrets {
            for view in secret_views(secret) {
                assert!(!text.contains(view), "key bytes in {text}");
            }
        }
    }
    assert!(shown[0].contains(&signer.active_kid()));
}

#[test]
fn corrupt_store_gives_a_clear_error_and_is_not_overwritten() {
    let cases: [&[u8]; 4] = [
        b"\x00\x01 not json",
        b"{\"version\":1,\"keys\":[]}",
        b"{\"version\":9,\"keys\":[]}",
        b"{\"version\":1,\"keys\":[{\"kid\":\"abc\",\"pkcs8\":\"AAAA\",\"created_ms\":1}]}",
    ];
    for bytes in cases {
        let store = MemoryKeyStore::with_bytes(bytes.to_vec());
        let err = Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("left untouched"), "{message}");
        assert_eq!(store.bytes().as_deref(), Some(bytes));
        assert_eq!(store.save_count(), 0);
    }
}

#[test]
fn corrupt_file_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("identity-keys.json");
    std::fs::write(&path, b"{\"version\":1,\"keys\":").unwrap();
    let err = Signer::open_at(FileKeyStore::new(&path), Rotation::default(), t0()).unwrap_err();
    match &err {
        IdentityError::Corrupt { reason } => assert!(reason.starts_with("truncated JSON")),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"version\":1,\"keys\":");
}

#[test]
fn errors_about_a_stored_set_never_repeat_key_bytes() {
    let store = MemoryKeyStore::new();
    Signer::open_at(store.clone(), Rotation::default(), t0()).unwrap();
    let secret = stored_secrets(&store).remove(0);
    let good = stored_json(&store);

    // A key in the wrong field, and a bad key after a good one.
    let mut misplaced = good.clone();
    misplaced["keys"][0]["created_ms"] = secret.clone().into();
    let mut second_bad = good.clone();
    let mut bad = good["keys"][0].clone();
    bad["kid"] = "other".into();
    bad["pkcs8"] = secret[..secret.len() - 4].into();
    second_bad["keys"].as_array_mut().unwrap().push(bad);

    for value in [misplaced, second_bad] {
        let err = StoredKeySet::from_bytes(&serde_json::to_vec(&value).unwrap()).unwrap_err();
        let shown = format!("{err} {err:?}");
        for view in secret_views(&secret) {
            assert!(!shown.contains(view), "key bytes in {shown}");
        }
    }
}

#[test]
fn a_failing_store_is_reported_as_a_load_or_save_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = FileKeyStore::new(dir.path().join("no-such-dir").join("keys.json"));
    let err = Signer::open_at(missing, Rotation::default(), t0()).unwrap_err();
    assert!(matches!(err, IdentityError::Save(_)), "{err:?}");

    // A directory where the file should be cannot be read.
    let unreadable = FileKeyStore::new(dir.path());
    assert!(unreadable.load().is_err());
    let err = Signer::open_at(unreadable, Rotation::default(), t0()).unwrap_err();
    assert!(matches!(err, IdentityError::Load(_)), "{err:?}");
}
