//! JSON request bodies, parsed so that no error repeats a value the client sent.
//!
//! serde's own messages quote the offending value (`invalid type: string "…", expected a
//! sequence`), and a value may be a secret or a mount flag. So a body is first read as a
//! [`Value`] (syntax errors name a line and column, never text), then deserialized through
//! [`Quiet`], whose error type keeps the expected type and the kind of what was found (`a
//! string`, `an integer`…) and drops the value. The field path is kept, with keys that are not
//! plain names shown escaped and cut.

use std::fmt::{self, Display, Write as _};

use serde::{
    Deserializer,
    de::{
        self, DeserializeOwned, Expected, IntoDeserializer, Unexpected, Visitor,
        value::{MapAccessDeserializer, MapDeserializer, SeqDeserializer},
    },
    forward_to_deserialize_any,
};
use serde_json::Value;
use serde_path_to_error::Segment;

use super::ApiError;

/// Parses `body` as one JSON document of type `T`. A 400 error says what `what` is (`claim
/// request`…) and names the field at fault (or the line and column of a syntax error), never
/// a value. Nesting deeper than serde_json's recursion limit (128) is a syntax error.
pub(super) fn parse<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, ApiError> {
    let bad = |m: String| ApiError::BadRequest(format!("invalid {what}: {m}"));
    let value: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    serde_path_to_error::deserialize(Quiet(value)).map_err(|e| {
        let path = field_path(e.path());
        if path.is_empty() {
            bad(e.inner().to_string())
        } else {
            bad(format!("field `{path}`: {}", e.inner()))
        }
    })
}

/// The field path of an error, `mount_options.mount_flags[0]` style; empty at the top.
fn field_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => {
                let _ = write!(out, "[{index}]");
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                if is_plain_key(key) {
                    out.push_str(key);
                } else {
                    out.push_str(&berth_input::quoted(key));
                }
            }
            Segment::Unknown => out.push('?'),
        }
    }
    out
}

/// A key printed as it is: a short name of ASCII letters, digits, `_`, `-` and `.`.
fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A deserialization error that names what was expected and what kind of value was found,
/// never the value itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QuietError(String);

impl Display for QuietError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QuietError {}

impl de::Error for QuietError {
    /// A type's own message may quote the value: it is replaced.
    fn custom<T: Display>(_msg: T) -> Self {
        Self("invalid value".into())
    }

    fn invalid_type(unexp: Unexpected<'_>, exp: &dyn Expected) -> Self {
        Self(format!("expected {exp}, found {}", kind(&unexp)))
    }

    fn invalid_value(unexp: Unexpected<'_>, exp: &dyn Expected) -> Self {
        Self(format!("invalid value ({}), expected {exp}", kind(&unexp)))
    }

    fn invalid_length(len: usize, exp: &dyn Expected) -> Self {
        Self(format!("invalid length {len}, expected {exp}"))
    }

    fn unknown_variant(_variant: &str, expected: &'static [&'static str]) -> Self {
        Self(format!("unknown value, expected {}", one_of(expected)))
    }

    /// The path already ends with the field's name.
    fn unknown_field(_field: &str, expected: &'static [&'static str]) -> Self {
        if expected.is_empty() {
            Self("unknown field, there are no fields".into())
        } else {
            Self(format!("unknown field, expected {}", one_of(expected)))
        }
    }

    fn missing_field(field: &'static str) -> Self {
        Self(format!("missing field `{field}`"))
    }

    fn duplicate_field(field: &'static str) -> Self {
        Self(format!("duplicate field `{field}`"))
    }
}

/// What kind of value was found, without the value.
fn kind(unexp: &Unexpected<'_>) -> &'static str {
    match unexp {
        Unexpected::Bool(_) => "a boolean",
        Unexpected::Unsigned(_) | Unexpected::Signed(_) => "an integer",
        Unexpected::Float(_) => "a fractional number",
        Unexpected::Char(_) => "a character",
        Unexpected::Str(_) => "a string",
        Unexpected::Bytes(_) => "bytes",
        Unexpected::Unit => "null",
        Unexpected::Seq => "an array",
        Unexpected::Map => "an object",
        _ => "a value of another type",
    }
}

/// `` `a` ``, `` `a` or `b` ``, `` one of `a`, `b`, `c` ``.
fn one_of(names: &[&str]) -> String {
    match names {
        [] => "nothing".into(),
        [one] => format!("`{one}`"),
        [a, b] => format!("`{a}` or `{b}`"),
        _ => {
            let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("one of {}", list.join(", "))
        }
    }
}

/// A parsed JSON value as a deserializer whose errors are [`QuietError`]s.
struct Quiet(Value);

impl<'de> IntoDeserializer<'de, QuietError> for Quiet {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

fn found(value: &Value) -> Unexpected<'static> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(_) => Unexpected::Bool(false),
        Value::Number(_) => Unexpected::Unsigned(0),
        Value::String(_) => Unexpected::Str(""),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> Deserializer<'de> for Quiet {
    type Error = QuietError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QuietError> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(Quiet));
                let out = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(out)
            }
            Value::Object(map) => {
                let mut map = MapDeserializer::new(map.into_iter().map(|(k, v)| (k, Quiet(v))));
                let out = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(out)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QuietError> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Quiet(other)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, QuietError> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.into_deserializer()),
            Value::Object(map) if map.len() == 1 => {
                let map = MapDeserializer::new(map.into_iter().map(|(k, v)| (k, Quiet(v))));
                visitor.visit_enum(MapAccessDeserializer::new(map))
            }
            other => Err(QuietError(format!(
                "expected {}, found {}",
                one_of(variants),
                kind(&found(&other))
            ))),
        }
    }

    /// Objects only: serde would also take a struct from an array, field by position.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, QuietError> {
        match self.0 {
            Value::Object(_) => self.deserialize_any(visitor),
            other => Err(de::Error::invalid_type(found(&other), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, QuietError> {
        visitor.visit_newtype_struct(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        count: u64,
        on: bool,
        #[serde(default)]
        flags: Option<Vec<String>>,
        #[serde(default)]
        map: BTreeMap<String, String>,
        #[serde(default)]
        mode: Option<Mode>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    enum Mode {
        Read,
        Write,
    }

    fn err(body: &str) -> String {
        parse::<Doc>("doc", body.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn errors_name_the_field_and_the_expected_type_but_never_the_value() {
        let cases = [
            (
                r#"{"name": "n", "count": 1, "on": true, "flags": "hunter2"}"#,
                "invalid doc: field `flags`: expected a sequence, found a string",
            ),
            (
                r#"{"name": 987654321, "count": 1, "on": true}"#,
                "invalid doc: field `name`: expected a string, found an integer",
            ),
            (
                r#"{"name": "n", "count": -987654321, "on": true}"#,
                "invalid doc: field `count`: invalid value (an integer), expected u64",
            ),
            (
                r#"{"name": "n", "count": 1.25, "on": true}"#,
                "invalid doc: field `count`: expected u64, found a fractional number",
            ),
            (
                r#"{"name": "n", "count": 1, "on": "hunter2"}"#,
                "invalid doc: field `on`: expected a boolean, found a string",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "flags": ["ok", ["hunter2"]]}"#,
                "invalid doc: field `flags[1]`: expected a string, found an array",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "map": {"token": 987654321}}"#,
                "invalid doc: field `map.token`: expected a string, found an integer",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "map": {"a\nb": true}}"#,
                r#"invalid doc: field `map."a\nb"`: expected a string, found a boolean"#,
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "mode": "hunter2"}"#,
                "invalid doc: field `mode`: unknown value, expected `read` or `write`",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "mode": 987654321}"#,
                "invalid doc: field `mode`: expected `read` or `write`, found an integer",
            ),
            (
                r#"{"name": {"k": "hunter2"}, "count": 1, "on": true}"#,
                "invalid doc: field `name`: expected a string, found an object",
            ),
            (
                r#"{"name": null, "count": 1, "on": true}"#,
                "invalid doc: field `name`: expected a string, found null",
            ),
            (
                r#"{"count": 1, "on": true}"#,
                "invalid doc: missing field `name`",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "bogus": "hunter2"}"#,
                "invalid doc: field `bogus`: unknown field, expected one of `name`, `count`, \
                 `on`, `flags`, `map`, `mode`",
            ),
            (
                r#"{"name": "n", "count": 1, "on": true, "bell\u0007": 1}"#,
                "invalid doc: field `\"bell\\u{7}\"`: unknown field, expected one of `name`, \
                 `count`, `on`, `flags`, `map`, `mode`",
            ),
            (
                r#""hunter2""#,
                "invalid doc: expected struct Doc, found a string",
            ),
            (
                r#"["hunter2", 1, true]"#,
                "invalid doc: expected struct Doc, found an array",
            ),
        ];
        for (body, want) in cases {
            let got = err(body);
            assert_eq!(got, want, "{body}");
            assert!(
                !got.contains("hunter2") && !got.contains("987654321"),
                "{got}"
            );
        }
    }

    #[test]
    fn syntax_errors_give_the_place_and_deep_nesting_is_refused() {
        assert_eq!(
            err(r#"{"name": "hunter2"#),
            "invalid doc: EOF while parsing a string at line 1 column 17"
        );
        assert!(err("not json").contains("expected ident at line 1 column 2"));
        assert!(err(r#"{"name": "n", "count": 1, "on": true} x"#).contains("trailing characters"));
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(
            err(&deep).contains("recursion limit exceeded"),
            "{}",
            err(&deep)
        );
        let deep_map = format!(
            r#"{{"name": "n", "count": 1, "on": true, "map": {}1{}}}"#,
            r#"{"a":"#.repeat(200),
            "}".repeat(200)
        );
        assert!(err(&deep_map).contains("recursion limit exceeded"));
    }

    #[test]
    fn good_documents_parse() {
        let doc: Doc = parse(
            "doc",
            br#"{"name": "n", "count": 7, "on": false, "flags": ["a"], "map": {"k": "v"}, "mode": "write"}"#,
        )
        .unwrap();
        assert_eq!(doc.count, 7);
        assert_eq!(doc.flags.as_deref(), Some(&["a".to_string()][..]));
        assert!(matches!(doc.mode, Some(Mode::Write)));
    }
}
