//! Job helpers shared by the tests that run jobs on a real agent.

use std::{path::Path, time::Duration};

use berth_api::{
    Client, ClientError,
    jobs::{AllocStatus, ClientStatus, JobRunRequest, JobStatus},
    volumes::{SpecFormat, VolumeSpecRequest},
};

use super::AgentProcess;

/// The volume RPCs of a claim and a release, in their order.
pub const VOLUME_RPCS: [&str; 6] = [
    "ControllerPublishVolume",
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "ControllerUnpublishVolume",
];

/// A job with one exec task that mounts volume `source` (single-node-writer) at `dest` and
/// runs `script` with `sh -c` (`$0` is `dest`).
pub fn volume_job(id: &str, job_type: &str, source: &str, dest: &Path, script: &str) -> String {
    format!(
        r#"
job "{id}" {{
  type = "{job_type}"
  group "g" {{
    volume "data" {{
      type        = "csi"
      source      = "{source}"
      access_mode = "single-node-writer"
    }}
    task "main" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}", "{dest}"]
      }}
      volume_mount {{
        volume      = "data"
        destination = "{dest}"
      }}
      kill_timeout = "2s"
    }}
  }}
}}
"#,
        dest = dest.display()
    )
}

/// `job run` of HCL `text`, named `job.hcl` in errors.
pub async fn run_job(client: &Client, text: String) -> Result<JobStatus, ClientError> {
    client
        .run_job(&JobRunRequest {
            spec: text,
            format: SpecFormat::Hcl,
            file: Some("job.hcl".into()),
            ..Default::default()
        })
        .await
}

/// Creates a 10 MiB single-node-writer volume `id` of `plugin`; its external id.
pub async fn create_volume(client: &Client, plugin: &str, id: &str) -> String {
    let spec = format!(
        "id = \"{id}\"\ntype = \"csi\"\nplugin_id = \"{plugin}\"\ncapacity_min = \"10MiB\"\n\
         capability {{\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}}\n"
    );
    client
        .create_volume(&VolumeSpecRequest {
            spec,
            format: SpecFormat::Hcl,
            file: None,
        })
        .await
        .expect("create volume")
        .external_id
}

/// Polls job `id` until `pred` holds (at most 30 s; the failure shows the agent's log).
pub async fn wait_job(
    agent: &AgentProcess,
    id: &str,
    pred: impl Fn(&JobStatus) -> bool,
) -> JobStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    wait_job_before(agent, id, deadline, pred).await
}

/// Polls job `id` until `pred` holds; panics (with the job and the agent's log) when
/// `deadline` passes first.
pub async fn wait_job_before(
    agent: &AgentProcess,
    id: &str,
    deadline: tokio::time::Instant,
    pred: impl Fn(&JobStatus) -> bool,
) -> JobStatus {
    let what = format!("job {id}");
    // In a fleet, a job run through another agent reaches this one's view a moment later:
    // until then it is not found here.
    let fetch = |c: Client| async move {
        match c.job(id).await {
            Ok(s) => Some(s),
            Err(e) if e.is_not_found() => None,
            Err(e) => panic!("job status: {e:?}"),
        }
    };
    let found = super::poll_api(agent, &what, deadline, fetch, |s| {
        s.as_ref().is_some_and(&pred)
    });
    found.await.expect("the predicate held for a status")
}

/// Polls the first alloc of job `id` until `pred` holds (at most 30 s).
pub async fn wait_alloc(
    agent: &AgentProcess,
    id: &str,
    pred: impl Fn(&AllocStatus) -> bool,
) -> AllocStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    wait_alloc_before(agent, id, deadline, pred).await
}

/// Polls the first alloc of job `id` until `pred` holds; panics when `deadline` passes first.
pub async fn wait_alloc_before(
    agent: &AgentProcess,
    id: &str,
    deadline: tokio::time::Instant,
    pred: impl Fn(&AllocStatus) -> bool,
) -> AllocStatus {
    let s = wait_job_before(agent, id, deadline, |s| s.allocs.first().is_some_and(&pred)).await;
    s.allocs[0].clone()
}

/// Runs batch job `text` (id `id`) and waits until its alloc completed.
pub async fn run_to_completion(agent: &AgentProcess, id: &str, text: String) -> AllocStatus {
    run_job(&agent.client(), text).await.expect("job run");
    let done = wait_alloc(agent, id, |a| a.client_status.is_terminal()).await;
    assert_eq!(done.client_status, ClientStatus::Complete, "{done:#?}");
    done
}
