//! Upstream's first-poll deferral at the binary's edge: while a monitored device is
//! unreadable (a port's `state`, `phys_state` or `link_layer`), the daemon's first poll of a
//! boot is deferred, at most 3 times, each counted in
//! `nic_health_monitor_first_poll_deferred_total{node,check}`; then it runs with the
//! readable devices, and the reboot's clear and baselines arrive at a real connector.
//! Waits are condition-based, bounded by timeouts.
use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nicmon_proto::datamodels::HealthEvent;
use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};

const WAIT: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-node-5";

fn start(node: &Node, conn: &Connector, port: u16) -> Daemon {
    Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", NODE)
            .args(["--platform-connector-socket", &conn.target(), "--no-kmsg", "--no-wake"])
            .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &port.to_string()])
            .env("RUST_LOG", "warn,nicmon=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn metrics(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The value of `nic_health_monitor_first_poll_deferred_total` for `check`.
fn deferred(text: &str, check: &str) -> Option<u64> {
    let key = format!("nic_health_monitor_first_poll_deferred_total{{node=\"{NODE}\",check=\"{check}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).and_then(|v| v.trim().parse().ok())
}

/// Wait until /metrics satisfies `pred` (polling the endpoint, bounded by `WAIT`).
fn wait_metrics(port: u16, pred: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let m = metrics(port);
        if pred(&m) {
            return m;
        }
        assert!(start.elapsed() < WAIT, "metrics never matched: {m}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `mlx5_5`'s port state unreadable: a directory where the file was.
fn make_unreadable(node: &Node) {
    let state = node.port_file("mlx5_5", 1, "state");
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir(&state).unwrap();
}

fn make_readable(node: &Node) {
    let state = node.port_file("mlx5_5", 1, "state");
    std::fs::remove_dir(&state).unwrap();
    std::fs::write(&state, "4: ACTIVE\n").unwrap();
}

fn port_healthy(ev: &[HealthEvent], dev: &str) -> bool {
    ev.iter().any(|e| {
        e.check_name == "InfiniBandStateCheck"
            && e.is_healthy
            && e.entities_impacted.iter().any(|x| x.entity_value == dev)
    })
}

fn cleared(ev: &[HealthEvent]) -> bool {
    ev.iter().any(|e| e.check_name == "InfiniBandStateCheck" && e.is_healthy && e.entities_impacted.is_empty())
}

#[test]
fn an_unreadable_device_defers_the_first_poll_three_times_then_it_runs_with_the_readable_ones() {
    let node = Platform::H100Oci.build();
    make_unreadable(&node);
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let port = free_port();
    let d = start(&node, &conn, port);
    assert!(conn.wait_until(WAIT, |ev| cleared(ev) && port_healthy(ev, "mlx5_0")), "{:#?}", conn.events());
    let m = wait_metrics(port, |m| deferred(m, "InfiniBandStateCheck").is_some());
    assert_eq!(deferred(&m, "InfiniBandStateCheck"), Some(3), "{m}");
    assert_eq!(deferred(&m, "InfiniBandDegradationCheck"), Some(3), "{m}");
    assert_eq!(deferred(&m, "EthernetStateCheck"), Some(3), "{m}");
    let ev = conn.events();
    assert!(!port_healthy(&ev, "mlx5_5"), "an unknown state is not a verdict: {ev:#?}");
    assert!(ev.iter().all(|e| e.is_healthy), "{ev:#?}");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    for n in 1..=3 {
        assert!(log.contains(&format!("first poll deferred ({n}/3): devices unreadable: mlx5_5")), "{log}");
    }
    assert!(!log.contains("first poll deferred (4/3)"), "{log}");
    assert!(log.contains("first-poll deferral limit (3) reached"), "{log}");
}

#[test]
fn a_device_readable_again_within_the_deferrals_ends_them_and_is_baselined() {
    let node = Platform::H100Oci.build();
    make_unreadable(&node);
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let port = free_port();
    let d = start(&node, &conn, port);
    wait_metrics(port, |m| deferred(m, "InfiniBandStateCheck").is_some_and(|n| n >= 1));
    make_readable(&node);
    assert!(conn.wait_until(WAIT, |ev| cleared(ev) && port_healthy(ev, "mlx5_5")), "{:#?}", conn.events());
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("first poll deferred (1/3)"), "{log}");
    assert!(!log.contains("first-poll deferral limit"), "the first poll ran on a complete read: {log}");
    // The clear of the reboot comes before every baseline.
    let ev = conn.events();
    let first = ev.iter().find(|e| e.check_name == "InfiniBandStateCheck").unwrap();
    assert!(first.entities_impacted.is_empty(), "{ev:#?}");
}
