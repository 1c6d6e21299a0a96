//! The `NICPCIeCheck` of one poll (SPEC §1.10): the monitored PFs' readings through the
//! link-training and AER deciders, their findings filed under the check. Pure.
//!
//! A reboot gives no per-NIC healthy PCIe events: the reboot's clear (one entity-less
//! healthy event per enabled check) already clears every PCIe condition of the last boot,
//! and a link or AER total seen first afterwards is only a baseline.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::aer::{self, AerPort, AerState, AerThresholds};
use super::link::{self, CardLink, LinkState};
use crate::decide::roles::Classification;
use crate::model::event::{Check, HealthEvent, Stamp};
use crate::model::pcie::parse::AerSeverity;
use crate::model::{Device, Snapshot};

/// What the PCIe check carries from one poll to the next (persisted in the state file).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PcieState {
    /// Cards reported downtrained.
    #[serde(default)]
    pub link: LinkState,
    /// The AER totals' counter-engine state (baselines, windows, latches).
    #[serde(default)]
    pub aer: AerState,
}

impl PcieState {
    /// Whether nothing is held (the state file omits an empty one).
    pub fn is_empty(&self) -> bool {
        *self == PcieState::default()
    }
}

/// One poll's PCIe outcome.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub events: Vec<HealthEvent>,
    pub state: PcieState,
    /// Lines for the log, each said once (AER not available).
    pub notes: Vec<String>,
}

/// The PFs the check judges: monitored, with a PCIe reading, in name order (a card's
/// events name its first monitored PF).
fn judged<'s>(snapshot: &'s Snapshot, roles: &BTreeMap<String, Classification>) -> Vec<&'s Device> {
    let mut out: Vec<&Device> = snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && d.pcie.is_some() && roles.get(&d.name).is_some_and(|c| c.monitored))
        .map(|d| &**d)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Judge the PCIe state of every monitored PF this poll.
pub fn evaluate(
    prev: &PcieState,
    snapshot: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    thresholds: &AerThresholds,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> Outcome {
    let pfs = judged(snapshot, roles);
    let cards: Vec<CardLink<'_>> = pfs
        .iter()
        .filter_map(|d| {
            Some(CardLink {
                card: d.card.as_deref()?,
                nic: &d.name,
                role: roles.get(&d.name).and_then(|c| c.role),
                model: d.hca_type.as_deref(),
                reading: d.pcie.as_ref()?,
            })
        })
        .collect();
    let (link_findings, link) = link::evaluate(&prev.link, &cards, false);
    let ports: Vec<AerPort<'_>> = pfs
        .iter()
        .filter_map(|d| Some(AerPort { nic: &d.name, address: d.pci_address.as_deref(), aer: &d.pcie.as_ref()?.aer }))
        .collect();
    let aer_out = aer::evaluate(&prev.aer, &ports, thresholds, now, false);
    let events =
        link_findings.iter().chain(&aer_out.findings).map(|f| f.event(Check::NICPCIeCheck, stamp, now)).collect();
    Outcome { events, state: PcieState { link, aer: aer_out.state }, notes: aer_out.notes }
}

/// One judged PF's figures for the metrics: device, link speed (GT/s), width (lanes), AER
/// totals by severity (`correctable`, `nonfatal`, `fatal`; `None`: unknown).
pub type Figures<'a> = (&'a str, Option<f64>, Option<u8>, [(&'static str, Option<u64>); 3]);

/// The metrics' figures of every judged PF.
pub fn figures<'s>(snapshot: &'s Snapshot, roles: &BTreeMap<String, Classification>) -> Vec<Figures<'s>> {
    judged(snapshot, roles)
        .into_iter()
        .filter_map(|d| {
            let r = d.pcie.as_ref()?;
            let total = |s: AerSeverity| r.aer.get(s).map(|c| c.total);
            let aer = [
                ("correctable", total(AerSeverity::Correctable)),
                ("nonfatal", total(AerSeverity::NonFatal)),
                ("fatal", total(AerSeverity::Fatal)),
            ];
            Some((d.name.as_str(), r.link.speed.map(|s| f64::from(s.mts()) / 1000.0), r.link.width, aer))
        })
        .collect()
}
