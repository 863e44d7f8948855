//! Claims: an allocation's right to use a volume, and the CSI access-mode rules that decide
//! which claims may coexist on one volume.
//!
//! Pure logic, no I/O. A [`ClaimSet`] holds the claims on one volume; [`ClaimSet::claim`] grants
//! a claim only if every rule below still holds afterwards, and a refused claim changes nothing.
//!
//! # Rules
//!
//! A claim names an access mode and an attachment mode; the pair must be one of the volume's
//! capabilities. All claims on a volume share one (access mode, attachment mode) pair: the first
//! claim picks it, and a claim asking for another pair waits until every other claim is released
//! (the modes below only make promises about claims in the same mode, and a volume must not be
//! a filesystem for one alloc and a raw block device for another). Within that mode, following
//! the `AccessMode` comments of CSI v1.12.0:
//!
//! | mode                        | nodes | claims | writers          | readers             |
//! |-----------------------------|-------|--------|------------------|---------------------|
//! | `single-node-writer`        | one   | any    | one              | any                 |
//! | `single-node-reader-only`   | one   | any    | none             | any                 |
//! | `multi-node-reader-only`    | many  | any    | none             | any                 |
//! | `multi-node-single-writer`  | many  | any    | one, on any node | any, on any node    |
//! | `multi-node-multi-writer`   | many  | any    | any              | any                 |
//! | `single-node-single-writer` | one   | one    | one              | one (the same one)  |
//! | `single-node-multi-writer`  | one   | any    | any              | any                 |
//!
//! Reading of the spec: it says `single-node-writer` and `single-node-reader-only` "can only be
//! published once" on a single node, and its NodePublishVolume table lets a plugin refuse a
//! second target path in those modes; it also says the newer `single-node-single-writer` and
//! `single-node-multi-writer` exist "to clarify the number of writers" on one node, i.e. the old
//! mode was ambiguous. berth reads the old modes as Kubernetes does (many pods of one node may
//! share a volume): one node, several allocs there, and for `single-node-writer` at most one of
//! them writing, as in Nomad (a plugin that enforces one publish will refuse the second alloc
//! at publish time). Nomad is stricter on readers: one reader for `single-node-reader-only`,
//! and `single-node-writer` readers only on an unclaimed volume. The new
//! `single-node-single-writer` is "published once as read/write at a single workload": one
//! alloc only, whether it reads or writes.
//!
//! "One node" means that a claim from a node is refused while another alloc holds a claim from
//! a different node. An alloc's claim stays on the node it was granted from: a claim by the same
//! alloc from another node is refused until the first one is released.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use berth_csi::model::{AccessMode, AttachmentMode};
use berth_sys::{InvalidId, validate_path_segment};
use serde::{Deserialize, Serialize};

/// Whether a claim reads or writes the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimMode {
    /// The alloc mounts the volume read-only.
    Read,
    /// The alloc mounts the volume read-write.
    Write,
}

impl ClaimMode {
    /// `"read"` or `"write"`, as in specs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
        }
    }
}

impl fmt::Display for ClaimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One allocation's right to use one volume, from one node. A plain record, persisted as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The claiming allocation. A path segment (see [`Claim::validate`]).
    pub alloc_id: String,
    /// The node the allocation runs on. A path segment (see [`Claim::validate`]).
    pub node_id: String,
    /// Read or write.
    pub mode: ClaimMode,
    /// The access mode the volume is used with; must be one of the volume's capabilities.
    pub access_mode: AccessMode,
    /// The attachment mode the volume is used with; must be one of the volume's capabilities.
    pub attachment_mode: AttachmentMode,
}

impl Claim {
    /// Checks the claim's ids: `alloc_id` and `node_id` must each be a valid path segment (they
    /// name directories on the node). The error's `kind` is the field name (`"alloc_id"` or
    /// `"node_id"`); `alloc_id` is checked first.
    pub fn validate(&self) -> Result<(), InvalidId> {
        validate_path_segment("alloc_id", &self.alloc_id)?;
        validate_path_segment("node_id", &self.node_id)
    }

    fn is_write(&self) -> bool {
        self.mode == ClaimMode::Write
    }
}

/// What [`ClaimSet::claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The alloc had no claim on the volume; it has one now.
    Granted,
    /// The alloc already held exactly this claim; nothing changed.
    Unchanged,
    /// The alloc held a different claim (say read, now write); it was replaced.
    Changed {
        /// The claim that was replaced.
        previous: Claim,
    },
}

/// Why a claim was refused. Each conflict names the volume's mode and the alloc (and node) in
/// the way; the volume id is the caller's to add.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// `alloc_id` or `node_id` is not a valid path segment; `kind` names the field.
    #[error(transparent)]
    Invalid(#[from] InvalidId),
    /// The volume does not offer the requested (access mode, attachment mode).
    #[error(
        "volume has no capability {access_mode}/{attachment_mode} (it offers {})",
        list_capabilities(.offered)
    )]
    UnsupportedCapability {
        /// Requested access mode.
        access_mode: AccessMode,
        /// Requested attachment mode.
        attachment_mode: AttachmentMode,
        /// The volume's capabilities.
        offered: Vec<(AccessMode, AttachmentMode)>,
    },
    /// A write claim in a reader-only mode.
    #[error("volume is {access_mode} and refuses writers")]
    ReadOnly {
        /// The reader-only mode.
        access_mode: AccessMode,
    },
    /// The alloc already holds a claim from another node.
    #[error(
        "alloc {alloc_id:?} already claims the volume from node {node_id:?}, not {requested_node:?}; release it first"
    )]
    AllocOnOtherNode {
        /// The claiming alloc.
        alloc_id: String,
        /// The node its existing claim is from.
        node_id: String,
        /// The node the new claim is from.
        requested_node: String,
    },
    /// Another alloc uses the volume with another access or attachment mode.
    #[error(
        "volume is in use as {access_mode}/{attachment_mode} by alloc {alloc_id:?}, so it cannot be claimed as {requested_access_mode}/{requested_attachment_mode}"
    )]
    ModeInUse {
        /// The access mode in use.
        access_mode: AccessMode,
        /// The attachment mode in use.
        attachment_mode: AttachmentMode,
        /// An alloc using it.
        alloc_id: String,
        /// Requested access mode.
        requested_access_mode: AccessMode,
        /// Requested attachment mode.
        requested_attachment_mode: AttachmentMode,
    },
    /// A single-node mode, and another alloc uses the volume from another node.
    #[error(
        "volume is {access_mode} and alloc {alloc_id:?} already uses it on node {node_id:?}, not {requested_node:?}"
    )]
    OtherNode {
        /// The single-node mode.
        access_mode: AccessMode,
        /// The alloc using the volume.
        alloc_id: String,
        /// The node it uses the volume from.
        node_id: String,
        /// The node the new claim is from.
        requested_node: String,
    },
    /// `single-node-single-writer`, and another alloc already claims the volume.
    #[error(
        "volume is {access_mode} (one workload at a time) and alloc {alloc_id:?} already claims it"
    )]
    SingleWorkload {
        /// The mode (`single-node-single-writer`).
        access_mode: AccessMode,
        /// The alloc holding the volume.
        alloc_id: String,
    },
    /// A one-writer mode, and another alloc already writes.
    #[error(
        "volume is {access_mode} and alloc {alloc_id:?} already writes to it from node {node_id:?}"
    )]
    WriterExists {
        /// The one-writer mode.
        access_mode: AccessMode,
        /// The writing alloc.
        alloc_id: String,
        /// The node it writes from.
        node_id: String,
    },
}

fn list_capabilities(caps: &[(AccessMode, AttachmentMode)]) -> String {
    if caps.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = caps.iter().map(|(a, b)| format!("{a}/{b}")).collect();
    names.join(", ")
}

/// At most one writer in this mode.
fn one_writer(mode: AccessMode) -> bool {
    matches!(
        mode,
        AccessMode::SingleNodeWriter | AccessMode::MultiNodeSingleWriter
    )
}

/// The claims on one volume, one per alloc.
///
/// Invariants, upheld by [`ClaimSet::claim`] (the only way in besides deserialization, which
/// checks ids and duplicates but cannot know the volume's capabilities): every claim satisfies
/// [`Claim::validate`], and the claims together obey the rules of the [module](self).
/// Iteration is in alloc-id order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Claim>", into = "Vec<Claim>")]
pub struct ClaimSet {
    claims: BTreeMap<String, Claim>,
}

/// Why a persisted list of claims cannot be a [`ClaimSet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimSetError {
    /// A claim has an invalid id.
    #[error(transparent)]
    Invalid(#[from] InvalidId),
    /// Two claims for one alloc.
    #[error("alloc {alloc_id:?} has more than one claim")]
    Duplicate {
        /// The alloc.
        alloc_id: String,
    },
}

impl TryFrom<Vec<Claim>> for ClaimSet {
    type Error = ClaimSetError;
    fn try_from(list: Vec<Claim>) -> Result<Self, ClaimSetError> {
        let mut claims = BTreeMap::new();
        for claim in list {
            claim.validate()?;
            if claims.contains_key(&claim.alloc_id) {
                return Err(ClaimSetError::Duplicate {
                    alloc_id: claim.alloc_id,
                });
            }
            claims.insert(claim.alloc_id.clone(), claim);
        }
        Ok(Self { claims })
    }
}

impl From<ClaimSet> for Vec<Claim> {
    fn from(set: ClaimSet) -> Self {
        set.claims.into_values().collect()
    }
}

/// What a granted claim does to the set.
enum Decision {
    Unchanged,
    Insert,
}

impl ClaimSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says whether [`ClaimSet::claim`] would grant `new` (`Ok`) or refuse it, with the same
    /// error, without changing anything.
    pub fn check(
        &self,
        volume_capabilities: &[(AccessMode, AttachmentMode)],
        new: &Claim,
    ) -> Result<(), ClaimError> {
        self.decide(volume_capabilities, new).map(|_| ())
    }

    /// Grants `new` if the rules allow it, replacing the alloc's previous claim if it had one.
    ///
    /// Idempotent: a claim identical to the one the alloc holds is `Ok(Unchanged)`, whatever the
    /// capabilities are now (it was checked when it was granted). Any other claim by an alloc
    /// that already holds one (read to write, another mode) is checked as if the alloc's own
    /// claim were absent, then replaces it. On error the set is unchanged.
    pub fn claim(
        &mut self,
        volume_capabilities: &[(AccessMode, AttachmentMode)],
        new: Claim,
    ) -> Result<ClaimOutcome, ClaimError> {
        match self.decide(volume_capabilities, &new)? {
            Decision::Unchanged => Ok(ClaimOutcome::Unchanged),
            Decision::Insert => Ok(match self.claims.insert(new.alloc_id.clone(), new) {
                None => ClaimOutcome::Granted,
                Some(previous) => ClaimOutcome::Changed { previous },
            }),
        }
    }

    /// Removes and returns the alloc's claim; `None` (and no change) if it had none.
    pub fn release(&mut self, alloc_id: &str) -> Option<Claim> {
        self.claims.remove(alloc_id)
    }

    fn decide(
        &self,
        caps: &[(AccessMode, AttachmentMode)],
        new: &Claim,
    ) -> Result<Decision, ClaimError> {
        new.validate()?;
        let own = self.claims.get(&new.alloc_id);
        if own == Some(new) {
            return Ok(Decision::Unchanged);
        }
        let mode = new.access_mode;
        if !caps.contains(&(mode, new.attachment_mode)) {
            return Err(ClaimError::UnsupportedCapability {
                access_mode: mode,
                attachment_mode: new.attachment_mode,
                offered: caps.to_vec(),
            });
        }
        if new.is_write() && mode.is_read_only() {
            return Err(ClaimError::ReadOnly { access_mode: mode });
        }
        if let Some(own) = own
            && own.node_id != new.node_id
        {
            return Err(ClaimError::AllocOnOtherNode {
                alloc_id: own.alloc_id.clone(),
                node_id: own.node_id.clone(),
                requested_node: new.node_id.clone(),
            });
        }
        let mut others = self.claims.values().filter(|c| c.alloc_id != new.alloc_id);
        // All other claims share one mode, so the first one tells it.
        if let Some(c) = others.clone().next()
            && (c.access_mode, c.attachment_mode) != (mode, new.attachment_mode)
        {
            return Err(ClaimError::ModeInUse {
                access_mode: c.access_mode,
                attachment_mode: c.attachment_mode,
                alloc_id: c.alloc_id.clone(),
                requested_access_mode: mode,
                requested_attachment_mode: new.attachment_mode,
            });
        }
        if mode.is_single_node()
            && let Some(c) = others.clone().find(|c| c.node_id != new.node_id)
        {
            return Err(ClaimError::OtherNode {
                access_mode: mode,
                alloc_id: c.alloc_id.clone(),
                node_id: c.node_id.clone(),
                requested_node: new.node_id.clone(),
            });
        }
        if mode == AccessMode::SingleNodeSingleWriter
            && let Some(c) = others.next()
        {
            return Err(ClaimError::SingleWorkload {
                access_mode: mode,
                alloc_id: c.alloc_id.clone(),
            });
        }
        if new.is_write()
            && one_writer(mode)
            && let Some(c) = self
                .claims
                .values()
                .find(|c| c.alloc_id != new.alloc_id && c.is_write())
        {
            return Err(ClaimError::WriterExists {
                access_mode: mode,
                alloc_id: c.alloc_id.clone(),
                node_id: c.node_id.clone(),
            });
        }
        Ok(Decision::Insert)
    }

    /// The alloc's claim, if any.
    pub fn get(&self, alloc_id: &str) -> Option<&Claim> {
        self.claims.get(alloc_id)
    }

    /// Every claim, in alloc-id order.
    pub fn iter(&self) -> impl Iterator<Item = &Claim> {
        self.claims.values()
    }

    /// How many allocs hold a claim.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// True when no alloc holds a claim (the volume is free).
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// The write claims, in alloc-id order.
    pub fn writers(&self) -> impl Iterator<Item = &Claim> {
        self.iter().filter(|c| c.mode == ClaimMode::Write)
    }

    /// The read claims, in alloc-id order.
    pub fn readers(&self) -> impl Iterator<Item = &Claim> {
        self.iter().filter(|c| c.mode == ClaimMode::Read)
    }

    /// The nodes the volume is claimed from.
    pub fn nodes(&self) -> BTreeSet<&str> {
        self.iter().map(|c| c.node_id.as_str()).collect()
    }

    /// The claims from `node_id`, in alloc-id order.
    pub fn on_node<'a>(&'a self, node_id: &'a str) -> impl Iterator<Item = &'a Claim> + 'a {
        self.iter().filter(move |c| c.node_id == node_id)
    }

    /// The claims grouped by node, each group in alloc-id order.
    pub fn by_node(&self) -> BTreeMap<&str, Vec<&Claim>> {
        let mut out: BTreeMap<&str, Vec<&Claim>> = BTreeMap::new();
        for c in self.iter() {
            out.entry(c.node_id.as_str()).or_default().push(c);
        }
        out
    }

    /// The (access mode, attachment mode) every claim uses; `None` when the set is empty.
    pub fn mode_in_use(&self) -> Option<(AccessMode, AttachmentMode)> {
        self.iter()
            .next()
            .map(|c| (c.access_mode, c.attachment_mode))
    }
}

#[cfg(test)]
mod tests;
