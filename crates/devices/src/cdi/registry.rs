//! The CDI spec directories, read into one snapshot, and the resolution of device names into
//! [`ContainerEdits`].

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fs, io,
    path::{Path, PathBuf},
};

use berth_input::{MAX_LISTED, Quoted, Shown};

use super::{
    CdiNameError, QualifiedName,
    edits::{self, Unsupported},
    spec::{CdiDevice, CdiSpec, CdiSpecError, SpecFormat},
};
use crate::model::ContainerEdits;

/// The spec directories CDI's own tools use, lowest priority first: `/etc/cdi` (static specs)
/// and `/var/run/cdi` (specs generated at boot).
pub const DEFAULT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// Why a spec file or directory was refused, or a device cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A spec file was refused; its devices are not in the registry.
    #[error(transparent)]
    Spec(#[from] CdiSpecError),
    /// A spec directory exists but could not be listed.
    #[error("{}: cannot list CDI spec directory: {source}", shown(dir))]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// A device name that is no fully qualified CDI name.
    #[error("CDI device name {0}")]
    Name(#[from] CdiNameError),
    /// Two or more spec files of the same directory (the highest that defines the device)
    /// define the device: it resolves to neither until one goes.
    #[error(
        "CDI device {name}: defined by {}, all in the same directory; berth uses none of them \
         until only one defines it",
        path_list(files)
    )]
    Conflict {
        /// The device's qualified name.
        name: String,
        /// The files that define it.
        files: Vec<PathBuf>,
    },
    /// No spec the registry holds defines the device.
    #[error(
        "CDI device {name}: {}",
        unknown_reason(name, dirs, known_kinds, kind_devices, refused_files)
    )]
    Unknown {
        /// The device's qualified name.
        name: String,
        /// The spec directories read.
        dirs: Vec<PathBuf>,
        /// The kinds the loaded specs define.
        known_kinds: Vec<String>,
        /// The devices of the device's kind that are defined (none when the kind is unknown).
        kind_devices: Vec<String>,
        /// The spec files that were refused (one of them may have meant to define it).
        refused_files: Vec<PathBuf>,
    },
    /// The device, or the edits its spec gives every device, needs something berth's task
    /// drivers cannot do (OCI hooks, extra groups, Intel RDT, network devices, a device
    /// node's owner or mode, a mount other than a bind mount).
    #[error("CDI device {name}: {}: {field}: {reason}", shown(path))]
    Unsupported {
        /// The device's qualified name.
        name: String,
        /// Its spec file.
        path: PathBuf,
        /// The field berth cannot honour (`devices[0].containerEdits.hooks`).
        field: String,
        /// Why.
        reason: String,
    },
}

fn shown(path: &Path) -> String {
    Shown(&path.to_string_lossy()).to_string()
}

/// `a`, `a and b`, `a, b and c`; at most [`MAX_LISTED`] paths, then how many more.
fn path_list(files: &[PathBuf]) -> String {
    let mut shown: Vec<String> = files.iter().take(MAX_LISTED).map(|f| shown(f)).collect();
    let more = files.len() - shown.len();
    if more > 0 {
        shown.push(format!("{more} more"));
    }
    match shown.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => "no file".into(),
    }
}

fn unknown_reason(
    name: &str,
    dirs: &[PathBuf],
    known_kinds: &[String],
    kind_devices: &[String],
    refused_files: &[PathBuf],
) -> String {
    let kind = name.split_once('=').map_or(name, |(kind, _)| kind);
    let mut reason = if !kind_devices.is_empty() {
        format!(
            "no such device; kind {kind} has {}",
            berth_input::quoted_list(kind_devices.iter().map(String::as_str))
        )
    } else if !known_kinds.is_empty() {
        format!(
            "unknown kind {}; the CDI specs define {}",
            Quoted(kind),
            berth_input::quoted_list(known_kinds.iter().map(String::as_str))
        )
    } else if dirs.is_empty() {
        "no CDI spec directory is configured".to_string()
    } else {
        format!("no CDI spec in {} defines any device", path_list(dirs))
    };
    if !refused_files.is_empty() {
        reason.push_str(&format!(
            " ({} refused spec file{}: {})",
            refused_files.len(),
            if refused_files.len() == 1 { "" } else { "s" },
            path_list(refused_files)
        ));
    }
    reason
}

/// Where a name points.
#[derive(Debug, Clone)]
enum Entry {
    /// Device `device` of spec `spec`.
    Device { spec: usize, device: usize },
    /// Defined by these files of one directory.
    Conflict(Vec<PathBuf>),
}

/// A snapshot of the CDI spec directories: every spec file read and checked, and for each
/// fully qualified device name the spec that defines it.
///
/// Directories are given lowest priority first: a device defined in several directories
/// comes from the last one. Within a directory each name must be defined once: when the
/// highest directory that defines a name defines it in two files, that is a conflict, and the
/// name resolves to neither definition (CDI's rule, except that berth lets a higher
/// directory's single definition win over a lower directory's conflict, where CDI drops the
/// name altogether).
///
/// A snapshot never changes: nothing watches the directories. It is cheap to rebuild
/// ([`CdiRegistry::load`], [`CdiRegistry::reload`]), and the device manager loads a fresh one
/// each time it places or reserves CDI devices, so a spec written or removed since is seen
/// then.
#[derive(Debug, Default)]
pub struct CdiRegistry {
    dirs: Vec<PathBuf>,
    specs: Vec<CdiSpec>,
    names: BTreeMap<QualifiedName, Entry>,
    errors: Vec<CdiError>,
}

impl CdiRegistry {
    /// Reads every spec file (`*.json`, `*.yaml`, `*.yml`; other names and directories are
    /// passed over; a symlink is followed, to a regular file only) of every directory in
    /// `dirs`, in name order, lowest priority first. A missing directory is no error. Never
    /// fails: a directory that cannot be listed, a file that is refused and each conflict are
    /// kept in [`CdiRegistry::errors`], and a refused file adds none of its devices, so every
    /// other file's devices still resolve.
    pub fn load(dirs: &[PathBuf]) -> Self {
        let mut reg = Self {
            dirs: dirs.to_vec(),
            ..Self::default()
        };
        for dir in dirs {
            let files = match spec_files(dir) {
                Ok(files) => files,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    reg.errors.push(CdiError::Dir {
                        dir: dir.clone(),
                        source,
                    });
                    continue;
                }
            };
            // Every definition of each name in this directory.
            let mut here: BTreeMap<QualifiedName, Vec<(usize, usize)>> = BTreeMap::new();
            for file in files {
                match CdiSpec::load(&file) {
                    Ok(spec) => {
                        let s = reg.specs.len();
                        for (d, device) in spec.devices().iter().enumerate() {
                            here.entry(spec.qualified_name(device))
                                .or_default()
                                .push((s, d));
                        }
                        reg.specs.push(spec);
                    }
                    Err(e) => reg.errors.push(e.into()),
                }
            }
            for (name, defs) in here {
                let entry = match defs[..] {
                    [(spec, device)] => Entry::Device { spec, device },
                    _ => Entry::Conflict(
                        defs.iter()
                            .map(|(s, _)| reg.specs[*s].path().to_path_buf())
                            .collect(),
                    ),
                };
                reg.names.insert(name, entry);
            }
        }
        let conflicts: Vec<CdiError> = reg
            .names
            .iter()
            .filter_map(|(name, entry)| match entry {
                Entry::Conflict(files) => Some(CdiError::Conflict {
                    name: name.to_string(),
                    files: files.clone(),
                }),
                Entry::Device { .. } => None,
            })
            .collect();
        reg.errors.extend(conflicts);
        reg
    }

    /// Reads the same directories again, replacing this snapshot.
    pub fn reload(&mut self) {
        *self = Self::load(&self.dirs);
    }

    /// The directories, lowest priority first.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// What went wrong while loading, directory by directory (one that cannot be listed, or
    /// its refused files in name order), then the conflicts by name.
    pub fn errors(&self) -> &[CdiError] {
        &self.errors
    }

    /// The specs read, in the order read.
    pub fn specs(&self) -> &[CdiSpec] {
        &self.specs
    }

    /// Every device that resolves, by name, with the spec file it comes from (conflicts are
    /// left out: they are among [`CdiRegistry::errors`]).
    pub fn devices(&self) -> Vec<(QualifiedName, PathBuf)> {
        self.names
            .iter()
            .filter_map(|(name, entry)| match entry {
                Entry::Device { spec, .. } => {
                    Some((name.clone(), self.specs[*spec].path().to_path_buf()))
                }
                Entry::Conflict(_) => None,
            })
            .collect()
    }

    /// The spec and the device a name resolves to, if it does.
    pub fn device(&self, name: &QualifiedName) -> Option<(&CdiSpec, &CdiDevice)> {
        match self.names.get(name)? {
            Entry::Device { spec, device } => {
                let spec = &self.specs[*spec];
                Some((spec, &spec.devices()[*device]))
            }
            Entry::Conflict(_) => None,
        }
    }

    /// What a task gets for the devices `names`: for each device, its spec's edits (once per
    /// spec, however many of its devices are named, before the first of them) and then its
    /// own, turned into berth's form:
    ///
    /// - `env` entries set their variable (a later entry wins);
    /// - a device node gives its host node (`hostPath`, or `path` when that is empty) at
    ///   `path`, with CDI's permissions (empty: `rwm`; `none`: empty, meaning the node is
    ///   there but the device cgroup allows no access);
    /// - a mount becomes a bind mount, read-only when its options say `ro` (the last of
    ///   `ro` and `rw` decides; other options are not carried);
    /// - a device node or a mount at the same place as an earlier one replaces it; mounts
    ///   are ordered parents first.
    ///
    /// A name given twice counts once. All or nothing: an unknown name, a conflict, or any
    /// edit berth's drivers cannot apply (see [`CdiError::Unsupported`]) fails the whole
    /// call.
    pub fn resolve(&self, names: &[QualifiedName]) -> Result<ContainerEdits, CdiError> {
        let mut out = ContainerEdits::default();
        let mut specs_done = HashSet::new();
        let mut seen = HashSet::new();
        for name in names {
            if !seen.insert(name) {
                continue;
            }
            let (s, d) = match self.names.get(name) {
                Some(Entry::Device { spec, device }) => (*spec, *device),
                Some(Entry::Conflict(files)) => {
                    return Err(CdiError::Conflict {
                        name: name.to_string(),
                        files: files.clone(),
                    });
                }
                None => return Err(self.unknown(name)),
            };
            let spec = &self.specs[s];
            let refuse = |u: Unsupported| CdiError::Unsupported {
                name: name.to_string(),
                path: spec.path().to_path_buf(),
                field: u.field,
                reason: u.reason,
            };
            if specs_done.insert(s) {
                edits::check("containerEdits", spec.container_edits()).map_err(refuse)?;
                edits::apply(&mut out, spec.container_edits());
            }
            let device = &spec.devices()[d];
            edits::check(
                &format!("devices[{d}].containerEdits"),
                &device.container_edits,
            )
            .map_err(refuse)?;
            edits::apply(&mut out, &device.container_edits);
        }
        edits::order_mounts(&mut out);
        Ok(out)
    }

    /// [`CdiRegistry::resolve`] for names still in text (as in
    /// [`ContainerEdits::cdi_devices`]); a text that is no qualified name fails the call.
    pub fn resolve_names<S: AsRef<str>>(&self, names: &[S]) -> Result<ContainerEdits, CdiError> {
        let names = names
            .iter()
            .map(|n| QualifiedName::parse(n.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        self.resolve(&names)
    }

    fn unknown(&self, name: &QualifiedName) -> CdiError {
        let known_kinds: BTreeSet<String> = self.specs.iter().map(CdiSpec::kind).collect();
        let kind_devices = self
            .names
            .keys()
            .filter(|n| n.vendor == name.vendor && n.class == name.class)
            .map(|n| n.name.clone())
            .collect();
        let refused_files = self
            .errors
            .iter()
            .filter_map(|e| match e {
                CdiError::Spec(s) => Some(s.path().to_path_buf()),
                _ => None,
            })
            .collect();
        CdiError::Unknown {
            name: name.to_string(),
            dirs: self.dirs.clone(),
            known_kinds: known_kinds.into_iter().collect(),
            kind_devices,
            refused_files,
        }
    }
}

/// The spec files of `dir` by name: entries named `*.json`, `*.yaml` or `*.yml` that are not
/// directories (after following symlinks). An entry that cannot be looked at is kept, so
/// reading it reports why.
fn spec_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if SpecFormat::of(&path).is_none() {
            continue;
        }
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        files.push(path);
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qn(s: &str) -> QualifiedName {
        QualifiedName::parse(s).unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).unwrap();
    }

    fn spec(kind: &str, devices: &[(&str, &str)], common: &str) -> String {
        let devices: Vec<String> = devices
            .iter()
            .map(|(n, env)| format!(r#"{{"name": "{n}", "containerEdits": {{"env": ["{env}"]}}}}"#))
            .collect();
        format!(
            r#"{{"cdiVersion": "0.6.0", "kind": "{kind}", "containerEdits": {common},
                "devices": [{}]}}"#,
            devices.join(",")
        )
    }

    #[test]
    fn spec_edits_come_once_before_the_first_device_of_the_spec() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "a.json",
            &spec(
                "a.com/x",
                &[("0", "WHO=0"), ("1", "WHO=1")],
                r#"{"env": ["WHO=spec", "SPEC=a"]}"#,
            ),
        );
        let reg = CdiRegistry::load(&[d.path().to_path_buf()]);
        assert!(reg.errors().is_empty(), "{:?}", reg.errors());
        let out = reg.resolve(&[qn("a.com/x=0"), qn("a.com/x=1")]).unwrap();
        // Spec-level WHO=spec came first and was overridden by both devices, in order.
        assert_eq!(out.env["WHO"], "1");
        assert_eq!(out.env["SPEC"], "a");
        let out = reg.resolve(&[qn("a.com/x=1"), qn("a.com/x=1")]).unwrap();
        assert_eq!(out.env["WHO"], "1");
        assert!(reg.resolve(&[]).unwrap().is_empty());
    }

    #[test]
    fn unknown_names_say_what_is_known() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "a.json",
            &spec("a.com/x", &[("gpu0", "A=1")], "{}"),
        );
        write(d.path(), "broken.yaml", "cdiVersion: [");
        let reg = CdiRegistry::load(&[d.path().to_path_buf()]);
        let msg = reg.resolve(&[qn("a.com/x=gpu9")]).unwrap_err().to_string();
        assert!(
            msg.starts_with("CDI device a.com/x=gpu9: no such device"),
            "{msg}"
        );
        assert!(msg.contains("kind a.com/x has \"gpu0\""), "{msg}");
        assert!(msg.contains("1 refused spec file: "), "{msg}");
        assert!(msg.contains("broken.yaml"), "{msg}");
        let msg = reg.resolve(&[qn("b.com/y=0")]).unwrap_err().to_string();
        assert!(msg.contains("unknown kind \"b.com/y\""), "{msg}");
        assert!(msg.contains("define \"a.com/x\""), "{msg}");

        let empty = CdiRegistry::load(&[d.path().join("missing")]);
        assert!(empty.errors().is_empty());
        let msg = empty.resolve(&[qn("b.com/y=0")]).unwrap_err().to_string();
        assert!(msg.contains("no CDI spec in"), "{msg}");
        let msg = CdiRegistry::load(&[])
            .resolve_names(&["b.com/y=0"])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("no CDI spec directory is configured"), "{msg}");
        let e = empty.resolve_names(&["nonsense"]).unwrap_err();
        assert!(matches!(e, CdiError::Name(_)), "{e}");
    }

    #[test]
    fn path_lists_read_as_prose() {
        let p = |n: usize| {
            (0..n)
                .map(|i| PathBuf::from(format!("/d/{i}")))
                .collect::<Vec<_>>()
        };
        assert_eq!(path_list(&p(1)), "/d/0");
        assert_eq!(path_list(&p(2)), "/d/0 and /d/1");
        assert_eq!(path_list(&p(3)), "/d/0, /d/1 and /d/2");
        assert!(path_list(&p(20)).ends_with("/d/7 and 12 more"));
    }
}
