//! The Container Device Interface: devices named `vendor.com/class=name`, described by CDI
//! spec files, resolved into what a task gets.

mod name;

pub use name::{CdiNameError, QualifiedName};
