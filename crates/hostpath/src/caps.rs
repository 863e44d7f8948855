//! Checks of request fields shared by several RPCs: capabilities, capacity ranges, topology,
//! ids and paths.

use std::{
    collections::HashMap,
    path::{Component, Path, PathBuf},
};

use berth_csi::pb::{
    self, CapacityRange, TopologyRequirement,
    volume_capability::{AccessType, access_mode::Mode},
};
use tonic::{Code, Status};

use crate::state::Capability;

/// Capacity of a volume created without a capacity range (and without a source).
pub(crate) const DEFAULT_CAPACITY: i64 = 1 << 30;

/// Longest volume or snapshot name accepted (the CSI string size limit).
pub(crate) const MAX_NAME_LEN: usize = 128;

/// Checks one capability: an access mode and a mount access type are required. A block access
/// type fails with `unsupported` (the code the calling RPC's error table uses for "exceeds
/// capabilities").
pub(crate) fn capability(
    cap: &pb::VolumeCapability,
    field: &str,
    unsupported: Code,
) -> Result<Capability, Status> {
    let mode = cap
        .access_mode
        .and_then(|m| Mode::try_from(m.mode).ok())
        .filter(|m| *m != Mode::Unknown)
        .ok_or_else(|| Status::invalid_argument(format!("{field}.access_mode is required")))?;
    match &cap.access_type {
        None => Err(Status::invalid_argument(format!(
            "{field}.access_type is required (mount or block)"
        ))),
        Some(AccessType::Block(_)) => Err(Status::new(
            unsupported,
            format!("{field}: block access is not supported; this plugin serves directories"),
        )),
        Some(AccessType::Mount(m)) => Ok(Capability {
            access_mode: mode.as_str_name().to_owned(),
            fs_type: m.fs_type.clone(),
            mount_group: m.volume_mount_group.clone(),
        }),
    }
}

/// [`capability`] of a required field.
pub(crate) fn required_capability(
    cap: Option<&pb::VolumeCapability>,
    field: &str,
    unsupported: Code,
) -> Result<Capability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument(format!("{field} is required")))?;
    capability(cap, field, unsupported)
}

/// The mount flags of a mount capability (none for others). They may be sensitive: never log
/// or echo them.
pub(crate) fn mount_flags(cap: Option<&pb::VolumeCapability>) -> &[String] {
    match cap.and_then(|c| c.access_type.as_ref()) {
        Some(AccessType::Mount(m)) => &m.mount_flags,
        _ => &[],
    }
}

/// Whether the access mode allows only one target path on a node: SINGLE_NODE_SINGLE_WRITER,
/// the mode that exists to say so. The legacy SINGLE_NODE_WRITER and the reader modes allow
/// several workloads of one node, as COs publish them (one target per workload).
pub(crate) fn single_target(cap: &Capability) -> bool {
    Mode::from_str_name(&cap.access_mode) == Some(Mode::SingleNodeSingleWriter)
}

/// Whether the access mode only allows reading.
pub(crate) fn reader_only(cap: &Capability) -> bool {
    matches!(
        Mode::from_str_name(&cap.access_mode),
        Some(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
    )
}

/// A non-empty string field.
pub(crate) fn required<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(value)
    }
}

/// A volume or snapshot id: required, and usable as a directory name.
pub(crate) fn id<'a>(value: &'a str, field: &'static str) -> Result<&'a str, Status> {
    required(value, field)?;
    berth_sys::validate_path_segment(field, value)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(value)
}

/// A CO-chosen name: required, at most 128 bytes, no control characters.
pub(crate) fn name<'a>(value: &'a str, field: &str) -> Result<&'a str, Status> {
    required(value, field)?;
    if value.len() > MAX_NAME_LEN {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes long, more than {MAX_NAME_LEN}",
            value.len()
        )));
    }
    if value
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(Status::invalid_argument(format!(
            "{field} contains a control character"
        )));
    }
    Ok(value)
}

/// A node path: required, absolute, without `..` or NUL.
pub(crate) fn node_path(value: &str, field: &str) -> Result<PathBuf, Status> {
    required(value, field)?;
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(Status::invalid_argument(format!(
            "{field} {value:?} is not absolute"
        )));
    }
    if value.contains('\0') || path.components().any(|c| c == Component::ParentDir) {
        return Err(Status::invalid_argument(format!(
            "{field} {value:?} contains '..' or a NUL byte"
        )));
    }
    Ok(path)
}

/// An optional node path: empty, or a [`node_path`].
pub(crate) fn optional_node_path(value: &str, field: &str) -> Result<Option<PathBuf>, Status> {
    if value.is_empty() {
        Ok(None)
    } else {
        node_path(value, field).map(Some)
    }
}

/// A path the plugin mounts on: a [`node_path`] that is neither inside the state directory nor
/// above it (so deleting a volume never reaches into a mount, and no mount hides the state).
pub(crate) fn mount_path(value: &str, field: &str, statedir: &Path) -> Result<PathBuf, Status> {
    let path = node_path(value, field)?;
    if path.starts_with(statedir) || statedir.starts_with(&path) {
        return Err(Status::invalid_argument(format!(
            "{field} {value:?} overlaps the plugin's state directory"
        )));
    }
    Ok(path)
}

/// The capacity to give a volume: at least `required_bytes` and the size of its source
/// (`floor`), at most `limit_bytes` and `max`; 1 GiB (or the source size) when no range is
/// given. `OUT_OF_RANGE` when no size fits.
pub(crate) fn choose_capacity(
    range: Option<&CapacityRange>,
    floor: i64,
    max: Option<u64>,
) -> Result<i64, Status> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(
            "capacity_range.required_bytes and limit_bytes must not be negative",
        ));
    }
    if limit > 0 && required > limit {
        return Err(Status::out_of_range(format!(
            "capacity_range.limit_bytes {limit} is less than required_bytes {required}"
        )));
    }
    let max = max.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
    let low = required.max(floor);
    let high = match (limit, max) {
        (0, None) => i64::MAX,
        (0, Some(m)) => m,
        (l, None) => l,
        (l, Some(m)) => l.min(m),
    };
    if low > high {
        let why = if max.is_some_and(|m| low > m) {
            format!(
                "the maximum volume size is {} bytes",
                max.unwrap_or_default()
            )
        } else {
            format!("limit_bytes is {limit}")
        };
        let what = if floor > required {
            format!("the content source is {floor} bytes")
        } else {
            format!("{required} bytes are required")
        };
        return Err(Status::out_of_range(format!("{what} but {why}")));
    }
    Ok(if required > 0 {
        low
    } else if floor > 0 {
        floor
    } else {
        DEFAULT_CAPACITY.min(high)
    })
}

/// Whether a volume of `capacity` bytes satisfies `range`.
pub(crate) fn capacity_fits(capacity: i64, range: Option<&CapacityRange>) -> bool {
    range.is_none_or(|r| {
        capacity >= r.required_bytes && (r.limit_bytes == 0 || capacity <= r.limit_bytes)
    })
}

/// Whether a topology (all of its segments) describes this node.
pub(crate) fn topology_matches(
    segments: &HashMap<String, String>,
    ours: &HashMap<String, String>,
) -> bool {
    segments.iter().all(|(k, v)| ours.get(k) == Some(v))
}

/// Whether a volume on this node satisfies the requisite topologies of `req` (preferred ones
/// are hints; no requisite means anywhere).
pub(crate) fn topology_allows(
    req: Option<&TopologyRequirement>,
    ours: &HashMap<String, String>,
) -> bool {
    req.is_none_or(|r| {
        r.requisite.is_empty()
            || r.requisite
                .iter()
                .any(|t| topology_matches(&t.segments, ours))
    })
}

#[cfg(test)]
mod tests {
    use berth_csi::pb::volume_capability::{AccessMode, BlockVolume, MountVolume};

    use super::*;

    fn cap(mode: Mode, block: bool) -> pb::VolumeCapability {
        pb::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume::default())
            }),
        }
    }

    #[test]
    fn capabilities() {
        let c = capability(
            &cap(Mode::SingleNodeWriter, false),
            "c",
            Code::InvalidArgument,
        )
        .expect("mount is supported");
        assert_eq!(c.access_mode, "SINGLE_NODE_WRITER");
        let err = capability(
            &cap(Mode::SingleNodeWriter, true),
            "c",
            Code::FailedPrecondition,
        )
        .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        let err = capability(&cap(Mode::Unknown, false), "c", Code::InvalidArgument).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let no_type = pb::VolumeCapability {
            access_type: None,
            ..cap(Mode::SingleNodeWriter, false)
        };
        let err = capability(&no_type, "c", Code::FailedPrecondition).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(single_target(
            &capability(
                &cap(Mode::SingleNodeSingleWriter, false),
                "c",
                Code::Internal
            )
            .expect("ok")
        ));
        assert!(!single_target(&c));
    }

    fn range(required_bytes: i64, limit_bytes: i64) -> CapacityRange {
        CapacityRange {
            required_bytes,
            limit_bytes,
        }
    }

    #[test]
    fn capacities() {
        assert_eq!(choose_capacity(None, 0, None).ok(), Some(DEFAULT_CAPACITY));
        assert_eq!(choose_capacity(None, 0, Some(100)).ok(), Some(100));
        assert_eq!(choose_capacity(None, 5000, None).ok(), Some(5000));
        assert_eq!(choose_capacity(Some(&range(10, 0)), 0, None).ok(), Some(10));
        assert_eq!(choose_capacity(Some(&range(0, 10)), 0, None).ok(), Some(10));
        assert_eq!(
            choose_capacity(Some(&range(10, 20)), 15, None).ok(),
            Some(15)
        );
        let code = |r, floor, max| choose_capacity(Some(&r), floor, max).unwrap_err().code();
        assert_eq!(code(range(20, 10), 0, None), Code::OutOfRange);
        assert_eq!(code(range(200, 0), 0, Some(100)), Code::OutOfRange);
        assert_eq!(code(range(10, 20), 30, None), Code::OutOfRange);
        assert_eq!(code(range(-1, 0), 0, None), Code::InvalidArgument);
        assert!(capacity_fits(15, Some(&range(10, 20))));
        assert!(!capacity_fits(25, Some(&range(10, 20))));
        assert!(capacity_fits(25, Some(&range(10, 0))));
    }

    #[test]
    fn node_paths() {
        let state = Path::new("/var/lib/hp");
        assert!(mount_path("/mnt/x", "target_path", state).is_ok());
        assert!(node_path("/var/lib", "volume_path").is_ok());
        for bad in [
            "",
            "mnt/x",
            "/mnt/../etc",
            "/var/lib/hp/volumes/v",
            "/var/lib",
            "/a\0b",
        ] {
            let err = mount_path(bad, "target_path", state).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn names_and_ids() {
        assert!(name("pvc-1 with spaces", "name").is_ok());
        assert!(name("bad\u{1}", "name").is_err());
        assert!(name(&"x".repeat(129), "name").is_err());
        assert!(id("vol-1", "volume_id").is_ok());
        assert!(id("../x", "volume_id").is_err());
    }

    #[test]
    fn topologies() {
        let ours = HashMap::from([("k".to_owned(), "n1".to_owned())]);
        let topo = |v: &str| pb::Topology {
            segments: HashMap::from([("k".to_owned(), v.to_owned())]),
        };
        let req = |requisite| TopologyRequirement {
            requisite,
            preferred: vec![],
        };
        assert!(topology_allows(None, &ours));
        assert!(topology_allows(Some(&req(vec![])), &ours));
        assert!(topology_allows(
            Some(&req(vec![topo("n2"), topo("n1")])),
            &ours
        ));
        assert!(!topology_allows(Some(&req(vec![topo("n2")])), &ours));
    }
}
