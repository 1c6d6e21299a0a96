//! The probable cause of every unhealthy event (SPEC §1.13): pure over the facts of the same
//! poll ([`Facts`]), first rule that matches wins, `unknown` rather than a guess.
//!
//! The rules, in order, over the devices the event is about (its device, or its card's):
//! 1. a firmware fatal (devlink `fw_fatal`, the kernel log's) → `nic-firmware`;
//! 2. AER fatal/non-fatal, a downtrained link, config space of all ones or unreadable, a PCIe
//!    kernel-log line → `pcie`;
//! 3. the PCI function is there and the RDMA device is not, or the driver failed to load →
//!    `driver`;
//! 4. a sensor at or over its critical temperature → `nic-thermal`;
//! 5. the port's module: Tx fault, CMIS module fault, temperature alarm → `optic`;
//! 6. a port down (or `link_downed`, symbol errors, link error recovery, an Rx LOS event)
//!    with Rx LOS or receive power below the low alarm on its lanes while its own Tx is fine
//!    → `cable-or-far-end`;
//! 7. an error counter's breach with receive power below the low warning → `cable-or-far-end`;
//! 8. otherwise `unknown`.
use std::collections::BTreeMap;

use crate::model::cause::{CAUSE_KEY, Cause, DeviceFacts, Diagnosis, EVIDENCE_KEY, Facts, ModuleFacts, lanes_text};
use crate::model::event::{CheckKind, HealthEvent, MAX_MESSAGE_LEN, Subject};
use crate::model::module::{Module, decode};
use crate::model::thermal::celsius;
use crate::model::{PciPresence, Snapshot};

/// Counters whose breach means the link itself went away or could not hold symbols: judged
/// like a port that went down.
const LINK_LOSS_CODES: &[&str] = &["link_downed", "symbol_error", "link_error_recovery", "optic_rx_los"];

/// The kernel log's patterns that name a part, by error code; the others name none.
const KERNEL_LOG_PARTS: &[(&str, Cause)] = &[
    ("health_compromised", Cause::NicFirmware),
    ("fw_fatal_error", Cause::NicFirmware),
    ("fw_unrecoverable", Cause::NicFirmware),
    ("health_recovery_failed", Cause::NicFirmware),
    ("cmd_timeout", Cause::NicFirmware),
    ("fw_fatal", Cause::NicFirmware),
    ("pci_slot_unavailable", Cause::Pcie),
    ("slot_reset_failed", Cause::Pcie),
    ("pcie_surprise_removal", Cause::Pcie),
    ("pcie_link_not_restored", Cause::Pcie),
    ("aer_recovery_failed", Cause::Pcie),
    ("pcie_fatal", Cause::Pcie),
    ("pcie_nonfatal", Cause::Pcie),
    ("load_failed", Cause::Driver),
    ("init_failed", Cause::Driver),
];

/// The part a kernel-log (or firmware) error code names, if any.
pub fn kernel_log_part(code: &str) -> Option<Cause> {
    KERNEL_LOG_PARTS.iter().find(|(c, _)| *c == code).map(|&(_, cause)| cause)
}

/// What kind of failure an event reports, as the rules ask it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// The link went away: a port down, `link_downed`, symbol errors, Rx LOS.
    LinkLoss,
    Other,
}

fn trigger(e: &HealthEvent) -> Trigger {
    let code = e.error_code.first().map(String::as_str).unwrap_or("");
    let kind = e.check().map(|c| c.kind());
    match kind {
        _ if LINK_LOSS_CODES.contains(&code) => Trigger::LinkLoss,
        Some(CheckKind::PortState) if matches!(e.subject(), Subject::Port { .. }) => Trigger::LinkLoss,
        _ => Trigger::Other,
    }
}

/// An error counter's breach (`link_downed` and symbol errors included; the optics' own
/// events are not errors).
fn counts_errors(e: &HealthEvent) -> bool {
    let code = e.error_code.first().map(String::as_str).unwrap_or("");
    e.check().map(|c| c.kind()) == Some(CheckKind::Counters) && !code.starts_with("optic_")
}

/// The devices an event is about: its device, or every device of its card.
fn devices_of<'f>(e: &'f HealthEvent, facts: &'f Facts) -> Vec<&'f str> {
    match e.subject() {
        Subject::Port { device, .. } | Subject::Device(device) => vec![device],
        Subject::Card(card) => {
            facts.cards.get(card).map(|d| d.iter().map(String::as_str).collect()).unwrap_or_default()
        }
        Subject::Node => Vec::new(),
    }
}

/// The first device fact `pick` finds among the event's devices.
fn device_fact<'f>(
    devices: &[&str],
    facts: &'f Facts,
    pick: impl Fn(&'f DeviceFacts) -> Option<&'f String>,
) -> Option<&'f String> {
    devices.iter().filter_map(|d| facts.devices.get(*d)).find_map(pick)
}

/// The module's own fault, if it has one (rule 5).
fn optic_fault(m: &ModuleFacts) -> Option<String> {
    if !m.tx_fault.is_empty() {
        return Some(format!("Tx fault, {}", lanes_text(&m.tx_fault)));
    }
    m.module_fault.clone().or_else(|| m.temperature_alarm.clone())
}

/// The receive side dark or too weak while this end transmits (rule 6).
fn light_lost(m: &ModuleFacts) -> Option<String> {
    if !m.tx_fine() {
        return None;
    }
    let of = |lanes: &[usize]| {
        if m.lanes > 0 { format!("on {} of {} lanes", lanes.len(), m.lanes) } else { lanes_text(lanes) }
    };
    if !m.rx_los.is_empty() {
        return Some(format!("Rx LOS {}", of(&m.rx_los)));
    }
    (!m.rx_below_low_alarm.is_empty())
        .then(|| format!("Rx power below the module's low alarm {}", of(&m.rx_below_low_alarm)))
}

/// The probable cause of `e` from `facts` (the rules in the module's doc).
pub fn diagnose(e: &HealthEvent, facts: &Facts) -> Diagnosis {
    let found = |cause: Cause, evidence: &str| Diagnosis { cause, evidence: evidence.to_string() };
    let devices = devices_of(e, facts);
    if let Some(ev) = device_fact(&devices, facts, |d| d.firmware_fatal.as_ref()) {
        return found(Cause::NicFirmware, ev);
    }
    if let Some(ev) = device_fact(&devices, facts, |d| d.pcie.as_ref()) {
        return found(Cause::Pcie, ev);
    }
    if let Some(ev) = device_fact(&devices, facts, |d| d.driver.as_ref()) {
        return found(Cause::Driver, ev);
    }
    if let Some(ev) = device_fact(&devices, facts, |d| d.thermal.as_ref()) {
        return found(Cause::NicThermal, ev);
    }
    let module = match e.subject() {
        Subject::Port { device, port } => facts.ports.get(&(device.to_string(), port)),
        _ => None,
    };
    if let Some(m) = module {
        if let Some(ev) = optic_fault(m) {
            return found(Cause::Optic, &ev);
        }
        if trigger(e) == Trigger::LinkLoss
            && let Some(ev) = light_lost(m)
        {
            return found(Cause::CableOrFarEnd, &ev);
        }
        if counts_errors(e) && !m.rx_below_low_warning.is_empty() {
            let ev = format!("Rx power below the module's low warning on {}", lanes_text(&m.rx_below_low_warning));
            return found(Cause::CableOrFarEnd, &ev);
        }
    }
    Diagnosis { cause: Cause::Unknown, evidence: String::new() }
}

/// Every unhealthy event of `events` with its probable cause: `metadata.probableCause`,
/// `metadata.evidence` and the message ending "probable cause: optic (Tx fault, lanes 1–2)".
/// Healthy events are left as they are.
pub fn annotate(events: &mut [HealthEvent], facts: &Facts) {
    for e in events.iter_mut().filter(|e| !e.is_healthy) {
        let d = diagnose(e, facts);
        let suffix = match d.evidence.is_empty() {
            true => format!(" - probable cause: {}", d.cause.as_str()),
            false => format!(" - probable cause: {} ({})", d.cause.as_str(), d.evidence),
        };
        // The cause is the end of the message whatever its length: the message gives way.
        let room = MAX_MESSAGE_LEN.saturating_sub(suffix.len());
        let mut cut = e.message.len().min(room);
        while !e.message.is_char_boundary(cut) {
            cut -= 1;
        }
        e.message.truncate(cut);
        e.message.push_str(&crate::model::event::sanitize_message(&suffix));
        e.metadata.insert(CAUSE_KEY.to_string(), d.cause.as_str().to_string());
        if !d.evidence.is_empty() {
            e.metadata.insert(EVIDENCE_KEY.to_string(), crate::model::event::sanitize_message(&d.evidence));
        }
    }
}

/// What a decoded module says for the rules: lanes as the module numbers them (from 1).
pub fn module_facts(m: &Module) -> ModuleFacts {
    let temperature_alarm =
        m.temperature_over_high_alarm().then(|| match (m.temperature_c, m.temperature_thresholds) {
            (Some(t), Some(th)) => format!("module at {t:.1} C, high alarm {:.1} C", th.high_alarm),
            _ => "module temperature high alarm".to_string(),
        });
    let module_fault = m.in_fault().then(|| match (m.fault_cause, m.fault_cause_text()) {
        (Some(c), Some(text)) if c != 0 => format!("CMIS module state Fault ({text})"),
        _ => "CMIS module state Fault".to_string(),
    });
    ModuleFacts {
        lanes: m.lanes.len(),
        tx_fault: m.tx_fault_lanes(),
        tx_los: m.lanes_where(|l| l.tx_los),
        rx_los: m.rx_los_lanes(),
        rx_below_low_alarm: m.rx_power_below_low_alarm(),
        rx_below_low_warning: m.rx_power_low_lanes(),
        module_fault,
        temperature_alarm,
    }
}

/// The facts of the snapshot and this poll's events: each port's transceiver (replayed or
/// read), the PCI probe of a device gone from `class/infiniband`, hwmon sensors at or over their critical temperature, the kernel log's,
/// devlink's and the PCIe check's unhealthy events of this poll, and the PCIe conditions
/// still held (`held_pcie`: device → evidence, from the check's state). For diagnosing
/// `events` ([`annotate`]): a card's devices are listed only when one of them is about a card.
pub fn base_facts(snapshot: &Snapshot, events: &[HealthEvent], held_pcie: &BTreeMap<String, String>) -> Facts {
    let mut facts = Facts::default();
    // Only an event about a card asks which devices the card has (every function of a
    // node's cards, VFs included: ~500 names on an SR-IOV node, each poll).
    if events.iter().any(|e| matches!(e.subject(), Subject::Card(_))) {
        for d in &snapshot.devices {
            if let Some(card) = &d.card {
                facts.cards.entry(card.clone()).or_default().push(d.name.clone());
            }
        }
    }
    for (name, probe) in &snapshot.pci_probes {
        let f = facts.devices.entry(name.clone()).or_default();
        match probe {
            PciPresence::AllOnes => f.pcie = Some("PCI config space reads 0xFF".into()),
            PciPresence::ReadError(e) => f.pcie = Some(format!("PCI config space read failed: {e}")),
            PciPresence::Present => f.driver = Some("PCI function present, RDMA device gone".into()),
            PciPresence::Gone => {}
        }
    }
    for d in &snapshot.devices {
        let Some(sensors) = d.pci_address.as_ref().and_then(|a| snapshot.thermal.get(a)) else { continue };
        if let Some(hot) = sensors.iter().find(|s| s.at_or_over(0)) {
            let (t, c) = (hot.input.unwrap_or_default(), hot.crit.unwrap_or_default());
            let ev = format!("sensor {} at {:.1} C, critical {:.1} C", hot.display(), celsius(t), celsius(c));
            facts.devices.entry(d.name.clone()).or_default().thermal = Some(ev);
        }
    }
    for d in &snapshot.devices {
        for p in &d.ports {
            let module = p.module.as_deref().and_then(decode);
            if let Some(m) = module {
                facts.ports.insert((d.name.clone(), p.number), module_facts(&m));
            }
        }
    }
    for (device, ev) in held_pcie {
        facts.devices.entry(device.clone()).or_default().pcie.get_or_insert_with(|| ev.clone());
    }
    for e in events.iter().filter(|e| !e.is_healthy) {
        let Some(code) = e.error_code.first() else { continue };
        let part = match e.check().map(|c| c.kind()) {
            Some(CheckKind::Pcie) if code != "aer_correctable" => Some(Cause::Pcie),
            Some(CheckKind::KernelLog | CheckKind::Firmware) => kernel_log_part(code),
            _ => None,
        };
        let Some(part) = part else { continue };
        let evidence = match e.check().map(|c| c.kind()) {
            Some(CheckKind::KernelLog) => format!("kernel log: {code}"),
            Some(CheckKind::Firmware) => format!("devlink health: {code}"),
            _ => format!("PCIe: {code}"),
        };
        for device in devices_of(e, &facts).into_iter().map(str::to_string).collect::<Vec<_>>() {
            let f = facts.devices.entry(device).or_default();
            let slot = match part {
                Cause::NicFirmware => &mut f.firmware_fatal,
                Cause::Pcie => &mut f.pcie,
                Cause::Driver => &mut f.driver,
                _ => continue,
            };
            slot.get_or_insert_with(|| evidence.clone());
        }
    }
    facts
}

#[cfg(test)]
mod tests;
