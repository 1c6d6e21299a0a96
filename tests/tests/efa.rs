//! AWS EFA nodes: discovery, the report, and `EFADegradationCheck` (the `efa_*` counters,
//! device-level ones reported against port 1). Roles from metadata and from the sysfs
//! fallback are in `foundation.rs` (every platform).
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Timeline, brief};

fn efa_devices(report: &serde_json::Value) -> Vec<&serde_json::Value> {
    report["devices"].as_array().unwrap().iter().filter(|d| d["name"].as_str().unwrap().starts_with("rdmap")).collect()
}

#[test]
fn p5_and_p4d_show_efa_ports_monitored_as_compute() {
    for (p, efas, with_netdev) in [(Platform::AwsP5, 32, 8), (Platform::AwsP4d, 4, 4)] {
        let node = Platform::build(p);
        let r = node.check_json(&[]);
        let devs = efa_devices(&r);
        assert_eq!(devs.len(), efas, "{}", p.name());
        assert_eq!(r["devices"].as_array().unwrap().len(), efas, "{}: only the EFAs are RDMA devices", p.name());
        for d in &devs {
            assert_eq!(d["monitored"], true, "{d:#}");
            assert_eq!(d["role"], "compute", "{d:#}");
            assert_eq!(d["is_vf"], false);
            let port = &d["ports"][0];
            assert_eq!(port["link_layer"], "EFA", "{d:#}");
            assert_eq!(port["state"], "ACTIVE");
            assert_eq!(port["rate_gbps"], 100.0);
            // efa_* counters only: per-port rx_drops, device-level no_completion_cmds on port 1.
            let counters = port["counters"].as_object().unwrap();
            assert_eq!(counters["rx_drops"], 0);
            assert_eq!(counters["no_completion_cmds"], 0);
            assert!(!counters.contains_key("link_downed") && !counters.contains_key("symbol_error"));
        }
        let netdevs: Vec<_> = devs.iter().filter(|d| !d["netdev"].is_null()).collect();
        assert_eq!(netdevs.len(), with_netdev, "{}", p.name());
        assert!(netdevs.iter().all(|d| d["ports"][0]["operstate"] == "up" && d["ports"][0]["carrier"] == true));
        // EFA has no IB ports: no character devices expected; a fresh start says nothing.
        assert!(r["char_devices"].as_array().unwrap().is_empty());
        // A fresh start: one EFAStateCheck healthy baseline per EFA port, nothing else.
        let ev = r["events"].as_array().unwrap();
        assert_eq!(ev.len(), efas, "{ev:#?}");
        assert!(ev.iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"), "{ev:#?}");
    }
}

#[test]
fn efa_device_counter_breach_is_reported_on_port_1() {
    let node = Platform::AwsP4d.build();
    let dev = node.pfs()[1].clone();
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"));
    node.write_device_file(&dev, "hw_counters/no_completion_cmds", "3\n");
    let ev = tl.poll(1);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(
        brief(&ev[0]),
        ("EFADegradationCheck".into(), false, true, format!("NIC={dev} NICPort=1"), "efa_no_completion_cmds".into())
    );
    assert_eq!(ev[0]["recommendedAction"], "REPLACE_VM");
    assert!(ev[0]["message"].as_str().unwrap().contains("value=3, delta=3"), "{}", ev[0]["message"]);
    assert!(tl.poll(2).is_empty(), "latched");

    // A per-port counter: rx_drops above 100/s over a full second.
    node.set_counter(&dev, 1, "hw_counters/rx_drops", 500);
    let ev = tl.poll(3);
    assert_eq!(
        ev.iter().map(brief).collect::<Vec<_>>(),
        vec![("EFADegradationCheck".into(), false, false, format!("NIC={dev} NICPort=1"), "efa_rx_drops".into())]
    );
}

#[test]
fn efa_counters_reading_na_are_unknown_and_siblings_are_still_evaluated() {
    let node = Platform::AwsP4d.build();
    let pfs = node.pfs();
    let (odd, sibling) = (&pfs[0], &pfs[2]);
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"));
    node.write_device_file(odd, "hw_counters/no_completion_cmds", "N/A\n");
    node.write_port_file(odd, 1, "hw_counters/rx_drops", "N/A (no PMA)\n");
    node.write_device_file(sibling, "hw_counters/no_completion_cmds", "1\n");
    let (r, log) = poll_logged(&tl, 1);
    for rule in ["efa_no_completion_cmds", "efa_rx_drops"] {
        let note = format!(
            "counter {rule} on {odd} port 1: unreadable (file gone, or not a number such as N/A): not evaluated"
        );
        assert_eq!(log.matches(&note).count(), 1, "a clear note per counter: {log}");
    }
    let ev: Vec<_> = r["events"].as_array().unwrap().iter().map(brief).collect();
    assert_eq!(
        ev,
        vec![(
            "EFADegradationCheck".into(),
            false,
            true,
            format!("NIC={sibling} NICPort=1"),
            "efa_no_completion_cmds".into()
        )]
    );
    let d = r["devices"].as_array().unwrap().iter().find(|d| d["name"] == odd.as_str()).unwrap();
    let counters = d["ports"][0]["counters"].as_object().unwrap();
    assert!(!counters.contains_key("no_completion_cmds") && !counters.contains_key("rx_drops"), "{counters:?}");
    assert_eq!(counters["retrans_timeout_events"], 0, "the other counters are still read");
    let (_, log) = poll_logged(&tl, 2);
    assert!(!log.contains("unreadable"), "said once per episode: {log}");
    // Readable again: a value below nothing is a fresh baseline, not a breach.
    node.write_device_file(odd, "hw_counters/no_completion_cmds", "0\n");
    assert!(tl.poll(3).is_empty());
}

/// The EFA devices of a node that have a netdev, with it.
fn efa_with_netdev(node: &nicmon_tests::Node) -> Vec<(String, String)> {
    let r = node.check_json(&[]);
    efa_devices(&r)
        .into_iter()
        .filter_map(|d| Some((d["name"].as_str()?.to_string(), d["netdev"].as_str()?.to_string())))
        .collect()
}

/// One poll at `t` with `RUST_LOG=info`: (report, stderr).
fn poll_logged(tl: &Timeline, t: i64) -> (serde_json::Value, String) {
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
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    (serde_json::from_slice(&out.stdout).unwrap(), err)
}

#[test]
fn efa_netdev_down_is_fatal_with_its_card_and_up_recovers() {
    let node = Platform::AwsP5.build();
    let (dev, nd) = efa_with_netdev(&node).remove(0);
    let r = node.check_json(&[]);
    let card =
        efa_devices(&r).iter().find(|d| d["name"] == dev.as_str()).unwrap()["card"].as_str().unwrap().to_string();
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"));
    node.efa_netdev_down(&dev);
    let ev = tl.poll(1);
    let b: Vec<_> = ev.iter().map(brief).collect();
    assert_eq!(
        b,
        vec![
            ("EFAStateCheck".into(), false, true, format!("NIC={dev} NICPort=1"), String::new()),
            ("EFAStateCheck".into(), false, true, format!("NIC={card}"), String::new()),
        ],
        "{ev:#?}"
    );
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("state DOWN, phys_state LinkDown") && msg.contains("operstate down, carrier 0"), "{msg}");
    assert_eq!(ev[0]["recommendedAction"], "REPLACE_VM");
    assert!(tl.poll(2).is_empty(), "reported once");
    node.efa_netdev_up(&dev);
    let b: Vec<_> = tl.poll(3).iter().map(brief).collect();
    assert_eq!(
        b,
        vec![
            ("EFAStateCheck".into(), true, false, format!("NIC={dev} NICPort=1"), String::new()),
            ("EFAStateCheck".into(), true, false, format!("NIC={card}"), String::new()),
        ]
    );
    let _ = nd;
}

#[test]
fn efa_device_falling_off_the_bus_is_reported_under_efa_state_check_after_3_polls() {
    let node = Platform::AwsP5.build();
    // One without a netdev: only disappearance applies to it.
    let with_nd: Vec<String> = efa_with_netdev(&node).into_iter().map(|(d, _)| d).collect();
    let dev = node.pfs().into_iter().find(|d| d.starts_with("rdmap") && !with_nd.contains(d)).unwrap();
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"));
    node.fall_off_bus(&dev);
    assert!(tl.poll(1).is_empty());
    assert!(tl.poll(2).is_empty());
    let ev = tl.poll(3);
    assert_eq!(
        ev.iter().map(brief).collect::<Vec<_>>(),
        vec![("EFAStateCheck".into(), false, true, format!("NIC={dev}"), String::new())],
        "{ev:#?}"
    );
    assert!(ev[0]["message"].as_str().unwrap().contains("reads 0xFF"), "{}", ev[0]["message"]);
    assert!(tl.poll(4).is_empty());
    node.restore_device(&dev);
    let ev = tl.poll(5);
    assert_eq!(
        ev.iter().map(brief).collect::<Vec<_>>(),
        vec![("EFAStateCheck".into(), true, false, format!("NIC={dev}"), String::new())]
    );
}

#[test]
fn a_non_numeric_carrier_leaves_the_port_unknown_with_a_note_and_siblings_monitored() {
    let node = Platform::AwsP5.build();
    let efas = efa_with_netdev(&node);
    let ((odd, odd_nd), (sib, _)) = (efas[0].clone(), efas[1].clone());
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EFAStateCheck"));
    node.set_carrier(&odd_nd, "garbage");
    node.efa_netdev_down(&sib);
    let (r, err) = poll_logged(&tl, 1);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(&format!("EFA port {odd} port 1: netdev {odd_nd} carrier is unreadable or not 0/1")), "{err}");
    let b: Vec<_> = r["events"].as_array().unwrap().iter().map(brief).filter(|b| b.3.contains("NICPort")).collect();
    assert_eq!(b, vec![("EFAStateCheck".into(), false, true, format!("NIC={sib} NICPort=1"), String::new())]);
    // Readable again and up: the port was never reported unhealthy, nothing to say.
    node.set_carrier(&odd_nd, "1");
    let (r, _) = poll_logged(&tl, 2);
    assert!(!r["events"].as_array().unwrap().iter().any(|e| brief(e).3.contains(&odd)), "{r:#}");
}

/// Unknown is not a value on EFA too: an EFA port whose netdev `operstate` is a FIFO and
/// whose `carrier`, `state` and `phys_state` are unreadable or empty gets no decision — no
/// event over a timeline past the escalation grace, no card event for its card — and the
/// report says why; its counters are still evaluated.
#[test]
fn an_efa_port_with_unreadable_state_files_is_unknown_and_no_decision() {
    let node = Platform::AwsP4d.build();
    let r = node.check_json(&[]);
    let with_netdev = efa_devices(&r).into_iter().find(|d| !d["netdev"].is_null()).cloned().unwrap();
    let dev = with_netdev["name"].as_str().unwrap().to_string();
    let nd = with_netdev["netdev"].as_str().unwrap().to_string();
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).is_empty());
    let operstate = node.sys().join(format!("class/net/{nd}/operstate"));
    std::fs::remove_file(&operstate).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&operstate).status().unwrap();
    assert!(made.success());
    std::fs::write(node.sys().join(format!("class/net/{nd}/carrier")), "").unwrap();
    node.write_port_file(&dev, 1, "state", "");
    node.write_port_file(&dev, 1, "phys_state", "N/A (no PMA)\n");
    for t in [1, 10, 40, 80] {
        let r = tl.report(t);
        assert!(r["events"].as_array().unwrap().is_empty(), "t={t}: {:#}", r["events"]);
        let d = efa_devices(&r).into_iter().find(|d| d["name"] == dev.as_str()).unwrap().clone();
        let port = &d["ports"][0];
        assert!(port["operstate"].is_null() && port["carrier"].is_null(), "{port:#}");
        assert_eq!(port["unknown"]["state"], "empty", "{port:#}");
        assert_eq!(d["monitored"], true);
    }
    // Its counters are still judged.
    node.set_counter(&dev, 1, "hw_counters/rx_drops", 500);
    let ev = tl.poll(82);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(ev[0]["checkName"], "EFADegradationCheck");
}
