//! The control plane: volume catalog and claims.

pub mod claims;

pub use claims::{Claim, ClaimError, ClaimMode, ClaimOutcome, ClaimSet, ClaimSetError};
