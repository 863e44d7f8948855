//! A group's `service` blocks and a task's `kind` and `identity` blocks: read, checked by
//! Nomad's rules, and checked against each other (a proxy task's service exists, with a
//! sidecar).

use std::{
    collections::BTreeMap,
    path::{Component, Path},
    time::Duration,
};

use berth_input::{Quoted, Shown, quoted_list};
use berth_volume::SpecError;

use super::{Cx, Fields, Res, duplicate, string};
use crate::{
    connect::{
        ConnectSpec, DEFAULT_IDENTITY_AUD, DEFAULT_IDENTITY_NAME, IdentityChangeMode,
        MAX_IDENTITY_NAME_CHARS, ServiceIdentity, ServiceProvider, ServiceSpec, SidecarService,
        TaskKind, TaskKindError, WorkloadIdentity, check_service_name,
    },
    input::V,
    path::FieldPath,
    spec::TaskSpec,
};

/// A group's services as read. `complete` is false when a `service` block was dropped for an
/// error: checks against the list would then only repeat that error.
pub(super) struct GroupServices {
    pub list: Vec<ServiceSpec>,
    pub complete: bool,
}

/// The group's `service` blocks, each checked; names unique, one provider for all (as in
/// Nomad). Problems are recorded, and the block in question dropped.
pub(super) fn services(cx: &Cx<'_>, g: &mut Fields, job_id: &str, group: &str) -> GroupServices {
    let mut out = GroupServices {
        list: Vec::new(),
        complete: true,
    };
    let blocks = match g.blocks(cx, "service") {
        Ok(b) => b,
        Err(e) => {
            cx.record(e);
            out.complete = false;
            return out;
        }
    };
    let mut lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for mut s in blocks {
        let provider_line = s.line_of("provider");
        let svc = match service(cx, &mut s, job_id, group) {
            Ok(svc) => svc,
            Err(e) => {
                cx.record(e);
                out.complete = false;
                continue;
            }
        };
        if let Some(first) = lines.get(&svc.name) {
            cx.record(duplicate(cx, &s, "service", &svc.name, *first));
            continue;
        }
        if let Some(other) = out.list.iter().find(|o| o.provider != svc.provider) {
            cx.record(cx.err(
                &s.path.key("provider"),
                provider_line,
                format!(
                    "is {}, but service {} uses {}: the services of a group share one provider",
                    Quoted(svc.provider.as_str()),
                    Quoted(&other.name),
                    Quoted(other.provider.as_str())
                ),
            ));
            continue;
        }
        lines.insert(svc.name.clone(), s.line);
        out.list.push(svc);
    }
    out
}

/// Runtime variables a group service's name may use; they are filled when the spec is read.
const NAME_VARIABLES: &str = "${NOMAD_JOB_NAME} and ${NOMAD_GROUP_NAME}";

fn service(cx: &Cx<'_>, s: &mut Fields, job_id: &str, group: &str) -> Res<ServiceSpec> {
    s.deny_unknown(
        cx,
        &["name", "port", "tags", "provider", "connect", "identity"],
    )?;
    let p = s.path.clone();
    let line = s.line_of("name");
    let written = s.template(cx, "name")?.ok_or_else(|| {
        cx.err(
            &p.key("name"),
            s.line,
            "is required (a service name, e.g. name = \"api\")",
        )
    })?;
    let name = written
        .render(&|var| match var {
            "NOMAD_JOB_NAME" => Some(job_id.to_owned()),
            "NOMAD_GROUP_NAME" => Some(group.to_owned()),
            _ => None,
        })
        .map_err(|var| {
            let why = if var == "NOMAD_TASK_NAME" {
                "a group service belongs to no task"
            } else {
                "not known here"
            };
            cx.err(
                &p.key("name"),
                line,
                format!(
                    "unknown variable {} ({why}): a service name may use {NAME_VARIABLES}, \
                     filled when the spec is read",
                    Shown(&var)
                ),
            )
        })?;
    check_service_name(&name).map_err(|e| cx.err(&p.key("name"), line, e.to_string()))?;
    let port = port(cx, s, "port")?;
    let tags = s.strings(cx, "tags")?.unwrap_or_default();
    let line = s.line_of("provider");
    let provider = match s.string(cx, "provider")? {
        None => ServiceProvider::default(),
        Some(v) => v
            .parse()
            .map_err(|e: String| cx.err(&p.key("provider"), line, e))?,
    };
    let connect = s
        .block(cx, "connect")?
        .map(|c| connect(cx, c, provider))
        .transpose()?;
    let identity = match s.block(cx, "identity")? {
        Some(mut i) => {
            i.deny_unknown(cx, &["aud", "ttl"])?;
            let aud = audiences(cx, &mut i)?;
            let ttl = ttl(cx, &mut i)?;
            Some(ServiceIdentity { aud, ttl })
        }
        None => None,
    };
    Ok(ServiceSpec {
        name,
        port,
        tags,
        provider,
        connect,
        identity,
    })
}

/// A port label or number (1 to 65535), kept as text.
fn port(cx: &Cx<'_>, f: &mut Fields, key: &str) -> Res<Option<String>> {
    let path = f.path.key(key);
    let Some(n) = f.value(cx, key)? else {
        return Ok(None);
    };
    let text = match &n.v {
        V::Str(s) => s.clone(),
        V::Num(x) if x.as_u64().is_some_and(|p| (1..=65535).contains(&p)) => x.to_string(),
        V::Num(x) => {
            return Err(cx.err(
                &path,
                n.line,
                format!("{x} is not a port number (1 to 65535)"),
            ));
        }
        _ => return Err(cx.wrong(&path, &n, "a port label or number")),
    };
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(cx.err(
            &path,
            n.line,
            format!("{} is not a port label or number", Quoted(&text)),
        ));
    }
    Ok(Some(text))
}

fn connect(cx: &Cx<'_>, mut c: Fields, provider: ServiceProvider) -> Res<ConnectSpec> {
    c.deny_unknown(cx, &["native", "sidecar_service"])?;
    if provider != ServiceProvider::Consul {
        return Err(cx.err(
            &c.path,
            c.line,
            format!(
                "Connect needs provider \"consul\", and this service's provider is {}",
                Quoted(provider.as_str())
            ),
        ));
    }
    let native_line = c.line_of("native");
    let native = c.bool(cx, "native")?.unwrap_or(false);
    let sidecar_service = match c.block(cx, "sidecar_service")? {
        Some(mut sc) => {
            sc.deny_unknown(cx, &["port", "tags"])?;
            Some(SidecarService {
                port: port(cx, &mut sc, "port")?,
                tags: sc.strings(cx, "tags")?.unwrap_or_default(),
            })
        }
        None => None,
    };
    match (native, &sidecar_service) {
        (true, Some(_)) => Err(cx.err(
            &c.path.key("native"),
            native_line,
            "native = true and a sidecar_service block exclude each other (a native service \
             has no proxy)",
        )),
        (false, None) => Err(cx.err(
            &c.path,
            c.line,
            "needs a sidecar_service { … } block (a sidecar proxy fronts the service) or \
             native = true",
        )),
        _ => Ok(ConnectSpec {
            native,
            sidecar_service,
        }),
    }
}

/// `aud`: a list of non-empty strings; errors name the item and its line.
fn audiences(cx: &Cx<'_>, f: &mut Fields) -> Res<Vec<String>> {
    let path = f.path.key("aud");
    let Some(n) = f.value(cx, "aud")? else {
        return Ok(Vec::new());
    };
    let line = n.line;
    let V::List(items) = n.v else {
        return Err(cx.wrong(&path, &n, "a list of strings"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, x) in items.into_iter().enumerate() {
        let at = x.line.or(line);
        let a = string(cx, &path.at(i), x)?;
        if a.is_empty() {
            return Err(cx.err(
                &path.at(i),
                at,
                "is empty: an audience is a non-empty string",
            ));
        }
        out.push(a);
    }
    Ok(out)
}

/// `ttl`: a duration of more than 0.
fn ttl(cx: &Cx<'_>, f: &mut Fields) -> Res<Option<Duration>> {
    let line = f.line_of("ttl");
    match f.duration(cx, "ttl")? {
        Some(d) if d.is_zero() => Err(cx.err(
            &f.path.key("ttl"),
            line,
            "must be more than 0 (leave ttl out for a token that does not expire)",
        )),
        d => Ok(d),
    }
}

/// A task's `identity` blocks, each checked; names unique.
pub(super) fn identities(cx: &Cx<'_>, t: &mut Fields) -> Res<Vec<WorkloadIdentity>> {
    // Nomad names an identity inside the block; a label is an easy slip.
    let labelled = t.items.iter().find_map(|(k, n)| match &n.v {
        V::Block { labels, .. } if k == "identity" && !labels.is_empty() => Some((n.line, labels)),
        _ => None,
    });
    if let Some((line, labels)) = labelled {
        return Err(cx.err(
            &t.path.key("identity"),
            line,
            format!(
                "takes no label: name the identity inside the block, identity {{ name = {} … }}, \
                 as Nomad does",
                Quoted(&labels[0])
            ),
        ));
    }
    let mut out: Vec<WorkloadIdentity> = Vec::new();
    let mut lines: BTreeMap<String, Option<usize>> = BTreeMap::new();
    for mut i in t.blocks(cx, "identity")? {
        let id = identity(cx, &mut i)?;
        if let Some(first) = lines.get(&id.name) {
            let mut e = duplicate(cx, &i, "identity", &id.name, *first);
            if id.is_default() {
                e.message.push_str(
                    "; only one identity block may leave out name: it sets up the default identity",
                );
            }
            return Err(e);
        }
        lines.insert(id.name.clone(), i.line);
        out.push(id);
    }
    Ok(out)
}

fn identity(cx: &Cx<'_>, i: &mut Fields) -> Res<WorkloadIdentity> {
    i.deny_unknown(
        cx,
        &[
            "name",
            "aud",
            "env",
            "file",
            "filepath",
            "ttl",
            "change_mode",
            "change_signal",
        ],
    )?;
    let p = i.path.clone();
    let line = i.line_of("name");
    // As in Nomad, an empty name is the default identity's.
    let name = i
        .string(cx, "name")?
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_IDENTITY_NAME.to_owned());
    if name.len() > MAX_IDENTITY_NAME_CHARS
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(cx.err(
            &p.key("name"),
            line,
            format!(
                "invalid identity name {}: 1 to {MAX_IDENTITY_NAME_CHARS} ASCII letters, digits, \
                 '-' and '_'",
                Quoted(&name)
            ),
        ));
    }
    let default = name == DEFAULT_IDENTITY_NAME;

    let line = i.line_of("aud");
    let mut aud = audiences(cx, i)?;
    if default {
        if !aud.is_empty() && aud != [DEFAULT_IDENTITY_AUD] {
            return Err(cx.err(
                &p.key("aud"),
                line,
                format!(
                    "the default identity's audience is always \"{DEFAULT_IDENTITY_AUD}\" (as in \
                     Nomad); give the identity a name to set another"
                ),
            ));
        }
        aud = vec![DEFAULT_IDENTITY_AUD.to_owned()];
    }
    let env = i.bool(cx, "env")?.unwrap_or(false);
    let file = i.bool(cx, "file")?.unwrap_or(false);
    let line = i.line_of("filepath");
    let filepath = i.string(cx, "filepath")?;
    if let Some(fp) = &filepath {
        let why = if !file {
            Some("goes with file = true only")
        } else if fp.is_empty() || fp.starts_with('/') {
            Some("must be a path relative to the task's directory")
        } else if Path::new(fp)
            .components()
            .any(|c| c == Component::ParentDir)
        {
            Some("must not contain \"..\"")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(cx.err(&p.key("filepath"), line, why));
        }
    }
    let line = i.line_of("ttl");
    let ttl = ttl(cx, i)?;
    if default && ttl.is_some() {
        return Err(cx.err(
            &p.key("ttl"),
            line,
            "the default identity takes no ttl (as in Nomad); give the identity a name to set one",
        ));
    }

    let mode_line = i.line_of("change_mode");
    let change_mode = match i.string(cx, "change_mode")? {
        None => IdentityChangeMode::default(),
        Some(m) => m
            .parse()
            .map_err(|e: String| cx.err(&p.key("change_mode"), mode_line, e))?,
    };
    let line = i.line_of("change_signal");
    let change_signal = i
        .string(cx, "change_signal")?
        .map(|s| s.to_ascii_uppercase());
    match (&change_signal, change_mode) {
        (None, IdentityChangeMode::Signal) => {
            return Err(cx.err(
                &p.key("change_mode"),
                mode_line,
                "\"signal\" needs change_signal (e.g. change_signal = \"SIGHUP\")",
            ));
        }
        (Some(_), IdentityChangeMode::Noop | IdentityChangeMode::Restart) => {
            return Err(cx.err(
                &p.key("change_signal"),
                line,
                "goes with change_mode = \"signal\" only",
            ));
        }
        (Some(s), IdentityChangeMode::Signal) if !is_signal_name(s) => {
            return Err(cx.err(
                &p.key("change_signal"),
                line,
                format!("{} is not a signal name such as \"SIGHUP\"", Quoted(s)),
            ));
        }
        _ => {}
    }
    Ok(WorkloadIdentity {
        name,
        aud,
        env,
        file,
        filepath,
        ttl,
        change_mode,
        change_signal,
    })
}

/// `SIG` and letters, digits or `+` (`SIGHUP`, `SIGRTMIN+1`).
fn is_signal_name(s: &str) -> bool {
    s.strip_prefix("SIG").is_some_and(|rest| {
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')
    })
}

/// A task's `kind`. A proxy's service must be one of the group's with a sidecar, a native
/// task's one with `native = true` (unless a service block was dropped for an error).
pub(super) fn kind(cx: &Cx<'_>, t: &mut Fields, services: &GroupServices) -> Res<Option<TaskKind>> {
    let path = t.path.key("kind");
    let line = t.line_of("kind");
    let Some(text) = t.string(cx, "kind")? else {
        return Ok(None);
    };
    let kind: TaskKind = text
        .parse()
        .map_err(|e: TaskKindError| cx.err(&path, line, e.to_string()))?;
    if !services.complete {
        return Ok(Some(kind));
    }
    let (block, has): (&str, fn(&ServiceSpec) -> bool) = match &kind {
        TaskKind::ConnectProxy(_) => ("connect { sidecar_service {} }", ServiceSpec::has_sidecar),
        TaskKind::ConnectNative(_) => ("connect { native = true }", ServiceSpec::is_connect_native),
        _ => return Ok(Some(kind)),
    };
    let name = kind.service();
    match services.list.iter().find(|s| s.name == name) {
        None => {
            let have = if services.list.is_empty() {
                "the group has no service block".to_owned()
            } else {
                format!(
                    "the group's services: {}",
                    quoted_list(services.list.iter().map(|s| s.name.as_str()))
                )
            };
            Err(cx.err(
                &path,
                line,
                format!(
                    "{kind}: the group has no service {} ({have}); add service {{ name = {} \
                     {block} }} to the group",
                    Quoted(name),
                    Quoted(name)
                ),
            ))
        }
        Some(s) if !has(s) => Err(cx.err(
            &path,
            line,
            format!("{kind}: service {} has no {block} block", Quoted(&s.name)),
        )),
        Some(_) => Ok(Some(kind)),
    }
}

/// Keeps the first `connect-proxy` task of each service in `proxies` (service → task); for a
/// second one, the error to record.
pub(super) fn second_proxy(
    cx: &Cx<'_>,
    proxies: &mut BTreeMap<String, String>,
    task: &TaskSpec,
    (path, line): (&FieldPath, Option<usize>),
) -> Option<SpecError> {
    let Some(TaskKind::ConnectProxy(service)) = &task.kind else {
        return None;
    };
    if let Some(first) = proxies.get(service) {
        return Some(cx.err(
            path,
            line,
            format!(
                "task {} is already the proxy of service {}: a service has one sidecar proxy",
                Quoted(first),
                Quoted(service)
            ),
        ));
    }
    proxies.insert(service.clone(), task.name.clone());
    None
}
