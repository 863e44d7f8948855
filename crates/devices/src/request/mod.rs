//! What a task asks for: device requests, as a job's `device "<name>" { … }` block writes them
//! (Nomad's `RequestedDevice`), and how they match device groups.
//!
//! A request names devices by type (`gpu`), vendor and type (`nvidia/gpu`), or vendor, type
//! and name (`nvidia/gpu/Tesla K80`), or names one CDI device (`nvidia.com/gpu=0`). It asks for
//! `count` instances, narrows the groups with constraints and ranks them with affinities. Both
//! compare an `attribute` with a `value` through an operator; each side is either a literal
//! (read with [`Attribute::parse`](crate::attribute::Attribute::parse)) or one of
//! `${device.model}`, `${device.vendor}`, `${device.type}`, `${device.ids}` and
//! `${device.attr.<name>}`.
//!
//! [`DeviceRequest::build`] checks a request as written and reports every problem with its
//! field; [`check_group`] says why a group does not fit, and [`affinity_score`] ranks the groups
//! that do.

mod matching;
mod version;

use std::{fmt, str::FromStr};

use berth_input::Quoted;
use serde::{Deserialize, Serialize};

use crate::{cdi::QualifiedName, model::DeviceGroupId};

pub use matching::{
    AffinityWeights, affinity_score, affinity_weights, check_group, instance_fits, text_holds,
};

/// `count` when a request does not give it.
pub const DEFAULT_COUNT: u32 = 1;
/// An affinity's `weight` when not given, as in Nomad.
pub const DEFAULT_AFFINITY_WEIGHT: i8 = 50;
/// The weights an affinity may have (0 excluded).
pub const AFFINITY_WEIGHT_RANGE: std::ops::RangeInclusive<i8> = -100..=100;

/// The references a constraint or an affinity may use, for messages.
pub const DEVICE_REFERENCES: &str = "${device.model|vendor|type|ids|attr.<name>}";

/// Which device plugin groups a request takes from: Nomad's `type`, `vendor/type` or
/// `vendor/type/name`. The name may hold spaces and further `/` (the label is split in three
/// at most).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceName {
    /// The vendor, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// The type; always given.
    pub device_type: String,
    /// The name (model), when given (only with a vendor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl DeviceName {
    /// Reads `type`, `vendor/type` or `vendor/type/name`. Every part is non-empty and holds no
    /// control character.
    pub fn parse(label: &str) -> Result<Self, String> {
        let shown = Quoted(label);
        if label.is_empty() {
            return Err(
                "is empty: name a device type (gpu), vendor/type (nvidia/gpu), \
                        vendor/type/name (nvidia/gpu/Tesla K80) or a CDI device \
                        (vendor.com/class=name)"
                    .into(),
            );
        }
        if label.chars().any(char::is_control) {
            return Err(format!("{shown} holds a control character"));
        }
        let parts: Vec<&str> = label.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "{shown} has an empty part (expected type, vendor/type or vendor/type/name)"
            ));
        }
        Ok(match parts.as_slice() {
            [t] => Self {
                vendor: None,
                device_type: (*t).into(),
                name: None,
            },
            [v, t] => Self {
                vendor: Some((*v).into()),
                device_type: (*t).into(),
                name: None,
            },
            [v, t, n, ..] => Self {
                vendor: Some((*v).into()),
                device_type: (*t).into(),
                name: Some((*n).into()),
            },
            [] => unreachable!("splitn yields at least one part"),
        })
    }

    /// Whether the group `id` is one of those named: the type is the same, and so are the
    /// vendor and the name when given (exact, case-sensitive), as Nomad's
    /// `DeviceIdTuple.Matches`.
    pub fn matches(&self, id: &DeviceGroupId) -> bool {
        self.device_type == id.device_type
            && self.vendor.as_ref().is_none_or(|v| *v == id.vendor)
            && self.name.as_ref().is_none_or(|n| *n == id.name)
    }
}

/// As written: `type`, `vendor/type` or `vendor/type/name`.
impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(v) = &self.vendor {
            write!(f, "{v}/")?;
        }
        f.write_str(&self.device_type)?;
        if let Some(n) = &self.name {
            write!(f, "/{n}")?;
        }
        Ok(())
    }
}

impl FromStr for DeviceName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// What a request names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceTarget {
    /// Instances of device plugin groups.
    Plugin(DeviceName),
    /// One CDI device, resolved from the CDI spec directories (stored as its name).
    Cdi(#[serde(with = "cdi_name")] QualifiedName),
}

impl DeviceTarget {
    /// A label holding `=` names a CDI device (`vendor.com/class=name`); any other a plugin
    /// device ([`DeviceName::parse`]).
    pub fn parse(label: &str) -> Result<Self, String> {
        if label.contains('=') {
            QualifiedName::parse(label)
                .map(Self::Cdi)
                .map_err(|e| format!("not a CDI device name: {e}"))
        } else {
            DeviceName::parse(label).map(Self::Plugin)
        }
    }
}

impl fmt::Display for DeviceTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plugin(n) => n.fmt(f),
            Self::Cdi(q) => q.fmt(f),
        }
    }
}

/// A CDI name as its text.
mod cdi_name {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    use crate::cdi::QualifiedName;

    pub(super) fn serialize<S: Serializer>(q: &QualifiedName, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(q)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QualifiedName, D::Error> {
        let text = String::deserialize(d)?;
        QualifiedName::parse(&text).map_err(D::Error::custom)
    }
}

/// How a constraint or an affinity compares its attribute with its value (Nomad's operands;
/// `distinct_hosts` and `distinct_property` do not apply to devices).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operand {
    /// `=` (also `==`, `is`): equal, numbers across units of one base.
    Equal,
    /// `!=` (also `not`): not equal; true when exactly one side is set.
    NotEqual,
    /// `<`.
    Less,
    /// `<=`.
    LessOrEqual,
    /// `>`.
    Greater,
    /// `>=`.
    GreaterOrEqual,
    /// `regexp`: the attribute's text matches the value, a regular expression (anywhere in
    /// the text unless anchored).
    Regexp,
    /// `version`: the attribute is a version meeting the value, go-version constraints
    /// (`>= 1.2, < 2.0`, `~> 1.2`).
    Version,
    /// `semver`: likewise, with Semver 2.0 rules.
    Semver,
    /// `set_contains`: the attribute, a comma-separated list, holds every item of the value's.
    SetContains,
    /// `set_contains_all`: the same as `set_contains`.
    SetContainsAll,
    /// `set_contains_any`: the attribute's list holds at least one item of the value's.
    SetContainsAny,
    /// `is_set`: the attribute is set (constraints only; takes no value).
    IsSet,
    /// `is_not_set`: the attribute is not set (constraints only; takes no value).
    IsNotSet,
}

impl Operand {
    /// Every operand.
    pub const ALL: [Operand; 14] = [
        Self::Equal,
        Self::NotEqual,
        Self::Less,
        Self::LessOrEqual,
        Self::Greater,
        Self::GreaterOrEqual,
        Self::Regexp,
        Self::Version,
        Self::Semver,
        Self::SetContains,
        Self::SetContainsAll,
        Self::SetContainsAny,
        Self::IsSet,
        Self::IsNotSet,
    ];

    /// Reads any of Nomad's spellings: `=`, `==`, `is`, `!=`, `not`, `<`, `<=`, `>`, `>=`,
    /// `regexp`, `version`, `semver`, `set_contains`, `set_contains_all`, `set_contains_any`,
    /// `is_set`, `is_not_set`.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "=" | "==" | "is" => Self::Equal,
            "!=" | "not" => Self::NotEqual,
            "<" => Self::Less,
            "<=" => Self::LessOrEqual,
            ">" => Self::Greater,
            ">=" => Self::GreaterOrEqual,
            "regexp" => Self::Regexp,
            "version" => Self::Version,
            "semver" => Self::Semver,
            "set_contains" => Self::SetContains,
            "set_contains_all" => Self::SetContainsAll,
            "set_contains_any" => Self::SetContainsAny,
            "is_set" => Self::IsSet,
            "is_not_set" => Self::IsNotSet,
            _ => return None,
        })
    }

    /// The main spelling (`=`, `!=`, `>=`, `regexp`…).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Equal => "=",
            Self::NotEqual => "!=",
            Self::Less => "<",
            Self::LessOrEqual => "<=",
            Self::Greater => ">",
            Self::GreaterOrEqual => ">=",
            Self::Regexp => "regexp",
            Self::Version => "version",
            Self::Semver => "semver",
            Self::SetContains => "set_contains",
            Self::SetContainsAll => "set_contains_all",
            Self::SetContainsAny => "set_contains_any",
            Self::IsSet => "is_set",
            Self::IsNotSet => "is_not_set",
        }
    }

    /// Whether it compares with a value (all but `is_set` and `is_not_set`).
    pub fn takes_value(self) -> bool {
        !matches!(self, Self::IsSet | Self::IsNotSet)
    }

    /// Whether an affinity may use it (all but `is_set` and `is_not_set`, as in Nomad).
    pub fn for_affinity(self) -> bool {
        self.takes_value()
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A constraint: a group is eligible only when it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Constraint {
    /// The left side: a literal or a `${device.…}` reference; non-empty.
    pub attribute: String,
    /// How the sides compare.
    pub operator: Operand,
    /// The right side, like `attribute`; empty exactly when `operator` takes no value.
    #[serde(default)]
    pub value: String,
}

/// An affinity: groups where it holds are preferred (positive weight) or avoided (negative).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Affinity {
    /// The left side, as in [`Constraint`].
    pub attribute: String,
    /// How the sides compare (never `is_set` or `is_not_set`).
    pub operator: Operand,
    /// The right side; non-empty.
    pub value: String,
    /// In [`AFFINITY_WEIGHT_RANGE`], not 0.
    pub weight: i8,
}

/// A checked device request (Nomad's `RequestedDevice`).
///
/// Guarantees, for one made by [`DeviceRequest::build`]: `target` is `name` parsed; `count`
/// is at least 1, and exactly 1 for a CDI device; a CDI request has no constraint or
/// affinity; every operator has a value exactly when it takes one; every side is a literal or
/// one of the `${device.…}` references; regular expressions compile and version constraints
/// parse (when literal); weights are in [`AFFINITY_WEIGHT_RANGE`] and not 0. Deserializing
/// does not check again: [`DeviceRequest::validate`] does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceRequest {
    /// The label, as written.
    pub name: String,
    /// What the label names.
    pub target: DeviceTarget,
    /// How many instances.
    pub count: u32,
    /// Constraints, all of which a group must meet.
    #[serde(default)]
    pub constraints: Vec<Constraint>,
    /// Affinities that rank the eligible groups.
    #[serde(default)]
    pub affinities: Vec<Affinity>,
}

/// A request as written, before it is checked: what a spec reader hands to
/// [`DeviceRequest::build`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInput {
    /// The label.
    pub name: String,
    /// `count`; [`DEFAULT_COUNT`] when `None`.
    pub count: Option<u64>,
    /// `constraint` blocks, in order.
    pub constraints: Vec<ConstraintInput>,
    /// `affinity` blocks, in order.
    pub affinities: Vec<AffinityInput>,
}

/// A `constraint` block as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConstraintInput {
    /// `attribute`.
    pub attribute: String,
    /// `operator`; `=` when `None`.
    pub operator: Option<String>,
    /// `value` (empty when not given).
    pub value: String,
}

/// An `affinity` block as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AffinityInput {
    /// `attribute`.
    pub attribute: String,
    /// `operator`; `=` when `None`.
    pub operator: Option<String>,
    /// `value` (empty when not given).
    pub value: String,
    /// `weight`; [`DEFAULT_AFFINITY_WEIGHT`] when `None`.
    pub weight: Option<i64>,
}

/// Which field of a request a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// The label.
    Name,
    /// `count`.
    Count,
    /// The constraint at this index (0-based), and which part of it.
    Constraint(usize, Part),
    /// The affinity at this index (0-based), and which part of it.
    Affinity(usize, Part),
}

/// A part of a constraint or an affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// The block as a whole.
    Block,
    /// `attribute`.
    Attribute,
    /// `operator`.
    Operator,
    /// `value`.
    Value,
    /// `weight` (affinities).
    Weight,
}

impl Part {
    /// The field's name; `None` for the block.
    pub fn key(self) -> Option<&'static str> {
        match self {
            Self::Block => None,
            Self::Attribute => Some("attribute"),
            Self::Operator => Some("operator"),
            Self::Value => Some("value"),
            Self::Weight => Some("weight"),
        }
    }
}

/// `name`, `count`, `constraint[0].operator`, `affinity[1]`…
impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, i, part) = match self {
            Self::Name => return f.write_str("name"),
            Self::Count => return f.write_str("count"),
            Self::Constraint(i, p) => ("constraint", i, p),
            Self::Affinity(i, p) => ("affinity", i, p),
        };
        write!(f, "{kind}[{i}]")?;
        if let Some(k) = part.key() {
            write!(f, ".{k}")?;
        }
        Ok(())
    }
}

/// One problem of a request, with the field it is about. The message repeats user text only
/// escaped and cut ([`Quoted`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    /// The field.
    pub field: Field,
    /// What is wrong.
    pub message: String,
}

impl DeviceRequest {
    /// Checks `input` whole: every problem is returned, in field order.
    pub fn build(input: &RequestInput) -> Result<Self, Vec<RequestError>> {
        let mut errors = Vec::new();
        let mut err = |field: Field, message: String| errors.push(RequestError { field, message });

        let target = DeviceTarget::parse(&input.name)
            .map_err(|m| err(Field::Name, m))
            .ok();
        let cdi = matches!(target, Some(DeviceTarget::Cdi(_)));

        let count = match input.count {
            None => Some(DEFAULT_COUNT),
            Some(0) => {
                err(Field::Count, "must be at least 1".into());
                None
            }
            Some(n) => match u32::try_from(n) {
                Ok(n) if cdi && n != 1 => {
                    err(
                        Field::Count,
                        format!(
                            "is {n}, but a CDI device request names one device: count must be 1 \
                             (write one device block per CDI device)"
                        ),
                    );
                    None
                }
                Ok(n) => Some(n),
                Err(_) => {
                    err(Field::Count, format!("{n} is more than {}", u32::MAX));
                    None
                }
            },
        };

        if cdi && !input.constraints.is_empty() {
            err(
                Field::Constraint(0, Part::Block),
                "a CDI device is named exactly and takes no constraint".into(),
            );
        }
        if cdi && !input.affinities.is_empty() {
            err(
                Field::Affinity(0, Part::Block),
                "a CDI device is named exactly and takes no affinity".into(),
            );
        }

        let mut constraints = Vec::new();
        for (i, c) in input.constraints.iter().enumerate() {
            let at = |p| Field::Constraint(i, p);
            let operator = rule(
                &mut err,
                at,
                &c.attribute,
                c.operator.as_deref(),
                &c.value,
                false,
            );
            if let Some(operator) = operator {
                constraints.push(Constraint {
                    attribute: c.attribute.clone(),
                    operator,
                    value: c.value.clone(),
                });
            }
        }

        let mut affinities = Vec::new();
        for (i, a) in input.affinities.iter().enumerate() {
            let at = |p| Field::Affinity(i, p);
            let operator = rule(
                &mut err,
                at,
                &a.attribute,
                a.operator.as_deref(),
                &a.value,
                true,
            );
            let weight = match a.weight {
                None => Some(DEFAULT_AFFINITY_WEIGHT),
                Some(0) => {
                    err(
                        at(Part::Weight),
                        "must not be 0: from -100 (avoid) to 100 (prefer)".into(),
                    );
                    None
                }
                Some(w) => match i8::try_from(w) {
                    Ok(w) if AFFINITY_WEIGHT_RANGE.contains(&w) => Some(w),
                    _ => {
                        err(at(Part::Weight), format!("{w} is outside -100 to 100"));
                        None
                    }
                },
            };
            if let (Some(operator), Some(weight)) = (operator, weight) {
                affinities.push(Affinity {
                    attribute: a.attribute.clone(),
                    operator,
                    value: a.value.clone(),
                    weight,
                });
            }
        }

        match (target, count) {
            (Some(target), Some(count)) if errors.is_empty() => Ok(Self {
                name: input.name.clone(),
                target,
                count,
                constraints,
                affinities,
            }),
            _ => Err(errors),
        }
    }

    /// This request as written (for [`DeviceRequest::validate`], and for tools that edit it).
    pub fn to_input(&self) -> RequestInput {
        RequestInput {
            name: self.name.clone(),
            count: Some(u64::from(self.count)),
            constraints: self
                .constraints
                .iter()
                .map(|c| ConstraintInput {
                    attribute: c.attribute.clone(),
                    operator: Some(c.operator.as_str().into()),
                    value: c.value.clone(),
                })
                .collect(),
            affinities: self
                .affinities
                .iter()
                .map(|a| AffinityInput {
                    attribute: a.attribute.clone(),
                    operator: Some(a.operator.as_str().into()),
                    value: a.value.clone(),
                    weight: Some(i64::from(a.weight)),
                })
                .collect(),
        }
    }

    /// Checks a request made some other way (deserialized, built by hand) as
    /// [`DeviceRequest::build`] checks its input, and that `target` is `name` parsed.
    pub fn validate(&self) -> Result<(), Vec<RequestError>> {
        let built = Self::build(&self.to_input())?;
        if built.target != self.target {
            return Err(vec![RequestError {
                field: Field::Name,
                message: format!(
                    "{} does not name the stored target {}",
                    Quoted(&self.name),
                    Quoted(&self.target.to_string())
                ),
            }]);
        }
        Ok(())
    }
}

/// Checks one constraint or affinity; its operand when it is well formed.
fn rule(
    err: &mut impl FnMut(Field, String),
    at: impl Fn(Part) -> Field,
    attribute: &str,
    operator: Option<&str>,
    value: &str,
    affinity: bool,
) -> Option<Operand> {
    let mut ok = true;
    if attribute.is_empty() {
        err(
            at(Part::Attribute),
            format!("is required (a literal or {DEVICE_REFERENCES})"),
        );
        ok = false;
    } else if let Err(m) = matching::parse_target(attribute) {
        err(at(Part::Attribute), m);
        ok = false;
    }
    let value_target = if value.is_empty() {
        None
    } else {
        match matching::parse_target(value) {
            Ok(t) => Some(t),
            Err(m) => {
                err(at(Part::Value), m);
                ok = false;
                None
            }
        }
    };
    let op_text = operator.unwrap_or("=");
    let Some(op) = Operand::parse(op_text) else {
        let hint = if matches!(op_text, "distinct_hosts" | "distinct_property") {
            " (distinct_hosts and distinct_property place allocs, they do not select devices)"
                .to_string()
        } else {
            let all: Vec<&str> = Operand::ALL
                .iter()
                .filter(|o| !affinity || o.for_affinity())
                .map(|o| o.as_str())
                .collect();
            format!(" (expected one of {}; or ==, is, not)", all.join(", "))
        };
        err(
            at(Part::Operator),
            format!("unknown operator {}{hint}", Quoted(op_text)),
        );
        return None;
    };
    if affinity && !op.for_affinity() {
        err(
            at(Part::Operator),
            format!("{op} applies to constraints only, not to affinities"),
        );
        return None;
    }
    if !op.takes_value() {
        if !value.is_empty() {
            err(
                at(Part::Value),
                format!("{op} takes no value: it only asks whether the attribute is set"),
            );
            return None;
        }
        return ok.then_some(op);
    }
    if value.is_empty() {
        err(at(Part::Value), format!("is required by operator {op}"));
        return None;
    }
    // A literal value is checked now; a reference is checked with the value it takes.
    if let Some(matching::Target::Literal(text)) = value_target {
        let problem = match op {
            Operand::Regexp => regex::Regex::new(text)
                .err()
                .map(|e| format!("regexp does not compile: {}", regex_error(&e))),
            Operand::Version => version::Constraints::parse(text, version::Flavor::Version)
                .err()
                .map(|e| {
                    format!("not a version constraint: {e} (e.g. \">= 1.2, < 2.0\" or \"~> 1.2\")")
                }),
            Operand::Semver => version::Constraints::parse(text, version::Flavor::Semver)
                .err()
                .map(|e| format!("not a semver constraint: {e} (e.g. \">= 1.2.0, < 2.0.0\")")),
            _ => None,
        };
        if let Some(p) = problem {
            err(at(Part::Value), p);
            return None;
        }
    }
    ok.then_some(op)
}

/// The regex crate's message in one line: its last line (`error: …`), without the prefix.
pub(crate) fn regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    last.trim().trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests;
