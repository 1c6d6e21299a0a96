//! PCIe scenarios (SPEC §1.10, `NICPCIeCheck`): each test drives a testbed node through
//! successive `nicmon check --state-file … --now …` cycles (each one daemon poll cycle) and
//! asserts the PCIe events exactly. The DGX H100 testbed: eight single-PF compute cards,
//! each below a PCIe switch it shares with a GPU, every link Gen5 x16 and no AER error.
use std::process::Command;

use nicmon_tests::pcie::AerFile;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, Timeline, brief, nicmon_bin};

type Brief = (String, bool, bool, String, String);

/// The PCIe events of a poll, briefly.
fn pcie(events: &[serde_json::Value]) -> Vec<Brief> {
    events.iter().filter(|e| e["checkName"] == "NICPCIeCheck").map(brief).collect()
}

fn ev(healthy: bool, fatal: bool, dev: &str, code: &str) -> Brief {
    ("NICPCIeCheck".into(), healthy, fatal, format!("NIC={dev}"), code.into())
}

/// The one PCIe event of a poll, with its brief.
fn only(events: &[serde_json::Value]) -> (Brief, serde_json::Value) {
    let mine: Vec<&serde_json::Value> = events.iter().filter(|e| e["checkName"] == "NICPCIeCheck").collect();
    assert_eq!(mine.len(), 1, "one PCIe event: {events:#?}");
    (brief(mine[0]), mine[0].clone())
}

fn device<'r>(report: &'r serde_json::Value, dev: &str) -> &'r serde_json::Value {
    report["devices"].as_array().unwrap().iter().find(|d| d["name"] == dev).expect("device in report")
}

/// A fresh start and a second poll: no PCIe event on a healthy node.
fn quiet_start(tl: &Timeline) {
    assert!(pcie(&tl.poll(0)).is_empty());
    assert!(pcie(&tl.poll(1)).is_empty());
}

#[test]
fn a_healthy_node_gives_no_pcie_event_and_check_shows_each_link() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    let report = tl.report(0);
    assert!(pcie(report["events"].as_array().unwrap()).is_empty(), "{:#?}", report["events"]);
    for t in 1..4 {
        assert!(pcie(&tl.poll(t)).is_empty());
    }
    let d = device(&report, "mlx5_3");
    assert_eq!(d["pcie"]["link"], "x16 Gen5", "{d:#}");
    assert_eq!(d["pcie"]["width"], 16);
    assert_eq!(d["pcie"]["speed_gts"], 32.0);
    assert_eq!(d["pcie"]["capable_width"], 16);
    assert_eq!(d["pcie"]["capable_speed_gts"], 32.0);
    assert_eq!(d["pcie"]["aer_fatal"], 0);
    assert!(d["pcie"]["upstream_port"].as_str().is_some_and(|u| !u.is_empty()));
    // A VF has no link of its own.
    let vf = report["devices"].as_array().unwrap().iter().find(|d| d["is_vf"] == true).expect("a VF");
    assert!(vf["pcie"].is_null(), "{vf:#}");

    // The table shows it too.
    let out = node.nicmon("check", &["--config", "/nonexistent/nicmon.toml"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().unwrap().contains("PCIE"), "{table}");
    let line = table.lines().find(|l| l.starts_with("mlx5_3 ")).expect("a line for mlx5_3");
    assert!(line.contains("x16 Gen5"), "{line}");
}

#[test]
fn a_link_at_x8_of_x16_is_one_non_fatal_event_naming_the_nic_cleared_on_retrain() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    quiet_start(&tl);

    node.set_pcie_link("mlx5_2", Some((8, 5)));
    let (b, e) = only(&tl.poll(2));
    assert_eq!(b, ev(false, false, "mlx5_2", "pcie_link_downtrained"));
    assert_eq!(e["recommendedAction"], "NONE");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("NIC mlx5_2") && msg.contains("x8 of x16"), "{msg}");
    assert!(!msg.contains("GT/s"), "only the width fell short: {msg}");
    // Below its seven role-group peers of the same model: named as such.
    assert!(msg.contains("below its 7 role-group peers") && msg.contains("x16 Gen5"), "{msg}");
    assert_eq!(device(&tl.report(3), "mlx5_2")["pcie"]["link"], "x8 Gen5");
    // Said once while it stays there.
    assert!(pcie(&tl.poll(4)).is_empty());

    // It retrains: one healthy event for the same NIC.
    node.set_pcie_link("mlx5_2", Some((16, 5)));
    let (b, e) = only(&tl.poll(5));
    assert_eq!(b, ev(true, false, "mlx5_2", "pcie_link_downtrained"));
    assert!(e["message"].as_str().unwrap().contains("trained back to x16 Gen5"), "{e:#}");
    assert!(pcie(&tl.poll(6)).is_empty());

    // A speed shortfall says both speeds.
    node.set_pcie_link("mlx5_5", Some((16, 4)));
    let (b, e) = only(&tl.poll(7));
    assert_eq!(b, ev(false, false, "mlx5_5", "pcie_link_downtrained"));
    assert!(e["message"].as_str().unwrap().contains("16.0 of 32.0 GT/s"), "{e:#}");
}

#[test]
fn a_gen5_nic_in_a_gen4_slot_at_gen4_is_not_degraded() {
    let node = Platform::DgxH100.build();
    node.set_slot_capability("mlx5_1", 16, 4);
    let tl = Timeline::new(&node);
    let report = tl.report(0);
    assert!(pcie(report["events"].as_array().unwrap()).is_empty(), "{:#?}", report["events"]);
    let d = device(&report, "mlx5_1");
    assert_eq!(d["pcie"]["link"], "x16 Gen4");
    assert_eq!(d["pcie"]["capable_speed_gts"], 16.0);
    assert!(pcie(&tl.poll(1)).is_empty());
    // An x8 slot (bifurcated port) with the card at x8: not degraded either.
    node.set_slot_capability("mlx5_1", 8, 4);
    assert!(pcie(&tl.poll(2)).is_empty());
    // Below even that slot: degraded.
    node.set_pcie_link("mlx5_1", Some((4, 4)));
    let (b, e) = only(&tl.poll(3));
    assert_eq!(b, ev(false, false, "mlx5_1", "pcie_link_downtrained"));
    assert!(e["message"].as_str().unwrap().contains("x4 of x8"), "{e:#}");
}

#[test]
fn a_link_that_is_down_is_unknown_not_downtrained() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    quiet_start(&tl);
    node.set_pcie_link("mlx5_4", None);
    assert!(pcie(&tl.poll(2)).is_empty());
    assert_eq!(device(&tl.report(3), "mlx5_4")["pcie"]["link"], "down");
}

#[test]
fn aer_fatal_total_0_to_1_is_one_fatal_event_naming_the_nic() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    quiet_start(&tl);
    node.set_aer("mlx5_6", AerFile::Fatal, &[("SDES", 1)]);
    let (b, e) = only(&tl.poll(2));
    assert_eq!(b, ev(false, true, "mlx5_6", "aer_fatal"));
    assert_eq!(e["recommendedAction"], "REPLACE_VM");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("NIC mlx5_6") && msg.contains("SDES +1") && msg.contains("TOTAL_ERR_FATAL +1"), "{msg}");
    // Latched: nothing more while it stays, nor when it counts again.
    assert!(pcie(&tl.poll(3)).is_empty());
    node.set_aer("mlx5_6", AerFile::Fatal, &[("SDES", 2)]);
    assert!(pcie(&tl.poll(4)).is_empty());

    // A non-fatal uncorrectable error elsewhere: non-fatal, naming its bit.
    node.set_aer("mlx5_0", AerFile::NonFatal, &[("CmpltTO", 1)]);
    let (b, e) = only(&tl.poll(5));
    assert_eq!(b, ev(false, false, "mlx5_0", "aer_nonfatal"));
    assert!(e["message"].as_str().unwrap().contains("CmpltTO +1"), "{e:#}");
}

#[test]
fn a_correctable_burst_above_the_threshold_is_one_non_fatal_event() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    quiet_start(&tl);
    // A handful in a minute: below 60/minute.
    node.set_aer("mlx5_7", AerFile::Correctable, &[("RxErr", 5)]);
    assert!(pcie(&tl.poll(61)).is_empty());
    // A burst: +118 BadTLP in the next minute.
    node.set_aer("mlx5_7", AerFile::Correctable, &[("RxErr", 5), ("BadTLP", 118)]);
    let (b, e) = only(&tl.poll(122));
    assert_eq!(b, ev(false, false, "mlx5_7", "aer_correctable"));
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("BadTLP +118") && !msg.contains("RxErr"), "the bits that moved: {msg}");
    assert!(msg.contains("above 60/min"), "{msg}");
    assert!(pcie(&tl.poll(183)).is_empty());
}

#[test]
fn the_correctable_threshold_is_configurable_and_the_check_can_be_turned_off() {
    let node = Platform::DgxH100.build();
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(&cfg, "[pcieCheck]\ncorrectableThreshold = 1000\ncorrectableVelocityUnit = \"minute\"\n").unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--config".into(), cfg.to_str().unwrap().into()];
    quiet_start(&tl);
    node.set_aer("mlx5_7", AerFile::Correctable, &[("BadTLP", 118)]);
    assert!(pcie(&tl.poll(62)).is_empty(), "118/min is below 1000/min");

    std::fs::write(&cfg, "[pcieCheck]\nenabled = false\n").unwrap();
    node.set_aer("mlx5_7", AerFile::Fatal, &[("DLP", 1)]);
    node.set_pcie_link("mlx5_3", Some((8, 5)));
    assert!(pcie(&tl.poll(63)).is_empty(), "the check is off");

    // Nor under a --checks list that does not name it (upstream's chart).
    let node = Platform::DgxH100.build();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--checks".into(), "InfiniBandStateCheck,InfiniBandDegradationCheck".into()];
    quiet_start(&tl);
    node.set_pcie_link("mlx5_3", Some((8, 5)));
    assert!(pcie(&tl.poll(2)).is_empty());
}

/// `nicmon check` with its notes on stderr (`RUST_LOG=info`).
fn check_with_notes(node: &Node, state: &str, now: &str) -> (serde_json::Value, String) {
    let out = Command::new(nicmon_bin())
        .arg("check")
        .args(["--sysfs", node.sys().to_str().unwrap(), "--procfs", node.proc().to_str().unwrap()])
        .args(["--config", "/nonexistent/nicmon.toml", "--format", "json", "--now", now])
        .args(["--state-file", state])
        .env_remove("NODE_NAME")
        .env("RUST_LOG", "info")
        .output()
        .expect("running nicmon");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn without_aer_files_no_event_no_error_spam_and_it_is_said_once() {
    let node = Platform::DgxH100.build();
    node.without_aer();
    let state = node.root().join("state.json");
    let state = state.to_str().unwrap();
    let at = |t: u32| format!("2026-09-01T00:00:{t:02}Z");
    let (report, log) = check_with_notes(&node, state, &at(0));
    assert!(pcie(report["events"].as_array().unwrap()).is_empty());
    let said: Vec<&str> = log.lines().filter(|l| l.contains("AER statistics not available")).collect();
    assert_eq!(said.len(), 1, "said once, in one line: {log}");
    assert!(said[0].contains("mlx5_0") && said[0].contains("mlx5_7"), "{}", said[0]);
    let errors = log.lines().filter(|l| (l.contains("ERROR") || l.contains("WARN")) && l.contains("aer"));
    assert_eq!(errors.count(), 0, "no error about the AER files: {log}");
    assert!(device(&report, "mlx5_0")["pcie"]["aer_fatal"].is_null());
    for t in 1..4 {
        let (report, log) = check_with_notes(&node, state, &at(t));
        assert!(pcie(report["events"].as_array().unwrap()).is_empty());
        assert!(!log.contains("AER"), "not said again: {log}");
    }
    // The link part still works without AER.
    node.set_pcie_link("mlx5_2", Some((8, 5)));
    let (report, _) = check_with_notes(&node, state, &at(5));
    let (b, _) = only(report["events"].as_array().unwrap());
    assert_eq!(b, ev(false, false, "mlx5_2", "pcie_link_downtrained"));
}

#[test]
fn aer_baselines_persist_across_restarts_and_a_reboot_clears() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    // A card that counted fatal errors before nicmon started: a baseline, not an event.
    node.set_aer("mlx5_3", AerFile::Fatal, &[("DLP", 2)]);
    quiet_start(&tl);
    let saved = std::fs::read_to_string(&tl.state_file).unwrap();
    assert!(saved.contains("aer_fatal"), "the AER baselines are in the state file: {saved}");
    node.set_aer("mlx5_3", AerFile::Fatal, &[("DLP", 3)]);
    let (b, _) = only(&tl.poll(2));
    assert_eq!(b, ev(false, true, "mlx5_3", "aer_fatal"));

    // A reboot: the check's clear (no entities), nothing per NIC; the count is a baseline.
    std::fs::write(node.proc().join("sys/kernel/random/boot_id"), "b00710ad-0000-4000-8000-000000000002\n").unwrap();
    let events = tl.poll(10);
    let mine: Vec<&serde_json::Value> = events.iter().filter(|e| e["checkName"] == "NICPCIeCheck").collect();
    assert_eq!(mine.len(), 1, "{mine:#?}");
    assert_eq!(mine[0]["isHealthy"], true);
    assert!(mine[0]["entitiesImpacted"].as_array().unwrap().is_empty());
    assert!(pcie(&tl.poll(11)).is_empty());
}
