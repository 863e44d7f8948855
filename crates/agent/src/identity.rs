//! The agent's workload identities: the signing keys live in the agent's store
//! (`Table::IDENTITY`), are checked for rotation periodically, and their public halves are
//! served at `/.well-known/jwks.json`.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use berth_identity::{IdentityError, KeyStore, KeyStoreError, Rotation, Signer};
use berth_state::{Store, Table};
use tokio_util::sync::CancellationToken;

/// The record of `Table::IDENTITY` that holds the key set.
const KEYS_RECORD: &str = "keys";

/// How often the agent checks whether the active key is due for rotation.
pub const ROTATION_CHECK: Duration = Duration::from_secs(60);

/// The key set as one record of the agent's store (redb commits are atomic and durable, as
/// a [`KeyStore`] must be). The record is the key set's JSON text.
struct StoreKeyStore {
    store: Arc<Store>,
}

fn backend(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> KeyStoreError {
    KeyStoreError::Backend {
        what: what.to_owned(),
        source: Box::new(e),
    }
}

impl KeyStore for StoreKeyStore {
    fn load(&self) -> Result<Option<Vec<u8>>, KeyStoreError> {
        let text: Option<String> = self
            .store
            .get(Table::IDENTITY, KEYS_RECORD)
            .map_err(|e| backend("reading identity/keys", e))?;
        Ok(text.map(String::into_bytes))
    }

    fn save(&self, bytes: &[u8]) -> Result<(), KeyStoreError> {
        let text = std::str::from_utf8(bytes).map_err(|e| backend("encoding identity/keys", e))?;
        self.store
            .put(Table::IDENTITY, KEYS_RECORD, &text)
            .map_err(|e| backend("writing identity/keys", e))
    }
}

/// Opens the agent's signer over its store, making the first key if there is none.
pub fn open_signer(store: Arc<Store>, rotation: Rotation) -> Result<Signer, IdentityError> {
    Signer::open(StoreKeyStore { store }, rotation)
}

/// Checks the keys for rotation every `every` until `shutdown`; a failed rotation keeps the
/// old keys and is tried again at the next check.
pub async fn rotate(signer: Signer, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let s = signer.clone();
        let done = tokio::task::spawn_blocking(move || s.rotate_if_due(SystemTime::now())).await;
        match done {
            Ok(Ok(report)) if report.changed() => tracing::info!(
                new_key = report.new_kid.as_deref().unwrap_or(""),
                dropped = report.dropped.join(","),
                "workload identity keys rotated"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot rotate the workload identity keys"),
            Err(e) => tracing::warn!(error = %e, "the key rotation task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_reopening_the_store_and_rotation_is_saved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = Arc::new(Store::open(&path).unwrap());
        let signer = open_signer(Arc::clone(&store), Rotation::default()).unwrap();
        let first = signer.active_kid();
        let report = signer.rotate_now(SystemTime::now()).unwrap();
        let second = report.new_kid.unwrap();
        assert_ne!(first, second);
        drop(signer);
        drop(store);
        let store = Arc::new(Store::open(&path).unwrap());
        let again = open_signer(store, Rotation::default()).unwrap();
        assert_eq!(again.active_kid(), second);
        let kids: Vec<String> = again
            .jwks()
            .keys
            .iter()
            .filter_map(|k| k.common.key_id.clone())
            .collect();
        assert_eq!(kids, [second, first], "the retired key still verifies");
    }
}
