//! Field paths for error messages: `job.group[web].task[app].volume_mount[0].volume`.

use std::fmt;

use berth_input::{MAX_SHOWN_CHARS, Quoted};

/// How many characters of a label a path shows.
const SHOWN_LABEL_CHARS: usize = 64;

/// Which one of a repeated key: a position (unlabelled blocks, list items) or a block's label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Which {
    At(usize),
    Label(String),
    /// A label that is a `/`-separated name (`nvidia/gpu`): shown bare with its `/`.
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seg {
    name: String,
    which: Option<Which>,
}

/// A path from the top of a spec to a field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Seg>);

impl FieldPath {
    pub fn root() -> Self {
        Self::default()
    }

    /// This path, then `name`.
    pub fn key(&self, name: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Seg {
            name: name.to_string(),
            which: None,
        });
        p
    }

    /// This path, at position `index` of its last key.
    pub fn at(&self, index: usize) -> Self {
        self.with(Which::At(index))
    }

    /// This path, at the block labelled `label` of its last key.
    pub fn label(&self, label: &str) -> Self {
        self.with(Which::Label(label.to_string()))
    }

    /// This path, at the block labelled `label` of its last key, where the label is a
    /// `/`-separated name (`device[nvidia/gpu]`).
    pub fn name(&self, label: &str) -> Self {
        self.with(Which::Name(label.to_string()))
    }

    fn with(&self, which: Which) -> Self {
        let mut p = self.clone();
        if let Some(last) = p.0.last_mut() {
            last.which = Some(which);
        }
        p
    }
}

/// Shown as is: letters, digits, `_`, `-` and `.`, with at least one letter or digit (so `..`
/// is quoted).
fn plain(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            let name_plain =
                plain(&seg.name) && !seg.name.contains('.') && seg.name.len() <= MAX_SHOWN_CHARS;
            match (name_plain, i) {
                (true, 0) => f.write_str(&seg.name)?,
                (true, _) => write!(f, ".{}", seg.name)?,
                (false, _) => write!(f, "[{}]", Quoted(&seg.name))?,
            }
            match &seg.which {
                None => {}
                Some(Which::At(n)) => write!(f, "[{n}]")?,
                Some(Which::Label(l)) if plain(l) && l.len() <= SHOWN_LABEL_CHARS => {
                    write!(f, "[{l}]")?
                }
                Some(Which::Name(l)) if l.split('/').all(plain) && l.len() <= SHOWN_LABEL_CHARS => {
                    write!(f, "[{l}]")?
                }
                Some(Which::Label(l) | Which::Name(l)) => {
                    let mut shown: String = l.chars().take(SHOWN_LABEL_CHARS).collect();
                    if shown.len() < l.len() {
                        shown.push('…');
                    }
                    write!(f, "[{}]", Quoted(&shown))?
                }
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
        let p = FieldPath::root()
            .key("job")
            .key("group")
            .label("web")
            .key("task")
            .label("app.v2")
            .key("volume_mount")
            .at(0)
            .key("volume");
        assert_eq!(
            p.to_string(),
            "job.group[web].task[app.v2].volume_mount[0].volume"
        );
        let p = FieldPath::root().key("job").key("group").label("a b/c");
        assert_eq!(p.to_string(), "job.group[\"a b/c\"]");
        let p = FieldPath::root().key("group").label("..");
        assert_eq!(p.to_string(), "group[\"..\"]");
        let p = FieldPath::root().key("env").key("A B");
        assert_eq!(p.to_string(), "env[\"A B\"]");
        let long = "x".repeat(100);
        let p = FieldPath::root().key("group").label(&long);
        assert_eq!(p.to_string(), format!("group[\"{}…\"]", "x".repeat(64)));
        assert_eq!(FieldPath::root().to_string(), "");
        let d = FieldPath::root().key("device");
        assert_eq!(d.name("nvidia/gpu").to_string(), "device[nvidia/gpu]");
        assert_eq!(d.name("gpu").to_string(), "device[gpu]");
        assert_eq!(
            d.name("nvidia/gpu/Tesla K80").to_string(),
            "device[\"nvidia/gpu/Tesla K80\"]"
        );
        assert_eq!(d.name("a//b").to_string(), "device[\"a//b\"]");
        assert_eq!(d.name("../x").to_string(), "device[\"../x\"]");
    }
}
