//! Whether a device group fits a request, and how much the request's affinities like it, as
//! Nomad's scheduler decides (`nodeDeviceMatches`, `checkAttributeConstraint`, and the device
//! part of its ranking).
//!
//! Where Nomad's answer is plainly unintended, berth answers otherwise (each is said where it
//! is done): two different bools are not ordered; a string attribute that reads as a number
//! (`"7.5"`, `"16 GiB"`) compares as that number with a number; the text operators (`regexp`,
//! `version`, `semver`, `set_contains*`) read a literal value as written (Nomad first turns
//! `"1.2"` into a float and then finds no text in it) and a number or bool attribute as its
//! text (`2048 MiB`).

use std::{borrow::Cow, cmp::Ordering};

use berth_input::{Quoted, Shown};

use super::{
    DEVICE_REFERENCES, DeviceRequest, DeviceTarget, Operand, regex_error,
    version::{Constraints, Flavor, Version},
};
use crate::{
    attribute::{AttrValue, Attribute},
    model::DeviceGroup,
};

/// One side of a constraint, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// Text taken as it is.
    Literal(&'a str),
    /// `${device.ids}`: the group's instance ids, joined by `,`.
    Ids,
    /// `${device.model}`: the group's name.
    Model,
    /// `${device.vendor}`.
    Vendor,
    /// `${device.type}`.
    Type,
    /// `${device.attr.<name>}`.
    Attr(&'a str),
}

/// Reads one side: text without `${` is a literal; otherwise it must be exactly one of the
/// device references.
pub(crate) fn parse_target(text: &str) -> Result<Target<'_>, String> {
    if !text.contains("${") {
        return Ok(Target::Literal(text));
    }
    let inner = text
        .strip_prefix("${")
        .and_then(|t| t.strip_suffix('}'))
        .filter(|t| !t.contains(['{', '}']));
    let target = match inner {
        Some("device.ids") => Some(Target::Ids),
        Some("device.model") => Some(Target::Model),
        Some("device.vendor") => Some(Target::Vendor),
        Some("device.type") => Some(Target::Type),
        Some(other) => other
            .strip_prefix("device.attr.")
            .filter(|k| !k.is_empty())
            .map(Target::Attr),
        None => None,
    };
    target.ok_or_else(|| {
        let whole = if inner.is_none() {
            ", each as the whole attribute or value"
        } else {
            ""
        };
        format!(
            "{}: device constraints can only use {DEVICE_REFERENCES}{whole}",
            Quoted(text)
        )
    })
}

/// One side, resolved against a group.
#[derive(Debug, Clone)]
struct Side<'a> {
    /// As written (for messages).
    written: &'a str,
    /// What the side is called in messages (`memory`, `model`); `None` for a literal.
    name: Option<Cow<'a, str>>,
    /// The value; `None` when the attribute is not set (or the side is not a valid target).
    value: Option<Attribute>,
    /// The text the text operators read.
    text: String,
}

impl<'a> Side<'a> {
    fn resolve(written: &'a str, group: &DeviceGroup) -> Self {
        let string = |name: &'a str, s: &str| Side {
            written,
            name: Some(Cow::Borrowed(name)),
            value: Some(Attribute::string(s)),
            text: s.to_string(),
        };
        match parse_target(written) {
            Ok(Target::Literal(t)) => Side {
                written,
                name: None,
                value: Some(Attribute::parse(t)),
                text: t.to_string(),
            },
            Ok(Target::Ids) => {
                let ids: Vec<&str> = group.instances.iter().map(|i| i.id.as_str()).collect();
                string("ids", &ids.join(","))
            }
            Ok(Target::Model) => string("model", &group.name),
            Ok(Target::Vendor) => string("vendor", &group.vendor),
            Ok(Target::Type) => string("type", &group.device_type),
            Ok(Target::Attr(key)) => {
                let value = group.attributes.get(key).cloned();
                Side {
                    written,
                    name: Some(Cow::Borrowed(key)),
                    text: value.as_ref().map(text_of).unwrap_or_default(),
                    value,
                }
            }
            // Nomad resolves anything else to "not set".
            Err(_) => Side {
                written,
                name: Some(Cow::Borrowed(written)),
                value: None,
                text: String::new(),
            },
        }
    }

    /// A device instance id, as Nomad's per-instance check sees it.
    fn instance(id: &'a str) -> Self {
        Side {
            written: id,
            name: Some(Cow::Borrowed("id")),
            value: Some(Attribute::string(id)),
            text: id.to_string(),
        }
    }

    fn found(&self) -> bool {
        self.value.is_some()
    }

    /// `memory is 2 GiB`, `attribute memory is not set`; `None` for a literal.
    fn describe(&self) -> Option<String> {
        let name = self.name.as_deref()?;
        Some(match &self.value {
            None => format!("attribute {} is not set", Shown(name)),
            Some(_) if name == "ids" => format!("ids are {}", Shown(&self.text)),
            Some(_) => format!("{} is {}", Shown(name), Shown(&self.text)),
        })
    }
}

/// An attribute as the text operators read it: a string as it is, anything else as Nomad
/// prints it (`2048 MiB`, `true`).
fn text_of(a: &Attribute) -> String {
    match &a.value {
        AttrValue::String(s) => s.clone(),
        _ => a.to_string(),
    }
}

/// How two resolved values relate.
enum Rel {
    Ordered(Ordering),
    /// Two different bools.
    Unequal,
    Incomparable,
}

fn relate(l: &Attribute, r: &Attribute) -> Rel {
    let direct = |l: &Attribute, r: &Attribute| {
        l.equals(r).map(|eq| match l.compare(r) {
            Some(o) => Rel::Ordered(o),
            None if eq => Rel::Ordered(Ordering::Equal),
            None => Rel::Unequal,
        })
    };
    if let Some(rel) = direct(l, r) {
        return rel;
    }
    // Unlike Nomad: a string that reads as a number or a bool compares as one with one.
    let reread = |a: &Attribute| match &a.value {
        AttrValue::String(s) => Attribute::parse(s),
        _ => a.clone(),
    };
    if (l.as_str().is_some() || r.as_str().is_some())
        && let Some(rel) = direct(&reread(l), &reread(r))
    {
        return rel;
    }
    Rel::Incomparable
}

/// Why a check failed, beyond the sides' values (`None`: their values say it all).
type Why = Option<String>;

/// Whether `op` holds between `l` and `r`; when it does not, an extra reason when there is one.
fn holds(op: Operand, l: &Side<'_>, r: &Side<'_>) -> Result<(), Why> {
    let both = l.found() && r.found();
    let not_comparable = || {
        Some(format!(
            "{} does not compare with {}",
            Shown(&l.text),
            Shown(&r.text)
        ))
    };
    let fail = |c: bool| if c { Ok(()) } else { Err(None) };
    match op {
        Operand::IsSet => fail(l.found()),
        Operand::IsNotSet => fail(!l.found()),
        Operand::NotEqual => match (l.value.as_ref(), r.value.as_ref()) {
            (None, None) => Err(None),
            (Some(_), None) | (None, Some(_)) => Ok(()),
            (Some(a), Some(b)) => match relate(a, b) {
                Rel::Ordered(o) => fail(o != Ordering::Equal),
                Rel::Unequal => Ok(()),
                Rel::Incomparable => Err(not_comparable()),
            },
        },
        Operand::Equal
        | Operand::Less
        | Operand::LessOrEqual
        | Operand::Greater
        | Operand::GreaterOrEqual => {
            let (Some(a), Some(b)) = (l.value.as_ref(), r.value.as_ref()) else {
                return Err(None);
            };
            match relate(a, b) {
                Rel::Ordered(o) => fail(match op {
                    Operand::Equal => o.is_eq(),
                    Operand::Less => o.is_lt(),
                    Operand::LessOrEqual => o.is_le(),
                    Operand::Greater => o.is_gt(),
                    _ => o.is_ge(),
                }),
                // Unlike Nomad, which finds any two different bools both `>` each other.
                Rel::Unequal => Err(Some("bools are only equal or not".into())),
                Rel::Incomparable => Err(not_comparable()),
            }
        }
        Operand::Regexp => {
            if !both {
                return Err(None);
            }
            match regex::Regex::new(&r.text) {
                Ok(re) => fail(re.is_match(&l.text)),
                Err(e) => Err(Some(format!(
                    "{} is not a regular expression: {}",
                    Shown(&r.text),
                    regex_error(&e)
                ))),
            }
        }
        Operand::Version | Operand::Semver => {
            if !both {
                return Err(None);
            }
            let flavor = if op == Operand::Version {
                Flavor::Version
            } else {
                Flavor::Semver
            };
            let c = Constraints::parse(&r.text, flavor).map_err(Some)?;
            let v = Version::parse_checked(&l.text, flavor).map_err(Some)?;
            fail(c.check(&v))
        }
        Operand::SetContains | Operand::SetContainsAll | Operand::SetContainsAny => {
            if !both {
                return Err(None);
            }
            let have: Vec<&str> = l.text.split(',').map(str::trim).collect();
            let mut want = r.text.split(',').map(str::trim);
            fail(if op == Operand::SetContainsAny {
                want.any(|w| have.contains(&w))
            } else {
                want.all(|w| have.contains(&w))
            })
        }
    }
}

/// `${device.attr.memory} >= 4 GiB`.
fn shown_rule(attribute: &str, op: Operand, value: &str) -> String {
    if value.is_empty() {
        format!("{} {op}", Shown(attribute))
    } else {
        format!("{} {op} {}", Shown(attribute), Shown(value))
    }
}

/// Why `op` fails between `l` and `r`, in words: what the device sides are, then `extra`.
fn reason(l: &Side<'_>, r: &Side<'_>, op: Operand, extra: Why) -> String {
    if op == Operand::IsNotSet {
        return format!(
            "attribute {} is set ({})",
            Shown(l.name.as_deref().unwrap_or(l.written)),
            Shown(&l.text)
        );
    }
    let mut parts: Vec<String> = l.describe().into_iter().collect();
    if op.takes_value() {
        parts.extend(r.describe());
    }
    if parts.is_empty() {
        parts.push(format!(
            "{} {op} {} does not hold",
            Shown(&l.text),
            Shown(&r.text)
        ));
    }
    parts.extend(extra);
    parts.join("; ")
}

/// Every reason `group` does not fit `req`, apart from how many of its instances are free and
/// healthy (placement counts those): its vendor, type or name is not the one asked for (then
/// that is the only reason given), or, for each constraint that fails, `constraint <attribute>
/// <op> <value> failed: <why>` (`…: memory is 2 GiB`, `…: attribute memory is not set`).
/// Constraints are checked per group: attributes belong to groups, and `${device.ids}` is the
/// group's instance ids joined by `,`. A CDI request fits no plugin group (CDI devices are
/// resolved from CDI specs).
pub fn check_group(req: &DeviceRequest, group: &DeviceGroup) -> Result<(), Vec<String>> {
    let name = match &req.target {
        DeviceTarget::Plugin(n) => n,
        DeviceTarget::Cdi(q) => {
            return Err(vec![format!(
                "CDI device {q} is resolved from CDI specs, not from device plugin groups"
            )]);
        }
    };
    let id = group.id();
    if !name.matches(&id) {
        return Err(vec![format!(
            "device {} is not {}",
            Shown(&id.to_string()),
            Shown(&name.to_string())
        )]);
    }
    let reasons: Vec<String> = req
        .constraints
        .iter()
        .filter_map(|c| {
            let l = Side::resolve(&c.attribute, group);
            let r = Side::resolve(&c.value, group);
            holds(c.operator, &l, &r).err().map(|extra| {
                format!(
                    "constraint {} failed: {}",
                    shown_rule(&c.attribute, c.operator, &c.value),
                    reason(&l, &r, c.operator, extra)
                )
            })
        })
        .collect();
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// The affinities of a request against one group: the sum of the weights of those that hold,
/// and the sum of the absolute weights of all; [`affinity_score`] divides them (Nomad adds
/// them up over every request of an alloc to rank a node).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AffinityWeights {
    /// Sum of the weights of the affinities that hold (negative ones included).
    pub matched: f64,
    /// Sum of the absolute weights of all affinities.
    pub total: f64,
}

impl AffinityWeights {
    /// `matched / total`, in [-1, 1]; 0 when there is no affinity.
    pub fn score(&self) -> f64 {
        if self.total == 0.0 {
            0.0
        } else {
            self.matched / self.total
        }
    }
}

/// [`AffinityWeights`] of `req` against `group` (which should fit it: see [`check_group`]).
pub fn affinity_weights(req: &DeviceRequest, group: &DeviceGroup) -> AffinityWeights {
    let mut w = AffinityWeights::default();
    for a in &req.affinities {
        w.total += f64::from(a.weight).abs();
        let l = Side::resolve(&a.attribute, group);
        let r = Side::resolve(&a.value, group);
        if holds(a.operator, &l, &r).is_ok() {
            w.matched += f64::from(a.weight);
        }
    }
    w
}

/// How much `req`'s affinities like `group`, in [-1, 1], as Nomad scores a device choice: the
/// sum of the weights of the affinities that hold over the sum of all absolute weights; 0
/// without affinities. Higher is better.
pub fn affinity_score(req: &DeviceRequest, group: &DeviceGroup) -> f64 {
    affinity_weights(req, group).score()
}

/// Whether the instance `instance_id` of `group` may be given for `req`: every constraint
/// with `${device.ids}` on one side must hold between its other side and the instance's id
/// alone (Nomad's per-instance check, after [`check_group`] has passed for the group):
/// `${device.ids} set_contains_any "GPU-1,GPU-3"` lets only those two instances be chosen.
pub fn instance_fits(req: &DeviceRequest, group: &DeviceGroup, instance_id: &str) -> bool {
    req.constraints.iter().all(|c| {
        let other = if c.attribute == "${device.ids}" {
            &c.value
        } else if c.value == "${device.ids}" {
            &c.attribute
        } else {
            return true;
        };
        let other = Side::resolve(other, group);
        holds(c.operator, &other, &Side::instance(instance_id)).is_ok()
    })
}

/// Whether `op` holds between two sides already resolved to text (`None`: not set), by the
/// same rules as a device constraint: text that reads as a number, a size or a bool compares
/// as one. For node rules, whose `${attr.…}` sides the caller resolves per node. On failure,
/// the reason in words (`"4" >= "8" does not hold`, `attribute x is not set`).
pub fn text_holds(op: Operand, left: Option<&str>, right: Option<&str>) -> Result<(), String> {
    let side = |written: &'static str, t: Option<&str>| Side {
        written,
        name: None,
        value: t.map(Attribute::parse),
        text: t.unwrap_or_default().to_string(),
    };
    let l = side("attribute", left);
    let r = side("value", right);
    holds(op, &l, &r).map_err(|extra| {
        let mut why = match (left, op) {
            (None, _) => "its attribute is not set".to_string(),
            (Some(_), Operand::IsNotSet) => "its attribute is set".to_string(),
            (Some(_), _) if op.takes_value() && right.is_none() => {
                "its value is not set".to_string()
            }
            (Some(l), _) => format!("{} {op} {} does not hold", Shown(l), Shown(r.text.as_str())),
        };
        if let Some(extra) = extra {
            why.push_str("; ");
            why.push_str(&extra);
        }
        why
    })
}
