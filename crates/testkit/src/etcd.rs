//! Real etcd servers (Debian's `etcd-server`, etcd 3.4) on 127.0.0.1, one process per member,
//! for integration tests and benches.
//!
//! Everything is blocking and spoken over plain HTTP/1.1: health is `GET /health` on each
//! member's metrics port (plain HTTP also when clients must use TLS), the raft state is the gRPC
//! gateway's `POST /v3/maintenance/status` on its client port (etcd 3.4 no longer serves
//! `/v2/stats/self` unless started with `--enable-v2`, which tests of a v3 client should not
//! need).
//!
//! [`EtcdCluster::start_tls`] makes members that serve clients only over TLS and only to
//! clients with a certificate their CA signed ([`EtcdTls`]).

use std::{
    fs::OpenOptions,
    io::{self, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::{ffi::OsStrExt as _, fs::PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::POLL_INTERVAL;

/// How long [`EtcdCluster::start`] and [`EtcdCluster::restart`] wait for members to answer
/// healthy.
pub const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Raft heartbeat interval given to every member (etcd's default is 100 ms).
const HEARTBEAT_MS: &str = "50";

/// Raft election timeout given to every member (etcd's default is 1000 ms): a follower that
/// hears nothing from its leader for this long starts an election.
const ELECTION_MS: &str = "500";

/// Bound on each step (connect, send, every read) of one HTTP request to a member.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How many lines of each member's log [`EtcdCluster::logs`] and errors show.
const LOG_TAIL_LINES: usize = 40;

/// How many sets of ports [`EtcdCluster::start`] tries: a port picked free may be taken by
/// another process before the member binds it.
const START_ATTEMPTS: usize = 3;

/// What a member logs when it cannot bind one of its ports.
const ADDR_IN_USE: &str = "address already in use";

/// A cluster did not come up, or a member did not come back.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// There is no executable `etcd` on `PATH`.
    #[error("no executable `etcd` on PATH (Debian: `apt-get install etcd-server`)")]
    NotInstalled,
    /// A cluster was asked for with no members.
    #[error("an etcd cluster needs at least one member")]
    NoMembers,
    /// The cluster's directory, ports or log files could not be set up.
    #[error("{what}")]
    Setup {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A member's process could not be started.
    #[error("starting etcd member {member}")]
    Spawn {
        /// Index of the member.
        member: usize,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A member exited before it answered healthy.
    #[error("etcd member {member} exited ({status}) before it was healthy\n{log}")]
    Exited {
        /// Index of the member.
        member: usize,
        /// How it exited.
        status: ExitStatus,
        /// The tail of its log.
        log: String,
    },
    /// A member did not answer healthy in time.
    #[error("etcd member {member} was not healthy within {waited:?} (last answer: {last})\n{log}")]
    NotHealthy {
        /// Index of the member.
        member: usize,
        /// How long was waited.
        waited: Duration,
        /// The last answer to `GET /health`, or why there was none.
        last: String,
        /// The tail of its log.
        log: String,
    },
}

/// A real etcd cluster of one or more members on 127.0.0.1, each its own `etcd` process with
/// its own client and peer port and data directory, all inside one temporary directory
/// (`m<i>.data/`, and `m<i>.log` holding everything member `i` wrote, over all its runs).
///
/// Members run as `setpriv --pdeathsig KILL -- etcd …`, so each dies with the thread that
/// started it (even if the test process is killed): start and restart members on the test's
/// own thread, not in `spawn_blocking` (whose threads exit when idle). Dropping the handle
/// (or [`stop`](Self::stop)) kills and reaps every member and removes the directory; when the
/// thread is panicking it prints [`logs`](Self::logs) first.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    binary: PathBuf,
    initial_cluster: String,
    token: String,
    tls: Option<EtcdTls>,
    dir: TempDir,
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP, for `/health` whatever the client port speaks.
    metrics_port: u16,
    /// Whether clients must speak TLS.
    tls: bool,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Certificates for an etcd that serves clients only over TLS, written as PEM files into one
/// directory: a CA, the server's certificate for `127.0.0.1` and `localhost`, and a client
/// certificate, each signed by the CA.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The server's certificate.
    pub server_cert: PathBuf,
    /// The server's key.
    pub server_key: PathBuf,
    /// A client certificate.
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
}

impl EtcdTls {
    /// Generates a new CA (named `ca_name`) and the certificates it signs into `dir` (which
    /// must exist): `ca.pem`, `server.pem`, `server-key.pem`, `client.pem`, `client-key.pem`.
    pub fn generate(dir: &Path, ca_name: &str) -> Result<Self, EtcdError> {
        let setup = |what: &str, e: &dyn std::fmt::Display| EtcdError::Setup {
            what: format!("generating the test certificates: {what}"),
            source: io::Error::other(e.to_string()),
        };
        let key = || rcgen::KeyPair::generate().map_err(|e| setup("a key", &e));
        let params = |names: &[&str], purposes: &[rcgen::ExtendedKeyUsagePurpose]| {
            let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let mut p = rcgen::CertificateParams::new(names).map_err(|e| setup("params", &e))?;
            p.extended_key_usages.extend_from_slice(purposes);
            Ok::<_, EtcdError>(p)
        };
        let mut ca_params = params(&[], &[])?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, key()?)
            .map_err(|e| setup("the CA", &e))?;
        let issue = |names: &[&str], purposes: &[_]| {
            let k = key()?;
            let cert = params(names, purposes)?
                .signed_by(&k, &ca)
                .map_err(|e| setup("a certificate", &e))?;
            Ok::<_, EtcdError>((cert.pem(), k.serialize_pem()))
        };
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        // etcd's gRPC gateway dials its own server with the server's certificate, so that one
        // serves as a client certificate too (as etcd's docs want).
        let (server, server_key) = issue(&["127.0.0.1", "localhost"], &[ServerAuth, ClientAuth])?;
        let (client, client_key) = issue(&["berth-client"], &[ClientAuth])?;
        let tls = Self {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client-key.pem"),
        };
        for (path, pem) in [
            (&tls.ca, ca.pem()),
            (&tls.server_cert, server),
            (&tls.server_key, server_key),
            (&tls.client_cert, client),
            (&tls.client_key, client_key),
        ] {
            std::fs::write(path, pem).map_err(|source| EtcdError::Setup {
                what: format!("writing {}", path.display()),
                source,
            })?;
        }
        Ok(tls)
    }
}

impl Member {
    fn client_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Its exit status if its process has exited (then reaped and forgotten).
    fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }
}

impl EtcdCluster {
    /// Starts a cluster of `members` members and returns once every one of them answers
    /// `GET /health` with `"health":"true"` (so the cluster has a leader and serves requests),
    /// within [`ETCD_READY_TIMEOUT`]. On error nothing is left running and the error holds
    /// the failing member's log.
    pub fn start(members: usize) -> Result<Self, EtcdError> {
        Self::start_with(members, false)
    }

    /// Like [`start`](Self::start), but the members serve clients only over TLS
    /// (`https://` endpoints) and only to clients whose certificate the cluster's own CA
    /// signed ([`tls`](Self::tls) has the files). [`leader`](Self::leader) knows no leader
    /// of such a cluster.
    pub fn start_tls(members: usize) -> Result<Self, EtcdError> {
        Self::start_with(members, true)
    }

    fn start_with(members: usize, tls: bool) -> Result<Self, EtcdError> {
        if members == 0 {
            return Err(EtcdError::NoMembers);
        }
        let binary = find_etcd().ok_or(EtcdError::NotInstalled)?;
        let mut attempt = 1;
        loop {
            let result = Self::try_start(&binary, members, tls);
            let port_taken = matches!(
                &result,
                Err(EtcdError::Exited { log, .. }) if log.contains(ADDR_IN_USE)
            );
            if !port_taken || attempt == START_ATTEMPTS {
                return result;
            }
            attempt += 1;
        }
    }

    /// A one-member cluster: [`start(1)`](Self::start).
    pub fn single() -> Result<Self, EtcdError> {
        Self::start(1)
    }

    fn try_start(binary: &Path, count: usize, tls: bool) -> Result<Self, EtcdError> {
        let dir = tempfile::Builder::new()
            .prefix("berth-etcd-")
            .tempdir()
            .map_err(|source| EtcdError::Setup {
                what: "creating the cluster's temporary directory".to_owned(),
                source,
            })?;
        let tls = tls
            .then(|| EtcdTls::generate(dir.path(), "berth test etcd CA"))
            .transpose()?;
        let ports = free_ports(3 * count).map_err(|source| EtcdError::Setup {
            what: "picking free ports on 127.0.0.1".to_owned(),
            source,
        })?;
        let members: Vec<Member> = ports
            .chunks(3)
            .enumerate()
            .map(|(i, three)| Member {
                name: format!("m{i}"),
                client_port: three[0],
                peer_port: three[1],
                metrics_port: three[2],
                tls: tls.is_some(),
                // Left for etcd to create: it wants its data directory private (0700).
                data_dir: dir.path().join(format!("m{i}.data")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        // The directory's name is unique on this machine, so the token is too.
        let token = format!(
            "berth-{}",
            dir.path().file_name().unwrap_or_default().display()
        );
        let mut cluster = EtcdCluster {
            members,
            binary: binary.to_owned(),
            initial_cluster,
            token,
            tls,
            dir,
        };
        // All first, then wait: a member of a larger cluster is healthy only with a quorum.
        for i in 0..count {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_healthy(&(0..count).collect::<Vec<_>>())?;
        Ok(cluster)
    }

    /// Starts member `i`'s process with `--initial-cluster-state <state>`; its output goes to
    /// its log file.
    fn spawn(&mut self, i: usize, state: &str) -> Result<(), EtcdError> {
        let member = &self.members[i];
        let open_log = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&member.log)
                .map_err(|source| EtcdError::Setup {
                    what: format!("opening {}", member.log.display()),
                    source,
                })
        };
        let (stdout, stderr) = (open_log()?, open_log()?);
        let client = member.client_url();
        let peer = member.peer_url();
        let metrics = format!("http://127.0.0.1:{}", member.metrics_port);
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(&self.binary)
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--heartbeat-interval", HEARTBEAT_MS])
            .args(["--election-timeout", ELECTION_MS])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        // etcd refuses to start when a flag and its ETCD_* variable are both set.
        for (key, _) in std::env::vars_os() {
            if key.as_bytes().starts_with(b"ETCD_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .spawn()
            .map_err(|source| EtcdError::Spawn { member: i, source })?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Returns once every member in `which` answers healthy; an error (naming the first member
    /// that failed) if one exits or [`ETCD_READY_TIMEOUT`] passes first.
    fn wait_healthy(&mut self, which: &[usize]) -> Result<(), EtcdError> {
        let deadline = Instant::now() + ETCD_READY_TIMEOUT;
        let mut pending = which.to_vec();
        let mut last = String::from("none yet");
        loop {
            let mut still = Vec::new();
            for &i in &pending {
                if let Some(status) = self.members[i].exited() {
                    return Err(EtcdError::Exited {
                        member: i,
                        status,
                        log: self.member_log(i),
                    });
                }
                if let Err(answer) = health(self.members[i].metrics_port) {
                    if still.is_empty() {
                        last = answer;
                    }
                    still.push(i);
                }
            }
            pending = still;
            let Some(&first) = pending.first() else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(EtcdError::NotHealthy {
                    member: first,
                    waited: ETCD_READY_TIMEOUT,
                    last,
                    log: self.member_log(first),
                });
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// Client URL of every member, by index: `http://127.0.0.1:<port>` (`https://` for a
    /// cluster from [`start_tls`](Self::start_tls)), also for members that are not running.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_url).collect()
    }

    /// [`endpoints`](Self::endpoints) joined with commas, as etcd clients take them.
    pub fn endpoints_csv(&self) -> String {
        self.endpoints().join(",")
    }

    /// The certificates of a cluster from [`start_tls`](Self::start_tls).
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// Process id of member `member` while it runs (as started by this handle).
    ///
    /// # Panics
    /// If there is no such member.
    pub fn pid(&self, member: usize) -> Option<u32> {
        self.members[member].child.as_ref().map(Child::id)
    }

    /// Kills member `member` with SIGKILL; once this returns its process is dead and reaped
    /// and its ports are closed. Does nothing if it is not running.
    ///
    /// # Panics
    /// If there is no such member.
    pub fn kill(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].child.take() {
            // An error means it has already exited; wait() reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills member `member` if it runs, starts it again on the same ports and data
    /// directory (`--initial-cluster-state existing`) and returns once it answers healthy,
    /// within [`ETCD_READY_TIMEOUT`]. On error the member may be left running; the handle
    /// still kills it on drop.
    ///
    /// # Panics
    /// If there is no such member.
    pub fn restart(&mut self, member: usize) -> Result<(), EtcdError> {
        self.kill(member);
        let log = &self.members[member].log;
        // Only a marker for readers of the log: failing to write it changes nothing.
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(log) {
            let _ = writeln!(file, "--- testkit: restarting etcd member {member} ---");
        }
        self.spawn(member, "existing")?;
        self.wait_healthy(&[member])
    }

    /// The member every running member that answers agrees is the raft leader, found with
    /// `POST /v3/maintenance/status` on each; `None` if none answers, none claims to lead, or
    /// they disagree (an election is under way).
    pub fn leader(&self) -> Option<usize> {
        let statuses = self.statuses();
        let mut claims = statuses.iter().filter(|(_, s)| s.leads());
        let (leader, status) = claims.next()?;
        if claims.next().is_some() {
            return None;
        }
        statuses
            .iter()
            .all(|(_, s)| s.leader == status.member_id)
            .then_some(*leader)
    }

    /// Polls [`leader`](Self::leader) until it names a member (then that member) or `timeout`
    /// has passed (then `None`).
    pub fn wait_leader(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                return Some(leader);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(POLL_INTERVAL.min(deadline - now));
        }
    }

    /// The raft status of every running member that answers, by index.
    fn statuses(&self) -> Vec<(usize, Status)> {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.child.is_some() && !m.tls)
            .filter_map(|(i, m)| Some((i, status(m.client_port)?)))
            .collect()
    }

    /// The last lines of every member's log, each under a header naming the member.
    pub fn logs(&self) -> String {
        (0..self.members.len())
            .map(|i| self.member_log(i))
            .collect()
    }

    fn member_log(&self, i: usize) -> String {
        let member = &self.members[i];
        let text = match std::fs::read(&member.log) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("(cannot read {}: {e})", member.log.display()),
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        format!(
            "--- etcd member {i} ({}, {}): last {} lines of its log ---\n{}\n",
            member.name,
            member.client_url(),
            tail.len(),
            tail.join("\n")
        )
    }

    /// Kills and reaps every member and removes the cluster's directory (what dropping the
    /// handle does).
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            eprintln!("{}--- end of etcd logs ---", self.logs());
        }
    }
}

/// A member's view of raft, from `POST /v3/maintenance/status` (ids as etcd prints them).
#[derive(Debug)]
struct Status {
    member_id: String,
    /// The leader's id; empty or `"0"` when it knows none.
    leader: String,
}

impl Status {
    fn leads(&self) -> bool {
        self.leader == self.member_id
    }
}

/// The raft status of the member listening on `port`, if it answers.
fn status(port: u16) -> Option<Status> {
    let (code, body) = request(port, "POST", "/v3/maintenance/status", "{}").ok()?;
    if code != 200 {
        return None;
    }
    Some(Status {
        member_id: json_string(&body, "member_id")?,
        leader: json_string(&body, "leader").unwrap_or_default(),
    })
}

/// `Ok` if the member whose metrics port is `port` answers `GET /health` with `"health":"true"`;
/// otherwise what it answered, or why it did not.
fn health(port: u16) -> Result<(), String> {
    match request(port, "GET", "/health", "") {
        Ok((200, body)) if body.contains(r#""health":"true""#) => Ok(()),
        Ok((code, body)) => Err(format!("{code} {}", body.trim())),
        Err(e) => Err(e.to_string()),
    }
}

/// The string value of the first `"key":"…"` in compact JSON (as etcd writes it).
fn json_string(json: &str, key: &str) -> Option<String> {
    let start = json.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let len = json[start..].find('"')?;
    Some(json[start..start + len].to_owned())
}

/// One HTTP/1.1 request to 127.0.0.1:`port` on a fresh connection; the status code and body
/// of the answer. Each step is bounded by [`REQUEST_TIMEOUT`]. etcd's answers here are small
/// and sent with a `Content-Length`, so the body is everything after the headers.
fn request(port: u16, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let malformed = || io::Error::new(io::ErrorKind::InvalidData, format!("{answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(malformed)?;
    Ok((code, body.to_owned()))
}

/// `n` distinct ports free on 127.0.0.1 a moment ago (all bound at once, then released).
fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// The first executable file named `etcd` in a directory of `PATH`.
fn find_etcd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|file| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bound on an election after the leader dies: a few election timeouts.
    const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);

    fn started(members: usize) -> EtcdCluster {
        EtcdCluster::start(members).unwrap_or_else(|e| panic!("{e}"))
    }

    fn port(endpoint: &str) -> u16 {
        let port = endpoint.rsplit(':').next().and_then(|p| p.parse().ok());
        port.unwrap_or_else(|| panic!("no port in {endpoint:?}"))
    }

    /// Whether `pid` is gone, or is no longer a process with `dir` on its command line.
    fn gone(pid: u32, dir: &Path) -> bool {
        std::fs::read(format!("/proc/{pid}/cmdline")).map_or(true, |cmdline| {
            !cmdline
                .split(|b| *b == 0)
                .any(|arg| Path::new(std::ffi::OsStr::from_bytes(arg)).starts_with(dir))
        })
    }

    #[test]
    fn single_member_is_healthy_and_keeps_its_data_over_a_restart() {
        let mut cluster = started(1);
        let endpoints = cluster.endpoints();
        assert_eq!(endpoints.len(), 1);
        assert_eq!(cluster.endpoints_csv(), endpoints[0]);
        assert!(endpoints[0].starts_with("http://127.0.0.1:"));
        let client = port(&endpoints[0]);
        assert_eq!(health(client), Ok(()));
        assert_eq!(cluster.leader(), Some(0));

        // Key "berth", value "yes", base64 as the gateway wants them.
        let put = request(
            client,
            "POST",
            "/v3/kv/put",
            r#"{"key":"YmVydGg=","value":"eWVz"}"#,
        );
        assert_eq!(put.map(|(code, _)| code).ok(), Some(200));
        let pid = cluster.pid(0).expect("member 0 runs");
        cluster.kill(0);
        assert!(gone(pid, cluster.dir.path()));
        assert_eq!(cluster.pid(0), None);
        assert!(health(client).is_err());

        cluster.restart(0).unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(cluster.pid(0), Some(pid));
        let (code, body) = request(client, "POST", "/v3/kv/range", r#"{"key":"YmVydGg="}"#)
            .unwrap_or_else(|e| panic!("range: {e}"));
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(r#""value":"eWVz""#), "{body}");
        let log = std::fs::read_to_string(cluster.dir.path().join("m0.log")).unwrap();
        assert!(log.contains("restarting etcd member 0"));
    }

    #[test]
    fn three_members_elect_one_leader_and_another_when_it_dies() {
        let mut cluster = started(3);
        assert_eq!(cluster.endpoints().len(), 3);
        assert_eq!(cluster.endpoints_csv().split(',').count(), 3);
        let statuses = cluster.statuses();
        assert_eq!(statuses.len(), 3);
        let claims: Vec<usize> = statuses
            .iter()
            .filter(|(_, s)| s.leads())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(claims.len(), 1, "{statuses:?}");
        let old = cluster.leader().expect("a leader");
        assert_eq!(claims, [old]);

        cluster.kill(old);
        let killed_at = Instant::now();
        let new = cluster.wait_leader(FAILOVER_TIMEOUT);
        let new = new.unwrap_or_else(|| panic!("no new leader\n{}", cluster.logs()));
        assert_ne!(new, old);
        eprintln!("new leader after {:?}", killed_at.elapsed());

        cluster.restart(old).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cluster.statuses().len(), 3);

        let dir = cluster.dir.path().to_owned();
        let pids: Vec<u32> = (0..3).filter_map(|i| cluster.pid(i)).collect();
        assert_eq!(pids.len(), 3);
        cluster.stop();
        for pid in pids {
            assert!(gone(pid, &dir), "etcd {pid} outlived its cluster");
        }
        assert!(!dir.exists());
    }

    #[test]
    fn no_members_is_refused() {
        assert!(matches!(EtcdCluster::start(0), Err(EtcdError::NoMembers)));
    }
}
