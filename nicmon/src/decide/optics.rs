//! Optics events (SPEC §1.13): what each monitored port's transceiver says about itself,
//! filed under the port's degradation check (`EthernetDegradationCheck` /
//! `InfiniBandDegradationCheck` by link layer), never fatal — the link-state check already
//! says when the link is gone; these say the optic is why, or soon will be. Pure.
//!
//! One condition per (port, code), raised when it appears and cleared (a healthy event with
//! the same code) when it goes:
//! - `optic_rx_power_low`: a lane below the module's low warning while the link is up (the
//!   pre-failure sign: a dirty fibre, a failing laser at the far end); judged only while up;
//! - `optic_rx_los`: a lane's latched Rx loss of signal;
//! - `optic_tx_fault`: a lane's latched Tx fault;
//! - `optic_temperature`: the module above its own high warning (measured or latched);
//! - `optic_module_fault`: CMIS module state Fault.
//!
//! A port whose module was not read (no netdev, not supported, not yet read) or whose pages
//! do not decode keeps its verdicts until it is read again.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::decide::roles::Classification;
use crate::model::cause::lanes_text;
use crate::model::event::{Check, Entity, HealthEvent, Stamp, sanitize_message};
use crate::model::module::{Module, dbm, decode};
use crate::model::{Device, LinkLayer, Port, PortState, Snapshot};

/// The optics conditions, in the order their events are sent.
pub const CODES: [&str; 5] =
    ["optic_module_fault", "optic_tx_fault", "optic_temperature", "optic_rx_los", "optic_rx_power_low"];

/// What the check carries between polls: the conditions raised, by port (`mlx5_0:1`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OpticsState {
    #[serde(default)]
    pub raised: BTreeMap<String, BTreeSet<String>>,
}

impl OpticsState {
    pub fn is_empty(&self) -> bool {
        self.raised.is_empty()
    }
}

/// A monitored port and its decoded module.
pub struct Judged<'s> {
    pub device: &'s Device,
    pub port: &'s Port,
    pub module: Module,
}

/// The monitored PFs' ports whose module was read and decodes, in name and port order.
pub fn judged<'s>(snapshot: &'s Snapshot, roles: &BTreeMap<String, Classification>) -> Vec<Judged<'s>> {
    let mut out: Vec<Judged<'s>> = snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && !d.is_software() && roles.get(&d.name).is_some_and(|c| c.monitored))
        .flat_map(|d| d.ports.iter().map(move |p| (&**d, p)))
        .filter_map(|(device, port)| Some(Judged { device, port, module: decode(port.module.as_deref()?)? }))
        .collect();
    out.sort_by(|a, b| (&a.device.name, a.port.number).cmp(&(&b.device.name, b.port.number)));
    out
}

/// The port's degradation check, by link layer.
fn check_of(port: &Port) -> Check {
    match port.link_layer {
        Some(LinkLayer::Ethernet) => Check::EthernetDegradationCheck,
        _ => Check::InfiniBandDegradationCheck,
    }
}

fn is_up(port: &Port) -> bool {
    matches!(port.state, Some(PortState::Active | PortState::ActiveDefer))
}

/// Whether condition `code` holds on `m` (`None`: not judged now, the verdict stands).
fn holds(code: &str, m: &Module, port: &Port) -> Option<bool> {
    match code {
        "optic_module_fault" => Some(m.in_fault()),
        "optic_tx_fault" => Some(!m.tx_fault_lanes().is_empty()),
        "optic_temperature" => Some(m.temperature_over_high_warning()),
        "optic_rx_los" => Some(!m.rx_los_lanes().is_empty()),
        "optic_rx_power_low" => is_up(port).then(|| !m.rx_power_low_lanes().is_empty()),
        _ => None,
    }
}

fn power(mw: Option<f64>) -> String {
    match (mw, dbm(mw)) {
        (_, Some(d)) => format!("{d:.1} dBm"),
        (Some(_), None) => "no light".to_string(),
        (None, _) => "not measured".to_string(),
    }
}

/// What the module says, for an unhealthy event of `code`.
fn describe(code: &str, m: &Module) -> String {
    let lanes_power = |lanes: &[usize]| {
        let each: Vec<String> = m
            .lanes
            .iter()
            .filter(|l| lanes.contains(&l.number))
            .map(|l| format!("lane {} {}", l.number, power(l.rx_power_mw)))
            .collect();
        each.join(", ")
    };
    match code {
        "optic_module_fault" => match m.fault_cause_text() {
            Some(t) => format!("CMIS module state Fault ({t})"),
            None => "CMIS module state Fault".to_string(),
        },
        "optic_tx_fault" => format!("Tx fault on {}", lanes_text(&m.tx_fault_lanes())),
        "optic_temperature" => match (m.temperature_c, m.temperature_thresholds) {
            (Some(t), Some(th)) => format!("module at {t:.1} °C, high warning {:.1} °C", th.high_warning),
            _ => "module temperature warning flag latched".to_string(),
        },
        "optic_rx_los" => {
            let los = m.rx_los_lanes();
            format!("Rx loss of signal on {} of {} lanes ({})", los.len(), m.lanes.len(), lanes_text(&los))
        }
        _ => {
            let low = m.rx_power_low_lanes();
            let warn = m.rx_power_thresholds_mw.map(|t| power(Some(t.low_warning))).unwrap_or_default();
            format!("Rx power below the module's low warning {warn} on {}: {}", lanes_text(&low), lanes_power(&low))
        }
    }
}

/// What the healthy event of `code` says.
fn cleared(code: &str) -> &'static str {
    match code {
        "optic_module_fault" => "module out of its Fault state",
        "optic_tx_fault" => "no Tx fault",
        "optic_temperature" => "module temperature back below its high warning",
        "optic_rx_los" => "receive signal on every lane",
        _ => "Rx power back above the module's low warning on every lane",
    }
}

/// Judge every monitored port's module: an event per condition that appeared or went.
pub fn evaluate(
    prev: &OpticsState,
    snapshot: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, OpticsState) {
    let mut events = Vec::new();
    let mut next = OpticsState::default();
    let judged = judged(snapshot, roles);
    for j in &judged {
        let key = format!("{}:{}", j.device.name, j.port.number);
        let was = prev.raised.get(&key).cloned().unwrap_or_default();
        let mut now_raised = BTreeSet::new();
        for code in CODES {
            let before = was.contains(code);
            let holds = holds(code, &j.module, j.port).unwrap_or(before);
            if holds {
                now_raised.insert(code.to_string());
            }
            if holds == before {
                continue;
            }
            let base = HealthEvent::new(check_of(j.port), stamp, now, "")
                .entities(vec![Entity::device(&j.device.name), Entity::port(j.port.number)])
                .error_code(code);
            let what = format!("{} port {} {}", j.device.name, j.port.number, j.module.type_name());
            events.push(match holds {
                true => HealthEvent {
                    message: sanitize_message(&format!("{what}: {}", describe(code, &j.module))),
                    ..base.unhealthy(false)
                },
                false => HealthEvent { message: sanitize_message(&format!("{what}: {}", cleared(code))), ..base },
            });
        }
        if !now_raised.is_empty() {
            next.raised.insert(key, now_raised);
        }
    }
    // A port not judged now (module unread, device gone) keeps its verdicts.
    for (key, codes) in &prev.raised {
        let judged_now = judged.iter().any(|j| format!("{}:{}", j.device.name, j.port.number) == *key);
        if !judged_now {
            next.raised.insert(key.clone(), codes.clone());
        }
    }
    (events, next)
}

#[cfg(test)]
mod tests;
