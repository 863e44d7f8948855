//! Applying a plugin's configuration schema (its `ConfigSchema`, HCL `hcldec` specs) to the
//! user's `config { … }` block, as Nomad does before `SetConfig`: defaults filled in, values
//! converted to the declared types, required attributes and block counts checked, unknown
//! keys refused. Plugins apply no defaults themselves: a config sent without them fails.
//!
//! The block arrives as JSON (the agent converts HCL to it), which is also how Nomad feeds it
//! to `hcldec`: an attribute is a JSON property; a block is a JSON object (or an array of
//! objects, for several); a labelled block (`BlockMap`) is objects nested by label.

mod literal;
mod types;
mod value;

use std::{collections::BTreeMap, fmt};

pub use types::Type;
pub use value::{ConfigValue, Number};

use crate::proto::hclspec::{Spec, spec::Block};

type Body = serde_json::Map<String, serde_json::Value>;

/// Where in the configuration a value sits: `.dir`, `.devices[0].name`, `.env["A B"]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// The path of attribute or key `name` under this one.
    pub fn key(&self, name: &str) -> Self {
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if plain {
            Self(format!("{}.{name}", self.0))
        } else {
            Self(format!("{}[{name:?}]", self.0))
        }
    }

    /// The path of element `i` under this one.
    pub fn index(&self, i: usize) -> Self {
        Self(format!("{}[{i}]", self.0))
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a configuration cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The user's configuration does not fit the schema (the user's to fix).
    #[error("plugin {plugin:?}.config{path}: {reason}")]
    Invalid {
        /// The plugin's configured name.
        plugin: String,
        /// Where (empty: the whole block).
        path: Path,
        /// What is wrong.
        reason: String,
    },
    /// The plugin's schema cannot be used (the plugin's to fix).
    #[error("plugin {plugin:?} sent an unusable config schema (at config{path}): {reason}")]
    Schema {
        /// The plugin's configured name.
        plugin: String,
        /// Where the broken spec applies.
        path: Path,
        /// What is wrong.
        reason: String,
    },
}

/// Applies `spec` (the plugin's `ConfigSchema`; `None` when it has none) to `config` (the
/// user's block as JSON; `null` or absent is an empty block) for plugin `plugin`. Returns the
/// decoded configuration, `None` when the plugin has no schema and none was given. Errors
/// name the field: `plugin "<name>".config.<path>: <what>`.
pub fn apply(
    plugin: &str,
    spec: Option<&Spec>,
    config: &serde_json::Value,
) -> Result<Option<ConfigValue>, ConfigError> {
    let empty = Body::new();
    let body = match config {
        serde_json::Value::Null => &empty,
        serde_json::Value::Object(map) => map,
        other => {
            return Err(ConfigError::Invalid {
                plugin: plugin.to_string(),
                path: Path::default(),
                reason: format!(
                    "must be an object (the plugin's config block), not {}",
                    types::kind(other)
                ),
            });
        }
    };
    let Some(spec) = spec else {
        if body.is_empty() {
            return Ok(None);
        }
        return Err(ConfigError::Invalid {
            plugin: plugin.to_string(),
            path: Path::default(),
            reason: "the plugin takes no configuration (its ConfigSchema is empty)".to_string(),
        });
    };
    Decoder { plugin }
        .body(spec, body, &Path::default(), 0)
        .map(Some)
}

/// How deep specs and blocks may nest.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Attribute,
    Block,
}

struct Decoder<'a> {
    plugin: &'a str,
}

impl Decoder<'_> {
    fn invalid(&self, path: Path, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            plugin: self.plugin.to_string(),
            path,
            reason: reason.into(),
        }
    }

    fn schema(&self, path: &Path, reason: impl Into<String>) -> ConfigError {
        ConfigError::Schema {
            plugin: self.plugin.to_string(),
            path: path.clone(),
            reason: reason.into(),
        }
    }

    /// Decodes `body` with `spec` after refusing the keys no spec reads.
    fn body(
        &self,
        spec: &Spec,
        body: &Body,
        path: &Path,
        depth: usize,
    ) -> Result<ConfigValue, ConfigError> {
        let mut names = BTreeMap::new();
        self.names(spec, "", &mut names, path, depth)?;
        if let Some(unknown) = body.keys().find(|k| !names.contains_key(*k)) {
            let takes: Vec<String> = names
                .iter()
                .map(|(n, k)| match k {
                    Kind::Attribute => n.clone(),
                    Kind::Block => format!("{n} {{…}}"),
                })
                .collect();
            return Err(self.invalid(
                path.key(unknown),
                format!(
                    "unsupported argument: the plugin's schema has no such attribute or block \
                     (it takes: {})",
                    if takes.is_empty() {
                        "nothing".to_string()
                    } else {
                        takes.join(", ")
                    }
                ),
            ));
        }
        self.decode(spec, "", body, path, depth)
    }

    /// The attribute and block names `spec` reads from the body it applies to (a `Default`'s
    /// fallback reads none: it cannot constrain the body).
    fn names(
        &self,
        spec: &Spec,
        implied: &str,
        out: &mut BTreeMap<String, Kind>,
        path: &Path,
        depth: usize,
    ) -> Result<(), ConfigError> {
        if depth > MAX_DEPTH {
            return Err(self.schema(path, "specs nest too deeply"));
        }
        let name = |given: &str| if given.is_empty() { implied } else { given }.to_string();
        match &spec.block {
            None | Some(Block::Literal(_)) => {}
            Some(Block::Object(o)) => {
                for (k, s) in &o.attributes {
                    self.names(s, k, out, path, depth + 1)?;
                }
            }
            Some(Block::Array(a)) => {
                for s in &a.values {
                    self.names(s, "", out, path, depth + 1)?;
                }
            }
            Some(Block::Default(d)) => {
                if let Some(primary) = &d.primary {
                    self.names(primary, implied, out, path, depth + 1)?;
                }
            }
            Some(Block::Attr(a)) => {
                out.insert(name(&a.name), Kind::Attribute);
            }
            Some(Block::BlockValue(b)) => {
                out.insert(name(&b.name), Kind::Block);
            }
            Some(Block::BlockAttrs(b)) => {
                out.insert(name(&b.name), Kind::Block);
            }
            Some(Block::BlockList(b)) => {
                out.insert(name(&b.name), Kind::Block);
            }
            Some(Block::BlockSet(b)) => {
                out.insert(name(&b.name), Kind::Block);
            }
            Some(Block::BlockMap(b)) => {
                out.insert(name(&b.name), Kind::Block);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    fn decode(
        &self,
        spec: &Spec,
        implied: &str,
        body: &Body,
        path: &Path,
        depth: usize,
    ) -> Result<ConfigValue, ConfigError> {
        if depth > MAX_DEPTH {
            return Err(self.schema(path, "specs nest too deeply"));
        }
        let named = |given: &str, what: &str| {
            let name = if given.is_empty() { implied } else { given };
            if name.is_empty() {
                Err(self.schema(path, format!("{what} spec without a name")))
            } else {
                Ok(name.to_string())
            }
        };
        match &spec.block {
            None => Err(self.schema(path, "empty spec")),
            Some(Block::Object(o)) => {
                let mut keys: Vec<&String> = o.attributes.keys().collect();
                keys.sort();
                let mut out = BTreeMap::new();
                for k in keys {
                    let v = self.decode(&o.attributes[k], k, body, path, depth + 1)?;
                    out.insert(k.clone(), v);
                }
                Ok(ConfigValue::Map(out))
            }
            Some(Block::Array(a)) => {
                let mut out = Vec::with_capacity(a.values.len());
                for s in &a.values {
                    out.push(self.decode(s, "", body, path, depth + 1)?);
                }
                Ok(ConfigValue::List(out))
            }
            Some(Block::Literal(l)) => {
                literal::evaluate(&l.value).map_err(|reason| self.schema(path, reason))
            }
            Some(Block::Default(d)) => {
                let Some(primary) = &d.primary else {
                    return Err(self.schema(path, "Default spec without a primary spec"));
                };
                let v = self.decode(primary, implied, body, path, depth + 1)?;
                match (&v, &d.default) {
                    (ConfigValue::Null, Some(fallback)) => {
                        self.decode(fallback, implied, body, path, depth + 1)
                    }
                    _ => Ok(v),
                }
            }
            Some(Block::Attr(a)) => {
                let name = named(&a.name, "Attr")?;
                let at = path.key(&name);
                let ty = types::parse(&a.r#type).map_err(|e| self.schema(&at, e))?;
                match body.get(&name) {
                    None if a.required => Err(self.invalid(at, "missing required argument")),
                    None => Ok(ConfigValue::Null),
                    Some(v) => types::convert(v, &ty, &at).map_err(|(p, why)| self.invalid(p, why)),
                }
            }
            Some(Block::BlockValue(b)) => {
                let name = named(&b.name, "Block")?;
                let at = path.key(&name);
                let nested = self.nested(b.nested.as_deref(), &at)?;
                let mut blocks = self.blocks(body.get(&name), &at)?;
                match blocks.len() {
                    0 if b.required => Err(self.invalid(at, format!("a {name} block is required"))),
                    0 => Ok(ConfigValue::Null),
                    1 => {
                        let (block_path, block) = blocks.remove(0);
                        self.body(nested, block, &block_path, depth + 1)
                    }
                    n => {
                        Err(self
                            .invalid(at, format!("only one {name} block is allowed, found {n}")))
                    }
                }
            }
            Some(Block::BlockAttrs(b)) => {
                let name = named(&b.name, "BlockAttrs")?;
                let at = path.key(&name);
                let ty = types::parse(&b.r#type).map_err(|e| self.schema(&at, e))?;
                let mut blocks = self.blocks(body.get(&name), &at)?;
                match blocks.len() {
                    0 if b.required => Err(self.invalid(at, format!("a {name} block is required"))),
                    0 => Ok(ConfigValue::Null),
                    1 => {
                        let (block_path, block) = blocks.remove(0);
                        let mut out = BTreeMap::new();
                        for (k, v) in block {
                            let p = block_path.key(k);
                            let v = types::convert(v, &ty, &p)
                                .map_err(|(p, why)| self.invalid(p, why))?;
                            out.insert(k.clone(), v);
                        }
                        Ok(ConfigValue::Map(out))
                    }
                    n => {
                        Err(self
                            .invalid(at, format!("only one {name} block is allowed, found {n}")))
                    }
                }
            }
            Some(Block::BlockList(b)) => {
                let name = named(&b.name, "BlockList")?;
                self.block_list(
                    &name,
                    b.nested.as_deref(),
                    b.min_items,
                    b.max_items,
                    false,
                    body,
                    path,
                    depth,
                )
            }
            Some(Block::BlockSet(b)) => {
                let name = named(&b.name, "BlockSet")?;
                self.block_list(
                    &name,
                    b.nested.as_deref(),
                    b.min_items,
                    b.max_items,
                    true,
                    body,
                    path,
                    depth,
                )
            }
            Some(Block::BlockMap(b)) => {
                let name = named(&b.name, "BlockMap")?;
                let at = path.key(&name);
                if b.labels.is_empty() {
                    return Err(self.schema(&at, "BlockMap spec without labels"));
                }
                let nested = self.nested(b.nested.as_deref(), &at)?;
                match body.get(&name) {
                    None | Some(serde_json::Value::Null) => Ok(ConfigValue::Map(BTreeMap::new())),
                    Some(v) => self.by_labels(v, &b.labels, nested, &at, depth + 1),
                }
            }
        }
    }

    fn nested<'s>(&self, nested: Option<&'s Spec>, at: &Path) -> Result<&'s Spec, ConfigError> {
        nested
            .filter(|s| s.block.is_some())
            .ok_or_else(|| self.schema(at, "block spec without a nested spec"))
    }

    /// The blocks a JSON value holds: none (absent, null or `[]`), one (an object) or several
    /// (an array of objects), each with its path.
    fn blocks<'v>(
        &self,
        v: Option<&'v serde_json::Value>,
        at: &Path,
    ) -> Result<Vec<(Path, &'v Body)>, ConfigError> {
        match v {
            None | Some(serde_json::Value::Null) => Ok(Vec::new()),
            Some(serde_json::Value::Object(map)) => Ok(vec![(at.clone(), map)]),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    serde_json::Value::Object(map) => Ok((at.index(i), map)),
                    other => Err(self.invalid(
                        at.index(i),
                        format!("must be a block (an object), not {}", types::kind(other)),
                    )),
                })
                .collect(),
            Some(other) => Err(self.invalid(
                at.clone(),
                format!("must be a block (an object), not {}", types::kind(other)),
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn block_list(
        &self,
        name: &str,
        nested: Option<&Spec>,
        min: u64,
        max: u64,
        set: bool,
        body: &Body,
        path: &Path,
        depth: usize,
    ) -> Result<ConfigValue, ConfigError> {
        let at = path.key(name);
        let nested = self.nested(nested, &at)?;
        let blocks = self.blocks(body.get(name), &at)?;
        let n = blocks.len() as u64;
        if min > 0 && n < min {
            return Err(self.invalid(
                at,
                format!("at least {min} {name} block(s) are required, found {n}"),
            ));
        }
        if max > 0 && n > max {
            return Err(self.invalid(
                at,
                format!("at most {max} {name} block(s) are allowed, found {n}"),
            ));
        }
        let mut out = Vec::with_capacity(blocks.len());
        for (p, block) in blocks {
            let v = self.body(nested, block, &p, depth + 1)?;
            if !set || !out.contains(&v) {
                out.push(v);
            }
        }
        Ok(ConfigValue::List(out))
    }

    /// A `BlockMap`'s value: objects keyed by each label in turn, then the block bodies.
    fn by_labels(
        &self,
        v: &serde_json::Value,
        labels: &[String],
        nested: &Spec,
        at: &Path,
        depth: usize,
    ) -> Result<ConfigValue, ConfigError> {
        let Some((label, rest)) = labels.split_first() else {
            let mut blocks = self.blocks(Some(v), at)?;
            return match blocks.len() {
                1 => {
                    let (p, block) = blocks.remove(0);
                    self.body(nested, block, &p, depth + 1)
                }
                0 => Err(self.invalid(at.clone(), "an empty block list is not a block")),
                n => Err(self.invalid(
                    at.clone(),
                    format!("only one block per label is allowed, found {n}"),
                )),
            };
        };
        let serde_json::Value::Object(map) = v else {
            return Err(self.invalid(
                at.clone(),
                format!(
                    "must be an object keyed by the block's {label:?} label, not {}",
                    types::kind(v)
                ),
            ));
        };
        let mut out = BTreeMap::new();
        for (k, item) in map {
            out.insert(
                k.clone(),
                self.by_labels(item, rest, nested, &at.key(k), depth + 1)?,
            );
        }
        Ok(ConfigValue::Map(out))
    }
}

#[cfg(test)]
mod tests;
