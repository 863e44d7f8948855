//! The berth agent: a persisted registry of CSI plugins, fed by the config, a kubelet-style
//! registration directory and the API; one health loop per plugin instance; device plugins
//! and the device manager; jobs; workload identities and the Consul tokens derived from them;
//! and the view the HTTP API serves.

pub mod acl;
pub mod agent;
pub mod alloc_events;
pub mod config;
pub mod consul;
pub mod devices;
pub mod event_log;
pub mod events;
pub mod fleet_claims;
pub mod fleet_jobs;
pub mod identity;
pub mod jobs;
pub mod manager;
pub mod metrics;
mod node_attrs;
pub mod plugin_tasks;
pub mod registry;
pub mod supervisor;
pub mod volumes;
pub mod watch;

pub use berth_sys::now_ms;

pub use agent::{Agent, AgentError, AgentOptions, Running};
