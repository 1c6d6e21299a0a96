use std::collections::BTreeMap;

use time::OffsetDateTime;

use super::*;
use crate::model::event::{Check, Entity, Stamp};

fn at() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap()
}

fn port_event(check: Check, code: Option<&str>, device: &str, port: u32) -> HealthEvent {
    let e = HealthEvent::new(check, &Stamp::default(), at(), &format!("Port {device} port {port}: state DOWN"))
        .unhealthy(true)
        .entities(vec![Entity::device(device), Entity::port(port)]);
    match code {
        Some(c) => e.error_code(c),
        None => e,
    }
}

fn down(device: &str) -> HealthEvent {
    port_event(Check::EthernetStateCheck, None, device, 1)
}

fn module(f: impl FnOnce(&mut ModuleFacts)) -> ModuleFacts {
    let mut m = ModuleFacts { lanes: 4, ..ModuleFacts::default() };
    f(&mut m);
    m
}

fn with_port(m: ModuleFacts) -> Facts {
    let mut facts = Facts::default();
    facts.ports.insert(("mlx5_8".into(), 1), m);
    facts
}

fn cause(e: &HealthEvent, facts: &Facts) -> (Cause, String) {
    let d = diagnose(e, facts);
    (d.cause, d.evidence)
}

#[test]
fn a_port_down_with_rx_los_on_every_lane_and_tx_fine_is_the_cable_or_far_end() {
    let facts = with_port(module(|m| m.rx_los = vec![1, 2, 3, 4]));
    assert_eq!(cause(&down("mlx5_8"), &facts), (Cause::CableOrFarEnd, "Rx LOS on 4 of 4 lanes".into()));
    // link_downed is a link loss too.
    let ld = port_event(Check::InfiniBandDegradationCheck, Some("link_downed"), "mlx5_8", 1);
    assert_eq!(cause(&ld, &facts).0, Cause::CableOrFarEnd);
}

#[test]
fn rx_power_below_the_low_alarm_on_a_dead_port_is_the_cable_or_far_end() {
    let facts = with_port(module(|m| m.rx_below_low_alarm = vec![2]));
    assert_eq!(
        cause(&down("mlx5_8"), &facts),
        (Cause::CableOrFarEnd, "Rx power below the module's low alarm on 1 of 4 lanes".into())
    );
}

#[test]
fn rx_los_with_a_tx_fault_is_the_optic_not_the_cable() {
    let facts = with_port(module(|m| {
        m.rx_los = vec![1, 2, 3, 4];
        m.tx_fault = vec![1, 2];
    }));
    assert_eq!(cause(&down("mlx5_8"), &facts), (Cause::Optic, "Tx fault, lanes 1\u{2013}2".into()));
    // Tx LOS alone does not make it the optic, but the receive side no longer decides.
    let facts = with_port(module(|m| {
        m.rx_los = vec![1];
        m.tx_los = vec![1];
    }));
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::Unknown);
}

#[test]
fn a_cmis_module_fault_or_a_temperature_alarm_is_the_optic() {
    let facts = with_port(module(|m| m.module_fault = Some("CMIS module state Fault".into())));
    assert_eq!(cause(&down("mlx5_8"), &facts), (Cause::Optic, "CMIS module state Fault".into()));
    let facts = with_port(module(|m| m.temperature_alarm = Some("module at 81.0 C, alarm 75.0 C".into())));
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::Optic);
}

#[test]
fn low_rx_power_explains_errors_but_not_a_port_down_alone() {
    let facts = with_port(module(|m| m.rx_below_low_warning = vec![3]));
    let ber = port_event(Check::EthernetDegradationCheck, Some("pre_fec_ber"), "mlx5_8", 1);
    assert_eq!(cause(&ber, &facts), (Cause::CableOrFarEnd, "Rx power below the module's low warning on lane 3".into()));
    // Below the warning (not the alarm) and no Rx LOS: a dead port is not explained by it.
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::Unknown);
}

#[test]
fn nothing_known_is_unknown_never_a_guess() {
    assert_eq!(cause(&down("mlx5_8"), &Facts::default()), (Cause::Unknown, String::new()));
    // A healthy module: nothing decides.
    assert_eq!(cause(&down("mlx5_8"), &with_port(module(|_| {}))).0, Cause::Unknown);
    // Another port's module says nothing about this one.
    let facts = with_port(module(|m| m.rx_los = vec![1]));
    assert_eq!(cause(&down("mlx5_9"), &facts).0, Cause::Unknown);
}

#[test]
fn device_facts_come_first_in_their_order() {
    let mut facts = with_port(module(|m| m.tx_fault = vec![1]));
    let dev = facts.devices.entry("mlx5_8".into()).or_default();
    dev.thermal = Some("asic at 110.0 C, critical 105.0 C".into());
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::NicThermal);
    facts.devices.get_mut("mlx5_8").unwrap().driver = Some("driver".into());
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::Driver);
    facts.devices.get_mut("mlx5_8").unwrap().pcie = Some("PCIe: aer_fatal".into());
    assert_eq!(cause(&down("mlx5_8"), &facts).0, Cause::Pcie);
    facts.devices.get_mut("mlx5_8").unwrap().firmware_fatal = Some("devlink fw_fatal".into());
    assert_eq!(cause(&down("mlx5_8"), &facts), (Cause::NicFirmware, "devlink fw_fatal".into()));
}

#[test]
fn a_card_event_asks_every_device_of_its_card() {
    let mut facts = Facts::default();
    facts.cards.insert("0000:15:00".into(), vec!["mlx5_3".into(), "mlx5_4".into()]);
    facts.devices.entry("mlx5_4".into()).or_default().pcie = Some("PCIe: pcie_link_downtrained".into());
    let card = HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), at(), "Card has 0 active ports")
        .unhealthy(true)
        .entities(vec![Entity::card("0000:15:00")]);
    assert_eq!(cause(&card, &facts).0, Cause::Pcie);
}

#[test]
fn annotate_ends_the_message_with_the_cause_and_fills_the_metadata() {
    let facts = with_port(module(|m| m.rx_los = vec![1, 2, 3, 4]));
    let healthy = HealthEvent::new(Check::EthernetStateCheck, &Stamp::default(), at(), "healthy");
    let mut events = vec![down("mlx5_8"), down("mlx5_9"), healthy.clone()];
    annotate(&mut events, &facts);
    assert_eq!(
        events[0].message,
        "Port mlx5_8 port 1: state DOWN - probable cause: cable-or-far-end (Rx LOS on 4 of 4 lanes)"
    );
    assert_eq!(events[0].metadata[CAUSE_KEY], "cable-or-far-end");
    assert_eq!(events[0].metadata[EVIDENCE_KEY], "Rx LOS on 4 of 4 lanes");
    assert_eq!(events[1].message, "Port mlx5_9 port 1: state DOWN - probable cause: unknown");
    assert_eq!((events[1].metadata[CAUSE_KEY].as_str(), events[1].metadata.get(EVIDENCE_KEY)), ("unknown", None));
    assert_eq!(events[2], healthy, "a healthy event is left as it is");
    // Upstream's fields do not move.
    assert!(events[0].is_fatal && events[0].check_name == "EthernetStateCheck" && events[0].error_code.is_empty());
}

#[test]
fn a_long_message_gives_way_to_the_cause() {
    let mut e = down("mlx5_8");
    e.message = "x".repeat(MAX_MESSAGE_LEN);
    let mut events = vec![e];
    annotate(&mut events, &with_port(module(|m| m.tx_fault = vec![2])));
    assert!(events[0].message.len() <= MAX_MESSAGE_LEN);
    assert!(events[0].message.ends_with(" - probable cause: optic (Tx fault, lane 2)"), "{}", events[0].message);
}

#[test]
fn base_facts_read_the_pci_probe_and_this_polls_kernel_log_and_pcie_events() {
    let mut snapshot = Snapshot::default();
    snapshot.pci_probes.insert("mlx5_6".into(), PciPresence::AllOnes);
    snapshot.pci_probes.insert("mlx5_7".into(), PciPresence::Present);
    snapshot.pci_probes.insert("mlx5_5".into(), PciPresence::Gone);
    let kmsg = HealthEvent::new(Check::NICKernelLogCheck, &Stamp::default(), at(), "health compromised")
        .unhealthy(true)
        .error_code("health_compromised")
        .entities(vec![Entity::device("mlx5_2")]);
    let watchdog = HealthEvent::new(Check::NICKernelLogCheck, &Stamp::default(), at(), "watchdog")
        .unhealthy(false)
        .error_code("netdev_watchdog")
        .entities(vec![Entity::device("mlx5_1")]);
    let held = BTreeMap::from([("mlx5_0".to_string(), "PCIe: pcie_link_downtrained".to_string())]);
    let facts = base_facts(&snapshot, &[kmsg.clone(), watchdog.clone()], &held);
    let gone = |name: &str| {
        HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), at(), "gone")
            .unhealthy(true)
            .entities(vec![Entity::device(name)])
    };
    assert_eq!(cause(&gone("mlx5_6"), &facts), (Cause::Pcie, "PCI config space reads 0xFF".into()));
    assert_eq!(cause(&gone("mlx5_7"), &facts).0, Cause::Driver);
    assert_eq!(cause(&gone("mlx5_5"), &facts).0, Cause::Unknown, "a clean removal names no part");
    assert_eq!(cause(&kmsg, &facts), (Cause::NicFirmware, "kernel log: health_compromised".into()));
    assert_eq!(cause(&watchdog, &facts).0, Cause::Unknown);
    assert_eq!(cause(&down("mlx5_0"), &facts).0, Cause::Pcie);
}

fn pf(name: &str, pci: &str) -> crate::model::Device {
    crate::model::Device {
        pci_address: Some(pci.into()),
        card: Some(pci[..10].into()),
        ..crate::model::Device::pf(name, Vec::new())
    }
}

/// A sensor at its critical temperature makes the NIC's dead port `nic-thermal`; one 5 °C
/// below it (overheating, not yet critical) decides nothing. A devlink `fw_fatal` event names
/// the firmware for every function of its card.
#[test]
fn base_facts_read_the_sensors_and_the_firmware_check() {
    use crate::model::thermal::Sensor;
    let sensor = |input: i64| Sensor {
        hwmon: "hwmon3".into(),
        channel: 1,
        label: Some("asic".into()),
        input: Some(input),
        crit: Some(105_000),
        highest: None,
    };
    let mut snapshot = Snapshot {
        devices: vec![
            std::sync::Arc::new(pf("mlx5_0", "0000:3b:00.0")),
            std::sync::Arc::new(pf("mlx5_1", "0000:3b:00.1")),
            std::sync::Arc::new(pf("mlx5_8", "0000:5e:00.0")),
        ],
        ..Snapshot::default()
    };
    std::sync::Arc::make_mut(&mut snapshot.thermal).insert("0000:5e:00.0".into(), vec![sensor(105_000)]);
    std::sync::Arc::make_mut(&mut snapshot.thermal).insert("0000:3b:00.0".into(), vec![sensor(100_000)]);
    let fw = HealthEvent::new(Check::NICFirmwareCheck, &Stamp::default(), at(), "fw fatal")
        .unhealthy(true)
        .error_code("fw_fatal")
        .entities(vec![Entity::device("mlx5_0")]);
    let card = HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), at(), "card")
        .unhealthy(true)
        .entities(vec![Entity::card("0000:3b:00")]);
    // The facts of the poll whose events they diagnose.
    let facts = base_facts(&snapshot, &[fw.clone(), card.clone()], &BTreeMap::new());
    assert_eq!(cause(&down("mlx5_8"), &facts), (Cause::NicThermal, "sensor asic at 105.0 C, critical 105.0 C".into()));
    assert_eq!(cause(&fw, &facts), (Cause::NicFirmware, "devlink health: fw_fatal".into()));
    assert_eq!(cause(&card, &facts).0, Cause::NicFirmware, "the card of the function whose firmware failed");
    assert_eq!(cause(&down("mlx5_1"), &facts).0, Cause::Unknown, "100 C of 105 C is not critical");
}
