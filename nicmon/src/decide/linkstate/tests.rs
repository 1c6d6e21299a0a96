//! The evaluator as a whole: hold-down and flap damping together, over any sequence of polls.
use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

use super::flap::{ERROR_CODE, FlapConfig};
use super::{LinkState, StateConfig, evaluate};
use crate::decide::roles::{Classification, Role};
use crate::model::event::{EntityKind, HealthEvent, Stamp, Subject};
use crate::model::{Device, Function, LinkLayer, PhysState, Port, PortState, Snapshot};

const T0: OffsetDateTime = datetime!(2026-01-01 00:00:00 UTC);

/// Three single-port InfiniBand compute cards; `mlx5_0`'s port is up or down.
fn snapshot(up: bool) -> Snapshot {
    let dev = |i: u32, up: bool| Device {
        name: format!("mlx5_{i}"),
        unsupported: None,
        pci_address: Some(format!("0000:{:02x}:00.0", 0x10 + i)),
        card: Some(format!("0000:{:02x}:00", 0x10 + i)),
        numa_node: Some(0),
        hca_type: None,
        fw_ver: None,
        board_id: None,
        driver: Some("mlx5_core".into()),
        rdma_driver: None,
        function: Function::Pf,
        netdev: None,
        ports: vec![Port {
            number: 1,
            link_layer: Some(LinkLayer::InfiniBand),
            state: Some(if up { PortState::Active } else { PortState::Down }),
            phys_state: Some(if up { PhysState::LinkUp } else { PhysState::Disabled }),
            ..Port::default()
        }],
        unknown: Default::default(),
        pcie: None,
    };
    Snapshot { devices: vec![dev(0, up).into(), dev(1, true).into(), dev(2, true).into()], ..Snapshot::default() }
}

fn roles() -> BTreeMap<String, Classification> {
    (0..3)
        .map(|i| {
            let c = Classification { monitored: true, reason: None, role: Some(Role::Compute), role_reason: None };
            (format!("mlx5_{i}"), c)
        })
        .collect()
}

fn is_port(e: &HealthEvent) -> bool {
    e.entities_impacted.iter().any(|x| x.wire_type() == "NICPort")
}

proptest! {
    /// Any sequence of up/down polls of one port, with or without a hold-down and flap
    /// damping: never a panic; an unhealthy port event (other than a "port flapping" one)
    /// only after the port has been down for the hold-down; boundary crossings only; at
    /// most one "port flapping" event per hold; no card event while the port is held as
    /// flapping (after the poll of its flapping event).
    #[test]
    fn hold_down_and_flap_damping_together(
        hold_ms in prop_oneof![Just(0i64), 100i64..5000],
        threshold in prop_oneof![Just(0u32), 2u32..5],
        steps in proptest::collection::vec((any::<bool>(), 1i64..3000), 1..120),
    ) {
        let cfg = StateConfig {
            port_state_hold_down: Duration::milliseconds(hold_ms),
            flap: FlapConfig { threshold, window: Duration::seconds(20), settle: Duration::seconds(10) },
            ..StateConfig::default()
        };
        let stamp = Stamp::default();
        let roles = roles();
        let mut now = T0;
        let out = evaluate(&LinkState::default(), true, &snapshot(true), &roles, &cfg, now, &stamp, &BTreeSet::new());
        let mut st = out.state;
        let mut down_since: Option<OffsetDateTime> = None;
        let mut last_port_healthy = true;
        let mut flapping = false;
        for (up, dt) in steps {
            now += Duration::milliseconds(dt);
            if up {
                down_since = None;
            } else {
                down_since.get_or_insert(now);
            }
            let out = evaluate(&st, false, &snapshot(up), &roles, &cfg, now, &stamp, &BTreeSet::new());
            let was_flapping = flapping;
            for e in out.events.iter().filter(|e| is_port(e)) {
                let flap_event = e.error_code.iter().any(|c| c == ERROR_CODE);
                if e.is_healthy {
                    prop_assert!(up, "healthy while down");
                    prop_assert!(!last_port_healthy, "healthy twice");
                    last_port_healthy = true;
                    flapping = false;
                } else {
                    prop_assert!(last_port_healthy || flap_event, "unhealthy twice: {e:?}");
                    prop_assert!(!was_flapping, "an event while held as flapping: {e:?}");
                    if flap_event {
                        prop_assert!(threshold > 0);
                        flapping = true;
                    } else {
                        let since = down_since.expect("unhealthy event while up");
                        prop_assert!(now - since >= cfg.port_state_hold_down, "published inside the hold-down");
                    }
                    last_port_healthy = false;
                }
            }
            if was_flapping && flapping {
                prop_assert!(out.events.iter().all(is_port), "a card event while flapping: {:?}", out.events);
            }
            prop_assert!(out.holds.held.len() <= 1 && out.holds.blips.len() <= 1);
            if !out.holds.held.is_empty() {
                prop_assert!(!up && !flapping);
            }
            st = out.state;
        }
    }
}

/// Each event of the port-state check names what it is about, typed from here to the
/// sinks: a port's state its port, a card below its peers its card (by PCI slot), a
/// device gone from `class/infiniband` the device.
#[test]
fn each_event_names_its_port_card_or_device() {
    let cfg = StateConfig::default();
    let stamp = Stamp::default();
    let roles = roles();
    let base = evaluate(&LinkState::default(), true, &snapshot(true), &roles, &cfg, T0, &stamp, &BTreeSet::new());
    let subjects = |events: &[HealthEvent]| -> Vec<(bool, String)> {
        events.iter().map(|e| (e.is_healthy, format!("{:?}", e.subject()))).collect()
    };
    assert!(base.events.iter().all(|e| e.is_healthy), "{:?}", subjects(&base.events));
    assert!(base.events.iter().any(|e| e.subject() == Subject::Port { device: "mlx5_0", port: 1 }));

    let down = evaluate(
        &base.state,
        false,
        &snapshot(false),
        &roles,
        &cfg,
        T0 + Duration::seconds(1),
        &stamp,
        &BTreeSet::new(),
    );
    let unhealthy: Vec<Subject<'_>> = down.events.iter().filter(|e| !e.is_healthy).map(HealthEvent::subject).collect();
    assert!(unhealthy.contains(&Subject::Port { device: "mlx5_0", port: 1 }), "{:?}", subjects(&down.events));
    assert!(unhealthy.contains(&Subject::Card("0000:10:00")), "{:?}", subjects(&down.events));
    let card = down.events.iter().find(|e| e.kind() == EntityKind::Card).unwrap();
    assert_eq!(card.entities_text(), "NIC=0000:10:00", "a card is `NIC` on the wire");

    let mut gone = snapshot(true);
    gone.devices.retain(|d| d.name != "mlx5_2");
    let mut st = base.state;
    let mut events = Vec::new();
    for i in 1..=super::disappearance::MISSES_BEFORE_REPORT {
        let out = evaluate(&st, false, &gone, &roles, &cfg, T0 + Duration::seconds(i.into()), &stamp, &BTreeSet::new());
        events.extend(out.events);
        st = out.state;
    }
    let gone: Vec<&HealthEvent> = events.iter().filter(|e| !e.is_healthy).collect();
    assert_eq!(gone.len(), 1, "{:?}", subjects(&events));
    assert_eq!(gone[0].subject(), Subject::Device("mlx5_2"));
}

/// The disappearance events of `mlx5_2` over the polls after it left, each poll with the
/// kernel's word `said` (what it said was removed): the poll of each event, 1-based.
fn mlx5_2_lost_at(said: &[&str]) -> Vec<u32> {
    let (cfg, stamp, roles) = (StateConfig::default(), Stamp::default(), roles());
    let mut present = snapshot(true);
    let mut dev = (*present.devices[2]).clone();
    dev.netdev = Some("eth2".into());
    present.devices[2] = dev.into();
    let base = evaluate(&LinkState::default(), true, &present, &roles, &cfg, T0, &stamp, &BTreeSet::new());
    assert_eq!(base.state.known_devices["mlx5_2"].netdev.as_deref(), Some("eth2"), "the netdev is remembered");
    let mut gone = present.clone();
    gone.devices.retain(|d| d.name != "mlx5_2");
    let said: BTreeSet<String> = said.iter().map(|s| s.to_string()).collect();
    let mut st = base.state;
    let mut lost = Vec::new();
    for i in 1..=super::disappearance::MISSES_BEFORE_REPORT + 1 {
        let out = evaluate(&st, false, &gone, &roles, &cfg, T0 + Duration::seconds(i.into()), &stamp, &said);
        for e in out.events.iter().filter(|e| !e.is_healthy) {
            assert_eq!(e.subject(), Subject::Device("mlx5_2"), "{e:?}");
            lost.push(i);
        }
        st = out.state;
    }
    lost
}

/// Without the kernel's word a missing device is reported after three polls; with it (the
/// device's name, its netdev or its PCI address removed) in the first poll that finds it
/// gone; a removal the kernel announced of another device changes nothing.
#[test]
fn the_kernel_word_reports_a_lost_device_at_once() {
    assert_eq!(mlx5_2_lost_at(&[]), vec![super::disappearance::MISSES_BEFORE_REPORT]);
    assert_eq!(mlx5_2_lost_at(&["mlx5_2"]), vec![1], "uevent remove of the RDMA device");
    assert_eq!(mlx5_2_lost_at(&["eth2"]), vec![1], "uevent remove / RTM_DELLINK of its netdev");
    assert_eq!(mlx5_2_lost_at(&["0000:12:00.0"]), vec![1], "uevent remove of its PCI function");
    assert_eq!(
        mlx5_2_lost_at(&["mlx5_1", "eth1", "0000:11:00.0", "eth0"]),
        vec![super::disappearance::MISSES_BEFORE_REPORT],
        "another device's removal does not speed this one up"
    );
}

/// The kernel's word for a device still present reports nothing (sysfs must confirm).
#[test]
fn the_kernel_word_alone_reports_nothing() {
    let (cfg, stamp, roles) = (StateConfig::default(), Stamp::default(), roles());
    let base = evaluate(&LinkState::default(), true, &snapshot(true), &roles, &cfg, T0, &stamp, &BTreeSet::new());
    let said: BTreeSet<String> = ["mlx5_2".to_string()].into();
    let out = evaluate(&base.state, false, &snapshot(true), &roles, &cfg, T0 + Duration::seconds(1), &stamp, &said);
    assert!(out.events.iter().all(|e| e.is_healthy), "{:?}", out.events);
    assert_eq!(out.state.known_devices["mlx5_2"].misses, 0);
}
