//! The physical-layer alerts (deploy/prometheus/nicmon-rules.yaml, group `nicmon-physical`,
//! and `NicmonFatalHealthEvent`) against a real Prometheus 2.42 scraping a running nicmon, with
//! the rules as shipped (no `for:` or window rewritten): a PCIe downtrain, a fatal and a
//! non-fatal AER error, a pre-FEC BER above the FEC threshold, post-FEC loss (uncorrectable
//! codewords), a PFC storm and a pause victim each fire their own alert, naming node, device
//! and port, with its runbook.
//!
//! Two runs, in parallel (two test threads), one nicmon and one Prometheus each:
//! - **first occurrence**: a healthy node, scraped; nothing fires; then every fault is
//!   injected at once while nicmon runs and Prometheus scrapes: each alert fires for its own
//!   NIC and port and for no other, the untouched ports staying quiet over a full minute
//!   (the BER and pause windows' length) — the quiet case of every alert;
//! - **present at start-up**: the node boots with its PCIe link at x8 of x16, and every
//!   counted fault occurs during nicmon's first polls; Prometheus starts only once nicmon
//!   exports all seven event series, so each is born above 0 before Prometheus' first scrape
//!   (the case `increase()` alone misses: the rules' `X unless X offset W` guard catches it).
//!
//! A counter already non-zero when nicmon first reads it (AER totals, uncorrectable blocks,
//! storm events) is by design a baseline, not an event (a condition from before the monitor
//! started cannot be dated: SPEC §1.4, as upstream): "present at start-up" for those is a
//! count that moves during the first polls, before the first scrape. The BER and pause share
//! are rates over a one-minute window (SPEC §1.11): they fire at the end of the first full
//! window, about 60 s after nicmon's first ethtool read, which sets the length of both runs.
//!
//! The same two runs, on a second node, for NIC temperature, firmware health and the
//! transceivers (`NicmonNicOverheating`, `NicmonFirmwareFatal`, `NicmonFirmwareErrors` and
//! the five optics alerts).
//!
//! Alerts of the file not fired here: the port and counter alerts and the monitor's own
//! (groups `nicmon-ports`, `nicmon-monitor`, `nicmon-ebpf`, `nicmon-kernel-log`), most of
//! which hold for 1 to 20 minutes (`for:`) as shipped — tests/tests/prometheus_monitor_alerts.rs
//! fires and quiets them against a real Prometheus with those holds shortened (only
//! `NicmonPollStalled` cannot be provoked: that file says why); their promtool tests in
//! deploy/prometheus/tests/ fire them and keep them quiet with the holds as shipped.
//!
//! Not flaky by construction: every wait is on a condition (an exposition line, an alert in
//! Prometheus' API) with a 180 s deadline; an unanswered API call is "not yet", not a failure
//! (under load Prometheus may answer late, and a scrape may miss its 1 s timeout, marking the
//! series stale for a moment); the ethtool replay files are replaced atomically (a rename), so
//! a poll never reads half a file; AER and link files are single small writes, and a poll that
//! reads one empty skips that counter, keeping its snapshot.
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use nicmon_tests::alerts::{
    Expected, assert_alerts, label, tools, wait_all_firing, wait_first_poll, wait_rules_evaluated,
};
use nicmon_tests::daemon::Daemon;
use nicmon_tests::pcie::AerFile;
use nicmon_tests::platforms::Platform;
use nicmon_tests::prom_server::{Prometheus, free_port, http_get, wait_for};
use nicmon_tests::prometheus::RULES;
use nicmon_tests::{Node, nicmon_bin};
use serde_json::{Value, json};

const NODE: &str = "roce-node-3";

/// What each injected physical fault must fire.
const EXPECTED: &[Expected] = &[
    ("NicmonPCIeLinkDowntrained", "pcie_link_downtrained", "mlx5_2", "0"),
    ("NicmonPCIeAerFatal", "aer_fatal", "mlx5_4", "0"),
    ("NicmonPCIeAerErrors", "aer_nonfatal", "mlx5_5", "0"),
    ("NicmonPreFecBerHigh", "pre_fec_ber", "mlx5_0", "1"),
    ("NicmonFecUncorrectable", "fec_uncorrectable", "mlx5_1", "1"),
    ("NicmonPfcStorm", "pfc_storm", "mlx5_3", "1"),
    ("NicmonPauseVictim", "pause_victim", "mlx5_2", "1"),
    // The fatal AER error is the node's one fatal event.
    ("NicmonFatalHealthEvent", "NICPCIeCheck", "mlx5_4", "0"),
];

/// A 200G port's bits in one minute.
const BITS_PER_MINUTE: u64 = 200_000_000_000 * 60;

/// One netdev's ethtool data, as mlx5 gives it (the shape tests/tests/roce_phy.rs uses).
#[derive(Clone, Copy, Default)]
struct Phy {
    corrected_bits: u64,
    uncorrectable: u64,
    storm_warnings: u64,
    paused_us: u64,
}

impl Phy {
    fn json(&self) -> Value {
        let lane = json!({"corrected_blocks": 0, "uncorrectable_blocks": 0});
        json!({
            "fec": {
                "active": "RS",
                "corrected_blocks": 1000 + self.corrected_bits / 3,
                "uncorrectable_blocks": self.uncorrectable,
                "corrected_bits": self.corrected_bits,
                "lanes": [lane, lane, lane, lane],
            },
            "pause": {"tx_frames": 0, "rx_frames": self.paused_us / 10},
            "stats": {
                "rx_corrected_bits_phy": self.corrected_bits,
                "rx_pcs_symbol_err_phy": 0,
                "rx_discards_phy": 0,
                "tx_pause_storm_warning_events": self.storm_warnings,
                "tx_pause_storm_error_events": 0,
                "rx_prio3_pause_duration": self.paused_us,
                "rx_prio0_pause_duration": 0,
            },
        })
    }
}

/// The node's ethtool replay directory, `<netdev>.json` per RoCE port.
struct Fabric {
    dir: PathBuf,
    ports: [Phy; 6],
}

impl Fabric {
    fn new(node: &Node) -> Fabric {
        let f = Fabric { dir: node.root().join("ethtool"), ports: [Phy::default(); 6] };
        std::fs::create_dir_all(&f.dir).unwrap();
        f.write();
        f
    }

    /// Every file replaced by a rename: a poll reads the old file or the new one.
    fn write(&self) {
        for (i, p) in self.ports.iter().enumerate() {
            let tmp = self.dir.join(format!(".rdma{i}.json.tmp"));
            std::fs::write(&tmp, serde_json::to_string_pretty(&p.json()).unwrap()).unwrap();
            std::fs::rename(&tmp, self.dir.join(format!("rdma{i}.json"))).unwrap();
        }
    }
}

/// The counted faults: two AER errors, and on the RoCE ports a pre-FEC BER of 1e-3 over a
/// minute (KP4's threshold is 1e-4), 7 lost codewords, a PFC storm warning, and ten minutes
/// paused (a share of 1, capped, whatever the window).
fn inject_counted_faults(node: &Node, fabric: &mut Fabric) {
    node.set_aer("mlx5_4", AerFile::Fatal, &[("SDES", 1)]);
    node.set_aer("mlx5_5", AerFile::NonFatal, &[("CmpltTO", 1)]);
    fabric.ports[0].corrected_bits += BITS_PER_MINUTE / 1000;
    fabric.ports[1].uncorrectable += 7;
    fabric.ports[3].storm_warnings += 1;
    fabric.ports[2].paused_us += 600_000_000;
    fabric.write();
}

/// nicmon `run` on the node: polls every 200 ms, ethtool read every second (`[phyCheck]
/// readInterval`), metrics on loopback.
fn start_nicmon(node: &Node, fabric: &Fabric) -> (Daemon, SocketAddr) {
    let config = node.root().join("nicmon.toml");
    std::fs::write(&config, "[phyCheck]\nreadInterval = \"1s\"\n").unwrap();
    // Returns once the first poll is done: every baseline (AER totals, ethtool counters) taken.
    spawn_replayed(node, NODE, &config, &["--ethtool-replay".as_ref(), fabric.dir.as_os_str()])
}

/// nicmon `run` on `node` as `node_name` with `config` and `replay` (its replay flags):
/// every 200 ms, no kernel log or wake-up, events to stdout (dropped), metrics on loopback;
/// returned once its first poll is done.
fn spawn_replayed(
    node: &Node,
    node_name: &str,
    config: &std::path::Path,
    replay: &[&std::ffi::OsStr],
) -> (Daemon, SocketAddr) {
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let nicmon = Daemon::spawn(
        node.daemon_command(&nicmon_bin(), "run", Some(config), "state.json", node_name)
            .args(["--no-kmsg", "--no-wake", "--sink", "stdout", "--state-polling-interval", "200ms"])
            .args(replay)
            .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &metrics.port().to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    wait_first_poll(metrics);
    (nicmon, metrics)
}

/// Healthy node, Prometheus scraping: no physical alert is active (pending or firing) after
/// several scrapes and rule evaluations; then every fault at once fires its own alert.
#[test]
fn each_physical_fault_fires_its_own_alert_at_its_first_occurrence_and_a_healthy_port_stays_quiet() {
    let Some(tools) = tools() else { return };
    let node = Platform::L40sOci.build();
    let mut fabric = Fabric::new(&node);
    let (_nicmon, metrics) = start_nicmon(&node, &fabric);
    let prom = Prometheus::start(&tools.prometheus, RULES, metrics);
    // Five successful scrapes, the rules evaluated every second meanwhile.
    wait_for("five scrapes of nicmon", || {
        prom.has("sum_over_time(up{job=\"nicmon\"}[10m]) >= 5 and on () count(nicmon_port_healthy) > 0").then_some(())
    });
    wait_rules_evaluated(&prom, &["nicmon-physical"]);
    let alerts = wait_for("Prometheus' alerts", || prom.alerts());
    let mine: BTreeSet<&str> = EXPECTED.iter().map(|e| e.0).collect();
    let active: Vec<&Value> = alerts.iter().filter(|a| mine.contains(label(a, "alertname"))).collect();
    assert!(active.is_empty(), "a healthy node: {active:#?}");

    let since = Instant::now();
    node.set_pcie_link("mlx5_2", Some((8, 5)));
    inject_counted_faults(&node, &mut fabric);
    let fired = wait_all_firing(&prom, since, EXPECTED);
    assert_alerts(&prom, metrics, NODE, &fired, EXPECTED, &[]);
}

/// A node booted with a downtrained PCIe link, its counted faults in nicmon's first polls:
/// every event series is exported above 0 before Prometheus' first scrape, and each alert
/// fires all the same.
#[test]
fn each_physical_fault_present_when_nicmon_starts_fires_its_alert() {
    let Some(tools) = tools() else { return };
    let node = Platform::L40sOci.build();
    node.set_pcie_link("mlx5_2", Some((8, 5)));
    let mut fabric = Fabric::new(&node);
    let (_nicmon, metrics) = start_nicmon(&node, &fabric);
    inject_counted_faults(&node, &mut fabric);
    let codes: BTreeSet<&str> = EXPECTED.iter().filter(|e| e.1 != "NICPCIeCheck").map(|e| e.1).collect();
    wait_for("nicmon to export every event series", || {
        let (_, body) = http_get(metrics, "/metrics")?;
        let born: BTreeSet<&str> = codes
            .iter()
            .copied()
            .filter(|c| {
                body.lines().any(|l| {
                    l.starts_with("nicmon_unhealthy_events_total{") && l.contains(&format!("error_code=\"{c}\""))
                })
            })
            .collect();
        (born == codes).then_some(())
    });
    // Times from Prometheus' start: every series is already there, above 0.
    let since = Instant::now();
    let prom = Prometheus::start(&tools.prometheus, RULES, metrics);
    let fired = wait_all_firing(&prom, since, EXPECTED);
    assert_alerts(&prom, metrics, NODE, &fired, EXPECTED, &[]);
}

// ---------------------------------------------------------------------------------------
// NIC temperature, firmware health and the transceivers (group `nicmon-physical`): one
// nicmon on a RoCE node whose six PFs each carry a hwmon device, devlink health reporters
// and a module (the testbed's QSFP56, SFF-8636; mlx5_2's an OSFP, CMIS, fitted before the
// node boots: the module Fault state is CMIS's), read from its replay directories; each
// fault on its own PF and alert, so one Prometheus sees them all apart.

const NIC_NODE: &str = "roce-node-5";

/// What each NIC fault must fire.
const EXPECTED_NIC: &[Expected] = &[
    ("NicmonNicOverheating", "nic_overheating", "mlx5_0", "0"),
    ("NicmonFirmwareFatal", "fw_fatal", "mlx5_1", "0"),
    ("NicmonFirmwareErrors", "fw_error", "mlx5_2", "0"),
    ("NicmonOpticRxPowerLow", "optic_rx_power_low", "mlx5_3", "1"),
    ("NicmonOpticRxLos", "optic_rx_los", "mlx5_4", "1"),
    ("NicmonOpticTxFault", "optic_tx_fault", "mlx5_5", "1"),
    ("NicmonOpticTemperature", "optic_temperature", "mlx5_0", "1"),
    ("NicmonOpticModuleFault", "optic_module_fault", "mlx5_2", "1"),
    // The firmware fatal is the node's one fatal event.
    ("NicmonFatalHealthEvent", "NICFirmwareCheck", "mlx5_1", "0"),
];

/// Makes the transceiver fault whose event has error code `code` on `dev`'s module (its
/// port staying up): the hook every optics case of this file goes through.
fn inject_optic_fault(node: &Node, dev: &str, code: &str) {
    use nicmon_tests::optics::{Form, Module};
    assert!(node.module_form(dev).is_some(), "{dev} has no module on this node");
    match code {
        "optic_rx_power_low" => node.set_module(dev, |m| Module { rx_power_mw: 0.08, ..m }),
        "optic_rx_los" => node.set_module(dev, |m| Module { rx_los: vec![2], ..m }),
        "optic_tx_fault" => node.set_module(dev, |m| Module { tx_fault: vec![3], ..m }),
        // 2 °C above the module's high warning (70 °C on a QSFP56, 75 °C on an OSFP).
        "optic_temperature" => node.set_module(dev, |m| {
            let warning = if m.form == Form::Osfp { 75 } else { 70 };
            Module { temperature_c: warning + 2, ..m }
        }),
        "optic_module_fault" => {
            assert_eq!(node.module_form(dev), Some(Form::Osfp), "{dev}: the Fault state is a CMIS module's");
            node.set_module(dev, |m| Module { fault: true, ..m })
        }
        other => panic!("the testbed's modules cannot show {other}"),
    }
}

/// The NIC node as it boots: an L40S OCI RoCE node whose mlx5_2 (rdma2) carries a healthy
/// OSFP (CMIS) module in place of its QSFP56.
fn nic_node() -> Node {
    use nicmon_tests::optics::{Form, Module};
    let node = Platform::L40sOci.build();
    node.put_module("rdma2", &Module::healthy(Form::Osfp));
    node
}

/// Every NIC fault of [`EXPECTED_NIC`]: a sensor 4 °C under its 105 °C critical line (the
/// margin is 5 °C), an error of the `fw_fatal` and of the `fw` reporter, and the optics.
fn inject_nic_faults(node: &Node) {
    node.set_temperature("mlx5_0", 1, 101_000);
    node.bump_reporter("mlx5_1", "fw_fatal", 1);
    node.bump_reporter("mlx5_2", "fw", 1);
    for &(_, code, dev, _) in EXPECTED_NIC.iter().filter(|e| e.1.starts_with("optic_")) {
        inject_optic_fault(node, dev, code);
    }
}

/// nicmon `run` on the node, every NIC source read at each 200 ms poll.
fn start_nicmon_nic(node: &Node) -> (Daemon, SocketAddr) {
    let config = node.root().join("nicmon.toml");
    let every_poll = "readInterval = \"0s\"\n";
    std::fs::write(
        &config,
        format!("[thermalCheck]\n{every_poll}[firmwareCheck]\n{every_poll}[opticsCheck]\n{every_poll}"),
    )
    .unwrap();
    let (ethtool, devlink) = (node.ethtool_dir(), node.devlink_dir());
    let replay = ["--ethtool-replay".as_ref(), ethtool.as_os_str(), "--devlink-replay".as_ref(), devlink.as_os_str()];
    spawn_replayed(node, NIC_NODE, &config, &replay)
}

/// A healthy RoCE node, scraped: no NIC alert is active; then every fault at once fires its
/// own alert, naming node, device and port, and nothing else fires.
#[test]
fn each_nic_temperature_firmware_and_optics_fault_fires_its_own_alert_at_its_first_occurrence() {
    let Some(tools) = tools() else { return };
    let node = nic_node();
    let (_nicmon, metrics) = start_nicmon_nic(&node);
    let prom = Prometheus::start(&tools.prometheus, RULES, metrics);
    wait_for("five scrapes of nicmon", || {
        prom.has("sum_over_time(up{job=\"nicmon\"}[10m]) >= 5 and on () count(nicmon_optic_rx_power_dbm) > 0")
            .then_some(())
    });
    wait_rules_evaluated(&prom, &["nicmon-physical"]);
    let alerts = wait_for("Prometheus' alerts", || prom.alerts());
    let mine: BTreeSet<&str> = EXPECTED_NIC.iter().map(|e| e.0).collect();
    let active: Vec<&Value> = alerts.iter().filter(|a| mine.contains(label(a, "alertname"))).collect();
    assert!(active.is_empty(), "a healthy node: {active:#?}");

    let since = Instant::now();
    inject_nic_faults(&node);
    let fired = wait_all_firing(&prom, since, EXPECTED_NIC);
    assert_alerts(&prom, metrics, NIC_NODE, &fired, EXPECTED_NIC, &[]);
}

/// The node boots hot, with its firmware errors counted and its modules faulty: every event
/// series is exported above 0 before Prometheus' first scrape, and each alert fires.
#[test]
fn each_nic_temperature_firmware_and_optics_fault_present_when_nicmon_starts_fires_its_alert() {
    let Some(tools) = tools() else { return };
    let node = nic_node();
    inject_nic_faults(&node);
    let (_nicmon, metrics) = start_nicmon_nic(&node);
    let codes: BTreeSet<&str> = EXPECTED_NIC.iter().filter(|e| e.0 != "NicmonFatalHealthEvent").map(|e| e.1).collect();
    wait_for("nicmon to export every event series", || {
        let (_, body) = http_get(metrics, "/metrics")?;
        let born = codes.iter().filter(|c| {
            body.lines()
                .any(|l| l.starts_with("nicmon_unhealthy_events_total{") && l.contains(&format!("error_code=\"{c}\"")))
        });
        (born.count() == codes.len()).then_some(())
    });
    let since = Instant::now();
    let prom = Prometheus::start(&tools.prometheus, RULES, metrics);
    let fired = wait_all_firing(&prom, since, EXPECTED_NIC);
    assert_alerts(&prom, metrics, NIC_NODE, &fired, EXPECTED_NIC, &[]);
}
