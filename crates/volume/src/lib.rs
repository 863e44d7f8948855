//! berth's volume model: volume specs as `berth volume register|create` read them (HCL or
//! JSON, compatible with Nomad's), usages of a volume on a node and the names of their
//! directories, and the staging and publish paths of DESIGN.md's on-disk layout.
//!
//! Nothing here does I/O except [`VolumeSpec::load`], which reads one file. Secrets and mount
//! flags never print: not in `Debug`, not in errors.

mod field;
mod hcl_input;
pub mod paths;
pub mod size;
pub mod spec;
mod stored;
pub mod usage;

pub use paths::{PathError, PluginDir, PluginPaths, publish_path, staging_path};
pub use size::{SizeError, parse_size};
pub use spec::{
    MAX_MAP_BYTES, MAX_STRING_BYTES, Operation, SpecError, SpecKind, TopologyRequest, VolumeSpec,
    check_fs_type,
};
pub use stored::StoredMountOptions;
pub use usage::{
    MAX_MOUNT_FLAGS_BYTES, MountFlagsError, NotAUsageDir, Usage, UsageKey, check_mount_flags,
    merge_mount_options,
};
