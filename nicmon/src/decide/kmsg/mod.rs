//! The kernel log watcher (SPEC §1.5; `reference/kernel-log-patterns.md`).
//!
//! - [`record`] — parse `/dev/kmsg` records and plain text lines (pure);
//! - [`pattern`] — the built-in pattern table and its `[kernelLog]` configuration;
//! - [`attribution`] — which monitored NIC (card) a line is about;
//! - [`matcher`] — [`process`]: (state, records, index, patterns, now) → (events, next
//!   state, wake hints), with the soft lockup rule, per-card dedup and the resume cursor;
//! - [`reader`] — the thin imperative part: a tail thread on `/dev/kmsg`, a FIFO or a
//!   followed regular file, and `--kmsg FILE`;
//! - [`real_log`] — the only writer into the real `/dev/kmsg`: self-test lines that no
//!   kernel-log monitor can mistake for a fault.
pub mod attribution;
pub mod matcher;
pub mod pattern;

pub use attribution::{DeviceIndex, IndexEntry, Resolution, Target};
pub use matcher::{DedupEntry, KmsgState, PendingLockup, Processed, WakeHint, process};
pub use pattern::{ConfigError, KmsgConfig, Outcome, Pattern, PatternConfig, Patterns, Scope};

#[cfg(test)]
mod tests;
