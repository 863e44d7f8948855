//! The plugin's configuration: its schema (what `ConfigSchema` answers, like Nomad's example
//! plugin: every key optional with a default) and decoding what `SetConfig` sends. Decoding
//! is strict: every key must be there with its type, because the host owes the plugin its
//! schema's defaults; a host that skips them is refused, as real plugins refuse it.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use berth_devices::attribute::Attribute;
use berth_devices_nomad::proto::hclspec::{self as pb, Spec, spec::Block};

use crate::devices::{parse_attribute, parse_go_duration};

/// Every key: name, HCL type, default (an HCL expression).
const KEYS: &[(&str, &str, &str)] = &[
    ("dir", "string", "\".\""),
    ("list_period", "string", "\"5s\""),
    ("unhealthy_perm", "string", "\"-rwxrwxrwx\""),
    ("stats_period", "string", "\"1s\""),
    ("vendor", "string", "\"berth\""),
    ("type", "string", "\"file\""),
    ("name", "string", "\"mock\""),
    ("attributes", "map(string)", "{}"),
    ("fault_file", "string", "\"\""),
];

/// The schema: an object of `Default(Attr, Literal)` per key.
pub fn schema() -> Spec {
    let spec = |block| Spec { block: Some(block) };
    let attributes = KEYS
        .iter()
        .map(|(name, ty, default)| {
            let attr = spec(Block::Attr(pb::Attr {
                name: (*name).to_string(),
                r#type: (*ty).to_string(),
                required: false,
            }));
            let literal = spec(Block::Literal(pb::Literal {
                value: (*default).to_string(),
            }));
            let with_default = spec(Block::Default(Box::new(pb::Default {
                primary: Some(Box::new(attr)),
                default: Some(Box::new(literal)),
            })));
            ((*name).to_string(), with_default)
        })
        .collect();
    spec(Block::Object(pb::Object { attributes }))
}

/// The configuration in force.
#[derive(Debug, Clone)]
pub struct Settings {
    pub dir: PathBuf,
    pub list_period: Duration,
    pub unhealthy_perm: String,
    pub vendor: String,
    pub device_type: String,
    pub name: String,
    pub attributes: BTreeMap<String, Attribute>,
    pub fault_file: Option<PathBuf>,
}

fn kind(v: &rmpv::Value) -> &'static str {
    match v {
        rmpv::Value::Nil => "nil",
        rmpv::Value::Boolean(_) => "a bool",
        rmpv::Value::Integer(_) => "an integer",
        rmpv::Value::F32(_) | rmpv::Value::F64(_) => "a float",
        rmpv::Value::String(_) => "a string",
        rmpv::Value::Binary(_) => "binary data",
        rmpv::Value::Array(_) => "an array",
        rmpv::Value::Map(_) => "a map",
        rmpv::Value::Ext(..) => "an extension value",
    }
}

/// Decodes `SetConfig`'s MessagePack; the error names the key.
pub fn decode(bytes: &[u8]) -> Result<Settings, String> {
    if bytes.is_empty() {
        return Err(
            "msgpack_config is empty: the host sent no configuration; every key \
                    must be set (the host must apply the schema's defaults)"
                .into(),
        );
    }
    let value = rmpv::decode::read_value(&mut &bytes[..])
        .map_err(|e| format!("msgpack_config is not MessagePack: {e}"))?;
    let rmpv::Value::Map(entries) = value else {
        return Err(format!(
            "msgpack_config must be a map, not {}",
            kind(&value)
        ));
    };
    let mut map = BTreeMap::new();
    for (k, v) in entries {
        let Some(k) = k.as_str().map(str::to_string) else {
            return Err(format!("config key {k} is not a string"));
        };
        if !KEYS.iter().any(|(name, ..)| *name == k) {
            return Err(format!("config key {k:?} is unknown"));
        }
        map.insert(k, v);
    }
    let string = |key: &str| -> Result<String, String> {
        match map.get(key) {
            None => Err(format!(
                "config key {key:?} is missing (the host must apply the schema's defaults)"
            )),
            Some(rmpv::Value::String(s)) => s
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("config key {key:?} is not UTF-8")),
            Some(other) => Err(format!(
                "config key {key:?} must be a string, not {}",
                kind(other)
            )),
        }
    };
    let period = |key: &str| -> Result<Duration, String> {
        let s = string(key)?;
        parse_go_duration(&s)
            .ok_or_else(|| format!("config key {key:?}: {s:?} is not a positive Go duration"))
    };
    let attributes = match map.get("attributes") {
        None => {
            return Err(
                "config key \"attributes\" is missing (the host must apply the schema's defaults)"
                    .into(),
            );
        }
        Some(rmpv::Value::Map(entries)) => {
            let mut out = BTreeMap::new();
            for (k, v) in entries {
                match (k.as_str(), v.as_str()) {
                    (Some(k), Some(v)) => {
                        out.insert(k.to_string(), parse_attribute(v));
                    }
                    _ => {
                        return Err(format!(
                            "config key \"attributes\" must map strings to strings; {k} = {v} does not"
                        ));
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(format!(
                "config key \"attributes\" must be a map, not {}",
                kind(other)
            ));
        }
    };
    let fault_file = string("fault_file")?;
    // Kept from Nomad's example plugin for its configs to work; checked, then unused: the
    // host's collection interval says how often statistics are sent.
    period("stats_period")?;
    Ok(Settings {
        dir: PathBuf::from(string("dir")?),
        list_period: period("list_period")?,
        unhealthy_perm: string("unhealthy_perm")?,

        vendor: string("vendor")?,
        device_type: string("type")?,
        name: string("name")?,
        attributes,
        fault_file: (!fault_file.is_empty()).then(|| PathBuf::from(fault_file)),
    })
}
