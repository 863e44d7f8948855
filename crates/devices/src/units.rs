//! The units device attributes carry (Nomad's unit table): bytes, byte rates, hertz and watts,
//! each a multiple (or, for `mW`, a fraction) of its base unit. Numbers in units of one base
//! compare with each other (`2048 MiB < 4 GiB`); numbers of different bases never do.

use std::fmt;

/// What a unit measures. Units compare only with units of the same base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BaseUnit {
    /// Bytes (`KiB`, `MB`…).
    Byte,
    /// Bytes per second (`MiB/s`, `GB/s`…).
    ByteRate,
    /// Hertz (`MHz`, `GHz`).
    Hertz,
    /// Watts (`mW`, `W`, `kW`…).
    Watt,
}

impl BaseUnit {
    /// `byte`, `byte rate`, `hertz` or `watt`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Byte => "byte",
            Self::ByteRate => "byte rate",
            Self::Hertz => "hertz",
            Self::Watt => "watt",
        }
    }
}

impl fmt::Display for BaseUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One unit: its name, its base, and how many base units it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unit {
    /// The name as written after a number (`GiB`, `MB/s`, `mW`); case matters.
    pub name: &'static str,
    /// What it measures.
    pub base: BaseUnit,
    /// How many base units one of it is (`KiB`: 1024) or, when `inverse`, how many of it make
    /// one base unit (`mW`: 1000).
    pub multiplier: u64,
    /// The unit is a fraction of its base: `1/multiplier` base units.
    pub inverse: bool,
}

impl Unit {
    /// Whether numbers in `self` and `other` compare (same base).
    pub fn comparable(&self, other: &Unit) -> bool {
        self.base == other.base
    }

    /// `n` of this unit in base units, as a float.
    #[allow(clippy::cast_precision_loss)]
    pub fn to_base(&self, n: f64) -> f64 {
        if self.inverse {
            n / self.multiplier as f64
        } else {
            n * self.multiplier as f64
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

const fn unit(name: &'static str, base: BaseUnit, multiplier: u64) -> Unit {
    Unit {
        name,
        base,
        multiplier,
        inverse: false,
    }
}

const KI: u64 = 1 << 10;
const K: u64 = 1000;

/// Every unit an attribute may carry, as Nomad knows them. `kB` and `KB` (and their rates) are
/// the same unit under two names.
pub const UNITS: &[Unit] = &[
    // Binary bytes.
    unit("KiB", BaseUnit::Byte, KI),
    unit("MiB", BaseUnit::Byte, KI.pow(2)),
    unit("GiB", BaseUnit::Byte, KI.pow(3)),
    unit("TiB", BaseUnit::Byte, KI.pow(4)),
    unit("PiB", BaseUnit::Byte, KI.pow(5)),
    unit("EiB", BaseUnit::Byte, KI.pow(6)),
    // Decimal bytes.
    unit("kB", BaseUnit::Byte, K),
    unit("KB", BaseUnit::Byte, K),
    unit("MB", BaseUnit::Byte, K.pow(2)),
    unit("GB", BaseUnit::Byte, K.pow(3)),
    unit("TB", BaseUnit::Byte, K.pow(4)),
    unit("PB", BaseUnit::Byte, K.pow(5)),
    unit("EB", BaseUnit::Byte, K.pow(6)),
    // Binary byte rates.
    unit("KiB/s", BaseUnit::ByteRate, KI),
    unit("MiB/s", BaseUnit::ByteRate, KI.pow(2)),
    unit("GiB/s", BaseUnit::ByteRate, KI.pow(3)),
    unit("TiB/s", BaseUnit::ByteRate, KI.pow(4)),
    unit("PiB/s", BaseUnit::ByteRate, KI.pow(5)),
    unit("EiB/s", BaseUnit::ByteRate, KI.pow(6)),
    // Decimal byte rates.
    unit("kB/s", BaseUnit::ByteRate, K),
    unit("KB/s", BaseUnit::ByteRate, K),
    unit("MB/s", BaseUnit::ByteRate, K.pow(2)),
    unit("GB/s", BaseUnit::ByteRate, K.pow(3)),
    unit("TB/s", BaseUnit::ByteRate, K.pow(4)),
    unit("PB/s", BaseUnit::ByteRate, K.pow(5)),
    unit("EB/s", BaseUnit::ByteRate, K.pow(6)),
    // Hertz.
    unit("MHz", BaseUnit::Hertz, K.pow(2)),
    unit("GHz", BaseUnit::Hertz, K.pow(3)),
    // Watts.
    Unit {
        name: "mW",
        base: BaseUnit::Watt,
        multiplier: K,
        inverse: true,
    },
    unit("W", BaseUnit::Watt, 1),
    unit("kW", BaseUnit::Watt, K),
    unit("MW", BaseUnit::Watt, K.pow(2)),
    unit("GW", BaseUnit::Watt, K.pow(3)),
];

/// The unit called `name` (exactly; `gib` is not `GiB`).
pub fn lookup(name: &str) -> Option<&'static Unit> {
    UNITS.iter().find(|u| u.name == name)
}

/// The longest unit name `text` ends with (`4 GiB/s` ends with `GiB/s`, not `s`-less `GiB`).
pub fn suffix_of(text: &str) -> Option<&'static Unit> {
    UNITS
        .iter()
        .filter(|u| text.ends_with(u.name))
        .max_by_key(|u| u.name.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_nomads() {
        assert_eq!(UNITS.len(), 33);
        assert_eq!(lookup("GiB").unwrap().multiplier, 1 << 30);
        assert_eq!(lookup("EiB").unwrap().multiplier, 1 << 60);
        assert_eq!(lookup("EB").unwrap().multiplier, 1_000_000_000_000_000_000);
        let (kb, kb2) = (lookup("kB").unwrap(), lookup("KB").unwrap());
        assert_eq!((kb.base, kb.multiplier), (kb2.base, kb2.multiplier));
        assert_eq!(lookup("MHz").unwrap().base, BaseUnit::Hertz);
        assert!(lookup("mW").unwrap().inverse);
        assert_eq!(lookup("GW").unwrap().multiplier, 1_000_000_000);
        assert_eq!(lookup("gib"), None);
        assert_eq!(lookup("Hz"), None);
        assert_eq!(lookup("C"), None);
        // Names are unique.
        for (i, u) in UNITS.iter().enumerate() {
            assert!(UNITS[i + 1..].iter().all(|o| o.name != u.name), "{u}");
        }
    }

    #[test]
    fn longest_suffix_wins() {
        assert_eq!(suffix_of("4 GiB/s").unwrap().name, "GiB/s");
        assert_eq!(suffix_of("4 GiB").unwrap().name, "GiB");
        assert_eq!(suffix_of("3MW").unwrap().name, "MW");
        assert_eq!(suffix_of("3 mW").unwrap().name, "mW");
        assert_eq!(suffix_of("3 W").unwrap().name, "W");
        assert_eq!(suffix_of("3 kB/s").unwrap().name, "kB/s");
        assert_eq!(suffix_of("Tesla K80"), None);
        assert_eq!(suffix_of(""), None);
    }

    #[test]
    fn comparability_and_base_values() {
        let (mib, gib, mhz) = (
            lookup("MiB").unwrap(),
            lookup("GiB").unwrap(),
            lookup("MHz").unwrap(),
        );
        assert!(mib.comparable(gib));
        assert!(!mib.comparable(mhz));
        assert!(!mib.comparable(lookup("MiB/s").unwrap()));
        assert_eq!(gib.to_base(1.5), 1.5 * f64::from(1u32 << 30));
        assert_eq!(lookup("mW").unwrap().to_base(1500.0), 1.5);
    }
}
