//! The checks' state between polls: what each decider remembers (its own type), gathered
//! for the poll and the state file ([`crate::act::state::State`] adds the outbox).
use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::decide::chardev::CharDevState;
use crate::decide::counters::CounterState;
use crate::decide::firmware::FirmwareState;
use crate::decide::kmsg::KmsgState;
use crate::decide::linkstate::LinkState;
use crate::decide::optics::OpticsState;
use crate::decide::pcie::check::PcieState;
use crate::decide::thermal::ThermalState;

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
    /// NIC temperature: the NICs reported overheating.
    #[serde(default, skip_serializing_if = "ThermalState::is_empty")]
    pub thermal: ThermalState,
    /// Optics: the conditions raised, by port.
    #[serde(default, skip_serializing_if = "OpticsState::is_empty")]
    pub optics: OpticsState,
    /// Firmware health: the reporters' baselines, the faults raised, the last firmware fatal
    /// of each card (the dedup with the kernel log).
    #[serde(default, skip_serializing_if = "FirmwareState::is_empty")]
    pub firmware: FirmwareState,
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
    /// Every port's last transitions (kept across reboots, see [`crate::model::history`]).
    #[serde(default, skip_serializing_if = "crate::model::history::History::is_empty")]
    pub history: crate::model::history::History,
}

/// Whether the PCIe state holds nothing (the state file omits it).
fn pcie_is_empty(pcie: &std::sync::Arc<PcieState>) -> bool {
    pcie.is_empty()
}
