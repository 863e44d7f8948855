//! The Container Device Interface: devices named `vendor.com/class=name`, described by CDI
//! spec files, resolved into what a task gets.
//!
//! - [`CdiSpec`]: one spec file (JSON or YAML, CDI spec format 0.3.0 to 1.1.0), read, parsed
//!   strictly and checked; every error names the file and the field.
//! - [`CdiRegistry`]: a snapshot of the spec directories (lowest priority first, as
//!   [`DEFAULT_SPEC_DIRS`]), which resolves device names into berth's
//!   [`ContainerEdits`](crate::model::ContainerEdits).
//!
//! What berth's task drivers cannot apply is refused when a device is resolved, naming the
//! field, rather than silently left out: OCI `hooks`, `additionalGids` (other than 0),
//! `intelRdt`, `netDevices`, a device node's `uid`, `gid` or `fileMode`, and mounts that are
//! not bind mounts. A spec that uses them is still valid, and its other devices, when their
//! own edits and the spec's common edits avoid them, still resolve. A device node's `type`,
//! `major` and `minor` are checked but not used: berth gives a task the host's node at
//! `hostPath` (or `path`).

mod check;
mod edits;
mod name;
mod registry;
mod spec;
mod version;

pub use name::{CdiNameError, QualifiedName};
pub use registry::{CdiError, CdiRegistry, DEFAULT_SPEC_DIRS};
pub use spec::{
    CdiDevice, CdiDeviceNode, CdiEdits, CdiHook, CdiIntelRdt, CdiMount, CdiNetDevice, CdiSpec,
    CdiSpecError, SpecFormat,
};
pub use version::{NEWEST_READ, OLDEST_READ};
