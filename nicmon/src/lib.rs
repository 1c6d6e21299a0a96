//! nicmon: a health monitor for the RDMA NICs of GPU nodes.
//!
//! Three layers, data flowing one way on every poll (STYLE.md):
//! - **read** — [`host`] (the only code that touches sysfs/procfs) and [`discovery`]
//!   turn the host into a [`model::Snapshot`];
//! - **decide** — pure functions of (previous state, snapshot, config, now);
//! - **act** — dispatch events, then persist state.
pub mod bundle;
pub mod chardev;
pub mod check;
pub mod config;
pub mod counters;
pub mod cycle;
pub mod daemon;
pub mod discovery;
pub mod dispatch;
pub mod ethtool;
pub mod event;
pub mod host;
pub mod kmsg;
pub mod linkstate;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod outbox;
pub mod parse;
pub mod paths;
pub mod report;
pub mod roles;
pub mod stall;
pub mod state;
pub mod state_v2;
pub mod topology;
pub mod upstream;
pub mod wake;
