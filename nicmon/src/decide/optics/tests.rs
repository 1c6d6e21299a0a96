//! Each optics condition raised and cleared on SFF-8636 and CMIS pages built at the spec's
//! offsets; Rx power judged only while the link is up; unread modules keep their verdicts.
use std::sync::Arc;

use super::*;
use crate::model::module::Pages;

fn put16(page: &mut [u8], at: usize, v: u16) {
    page[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// A QSFP56 (SFF-8636) at `temp` °C with every lane at `rx` mW (thresholds on page 03h:
/// temperature high warning 70 °C; Rx power low warning 0.1 mW, low alarm 0.05 mW) and
/// latched Rx LOS / Tx fault masks (byte 3 bits 0–3, byte 4 bits 0–3).
fn qsfp(temp: u16, rx: f64, los: u8, tx_fault: u8) -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x11;
    p0[3] = los;
    p0[4] = tx_fault;
    put16(&mut p0, 22, temp * 256);
    put16(&mut p0, 26, 33_000);
    for i in 0..4 {
        put16(&mut p0, 34 + 2 * i, (rx * 10_000.0) as u16);
        put16(&mut p0, 42 + 2 * i, 3500);
        put16(&mut p0, 50 + 2 * i, 10_000);
    }
    let mut p3 = vec![0u8; 128];
    for (i, t) in [75u16, 0, 70, 5].into_iter().enumerate() {
        put16(&mut p3, 2 * i, t * 256);
    }
    for (i, w) in [34_000u16, 500, 22_000, 1000].into_iter().enumerate() {
        put16(&mut p3, 48 + 2 * i, w);
    }
    Pages([(0, p0), (3, p3)].into())
}

/// An OSFP (CMIS) in module state `state` (3 Ready, 5 Fault) with fault cause `cause`.
fn osfp(state: u8, cause: u8) -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x19;
    p0[3] = state << 1;
    p0[41] = cause;
    put16(&mut p0, 14, 45 * 256);
    let mut p11 = vec![0u8; 128];
    p11[..4].fill(0x44);
    for i in 0..8 {
        put16(&mut p11, 58 + 2 * i, 8000);
    }
    Pages([(0, p0), (0x11, p11)].into())
}

fn snapshot(state: PortState, layer: LinkLayer, module: Option<Pages>) -> (Snapshot, BTreeMap<String, Classification>) {
    let port = Port {
        number: 1,
        link_layer: Some(layer),
        state: Some(state),
        module: module.map(Arc::new),
        ..Port::default()
    };
    let device = Device {
        pci_address: Some("0000:0c:00.0".into()),
        card: Some("0000:0c:00".into()),
        netdev: Some("eth2".into()),
        ..Device::pf("mlx5_0", vec![port])
    };
    let mut s = Snapshot::default();
    s.devices.push(Arc::new(device));
    let roles =
        [("mlx5_0".to_string(), Classification { monitored: true, reason: None, role: None, role_reason: None })]
            .into();
    (s, roles)
}

fn run(prev: &OpticsState, state: PortState, module: Option<Pages>) -> (Vec<HealthEvent>, OpticsState) {
    let (s, roles) = snapshot(state, LinkLayer::Ethernet, module);
    evaluate(prev, &s, &roles, OffsetDateTime::UNIX_EPOCH, &Stamp::default())
}

/// (healthy, code, message) of each event.
fn said(ev: &[HealthEvent]) -> Vec<(bool, String, String)> {
    ev.iter().map(|e| (e.is_healthy, e.error_code.join(","), e.message.clone())).collect()
}

#[test]
fn a_healthy_module_says_nothing() {
    let (ev, st) = run(&OpticsState::default(), PortState::Active, Some(qsfp(40, 0.8, 0, 0)));
    assert!(ev.is_empty() && st.is_empty(), "{ev:?}");
}

#[test]
fn rx_power_below_the_low_warning_while_up_is_raised_then_cleared() {
    let (ev, st) = run(&OpticsState::default(), PortState::Active, Some(qsfp(40, 0.08, 0, 0)));
    let e = &ev[0];
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(!e.is_healthy && !e.is_fatal, "{e:?}");
    assert_eq!(
        (e.check(), e.entities_text().as_str()),
        (Some(Check::EthernetDegradationCheck), "NIC=mlx5_0 NICPort=1")
    );
    assert_eq!(e.error_code, ["optic_rx_power_low"]);
    assert_eq!(
        e.message,
        "mlx5_0 port 1 QSFP28: Rx power below the module's low warning -10.0 dBm on lanes 1\u{2013}4: \
         lane 1 -11.0 dBm, lane 2 -11.0 dBm, lane 3 -11.0 dBm, lane 4 -11.0 dBm"
    );
    // Held while still low; the port going down does not clear it (not judged while down).
    let (ev, st) = run(&st, PortState::Active, Some(qsfp(40, 0.08, 0, 0)));
    assert!(ev.is_empty());
    let (ev, st) = run(&st, PortState::Down, Some(qsfp(40, 0.0, 0, 0)));
    assert!(ev.is_empty() && st.raised["mlx5_0:1"].contains("optic_rx_power_low"), "{ev:?}");
    // Up again with good light: cleared.
    let (ev, st) = run(&st, PortState::Active, Some(qsfp(40, 0.8, 0, 0)));
    assert_eq!(
        said(&ev),
        [(
            true,
            "optic_rx_power_low".into(),
            "mlx5_0 port 1 QSFP28: Rx power back above the module's low warning on every lane".into()
        )]
    );
    assert!(st.is_empty());
}

#[test]
fn a_port_down_with_weak_light_is_not_raised_low() {
    let (ev, st) = run(&OpticsState::default(), PortState::Down, Some(qsfp(40, 0.08, 0, 0)));
    assert!(ev.is_empty() && st.is_empty(), "{ev:?}");
}

#[test]
fn rx_los_tx_fault_and_temperature_each_their_event() {
    let (ev, st) = run(&OpticsState::default(), PortState::Down, Some(qsfp(72, 0.0, 0b1111, 0b0011)));
    let got: Vec<(bool, String)> = said(&ev).into_iter().map(|(h, c, _)| (h, c)).collect();
    assert_eq!(
        got,
        [(false, "optic_tx_fault".into()), (false, "optic_temperature".into()), (false, "optic_rx_los".into())]
    );
    assert!(ev[0].message.ends_with("Tx fault on lanes 1\u{2013}2"), "{}", ev[0].message);
    assert!(ev[1].message.ends_with("module at 72.0 °C, high warning 70.0 °C"), "{}", ev[1].message);
    assert!(ev[2].message.ends_with("Rx loss of signal on 4 of 4 lanes (lanes 1\u{2013}4)"), "{}", ev[2].message);
    // The Tx fault clears (its latch read clear), the rest holds.
    let (ev, st) = run(&st, PortState::Down, Some(qsfp(72, 0.0, 0b1111, 0)));
    assert_eq!(said(&ev), [(true, "optic_tx_fault".into(), "mlx5_0 port 1 QSFP28: no Tx fault".into())]);
    assert_eq!(st.raised["mlx5_0:1"].len(), 2);
    // Module not read this poll: every verdict stands, nothing said.
    let (ev, st2) = run(&st, PortState::Down, None);
    assert!(ev.is_empty() && st2 == st, "{ev:?}");
}

#[test]
fn cmis_module_fault_names_its_cause_on_the_infiniband_check() {
    let (s, roles) = snapshot(PortState::Down, LinkLayer::InfiniBand, Some(osfp(5, 1)));
    let (ev, st) = evaluate(&OpticsState::default(), &s, &roles, OffsetDateTime::UNIX_EPOCH, &Stamp::default());
    assert_eq!(
        said(&ev),
        [(false, "optic_module_fault".into(), "mlx5_0 port 1 OSFP: CMIS module state Fault (TEC runaway)".into())]
    );
    assert_eq!(ev[0].check(), Some(Check::InfiniBandDegradationCheck));
    let (s, roles) = snapshot(PortState::Active, LinkLayer::InfiniBand, Some(osfp(3, 0)));
    let (ev, st) = evaluate(&st, &s, &roles, OffsetDateTime::UNIX_EPOCH, &Stamp::default());
    assert_eq!(
        said(&ev),
        [(true, "optic_module_fault".into(), "mlx5_0 port 1 OSFP: module out of its Fault state".into())]
    );
    assert!(st.is_empty());
}

#[test]
fn unmonitored_devices_and_undecodable_pages_are_not_judged() {
    let (s, _) = snapshot(PortState::Active, LinkLayer::Ethernet, Some(qsfp(40, 0.0, 0b1111, 0)));
    let (ev, _) =
        evaluate(&OpticsState::default(), &s, &BTreeMap::new(), OffsetDateTime::UNIX_EPOCH, &Stamp::default());
    assert!(ev.is_empty());
    // An SFP (identifier 0x03) is not decoded: nothing judged, nothing said.
    let mut p = qsfp(40, 0.0, 0b1111, 0);
    p.0.get_mut(&0).unwrap()[0] = 0x03;
    let (ev, st) = run(&OpticsState::default(), PortState::Active, Some(p));
    assert!(ev.is_empty() && st.is_empty());
}

#[test]
fn the_state_round_trips_through_json() {
    let (_, st) = run(&OpticsState::default(), PortState::Down, Some(qsfp(72, 0.0, 0b1111, 0)));
    let text = serde_json::to_string(&st).unwrap();
    assert_eq!(serde_json::from_str::<OpticsState>(&text).unwrap(), st);
}
