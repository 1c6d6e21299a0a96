//! What a poll's result shows in the metrics: [`Metrics::observe`]. Read from typed
//! fields of the poll, its events and the checks' state — never from messages.
use std::collections::BTreeMap;

use super::Metrics;
use crate::decide::poll::Poll;
use crate::decide::state::CheckState;
use crate::model::event::{Check, CheckKind, HealthEvent, Subject};

impl Metrics {
    /// Observe one poll: the devices and ports it saw, its deferrals and read health, the
    /// checks' state it produced (`next`; `poll.next` is moved out by the commit) and its
    /// unhealthy events.
    pub fn observe(&self, poll: &Poll, next: &CheckState) {
        self.observe_with_events(poll, poll.events.iter(), next);
    }

    /// [`Metrics::observe`] with the poll's events given apart (`poll.events` moved into
    /// the outbox's batches by the commit).
    pub fn observe_with_events<'e>(
        &self,
        poll: &Poll,
        events: impl Iterator<Item = &'e HealthEvent>,
        next: &CheckState,
    ) {
        let devices_changed = self.devices_seen(poll);
        if devices_changed {
            self.observe_devices(poll);
        }
        for check in &poll.deferred {
            self.first_poll_deferred(*check, 1);
        }
        self.set_read_health(poll.reads_abandoned, &poll.stuck_reads);
        self.kmsg_records_lost(next.kmsg.lost_records);
        self.set_saturated_counters(next.counters.saturated());
        self.set_counter_values(&next.counters.last_values);
        for f in &poll.flaps {
            self.port_flap_transition(&f.device, f.port);
        }
        self.set_flapping_ports(
            next.links.port_states.values().filter(|r| r.flap.is_flapping()).map(|r| (r.device.as_str(), r.port)),
        );
        let events: Vec<&HealthEvent> = events.collect();
        self.observe_errors(events.iter().copied(), next);
        self.observe_causes(&events);
        self.observe_phy(poll, next);
        // Made from the sensors' reading, the devices' and their roles: set again only when
        // one of them is not the one they were last set from.
        if self.thermal_seen(poll) || devices_changed {
            self.observe_thermal(poll);
        }
        self.observe_optics(poll);
        self.observe_devlink(poll);
    }

    /// The families made from the poll's device readings and roles alone: roles, port
    /// health and unknown attributes, PCIe figures, devices discovered.
    fn observe_devices(&self, poll: &Poll) {
        self.observe_roles(poll);
        self.observe_ports(poll);
        self.set_pcie(crate::decide::pcie::check::figures(&poll.snapshot, &poll.roles));
        self.set_pcie_capability(poll.snapshot.devices.iter().filter(|d| !d.is_vf()).filter_map(|d| {
            let monitored = poll.roles.get(&d.name).is_some_and(|c| c.monitored);
            let cap = crate::decide::pcie::link::capability(d.pcie.as_ref().filter(|_| monitored)?)?;
            Some((d.name.as_str(), cap))
        }));
        self.observe_discovered(poll);
    }

    /// Whether the poll's sensor reading is another than the one the temperature families
    /// were last set from (then it is remembered as set).
    pub(super) fn thermal_seen(&self, poll: &Poll) -> bool {
        let mut seen = self.thermal_seen.lock().unwrap_or_else(|p| p.into_inner());
        let same = std::ptr::eq(seen.as_ptr(), std::sync::Arc::as_ptr(&poll.snapshot.thermal));
        if !same {
            *seen = std::sync::Arc::downgrade(&poll.snapshot.thermal);
        }
        !same
    }

    /// Whether the poll's device readings or roles differ from those the device families
    /// were last set from (then they are remembered as set). A device read the same as at
    /// the last poll is the same reading (`Arc`), so a quiet poll sets none of them again.
    fn devices_seen(&self, poll: &Poll) -> bool {
        let mut seen = self.devices_seen.lock().unwrap_or_else(|p| p.into_inner());
        let same = seen.as_ref().is_some_and(|s| {
            s.devices.len() == poll.snapshot.devices.len()
                && s.devices.iter().zip(&poll.snapshot.devices).all(|(w, d)| std::ptr::eq(w.as_ptr(), &**d))
                && s.roles == poll.roles
        });
        if !same {
            let devices = poll.snapshot.devices.iter().map(std::sync::Arc::downgrade).collect();
            *seen = Some(super::DevicesSeen { devices, roles: poll.roles.clone() });
        }
        !same
    }

    /// Monitored devices per role.
    fn observe_roles(&self, poll: &Poll) {
        let mut by_role: BTreeMap<&str, usize> = Default::default();
        for c in poll.roles.values() {
            if let Some(r) = c.role {
                *by_role.entry(r.as_str()).or_default() += 1;
            }
        }
        self.set_devices_by_role(by_role);
    }

    /// The health and unknown attributes of monitored ports.
    fn observe_ports(&self, poll: &Poll) {
        let mut ports = Vec::new();
        let mut unknown = Vec::new();
        for d in &poll.snapshot.devices {
            // A VF is never monitored (asked first: it is cheaper).
            if !d.is_vf() && poll.roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) {
                for p in &d.ports {
                    unknown.extend(p.unknown.keys().map(|a| (d.name.as_str(), p.number, a.as_str())));
                    // Unknown is not a value: a port whose state is unknown is neither healthy
                    // nor unhealthy, so it is left out of the health gauge.
                    if p.unknown_state().is_none() {
                        ports.push((d.name.as_str(), p.number, p.is_healthy()));
                    }
                }
            }
        }
        self.set_port_health(ports);
        self.set_unknown_attributes(unknown);
    }

    /// Monitored PFs per state check (by link layer); InfiniBand ones for the char-device
    /// check.
    fn observe_discovered(&self, poll: &Poll) {
        let mut discovered: BTreeMap<Check, usize> = Default::default();
        for d in poll.snapshot.devices.iter().filter(|d| !d.is_vf()) {
            if !poll.roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) {
                continue;
            }
            let ll = crate::decide::roles::device_link_layer(d);
            if let Some(check) = ll.and_then(crate::decide::linkstate::state_check) {
                *discovered.entry(check).or_default() += 1;
            }
            if ll == Some(&crate::model::LinkLayer::InfiniBand) {
                *discovered.entry(Check::InfiniBandCharDeviceCheck).or_default() += 1;
            }
        }
        for check in Check::ALL.into_iter().filter(|c| c.watches_devices()) {
            self.set_devices_discovered(check, discovered.get(&check).copied().unwrap_or(0));
        }
    }

    /// Unhealthy events by probable cause, and the ports (and devices) unhealthy now by their
    /// state check, by the cause of the event that made them so (a healthy event of the state
    /// check clears its port; a clear of the node, every one).
    fn observe_causes(&self, events: &[&HealthEvent]) {
        use crate::model::cause::{CAUSE_KEY, Cause};
        let mut now = self.causes_now.lock().unwrap_or_else(|p| p.into_inner());
        for e in events {
            let cause = e.metadata.get(CAUSE_KEY).and_then(|c| Cause::parse(c)).unwrap_or(Cause::Unknown);
            if !e.is_healthy {
                let labels = super::families::CauseLabels {
                    node: self.node.clone(),
                    check: e.check_name.to_string(),
                    probable_cause: cause.as_str().into(),
                };
                self.f.unhealthy_by_cause.get_or_create(&labels).inc();
            }
            if e.check().map(|c| c.kind()) != Some(CheckKind::PortState) {
                continue;
            }
            let key = match e.subject() {
                Subject::Port { device, port } => (device.to_string(), port),
                Subject::Device(d) | Subject::Card(d) => (d.to_string(), 0),
                Subject::Node => {
                    now.clear();
                    continue;
                }
            };
            match e.is_healthy {
                true => now.remove(&key),
                false => now.insert(key, cause),
            };
        }
        let mut counts: BTreeMap<Cause, i64> = Cause::ALL.into_iter().map(|c| (c, 0)).collect();
        for c in now.values() {
            *counts.entry(*c).or_default() += 1;
        }
        for (cause, n) in counts {
            let labels = super::families::NodeCause { node: self.node.clone(), probable_cause: cause.as_str().into() };
            self.f.unhealthy_ports_by_cause.get_or_create(&labels).set(n);
        }
    }

    /// Every unhealthy event by check, NIC and error code (`nicmon_unhealthy_events_total`),
    /// and the existing monitor's error metrics, from the unhealthy events' typed fields: state
    /// check errors, and counter threshold breaches (a saturated counter's event is not a
    /// breach: no thresholds are evaluated while it is saturated).
    fn observe_errors<'e>(&self, events: impl Iterator<Item = &'e HealthEvent>, next: &CheckState) {
        for e in events.filter(|e| !e.is_healthy) {
            // A card's errors are labelled with the card; the node's with no device.
            let (dev, port) = match e.subject() {
                Subject::Port { device, port } => (device, port),
                Subject::Device(name) | Subject::Card(name) => (name, 0),
                Subject::Node => ("", 0),
            };
            self.unhealthy_event(e, dev, port);
            let Some(check) = e.check() else { continue };
            match check.kind() {
                CheckKind::PortState | CheckKind::CharDevices => self.state_check_error(check, dev, port),
                CheckKind::Counters => {
                    // The counter rule is the event's error code.
                    let counter = e.error_code.first().map(String::as_str).unwrap_or("");
                    if !next.counters.is_saturated(dev, port, counter) {
                        self.counter_threshold_breach(counter, dev, port, e.is_fatal)
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;
    use crate::decide::counters::eval::Saturation;
    use crate::model::event::{Entity, HealthEvent, Stamp};

    fn degradation(counter: &str, fatal: bool) -> HealthEvent {
        HealthEvent::new(Check::InfiniBandDegradationCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
            .entities(vec![Entity::device("mlx5_0".to_string()), Entity::port(1)])
            .error_code(counter)
            .unhealthy(fatal)
    }

    /// The breach metric comes from the event's typed fields and the counters' state: a
    /// saturated counter's event is not a breach, whatever its message says.
    #[test]
    fn breaches_are_counted_from_typed_fields_saturation_excluded() {
        let mut next = crate::decide::state::CheckState::default();
        std::sync::Arc::make_mut(&mut next.counters).saturation_flags.insert(
            crate::decide::counters::counter_key("mlx5_0", 1, "link_downed"),
            Saturation {
                check_name: Check::InfiniBandDegradationCheck.as_str().into(),
                value: 255,
                since: OffsetDateTime::UNIX_EPOCH,
            },
        );
        let poll = Poll {
            events: vec![degradation("symbol_error", true), degradation("link_downed", false)],
            next,
            ..Default::default()
        };
        let metrics = Metrics::new("n");
        metrics.observe(&poll, &poll.next);
        let text = metrics.encode();
        let breaches: Vec<&str> =
            text.lines().filter(|l| l.starts_with("nic_health_monitor_counter_threshold_breaches_total{")).collect();
        assert_eq!(breaches.len(), 1, "{breaches:#?}");
        assert!(breaches[0].contains("symbol_error") && breaches[0].ends_with(" 1"), "{}", breaches[0]);
    }

    /// Every unhealthy event is counted by check, NIC, error code and fatality, whatever its
    /// check (a device's event on port 0); healthy events are not.
    #[test]
    fn unhealthy_events_are_counted_by_nic_and_error_code() {
        let pcie = HealthEvent::new(Check::NICPCIeCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
            .entities(vec![Entity::device("mlx5_3".to_string())])
            .error_code("aer_fatal")
            .unhealthy(true);
        let healthy = HealthEvent::new(Check::NICPCIeCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
            .entities(vec![Entity::device("mlx5_3".to_string())])
            .error_code("pcie_link_downtrained");
        let poll = Poll { events: vec![pcie, degradation("symbol_error", false), healthy], ..Default::default() };
        let metrics = Metrics::new("n");
        metrics.observe(&poll, &poll.next);
        let text = metrics.encode();
        let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with("nicmon_unhealthy_events_total{")).collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                r#"nicmon_unhealthy_events_total{node="n",check="InfiniBandDegradationCheck",device="mlx5_0",port="1",error_code="symbol_error",is_fatal="false"} 1"#,
                r#"nicmon_unhealthy_events_total{node="n",check="NICPCIeCheck",device="mlx5_3",port="0",error_code="aer_fatal",is_fatal="true"} 1"#,
            ],
            "{text}"
        );
    }

    /// Dead ports by probable cause: counted while unhealthy, cleared by their healthy event;
    /// unhealthy events of every check counted by cause.
    #[test]
    fn dead_ports_and_unhealthy_events_are_counted_by_probable_cause() {
        use crate::model::cause::CAUSE_KEY;
        let down = |dev: &str, cause: &str, healthy: bool| {
            let mut e = HealthEvent::new(Check::EthernetStateCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
                .entities(vec![Entity::device(dev.to_string()), Entity::port(1)]);
            if !healthy {
                e = e.unhealthy(true);
                e.metadata.insert(CAUSE_KEY.into(), cause.into());
            }
            e
        };
        let metrics = Metrics::new("n");
        let lines = |m: &Metrics, prefix: &str| -> Vec<String> {
            let mut v: Vec<String> = m.encode().lines().filter(|l| l.starts_with(prefix)).map(str::to_string).collect();
            v.sort();
            v
        };
        let zero = lines(&metrics, "nicmon_unhealthy_ports{");
        assert_eq!(zero.len(), 8, "every cause exported at 0 from the start: {zero:?}");
        assert!(zero.iter().all(|l| l.ends_with(" 0")));
        let first = Poll {
            events: vec![
                down("mlx5_8", "optic", false),
                down("mlx5_9", "cable-or-far-end", false),
                down("mlx5_10", "cable-or-far-end", false),
            ],
            ..Default::default()
        };
        metrics.observe(&first, &first.next);
        let second = Poll { events: vec![down("mlx5_9", "", true)], ..Default::default() };
        metrics.observe(&second, &second.next);
        let now = lines(&metrics, "nicmon_unhealthy_ports{");
        assert!(now.contains(&r#"nicmon_unhealthy_ports{node="n",probable_cause="optic"} 1"#.to_string()), "{now:?}");
        assert!(now.contains(&r#"nicmon_unhealthy_ports{node="n",probable_cause="cable-or-far-end"} 1"#.to_string()));
        assert_eq!(
            lines(&metrics, "nicmon_unhealthy_events_by_cause_total{"),
            [
                r#"nicmon_unhealthy_events_by_cause_total{node="n",check="EthernetStateCheck",probable_cause="cable-or-far-end"} 2"#,
                r#"nicmon_unhealthy_events_by_cause_total{node="n",check="EthernetStateCheck",probable_cause="optic"} 1"#,
            ]
        );
    }

    /// A port whose state is unknown is neither healthy nor unhealthy in the metrics: it is
    /// left out of `nicmon_port_healthy` and shown by `nicmon_port_attribute_unknown`.
    #[test]
    fn an_unknown_port_is_not_exported_as_unhealthy() {
        use crate::model::{Device, PhysState, Port, PortState};
        let port = |n: u32, state: Option<PortState>| Port {
            number: n,
            state: state.clone(),
            phys_state: Some(PhysState::LinkUp),
            unknown: if state.is_none() {
                [("state".to_string(), "empty".to_string())].into()
            } else {
                Default::default()
            },
            ..Port::default()
        };
        let dev = Device::pf("mlx5_0", vec![port(1, Some(PortState::Active)), port(2, None)]);
        let classification =
            crate::decide::roles::Classification { monitored: true, reason: None, role: None, role_reason: None };
        let poll = Poll {
            snapshot: crate::model::Snapshot { devices: vec![dev.into()], ..Default::default() },
            roles: [("mlx5_0".to_string(), classification)].into(),
            ..Default::default()
        };
        let metrics = Metrics::new("n");
        metrics.observe(&poll, &poll.next);
        let text = metrics.encode();
        assert!(text.contains(r#"nicmon_port_healthy{device="mlx5_0",port="1"} 1"#), "{text}");
        assert!(!text.contains(r#"nicmon_port_healthy{device="mlx5_0",port="2"}"#), "{text}");
        assert!(
            text.contains(r#"nicmon_port_attribute_unknown{device="mlx5_0",port="2",attribute="state"} 1"#),
            "{text}"
        );
    }
    /// The device families follow each new reading and each change of roles: the same
    /// readings (the same `Arc`s) and roles again set nothing anew; a device read anew, or
    /// its role changed, sets them from the new ones.
    #[test]
    fn the_device_families_follow_each_new_reading_and_role() {
        use std::sync::Arc;

        use crate::model::{Device, PhysState, Port, PortState};
        let dev = |state: PortState| {
            let port = Port { number: 1, state: Some(state), phys_state: Some(PhysState::LinkUp), ..Port::default() };
            Arc::new(Device::pf("mlx5_0", vec![port]))
        };
        let role = |monitored: bool| crate::decide::roles::Classification {
            monitored,
            reason: None,
            role: None,
            role_reason: None,
        };
        let poll = |d: &Arc<Device>, monitored: bool| Poll {
            snapshot: crate::model::Snapshot { devices: vec![d.clone()], ..Default::default() },
            roles: [("mlx5_0".to_string(), role(monitored))].into(),
            ..Default::default()
        };
        let healthy = |v: u8| format!(r#"nicmon_port_healthy{{device="mlx5_0",port="1"}} {v}"#);
        let metrics = Metrics::new("n");
        let up = dev(PortState::Active);
        let first = poll(&up, true);
        metrics.observe(&first, &first.next);
        assert!(metrics.encode().contains(&healthy(1)));
        // The same reading and roles: seen, nothing set anew.
        assert!(!metrics.devices_seen(&poll(&up, true)));
        // A reading anew (the port went down): set from it.
        let down = poll(&dev(PortState::Down), true);
        metrics.observe(&down, &down.next);
        assert!(metrics.encode().contains(&healthy(0)), "{}", metrics.encode());
        // The same reading, the device no longer monitored: its series go.
        let unmonitored = poll(&down.snapshot.devices[0], false);
        metrics.observe(&unmonitored, &unmonitored.next);
        assert!(!metrics.encode().contains(r#"nicmon_port_healthy{device="mlx5_0""#), "{}", metrics.encode());
        // Back to the first reading: set again (a different reading from the last seen).
        metrics.observe(&first, &first.next);
        assert!(metrics.encode().contains(&healthy(1)));
    }
}
