//! What `nicmon run` is told: its options, resolved from flags by `main.rs`.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::act::dispatch::{GrpcConfig, SinkSpec};
use crate::model::event::Check;
use crate::monitor::MonitorOptions;
use crate::read::wake::WakeOptions;

/// Everything `nicmon run` needs, resolved from flags.
pub struct RunOptions {
    /// What every polling command shares (host roots, config, metadata, checks, stamp).
    pub monitor: MonitorOptions,
    pub state_file: PathBuf,
    pub interval: Duration,
    pub sink: SinkSpec,
    pub grpc: GrpcConfig,
    /// `None` disables the HTTP endpoint.
    pub metrics_port: Option<u16>,
    /// `--metrics-bind-address`.
    pub metrics_bind_address: std::net::IpAddr,
    /// `None` disables the kernel log watcher.
    pub kmsg_path: Option<PathBuf>,
    pub wake: WakeOptions,
    /// Disable every wake source (polling only).
    pub no_wake: bool,
    /// Trace mode: print each wake-up and the poll it caused.
    pub trace: bool,
    /// `--poll-stall-deadline` (zero: no watchdog) and the strategy its events carry.
    pub poll_stall: PollStall,
}

/// The poll-stall watchdog's settings ([`crate::act::stall`]).
#[derive(Debug, Clone, Copy)]
pub struct PollStall {
    /// Zero disables the watchdog.
    pub deadline: Duration,
    pub store_only: bool,
}

/// Parse `--checks`: comma-separated names. Unknown names are returned, to be logged and
/// skipped (000 §12.1).
pub fn parse_checks(list: &str) -> (BTreeSet<Check>, Vec<String>) {
    let mut known = BTreeSet::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Check::parse(name) {
            Some(c) => {
                known.insert(c);
            }
            None => unknown.push(name.to_string()),
        }
    }
    (known, unknown)
}
