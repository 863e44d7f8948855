//! Durations as people read them.

use std::time::Duration;

const NS: u128 = 1;
const US: u128 = 1_000;
const MS: u128 = 1_000_000;
const SEC: u128 = 1_000_000_000;
const MIN: u128 = 60 * SEC;
const HOUR: u128 = 60 * MIN;
const DAY: u128 = 24 * HOUR;

/// A duration the way an operator reads it: about three significant digits, the largest unit
/// first: `0s`, `850ns`, `1.5us`, `708ms`, `1.5s`, `42s`, `2m3s`, `1h5m`, `2d3h`.
pub fn short_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    // Round to the precision shown at this size; rounding may carry into the next size.
    let step = match ns {
        n if n < US => NS,
        n if n < 10 * US => US / 10,
        n if n < MS => US,
        n if n < 10 * MS => MS / 10,
        n if n < SEC => MS,
        n if n < 10 * SEC => SEC / 10,
        n if n < HOUR => SEC,
        n if n < DAY => MIN,
        _ => HOUR,
    };
    let r = (ns + step / 2) / step * step;
    let tenths = |unit: u128, name: &str| {
        let t = r * 10 / unit;
        if t.is_multiple_of(10) {
            format!("{}{name}", t / 10)
        } else {
            format!("{}.{}{name}", t / 10, t % 10)
        }
    };
    let two = |big: u128, big_name: &str, small: u128, small_name: &str| {
        let (a, b) = (r / big, r % big / small);
        if b == 0 {
            format!("{a}{big_name}")
        } else {
            format!("{a}{big_name}{b}{small_name}")
        }
    };
    match r {
        r if r < US => format!("{r}ns"),
        r if r < MS => tenths(US, "us"),
        r if r < SEC => tenths(MS, "ms"),
        r if r < MIN => tenths(SEC, "s"),
        r if r < HOUR => two(MIN, "m", SEC, "s"),
        r if r < DAY => two(HOUR, "h", MIN, "m"),
        _ => two(DAY, "d", HOUR, "h"),
    }
}

/// Milliseconds since the epoch, now (0 before 1970, `u64::MAX` far in the future).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_an_operator_reads_them() {
        let ns = Duration::from_nanos;
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (ns(1), "1ns"),
            (ns(850), "850ns"),
            (ns(999), "999ns"),
            (ns(1_500), "1.5us"),
            (ns(9_960), "10us"),
            (ns(874_794), "875us"),
            (ns(999_700), "1ms"),
            (ns(1_250_000), "1.3ms"),
            (ns(707_874_794), "708ms"),
            (ns(999_600_000), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (ns(2_003_457_812), "2s"),
            (Duration::from_millis(9_960), "10s"),
            (Duration::from_millis(42_400), "42s"),
            (Duration::from_millis(59_600), "1m"),
            (Duration::from_secs(123), "2m3s"),
            (Duration::from_secs(3_599), "59m59s"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(3_600 + 5 * 60 + 29), "1h5m"),
            (Duration::from_secs(86_399), "1d"),
            (Duration::from_secs(2 * 86_400 + 3 * 3_600), "2d3h"),
            (Duration::MAX, "213503982334601d7h"),
        ] {
            assert_eq!(short_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn restart_and_timeout_figures_read_short() {
        assert_eq!(short_duration(Duration::from_nanos(707_874_794)), "708ms");
        assert_eq!(short_duration(Duration::from_millis(50)), "50ms");
        assert_eq!(short_duration(Duration::from_secs(300)), "5m");
    }
}
