//! Kubernetes device plugins (being written).
