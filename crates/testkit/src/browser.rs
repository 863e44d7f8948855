//! A headless Chromium driven over WebDriver, for tests of the web UI: Debian's `chromium` and
//! `chromium-driver` (chromedriver), talked to with `fantoccini`.
//!
//! [`Browser::start`] runs chromedriver on a free loopback port, in a process group of its own
//! and marked in its environment (which Chromium inherits), and opens a headless session with a
//! profile in a temporary directory. Dropping the [`Browser`] kills chromedriver, Chromium and
//! every process they started, and removes the profile, whether the test passed or not.

use std::{
    collections::BTreeMap,
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, wd::WebDriverCompatibleCommand};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::{
    sys::signal::{Signal, killpg},
    unistd::Pid,
};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::POLL_INTERVAL;

/// What a test that needs the browser and does not find it is told to do.
pub const BROWSER_SETUP_HINT: &str = "the web UI's tests need Debian's chromium and \
     chromium-driver: run ./scripts/test (or ./scripts/dev) as root, which installs what is \
     missing through scripts/setup.sh, or `apt-get install chromium chromium-driver`";

/// How long [`Browser::start`] waits for chromedriver to listen.
pub const DRIVER_READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The environment variable that marks chromedriver and every process it starts with the
/// browser's temporary directory, so [`Browser`]'s drop finds them all.
const MARK_VAR: &str = "BERTH_TEST_BROWSER_DIR";

/// The window the session opens (screenshots have this size).
pub const WINDOW: (u32, u32) = (1280, 900);

/// Why the browser could not be started.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// `chromium` or `chromedriver` is not installed.
    #[error("{program} is not on PATH: {BROWSER_SETUP_HINT}")]
    Missing {
        /// The program looked for.
        program: &'static str,
    },
    /// The temporary directory could not be made.
    #[error("cannot make the browser's temporary directory")]
    TempDir(#[source] io::Error),
    /// chromedriver could not be run.
    #[error("cannot run {}", path.display())]
    Spawn {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// chromedriver exited or did not listen in time, on every port tried.
    #[error("chromedriver did not start on 127.0.0.1:{port}: {why}; its log:\n{log}")]
    NotReady {
        /// The last port tried.
        port: u16,
        /// What happened.
        why: String,
        /// What chromedriver wrote.
        log: String,
    },
    /// chromedriver refused to open a session (Chromium failed to start).
    #[error("chromedriver could not open a headless Chromium session; its log:\n{log}")]
    Session {
        /// What chromedriver wrote.
        log: String,
        /// Why.
        #[source]
        source: fantoccini::error::NewSessionError,
    },
}

/// A request the page made, as Chromium's network log saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// Its URL.
    pub url: String,
    /// Its headers, names in lower case (what the page set and what Chromium added on the
    /// wire).
    pub headers: BTreeMap<String, String>,
}

/// A headless Chromium session; see the [module docs](self).
#[derive(Debug)]
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    dir: TempDir,
}

impl Browser {
    /// Starts chromedriver and opens a headless session (`--headless=new --no-sandbox
    /// --disable-gpu --disable-dev-shm-usage`, a fresh profile, no network beyond what the page
    /// asks for). Fails with [`BrowserError::Missing`] (which says to run the setup script)
    /// when Chromium or chromedriver is not installed.
    pub async fn start() -> Result<Browser, BrowserError> {
        let chromium = find_program("chromium").ok_or(BrowserError::Missing {
            program: "chromium",
        })?;
        let chromedriver = find_program("chromedriver").ok_or(BrowserError::Missing {
            program: "chromedriver",
        })?;
        let dir = tempfile::Builder::new()
            .prefix("berth-browser")
            .tempdir()
            .map_err(BrowserError::TempDir)?;
        let (driver, port) = start_driver(&chromedriver, dir.path())?;
        // From here on, dropping `browser` kills chromedriver and whatever it started.
        let mut browser = Browser {
            client: None,
            driver,
            dir,
        };
        let profile = browser.dir.path().join("profile");
        let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={},{}", WINDOW.0, WINDOW.1),
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-breakpad",
                    "--disable-crash-reporter",
                    "--disable-default-apps",
                    "--metrics-recording-only",
                    "--password-store=basic",
                ],
            },
            "goog:loggingPrefs": { "performance": "ALL" },
        }))
        .expect("capabilities are a JSON object");
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .map_err(|source| BrowserError::Session {
                log: browser.driver_log(),
                source,
            })?;
        browser.client = Some(client);
        Ok(browser)
    }

    /// The WebDriver client.
    pub fn client(&self) -> &Client {
        self.client.as_ref().expect("a session is open")
    }

    /// Runs `script` (a function body: `return …`) in the page and returns its value.
    ///
    /// # Panics
    /// If the script throws or the session is gone.
    pub async fn eval(&self, script: &str) -> Value {
        self.client()
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` (a function body) every [`POLL_INTERVAL`] until it returns something
    /// other than `null`, `undefined` or `false`, and returns that. Panics, naming `what` and
    /// showing the page's text and the script's last value, once `timeout` has passed.
    pub async fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let got = self.client().execute(script, Vec::new()).await;
            match &got {
                Ok(Value::Null | Value::Bool(false)) | Err(_) => {}
                Ok(v) => return v.clone(),
            }
            if tokio::time::Instant::now() >= deadline {
                let text = self
                    .client()
                    .execute(
                        "return document.body ? document.body.innerText : ''",
                        vec![],
                    )
                    .await
                    .map(|v| v.as_str().unwrap_or_default().to_owned())
                    .unwrap_or_default();
                let url = self
                    .client()
                    .current_url()
                    .await
                    .map(|u| u.to_string())
                    .unwrap_or_default();
                panic!(
                    "not true within {timeout:?}: {what}\nlast value: {got:?}\npage {url}:\n{text}"
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Writes a PNG screenshot of the window to `path` (creating its directory); returns its
    /// size in bytes.
    ///
    /// # Panics
    /// If the screenshot or the write fails.
    pub async fn screenshot(&self, path: &Path) -> usize {
        let png = self.client().screenshot().await.expect("screenshot");
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::write(path, &png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        png.len()
    }

    /// The requests the page sent since the last call, from Chromium's network log (the
    /// headers it put on the wire, not what the page's script says it set).
    ///
    /// # Panics
    /// If chromedriver does not hand out the log.
    pub async fn requests(&self) -> Vec<SeenRequest> {
        let log = self
            .client()
            .issue_cmd(GetLog("performance"))
            .await
            .expect("chromedriver's performance log");
        let mut by_id: BTreeMap<String, SeenRequest> = BTreeMap::new();
        let mut order = Vec::new();
        for entry in log.as_array().into_iter().flatten() {
            let Some(message) = entry
                .get("message")
                .and_then(Value::as_str)
                .and_then(|m| serde_json::from_str::<Value>(m).ok())
            else {
                continue;
            };
            let inner = &message["message"];
            let params = &inner["params"];
            let Some(id) = params["requestId"].as_str() else {
                continue;
            };
            let headers = match inner["method"].as_str() {
                Some("Network.requestWillBeSent") => &params["request"]["headers"],
                Some("Network.requestWillBeSentExtraInfo") => &params["headers"],
                _ => continue,
            };
            let seen = by_id.entry(id.to_owned()).or_insert_with(|| {
                order.push(id.to_owned());
                SeenRequest {
                    url: String::new(),
                    headers: BTreeMap::new(),
                }
            });
            if let Some(url) = params["request"]["url"].as_str() {
                seen.url = url.to_owned();
            }
            for (k, v) in headers.as_object().into_iter().flatten() {
                if let Some(v) = v.as_str() {
                    seen.headers.insert(k.to_ascii_lowercase(), v.to_owned());
                }
            }
        }
        order
            .into_iter()
            .filter_map(|id| by_id.remove(&id))
            .filter(|r| !r.url.is_empty())
            .collect()
    }

    /// Ends the session, then stops chromedriver and Chromium as drop does.
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.close().await;
        }
    }

    fn driver_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("chromedriver.log")).unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group first (chromedriver, Chromium and its helpers), then anything that
        // left the group but still carries the mark.
        let group = i32::try_from(self.driver.id()).ok().map(Pid::from_raw);
        if let Some(group) = group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        crate::kill_marked(MARK_VAR, self.dir.path());
        // Wait (bounded) until the group is gone, so nothing writes into the profile while
        // the temporary directory is removed.
        if let Some(group) = group {
            let deadline = Instant::now() + crate::KILL_WAIT;
            while group_alive(group) && Instant::now() < deadline {
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }
}

/// Whether any process (a zombie not yet reaped included) is left in process group `group`.
fn group_alive(group: Pid) -> bool {
    killpg(group, None::<Signal>).is_ok()
}

/// `POST /session/{id}/se/log`: chromedriver's log of the given type (entries since the last
/// read).
#[derive(Debug)]
struct GetLog(&'static str);

impl WebDriverCompatibleCommand for GetLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (hyper::Method, Option<String>) {
        (
            hyper::Method::POST,
            Some(json!({ "type": self.0 }).to_string()),
        )
    }
}

/// The first executable file named `name` in a directory of `PATH`.
fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A loopback port nobody listens on now.
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// Runs chromedriver on a free port (another one when the port was taken meanwhile) and waits
/// until it listens.
fn start_driver(chromedriver: &Path, dir: &Path) -> Result<(Child, u16), BrowserError> {
    let log_path = dir.join("chromedriver.log");
    let mut last = None;
    for _ in 0..3 {
        let port = free_port().map_err(|source| BrowserError::Spawn {
            path: chromedriver.to_owned(),
            source,
        })?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log_path.display()))
            .env(MARK_VAR, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|source| BrowserError::Spawn {
            path: chromedriver.to_owned(),
            source,
        })?;
        let deadline = Instant::now() + DRIVER_READY_TIMEOUT;
        let why = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break format!("it exited ({status})");
            }
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok((child, port));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break format!("it did not listen within {DRIVER_READY_TIMEOUT:?}");
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        last = Some((port, why));
    }
    let (port, why) = last.expect("tried at least once");
    Err(BrowserError::NotReady {
        port,
        why,
        log: std::fs::read_to_string(&log_path).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_page_is_driven_and_nothing_outlives_the_browser() {
        let b = Browser::start().await.unwrap_or_else(|e| panic!("{e}"));
        b.client()
            .goto("data:text/html,<p id=x>hi</p>")
            .await
            .expect("open a page");
        let text = b
            .wait_for(
                "the paragraph",
                Duration::from_secs(10),
                "const p = document.getElementById('x'); return p && p.textContent;",
            )
            .await;
        assert_eq!(text, Value::from("hi"));
        let png = b.dir.path().join("shot.png");
        assert!(b.screenshot(&png).await > 0);
        let group = Pid::from_raw(i32::try_from(b.driver.id()).expect("pid"));
        let dir = b.dir.path().to_owned();
        let profile_users = || {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                        c.windows(dir.as_os_str().len())
                            .any(|w| w == dir.as_os_str().as_encoded_bytes())
                    })
                })
                .count()
        };
        assert!(group_alive(group));
        assert!(profile_users() > 0, "Chromium runs with its profile");
        drop(b);
        assert!(!group_alive(group), "a process of the browser is left");
        assert_eq!(profile_users(), 0, "a process of the browser is left");
        assert!(!dir.exists(), "{} is left", dir.display());
    }
}
