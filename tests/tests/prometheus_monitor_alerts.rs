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
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nicmon_tests::alerts::{
    self, Expected, assert_alerts, assert_quiet_for, tools, wait_all_firing, wait_first_poll, wait_rules_evaluated,
};
use nicmon_tests::blocking::{BlockingFile, SlowFile, fifo_in};
use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::frozen::FreezableFs;
use nicmon_tests::platforms::Platform;
use nicmon_tests::prom_server::{Prometheus, free_port, http_get, wait_for};
use nicmon_tests::{Node, nicmon_bin};
use tonic::Code;

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

/// The alerts that fire besides: the fatal port and counter events, and the monitor's own
/// about how this nicmon runs (`--no-kmsg`, `--no-wake`: their holds are 5 s here).
const ALSO_PORTS: &[&str] = &["NicmonFatalHealthEvent", "NicmonKernelLogNotWatched", "NicmonEbpfUnavailable"];

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

/// The value of the label-less series `name` in `body`.
fn plain(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn polls_done(metrics: SocketAddr) -> Option<f64> {
    plain(&scrape(metrics), "nicmon_poll_duration_seconds_count")
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
    start_nicmon_saving_to(node, "state.json", name, config, extra)
}

/// [`start_nicmon`] with its state file at `state` (relative to the node's root, or absolute).
fn start_nicmon_saving_to(node: &Node, state: &str, name: &str, config: &str, extra: &[&str]) -> (Daemon, SocketAddr) {
    let path = node.root().join("nicmon.toml");
    std::fs::write(&path, config).unwrap();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let nicmon = Daemon::spawn(
        node.daemon_command(&nicmon_bin(), "run", Some(&path), state, name)
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

// ---------------------------------------------------------------------------------------
// The monitor's own alerts: two nicmons, each on its own node, one Prometheus scraping
// both (the alerts tell them apart by `instance`).
//
// - **at start-up**: a node without NVSentinel's metadata file, nicmon started with its
//   eBPF programs off (`--no-ebpf`), a kernel log path that does not exist, a platform
//   connector that is not listening, and a counter file whose reads never return (a
//   tracefs `trace_pipe`, tests/src/blocking.rs): `NicmonTopologyFallback`,
//   `NicmonEbpfUnavailable` (where the binary carries the programs),
//   `NicmonKernelLogNotWatched`, `NicmonEventsNotDelivered`, `NicmonReadsStuck`.
// - **first occurrence**, on a healthy node (metadata, a followed kernel log file, an
//   accepting connector, eBPF as it loads here), quiet over a 15 s window first: the
//   connector rejecting a batch for good (a port fault's), six counter reads hanging one
//   after the other, a sequence gap in the kernel log; then nicmon killed:
//   `NicmonEventsDropped`, `NicmonReadsStuck`, `NicmonReadsAbandoned`, `NicmonPollSlow`,
//   `NicmonKernelLogRecordsLost`, then `NicmonAbsent`.
//
// `NicmonReadsAbandoned` and `NicmonPollSlow` are rates over what Prometheus scraped
// (`increase`, `rate` of the poll-duration histogram, no `unless … offset` guard): they
// alert on reads abandoned, polls slow, *while* Prometheus watches. nicmon abandons a hung
// read once and never retries it (the read is then `NicmonReadsStuck`'s, which fires at
// start-up); so a hang from before the first scrape is not theirs, by design, and their
// case is abandonment that goes on (a new file hanging after another).
//
// `NicmonPollStalled` (no completed poll for 30 s while /metrics still answers) cannot come
// from the host reads: every one is abandoned at its 1 s deadline and a poll's at 2 s, and
// past 8 stuck reads the rest fail at once, so a poll always completes. What does hold the
// loop is the state file: it is written (and the sent-batch journal next to it) on the
// loop's thread, and a filesystem that stops taking writes holds it there — its cases are
// the last two tests here (a filesystem frozen while nicmon runs, and one frozen before it
// starts); its quiet case is here. A stopped process stops
// answering /metrics too, and its series go stale (`NicmonAbsent`'s case).

const MONITOR_ALERTS: &[&str] = &[
    "NicmonPollStalled",
    "NicmonAbsent",
    "NicmonReadsStuck",
    "NicmonReadsAbandoned",
    "NicmonPollSlow",
    "NicmonEventsNotDelivered",
    "NicmonEventsDropped",
    "NicmonTopologyFallback",
    "NicmonEbpfUnavailable",
    "NicmonKernelLogNotWatched",
    "NicmonKernelLogRecordsLost",
];

/// Whether this nicmon carries its eBPF programs (`cargo xtask build-ebpf` before the build).
fn ebpf_built_in() -> bool {
    let out = std::process::Command::new(nicmon_bin()).arg("version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("eBPF programs: built in")
}

/// One kernel log record in `/dev/kmsg`'s format (nothing driver-like).
fn kmsg_record(seq: u64) -> String {
    format!("6,{seq},{},-;nicmon alert test record {seq}\n", seq * 1000)
}

/// `dev`'s counter file whose reads hang from now on: a symlink to `blocking`'s trace_pipe.
fn hang_reads(node: &Node, blocking: &BlockingFile, dev: &str) {
    read_through(node, &blocking.pipe(), dev);
}

/// `dev`'s counter file read through `pipe` from now on (a symlink to it).
fn read_through(node: &Node, pipe: &std::path::Path, dev: &str) {
    let ctr = node.port_file(dev, 1, "counters/link_downed");
    std::fs::remove_file(&ctr).unwrap();
    std::os::unix::fs::symlink(pipe, &ctr).unwrap();
}

/// The healthy node's faults, one after the other: the port fault's batch rejected for
/// good; six reads hanging, each once the last was abandoned (a hung read keeps its reader
/// thread and is never retried: a read abandoned poll after poll takes a new file each
/// time); two kernel log records with nine lost between them.
fn inject_monitor_faults(
    node: &Node,
    metrics: SocketAddr,
    conn: &Connector,
    kmsg: &std::path::Path,
    hung: &[(&str, &BlockingFile)],
) {
    conn.refuse_next(&[Code::InvalidArgument]);
    node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
    assert!(
        conn.wait_for_calls(Duration::from_secs(60), |calls| calls.iter().any(|c| c.refused.is_some())),
        "the port fault's batch reached the connector"
    );
    for &(dev, blocking) in hung {
        let before = plain(&scrape(metrics), "nicmon_reads_abandoned_total").unwrap_or(0.0);
        hang_reads(node, blocking, dev);
        wait_for("the hung read abandoned", || {
            plain(&scrape(metrics), "nicmon_reads_abandoned_total").filter(|n| *n > before)
        });
    }
    let mut w = std::fs::OpenOptions::new().append(true).open(kmsg).unwrap();
    std::io::Write::write_all(&mut w, format!("{}{}", kmsg_record(101), kmsg_record(111)).as_bytes()).unwrap();
}

const FAULTY_NODE: &str = "gpu-node-5";
const HEALTHY_NODE: &str = "gpu-node-6";

#[test]
fn each_monitor_fault_fires_its_alert_at_start_up_and_at_its_first_occurrence_and_a_healthy_monitor_stays_quiet() {
    let Some(tools) = tools() else { return };
    // Declared first, dropped last: the daemons reading the trace_pipes are gone by then.
    let Some(blocking_faulty) = BlockingFile::new("alerts-faulty") else { return };
    // One instance per hung file (a trace_pipe is read by one reader at a time).
    let hung = ["mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8"];
    let Some(blocking_healthy) =
        hung.iter().map(|d| BlockingFile::new(&format!("alerts-{d}"))).collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = alerts::rules_with_short_holds(dir.path());
    let ebpf = ebpf_built_in();

    // Faulty from the start.
    let faulty = Platform::H100Oci.build();
    faulty.remove_metadata();
    hang_reads(&faulty, &blocking_faulty, "mlx5_8");
    let nowhere = format!("unix://{}", faulty.root().join("no-connector.sock").display());
    let no_kmsg = faulty.root().join("no-such-kmsg");
    let (_faulty, faulty_metrics) = start_nicmon(
        &faulty,
        FAULTY_NODE,
        "",
        &["--no-ebpf", "--kmsg-path", no_kmsg.to_str().unwrap(), "--platform-connector-socket", &nowhere],
    );

    // Healthy until its faults.
    let healthy = Platform::H100Oci.build();
    let kmsg = healthy.root().join("kmsg.log");
    std::fs::write(&kmsg, kmsg_record(100)).unwrap();
    let conn = Connector::start(&healthy.root().join("nvsentinel.sock"));
    let (mut healthy_nicmon, healthy_metrics) = start_nicmon(
        &healthy,
        HEALTHY_NODE,
        "",
        &["--kmsg-path", kmsg.to_str().unwrap(), "--platform-connector-socket", &conn.target()],
    );
    let ebpf_loaded = plain(&scrape(healthy_metrics), "nicmon_ebpf_available") == Some(1.0);

    let since = Instant::now();
    let prom = Prometheus::start_all(&tools.prometheus, &rules, &[faulty_metrics, healthy_metrics]);
    wait_for("five scrapes of both", || {
        prom.has("count(sum_over_time(up{job=\"nicmon\"}[10m]) >= 5) == 2").then_some(())
    });
    wait_rules_evaluated(&prom, &["nicmon-monitor", "nicmon-ebpf", "nicmon-kernel-log"]);
    let quiet: Vec<&str> =
        MONITOR_ALERTS.iter().copied().filter(|a| *a != "NicmonEbpfUnavailable" || ebpf_loaded).collect();
    if !ebpf_loaded {
        eprintln!("NicmonEbpfUnavailable's quiet case not shown: eBPF did not load on this machine");
    }
    assert_quiet_for(&prom, healthy_metrics, &quiet, Duration::from_secs(15));

    let mut at_start: Vec<Expected> = vec![
        ("NicmonTopologyFallback", "sysfs", "", ""),
        ("NicmonKernelLogNotWatched", "", "", ""),
        ("NicmonEventsNotDelivered", "", "", ""),
        ("NicmonReadsStuck", "", "", ""),
    ];
    if ebpf {
        at_start.push(("NicmonEbpfUnavailable", "", "", ""));
    } else {
        eprintln!("NicmonEbpfUnavailable not fired: this nicmon carries no eBPF programs (nicmon_ebpf_embedded 0)");
    }
    let fired = wait_all_firing(&prom, since, &at_start);
    assert_alerts(&prom, faulty_metrics, FAULTY_NODE, &fired, &at_start, &[]);

    let since = Instant::now();
    inject_monitor_faults(
        &healthy,
        healthy_metrics,
        &conn,
        &kmsg,
        &hung.iter().copied().zip(&blocking_healthy).collect::<Vec<_>>(),
    );
    let first: &[Expected] = &[
        ("NicmonReadsStuck", "", "", ""),
        ("NicmonReadsAbandoned", "", "", ""),
        ("NicmonPollSlow", "", "", ""),
        ("NicmonEventsDropped", "InfiniBandStateCheck", "", ""),
        ("NicmonKernelLogRecordsLost", "", "", ""),
    ];
    let fired = wait_all_firing(&prom, since, first);
    let port_down = ["NicmonFatalHealthEvent", "NicmonPortDown"];
    assert_alerts(&prom, healthy_metrics, HEALTHY_NODE, &fired, first, &port_down);

    // Gone after Prometheus scraped it.
    let since = Instant::now();
    healthy_nicmon.kill9();
    let absent: &[Expected] = &[("NicmonAbsent", "", "", "")];
    let fired = wait_all_firing(&prom, since, absent);
    // (The alerts of its last scrapes may still be firing as the series go stale.)
    let before: Vec<&str> = MONITOR_ALERTS.iter().chain(&port_down).copied().collect();
    assert_alerts(&prom, healthy_metrics, HEALTHY_NODE, &fired, absent, &before);
}

// ---------------------------------------------------------------------------------------
// The monitor's faults that are counted, present as nicmon starts: a connector that rejects
// every batch for good from the start (the first poll's port fault, and the poll-stall
// watchdog's baseline), a kernel log whose first records read have ten lost between them
// (100 and 111, already in the FIFO nicmon reads), and a counter file behind a slow firmware
// command (every read answers 3 s late: it is abandoned at the 1 s read deadline, read again
// once it answered, abandoned again; each such poll lasts its 1 s read deadline).
//
// Every count is above 0 before Prometheus' first scrape. `NicmonEventsDropped` and
// `NicmonKernelLogRecordsLost` count a series born above 0 (`X unless X offset W`);
// `NicmonReadsAbandoned` and `NicmonPollSlow` need no such guard for a fault that goes on:
// increase() and rate() see it add after the first scrape.

const STARTUP_NODE: &str = "gpu-node-7";

#[test]
fn dropped_events_lost_kernel_log_records_and_slow_reads_present_when_nicmon_starts_fire_their_alerts() {
    let Some(tools) = tools() else { return };
    // Declared first, dropped last: nicmon, reading it, is gone by then.
    let Some(slow) = SlowFile::new("alerts-slow", Duration::from_secs(3)) else { return };
    let dir = tempfile::tempdir().unwrap();
    let rules = alerts::rules_with_short_holds(dir.path());
    let node = Platform::H100Oci.build();
    node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
    read_through(&node, &slow.pipe(), "mlx5_8");
    // Held open read-write by the test: the records wait in the FIFO for nicmon.
    let kmsg = fifo_in(node.root(), "kmsg");
    let mut held = std::fs::OpenOptions::new().read(true).write(true).open(&kmsg).unwrap();
    std::io::Write::write_all(&mut held, format!("{}{}", kmsg_record(100), kmsg_record(111)).as_bytes()).unwrap();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    conn.refuse_all(Code::InvalidArgument);
    let (_nicmon, metrics) = start_nicmon(
        &node,
        STARTUP_NODE,
        "",
        &["--no-wake", "--kmsg-path", kmsg.to_str().unwrap(), "--platform-connector-socket", &conn.target()],
    );
    // Each check whose batch the connector rejected is counted under it: the port fault's,
    // the watchdog's baseline (and any other check's first-poll batch).
    let dropped = |check: &str| format!("nicmon_events_failed_total{{check=\"{check}\",kind=\"permanent\"}}");
    wait_for("nicmon to count every fault", || {
        let body = scrape(metrics);
        let above = |name: &str| plain(&body, name).is_some_and(|v| v > 0.0);
        let rejected = rejected_checks(&conn);
        (plain(&body, "nicmon_kmsg_records_lost_total") == Some(10.0)
            && ["InfiniBandStateCheck", "NICPollStallCheck"].iter().all(|c| rejected.contains(*c))
            && rejected.iter().all(|c| above(&dropped(c)))
            && above("nicmon_reads_abandoned_total"))
        .then_some(())
    });
    assert!(conn.received().iter().all(|c| c.refused == Some(Code::InvalidArgument)), "every batch rejected");

    let since = Instant::now();
    let prom = Prometheus::start(&tools.prometheus, &rules, metrics);
    let counted: &[Expected] = &[
        ("NicmonKernelLogRecordsLost", "", "", ""),
        ("NicmonReadsAbandoned", "", "", ""),
        ("NicmonPollSlow", "", "", ""),
    ];
    let expected = |rejected: BTreeSet<String>| -> Vec<Expected> {
        let leak = |c: String| -> &'static str { Box::leak(c.into_boxed_str()) };
        rejected.into_iter().map(|c| ("NicmonEventsDropped", leak(c), "", "")).chain(counted.iter().copied()).collect()
    };
    let fired = wait_all_firing(&prom, since, &expected(rejected_checks(&conn)));
    // The port fault's own; a slow read is stuck for up to 3 s at a time; `--no-wake`.
    let also = ["NicmonFatalHealthEvent", "NicmonPortDown", "NicmonReadsStuck", "NicmonEbpfUnavailable"];
    assert_alerts(&prom, metrics, STARTUP_NODE, &fired, &expected(rejected_checks(&conn)), &also);
    drop(held);
}

/// The checks of the events in the batches `conn` refused.
fn rejected_checks(conn: &Connector) -> BTreeSet<String> {
    let refused = conn.received().into_iter().filter(|c| c.refused.is_some());
    refused.flat_map(|c| c.batch.events).map(|e| e.check_name).collect()
}

// ---------------------------------------------------------------------------------------
// `NicmonPollStalled`: the state file's filesystem frozen (`fsfreeze`, as a snapshot tool
// does; a hung disk or NFS server holds writes the same way), then a port goes down: the
// poll's commit writes the sent-batch journal and the state file on the loop's thread, the
// write blocks, no poll completes; the metrics thread goes on answering, with upstream's
// stall gauge at 1 and /healthz failing. The 30 s is the shipped expression's: the alert
// fires some 35 s after the freeze. Thawed, the poll completes and the alert resolves.

const STALLED_NODE: &str = "gpu-node-8";

/// What both stall tests start from: a freezable filesystem with nicmon's state file on
/// it, the node and the shipped rules with short holds. Declared before nicmon, so the
/// filesystem is unmounted after nicmon is gone.
struct Stall {
    tools: nicmon_tests::prometheus::Tools,
    fs: FreezableFs,
    _dir: tempfile::TempDir,
    rules: std::path::PathBuf,
    node: Node,
    state: String,
}

impl Stall {
    /// `None` (the test skips, saying why) without the tools or a freezable filesystem.
    fn set_up() -> Option<Stall> {
        let tools = tools()?;
        let fs = FreezableFs::new()?;
        let dir = tempfile::tempdir().unwrap();
        let rules = alerts::rules_with_short_holds(dir.path());
        let state = fs.path().join("state.json").to_str().unwrap().to_string();
        Some(Stall { tools, fs, _dir: dir, rules, node: Platform::H100Oci.build(), state })
    }

    /// After the thaw: a poll completes (more than `polls` done) and the alert resolves.
    fn thawed(&self, prom: &Prometheus, metrics: SocketAddr, polls: f64) {
        wait_for("a poll completed after the thaw", || polls_done(metrics).filter(|n| *n > polls));
        wait_for("NicmonPollStalled resolved", || {
            let active = prom.alerts()?;
            (!active.iter().any(|a| alerts::label(a, "alertname") == "NicmonPollStalled")).then_some(())
        });
    }
}

#[test]
fn a_poll_loop_held_by_a_frozen_state_file_filesystem_fires_nicmon_poll_stalled_while_metrics_answer() {
    let Some(stall) = Stall::set_up() else { return };
    let (node, fs) = (&stall.node, &stall.fs);
    let (_nicmon, metrics) = start_nicmon_saving_to(node, &stall.state, STALLED_NODE, "", PORT_ARGS);
    let prom = Prometheus::start(&stall.tools.prometheus, &stall.rules, metrics);
    wait_for("five scrapes of nicmon", || {
        prom.has("sum_over_time(up{job=\"nicmon\"}[10m]) >= 5 and on () count(nicmon_port_healthy) > 0").then_some(())
    });
    wait_rules_evaluated(&prom, &["nicmon-monitor"]);
    assert!(std::path::Path::new(&stall.state).is_file(), "nicmon saves its state on the frozen-to-be filesystem");

    let since = Instant::now();
    // Declared after nicmon, so thawed before it is killed (a writer blocked on a frozen
    // filesystem cannot be killed), a failing assertion included.
    let frozen = fs.freeze();
    node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
    let expected: &[Expected] = &[("NicmonPollStalled", "", "", "")];
    let fired = wait_all_firing(&prom, since, expected);
    let body = scrape(metrics);
    for category in ["state", "counter"] {
        let line = format!("nic_health_monitor_poll_stalled{{node=\"{STALLED_NODE}\",category=\"{category}\"}} 1");
        assert!(body.lines().any(|l| l == line), "{line} in {body}");
    }
    let healthz = http_get(metrics, "/healthz").map(|(code, _)| code);
    assert!(healthz.is_some_and(|c| c != 200), "/healthz answers, failing: {healthz:?}");
    // `--no-kmsg`, `--no-wake`; nothing of the port fault: its poll is the one held.
    let also = ["NicmonKernelLogNotWatched", "NicmonEbpfUnavailable"];
    assert_alerts(&prom, metrics, STALLED_NODE, &fired, expected, &also);
    assert_eq!(value_of(&body, "nicmon_port_healthy{", "mlx5_0"), Some(1.0), "the held poll's fault is not exported");
    let polls = plain(&body, "nicmon_poll_duration_seconds_count").unwrap();

    drop(frozen);
    stall.thawed(&prom, metrics, polls);
    wait_for("the port fault exported", || {
        (value_of(&scrape(metrics), "nicmon_port_healthy{", "mlx5_0") == Some(0.0)).then_some(())
    });
}

// `NicmonPollStalled` present at start-up: the state file's filesystem already frozen when
// nicmon starts. It serves /metrics and completes its first poll, whose save then blocks:
// no poll completes after it, and the alert fires on the first completion's timestamp
// growing old (the shipped 30 s).

const STALLED_AT_START_NODE: &str = "gpu-node-9";

#[test]
fn a_state_file_filesystem_frozen_before_nicmon_starts_fires_nicmon_poll_stalled() {
    let Some(stall) = Stall::set_up() else { return };
    // Declared before the freeze, so dropped after the thaw (a process blocked on a frozen
    // filesystem cannot be killed), a failing assertion included.
    let nicmon: Daemon;
    let frozen = stall.fs.freeze();
    let since = Instant::now();
    let (daemon, metrics) = start_nicmon_saving_to(&stall.node, &stall.state, STALLED_AT_START_NODE, "", PORT_ARGS);
    nicmon = daemon;
    let prom = Prometheus::start(&stall.tools.prometheus, &stall.rules, metrics);
    let expected: &[Expected] = &[("NicmonPollStalled", "", "", "")];
    let fired = wait_all_firing(&prom, since, expected);
    assert_eq!(polls_done(metrics), Some(1.0), "the first poll completed, none after it");
    let also = ["NicmonKernelLogNotWatched", "NicmonEbpfUnavailable"];
    assert_alerts(&prom, metrics, STALLED_AT_START_NODE, &fired, expected, &also);

    drop(frozen);
    stall.thawed(&prom, metrics, 1.0);
    drop(nicmon);
}
