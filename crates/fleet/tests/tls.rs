//! An etcd that serves clients only over TLS and only to clients with a certificate its CA
//! signed: berth reaches it with `control_plane.etcd.tls`, reads and watches over it, and is
//! refused (with an error naming the endpoint) without a client certificate or when it does
//! not trust the server's CA.

use std::{error::Error as _, sync::Arc, time::Duration};

use berth_fleet::{Etcd, EtcdSettings, FleetError, TlsFiles, WatchedDir};
use berth_testkit::{EtcdCluster, EtcdTls};
use tokio_util::sync::CancellationToken;

fn settings(cluster: &EtcdCluster, tls: TlsFiles) -> EtcdSettings {
    let mut s = EtcdSettings::new(cluster.endpoints()).unwrap();
    s.prefix = "/tls".into();
    s.tls = Some(tls);
    s.check().unwrap();
    s
}

/// The whole chain of an error, for messages.
fn chain(e: &FleetError) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text.push_str(": ");
        text.push_str(&s.to_string());
        next = s.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_reaches_an_etcd_that_requires_tls() {
    let cluster = EtcdCluster::start_tls(1).unwrap();
    let files = cluster.tls().unwrap().clone();
    assert!(cluster.endpoints()[0].starts_with("https://127.0.0.1:"));
    let etcd = Etcd::connect(&settings(
        &cluster,
        TlsFiles {
            ca_file: Some(files.ca.clone()),
            cert_file: Some(files.client_cert.clone()),
            key_file: Some(files.client_key.clone()),
        },
    ))
    .await
    .unwrap_or_else(|e| panic!("{}", chain(&e)));

    // Reads, writes and a watch all go over the TLS connection.
    let shutdown = CancellationToken::new();
    let dir = WatchedDir::<u32>::new(etcd.dir("d"));
    tokio::spawn(Arc::clone(&dir).run(etcd.clone(), shutdown.clone()));
    dir.wait_synced(&shutdown).await;
    let key = etcd.key(&["d", "k"]);
    etcd.put(&key, &7u32, None).await.unwrap();
    assert_eq!(etcd.get::<u32>(&key).await.unwrap().unwrap().value, 7);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dir.get("k") != Some(7) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch saw nothing"
        );
        tokio::time::sleep(berth_testkit::POLL_INTERVAL).await;
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_or_trust_in_the_server_a_client_is_refused() {
    let cluster = EtcdCluster::start_tls(1).unwrap();
    let files = cluster.tls().unwrap().clone();
    let endpoint = cluster.endpoints()[0].clone();

    // The server's CA is trusted, but no client certificate is shown.
    let Err(no_cert) = Etcd::connect(&settings(
        &cluster,
        TlsFiles {
            ca_file: Some(files.ca.clone()),
            cert_file: None,
            key_file: None,
        },
    ))
    .await
    else {
        panic!("connected without a client certificate");
    };
    assert!(
        matches!(no_cert, FleetError::Connect { .. }),
        "{}",
        chain(&no_cert)
    );
    assert!(no_cert.to_string().contains(&endpoint), "{no_cert}");

    // A client certificate from another CA, which is also the only CA trusted: the server's
    // certificate does not verify.
    let other = tempfile::tempdir().unwrap();
    let stranger = EtcdTls::generate(other.path(), "another CA").unwrap();
    let Err(untrusted) = Etcd::connect(&settings(
        &cluster,
        TlsFiles {
            ca_file: Some(stranger.ca.clone()),
            cert_file: Some(stranger.client_cert.clone()),
            key_file: Some(stranger.client_key.clone()),
        },
    ))
    .await
    else {
        panic!("connected trusting another CA");
    };
    assert!(
        matches!(untrusted, FleetError::Connect { .. }),
        "{}",
        chain(&untrusted)
    );

    // A key file that cannot be read is named, and its contents never shown.
    let missing = other.path().join("absent-key.pem");
    let Err(unreadable) = Etcd::connect(&settings(
        &cluster,
        TlsFiles {
            ca_file: Some(files.ca.clone()),
            cert_file: Some(files.client_cert.clone()),
            key_file: Some(missing.clone()),
        },
    ))
    .await
    else {
        panic!("connected with a missing key file");
    };
    let text = chain(&unreadable);
    assert!(
        text.contains("control_plane.etcd.tls") && text.contains(&missing.display().to_string()),
        "{text}"
    );
    let key = std::fs::read_to_string(&files.client_key).unwrap();
    let key_body = key.lines().nth(1).unwrap();
    for e in [&no_cert, &untrusted, &unreadable] {
        assert!(!chain(e).contains(key_body), "a key in {}", chain(e));
    }
}
