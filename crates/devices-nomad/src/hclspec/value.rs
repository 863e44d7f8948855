//! The decoded configuration: the values HCL's decoder produces (cty values, without their
//! types), ready to encode as MessagePack.

use std::{collections::BTreeMap, fmt};

/// A number, as cty keeps it: whole numbers that fit are integers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A whole number.
    Int(i64),
    /// A whole number above `i64::MAX`.
    UInt(u64),
    /// Any other (finite) number.
    Float(f64),
}

impl Number {
    /// `x` as a number: an integer when it is whole and fits; `None` when not finite.
    pub fn from_f64(x: f64) -> Option<Self> {
        if !x.is_finite() {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        if x.fract() == 0.0 && x >= i64::MIN as f64 && x < i64::MAX as f64 {
            return Some(Self::Int(x as i64));
        }
        Some(Self::Float(x))
    }

    /// A JSON number.
    pub fn from_json(n: &serde_json::Number) -> Option<Self> {
        if let Some(i) = n.as_i64() {
            Some(Self::Int(i))
        } else if let Some(u) = n.as_u64() {
            Some(Self::UInt(u))
        } else {
            n.as_f64().and_then(Self::from_f64)
        }
    }

    /// A decimal number in text (`"5"`, `"-1.5"`, `"1e3"`).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if let Ok(i) = s.parse::<i64>() {
            return Some(Self::Int(i));
        }
        if let Ok(u) = s.parse::<u64>() {
            return Some(Self::UInt(u));
        }
        // Rust also reads "inf" and "NaN"; cty does not.
        if s.chars()
            .any(|c| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        {
            return None;
        }
        s.parse::<f64>().ok().and_then(Self::from_f64)
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::UInt(u) => write!(f, "{u}"),
            Self::Float(x) => write!(f, "{x}"),
        }
    }
}

/// A decoded configuration value.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigValue {
    /// Absent, or explicitly null.
    Null,
    /// A bool.
    Bool(bool),
    /// A number.
    Number(Number),
    /// A string.
    String(String),
    /// A list, set or tuple.
    List(Vec<ConfigValue>),
    /// A map or object (keys sorted).
    Map(BTreeMap<String, ConfigValue>),
}

impl ConfigValue {
    /// A JSON value as is (the `any` type): arrays become lists, objects maps.
    pub fn from_json(v: &serde_json::Value) -> Self {
        match v {
            serde_json::Value::Null => Self::Null,
            serde_json::Value::Bool(b) => Self::Bool(*b),
            serde_json::Value::Number(n) => Number::from_json(n).map_or(Self::Null, Self::Number),
            serde_json::Value::String(s) => Self::String(s.clone()),
            serde_json::Value::Array(items) => {
                Self::List(items.iter().map(Self::from_json).collect())
            }
            serde_json::Value::Object(map) => Self::Map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Self::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// The value as JSON (for logs and tests).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Null => serde_json::Value::Null,
            Self::Bool(b) => serde_json::Value::Bool(*b),
            Self::Number(Number::Int(i)) => serde_json::Value::from(*i),
            Self::Number(Number::UInt(u)) => serde_json::Value::from(*u),
            Self::Number(Number::Float(x)) => serde_json::Value::from(*x),
            Self::String(s) => serde_json::Value::String(s.clone()),
            Self::List(items) => {
                serde_json::Value::Array(items.iter().map(Self::to_json).collect())
            }
            Self::Map(map) => serde_json::Value::Object(
                map.iter().map(|(k, v)| (k.clone(), v.to_json())).collect(),
            ),
        }
    }

    /// Whether it is null.
    pub fn is_null(&self) -> bool {
        matches!(self, Self::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_integers_when_whole() {
        assert_eq!(Number::from_f64(5.0), Some(Number::Int(5)));
        assert_eq!(Number::from_f64(1.5), Some(Number::Float(1.5)));
        assert_eq!(Number::from_f64(f64::NAN), None);
        assert_eq!(Number::parse(" 42 "), Some(Number::Int(42)));
        assert_eq!(Number::parse("1e3"), Some(Number::Int(1000)));
        assert_eq!(
            Number::parse("18446744073709551615"),
            Some(Number::UInt(u64::MAX))
        );
        assert_eq!(Number::parse("inf"), None);
        assert_eq!(Number::parse("5s"), None);
        let json: serde_json::Value = serde_json::from_str("[1, 2.0, 2.5]").unwrap();
        assert_eq!(
            ConfigValue::from_json(&json),
            ConfigValue::List(vec![
                ConfigValue::Number(Number::Int(1)),
                ConfigValue::Number(Number::Int(2)),
                ConfigValue::Number(Number::Float(2.5)),
            ])
        );
    }
}
