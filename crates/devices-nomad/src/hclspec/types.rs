//! HCL type expressions (`string`, `list(number)`, `object({a = string})`…) and converting a
//! JSON value to a type as cty's conversions do (`"5"` → 5 for a number, `5` → `"5"` for a
//! string, `"true"` → true for a bool).

use std::{collections::BTreeMap, fmt};

use super::{
    Path,
    value::{ConfigValue, Number},
};

/// A type a schema asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    /// Anything (`any`).
    Any,
    /// `string`.
    String,
    /// `number`.
    Number,
    /// `bool`.
    Bool,
    /// `list(T)`.
    List(Box<Type>),
    /// `set(T)`.
    Set(Box<Type>),
    /// `map(T)`.
    Map(Box<Type>),
    /// `object({name = T, …})`.
    Object(BTreeMap<String, Type>),
    /// `tuple([T, …])`.
    Tuple(Vec<Type>),
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("any"),
            Self::String => f.write_str("string"),
            Self::Number => f.write_str("number"),
            Self::Bool => f.write_str("bool"),
            Self::List(t) => write!(f, "list({t})"),
            Self::Set(t) => write!(f, "set({t})"),
            Self::Map(t) => write!(f, "map({t})"),
            Self::Object(attrs) => {
                f.write_str("object({")?;
                for (i, (k, t)) in attrs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k} = {t}")?;
                }
                f.write_str("})")
            }
            Self::Tuple(types) => {
                f.write_str("tuple([")?;
                for (i, t) in types.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str("])")
            }
        }
    }
}

/// How deep type expressions may nest.
const MAX_DEPTH: usize = 32;

/// Parses a type expression; the error says what is wrong.
pub fn parse(expr: &str) -> Result<Type, String> {
    let mut p = Parser {
        s: expr.as_bytes(),
        at: 0,
    };
    let t = p.ty(0)?;
    p.skip_ws();
    if p.at != p.s.len() {
        return Err(format!(
            "type expression {expr:?}: unexpected text at byte {}",
            p.at
        ));
    }
    Ok(t)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn err(&self, what: &str) -> String {
        format!(
            "type expression {:?}: {what} at byte {}",
            String::from_utf8_lossy(self.s),
            self.at
        )
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')
        {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        self.skip_ws();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected {:?}", c as char)))
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn ty(&mut self, depth: usize) -> Result<Type, String> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        let Some(name) = self.ident() else {
            return Err(self.err("expected a type name"));
        };
        Ok(match name.as_str() {
            "any" => Type::Any,
            "string" => Type::String,
            "number" => Type::Number,
            "bool" => Type::Bool,
            "list" | "set" | "map" => {
                self.expect(b'(')?;
                let inner = Box::new(self.ty(depth + 1)?);
                self.expect(b')')?;
                match name.as_str() {
                    "list" => Type::List(inner),
                    "set" => Type::Set(inner),
                    _ => Type::Map(inner),
                }
            }
            "object" => {
                self.expect(b'(')?;
                self.expect(b'{')?;
                let mut attrs = BTreeMap::new();
                while !self.eat(b'}') {
                    let Some(key) = self.ident() else {
                        return Err(self.err("expected an attribute name"));
                    };
                    if !(self.eat(b'=') || self.eat(b':')) {
                        return Err(self.err("expected \"=\""));
                    }
                    let t = self.ty(depth + 1)?;
                    attrs.insert(key, t);
                    // Attributes are separated by commas or newlines.
                    self.eat(b',');
                }
                self.expect(b')')?;
                Type::Object(attrs)
            }
            "tuple" => {
                self.expect(b'(')?;
                self.expect(b'[')?;
                let mut types = Vec::new();
                while !self.eat(b']') {
                    types.push(self.ty(depth + 1)?);
                    if !self.eat(b',') {
                        self.expect(b']')?;
                        break;
                    }
                }
                self.expect(b')')?;
                Type::Tuple(types)
            }
            other => return Err(self.err(&format!("unknown type {other:?}"))),
        })
    }
}

/// The name of a JSON value's kind, for errors.
pub fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a bool",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Converts `v` to `ty`; the error names the path of the offending part and says why.
pub fn convert(
    v: &serde_json::Value,
    ty: &Type,
    path: &Path,
) -> Result<ConfigValue, (Path, String)> {
    use serde_json::Value as J;
    let wrong = |what: String| Err((path.clone(), what));
    match (ty, v) {
        (_, J::Null) => Ok(ConfigValue::Null),
        (Type::Any, v) => Ok(ConfigValue::from_json(v)),
        (Type::String, J::String(s)) => Ok(ConfigValue::String(s.clone())),
        (Type::String, J::Number(n)) => Ok(ConfigValue::String(
            Number::from_json(n).map_or_else(|| n.to_string(), |n| n.to_string()),
        )),
        (Type::String, J::Bool(b)) => Ok(ConfigValue::String(b.to_string())),
        (Type::Number, J::Number(n)) => match Number::from_json(n) {
            Some(n) => Ok(ConfigValue::Number(n)),
            None => wrong(format!("{n} is not a finite number")),
        },
        (Type::Number, J::String(s)) => match Number::parse(s) {
            Some(n) => Ok(ConfigValue::Number(n)),
            // The value is not repeated: a plugin's config may hold credentials.
            None => wrong("a number is required; the string given is not a number".into()),
        },
        (Type::Bool, J::Bool(b)) => Ok(ConfigValue::Bool(*b)),
        (Type::Bool, J::String(s)) if s == "true" || s == "false" => {
            Ok(ConfigValue::Bool(s == "true"))
        }
        (Type::Bool, J::String(_)) => {
            wrong("a bool is required; the string given is not true or false".into())
        }
        (Type::List(t) | Type::Set(t), J::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let v = convert(item, t, &path.index(i))?;
                if matches!(ty, Type::List(_)) || !out.contains(&v) {
                    out.push(v);
                }
            }
            Ok(ConfigValue::List(out))
        }
        (Type::Map(t), J::Object(map)) => {
            let mut out = BTreeMap::new();
            for (k, item) in map {
                out.insert(k.clone(), convert(item, t, &path.key(k))?);
            }
            Ok(ConfigValue::Map(out))
        }
        (Type::Object(attrs), J::Object(map)) => {
            if let Some(extra) = map.keys().find(|k| !attrs.contains_key(*k)) {
                return Err((
                    path.key(extra),
                    format!("unsupported attribute: {ty} has no attribute {extra:?}"),
                ));
            }
            let mut out = BTreeMap::new();
            for (k, t) in attrs {
                match map.get(k) {
                    Some(item) => {
                        out.insert(k.clone(), convert(item, t, &path.key(k))?);
                    }
                    None => return Err((path.key(k), format!("attribute {k:?} is required"))),
                }
            }
            Ok(ConfigValue::Map(out))
        }
        (Type::Tuple(types), J::Array(items)) => {
            if types.len() != items.len() {
                return wrong(format!(
                    "{ty} is required: a list of exactly {} elements, not {}",
                    types.len(),
                    items.len()
                ));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, (item, t)) in items.iter().zip(types).enumerate() {
                out.push(convert(item, t, &path.index(i))?);
            }
            Ok(ConfigValue::List(out))
        }
        (ty, v) => wrong(format!("{} is required, not {}", describe(ty), kind(v))),
    }
}

/// `a string`, `a list of string`…, for errors.
fn describe(ty: &Type) -> String {
    match ty {
        Type::String => "a string".into(),
        Type::Number => "a number".into(),
        Type::Bool => "a bool".into(),
        Type::List(t) => format!("a list of {t}"),
        Type::Set(t) => format!("a set of {t}"),
        Type::Map(t) => format!("a map of {t}"),
        other => format!("a value of type {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_type_expressions() {
        assert_eq!(parse("string").unwrap(), Type::String);
        assert_eq!(
            parse(" list( map(number) ) ").unwrap(),
            Type::List(Box::new(Type::Map(Box::new(Type::Number))))
        );
        assert_eq!(
            parse("object({name = string, size: number})")
                .unwrap()
                .to_string(),
            "object({name = string, size = number})"
        );
        assert_eq!(
            parse("tuple([string, bool])").unwrap(),
            Type::Tuple(vec![Type::String, Type::Bool])
        );
        assert_eq!(parse("set(any)").unwrap(), Type::Set(Box::new(Type::Any)));
        for bad in [
            "",
            "strin",
            "list(",
            "list(string",
            "map()",
            "string string",
            "\"string\"",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn converts_as_cty_does() {
        let root = Path::default();
        let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        let ok = |v: &str, t: &str| convert(&j(v), &parse(t).unwrap(), &root).unwrap().to_json();
        assert_eq!(ok("5", "string"), j("\"5\""));
        assert_eq!(ok("1.5", "string"), j("\"1.5\""));
        assert_eq!(ok("true", "string"), j("\"true\""));
        assert_eq!(ok("\"7\"", "number"), j("7"));
        assert_eq!(ok("\"false\"", "bool"), j("false"));
        assert_eq!(ok("[1, \"2\"]", "list(number)"), j("[1, 2]"));
        assert_eq!(
            ok("[\"a\", \"a\", \"b\"]", "set(string)"),
            j("[\"a\", \"b\"]")
        );
        assert_eq!(ok("{\"a\": 1}", "map(string)"), j("{\"a\": \"1\"}"));
        assert_eq!(ok("null", "number"), j("null"));
        let err = |v: &str, t: &str| {
            let (path, why) = convert(&j(v), &parse(t).unwrap(), &root).unwrap_err();
            format!("{path}: {why}")
        };
        assert_eq!(
            err("\"x\"", "number"),
            ": a number is required; the string given is not a number"
        );
        assert_eq!(
            err("[1, [2]]", "list(number)"),
            "[1]: a number is required, not a list"
        );
        assert_eq!(
            err("{\"a\": {}}", "map(string)"),
            ".a: a string is required, not an object"
        );
        assert_eq!(
            err("\"yes\"", "bool"),
            ": a bool is required; the string given is not true or false"
        );
        assert_eq!(
            err("{\"a\": 1, \"b\": 2}", "object({a = number})"),
            ".b: unsupported attribute: object({a = number}) has no attribute \"b\""
        );
        assert_eq!(
            err("{}", "object({a = number})"),
            ".a: attribute \"a\" is required"
        );
        assert_eq!(
            err("[1]", "tuple([number, number])"),
            ": tuple([number, number]) is required: a list of exactly 2 elements, not 1"
        );
    }
}
