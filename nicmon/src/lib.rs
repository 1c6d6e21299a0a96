//! nicmon: a health monitor for the RDMA NICs of GPU nodes.
//!
//! Three layers, data flowing one way on every poll, each in its own folder; every import
//! points down (or sideways within a layer), never back up:
//! - [`model`] — plain data, no I/O: the node's snapshot (`model/mod.rs`), health events
//!   (`event.rs`), the port history (`history.rs`), ethtool, PCIe and kernel-log records;
//! - [`read`] — the host into snapshots: `host/` (the only code touching sysfs/procfs: reader
//!   pool and deadlines, kept files), `discovery/` (one poll's read), `topology.rs`,
//!   `ethtool/`, `pcie.rs`, `kmsg.rs` (the kernel-log tail), `wake/` (eBPF ring-buffer
//!   records, rtnetlink: the wake-ups), `observe.rs` (one observation of the node);
//! - [`decide`] (pure) — `poll.rs` (one poll's decision: observation + state → events +
//!   state), `roles.rs`, `linkstate/` (`health.rs`: where a DOWN port is decided fatal),
//!   `counters/` (`defaults.rs`: every counter's default threshold), `phy.rs` (the RoCE
//!   physical layer's thresholds), `pcie/`, `chardev.rs`, `kmsg/` (pattern matching,
//!   attribution), `state.rs` (the checks' state), `settings.rs` (what the checks are told);
//! - [`act`] — `outbox.rs` (what is owed, its bound, the commit rule), `courier.rs` (sends in
//!   order; where an event leaves the outbox after delivery), `dispatch/` (the sinks),
//!   `state/` (`file.rs`: nicmon's state file; `upstream_import.rs`: upstream's old state
//!   file), `metrics/`, `stall.rs`, `logging.rs`.
//!
//! Above them: [`config`] (the config file into [`decide::settings::Config`]; upstream's
//! flags), [`monitor`] (a poll = read's observation composed with decide's step), [`daemon`]
//! (the loop; `wakeup.rs`: where a wake-up becomes a poll), [`cli`] (`nicmon check`, its
//! report, support bundles) and `main.rs` (the commands). `docs/design.md` has the map.
pub mod act;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod decide;
pub mod model;
pub mod monitor;
pub mod read;
