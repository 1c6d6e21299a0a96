//! `NICPollStallCheck` (NVSentinel's poll-stall watchdog) at the binary's edge: a host read
//! that blocks keeps a poll in flight past `--poll-stall-deadline`; the watchdog, a thread of
//! its own, sends the stall to a real connector while the poll is stuck, and a healthy event
//! once polls complete again. `--poll-stall-store-only` sends them `STORE_ONLY`; `0s` turns
//! the watchdog off.
//!
//! The blocking read is a tracefs `trace_pipe` in place of a counter file; each read of it is
//! abandoned after nicmon's 1 s read deadline, so a poll that meets it lasts about 1 s, well
//! past the test's 300 ms deadline. Waits are condition-based, bounded by timeouts.
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nicmon_proto::datamodels::HealthEvent;
use nicmon_tests::blocking::BlockingFile;
use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};

const WAIT: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-node-3";
const CHECK: &str = "NICPollStallCheck";
/// `ProcessingStrategy` wire numbers.
const EXECUTE_REMEDIATION: i32 = 1;
const STORE_ONLY: i32 = 2;

fn start(node: &Node, conn: &Connector, extra: &[&str]) -> Daemon {
    Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", NODE)
            .args(["--platform-connector-socket", &conn.target(), "--no-kmsg", "--no-wake", "--no-metrics"])
            .args(["--connector-retry-base", "50ms"])
            .args(extra)
            .env("RUST_LOG", "warn,nicmon=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
}

fn stall_events(ev: &[HealthEvent]) -> Vec<&HealthEvent> {
    ev.iter().filter(|e| e.check_name == CHECK).collect()
}

/// The counter file a blocking read replaces (read on every poll: nicmon's default counters).
fn counter(node: &Node) -> PathBuf {
    node.port_file("mlx5_2", 1, "counters/link_downed")
}

fn block(node: &Node, blocking: &BlockingFile) {
    let ctr = counter(node);
    std::fs::remove_file(&ctr).unwrap();
    std::os::unix::fs::symlink(blocking.pipe(), &ctr).unwrap();
}

fn unblock(node: &Node) {
    let ctr = counter(node);
    std::fs::remove_file(&ctr).unwrap();
    std::fs::write(&ctr, "0\n").unwrap();
}

/// Healthy baseline after the first poll; a stuck read → the stall (non-fatal, action NONE,
/// node-level) while the poll is in flight; recovery → healthy.
fn stall_then_recovery(store_only: bool) {
    // Declared first, dropped last: the daemon (reading its trace_pipe) is gone by then.
    let Some(blocking) = BlockingFile::new("stall") else { return };
    let node = Platform::H100Oci.build();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let mut extra = vec!["--poll-stall-deadline=300ms"];
    if store_only {
        extra.push("--poll-stall-store-only");
    }
    let d = start(&node, &conn, &extra);
    let strategy = if store_only { STORE_ONLY } else { EXECUTE_REMEDIATION };
    assert!(
        conn.wait_until(WAIT, |ev| stall_events(ev).iter().any(|e| e.is_healthy)),
        "the first completed poll sends a healthy baseline: {:#?}",
        conn.events()
    );
    block(&node, &blocking);
    assert!(
        conn.wait_until(WAIT, |ev| stall_events(ev).iter().any(|e| !e.is_healthy)),
        "a poll stuck past the deadline is reported: {:#?}",
        conn.events()
    );
    unblock(&node);
    let recovered = |ev: &[HealthEvent]| {
        let s = stall_events(ev);
        s.iter().position(|e| !e.is_healthy).is_some_and(|i| s[i + 1..].iter().any(|e| e.is_healthy))
    };
    assert!(conn.wait_until(WAIT, recovered), "healthy after recovery: {:#?}", conn.events());
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let ev = conn.events();
    let stall = stall_events(&ev);
    let stalled = stall.iter().find(|e| !e.is_healthy).unwrap();
    assert!(!stalled.is_fatal, "{stalled:#?}");
    assert_eq!(stalled.recommended_action, 0, "NONE: {stalled:#?}");
    assert!(stalled.entities_impacted.is_empty(), "node-level: {stalled:#?}");
    assert!(stalled.message.starts_with("NIC state cannot be observed: poll in flight for"), "{stalled:#?}");
    assert_eq!(stalled.node_name, NODE);
    assert_eq!(stalled.agent, "nic-health-monitor");
    for e in &stall {
        assert_eq!(e.processing_strategy, strategy, "{e:#?}");
    }
    // The stall's clear follows it, never precedes it (one publish at a time).
    assert!(stall[0].is_healthy, "baseline first: {stall:#?}");
    // The other checks' events keep the daemon's strategy.
    assert!(
        ev.iter().filter(|e| e.check_name != CHECK).all(|e| e.processing_strategy == EXECUTE_REMEDIATION),
        "{ev:#?}"
    );
    assert!(log.contains("NIC poll stall detection enabled"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    drop(blocking);
}

#[test]
fn a_stuck_read_past_the_deadline_is_a_poll_stall_and_recovery_is_healthy() {
    stall_then_recovery(false);
}

#[test]
fn store_only_sends_the_stall_events_store_only() {
    stall_then_recovery(true);
}

/// `0s`: a poll held by a stuck read (about 1 s, longer than any deadline a test would set)
/// sends no NICPollStallCheck event, and the daemon still reports a cable pull.
#[test]
fn a_zero_deadline_turns_the_watchdog_off() {
    let Some(blocking) = BlockingFile::new("stall-off") else { return };
    let node = Platform::H100Oci.build();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    block(&node, &blocking);
    let d = start(&node, &conn, &["--poll-stall-deadline=0s"]);
    let baselines =
        |ev: &[HealthEvent]| ev.iter().filter(|e| e.is_healthy && e.check_name == "InfiniBandStateCheck").count() >= 16;
    assert!(conn.wait_until(WAIT, baselines), "baselines: {:#?}", conn.events());
    node.pull_cable("mlx5_0", 1);
    let pulled = |ev: &[HealthEvent]| {
        ev.iter().any(|e| {
            e.check_name == "InfiniBandStateCheck"
                && !e.is_healthy
                && e.entities_impacted.iter().any(|x| x.entity_value == "mlx5_0")
        })
    };
    assert!(conn.wait_until(WAIT, pulled), "cable pull: {:#?}", conn.events());
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("read did not return in time"), "the poll met the stuck read: {log}");
    assert!(log.contains("NIC poll stall detection off"), "{log}");
    assert!(stall_events(&conn.events()).is_empty(), "{:#?}", conn.events());
    drop(blocking);
}
