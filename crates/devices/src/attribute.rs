//! Nomad's typed attributes: a float, an integer, a string or a bool, with an optional unit
//! (`4 GiB`, `1.5 GHz`, `250 W`), as device plugins report them and constraints compare them.

use std::fmt;

use serde::{Deserialize, Serialize};

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
