//! Strict mode (`--strict`): the plugin refuses requests in which the CO skipped a duty the CSI
//! spec puts on it, instead of covering for it, so a CO tested against it cannot rely on a
//! forgiving plugin. Each check here is called only in strict mode; the checks that need the
//! mount table live with their RPC.
//!
//! Codes: `INVALID_ARGUMENT` when a field holds what the spec forbids, `FAILED_PRECONDITION`
//! when the CO has not done (or undone) what must come first. No message echoes a value of the
//! request other than paths and ids.

use std::{collections::HashMap, fs, io, path::Path};

use tonic::Status;

use crate::{error::internal, files::FsError, plugin::PUBLISH_CONTEXT_NODE_KEY};

/// NodeStageVolume: `staging_target_path` must be an existing directory. The spec makes the CO
/// responsible for creating it; the plugin never does.
pub(crate) fn staging_dir(path: &Path) -> Result<(), Status> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Status::failed_precondition(format!(
            "staging_target_path {} is not a directory: the CO must create it as a directory \
             before NodeStageVolume (CSI spec, NodeStageVolume); refused in strict mode",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Status::failed_precondition(format!(
            "staging_target_path {} does not exist: the CSI spec makes the CO responsible for \
             creating the directory before NodeStageVolume; this plugin does not create it in \
             strict mode",
            path.display()
        ))),
        Err(source) => Err(internal(&FsError {
            action: "inspecting",
            path: path.to_path_buf(),
            source,
        })),
    }
}

/// NodePublishVolume: the parent directory of `target_path` must exist (the CO's duty; the
/// target itself is the plugin's to create).
pub(crate) fn target_parent(target: &Path) -> Result<(), Status> {
    let parent = target.parent().unwrap_or(target);
    match fs::metadata(parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Status::failed_precondition(format!(
            "target_path {}: its parent {} is not a directory; the CSI spec makes the CO \
             responsible for the parent directory of target_path (refused in strict mode)",
            target.display(),
            parent.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Status::failed_precondition(format!(
            "target_path {}: its parent directory {} does not exist; the CSI spec makes the CO \
             responsible for creating it before NodePublishVolume (refused in strict mode)",
            target.display(),
            parent.display()
        ))),
        Err(source) => Err(internal(&FsError {
            action: "inspecting",
            path: parent.to_path_buf(),
            source,
        })),
    }
}

/// NodePublishVolume: a `target_path` that exists and was not made by this plugin was made by
/// the CO, whose duty ends at the parent: the spec gives creating `target_path` to the plugin.
pub(crate) fn target_made_by_co(target: &Path) -> Status {
    Status::failed_precondition(format!(
        "target_path {} exists but this plugin did not create it: the CSI spec makes creating \
         target_path the plugin's job, the CO only provides its parent (refused in strict mode)",
        target.display()
    ))
}

/// NodeStageVolume and NodePublishVolume: `publish_context` must be what ControllerPublishVolume
/// returned when the plugin has PUBLISH_UNPUBLISH_VOLUME (`attach`), and empty otherwise.
pub(crate) fn publish_context(
    context: &HashMap<String, String>,
    attach: bool,
    node_id: &str,
) -> Result<(), Status> {
    if !attach {
        if context.is_empty() {
            return Ok(());
        }
        return Err(Status::invalid_argument(
            "publish_context must be left unset: this plugin does not have \
             PUBLISH_UNPUBLISH_VOLUME (CSI spec; refused in strict mode)",
        ));
    }
    let expected = context.len() == 1
        && context.get(PUBLISH_CONTEXT_NODE_KEY).map(String::as_str) == Some(node_id);
    if expected {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "publish_context must be the one ControllerPublishVolume returned \
             ({PUBLISH_CONTEXT_NODE_KEY}={node_id}); the CSI spec makes the CO pass it on \
             (refused in strict mode)"
        )))
    }
}

/// ControllerPublishVolume, ValidateVolumeCapabilities, NodeStageVolume, NodePublishVolume:
/// `volume_context` must match the volume's. This plugin's volumes have none.
pub(crate) fn volume_context(context: &HashMap<String, String>) -> Result<(), Status> {
    if context.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(
            "volume_context must match the volume's, and this plugin's volumes have an empty \
             one (CSI spec; refused in strict mode)",
        ))
    }
}

/// ControllerPublishVolume: `readonly` must be false, as the plugin does not have
/// PUBLISH_READONLY.
pub(crate) fn controller_readonly(readonly: bool) -> Result<(), Status> {
    if readonly {
        Err(Status::invalid_argument(
            "readonly must be false: this plugin does not have PUBLISH_READONLY (CSI spec, \
             ControllerPublishVolume; refused in strict mode)",
        ))
    } else {
        Ok(())
    }
}

/// NodeGetVolumeStats and NodeExpandVolume: `staging_target_path` is set exactly when the
/// plugin has STAGE_UNSTAGE_VOLUME (the spec asks the CO to supply it then, and to leave it
/// empty otherwise).
pub(crate) fn staging_hint(value: &str, stage: bool) -> Result<(), Status> {
    match (stage, value.is_empty()) {
        (true, true) => Err(Status::invalid_argument(
            "staging_target_path is required: this plugin has STAGE_UNSTAGE_VOLUME, and the CSI \
             spec asks the CO to supply it (required in strict mode)",
        )),
        (false, false) => Err(Status::invalid_argument(
            "staging_target_path must be empty: this plugin does not have STAGE_UNSTAGE_VOLUME \
             (CSI spec; refused in strict mode)",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn staging_dirs_and_target_parents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        fs::write(&file, b"x").expect("write");
        assert!(staging_dir(dir.path()).is_ok());
        for bad in [dir.path().join("missing"), file.clone()] {
            let status = staging_dir(&bad).unwrap_err();
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert!(status.message().contains("staging_target_path"));
            assert!(status.message().contains("CO"));
        }
        assert!(!dir.path().join("missing").exists(), "nothing created");

        assert!(target_parent(&dir.path().join("t")).is_ok());
        for bad in [dir.path().join("missing/t"), file.join("t")] {
            let status = target_parent(&bad).unwrap_err();
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert!(status.message().contains("target_path"));
        }
    }

    #[test]
    fn contexts() {
        let node = HashMap::from([(PUBLISH_CONTEXT_NODE_KEY.to_owned(), "n1".to_owned())]);
        assert!(publish_context(&node, true, "n1").is_ok());
        assert!(publish_context(&HashMap::new(), false, "n1").is_ok());
        let other = HashMap::from([(PUBLISH_CONTEXT_NODE_KEY.to_owned(), "n2".to_owned())]);
        for (ctx, attach) in [(&HashMap::new(), true), (&other, true), (&node, false)] {
            let status = publish_context(ctx, attach, "n1").unwrap_err();
            assert_eq!(status.code(), Code::InvalidArgument);
        }
        assert!(volume_context(&HashMap::new()).is_ok());
        let ctx = HashMap::from([("k".to_owned(), "private-value".to_owned())]);
        let status = volume_context(&ctx).unwrap_err();
        assert!(!status.message().contains("private-value"));
        assert!(controller_readonly(false).is_ok());
        assert!(controller_readonly(true).is_err());
        assert!(staging_hint("/s", true).is_ok() && staging_hint("", false).is_ok());
        assert!(staging_hint("", true).is_err() && staging_hint("/s", false).is_err());
    }
}
