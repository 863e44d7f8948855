//! The connection to the fleet's etcd: keys under the fleet's prefix, reads, and the one
//! write berth makes — a transaction that compares the key's `mod_revision` with the one
//! the writer read.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use serde::{Serialize, de::DeserializeOwned};

use crate::settings::EtcdSettings;

/// How long one etcd request may take before it is given up (an unknown outcome: the caller
/// reads again before it decides anything).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How many times a request that reached no member is made in all.
const UNSENT_TRIES: u32 = 5;
/// The first wait before it is made again (then twice, three times… as long).
const UNSENT_WAIT: Duration = Duration::from_millis(200);
/// How often each endpoint is probed (with several endpoints).
pub const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a probe may take before its member counts as dead.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a fleet operation failed. Texts name the key or endpoint, never a value.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The settings are invalid (names the field).
    #[error("control_plane.etcd.{0}")]
    Settings(String),
    /// A TLS file cannot be read.
    #[error("control_plane.etcd.tls: {path}: {source}")]
    TlsFile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No endpoint answered.
    #[error("etcd at {endpoints}: {source}")]
    Connect {
        /// The endpoints, joined.
        endpoints: String,
        /// etcd's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A request failed or timed out.
    #[error("etcd {op} {key:?}: {source}")]
    Request {
        /// What was asked (get, txn, watch, lease…).
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// etcd's error.
        #[source]
        source: etcd_client::Error,
    },
    /// A record is larger than one etcd request may carry.
    #[error("etcd key {key:?}: {bytes} bytes is more than one etcd request carries")]
    TooLarge {
        /// The key.
        key: String,
        /// Its size.
        bytes: usize,
    },
    /// A value under berth's prefix is not what berth wrote.
    #[error("etcd key {key:?} holds no valid record: {source}")]
    Decode {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// A connection to the fleet's etcd, with its key prefix. Cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    prefix: String,
    /// The endpoints as given, and the options each probe connects with.
    endpoints: std::sync::Arc<Vec<String>>,
    options: ConnectOptions,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A value read with the revision a conditional write compares.
#[derive(Debug, Clone)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// The key's `mod_revision`.
    pub mod_revision: i64,
}

impl Etcd {
    /// Connects (and checks the settings first). Fails when no endpoint answers within
    /// [`CONNECT_TIMEOUT`].
    pub async fn connect(settings: &EtcdSettings) -> Result<Self, FleetError> {
        settings.check().map_err(FleetError::Settings)?;
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(3))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &settings.tls {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|source| FleetError::TlsFile {
                    path: p.display().to_string(),
                    source,
                })
            };
            let mut t = TlsOptions::new();
            if let Some(ca) = &tls.ca_file {
                t = t.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
                t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            opts = opts.with_tls(t);
        }
        let endpoints: Vec<&str> = settings
            .endpoints
            .iter()
            .map(|e| e.trim_end_matches('/'))
            .collect();
        let mut client = Client::connect(&endpoints, Some(opts.clone()))
            .await
            .map_err(|source| FleetError::Connect {
                endpoints: endpoints.join(","),
                source,
            })?;
        // Connecting is lazy: one request proves an endpoint answers.
        client
            .status()
            .await
            .map_err(|source| FleetError::Connect {
                endpoints: endpoints.join(","),
                source,
            })?;
        Ok(Self {
            client,
            prefix: settings.prefix.trim_end_matches('/').to_string(),
            endpoints: std::sync::Arc::new(endpoints.iter().map(|e| e.to_string()).collect()),
            options: opts,
        })
    }

    /// Keeps the client's endpoints to the members that answer, until `shutdown`: every
    /// [`PROBE_EVERY`] each endpoint is asked for its status on a connection of its own; one
    /// that does not answer is taken out of the client's balancing (so requests stop going to
    /// a dead member), and put back once it answers again. The last endpoint is never taken
    /// out. Nothing to do with one endpoint.
    pub async fn watch_endpoints(self, shutdown: tokio_util::sync::CancellationToken) {
        if self.endpoints.len() < 2 {
            return;
        }
        let probe_opts = self
            .options
            .clone()
            .with_connect_timeout(PROBE_TIMEOUT)
            .with_timeout(PROBE_TIMEOUT);
        let mut probes: Vec<Option<Client>> = vec![None; self.endpoints.len()];
        let mut out = vec![false; self.endpoints.len()];
        loop {
            for (i, ep) in self.endpoints.iter().enumerate() {
                let alive = match &mut probes[i] {
                    Some(c) => c.status().await.is_ok(),
                    None => match Client::connect([ep.as_str()], Some(probe_opts.clone())).await {
                        Ok(mut c) => {
                            let ok = c.status().await.is_ok();
                            probes[i] = Some(c);
                            ok
                        }
                        Err(_) => false,
                    },
                };
                if !alive {
                    probes[i] = None;
                }
                let others_in = out.iter().enumerate().any(|(j, o)| j != i && !o);
                if !alive && !out[i] && others_in {
                    match self.client.remove_endpoint(ep).await {
                        Ok(()) => {
                            out[i] = true;
                            tracing::warn!(endpoint = %ep, "etcd member does not answer; requests go to the others");
                        }
                        Err(e) => {
                            tracing::warn!(endpoint = %ep, error = %e, "cannot take an etcd endpoint out")
                        }
                    }
                } else if alive && out[i] {
                    match self.client.add_endpoint(ep).await {
                        Ok(()) => {
                            out[i] = false;
                            tracing::info!(endpoint = %ep, "etcd member answers again");
                        }
                        Err(e) => {
                            tracing::warn!(endpoint = %ep, error = %e, "cannot put an etcd endpoint back")
                        }
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    }

    /// Runs `call` on the client, again (up to [`UNSENT_TRIES`] times, waiting a little longer
    /// each time) while it fails without having reached any member (connection refused: a
    /// member just died and the client still balances requests to it). A request that may
    /// have been sent is never repeated here.
    async fn unsent_again<T, F, Fut>(&self, mut call: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 1;
        loop {
            match call(self.client.clone()).await {
                Err(e) if tries < UNSENT_TRIES && unsent(&e) => {
                    tracing::debug!(error = %e, "etcd request not sent; trying again");
                    tokio::time::sleep(UNSENT_WAIT * tries).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// The raw client (leases, watches, elections).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The key of `parts` under the prefix: `<prefix>/<a>/<b>`.
    pub fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for p in parts {
            k.push('/');
            k.push_str(p);
        }
        k
    }

    /// The prefix of a directory of keys: `<prefix>/<dir>/`.
    pub fn dir(&self, dir: &str) -> String {
        format!("{}/{dir}/", self.prefix)
    }

    /// The value at `key`, decoded, with its `mod_revision`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<Versioned<T>>, FleetError> {
        let resp = self
            .unsent_again(|mut c| async move { c.get(key, None).await })
            .await
            .map_err(request("get", key))?;
        match resp.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(Versioned {
                value: decode(key, kv.value())?,
                mod_revision: kv.mod_revision(),
            })),
        }
    }

    /// Every value under `dir` (a key prefix), decoded, and the revision of the read.
    pub async fn list<T: DeserializeOwned>(
        &self,
        dir: &str,
    ) -> Result<(Vec<(String, Versioned<T>)>, i64), FleetError> {
        let resp = self
            .unsent_again(
                |mut c| async move { c.get(dir, Some(GetOptions::new().with_prefix())).await },
            )
            .await
            .map_err(request("list", dir))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let value = decode(&key, kv.value())?;
            out.push((
                key,
                Versioned {
                    value,
                    mod_revision: kv.mod_revision(),
                },
            ));
        }
        Ok((out, revision))
    }

    /// The store's current revision.
    pub async fn revision(&self) -> Result<i64, FleetError> {
        let resp = self
            .client
            .clone()
            .get(
                self.prefix.as_str(),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(request("get", &self.prefix))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    /// Compacts the history up to `revision` (a revision already compacted is done).
    pub async fn compact(&self, revision: i64) -> Result<(), FleetError> {
        match self.client.clone().compact(revision, None).await {
            Ok(_) => Ok(()),
            Err(e)
                if e.to_string()
                    .contains("required revision has been compacted") =>
            {
                Ok(())
            }
            Err(source) => Err(FleetError::Request {
                op: "compact",
                key: format!("revision {revision}"),
                source,
            }),
        }
    }

    /// Writes `value` at `key` when its `mod_revision` is still `expected` (0: the key must
    /// not exist) and, with a `fence`, only while this node's registration is the live one.
    pub async fn put_if<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        expected: i64,
        fence: Option<&Fence>,
    ) -> Result<Outcome, FleetError> {
        let bytes = serde_json::to_vec(value).map_err(|source| FleetError::Decode {
            key: key.to_string(),
            source,
        })?;
        self.txn_if(
            key,
            expected,
            TxnOp::put(key, bytes, None),
            fence,
            "txn put",
        )
        .await
    }

    /// Deletes `key` when its `mod_revision` is still `expected`; as [`Etcd::put_if`].
    pub async fn delete_if(
        &self,
        key: &str,
        expected: i64,
        fence: Option<&Fence>,
    ) -> Result<Outcome, FleetError> {
        self.txn_if(key, expected, TxnOp::delete(key, None), fence, "txn delete")
            .await
    }

    /// Puts `value` at `key`, on `lease` when given, whatever was there.
    pub async fn put<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        lease: Option<i64>,
    ) -> Result<i64, FleetError> {
        let bytes = serde_json::to_vec(value).map_err(|source| FleetError::Decode {
            key: key.to_string(),
            source,
        })?;
        let resp = self
            .unsent_again(|mut c| {
                let bytes = bytes.clone();
                async move {
                    c.put(key, bytes, lease.map(|l| PutOptions::new().with_lease(l)))
                        .await
                }
            })
            .await
            .map_err(request("put", key))?;
        Ok(resp.header().map_or(0, |h| h.revision()))
    }

    async fn txn_if(
        &self,
        key: &str,
        expected: i64,
        op: TxnOp,
        fence: Option<&Fence>,
        what: &'static str,
    ) -> Result<Outcome, FleetError> {
        let mut when = vec![Compare::mod_revision(key, CompareOp::Equal, expected)];
        let mut otherwise = Vec::new();
        if let Some(f) = fence {
            when.push(Compare::lease(f.key.as_str(), CompareOp::Equal, f.lease));
            otherwise.push(TxnOp::get(f.key.as_str(), None));
        }
        let txn = Txn::new().when(when).and_then([op]).or_else(otherwise);
        let resp = self
            .unsent_again(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(request(what, key))?;
        if resp.succeeded() {
            return Ok(Outcome::Done(resp.header().map_or(0, |h| h.revision())));
        }
        if let Some(f) = fence {
            let live = resp.op_responses().into_iter().any(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().iter().any(|kv| kv.lease() == f.lease),
                _ => false,
            });
            if !live {
                return Ok(Outcome::Fenced);
            }
        }
        Ok(Outcome::Changed)
    }
}

/// One write of a batch: put `value` (or delete, when `None`) at `key` if its `mod_revision`
/// is still `expected` (0: absent).
#[derive(Debug, Clone)]
pub struct Write {
    /// The key.
    pub key: String,
    /// The revision it must still have.
    pub expected: i64,
    /// The bytes to put; `None` deletes.
    pub value: Option<Vec<u8>>,
}

impl Write {
    /// A put of `value`, encoded.
    pub fn put<T: Serialize>(key: String, expected: i64, value: &T) -> Result<Self, FleetError> {
        let bytes = serde_json::to_vec(value).map_err(|source| FleetError::Decode {
            key: key.clone(),
            source,
        })?;
        Ok(Self {
            key,
            expected,
            value: Some(bytes),
        })
    }

    /// A delete of `key`, if its revision is still `expected`.
    pub fn delete(key: String, expected: i64) -> Self {
        Self {
            key,
            expected,
            value: None,
        }
    }

    fn size(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Vec::len) + 16
    }
}

/// Most operations one transaction carries (etcd's default `--max-txn-ops` is 128: each
/// write is one compare and one operation, plus the fence).
pub const MAX_TXN_WRITES: usize = 60;
/// Most bytes one transaction carries (etcd's default request limit is 1.5 MiB).
pub const MAX_TXN_BYTES: usize = 1024 * 1024;

impl Etcd {
    /// Writes `writes` in as few transactions as etcd's default limits allow, each all or
    /// nothing and fenced; stops at the first that is not done. Returns that outcome (or the
    /// last `Done`) and how many transactions were sent.
    pub async fn write_all(
        &self,
        writes: Vec<Write>,
        fence: &Fence,
    ) -> Result<(Outcome, usize), FleetError> {
        let mut sent = 0;
        let mut last = Outcome::Done(0);
        let mut batch: Vec<Write> = Vec::new();
        let mut bytes = 0;
        let mut it = writes.into_iter().peekable();
        while let Some(w) = it.next() {
            if w.size() > MAX_TXN_BYTES {
                return Err(FleetError::TooLarge {
                    bytes: w.size(),
                    key: w.key,
                });
            }
            bytes += w.size();
            batch.push(w);
            let full = it
                .peek()
                .is_none_or(|n| batch.len() >= MAX_TXN_WRITES || bytes + n.size() > MAX_TXN_BYTES);
            if !full {
                continue;
            }
            last = self.txn_batch(std::mem::take(&mut batch), fence).await?;
            bytes = 0;
            sent += 1;
            if !matches!(last, Outcome::Done(_)) {
                break;
            }
        }
        Ok((last, sent))
    }

    async fn txn_batch(&self, batch: Vec<Write>, fence: &Fence) -> Result<Outcome, FleetError> {
        let first = batch.first().map(|w| w.key.clone()).unwrap_or_default();
        let mut when = vec![Compare::lease(
            fence.key.as_str(),
            CompareOp::Equal,
            fence.lease,
        )];
        let mut ops = Vec::with_capacity(batch.len());
        for w in batch {
            when.push(Compare::mod_revision(
                w.key.as_str(),
                CompareOp::Equal,
                w.expected,
            ));
            ops.push(match w.value {
                Some(v) => TxnOp::put(w.key, v, None),
                None => TxnOp::delete(w.key, None),
            });
        }
        let txn = Txn::new()
            .when(when)
            .and_then(ops)
            .or_else([TxnOp::get(fence.key.as_str(), None)]);
        let resp = self
            .unsent_again(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(request("txn batch", &first))?;
        if resp.succeeded() {
            return Ok(Outcome::Done(resp.header().map_or(0, |h| h.revision())));
        }
        let live = resp.op_responses().into_iter().any(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().iter().any(|kv| kv.lease() == fence.lease),
            _ => false,
        });
        Ok(if live {
            Outcome::Changed
        } else {
            Outcome::Fenced
        })
    }
}

/// A condition every fleet write of a node carries: its registration key is still on the
/// lease it holds, so a node whose lease lapsed (a partition, a long pause) writes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The node's registration key.
    pub key: String,
    /// The lease it must be on.
    pub lease: i64,
}

/// The outcome of a conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Written at this revision.
    Done(i64),
    /// The key had changed since it was read; nothing written.
    Changed,
    /// The writer's registration lapsed; nothing written.
    Fenced,
}

/// Whether the request failed before it reached any etcd member.
fn unsent(e: &etcd_client::Error) -> bool {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.contains("tcp connect error") || text.contains("Connection refused")
}

fn request(op: &'static str, key: &str) -> impl FnOnce(etcd_client::Error) -> FleetError {
    let key = key.to_string();
    move |source| FleetError::Request { op, key, source }
}

/// Decodes a value berth wrote.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, FleetError> {
    serde_json::from_slice(bytes).map_err(|source| FleetError::Decode {
        key: key.to_string(),
        source,
    })
}
