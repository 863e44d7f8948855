//! Specs nested 200,000 levels deep against a real `berth agent`: through the API
//! (`POST /v1/volumes/create`, `POST /v1/jobs`) and through the CLI (`berth volume create`,
//! `berth job run`). Each is answered 400 with `file:line: nesting deeper than 64 levels`, the
//! agent stays up and answers, and nothing was created.

mod agent_support;

use std::{path::Path, process::Output};

use agent_support::{AgentProcess, berth};
use berth_api::{
    Client, ClientError,
    jobs::JobRunRequest,
    volumes::{SpecFormat, VolumeSpecRequest},
};

/// The most bytes of a spec the agent reads (1 MiB): the deep texts stay under it, so it is
/// the depth that refuses them.
use berth_api::volumes::MAX_SPEC_BYTES;

/// The start of a create spec; the deep part follows on line 9.
const SPEC_HEAD: &str = "id = \"deep\"\ntype = \"csi\"\nplugin_id = \"hp\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n# the deep part:\n";
const DEEP_LINE: usize = 9;

/// `n` levels of `open` (then `close`), kept under 1 MiB.
fn deep(lead: &str, open: &str, inner: &str, close: &str, n: usize) -> String {
    let text = format!(
        "{SPEC_HEAD}{lead}{}{inner}{}\n",
        open.repeat(n),
        close.repeat(n)
    );
    assert!(text.len() < MAX_SPEC_BYTES, "{} bytes", text.len());
    text
}

/// Deep volume specs: (file name, format, text, line of the 65th opening).
fn deep_volume_specs() -> Vec<(&'static str, SpecFormat, String, usize)> {
    vec![
        (
            "blocks.hcl",
            SpecFormat::Hcl,
            deep("", "a{\n", "", "}\n", 200_000),
            DEEP_LINE + 64,
        ),
        (
            "objects.hcl",
            SpecFormat::Hcl,
            deep("parameters = ", "{a=", "1", "}", 200_000),
            DEEP_LINE,
        ),
        (
            "templates.hcl",
            SpecFormat::Hcl,
            deep("name = ", "\"${", "1", "}\"", 190_000),
            DEEP_LINE,
        ),
        (
            "arrays.json",
            SpecFormat::Json,
            format!(
                "{{\"id\": \"deep\",\n\"parameters\": {}1{}}}",
                "[".repeat(200_000),
                "]".repeat(200_000)
            ),
            2,
        ),
        (
            "objects.json",
            SpecFormat::Json,
            format!(
                "{{\"id\": \"deep\",\n\"parameters\": {}1{}}}",
                "{\"\":".repeat(190_000),
                "}".repeat(190_000)
            ),
            2,
        ),
    ]
}

/// A job whose `config.args` nests `n` lists, from line 6.
fn deep_job(n: usize) -> String {
    let text = format!(
        "job \"deep\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n        args = {}\"x\"{}\n      }}\n    }}\n  }}\n}}\n",
        "[".repeat(n),
        "]".repeat(n)
    );
    assert!(text.len() < MAX_SPEC_BYTES);
    text
}
const DEEP_JOB_LINE: usize = 7;

/// An agent with no plugin: a spec that got past the parser would fail on its plugin instead.
async fn agent() -> AgentProcess {
    AgentProcess::start("").await
}

/// The agent answers, and holds no volume and no job.
async fn assert_up_and_empty(agent: &AgentProcess, client: &Client) {
    client
        .plugins()
        .await
        .unwrap_or_else(|e| panic!("the agent no longer answers: {e}\n{}", agent.log()));
    let volumes = client.volumes().await.expect("volume list");
    assert!(volumes.volumes.is_empty(), "{volumes:?}");
    let jobs = client.jobs().await.expect("job list");
    assert!(jobs.jobs.is_empty(), "{jobs:?}");
    assert!(!agent.log().contains("overflow"), "{}", agent.log());
}

fn assert_bad_request(r: Result<impl std::fmt::Debug, ClientError>) {
    match r {
        Err(ClientError::Api { status: 400, .. }) => {}
        other => panic!("expected a 400, got {other:?}"),
    }
}

fn assert_400(r: Result<impl std::fmt::Debug, ClientError>, want: &str) {
    match r {
        Err(ClientError::Api {
            status, message, ..
        }) => {
            assert_eq!(status, 400, "{message}");
            assert_eq!(message, want);
        }
        other => panic!("expected a 400 saying {want:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_volume_specs_through_the_api_are_refused_and_the_agent_stays_up() {
    let agent = agent().await;
    let client = agent.client();
    for (file, format, spec, line) in deep_volume_specs() {
        let r = client
            .create_volume(&VolumeSpecRequest {
                spec,
                format,
                file: Some(file.to_string()),
            })
            .await;
        assert_400(r, &format!("{file}:{line}: nesting deeper than 64 levels"));
        assert_up_and_empty(&agent, &client).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_at_the_limit_or_deep_in_other_ways_do_not_take_the_agent_down() {
    let agent = agent().await;
    let client = agent.client();
    for spec in [
        // 64 levels: parsed, then refused by the checker.
        deep("", "a{\n", "", "}\n", 64),
        deep("parameters = ", "{a=", "1", "}", 64),
        deep("parameters = ", "[", "1", "]", 64),
        deep("name = ", "\"${", "1", "}\"", 64),
        // Operators nest in the parser without brackets: hcl refuses them itself.
        deep("name = ", "!", "true", "", 200_000),
        deep("name = ", "- ", "1", "", 200_000),
        deep("name = ", "a ? 1 : ", "1", "", 100_000),
        // Braces the depth check reads as a comment, but the outline of Nomad's HCL1 forms
        // reads as blocks.
        format!(
            "{SPEC_HEAD}x = \"${{ /* }}\"\n{} */ }}\"\n",
            "a{".repeat(200_000)
        ),
    ] {
        let r = client
            .create_volume(&VolumeSpecRequest {
                spec,
                format: SpecFormat::Hcl,
                file: Some("limit.hcl".into()),
            })
            .await;
        assert_bad_request(r);
        assert_up_and_empty(&agent, &client).await;
    }
    let r = client
        .run_job(&JobRunRequest {
            spec: deep_job(64),
            format: SpecFormat::Hcl,
            file: Some("limit.hcl".into()),
            ..Default::default()
        })
        .await;
    assert_bad_request(r);
    assert_up_and_empty(&agent, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_jobs_through_the_api_are_refused_and_the_agent_stays_up() {
    let agent = agent().await;
    let client = agent.client();
    let r = client
        .run_job(&JobRunRequest {
            spec: deep_job(200_000),
            format: SpecFormat::Hcl,
            file: Some("deep-job.hcl".into()),
            ..Default::default()
        })
        .await;
    assert_400(
        r,
        &format!("deep-job.hcl:{DEEP_JOB_LINE}: nesting deeper than 64 levels"),
    );
    assert_up_and_empty(&agent, &client).await;
}

fn assert_cli_refused(out: &Output, file: &Path, line: usize) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:{line}: nesting deeper than 64 levels",
            file.display()
        )),
        "{stderr}"
    );
    assert!(stderr.len() < 2000, "{} bytes of error", stderr.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_files_through_the_cli_are_refused_and_the_agent_stays_up() {
    let agent = agent().await;
    let client = agent.client();
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, _, spec, line) in deep_volume_specs() {
        let file = dir.path().join(name);
        std::fs::write(&file, &spec).expect("write spec");
        let out = berth(
            &agent,
            &["volume", "create", file.to_str().expect("utf-8 path")],
        )
        .await;
        assert_cli_refused(&out, &file, line);
        assert_up_and_empty(&agent, &client).await;
    }
    let file = dir.path().join("deep-job.hcl");
    std::fs::write(&file, deep_job(200_000)).expect("write job");
    let out = berth(&agent, &["job", "run", file.to_str().expect("utf-8 path")]).await;
    assert_cli_refused(&out, &file, DEEP_JOB_LINE);
    assert_up_and_empty(&agent, &client).await;
}
