//! The decoded configuration as MessagePack, the way Nomad encodes it for `SetConfig` (cty's
//! msgpack encoding of a value of known type): whole numbers as integers, other numbers as
//! float64, strings, bools, lists and sets as arrays, maps and objects as maps with string
//! keys (sorted), null as nil.

use rmpv::Value;

use crate::hclspec::{ConfigValue, Number};

/// `value` as a MessagePack value.
pub fn to_value(value: &ConfigValue) -> Value {
    match value {
        ConfigValue::Null => Value::Nil,
        ConfigValue::Bool(b) => Value::Boolean(*b),
        ConfigValue::Number(Number::Int(i)) => Value::from(*i),
        ConfigValue::Number(Number::UInt(u)) => Value::from(*u),
        ConfigValue::Number(Number::Float(x)) => Value::F64(*x),
        ConfigValue::String(s) => Value::from(s.as_str()),
        ConfigValue::List(items) => Value::Array(items.iter().map(to_value).collect()),
        ConfigValue::Map(map) => Value::Map(
            map.iter()
                .map(|(k, v)| (Value::from(k.as_str()), to_value(v)))
                .collect(),
        ),
    }
}

/// `value` encoded as MessagePack bytes.
pub fn encode(value: &ConfigValue) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    rmpv::encode::write_value(&mut out, &to_value(value)).expect("encoding into a Vec");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn encodes_as_cty_does() {
        let v = ConfigValue::Map(BTreeMap::from([
            ("b".to_string(), ConfigValue::Number(Number::Int(5))),
            ("a".to_string(), ConfigValue::Number(Number::Float(1.5))),
            ("c".to_string(), ConfigValue::Null),
            (
                "d".to_string(),
                ConfigValue::List(vec![
                    ConfigValue::String("x".into()),
                    ConfigValue::Bool(true),
                ]),
            ),
        ]));
        let bytes = encode(&v);
        // fixmap of 4; keys in order a, b, c, d.
        assert_eq!(bytes[0], 0x84);
        assert_eq!(&bytes[1..3], &[0xa1, b'a']);
        assert_eq!(bytes[3], 0xcb, "1.5 as float64");
        assert_eq!(&bytes[12..14], &[0xa1, b'b']);
        assert_eq!(bytes[14], 0x05, "5 as a positive fixint");
        assert_eq!(&bytes[15..18], &[0xa1, b'c', 0xc0]);
        let back = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
        assert_eq!(back, to_value(&v));
        assert_eq!(back["d"][0].as_str(), Some("x"));
        assert_eq!(back["d"][1].as_bool(), Some(true));
    }
}
