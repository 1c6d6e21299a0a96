//! RoCE physical layer and lossless fabric (SPEC §1.11) on a replayed RoCE node: six
//! 200G RoCE ports (L40S OCI), their ethtool data replayed from `<dir>/<netdev>.json`,
//! each `nicmon check --state-file … --now … --ethtool-replay DIR` one daemon poll.
use std::path::{Path, PathBuf};

use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, Timeline, brief};
use serde_json::json;

type Brief = (String, bool, bool, String, String);

fn briefs(events: &[serde_json::Value]) -> Vec<Brief> {
    events.iter().map(brief).collect()
}

fn eth(healthy: bool, dev: &str, code: &str) -> Brief {
    ("EthernetDegradationCheck".into(), healthy, false, format!("NIC={dev} NICPort=1"), code.into())
}

/// A 200G port's bits in one minute.
const BITS_PER_MINUTE: u64 = 200_000_000_000 * 60;

/// One netdev's ethtool data, as mlx5 gives it: FEC statistics with four KP4 lanes, pause
/// frames, and the driver strings nicmon picks.
#[derive(Clone, Copy, Default)]
struct Phy {
    corrected_bits: u64,
    uncorrectable: u64,
    storm_warnings: u64,
    storm_errors: u64,
    /// µs paused by the fabric on the RoCE priority.
    paused_us: u64,
    /// ECN-marked packets and CNPs (congestion, metrics only).
    ecn: u64,
    /// The driver gives no per-lane FEC statistics.
    no_lanes: bool,
}

impl Phy {
    fn json(&self) -> serde_json::Value {
        let lane = |i: u64| json!({"corrected_blocks": 10 * i, "uncorrectable_blocks": 0});
        let lanes = if self.no_lanes { json!([]) } else { json!([lane(0), lane(1), lane(2), lane(3)]) };
        json!({
            "fec": {
                "active": "RS",
                "corrected_blocks": 1000 + self.corrected_bits / 3,
                "uncorrectable_blocks": self.uncorrectable,
                "corrected_bits": self.corrected_bits,
                "lanes": lanes,
            },
            "pause": {"tx_frames": self.ecn, "rx_frames": self.paused_us / 10},
            "stats": {
                "rx_corrected_bits_phy": self.corrected_bits,
                "rx_pcs_symbol_err_phy": 0,
                "rx_discards_phy": 0,
                "tx_pause_storm_warning_events": self.storm_warnings,
                "tx_pause_storm_error_events": self.storm_errors,
                "rx_prio3_pause_duration": self.paused_us,
                "rx_prio0_pause_duration": 0,
                "np_ecn_marked_roce_packets": self.ecn,
                "np_cnp_sent": self.ecn / 2,
                "rp_cnp_handled": self.ecn / 3,
            },
        })
    }
}

/// The replay directory of a node and what its six netdevs answer.
struct Fabric {
    dir: PathBuf,
    ports: [Phy; 6],
}

impl Fabric {
    fn new(node: &Node) -> Fabric {
        let f = Fabric { dir: node.root().join("ethtool"), ports: [Phy::default(); 6] };
        f.write();
        f
    }

    fn write(&self) {
        std::fs::create_dir_all(&self.dir).unwrap();
        for (i, p) in self.ports.iter().enumerate() {
            let text = serde_json::to_string_pretty(&p.json()).unwrap();
            std::fs::write(self.dir.join(format!("rdma{i}.json")), text).unwrap();
        }
    }

    /// Every port one minute on: corrected bits at `ber` (healthy 1e-9), `pause` of the
    /// minute paused, `ecn` marks; then `change` on top.
    fn minute(&mut self, ber: f64, pause: f64, ecn: u64, change: impl FnOnce(&mut [Phy; 6])) {
        for p in &mut self.ports {
            p.corrected_bits += (BITS_PER_MINUTE as f64 * ber) as u64;
            p.paused_us += (60e6 * pause) as u64;
            p.ecn += ecn;
        }
        change(&mut self.ports);
        self.write();
    }
}

fn timeline<'a>(node: &'a Node, dir: &Path) -> Timeline<'a> {
    let mut tl = Timeline::new(node);
    tl.extra = vec!["--ethtool-replay".into(), dir.to_str().unwrap().into()];
    tl
}

/// The `phy` object of `dev`'s port 1 in a report.
fn phy<'r>(report: &'r serde_json::Value, dev: &str) -> &'r serde_json::Value {
    let d = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == dev).expect("device");
    &d["ports"][0]["phy"]
}

#[test]
fn healthy_fabric_then_ber_near_the_fec_limit_then_back() {
    let node = Platform::L40sOci.build();
    let mut fabric = Fabric::new(&node);
    let tl = timeline(&node, &fabric.dir);
    let ev = tl.poll(0);
    assert!(ev.iter().all(|e| e["isHealthy"] == true && e["checkName"] == "EthernetStateCheck"), "{ev:#?}");

    // A healthy minute: BER 1e-9 everywhere, no event; the report shows BER and FEC mode.
    fabric.minute(1e-9, 0.0, 0, |_| {});
    let report = tl.report(60);
    assert_eq!(report["events"], json!([]));
    let p = phy(&report, "mlx5_1");
    assert_eq!(p["fec_mode"], "RS");
    let ber = p["pre_fec_ber"].as_f64().unwrap();
    assert!((ber / 1e-9 - 1.0).abs() < 1e-6, "{ber:e}");
    let d0 = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_0").unwrap();
    assert_eq!(d0["ports"][0]["counters"]["ethtool/fec_corrected_bits"], 12_000);

    // mlx5_1's optic degrades: 2e-4, near KP4's 2.4e-4 limit. One non-fatal event, BER in it.
    fabric.minute(1e-9, 0.0, 0, |p| p[1].corrected_bits += (BITS_PER_MINUTE as f64 * 2e-4) as u64);
    let ev = tl.poll(120);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_1", "pre_fec_ber")], "{ev:#?}");
    assert_eq!(ev[0]["recommendedAction"], "NONE");
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("pre_fec_ber") && msg.contains("BER 2.00e-4"), "{msg}");

    // Still high a minute later: latched, nothing new.
    fabric.minute(1e-9, 0.0, 0, |p| p[1].corrected_bits += (BITS_PER_MINUTE as f64 * 2e-4) as u64);
    assert!(tl.poll(180).is_empty());

    // The optic was cleaned: back to 1e-9, one healthy event for the same error code.
    fabric.minute(1e-9, 0.0, 0, |_| {});
    let ev = tl.poll(240);
    assert_eq!(briefs(&ev), vec![eth(true, "mlx5_1", "pre_fec_ber")], "{ev:#?}");
    fabric.minute(1e-9, 0.0, 0, |_| {});
    assert!(tl.poll(300).is_empty());

    // The table shows BER and FEC mode for the RoCE ports.
    fabric.minute(1e-9, 0.0, 0, |_| {});
    let dir = fabric.dir.to_str().unwrap();
    let state = tl.state_file.to_str().unwrap();
    let out = node.nicmon(
        "check",
        &["--state-file", state, "--now", &tl.at(360), "--ethtool-replay", dir, "--config", "/nonexistent.toml"],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table.lines().find(|l| l.starts_with("mlx5_1 ")).expect("mlx5_1 line");
    assert!(line.contains("FEC RS, pre-FEC BER 1.0e-9"), "{table}");
}

#[test]
fn uncorrectable_blocks_storms_and_resets() {
    let node = Platform::L40sOci.build();
    let mut fabric = Fabric::new(&node);
    let tl = timeline(&node, &fabric.dir);
    tl.poll(0);
    assert!(tl.poll(10).is_empty());

    // Uncorrectable codewords on mlx5_2: one non-fatal event; more of them: latched.
    fabric.minute(1e-9, 0.0, 0, |p| p[2].uncorrectable = 7);
    let ev = tl.poll(20);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_2", "fec_uncorrectable")], "{ev:#?}");
    fabric.minute(1e-9, 0.0, 0, |p| p[2].uncorrectable = 9);
    assert!(tl.poll(30).is_empty());

    // mlx5_3 sends pause frames too long: one pfc_storm (the warning); storm prevention
    // then disables pause on it: pfc_storm again, its message naming the error. Neither
    // is fatal.
    fabric.minute(1e-9, 0.0, 0, |p| p[3].storm_warnings = 1);
    let ev = tl.poll(40);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_3", "pfc_storm")]);
    assert!(ev[0]["message"].as_str().unwrap().contains("PFC storm warning"), "{ev:#?}");
    fabric.minute(1e-9, 0.0, 0, |p| p[3].storm_errors = 1);
    let ev = tl.poll(50);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_3", "pfc_storm")]);
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("PFC storm error") && msg.contains("not draining"), "{ev:#?}");

    // The driver reloads on mlx5_2: its counters restart at 0. One recovery, like the
    // other counters; then re-armed.
    fabric.minute(1e-9, 0.0, 0, |p| p[2] = Phy::default());
    assert_eq!(briefs(&tl.poll(60)), vec![eth(true, "mlx5_2", "fec_uncorrectable")]);
    fabric.minute(1e-9, 0.0, 0, |p| p[2].uncorrectable = 1);
    assert_eq!(briefs(&tl.poll(70)), vec![eth(false, "mlx5_2", "fec_uncorrectable")]);

    // mlx5_3's driver reloads too: both storm counters restart, the code clears once.
    fabric.minute(1e-9, 0.0, 0, |p| p[3] = Phy::default());
    assert_eq!(briefs(&tl.poll(80)), vec![eth(true, "mlx5_3", "pfc_storm")]);
}

#[test]
fn a_reboot_rebaselines_the_phy_counters() {
    let mut node = Platform::L40sOci.build();
    let mut fabric = Fabric::new(&node);
    {
        let tl = timeline(&node, &fabric.dir);
        tl.poll(0);
        fabric.minute(1e-9, 0.0, 0, |p| p[0].uncorrectable = 3);
        assert_eq!(briefs(&tl.poll(10)), vec![eth(false, "mlx5_0", "fec_uncorrectable")]);
    }
    // The node reboots; the counters come back small. Same state file.
    fabric.ports = [Phy::default(); 6];
    fabric.write();
    node.set_boot_id("5d0c6f7e-0000-4000-8000-000000000003");
    let tl = timeline(&node, &fabric.dir);
    let ev = tl.poll(900);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");
    let of = |code: &str| briefs(&ev).into_iter().filter(|b| b.4 == code).collect::<Vec<_>>();
    // One baseline per error code: the storm's warning and error rules share `pfc_storm`.
    assert!(of("pfc_storm_error").is_empty());
    for code in ["pre_fec_ber", "fec_uncorrectable", "pfc_storm", "pause_victim"] {
        let want: Vec<Brief> = (0..6).map(|i| eth(true, &format!("mlx5_{i}"), code)).collect();
        assert_eq!(of(code), want, "{code}");
    }
    assert!(tl.poll(901).is_empty());
    fabric.minute(1e-9, 0.0, 0, |p| p[0].uncorrectable = 1);
    assert_eq!(briefs(&tl.poll(902)), vec![eth(false, "mlx5_0", "fec_uncorrectable")]);
}

#[test]
fn a_busy_congested_fabric_is_not_a_fault() {
    let node = Platform::L40sOci.build();
    let mut fabric = Fabric::new(&node);
    let tl = timeline(&node, &fabric.dir);
    tl.poll(0);
    // Ten minutes of heavy congestion: paused 40 % of the time, ECN marks and CNPs by the
    // million, healthy BER. Metrics only: no event at all.
    for m in 1..=10 {
        fabric.minute(1e-9, 0.4, 5_000_000, |_| {});
        let report = tl.report(60 * m);
        assert_eq!(report["events"], json!([]), "minute {m}");
        let share = phy(&report, "mlx5_4")["pause_share"].as_f64().unwrap();
        assert!((share - 0.4).abs() < 1e-9, "{share}");
    }
    // mlx5_4 is paused 90 % of a minute (a host downstream is not draining): a non-fatal
    // pause_victim; it clears when the share falls. Nothing is ever fatal.
    fabric.minute(1e-9, 0.4, 5_000_000, |p| p[4].paused_us += 30_000_000);
    let ev = tl.poll(660);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_4", "pause_victim")], "{ev:#?}");
    fabric.minute(1e-9, 0.4, 5_000_000, |_| {});
    assert_eq!(briefs(&tl.poll(720)), vec![eth(true, "mlx5_4", "pause_victim")]);
}

#[test]
fn netdevs_without_ethtool_data_are_unknown_not_errors() {
    // No replay file for any netdev (veth, virtio): no phy object, no event, exit 0.
    let node = Platform::L40sOci.build();
    let empty = node.root().join("no-ethtool");
    std::fs::create_dir_all(&empty).unwrap();
    let tl = timeline(&node, &empty);
    tl.poll(0);
    let report = tl.report(60);
    assert_eq!(report["events"], json!([]));
    assert!(phy(&report, "mlx5_0").is_null());
}

#[test]
fn missing_ethtool_data_is_said_once_in_a_few_lines() {
    // The first poll's log on a RoCE node without ethtool data: one line per netdev (its
    // ethtool data not supported), one line naming the physical-layer counters and ports,
    // not one line per counter.
    let node = Platform::L40sOci.build();
    let empty = node.root().join("no-ethtool");
    std::fs::create_dir_all(&empty).unwrap();
    let out = std::process::Command::new(nicmon_tests::nicmon_bin())
        .args(["check", "--config", "/nonexistent.toml"])
        .arg("--ethtool-replay")
        .arg(&empty)
        .arg("--sysfs")
        .arg(node.sys())
        .arg("--procfs")
        .arg(node.proc())
        .env_remove("NODE_NAME")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = String::from_utf8_lossy(&out.stderr);
    let lines = |needle: &str| log.lines().filter(|l| l.contains(needle)).collect::<Vec<_>>();
    let phy = lines("RoCE physical-layer counters");
    assert_eq!(phy.len(), 1, "{log}");
    for name in ["pre_fec_ber", "fec_uncorrectable", "pfc_storm", "pfc_storm_error", "pause_victim"] {
        assert!(phy[0].contains(name), "{name}: {log}");
    }
    for i in 0..6 {
        assert!(phy[0].contains(&format!("mlx5_{i} port 1")), "mlx5_{i}: {log}");
    }
    assert!(lines(" absent on ").len() == 1, "one absent line: {log}");
    for i in 0..6 {
        // One line for its ethtool data, one for its transceiver (both read from the replay).
        let netdev = lines(&format!("of rdma{i}: not supported"));
        assert_eq!(netdev.len(), 2, "rdma{i}: {log}");
        assert_eq!(lines(&format!("ethtool FEC, pause and statistics of rdma{i}: not supported")).len(), 1, "{log}");
        assert_eq!(lines(&format!("transceiver module of rdma{i}: not supported")).len(), 1, "{log}");
    }
}

#[test]
fn a_port_without_a_usable_rate_gets_its_ber_from_the_netdev_speed() {
    // mlx5_1's RDMA `rate` is gone, mlx5_2's unparsable: their BER comes from the netdev's
    // `speed` (100 Gb/s here, half the 200G rate: a BER twice the others'). mlx5_3 has
    // neither (no link speed, -1): its BER is unknown, not a guess.
    let node = Platform::L40sOci.build();
    node.remove_port_file("mlx5_1", 1, "rate");
    node.write_port_file("mlx5_2", 1, "rate", "N/A\n");
    node.set_speed("rdma1", "100000");
    node.set_speed("rdma2", "100000");
    node.remove_port_file("mlx5_3", 1, "rate");
    node.set_speed("rdma3", "-1");
    let mut fabric = Fabric::new(&node);
    let tl = timeline(&node, &fabric.dir);
    tl.poll(0);
    fabric.minute(1e-9, 0.0, 0, |_| {});
    let report = tl.report(60);
    assert_eq!(report["events"], json!([]));
    let ber = |dev: &str| phy(&report, dev)["pre_fec_ber"].as_f64();
    for (dev, want) in [("mlx5_0", Some(1e-9)), ("mlx5_1", Some(2e-9)), ("mlx5_2", Some(2e-9)), ("mlx5_3", None)] {
        match (ber(dev), want) {
            (Some(got), Some(want)) => assert!((got / want - 1.0).abs() < 1e-6, "{dev}: {got:e}"),
            (got, want) => assert_eq!(got, want, "{dev}"),
        }
    }
    // A degrading optic on the speed-rated port is judged at that rate: 1.5e-4 at 100G.
    fabric.minute(1e-9, 0.0, 0, |p| p[1].corrected_bits += (BITS_PER_MINUTE as f64 * 0.75e-4) as u64);
    let ev = tl.poll(120);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_1", "pre_fec_ber")], "{ev:#?}");
    assert!(ev[0]["message"].as_str().unwrap().contains("BER 1.50e-4"), "{ev:#?}");
}

#[test]
fn congestion_counters_are_read_on_roce_ports_only() {
    // H100 OCI: InfiniBand compute ports and two RoCE storage ports; mlx5 lists the ECN/CNP
    // files on every port. They are a RoCE port's (metrics only), not an IB port's.
    let node = Platform::H100Oci.build();
    let report = node.check_json(&[]);
    let mut seen = (0, 0);
    for d in report["devices"].as_array().unwrap() {
        for p in d["ports"].as_array().unwrap() {
            let has =
                ["np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled"].map(|c| p["counters"].get(c).is_some());
            match p["link_layer"].as_str() {
                Some("Ethernet") => {
                    assert_eq!(has, [true; 3], "{}: {p:#}", d["name"]);
                    seen.0 += 1;
                }
                _ => {
                    assert_eq!(has, [false; 3], "{}: {p:#}", d["name"]);
                    seen.1 += 1;
                }
            }
        }
    }
    assert_eq!(seen, (2, 16));
    // `[phyCheck] enabled = false`: not read on RoCE ports either.
    let cfg = node.root().join("nophy.toml");
    std::fs::write(&cfg, "[phyCheck]\nenabled = false\n").unwrap();
    let report = node.check_json(&["--config", cfg.to_str().unwrap()]);
    let text = report["devices"].to_string();
    assert!(!text.contains("np_cnp_sent"), "{text}");
}

#[test]
fn the_lane_rate_the_rdma_rate_names_picks_the_fec_code() {
    // No per-lane FEC statistics anywhere: the lanes come from the RDMA `rate`. mlx5_1 is
    // 4 x 25G (KR4, threshold 1e-5), mlx5_2 one 25G lane (KR4), mlx5_3 2 x 50G (KP4, 1e-4).
    // A BER of 4e-5 is past KR4's limit (~2.3e-5: codewords are being lost) and well under
    // KP4's: an event on the two KR4 ports only (issue #43, defect 8).
    let node = Platform::L40sOci.build();
    node.write_port_file("mlx5_1", 1, "rate", "100 Gb/sec (4X EDR)\n");
    node.write_port_file("mlx5_2", 1, "rate", "25 Gb/sec (1X EDR)\n");
    node.write_port_file("mlx5_3", 1, "rate", "100 Gb/sec (2X HDR)\n");
    let mut fabric = Fabric::new(&node);
    for p in &mut fabric.ports {
        p.no_lanes = true;
    }
    fabric.write();
    let tl = timeline(&node, &fabric.dir);
    tl.poll(0);
    fabric.minute(1e-9, 0.0, 0, |_| {});
    assert!(tl.poll(60).is_empty());
    let at = |gbps: f64, ber: f64| (gbps * 1e9 * 60.0 * ber) as u64;
    fabric.minute(1e-9, 0.0, 0, |p| {
        p[1].corrected_bits += at(100.0, 4e-5);
        p[2].corrected_bits += at(25.0, 4e-5);
        p[3].corrected_bits += at(100.0, 4e-5);
    });
    let ev = tl.poll(120);
    assert_eq!(briefs(&ev), vec![eth(false, "mlx5_1", "pre_fec_ber"), eth(false, "mlx5_2", "pre_fec_ber")], "{ev:#?}");
}
