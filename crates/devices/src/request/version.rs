//! Version constraints for the `version` and `semver` operands, read and checked as Nomad does.
//!
//! - `version`: HashiCorp go-version's syntax. A comma-separated list of `<op> <version>`, each
//!   of which must hold; ops `=` (also none), `!=`, `>`, `>=`, `<`, `<=` and `~>` (pessimistic:
//!   `~> 1.2` is `>= 1.2, < 2.0`; `~> 1.2.3` is `>= 1.2.3, < 1.3`). Versions are lenient: an
//!   optional `v`, one or more numbers (missing ones are 0), then an optional pre-release (with
//!   or without `-`: `1.2-beta.1`, `1.2rc1`) and `+metadata`. A pre-release version only
//!   satisfies an ordering op whose version is a pre-release of the same numbers.
//! - `semver`: the same list without `~>`; the pre-release needs its `-` and must be a valid
//!   Semver 2.0 pre-release, and pre-releases are ordered by Semver 2.0 precedence, with no
//!   special rule for them (`>= 1.0.0` holds for `1.1.0-beta`).
//!
//! Metadata never affects ordering.

use std::cmp::Ordering;

use berth_input::Quoted;

/// Which rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// go-version's constraints (the `version` operand).
    Version,
    /// Nomad's semver constraints (the `semver` operand).
    Semver,
}

/// A parsed version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// The numbers, padded with zeros to at least three.
    segments: Vec<u64>,
    /// How many numbers were written.
    written: usize,
    /// The pre-release, without its `-`; empty when none.
    pre: String,
    /// The pre-release as Semver reads it ([`Flavor::Semver`] only; empty otherwise).
    semver_pre: semver::Prerelease,
}

/// Characters of pre-release and metadata identifiers.
fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '~'
}

/// Dot-separated non-empty identifiers.
fn idents(s: &str) -> bool {
    s.split('.')
        .all(|part| !part.is_empty() && part.chars().all(ident_char))
}

impl Version {
    /// Reads a version to check against constraints, as Nomad does: leniently (go-version's
    /// rules) for both flavors; for [`Flavor::Semver`] the pre-release must then be a valid
    /// Semver pre-release, which is how it is ordered.
    pub(crate) fn parse_checked(text: &str, flavor: Flavor) -> Result<Self, String> {
        let mut v = Self::parse(text, Flavor::Version)?;
        if flavor == Flavor::Semver {
            v.semver_pre = semver::Prerelease::new(&v.pre).map_err(|e| {
                format!(
                    "{} is not a semver version: pre-release {}: {e}",
                    Quoted(text),
                    Quoted(&v.pre)
                )
            })?;
        }
        Ok(v)
    }

    /// Reads `text` (no surrounding space) under `flavor`'s rules.
    pub(crate) fn parse(text: &str, flavor: Flavor) -> Result<Self, String> {
        let bad = |why: &str| format!("{} is not a version: {why}", Quoted(text));
        let s = text.strip_prefix('v').unwrap_or(text);
        // The numbers: digits, then `.digits` as long as they come.
        let bytes = s.as_bytes();
        let mut end = 0;
        loop {
            let start = end;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            if end == start {
                if start == 0 {
                    return Err(bad("it must start with a number"));
                }
                // A `.` not followed by a digit is not part of the numbers.
                end = start - 1;
                break;
            }
            if end < bytes.len() && bytes[end] == b'.' {
                end += 1;
            } else {
                break;
            }
        }
        let numbers = &s[..end];
        let mut segments = numbers
            .split('.')
            .map(|n| n.parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("a number is too large"))?;
        let written = segments.len();
        if segments.len() < 3 {
            segments.resize(3, 0);
        }
        let rest = &s[end..];
        let (pre_part, meta) = match rest.split_once('+') {
            Some((p, m)) => (p, Some(m)),
            None => (rest, None),
        };
        if let Some(m) = meta
            && !idents(m)
        {
            return Err(bad("bad metadata after +"));
        }
        let pre = if pre_part.is_empty() {
            ""
        } else if let Some(p) = pre_part.strip_prefix('-').filter(|p| idents(p)) {
            p
        } else if flavor == Flavor::Version
            && idents(pre_part)
            && pre_part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '-' || c == '~')
        {
            pre_part
        } else {
            return Err(bad(match flavor {
                Flavor::Version => "expected numbers, then -prerelease and +metadata",
                Flavor::Semver => "expected numbers, then -prerelease and +metadata (with the -)",
            }));
        };
        let semver_pre = match flavor {
            Flavor::Version => semver::Prerelease::EMPTY,
            Flavor::Semver => semver::Prerelease::new(pre)
                .map_err(|e| bad(&format!("pre-release {}: {e}", Quoted(pre))))?,
        };
        Ok(Self {
            segments,
            written,
            pre: pre.to_string(),
            semver_pre,
        })
    }

    /// go-version's ordering: numbers (missing trailing ones count as 0), then, when the
    /// numbers are the same, a release above its pre-releases and pre-releases part by part.
    fn cmp_version(&self, other: &Self) -> Ordering {
        if self.segments == other.segments {
            return match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => cmp_prereleases(&self.pre, &other.pre),
            };
        }
        cmp_numbers(&self.segments, &other.segments)
    }

    /// Semver 2.0 precedence: numbers, then pre-release (a release above its pre-releases).
    fn cmp_semver(&self, other: &Self) -> Ordering {
        cmp_numbers(&self.segments, &other.segments)
            .then_with(|| self.semver_pre.cmp(&other.semver_pre))
    }
}

/// Numbers compared one by one; a longer list is greater only when its extra numbers are not
/// all 0.
fn cmp_numbers(a: &[u64], b: &[u64]) -> Ordering {
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).copied().unwrap_or(0),
            b.get(i).copied().unwrap_or(0),
        );
        match x.cmp(&y) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    Ordering::Equal
}

/// go-version's pre-release order: part by part; a number below a word; words by bytes; a
/// missing part below a word part and above a number part.
fn cmp_prereleases(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..pa.len().max(pb.len()) {
        let (x, y) = (
            pa.get(i).copied().unwrap_or(""),
            pb.get(i).copied().unwrap_or(""),
        );
        match cmp_part(x, y) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    Ordering::Equal
}

fn cmp_part(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (na, nb) = (a.parse::<i64>().ok(), b.parse::<i64>().ok());
    if a.is_empty() {
        return if nb.is_some() {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    if b.is_empty() {
        return if na.is_some() {
            Ordering::Greater
        } else {
            Ordering::Less
        };
    }
    match (na, nb) {
        (Some(x), Some(y)) if x > y => Ordering::Greater,
        (Some(_), Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) if a > b => Ordering::Greater,
        (None, None) => Ordering::Less,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Pessimistic,
}

/// Longest first, so `>=` is not read as `>`.
const OPS: [(&str, Op); 7] = [
    ("<=", Op::Le),
    (">=", Op::Ge),
    ("!=", Op::Ne),
    ("~>", Op::Pessimistic),
    ("<", Op::Lt),
    (">", Op::Gt),
    ("=", Op::Eq),
];

/// A list of version constraints, all of which must hold.
#[derive(Debug, Clone)]
pub(crate) struct Constraints {
    flavor: Flavor,
    all: Vec<(Op, Version)>,
}

impl Constraints {
    /// Reads `text`: `<op> <version>` items separated by commas.
    pub(crate) fn parse(text: &str, flavor: Flavor) -> Result<Self, String> {
        let mut all = Vec::new();
        for item in text.split(',') {
            let t = item.trim();
            let (op, rest) = OPS
                .iter()
                .filter(|(_, op)| flavor == Flavor::Version || *op != Op::Pessimistic)
                .find_map(|(s, op)| t.strip_prefix(s).map(|r| (*op, r)))
                .unwrap_or((Op::Eq, t));
            let v = rest.trim_start();
            if v.is_empty() {
                return Err(format!(
                    "{} is not a constraint (expected an operator and a version, as in \">= 1.2\")",
                    Quoted(item.trim())
                ));
            }
            all.push((op, Version::parse(v, flavor)?));
        }
        Ok(Self { flavor, all })
    }

    /// Whether `v` satisfies every constraint.
    pub(crate) fn check(&self, v: &Version) -> bool {
        self.all.iter().all(|(op, c)| match self.flavor {
            Flavor::Version => check_version(*op, v, c),
            Flavor::Semver => {
                let o = v.cmp_semver(c);
                match op {
                    Op::Eq => o.is_eq(),
                    Op::Ne => o.is_ne(),
                    Op::Gt => o.is_gt(),
                    Op::Ge => o.is_ge(),
                    Op::Lt => o.is_lt(),
                    Op::Le => o.is_le(),
                    Op::Pessimistic => false,
                }
            }
        })
    }
}

/// A pre-release version satisfies an ordering only against a pre-release of the same numbers;
/// a release satisfies any.
fn prerelease_ok(v: &Version, c: &Version) -> bool {
    match (v.pre.is_empty(), c.pre.is_empty()) {
        (false, false) => v.segments == c.segments,
        (false, true) => false,
        _ => true,
    }
}

fn check_version(op: Op, v: &Version, c: &Version) -> bool {
    let o = v.cmp_version(c);
    match op {
        Op::Eq => o.is_eq(),
        Op::Ne => o.is_ne(),
        Op::Gt => prerelease_ok(v, c) && o.is_gt(),
        Op::Ge => prerelease_ok(v, c) && o.is_ge(),
        Op::Lt => prerelease_ok(v, c) && o.is_lt(),
        Op::Le => prerelease_ok(v, c) && o.is_le(),
        Op::Pessimistic => {
            if !prerelease_ok(v, c) || (!c.pre.is_empty() && v.pre.is_empty()) || o.is_lt() {
                return false;
            }
            let n = c.segments.len();
            if n > v.segments.len() {
                return false;
            }
            // The written numbers but the last must be the same; the last may grow.
            let fixed = c.written.saturating_sub(1);
            v.segments[..fixed] == c.segments[..fixed] && c.segments[n - 1] <= v.segments[n - 1]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(flavor: Flavor, constraint: &str, version: &str) -> bool {
        let c = Constraints::parse(constraint, flavor).unwrap_or_else(|e| panic!("{e}"));
        let v = Version::parse_checked(version, flavor).unwrap_or_else(|e| panic!("{e}"));
        c.check(&v)
    }

    #[test]
    fn lenient_versions() {
        for ok in [
            "1",
            "1.2",
            "v1.2.3",
            "1.2.3.4",
            "1.2-beta",
            "1.2beta",
            "1.2.3-rc.1+build.5",
            "1.0-",
            "1.0--x",
            "470.57.02",
        ] {
            Version::parse(ok, Flavor::Version).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "", "x", "1.", "1..2", "1.2.x", "1.2 ", "1.2+", "1.2-a..b", "v",
        ] {
            assert!(Version::parse(bad, Flavor::Version).is_err(), "{bad}");
        }
        let v = Version::parse("1.2", Flavor::Version).unwrap();
        assert_eq!((v.segments.as_slice(), v.written), (&[1, 2, 0][..], 2));
        assert_eq!(
            Version::parse("1.2beta", Flavor::Version).unwrap().pre,
            "beta"
        );
        // Semver wants the `-` and a valid pre-release.
        assert!(Version::parse("1.2beta", Flavor::Semver).is_err());
        assert!(Version::parse("1.2.3-01", Flavor::Semver).is_err());
        assert!(Version::parse("1.2.3-rc.1", Flavor::Semver).is_ok());
        assert!(Version::parse("1.2", Flavor::Semver).is_ok());
    }

    #[test]
    fn go_version_constraints() {
        let v = |c: &str, v: &str| holds(Flavor::Version, c, v);
        assert!(v(">= 1.2, < 2.0", "1.5"));
        assert!(!v(">= 1.2, < 2.0", "2.0"));
        assert!(v("1.2", "1.2.0"));
        assert!(v("= 1.2", "v1.2"));
        assert!(v("!= 1.2", "1.3"));
        assert!(v("> 1.2", "1.2.1"));
        assert!(v("<= 1.2", "1.2"));
        assert!(v(">=1.2,<2", "1.9.9"));
        // Pessimistic.
        assert!(v("~> 1.2", "1.9"));
        assert!(!v("~> 1.2", "2.0"));
        assert!(!v("~> 1.2", "1.1"));
        assert!(v("~> 1.2.3", "1.2.9"));
        assert!(!v("~> 1.2.3", "1.3.0"));
        assert!(!v("~> 1.2.3", "1.2.2"));
        // Pre-releases only meet pre-releases of the same numbers.
        assert!(!v(">= 1.0", "1.1-beta"));
        assert!(v(">= 1.0-alpha", "1.0-beta"));
        assert!(!v(">= 1.0-alpha", "1.1-beta"));
        assert!(v("< 1.0", "0.9"));
        assert!(!v("> 1.0-beta", "1.0-alpha"));
        assert!(v("= 1.0-beta", "1.0-beta"));
        // Numbers, not text: 470.57.02 > 470.9.
        assert!(v("> 470.9", "470.57.02"));
        // Metadata does not order.
        assert!(v("= 1.0+a", "1.0+b"));
        for bad in [
            "",
            ">=",
            ">= 1.x",
            "1.0,",
            "=> 1.0",
            "~ 1.0",
            "^1.0",
            ">= 1.0 || < 0.5",
        ] {
            assert!(Constraints::parse(bad, Flavor::Version).is_err(), "{bad}");
        }
    }

    #[test]
    fn semver_constraints() {
        let s = |c: &str, v: &str| holds(Flavor::Semver, c, v);
        assert!(s(">= 1.0.0", "1.1.0-beta"));
        assert!(s(">= 1.0.0, < 2.0.0", "1.9.0"));
        assert!(!s(">= 1.0.0, < 2.0.0", "2.0.0"));
        assert!(s("1.2.3", "1.2.3"));
        assert!(s("!= 1.2.3", "1.2.4"));
        // Semver 2.0 precedence.
        assert!(s("< 1.0.0", "1.0.0-rc.1"));
        assert!(s("< 1.0.0-alpha.beta", "1.0.0-alpha"));
        assert!(s("< 1.0.0-alpha.10", "1.0.0-alpha.9"));
        assert!(s("> 1.0.0-beta", "1.0.0-beta.2"));
        assert!(s("= 1.2", "1.2.0"));
        // The version checked is read leniently, its pre-release as Semver's.
        assert!(s("< 1.2.3", "1.2.3beta"));
        assert!(Version::parse_checked("1.2.3-01", Flavor::Semver).is_err());
        assert!(Version::parse_checked("1.2.3-01", Flavor::Version).is_ok());
        for bad in ["~> 1.0", "^1.0", ">= 1.0beta", "1.0.0-01", ""] {
            assert!(Constraints::parse(bad, Flavor::Semver).is_err(), "{bad}");
        }
    }
}
