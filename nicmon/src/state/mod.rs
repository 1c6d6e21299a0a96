//! What nicmon remembers between polls and across restarts within one boot (SPEC §1.6,
//! 001 §6.5–6.6): the checks' state ([`CheckState`], decide's input and output) and the
//! outbox (act's data), persisted together as one file.
//!
//! - `file.rs`: nicmon's own state file — load, atomic save, the write policy;
//! - `upstream_import.rs`: importing upstream NVSentinel's old (schema-v2) state file.
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::chardev::CharDevState;
use crate::counters::CounterState;
use crate::kmsg::KmsgState;
use crate::linkstate::LinkState;
use crate::outbox::Outbox;
use crate::pcie::check::PcieState;

pub mod file;
pub mod upstream_import;

pub use file::Loaded;

/// Version of the file format.
pub const VERSION: u32 = 1;

/// Default location in the DaemonSet (a hostPath directory).
pub const DEFAULT_PATH: &str = "/var/run/nic_health_monitor/state.json";

/// What the checks carry from one poll to the next: the decide layer's input and output.
/// The outbox (act's data) is not part of it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CheckState {
    /// Polls evaluated in this boot (0 = no usable previous state).
    #[serde(default)]
    pub polls: u64,
    /// Port records, known devices, cards below their peers (the state checks' memory).
    #[serde(flatten)]
    pub links: LinkState,
    /// Counter snapshots, breach and saturation flags (the counter check's state).
    #[serde(default)]
    pub counters: std::sync::Arc<CounterState>,
    /// Kernel log cursor and dedup memory.
    #[serde(default)]
    pub kmsg: std::sync::Arc<KmsgState>,
    /// Character-device miss counts, latches and the issm mode they were made under.
    #[serde(default)]
    pub char_devices: std::sync::Arc<CharDevState>,
    /// PCIe: cards reported downtrained, the AER totals' baselines and latches.
    /// Shared with the previous poll's state while a poll leaves it as it was (a targeted
    /// poll does not evaluate PCIe).
    #[serde(default, skip_serializing_if = "pcie_is_empty")]
    pub pcie: std::sync::Arc<PcieState>,
    /// sysfs files whose read failed with EINVAL in this boot: never read again.
    #[serde(default)]
    pub einval: BTreeSet<String>,
    /// The discovery scope the state checks' memory was made under (upstream's fingerprint
    /// `incl=<nicInclusionRegexOverride>;excl=<nicExclusionRegex>`). `None`: not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// First polls deferred in this run because devices were unreadable (in memory only, as
    /// upstream's: a deferred poll commits nothing, so a restart still owes the first poll).
    #[serde(skip)]
    pub first_poll_deferrals: u32,
    /// Every port's last transitions (kept across reboots, see [`crate::history`]).
    #[serde(default, skip_serializing_if = "crate::history::History::is_empty")]
    pub history: crate::history::History,
}

/// Everything persisted. Field names are the file's JSON keys; the flattened parts keep
/// the file's flat shape (`polls`, `port_states`, ..., `outbox`, `next_batch_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    pub boot_id: Option<String>,
    #[serde(flatten)]
    pub checks: CheckState,
    /// Batches not yet accepted by the connector (see [`crate::outbox`]).
    #[serde(flatten)]
    pub outbox: Outbox,
}

impl State {
    pub fn fresh(boot_id: Option<String>) -> State {
        State { version: VERSION, boot_id, checks: CheckState::default(), outbox: Outbox::default() }
    }
}

/// Whether the PCIe state holds nothing (the state file omits it).
fn pcie_is_empty(pcie: &std::sync::Arc<PcieState>) -> bool {
    pcie.is_empty()
}
