//! Durations in Go's form (`time.ParseDuration`), as Nomad's specs write them: `"30s"`,
//! `"1m30s"`, `"1.5h"`, `"500ms"`, `"0"`.

use std::{fmt, time::Duration};

/// A text that is not a Go-form duration. Says what is wrong, not the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing, or only a sign.
    #[error("is empty")]
    Empty,
    /// A leading `-`.
    #[error("must not be negative")]
    Negative,
    /// A number with no unit after it (other than a lone `0`).
    #[error("a number needs a unit (ns, us, ms, s, m or h), as in \"30s\"")]
    MissingUnit,
    /// A unit that is not one of Go's.
    #[error("unknown unit (expected ns, us, µs, ms, s, m or h)")]
    UnknownUnit,
    /// Something other than a number where one should be.
    #[error("expected a number followed by a unit, as in \"30s\" or \"1m30s\"")]
    Malformed,
    /// More than `Duration` holds.
    #[error("is too long")]
    Overflow,
}

const NANOS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a Go-form duration: one or more `<number><unit>` with no spaces between them, where
/// a number may have a fraction (`1.5h`) and the unit is `ns`, `us` (or `µs`), `ms`, `s`, `m` or
/// `h`; a lone `0` needs no unit. A leading `+` is allowed, a `-` is not.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = rest;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.find(|c: char| !c.is_ascii_digit()).unwrap_or(a.len());
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(DurationError::Malformed);
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(DurationError::MissingUnit);
        }
        let scale = NANOS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, n)| *n)
            .ok_or(DurationError::UnknownUnit)?;
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| DurationError::Overflow)?
        };
        let mut nanos = whole.checked_mul(scale).ok_or(DurationError::Overflow)?;
        // The fraction, truncated to whole nanoseconds (as Go does); digits past the 20th
        // cannot change the result.
        let frac = &frac[..frac.len().min(20)];
        if !frac.is_empty() {
            let digits: u128 = frac.parse().map_err(|_| DurationError::Malformed)?;
            let denom = 10u128.pow(frac.len() as u32);
            nanos = nanos
                .checked_add(digits * scale / denom)
                .ok_or(DurationError::Overflow)?;
        }
        total = total.checked_add(nanos).ok_or(DurationError::Overflow)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| DurationError::Overflow)?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Writes `d` in Go's form, exactly: `"1h2m3s"`, `"500ms"`, `"1s250us"`, `"0s"`. What it writes
/// [`parse_duration`] reads back to the same value.
pub fn format_duration(d: Duration) -> String {
    GoDuration(d).to_string()
}

/// Displays a duration in Go's form (see [`format_duration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        for (unit, scale) in [
            ("h", 3_600_000_000_000u128),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ] {
            let n = nanos / scale;
            if n > 0 {
                write!(f, "{n}{unit}")?;
                nanos %= scale;
            }
        }
        Ok(())
    }
}

/// `#[serde(with = "…")]` for a `Duration` stored as a Go-form string.
pub(crate) mod go_form {
    use std::time::Duration;

    use serde::{Deserialize as _, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::GoDuration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(|e| D::Error::custom(format!("duration {s:?} {e}")))
    }
}

/// `#[serde(with = "…")]` for an `Option<Duration>` stored as a Go-form string or `null`.
pub(crate) mod go_form_opt {
    use std::time::Duration;

    use serde::{Deserialize as _, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&super::GoDuration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| {
                super::parse_duration(&s)
                    .map_err(|e| D::Error::custom(format!("duration {s:?} {e}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        let ms = Duration::from_millis;
        for (s, want) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("30s", ms(30_000)),
            ("+5s", ms(5_000)),
            ("1m30s", ms(90_000)),
            ("500ms", ms(500)),
            ("1.5h", ms(5_400_000)),
            (".5s", ms(500)),
            ("1.s", ms(1_000)),
            ("2h45m", ms(9_900_000)),
            ("1h1m1s1ms1us1ns", Duration::new(3661, 1_001_001)),
            ("1µs", Duration::from_micros(1)),
            ("3us", Duration::from_micros(3)),
            ("1.0000000009s", Duration::new(1, 0)),
            ("0.000000001s", Duration::from_nanos(1)),
        ] {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        use DurationError::*;
        for (s, want) in [
            ("", Empty),
            ("+", Empty),
            ("-5s", Negative),
            ("5", MissingUnit),
            ("1m30", MissingUnit),
            ("5 s", UnknownUnit),
            ("5sec", UnknownUnit),
            ("5d", UnknownUnit),
            ("s", Malformed),
            (".s", Malformed),
            ("1h.", Malformed),
            ("99999999999999999999999999999999999999999h", Overflow),
            ("9999999999999999999h", Overflow),
        ] {
            assert_eq!(parse_duration(s), Err(want), "{s:?}");
        }
    }

    #[test]
    fn formats_exactly_and_round_trips() {
        for (d, s) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(5), "5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(1800), "30m"),
            (Duration::from_secs(86_400), "24h"),
            (Duration::from_millis(500), "500ms"),
            (Duration::new(1, 250_000), "1s250us"),
            (Duration::new(3661, 1_001_001), "1h1m1s1ms1us1ns"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Ok(d));
        }
        let max = Duration::new(u64::MAX, 999_999_999);
        assert_eq!(parse_duration(&format_duration(max)), Ok(max));
    }
}
