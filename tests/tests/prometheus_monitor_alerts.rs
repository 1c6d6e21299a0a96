//! The port and counter alerts (deploy/prometheus/nicmon-rules.yaml, group `nicmon-ports`)
//! and the monitor's own (groups `nicmon-monitor`, `nicmon-ebpf`, `nicmon-kernel-log`)
//! against a real Prometheus 2.42 scraping running nicmons: each fires for its fault, on its
//! first occurrence and when the fault is there as nicmon starts, naming what it says it
//! names, with its runbook; each stays quiet on a healthy node over a scrape window.
//!
//! **What is rewritten, and why.** Most of these alerts hold 1 to 20 minutes (`for:`) as
//! shipped: the rules Prometheus loads here are a copy of the shipped file in which every
//! `for: <duration>` line reads `for: 5s` ([`alerts::rules_with_short_holds`], checked line
//! by line by its unit test) — nothing else: every expression, range window and threshold is
//! the shipped one. Prometheus scrapes and evaluates every second.
//!
//! Not flaky by construction: every wait is on a condition (an exposition line, an alert in
//! Prometheus' API) with a 180 s deadline; a quiet case samples Prometheus' alerts over its
//! window and fails on any active (pending or firing) one.
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nicmon_tests::alerts::{
    self, Expected, assert_alerts, assert_quiet_for, tools, wait_all_firing, wait_first_poll, wait_rules_evaluated,
};
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::prom_server::{Prometheus, free_port, http_get, wait_for};
use nicmon_tests::{Node, nicmon_bin};

// ---------------------------------------------------------------------------------------
// Ports and counters: one nicmon on an H100 OCI node (16 InfiniBand compute ports), each
// fault on its own port.

const PORT_NODE: &str = "gpu-node-4";

/// What each port fault must fire.
const EXPECTED_PORTS: &[Expected] = &[
    ("NicmonPortDown", "", "mlx5_0", "1"),
    ("NicmonPortFlapping", "", "mlx5_3", "1"),
    // The flapping port blipped five times under the hold-down before it was flapping.
    ("NicmonPortBlips", "", "mlx5_3", "1"),
    ("NicmonPortBlips", "", "mlx5_5", "1"),
    ("NicmonLinkDegraded", "InfiniBandStateCheck", "mlx5_12", "1"),
    ("NicmonLinkErrorsFatal", "link_downed", "mlx5_7", "1"),
    ("NicmonLinkErrors", "port_rcv_errors", "mlx5_9", "1"),
    ("NicmonCounterSaturated", "link_downed", "mlx5_13", "1"),
    ("NicmonPortAttributeUnknown", "state", "mlx5_15", "1"),
];

/// The alerts the port faults make fire besides: the fatal port and counter events.
const ALSO_PORTS: &[&str] = &["NicmonFatalHealthEvent"];

/// The group's alerts (the quiet case covers each).
const PORT_ALERTS: &[&str] = &[
    "NicmonPortDown",
    "NicmonPortFlapping",
    "NicmonPortBlips",
    "NicmonLinkDegraded",
    "NicmonLinkErrorsFatal",
    "NicmonLinkErrors",
    "NicmonCounterSaturated",
    "NicmonPortAttributeUnknown",
];

/// The hold-down that makes short DOWNs blips, and a flap threshold above the blips port's
/// three blips.
const PORT_CONFIG: &str = "[stateCheck]\nportStateHoldDown = \"15s\"\nflapThreshold = 6\n";

/// A numeric value of the first exposition line of `family` (`name{`) that carries `dev`.
fn value_of(body: &str, family: &str, dev: &str) -> Option<f64> {
    let device = format!("device=\"{dev}\"");
    body.lines().find(|l| l.starts_with(family) && l.contains(&device)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn scrape(metrics: SocketAddr) -> String {
    http_get(metrics, "/metrics").filter(|(c, _)| *c == 200).map(|(_, b)| b).unwrap_or_default()
}

fn polls_done(metrics: SocketAddr) -> Option<f64> {
    scrape(metrics).lines().find_map(|l| l.strip_prefix("nicmon_poll_duration_seconds_count ")?.trim().parse().ok())
}

const BLIPS: &str = "nic_health_monitor_port_state_blips_total{";
const FLAPPING: &str = "nicmon_port_flapping{";

/// A DOWN shorter than the hold-down: pulled, seen by two full polls, repaired; returns
/// once nicmon counted the blip (or holds the port as flapping).
fn blip(node: &Node, metrics: SocketAddr, dev: &str) {
    let before = value_of(&scrape(metrics), BLIPS, dev).unwrap_or(0.0);
    let polls = wait_for("nicmon's poll count", || polls_done(metrics));
    node.pull_cable(dev, 1);
    wait_for("two polls of the pulled port", || polls_done(metrics).filter(|n| *n >= polls + 2.0));
    node.repair(dev, 1);
    wait_for("the blip counted", || {
        let body = scrape(metrics);
        let counted = value_of(&body, BLIPS, dev).is_some_and(|n| n > before);
        (counted || value_of(&body, FLAPPING, dev) == Some(1.0)).then_some(())
    });
}

/// The faults a node can have as nicmon first reads it: a port down, one trained at half
/// its group's rate, a saturated 8-bit counter, an unparsable state.
fn inject_port_states(node: &Node) {
    node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
    node.set_rate("mlx5_12", 1, "200 Gb/sec (2X NDR)");
    node.set_counter("mlx5_13", 1, "counters/link_downed", 255);
    node.write_port_file("mlx5_15", 1, "state", "not a port state\n");
}

/// The faults that are moves of what nicmon already read: counter breaches, blips, flaps.
fn inject_port_moves(node: &Node, metrics: SocketAddr) {
    node.set_counter("mlx5_7", 1, "counters/link_downed", 1);
    node.set_counter("mlx5_9", 1, "counters/port_rcv_errors", 100_000);
    for _ in 0..3 {
        blip(node, metrics, "mlx5_5");
    }
    for _ in 0..10 {
        if value_of(&scrape(metrics), FLAPPING, "mlx5_3") == Some(1.0) {
            return;
        }
        blip(node, metrics, "mlx5_3");
    }
    panic!("mlx5_3 not flapping after 10 blips: {}", scrape(metrics));
}

/// nicmon `run` on `node`, polling every 200 ms, metrics on loopback.
fn start_nicmon(node: &Node, name: &str, config: &str, extra: &[&str]) -> (Daemon, SocketAddr) {
    let path = node.root().join("nicmon.toml");
    std::fs::write(&path, config).unwrap();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let nicmon = Daemon::spawn(
        node.daemon_command(&nicmon_bin(), "run", Some(&path), "state.json", name)
            .args(["--state-polling-interval", "200ms"])
            .args(extra)
            .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &metrics.port().to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    wait_first_poll(metrics);
    (nicmon, metrics)
}

const PORT_ARGS: &[&str] = &["--no-kmsg", "--no-wake", "--sink", "stdout"];

/// A healthy node, scraped: no port or counter alert is active over 15 s (three holds);
/// then every fault, each on its port, fires its own alert and nothing else.
#[test]
fn each_port_and_counter_fault_fires_its_alert_at_its_first_occurrence_and_a_healthy_node_stays_quiet() {
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rules = alerts::rules_with_short_holds(dir.path());
    let node = Platform::H100Oci.build();
    let (_nicmon, metrics) = start_nicmon(&node, PORT_NODE, PORT_CONFIG, PORT_ARGS);
    let prom = Prometheus::start(&tools.prometheus, &rules, metrics);
    wait_for("five scrapes of nicmon", || {
        prom.has("sum_over_time(up{job=\"nicmon\"}[10m]) >= 5 and on () count(nicmon_port_healthy) > 0").then_some(())
    });
    wait_rules_evaluated(&prom, &["nicmon-ports"]);
    assert_quiet_for(&prom, metrics, PORT_ALERTS, Duration::from_secs(15));

    let since = Instant::now();
    inject_port_states(&node);
    inject_port_moves(&node, metrics);
    let fired = wait_all_firing(&prom, since, EXPECTED_PORTS);
    assert_alerts(&prom, metrics, PORT_NODE, &fired, EXPECTED_PORTS, ALSO_PORTS);
}

/// The node boots with a port down, one downtrained, a counter saturated and a state
/// unreadable; its counters breach, one port blips and one flaps during nicmon's first
/// polls: every series is exported before Prometheus' first scrape, and each alert fires.
#[test]
fn each_port_and_counter_fault_present_when_nicmon_starts_fires_its_alert() {
    let Some(tools) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rules = alerts::rules_with_short_holds(dir.path());
    let node = Platform::H100Oci.build();
    inject_port_states(&node);
    let (_nicmon, metrics) = start_nicmon(&node, PORT_NODE, PORT_CONFIG, PORT_ARGS);
    inject_port_moves(&node, metrics);
    wait_for("nicmon to export every fault", || {
        let body = scrape(metrics);
        let has = |family: &str, dev: &str, want: fn(f64) -> bool| value_of(&body, family, dev).is_some_and(want);
        (has("nicmon_port_healthy{", "mlx5_0", |v| v == 0.0)
            && has("nic_health_monitor_state_check_errors_total{", "mlx5_12", |v| v > 0.0)
            && has("nic_health_monitor_counter_threshold_breaches_total{", "mlx5_7", |v| v > 0.0)
            && has("nic_health_monitor_counter_threshold_breaches_total{", "mlx5_9", |v| v > 0.0)
            && has("nicmon_counter_saturated{", "mlx5_13", |v| v == 1.0)
            && has("nicmon_port_attribute_unknown{", "mlx5_15", |v| v == 1.0))
        .then_some(())
    });
    let since = Instant::now();
    let prom = Prometheus::start(&tools.prometheus, &rules, metrics);
    let fired = wait_all_firing(&prom, since, EXPECTED_PORTS);
    assert_alerts(&prom, metrics, PORT_NODE, &fired, EXPECTED_PORTS, ALSO_PORTS);
}
