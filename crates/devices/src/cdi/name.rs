//! Fully qualified CDI device names: `vendor/class=name` (`example.com/device=dev0`).

use std::{fmt, str::FromStr};

/// A fully qualified CDI device name. Its parts follow CDI's rules: the vendor and the class
/// start with a letter, end with a letter or digit and hold letters, digits, `_`, `-` and `.`
/// between; the name starts and ends with a letter or digit and holds letters, digits, `_`,
/// `-`, `.` and `:` between.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    /// The vendor (`example.com`).
    pub vendor: String,
    /// The class (`device`).
    pub class: String,
    /// The device's name within the kind (`dev0`).
    pub name: String,
}

/// Why a text is not a fully qualified CDI device name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", berth_input::Quoted(text))]
pub struct CdiNameError {
    /// The text, as given.
    pub text: String,
    /// What is wrong.
    pub reason: String,
}

impl QualifiedName {
    /// Parses `vendor/class=name`.
    pub fn parse(text: &str) -> Result<Self, CdiNameError> {
        let fail = |reason: String| CdiNameError {
            text: text.to_string(),
            reason,
        };
        let (kind, name) = text
            .split_once('=')
            .ok_or_else(|| fail("not a CDI device name (expected vendor.com/class=name)".into()))?;
        let (vendor, class) = kind
            .split_once('/')
            .ok_or_else(|| fail("missing vendor (expected vendor.com/class=name)".into()))?;
        if vendor.is_empty() {
            return Err(fail("missing vendor".into()));
        }
        if class.is_empty() {
            return Err(fail("missing class".into()));
        }
        if name.is_empty() {
            return Err(fail("missing device name".into()));
        }
        check_kind_part("vendor", vendor).map_err(&fail)?;
        check_kind_part("class", class).map_err(&fail)?;
        check_device_name(name).map_err(&fail)?;
        Ok(Self {
            vendor: vendor.to_string(),
            class: class.to_string(),
            name: name.to_string(),
        })
    }

    /// The kind: `vendor/class`.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

impl FromStr for QualifiedName {
    type Err = CdiNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Checks one part of a kind (`vendor` or `class`).
pub(crate) fn check_kind_part(what: &str, part: &str) -> Result<(), String> {
    check_part(
        what,
        part,
        |c| c.is_ascii_alphabetic(),
        "a letter",
        &['_', '-', '.'],
    )
}

/// Checks a device name.
pub(crate) fn check_device_name(name: &str) -> Result<(), String> {
    check_part(
        "device name",
        name,
        |c| c.is_ascii_alphanumeric(),
        "a letter or digit",
        &['_', '-', '.', ':'],
    )
}

fn check_part(
    what: &str,
    part: &str,
    first_ok: impl Fn(char) -> bool,
    first_what: &str,
    inner: &[char],
) -> Result<(), String> {
    let shown = berth_input::Quoted(part);
    let mut chars = part.chars();
    let Some(first) = chars.next() else {
        return Err(format!("empty {what}"));
    };
    if !first_ok(first) {
        return Err(format!("{what} {shown} must start with {first_what}"));
    }
    let last = part.chars().last().unwrap_or(first);
    if !last.is_ascii_alphanumeric() {
        return Err(format!("{what} {shown} must end with a letter or digit"));
    }
    if let Some(bad) = part
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !inner.contains(c))
    {
        return Err(format!(
            "{what} {shown} holds {}, which is not allowed",
            berth_input::Quoted(&bad.to_string())
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_parse() {
        let n = QualifiedName::parse("example.com/device=dev0").unwrap();
        assert_eq!(n.vendor, "example.com");
        assert_eq!(n.class, "device");
        assert_eq!(n.name, "dev0");
        assert_eq!(n.kind(), "example.com/device");
        assert_eq!(n.to_string(), "example.com/device=dev0");
        for ok in [
            "nvidia.com/gpu=0",
            "vendor.com/foo-bar_1=GPU-fef8089b:1",
            "a/b=c",
            "x.y/z.w=1.2",
        ] {
            QualifiedName::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn bad_names_say_why() {
        for (bad, why) in [
            ("example.com/device", "not a CDI device name"),
            ("device=dev0", "missing vendor"),
            ("/device=dev0", "missing vendor"),
            ("example.com/=dev0", "missing class"),
            ("example.com/device=", "missing device name"),
            ("1example.com/device=dev0", "must start with a letter"),
            (
                "example.com-/device=dev0",
                "must end with a letter or digit",
            ),
            ("example.com/dev ice=dev0", "not allowed"),
            (
                "example.com/device=-dev0",
                "must start with a letter or digit",
            ),
            ("example.com/device=dev/0", "not allowed"),
        ] {
            let e = QualifiedName::parse(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }
}
