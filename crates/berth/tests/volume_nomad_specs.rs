//! Nomad's volume files on a real agent, through the CLI: the `nomad volume init` shape is
//! created and registered with its unused fields named in warnings (never their values), and
//! `volume create` again with a larger capacity expands the volume, as Nomad documents.

mod agent_support;

use std::{path::Path, process::Output};

use agent_support::AgentProcess;

const PLUGIN: &str = "hp";

/// `volume.csi.hcl`'s shape for this node's plugin: one file-system capability (berth-hostpath
/// serves no block devices), no snapshot to start from, a size hostpath can give, and no
/// topology (the template's racks are not this node's).
fn template(capacity: &str) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nomad/volumes/volume.csi.hcl"),
    )
    .unwrap();
    let block = "capability {\n  access_mode     = \"single-node-reader-only\"\n  attachment_mode = \"block-device\"\n}\n";
    assert!(text.contains(block));
    let text = text
        .replace(
            "plugin_id = \"plugin_id\"",
            &format!("plugin_id = \"{PLUGIN}\""),
        )
        .replace(block, "")
        .replace("snapshot_id = \"snap-12345\"", "")
        .replace(
            "capacity_min = \"10GiB\"",
            &format!("capacity_min = \"{capacity}\""),
        )
        .replace("capacity_max = \"20G\"", "")
        .replace("mount_flags = [\"ro\"]", "mount_flags = [\"noatime\"]");
    let at = text.find("topology_request {").unwrap();
    let end = text[at..].find("\nsecrets").unwrap() + at;
    format!("{}{}", &text[..at], &text[end..])
}

async fn berth(agent: &AgentProcess, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--address")
        .arg(format!("unix://{}", agent.socket().display()))
        .args(args)
        .output()
        .await
        .expect("berth")
}

#[tokio::test]
async fn the_init_template_creates_registers_and_a_larger_create_expands() {
    let agent = AgentProcess::start_with_hostpath(PLUGIN, &["--enable-stage"]).await;
    let client = agent.client();
    let file = agent.tmp.path().join("volume.hcl");
    let text = template("10MiB");
    std::fs::write(&file, &text).unwrap();
    let out = berth(&agent, &["volume", "create", file.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("external_id: ignored"),
        "{stderr}"
    );
    assert!(stderr.contains("context: ignored"), "{stderr}");
    assert!(
        !stderr.contains("xyzzy") && !stderr.contains("192.168"),
        "{stderr}"
    );
    let vol = client.volume("ebs_prod_db1").await.unwrap();
    assert_eq!(vol.capacity_bytes, 10 << 20);
    assert!(
        vol.context.is_empty(),
        "the plugin's context, not the spec's"
    );

    // The same create with a larger capacity_min expands it.
    std::fs::write(&file, text.replace("\"10MiB\"", "\"20MiB\"")).unwrap();
    let out = berth(&agent, &["volume", "create", file.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("expanded from 10485760 to 20971520 bytes"),
        "{stderr}"
    );
    assert_eq!(
        client.volume("ebs_prod_db1").await.unwrap().capacity_bytes,
        20 << 20
    );
    // The same again: nothing to do.
    let out = berth(&agent, &["volume", "create", file.to_str().unwrap()]).await;
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("expanded"));

    // Registered under another id, from the same shape: the capacity range is recorded, the
    // snapshot and the preferred topology ignored with a warning.
    let reg = text
        .replace("id        = \"ebs_prod_db1\"", "id        = \"registered\"")
        .replace("vol-23452345", &vol.external_id)
        .replace(
            "# register: the storage",
            "snapshot_id = \"snap-1\"\n# register: the storage",
        )
        .replace(
            "context {\n  endpoint = \"http://192.168.1.101:9425\"\n}\n",
            "",
        )
        .replace(
            "capacity_min = \"10MiB\"",
            "capacity_min = \"10MiB\"\ncapacity_max = \"30MiB\"",
        );
    let reg_file = agent.tmp.path().join("register.hcl");
    std::fs::write(&reg_file, reg).unwrap();
    let out = berth(&agent, &["volume", "register", reg_file.to_str().unwrap()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("snapshot_id: ignored"), "{stderr}");
    assert_eq!(
        client.volume("registered").await.unwrap().capacity_bytes,
        30 << 20
    );

    // A job spec given to volume create says which command takes it; nothing changes.
    let job = agent.tmp.path().join("job.hcl");
    std::fs::write(&job, "job \"j\" {\n  group \"g\" {}\n}\n").unwrap();
    let out = berth(&agent, &["volume", "create", job.to_str().unwrap()]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("berth job run"));
    assert_eq!(client.volumes().await.unwrap().volumes.len(), 2);
}
