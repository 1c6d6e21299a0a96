//! Link state scenarios (issue: state monitoring): each test drives a testbed node through
//! successive `nicmon check --state-file … --now …` cycles and asserts the exact events.
use nicmon_tests::platforms::Platform;
use nicmon_tests::{NicSpec, Node, Timeline, brief};

fn unhealthy(events: &[serde_json::Value]) -> Vec<(String, bool, bool, String, String)> {
    events.iter().map(brief).filter(|b| !b.1).collect()
}

/// A card-level event (entity `NIC=<card>` only) of `check`: (healthy, fatal).
fn card_event(e: &serde_json::Value, check: &str) -> (bool, bool) {
    let b = brief(e);
    assert_eq!(b.0, check, "{e:#}");
    assert!(b.3.starts_with("NIC=") && !b.3.contains("NICPort") && b.3.contains(':'), "card entity: {e:#}");
    (b.1, b.2)
}

/// Fresh start: one healthy baseline per monitored PF port, nothing else.
fn baseline(tl: &Timeline, expected_ports: usize) {
    let ev = tl.poll(0);
    assert_eq!(ev.len(), expected_ports, "{ev:#?}");
    assert!(ev.iter().all(|e| e["isHealthy"] == true));
}

#[test]
fn cable_pull_repair_and_transitions_on_h100() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    assert!(tl.poll(1).is_empty());

    // Cable pull on a compute port: DOWN/Polling, its card below its peers → one fatal
    // port event, and the card's own event alongside it (SPEC §1.3, upstream: the card
    // event is no longer dropped when a port event covers the card).
    node.pull_cable("mlx5_3", 1);
    let ev = tl.poll(2);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(card_event(&ev[1], "InfiniBandStateCheck"), (false, true));
    assert!(
        ev[1]["message"].as_str().unwrap().contains("has 1 active ports, expected 2 (peer mode)"),
        "{}",
        ev[1]["message"]
    );
    let e = &ev[0];
    assert_eq!(brief(e), ("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_3 NICPort=1".into(), String::new()));
    assert_eq!(e["recommendedAction"], "REPLACE_VM");
    assert_eq!(e["agent"], "nic-health-monitor");
    assert_eq!(e["componentClass"], "NIC");
    assert_eq!(e["nodeName"], "node-a");
    assert_eq!(e["processingStrategy"], "EXECUTE_REMEDIATION");
    assert_eq!(e["version"], 1);
    assert_eq!(e["generatedTimestamp"], tl.at(2));
    assert!(e["message"].as_str().unwrap().starts_with("Port mlx5_3 port 1: state DOWN, phys_state Polling"));
    assert!(tl.poll(3).is_empty(), "still down: nothing");

    // DOWN/Polling → DOWN/Disabled while already fatal: nothing.
    node.set_port("mlx5_3", 1, "1: DOWN", "3: Disabled");
    assert!(tl.poll(4).is_empty());
    node.set_port("mlx5_3", 1, "1: DOWN", "2: Polling");
    assert!(tl.poll(5).is_empty());

    // Repair → one healthy port event, and the card's.
    node.repair("mlx5_3", 1);
    let ev = tl.poll(6);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(card_event(&ev[1], "InfiniBandStateCheck"), (true, false));
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), true, false, "NIC=mlx5_3 NICPort=1".into(), String::new())
    );
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    assert_eq!(ev[0]["message"], "Port mlx5_3 port 1: healthy (ACTIVE, LinkUp)");
    assert!(tl.poll(7).is_empty());
}

/// A single dual-port IB card: no peers, so no card evidence — states are judged alone.
fn lone_card() -> Node {
    let mut n = Node::new("lone");
    let rc = n.root_complex(0, 0);
    let rp = n.root_port(&rc, 1);
    let sw = n.switch(&rp);
    let a = n.switch_port(&sw, 0);
    let b = n.switch_port(&sw, 1);
    n.gpu(&a, 0);
    n.card(&b, 0, vec![NicSpec::ib("mlx5_0"), NicSpec::ib("mlx5_1")]);
    n.write_metadata();
    n
}

#[test]
fn init_armed_polling_are_non_fatal_and_escalate_after_the_grace() {
    for (state, phys) in [("2: INIT", "5: LinkUp"), ("3: ARMED", "5: LinkUp"), ("1: DOWN", "2: Polling")] {
        let node = lone_card();
        let tl = Timeline::new(&node);
        baseline(&tl, 2);
        node.set_port("mlx5_0", 1, state, phys);
        let ev = tl.poll(1);
        assert_eq!(
            unhealthy(&ev),
            vec![("InfiniBandStateCheck".into(), false, false, "NIC=mlx5_0 NICPort=1".into(), String::new())],
            "{state}/{phys}"
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["recommendedAction"], "NONE");
        assert!(tl.poll(20).is_empty(), "{state}: within the 30 s grace");
        // Non-fatal → fatal escalation: one more event.
        let ev = tl.poll(31);
        assert_eq!(
            unhealthy(&ev),
            vec![("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_0 NICPort=1".into(), String::new())],
            "{state}"
        );
        assert!(ev[0]["message"].as_str().unwrap().contains("still unhealthy after 30 s"));
        assert!(tl.poll(40).is_empty());
    }
}

#[test]
fn non_fatal_then_disabled_escalates_with_one_event() {
    let node = lone_card();
    let tl = Timeline::new(&node);
    baseline(&tl, 2);
    node.set_port("mlx5_1", 1, "2: INIT", "5: LinkUp");
    assert_eq!(unhealthy(&tl.poll(1)).len(), 1);
    node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
    let ev = tl.poll(2);
    assert_eq!(
        unhealthy(&ev),
        vec![("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_1 NICPort=1".into(), String::new())]
    );
    assert_eq!(ev.len(), 1);
}

#[test]
fn roce_port_down_is_fatal_with_operstate() {
    let node = Platform::L40sOci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 6);
    node.set_port("mlx5_2", 1, "1: DOWN", "3: Disabled");
    node.set_operstate("rdma2", "down");
    let ev = tl.poll(1);
    // The port event, and its card's (below its storage peers) alongside it.
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(card_event(&ev[1], "EthernetStateCheck"), (false, true));
    assert_eq!(brief(&ev[0]), ("EthernetStateCheck".into(), false, true, "NIC=mlx5_2 NICPort=1".into(), String::new()));
    assert_eq!(
        ev[0]["message"],
        "RoCE port mlx5_2 port 1: state DOWN, phys_state Disabled, operstate down - probable cause: unknown"
    );
    assert_eq!(ev[0]["metadata"]["probableCause"], "unknown");
}

#[test]
fn vfs_and_management_nics_never_produce_events() {
    let node = Platform::DgxH100.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 12);
    // The 16 VFs are already DOWN; flap them anyway.
    for vf in (12..28).map(|i| format!("mlx5_{i}")) {
        node.set_port(&vf, 1, "4: ACTIVE", "5: LinkUp");
    }
    assert!(tl.poll(1).is_empty());
    for vf in (12..28).map(|i| format!("mlx5_{i}")) {
        node.set_port(&vf, 1, "1: DOWN", "3: Disabled");
    }
    assert!(tl.poll(2).is_empty());

    let node = Platform::A100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 16);
    node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
    node.set_port("mlx5_13", 1, "1: DOWN", "3: Disabled");
    assert!(tl.poll(1).is_empty(), "management NICs DOWN: nothing");
}

#[test]
fn fresh_start_uncabled_second_ports_and_one_anomalous_card() {
    let node = Platform::H100Oci.build();
    // Every dual-port compute card has its second port uncabled.
    let seconds = ["mlx5_1", "mlx5_4", "mlx5_6", "mlx5_8", "mlx5_10", "mlx5_13", "mlx5_15", "mlx5_17"];
    for d in seconds {
        node.set_port(d, 1, "1: DOWN", "2: Polling");
    }
    let tl = Timeline::new(&node);
    let ev = tl.poll(0);
    assert!(unhealthy(&ev).is_empty(), "{ev:#?}");
    assert_eq!(ev.len(), 10, "healthy baselines only for the 10 cabled ports");
    for t in 1..=4 {
        assert!(tl.poll(t).is_empty());
    }

    // Another fresh start where one card has fewer active ports than its peers.
    let node = Platform::H100Oci.build();
    for d in seconds {
        node.set_port(d, 1, "1: DOWN", "2: Polling");
    }
    node.set_port("mlx5_7", 1, "1: DOWN", "2: Polling");
    let tl = Timeline::new(&node);
    let ev = tl.poll(0);
    let card = node.info["mlx5_7"].bdf[..10].to_string();
    assert_eq!(
        unhealthy(&ev),
        vec![("InfiniBandStateCheck".into(), false, true, format!("NIC={card}"), String::new())]
    );
    assert_eq!(ev.len(), 10, "9 baselines + 1 card-level fatal: {ev:#?}");
    assert!(tl.poll(1).is_empty(), "reported once");

    // A tie between modes decides nothing: 2 IB cards, one with 1 active port, one with 2.
    let mut node = Node::new("tie");
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::ib("mlx5_0"), NicSpec::ib("mlx5_1")]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::ib("mlx5_2"), NicSpec::ib("mlx5_3")]);
    node.set_port("mlx5_3", 1, "1: DOWN", "3: Disabled");
    let tl = Timeline::new(&node);
    let ev = tl.poll(0);
    assert!(unhealthy(&ev).is_empty(), "{ev:#?}");
}

#[test]
fn device_removal_is_reported_on_the_third_miss_with_the_pci_verdict() {
    for (how, want) in [("gone", "gone from the bus"), ("ff", "reads 0xFF")] {
        let node = Platform::H100Oci.build();
        let tl = Timeline::new(&node);
        baseline(&tl, 18);
        if how == "gone" {
            node.remove_device("mlx5_5");
        } else {
            node.fall_off_bus("mlx5_5");
        }
        assert!(tl.poll(1).is_empty(), "miss 1");
        assert!(tl.poll(2).is_empty(), "miss 2");
        let ev = tl.poll(3);
        assert_eq!(ev.len(), 1, "{ev:#?}");
        assert_eq!(brief(&ev[0]), ("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_5".into(), String::new()));
        let msg = ev[0]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{how}: {msg}");
        assert!(tl.poll(4).is_empty(), "reported once");
        node.restore_device("mlx5_5");
        let ev = tl.poll(5);
        assert!(!ev.is_empty() && ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");
    }
}

#[test]
fn restart_recovery_reboot_and_corrupt_state() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    node.set_port("mlx5_9", 1, "1: DOWN", "3: Disabled");
    // The port event and its card's (below its peers).
    assert_eq!(unhealthy(&tl.poll(1)).len(), 2);
    // nicmon stops; the port is repaired meanwhile; nicmon restarts (same boot, state file).
    node.repair("mlx5_9", 1);
    let ev = tl.poll(30);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(card_event(&ev[1], "InfiniBandStateCheck"), (true, false));
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), true, false, "NIC=mlx5_9 NICPort=1".into(), String::new())
    );

    // Reboot: clear-all per check (no entities, 1 s earlier), then the baselines.
    let mut node = node;
    node.set_boot_id("11111111-2222-4333-8444-555555555555");
    let tl = Timeline::new(&node);
    let ev = tl.poll(100);
    let clears: Vec<_> = ev.iter().filter(|e| e["entitiesImpacted"].as_array().unwrap().is_empty()).collect();
    let checks: Vec<&str> = clears.iter().map(|e| e["checkName"].as_str().unwrap()).collect();
    assert_eq!(
        checks,
        [
            "InfiniBandStateCheck",
            "EthernetStateCheck",
            "EFAStateCheck",
            "InfiniBandDegradationCheck",
            "EthernetDegradationCheck",
            "EFADegradationCheck",
            "InfiniBandCharDeviceCheck",
            "NICKernelLogCheck",
            "NICPCIeCheck",
            "NICThermalCheck",
            "NICFirmwareCheck"
        ]
    );
    assert!(clears.iter().all(|e| e["isHealthy"] == true && e["generatedTimestamp"] == tl.at(99)));
    let port_baselines = ev
        .iter()
        .filter(|e| e["checkName"] == "InfiniBandStateCheck" || e["checkName"] == "EthernetStateCheck")
        .filter(|e| !e["entitiesImpacted"].as_array().unwrap().is_empty())
        .count();
    assert_eq!(port_baselines, 18);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "after a reboot onto healthy hardware: only healthy events");
    let counter_baselines = ev.iter().filter(|e| e["checkName"] == "InfiniBandDegradationCheck").count();
    assert!(counter_baselines > 0, "counter baselines after the reboot");
    assert!(ev[..5].iter().all(|e| e["entitiesImpacted"].as_array().unwrap().is_empty()), "clear-all first");

    // Corrupt state file: reboot semantics (clear-all, then baselines) with a warning, no crash.
    std::fs::write(&tl.state_file, "{\"version\": 1, \"port_states\": [tru").unwrap();
    let out = node.nicmon(
        "check",
        &[
            "--format",
            "json",
            "--config",
            "/nonexistent.toml",
            "--state-file",
            tl.state_file.to_str().unwrap(),
            "--metadata",
            node.metadata_path().to_str().unwrap(),
        ],
    );
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("starting fresh"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = v["events"].as_array().unwrap();
    let clears = ev.iter().take_while(|e| e["entitiesImpacted"].as_array().unwrap().is_empty()).count();
    assert!(clears > 0 && ev[..clears].iter().all(|e| e["isHealthy"] == true), "clear-all first: {ev:#?}");
    let ports = ev[clears..].iter().filter(|e| e["checkName"].as_str().unwrap().ends_with("StateCheck")).count();
    assert_eq!(ports, 18, "{ev:#?}");
}

#[test]
fn speed_degradation_and_subnet_manager_change() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    node.set_rate("mlx5_12", 1, "200 Gb/sec (2X NDR)");
    let ev = tl.poll(1);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), false, false, "NIC=mlx5_12 NICPort=1".into(), "LinkSpeedDegraded".into())
    );
    assert!(tl.poll(2).is_empty());
    node.set_rate("mlx5_12", 1, "400 Gb/sec (4X NDR)");
    let ev = tl.poll(3);
    assert!(brief(&ev[0]).1);

    node.set_sm_lid("mlx5_0", 1, 0x2);
    let ev = tl.poll(4);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), false, false, "NIC=mlx5_0 NICPort=1".into(), "SubnetManagerChanged".into())
    );
    assert!(tl.poll(5).is_empty());
}

#[test]
fn a_kill_during_the_state_write_never_leaves_a_half_written_file() {
    let node = Platform::DgxH100.build();
    let state = node.root().join("state.json");
    let meta = node.metadata_path();
    for i in 0..40u64 {
        // Alternate the port so every cycle has a state change to write.
        if i % 2 == 0 {
            node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
        } else {
            node.repair("mlx5_1", 1);
        }
        let mut child = std::process::Command::new(nicmon_tests::nicmon_bin())
            .args(["check", "--format", "json", "--config", "/nonexistent.toml"])
            .arg("--sysfs")
            .arg(node.sys())
            .arg("--procfs")
            .arg(node.proc())
            .arg("--metadata")
            .arg(&meta)
            .arg("--state-file")
            .arg(&state)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill at a spread of points in the cycle (the poll takes a few ms).
        std::thread::sleep(std::time::Duration::from_micros(500 * (i % 20)));
        let _ = child.kill();
        let _ = child.wait();
        if let Ok(bytes) = std::fs::read(&state) {
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("iteration {i}: half-written state file: {e}"));
            assert_eq!(v["version"], 1);
        }
        let leftovers: Vec<_> = std::fs::read_dir(node.root())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp"))
            .collect();
        // A temp file may remain after a kill; it is never the state file itself.
        assert!(leftovers.iter().all(|e| e.path() != state));
    }
}

#[test]
fn hold_down_blip_publishes_nothing_and_a_long_outage_is_reported_once_after_it() {
    let node = Platform::H100Oci.build();
    let cfg = node.root().join("hold.toml");
    std::fs::write(&cfg, "[stateCheck]\nportStateHoldDown = \"10s\"\n").unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--config".into(), cfg.to_str().unwrap().into()];
    baseline(&tl, 18);

    // A blip: down at t=1, still held at t=5, up at t=8 → nothing published, one blip.
    node.set_port("mlx5_9", 1, "1: DOWN", "3: Disabled");
    for t in [1, 5] {
        let r = tl.report(t);
        assert!(r["events"].as_array().unwrap().is_empty(), "held: neither port nor card event {r:#}");
        let held = r["held_ports"].as_array().unwrap();
        assert_eq!(held.len(), 1, "{held:#?}");
        assert_eq!((held[0]["device"].as_str(), held[0]["port"].as_u64()), (Some("mlx5_9"), Some(1)));
        assert_eq!(held[0]["state"], "DOWN/Disabled");
    }
    node.repair("mlx5_9", 1);
    let r = tl.report(8);
    assert!(r["events"].as_array().unwrap().is_empty(), "{r:#}");
    let blips = r["blips"].as_array().unwrap();
    assert_eq!(blips.len(), 1);
    assert_eq!(
        (blips[0]["check"].as_str(), blips[0]["device"].as_str()),
        (Some("InfiniBandStateCheck"), Some("mlx5_9"))
    );
    assert!(tl.report(9)["blips"].as_array().unwrap().is_empty(), "staying healthy is no blip");

    // A long outage: down at t=20, held until t=30, then the port and its card once.
    node.set_port("mlx5_9", 1, "1: DOWN", "3: Disabled");
    assert!(tl.poll(20).is_empty());
    assert!(tl.poll(29).is_empty(), "one second short of the hold-down");
    let ev = tl.poll(30);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_9 NICPort=1".into(), String::new())
    );
    assert_eq!(card_event(&ev[1], "InfiniBandStateCheck"), (false, true));
    assert!(tl.poll(31).is_empty(), "reported once");
    // The recovery is not held.
    node.repair("mlx5_9", 1);
    let ev = tl.poll(32);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert!(ev.iter().all(|e| e["isHealthy"] == true));

    // A bad value: exit 2, naming the key.
    std::fs::write(&cfg, "[stateCheck]\nportStateHoldDown = \"soon\"\n").unwrap();
    let meta = node.metadata_path();
    let out = node.nicmon("check", &["--config", cfg.to_str().unwrap(), "--metadata", meta.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stateCheck.portStateHoldDown = \"soon\""), "{err}");
}

/// SPEC §1.3: a non-escalating unhealthy state (`ACTIVE` + `LinkErrorRecovery`) stays
/// non-fatal on a card with no peer evidence, but on a card below its peers' mode it is
/// fatal at once, with the card's own event alongside.
#[test]
fn non_escalating_state_is_fatal_on_a_card_below_its_peers_only() {
    // Alone: non-fatal, and never escalated by time.
    let node = lone_card();
    let tl = Timeline::new(&node);
    baseline(&tl, 2);
    node.set_port("mlx5_0", 1, "4: ACTIVE", "6: LinkErrorRecovery");
    let ev = tl.poll(1);
    assert_eq!(
        unhealthy(&ev),
        vec![("InfiniBandStateCheck".into(), false, false, "NIC=mlx5_0 NICPort=1".into(), String::new())]
    );
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert!(tl.poll(40).is_empty(), "not an escalating state: no fatal after the grace");
    assert!(tl.poll(400).is_empty());

    // Below its peers (H100: the card has 1 active port, its peers 2): fatal at once.
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    baseline(&tl, 18);
    node.set_port("mlx5_3", 1, "4: ACTIVE", "6: LinkErrorRecovery");
    let ev = tl.poll(1);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(
        brief(&ev[0]),
        ("InfiniBandStateCheck".into(), false, true, "NIC=mlx5_3 NICPort=1".into(), String::new())
    );
    assert!(
        ev[0]["message"].as_str().unwrap().ends_with("has 1 active ports, its peers 2 - probable cause: unknown"),
        "{}",
        ev[0]["message"]
    );
    assert_eq!(card_event(&ev[1], "InfiniBandStateCheck"), (false, true));
    assert!(tl.poll(2).is_empty());
    node.repair("mlx5_3", 1);
    let ev = tl.poll(3);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert!(ev.iter().all(|e| e["isHealthy"] == true));
}

/// Three dual-PF RoCE cards beside a GPU (storage role); the first card's function 0
/// (`mlx5_0`, netdev `eth0`) carries the default route when `routed`: a management NIC.
fn management_sibling_node(routed: bool) -> Node {
    let mut n = Node::new("mgmt-sibling");
    let rc = n.root_complex(0, 0);
    let gpu = n.root_port(&rc, 1);
    n.gpu(&gpu, 0);
    for c in 0..3u8 {
        let rp = n.root_port(&rc, 2 + c);
        let (a, b) = (2 * c, 2 * c + 1);
        n.card(
            &rp,
            0,
            vec![
                NicSpec::eth(&format!("mlx5_{a}"), &format!("eth{a}")),
                NicSpec::eth(&format!("mlx5_{b}"), &format!("eth{b}")),
            ],
        );
    }
    if routed {
        n.default_route("eth0");
    }
    n.write_metadata();
    n
}

/// A card with a management NIC among its functions is exempt from the peer comparison
/// (upstream: "management NIC sibling"): its other function, uncabled, is not a card below
/// its peers, while that port keeps its own transitions; a card event latched on a card that
/// becomes exempt is cleared with upstream's healthy event.
#[test]
fn a_card_with_a_management_sibling_is_exempt_from_peer_comparison() {
    // Fresh start, the management NIC's sibling uncabled: only the 4 peers' baselines.
    let node = management_sibling_node(true);
    node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
    let tl = Timeline::new(&node);
    let ev = tl.poll(0);
    assert!(unhealthy(&ev).is_empty(), "{ev:#?}");
    assert_eq!(ev.len(), 4, "{ev:#?}");
    assert!(tl.poll(1).is_empty());
    // Its own transitions are still reported, with no card event.
    node.repair("mlx5_1", 1);
    let ev = tl.poll(2);
    assert_eq!(brief(&ev[0]), ("EthernetStateCheck".into(), true, false, "NIC=mlx5_1 NICPort=1".into(), String::new()));
    assert_eq!(ev.len(), 1, "{ev:#?}");
    node.pull_cable("mlx5_1", 1);
    let ev = tl.poll(3);
    assert_eq!(
        unhealthy(&ev),
        vec![("EthernetStateCheck".into(), false, true, "NIC=mlx5_1 NICPort=1".into(), String::new())]
    );
    assert_eq!(ev.len(), 1, "no card event: {ev:#?}");

    // Without the route the same card is compared: a pull is a card below its peers.
    let mut node = management_sibling_node(false);
    let tl = Timeline::new(&node);
    baseline(&tl, 6);
    node.pull_cable("mlx5_1", 1);
    let ev = tl.poll(1);
    assert_eq!(ev.len(), 2, "{ev:#?}");
    assert_eq!(card_event(&ev[1], "EthernetStateCheck"), (false, true));
    let card = node.info["mlx5_1"].bdf[..10].to_string();
    // mlx5_0 becomes the management NIC: the card is exempt, its latched event cleared.
    drop(tl);
    node.default_route("eth0");
    let tl = Timeline::new(&node);
    let ev = tl.poll(2);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(card_event(&ev[0], "EthernetStateCheck"), (true, false));
    assert_eq!(ev[0]["entitiesImpacted"][0]["entityValue"], card);
    assert_eq!(
        ev[0]["message"],
        format!("Card {card} exempt from peer comparison (management NIC sibling), clearing anomaly")
    );
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    assert!(tl.poll(3).is_empty(), "cleared once");
    assert!(tl.poll(4).is_empty());
}
