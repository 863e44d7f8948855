//! Ids that become path segments (volume, snapshot, alloc ids…).
//!
//! An id that names a directory must never escape it: [`validate_path_segment`] is the one check
//! every such id goes through before it touches a path.

use std::fmt;

/// Longest id, in bytes, accepted as a path segment (the CSI size limit for strings).
pub const MAX_SEGMENT_LEN: usize = 128;

/// How many characters of a rejected id an error repeats.
const SHOWN_CHARS: usize = 64;

/// An id that cannot be used as a single path segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {id:?}: {rule}")]
pub struct InvalidId {
    /// What the id names, e.g. `"volume id"`.
    pub kind: &'static str,
    /// The rejected id, cut to its first 64 characters.
    pub id: String,
    /// The rule it breaks.
    pub rule: IdRule,
}

/// The rule an [`InvalidId`] breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdRule {
    /// The id is empty.
    Empty,
    /// The id is longer than [`MAX_SEGMENT_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The id contains `/`.
    Slash,
    /// The id is `.` or `..`.
    Dots,
    /// The id contains a NUL byte.
    Nul,
    /// The id contains a control character (newline, tab, ESC…) or a bidirectional text
    /// control (U+202E…), which would forge lines or reorder text where the id is printed.
    Control,
}

impl fmt::Display for IdRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("must not be empty"),
            Self::TooLong { len } => {
                write!(f, "is {len} bytes long, more than {MAX_SEGMENT_LEN}")
            }
            Self::Slash => f.write_str("must not contain '/'"),
            Self::Dots => f.write_str("must not be '.' or '..'"),
            Self::Nul => f.write_str("must not contain a NUL byte"),
            Self::Control => f.write_str("must not contain control characters"),
        }
    }
}

/// Whether `c` is a control character (C0, DEL, C1) or a Unicode bidirectional text control:
/// characters that must never reach a terminal or a table from an id.
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Checks that `id` can be used as one path segment: non-empty, at most [`MAX_SEGMENT_LEN`]
/// bytes, no `/`, no NUL, no control or bidirectional-text characters, and not `.` or `..`.
/// The error names `kind` and the rule broken; it quotes the id escaped and cut short.
pub fn validate_path_segment(kind: &'static str, id: &str) -> Result<(), InvalidId> {
    let rule = if id.is_empty() {
        Some(IdRule::Empty)
    } else if id.len() > MAX_SEGMENT_LEN {
        Some(IdRule::TooLong { len: id.len() })
    } else if id.contains('/') {
        Some(IdRule::Slash)
    } else if id.contains('\0') {
        Some(IdRule::Nul)
    } else if id.chars().any(is_unprintable) {
        Some(IdRule::Control)
    } else if id == "." || id == ".." {
        Some(IdRule::Dots)
    } else {
        None
    };
    match rule {
        None => Ok(()),
        Some(rule) => Err(InvalidId {
            kind,
            id: id.chars().take(SHOWN_CHARS).collect(),
            rule,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: &str) -> Option<IdRule> {
        validate_path_segment("volume id", id).err().map(|e| e.rule)
    }

    #[test]
    fn accepts_plain_ids() {
        for id in [
            "a",
            "vol-1",
            "...",
            ".hidden",
            "x..y",
            "ünïcode",
            &"a".repeat(128),
        ] {
            assert_eq!(rule(id), None, "{id:?}");
        }
    }

    #[test]
    fn names_the_broken_rule() {
        assert_eq!(rule(""), Some(IdRule::Empty));
        assert_eq!(rule(&"a".repeat(129)), Some(IdRule::TooLong { len: 129 }));
        assert_eq!(rule("a/b"), Some(IdRule::Slash));
        assert_eq!(rule("/"), Some(IdRule::Slash));
        assert_eq!(rule("."), Some(IdRule::Dots));
        assert_eq!(rule(".."), Some(IdRule::Dots));
        assert_eq!(rule("a\0b"), Some(IdRule::Nul));
        for id in [
            "a\nb",
            "a\tb",
            "a\x1b[2Jb",
            "a\u{202e}b",
            "a\u{7f}",
            "a\u{85}b",
            "\u{2066}x",
        ] {
            assert_eq!(rule(id), Some(IdRule::Control), "{id:?}");
        }
    }

    #[test]
    fn control_characters_are_escaped_in_messages() {
        let err = validate_path_segment("alloc id", "a\nb\x1b")
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\n') && !err.contains('\x1b'), "{err}");
        assert!(err.contains(r"a\nb\u{1b}"), "{err}");
    }

    #[test]
    fn message_names_kind_and_rule() {
        let err = validate_path_segment("snapshot id", "../etc").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid snapshot id "../etc": must not contain '/'"#
        );
        let err = validate_path_segment("volume id", "a\0").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid volume id "a\0": must not contain a NUL byte"#
        );
    }

    #[test]
    fn long_ids_are_cut_in_messages() {
        let err = validate_path_segment("volume id", &"é".repeat(300)).unwrap_err();
        assert_eq!(err.id.chars().count(), 64);
        assert!(err.to_string().contains("600 bytes long, more than 128"));
    }
}
