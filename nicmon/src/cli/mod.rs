//! The one-shot commands beside the daemon: `nicmon check` ([`check`], rendered by
//! [`report`]), support bundles ([`bundle`]) and the kernel-log safety self-test
//! ([`real_log`]).
pub mod bundle;
pub mod check;
pub mod real_log;
pub mod report;
