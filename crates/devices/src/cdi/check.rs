//! CDI's rules for a parsed spec (see [`super::CdiSpec::parse`]): the first rule broken is
//! reported, with the path of the field that breaks it.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Component, Path},
};

use berth_input::Quoted;

use super::{
    name::{check_device_name, check_kind_part},
    spec::{CdiEdits, RawSpec},
    version,
};

/// A broken rule: the field path and what is wrong.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) field: String,
    pub(crate) reason: String,
}

fn fail(field: impl Into<String>, reason: impl Into<String>) -> Problem {
    Problem {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The OCI hook names CDI accepts.
pub(crate) const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Checks `raw` and returns its kind's vendor and class.
pub(crate) fn spec(raw: &RawSpec) -> Result<(String, String), Problem> {
    let have = version::rank(&raw.cdi_version).ok_or_else(|| {
        fail(
            "cdiVersion",
            format!(
                "{}: unsupported; berth reads CDI spec versions {} to {}",
                Quoted(&raw.cdi_version),
                version::OLDEST_READ,
                version::NEWEST_READ
            ),
        )
    })?;
    let (vendor, class) = kind(&raw.kind)?;
    annotations("annotations", &raw.annotations)?;
    edits("containerEdits", &raw.container_edits)?;
    if raw.devices.is_empty() {
        return Err(fail("devices", "a spec must define at least one device"));
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, d) in raw.devices.iter().enumerate() {
        let at = format!("devices[{i}]");
        check_device_name(&d.name).map_err(|r| fail(format!("{at}.name"), r))?;
        if let Some(first) = seen.get(d.name.as_str()) {
            return Err(fail(
                format!("{at}.name"),
                format!("{} is also the name of devices[{first}]", Quoted(&d.name)),
            ));
        }
        seen.insert(&d.name, i);
        annotations(&format!("{at}.annotations"), &d.annotations)?;
        let at = format!("{at}.containerEdits");
        if d.container_edits.is_empty() {
            return Err(fail(
                at,
                "a device needs at least one edit (env, deviceNodes, mounts, …)",
            ));
        }
        edits(&at, &d.container_edits)?;
    }
    let (need, field) = version::required(raw);
    if need > have {
        return Err(fail(
            "cdiVersion",
            format!(
                "{} is too old for {field}, which needs at least {}",
                Quoted(&raw.cdi_version),
                version::name(need)
            ),
        ));
    }
    Ok((vendor.to_string(), class.to_string()))
}

fn kind(kind: &str) -> Result<(&str, &str), Problem> {
    let (vendor, class) = kind.split_once('/').ok_or_else(|| {
        fail(
            "kind",
            format!(
                "{}: expected vendor/class, like example.com/device",
                Quoted(kind)
            ),
        )
    })?;
    check_kind_part("vendor", vendor).map_err(|r| fail("kind", r))?;
    check_kind_part("class", class).map_err(|r| fail("kind", r))?;
    Ok((vendor, class))
}

fn annotations(at: &str, a: &BTreeMap<String, String>) -> Result<(), Problem> {
    if a.contains_key("") {
        return Err(fail(at, "empty key"));
    }
    Ok(())
}

fn edits(at: &str, e: &CdiEdits) -> Result<(), Problem> {
    for (i, entry) in e.env.iter().enumerate() {
        env(&format!("{at}.env[{i}]"), entry)?;
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        let at = format!("{at}.deviceNodes[{i}]");
        path(&format!("{at}.path"), &n.path, Side::Task)?;
        if !n.host_path.is_empty() {
            path(&format!("{at}.hostPath"), &n.host_path, Side::Host)?;
        }
        if !["", "b", "c", "u", "p"].contains(&n.node_type.as_str()) {
            return Err(fail(
                format!("{at}.type"),
                format!("{}: expected b, c, u or p", Quoted(&n.node_type)),
            ));
        }
        let p = &n.permissions;
        if !(p.is_empty() || p == "none" || p.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))) {
            return Err(fail(
                format!("{at}.permissions"),
                format!(
                    "{}: expected one or more of r, w and m, or \"none\"",
                    Quoted(p)
                ),
            ));
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let at = format!("{at}.mounts[{i}]");
        path(&format!("{at}.hostPath"), &m.host_path, Side::Host)?;
        path(
            &format!("{at}.containerPath"),
            &m.container_path,
            Side::Task,
        )?;
        for (j, o) in m.options.iter().enumerate() {
            if o.contains('\0') {
                return Err(fail(format!("{at}.options[{j}]"), "holds a NUL byte"));
            }
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let at = format!("{at}.hooks[{i}]");
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(fail(
                format!("{at}.hookName"),
                format!(
                    "{}: unknown hook; expected one of {}",
                    Quoted(&h.hook_name),
                    HOOK_NAMES.join(", ")
                ),
            ));
        }
        path(&format!("{at}.path"), &h.path, Side::Host)?;
        for (j, entry) in h.env.iter().enumerate() {
            env(&format!("{at}.env[{j}]"), entry)?;
        }
        if h.timeout.is_some_and(|t| t <= 0) {
            return Err(fail(
                format!("{at}.timeout"),
                "must be greater than zero when set",
            ));
        }
    }
    if let Some(rdt) = &e.intel_rdt {
        let c = rdt.clos_id.as_str();
        // A file name under resctrl, or `/` for the root class.
        let bad =
            c != "/" && (c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n', '\0']));
        if bad {
            return Err(fail(
                format!("{at}.intelRdt.closID"),
                format!("{}: must be a file name, or \"/\"", Quoted(c)),
            ));
        }
    }
    let mut hosts: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, d) in e.net_devices.iter().enumerate() {
        let at = format!("{at}.netDevices[{i}]");
        for (field, value, seen) in [
            ("hostInterfaceName", &d.host_interface_name, &mut hosts),
            ("name", &d.name, &mut names),
        ] {
            if value.is_empty() {
                return Err(fail(format!("{at}.{field}"), "must not be empty"));
            }
            if let Some(first) = seen.insert(value, i) {
                return Err(fail(
                    format!("{at}.{field}"),
                    format!(
                        "{} is also the {field} of netDevices[{first}]",
                        Quoted(value)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// An env entry: `NAME=VALUE` with a name. Only the name is ever repeated.
fn env(at: &str, entry: &str) -> Result<(), Problem> {
    match entry.find('=') {
        None => Err(fail(at, format!("{}: expected NAME=VALUE", Quoted(entry)))),
        Some(0) => Err(fail(at, "expected NAME=VALUE; the name is empty")),
        Some(_) if entry.contains('\0') => Err(fail(at, "holds a NUL byte")),
        Some(_) => Ok(()),
    }
}

/// Which side of a task a path is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// On the host.
    Host,
    /// In the task: joined to its root by some drivers, so it may not climb out with `..`.
    Task,
}

fn path(at: &str, p: &str, side: Side) -> Result<(), Problem> {
    if p.is_empty() {
        return Err(fail(at, "must be an absolute path, not empty"));
    }
    if p.contains('\0') {
        return Err(fail(at, "holds a NUL byte"));
    }
    if !p.starts_with('/') {
        return Err(fail(
            at,
            format!("must be an absolute path, not {}", Quoted(p)),
        ));
    }
    if side == Side::Task && Path::new(p).components().any(|c| c == Component::ParentDir) {
        return Err(fail(at, format!("{}: must not contain \"..\"", Quoted(p))));
    }
    Ok(())
}
