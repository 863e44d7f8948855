//! The csi hook (claims with retries, failures) and volume mounts into exec tasks.

mod common;

use berth_allocrunner::{AllocRunner, ClientStatus, EventKind, TaskRunState, VolumeCall};
use berth_csi::model::AccessMode;
use common::*;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_claim_failures_are_retried_then_the_claim_succeeds() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "retry" {
  type = "batch"
  group "g" {
    count = 2
    volume "data" {
      type        = "csi"
      source      = "vol-r"
      access_mode = "single-node-writer"
      per_alloc   = true
      mount_options {
        fs_type     = "ext4"
        mount_flags = ["noatime", "secret-flag-xyz"]
      }
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#);
    node.volumes
        .fail_claims("vol-r[1]", 2, true, "plugin unavailable");
    let spec = berth_allocrunner::AllocSpec::from_job(&job, "g", "retry-1", 1).expect("spec");
    let runner = AllocRunner::new(spec, node.deps()).expect("runner");
    reaper.watch(&runner);
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Complete
    );

    let calls = node.volumes.calls();
    let claims: Vec<_> = calls.iter().filter(|c| c.is_claim()).collect();
    assert_eq!(claims.len(), 3);
    let VolumeCall::Claim {
        volume_id, usage, ..
    } = claims[2]
    else {
        unreachable!()
    };
    assert_eq!(volume_id, "vol-r[1]");
    assert_eq!(usage.access_mode, AccessMode::SingleNodeWriter);
    assert_eq!(usage.mount_options.fs_type, "ext4");
    assert_eq!(
        usage.mount_options.mount_flags.expose(),
        ["noatime", "secret-flag-xyz"]
    );
    assert!(
        matches!(calls.last(), Some(VolumeCall::Release { volume_id, .. }) if volume_id == "vol-r[1]")
    );

    let status = runner.status();
    let retries: Vec<&str> = status
        .events_of(None)
        .filter(|e| e.kind == EventKind::VolumeClaimRetrying)
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(retries.len(), 2);
    assert!(
        retries[0].starts_with(
            "claim of volume data (vol-r[1]) failed (attempt 1 of 5): plugin unavailable; retrying in"
        ),
        "{}",
        retries[0]
    );
    assert!(retries[1].contains("attempt 2 of 5"), "{}", retries[1]);
    assert!(in_order(
        &kinds(&status, None),
        &[
            EventKind::VolumeClaimRetrying,
            EventKind::VolumeClaimRetrying,
            EventKind::VolumeClaimed,
            EventKind::VolumeReleased,
            EventKind::AllocComplete
        ]
    ));
    // Mount flags never show in events, status or Debug.
    let shown = format!(
        "{} {status:?} {:?}",
        serde_json::to_string(&status).expect("json"),
        runner.record()
    );
    assert!(!shown.contains("secret-flag-xyz"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_claim_fails_the_alloc_and_releases_what_was_claimed() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "refused" {
  group "g" {
    volume "a" {
      type        = "csi"
      source      = "vol-ok"
      access_mode = "single-node-writer"
    }
    volume "b" {
      type        = "csi"
      source      = "vol-bad"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#);
    node.volumes
        .fail_claims("vol-bad", 1, false, "volume vol-bad is not registered");
    let runner = AllocRunner::new(alloc(&job, "refused-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Failed
    );

    let calls: Vec<(bool, String)> = node
        .volumes
        .calls()
        .iter()
        .map(|c| (c.is_claim(), c.volume_id().to_owned()))
        .collect();
    assert_eq!(
        calls,
        [
            (true, "vol-ok".to_owned()),
            (true, "vol-bad".to_owned()),
            (false, "vol-ok".to_owned())
        ]
    );
    assert!(node.volumes.held().is_empty());
    let status = runner.status();
    let expected = "claim of volume b (vol-bad) was refused: volume vol-bad is not registered";
    assert_eq!(status.failure.as_deref(), Some(expected));
    let failed = status
        .events_of(None)
        .find(|e| e.kind == EventKind::VolumeClaimFailed)
        .expect("claim failed event");
    assert_eq!(failed.message, expected);
    assert_eq!(
        status.events.last().map(|e| (e.kind, e.message.as_str())),
        Some((EventKind::AllocFailed, expected))
    );
    // The task never started.
    let task = &status.tasks["t"];
    assert_eq!(task.state, TaskRunState::Dead);
    assert_eq!(task.started_at, None);
    assert!(!kinds(&status, Some("t")).contains(&EventKind::Started));
    assert!(!status.volumes["a"].claimed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_fail_the_alloc() {
    let node = Node::new();
    let job = job(r#"
job "busy" {
  group "g" {
    volume "a" {
      type        = "csi"
      source      = "vol-busy"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#);
    node.volumes.fail_claims("vol-busy", 10, true, "still busy");
    let runner = AllocRunner::new(alloc(&job, "busy-0"), node.deps()).expect("runner");
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Failed
    );
    assert_eq!(node.volumes.claim_count(), 5);
    assert_eq!(
        runner.status().failure.as_deref(),
        Some("claim of volume a (vol-busy) failed 5 times, the last time with: still busy")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_claim_retries_ends_the_alloc_without_starting_tasks() {
    let node = Node::new();
    let job = job(r#"
job "slow" {
  group "g" {
    volume "a" {
      type        = "csi"
      source      = "vol-slow"
      access_mode = "single-node-writer"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
    }
  }
}
"#);
    node.volumes.fail_claims("vol-slow", 100, true, "not yet");
    let mut deps = node.deps();
    deps.config.claim_retry.attempts = 1000;
    deps.config.claim_retry.initial = std::time::Duration::from_secs(3600);
    deps.config.claim_retry.max = std::time::Duration::from_secs(3600);
    let runner = AllocRunner::new(alloc(&job, "slow-0"), deps).expect("runner");
    let run = spawn_run(&runner, &CancellationToken::new());
    wait_status(&runner, "a claim retry", |s| {
        kinds(s, None).contains(&EventKind::VolumeClaimRetrying)
    })
    .await;
    runner.stop();
    assert_eq!(finished(run).await.expect("run"), ClientStatus::Complete);
    let status = runner.status();
    assert_eq!(status.tasks["t"].started_at, None);
    assert_eq!(node.volumes.claim_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_task_writes_through_a_bind_mounted_volume_and_a_read_only_mount_refuses_writes() {
    let node = Node::new();
    let reaper = Reaper::default();
    let root = node.path().to_path_buf();
    let data_target = root.join("targets/data");
    let ro_target = root.join("targets/ro");
    node.volumes.set_target("vol-data", &data_target);
    node.volumes.set_target("vol-ro", &ro_target);
    let data_mnt = root.join("mnt/data");
    let ro_mnt = root.join("mnt/ro");
    let script = format!(
        "echo hello > {d}/hello.txt && echo wrote-data; \
         if echo x > {r}/nope.txt 2>/dev/null; then echo wrote-ro; else echo refused-ro; fi; \
         grep -q ' {d} ' /proc/self/mountinfo && echo mounted-data",
        d = data_mnt.display(),
        r = ro_mnt.display()
    );
    let job = job(&format!(
        r#"
job "exec" {{
  type = "batch"
  group "g" {{
    volume "data" {{
      type        = "csi"
      source      = "vol-data"
      access_mode = "single-node-writer"
    }}
    volume "ro" {{
      type        = "csi"
      source      = "vol-ro"
      access_mode = "single-node-reader-only"
      read_only   = true
    }}
    task "writer" {{
      driver = "exec"
      # The fake volumes are directories of root's, 0700.
      user   = "root"
      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}
      volume_mount {{
        volume      = "data"
        destination = "{data}"
      }}
      volume_mount {{
        volume      = "ro"
        destination = "{ro}"
      }}
    }}
  }}
}}
"#,
        data = data_mnt.display(),
        ro = ro_mnt.display(),
    ));
    let runner = AllocRunner::new(alloc(&job, "exec-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    let status = runner.run(CancellationToken::new()).await.expect("run");
    let stdout = read(runner.alloc_dir().join("logs/writer.stdout"));
    let stderr = read(runner.alloc_dir().join("logs/writer.stderr"));
    assert_eq!(
        status,
        ClientStatus::Complete,
        "stdout {stdout:?} stderr {stderr:?} events {:#?}",
        runner.status().events
    );
    assert_eq!(
        stdout, "wrote-data\nrefused-ro\nmounted-data\n",
        "stderr {stderr:?}"
    );
    // The write went through the mount into the volume's target, not into the host's
    // mount point (the mount lived only in the task's namespace).
    assert_eq!(read(data_target.join("hello.txt")), "hello\n");
    assert!(!data_mnt.join("hello.txt").exists());
    assert!(!ro_target.join("nope.txt").exists());
    let claims: Vec<bool> = node
        .volumes
        .calls()
        .iter()
        .filter_map(|c| match c {
            VolumeCall::Claim { usage, .. } => Some(usage.read_only),
            VolumeCall::Release { .. } => None,
        })
        .collect();
    assert_eq!(claims, [false, true]);
    let status = runner.status();
    assert!(status.volumes["ro"].read_only);
    assert!(node.volumes.held().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_exec_cannot_mount_volumes_and_says_so() {
    let node = Node::new();
    let reaper = Reaper::default();
    let job = job(r#"
job "nomount" {
  type = "batch"
  group "g" {
    volume "data" {
      type        = "csi"
      source      = "vol-x"
      access_mode = "single-node-writer"
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/true"
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
    }
  }
}
"#);
    let runner = AllocRunner::new(alloc(&job, "nomount-0"), node.deps()).expect("runner");
    reaper.watch(&runner);
    assert_eq!(
        runner.run(CancellationToken::new()).await.expect("run"),
        ClientStatus::Failed
    );
    let status = runner.status();
    let failed = status
        .events_of(Some("t"))
        .find(|e| e.kind == EventKind::StartFailed)
        .expect("start failed");
    assert!(failed.message.contains("bind mounts"), "{}", failed.message);
    assert_eq!(
        kinds(&status, Some("t")),
        [EventKind::StartFailed, EventKind::NotRestarting]
    );
    assert!(node.volumes.held().is_empty());
}
