//! nicmon: a health monitor for the RDMA NICs of GPU nodes.
//!
//! Three layers, data flowing one way on every poll (STYLE.md), and the rooms of each:
//! - **read** — `host/` (the only code touching sysfs/procfs: reader pool and deadlines, kept
//!   files), `discovery.rs` → `model.rs` (the snapshot), `topology.rs`, `kmsg/reader.rs`,
//!   `wake/` (eBPF ring-buffer records, rtnetlink: the wake-ups);
//! - **decide** (pure) — `cycle.rs` (one poll), `roles.rs`, `linkstate/` (`health.rs`: where a
//!   DOWN port is decided fatal), `counters/` (`defaults.rs`: each counter's default threshold,
//!   `symbol_error`'s too), `chardev.rs`, `kmsg/` (pattern matching, attribution);
//! - **act** — `outbox.rs` (what is owed, its bound, the commit rule), `courier.rs` (sends in
//!   order; where an event leaves the outbox after delivery), `dispatch/` (the sinks), `state/`
//!   (`file.rs`: nicmon's state file; `upstream_import.rs`: upstream's old state file),
//!   `metrics/` (`observe.rs`), `daemon/` (the loop; `wakeup.rs`: where a wake-up becomes a
//!   poll), `check.rs`, `bundle/`;
//! - **edges** — `main.rs` (the commands), `config.rs`, `upstream.rs` (where upstream's flags
//!   are read).
pub mod bundle;
pub mod chardev;
pub mod check;
pub mod config;
pub mod counters;
pub mod courier;
pub mod cycle;
pub mod daemon;
pub mod discovery;
pub mod dispatch;
pub mod ethtool;
pub mod event;
pub mod history;
pub mod host;
pub mod kmsg;
pub mod linkstate;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod outbox;
pub mod parse;
pub mod paths;
pub mod pcie;
pub mod report;
pub mod roles;
pub mod sched;
pub mod stall;
pub mod state;
pub mod topology;
pub mod upstream;
pub mod wake;
