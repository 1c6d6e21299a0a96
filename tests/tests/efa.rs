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
        assert!(r["events"].as_array().unwrap().is_empty(), "{:#}", r["events"]);
    }
}

#[test]
fn efa_device_counter_breach_is_reported_on_port_1() {
    let node = Platform::AwsP4d.build();
    let dev = node.pfs()[1].clone();
    let tl = Timeline::new(&node);
    assert!(tl.poll(0).is_empty());
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
    assert!(tl.poll(0).is_empty());
    node.write_device_file(odd, "hw_counters/no_completion_cmds", "N/A\n");
    node.write_port_file(odd, 1, "hw_counters/rx_drops", "N/A (no PMA)\n");
    node.write_device_file(sibling, "hw_counters/no_completion_cmds", "1\n");
    let r = tl.report(1);
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
    // Readable again: a value below nothing is a fresh baseline, not a breach.
    node.write_device_file(odd, "hw_counters/no_completion_cmds", "0\n");
    assert!(tl.poll(2).is_empty());
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
