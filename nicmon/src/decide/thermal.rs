//! `NICThermalCheck` (SPEC §1.13): a monitored NIC whose hwmon sensor reads at or above its
//! critical temperature less `[thermalCheck] marginCelsius` is overheating (non-fatal
//! `nic_overheating`: the firmware throttles, then shuts the link down at `_crit`); it is
//! healthy again once every sensor is [`HYSTERESIS`] below that line, so a reading that
//! hovers on it does not flap. Pure.
//!
//! One condition per NIC (`NIC=<device>`), whichever of its sensors (ASIC, modules) is hot:
//! the message names each. A reboot gives no per-NIC healthy events (the reboot's clear does).
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::decide::roles::Classification;
use crate::model::event::{Check, Entity, HealthEvent, Stamp};
use crate::model::thermal::{Sensor, celsius};
use crate::model::{Device, Snapshot};

/// Degrees (in millidegrees) below the overheating line a sensor must fall to clear.
pub const HYSTERESIS: i64 = 2_000;

/// The event's error code.
pub const CODE: &str = "nic_overheating";

/// What the check carries between polls: the NICs reported overheating.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ThermalState {
    #[serde(default)]
    pub overheating: BTreeSet<String>,
}

impl ThermalState {
    pub fn is_empty(&self) -> bool {
        self.overheating.is_empty()
    }
}

/// The monitored PFs and their sensors, in name order.
pub fn judged<'s>(snapshot: &'s Snapshot, roles: &BTreeMap<String, Classification>) -> Vec<(&'s Device, &'s [Sensor])> {
    let mut out: Vec<(&Device, &[Sensor])> = snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && roles.get(&d.name).is_some_and(|c| c.monitored))
        .filter_map(|d| Some((&**d, snapshot.thermal.get(d.pci_address.as_deref()?)?.as_slice())))
        .collect();
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    out
}

/// Judge every monitored NIC's sensors. `margin`: millidegrees below `_crit`.
pub fn evaluate(
    prev: &ThermalState,
    snapshot: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    margin: i64,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, ThermalState) {
    let mut events = Vec::new();
    let mut next = ThermalState::default();
    let judged = judged(snapshot, roles);
    for (d, sensors) in &judged {
        let was = prev.overheating.contains(&d.name);
        let hot: Vec<&Sensor> = sensors.iter().filter(|s| s.at_or_over(margin)).collect();
        let still = was && sensors.iter().any(|s| s.at_or_over(margin + HYSTERESIS));
        // Nothing read (every input unknown): the verdict stands.
        let unknown = sensors.iter().all(|s| s.input.is_none() || s.crit.is_none());
        if !hot.is_empty() || still || (was && unknown) {
            next.overheating.insert(d.name.clone());
        }
        // Made only for an event (most polls have none).
        let base = || HealthEvent::new(Check::NICThermalCheck, stamp, now, "").entities(vec![Entity::device(&d.name)]);
        if !was && !hot.is_empty() {
            let what: Vec<String> = hot.iter().map(|s| describe(s)).collect();
            let msg = format!("{} overheating: {} (within {} of critical)", d.name, what.join(", "), deg(margin));
            events.push(HealthEvent { message: msg, ..base().unhealthy(false).error_code(CODE) });
        } else if was && !next.overheating.contains(&d.name) {
            let what: Vec<String> = sensors.iter().filter(|s| s.input.is_some()).map(describe).collect();
            let msg = format!("{} temperature back to normal: {}", d.name, what.join(", "));
            events.push(HealthEvent { message: msg, ..base().error_code(CODE) });
        }
    }
    // A NIC no longer judged (gone, its hwmon gone) keeps its verdict until it is read again.
    for name in &prev.overheating {
        if !judged.iter().any(|(d, _)| &d.name == name) {
            next.overheating.insert(name.clone());
        }
    }
    (events, next)
}

/// `asic (temp1) 103.0 °C, critical 105.0 °C, highest 104.0 °C`.
fn describe(s: &Sensor) -> String {
    let mut t = format!("{} ({})", s.display(), s.name());
    if let Some(v) = s.input {
        t.push_str(&format!(" {}", deg(v)));
    }
    if let Some(v) = s.crit {
        t.push_str(&format!(", critical {}", deg(v)));
    }
    if let Some(v) = s.highest {
        t.push_str(&format!(", highest {}", deg(v)));
    }
    t
}

fn deg(millidegrees: i64) -> String {
    format!("{:.1} °C", celsius(millidegrees))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::roles::Classification;
    use std::sync::Arc;

    fn device(name: &str, pci: &str) -> Device {
        Device { pci_address: Some(pci.into()), card: Some(pci[..10].into()), ..Device::pf(name, Vec::new()) }
    }

    fn sensor(channel: u32, label: &str, input: i64, crit: i64) -> Sensor {
        Sensor {
            hwmon: "hwmon2".into(),
            channel,
            label: Some(label.into()),
            input: Some(input),
            crit: Some(crit),
            highest: None,
        }
    }

    fn snap(readings: &[(&str, i64)]) -> (Snapshot, BTreeMap<String, Classification>) {
        let mut s = Snapshot::default();
        let mut roles = BTreeMap::new();
        for (i, (name, asic)) in readings.iter().enumerate() {
            let pci = format!("0000:0{i}:00.0");
            s.devices.push(Arc::new(device(name, &pci)));
            std::sync::Arc::make_mut(&mut s.thermal)
                .insert(pci, vec![sensor(1, "asic", *asic, 105_000), sensor(2, "module0", 40_000, 75_000)]);
            roles.insert(
                name.to_string(),
                Classification { monitored: true, reason: None, role: None, role_reason: None },
            );
        }
        (s, roles)
    }

    fn run(prev: &ThermalState, readings: &[(&str, i64)]) -> (Vec<HealthEvent>, ThermalState) {
        let (s, roles) = snap(readings);
        evaluate(prev, &s, &roles, 5_000, OffsetDateTime::UNIX_EPOCH, &Stamp::default())
    }

    #[test]
    fn overheating_at_the_margin_clears_below_the_hysteresis() {
        let (ev, st) = run(&ThermalState::default(), &[("mlx5_0", 99_999), ("mlx5_1", 60_000)]);
        assert!(ev.is_empty() && st.is_empty(), "{ev:?}");
        // At crit − 5 °C: unhealthy, non-fatal, naming the sensor.
        let (ev, st) = run(&st, &[("mlx5_0", 100_000), ("mlx5_1", 60_000)]);
        assert_eq!(ev.len(), 1);
        let e = &ev[0];
        assert!(!e.is_healthy && !e.is_fatal, "{e:?}");
        assert_eq!(
            (e.error_code.as_slice(), e.entities_text().as_str()),
            (&["nic_overheating".to_string()][..], "NIC=mlx5_0")
        );
        assert!(e.message.contains("asic (temp1) 100.0 °C, critical 105.0 °C"), "{}", e.message);
        assert!(st.overheating.contains("mlx5_0"));
        // Still hot: nothing new. Just under the line, within the hysteresis: held.
        let (ev, st) = run(&st, &[("mlx5_0", 104_000), ("mlx5_1", 60_000)]);
        assert!(ev.is_empty());
        let (ev, st) = run(&st, &[("mlx5_0", 98_500), ("mlx5_1", 60_000)]);
        assert!(ev.is_empty() && st.overheating.contains("mlx5_0"));
        // 2 °C below the line: healthy.
        let (ev, st) = run(&st, &[("mlx5_0", 97_999), ("mlx5_1", 60_000)]);
        assert_eq!(ev.len(), 1);
        assert!(ev[0].is_healthy && ev[0].error_code == ["nic_overheating"], "{:?}", ev[0]);
        assert!(st.is_empty());
    }

    #[test]
    fn a_module_sensor_counts_and_unknown_keeps_the_verdict() {
        let (mut s, roles) = snap(&[("mlx5_0", 50_000)]);
        std::sync::Arc::make_mut(&mut s.thermal).get_mut("0000:00:00.0").unwrap()[1].input = Some(71_000);
        let (ev, st) =
            evaluate(&ThermalState::default(), &s, &roles, 5_000, OffsetDateTime::UNIX_EPOCH, &Stamp::default());
        assert_eq!(ev.len(), 1);
        assert!(ev[0].message.contains("module0 (temp2) 71.0 °C"), "{}", ev[0].message);
        for x in std::sync::Arc::make_mut(&mut s.thermal).get_mut("0000:00:00.0").unwrap() {
            x.input = None;
        }
        let (ev, st) = evaluate(&st, &s, &roles, 5_000, OffsetDateTime::UNIX_EPOCH, &Stamp::default());
        assert!(ev.is_empty() && st.overheating.contains("mlx5_0"));
        // An unmonitored NIC is not judged.
        let (ev, _) = evaluate(
            &ThermalState::default(),
            &snap(&[("mlx5_0", 110_000)]).0,
            &BTreeMap::new(),
            5_000,
            OffsetDateTime::UNIX_EPOCH,
            &Stamp::default(),
        );
        assert!(ev.is_empty());
    }
}
