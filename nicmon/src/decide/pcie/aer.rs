//! AER statistics (SPEC §1.10) judged by the counter engine ([`crate::decide::counters::evaluate`]):
//! deltas, velocity windows, latching until a reset, reset on reboot, snapshots persisted.
//!
//! Each PF's three `TOTAL_ERR_*` values are counters of a rule declared here (name =
//! error code, path = the file): `aer_fatal` delta > 0 → fatal (`REPLACE_VM`, as the
//! kernel-log `pcie_fatal` row), `aer_nonfatal` delta > 0 → non-fatal, `aer_correctable`
//! velocity > `[pcieCheck] correctableThreshold` per `correctableVelocityUnit` → non-fatal.
//! The engine's *state* is the decision (a breach latched this poll, a latch released by a
//! reset, a first sight after a reboot); the findings are worded here, filed under the PCIe
//! check and naming the NIC and the error bits that moved (`BadTLP +3`): the bits at the
//! start of each rule's window are kept beside the engine's snapshot.
//! A PF with none of the three files (a kernel without AER, firmware-first error handling)
//! has no AER part: said once, no events, no errors.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{Finding, Health};
use crate::decide::counters::{self, CounterPort, CounterRule, CounterState, Layers, ThresholdType, VelocityUnit};
use crate::model::event::Stamp;
use crate::model::pcie::parse::{AerCounts, AerSeverity, moved_text};
use crate::model::pcie::reading::Aer;

/// The `[pcieCheck]` settings the AER rules take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AerThresholds {
    /// Correctable errors per `correctable_unit` above which the link is reported.
    pub correctable: f64,
    pub correctable_unit: VelocityUnit,
}

impl Default for AerThresholds {
    /// 60 per minute: a healthy link shows at most a handful a day.
    fn default() -> AerThresholds {
        AerThresholds { correctable: 60.0, correctable_unit: VelocityUnit::Minute }
    }
}

/// The counter rules of the three AER totals.
pub fn rules(t: &AerThresholds) -> Vec<CounterRule> {
    AerSeverity::ALL
        .into_iter()
        .map(|s| {
            let (threshold_type, threshold, velocity_unit) = match s {
                AerSeverity::Correctable => (ThresholdType::Velocity, t.correctable, Some(t.correctable_unit)),
                AerSeverity::NonFatal | AerSeverity::Fatal => (ThresholdType::Delta, 0.0, None),
            };
            CounterRule {
                name: s.error_code().to_string(),
                path: s.file().to_string(),
                enabled: true,
                is_fatal: s == AerSeverity::Fatal,
                threshold_type,
                threshold,
                velocity_unit,
                description: String::new(),
                layers: Layers::default(),
                measure: crate::decide::counters::rule::Measure::Count,
                error_code: None,
                threshold_set: false,
                drivers: Default::default(),
                alias: None,
            }
        })
        .collect()
}

/// One monitored PF's AER statistics.
#[derive(Debug, Clone, Copy)]
pub struct AerPort<'a> {
    pub nic: &'a str,
    /// Its PCI address, for the message.
    pub address: Option<&'a str>,
    pub aer: &'a Aer,
}

/// An AER file's bits as read ([`AerCounts::bits`]).
pub type Bits = Arc<[(String, u64)]>;

/// What the AER decision carries between polls (persisted).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AerState {
    /// The engine's state; keys `<nic>:0:<error code>`.
    #[serde(default)]
    pub counters: CounterState,
    /// The error bits at the start of each key's current window (what "moved" is measured
    /// from); shared with the previous poll's state until a window starts (no copy per poll).
    #[serde(default)]
    pub window_bits: Arc<BTreeMap<String, Bits>>,
    /// NICs said to have no AER statistics (said once; forgotten when they have them again).
    #[serde(default)]
    pub unavailable: BTreeSet<String>,
}

/// One poll's AER outcome.
#[derive(Debug, Clone, Default)]
pub struct AerOutcome {
    pub findings: Vec<Finding>,
    pub state: AerState,
    /// Lines for the log (AER not available on a NIC), each said once.
    pub notes: Vec<String>,
}

/// The totals of a PF keyed by rule path (`aer_dev_fatal` → 1); a file not read is absent.
fn totals(aer: &Aer) -> BTreeMap<Arc<str>, u64> {
    aer.totals().map(|(s, total)| (s.file().into(), total)).collect()
}

/// Judge one poll's AER statistics. `reboot`: the state was cleared by a boot-ID change —
/// every total seen first gets a healthy baseline (as counters do).
pub fn evaluate(
    prev: &AerState,
    ports: &[AerPort<'_>],
    thresholds: &AerThresholds,
    now: OffsetDateTime,
    reboot: bool,
) -> AerOutcome {
    let rules = rules(thresholds);
    let readings: Vec<BTreeMap<Arc<str>, u64>> = ports.iter().map(|p| totals(p.aer)).collect();
    let engine_ports: Vec<CounterPort<'_>> = ports
        .iter()
        .zip(&readings)
        .map(|(p, counters)| CounterPort {
            device: p.nic,
            port: 0,
            link_layer: None,
            driver: None,
            counters,
            rate_bps: None,
            ber_threshold: None,
            ethtool_age: Default::default(),
        })
        .collect();
    // The engine's own events are not used: its state says what happened (module doc).
    let (_, counters) = counters::evaluate(&prev.counters, &engine_ports, &rules, now, reboot, &Stamp::default());
    // The engine's state is new; the rest is carried over (the old engine state is not cloned).
    let state = AerState { counters, window_bits: prev.window_bits.clone(), unavailable: prev.unavailable.clone() };
    let mut out = AerOutcome { state, ..AerOutcome::default() };
    let mut key = String::new();
    for p in ports {
        for rule in &rules {
            let Some(s) = AerSeverity::of_error_code(&rule.name) else {
                continue;
            };
            let Some(counts) = p.aer.get(s) else {
                continue;
            };
            counters::eval::write_counter_key(&mut key, p.nic, 0, &rule.name);
            judge(prev, &mut out, p, rule, s, counts, &key, reboot, now);
        }
    }
    unavailable(ports, &mut out);
    out
}

/// The finding of one (PF, rule) from the engine's state before and after, and the window's
/// bits moved on when the engine started a new window.
#[allow(clippy::too_many_arguments)]
fn judge(
    prev: &AerState,
    out: &mut AerOutcome,
    p: &AerPort<'_>,
    rule: &CounterRule,
    s: AerSeverity,
    counts: &AerCounts,
    key: &str,
    reboot: bool,
    now: OffsetDateTime,
) {
    let before = prev.counters.counter_snapshots.get(key);
    let after = out.state.counters.counter_snapshots.get(key);
    let was = prev.counters.is_breached(key);
    let is = out.state.counters.is_breached(key);
    let at = || p.address.map(|a| format!(" ({a})")).unwrap_or_default();
    if !was && is {
        let at = at();
        let base = prev.window_bits.get(key).map(|b| AerCounts { bits: b.clone(), total: 0 }).unwrap_or_default();
        let moved = moved_text(&counts.moved_since(&base));
        let moved = if moved.is_empty() { String::new() } else { format!(" ({moved})") };
        let rise = before.map(|b| counts.total.saturating_sub(b.value)).unwrap_or(counts.total);
        let how = match (rule.threshold_type, rule.velocity_unit, before) {
            (ThresholdType::Velocity, Some(unit), Some(b)) if (now - b.timestamp).is_positive() => {
                let rate = rise as f64 / (now - b.timestamp).as_seconds_f64() * f64::from(unit.seconds());
                format!(" at {rate:.2}/{}, above {}/{}", unit.suffix(), rule.threshold, unit.suffix())
            }
            _ => String::new(),
        };
        let health = if rule.is_fatal { Health::Fatal } else { Health::NonFatal };
        let msg = format!(
            "PCIe AER {} errors on NIC {}{at}: {} +{rise}{how}{moved}, total {}",
            severity_words(s),
            p.nic,
            s.total_line(),
            counts.total
        );
        out.findings.push(Finding::new(p.nic, s.error_code(), health, msg));
    } else if was && !is {
        let at = at();
        let msg = format!(
            "PCIe AER {} error count of NIC {}{at} was reset ({} {}): {} cleared",
            severity_words(s),
            p.nic,
            s.total_line(),
            counts.total,
            s.error_code()
        );
        out.findings.push(Finding::new(p.nic, s.error_code(), Health::Healthy, msg));
    } else if reboot && before.is_none() && after.is_some() {
        let at = at();
        let msg = format!("PCIe AER {} healthy after reboot on NIC {}{at}", s.error_code(), p.nic);
        out.findings.push(Finding::new(p.nic, s.error_code(), Health::Healthy, msg));
    }
    if after.is_some_and(|a| a.timestamp == now) {
        let bits = &counts.bits;
        if out.state.window_bits.get(key).is_none_or(|b| b != bits) {
            Arc::make_mut(&mut out.state.window_bits).insert(key.to_string(), bits.clone());
        }
    }
}

fn severity_words(s: AerSeverity) -> &'static str {
    match s {
        AerSeverity::Correctable => "correctable",
        AerSeverity::NonFatal => "non-fatal uncorrectable",
        AerSeverity::Fatal => "fatal uncorrectable",
    }
}

/// A PF without AER statistics is said once (and again only after it had them); the PFs
/// newly without them this poll are named in one line.
fn unavailable(ports: &[AerPort<'_>], out: &mut AerOutcome) {
    let mut newly = Vec::new();
    for p in ports {
        if p.aer.available() {
            out.state.unavailable.remove(p.nic);
        } else if out.state.unavailable.insert(p.nic.to_string()) {
            newly.push(p.nic);
        }
    }
    if !newly.is_empty() {
        out.notes.push(format!(
            "PCIe AER statistics not available on {} (no aer_dev_* files: kernel without AER, or \
             firmware-first error handling): AER not checked there",
            newly.join(", ")
        ));
    }
}
