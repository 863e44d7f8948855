//! From the tree as read to a checked [`JobSpec`]: structure, types, defaults, rules. The first
//! problem is returned, with the field path and (HCL) line. No message repeats a mount flag or
//! an env value; other values are repeated escaped and cut ([`Quoted`]). Every check is linear
//! in the size of the spec (or close): a 1 MiB spec may hold many thousand blocks.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Component, Path, PathBuf},
    time::Duration,
};

use berth_csi::model::{AccessMode, AttachmentMode, MountFlags};
use berth_devices::request::{
    AFFINITY_WEIGHT_RANGE, AffinityInput, ConstraintInput, DEFAULT_AFFINITY_WEIGHT, DeviceRequest,
    Field, Operand, Part as RulePart, RequestInput,
};
use berth_input::{Quoted, Shown, quoted_list};
use berth_volume::{SpecError, StoredMountOptions, check_fs_type, check_mount_flags};

use crate::{
    docker::DOCKER_CONFIG_KEYS,
    duration::{GoDuration, parse_duration},
    input::{Node, V},
    path::FieldPath,
    rules::{
        DEFAULT_PRIORITY, DEFAULT_SPREAD_WEIGHT, NODE_REFERENCES, NodeAffinity, NodeConstraint,
        Rules, Spread, SpreadTarget, is_node_reference, side_references,
    },
    spec::*,
    template::{NODE_VARIABLES, Part, RUNTIME_VARIABLES, Template},
};

mod connect;
mod docker;

type Res<T> = Result<T, SpecError>;

const NOT_HERE: &str = "runtime variables (${NOMAD_…}, ${attr.…}…) are not interpolated here; \
     Nomad fills them in config.command and args, env, volume_mount.destination, csi_plugin \
     dirs, and a docker task's image, entrypoint, volumes, mount source and target and work_dir";

/// Where `${device.…}` references may be.
const DEVICE_ONLY: &str = "${device.…} references are read only in the attribute and value of \
     a device block's constraint and affinity (resources { device \"<name>\" { … } })";

struct Cx<'a> {
    file: &'a Path,
    opts: &'a ParseOptions,
    /// Problems found so far, while checking goes on.
    errors: std::cell::RefCell<Vec<SpecError>>,
}

impl Cx<'_> {
    fn err(&self, path: &FieldPath, line: Option<usize>, message: impl Into<String>) -> SpecError {
        SpecError {
            file: self.file.to_path_buf(),
            line,
            field: path.to_string(),
            message: message.into(),
        }
    }

    /// Keeps `e` and lets checking go on.
    fn record(&self, e: SpecError) {
        self.errors.borrow_mut().push(e);
    }

    /// "expected …, found …", or why an expression has no value.
    fn wrong(&self, path: &FieldPath, n: &Node, expected: &str) -> SpecError {
        match &n.v {
            V::Bad(why) => self.err(path, n.line, why.clone()),
            V::Tmpl(parts) if parts.iter().any(is_device_ref) => {
                self.err(path, n.line, DEVICE_ONLY)
            }
            V::Tmpl(_) => self.err(path, n.line, NOT_HERE),
            _ => self.err(
                path,
                n.line,
                format!("expected {expected}, found {}", n.v.kind()),
            ),
        }
    }
}

/// A block body being read: what is left of its fields.
struct Fields {
    path: FieldPath,
    line: Option<usize>,
    items: Vec<(String, Node)>,
}

/// A block as found: its body (`Obj`) and the line of the block.
fn body_of(cx: &Cx<'_>, path: &FieldPath, n: Node) -> Res<Fields> {
    match n.v {
        V::Obj(items) => Ok(Fields {
            path: path.clone(),
            line: n.line,
            items,
        }),
        _ => Err(cx.wrong(path, &n, "a block (an object)")),
    }
}

impl Fields {
    /// Like [`Fields::deny_unknown`], but names no key: in `mount_options` a stray key could be
    /// a mount flag written in the wrong place.
    fn deny_unknown_unnamed(&self, cx: &Cx<'_>, known: &[&str]) -> Res<()> {
        match self
            .items
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            None => Ok(()),
            Some((_, n)) => Err(cx.err(
                &self.path,
                n.line,
                format!(
                    "unknown field (not repeated: it could be a mount flag); expected one of: {}",
                    known.join(", ")
                ),
            )),
        }
    }

    /// Refuses keys outside `known`, naming the first in source order and listing the others.
    fn deny_unknown(&self, cx: &Cx<'_>, known: &[&str]) -> Res<()> {
        let mut unknown = self
            .items
            .iter()
            .filter(|(k, _)| !known.contains(&k.as_str()));
        let Some((first, n)) = unknown.next() else {
            return Ok(());
        };
        let mut others: Vec<&str> = unknown.map(|(k, _)| k.as_str()).collect();
        others.dedup();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(" (also unknown: {})", quoted_list(others.into_iter()))
        };
        Err(cx.err(
            &self.path.key(first),
            n.line,
            format!("unknown field{also}; expected one of: {}", known.join(", ")),
        ))
    }

    /// Every occurrence of `key`, in order.
    fn take(&mut self, key: &str) -> Vec<Node> {
        let (taken, kept) = std::mem::take(&mut self.items)
            .into_iter()
            .partition(|(k, _)| k == key);
        self.items = kept;
        taken.into_iter().map(|(_, n)| n).collect()
    }

    /// An attribute given at most once; `null` counts as not given.
    fn value(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Node>> {
        let mut all = self.take(key).into_iter();
        let first = all.next();
        if let Some(again) = all.next() {
            let at = first
                .as_ref()
                .and_then(|f| f.line)
                .map(|l| format!(" (first at line {l})"))
                .unwrap_or_default();
            return Err(cx.err(
                &self.path.key(key),
                again.line,
                format!("given more than once{at}"),
            ));
        }
        Ok(first.filter(|n| n.v != V::Null))
    }

    /// The unlabelled blocks called `key`, each with its path `key[i]`. Accepts HCL blocks,
    /// and JSON objects or lists of objects.
    fn blocks(&mut self, cx: &Cx<'_>, key: &str) -> Res<Vec<Fields>> {
        let base = self.path.key(key);
        let mut out = Vec::new();
        for n in self.take(key) {
            let items = match n.v {
                V::Null => continue,
                V::List(items) => items,
                _ => vec![n],
            };
            for n in items {
                let here = base.at(out.len());
                let n = match n.v {
                    V::Block { labels, body } if labels.is_empty() => *body,
                    V::Block { .. } => {
                        return Err(cx.err(&here, n.line, "this block takes no label"));
                    }
                    _ => n,
                };
                out.push(body_of(cx, &here, n)?);
            }
        }
        Ok(out)
    }

    /// At most one unlabelled block called `key`, with the path `key`.
    fn block(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Fields>> {
        let mut all = self.blocks(cx, key)?;
        if let Some(again) = all.get(1) {
            let at = all[0]
                .line
                .map(|l| format!(" (first at line {l})"))
                .unwrap_or_default();
            return Err(cx.err(
                &again.path,
                again.line,
                format!("declared more than once{at}"),
            ));
        }
        Ok(all.pop().map(|mut f| {
            f.path = self.path.key(key);
            f
        }))
    }

    /// The labelled blocks called `key` (`group "web" { … }`), each with its label and the path
    /// `key[label]`, in order, repeats kept. In JSON: an object of label → body (or list of
    /// bodies), or a list of such objects. `what` names the label in errors ("group name").
    fn labelled(&mut self, cx: &Cx<'_>, key: &str, what: &str) -> Res<Vec<(String, Fields)>> {
        let base = self.path.key(key);
        let needs_label = || format!("needs one label, its {what}: {key} \"<{what}>\" {{ … }}");
        let mut out = Vec::new();
        for n in self.take(key) {
            let items = match n.v {
                V::Null => continue,
                V::List(items) => items,
                _ => vec![n],
            };
            for n in items {
                match n.v {
                    V::Block { labels, body } => {
                        let [label] = <[String; 1]>::try_from(labels)
                            .map_err(|_| cx.err(&base, n.line, needs_label()))?;
                        out.push((label.clone(), body_of(cx, &base.label(&label), *body)?));
                    }
                    V::Obj(pairs) => {
                        for (label, body) in pairs {
                            let here = base.label(&label);
                            let bodies = match body.v {
                                V::List(items) => items,
                                _ => vec![body],
                            };
                            for b in bodies {
                                out.push((label.clone(), body_of(cx, &here, b)?));
                            }
                        }
                    }
                    _ => {
                        return Err(match &n.v {
                            V::Bad(why) => cx.err(&base, n.line, why.clone()),
                            _ => cx.err(&base, n.line, needs_label()),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    fn string(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<String>> {
        let path = self.path.key(key);
        self.value(cx, key)?
            .map(|n| string(cx, &path, n))
            .transpose()
    }

    fn required_string(&mut self, cx: &Cx<'_>, key: &str, hint: &str) -> Res<String> {
        let s = self.string(cx, key)?;
        s.ok_or_else(|| cx.err(&self.path.key(key), self.line, format!("is required{hint}")))
    }

    fn bool(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<bool>> {
        let path = self.path.key(key);
        self.value(cx, key)?
            .map(|n| match n.v {
                V::Bool(b) => Ok(b),
                _ => Err(cx.wrong(&path, &n, "true or false")),
            })
            .transpose()
    }

    /// A whole number in `min..=max`.
    fn number(&mut self, cx: &Cx<'_>, key: &str, min: u32, max: u32) -> Res<Option<u32>> {
        let path = self.path.key(key);
        let Some(n) = self.value(cx, key)? else {
            return Ok(None);
        };
        let V::Num(num) = &n.v else {
            return Err(cx.wrong(&path, &n, "a whole number"));
        };
        let Some(i) = num.as_i64() else {
            return Err(cx.err(&path, n.line, format!("{num} is not a whole number")));
        };
        match u32::try_from(i) {
            Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ if i < i64::from(min) => {
                Err(cx.err(&path, n.line, format!("{i} is less than {min}")))
            }
            _ => Err(cx.err(&path, n.line, format!("{i} is more than {max}"))),
        }
    }

    fn duration(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Duration>> {
        let path = self.path.key(key);
        let Some(n) = self.value(cx, key)? else {
            return Ok(None);
        };
        let line = n.line;
        let V::Str(s) = &n.v else {
            return Err(cx.wrong(&path, &n, "a duration string such as \"30s\" or \"1m30s\""));
        };
        parse_duration(s)
            .map(Some)
            .map_err(|e| cx.err(&path, line, format!("{} is not a duration: {e}", Quoted(s))))
    }

    /// A string that may hold runtime references.
    fn template(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Template>> {
        let path = self.path.key(key);
        self.value(cx, key)?
            .map(|n| template(cx, &path, n))
            .transpose()
    }

    /// A list of strings that may hold runtime references; errors name the item.
    fn templates(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Vec<Template>>> {
        let path = self.path.key(key);
        let Some(n) = self.value(cx, key)? else {
            return Ok(None);
        };
        let V::List(items) = n.v else {
            return Err(cx.wrong(&path, &n, "a list of strings"));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, x)| template(cx, &path.at(i), x))
            .collect::<Res<_>>()
            .map(Some)
    }

    /// A list of strings; errors name the item, never its value.
    fn strings(&mut self, cx: &Cx<'_>, key: &str) -> Res<Option<Vec<String>>> {
        let path = self.path.key(key);
        let Some(n) = self.value(cx, key)? else {
            return Ok(None);
        };
        let V::List(items) = n.v else {
            return Err(cx.wrong(&path, &n, "a list of strings"));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, x)| string(cx, &path.at(i), x))
            .collect::<Res<_>>()
            .map(Some)
    }
}

fn is_device_ref(p: &Part) -> bool {
    matches!(p, Part::Var(v) if v.starts_with("device."))
}

/// A string without NUL bytes (none can reach a process or a mount). The value is not repeated.
fn string(cx: &Cx<'_>, path: &FieldPath, n: Node) -> Res<String> {
    match n.v {
        V::Str(s) if s.contains('\0') => Err(cx.err(path, n.line, "contains a NUL byte")),
        V::Str(s) => Ok(s),
        _ => Err(cx.wrong(path, &n, "a string")),
    }
}

/// A string, or a template with runtime references; numbers and bools become their text.
/// Without NUL bytes. The value is not repeated.
fn template(cx: &Cx<'_>, path: &FieldPath, n: Node) -> Res<Template> {
    let nul = |t: &str| t.contains('\0');
    match n.v {
        V::Str(s) if nul(&s) => Err(cx.err(path, n.line, "contains a NUL byte")),
        V::Str(s) => Ok(Template::from_parts(vec![Part::Lit(s)], n.line)),
        V::Num(x) => Ok(Template::from_parts(vec![Part::Lit(x.to_string())], n.line)),
        V::Bool(b) => Ok(Template::from_parts(vec![Part::Lit(b.to_string())], n.line)),
        V::Tmpl(parts) => {
            if parts.iter().any(|p| matches!(p, Part::Lit(t) if nul(t))) {
                return Err(cx.err(path, n.line, "contains a NUL byte"));
            }
            Ok(Template::from_parts(parts, n.line))
        }
        _ => Err(cx.wrong(path, &n, "a string")),
    }
}

fn segment(
    cx: &Cx<'_>,
    path: &FieldPath,
    line: Option<usize>,
    kind: &'static str,
    id: &str,
) -> Res<()> {
    berth_sys::validate_path_segment(kind, id).map_err(|e| cx.err(path, line, e.to_string()))
}

/// An absolute path without `..`, normalized (no `.`, no repeated or trailing `/`).
fn absolute(cx: &Cx<'_>, path: &FieldPath, line: Option<usize>, p: &str) -> Res<PathBuf> {
    if !p.starts_with('/') {
        return Err(cx.err(path, line, format!("{} is not an absolute path", Quoted(p))));
    }
    let parts: Vec<Component<'_>> = Path::new(p).components().collect();
    if parts.contains(&Component::ParentDir) {
        return Err(cx.err(path, line, format!("{} must not contain \"..\"", Quoted(p))));
    }
    Ok(parts.into_iter().collect())
}

/// The top of a spec: exactly one `job` block.
pub(crate) fn job(file: &Path, root: Node, opts: &ParseOptions) -> Result<JobSpec, SpecErrors> {
    let cx = Cx {
        file,
        opts,
        errors: Default::default(),
    };
    let spec = job_of(&cx, root);
    let mut errors = cx.errors.into_inner();
    match spec {
        Ok(spec) if errors.is_empty() => Ok(spec),
        spec => {
            errors.extend(spec.err());
            // In file order.
            errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
            Err(SpecErrors::new(errors))
        }
    }
}

/// Fields of Nomad's volume specs: a file holding these and no job is a volume spec.
const VOLUME_SPEC_FIELDS: [&str; 8] = [
    "plugin_id",
    "capability",
    "capacity_min",
    "capacity_max",
    "external_id",
    "snapshot_id",
    "clone_id",
    "mount_options",
];

fn job_of(cx: &Cx<'_>, root: Node) -> Res<JobSpec> {
    let root_path = FieldPath::root();
    let mut top = match root.v {
        V::Obj(_) => body_of(cx, &root_path, root)?,
        _ => {
            return Err(cx.err(
                &root_path,
                root.line,
                format!(
                    "a job spec is an object with one job block, found {}",
                    root.v.kind()
                ),
            ));
        }
    };
    if top.items.iter().any(|(k, _)| k == "Job") && !top.items.iter().any(|(k, _)| k == "job") {
        return Err(cx.err(
            &root_path.key("Job"),
            None,
            "this is Nomad's API form of a job; berth reads HCL's JSON form: {\"job\": {\"<id>\": { … }}}",
        ));
    }
    if !top.items.iter().any(|(k, _)| k == "job")
        && top
            .items
            .iter()
            .any(|(k, _)| VOLUME_SPEC_FIELDS.contains(&k.as_str()))
    {
        return Err(cx.err(
            &root_path,
            None,
            "this is a volume spec: use `berth volume register` or `berth volume create`",
        ));
    }
    top.deny_unknown(cx, &["job"])?;
    let mut jobs = top.labelled(cx, "job", "id")?;
    let job_path = root_path.key("job");
    if jobs.len() > 1 {
        let (_, again) = &jobs[1];
        return Err(cx.err(
            &job_path,
            again.line,
            "declared more than once: a spec holds exactly one job",
        ));
    }
    let Some((id, mut j)) = jobs.pop() else {
        return Err(cx.err(
            &job_path,
            None,
            "is required: a spec holds one job block, job \"<id>\" { … }",
        ));
    };
    j.path = job_path.clone();
    segment(cx, &job_path, j.line, "job id", &id)?;
    j.deny_unknown(
        cx,
        &[
            "type",
            "datacenters",
            "group",
            "region",
            "namespace",
            "priority",
            "meta",
            "constraint",
            "affinity",
            "spread",
        ],
    )?;

    let line = j.line_of("type");
    let job_type = match j.string(cx, "type")? {
        None => JobType::default(),
        Some(s) => s
            .parse()
            .map_err(|e: String| cx.err(&job_path.key("type"), line, e))?,
    };
    let datacenters_line = j.line_of("datacenters");
    let datacenters = j.strings(cx, "datacenters")?.unwrap_or_default();
    for (i, dc) in datacenters.iter().enumerate() {
        if dc.is_empty() {
            cx.record(cx.err(
                &job_path.key("datacenters").at(i),
                datacenters_line,
                "is empty: a datacenter name (where `*` matches any text and `?` any one \
                 character)",
            ));
        }
    }
    let priority = j
        .number(cx, "priority", 1, 100)?
        .map_or(DEFAULT_PRIORITY, small);
    let region = j.string(cx, "region")?;
    let namespace = j.string(cx, "namespace")?;
    let meta = meta(cx, &mut j, &BTreeMap::new())?;
    let rules = node_rules(cx, &mut j, job_type);

    let mut groups: Vec<GroupSpec> = Vec::new();
    let mut lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for (name, g) in j.labelled(cx, "group", "name")? {
        if let Some(first) = lines.get(&name) {
            cx.record(duplicate(cx, &g, "group", &name, *first));
            continue;
        }
        lines.insert(name.clone(), g.line);
        match group(cx, job_type, &id, &meta, name, g) {
            Ok(g) => groups.push(g),
            Err(e) => cx.record(e),
        }
    }
    if groups.is_empty() && lines.is_empty() {
        return Err(cx.err(
            &job_path.key("group"),
            j.line,
            "is required: a job has at least one group \"<name>\" { … } block",
        ));
    }
    Ok(JobSpec {
        id,
        job_type,
        groups,
        region,
        namespace,
        priority,
        datacenters,
        rules,
    })
}

impl Fields {
    /// The line of `key` if it is still there, else of the block.
    fn line_of(&self, key: &str) -> Option<usize> {
        self.items
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, n)| n.line)
            .or(self.line)
    }
}

fn duplicate(cx: &Cx<'_>, f: &Fields, kind: &str, name: &str, first: Option<usize>) -> SpecError {
    let at = first
        .map(|l| format!(" (first at line {l})"))
        .unwrap_or_default();
    cx.err(
        &f.path,
        f.line,
        format!("duplicate {kind} name {}{at}", Quoted(name)),
    )
}

/// `meta` of a block over `base` (a map of strings; numbers and bools become their text).
fn meta(
    cx: &Cx<'_>,
    f: &mut Fields,
    base: &BTreeMap<String, String>,
) -> Res<BTreeMap<String, String>> {
    let mut out = base.clone();
    if let Some(m) = f.block(cx, "meta")? {
        for (k, n) in m.items {
            let here = m.path.key(&k);
            let v = match n.v {
                V::Str(s) => s,
                V::Num(x) => x.to_string(),
                V::Bool(b) => b.to_string(),
                _ => return Err(cx.wrong(&here, &n, "a string")),
            };
            out.insert(k, v);
        }
    }
    Ok(out)
}

fn group(
    cx: &Cx<'_>,
    job_type: JobType,
    job_id: &str,
    job_meta: &BTreeMap<String, String>,
    name: String,
    mut g: Fields,
) -> Res<GroupSpec> {
    segment(cx, &g.path, g.line, "group name", &name)?;
    misplaced_devices(cx, &mut g);
    g.deny_unknown(
        cx,
        &[
            "count",
            "volume",
            "restart",
            "task",
            "meta",
            "constraint",
            "affinity",
            "spread",
            "service",
        ],
    )?;
    let group_meta = meta(cx, &mut g, job_meta)?;
    let count_line = g.line_of("count");
    let count = g
        .number(cx, "count", *COUNT_RANGE.start(), *COUNT_RANGE.end())?
        .unwrap_or(1);
    if job_type == JobType::System && count > 1 {
        cx.record(cx.err(
            &g.path.key("count"),
            count_line,
            format!(
                "is {count}, but count cannot exceed 1 with the system scheduler (a system job \
                 runs one alloc on every eligible node)"
            ),
        ));
    }
    let rules = node_rules(cx, &mut g, job_type);

    let mut volumes: BTreeMap<String, VolumeRequest> = BTreeMap::new();
    let mut lines = BTreeMap::new();
    // Volume id → the volume blocks that claim it: for every alloc (`None`) or one (per_alloc).
    let mut claims: HashMap<String, Vec<(Option<u32>, String)>> = HashMap::new();
    for (vname, v) in g.labelled(cx, "volume", "name")? {
        if let Some(first) = lines.get(&vname) {
            cx.record(duplicate(cx, &v, "volume", &vname, *first));
            continue;
        }
        lines.insert(vname.clone(), v.line);
        let (path, source_line) = (v.path.key("source"), v.line_of("source"));
        let req = match volume(cx, count, vname.clone(), v) {
            Ok(r) => r,
            Err(e) => {
                cx.record(e);
                continue;
            }
        };
        // An alloc claims a volume once: two blocks naming the same volume for one alloc
        // would share one claim, and the first release would pull it from under the other.
        let ids: Vec<(String, Option<u32>)> = if req.per_alloc {
            (0..count).map(|i| (req.source_for(i), Some(i))).collect()
        } else {
            vec![(req.source.clone(), None)]
        };
        let clash = ids
            .iter()
            .flat_map(|(id, mine)| {
                claims
                    .get(id)
                    .into_iter()
                    .flatten()
                    .filter_map(move |(theirs, other)| {
                        let i = match (mine, theirs) {
                            (None, None) => Some(0),
                            (None, Some(i)) | (Some(i), None) => Some(*i),
                            (Some(i), Some(j)) => (i == j).then_some(*i),
                        };
                        i.map(|i| (other, i))
                    })
            })
            .min();
        if let Some((other, i)) = clash {
            return Err(cx.err(
                &path,
                source_line,
                format!(
                    "alloc {i} would claim volume {} twice, here and in volume {}; \
                     an alloc claims a volume once: mount one volume block in several places",
                    Quoted(&req.source_for(i)),
                    Quoted(other)
                ),
            ));
        }
        for (id, which) in ids {
            claims.entry(id).or_default().push((which, vname.clone()));
        }
        volumes.insert(vname, req);
    }

    let base = RestartPolicy::default_for(job_type);
    let restart = match g.block(cx, "restart")? {
        Some(r) => restart(cx, base, r)?,
        None => base,
    };

    let services = connect::services(cx, &mut g, job_id, &name);

    let mut tasks: Vec<TaskSpec> = Vec::new();
    let mut lines = BTreeMap::new();
    // Service → its connect-proxy task.
    let mut proxies = BTreeMap::new();
    for (tname, t) in g.labelled(cx, "task", "name")? {
        if let Some(first) = lines.get(&tname) {
            cx.record(duplicate(cx, &t, "task", &tname, *first));
            continue;
        }
        lines.insert(tname.clone(), t.line);
        let kind_at = (t.path.key("kind"), t.line_of("kind"));
        let parsed = task(cx, &volumes, &services, restart, &group_meta, tname, t);
        match parsed {
            Ok(t) => match connect::second_proxy(cx, &mut proxies, &t, (&kind_at.0, kind_at.1)) {
                Some(e) => cx.record(e),
                None => tasks.push(t),
            },
            Err(e) => cx.record(e),
        }
    }
    if tasks.is_empty() && lines.is_empty() {
        return Err(cx.err(
            &g.path.key("task"),
            g.line,
            "is required: a group has at least one task \"<name>\" { … } block",
        ));
    }
    Ok(GroupSpec {
        name,
        count,
        volumes,
        restart,
        tasks,
        rules,
        services: services.list,
    })
}

fn volume(cx: &Cx<'_>, count: u32, name: String, mut v: Fields) -> Res<VolumeRequest> {
    segment(cx, &v.path, v.line, "volume name", &name)?;
    let p = v.path.clone();
    // type first: a host volume is refused for its type, not for its fields.
    let line = v.line_of("type");
    let ty = v.required_string(cx, "type", " (type = \"csi\")")?;
    if ty != "csi" {
        return Err(cx.err(
            &p.key("type"),
            line,
            format!(
                "{}: berth handles CSI volumes only (type = \"csi\")",
                Quoted(&ty)
            ),
        ));
    }
    v.deny_unknown(
        cx,
        &[
            "source",
            "access_mode",
            "attachment_mode",
            "read_only",
            "per_alloc",
            "mount_options",
        ],
    )?;
    let source_line = v.line_of("source");
    let source = v.required_string(cx, "source", " (the id of a registered volume)")?;
    segment(cx, &p.key("source"), source_line, "volume id", &source)?;
    let per_alloc = v.bool(cx, "per_alloc")?.unwrap_or(false);
    if per_alloc {
        // The id of the last alloc's volume must be an id too.
        let last = format!("{source}[{}]", count - 1);
        segment(
            cx,
            &p.key("source"),
            source_line,
            "per-alloc volume id",
            &last,
        )?;
    }

    let line = v.line_of("access_mode");
    let access = v.required_string(cx, "access_mode", "")?;
    let access_mode: AccessMode = access.parse().map_err(|_| {
        let all: Vec<&str> = AccessMode::ALL.iter().map(|m| m.as_str()).collect();
        cx.err(
            &p.key("access_mode"),
            line,
            format!(
                "unknown access mode {} (expected one of {})",
                Quoted(&access),
                all.join(", ")
            ),
        )
    })?;
    let line = v.line_of("attachment_mode");
    let attachment_mode = match v.string(cx, "attachment_mode")? {
        None => AttachmentMode::FileSystem,
        Some(a) => a.parse().map_err(|_| {
            cx.err(
                &p.key("attachment_mode"),
                line,
                format!(
                    "unknown attachment mode {} (expected file-system or block-device)",
                    Quoted(&a)
                ),
            )
        })?,
    };
    let line = v.line_of("read_only");
    let read_only = v.bool(cx, "read_only")?.unwrap_or(false);
    if access_mode.is_read_only() && !read_only {
        return Err(cx.err(
            &p.key("read_only"),
            line,
            format!("must be true for a {access_mode} volume"),
        ));
    }

    let mut mount_options = StoredMountOptions::default();
    if let Some(mut mo) = v.block(cx, "mount_options")? {
        mo.deny_unknown_unnamed(cx, &["fs_type", "mount_flags"])?;
        if attachment_mode == AttachmentMode::BlockDevice {
            return Err(cx.err(
                &mo.path,
                mo.line,
                "apply to file-system volumes only, and this one is block-device",
            ));
        }
        let line = mo.line_of("fs_type");
        mount_options.fs_type = mo.string(cx, "fs_type")?.unwrap_or_default();
        check_fs_type(&mount_options.fs_type)
            .map_err(|m| cx.err(&mo.path.key("fs_type"), line, m))?;
        let line = mo.line_of("mount_flags");
        let flags = mo.strings(cx, "mount_flags")?.unwrap_or_default();
        let flags = MountFlags::new(flags);
        check_mount_flags(&flags)
            .map_err(|e| cx.err(&mo.path.key("mount_flags"), line, e.to_string()))?;
        mount_options.mount_flags = flags.expose().to_vec();
    }
    Ok(VolumeRequest {
        name,
        source,
        access_mode,
        attachment_mode,
        read_only,
        per_alloc,
        mount_options,
    })
}

/// `base` with the block's fields applied, then checked as Nomad does.
fn restart(cx: &Cx<'_>, base: RestartPolicy, mut r: Fields) -> Res<RestartPolicy> {
    r.deny_unknown(
        cx,
        &["attempts", "interval", "delay", "mode", "render_templates"],
    )?;
    // Accepted for Nomad's files: berth renders no templates.
    r.bool(cx, "render_templates")?;
    let mut p = base;
    if let Some(a) = r.number(cx, "attempts", 0, u32::MAX)? {
        p.attempts = a;
    }
    if let Some(i) = r.duration(cx, "interval")? {
        p.interval = i;
    }
    if let Some(d) = r.duration(cx, "delay")? {
        p.delay = d;
    }
    let line = r.line_of("mode");
    if let Some(m) = r.string(cx, "mode")? {
        p.mode = match m.as_str() {
            "fail" => RestartMode::Fail,
            "delay" => RestartMode::Delay,
            _ => {
                return Err(cx.err(
                    &r.path.key("mode"),
                    line,
                    format!(
                        "unknown restart mode {} (expected fail or delay)",
                        Quoted(&m)
                    ),
                ));
            }
        };
    }
    if p.attempts == 0 && p.mode == RestartMode::Delay {
        return Err(cx.err(
            &r.path,
            r.line,
            "mode \"delay\" with 0 attempts is ambiguous: give attempts, or use mode \"fail\"",
        ));
    }
    if !p.interval.is_zero() && p.delay.saturating_mul(p.attempts) > p.interval {
        return Err(cx.err(
            &r.path,
            r.line,
            format!(
                "{} attempts with a delay of {} do not fit in an interval of {}",
                p.attempts,
                GoDuration(p.delay),
                GoDuration(p.interval)
            ),
        ));
    }
    Ok(p)
}

/// A task's `logs` block, as Nomad reads it: `max_files` and `max_file_size` (MiB) at least 1,
/// `disabled`, or Nomad's older `enabled` (its opposite; both given must agree).
fn logs(cx: &Cx<'_>, mut l: Fields) -> Res<LogConfig> {
    l.deny_unknown(cx, &["max_files", "max_file_size", "disabled", "enabled"])?;
    let mut c = LogConfig::default();
    if let Some(n) = l.number(cx, "max_files", 1, u32::MAX)? {
        c.max_files = n;
    }
    // A file's size is kept in bytes as a u64 by the collector: any u32 of MiB fits.
    if let Some(n) = l.number(cx, "max_file_size", 1, u32::MAX)? {
        c.max_file_size_mb = n;
    }
    let disabled = l.bool(cx, "disabled")?;
    let line = l.line_of("enabled");
    let enabled = l.bool(cx, "enabled")?;
    c.disabled = match (disabled, enabled) {
        (Some(d), Some(e)) if d == e => {
            return Err(cx.err(
                &l.path.key("enabled"),
                line,
                format!("enabled = {e} contradicts disabled = {d}: give only disabled"),
            ));
        }
        (Some(d), _) => d,
        (None, Some(e)) => !e,
        (None, None) => false,
    };
    Ok(c)
}

fn task(
    cx: &Cx<'_>,
    volumes: &BTreeMap<String, VolumeRequest>,
    services: &connect::GroupServices,
    group_restart: RestartPolicy,
    group_meta: &BTreeMap<String, String>,
    name: String,
    mut t: Fields,
) -> Res<TaskSpec> {
    segment(cx, &t.path, t.line, "task name", &name)?;
    let p = t.path.clone();
    // The driver first: a driver this node lacks says so, whatever its config holds.
    let line = t.line_of("driver");
    let driver = t.required_string(cx, "driver", " (e.g. driver = \"exec\")")?;
    if driver.trim().is_empty() {
        return Err(cx.err(&p.key("driver"), line, "must not be empty"));
    }
    if let Some(have) = &cx.opts.drivers
        && !have.contains(&driver)
    {
        return Err(cx.err(
            &p.key("driver"),
            line,
            format!(
                "driver {} is not available on this node: {}",
                Quoted(&driver),
                crate::vars::listed(have)
            ),
        ));
    }
    misplaced_devices(cx, &mut t);
    t.deny_unknown(
        cx,
        &[
            "config",
            "env",
            "volume_mount",
            "resources",
            "kill_timeout",
            "restart",
            "csi_plugin",
            "user",
            "meta",
            "kind",
            "identity",
            "logs",
        ],
    )?;
    let meta = meta(cx, &mut t, group_meta)?;
    let user = t.string(cx, "user")?;
    if let Some(u) = &user
        && (u.is_empty() || u.chars().any(|c| c.is_control() || c == ':' || c == '/'))
    {
        return Err(cx.err(
            &p.key("user"),
            t.line_of("user"),
            "is not a user name or uid",
        ));
    }

    let is_docker = driver == "docker";
    let Some(mut config) = t.block(cx, "config")? else {
        let hint = if is_docker {
            "is required: config { image = \"…\" }"
        } else {
            "is required: config { command = \"…\" }"
        };
        return Err(cx.err(&p.key("config"), t.line, hint));
    };
    if is_docker {
        config.deny_unknown(cx, DOCKER_CONFIG_KEYS)?;
    } else if driver == "exec" {
        config.deny_unknown(cx, &["command", "args", "pid_mode"])?;
    } else {
        config.deny_unknown(cx, &["command", "args"])?;
    }
    let line = config.line_of("pid_mode");
    let pid_mode = match config.string(cx, "pid_mode")?.as_deref() {
        None => None,
        Some("private") => Some(PidMode::Private),
        Some("host") => Some(PidMode::Host),
        Some(other) => {
            return Err(cx.err(
                &config.path.key("pid_mode"),
                line,
                format!("{}: expected private or host", Quoted(other)),
            ));
        }
    };
    let line = config.line_of("command");
    let command = match config.template(cx, "command")? {
        Some(c) if c.as_literal() == Some("") => {
            let hint = if is_docker {
                " (leave it out to run the image's own command)"
            } else {
                ""
            };
            return Err(cx.err(
                &config.path.key("command"),
                line,
                format!("must not be empty{hint}"),
            ));
        }
        Some(c) => c,
        // The image's own command.
        None if is_docker => Template::literal(""),
        None => return Err(cx.err(&config.path.key("command"), config.line, "is required")),
    };
    let args = config.templates(cx, "args")?.unwrap_or_default();
    let docker_task = if is_docker {
        Some(docker::config(cx, &mut config)?)
    } else {
        None
    };

    let env = match t.block(cx, "env")? {
        Some(e) => env(cx, e)?,
        None => BTreeMap::new(),
    };

    let mut volume_mounts: Vec<VolumeMount> = Vec::new();
    let mut destinations: HashMap<PathBuf, usize> = HashMap::new();
    for mut m in t.blocks(cx, "volume_mount")? {
        m.deny_unknown(
            cx,
            &[
                "volume",
                "destination",
                "read_only",
                "propagation_mode",
                "selinux_label",
            ],
        )?;
        let line = m.line_of("volume");
        let volume = m.required_string(cx, "volume", "")?;
        let Some(req) = volumes.get(&volume) else {
            let declared = if volumes.is_empty() {
                "the group declares no volume".to_string()
            } else {
                let names = quoted_list(volumes.keys().map(String::as_str));
                format!("the group declares {names}")
            };
            return Err(cx.err(
                &m.path.key("volume"),
                line,
                format!("no volume {} in this group ({declared})", Quoted(&volume)),
            ));
        };
        let line = m.line_of("destination");
        let destination = m.template(cx, "destination")?.ok_or_else(|| {
            cx.err(
                &m.path.key("destination"),
                m.line,
                "is required (an absolute path in the task)",
            )
        })?;
        let destination = match destination.as_literal() {
            Some(d) => {
                let d = absolute(cx, &m.path.key("destination"), line, d)?;
                if let Some(i) = destinations.get(&d) {
                    return Err(cx.err(
                        &m.path.key("destination"),
                        line,
                        format!("same destination as volume_mount[{i}]"),
                    ));
                }
                destinations.insert(d.clone(), volume_mounts.len());
                Template::from_parts(vec![Part::Lit(d.display().to_string())], line)
            }
            None => destination,
        };
        let read_only = m.bool(cx, "read_only")?.unwrap_or(false) || req.read_only;
        let line = m.line_of("propagation_mode");
        let propagation = match m.string(cx, "propagation_mode")?.as_deref() {
            None | Some("private") => PropagationMode::Private,
            Some("host-to-task") => PropagationMode::HostToTask,
            Some("bidirectional") => PropagationMode::Bidirectional,
            Some(other) => {
                return Err(cx.err(
                    &m.path.key("propagation_mode"),
                    line,
                    format!(
                        "{}: expected private, host-to-task or bidirectional",
                        Quoted(other)
                    ),
                ));
            }
        };
        let selinux_label = m.string(cx, "selinux_label")?;
        volume_mounts.push(VolumeMount {
            volume,
            destination,
            read_only,
            propagation,
            selinux_label,
        });
    }

    let mut resources = Resources::default();
    let mut devices = Vec::new();
    if let Some(mut r) = t.block(cx, "resources")? {
        r.deny_unknown(cx, &["cpu", "memory", "device"])?;
        if let Some(c) = r.number(cx, "cpu", MIN_CPU_MHZ, u32::MAX)? {
            resources.cpu_mhz = c;
        }
        if let Some(m) = r.number(cx, "memory", MIN_MEMORY_MB, u32::MAX)? {
            resources.memory_mb = m;
        }
        devices = device_blocks(cx, &mut r)?;
    }

    let kill_timeout = t
        .duration(cx, "kill_timeout")?
        .unwrap_or(DEFAULT_KILL_TIMEOUT);
    let restart = match t.block(cx, "restart")? {
        Some(r) => restart(cx, group_restart, r)?,
        None => group_restart,
    };
    let logs = match t.block(cx, "logs")? {
        Some(l) => logs(cx, l)?,
        None => LogConfig::default(),
    };
    let csi_plugin = t
        .block(cx, "csi_plugin")?
        .map(|c| plugin(cx, c))
        .transpose()?;
    let kind = connect::kind(cx, &mut t, services)?;
    let identities = connect::identities(cx, &mut t)?;

    let spec = TaskSpec {
        name,
        driver,
        command,
        args,
        env,
        user,
        pid_mode,
        meta,
        volume_mounts,
        resources,
        devices,
        kill_timeout,
        restart,
        csi_plugin,
        kind,
        identities,
        docker: docker_task,
        logs,
    };
    references(cx, &p, &spec);
    Ok(spec)
}

/// Records every runtime reference of `task` that nothing will fill: not one of Nomad's
/// runtime variables, not `CSI_ENDPOINT` in a plugin task, not an attribute or meta key of the
/// node (when the node is known), not one of the task's `env` keys (outside `env` itself).
fn references(cx: &Cx<'_>, p: &FieldPath, task: &TaskSpec) {
    let known = |name: &str, in_env: bool| -> Result<(), String> {
        if RUNTIME_VARIABLES.contains(&name) || NODE_VARIABLES.contains(&name) {
            return Ok(());
        }
        if name.starts_with("device.") {
            return Err(DEVICE_ONLY.into());
        }
        if name == "CSI_ENDPOINT" {
            return if task.csi_plugin.is_some() {
                Ok(())
            } else {
                Err("only a task with a csi_plugin block has CSI_ENDPOINT".into())
            };
        }
        if let Some(key) = name.strip_prefix("attr.") {
            return match &cx.opts.node {
                Some(n) if !n.attrs.contains(key) => Err(format!(
                    "this node has no attribute {} (`berth node status --json` lists them)",
                    Quoted(key)
                )),
                _ => Ok(()),
            };
        }
        if let Some(key) = name.strip_prefix("meta.") {
            return match &cx.opts.node {
                Some(n) if !n.meta.contains(key) => Err(format!(
                    "this node has no meta key {} (the agent config's client.meta)",
                    Quoted(key)
                )),
                _ => Ok(()),
            };
        }
        if !in_env && task.env.contains_key(name) {
            return Ok(());
        }
        Err(format!(
            "runtime variables are NOMAD_ALLOC_ID, NOMAD_TASK_DIR… (Nomad's), attr.*, node.*, \
             meta.*{} and the task's env keys",
            if task.csi_plugin.is_some() {
                ", CSI_ENDPOINT"
            } else {
                ""
            }
        ))
    };
    let check = |field: FieldPath, t: &Template, in_env: bool| {
        for name in t.vars() {
            if let Err(why) = known(name, in_env) {
                cx.record(cx.err(
                    &field,
                    t.line(),
                    format!("unknown variable {}: {why}", Shown(name)),
                ));
            }
        }
    };
    let config = p.key("config");
    check(config.key("command"), &task.command, false);
    for (i, a) in task.args.iter().enumerate() {
        check(config.key("args").at(i), a, false);
    }
    for (k, v) in &task.env {
        check(p.key("env").key(k), v, true);
    }
    for (i, m) in task.volume_mounts.iter().enumerate() {
        check(
            p.key("volume_mount").at(i).key("destination"),
            &m.destination,
            false,
        );
    }
    if let Some(d) = &task.docker {
        for (field, t) in docker::templates(d, &config) {
            check(field, t, false);
        }
    }
    if let Some(c) = &task.csi_plugin {
        check(p.key("csi_plugin").key("mount_dir"), &c.mount_dir, false);
        check(
            p.key("csi_plugin").key("stage_publish_base_dir"),
            &c.stage_publish_base_dir,
            false,
        );
    }
}

/// `env`: names without `=` or NUL; values strings (numbers and bools become their text),
/// never repeated in an error.
fn env(cx: &Cx<'_>, e: Fields) -> Res<BTreeMap<String, Template>> {
    let mut out = BTreeMap::new();
    for (k, n) in e.items {
        let here = e.path.key(&k);
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(cx.err(
                &here,
                n.line,
                "is not a valid variable name (empty, or has '=' or a NUL byte)",
            ));
        }
        let line = n.line;
        let v = template(cx, &here, n)?;
        if out.insert(k, v).is_some() {
            return Err(cx.err(&here, line, "given more than once"));
        }
    }
    Ok(out)
}

fn plugin(cx: &Cx<'_>, mut c: Fields) -> Res<CsiPluginSpec> {
    c.deny_unknown(
        cx,
        &[
            "id",
            "type",
            "mount_dir",
            "stage_publish_base_dir",
            "health_timeout",
        ],
    )?;
    let p = c.path.clone();
    let line = c.line_of("id");
    let id = c.required_string(cx, "id", "")?;
    segment(cx, &p.key("id"), line, "plugin id", &id)?;
    let line = c.line_of("type");
    let ty = c.required_string(cx, "type", " (node, controller or monolith)")?;
    let plugin_type: CsiPluginType = ty
        .parse()
        .map_err(|e: String| cx.err(&p.key("type"), line, e))?;

    let mut dir = |key: &str, default: &str| -> Res<(Template, Option<usize>)> {
        let line = c.line_of(key);
        let t = c
            .template(cx, key)?
            .unwrap_or_else(|| Template::from_parts(vec![Part::Lit(default.into())], line));
        Ok(match t.as_literal() {
            Some(s) => {
                let p = absolute(cx, &p.key(key), line, s)?;
                (
                    Template::from_parts(vec![Part::Lit(p.display().to_string())], line),
                    line,
                )
            }
            None => (t, line),
        })
    };
    let (mount_dir, mount_line) = dir("mount_dir", DEFAULT_PLUGIN_MOUNT_DIR)?;
    let (stage_publish_base_dir, stage_line) =
        dir("stage_publish_base_dir", DEFAULT_STAGE_PUBLISH_BASE_DIR)?;
    if let (Some(m), Some(st)) = (mount_dir.as_literal(), stage_publish_base_dir.as_literal()) {
        let (m, st) = (Path::new(m), Path::new(st));
        if m.starts_with(st) {
            return Err(cx.err(
                &p.key("mount_dir"),
                mount_line,
                format!(
                    "{} lies inside stage_publish_base_dir {} (or is it); the socket directory and the volumes' directory must be apart",
                    Shown(&m.to_string_lossy()),
                    Shown(&st.to_string_lossy())
                ),
            ));
        }
        if st.starts_with(m) {
            return Err(cx.err(
                &p.key("stage_publish_base_dir"),
                stage_line,
                format!(
                    "{} lies inside mount_dir {}; the socket directory and the volumes' directory must be apart",
                    Shown(&st.to_string_lossy()),
                    Shown(&m.to_string_lossy())
                ),
            ));
        }
    }
    let line = c.line_of("health_timeout");
    let health_timeout = c
        .duration(cx, "health_timeout")?
        .unwrap_or(DEFAULT_PLUGIN_HEALTH_TIMEOUT);
    if health_timeout.is_zero() {
        return Err(cx.err(&p.key("health_timeout"), line, "must be more than 0"));
    }
    Ok(CsiPluginSpec {
        id,
        plugin_type,
        mount_dir,
        stage_publish_base_dir,
        health_timeout,
    })
}

/// Records a `device` block found outside `resources` (and drops it), saying where it goes.
fn misplaced_devices(cx: &Cx<'_>, f: &mut Fields) {
    for n in f.take("device") {
        cx.record(cx.err(
            &f.path.key("device"),
            n.line,
            "device blocks go in a task's resources block: \
             task \"…\" { resources { device \"<name>\" { … } } }",
        ));
    }
}

/// The `device` blocks of a `resources` block. A device with problems is left out, its
/// problems recorded; the others are checked on.
fn device_blocks(cx: &Cx<'_>, r: &mut Fields) -> Res<Vec<DeviceRequest>> {
    let base = r.path.key("device");
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for (label, mut d) in r.labelled(cx, "device", "name")? {
        d.path = base.name(&label);
        if let Some(first) = seen.get(&label) {
            cx.record(duplicate(cx, &d, "device", &label, *first));
            continue;
        }
        seen.insert(label.clone(), d.line);
        match device(cx, label, d) {
            Ok(Some(req)) => out.push(req),
            Ok(None) => {}
            Err(e) => cx.record(e),
        }
    }
    Ok(out)
}

/// `operator`-less forms Nomad reads in a constraint or an affinity: `regexp = "…"` is
/// `operator = "regexp"` with `value = "…"`.
const RULE_SHORTCUTS: [&str; 6] = [
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
];

/// Where the parts of one constraint or affinity were written.
struct RuleAt {
    path: FieldPath,
    block: Option<usize>,
    attribute: Option<usize>,
    operator: (String, Option<usize>),
    value: (String, Option<usize>),
    weight: Option<usize>,
    /// A field could not be read (its problem is recorded): the request's own checks of this
    /// rule would only repeat it.
    broken: bool,
}

impl RuleAt {
    /// A problem of `part`.
    fn err(&self, cx: &Cx<'_>, part: RulePart, message: impl Into<String>) -> SpecError {
        let (path, line) = self.of(part);
        cx.err(&path, line, message)
    }

    fn of(&self, part: RulePart) -> (FieldPath, Option<usize>) {
        match part {
            RulePart::Block => (self.path.clone(), self.block),
            RulePart::Attribute => (self.path.key("attribute"), self.attribute),
            RulePart::Operator => (self.path.key(&self.operator.0), self.operator.1),
            RulePart::Value => (self.path.key(&self.value.0), self.value.1),
            RulePart::Weight => (self.path.key("weight"), self.weight),
        }
    }
}

/// A field of a device block: its problem is recorded (and `broken` set) instead of returned.
fn kept<T>(cx: &Cx<'_>, broken: &mut bool, r: Res<Option<T>>) -> Option<T> {
    r.unwrap_or_else(|e| {
        cx.record(e);
        *broken = true;
        None
    })
}

/// A side of a constraint or an affinity: text, with `${device.…}` (and any other reference,
/// for the request's checks to refuse) written back as `${…}`; `${var.…}` was filled when read.
fn rule_text(cx: &Cx<'_>, f: &mut Fields, key: &str) -> Res<Option<(String, Option<usize>)>> {
    let line = f.line_of(key);
    let path = f.path.key(key);
    let Some(n) = f.value(cx, key)? else {
        return Ok(None);
    };
    let mut text = String::new();
    for p in template(cx, &path, n)?.parts() {
        match p {
            Part::Lit(s) => text.push_str(s),
            Part::Var(v) => {
                text.push_str("${");
                text.push_str(v);
                text.push('}');
            }
        }
    }
    Ok(Some((text, line)))
}

/// One `constraint` or `affinity` block, as written. `distinct_hosts` and `distinct_property`
/// still in `f` are refused as a device block's (a job's or group's rules take them out first);
/// `also_known` are fields taken out before, named among the expected ones.
fn rule(
    cx: &Cx<'_>,
    mut f: Fields,
    affinity: bool,
    also_known: &[&str],
) -> (ConstraintInput, Option<i64>, RuleAt) {
    let mut at = RuleAt {
        path: f.path.clone(),
        block: f.line,
        attribute: f.line_of("attribute"),
        operator: ("operator".into(), f.line_of("operator")),
        value: ("value".into(), f.line_of("value")),
        weight: f.line_of("weight"),
        broken: false,
    };
    let mut input = ConstraintInput::default();
    let mut weight = None;
    for key in ["distinct_hosts", "distinct_property"] {
        for n in f.take(key) {
            cx.record(cx.err(
                &f.path.key(key),
                n.line,
                "places allocs on distinct nodes; it does not select devices (put it in a \
                 constraint of the job or group)",
            ));
            at.broken = true;
        }
    }
    let mut known = vec!["attribute", "operator", "value"];
    known.extend(RULE_SHORTCUTS);
    known.extend(also_known);
    if affinity {
        known.push("weight");
    }
    if let Err(e) = f.deny_unknown(cx, &known) {
        cx.record(e);
        at.broken = true;
        return (input, weight, at);
    }
    let broken = &mut at.broken;
    if let Some((a, _)) = kept(cx, broken, rule_text(cx, &mut f, "attribute")) {
        input.attribute = a;
    }
    input.operator = kept(cx, broken, f.string(cx, "operator"));
    if let Some((v, _)) = kept(cx, broken, rule_text(cx, &mut f, "value")) {
        input.value = v;
    }
    if affinity {
        let path = f.path.key("weight");
        if let Some(n) = kept(cx, broken, f.value(cx, "weight")) {
            match &n.v {
                V::Num(x) => match x.as_i64() {
                    Some(w) => weight = Some(w),
                    None => {
                        cx.record(cx.err(&path, n.line, format!("{x} is not a whole number")));
                        *broken = true;
                    }
                },
                _ => {
                    cx.record(cx.wrong(&path, &n, "a whole number from -100 to 100"));
                    *broken = true;
                }
            }
        }
    }
    for key in RULE_SHORTCUTS {
        let Some((v, line)) = kept(cx, broken, rule_text(cx, &mut f, key)) else {
            continue;
        };
        if input.operator.is_some() || !input.value.is_empty() {
            cx.record(cx.err(
                &f.path.key(key),
                line,
                format!(
                    "{key} = \"…\" is short for operator = \"{key}\" and value = \"…\": give \
                     one form, not both"
                ),
            ));
            *broken = true;
            continue;
        }
        input.operator = Some(key.into());
        input.value = v;
        at.operator = (key.into(), line);
        at.value = (key.into(), line);
    }
    (input, weight, at)
}

/// One `device "<label>"` block; `None` when it has problems (they are recorded).
fn device(cx: &Cx<'_>, label: String, mut d: Fields) -> Res<Option<DeviceRequest>> {
    d.deny_unknown(cx, &["count", "constraint", "affinity"])?;
    let p = d.path.clone();
    let mut broken = false;
    let count_line = d.line_of("count");
    let count = kept(cx, &mut broken, d.number(cx, "count", 1, u32::MAX));
    let mut input = RequestInput {
        name: label,
        count: count.map(u64::from),
        ..Default::default()
    };
    let mut constraints = Vec::new();
    for c in kept(cx, &mut broken, d.blocks(cx, "constraint").map(Some)).unwrap_or_default() {
        let (c, _, at) = rule(cx, c, false, &[]);
        input.constraints.push(c);
        constraints.push(at);
    }
    let mut affinities = Vec::new();
    for a in kept(cx, &mut broken, d.blocks(cx, "affinity").map(Some)).unwrap_or_default() {
        let (c, weight, at) = rule(cx, a, true, &[]);
        input.affinities.push(AffinityInput {
            attribute: c.attribute,
            operator: c.operator,
            value: c.value,
            weight,
        });
        affinities.push(at);
    }
    let broken = broken || constraints.iter().chain(&affinities).any(|a| a.broken);
    match DeviceRequest::build(&input) {
        Ok(req) if !broken => Ok(Some(req)),
        Ok(_) => Ok(None),
        Err(errors) => {
            for e in errors {
                let (path, line) = match e.field {
                    Field::Name => (p.clone(), d.line),
                    Field::Count => (p.key("count"), count_line),
                    Field::Constraint(i, part) => match constraints.get(i) {
                        Some(at) if at.broken => continue,
                        Some(at) => at.of(part),
                        None => (p.key("constraint").at(i), d.line),
                    },
                    Field::Affinity(i, part) => match affinities.get(i) {
                        Some(at) if at.broken => continue,
                        Some(at) => at.of(part),
                        None => (p.key("affinity").at(i), d.line),
                    },
                };
                cx.record(cx.err(&path, line, e.message));
            }
            Ok(None)
        }
    }
}

/// A whole number already checked to be at most 100.
fn small(n: u32) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

/// The `constraint`, `affinity` and `spread` blocks of a job or a group. A rule with problems is
/// left out, its problems recorded; the others are checked on.
fn node_rules(cx: &Cx<'_>, f: &mut Fields, job_type: JobType) -> Rules {
    let mut blocks = |key: &str| {
        let all = f.blocks(cx, key).unwrap_or_else(|e| {
            cx.record(e);
            Vec::new()
        });
        if job_type != JobType::System || key == "constraint" {
            return all;
        }
        // As in Nomad: a system job places an alloc on every eligible node, so there is
        // nothing to prefer or to spread.
        for b in &all {
            cx.record(cx.err(
                &b.path,
                b.line,
                format!(
                    "a system job takes no {key} block: it runs on every eligible node \
                     (constraints choose which)"
                ),
            ));
        }
        Vec::new()
    };
    let constraints = blocks("constraint")
        .into_iter()
        .filter_map(|c| node_constraint(cx, c))
        .collect();
    let affinities = blocks("affinity")
        .into_iter()
        .filter_map(|a| node_affinity(cx, a))
        .collect();
    let spreads = blocks("spread")
        .into_iter()
        .filter_map(|s| spread(cx, s))
        .collect();
    Rules {
        constraints,
        affinities,
        spreads,
    }
}

/// "unknown operator …", with the operators a node constraint (or affinity) takes.
fn unknown_node_operator(text: &str, affinity: bool) -> String {
    let mut all: Vec<&str> = Operand::ALL
        .iter()
        .filter(|o| !affinity || o.for_affinity())
        .map(|o| o.as_str())
        .collect();
    if !affinity {
        all.extend(["distinct_hosts", "distinct_property"]);
    }
    format!(
        "unknown operator {} (expected one of {}; or ==, is, not)",
        Quoted(text),
        all.join(", ")
    )
}

/// One side of a node rule: its `${…}` references must be among [`NODE_REFERENCES`]. Problems
/// are recorded; false when there was one. A node lacking an `attr.` or `meta.` key is no
/// problem: the rule is for every node of a fleet.
fn node_side(cx: &Cx<'_>, (path, line): (FieldPath, Option<usize>), text: &str) -> bool {
    let names = match side_references(text) {
        Ok(names) => names,
        Err(why) => {
            cx.record(cx.err(&path, line, why));
            return false;
        }
    };
    let mut ok = true;
    for name in names.into_iter().filter(|n| !is_node_reference(n)) {
        let hint = if name.starts_with("device.") {
            " (${device.…} references go in a device block's constraint or affinity)"
        } else {
            ""
        };
        cx.record(cx.err(
            &path,
            line,
            format!(
                "unknown reference {}: a job's or group's constraint, affinity or spread can \
                 use {NODE_REFERENCES}{hint}",
                Quoted(&format!("${{{name}}}"))
            ),
        ));
        ok = false;
    }
    ok
}

/// Why a literal value of `regexp`, `version` or `semver` does not compile or parse. A device
/// request checks these values the same way, so one is asked.
fn literal_value_problem(op: Operand, value: &str) -> Option<String> {
    if !matches!(op, Operand::Regexp | Operand::Version | Operand::Semver) || value.contains("${") {
        return None;
    }
    let probe = RequestInput {
        name: "gpu".into(),
        constraints: vec![ConstraintInput {
            attribute: "${device.model}".into(),
            operator: Some(op.as_str().into()),
            value: value.into(),
        }],
        ..Default::default()
    };
    DeviceRequest::build(&probe)
        .err()?
        .into_iter()
        .find(|e| e.field == Field::Constraint(0, RulePart::Value))
        .map(|e| e.message)
}

/// The sides of a node constraint or affinity comparing with `op`; false when one has a problem
/// (recorded).
fn node_sides(cx: &Cx<'_>, at: &RuleAt, input: &ConstraintInput, op: Operand) -> bool {
    let mut ok = true;
    if input.attribute.is_empty() {
        cx.record(at.err(
            cx,
            RulePart::Attribute,
            format!("is required (a literal or {NODE_REFERENCES})"),
        ));
        ok = false;
    } else {
        ok &= node_side(cx, at.of(RulePart::Attribute), &input.attribute);
    }
    if !op.takes_value() {
        if !input.value.is_empty() {
            cx.record(at.err(
                cx,
                RulePart::Value,
                format!("{op} takes no value: it only asks whether the attribute is set"),
            ));
            ok = false;
        }
        return ok;
    }
    if input.value.is_empty() {
        cx.record(at.err(cx, RulePart::Value, format!("is required by operator {op}")));
        return false;
    }
    if !node_side(cx, at.of(RulePart::Value), &input.value) {
        return false;
    }
    if let Some(problem) = literal_value_problem(op, &input.value) {
        cx.record(at.err(cx, RulePart::Value, problem));
        return false;
    }
    ok
}

/// A `distinct_property` constraint on `attribute` (written at `attribute_at`), at most `limit`
/// allocs (text, empty for 1) per value of it.
fn distinct_property(
    cx: &Cx<'_>,
    at: &RuleAt,
    attribute_at: (FieldPath, Option<usize>),
    attribute: String,
    limit: &str,
) -> Option<NodeConstraint> {
    let mut ok = true;
    if attribute.is_empty() {
        let (path, line) = attribute_at;
        cx.record(cx.err(
            &path,
            line,
            "is required by distinct_property: the property whose values hold a limited \
             number of allocs each, e.g. \"${meta.rack}\"",
        ));
        ok = false;
    } else {
        ok &= node_side(cx, attribute_at, &attribute);
    }
    let limit = match limit {
        "" => Some(1),
        text => match text.parse::<u32>() {
            Ok(0) => {
                cx.record(at.err(
                    cx,
                    RulePart::Value,
                    "must be at least 1: distinct_property's value is how many allocs one \
                     value of the attribute may hold",
                ));
                None
            }
            Ok(n) => Some(n),
            Err(_) => {
                cx.record(at.err(
                    cx,
                    RulePart::Value,
                    format!(
                        "{} is not a whole number: distinct_property's value is how many allocs \
                         one value of the attribute may hold (at least 1; 1 when not given)",
                        Quoted(text)
                    ),
                ));
                None
            }
        },
    };
    match limit {
        Some(limit) if ok => Some(NodeConstraint::DistinctProperty { attribute, limit }),
        _ => None,
    }
}

/// One `constraint` block of a job or group; `None` when it has problems (recorded) or is
/// `distinct_hosts = false`.
fn node_constraint(cx: &Cx<'_>, mut c: Fields) -> Option<NodeConstraint> {
    let mut broken = false;
    let hosts_path = c.path.key("distinct_hosts");
    let hosts_line = c.line_of("distinct_hosts");
    let hosts = kept(cx, &mut broken, c.bool(cx, "distinct_hosts"));
    let property_path = c.path.key("distinct_property");
    let property = kept(cx, &mut broken, rule_text(cx, &mut c, "distinct_property"));
    let (input, _, at) = rule(cx, c, false, &["distinct_hosts", "distinct_property"]);
    if broken || at.broken {
        return None;
    }
    let written =
        input.operator.is_some() || !input.attribute.is_empty() || !input.value.is_empty();
    match (hosts, property) {
        (Some(_), Some((_, line))) => {
            cx.record(cx.err(
                &property_path,
                line,
                "give distinct_hosts or distinct_property, not both",
            ));
            None
        }
        (Some(_), None) if written => {
            cx.record(cx.err(
                &hosts_path,
                hosts_line,
                "distinct_hosts = true/false stands for a whole constraint: give it alone \
                 (no attribute, operator, value or short form)",
            ));
            None
        }
        (Some(on), None) => on.then_some(NodeConstraint::DistinctHosts),
        (None, Some((attribute, line))) => {
            let both = "distinct_property = \"…\" is short for operator = \"distinct_property\" \
                        and attribute = \"…\": give one form, not both (value is the limit)";
            if input.operator.is_some() {
                cx.record(at.err(cx, RulePart::Operator, both));
                return None;
            }
            if !input.attribute.is_empty() {
                cx.record(at.err(cx, RulePart::Attribute, both));
                return None;
            }
            distinct_property(cx, &at, (property_path, line), attribute, &input.value)
        }
        (None, None) => match input.operator.as_deref().unwrap_or("=") {
            "distinct_hosts" => {
                let mut ok = true;
                if !input.attribute.is_empty() {
                    cx.record(at.err(
                        cx,
                        RulePart::Attribute,
                        "distinct_hosts takes no attribute: it keeps the allocs on distinct \
                         nodes",
                    ));
                    ok = false;
                }
                if !matches!(input.value.as_str(), "" | "true") {
                    cx.record(at.err(
                        cx,
                        RulePart::Value,
                        format!(
                            "distinct_hosts takes no value but \"true\", found {} (leave the \
                             constraint out to not apply it)",
                            Quoted(&input.value)
                        ),
                    ));
                    ok = false;
                }
                ok.then_some(NodeConstraint::DistinctHosts)
            }
            "distinct_property" => {
                let attribute_at = at.of(RulePart::Attribute);
                distinct_property(cx, &at, attribute_at, input.attribute, &input.value)
            }
            text => {
                let Some(operator) = Operand::parse(text) else {
                    cx.record(at.err(cx, RulePart::Operator, unknown_node_operator(text, false)));
                    return None;
                };
                node_sides(cx, &at, &input, operator).then_some(NodeConstraint::Attribute {
                    attribute: input.attribute,
                    operator,
                    value: input.value,
                })
            }
        },
    }
}

/// One `affinity` block of a job or group; `None` when it has problems (recorded).
fn node_affinity(cx: &Cx<'_>, mut a: Fields) -> Option<NodeAffinity> {
    let mut broken = false;
    for key in ["distinct_hosts", "distinct_property"] {
        for n in a.take(key) {
            cx.record(cx.err(
                &a.path.key(key),
                n.line,
                format!("{key} applies to constraints only, not to affinities"),
            ));
            broken = true;
        }
    }
    let (input, weight, at) = rule(cx, a, true, &[]);
    if broken || at.broken {
        return None;
    }
    let text = input.operator.as_deref().unwrap_or("=");
    let operator = match Operand::parse(text) {
        Some(op) if op.for_affinity() => op,
        Some(_) => {
            cx.record(at.err(
                cx,
                RulePart::Operator,
                format!("{text} applies to constraints only, not to affinities"),
            ));
            return None;
        }
        None if matches!(text, "distinct_hosts" | "distinct_property") => {
            cx.record(at.err(
                cx,
                RulePart::Operator,
                format!("{text} applies to constraints only, not to affinities"),
            ));
            return None;
        }
        None => {
            cx.record(at.err(cx, RulePart::Operator, unknown_node_operator(text, true)));
            return None;
        }
    };
    let sides = node_sides(cx, &at, &input, operator);
    let weight = match weight {
        None => Some(DEFAULT_AFFINITY_WEIGHT),
        Some(0) => {
            cx.record(at.err(
                cx,
                RulePart::Weight,
                "must not be 0: from -100 (avoid) to 100 (prefer)",
            ));
            None
        }
        Some(w) => match i8::try_from(w) {
            Ok(w) if AFFINITY_WEIGHT_RANGE.contains(&w) => Some(w),
            _ => {
                cx.record(at.err(cx, RulePart::Weight, format!("{w} is outside -100 to 100")));
                None
            }
        },
    };
    match weight {
        Some(weight) if sides => Some(NodeAffinity {
            attribute: input.attribute,
            operator,
            value: input.value,
            weight,
        }),
        _ => None,
    }
}

/// One `spread` block of a job or group; `None` when it has problems (recorded).
fn spread(cx: &Cx<'_>, mut s: Fields) -> Option<Spread> {
    if let Err(e) = s.deny_unknown(cx, &["attribute", "weight", "target"]) {
        cx.record(e);
        return None;
    }
    let mut broken = false;
    let attribute_path = s.path.key("attribute");
    let attribute_line = s.line_of("attribute");
    let attribute = match kept(cx, &mut broken, rule_text(cx, &mut s, "attribute")) {
        Some((a, line)) if !a.is_empty() => {
            broken |= !node_side(cx, (attribute_path, line), &a);
            a
        }
        written => {
            if !broken {
                cx.record(cx.err(
                    &attribute_path,
                    written.and_then(|(_, line)| line).or(attribute_line),
                    format!(
                        "is required: the property whose values the allocs spread over, e.g. \
                         \"${{node.datacenter}}\" ({NODE_REFERENCES})"
                    ),
                ));
                broken = true;
            }
            String::new()
        }
    };
    let weight_path = s.path.key("weight");
    let weight_line = s.line_of("weight");
    let weight = match kept(cx, &mut broken, s.number(cx, "weight", 0, 100)) {
        None => DEFAULT_SPREAD_WEIGHT,
        Some(0) => {
            cx.record(cx.err(
                &weight_path,
                weight_line,
                "must be from 1 to 100: berth refuses a weight of 0 (Nomad takes it), which \
                 gives the spread no say in placement",
            ));
            broken = true;
            0
        }
        Some(w) => small(w),
    };
    let mut targets = Vec::new();
    let mut seen: BTreeMap<String, Option<usize>> = BTreeMap::new();
    let mut total = 0;
    let mut over = None;
    let labelled = kept(cx, &mut broken, s.labelled(cx, "target", "value").map(Some));
    for (value, mut t) in labelled.unwrap_or_default() {
        if let Some(first) = seen.get(&value) {
            let at = first
                .map(|l| format!(" (first at line {l})"))
                .unwrap_or_default();
            cx.record(cx.err(
                &t.path,
                t.line,
                format!("target {} given more than once{at}", Quoted(&value)),
            ));
            broken = true;
            continue;
        }
        seen.insert(value.clone(), t.line);
        if value.is_empty() {
            cx.record(cx.err(
                &t.path,
                t.line,
                "needs a value as its label: target \"<value>\" { percent = <0 to 100> }",
            ));
            broken = true;
            continue;
        }
        let percent_path = t.path.key("percent");
        let percent_line = t.line_of("percent");
        let percent = t
            .deny_unknown(cx, &["percent"])
            .and_then(|()| t.number(cx, "percent", 0, 100));
        let Some(percent) = kept(cx, &mut broken, percent.map(|p| Some(p.unwrap_or(0)))) else {
            continue;
        };
        total += percent;
        if total > 100 && over.is_none() {
            over = Some((percent_path, percent_line));
        }
        targets.push(SpreadTarget {
            value,
            percent: small(percent),
        });
    }
    if let Some((path, line)) = over {
        cx.record(cx.err(
            &path,
            line,
            format!("the spread's target percents add up to {total}: at most 100"),
        ));
        broken = true;
    }
    (!broken).then_some(Spread {
        attribute,
        weight,
        targets,
    })
}
