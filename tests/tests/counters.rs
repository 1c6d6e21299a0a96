//! Counter scenarios (issue: counter monitoring): each test drives a testbed node through
//! successive `nicmon check --state-file … --now …` cycles — every one a daemon poll cycle
//! and a process restart — and asserts the exact events.
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Timeline, brief};

type Brief = (String, bool, bool, String, String);

fn briefs(events: &[serde_json::Value]) -> Vec<Brief> {
    events.iter().map(brief).collect()
}

fn ib(healthy: bool, fatal: bool, dev: &str, code: &str) -> Brief {
    ("InfiniBandDegradationCheck".into(), healthy, fatal, format!("NIC={dev} NICPort=1"), code.into())
}

fn eth(healthy: bool, fatal: bool, dev: &str, code: &str) -> Brief {
    ("EthernetDegradationCheck".into(), healthy, fatal, format!("NIC={dev} NICPort=1"), code.into())
}

/// Fresh start: one healthy state baseline per monitored PF port, nothing else (counters
/// take their first snapshot silently).
fn baseline(tl: &Timeline, expected_ports: usize) {
    let ev = tl.poll(0);
    assert_eq!(ev.len(), expected_ports, "{ev:#?}");
    assert!(ev.iter().all(|e| e["isHealthy"] == true && e["checkName"].as_str().unwrap().ends_with("StateCheck")));
}

/// `devices[name].ports[port].counters` of a report.
fn counters_of(report: &serde_json::Value, dev: &str) -> serde_json::Map<String, serde_json::Value> {
    let d = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == dev).expect("device in report");
    d["ports"][0]["counters"].as_object().cloned().unwrap_or_default()
}

#[test]
fn link_downed_once_is_fatal_latches_and_recovers_on_admin_reset() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    assert!(tl.poll(1).is_empty());

    // mlx5_4 port 1 retrained once: link_downed 0 → 1.
    node.set_counter("mlx5_4", 1, "counters/link_downed", 1);
    let ev = tl.poll(2);
    assert_eq!(briefs(&ev), vec![ib(false, true, "mlx5_4", "link_downed")], "{ev:#?}");
    let e = &ev[0];
    assert_eq!(e["recommendedAction"], "REPLACE_VM");
    assert_eq!(e["agent"], "nic-health-monitor");
    assert_eq!(e["componentClass"], "NIC");
    assert_eq!(e["nodeName"], "node-a");
    assert_eq!(e["generatedTimestamp"], tl.at(2));
    let msg = e["message"].as_str().unwrap();
    assert!(msg.starts_with("Port mlx5_4 port 1: link_downed"), "{msg}");
    assert!(msg.contains("value=1, delta=1, rate=1.00/sec"), "{msg}");

    // Still at 1: latched, nothing; a further increment while latched: nothing either.
    assert!(tl.poll(3).is_empty());
    assert!(tl.poll(4).is_empty());
    node.set_counter("mlx5_4", 1, "counters/link_downed", 2);
    assert!(tl.poll(5).is_empty());

    // The admin clears the counters (perfquery -x): one recovery for that counter.
    node.set_counter("mlx5_4", 1, "counters/link_downed", 0);
    let ev = tl.poll(6);
    assert_eq!(briefs(&ev), vec![ib(true, false, "mlx5_4", "link_downed")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    assert_eq!(ev[0]["message"], "Counter link_downed recovered on port mlx5_4 port 1");
    assert!(tl.poll(7).is_empty());

    // Re-armed: the next link drop is reported again.
    node.set_counter("mlx5_4", 1, "counters/link_downed", 1);
    assert_eq!(briefs(&tl.poll(8)), vec![ib(false, true, "mlx5_4", "link_downed")]);
}

#[test]
fn link_downed_breach_survives_a_restart_with_a_gap_until_the_reset() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    node.set_counter("mlx5_9", 1, "counters/link_downed", 1);
    assert_eq!(briefs(&tl.poll(1)), vec![ib(false, true, "mlx5_9", "link_downed")]);

    // The agent is down for two hours (pod rescheduled); it comes back with the same state
    // file. The latch holds: nothing is re-sent, the counter is not re-baselined.
    let restarted = Timeline::new(&node);
    assert_eq!(restarted.state_file, tl.state_file);
    assert!(restarted.poll(7201).is_empty());
    assert!(restarted.poll(7202).is_empty());

    // Reset, reported after another gap: one recovery.
    node.set_counter("mlx5_9", 1, "counters/link_downed", 0);
    let ev = restarted.poll(10_000);
    assert_eq!(briefs(&ev), vec![ib(true, false, "mlx5_9", "link_downed")], "{ev:#?}");
    assert!(restarted.poll(10_001).is_empty());
}

#[test]
fn link_downed_reset_during_downtime_is_still_one_recovery() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    node.set_counter("mlx5_0", 1, "counters/link_downed", 3);
    assert_eq!(briefs(&tl.poll(1)), vec![ib(false, true, "mlx5_0", "link_downed")]);
    // Counter cleared while the agent was not running; it starts 10 minutes later.
    node.set_counter("mlx5_0", 1, "counters/link_downed", 0);
    let ev = tl.poll(601);
    assert_eq!(briefs(&ev), vec![ib(true, false, "mlx5_0", "link_downed")], "{ev:#?}");
    assert!(tl.poll(602).is_empty());
}

#[test]
fn symbol_errors_at_200_per_hour_are_fatal_once_the_hour_has_elapsed() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);

    // A marginal cable on mlx5_7 port 1: 200 symbol errors spread evenly over one hour,
    // polled every minute. 200/hour > 120/hour, but only a whole hour shows it.
    for minute in 1..60 {
        node.set_counter("mlx5_7", 1, "counters/symbol_error", 200 * minute / 60);
        let ev = tl.poll(60 * minute as i64);
        assert!(ev.is_empty(), "minute {minute}: {ev:#?}");
    }
    node.set_counter("mlx5_7", 1, "counters/symbol_error", 200);
    let ev = tl.poll(3600);
    assert_eq!(briefs(&ev), vec![ib(false, true, "mlx5_7", "symbol_error_fatal")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "REPLACE_VM");
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("value=200, delta=200, rate=200.00/hour"), "{msg}");

    // Then a burst: +100 within 5 s (polled at 3606 here) →
    // the per-second symbol_error rule, non-fatal; the fatal one stays latched.
    assert!(tl.poll(3601).is_empty());
    node.set_counter("mlx5_7", 1, "counters/symbol_error", 300);
    let ev = tl.poll(3606);
    assert_eq!(briefs(&ev), vec![ib(false, false, "mlx5_7", "symbol_error")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    assert!(ev[0]["message"].as_str().unwrap().contains("rate=20.00/sec"), "{ev:#?}");
    assert!(tl.poll(3607).is_empty());

    // The cable is replaced and the counters cleared: each rule recovers under its own
    // errorCode (one rule's recovery never clears the other's condition).
    node.set_counter("mlx5_7", 1, "counters/symbol_error", 0);
    assert_eq!(
        briefs(&tl.poll(3700)),
        vec![ib(true, false, "mlx5_7", "symbol_error"), ib(true, false, "mlx5_7", "symbol_error_fatal")]
    );
    assert!(tl.poll(3701).is_empty());
}

#[test]
fn symbol_error_burst_within_ten_seconds_is_non_fatal() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);

    // Exactly 10/s for 10 s at the 1 s cadence: at the threshold, not above it.
    for s in 1..=10 {
        node.set_counter("mlx5_12", 1, "counters/symbol_error", 10 * s);
        assert!(tl.poll(s as i64).is_empty(), "second {s}");
    }
    // +100 within the next 10 s, in two bursts: the first sample above 10/s fires.
    let bursts = [(11, 100), (12, 100), (13, 140), (14, 140), (15, 200), (20, 200)];
    let mut fired = Vec::new();
    for (t, v) in bursts {
        node.set_counter("mlx5_12", 1, "counters/symbol_error", v);
        fired.extend(tl.poll(t).into_iter().map(|e| (t, brief(&e))));
    }
    assert_eq!(fired, vec![(13, ib(false, false, "mlx5_12", "symbol_error"))]);
}

/// One `nicmon check` cycle of `tl` at `t` with info logs: (exit code, report, stderr).
fn check_logged(tl: &Timeline, t: i64) -> (Option<i32>, serde_json::Value, String) {
    let node = tl.node;
    let out = std::process::Command::new(nicmon_tests::nicmon_bin())
        .arg("check")
        .args(["--sysfs".as_ref(), node.sys().as_os_str()])
        .args(["--procfs".as_ref(), node.proc().as_os_str()])
        .args(["--metadata".as_ref(), node.metadata_path().as_os_str()])
        .args(["--config", "/nonexistent/nicmon.toml", "--format", "json", "--node-name", "node-a"])
        .args(["--state-file".as_ref(), tl.state_file.as_os_str()])
        .args(["--now", &tl.at(t)])
        .env("RUST_LOG", "info")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (out.status.code(), report, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn missing_hw_counter_fails_open() {
    let node = Platform::L40sOci.build();
    // This ConnectX generation has no roce_slow_restart on any port.
    for pf in node.pfs() {
        node.remove_port_file(&pf, 1, "hw_counters/roce_slow_restart");
    }
    let tl = Timeline::new(&node);
    let (code, report, stderr) = check_logged(&tl, 0);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("ERROR") && !stderr.contains("WARN"), "{stderr}");
    let ev = report["events"].as_array().unwrap();
    assert_eq!(ev.len(), 6, "state baselines only: {ev:#?}");
    let c = counters_of(&report, "mlx5_3");
    assert!(!c.contains_key("roce_slow_restart"), "{c:?}");
    assert_eq!(c["carrier_changes"], 2);
    // Said once, in one line naming the ports.
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("roce_slow_restart")).collect();
    assert_eq!(said.len(), 1, "{stderr}");
    assert!(said[0].contains("mlx5_0 port 1") && said[0].contains("mlx5_5 port 1"), "{stderr}");

    let (code, report, stderr) = check_logged(&tl, 1);
    assert_eq!(code, Some(0));
    assert!(report["events"].as_array().unwrap().is_empty());
    assert!(!stderr.contains("roce_slow_restart"), "only on the first poll of a boot: {stderr}");

    // The other counters of the same port are still watched.
    node.set_counter("mlx5_3", 1, "hw_counters/out_of_sequence", 5_000);
    assert_eq!(briefs(&tl.poll(2)), vec![eth(false, false, "mlx5_3", "out_of_sequence")]);
    assert!(tl.poll(3).is_empty());
}

#[test]
fn link_downed_saturated_at_255_is_one_non_fatal_saturation_event() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);

    node.set_counter("mlx5_5", 1, "counters/link_downed", 255);
    let ev = tl.poll(1);
    assert_eq!(briefs(&ev), vec![ib(false, false, "mlx5_5", "link_downed")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("CounterSaturated") && msg.contains("value 255") && msg.contains("8-bit"), "{msg}");
    assert!(msg.contains("counter reset is needed"), "{msg}");
    assert!(tl.poll(2).is_empty());
    assert!(tl.poll(3).is_empty());

    // The reset ends the episode.
    node.set_counter("mlx5_5", 1, "counters/link_downed", 0);
    assert_eq!(briefs(&tl.poll(4)), vec![ib(true, false, "mlx5_5", "link_downed")]);
    assert!(tl.poll(5).is_empty());
}

#[test]
fn link_downed_already_saturated_at_first_sight() {
    let node = Platform::H100Oci.build();
    node.set_counter("mlx5_6", 1, "counters/link_downed", 255);
    let tl = Timeline::new(&node);
    let ev = tl.poll(0);
    let counter_events: Vec<Brief> = briefs(&ev).into_iter().filter(|b| b.0 == "InfiniBandDegradationCheck").collect();
    assert_eq!(counter_events, vec![ib(false, false, "mlx5_6", "link_downed")]);
    assert_eq!(ev.len(), 19, "18 state baselines and the saturation: {ev:#?}");
    assert!(tl.poll(1).is_empty());
}

#[test]
fn velocity_unit_fortnight_stops_with_one_line_naming_the_entry_and_key() {
    let node = Platform::H100Oci.build();
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(
        &cfg,
        "[counterDetection]\nenabled = true\n\n[[counterDetection.counters]]\nname = \"port_xmit_wait\"\nenabled = false\n\n\
         [[counterDetection.counters]]\nname = \"link_error_recovery\"\nthresholdType = \"velocity\"\n\
         threshold = 5\nvelocityUnit = \"fortnight\"\n",
    )
    .unwrap();
    let state = node.root().join("state.json");
    let out = node.nicmon(
        "check",
        &["--format", "json", "--config", cfg.to_str().unwrap(), "--state-file", state.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line = lines[0];
    for part in
        [cfg.to_str().unwrap(), "counterDetection.counters[1]", "link_error_recovery", "velocityUnit", "fortnight"]
    {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    assert!(!state.exists(), "no poll ran");
}

#[test]
fn management_nic_and_vf_counters_are_never_evaluated() {
    // A100 OCI: mlx5_0 carries no GPU's traffic (NUMA 0, no GPU there): management.
    let node = Platform::A100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 16);
    for (t, v) in [(1, 1), (2, 5), (3, 255), (4, 0)] {
        node.set_counter("mlx5_0", 1, "counters/link_downed", v);
        node.set_counter("mlx5_13", 1, "counters/link_downed", v);
        node.set_counter("mlx5_0", 1, "carrier_changes", 100 * v);
        assert!(tl.poll(t).is_empty(), "management link_downed={v}");
    }
    // Shown to the operator, never judged.
    assert_eq!(counters_of(&tl.report(5), "mlx5_0")["link_downed"], 0);

    // DGX-H100: 16 VFs of the compute PFs.
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 12);
    let vfs: Vec<String> = node.info.iter().filter(|(_, i)| i.is_vf).map(|(n, _)| n.clone()).collect();
    assert_eq!(vfs.len(), 16);
    for (t, v) in [(1, 1), (2, 7), (3, 255), (4, 0)] {
        for vf in &vfs {
            node.set_counter(vf, 1, "counters/link_downed", v);
            node.set_counter(vf, 1, "counters/symbol_error", 10_000 * v);
            node.set_counter(vf, 1, "hw_counters/rnr_nak_retry_err", v);
        }
        assert!(tl.poll(t).is_empty(), "VF counters = {v}");
    }
    assert!(counters_of(&tl.report(5), &vfs[0]).is_empty(), "VF counters are not read");
}

#[test]
fn carrier_changes_on_a_roce_port_is_ethernet_degradation() {
    let node = Platform::L40sOci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 6);
    // +2 in one poll: not above the threshold of 2.
    node.set_counter("mlx5_4", 1, "carrier_changes", 4);
    assert!(tl.poll(1).is_empty());
    // +3 in one poll: the link is flapping.
    node.set_counter("mlx5_4", 1, "carrier_changes", 7);
    let ev = tl.poll(2);
    assert_eq!(briefs(&ev), vec![eth(false, false, "mlx5_4", "carrier_changes")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    assert!(ev[0]["message"].as_str().unwrap().contains("value=7, delta=3"), "{ev:#?}");
    node.set_counter("mlx5_4", 1, "carrier_changes", 20);
    assert!(tl.poll(3).is_empty(), "latched");
}

#[test]
fn counter_values_appear_in_the_report() {
    let node = Platform::H100Oci.build();
    node.set_counter("mlx5_0", 1, "counters/symbol_error", 42);
    node.set_counter("mlx5_0", 1, "counters/port_xmit_wait", 123_456_789);
    node.set_counter("mlx5_0", 1, "hw_counters/rnr_nak_retry_err", 0);
    node.set_counter("mlx5_2", 1, "carrier_changes", 9);
    let r = Timeline::new(&node).report(0);

    let c = counters_of(&r, "mlx5_0");
    assert_eq!(c["symbol_error"], 42);
    assert_eq!(c["port_xmit_wait"], 123_456_789);
    assert_eq!(c["rnr_nak_retry_err"], 0);
    assert_eq!(c["link_downed"], 0);
    assert!(!c.contains_key("carrier_changes"), "an IB port has no netdev: {c:?}");
    // Only the configured counters are read, by their file names: the rules' (the ECN/CNP
    // congestion counters are read on RoCE ports only, below).
    let mut names: Vec<&str> = c.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "excessive_buffer_overrun_errors",
            "link_downed",
            "link_error_recovery",
            "local_ack_timeout_err",
            "local_link_integrity_errors",
            "out_of_sequence",
            "port_rcv_errors",
            "port_xmit_discards",
            "port_xmit_wait",
            "rnr_nak_retry_err",
            "roce_slow_restart",
            "symbol_error",
        ]
    );
    let roce = counters_of(&r, "mlx5_2");
    assert_eq!(roce["carrier_changes"], 9);
    // A RoCE port: the ECN/CNP congestion counters too, while `[phyCheck]` is enabled
    // (metrics only).
    for c in ["np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled"] {
        assert_eq!(roce.get(c), Some(&serde_json::json!(0)), "{c}: {roce:?}");
    }

    // An unreadable counter is absent, not 0.
    node.write_port_file("mlx5_0", 1, "counters/symbol_error", "N/A (no PMA)\n");
    let r = node.check_json(&[]);
    assert!(!counters_of(&r, "mlx5_0").contains_key("symbol_error"));
}

#[test]
fn a_reboot_clears_the_latch_and_sends_counter_baselines() {
    let mut node = Platform::L40sOci.build();
    {
        let tl = Timeline::new(&node);
        baseline(&tl, 6);
        node.set_counter("mlx5_1", 1, "counters/link_downed", 1);
        assert_eq!(briefs(&tl.poll(1)), vec![eth(false, true, "mlx5_1", "link_downed")]);
    }

    // The node reboots; the counter comes back at 0. Same state file.
    node.set_counter("mlx5_1", 1, "counters/link_downed", 0);
    node.set_boot_id("5d0c6f7e-0000-4000-8000-000000000002");
    let tl = Timeline::new(&node);
    let ev = tl.poll(900);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");
    let for_link_downed: Vec<Brief> = briefs(&ev).into_iter().filter(|b| b.4 == "link_downed").collect();
    let expected: Vec<Brief> = (0..6).map(|i| eth(true, false, &format!("mlx5_{i}"), "link_downed")).collect();
    assert_eq!(for_link_downed, expected);
    assert!(tl.poll(901).is_empty());
    // Re-armed in the new boot.
    node.set_counter("mlx5_1", 1, "counters/link_downed", 1);
    assert_eq!(briefs(&tl.poll(902)), vec![eth(false, true, "mlx5_1", "link_downed")]);
}
