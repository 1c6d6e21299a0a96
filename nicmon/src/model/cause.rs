//! The probable cause of an unhealthy event: which part of the path from the NIC to the
//! switch most likely failed (SPEC §1.13), and the one line of evidence it rests on.
//!
//! Decided by [`crate::decide::cause`] from the facts of the same poll; carried on the event
//! as `metadata.probableCause` and `metadata.evidence`, and at the end of its message.
use std::collections::BTreeMap;

/// Which part failed. `Unknown` when no fact decides: never a guess.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cause {
    /// The NIC itself (its hardware, not its firmware).
    Nic,
    /// The NIC's firmware: a firmware fatal seen by devlink or the kernel log.
    NicFirmware,
    /// The NIC ran at or over its critical temperature.
    NicThermal,
    /// The transceiver: Tx fault, CMIS module fault, module temperature alarm.
    Optic,
    /// The fibre or copper, or the switch port at its other end: light lost or too weak on
    /// the receive side while this end transmits.
    CableOrFarEnd,
    /// The PCIe link to the NIC: AER errors, a downtrained link, config space of all ones.
    Pcie,
    /// The driver: the PCI function is there, the RDMA device is not (or failed to load).
    Driver,
    Unknown,
}

impl Cause {
    /// Every cause, in the order the metrics and the guide list them.
    pub const ALL: [Cause; 8] = [
        Cause::Nic,
        Cause::NicFirmware,
        Cause::NicThermal,
        Cause::Optic,
        Cause::CableOrFarEnd,
        Cause::Pcie,
        Cause::Driver,
        Cause::Unknown,
    ];

    /// As `metadata.probableCause` and the metrics' `probable_cause` label spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::Nic => "nic",
            Cause::NicFirmware => "nic-firmware",
            Cause::NicThermal => "nic-thermal",
            Cause::Optic => "optic",
            Cause::CableOrFarEnd => "cable-or-far-end",
            Cause::Pcie => "pcie",
            Cause::Driver => "driver",
            Cause::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Cause> {
        Cause::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// A cause and the one line of evidence it rests on (empty for `Unknown`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub cause: Cause,
    pub evidence: String,
}

/// `metadata` keys of an unhealthy event.
pub const CAUSE_KEY: &str = "probableCause";
pub const EVIDENCE_KEY: &str = "evidence";

/// What one poll knows about the parts behind each NIC: per device (PCI function), per
/// port (its module), and which devices share a card. Built by the decide layer from the
/// snapshot, the checks' state and this poll's events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub devices: BTreeMap<String, DeviceFacts>,
    pub ports: BTreeMap<(String, u32), ModuleFacts>,
    /// `dddd:bb:dd` → the devices of that card.
    pub cards: BTreeMap<String, Vec<String>>,
}

/// What is known about one device's firmware, PCIe link, driver and temperature: each the
/// evidence when the fact holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    pub firmware_fatal: Option<String>,
    pub pcie: Option<String>,
    pub driver: Option<String>,
    /// A sensor at or over its critical temperature.
    pub thermal: Option<String>,
}

/// What one port's transceiver says, lanes numbered from 1 (an empty list: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModuleFacts {
    /// Lanes the module has (for "on 4 of 4 lanes").
    pub lanes: usize,
    pub tx_fault: Vec<usize>,
    pub tx_los: Vec<usize>,
    pub rx_los: Vec<usize>,
    /// Lanes whose receive power is below the module's low alarm / low warning threshold.
    pub rx_below_low_alarm: Vec<usize>,
    pub rx_below_low_warning: Vec<usize>,
    /// CMIS module state Fault (with its fault cause when the module gives one).
    pub module_fault: Option<String>,
    /// Module temperature over its high alarm threshold.
    pub temperature_alarm: Option<String>,
}

impl ModuleFacts {
    /// Its own transmit side is fine: no Tx fault, no Tx LOS.
    pub fn tx_fine(&self) -> bool {
        self.tx_fault.is_empty() && self.tx_los.is_empty()
    }
}

/// Lanes as people read them: `lane 3`, `lanes 1–2`, `lanes 1, 3–4`.
pub fn lanes_text(lanes: &[usize]) -> String {
    let mut sorted = lanes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for l in sorted.iter().copied() {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == l => *end = l,
            _ => runs.push((l, l)),
        }
    }
    let parts: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}\u{2013}{b}") }).collect();
    let word = if sorted.len() == 1 { "lane" } else { "lanes" };
    format!("{word} {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_read_as_runs() {
        assert_eq!(lanes_text(&[3]), "lane 3");
        assert_eq!(lanes_text(&[2, 1]), "lanes 1\u{2013}2");
        assert_eq!(lanes_text(&[1, 3, 4, 4]), "lanes 1, 3\u{2013}4");
        assert_eq!(lanes_text(&[1, 2, 3, 4, 5, 6, 7, 8]), "lanes 1\u{2013}8");
    }

    #[test]
    fn every_cause_parses_back() {
        for c in Cause::ALL {
            assert_eq!(Cause::parse(c.as_str()), Some(c));
        }
        assert_eq!(Cause::parse("switch"), None);
    }
}
