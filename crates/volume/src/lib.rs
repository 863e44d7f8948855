//! Volume specs and usages.
