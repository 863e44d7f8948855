//! The control plane: volume catalog and claims.
