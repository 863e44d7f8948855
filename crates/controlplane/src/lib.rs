//! The control plane: the volume catalog, claims under the CSI access-mode rules, and
//! controller RPCs routed to a healthy controller plugin (DESIGN.md component 6).
//!
//! [`Plane`] keeps the catalog in the agent's store (one node) or in etcd (a fleet, through a
//! [`backend::CatalogBackend`]); nodes reach it through the [`ControlPlane`] trait.

pub mod backend;
pub mod catalog;
pub mod claims;
pub mod placement;
mod plane;
pub mod rpc;

pub use catalog::{
    ClaimRecord, ClaimState, Origin, Publication, PublicationState, StoredCapability,
    StoredSecrets, VolumeRecord,
};
pub use claims::{Claim, ClaimError, ClaimMode, ClaimOutcome, ClaimSet, ClaimSetError};
pub use plane::{
    ControlPlane, ControlPlaneError, ControllerAccess, ControllerHandle, Controllers, Grant, Hook,
    NodeClaim, Plane,
};
pub use rpc::ControllerRpc;
