//! Volume specs: the files `berth volume register` and `berth volume create` read, compatible
//! with Nomad's (`nomad volume register/create`) for CSI volumes.
//!
//! A spec is HCL, or JSON (HCL's JSON form, as Nomad's `volume init -json` writes it: blocks
//! and maps may be wrapped in lists). It is checked whole and the first problem is returned as
//! a [`SpecError`] naming the file, the line when known (HCL), and the field. Secret values and
//! mount flags never appear in an error or in `Debug` output; hcl's syntax errors are stripped
//! of the source line they quote.
//!
//! HCL is read by `hcl-rs` (HCL2) with literal values only. Nomad reads volume specs as HCL1,
//! and its documented examples use forms HCL2 refuses (nested one-line blocks, commas between
//! a block's attributes, quoted keys in a block); when HCL2 refuses a text, those forms are
//! rewritten and it is parsed again, so Nomad's files work as they are.
//!
//! One struct serves both commands: [`VolumeSpec`] holds what they share, and its [`SpecKind`]
//! what only one of them takes. Which command a file is for is given by the caller
//! ([`Operation`]), as Nomad's CLI does. As Nomad treats them, the other command's fields are
//! accepted, so the file `nomad volume init` writes works with both; what is not used is named
//! in [`VolumeSpec::warnings`] (never with its value):
//!
//! - `external_id` (required for register) and `context` are ignored by create: a created
//!   volume gets both from the plugin;
//! - `snapshot_id`, `clone_id` and `topology_request.preferred` are ignored by register;
//!   `capacity_min` and `capacity_max` are recorded (the volume's capacity);
//! - empty `topology {}` / `segments {}` name no place and are skipped;
//! - a job spec is refused with the command that takes it.
//!
//! As in Nomad, an empty string counts as not given for every optional string field, so
//! `capacity_min = ""` in a register spec is accepted. `namespace` is accepted only as
//! `"default"` (berth has no namespaces). In JSON, a key given twice keeps its last value.
//!
//! Before either parser runs, the text is checked by [`berth_input::check_text`]: at most
//! 1 MiB, nested at most 64 levels. Values an error repeats are escaped and cut
//! ([`berth_input::Quoted`]), and so is the file name, which an API client chooses.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use berth_csi::{
    CapacityRange, ContentSource, CreateVolume,
    model::{
        AccessMode, AttachmentMode, ExternalId, ModelError, MountFlags, MountOptions, Secrets,
        VolumeCapability, validate_fs_type,
    },
    pb,
};
use berth_input::{Quoted, Shown, Syntax, TextError, check_text, quoted_list, read_text};
use serde_json::{Map, Value};

use crate::{
    field::FieldPath,
    hcl_input::{self, Node, Scan},
    size::parse_size,
    usage::check_mount_flags,
};

/// CSI's size limit for a string field, in bytes (ids, names, snapshot ids).
pub const MAX_STRING_BYTES: usize = 128;
/// CSI's size limit for a `map<string, string>` field, keys and values together, in bytes.
pub const MAX_MAP_BYTES: usize = 4096;

/// A problem with a spec: the file, the line when known, the field, and what is wrong.
///
/// Displays as `file:line: field: message` (no `:line` when unknown, no `field: ` for syntax
/// errors), the file name with control characters escaped and cut to
/// [`berth_input::MAX_SHOWN_CHARS`] characters. Never contains a secret value or a mount flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {field}{}{message}", Shown(&file.to_string_lossy()), line.map(|l| format!(":{l}")).unwrap_or_default(), if field.is_empty() { "" } else { ": " })]
pub struct SpecError {
    /// The spec file (or whatever the caller named the input, e.g. `request body`).
    pub file: PathBuf,
    /// 1-based line, when known (HCL input; JSON syntax errors).
    pub line: Option<usize>,
    /// The field, e.g. `capability[1].access_mode`; empty for syntax errors.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Which command a spec is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `volume register`: the volume exists at the provider; `external_id` names it.
    Register,
    /// `volume create`: the plugin creates it (CreateVolume).
    Create,
}

/// What only one of the two commands takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecKind {
    /// A spec for `volume register`.
    Register {
        /// The provider's id of the volume.
        external_id: ExternalId,
        /// `capacity_min` in bytes, recorded as the volume's capacity when no
        /// `capacity_max` is given.
        capacity_min: Option<u64>,
        /// `capacity_max` in bytes, recorded as the volume's capacity.
        capacity_max: Option<u64>,
    },
    /// A spec for `volume create`.
    Create {
        /// `capacity_min` in bytes (at most `i64::MAX`).
        capacity_min: Option<u64>,
        /// `capacity_max` in bytes (at most `i64::MAX`, and not below `capacity_min`).
        capacity_max: Option<u64>,
        /// `snapshot_id` or `clone_id` (never both).
        source: Option<ContentSource>,
    },
}

/// `topology_request`: where the volume must (required) or should (preferred) be reachable from.
/// Each topology is a non-empty map of segments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologyRequest {
    /// On create: at least one of these must reach the volume. On register: the volume is
    /// reachable from all of them.
    pub required: Vec<BTreeMap<String, String>>,
    /// Create only; in order of preference. When `required` is given too, each of these is
    /// one of `required` (a CSI rule).
    pub preferred: Vec<BTreeMap<String, String>>,
}

impl TopologyRequest {
    /// The wire form (`requisite` = required).
    pub fn to_pb(&self) -> pb::TopologyRequirement {
        let topo = |t: &BTreeMap<String, String>| pb::Topology {
            segments: t.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        pb::TopologyRequirement {
            requisite: self.required.iter().map(topo).collect(),
            preferred: self.preferred.iter().map(topo).collect(),
        }
    }
}

/// A checked volume spec.
///
/// Guarantees: `id` and `plugin_id` are valid path segments; `capabilities` is non-empty with no
/// two alike, and every file-system capability carries `mount_options`; mount flags total at most
/// 4 KiB; `secrets`, `parameters` and `context` are each at most [`MAX_MAP_BYTES`]; the
/// command-specific fields are in [`SpecKind`]. Not `Serialize`: it holds [`Secrets`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// berth's id of the volume.
    pub id: String,
    /// Display name (and CreateVolume's `name`); the id when not given.
    pub name: String,
    /// The CSI plugin that serves it.
    pub plugin_id: String,
    /// `capability` blocks in file order; file-system ones carry `mount_options`.
    pub capabilities: Vec<VolumeCapability>,
    /// `mount_options`; empty when not given. Only with a file-system capability.
    pub mount_options: MountOptions,
    /// `topology_request`, when it names any topology.
    pub topology_request: Option<TopologyRequest>,
    /// `secrets`; never printed.
    pub secrets: Secrets,
    /// `parameters`, passed to the plugin as is.
    pub parameters: BTreeMap<String, String>,
    /// `context` (register only; empty for create).
    pub context: BTreeMap<String, String>,
    /// Register- or create-only fields.
    pub kind: SpecKind,
    /// What was accepted but is not used (fields Nomad takes for the other command); shown to
    /// the user, never holding a value.
    pub warnings: Vec<String>,
}

impl VolumeSpec {
    /// Reads and checks `file` for `op`: JSON when its name ends in `.json`, HCL otherwise.
    /// Reads at most one byte past the 1 MiB a spec may take.
    pub fn load(op: Operation, file: &Path) -> Result<Self, SpecError> {
        let text = read_text(file).map_err(|e| SpecError {
            file: file.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(op, file, &text)
    }

    /// Checks `text` as the contents of `file`: JSON when `file` ends in `.json`, HCL otherwise.
    pub fn parse(op: Operation, file: &Path, text: &str) -> Result<Self, SpecError> {
        if file.extension().is_some_and(|e| e == "json") {
            Self::parse_json(op, file, text)
        } else {
            Self::parse_hcl(op, file, text)
        }
    }

    /// Checks `text` as HCL; `file` only names it in errors.
    pub fn parse_hcl(op: Operation, file: &Path, text: &str) -> Result<Self, SpecError> {
        check_text(Syntax::Hcl, text).map_err(|e| text_error(file, e))?;
        let scan = Scan::new(text);
        let body = match hcl::parse(text) {
            Ok(body) => body,
            // Maybe Nomad's HCL1 forms: try again rewritten as HCL2.
            Err(e) => match scan.hcl2() {
                None => return Err(hcl_syntax_error(file, &e, None)),
                Some((hcl2, lines)) => hcl::parse(&hcl2).map_err(|e2| {
                    let mapped = hcl_syntax_error(file, &e2, Some(&lines));
                    let first = hcl_syntax_error(file, &e, None);
                    // The same place: the original error has the right column too.
                    if first.line == mapped.line {
                        first
                    } else {
                        mapped
                    }
                })?,
            },
        };
        let cx = Cx {
            file,
            outline: Some(scan.outline),
            warnings: Default::default(),
        };
        if body.blocks().any(|b| b.identifier() == "job") {
            return Err(cx.err(
                &FieldPath::root().key("job"),
                "this is a job spec: run it with `berth job run`",
            ));
        }
        let root = hcl_input::body_to_json(&body, &FieldPath::root())
            .map_err(|(path, message)| cx.err(&path, message))?;
        check(op, root, &cx)
    }

    /// Checks `text` as JSON (e.g. an API body); `file` only names it in errors.
    pub fn parse_json(op: Operation, file: &Path, text: &str) -> Result<Self, SpecError> {
        check_text(Syntax::Json, text).map_err(|e| text_error(file, e))?;
        let root: Value = serde_json::from_str(text).map_err(|e| SpecError {
            file: file.to_path_buf(),
            line: Some(e.line()).filter(|l| *l > 0),
            field: String::new(),
            message: e.to_string(),
        })?;
        check(
            op,
            root,
            &Cx {
                file,
                outline: None,
                warnings: Default::default(),
            },
        )
    }

    /// Which command the spec is for.
    pub fn operation(&self) -> Operation {
        match self.kind {
            SpecKind::Register { .. } => Operation::Register,
            SpecKind::Create { .. } => Operation::Create,
        }
    }

    /// The provider's id, for a register spec.
    pub fn external_id(&self) -> Option<&ExternalId> {
        match &self.kind {
            SpecKind::Register { external_id, .. } => Some(external_id),
            SpecKind::Create { .. } => None,
        }
    }

    /// The capability for an access and attachment mode, if the spec lists it (a job's volume
    /// request must match one exactly, as in Nomad).
    pub fn capability(
        &self,
        access_mode: AccessMode,
        attachment_mode: AttachmentMode,
    ) -> Option<&VolumeCapability> {
        self.capabilities
            .iter()
            .find(|c| c.access_mode == access_mode && c.attachment_mode() == attachment_mode)
    }

    /// The CreateVolume request of a create spec; `None` for a register spec.
    pub fn create_request(&self) -> Option<CreateVolume> {
        let SpecKind::Create {
            capacity_min,
            capacity_max,
            source,
        } = &self.kind
        else {
            return None;
        };
        // Both are at most i64::MAX (checked when parsed).
        let bytes = |b: Option<u64>| i64::try_from(b.unwrap_or(0)).unwrap_or(i64::MAX);
        Some(CreateVolume {
            name: self.name.clone(),
            capacity: CapacityRange {
                required_bytes: bytes(*capacity_min),
                limit_bytes: bytes(*capacity_max),
            },
            capabilities: self.capabilities.clone(),
            parameters: self.parameters.clone(),
            secrets: self.secrets.clone(),
            source: source.clone(),
            accessibility_requirements: self.topology_request.as_ref().map(TopologyRequest::to_pb),
        })
    }
}

/// A text refused before parsing: too large, or nested too deep.
pub(crate) fn text_error(file: &Path, e: TextError) -> SpecError {
    SpecError {
        file: file.to_path_buf(),
        line: e.line(),
        field: String::new(),
        message: e.to_string(),
    }
}

/// A syntax error, with its line and without the source excerpt hcl adds (it could show a
/// secret). `lines` maps the lines of a rewritten text to the original's; the column is then
/// left out, as it is the rewritten text's. hcl's error is never formatted whole: its `Display`
/// quotes the source line, and panics when the column is past 65535.
fn hcl_syntax_error(file: &Path, e: &hcl::Error, lines: Option<&[usize]>) -> SpecError {
    let (mut line, message) = match e {
        hcl::Error::Parse(p) => {
            let at = p.location();
            let what = p.message().split_whitespace().collect::<Vec<_>>().join(" ");
            let message = match lines {
                None => format!("column {}: {what}", at.column()),
                Some(_) => what,
            };
            (Some(at.line()), message)
        }
        _ => (None, "syntax error".to_string()),
    };
    if let Some(lines) = lines {
        line = line.and_then(|l| lines.get(l.checked_sub(1)?).copied());
    }
    SpecError {
        file: file.to_path_buf(),
        line,
        field: String::new(),
        message,
    }
}

/// Where errors go: the file, and the outline of HCL text for lines.
struct Cx<'a> {
    file: &'a Path,
    outline: Option<Vec<Node>>,
    warnings: std::cell::RefCell<Vec<String>>,
}

type Res<T> = Result<T, SpecError>;

impl Cx<'_> {
    fn err(&self, path: &FieldPath, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.to_path_buf(),
            line: self
                .outline
                .as_deref()
                .and_then(|o| hcl_input::line_of(o, path)),
            field: path.to_string(),
            message: message.into(),
        }
    }

    /// Notes a field accepted but not used: `file:line: field: message`.
    fn warn(&self, path: &FieldPath, message: &str) {
        let e = self.err(path, message);
        self.warnings.borrow_mut().push(e.to_string());
    }

    fn line(&self, path: &FieldPath) -> Option<usize> {
        self.outline
            .as_deref()
            .and_then(|o| hcl_input::line_of(o, path))
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// An optional string; `""` and `null` count as not given.
fn opt_string(cx: &Cx<'_>, path: &FieldPath, v: Option<Value>) -> Res<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(cx.err(
            path,
            format!("expected a string, found {}", kind_of(&other)),
        )),
    }
}

fn required_string(cx: &Cx<'_>, path: &FieldPath, v: Option<Value>, hint: &str) -> Res<String> {
    opt_string(cx, path, v)?.ok_or_else(|| cx.err(path, format!("is required{hint}")))
}

fn check_len(cx: &Cx<'_>, path: &FieldPath, s: &str) -> Res<()> {
    if s.len() > MAX_STRING_BYTES {
        return Err(cx.err(
            path,
            format!(
                "is {} bytes long, more than {MAX_STRING_BYTES} (the CSI limit for a string)",
                s.len()
            ),
        ));
    }
    Ok(())
}

/// Block bodies: one object, or a list of them (HCL's JSON form of repeated blocks).
fn blocks(cx: &Cx<'_>, path: &FieldPath, v: Option<Value>) -> Res<Vec<Map<String, Value>>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => Ok(vec![m]),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(m) => Ok(m),
                other => Err(cx.err(
                    &path.at(i),
                    format!("expected a block (an object), found {}", kind_of(&other)),
                )),
            })
            .collect(),
        Some(other) => Err(cx.err(
            path,
            format!("expected a block (an object), found {}", kind_of(&other)),
        )),
    }
}

/// At most one block.
fn single_block(
    cx: &Cx<'_>,
    path: &FieldPath,
    v: Option<Value>,
) -> Res<Option<Map<String, Value>>> {
    let mut all = blocks(cx, path, v)?;
    if all.len() > 1 {
        return Err(cx.err(&path.at(1), "declared more than once"));
    }
    Ok(all.pop())
}

/// Refuses keys outside `known`, naming the first (in file order when known) and the rest.
fn deny_unknown(cx: &Cx<'_>, path: &FieldPath, m: &Map<String, Value>, known: &[&str]) -> Res<()> {
    let unknown = unknown_keys(cx, path, m, known);
    let Some((first, _)) = unknown.first() else {
        return Ok(());
    };
    let also = also_unknown(unknown[1..].iter().map(|(k, _)| *k));
    Err(cx.err(
        &path.key(first),
        format!("unknown field{also}; expected one of: {}", known.join(", ")),
    ))
}

/// Like [`deny_unknown`], but names no key (the error points at its line): in `mount_options`
/// a stray key could be a mount flag written in the wrong place.
fn deny_unknown_unnamed(
    cx: &Cx<'_>,
    path: &FieldPath,
    m: &Map<String, Value>,
    known: &[&str],
) -> Res<()> {
    match unknown_keys(cx, path, m, known).first() {
        None => Ok(()),
        Some((_, line)) => Err(SpecError {
            line: *line,
            ..cx.err(
                path,
                format!(
                    "unknown field (not repeated: it could be a mount flag); expected one of: {}",
                    known.join(", ")
                ),
            )
        }),
    }
}

/// The keys of `m` outside `known`, in file order when known (by name otherwise), each with its
/// line. Linear in the keys (but for the sort): a spec may hold a hundred thousand of them.
fn unknown_keys<'a>(
    cx: &Cx<'_>,
    path: &FieldPath,
    m: &'a Map<String, Value>,
    known: &[&str],
) -> Vec<(&'a str, Option<usize>)> {
    let lines = cx
        .outline
        .as_deref()
        .map(|o| hcl_input::key_lines(o, path))
        .unwrap_or_default();
    // A key the outline misses points at its parent, as `Cx::err` does.
    let parent = cx.line(path);
    let mut unknown: Vec<(&str, Option<usize>)> = m
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| (k.as_str(), lines.get(k.as_str()).copied().or(parent)))
        .collect();
    unknown.sort_by_key(|(k, line)| (line.unwrap_or(usize::MAX), *k));
    unknown
}

/// ` (also unknown: "a", "b" and 3 more)`, or nothing when `rest` is empty.
fn also_unknown<'a>(rest: impl ExactSizeIterator<Item = &'a str>) -> String {
    if rest.len() == 0 {
        return String::new();
    }
    format!(" (also unknown: {})", quoted_list(rest))
}

/// A `map<string, string>` field: an object (or HCL-JSON's list of objects); numbers and bools
/// become their text. Values never appear in errors.
fn string_map(cx: &Cx<'_>, path: &FieldPath, v: Option<Value>) -> Res<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (i, m) in blocks(cx, path, v)?.into_iter().enumerate() {
        for (k, v) in m {
            let here = path.key(&k);
            let s = match v {
                Value::String(s) => s,
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                other => {
                    return Err(cx.err(
                        &here,
                        format!("expected a string, found {}", kind_of(&other)),
                    ));
                }
            };
            if out.insert(k, s).is_some() {
                return Err(cx.err(&here, format!("given more than once (in block {i})")));
            }
        }
    }
    let bytes: usize = out.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(cx.err(
            path,
            format!("takes {bytes} bytes, more than {MAX_MAP_BYTES} (the CSI limit for a map)"),
        ));
    }
    Ok(out)
}

/// A size: a string like `"10GiB"` or a number of bytes. `""` counts as not given.
fn size(cx: &Cx<'_>, path: &FieldPath, v: Option<Value>) -> Res<Option<(u64, String)>> {
    match v {
        Some(Value::Number(n)) => {
            let b = n.as_u64().ok_or_else(|| {
                cx.err(
                    path,
                    format!("{n} is not a whole, non-negative number of bytes"),
                )
            })?;
            let s = n.to_string();
            parse_size(&s).map_err(|e| cx.err(path, e.to_string()))?;
            Ok(Some((b, s)))
        }
        v => match opt_string(cx, path, v)? {
            None => Ok(None),
            Some(s) => {
                let b = parse_size(&s).map_err(|e| cx.err(path, e.to_string()))?;
                Ok(Some((b, s)))
            }
        },
    }
}

const TOP: &[&str] = &[
    "id",
    "name",
    "type",
    "namespace",
    "plugin_id",
    "external_id",
    "capacity_min",
    "capacity_max",
    "snapshot_id",
    "clone_id",
    "capability",
    "mount_options",
    "topology_request",
    "secrets",
    "parameters",
    "context",
];

fn check(op: Operation, root: Value, cx: &Cx<'_>) -> Res<VolumeSpec> {
    let top = FieldPath::root();
    let Value::Object(mut m) = root else {
        return Err(cx.err(
            &top,
            format!(
                "a volume spec is an object of fields, found {}",
                kind_of(&root)
            ),
        ));
    };
    let f = |name: &str| top.key(name);
    if m.contains_key("job") && !m.contains_key("plugin_id") {
        return Err(cx.err(&f("job"), "this is a job spec: run it with `berth job run`"));
    }

    // type first: a host volume spec is refused for its type, not its fields.
    let ty = required_string(cx, &f("type"), m.remove("type"), " (type = \"csi\")")?;
    if !ty.eq_ignore_ascii_case("csi") {
        return Err(cx.err(
            &f("type"),
            format!(
                "{}: berth handles CSI volumes only (type = \"csi\")",
                Quoted(&ty)
            ),
        ));
    }
    deny_unknown(cx, &top, &m, TOP)?;
    if let Some(ns) = opt_string(cx, &f("namespace"), m.remove("namespace"))?
        && ns != "default"
    {
        return Err(cx.err(
            &f("namespace"),
            format!("{}: berth has one namespace, \"default\"", Quoted(&ns)),
        ));
    }

    // ids
    let id = required_string(cx, &f("id"), m.remove("id"), "")?;
    berth_sys::validate_path_segment("volume id", &id)
        .map_err(|e| cx.err(&f("id"), e.to_string()))?;
    let plugin_id = required_string(cx, &f("plugin_id"), m.remove("plugin_id"), "")?;
    berth_sys::validate_path_segment("plugin id", &plugin_id)
        .map_err(|e| cx.err(&f("plugin_id"), e.to_string()))?;
    let name = opt_string(cx, &f("name"), m.remove("name"))?.unwrap_or_else(|| id.clone());
    if op == Operation::Create {
        check_len(cx, &f("name"), &name)?;
    }

    // capability
    let cap_path = f("capability");
    let raw_caps = blocks(cx, &cap_path, m.remove("capability"))?;
    if raw_caps.is_empty() {
        return Err(cx.err(
            &cap_path,
            "at least one capability block is required, e.g. capability { access_mode = \"single-node-writer\", attachment_mode = \"file-system\" }",
        ));
    }
    let mut modes: Vec<(AccessMode, AttachmentMode)> = Vec::new();
    for (i, mut c) in raw_caps.into_iter().enumerate() {
        let here = cap_path.at(i);
        deny_unknown(cx, &here, &c, &["access_mode", "attachment_mode"])?;
        let ap = here.key("access_mode");
        let access = required_string(cx, &ap, c.remove("access_mode"), "")?;
        let access: AccessMode = access.parse().map_err(|_| {
            let all: Vec<&str> = AccessMode::ALL.iter().map(|m| m.as_str()).collect();
            cx.err(
                &ap,
                format!(
                    "unknown access mode {} (expected one of {})",
                    Quoted(&access),
                    all.join(", ")
                ),
            )
        })?;
        let tp = here.key("attachment_mode");
        let attach = required_string(cx, &tp, c.remove("attachment_mode"), "")?;
        let attach: AttachmentMode = attach.parse().map_err(|_| {
            cx.err(
                &tp,
                format!(
                    "unknown attachment mode {} (expected file-system or block-device)",
                    Quoted(&attach)
                ),
            )
        })?;
        if let Some(j) = modes.iter().position(|m| *m == (access, attach)) {
            return Err(cx.err(&here, format!("same as capability[{j}]")));
        }
        modes.push((access, attach));
    }

    // mount_options
    let mo_path = f("mount_options");
    let mut mount_options = MountOptions::default();
    if let Some(mut mo) = single_block(cx, &mo_path, m.remove("mount_options"))? {
        deny_unknown_unnamed(cx, &mo_path, &mo, &["fs_type", "mount_flags"])?;
        let fs_path = mo_path.key("fs_type");
        mount_options.fs_type = opt_string(cx, &fs_path, mo.remove("fs_type"))?.unwrap_or_default();
        check_fs_type(&mount_options.fs_type).map_err(|m| cx.err(&fs_path, m))?;
        let fp = mo_path.key("mount_flags");
        let flags = match mo.remove("mount_flags") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s),
                    other => Err(cx.err(
                        &fp.at(i),
                        format!("expected a string, found {}", kind_of(&other)),
                    )),
                })
                .collect::<Res<_>>()?,
            Some(other) => {
                return Err(cx.err(
                    &fp,
                    format!("expected a list of strings, found {}", kind_of(&other)),
                ));
            }
        };
        let flags = MountFlags::new(flags);
        check_mount_flags(&flags).map_err(|e| cx.err(&fp, e.to_string()))?;
        mount_options.mount_flags = flags;
        if mount_options != MountOptions::default()
            && !modes.iter().any(|(_, a)| *a == AttachmentMode::FileSystem)
        {
            return Err(cx.err(
                &mo_path,
                "apply to file-system capabilities only, and every capability here is block-device",
            ));
        }
    }
    let capabilities = modes
        .iter()
        .map(|(access, attach)| match attach {
            AttachmentMode::FileSystem => VolumeCapability::mount(*access, mount_options.clone()),
            AttachmentMode::BlockDevice => VolumeCapability::block(*access),
        })
        .collect();

    // topology_request
    let tr_path = f("topology_request");
    let mut topology_request = None;
    if let Some(tr) = single_block(cx, &tr_path, m.remove("topology_request"))? {
        deny_unknown(cx, &tr_path, &tr, &["required", "preferred"])?;
        let mut tr = tr;
        let required = topologies(cx, &tr_path.key("required"), tr.remove("required"))?;
        let pp = tr_path.key("preferred");
        let preferred = topologies(cx, &pp, tr.remove("preferred"))?;
        let preferred = if op == Operation::Register && !preferred.is_empty() {
            cx.warn(&pp, "ignored: a registered volume already has its place");
            Vec::new()
        } else {
            preferred
        };
        let required: Vec<_> = required.into_iter().map(|(t, _)| t).collect();
        // A set: a spec may list thousands of topologies.
        let required_set: BTreeSet<&BTreeMap<String, String>> = required.iter().collect();
        if !required.is_empty()
            && let Some((_, at)) = preferred.iter().find(|(p, _)| !required_set.contains(p))
        {
            return Err(cx.err(
                at,
                "is not one of the required topologies (CSI: when both are given, every preferred topology must be required too)",
            ));
        }
        if !required.is_empty() || !preferred.is_empty() {
            topology_request = Some(TopologyRequest {
                required,
                preferred: preferred.into_iter().map(|(t, _)| t).collect(),
            });
        }
    }

    // maps
    let secrets = Secrets::new(string_map(cx, &f("secrets"), m.remove("secrets"))?);
    let parameters = string_map(cx, &f("parameters"), m.remove("parameters"))?;
    let context = string_map(cx, &f("context"), m.remove("context"))?;

    // command-specific fields
    let ext = opt_string(cx, &f("external_id"), m.remove("external_id"))?;
    let cmin = size(cx, &f("capacity_min"), m.remove("capacity_min"))?;
    let cmax = size(cx, &f("capacity_max"), m.remove("capacity_max"))?;
    let snapshot = opt_string(cx, &f("snapshot_id"), m.remove("snapshot_id"))?;
    let clone = opt_string(cx, &f("clone_id"), m.remove("clone_id"))?;
    let kind = match op {
        Operation::Register => {
            for (field, given) in [
                ("snapshot_id", snapshot.is_some()),
                ("clone_id", clone.is_some()),
            ] {
                if given {
                    cx.warn(
                        &f(field),
                        "ignored: a registered volume already exists at the provider",
                    );
                }
            }
            check_capacity_range(cx, &f, &cmin, &cmax)?;
            let ep = f("external_id");
            let ext = ext.ok_or_else(|| {
                cx.err(
                    &ep,
                    "is required to register a volume: the provider's id of it",
                )
            })?;
            check_len(cx, &ep, &ext)?;
            SpecKind::Register {
                external_id: ExternalId::new(ext).map_err(|e| cx.err(&ep, e.to_string()))?,
                capacity_min: cmin.map(|(b, _)| b),
                capacity_max: cmax.map(|(b, _)| b),
            }
        }
        Operation::Create => {
            if ext.is_some() {
                cx.warn(
                    &f("external_id"),
                    "ignored: the plugin chooses the id of a volume it creates",
                );
            }
            if !context.is_empty() {
                cx.warn(
                    &f("context"),
                    "ignored: the plugin returns the context of a volume it creates",
                );
            }
            check_capacity_range(cx, &f, &cmin, &cmax)?;
            let source = match (snapshot, clone) {
                (Some(_), Some(_)) => {
                    return Err(cx.err(&f("clone_id"), "give snapshot_id or clone_id, not both"));
                }
                (Some(s), None) => {
                    check_len(cx, &f("snapshot_id"), &s)?;
                    Some(ContentSource::Snapshot(s))
                }
                (None, Some(c)) => {
                    check_len(cx, &f("clone_id"), &c)?;
                    Some(ContentSource::Volume(
                        ExternalId::new(c).map_err(|e| cx.err(&f("clone_id"), e.to_string()))?,
                    ))
                }
                (None, None) => None,
            };
            SpecKind::Create {
                capacity_min: cmin.map(|(b, _)| b),
                capacity_max: cmax.map(|(b, _)| b),
                source,
            }
        }
    };

    let context = if op == Operation::Create {
        BTreeMap::new()
    } else {
        context
    };
    Ok(VolumeSpec {
        id,
        name,
        plugin_id,
        capabilities,
        mount_options,
        topology_request,
        secrets,
        parameters,
        context,
        kind,
        warnings: cx.warnings.take(),
    })
}

/// `capacity_min` not above `capacity_max`.
fn check_capacity_range(
    cx: &Cx<'_>,
    f: &dyn Fn(&str) -> FieldPath,
    cmin: &Option<(u64, String)>,
    cmax: &Option<(u64, String)>,
) -> Res<()> {
    if let (Some((min, min_s)), Some((max, max_s))) = (cmin, cmax)
        && min > max
    {
        return Err(cx.err(
            &f("capacity_min"),
            format!(
                "{} ({min} bytes) is more than capacity_max {} ({max} bytes)",
                Quoted(min_s),
                Quoted(max_s)
            ),
        ));
    }
    Ok(())
}

/// Checks a spec's `mount_options.fs_type` with [`validate_fs_type`] (empty passes: the
/// plugin's default). The error is the message of a [`SpecError`] naming the field: it repeats
/// neither the field nor the value (which may be anything, of any size).
pub fn check_fs_type(fs_type: &str) -> Result<(), String> {
    validate_fs_type("mount_options.fs_type", fs_type).map_err(|e| match e {
        ModelError::InvalidFsType { len, .. } => format!(
            "not a filesystem type ({len} bytes; expected at most {} of a-z, A-Z, 0-9, '.', '_', '-')",
            berth_csi::model::MAX_FS_TYPE_LEN
        ),
        _ => "not a filesystem type".to_string(),
    })
}

/// `required { topology { segments { … } } … }` or its JSON form. Repeated `required` blocks
/// add up (Nomad's JSON form writes one per topology). Returns each topology with its path.
fn topologies(
    cx: &Cx<'_>,
    path: &FieldPath,
    v: Option<Value>,
) -> Res<Vec<(BTreeMap<String, String>, FieldPath)>> {
    let all = blocks(cx, path, v)?;
    let many = all.len() > 1;
    let mut out = Vec::new();
    for (j, mut b) in all.into_iter().enumerate() {
        let bp = if many { path.at(j) } else { path.clone() };
        deny_unknown(cx, &bp, &b, &["topology"])?;
        let tp = bp.key("topology");
        for (k, mut t) in blocks(cx, &tp, b.remove("topology"))?
            .into_iter()
            .enumerate()
        {
            let here = tp.at(k);
            deny_unknown(cx, &here, &t, &["segments"])?;
            let sp = here.key("segments");
            let segments = string_map(cx, &sp, t.remove("segments"))?;
            // An empty topology (`topology {}` or `segments {}`), as Nomad's template has,
            // names no place: skipped.
            if segments.is_empty() {
                continue;
            }
            if let Some((k, _)) = segments.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(cx.err(&sp.key(k), "segment keys and values must not be empty"));
            }
            out.push((segments, here));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-swordfish";
    const FLAG: &str = "password=hunter2";

    fn hcl(op: Operation, text: &str) -> Res<VolumeSpec> {
        VolumeSpec::parse(op, Path::new("/specs/vol.hcl"), text)
    }

    fn json(op: Operation, text: &str) -> Res<VolumeSpec> {
        VolumeSpec::parse(op, Path::new("/specs/vol.json"), text)
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Nomad's register example (its `volume init` file, register fields only), with a secret.
    const REGISTER_HCL: &str = r#"
id        = "ebs_prod_db1"
namespace = "default"
name      = "database"
type      = "csi"
plugin_id = "plugin_id"

# The provider's id.
external_id = "vol-23452345"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime", "password=hunter2"]
}

topology_request {
  required {
    topology { segments { rack = "R1" } }
    topology { segments { rack = "R2", zone = "us-east-1a" } }
  }
}

secrets {
  example_secret = "s3cr3t-swordfish"
}

parameters {
  skuname = "Premium_LRS"
  iops    = 3000
}

context {
  endpoint = "http://192.168.1.101:9425"
}
"#;

    /// The same in HCL's JSON form, as Nomad writes it (maps and blocks as lists).
    const REGISTER_JSON: &str = r#"{
  "id": "ebs_prod_db1",
  "namespace": "default",
  "name": "database",
  "type": "csi",
  "plugin_id": "plugin_id",
  "external_id": "vol-23452345",
  "capability": [
    {"access_mode": "single-node-writer", "attachment_mode": "file-system"},
    {"access_mode": "single-node-reader-only", "attachment_mode": "block-device"}
  ],
  "mount_options": [{"fs_type": "ext4", "mount_flags": ["noatime", "password=hunter2"]}],
  "topology_request": {
    "required": [
      {"topology": {"segments": {"rack": "R1"}}},
      {"topology": {"segments": {"rack": "R2", "zone": "us-east-1a"}}}
    ]
  },
  "secrets": [{"example_secret": "s3cr3t-swordfish"}],
  "parameters": [{"skuname": "Premium_LRS", "iops": 3000}],
  "context": [{"endpoint": "http://192.168.1.101:9425"}]
}"#;

    /// Nomad's create example (its volume specification page), attribute-style maps.
    const CREATE_HCL: &str = r#"
id           = "ebs_prod_db1"
namespace    = "default"
name         = "database"
type         = "csi"
plugin_id    = "ebs-prod"
snapshot_id  = "snap-12345" # or clone_id, see below
capacity_max = "200G"
capacity_min = "100G"

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

topology_request {
  required {
    topology { segments { "rack" = "R2" } }
    topology { segments { "rack" = "R1", "zone" = "us-east-1a" } }
  }
  preferred {
    topology { segments { "rack" = "R1", "zone" = "us-east-1a" } }
  }
}

secrets = {
  example_secret = "s3cr3t-swordfish"
}

parameters = {
  skuname = "Premium_LRS"
}
"#;

    const CREATE_JSON: &str = r#"{
  "id": "ebs_prod_db1", "namespace": "default", "name": "database", "type": "csi",
  "plugin_id": "ebs-prod", "snapshot_id": "snap-12345",
  "capacity_max": "200G", "capacity_min": "100G",
  "capability": [
    {"access_mode": "single-node-reader-only", "attachment_mode": "file-system"},
    {"access_mode": "single-node-writer", "attachment_mode": "file-system"}
  ],
  "mount_options": {"fs_type": "ext4", "mount_flags": ["noatime"]},
  "topology_request": {
    "required": {"topology": [
      {"segments": {"rack": "R2"}},
      {"segments": {"rack": "R1", "zone": "us-east-1a"}}
    ]},
    "preferred": {"topology": {"segments": {"rack": "R1", "zone": "us-east-1a"}}}
  },
  "secrets": {"example_secret": "s3cr3t-swordfish"},
  "parameters": {"skuname": "Premium_LRS"}
}"#;

    #[test]
    fn a_nomad_register_spec_parses() {
        let s = hcl(Operation::Register, REGISTER_HCL).unwrap();
        assert_eq!(s.id, "ebs_prod_db1");
        assert_eq!(s.name, "database");
        assert_eq!(s.plugin_id, "plugin_id");
        assert_eq!(s.operation(), Operation::Register);
        assert_eq!(s.external_id().unwrap().as_str(), "vol-23452345");
        assert_eq!(s.mount_options.fs_type, "ext4");
        assert_eq!(s.mount_options.mount_flags.expose(), ["noatime", FLAG]);
        assert_eq!(
            s.capabilities,
            vec![
                VolumeCapability::mount(AccessMode::SingleNodeWriter, s.mount_options.clone()),
                VolumeCapability::block(AccessMode::SingleNodeReaderOnly),
            ]
        );
        assert!(
            s.capability(
                AccessMode::SingleNodeReaderOnly,
                AttachmentMode::BlockDevice
            )
            .is_some()
        );
        assert!(
            s.capability(AccessMode::SingleNodeReaderOnly, AttachmentMode::FileSystem)
                .is_none()
        );
        assert_eq!(
            s.topology_request,
            Some(TopologyRequest {
                required: vec![
                    map(&[("rack", "R1")]),
                    map(&[("rack", "R2"), ("zone", "us-east-1a")])
                ],
                preferred: vec![],
            })
        );
        assert_eq!(s.secrets.expose(), &map(&[("example_secret", SECRET)]));
        assert_eq!(
            s.parameters,
            map(&[("skuname", "Premium_LRS"), ("iops", "3000")])
        );
        assert_eq!(s.context, map(&[("endpoint", "http://192.168.1.101:9425")]));
        assert!(s.create_request().is_none());

        let j = json(Operation::Register, REGISTER_JSON).unwrap();
        assert_eq!(j, s);
        let j = VolumeSpec::parse_json(
            Operation::Register,
            Path::new("request body"),
            REGISTER_JSON,
        )
        .unwrap();
        assert_eq!(j, s);
    }

    #[test]
    fn a_nomad_create_spec_parses() {
        let s = hcl(Operation::Create, CREATE_HCL).unwrap();
        assert_eq!(s.operation(), Operation::Create);
        assert_eq!(s.external_id(), None);
        assert_eq!(
            s.kind,
            SpecKind::Create {
                capacity_min: Some(100_000_000_000),
                capacity_max: Some(200_000_000_000),
                source: Some(ContentSource::Snapshot("snap-12345".into())),
            }
        );
        assert!(s.context.is_empty());
        let tr = s.topology_request.clone().unwrap();
        assert_eq!(
            tr.preferred,
            vec![map(&[("rack", "R1"), ("zone", "us-east-1a")])]
        );
        assert_eq!(tr.required.len(), 2);
        let pb = tr.to_pb();
        assert_eq!(pb.requisite.len(), 2);
        assert_eq!(pb.preferred[0].segments["zone"], "us-east-1a");

        let req = s.create_request().unwrap();
        assert_eq!(req.name, "database");
        assert_eq!(req.capacity.required_bytes, 100_000_000_000);
        assert_eq!(req.capacity.limit_bytes, 200_000_000_000);
        assert_eq!(req.capabilities, s.capabilities);
        assert_eq!(req.secrets.expose()["example_secret"], SECRET);
        assert_eq!(
            req.source,
            Some(ContentSource::Snapshot("snap-12345".into()))
        );
        assert_eq!(req.accessibility_requirements, Some(pb));

        assert_eq!(json(Operation::Create, CREATE_JSON).unwrap(), s);
    }

    #[test]
    fn minimal_specs_and_defaults() {
        let s = hcl(
            Operation::Create,
            "id = \"v\"\ntype = \"CSI\"\nplugin_id = \"p\"\ncapacity_min = 1073741824\nclone_id = \"vol-src\"\ncapability {\n  access_mode = \"SINGLE_NODE_WRITER\"\n  attachment_mode = \"block-device\"\n}\n",
        )
        .unwrap();
        assert_eq!(s.name, "v", "name defaults to the id");
        assert_eq!(
            s.kind,
            SpecKind::Create {
                capacity_min: Some(1 << 30),
                capacity_max: None,
                source: Some(ContentSource::Volume(ExternalId::new("vol-src").unwrap())),
            }
        );
        assert_eq!(s.mount_options, MountOptions::default());
        assert_eq!(s.topology_request, None);
        let req = s.create_request().unwrap();
        assert_eq!(
            (req.capacity.required_bytes, req.capacity.limit_bytes),
            (1 << 30, 0)
        );
        assert_eq!(req.accessibility_requirements, None);

        // Nomad's own register test: empty capacity_min, empty topologies are fine when a
        // required one names segments... except berth refuses a topology without segments.
        let r = hcl(
            Operation::Register,
            "id = \"v\"\nexternal_id = \"e\"\ntype = \"csi\"\nplugin_id = \"p\"\ncapacity_min = \"\"\nname = \"\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
        )
        .unwrap();
        assert_eq!(r.name, "v");
        // Every file-system capability carries the (empty) mount options.
        assert_eq!(
            r.capabilities,
            vec![VolumeCapability::mount(
                AccessMode::SingleNodeWriter,
                MountOptions::default()
            )]
        );
    }

    const BASE: &str = "type = \"csi\"\nplugin_id = \"p\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n";

    /// A register spec: `extra` lines after id, external_id and BASE.
    fn reg(extra: &str) -> String {
        format!("id = \"v\"\nexternal_id = \"e\"\n{BASE}{extra}")
    }

    fn create(extra: &str) -> String {
        format!("id = \"v\"\n{BASE}{extra}")
    }

    #[test]
    fn fields_of_the_other_command_are_accepted_with_a_warning_naming_them() {
        // A register spec given to create: external_id and context are ignored.
        let c = VolumeSpec::parse(Operation::Create, Path::new("/s/v.hcl"), REGISTER_HCL).unwrap();
        assert!(c.context.is_empty());
        let shown = c.warnings.join("\n");
        assert!(shown.contains("external_id: ignored"), "{shown}");
        assert!(shown.contains("context: ignored"), "{shown}");
        assert!(!shown.contains(SECRET) && !shown.contains(FLAG), "{shown}");
        // Create-only fields given to register: the range is recorded, the rest warned about.
        let r = hcl(
            Operation::Register,
            &reg("capacity_min = \"1GiB\"\ncapacity_max = \"2GiB\"\nsnapshot_id = \"s1\"\ntopology_request {\n  preferred {\n    topology { segments { rack = \"R1\" } }\n  }\n  required {\n    topology {}\n  }\n}\n"),
        )
        .unwrap();
        let SpecKind::Register {
            capacity_min,
            capacity_max,
            ..
        } = &r.kind
        else {
            panic!("{r:?}")
        };
        assert_eq!(
            (*capacity_min, *capacity_max),
            (Some(1 << 30), Some(2 << 30))
        );
        assert_eq!(
            r.topology_request, None,
            "empty and ignored topologies name no place"
        );
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains(":")
                && r.warnings
                    .iter()
                    .any(|w| w.contains("snapshot_id: ignored"))
        );
        // A job spec says which command takes it.
        let e = hcl(Operation::Create, "job \"j\" {\n}\n").unwrap_err();
        assert!(e.message.contains("berth job run"), "{e}");
    }

    #[test]
    fn bad_specs_name_the_field() {
        let long = "a".repeat(129);
        let flags: Vec<String> = (0..300).map(|i| format!("\"{FLAG}-{i}\"")).collect();
        let cases: Vec<(Operation, String, &str, &str)> = vec![
            // ids
            (
                Operation::Register,
                format!("id = \"a/b\"\nexternal_id = \"e\"\n{BASE}"),
                "id",
                "invalid volume id \"a/b\": must not contain '/'",
            ),
            (
                Operation::Register,
                format!("id = \"..\"\nexternal_id = \"e\"\n{BASE}"),
                "id",
                "must not be '.' or '..'",
            ),
            (
                Operation::Register,
                format!("id = \"a\\u0000b\"\nexternal_id = \"e\"\n{BASE}"),
                "id",
                "NUL",
            ),
            (
                Operation::Register,
                format!("id = \"{long}\"\nexternal_id = \"e\"\n{BASE}"),
                "id",
                "129 bytes long, more than 128",
            ),
            (
                Operation::Register,
                format!("external_id = \"e\"\n{BASE}"),
                "id",
                "is required",
            ),
            (
                Operation::Register,
                format!(
                    "id = \"v\"\nexternal_id = \"e\"\n{}",
                    BASE.replace("\"p\"", "\"../p\"")
                ),
                "plugin_id",
                "invalid plugin id",
            ),
            (
                Operation::Register,
                format!(
                    "id = \"v\"\nexternal_id = \"e\"\n{}",
                    BASE.replace("plugin_id = \"p\"\n", "")
                ),
                "plugin_id",
                "is required",
            ),
            (
                Operation::Register,
                format!("id = \"v\"\n{BASE}"),
                "external_id",
                "is required",
            ),
            (
                Operation::Register,
                reg("").replace("\"e\"", &format!("\"{long}\"")),
                "external_id",
                "more than 128",
            ),
            // type, namespace
            (
                Operation::Register,
                reg("").replace("\"csi\"", "\"host\""),
                "type",
                "CSI volumes only",
            ),
            (
                Operation::Create,
                create("node_pool = \"prod\"\nhost_path = \"/srv\"\n")
                    .replace("\"csi\"", "\"host\""),
                "type",
                "\"host\": berth handles CSI volumes only",
            ),
            (
                Operation::Register,
                reg("").replace("type = \"csi\"\n", ""),
                "type",
                "is required",
            ),
            (
                Operation::Register,
                reg("namespace = \"prod\"\n"),
                "namespace",
                "one namespace",
            ),
            // capabilities
            (
                Operation::Register,
                reg("").replace("single-node-writer", "single-node-everything"),
                "capability[0].access_mode",
                "unknown access mode \"single-node-everything\"",
            ),
            (
                Operation::Register,
                reg("").replace("file-system", "floppy"),
                "capability[0].attachment_mode",
                "unknown attachment mode \"floppy\"",
            ),
            (
                Operation::Register,
                "id = \"v\"\nexternal_id = \"e\"\ntype = \"csi\"\nplugin_id = \"p\"\n".into(),
                "capability",
                "at least one capability",
            ),
            (
                Operation::Register,
                reg("capability {\n  access_mode = \"single-node-writer\"\n}\n"),
                "capability[1].attachment_mode",
                "is required",
            ),
            (
                Operation::Register,
                reg(
                    "capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
                ),
                "capability[1]",
                "same as capability[0]",
            ),
            (
                Operation::Register,
                reg(
                    "capability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"block-device\"\n  shared = true\n}\n",
                ),
                "capability[1].shared",
                "unknown field",
            ),
            // mount options
            (
                Operation::Register,
                reg(&format!(
                    "mount_options {{\n  mount_flags = [{}]\n}}\n",
                    flags.join(", ")
                )),
                "mount_options.mount_flags",
                "more than 4096",
            ),
            (
                Operation::Register,
                reg("mount_options {\n  mount_flags = \"ro\"\n}\n"),
                "mount_options.mount_flags",
                "expected a list of strings",
            ),
            (
                Operation::Register,
                reg(
                    "mount_options {\n  fs_type = \"xfs\"\n}\nmount_options {\n  fs_type = \"ext4\"\n}\n",
                ),
                "mount_options[1]",
                "declared more than once",
            ),
            (
                Operation::Register,
                reg("mount_options {\n  fs = \"xfs\"\n}\n"),
                "mount_options",
                "unknown field (not repeated",
            ),
            (
                Operation::Register,
                reg("mount_options {\n  fs_type = \"xfs\"\n}\n")
                    .replace("file-system", "block-device"),
                "mount_options",
                "file-system capabilities only",
            ),
            // register vs create: only a bad range is refused (other fields warn)
            (
                Operation::Register,
                reg("capacity_min = \"2GiB\"\ncapacity_max = \"1GiB\"\n"),
                "capacity_min",
                "is more than capacity_max",
            ),
            // create fields
            (
                Operation::Create,
                create("capacity_min = \"20GiB\"\ncapacity_max = \"10GiB\"\n"),
                "capacity_min",
                "\"20GiB\" (21474836480 bytes) is more than capacity_max \"10GiB\" (10737418240 bytes)",
            ),
            (
                Operation::Create,
                create("capacity_min = \"lots\"\n"),
                "capacity_min",
                "is not a size",
            ),
            (
                Operation::Create,
                create("capacity_max = \"10 parsecs\"\n"),
                "capacity_max",
                "unknown unit",
            ),
            (
                Operation::Create,
                create("capacity_max = -5\n"),
                "capacity_max",
                "not a whole, non-negative number",
            ),
            (
                Operation::Create,
                create("snapshot_id = \"s\"\nclone_id = \"c\"\n"),
                "clone_id",
                "not both",
            ),
            (
                Operation::Create,
                create(&format!("name = \"{long}\"\n")),
                "name",
                "more than 128",
            ),
            // topology
            (
                Operation::Create,
                create(
                    "topology_request {\n  required {\n    topology { segments { rack = \"R1\" } }\n  }\n  preferred {\n    topology { segments { rack = \"R9\" } }\n  }\n}\n",
                ),
                "topology_request.preferred.topology[0]",
                "not one of the required",
            ),
            (
                Operation::Create,
                create(
                    "topology_request {\n  required {\n    topology { segments { rack = \"\" } }\n  }\n}\n",
                ),
                "topology_request.required.topology[0].segments.rack",
                "must not be empty",
            ),
            (
                Operation::Create,
                create("topology_request {\n  wanted {}\n}\n"),
                "topology_request.wanted",
                "unknown field",
            ),
            // maps
            (
                Operation::Create,
                create("parameters = { a = [1] }\n"),
                "parameters.a",
                "expected a string, found a list",
            ),
            (
                Operation::Create,
                create("parameters = \"a=b\"\n"),
                "parameters",
                "expected a block",
            ),
            // structure
            (
                Operation::Register,
                reg("colour = \"blue\"\nsize = 3\n"),
                "colour",
                "unknown field (also unknown: \"size\"); expected one of: id, name, type",
            ),
            (
                Operation::Register,
                reg("capability = []\n"),
                "capability",
                "declared more than once",
            ),
            (
                Operation::Register,
                reg("name = var.name\n"),
                "name",
                "must be a literal value",
            ),
            (
                Operation::Register,
                reg("name = \"db-${var.env}\"\n"),
                "name",
                "must be a literal value",
            ),
            (
                Operation::Register,
                reg("parameters = { a = upper(\"x\") }\n"),
                "parameters.a",
                "must be a literal value",
            ),
            (
                Operation::Register,
                reg("capability \"x\" {\n  access_mode = \"single-node-writer\"\n}\n"),
                "capability[1]",
                "takes no labels",
            ),
            (
                Operation::Register,
                reg("name = 7\n"),
                "name",
                "expected a string, found a number",
            ),
        ];
        for (op, text, field, what) in cases {
            let e = match hcl(op, &text) {
                Ok(s) => panic!("{text}\n parsed: {s:?}"),
                Err(e) => e,
            };
            assert_eq!(e.field, field, "{text}\n{e}");
            let shown = e.to_string();
            assert!(shown.starts_with("/specs/vol.hcl"), "{shown}");
            assert!(shown.contains(&format!(": {field}: ")), "{shown}");
            assert!(shown.contains(what), "{text}\n{shown}\nshould say {what:?}");
            assert!(!shown.contains(FLAG), "{shown}");
        }
    }

    #[test]
    fn errors_point_at_lines() {
        let text = reg(
            "capability {\n  access_mode = \"multi-node-everything\"\n  attachment_mode = \"file-system\"\n}\n",
        );
        let want = text
            .lines()
            .position(|l| l.contains("multi-node-everything"))
            .unwrap()
            + 1;
        let e = hcl(Operation::Register, &text).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.line),
            ("capability[1].access_mode", Some(want))
        );
        assert!(
            e.to_string().starts_with(&format!(
                "/specs/vol.hcl:{want}: capability[1].access_mode: "
            )),
            "{e}"
        );

        let e = hcl(Operation::Register, &reg("\n\ncolour = \"blue\"\n")).unwrap_err();
        assert_eq!(e.line, Some(reg("").lines().count() + 3));

        let text = create(
            "topology_request {\n  required {\n    topology { segments { rack = \"R1\" } }\n    topology {\n      segments = { rack = \"\" }\n    }\n  }\n}\n",
        );
        let want = text
            .lines()
            .position(|l| l.contains("segments = { rack = \"\" }"))
            .unwrap()
            + 1;
        let e = hcl(Operation::Create, &text).unwrap_err();
        assert!(
            e.field
                .starts_with("topology_request.required.topology[1].segments"),
            "{e}"
        );
        assert_eq!(e.line, Some(want), "{e}");

        // A field that is absent points at its parent, or nowhere.
        let e = hcl(Operation::Register, &format!("id = \"v\"\n{BASE}")).unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("external_id", None));

        // Syntax errors: hcl's line, no field.
        let e = hcl(
            Operation::Register,
            "id = \"v\"\ncapability {\n  access_mode = \n}\n",
        )
        .unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("", Some(3)), "{e}");
        assert!(
            e.to_string()
                .starts_with("/specs/vol.hcl:3: column 17: invalid expression"),
            "{e}"
        );
        // In a Nomad (HCL1-style) file too, on the original line.
        for (from, to) in [
            ("type      = \"csi\"", "type      = "),
            ("skuname = \"Premium_LRS\"", "skuname = \"Premium_LRS\" ]"),
            ("rack = \"R2\", zone", "rack = \"R2\" zone"),
        ] {
            let text = REGISTER_HCL.replace(from, to);
            let want = text.lines().position(|l| l.contains(to)).unwrap() + 1;
            let e = hcl(Operation::Register, &text).unwrap_err();
            assert_eq!((e.field.as_str(), e.line), ("", Some(want)), "{to}: {e}");
        }
        // hcl finds a repeated attribute itself.
        let e = hcl(Operation::Register, &reg("id = \"w\"\n")).unwrap_err();
        assert_eq!(e.line, Some(reg("").lines().count() + 1), "{e}");
        assert!(e.message.contains("redefined attribute"), "{e}");

        // JSON: syntax errors have lines; other errors name the field.
        let e = json(Operation::Register, "{\n\"id\": }").unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("", Some(2)), "{e}");
        let e = json(
            Operation::Register,
            &REGISTER_JSON.replace("\"single-node-writer\"", "\"nope\""),
        )
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.line),
            ("capability[0].access_mode", None)
        );
        assert_eq!(
            e.to_string(),
            "/specs/vol.json: capability[0].access_mode: unknown access mode \"nope\" (expected one of single-node-writer, single-node-reader-only, multi-node-reader-only, multi-node-single-writer, multi-node-multi-writer, single-node-single-writer, single-node-multi-writer)"
        );
        let e = json(Operation::Register, "[1]").unwrap_err();
        assert!(e.message.contains("object of fields"), "{e}");
        let e = json(
            Operation::Register,
            &REGISTER_JSON.replace("\"ebs_prod_db1\"", "\"a\\u0000b\""),
        )
        .unwrap_err();
        assert_eq!(e.field, "id");
        assert!(e.message.contains("NUL"), "{e}");
    }

    #[test]
    fn secrets_and_mount_flags_never_show() {
        // Valid specs: Debug hides both, in both forms.
        for s in [
            hcl(Operation::Register, REGISTER_HCL).unwrap(),
            json(Operation::Register, REGISTER_JSON).unwrap(),
        ] {
            let out = format!("{s:?} {s:#?}");
            assert!(!out.contains(SECRET) && !out.contains("hunter2"), "{out}");
            assert!(out.contains("ebs_prod_db1") && out.contains(berth_csi::REDACTED));
        }
        let req = hcl(Operation::Create, CREATE_HCL)
            .unwrap()
            .create_request()
            .unwrap();
        assert!(!format!("{req:?}").contains(SECRET));

        // Errors about, or next to, secrets and flags.
        let long_secret = format!("{SECRET}-{}", "x".repeat(5000));
        let big_flags: Vec<String> = (0..300).map(|i| format!("\"{FLAG}{i}\"")).collect();
        let cases: Vec<(Operation, String)> = vec![
            // Syntax error on the secret's own line (hcl would quote the line).
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{SECRET}\""), &format!("\"{SECRET}\" ]")),
            ),
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("= \"{SECRET}\""), &format!("= {SECRET}")),
            ),
            // Bad escapes inside the secret.
            (
                Operation::Register,
                REGISTER_HCL.replace(SECRET, &format!("{SECRET}\\q")),
            ),
            (
                Operation::Register,
                REGISTER_HCL.replace(SECRET, &format!("{SECRET}\\uZZZZ")),
            ),
            (
                Operation::Register,
                REGISTER_JSON.replace(SECRET, &format!("{SECRET}\\q")),
            ),
            // Syntax error on a mount flag's line.
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{FLAG}\"]"), &format!("\"{FLAG}\"] ]")),
            ),
            // Secrets over the size limit, of the wrong type, given twice, not literal.
            (
                Operation::Register,
                REGISTER_HCL.replace(SECRET, &long_secret),
            ),
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{SECRET}\""), &format!("[\"{SECRET}\"]")),
            ),
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{SECRET}\""), &format!("\"{SECRET}-${{x}}\"")),
            ),
            (
                Operation::Register,
                REGISTER_JSON.replace(
                    r#"[{"example_secret""#,
                    &format!(r#"[{{"example_secret": "{SECRET}"}}, {{"example_secret""#),
                ),
            ),
            (
                Operation::Register,
                REGISTER_JSON.replace(
                    &format!("\"{SECRET}\""),
                    &format!("{{\"v\": \"{SECRET}\"}}"),
                ),
            ),
            // Mount flags over 4 KiB, of the wrong type, with a NUL.
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{FLAG}\""), &big_flags.join(", ")),
            ),
            (
                Operation::Register,
                REGISTER_HCL.replace(&format!("\"{FLAG}\""), &format!("[\"{FLAG}\"]")),
            ),
            (
                Operation::Register,
                REGISTER_JSON.replace(&format!("\"{FLAG}\""), &format!("\"{FLAG}\\u0000\"")),
            ),
            // Something else wrong in a spec that has both.
            (
                Operation::Register,
                REGISTER_HCL.replace("single-node-writer", "bogus"),
            ),
        ];
        for (op, text) in cases {
            let file = if text.trim_start().starts_with('{') {
                "/s/v.json"
            } else {
                "/s/v.hcl"
            };
            let e = VolumeSpec::parse(op, Path::new(file), &text).expect_err(&text);
            let out = format!("{e} {e:?}");
            assert!(
                !out.contains(SECRET) && !out.contains("hunter2"),
                "leaked: {out}"
            );
        }
    }

    #[test]
    fn load_reads_the_file_and_picks_the_format() {
        let dir = tempfile::tempdir().unwrap();
        let h = dir.path().join("v.hcl");
        let j = dir.path().join("v.json");
        std::fs::write(&h, CREATE_HCL).unwrap();
        std::fs::write(&j, CREATE_JSON).unwrap();
        let a = VolumeSpec::load(Operation::Create, &h).unwrap();
        let b = VolumeSpec::load(Operation::Create, &j).unwrap();
        assert_eq!(a, b);
        // JSON text in a .hcl file is read as HCL (and fails there).
        assert!(VolumeSpec::parse(Operation::Create, &h, CREATE_JSON).is_err());
        let e = VolumeSpec::load(Operation::Create, &dir.path().join("missing.hcl")).unwrap_err();
        assert!(e.message.starts_with("cannot read"), "{e}");
    }

    #[test]
    fn truncated_specs_fail_cleanly() {
        // Every prefix of the samples: no panic, and no secret or flag in the error.
        for (file, text) in [
            ("/s/r.hcl", REGISTER_HCL),
            ("/s/r.json", REGISTER_JSON),
            ("/s/c.hcl", CREATE_HCL),
            ("/s/c.json", CREATE_JSON),
        ] {
            for (cut, _) in text.char_indices() {
                for op in [Operation::Register, Operation::Create] {
                    if let Err(e) = VolumeSpec::parse(op, Path::new(file), &text[..cut]) {
                        let out = format!("{e} {e:?}");
                        assert!(
                            !out.contains("s3cr3t") && !out.contains("hunter2"),
                            "{file} cut at {cut}: {out}"
                        );
                    }
                }
            }
        }
    }
}
