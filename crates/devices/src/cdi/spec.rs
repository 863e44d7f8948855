//! CDI spec files: JSON (`.json`) or YAML (`.yaml`, `.yml`), spec format 0.3.0 to 1.1.0.
//!
//! A file is read whole (at most [`berth_input::MAX_SPEC_BYTES`]), parsed with every field CDI
//! does not define refused (as CDI's own loader does), then checked against CDI's rules (see
//! [`CdiSpec::parse`]). A [`CdiSpec`] exists only once all of that passed. Every error names
//! the file, then the line when the parser knows it, then the field path
//! (`devices[1].containerEdits.deviceNodes[0].path`).
//!
//! As in CDI, an explicit `null` for an optional field (`env: null`, `containerEdits:` with
//! nothing after it in YAML) reads as the field left out.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use berth_input::{Shown, Syntax, TextError, serde_message};
use serde::{Deserialize, Deserializer};
use serde_path_to_error::Segment;

use super::{QualifiedName, check};

/// The encoding of a spec file, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// `.json`.
    Json,
    /// `.yaml` or `.yml`.
    Yaml,
}

impl SpecFormat {
    /// The format of a file named `path`: `.json` is JSON, `.yaml` and `.yml` are YAML;
    /// `None` for any other name (which is no spec file).
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "json" => Some(Self::Json),
            "yaml" | "yml" => Some(Self::Yaml),
            _ => None,
        }
    }
}

/// Why a CDI spec file is refused. Every message starts with the file (escaped and cut).
#[derive(Debug, thiserror::Error)]
pub enum CdiSpecError {
    /// The file could not be read: missing, unreadable, not a regular file, or not UTF-8.
    #[error("{}: cannot read CDI spec: {source}", shown(path))]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The name does not end in `.json`, `.yaml` or `.yml`.
    #[error(
        "{}: not a CDI spec file name (expected .json, .yaml or .yml)",
        shown(path)
    )]
    NotSpecFile {
        /// The file.
        path: PathBuf,
    },
    /// Larger than 1 MiB, or nested too deep, before any parser ran.
    #[error("{}{}: {source}", shown(path), at_line(source.line()))]
    Bounds {
        /// The file.
        path: PathBuf,
        /// Which bound.
        #[source]
        source: TextError,
    },
    /// Not valid JSON or YAML, or a field that is unknown, missing or of the wrong type. The
    /// message never repeats a value of the wrong type.
    #[error("{}{}: {}{message}", shown(path), at_line(*line), field_prefix(field))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line, when the parser knows it.
        line: Option<usize>,
        /// The field path (`devices[0].containerEdits`); empty at the top.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Well-formed, but against a rule of the CDI spec.
    #[error("{}: {field}: {reason}", shown(path))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field path (`devices[1].containerEdits.deviceNodes[0].path`).
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl CdiSpecError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Read { path, .. }
            | Self::NotSpecFile { path }
            | Self::Bounds { path, .. }
            | Self::Syntax { path, .. }
            | Self::Invalid { path, .. } => path,
        }
    }

    /// The 1-based line, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Bounds { source, .. } => source.line(),
            Self::Syntax { line, .. } => *line,
            _ => None,
        }
    }

    /// The field path, when the error is about one field.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Syntax { field, .. } | Self::Invalid { field, .. } if !field.is_empty() => {
                Some(field)
            }
            _ => None,
        }
    }
}

fn shown(path: &Path) -> String {
    Shown(&path.to_string_lossy()).to_string()
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

/// One CDI spec file, read and checked: a kind (`vendor/class`), the devices of that kind it
/// defines (at least one, names unique), and the edits every device of it brings along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiSpec {
    path: PathBuf,
    version: String,
    vendor: String,
    class: String,
    annotations: BTreeMap<String, String>,
    devices: Vec<CdiDevice>,
    container_edits: CdiEdits,
}

/// A device a spec defines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiDevice {
    /// Its name within the kind (`dev0`).
    pub name: String,
    /// Free-form information about the device (CDI 0.6.0).
    #[serde(default, deserialize_with = "null_default")]
    pub annotations: BTreeMap<String, String>,
    /// What a task that gets this device gets; never empty in a checked spec.
    #[serde(default, deserialize_with = "null_default")]
    pub container_edits: CdiEdits,
}

/// CDI's `containerEdits`: what a container gets, for one device or for every device of a
/// spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiEdits {
    /// Environment variables, `NAME=VALUE`.
    #[serde(default, deserialize_with = "null_default")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, deserialize_with = "null_default")]
    pub device_nodes: Vec<CdiDeviceNode>,
    /// Mounts.
    #[serde(default, deserialize_with = "null_default")]
    pub mounts: Vec<CdiMount>,
    /// OCI hooks.
    #[serde(default, deserialize_with = "null_default")]
    pub hooks: Vec<CdiHook>,
    /// Extra groups of the container's process (CDI 0.7.0; `0` is ignored).
    #[serde(default, deserialize_with = "null_default")]
    pub additional_gids: Vec<u32>,
    /// Intel RDT (resctrl) settings (CDI 0.7.0).
    #[serde(default)]
    pub intel_rdt: Option<CdiIntelRdt>,
    /// Network interfaces moved into the container (CDI 1.1.0).
    #[serde(default, deserialize_with = "null_default")]
    pub net_devices: Vec<CdiNetDevice>,
}

impl CdiEdits {
    /// Whether there is no edit at all (a spec's own edits may be empty, a device's not).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.additional_gids.is_empty()
            && self.intel_rdt.is_none()
            && self.net_devices.is_empty()
    }
}

/// A device node to create in the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiDeviceNode {
    /// Where the container sees it (absolute).
    pub path: String,
    /// The node on the host (absolute); `path` when empty (CDI 0.5.0).
    #[serde(default, deserialize_with = "null_default")]
    pub host_path: String,
    /// `b`, `c`, `u` or `p`; empty when it is to be read from the host's node.
    #[serde(rename = "type", default, deserialize_with = "null_default")]
    pub node_type: String,
    /// The major number.
    #[serde(default)]
    pub major: Option<i64>,
    /// The minor number.
    #[serde(default)]
    pub minor: Option<i64>,
    /// The node's file mode in the container.
    #[serde(default)]
    pub file_mode: Option<u32>,
    /// Cgroup permissions: one or more of `r`, `w` and `m`; empty means `rwm`, `none` means no
    /// access at all.
    #[serde(default, deserialize_with = "null_default")]
    pub permissions: String,
    /// The node's owner in the container.
    #[serde(default)]
    pub uid: Option<u32>,
    /// The node's group in the container.
    #[serde(default)]
    pub gid: Option<u32>,
}

/// A mount into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiMount {
    /// The source on the host (absolute).
    pub host_path: String,
    /// Where the container sees it (absolute).
    pub container_path: String,
    /// The file system type (CDI 0.4.0); a dummy such as `none` for bind mounts.
    #[serde(rename = "type", default, deserialize_with = "null_default")]
    pub mount_type: String,
    /// Mount options (`ro`, `bind`, `nosuid`, …).
    #[serde(default, deserialize_with = "null_default")]
    pub options: Vec<String>,
}

/// An OCI hook.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiHook {
    /// When it runs: `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart` or `poststop`.
    pub hook_name: String,
    /// The program (absolute).
    pub path: String,
    /// Its argv.
    #[serde(default, deserialize_with = "null_default")]
    pub args: Vec<String>,
    /// Its environment, `NAME=VALUE`.
    #[serde(default, deserialize_with = "null_default")]
    pub env: Vec<String>,
    /// Seconds before it is aborted; greater than zero when set.
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// Intel RDT settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiIntelRdt {
    /// The class of service.
    #[serde(rename = "closID", default, deserialize_with = "null_default")]
    pub clos_id: String,
    /// The L3 cache allocation schema.
    #[serde(default, deserialize_with = "null_default")]
    pub l3_cache_schema: String,
    /// The memory bandwidth allocation schema.
    #[serde(default, deserialize_with = "null_default")]
    pub mem_bw_schema: String,
    /// Schema lines (CDI 1.1.0; present, even empty, means 1.1.0 is needed).
    #[serde(default)]
    pub schemata: Option<Vec<String>>,
    /// Whether monitoring is enabled (CDI 1.1.0).
    #[serde(default, deserialize_with = "null_default")]
    pub enable_monitoring: bool,
}

/// A network interface moved from the host into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CdiNetDevice {
    /// Its name on the host.
    pub host_interface_name: String,
    /// Its name in the container.
    pub name: String,
}

/// The document as written, before it is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSpec {
    pub(crate) cdi_version: String,
    pub(crate) kind: String,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) annotations: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_default")]
    pub(crate) devices: Vec<CdiDevice>,
    #[serde(default, deserialize_with = "null_default")]
    pub(crate) container_edits: CdiEdits,
}

/// An explicit `null` reads as the default, as CDI's loader reads it.
fn null_default<'de, D, T>(de: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(de)?.unwrap_or_default())
}

impl CdiSpec {
    /// Reads and checks the spec file at `path`: only a regular file (a symlink is followed),
    /// at most 1 MiB, its format chosen by its extension. See [`CdiSpec::parse`].
    pub fn load(path: &Path) -> Result<Self, CdiSpecError> {
        if SpecFormat::of(path).is_none() {
            return Err(CdiSpecError::NotSpecFile {
                path: path.to_path_buf(),
            });
        }
        let text = berth_input::read_text(path).map_err(|source| CdiSpecError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and checks `text` as the spec file `path` (whose extension chooses JSON or
    /// YAML; the path is also what errors name). Beyond the field types, CDI's rules hold:
    ///
    /// - `cdiVersion` is a version berth knows (0.3.0 to 1.1.0, a leading `v` allowed) and at
    ///   least what the fields used need (`hostPath` of a device node needs 0.5.0, …);
    /// - `kind` is `vendor/class`, each part as in a [`QualifiedName`];
    /// - at least one device; device names valid and unique in the file; every device has
    ///   edits;
    /// - env entries are `NAME=VALUE`; paths are absolute, without NUL bytes, and the paths
    ///   in the container have no `..` (berth's rule: they are joined to a task's root);
    /// - device node types are `b`, `c`, `u` or `p`; permissions one or more of `r`, `w`,
    ///   `m`, or `none`; hook names known, hook timeouts positive; Intel RDT `closID` a
    ///   file name; net devices named, each host and container name once.
    ///
    /// Never panics, whatever the text.
    pub fn parse(path: &Path, text: &str) -> Result<Self, CdiSpecError> {
        let format = SpecFormat::of(path).ok_or_else(|| CdiSpecError::NotSpecFile {
            path: path.to_path_buf(),
        })?;
        let bounds = |source| CdiSpecError::Bounds {
            path: path.to_path_buf(),
            source,
        };
        match format {
            SpecFormat::Json => berth_input::check_text(Syntax::Json, text).map_err(bounds)?,
            SpecFormat::Yaml if text.len() > berth_input::MAX_SPEC_BYTES => {
                return Err(bounds(TextError::TooLarge));
            }
            SpecFormat::Yaml => {
                if let Some(line) = yaml_too_deep(text) {
                    return Err(bounds(TextError::TooDeep { line }));
                }
            }
        }
        let syntax = |line, field, message| CdiSpecError::Syntax {
            path: path.to_path_buf(),
            line,
            field,
            message,
        };
        if text.trim().is_empty() {
            return Err(syntax(
                None,
                String::new(),
                "empty file: no CDI spec".into(),
            ));
        }
        let raw = match format {
            SpecFormat::Json => parse_json(text),
            SpecFormat::Yaml => parse_yaml(text),
        }
        .map_err(|(line, field, message)| syntax(line, field, message))?;
        let (vendor, class) = check::spec(&raw).map_err(|p| CdiSpecError::Invalid {
            path: path.to_path_buf(),
            field: p.field,
            reason: p.reason,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            version: raw.cdi_version,
            vendor,
            class,
            annotations: raw.annotations,
            devices: raw.devices,
            container_edits: raw.container_edits,
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cdiVersion`, as written.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The vendor part of the kind (`example.com`).
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class part of the kind (`device`).
    pub fn class(&self) -> &str {
        &self.class
    }

    /// The kind: `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// Free-form information about the spec (CDI 0.6.0).
    pub fn annotations(&self) -> &BTreeMap<String, String> {
        &self.annotations
    }

    /// The devices, in file order; at least one, names unique.
    pub fn devices(&self) -> &[CdiDevice] {
        &self.devices
    }

    /// The device called `name` (unqualified: `dev0`).
    pub fn device(&self, name: &str) -> Option<&CdiDevice> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// The edits every device of this spec brings along, applied once per task however many
    /// of its devices the task gets; may be empty.
    pub fn container_edits(&self) -> &CdiEdits {
        &self.container_edits
    }

    /// The fully qualified name of one of its devices.
    pub fn qualified_name(&self, device: &CdiDevice) -> QualifiedName {
        QualifiedName {
            vendor: self.vendor.clone(),
            class: self.class.clone(),
            name: device.name.clone(),
        }
    }
}

/// The line of the first `[` or `{` nested deeper than [`berth_input::MAX_NESTING`], counting
/// every bracket of the text, whatever YAML makes of it.
///
/// The YAML parser reads any depth without recursing (and berth's types never descend into
/// what they do not expect), but its time grows with the square of the depth of flow
/// collections (`[[[[…`): a megabyte of brackets would keep it busy for minutes. No CDI spec
/// nests more than a few levels. Brackets inside quoted strings and comments count too, so a
/// text that closes brackets only there can pass with more depth than it seems to have; the
/// bound is against runaway generators, not a proof (whoever can write to a spec directory
/// is root already).
fn yaml_too_deep(text: &str) -> Option<usize> {
    let (mut depth, mut line) = (0usize, 1usize);
    for b in text.bytes() {
        match b {
            b'\n' => line += 1,
            b'[' | b'{' => {
                depth += 1;
                if depth > berth_input::MAX_NESTING {
                    return Some(line);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// A parse failure: line, field path, message.
type ParseFailure = (Option<usize>, String, String);

/// A field path as berth writes it (`devices[0].containerEdits`): the first `n` segments of
/// `path`, up to the first the parser could not name (where the syntax broke).
fn path_prefix(path: &serde_path_to_error::Path, n: usize) -> String {
    let mut out = String::new();
    for segment in path
        .iter()
        .take(n)
        .take_while(|s| !matches!(s, Segment::Unknown))
    {
        if !out.is_empty() && !matches!(segment, Segment::Seq { .. }) {
            out.push('.');
        }
        out.push_str(&segment.to_string());
    }
    out
}

/// The failure for a parser's `message` at `path`. The field is where the failure is; for an
/// unknown field, the object holding it (the message names the field). The YAML library
/// starts its messages with its own copy of the path (up to the object, for an unknown
/// field): it is dropped.
fn failure(path: &serde_path_to_error::Path, line: Option<usize>, message: &str) -> ParseFailure {
    let len = path.iter().count();
    let mut message = message;
    for n in (1..=len).rev() {
        if let Some(rest) = message
            .strip_prefix(path_prefix(path, n).as_str())
            .and_then(|r| r.strip_prefix(": "))
        {
            message = rest;
            break;
        }
    }
    let unknown = message.starts_with("unknown field `");
    let field = path_prefix(path, if unknown { len.saturating_sub(1) } else { len });
    (line, Shown(&field).to_string(), serde_message(message))
}

fn parse_json(text: &str) -> Result<RawSpec, ParseFailure> {
    let mut de = serde_json::Deserializer::from_str(text);
    let raw: RawSpec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let (line, message) = json_message(e.inner());
        failure(e.path(), line, &message)
    })?;
    de.end().map_err(|e| {
        let (line, message) = json_message(&e);
        (line, String::new(), serde_message(&message))
    })?;
    Ok(raw)
}

/// A JSON error's line and its message without the place.
fn json_message(e: &serde_json::Error) -> (Option<usize>, String) {
    let text = e.to_string();
    let place = format!(" at line {} column {}", e.line(), e.column());
    let line = (e.line() > 0).then_some(e.line());
    (line, text.strip_suffix(&place).unwrap_or(&text).to_string())
}

fn parse_yaml(text: &str) -> Result<RawSpec, ParseFailure> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let inner = e.inner();
        let mut message = inner.to_string();
        // The place is the line shown beside the file.
        if let Some(l) = inner.location() {
            let place = format!(" at line {} column {}", l.line(), l.column());
            message = message.replacen(&place, "", 1);
        }
        failure(e.path(), inner.location().map(|l| l.line()), &message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Result<CdiSpec, CdiSpecError> {
        CdiSpec::parse(Path::new("/etc/cdi/acme.json"), text)
    }

    fn yaml(text: &str) -> Result<CdiSpec, CdiSpecError> {
        CdiSpec::parse(Path::new("/etc/cdi/acme.yaml"), text)
    }

    const GOOD_JSON: &str = r#"{
        "cdiVersion": "0.6.0",
        "kind": "example.com/device",
        "annotations": {"owner": "lab"},
        "containerEdits": {"env": ["COMMON=1"]},
        "devices": [
            {
                "name": "dev0",
                "containerEdits": {
                    "env": ["DEV=0"],
                    "deviceNodes": [{"path": "/dev/card0", "hostPath": "/dev/dri/card0",
                                     "type": "c", "major": 226, "minor": 0,
                                     "permissions": "rw"}],
                    "mounts": [{"hostPath": "/usr/lib/acme", "containerPath": "/usr/lib/acme",
                                "type": "none", "options": ["ro", "bind"]}]
                }
            },
            {"name": "1", "containerEdits": {"env": ["DEV=1"]}}
        ]
    }"#;

    #[test]
    fn a_json_spec_reads_whole() {
        let s = json(GOOD_JSON).unwrap();
        assert_eq!(s.kind(), "example.com/device");
        assert_eq!(s.version(), "0.6.0");
        assert_eq!(s.annotations()["owner"], "lab");
        assert_eq!(s.container_edits().env, ["COMMON=1"]);
        assert_eq!(s.devices().len(), 2);
        let d = s.device("dev0").unwrap();
        assert_eq!(s.qualified_name(d).to_string(), "example.com/device=dev0");
        let n = &d.container_edits.device_nodes[0];
        assert_eq!(
            (n.path.as_str(), n.host_path.as_str(), n.node_type.as_str()),
            ("/dev/card0", "/dev/dri/card0", "c")
        );
        assert_eq!((n.major, n.minor), (Some(226), Some(0)));
        assert_eq!(d.container_edits.mounts[0].options, ["ro", "bind"]);
        assert!(s.device("dev9").is_none());
    }

    #[test]
    fn a_yaml_spec_reads_whole_and_null_means_absent() {
        let s = yaml(
            "cdiVersion: v1.1.0\nkind: vendor.com/gpu.x\ncontainerEdits:\ndevices:\n\
             - name: gpu0\n  annotations: ~\n  containerEdits:\n    env: [A=1]\n    \
             deviceNodes:\n    - path: /dev/gpu0\n      permissions: none\n",
        )
        .unwrap();
        assert_eq!(s.kind(), "vendor.com/gpu.x");
        assert!(s.container_edits().is_empty());
        assert_eq!(
            s.devices()[0].container_edits.device_nodes[0].permissions,
            "none"
        );
    }

    fn invalid(r: Result<CdiSpec, CdiSpecError>) -> (String, String) {
        match r {
            Err(e @ CdiSpecError::Invalid { .. }) => {
                let msg = e.to_string();
                let CdiSpecError::Invalid { field, .. } = e else {
                    unreachable!()
                };
                (field, msg)
            }
            other => panic!("expected an invalid spec, got {other:?}"),
        }
    }

    fn one_device(edits: &str) -> String {
        format!(
            r#"{{"cdiVersion": "1.1.0", "kind": "example.com/device",
                "devices": [{{"name": "dev0", "containerEdits": {edits}}}]}}"#
        )
    }

    #[test]
    fn rule_breaks_name_the_file_and_the_field() {
        let p = "devices[0].containerEdits";
        for (text, field, why) in [
            (
                one_device(r#"{"deviceNodes": [{"path": "dev/x"}]}"#),
                format!("{p}.deviceNodes[0].path"),
                "must be an absolute path",
            ),
            (
                one_device(r#"{"deviceNodes": [{"path": "/dev/x", "hostPath": "x"}]}"#),
                format!("{p}.deviceNodes[0].hostPath"),
                "must be an absolute path",
            ),
            (
                one_device(r#"{"deviceNodes": [{"path": "/dev/x", "type": "z"}]}"#),
                format!("{p}.deviceNodes[0].type"),
                "expected b, c, u or p",
            ),
            (
                one_device(r#"{"deviceNodes": [{"path": "/dev/x", "permissions": "rwx"}]}"#),
                format!("{p}.deviceNodes[0].permissions"),
                "one or more of r, w and m",
            ),
            (
                one_device(r#"{"env": ["A=1", "NOVALUE"]}"#),
                format!("{p}.env[1]"),
                "expected NAME=VALUE",
            ),
            (
                one_device(r#"{"env": ["=1"]}"#),
                format!("{p}.env[0]"),
                "the name is empty",
            ),
            (
                one_device(r#"{"env": ["A=\u0000"]}"#),
                format!("{p}.env[0]"),
                "NUL",
            ),
            (
                one_device(r#"{"mounts": [{"hostPath": "/a", "containerPath": "/b/../../etc"}]}"#),
                format!("{p}.mounts[0].containerPath"),
                "must not contain \"..\"",
            ),
            (
                one_device(r#"{"mounts": [{"hostPath": "", "containerPath": "/b"}]}"#),
                format!("{p}.mounts[0].hostPath"),
                "must be an absolute path, not empty",
            ),
            (
                one_device(r#"{"hooks": [{"hookName": "onBoot", "path": "/bin/true"}]}"#),
                format!("{p}.hooks[0].hookName"),
                "unknown hook",
            ),
            (
                one_device(r#"{"hooks": [{"hookName": "prestart", "path": "true"}]}"#),
                format!("{p}.hooks[0].path"),
                "must be an absolute path",
            ),
            (
                one_device(r#"{"hooks": [{"hookName": "prestart", "path": "/t", "timeout": 0}]}"#),
                format!("{p}.hooks[0].timeout"),
                "greater than zero",
            ),
            (
                one_device(r#"{"intelRdt": {"closID": ".."}}"#),
                format!("{p}.intelRdt.closID"),
                "file name",
            ),
            (
                one_device(
                    r#"{"netDevices": [{"hostInterfaceName": "eth0", "name": "a"},
                                       {"hostInterfaceName": "eth0", "name": "b"}]}"#,
                ),
                format!("{p}.netDevices[1].hostInterfaceName"),
                "netDevices[0]",
            ),
            (one_device("{}"), p.to_string(), "at least one edit"),
            (
                r#"{"cdiVersion": "9.9.9", "kind": "a.com/b", "devices": []}"#.into(),
                "cdiVersion".into(),
                "\"9.9.9\": unsupported",
            ),
            (
                r#"{"cdiVersion": "0.2.0", "kind": "a.com/b", "devices": []}"#.into(),
                "cdiVersion".into(),
                "unsupported",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "nokind", "devices": []}"#.into(),
                "kind".into(),
                "expected vendor/class",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "a.com/b/c", "devices": []}"#.into(),
                "kind".into(),
                "not allowed",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": []}"#.into(),
                "devices".into(),
                "at least one device",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [
                    {"name": "-x", "containerEdits": {"env": ["A=1"]}}]}"#
                    .into(),
                "devices[0].name".into(),
                "must start with a letter or digit",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "a.com/b", "devices": [
                    {"name": "x", "containerEdits": {"env": ["A=1"]}},
                    {"name": "y", "containerEdits": {"env": ["A=1"]}},
                    {"name": "x", "containerEdits": {"env": ["A=2"]}}]}"#
                    .into(),
                "devices[2].name".into(),
                "\"x\" is also the name of devices[0]",
            ),
            (
                r#"{"cdiVersion": "0.4.0", "kind": "a.com/b", "devices": [
                    {"name": "x", "containerEdits": {"deviceNodes": [
                        {"path": "/dev/a", "hostPath": "/dev/b"}]}}]}"#
                    .into(),
                "cdiVersion".into(),
                "too old for devices[0].containerEdits.deviceNodes[0].hostPath, which needs \
                 at least 0.5.0",
            ),
            (
                r#"{"cdiVersion": "0.5.0", "kind": "a.com/b.c", "devices": [
                    {"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#
                    .into(),
                "cdiVersion".into(),
                "too old for kind, which needs at least 0.6.0",
            ),
            (
                one_device(r#"{"intelRdt": {"schemata": []}}"#).replace("1.1.0", "1.0.0"),
                "cdiVersion".into(),
                "needs at least 1.1.0",
            ),
            (
                r#"{"cdiVersion": "0.6.0", "kind": "a.com/b", "annotations": {"": "x"},
                    "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}"#
                    .into(),
                "annotations".into(),
                "empty key",
            ),
        ] {
            let (got_field, msg) = invalid(json(&text));
            assert_eq!(got_field, field, "{msg}");
            assert!(
                msg.starts_with(&format!("/etc/cdi/acme.json: {field}: ")),
                "{msg}"
            );
            assert!(msg.contains(why), "{msg} (wanted {why:?})");
        }
    }

    #[test]
    fn parse_errors_name_the_line_and_the_field() {
        let e = yaml("cdiVersion: 1.1.0\nkind: a.com/b\ndevices:\n- name: x\n  bogus: 1\n")
            .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CdiSpecError::Syntax { .. }), "{e:?}");
        assert!(msg.starts_with("/etc/cdi/acme.yaml:5: devices[0]"), "{msg}");
        assert!(msg.contains("unknown field `bogus`"), "{msg}");

        let e =
            yaml("cdiVersion: 1.1.0\nkind: a.com/b\ndevices:\n  - name: x\n bad: [\n").unwrap_err();
        assert_eq!(e.line(), Some(5), "{e}");
        assert!(e.to_string().starts_with("/etc/cdi/acme.yaml:5: "), "{e}");

        let e = json("{\n\"cdiVersion\": \"1.1.0\",\n\"kind\": 7}").unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.line(), Some(3), "{msg}");
        assert_eq!(e.field(), Some("kind"), "{msg}");
        assert!(
            msg.contains("invalid type: integer, expected a string"),
            "{msg}"
        );

        let e = json(r#"{"cdiVersion": "1.1.0", "kind": "a/b"}"#).unwrap_err();
        assert!(e.to_string().contains("missing field `devices`"), "{e}");

        let e = json(&one_device(
            r#"{"deviceNodes": [{"path": "/x", "uid": "secret"}]}"#,
        ))
        .unwrap_err();
        let msg = e.to_string();
        assert_eq!(
            e.field(),
            Some("devices[0].containerEdits.deviceNodes[0].uid"),
            "{msg}"
        );
        assert!(!msg.contains("secret"), "{msg}");

        let e = json(&format!("{} x", one_device(r#"{"env": ["A=1"]}"#))).unwrap_err();
        assert!(e.to_string().contains("trailing characters"), "{e}");

        let e = yaml("   \n").unwrap_err();
        assert!(e.to_string().contains("empty file"), "{e}");
    }

    #[test]
    fn hostile_input_is_refused_without_panicking() {
        let deep_json = "[".repeat(100_000);
        let e = json(&deep_json).unwrap_err();
        assert!(matches!(e, CdiSpecError::Bounds { .. }), "{e}");

        // Deep flow collections are refused before the parser sees them; deep block
        // collections cost the parser little, and berth's types never descend into them.
        for deep_yaml in [
            "[".repeat(100_000),
            format!("devices:\n  - {}", "{".repeat(65)),
        ] {
            let e = yaml(&deep_yaml).unwrap_err();
            assert!(matches!(e, CdiSpecError::Bounds { .. }), "{e}");
            assert!(e.to_string().contains("nesting deeper than 64"), "{e}");
        }
        assert_eq!(
            yaml(&format!("devices:\n  - {}", "{".repeat(65)))
                .unwrap_err()
                .line(),
            Some(2)
        );
        let e = yaml(&format!("annotations:\n{}", "- ".repeat(100_000))).unwrap_err();
        assert!(matches!(e, CdiSpecError::Syntax { .. }), "{e}");
        // Closed brackets do not add up.
        let flat = format!(
            "cdiVersion: 1.1.0\nkind: a.com/b\ndevices:\n{}",
            (0..200)
                .map(|i| format!("- {{name: d{i}, containerEdits: {{env: [A=1]}}}}\n"))
                .collect::<String>()
        );
        assert_eq!(yaml(&flat).unwrap().devices().len(), 200);

        let big = format!("# {}\n", "x".repeat(berth_input::MAX_SPEC_BYTES));
        let e = yaml(&big).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");

        let laughs = "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n\
                      c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c]\n\
                      e: &e [*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e]\n\
                      g: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n";
        assert!(yaml(laughs).is_err());

        for text in [
            "---\na: 1\n---\nb: 2\n",
            "\u{0}",
            "cdiVersion: [",
            "!!binary aGVsbG8=",
            "{\"cdiVersion\": \"\\ud800\"}",
            "*x",
            "- - -",
        ] {
            assert!(yaml(text).is_err(), "{text:?}");
            assert!(json(text).is_err(), "{text:?}");
        }
        assert!(matches!(
            CdiSpec::parse(Path::new("/etc/cdi/a.toml"), "x"),
            Err(CdiSpecError::NotSpecFile { .. })
        ));
    }
}
