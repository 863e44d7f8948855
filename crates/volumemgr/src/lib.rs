//! The node volume manager of one CSI node plugin: stages and publishes volumes for allocs, one
//! persisted state machine per (volume, usage) (DESIGN.md component 5).
//!
//! Each usage has one [`UsageRecord`] in the store ([`Table::USAGES`](berth_state::Table)),
//! written before every RPC (the intent) and after it (the result), so a crash at any point
//! leaves a record that [`VolumeManager::reconcile`] (or the next call) drives to its end.
//! Records are plain values keyed by `<plugin id>/<volume id>/<usage>`; the allocs that use a
//! usage are a map inside its record, so "is anyone still using this staging?" is always
//! answered from what was persisted (rules 1 and 3).
//!
//! Secrets are never persisted: every call takes the secrets it needs. A stage or publish that
//! is driven again after a restart uses the secrets of the call that drives it
//! ([`VolumeManager::reconcile`] has none and sends empty secrets; a later
//! [`VolumeManager::mount`] re-drives with its own). Mount flags are persisted (a usage must be
//! staged again with the same flags) but never printed: not in `Debug`, errors or logs.

mod error;
mod manager;
mod record;

pub use error::VolumeError;
pub use manager::{
    MountRequest, MountTable, ProcMountTable, ReconcileAction, ReconcileReport, VolumeManager,
};
pub use record::{PublishState, StageState, StoredMountOptions, UsageRecord, record_key};
