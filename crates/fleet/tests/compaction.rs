//! The leader's compaction against a real etcd: old revisions go, at least one interval of
//! history stays, and a mirror keeps following the directory.

use std::{sync::Arc, time::Duration};

use berth_fleet::{Compactor, Etcd, EtcdSettings, WatchedDir};
use berth_testkit::EtcdCluster;
use etcd_client::GetOptions;
use tokio_util::sync::CancellationToken;

/// Whether revision `rev` of `key` can still be read.
async fn readable(etcd: &Etcd, key: &str, rev: i64) -> bool {
    etcd.client()
        .get(key, Some(GetOptions::new().with_revision(rev)))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_compacts_old_revisions_and_mirrors_keep_following() {
    let cluster = EtcdCluster::single().unwrap();
    let mut settings = EtcdSettings::new(cluster.endpoints()).unwrap();
    settings.prefix = "/c".into();
    let etcd = Etcd::connect(&settings).await.unwrap();
    let shutdown = CancellationToken::new();
    let dir = WatchedDir::<u32>::new(etcd.dir("d"));
    tokio::spawn(Arc::clone(&dir).run(etcd.clone(), shutdown.clone()));
    dir.wait_synced(&shutdown).await;

    let key = etcd.key(&["d", "k"]);
    let first = etcd.put(&key, &0u32, None).await.unwrap();
    for i in 1..20u32 {
        etcd.put(&key, &i, None).await.unwrap();
    }
    assert!(readable(&etcd, &key, first).await);

    let term = CancellationToken::new();
    let run =
        tokio::spawn(Compactor::new(etcd.clone(), Duration::from_millis(100)).run(term.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while readable(&etcd, &key, first).await {
        assert!(tokio::time::Instant::now() < deadline, "never compacted");
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    term.cancel();
    run.await.unwrap();
    // The newest revision is always kept.
    let now = etcd.revision().await.unwrap();
    assert!(readable(&etcd, &key, now).await);

    // The mirror follows writes made after the compaction.
    etcd.put(&key, &99u32, None).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dir.get("k") != Some(99) {
        assert!(tokio::time::Instant::now() < deadline, "the mirror stopped");
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    shutdown.cancel();
}
