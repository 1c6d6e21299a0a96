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
use nicmon_tests::connector::{Connector, Received};
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-node-3";
const CHECK: &str = "NICPollStallCheck";
/// `ProcessingStrategy` wire numbers.
const EXECUTE_REMEDIATION: i32 = 1;
const STORE_ONLY: i32 = 2;

fn start(node: &Node, conn: &Connector, extra: &[&str]) -> Daemon {
    let mut args = vec!["--no-metrics"];
    args.extend(extra);
    start_with(node, conn, &args)
}

fn start_with(node: &Node, conn: &Connector, extra: &[&str]) -> Daemon {
    Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", NODE)
            .args(["--platform-connector-socket", &conn.target(), "--no-kmsg", "--no-wake"])
            .args(["--connector-retry-base", "50ms"])
            .args(extra)
            .env("RUST_LOG", "warn,nicmon=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
}

/// Calls refused that offered a stall.
fn stall_refused_count(calls: &[Received]) -> usize {
    calls
        .iter()
        .filter(|c| c.refused.is_some() && c.batch.events.iter().any(|e| e.check_name == CHECK && !e.is_healthy))
        .count()
}

/// Polls completed so far (`nicmon_poll_duration_seconds_count` on /metrics).
fn polls_completed(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| l.strip_prefix("nicmon_poll_duration_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
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
    assert_stall_message(&stalled.message);
    assert_eq!(stalled.node_name, NODE);
    assert_eq!(stalled.agent, "nic-health-monitor");
    for e in &stall {
        assert_eq!(e.processing_strategy, strategy, "{e:#?}");
    }
    // The stall's clear follows it, never precedes it (one publish at a time): the events
    // start with the healthy baseline — or, where the first poll itself outlasted the 300 ms
    // deadline (a loaded machine: discovery's first walk), with that stall and its clear —
    // and no two stalls follow each other without a clear between them.
    assert!(stall[0].is_healthy || stall.get(1).is_some_and(|e| e.is_healthy), "baseline first: {stall:#?}");
    assert!(stall.windows(2).all(|w| w[0].is_healthy || w[1].is_healthy), "a clear between stalls: {stall:#?}");
    // The other checks' events keep the daemon's strategy.
    assert!(
        ev.iter().filter(|e| e.check_name != CHECK).all(|e| e.processing_strategy == EXECUTE_REMEDIATION),
        "{ev:#?}"
    );
    assert!(log.contains("NIC poll stall detection enabled"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    drop(blocking);
}

/// Upstream's shape: each stalled loop, sorted, in Go's rounded seconds (nicmon's one poll
/// reads both the counters and the state).
fn assert_stall_message(message: &str) {
    let (counter, state) = message
        .strip_prefix("NIC state cannot be observed: counter poll in flight for ")
        .and_then(|rest| rest.split_once(", state poll in flight for "))
        .unwrap_or_else(|| panic!("not upstream's shape: {message:?}"));
    for d in [counter, state] {
        let secs = d.strip_suffix('s').and_then(|n| n.parse::<u64>().ok());
        assert!(secs.is_some(), "{d:?} in {message:?}");
    }
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

/// A stall whose publish fails stays owed: the stuck poll ends and another poll completes
/// after it while the connector still refuses; once it accepts, the stall is published, then
/// the recovery, in that order.
#[test]
fn a_stall_whose_first_publish_fails_is_reported_after_the_stall_ended_then_the_recovery() {
    let Some(blocking) = BlockingFile::new("stall-refused") else { return };
    let node = Platform::H100Oci.build();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let port_arg = port.to_string();
    let d = start_with(
        &node,
        &conn,
        &["--poll-stall-deadline=300ms", "--metrics-port", &port_arg, "--metrics-bind-address", "127.0.0.1"],
    );
    let settled = |ev: &[HealthEvent]| {
        stall_events(ev).iter().any(|e| e.is_healthy)
            && ev.iter().filter(|e| e.is_healthy && e.check_name == "InfiniBandStateCheck").count() >= 16
    };
    assert!(conn.wait_until(WAIT, settled), "baselines: {:#?}", conn.events());
    conn.refuse_next(&std::iter::repeat_n(Code::Unavailable, 100_000).collect::<Vec<_>>());
    block(&node, &blocking);
    let stall_refused = |calls: &[Received]| {
        calls
            .iter()
            .any(|c| c.refused.is_some() && c.batch.events.iter().any(|e| e.check_name == CHECK && !e.is_healthy))
    };
    assert!(conn.wait_for_calls(WAIT, stall_refused), "the stall's publish is refused");
    unblock(&node);
    // The stuck poll ends, and one more after it (a poll's end is counted just before the
    // watchdog hears of it; the next poll begins only after).
    let before = polls_completed(port);
    let deadline = std::time::Instant::now() + WAIT;
    while polls_completed(port) < before + 2 {
        assert!(std::time::Instant::now() < deadline, "polls stopped completing");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stall is still being offered after its poll ended: more calls than the publish in
    // progress then could make (one publish is at most 5 calls, the sink's retry policy).
    let ended_at = conn.received().len();
    let offered_after = |calls: &[Received]| stall_refused_count(&calls[ended_at..]) > 10;
    assert!(conn.wait_for_calls(WAIT, offered_after), "the stall stays owed after its poll ended");
    assert!(stall_events(&conn.events()).iter().all(|e| e.is_healthy), "nothing of the stall accepted yet");
    conn.accept_all();
    let recovered = |ev: &[HealthEvent]| {
        let s = stall_events(ev);
        s.iter().position(|e| !e.is_healthy).is_some_and(|i| s[i + 1..].iter().any(|e| e.is_healthy))
    };
    assert!(conn.wait_until(WAIT, recovered), "the stall, then the recovery: {:#?}", conn.events());
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let ev = conn.events();
    let stall = stall_events(&ev);
    // Accepted: the baseline, the stall (once), its recovery.
    assert_eq!(stall.iter().map(|e| e.is_healthy).collect::<Vec<_>>(), [true, false, true], "{stall:#?}");
    assert_stall_message(&stall[1].message);
    assert!(log.contains("poll stall event not sent: retried"), "{log}");
    drop(blocking);
}
