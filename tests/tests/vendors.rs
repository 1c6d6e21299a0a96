//! Every RDMA vendor (SPEC §1.14, issue 45): Broadcom Thor2 (`bnxt_re`), AMD Pensando
//! Pollara (`ionic`), Intel E810 (`irdma`) and soft RoCE (`rxe`) beside mlx5 and EFA — on
//! each node shape every RDMA NIC is discovered with its role and the management NIC is not
//! monitored; a port going DOWN/Disabled is fatal for that device; a rising error counter
//! (both generations of bnxt_re's names, irdma's names with spaces, rxe's) gives the
//! degradation event naming the device and the counter; rxe never yields a fatal event.
use nicmon_tests::platforms::{Platform, mi300x_thor2_legacy};
use nicmon_tests::{Node, Timeline, brief, role_counts};
use serde_json::Value;

fn devices(report: &Value) -> Vec<Value> {
    report["devices"].as_array().cloned().unwrap_or_default()
}

fn device<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["devices"].as_array().unwrap().iter().find(|d| d["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

/// The first compute device of a report.
fn first_compute(report: &Value) -> String {
    let d = devices(report).into_iter().find(|d| d["role"] == "compute").expect("a compute NIC");
    d["name"].as_str().unwrap().to_string()
}

fn unhealthy(events: &[Value]) -> Vec<(String, bool, bool, String, String)> {
    events.iter().map(brief).filter(|b| !b.1).collect()
}

#[test]
fn every_rdma_nic_is_discovered_with_its_role_and_the_management_nic_is_not() {
    let want_driver = |p: Platform| match p {
        Platform::Mi300xThor2 => "bnxt_re",
        Platform::Mi300xPollara => "ionic",
        Platform::E810 => "irdma",
        _ => "rxe",
    };
    for p in Platform::VENDORS {
        let node = p.build();
        let r = node.check_json(&[]);
        let want = if p.has_metadata() {
            "metadata"
        } else if p == Platform::RxeCi {
            "none"
        } else {
            "sysfs"
        };
        assert_eq!(r["topology_source"], want, "{}", p.name());
        assert_eq!(role_counts(&r), p.expected_roles(), "{}: {:#}", p.name(), r["devices"]);
        for d in devices(&r) {
            let name = d["name"].as_str().unwrap();
            assert_eq!(d["monitored"], d["role"] != "management", "{} {name}: {d:#}", p.name());
            if d["role"] == "management" {
                assert!(d["reason"].as_str().unwrap().contains("default route"), "{d:#}");
            }
            // Recognised by driver and vendor: the Pollara's and E810's names say nothing.
            let driver = d["rdma_driver"].as_str().unwrap_or_else(|| panic!("{name}: no driver: {d:#}"));
            let mgmt_card = p != Platform::E810 && d["role"] != "compute" && p != Platform::RxeCi;
            assert_eq!(driver, if mgmt_card { "bnxt_re" } else { want_driver(p) }, "{} {name}", p.name());
            assert_eq!(d["software"] == true, p == Platform::RxeCi, "{name}");
        }
        // The compute NICs are PIX to their GPU (AMD's found on the PCI bus, NVIDIA's in the
        // metadata), not grouped by link layer.
        if p != Platform::RxeCi {
            let c = first_compute(&r);
            assert!(device(&r, &c)["role_reason"].as_str().unwrap().starts_with("PIX to GPU"), "{:#}", device(&r, &c));
        }
        // The first poll of a boot: a healthy baseline per monitored port, nothing else.
        let events = r["events"].as_array().unwrap();
        assert!(unhealthy(events).is_empty(), "{}: {events:#?}", p.name());
        assert_eq!(events.len(), p.expected_roles().1 + p.expected_roles().2, "{}", p.name());
    }
}

#[test]
fn the_rxe_device_rides_on_its_parent_netdev() {
    let node = Platform::RxeCi.build();
    let r = node.check_json(&[]);
    assert_eq!(devices(&r).len(), 1, "eth0 is no RDMA device: {:#}", r["devices"]);
    let rxe = device(&r, "rxe0");
    assert_eq!((rxe["netdev"].as_str(), rxe["pci_address"].as_str(), rxe["card"].as_str()), (Some("eth1"), None, None));
    assert!(rxe["role_reason"].as_str().unwrap().contains("software RDMA device (rxe over eth1)"), "{rxe:#}");
    assert_eq!(rxe["ports"][0]["operstate"], "up");
    assert_eq!(rxe["ports"][0]["counters"]["retry_exceeded_err"], 0);
}

#[test]
fn a_port_down_and_disabled_is_fatal_for_that_device() {
    for p in [Platform::Mi300xThor2, Platform::Mi300xPollara, Platform::E810] {
        let node = p.build();
        let t = Timeline::new(&node);
        let first = t.report(0);
        let dev = first_compute(&first);
        node.set_port(&dev, 1, "1: DOWN", "3: Disabled");
        node.set_operstate(node.info[&dev].netdev.as_deref().unwrap(), "down");
        let events = t.poll(5);
        let bad = unhealthy(&events);
        // The port, and its card below its peers (card homogeneity, generic).
        let card = device(&first, &dev)["card"].as_str().unwrap().to_string();
        assert_eq!(
            bad,
            [
                ("EthernetStateCheck".into(), false, true, format!("NIC={dev} NICPort=1"), String::new()),
                ("EthernetStateCheck".into(), false, true, format!("NIC={card}"), String::new())
            ],
            "{}: {events:#?}",
            p.name()
        );
        let ev = events.iter().find(|e| e["isHealthy"] == false).unwrap();
        assert_eq!(ev["recommendedAction"], "REPLACE_VM");
        assert!(ev["message"].as_str().unwrap().contains("operstate down"), "{ev:#}");
        // Back up: one healthy event for it.
        node.repair(&dev, 1);
        let back = t.poll(10);
        assert!(
            back.iter().any(|e| e["isHealthy"] == true && brief(e).3 == format!("NIC={dev} NICPort=1")),
            "{back:#?}"
        );
    }
}

/// Baseline at 0 s, then `path` on `dev` port 1 rises by `by` at 1 s: the events of that poll.
fn raise(node: &Node, dev: &str, path: &str, by: u64) -> Vec<Value> {
    let t = Timeline::new(node);
    let first = t.poll(0);
    assert!(unhealthy(&first).is_empty(), "{first:#?}");
    node.set_counter(dev, 1, path, by);
    t.poll(1)
}

/// The one unhealthy event of `events`: a non-fatal degradation event for `dev` port 1 with
/// `code`, its message naming both.
fn degradation(events: &[Value], dev: &str, code: &str) {
    let bad = unhealthy(events);
    assert_eq!(
        bad,
        [("EthernetDegradationCheck".into(), false, false, format!("NIC={dev} NICPort=1"), code.to_string())],
        "{events:#?}"
    );
    let msg = events.iter().find(|e| e["isHealthy"] == false).unwrap()["message"].as_str().unwrap().to_string();
    assert!(msg.contains(dev) && msg.contains(code), "{msg}");
}

#[test]
fn bnxt_re_counters_of_both_generations_give_degradation_events() {
    // The names of 2025 on: a retry exhausted, ACK timeouts, and Broadcom's
    // `rnr_nak_retry_err` — RNR NAKs received, not mlx5's fatal retries exhausted.
    let cases = [
        ("hw_counters/max_retry_exceeded", 1, "bnxt_re_max_retry_exceeded"),
        ("hw_counters/local_ack_timeout_err", 50, "bnxt_re_local_ack_timeout_err"),
        ("hw_counters/rnr_nak_retry_err", 5000, "bnxt_re_rnr_nak_retry_err"),
        ("hw_counters/packet_seq_err", 500, "bnxt_re_packet_seq_err"),
    ];
    for (path, by, code) in cases {
        let node = Platform::Mi300xThor2.build();
        degradation(&raise(&node, "bnxt_re3", path, by), "bnxt_re3", code);
    }
    // The names of before.
    let cases = [
        ("hw_counters/to_retransmits", 50, "bnxt_re_to_retransmits"),
        ("hw_counters/seq_err_naks_rcvd", 500, "bnxt_re_seq_err_naks_rcvd"),
        ("hw_counters/rnr_naks_rcvd", 5000, "bnxt_re_rnr_naks_rcvd"),
        ("hw_counters/oos_drop_count", 5000, "bnxt_re_oos_drop_count"),
    ];
    for (path, by, code) in cases {
        let node = mi300x_thor2_legacy();
        degradation(&raise(&node, "bnxt_re3", path, by), "bnxt_re3", code);
    }
}

#[test]
fn irdma_ionic_and_rxe_counters_give_degradation_events() {
    // irdma's GEN3 names have spaces; the file is there from the first poll (a counter
    // absent at the first read is not looked for again in that incarnation).
    let node = Platform::E810.build();
    node.set_counter("rocep6s0f0", 1, "hw_counters/RNR received", 0);
    degradation(&raise(&node, "rocep6s0f0", "hw_counters/RNR received", 5000), "rocep6s0f0", "irdma_RNR_received");
    let node = Platform::E810.build();
    degradation(&raise(&node, "rocep6s0f1", "hw_counters/ip4InDiscards", 5000), "rocep6s0f1", "irdma_ip4InDiscards");

    let node = Platform::Mi300xPollara.build();
    let dev = first_compute(&node.check_json(&[]));
    let events = raise(&node, &dev, "hw_counters/req_tx_retry_excd_err", 2);
    degradation(&events, &dev, "ionic_req_tx_retry_excd_err");

    let node = Platform::RxeCi.build();
    degradation(&raise(&node, "rxe0", "hw_counters/retry_exceeded_err", 1), "rxe0", "rxe_retry_exceeded_err");
}

#[test]
fn a_counter_of_another_driver_is_not_read_there() {
    // mlx5's rules are not bnxt_re's: its hw_counters are read under bnxt_re's rules only.
    let node = Platform::Mi300xThor2.build();
    let r = node.check_json(&[]);
    let counters = &device(&r, "bnxt_re0")["ports"][0]["counters"];
    assert_eq!(counters["max_retry_exceeded"], 0, "{counters:#}");
    assert!(counters.get("roce_slow_restart").is_none() && counters.get("symbol_error").is_none(), "{counters:#}");
    let node = Platform::E810.build();
    let r = node.check_json(&[]);
    let counters = &device(&r, "rocep6s0f0")["ports"][0]["counters"];
    assert_eq!(counters["tcpRetransSegs"], 0, "{counters:#}");
    assert!(counters.get("max_retry_exceeded").is_none(), "{counters:#}");
}

#[test]
fn rxe_never_yields_a_fatal_event() {
    let node = Platform::RxeCi.build();
    let mut t = Timeline::new(&node);
    // An operator made rxe's link_downed fatal: still not fatal on a software device.
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(
        &cfg,
        "[[counterDetection.counters]]\nname = \"rxe_link_downed\"\nisFatal = true\n\
         [[counterDetection.counters]]\nname = \"rxe_retry_exceeded_err\"\n",
    )
    .unwrap();
    t.extra = vec!["--config".into(), cfg.to_str().unwrap().into()];
    let mut all = t.poll(0);
    // The netdev goes down: rxe reports DOWN/Disabled.
    node.set_port("rxe0", 1, "1: DOWN", "3: Disabled");
    node.set_operstate("eth1", "down");
    node.set_counter("rxe0", 1, "hw_counters/link_downed", 1);
    let down = t.poll(1);
    assert_eq!(
        unhealthy(&down).iter().map(|b| (b.0.as_str(), b.2, b.4.as_str())).collect::<Vec<_>>(),
        [("EthernetStateCheck", false, ""), ("EthernetDegradationCheck", false, "rxe_link_downed")],
        "{down:#?}"
    );
    assert!(down.iter().all(|e| e["recommendedAction"] == "NONE"), "{down:#?}");
    all.extend(down);
    // Past the escalation grace, still down: nothing more.
    all.extend(t.poll(45));
    // It flaps: three transitions in a minute would be a fatal "port flapping" on hardware.
    for s in [50, 51, 52, 53, 54, 55] {
        if s % 2 == 0 {
            node.repair("rxe0", 1);
        } else {
            node.set_port("rxe0", 1, "1: DOWN", "3: Disabled");
        }
        all.extend(t.poll(s));
    }
    // It disappears (`rdma link delete rxe0`): three polls later, a non-fatal event.
    node.remove_device("rxe0");
    for s in 60..64 {
        all.extend(t.poll(s));
    }
    let gone: Vec<_> = all.iter().filter(|e| e["message"].as_str().unwrap().contains("disappeared")).collect();
    assert_eq!(gone.len(), 1, "{all:#?}");
    let fatal: Vec<_> = all.iter().filter(|e| e["isFatal"] == true).collect();
    assert!(fatal.is_empty(), "{fatal:#?}");
    assert!(all.iter().any(|e| e["errorCode"][0] == "PortFlapping"), "{all:#?}");
}

#[test]
fn nicmon_check_prints_a_sensible_table_on_each_shape() {
    for p in Platform::VENDORS {
        let node = p.build();
        let meta = node.metadata_path();
        let out = node.nicmon("check", &["--config", "/nonexistent/nicmon.toml", "--metadata", meta.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let table = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("DEVICE") && lines[0].ends_with("NOTE"), "{table}");
        for name in node.info.keys() {
            let line = lines.iter().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{table}"));
            if line.contains("management") {
                assert!(line.contains("not monitored: management NIC"), "{line}");
            } else {
                assert!(line.contains("healthy") && line.contains("ACTIVE") && line.contains("LinkUp"), "{line}");
            }
            if p == Platform::RxeCi {
                assert!(line.contains("software RDMA device (rxe over eth1)"), "{line}");
            } else {
                assert!(line.contains("x16 Gen5") && line.contains('['), "{line}");
            }
        }
        assert!(!table.contains("FATAL") && !table.contains("UNHEALTHY"), "{table}");
    }
}

#[test]
fn bnxt_en_phy_statistics_stand_in_for_the_missing_fec_ones() {
    // bnxt_en's netlink FEC statistics give blocks only (`bnxt_get_fec_stats`): the pre-FEC
    // BER comes from its `ethtool -S` `rx_corrected_bits`, the post-FEC loss from
    // `rx_fec_uncorrectable_blocks`.
    let node = Platform::Mi300xThor2.build();
    let dir = node.root().join("ethtool");
    std::fs::create_dir_all(&dir).unwrap();
    let netdev = node.info["bnxt_re2"].netdev.clone().unwrap();
    let write = |corrected_bits: u64, uncorrectable: u64| {
        let v = serde_json::json!({
            "fec": {"active": "RS", "corrected_blocks": corrected_bits / 4},
            "stats": {"rx_corrected_bits": corrected_bits, "rx_fec_uncorrectable_blocks": uncorrectable},
        });
        std::fs::write(dir.join(format!("{netdev}.json")), v.to_string()).unwrap();
    };
    let mut t = Timeline::new(&node);
    t.extra = vec!["--ethtool-replay".into(), dir.to_str().unwrap().into()];
    write(1000, 0);
    assert!(unhealthy(&t.poll(0)).is_empty());
    // 400 G for a minute at a BER of 3e-4: above RS(544,514)'s 1e-4.
    let bits = (400e9 * 60.0 * 3e-4) as u64;
    write(1000 + bits, 4);
    let events = t.poll(60);
    let mut codes: Vec<String> = unhealthy(&events).into_iter().map(|b| format!("{} {}", b.3, b.4)).collect();
    codes.sort();
    assert_eq!(
        codes,
        ["NIC=bnxt_re2 NICPort=1 fec_uncorrectable", "NIC=bnxt_re2 NICPort=1 pre_fec_ber"],
        "{events:#?}"
    );
}
