//! The shape `nomad volume init` writes (examples/nomad/volumes/volume.csi.hcl and .json) is
//! accepted by both `register` and `create`, the fields only the other command uses ignored
//! with a warning that names them, and never their values.

use std::path::{Path, PathBuf};

use berth_volume::{Operation, SpecKind, VolumeSpec};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/nomad/volumes")
        .join(name)
}

#[test]
fn the_init_template_is_accepted_by_register_and_create_in_hcl_and_json() {
    for file in ["volume.csi.hcl", "volume.csi.json"] {
        let path = example(file);
        let reg = VolumeSpec::load(Operation::Register, &path).unwrap_or_else(|e| panic!("{e}"));
        let SpecKind::Register {
            external_id,
            capacity_min,
            capacity_max,
        } = &reg.kind
        else {
            panic!("{reg:?}")
        };
        assert_eq!(external_id.as_str(), "vol-23452345");
        assert_eq!(*capacity_min, Some(10 << 30));
        assert_eq!(*capacity_max, Some(20_000_000_000));
        assert_eq!(reg.context["endpoint"], "http://192.168.1.101:9425");
        let warned = reg.warnings.join("\n");
        assert!(warned.contains("snapshot_id: ignored"), "{file}: {warned}");
        assert!(
            warned.contains("topology_request.preferred"),
            "{file}: {warned}"
        );
        assert_eq!(reg.topology_request.as_ref().unwrap().required.len(), 2);

        let create = VolumeSpec::load(Operation::Create, &path).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            create.kind,
            SpecKind::Create {
                capacity_min: Some(_),
                source: Some(_),
                ..
            }
        ));
        assert!(create.context.is_empty());
        let warned = create.warnings.join("\n");
        assert!(warned.contains("external_id: ignored"), "{file}: {warned}");
        assert!(warned.contains("context: ignored"), "{file}: {warned}");
        assert_eq!(create.topology_request.as_ref().unwrap().preferred.len(), 1);
        for w in reg.warnings.iter().chain(&create.warnings) {
            assert!(!w.contains("xyzzy") && !w.contains("192.168"), "{w}");
        }
        if file.ends_with(".hcl") {
            assert!(
                create
                    .warnings
                    .iter()
                    .all(|w| w.starts_with(&format!("{}:", path.display()))),
                "{:?}",
                create.warnings
            );
        }
    }
}
