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
//! The same volume may be used at once with different mount options for the same (read-only?,
//! attachment, access mode): each distinct set of options gets its own record, staging and
//! targets, told apart by the usage's *variant* number ([`berth_volume::UsageKey::variant`]):
//! variant 0 is named as DESIGN.md's layout says, variant `n > 0` adds `.n` to the usage's
//! directory name. Mount options never appear in a path.
//!
//! Secrets are never persisted: every call takes the secrets it needs. A stage or publish that
//! is driven again uses the secrets of whoever drives it: [`VolumeManager::mount`] its
//! request's, [`VolumeManager::reconcile`] what its closure returns for the volume id (the
//! agent's catalog holds them). Mount flags are persisted (a usage must be staged again with
//! the same flags) but never printed: not in `Debug`, errors or logs.
//!
//! A [`StepHook`] set with [`VolumeManager::with_hook`] is called before and after every
//! node RPC of the state machine, for crash tests.

mod error;
mod hook;
mod manager;
mod record;

pub use error::VolumeError;
pub use hook::{ParseStepError, Phase, Step, StepHook, StepRpc};
pub use manager::{
    CO_DIR_MODE, MountRequest, MountTable, ProcMountTable, ReconcileAction, ReconcileReport,
    VolumeManager, volume_records,
};
pub use record::{
    PublishState, StageState, StoredMountOptions, UsageRecord, record_key, staging_dir_name,
};
