//! Two copies of `berth-hostpath` never run on one state directory: the second one exits at
//! once, before it touches the state or its socket, with a distinct exit code.

mod common;

use std::{fs, os::unix::fs::PermissionsExt as _, process::Command};

use berth_csi::pb;
use berth_hostpath::statelock::EXIT_STATEDIR_IN_USE;
use berth_testkit::{HostpathPlugin, SpawnError, bin_path};
use common::*;

#[tokio::test]
async fn a_second_copy_on_the_same_statedir_exits_at_once_and_touches_nothing() {
    let mut first = HostpathPlugin::builder().spawn().await;
    let mut c = clients(&first).await;
    let id = create(&mut c, "kept").await.volume_id;
    let statedir = first.statedir().to_path_buf();
    // A leftover the second copy would clean up if it went on past the lock.
    let leftover = statedir.join("volumes/.new-leftover");
    fs::create_dir(&leftover).expect("mkdir");
    let state_before = fs::read(statedir.join("state.json")).expect("state");
    let lock = statedir.join("lock");
    assert_eq!(
        fs::read_to_string(&lock).expect("lock file"),
        format!("{}\n", first.pid())
    );
    assert_eq!(
        fs::metadata(&lock).expect("stat").permissions().mode() & 0o777,
        0o600
    );

    let second = HostpathPlugin::builder()
        .statedir(&statedir)
        .try_spawn()
        .await
        .expect_err("the second copy must not start");
    let SpawnError::Exited { status, stderr } = second else {
        panic!("{second}");
    };
    assert_eq!(
        status.code(),
        Some(i32::from(EXIT_STATEDIR_IN_USE)),
        "{stderr}"
    );
    assert!(
        stderr.contains(&statedir.display().to_string())
            && stderr.contains(&format!("pid {}", first.pid())),
        "the error names the state directory and the holder: {stderr}"
    );
    assert!(
        leftover.is_dir(),
        "the second copy touched the state directory"
    );
    assert_eq!(
        fs::read(statedir.join("state.json")).expect("state"),
        state_before
    );
    assert_eq!(
        fs::read_to_string(&lock).expect("lock file"),
        format!("{}\n", first.pid()),
        "the holder's pid stays"
    );

    // The first copy is unaffected.
    ok(c.identity.probe(pb::ProbeRequest {}).await);

    // Once it is gone (even killed), a new copy takes over the state directory.
    first.kill();
    let third = HostpathPlugin::builder().statedir(&statedir).spawn().await;
    let mut c = clients(&third).await;
    let list = ok(c
        .controller
        .list_volumes(pb::ListVolumesRequest::default())
        .await);
    let ids: Vec<String> = list
        .entries
        .into_iter()
        .map(|e| e.volume.expect("volume").volume_id)
        .collect();
    assert_eq!(ids, vec![id]);
    assert_eq!(
        fs::read_to_string(&lock).expect("lock file"),
        format!("{}\n", third.pid())
    );
    assert!(!leftover.exists(), "the new holder cleaned up");
}

#[test]
fn help_documents_the_exit_code() {
    for flag in ["-h", "--help"] {
        let out = Command::new(bin_path("berth-hostpath"))
            .arg(flag)
            .output()
            .expect("run berth-hostpath");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(
                "{EXIT_STATEDIR_IN_USE}  another berth-hostpath holds --statedir"
            )),
            "{flag}:\n{text}"
        );
    }
}
