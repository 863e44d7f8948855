//! `berth csi` against the real berth-hostpath process: output, exit codes, bad input that
//! changes nothing, and secrets that are never echoed.

use std::{path::Path, process::Output};

use berth_testkit::HostpathPlugin;

const SECRET: &str = "cli-secret-0a9b8c";

fn berth(endpoint: &str, args: &[&str]) -> Output {
    berth_with_stdin(endpoint, args, b"")
}

fn berth_with_stdin(endpoint: &str, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("csi")
        .args(["--endpoint", endpoint])
        .args(args)
        .env_remove("CSI_ENDPOINT")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run berth");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("berth output")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{:?}", text(o));
    serde_json::from_slice(&o.stdout).expect("json output")
}

/// The plugin's whole persisted state and volume dirs, to show a command changed nothing.
fn snapshot_state(statedir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![statedir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.push((p.display().to_string(), Vec::new()));
                stack.push(p);
            } else {
                out.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn info_create_list_delete_in_tables_and_json() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let ep = plugin.endpoint();

    let o = berth(&ep, &["info"]);
    let (out, _) = text(&o);
    assert!(
        o.status.success() && out.contains("hostpath.csi.berth.dev"),
        "{out}"
    );
    let info = json(&berth(&ep, &["--json", "info"]));
    assert_eq!(info["name"], "hostpath.csi.berth.dev");

    let caps = json(&berth(&ep, &["--json", "capabilities"]));
    assert_eq!(caps["plugin"]["controller_service"], true);
    assert!(
        caps["node"]
            .as_array()
            .expect("node caps")
            .iter()
            .any(|c| c == "stage-unstage-volume")
    );

    let created = json(&berth(
        &ep,
        &[
            "--json",
            "volume",
            "create",
            "--name",
            "cli-vol",
            "--required-bytes",
            "1048576",
            "--secret",
            &format!("password={SECRET}"),
        ],
    ));
    let id = created["external_id"]
        .as_str()
        .expect("external_id")
        .to_string();
    let o = berth(&ep, &["volume", "list"]);
    let (out, _) = text(&o);
    assert!(out.starts_with("EXTERNAL ID") && out.contains(&id), "{out}");

    let o = berth(&ep, &["volume", "delete", &id]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = berth(&ep, &["volume", "delete", &id]);
    assert!(o.status.success(), "deleting twice is fine: {:?}", text(&o));
    assert_eq!(
        json(&berth(&ep, &["--json", "volume", "list"]))["entries"],
        serde_json::json!([])
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let ep = plugin.endpoint();
    json(&berth(
        &ep,
        &["--json", "volume", "create", "--name", "keep"],
    ));
    let before = snapshot_state(plugin.statedir());

    let long = format!("unix:///{}", "s".repeat(120));
    let missing = format!("unix://{}", plugin.tmp().join("missing.sock").display());
    let not_socket = format!("unix://{}", plugin.statedir().join("state.json").display());
    // (endpoint, args, exit code, what the message must name)
    let cases: Vec<(&str, Vec<&str>, i32, &str)> = vec![
        (&long, vec!["probe"], 2, "107 bytes"),
        (&missing, vec!["probe"], 1, "does not exist"),
        (&not_socket, vec!["probe"], 1, "not a unix socket"),
        (
            &ep,
            vec![
                "volume",
                "create",
                "--name",
                "x",
                "--access-mode",
                "single-node-everything",
            ],
            2,
            "--access-mode",
        ),
        (&ep, vec!["volume", "delete", ""], 2, "<EXTERNAL_ID>"),
        (
            &ep,
            vec!["node", "stage", "", "--staging-path", "/tmp/x"],
            2,
            "<EXTERNAL_ID>",
        ),
        (
            &ep,
            vec![
                "volume",
                "create",
                "--name",
                "x",
                "--block",
                "--fs-type",
                "ext4",
            ],
            2,
            "--fs-type",
        ),
        (
            &ep,
            vec!["volume", "create", "--name", "x", "--secret", "novalue"],
            2,
            "KEY=VALUE",
        ),
        (&ep, vec!["volume", "create", "--name", ""], 1, "name"),
    ];
    for (endpoint, args, code, needle) in cases {
        let o = berth(endpoint, &args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {out} {err}");
        assert!(
            err.contains(needle),
            "{args:?}: stderr must name {needle:?}: {err}"
        );
        assert_eq!(
            snapshot_state(plugin.statedir()),
            before,
            "{args:?} changed the plugin's state"
        );
    }
    assert!(!plugin.tmp().join("missing.sock").exists());
}

#[tokio::test]
async fn secrets_and_mount_flags_are_never_echoed() {
    let plugin = HostpathPlugin::builder().spawn().await;
    let ep = plugin.endpoint();
    let secrets_file = plugin.tmp().join("secrets.json");
    std::fs::write(&secrets_file, format!(r#"{{"token": "{SECRET}"}}"#)).expect("write");
    let flag = "uid=cli-flag-77";
    let runs = [
        berth(
            &ep,
            &[
                "volume",
                "create",
                "--name",
                "s",
                "--secret",
                &format!("password={SECRET}"),
                "--mount-flag",
                flag,
            ],
        ),
        berth(
            &ep,
            &[
                "--json",
                "volume",
                "create",
                "--name",
                "s",
                "--secrets-file",
                secrets_file.to_str().expect("utf8"),
            ],
        ),
        // Secrets from standard input.
        berth_with_stdin(
            &ep,
            &[
                "--json",
                "volume",
                "create",
                "--name",
                "t",
                "--secrets-file",
                "-",
            ],
            format!("token={SECRET}\n").as_bytes(),
        ),
        // A failing call with secrets attached: unknown volume.
        berth(
            &ep,
            &[
                "--log-level",
                "trace",
                "controller",
                "publish",
                "nope",
                "--node-id",
                "n",
                "--secret",
                &format!("p={SECRET}"),
                "--mount-flag",
                flag,
            ],
        ),
        // A malformed secrets file: the error names the file and line, not the values.
        {
            let bad = plugin.tmp().join("bad.json");
            std::fs::write(&bad, format!("{{\"token\": \"{SECRET}\",\n oops}}")).expect("write");
            berth(
                &ep,
                &[
                    "volume",
                    "create",
                    "--name",
                    "s",
                    "--secrets-file",
                    bad.to_str().expect("utf8"),
                ],
            )
        },
    ];
    for o in &runs {
        let (out, err) = text(o);
        assert!(
            !out.contains(SECRET) && !err.contains(SECRET),
            "secret echoed: {out} {err}"
        );
        assert!(
            !out.contains(flag) && !err.contains(flag),
            "mount flag echoed: {out} {err}"
        );
    }
    assert!(runs[0].status.success(), "{:?}", text(&runs[0]));
    assert!(runs[1].status.success(), "{:?}", text(&runs[1]));
    assert!(runs[2].status.success(), "{:?}", text(&runs[2]));
    assert_eq!(runs[3].status.code(), Some(1));
    assert_eq!(runs[4].status.code(), Some(2));
    assert!(
        text(&runs[4]).1.contains("bad.json:2"),
        "{:?}",
        text(&runs[4])
    );
}
