//! Usages: one way a volume is used on a node, and the directory name it gets.
//!
//! Staging is per usage, publishing per (alloc, usage). A usage is identified by its
//! [`UsageKey`] (read-only?, attachment mode, access mode, variant). Its mount options never
//! appear in a path: when the same (read-only?, attachment mode, access mode) is used with
//! different mount options at once, each set of options gets its own *variant* number, and
//! variants other than 0 add `.<n>` to the directory name.

use std::{fmt, str::FromStr};

use berth_csi::model::{AccessMode, AttachmentMode, MountFlags, MountOptions, VolumeCapability};
use serde::{Deserialize, Serialize};

/// Most bytes mount flags may take, counted as they reach `mount -o`: joined by commas
/// (the CSI size limit for a repeated string field).
pub const MAX_MOUNT_FLAGS_BYTES: usize = 4096;

/// Mount flags that cannot be used. Never repeats a flag: flags may carry credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountFlagsError {
    /// Over [`MAX_MOUNT_FLAGS_BYTES`].
    #[error("mount flags take {len} bytes, more than {MAX_MOUNT_FLAGS_BYTES}")]
    TooLong {
        /// Their length joined by commas.
        len: usize,
    },
    /// A flag with a NUL byte (it cannot reach the kernel).
    #[error("mount flag [{index}] contains a NUL byte")]
    Nul {
        /// 0-based position of the flag.
        index: usize,
    },
}

/// Checks mount flags: at most [`MAX_MOUNT_FLAGS_BYTES`] joined by commas, no NUL byte.
/// The error never contains a flag.
pub fn check_mount_flags(flags: &MountFlags) -> Result<(), MountFlagsError> {
    let flags = flags.expose();
    if let Some(index) = flags.iter().position(|f| f.contains('\0')) {
        return Err(MountFlagsError::Nul { index });
    }
    let len = flags.iter().map(String::len).sum::<usize>() + flags.len().saturating_sub(1);
    if len > MAX_MOUNT_FLAGS_BYTES {
        return Err(MountFlagsError::TooLong { len });
    }
    Ok(())
}

/// The mount options a usage gets: the volume's options are the base; the request's `fs_type`
/// (and `volume_mount_group`) replace the volume's when non-empty; the request's mount flags
/// replace the volume's (all of them, no merging flag by flag) when non-empty.
pub fn merge_mount_options(volume: &MountOptions, request: &MountOptions) -> MountOptions {
    let pick = |req: &String, vol: &String| if req.is_empty() { vol } else { req }.clone();
    MountOptions {
        fs_type: pick(&request.fs_type, &volume.fs_type),
        mount_flags: if request.mount_flags.is_empty() {
            volume.mount_flags.clone()
        } else {
            request.mount_flags.clone()
        },
        volume_mount_group: pick(&request.volume_mount_group, &volume.volume_mount_group),
    }
}

/// What identifies a usage of a volume on a node, and names its directories.
///
/// Plain data (`Copy`, `Ord`, `Serialize`): key persisted records and maps by it. Keys that
/// differ only in `variant` sort together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UsageKey {
    /// Mounted read-only.
    pub read_only: bool,
    /// File-system or block-device.
    pub attachment_mode: AttachmentMode,
    /// The access mode claimed.
    pub access_mode: AccessMode,
    /// Which set of mount options, when one (read-only?, attachment, access mode) is used with
    /// several at once: 0 for the first (and usual) one. The volume manager assigns it; it is
    /// only a number, never derived from the options. Not serialized when 0, so records
    /// written before variants existed read the same.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub variant: u16,
}

fn is_zero(n: &u16) -> bool {
    *n == 0
}

impl UsageKey {
    /// `ro|rw-<file-system|block-device>-<access-mode>`, e.g. `rw-file-system-single-node-writer`,
    /// followed by `.<variant>` when the variant is not 0 (`rw-file-system-single-node-writer.2`).
    /// Always a valid path segment; distinct keys give distinct names.
    pub fn dir_name(&self) -> String {
        let base = format!(
            "{}-{}-{}",
            if self.read_only { "ro" } else { "rw" },
            self.attachment_mode.as_str(),
            self.access_mode.as_str()
        );
        match self.variant {
            0 => base,
            n => format!("{base}.{n}"),
        }
    }

    /// The same key with another variant.
    pub fn with_variant(self, variant: u16) -> Self {
        Self { variant, ..self }
    }

    /// The same key at variant 0: what (read-only?, attachment, access mode) it is, whatever
    /// its mount options.
    pub fn base(self) -> Self {
        self.with_variant(0)
    }

    /// Reads a name made by [`UsageKey::dir_name`] (exactly: no other spelling is accepted, so
    /// no `.0`, no leading zeros, no sign), e.g. when scanning a staging directory after a
    /// restart.
    pub fn from_dir_name(name: &str) -> Result<Self, NotAUsageDir> {
        let bad = || NotAUsageDir(name.chars().take(64).collect());
        let (name_base, variant) = match name.split_once('.') {
            None => (name, 0),
            Some((base, n)) => {
                let canonical =
                    !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0');
                if !canonical {
                    return Err(bad());
                }
                (base, n.parse::<u16>().map_err(|_| bad())?)
            }
        };
        let (read_only, rest) = if let Some(rest) = name_base.strip_prefix("ro-") {
            (true, rest)
        } else if let Some(rest) = name_base.strip_prefix("rw-") {
            (false, rest)
        } else {
            return Err(bad());
        };
        let (attachment_mode, rest) = [AttachmentMode::FileSystem, AttachmentMode::BlockDevice]
            .into_iter()
            .find_map(|m| {
                rest.strip_prefix(m.as_str())
                    .and_then(|r| r.strip_prefix('-'))
                    .map(|r| (m, r))
            })
            .ok_or_else(bad)?;
        let access_mode = AccessMode::ALL
            .into_iter()
            .find(|m| m.as_str() == rest)
            .ok_or_else(bad)?;
        Ok(Self {
            read_only,
            attachment_mode,
            access_mode,
            variant,
        })
    }
}

impl fmt::Display for UsageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dir_name())
    }
}

impl FromStr for UsageKey {
    type Err = NotAUsageDir;
    fn from_str(s: &str) -> Result<Self, NotAUsageDir> {
        Self::from_dir_name(s)
    }
}

/// A name that [`UsageKey::dir_name`] does not make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} is not a usage directory name (expected ro|rw-<file-system|block-device>-<access-mode>, then .<n> for a variant n > 0)",
    berth_input::Quoted(&self.0)
)]
pub struct NotAUsageDir(pub String);

/// One usage of a volume on a node: its key plus the mount options it is staged and published
/// with (already merged, see [`merge_mount_options`]).
///
/// It has no variant: [`Usage::key`] is variant 0, and the volume manager picks the variant a
/// set of mount options gets (see [`UsageKey::variant`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Mounted read-only.
    pub read_only: bool,
    /// File-system or block-device.
    pub attachment_mode: AttachmentMode,
    /// The access mode claimed.
    pub access_mode: AccessMode,
    /// How a file-system usage is mounted; ignored for block devices. Flags never print.
    pub mount_options: MountOptions,
}

impl Usage {
    /// Its identity at variant 0.
    pub fn key(&self) -> UsageKey {
        UsageKey {
            read_only: self.read_only,
            attachment_mode: self.attachment_mode,
            access_mode: self.access_mode,
            variant: 0,
        }
    }

    /// [`UsageKey::dir_name`] of its key (variant 0), e.g.
    /// `ro-block-device-multi-node-reader-only`.
    pub fn dir_name(&self) -> String {
        self.key().dir_name()
    }

    /// The capability for NodeStage/NodePublish: a mount with these options, or a block device.
    pub fn capability(&self) -> VolumeCapability {
        match self.attachment_mode {
            AttachmentMode::FileSystem => {
                VolumeCapability::mount(self.access_mode, self.mount_options.clone())
            }
            AttachmentMode::BlockDevice => VolumeCapability::block(self.access_mode),
        }
    }
}

impl From<&Usage> for UsageKey {
    fn from(u: &Usage) -> Self {
        u.key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(fs: &str, flags: &[&str]) -> MountOptions {
        MountOptions {
            fs_type: fs.into(),
            mount_flags: MountFlags::new(flags.iter().map(|f| f.to_string()).collect()),
            volume_mount_group: String::new(),
        }
    }

    #[test]
    fn dir_names_follow_the_layout() {
        let u = Usage {
            read_only: false,
            attachment_mode: AttachmentMode::FileSystem,
            access_mode: AccessMode::SingleNodeWriter,
            mount_options: opts("ext4", &["noatime"]),
        };
        assert_eq!(u.dir_name(), "rw-file-system-single-node-writer");
        let k = UsageKey {
            read_only: true,
            attachment_mode: AttachmentMode::BlockDevice,
            access_mode: AccessMode::MultiNodeReaderOnly,
            variant: 0,
        };
        assert_eq!(k.dir_name(), "ro-block-device-multi-node-reader-only");
        assert_eq!(k.to_string(), k.dir_name());
    }

    #[test]
    fn every_key_round_trips_and_names_are_distinct() {
        let mut names = std::collections::BTreeSet::new();
        for read_only in [false, true] {
            for attachment_mode in [AttachmentMode::FileSystem, AttachmentMode::BlockDevice] {
                for access_mode in AccessMode::ALL {
                    let k = UsageKey {
                        read_only,
                        attachment_mode,
                        access_mode,
                        variant: 0,
                    };
                    let name = k.dir_name();
                    berth_sys::validate_path_segment("usage", &name).unwrap();
                    assert_eq!(UsageKey::from_dir_name(&name), Ok(k));
                    assert_eq!(name.parse::<UsageKey>(), Ok(k));
                    assert!(names.insert(name));
                }
            }
        }
        assert_eq!(names.len(), 28);
        for bad in [
            "",
            "rw",
            "xx-file-system-single-node-writer",
            "rw-filesystem-single-node-writer",
            "rw-file-system-SINGLE_NODE_WRITER",
            "rw-file-system-single-node-writer-",
            "rw-block-device-",
        ] {
            assert!(UsageKey::from_dir_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn variants_add_a_suffix_and_round_trip() {
        let k = UsageKey {
            read_only: false,
            attachment_mode: AttachmentMode::FileSystem,
            access_mode: AccessMode::SingleNodeMultiWriter,
            variant: 0,
        };
        assert_eq!(k.dir_name(), "rw-file-system-single-node-multi-writer");
        assert_eq!(
            k.with_variant(2).dir_name(),
            "rw-file-system-single-node-multi-writer.2"
        );
        assert_eq!(k.with_variant(7).base(), k);
        for n in [1, 2, 9, 10, 100, 4242, u16::MAX] {
            let v = k.with_variant(n);
            let name = v.dir_name();
            berth_sys::validate_path_segment("usage", &name).unwrap();
            assert_eq!(UsageKey::from_dir_name(&name), Ok(v), "{name}");
            assert_eq!(name.parse::<UsageKey>(), Ok(v));
            assert_ne!(name, k.dir_name());
        }
        let base = k.dir_name();
        for suffix in [
            ".0",
            ".",
            ".01",
            ".007",
            ".+1",
            ".-1",
            ".1a",
            ".a",
            ". 1",
            ".1.2",
            "..1",
            ".65536",
            ".99999999999999999999",
            ".١",
        ] {
            let name = format!("{base}{suffix}");
            let e = UsageKey::from_dir_name(&name).expect_err(&name);
            assert!(e.to_string().contains("not a usage directory name"), "{e}");
        }
        // A variant on a name that is not a usage is still not a usage.
        assert!(UsageKey::from_dir_name("rw-file-system.1").is_err());
        assert!(UsageKey::from_dir_name(".1").is_err());
    }

    #[test]
    fn variant_zero_is_not_serialized_and_old_records_read_as_zero() {
        let k = UsageKey {
            read_only: true,
            attachment_mode: AttachmentMode::BlockDevice,
            access_mode: AccessMode::MultiNodeReaderOnly,
            variant: 0,
        };
        let json = serde_json::to_value(k).unwrap();
        assert!(json.get("variant").is_none(), "{json}");
        // A record written before variants existed.
        let old = serde_json::json!({
            "read_only": true,
            "attachment_mode": json["attachment_mode"],
            "access_mode": json["access_mode"],
        });
        assert_eq!(serde_json::from_value::<UsageKey>(old).unwrap(), k);
        let v = k.with_variant(3);
        let json = serde_json::to_value(v).unwrap();
        assert_eq!(json["variant"], 3);
        assert_eq!(serde_json::from_value::<UsageKey>(json).unwrap(), v);
    }

    #[test]
    fn merging_options() {
        let vol = MountOptions {
            volume_mount_group: "1000".into(),
            ..opts("ext4", &["noatime", "nodev"])
        };
        // Nothing requested: the volume's options.
        assert_eq!(merge_mount_options(&vol, &MountOptions::default()), vol);
        // fs_type overrides; flags stay.
        let m = merge_mount_options(&vol, &opts("xfs", &[]));
        assert_eq!(m.fs_type, "xfs");
        assert_eq!(m.mount_flags.expose(), ["noatime", "nodev"]);
        assert_eq!(m.volume_mount_group, "1000");
        // Flags replace, not append; fs_type stays.
        let m = merge_mount_options(&vol, &opts("", &["ro"]));
        assert_eq!(m.fs_type, "ext4");
        assert_eq!(m.mount_flags.expose(), ["ro"]);
        // Both.
        let m = merge_mount_options(&vol, &opts("btrfs", &["compress=zstd"]));
        assert_eq!(
            (m.fs_type.as_str(), m.mount_flags.expose()),
            ("btrfs", &["compress=zstd".to_string()][..])
        );
        // An empty volume takes the request as is.
        let req = opts("xfs", &["ro"]);
        assert_eq!(merge_mount_options(&MountOptions::default(), &req), req);
    }

    #[test]
    fn capability_follows_attachment() {
        let mut u = Usage {
            read_only: true,
            attachment_mode: AttachmentMode::FileSystem,
            access_mode: AccessMode::SingleNodeReaderOnly,
            mount_options: opts("ext4", &["ro"]),
        };
        let cap = u.capability();
        assert_eq!(cap.attachment_mode(), AttachmentMode::FileSystem);
        assert_eq!(cap.mount_flags(), ["ro"]);
        u.attachment_mode = AttachmentMode::BlockDevice;
        assert_eq!(
            u.capability(),
            VolumeCapability::block(AccessMode::SingleNodeReaderOnly)
        );
    }

    #[test]
    fn mount_flag_checks_never_show_flags() {
        let long = MountFlags::new(vec!["password=hunter2".repeat(300)]);
        let e = check_mount_flags(&long).unwrap_err();
        assert_eq!(e, MountFlagsError::TooLong { len: 4800 });
        assert!(!format!("{e} {e:?}").contains("hunter2"));
        let nul = MountFlags::new(vec!["ok".into(), "pass=hunter2\0".into()]);
        let e = check_mount_flags(&nul).unwrap_err();
        assert_eq!(e, MountFlagsError::Nul { index: 1 });
        assert!(!format!("{e} {e:?}").contains("hunter2"));
        // Exactly at the limit, commas counted.
        let at = MountFlags::new(vec!["a".repeat(2047), "b".repeat(2048)]);
        assert_eq!(check_mount_flags(&at), Ok(()));
        let over = MountFlags::new(vec!["a".repeat(2048), "b".repeat(2048)]);
        assert_eq!(
            check_mount_flags(&over),
            Err(MountFlagsError::TooLong { len: 4097 })
        );
    }
}
