//! `nicmon run` against a testbed node and an in-process platform connector (issue: the
//! daemon). Waits are condition-based (woken by each arrival), bounded by timeouts.
use std::process::{Command, Stdio};
use std::time::Duration;

use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};

const WAIT: Duration = Duration::from_secs(20);
const OUTAGE: Duration = Duration::from_secs(10);

fn start(node: &Node, socket: &str, extra: &[&str]) -> Daemon {
    Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-kmsg", "--no-wake"])
            .args(["--platform-connector-socket", socket, "--connector-retry-base", "100ms"])
            .args(["--state-polling-interval", "200ms"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )
}

fn is_port_event(e: &nicmon_proto::datamodels::HealthEvent, dev: &str, healthy: bool) -> bool {
    e.check_name == "InfiniBandStateCheck"
        && e.is_healthy == healthy
        && e.entities_impacted.iter().any(|x| x.entity_type == "NIC" && x.entity_value == dev)
}

#[test]
fn cable_pull_arrives_as_the_expected_health_event() {
    let node = Platform::H100Oci.build();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let d = start(&node, &conn.target(), &["--no-metrics", "--processing-strategy", "STORE_ONLY"]);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 18), "baselines");
    node.pull_cable("mlx5_3", 1);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_3", false))), "cable pull event");
    let calls = conn.received();
    let batch = calls.iter().find(|c| c.batch.events.iter().any(|e| is_port_event(e, "mlx5_3", false))).unwrap();
    assert_eq!(batch.batch.version, 1);
    assert_eq!(batch.authorization, None);
    let e = batch.batch.events.iter().find(|e| is_port_event(e, "mlx5_3", false)).unwrap();
    assert_eq!(e.version, 1);
    assert_eq!(e.agent, "nic-health-monitor");
    assert_eq!(e.component_class, "NIC");
    assert_eq!(e.check_name, "InfiniBandStateCheck");
    assert!(e.is_fatal);
    assert!(!e.is_healthy);
    assert!(e.message.starts_with("Port mlx5_3 port 1: state DOWN, phys_state Polling"), "{}", e.message);
    assert_eq!(e.recommended_action, 25, "REPLACE_VM");
    assert!(e.error_code.is_empty());
    let ents: Vec<(&str, &str)> =
        e.entities_impacted.iter().map(|x| (x.entity_type.as_str(), x.entity_value.as_str())).collect();
    assert_eq!(ents, [("NIC", "mlx5_3"), ("NICPort", "1")]);
    // The probable cause rides in the metadata (and ends the message); nothing else.
    assert_eq!(e.metadata.len(), 1, "{:?}", e.metadata);
    assert_eq!(e.metadata.get("probableCause").map(String::as_str), Some("unknown"));
    assert!(e.message.ends_with(" - probable cause: unknown"), "{}", e.message);
    let ts = e.generated_timestamp.as_ref().expect("timestamp");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - ts.seconds).abs() < 60, "timestamp is now-ish");
    assert_eq!(e.node_name, "gpu-node-7");
    assert_eq!(e.processing_strategy, 2, "STORE_ONLY");
    assert_eq!(d.stop().0.code(), Some(0));
}

#[test]
fn connector_outage_loses_nothing_and_a_restart_resends() {
    let node = Platform::H100Oci.build();
    let sock = node.root().join("nvsentinel.sock");
    let conn = Connector::start(&sock);
    let d = start(&node, &conn.target(), &["--no-metrics"]);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 18));
    let before = conn.events().len();
    conn.stop(); // the socket file stays: calls fail as with a crashed connector
    let down_at = std::time::Instant::now();

    // Three faults while the connector is down, each its own poll's batch.
    let (pid_state_1, pid_state_2) = ("mlx5_3", "mlx5_5");
    node.set_port(pid_state_1, 1, "1: DOWN", "3: Disabled");
    wait_for_state(&node, pid_state_1);
    node.set_port(pid_state_2, 1, "1: DOWN", "3: Disabled");
    wait_for_state(&node, pid_state_2);
    // nicmon restarts during the outage.
    assert_eq!(d.stop().0.code(), Some(0));
    let outbox = outbox_len(&node);
    assert!(outbox >= 2, "undelivered batches are kept in the state file: {outbox}");
    let d = start(&node, &format!("unix://{}", sock.display()), &["--no-metrics"]);
    node.set_port("mlx5_7", 1, "1: DOWN", "3: Disabled");
    wait_for_state(&node, "mlx5_7");

    // The outage lasts 10 s in all (the scenario, not a synchronisation): the daemon keeps
    // retrying the oldest batch meanwhile.
    std::thread::sleep(OUTAGE.saturating_sub(down_at.elapsed()));
    assert!(outbox_len(&node) >= 3, "three batches waiting after a {OUTAGE:?} outage");

    // The connector comes back: all three arrive, in order, once each.
    let conn = Connector::start(&sock);
    let all_three = |ev: &[nicmon_proto::datamodels::HealthEvent]| {
        ["mlx5_3", "mlx5_5", "mlx5_7"].iter().all(|d| ev.iter().any(|e| is_port_event(e, d, false)))
    };
    assert!(conn.wait_until(WAIT, all_three), "all batches delivered after the outage");
    let order: Vec<String> = conn
        .events()
        .iter()
        .filter(|e| e.check_name == "InfiniBandStateCheck" && !e.is_healthy)
        .map(|e| e.entities_impacted[0].entity_value.clone())
        .collect();
    // Each port event comes with its card's event (the card is below its peers) in the same batch.
    assert_eq!(order, ["mlx5_3", "0000:14:00", "mlx5_5", "0000:1d:00", "mlx5_7", "0000:26:00"], "in order, none twice");
    assert!(before >= 18);
    assert_eq!(d.stop().0.code(), Some(0));
    assert_eq!(outbox_len(&node), 0);
}

/// At-least-once across crashes: the daemon is killed with SIGKILL at random instants
/// after each fault (before or after it detected, sent, saved or had it acknowledged) and
/// restarted; every fault still arrives at the connector (duplicates are allowed).
#[test]
fn kill_9_at_random_instants_loses_nothing() {
    let node = Platform::H100Oci.build();
    let sock = node.root().join("nvsentinel.sock");
    let conn = Connector::start(&sock);
    let mut d = start(&node, &conn.target(), &["--no-metrics"]);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 18), "baselines");
    let mut devices: Vec<String> = conn
        .events()
        .iter()
        .filter(|e| e.check_name == "InfiniBandStateCheck" && e.is_healthy)
        .flat_map(|e| e.entities_impacted.iter().filter(|x| x.entity_type == "NIC").map(|x| x.entity_value.clone()))
        .collect();
    devices.sort();
    devices.dedup();
    assert!(devices.len() >= 7, "{devices:?}");
    // NICMON_KILL_SEED replays the kill instants of a printed seed.
    let seed = std::env::var("NICMON_KILL_SEED").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("kill -9 instants from seed {seed}");
    let mut rng = seed;
    let mut next_ms = move || {
        // xorshift64: reproducible from the printed seed.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % 600
    };
    let faults = &devices[..6];
    for dev in faults {
        node.set_port(dev, 1, "1: DOWN", "3: Disabled");
        // The random instant (the scenario, not a synchronisation): 0-600 ms spans several
        // 200 ms polls, so some kills land before detection, some during a commit, some after.
        std::thread::sleep(Duration::from_millis(next_ms()));
        d.kill9();
        d = start(&node, &conn.target(), &["--no-metrics"]);
    }
    let all = |ev: &[nicmon_proto::datamodels::HealthEvent]| {
        faults.iter().all(|f| ev.iter().any(|e| is_port_event(e, f, false)))
    };
    // Six restarts on a loaded machine: a longer bound than one wait.
    assert!(
        conn.wait_until(WAIT * 3, all),
        "every fault delivered despite the kills (seed {seed}): {:?}",
        conn.events()
            .iter()
            .filter(|e| !e.is_healthy)
            .map(|e| format!(
                "{}:{:?}",
                e.check_name,
                e.entities_impacted.iter().map(|x| &x.entity_value).collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
    );
    // The last daemon is polling before it is asked to stop: a fault on a device none of the
    // killed daemons saw arrives (only the running daemon can report it).
    let probe = devices.get(6).expect("a seventh device for the final probe").clone();
    node.set_port(&probe, 1, "1: DOWN", "3: Disabled");
    assert!(
        conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, &probe, false))),
        "the restarted daemon reports {probe}"
    );
    assert_eq!(d.stop().0.code(), Some(0));
}

/// SPEC §1.6: the state file is written only on change. A steady node polled every 100 ms
/// for 5 s (50 polls) gets no write at all once its baselines are acknowledged (volatile
/// parts are refreshed once a minute); a fault is written at once.
#[test]
fn a_steady_daemon_does_not_rewrite_its_state_file() {
    use std::os::unix::fs::MetadataExt;
    let node = Platform::H100Oci.build();
    let events = node.root().join("events.jsonl");
    let log = std::fs::File::create(node.root().join("nicmon.log")).unwrap();
    let mut child = node
        .run_command(&nicmon_bin(), "state.json", "gpu-node-7")
        .args(["--no-kmsg", "--no-wake", "--no-metrics", "--state-polling-interval", "100ms"])
        .arg("--sink")
        .arg(format!("file:{}", events.display()))
        .env("RUST_LOG", "warn,nicmon::act::state=debug")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn nicmon run");
    let writes = || {
        std::fs::read_to_string(node.root().join("nicmon.log"))
            .unwrap_or_default()
            .matches("state file written")
            .count()
    };
    // Settled: baselines delivered and acknowledged (the outbox is empty on disk), then the
    // first polls' deferred decisions made (ports "maybe uncabled" are decided by poll 3):
    // no write for 1 s (10 polls).
    let deadline = std::time::Instant::now() + WAIT;
    while !(std::fs::read_to_string(&events).map(|t| t.lines().count() >= 18).unwrap_or(false)
        && state(&node)["polls"].as_u64().is_some()
        && outbox_len(&node) == 0)
    {
        assert!(std::time::Instant::now() < deadline, "baselines not delivered and acknowledged in time");
        std::thread::sleep(Duration::from_millis(20)); // polling files another process writes
    }
    let mut quiet = (writes(), std::time::Instant::now());
    while quiet.1.elapsed() < Duration::from_secs(1) {
        assert!(std::time::Instant::now() < deadline + WAIT, "the state file never stopped changing");
        std::thread::sleep(Duration::from_millis(20)); // polling a log another process writes
        if writes() != quiet.0 {
            quiet = (writes(), std::time::Instant::now());
        }
    }
    let (w0, ino0) = (writes(), std::fs::metadata(node.root().join("state.json")).unwrap().ino());
    let before = state(&node);
    std::thread::sleep(Duration::from_secs(5)); // the measured steady window (about 50 polls)
    let (w1, ino1) = (writes(), std::fs::metadata(node.root().join("state.json")).unwrap().ino());
    assert!(w0 >= 1, "the log counts writes");
    assert_eq!(w1 - w0, 0, "no write in a steady 5 s window at 100 ms polls:\nbefore {before}\nafter {}", state(&node));
    assert_eq!(ino0, ino1, "the file was not replaced");
    // A fault is a change: written at once.
    node.set_port("mlx5_3", 1, "1: DOWN", "3: Disabled");
    wait_for_state(&node, "mlx5_3");
    // The write's log line follows the rename that made the new file visible.
    let logged = std::time::Instant::now() + WAIT;
    while writes() == w1 {
        assert!(std::time::Instant::now() < logged, "the write of the fault was not logged");
        std::thread::sleep(Duration::from_millis(20)); // polling a log another process writes
    }
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

fn state(node: &Node) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(node.root().join("state.json")).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

fn outbox_len(node: &Node) -> usize {
    state(node)["outbox"].as_array().map(|a| a.len()).unwrap_or(0)
}

/// Until the daemon has evaluated `dev` as reported fatal (its state file says so).
fn wait_for_state(node: &Node, dev: &str) {
    let key = format!("{dev}_1");
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        if state(node)["port_states"][&key]["reported"] == "fatal" {
            return;
        }
        std::thread::sleep(Duration::from_millis(20)); // polling a file another process writes
    }
    panic!("{dev} was not evaluated as fatal in time");
}

#[test]
fn bearer_token_is_sent_and_a_changed_file_is_picked_up() {
    let node = Platform::L40sOci.build();
    let conn = Connector::start(&node.root().join("c.sock"));
    let token = node.root().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let d = start(&node, &conn.target(), &["--no-metrics", "--platform-connector-token-path", token.to_str().unwrap()]);
    assert!(conn.wait_until(WAIT, |ev| ev.len() >= 6));
    assert!(conn.received().iter().all(|c| c.authorization.as_deref() == Some("Bearer first-token")));
    std::fs::write(&token, "  rotated-token \n").unwrap();
    node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(|e| !e.is_healthy)));
    let last = conn.received().into_iter().last().unwrap();
    assert_eq!(last.authorization.as_deref(), Some("Bearer rotated-token"));
    d.stop();
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, buf)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn metrics_and_healthz_survive_a_fifo_in_sysfs() {
    let node = Platform::DgxH100.build();
    let conn = Connector::start(&node.root().join("c.sock"));
    let port = free_port();
    let d = start(&node, &conn.target(), &["--metrics-port", &port.to_string()]);
    assert!(conn.wait_until(WAIT, |ev| ev.len() >= 12));
    // A fault of each kind, so every labelled series exists.
    node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
    node.set_counter("mlx5_4", 1, "counters/link_downed", 1);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| !e.is_healthy).count() >= 2));
    // The metrics are updated after the events are handed to the sender: wait (bounded) for
    // a sample of each family, not only its HELP and TYPE (declared before its first series).
    let names = [
        "nic_health_monitor_devices_discovered",
        "nic_health_monitor_health_events_sent_total",
        "nic_health_monitor_poll_cycle_duration_seconds",
        "nic_health_monitor_state_check_errors_total",
        "nic_health_monitor_counter_threshold_breaches_total",
        "nicmon_devices",
        "nicmon_port_healthy",
        "nicmon_poll_duration_seconds",
        "nicmon_topology_source",
        "nicmon_ebpf_embedded",
    ];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (code, body) = http_get(port, "/metrics");
        assert_eq!(code, 200);
        let missing: Vec<&str> = names.iter().copied().filter(|n| !body.lines().any(|l| l.starts_with(n))).collect();
        if missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "/metrics has no series of {missing:?}");
        std::thread::sleep(Duration::from_millis(50)); // probing an HTTP endpoint
    }
    assert_eq!(http_get(port, "/healthz").0, 200);

    // A sysfs file becomes a FIFO with no writer: it is not opened (not a regular file), so
    // the loop keeps completing cycles and /healthz stays 200 over many poll intervals.
    let state = node.sys().join(&node.info["mlx5_2"].ib_dir).join("ports/1/state");
    std::fs::remove_file(&state).unwrap();
    let c = std::ffi::CString::new(state.to_str().unwrap()).unwrap();
    assert_eq!(unsafe_mkfifo(&c), 0);
    let polls = |body: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix("nicmon_poll_duration_seconds_count "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = polls(&http_get(port, "/metrics").1);
    let deadline = std::time::Instant::now() + WAIT;
    while polls(&http_get(port, "/metrics").1) < before + 10 {
        assert!(std::time::Instant::now() < deadline, "the poll loop stopped completing cycles");
        assert_eq!(http_get(port, "/healthz").0, 200, "/healthz failed while a sysfs file is a FIFO");
        std::thread::sleep(Duration::from_millis(50)); // probing an HTTP endpoint
    }
    drop(d);
}

fn unsafe_mkfifo(path: &std::ffi::CStr) -> i32 {
    // mkfifo(3) through the `mkfifo` command keeps this test crate free of unsafe code.
    let status = Command::new("mkfifo").arg(path.to_str().unwrap()).status().unwrap();
    if status.success() { 0 } else { -1 }
}

/// A metrics port another process holds is not a crash loop (as upstream): the bind failure
/// is logged and the monitor runs and delivers without metrics.
#[test]
fn a_taken_metrics_port_is_logged_and_the_monitor_runs_without_metrics() {
    let node = Platform::H100Oci.build();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut d = Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-kmsg", "--no-wake", "--platform-connector-socket", &conn.target()])
            .args(["--state-polling-interval", "200ms", "--connector-retry-base", "100ms"])
            .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &port])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 18), "baselines");
    node.pull_cable("mlx5_3", 1);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_3", false))), "cable pull event");
    assert!(d.try_wait().is_none(), "still running");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let line = log.lines().find(|l| l.contains("metrics endpoint: cannot listen")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("WARN") && line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(line.contains("running without /metrics and /healthz"), "{line}");
    drop(taken);
}

/// `nicmon run --ethtool-replay DIR` on a RoCE node: the RoCE ports' physical-layer series
/// (FEC mode, uncorrectable blocks; ECN/CNP from sysfs `hw_counters/`) are scraped from
/// `/metrics` with the values the replayed ethtool data and sysfs give.
#[test]
fn run_with_ethtool_replay_exports_the_roce_physical_layer() {
    let node = Platform::L40sOci.build();
    let dir = node.root().join("ethtool");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..6 {
        let uncorrectable = 7 + i;
        let text = format!(
            r#"{{"fec": {{"active": "RS", "corrected_bits": 1000, "uncorrectable_blocks": {uncorrectable}}}}}"#
        );
        std::fs::write(dir.join(format!("rdma{i}.json")), text).unwrap();
    }
    node.set_counter("mlx5_1", 1, "hw_counters/np_cnp_sent", 42);
    let conn = Connector::start(&node.root().join("c.sock"));
    let port = free_port();
    let replay = dir.to_str().unwrap();
    let d = start(&node, &conn.target(), &["--metrics-port", &port.to_string(), "--ethtool-replay", replay]);
    // The first poll's events: the daemon is up and serving.
    assert!(conn.wait_until(WAIT, |ev| !ev.is_empty()));
    let want = [
        r#"nicmon_port_fec_mode{device="mlx5_1",port="1",mode="RS"} 1"#,
        r#"nicmon_port_fec_uncorrectable_blocks{device="mlx5_1",port="1"} 8.0"#,
        r#"nicmon_port_fec_uncorrectable_blocks{device="mlx5_3",port="1"} 10.0"#,
        r#"nicmon_port_congestion{device="mlx5_1",port="1",counter="np_cnp_sent"} 42.0"#,
    ];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (code, body) = http_get(port, "/metrics");
        let missing: Vec<&str> = want.iter().copied().filter(|w| !body.lines().any(|l| l == *w)).collect();
        if code == 200 && missing.is_empty() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "/metrics lacks {missing:#?}:\n{body}");
        std::thread::sleep(Duration::from_millis(100)); // probing an HTTP endpoint
    }
    drop(d);
}

/// Events in the state file's outbox (a missing or half-written file: none).
fn outbox_events(node: &Node) -> usize {
    let outbox = state(node)["outbox"].as_array().cloned().unwrap_or_default();
    outbox.iter().map(|b| b["events"].as_array().map(|e| e.len()).unwrap_or(0)).sum()
}

/// A poll that queues thousands of events (a reboot's counter baselines on a device with 300
/// ports) delivers them before its save: the state file never holds them, every one of them
/// reaches the sink once, and the outbox ends empty.
#[test]
fn a_large_commit_is_delivered_before_it_is_saved() {
    let node = Platform::DgxH100.build();
    let first = node.pfs().into_iter().next().expect("a PF");
    nicmon_tests::platforms::copy_ports(&node, &first, 300).unwrap();
    let events = node.root().join("events.jsonl");
    // Killed when dropped (a failed assertion leaves no daemon behind).
    let d = Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-kmsg", "--no-wake", "--no-metrics", "--state-polling-interval", "200ms"])
            .arg("--sink")
            .arg(format!("file:{}", events.display()))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    let baselines = |text: &str| text.lines().filter(|l| l.contains("healthy after reboot")).count();
    // Watch the state file as the daemon writes it, until the baselines were delivered and
    // acknowledged (the outbox empty on disk).
    let (mut most, deadline) = (0, std::time::Instant::now() + WAIT);
    loop {
        most = most.max(outbox_events(&node));
        let delivered = baselines(&std::fs::read_to_string(&events).unwrap_or_default());
        if delivered >= 300 * 10 && state(&node)["polls"].as_u64().is_some_and(|p| p >= 3) && outbox_len(&node) == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "baselines not delivered in time ({delivered})");
        std::thread::sleep(Duration::from_millis(5)); // sampling a file another process writes
    }
    assert!(most < 1000, "the state file held {most} queued events");
    assert_eq!(d.stop().0.code(), Some(0));
    let text = std::fs::read_to_string(&events).unwrap();
    let mut lines: Vec<&str> = text.lines().filter(|l| l.contains("healthy after reboot")).collect();
    let n = lines.len();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), n, "each baseline once");
    assert_eq!(outbox_len(&node), 0);
}
