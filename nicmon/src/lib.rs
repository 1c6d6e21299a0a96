//! nicmon: a health monitor for the RDMA NICs of GPU nodes.
//!
//! Three layers, data flowing one way on every poll (STYLE.md):
//! - **read** — [`host`] (the only code that touches sysfs/procfs) and [`discovery`]
//!   turn the host into a [`model::Snapshot`];
//! - **decide** — pure functions of (previous state, snapshot, config, now);
//! - **act** — dispatch events, then persist state.
pub mod event;
pub mod model;
pub mod wake;
