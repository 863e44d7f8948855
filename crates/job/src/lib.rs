//! Job specs: what `berth job run` reads.
