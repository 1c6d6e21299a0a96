use std::sync::Arc;

use super::*;
use crate::model::devlink::Reporter;

fn device(name: &str, pci: &str) -> Device {
    Device { pci_address: Some(pci.into()), card: Some(pci[..10].into()), ..Device::pf(name, Vec::new()) }
}

fn rep(name: &str, state: ReporterState, errors: u64) -> Reporter {
    Reporter { name: name.into(), state, error_count: errors, recover_count: errors }
}

/// Two PFs of one card (`0000:3b:00`): mlx5_0 and mlx5_1, with these reporters of mlx5_0.
fn snap(reporters: Vec<Reporter>) -> (Snapshot, BTreeMap<String, Classification>) {
    let mut s = Snapshot::default();
    let mut roles = BTreeMap::new();
    for (name, pci) in [("mlx5_0", "0000:3b:00.0"), ("mlx5_1", "0000:3b:00.1")] {
        s.devices.push(Arc::new(device(name, pci)));
        roles.insert(name.to_string(), Classification { monitored: true, reason: None, role: None, role_reason: None });
    }
    s.devlink.insert("0000:3b:00.0".into(), Reporters { reporters });
    (s, roles)
}

fn at(secs: i64) -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + Duration::seconds(secs)
}

fn run(prev: &FirmwareState, reporters: Vec<Reporter>, secs: i64) -> (Vec<HealthEvent>, FirmwareState) {
    let (s, roles) = snap(reporters);
    evaluate(prev, &s, &roles, at(secs), &Stamp::default())
}

fn brief(e: &HealthEvent) -> (bool, bool, String, String) {
    (e.is_healthy, e.is_fatal, e.error_code.join(","), e.entities_text())
}

use ReporterState::{Error, Healthy};

#[test]
fn a_count_there_at_start_is_a_baseline_a_rise_is_a_fault() {
    let all = |n: u64, s: ReporterState| vec![rep("fw", s, n), rep("fw_fatal", s, n), rep("tx", s, n), rep("rx", s, n)];
    let (ev, st) = run(&FirmwareState::default(), all(3, Healthy), 0);
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(st.counts["mlx5_0"]["fw_fatal"], 3);
    let (ev, st) = run(&st, all(3, Healthy), 1);
    assert!(ev.is_empty());
    let (ev, st) = run(&st, all(4, Error), 2);
    let got: Vec<_> = ev.iter().map(brief).collect();
    let want = |code: &str, fatal| (false, fatal, code.to_string(), "NIC=mlx5_0".to_string());
    assert_eq!(
        got,
        [want("fw_error", false), want("fw_fatal", true), want("tx_timeout", false), want("rx_error", false)]
    );
    let fatal = &ev[1];
    assert_eq!(fatal.recommended_action, crate::model::event::RecommendedAction::REPLACE_VM);
    assert!(fatal.message.contains("fw_fatal: error count 3 → 4 (state error"), "{}", fatal.message);
    assert_eq!(ev[0].recommended_action, crate::model::event::RecommendedAction::NONE);
    assert!(st.is_raised("mlx5_0", "tx_timeout") && !st.is_raised("mlx5_0", "fw_fatal"));
    // Healthy again, but not yet for CLEAR_AFTER: held; then the non-fatal ones clear.
    let (ev, st) = run(&st, all(4, Healthy), 200);
    assert!(ev.is_empty());
    let (ev, st) = run(&st, all(4, Healthy), 302);
    let got: Vec<_> = ev.iter().map(brief).collect();
    let healthy = |code: &str| (true, false, code.to_string(), "NIC=mlx5_0".to_string());
    assert_eq!(got, [healthy("fw_error"), healthy("tx_timeout"), healthy("rx_error")]);
    assert!(st.raised.is_empty());
    // A count that fell (driver reload) is a new baseline.
    let (ev, st) = run(&st, all(0, Healthy), 400);
    assert!(ev.is_empty());
    let (ev, _) = run(&st, all(1, Healthy), 401);
    assert_eq!(ev.len(), 4);
}

#[test]
fn an_error_state_at_first_read_is_a_fault() {
    let (ev, _) = run(&FirmwareState::default(), vec![rep("fw_fatal", Error, 1), rep("vnic", Error, 9)], 0);
    assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), [(false, true, "fw_fatal".into(), "NIC=mlx5_0".into())]);
    let (ev, _) = run(&FirmwareState::default(), vec![rep("fw_fatal", Error, 0)], 0);
    assert!(ev.is_empty());
}

#[test]
fn a_state_round_trips() {
    let (_, st) = run(&FirmwareState::default(), vec![rep("fw", Healthy, 0)], 0);
    let (_, st) = run(&st, vec![rep("fw", Error, 1)], 5);
    let mut st = st;
    st.last_fatal.insert("0000:3b:00".into(), at(5));
    let text = serde_json::to_string(&st).unwrap();
    assert!(text.contains("1970-01-01T00:00:05Z"), "{text}");
    assert_eq!(serde_json::from_str::<FirmwareState>(&text).unwrap(), st);
}

fn kmsg_fatal(device: &str, code: &str) -> HealthEvent {
    HealthEvent::new(Check::NICKernelLogCheck, &Stamp::default(), at(0), "x")
        .entities(vec![Entity::device(device)])
        .error_code(code)
        .unhealthy(true)
}

fn fw_fatal(device: &str) -> HealthEvent {
    HealthEvent::new(Check::NICFirmwareCheck, &Stamp::default(), at(0), "x")
        .entities(vec![Entity::device(device)])
        .error_code(FW_FATAL)
        .unhealthy(true)
}

fn card(d: &str) -> Option<String> {
    match d {
        "mlx5_0" | "mlx5_1" => Some("0000:3b:00".into()),
        "mlx5_2" => Some("0000:c1:00".into()),
        _ => None,
    }
}

fn checks(events: &[HealthEvent]) -> Vec<(String, String)> {
    events.iter().map(|e| (e.check_name.to_string(), e.entities_text())).collect()
}

#[test]
fn one_fatal_per_card_kernel_log_first() {
    let window = Duration::seconds(60);
    let mut last = BTreeMap::new();
    // The kernel log's line comes first (both PFs print it: the matcher's own dedup sends one).
    let mut ev = vec![kmsg_fatal("mlx5_0", "health_compromised")];
    dedup_fatals(&mut ev, &mut last, card, window, at(10));
    assert_eq!(ev.len(), 1);
    // devlink's rise on the other PF of the card 30 s later: nothing more.
    let mut ev = vec![fw_fatal("mlx5_1")];
    dedup_fatals(&mut ev, &mut last, card, window, at(40));
    assert!(ev.is_empty());
    // Another card is its own.
    let mut ev = vec![fw_fatal("mlx5_2")];
    dedup_fatals(&mut ev, &mut last, card, window, at(40));
    assert_eq!(ev.len(), 1);
    // After the window the card's next fatal is sent.
    let mut ev = vec![fw_fatal("mlx5_0")];
    dedup_fatals(&mut ev, &mut last, card, window, at(71));
    assert_eq!(ev.len(), 1);
}

#[test]
fn one_fatal_per_card_devlink_first() {
    let window = Duration::seconds(60);
    let mut last = BTreeMap::new();
    // Same poll, devlink's first in the list: the kernel log's line is dropped; non-firmware
    // kernel log fatals and healthy events pass.
    let pcie = kmsg_fatal("mlx5_0", "pcie_fatal");
    let mut ev = vec![fw_fatal("mlx5_0"), kmsg_fatal("mlx5_1", "fw_fatal_error"), pcie.clone()];
    dedup_fatals(&mut ev, &mut last, card, window, at(0));
    assert_eq!(
        checks(&ev),
        [("NICFirmwareCheck".into(), "NIC=mlx5_0".into()), ("NICKernelLogCheck".into(), "NIC=mlx5_0".into())]
    );
    assert_eq!(ev[1].error_code, ["pcie_fatal"]);
    // The kernel log sees it a poll later: dropped.
    let mut ev = vec![kmsg_fatal("mlx5_0", "health_recovery_failed")];
    dedup_fatals(&mut ev, &mut last, card, window, at(5));
    assert!(ev.is_empty());
    assert!(last.contains_key("0000:3b:00"));
}
