//! berth's fleet control plane on etcd (DESIGN.md component 6): node registration under
//! leases ([`Membership`]), and the volume catalog with its claims as etcd keys changed only
//! by `mod_revision` transactions ([`EtcdCatalog`], a backend of the one set of claim rules in
//! `berth-controlplane`), and controller RPCs routed to the node that runs the controller
//! ([`Router`]). Reads come from watched mirrors ([`WatchedDir`]), never from polling.

pub mod cache;
pub mod catalog;
pub mod compaction;
pub mod etcd;
pub mod gc;
pub mod leader;
pub mod nodes;
pub mod routing;
pub mod scheduling;
pub mod settings;

pub use cache::WatchedDir;
pub use catalog::EtcdCatalog;
pub use compaction::Compactor;
pub use etcd::{Etcd, Fence, FleetError, Outcome, Write};
pub use leader::{Election, LeaderRecord};
pub use nodes::{Membership, Snapshot};
pub use routing::{Router, RouterStats};
pub use scheduling::{AllocReport, Fleet, LeaderSettings, PlacementReport};
pub use settings::{EtcdSettings, TlsFiles};
