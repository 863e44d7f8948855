//! A `Literal` spec's value: an HCL expression in text (`"5s"`, `true`, `{}`, `["a", 1]`),
//! parsed and evaluated with no variables.

use hcl::eval::Evaluate as _;

use berth_input::{Quoted, shown_within};

use super::value::{ConfigValue, Number};

/// Evaluates `expr`; the error says why it is not a constant HCL expression.
pub fn evaluate(expr: &str) -> Result<ConfigValue, String> {
    let parsed: hcl::Expression = expr.parse().map_err(|e: hcl::Error| {
        format!(
            "literal {} is not an HCL expression: {}",
            Quoted(expr),
            shown_within(&e.to_string(), 300)
        )
    })?;
    let value = parsed.evaluate(&hcl::eval::Context::new()).map_err(|e| {
        format!(
            "literal {} cannot be evaluated (only constants are supported): {}",
            Quoted(expr),
            shown_within(&e.to_string(), 300)
        )
    })?;
    Ok(from_hcl(value))
}

fn from_hcl(v: hcl::Value) -> ConfigValue {
    match v {
        hcl::Value::Null => ConfigValue::Null,
        hcl::Value::Bool(b) => ConfigValue::Bool(b),
        hcl::Value::Number(n) => {
            let number = if let Some(i) = n.as_i64() {
                Some(Number::Int(i))
            } else if let Some(u) = n.as_u64() {
                Some(Number::UInt(u))
            } else {
                n.as_f64().and_then(Number::from_f64)
            };
            number.map_or(ConfigValue::Null, ConfigValue::Number)
        }
        hcl::Value::String(s) => ConfigValue::String(s),
        hcl::Value::Array(items) => ConfigValue::List(items.into_iter().map(from_hcl).collect()),
        hcl::Value::Object(map) => {
            ConfigValue::Map(map.into_iter().map(|(k, v)| (k, from_hcl(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_constants() {
        let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        let eval = |e: &str| evaluate(e).unwrap().to_json();
        assert_eq!(eval("\".\""), j("\".\""));
        assert_eq!(eval("\"-rwxrwxrwx\""), j("\"-rwxrwxrwx\""));
        assert_eq!(eval("5"), j("5"));
        assert_eq!(eval("1.5"), j("1.5"));
        assert_eq!(eval("true"), j("true"));
        assert_eq!(eval("null"), j("null"));
        assert_eq!(eval("{}"), j("{}"));
        assert_eq!(eval("[\"a\", 1, false]"), j("[\"a\", 1, false]"));
        assert_eq!(eval("{ a = 1, \"b\" = [2] }"), j("{\"a\": 1, \"b\": [2]}"));
        assert_eq!(eval("1 + 2"), j("3"));
        assert!(
            evaluate("\"unterminated")
                .unwrap_err()
                .contains("not an HCL expression")
        );
        assert!(
            evaluate("var.x")
                .unwrap_err()
                .contains("cannot be evaluated")
        );
    }
}
