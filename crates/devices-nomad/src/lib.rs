//! Nomad device plugins (being written).
