//! Dotted field paths for error messages: `capability[1].access_mode`. Keys are the user's
//! (map keys, unknown fields): one that is not a plain name, or is longer than
//! [`MAX_SHOWN_CHARS`], is shown quoted, escaped and cut.

use std::fmt;

use berth_input::{MAX_SHOWN_CHARS, Quoted};

/// One step: a key, and which occurrence of it (blocks repeat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seg {
    pub name: String,
    pub index: Option<usize>,
}

/// A path from the top of a spec to a field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    pub fn root() -> Self {
        Self::default()
    }

    /// This path, then `name`.
    pub fn key(&self, name: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg {
            name: name.to_string(),
            index: None,
        });
        p
    }

    /// This path, at occurrence `index` of its last key.
    pub fn at(&self, index: usize) -> Self {
        let mut p = self.clone();
        if let Some(last) = p.0.last_mut() {
            last.index = Some(index);
        }
        p
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            let plain = !seg.name.is_empty()
                && seg.name.len() <= MAX_SHOWN_CHARS
                && seg
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            match (plain, i) {
                (true, 0) => f.write_str(&seg.name)?,
                (true, _) => write!(f, ".{}", seg.name)?,
                (false, _) => write!(f, "[{}]", Quoted(&seg.name))?,
            }
            if let Some(n) = seg.index {
                write!(f, "[{n}]")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let p = FieldPath::root().key("capability").at(1).key("access_mode");
        assert_eq!(p.to_string(), "capability[1].access_mode");
        assert_eq!(
            FieldPath::root().key("parameters").key("a b").to_string(),
            "parameters[\"a b\"]"
        );
        assert_eq!(FieldPath::root().to_string(), "");
        let long = "k".repeat(100_000);
        assert_eq!(
            FieldPath::root().key("parameters").key(&long).to_string(),
            format!("parameters[\"{}\"…]", "k".repeat(MAX_SHOWN_CHARS))
        );
        assert_eq!(
            FieldPath::root().key("a\nb: forged").to_string(),
            "[\"a\\nb: forged\"]"
        );
    }
}
