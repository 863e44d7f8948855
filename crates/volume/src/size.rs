//! Human sizes (`10GiB`, `1G`, `500MB`) as Nomad's volume specs write them.

use berth_input::Quoted;

/// The largest size accepted: CSI carries byte counts as `int64`.
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// Why a size could not be read. Messages repeat the input (sizes are not secret), escaped and
/// cut to [`berth_input::MAX_SHOWN_CHARS`] characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Not a number followed by an optional unit.
    #[error(
        "{} is not a size (e.g. \"10GiB\", \"500MB\", \"1G\", \"1048576\")",
        Quoted(input)
    )]
    NotASize {
        /// The input as given.
        input: String,
    },
    /// A unit this parser does not know.
    #[error(
        "{}: unknown unit {} (expected B, K/KB, KiB, M/MB, MiB, G/GB, GiB, T/TB, TiB, P/PB, PiB, E/EB or EiB)",
        Quoted(input),
        Quoted(unit)
    )]
    UnknownUnit {
        /// The input as given.
        input: String,
        /// The unit part of it.
        unit: String,
    },
    /// More bytes than [`MAX_SIZE`].
    #[error("{} is more than {MAX_SIZE} bytes", Quoted(input))]
    TooLarge {
        /// The input as given.
        input: String,
    },
}

/// Reads a size in bytes, with the rules of Nomad's volume specs: a decimal number (a fraction is
/// allowed), optional spaces, then an optional case-insensitive unit. `K`, `KB`, `M`, `MB`, …
/// are powers of 1000; `Ki`, `KiB`, `Mi`, `MiB`, … powers of 1024; no unit or `B` means bytes.
/// Fractions of a byte are dropped. The result is at most [`MAX_SIZE`].
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let not_a_size = || SizeError::NotASize {
        input: input.to_string(),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(num_end);
    let unit = unit.trim_start();
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(not_a_size());
    }
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "ki" | "kib" => 1 << 10,
        "m" | "mb" => 1000u128.pow(2),
        "mi" | "mib" => 1 << 20,
        "g" | "gb" => 1000u128.pow(3),
        "gi" | "gib" => 1 << 30,
        "t" | "tb" => 1000u128.pow(4),
        "ti" | "tib" => 1 << 40,
        "p" | "pb" => 1000u128.pow(5),
        "pi" | "pib" => 1 << 50,
        "e" | "eb" => 1000u128.pow(6),
        "ei" | "eib" => 1 << 60,
        _ => {
            return Err(SizeError::UnknownUnit {
                input: input.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    let too_large = || SizeError::TooLarge {
        input: input.to_string(),
    };
    let int = int.trim_start_matches('0');
    if int.len() > 20 {
        return Err(too_large());
    }
    let whole: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| not_a_size())?
    };
    // Up to 18 fractional digits count; the rest are below a byte for every unit.
    let frac = &frac[..frac.len().min(18)];
    let part: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u128>().map_err(|_| not_a_size())? * mult / 10u128.pow(frac.len() as u32)
    };
    let bytes = whole
        .checked_mul(mult)
        .and_then(|b| b.checked_add(part))
        .ok_or_else(too_large)?;
    if bytes > u128::from(MAX_SIZE) {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_nomad() {
        for (s, want) in [
            ("10GiB", 10 << 30),
            ("1G", 1_000_000_000),
            ("500MB", 500_000_000),
            ("10 MiB", 10 << 20),
            ("1.5KiB", 1536),
            ("0.5kb", 500),
            ("2tib", 2 << 40),
            ("1048576", 1 << 20),
            ("7b", 7),
            (" 1 ei ", 1 << 60),
            (".5K", 500),
            ("0", 0),
        ] {
            assert_eq!(parse_size(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn bad_sizes_say_why() {
        for s in ["", "GiB", "ten", "-1G", "1.2.3G", "."] {
            assert!(
                matches!(parse_size(s), Err(SizeError::NotASize { .. })),
                "{s:?}"
            );
        }
        let e = parse_size("10 parsecs").unwrap_err();
        assert!(e.to_string().contains("unknown unit \"parsecs\""), "{e}");
        assert!(matches!(
            parse_size("8EiB"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::TooLarge { .. })
        ));
        assert_eq!(parse_size("9223372036854775807"), Ok(MAX_SIZE));
    }

    #[test]
    fn errors_repeat_the_input_escaped_and_cut() {
        let long = format!("1\n{}", "x".repeat(100_000));
        for e in [
            parse_size(&long).unwrap_err(),
            parse_size(&format!("ten\u{1b}[2J{long}")).unwrap_err(),
            parse_size(&"9".repeat(100_000)).unwrap_err(),
        ] {
            let shown = e.to_string();
            assert!(shown.len() < 600, "{} bytes", shown.len());
            assert!(
                !shown.contains('\n') && !shown.contains('\u{1b}'),
                "{shown}"
            );
        }
    }
}
