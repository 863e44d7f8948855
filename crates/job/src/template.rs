//! Strings with `${…}` runtime references: what the spec wrote where Nomad interpolates at
//! runtime, kept until the node fills them in.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nomad's runtime variables a spec may reference (`${NOMAD_ALLOC_ID}`…).
pub const RUNTIME_VARIABLES: &[&str] = &[
    "NOMAD_ALLOC_ID",
    "NOMAD_ALLOC_INDEX",
    "NOMAD_ALLOC_NAME",
    "NOMAD_ALLOC_DIR",
    "NOMAD_TASK_DIR",
    "NOMAD_SECRETS_DIR",
    "NOMAD_JOB_ID",
    "NOMAD_JOB_NAME",
    "NOMAD_GROUP_NAME",
    "NOMAD_TASK_NAME",
    "NOMAD_DC",
    "NOMAD_REGION",
    "NOMAD_NAMESPACE",
    "NOMAD_CPU_LIMIT",
    "NOMAD_MEMORY_LIMIT",
];

/// `node.*` references a spec may make.
pub const NODE_VARIABLES: &[&str] = &[
    "node.unique.id",
    "node.unique.name",
    "node.datacenter",
    "node.class",
    "node.region",
];

/// One piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Part {
    /// Text as it is.
    Lit(String),
    /// A reference as written: `NOMAD_ALLOC_ID`, `attr.kernel.name`, `meta.rack`, `FOO`.
    Var(String),
}

/// A string as the spec wrote it; `${…}` runtime references are left for the node to fill.
///
/// Its serde form is a plain string when it holds no reference (what older builds stored),
/// else the list of its parts.
#[derive(Debug, Clone, Default, Eq)]
pub struct Template {
    parts: Vec<Part>,
    line: Option<usize>,
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}

impl Template {
    /// A template of plain text.
    pub fn literal(s: impl Into<String>) -> Self {
        Self {
            parts: vec![Part::Lit(s.into())],
            line: None,
        }
    }

    /// A template of `parts` (adjacent texts joined), from spec line `line`.
    pub(crate) fn from_parts(parts: Vec<Part>, line: Option<usize>) -> Self {
        let mut out: Vec<Part> = Vec::with_capacity(parts.len());
        for p in parts {
            match (out.last_mut(), p) {
                (Some(Part::Lit(a)), Part::Lit(b)) => a.push_str(&b),
                (_, p) => out.push(p),
            }
        }
        Self { parts: out, line }
    }

    /// Its parts.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Its text when it holds no reference.
    pub fn as_literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Lit(s)] => Some(s),
            _ => None,
        }
    }

    /// The references it holds, in order.
    pub fn vars(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v) => Some(v.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// The spec line it came from (HCL).
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// Fills every reference from `lookup`; `Err(name)` names the first it cannot fill.
    pub fn render(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => out.push_str(&lookup(v).ok_or_else(|| v.clone())?),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in &self.parts {
            match p {
                Part::Lit(s) => f.write_str(&s.replace("${", "$${").replace("%{", "%%{"))?,
                Part::Var(v) => write!(f, "${{{v}}}")?,
            }
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Plain(String),
    Parts(Vec<Part>),
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.as_literal() {
            Some(text) => s.serialize_str(text),
            None => self.parts.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Repr::deserialize(d)? {
            Repr::Plain(s) => Template::literal(s),
            Repr::Parts(p) => Template::from_parts(p, None),
        })
    }
}

impl PartialEq<&str> for Template {
    fn eq(&self, other: &&str) -> bool {
        self.as_literal() == Some(*other)
    }
}

impl PartialEq<str> for Template {
    fn eq(&self, other: &str) -> bool {
        self.as_literal() == Some(other)
    }
}

impl From<&str> for Template {
    fn from(s: &str) -> Self {
        Template::literal(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_shows_and_stores() {
        let t = Template::from_parts(
            vec![
                Part::Lit("a ".into()),
                Part::Lit("${x} ".into()),
                Part::Var("NOMAD_TASK_NAME".into()),
            ],
            Some(3),
        );
        assert_eq!(t.parts().len(), 2);
        assert_eq!(t.to_string(), "a $${x} ${NOMAD_TASK_NAME}");
        assert_eq!(t.vars().collect::<Vec<_>>(), ["NOMAD_TASK_NAME"]);
        assert_eq!(t.as_literal(), None);
        assert_eq!(
            t.render(&|n| (n == "NOMAD_TASK_NAME").then(|| "web".into())),
            Ok("a ${x} web".into())
        );
        assert_eq!(t.render(&|_| None), Err("NOMAD_TASK_NAME".into()));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Template>(&json).unwrap(), t);
        // What older builds stored: a plain string, read as a literal (a `${` in it included).
        let old: Template = serde_json::from_str("\"echo ${HOME}\"").unwrap();
        assert_eq!(old.as_literal(), Some("echo ${HOME}"));
        assert_eq!(serde_json::to_string(&old).unwrap(), "\"echo ${HOME}\"");
    }
}
