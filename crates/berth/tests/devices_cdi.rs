//! CDI devices named in a job: resolved from the CDI spec directories into the task's env,
//! device nodes and mounts; a malformed spec is reported with its file and field and changes
//! nothing.

mod agent_support;

use std::{path::Path, time::Duration};

use agent_support::{
    AgentProcess, client_config,
    devices::{device_job, wait_node},
    hostpath_config,
    jobs::{create_volume, run_job, wait_alloc},
};
use berth_api::jobs::ClientStatus;

fn config() -> String {
    format!(
        "{}{}devices {{\n  kubernetes    = false\n  cdi_spec_dirs = [\"@TMP@/cdi-vendor\", \"@TMP@/cdi\"]\n}}\n",
        hostpath_config("hostpath", &[]),
        client_config("")
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdi_device_reaches_the_task_and_a_malformed_spec_changes_nothing() {
    let agent = AgentProcess::start_in_namespace(&config()).await;
    agent
        .wait_plugin("hostpath", Duration::from_secs(20), |p| p.health.healthy)
        .await;
    let tmp = agent.tmp.path();
    let node = tmp.join("nodes/example0");
    berth_testkit::mknod_char(&node, 1, 9);
    let libs = tmp.join("example-libs");
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::write(libs.join("libexample.so"), b"not really a library").unwrap();
    std::fs::create_dir_all(tmp.join("cdi")).unwrap();
    std::fs::create_dir_all(tmp.join("cdi-vendor")).unwrap();
    // The vendor's spec says dev0's env is "old"; the later directory's spec wins.
    let spec = |env: &str| {
        format!(
            r#"{{
  "cdiVersion": "0.6.0",
  "kind": "example.com/device",
  "containerEdits": {{"env": ["EXAMPLE_VENDOR=berth"]}},
  "devices": [
    {{
      "name": "dev0",
      "containerEdits": {{
        "env": ["EXAMPLE_DEVICE={env}"],
        "deviceNodes": [{{"path": "/dev/example0", "hostPath": "{}"}}],
        "mounts": [{{"hostPath": "{}", "containerPath": "/opt/example", "options": ["ro", "bind"]}}]
      }}
    }}
  ]
}}"#,
            node.display(),
            libs.display()
        )
    };
    std::fs::write(tmp.join("cdi-vendor/example.json"), spec("old")).unwrap();
    std::fs::write(tmp.join("cdi/example.json"), spec("dev0")).unwrap();
    std::fs::write(
        tmp.join("cdi/bad.yaml"),
        "cdiVersion: \"0.6.0\"\nkind: example.com/bad\ndevices:\n  - name: x\n    containerEdits:\n      deviceNodes:\n        - path: dev/x\n",
    )
    .unwrap();

    // The node lists the CDI devices and says which spec it refused, and why.
    let status = wait_node(&agent, "the CDI devices", |n| {
        !n.devices.cdi_devices.is_empty()
    })
    .await;
    assert_eq!(status.devices.cdi_devices, ["example.com/device=dev0"]);
    let errors = status.devices.cdi_errors.join("\n");
    assert!(errors.contains("bad.yaml"), "{errors}");
    assert!(
        errors.contains("devices[0].containerEdits.deviceNodes[0].path"),
        "{errors}"
    );

    let external = create_volume(&agent.client(), "hostpath", "out").await;
    let out = tmp.join("hp/volumes").join(external);
    let job = device_job(
        "cdi",
        "batch",
        "out",
        "        device \"example.com/device=dev0\" {}",
        "d=/data/cdi; mkdir -p $d; env | grep '^EXAMPLE' | sort > $d/env; head -c 8 /dev/example0 | wc -c > $d/node; ls /opt/example > $d/mount",
    );
    run_job(&agent.client(), job).await.expect("job run");
    let alloc = wait_alloc(&agent, "cdi", |a| a.client_status.is_terminal()).await;
    assert_eq!(alloc.client_status, ClientStatus::Complete, "{alloc:#?}");
    assert_eq!(
        read(&out.join("cdi/env")),
        "EXAMPLE_DEVICE=dev0\nEXAMPLE_VENDOR=berth\n"
    );
    assert_eq!(read(&out.join("cdi/node")).trim(), "8");
    assert_eq!(read(&out.join("cdi/mount")), "libexample.so\n");
    assert_eq!(
        alloc.tasks["main"].devices[0].devices,
        ["example.com/device=dev0"]
    );

    // A device of the malformed spec: refused, naming the file; nothing placed.
    let bad = device_job(
        "bad",
        "batch",
        "out",
        "        device \"example.com/bad=x\" {}",
        "true",
    );
    let err = run_job(&agent.client(), bad).await.unwrap_err().to_string();
    assert!(err.contains("example.com/bad=x"), "{err}");
    assert!(err.contains("bad.yaml"), "{err}");
    assert!(agent.client().job("bad").await.is_err());
}
