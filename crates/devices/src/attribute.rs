//! Nomad's typed attributes: a float, an integer, a string or a bool, with an optional unit
//! (`4 GiB`, `1.5 GHz`, `250 W`), as device plugins report them and constraints compare them.
//!
//! Text becomes an attribute as Nomad reads it ([`Attribute::parse`]): a number with an
//! optional known unit after it, else a bool, else a string. Two attributes compare
//! ([`Attribute::compare`]) when both are numbers without a unit, or numbers in units of one
//! base (`2048 MiB < 4 GiB`), or both strings (lexically), or both bools (equal or not).

use std::{cmp::Ordering, convert::Infallible, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::units::{self, Unit};

/// The value of an [`Attribute`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrValue {
    /// A floating-point number.
    Float(f64),
    /// An integer.
    Int(i64),
    /// A string.
    String(String),
    /// A bool.
    Bool(bool),
}

/// A device attribute (Nomad's `plugins/shared/structs.Attribute`): a value and, for numbers,
/// an optional unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attribute {
    /// The value.
    pub value: AttrValue,
    /// The unit (`MiB`, `MHz`, `W`…); empty when none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
}

impl Attribute {
    /// A string attribute.
    pub fn string(s: impl Into<String>) -> Self {
        Self {
            value: AttrValue::String(s.into()),
            unit: String::new(),
        }
    }

    /// An integer attribute with `unit` (may be empty).
    pub fn int(n: i64, unit: impl Into<String>) -> Self {
        Self {
            value: AttrValue::Int(n),
            unit: unit.into(),
        }
    }

    /// A float attribute with `unit` (may be empty).
    pub fn float(n: f64, unit: impl Into<String>) -> Self {
        Self {
            value: AttrValue::Float(n),
            unit: unit.into(),
        }
    }

    /// A bool attribute.
    pub fn bool(b: bool) -> Self {
        Self {
            value: AttrValue::Bool(b),
            unit: String::new(),
        }
    }

    /// Reads `text` as Nomad's `ParseAttribute` does: when it ends in a known unit (longest
    /// name first, `4 GiB` or `4GiB`) the rest, trimmed, is the number; a whole number becomes
    /// an int, else a number a float (both keep the unit); else Go's bool spellings (`true`,
    /// `True`, `TRUE`, `t`, `T`, and so for false) become a bool; anything else, the empty
    /// text included, is a string of `text` as given (a unit-like ending stays in it).
    pub fn parse(text: &str) -> Self {
        if text.is_empty() {
            return Self::string("");
        }
        let (numeric, unit) = match units::suffix_of(text) {
            Some(u) => (text[..text.len() - u.name.len()].trim(), u.name),
            None => (text, ""),
        };
        if let Ok(i) = numeric.parse::<i64>() {
            return Self::int(i, unit);
        }
        if let Some(f) = parse_go_float(numeric) {
            return Self::float(f, unit);
        }
        if let Some(b) = parse_go_bool(text) {
            return Self::bool(b);
        }
        Self::string(text)
    }

    /// The unit, when it is one of the known [`units`]; an unknown unit counts as none, as in
    /// Nomad.
    pub fn known_unit(&self) -> Option<&'static Unit> {
        units::lookup(&self.unit)
    }

    /// The string, when this is a string attribute.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            AttrValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Whether `self` and `other` can be compared at all: numbers with no (known) unit, or with
    /// units of one base; two strings; two bools. A number with a unit never compares with one
    /// without.
    pub fn comparable(&self, other: &Attribute) -> bool {
        !matches!(self.relate(other), Relation::Incomparable)
    }

    /// How `self` orders against `other`: numbers by value in base units (`4096 MiB` equals
    /// `4 GiB`; two ints exactly, else as floats), strings lexically (byte order). Bools are
    /// only equal or not: `Some(Equal)` when equal, `None` when they differ. `None` as well
    /// when the two are not [`comparable`](Self::comparable) (or a float is NaN).
    pub fn compare(&self, other: &Attribute) -> Option<Ordering> {
        match self.relate(other) {
            Relation::Ordered(o) => Some(o),
            Relation::Unequal | Relation::Incomparable => None,
        }
    }

    /// Whether `self` equals `other` as [`compare`](Self::compare) sees them (`4096 MiB` equals
    /// `4 GiB`); `None` when they are not comparable.
    pub fn equals(&self, other: &Attribute) -> Option<bool> {
        match self.relate(other) {
            Relation::Ordered(o) => Some(o == Ordering::Equal),
            Relation::Unequal => Some(false),
            Relation::Incomparable => None,
        }
    }

    fn relate(&self, other: &Attribute) -> Relation {
        let units = (self.known_unit(), other.known_unit());
        match (&self.value, &other.value) {
            (AttrValue::String(a), AttrValue::String(b)) if units == (None, None) => {
                Relation::Ordered(a.cmp(b))
            }
            (AttrValue::Bool(a), AttrValue::Bool(b)) if units == (None, None) => {
                if a == b {
                    Relation::Ordered(Ordering::Equal)
                } else {
                    Relation::Unequal
                }
            }
            (AttrValue::Int(_) | AttrValue::Float(_), AttrValue::Int(_) | AttrValue::Float(_)) => {
                match units {
                    (None, None) => compare_numbers(&self.value, None, &other.value, None),
                    (Some(a), Some(b)) if a.comparable(b) => {
                        compare_numbers(&self.value, Some(a), &other.value, Some(b))
                    }
                    _ => Relation::Incomparable,
                }
            }
            _ => Relation::Incomparable,
        }
    }
}

/// Reads as the attribute Nomad's `ParseAttribute` makes of it; never fails.
impl FromStr for Attribute {
    type Err = Infallible;
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(Self::parse(s))
    }
}

/// How two attributes relate.
enum Relation {
    Ordered(Ordering),
    /// Two different bools.
    Unequal,
    Incomparable,
}

/// `a` (in `ua`) against `b` (in `ub`): two ints exactly, in base units; otherwise as floats.
fn compare_numbers(a: &AttrValue, ua: Option<&Unit>, b: &AttrValue, ub: Option<&Unit>) -> Relation {
    // A unit as a fraction num/den of its base.
    let ratio = |u: Option<&Unit>| match u {
        None => (1i128, 1i128),
        Some(u) if u.inverse => (1, i128::from(u.multiplier)),
        Some(u) => (i128::from(u.multiplier), 1),
    };
    if let (AttrValue::Int(x), AttrValue::Int(y)) = (a, b) {
        let ((na, da), (nb, db)) = (ratio(ua), ratio(ub));
        // x·na/da against y·nb/db, without division: at most 2^63 · 2^60 · 1000, well
        // inside i128.
        let left = i128::from(*x)
            .checked_mul(na)
            .and_then(|v| v.checked_mul(db));
        let right = i128::from(*y)
            .checked_mul(nb)
            .and_then(|v| v.checked_mul(da));
        if let (Some(l), Some(r)) = (left, right) {
            return Relation::Ordered(l.cmp(&r));
        }
    }
    let base = |v: &AttrValue, u: Option<&Unit>| {
        #[allow(clippy::cast_precision_loss)]
        let n = match v {
            AttrValue::Int(i) => *i as f64,
            AttrValue::Float(f) => *f,
            _ => f64::NAN,
        };
        u.map_or(n, |u| u.to_base(n))
    };
    base(a, ua)
        .partial_cmp(&base(b, ub))
        .map_or(Relation::Incomparable, Relation::Ordered)
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal forms: digits with an optional point and
/// exponent, an optional sign, `inf`/`infinity`/`nan` in any case. Go's hex floats are not
/// read (they become strings).
fn parse_go_float(s: &str) -> Option<f64> {
    if s.is_empty() || s.contains('_') {
        return None;
    }
    s.parse::<f64>().ok()
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// As Nomad prints it: the value, then a space and the unit when there is one (`4 GiB`).
impl fmt::Display for Attribute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            AttrValue::Float(x) => write!(f, "{x}")?,
            AttrValue::Int(x) => write!(f, "{x}")?,
            AttrValue::String(s) => f.write_str(s)?,
            AttrValue::Bool(b) => write!(f, "{b}")?,
        }
        if !self.unit.is_empty() {
            write!(f, " {}", self.unit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Attribute {
        Attribute::parse(s)
    }

    #[test]
    fn parses_as_nomad() {
        assert_eq!(p("4 GiB"), Attribute::int(4, "GiB"));
        assert_eq!(p("4GiB"), Attribute::int(4, "GiB"));
        assert_eq!(p("1.5 GHz"), Attribute::float(1.5, "GHz"));
        assert_eq!(p("250 mW"), Attribute::int(250, "mW"));
        assert_eq!(p("10 MiB/s"), Attribute::int(10, "MiB/s"));
        assert_eq!(p("-3"), Attribute::int(-3, ""));
        assert_eq!(p("+3"), Attribute::int(3, ""));
        assert_eq!(p("2.5"), Attribute::float(2.5, ""));
        assert_eq!(p("1e3"), Attribute::float(1000.0, ""));
        assert_eq!(p("1"), Attribute::int(1, ""));
        assert_eq!(p("true"), Attribute::bool(true));
        assert_eq!(p("F"), Attribute::bool(false));
        assert_eq!(p("TRUE"), Attribute::bool(true));
        assert_eq!(p("yes"), Attribute::string("yes"));
        assert_eq!(p(""), Attribute::string(""));
        assert_eq!(p("Tesla K80"), Attribute::string("Tesla K80"));
        // A unit-like ending on something that is not a number stays in the string.
        assert_eq!(p("lots of GiB"), Attribute::string("lots of GiB"));
        assert_eq!(p("GiB"), Attribute::string("GiB"));
        // Unknown units are not split off; spaces are kept when no unit was found.
        assert_eq!(p("4 parsecs"), Attribute::string("4 parsecs"));
        assert_eq!(p(" 4"), Attribute::string(" 4"));
        assert_eq!(p("1_000"), Attribute::string("1_000"));
        // Beyond i64: a float.
        assert_eq!(
            p("9223372036854775808"),
            Attribute::float(9.223372036854776e18, "")
        );
        assert_eq!(
            "4 GiB".parse::<Attribute>().unwrap(),
            Attribute::int(4, "GiB")
        );
        assert_eq!(p("4 GiB").to_string(), "4 GiB");
    }

    #[test]
    fn numbers_compare_across_units_of_one_base() {
        use Ordering::*;
        let cmp = |a: &str, b: &str| p(a).compare(&p(b));
        assert_eq!(cmp("4096 MiB", "4 GiB"), Some(Equal));
        assert_eq!(cmp("8 GiB", "4 GiB"), Some(Greater));
        assert_eq!(cmp("2048 MiB", "4 GiB"), Some(Less));
        assert_eq!(cmp("0.5 GiB", "512 MiB"), Some(Equal));
        assert_eq!(cmp("1 GB", "1000 MB"), Some(Equal));
        assert_eq!(cmp("1 GB", "1 GiB"), Some(Less));
        assert_eq!(cmp("1 kB", "1 KB"), Some(Equal));
        assert_eq!(cmp("1500 MHz", "1.5 GHz"), Some(Equal));
        assert_eq!(cmp("1 GHz", "999 MHz"), Some(Greater));
        assert_eq!(cmp("1500 mW", "1 W"), Some(Greater));
        assert_eq!(cmp("1000 mW", "1 W"), Some(Equal));
        assert_eq!(cmp("1 kW", "999 W"), Some(Greater));
        assert_eq!(cmp("2 GW", "2000 MW"), Some(Equal));
        assert_eq!(cmp("1 EiB", "1024 PiB"), Some(Equal));
        assert_eq!(cmp("9223372036854775807 EiB", "1 KiB"), Some(Greater));
        assert_eq!(
            cmp("1 B", "1 KiB"),
            None,
            "B is not a unit: \"1 B\" is a string"
        );
        assert_eq!(cmp("1 MiB/s", "1024 KiB/s"), Some(Equal));
        // Different bases, a unit against none, numbers against other kinds.
        assert_eq!(cmp("1 GiB", "1 GiB/s"), None);
        assert_eq!(cmp("1 GHz", "1 W"), None);
        assert_eq!(cmp("4 GiB", "4"), None);
        assert_eq!(cmp("4", "4 GiB"), None);
        assert_eq!(cmp("4", "four"), None);
        assert_eq!(cmp("1", "true"), None);
        // Plain numbers, ints and floats mixed.
        assert_eq!(cmp("10", "9"), Some(Greater));
        assert_eq!(cmp("2", "2.0"), Some(Equal));
        assert_eq!(cmp("2.5", "3"), Some(Less));
        assert_eq!(Attribute::float(f64::NAN, "").compare(&p("1")), None);
        // Unknown units count as none.
        assert_eq!(Attribute::int(4, "furlongs").compare(&p("4")), Some(Equal));
        assert!(p("1 GiB").comparable(&p("1 MiB")));
        assert!(!p("1 GiB").comparable(&p("1 MHz")));
    }

    #[test]
    fn strings_lexically_bools_equal_or_not() {
        use Ordering::*;
        let s = Attribute::string;
        assert_eq!(s("abc").compare(&s("abd")), Some(Less));
        assert_eq!(s("10").compare(&s("9")), Some(Less));
        assert_eq!(s("K80").compare(&s("K80")), Some(Equal));
        assert_eq!(s("a").compare(&Attribute::bool(true)), None);
        let (t, f) = (Attribute::bool(true), Attribute::bool(false));
        assert_eq!(t.compare(&t), Some(Equal));
        assert_eq!(t.compare(&f), None);
        assert_eq!(t.equals(&f), Some(false));
        assert_eq!(t.equals(&t), Some(true));
        assert!(t.comparable(&f));
        assert_eq!(t.equals(&s("true")), None);
        assert_eq!(p("4096 MiB").equals(&p("4 GiB")), Some(true));
        assert_eq!(p("4 GiB").equals(&p("4 GHz")), None);
    }

    #[test]
    fn serde_form_is_unchanged() {
        let a = Attribute::int(4, "GiB");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"{"value":{"int":4},"unit":"GiB"}"#);
        assert_eq!(serde_json::from_str::<Attribute>(&json).unwrap(), a);
        assert_eq!(
            serde_json::to_string(&Attribute::string("x")).unwrap(),
            r#"{"value":{"string":"x"}}"#
        );
    }
}
