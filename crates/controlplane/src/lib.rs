//! The control plane: the volume catalog, claims under the CSI access-mode rules, and
//! controller RPCs routed to a healthy controller plugin (DESIGN.md component 6).
//!
//! [`Embedded`] keeps the catalog in the agent's store; nodes reach it through the
//! [`ControlPlane`] trait (in-process now, over the network later).

pub mod catalog;
pub mod claims;
mod embedded;
pub mod placement;

pub use catalog::{
    ClaimRecord, ClaimState, Origin, Publication, PublicationState, StoredCapability,
    StoredSecrets, VolumeRecord,
};
pub use claims::{Claim, ClaimError, ClaimMode, ClaimOutcome, ClaimSet, ClaimSetError};
pub use embedded::{
    ControlPlane, ControlPlaneError, ControllerAccess, ControllerHandle, Controllers, Embedded,
    Grant, Hook, NodeClaim,
};
