//! The adversarial suite (issue #14): nicmon attacked as a hostile or broken host would. Every
//! file kind nicmon reads is replaced by each malformation in turn — as one poll, as a
//! timeline, and while the same port really goes DOWN — and the files outside sysfs (state,
//! config, metadata, kernel log) and the sinks get the same treatment.
//!
//! The pass rule: no panic, no hang (every run is bounded in time), and no false fatal event
//! for a healthy port. Waits are bounded polls of a child process or an HTTP endpoint.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nicmon_tests::blocking::BlockingFile;
use nicmon_tests::{NicSpec, Node, Timeline, brief, nicmon_bin};

/// The longest one `nicmon check` may take whatever the input (its reads are abandoned at
/// 1 s each, 2 s per poll; start-up reads 2 s each).
const CHECK_LIMIT: Duration = Duration::from_secs(15);
/// SIGTERM to exit, whatever is stuck.
const EXIT_LIMIT: Duration = Duration::from_secs(5);

/// Two dual-PF IB cards beside a GPU: card homogeneity applies to every port.
fn node() -> Node {
    let mut n = Node::new("adversarial");
    let rc = n.root_complex(0, 0);
    let rp = n.root_port(&rc, 1);
    let sw = n.switch(&rp);
    let (a, b, c) = (n.switch_port(&sw, 0), n.switch_port(&sw, 1), n.switch_port(&sw, 2));
    n.gpu(&a, 0);
    n.card(&b, 0, vec![NicSpec::ib("mlx5_0"), NicSpec::ib("mlx5_1")]);
    n.card(&c, 0, vec![NicSpec::ib("mlx5_2"), NicSpec::ib("mlx5_3")]);
    n.write_metadata();
    n
}

/// The files nicmon reads on a host, as (name, path below the node's root). The attacked
/// device is mlx5_1.
fn targets(n: &Node) -> Vec<(&'static str, PathBuf)> {
    let ib = PathBuf::from("sys").join(&n.info["mlx5_1"].ib_dir);
    let pci = PathBuf::from("sys").join(&n.info["mlx5_1"].pci_dir);
    let port = ib.join("ports/1");
    vec![
        ("state", port.join("state")),
        ("phys_state", port.join("phys_state")),
        ("link_layer", port.join("link_layer")),
        ("rate", port.join("rate")),
        ("lid", port.join("lid")),
        ("sm_lid", port.join("sm_lid")),
        ("symbol_error", port.join("counters/symbol_error")),
        ("link_downed", port.join("counters/link_downed")),
        ("hca_type", ib.join("hca_type")),
        ("fw_ver", ib.join("fw_ver")),
        ("board_id", ib.join("board_id")),
        ("numa_node", pci.join("numa_node")),
        ("vendor", pci.join("vendor")),
        ("config", pci.join("config")),
        ("uevent", pci.join("uevent")),
        ("net/route", PathBuf::from("proc/net/route")),
        ("boot_id", PathBuf::from("proc/sys/kernel/random/boot_id")),
    ]
}

/// Kinds whose malformation is handled on the decide side: "unknown is not a value" for
/// state, phys_state and link_layer is decided in the link-state check (no decision, the card
/// left out of its group's comparison, the last known link layer), not by the reader.
const DECIDE_SIDE: [&str; 3] = ["state", "phys_state", "link_layer"];

#[derive(Debug, Clone, Copy)]
enum Bad {
    Empty,
    Whitespace,
    Binary,
    Huge,
    MinusOne,
    NoPma,
    Overflow,
    Nul,
    Unicode,
    Truncated,
    Fifo,
    Dangling,
    Directory,
    DevZero,
}

const ALL: [Bad; 14] = [
    Bad::Empty,
    Bad::Whitespace,
    Bad::Binary,
    Bad::Huge,
    Bad::MinusOne,
    Bad::NoPma,
    Bad::Overflow,
    Bad::Nul,
    Bad::Unicode,
    Bad::Truncated,
    Bad::Fifo,
    Bad::Dangling,
    Bad::Directory,
    Bad::DevZero,
];

fn mkfifo(p: &Path) {
    // mkfifo(1) keeps this test crate free of unsafe code.
    let ok = Command::new("mkfifo").arg(p).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "mkfifo {}", p.display());
}

/// Replace `path` by the malformation.
fn apply(path: &Path, bad: Bad) {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        let _ = std::fs::remove_file(path);
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let write = |bytes: &[u8]| std::fs::write(path, bytes).unwrap();
    match bad {
        Bad::Empty => write(b""),
        Bad::Whitespace => write(b"  \n\t\n"),
        Bad::Binary => write(&[0xff, 0xfe, 0x00, 0x80, 0x1b, b'[', b'2', b'J', 0x0a]),
        Bad::Huge => write(&vec![b'9'; 1 << 20]),
        Bad::MinusOne => write(b"-1\n"),
        Bad::NoPma => write(b"N/A (no PMA)\n"),
        Bad::Overflow => write(b"184467440737095516160000\n"),
        Bad::Nul => write(b"4\0: ACTIVE\n"),
        Bad::Unicode => write("４: ＡＣＴＩＶＥ\n".as_bytes()),
        Bad::Truncated => write(b"4:"),
        Bad::Fifo => mkfifo(path),
        Bad::Dangling => std::os::unix::fs::symlink("/nonexistent/nicmon-adversarial", path).unwrap(),
        Bad::Directory => std::fs::create_dir(path).unwrap(),
        Bad::DevZero => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
    }
}

/// Wait for `child` at most `limit`; kill it and fail if it takes longer.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> (ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, reader.join().unwrap(), started.elapsed());
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?} (a hang)");
        }
        // Polling a child process for its exit, bounded by `limit`.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `nicmon check --format json` on `node`, bounded in time; panics on a hang or a panic.
/// `nicmon check --format json` on `node`, with `extra` flags.
fn check_command(node: &Node, extra: &[&str]) -> Command {
    let mut cmd = Command::new(nicmon_bin());
    cmd.arg("check")
        .arg("--sysfs")
        .arg(node.sys())
        .arg("--procfs")
        .arg(node.proc())
        .arg("--metadata")
        .arg(node.metadata_path())
        .args(["--format", "json", "--config", "/nonexistent/nicmon.toml", "--node-name", "node-a"])
        .args(extra)
        .env("RUST_LOG", "warn");
    cmd
}

fn check(node: &Node, extra: &[&str], what: &str) -> (ExitStatus, serde_json::Value, String) {
    let mut cmd = check_command(node, extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let (status, stderr, _) = wait_bounded(child, CHECK_LIMIT, what);
    assert!(!stderr.contains("panicked"), "{what}: panic: {stderr}");
    let stdout = out.join().unwrap();
    let json = serde_json::from_slice(&stdout).unwrap_or(serde_json::Value::Null);
    (status, json, stderr)
}

fn fatal_events(report: &serde_json::Value) -> Vec<String> {
    report["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["isFatal"] == true)
        .map(|e| format!("{:?} {}", brief(e), e["message"]))
        .collect()
}

/// One poll per (file kind, malformation), after a healthy baseline: no panic, no hang, and
/// (outside the decide-side kinds) no fatal event.
fn one_poll_each(kinds: &[&str]) {
    let mut false_fatal = Vec::new();
    let node = node();
    let tl = Timeline::new(&node);
    let state = tl.state_file.to_str().unwrap().to_string();
    let (status, first, _) = check(&node, &["--state-file", &state, "--now", &tl.at(0)], "baseline");
    assert!(status.success() && fatal_events(&first).is_empty(), "baseline {first:#}");
    let baseline = std::fs::read(&state).unwrap();
    let stash = node.root().join("stash-original");
    for (kind, rel) in targets(&node).into_iter().filter(|(k, _)| kinds.contains(k)) {
        let path = node.root().join(&rel);
        std::fs::rename(&path, &stash).unwrap();
        for bad in ALL {
            // Each case is the poll after the same healthy baseline.
            std::fs::write(&state, &baseline).unwrap();
            let what = format!("{kind} as {bad:?}");
            apply(&path, bad);
            let (status, report, stderr) = check(&node, &["--state-file", &state, "--now", &tl.at(1)], &what);
            assert!(status.success(), "{what}: exit {status}: {stderr}");
            let fatal = fatal_events(&report);
            if !fatal.is_empty() {
                false_fatal.push(format!("{what}: {fatal:?}"));
            }
        }
        apply(&path, Bad::Empty);
        std::fs::rename(&stash, &path).unwrap();
    }
    assert!(false_fatal.is_empty(), "false fatal events for a healthy port:\n{}", false_fatal.join("\n"));
}

#[test]
fn malformed_host_files_one_poll_each() {
    let kinds: Vec<&str> = targets(&node()).iter().map(|(k, _)| *k).filter(|k| !DECIDE_SIDE.contains(k)).collect();
    one_poll_each(&kinds);
}

#[test]
fn malformed_port_state_files_give_no_false_fatal() {
    one_poll_each(&DECIDE_SIDE);
}

#[test]
fn malformed_port_state_files_never_hang_or_panic() {
    // The part of the pass rule the reader guarantees today for the decide-side kinds.
    for (kind, rel) in targets(&node()).into_iter().filter(|(k, _)| DECIDE_SIDE.contains(k)) {
        for bad in ALL {
            let node = node();
            apply(&node.root().join(&rel), bad);
            let what = format!("{kind} as {bad:?}");
            let (status, _, stderr) = check(&node, &[], &what);
            assert!(status.success(), "{what}: {stderr}");
        }
    }
}

#[test]
fn a_40s_timeline_of_malformed_files_escalates_nothing() {
    for bad in [Bad::Fifo, Bad::DevZero, Bad::NoPma, Bad::Binary, Bad::Directory] {
        for (kind, rel) in
            targets(&node()).into_iter().filter(|(k, _)| ["rate", "symbol_error", "hca_type"].contains(k))
        {
            let node = node();
            let tl = Timeline::new(&node);
            let state = tl.state_file.to_str().unwrap().to_string();
            let what = format!("{kind} as {bad:?} for 40 s");
            check(&node, &["--state-file", &state, "--now", &tl.at(0)], &what);
            apply(&node.root().join(&rel), bad);
            for t in [1, 10, 20, 31, 40] {
                let (status, report, _) = check(&node, &["--state-file", &state, "--now", &tl.at(t)], &what);
                assert!(status.success());
                assert!(fatal_events(&report).is_empty(), "{what} at t={t}: {report:#}");
            }
        }
    }
}

#[test]
fn a_real_cable_pull_is_reported_beside_a_malformed_file() {
    for (kind, rel) in
        targets(&node()).into_iter().filter(|(k, _)| ["rate", "symbol_error", "lid", "fw_ver"].contains(k))
    {
        for bad in [Bad::Fifo, Bad::DevZero, Bad::Empty, Bad::Huge] {
            let node = node();
            let tl = Timeline::new(&node);
            let state = tl.state_file.to_str().unwrap().to_string();
            let what = format!("cable pull with {kind} as {bad:?}");
            check(&node, &["--state-file", &state, "--now", &tl.at(0)], &what);
            apply(&node.root().join(&rel), bad);
            node.pull_cable("mlx5_1", 1);
            let (_, report, _) = check(&node, &["--state-file", &state, "--now", &tl.at(1)], &what);
            let down: Vec<_> = report["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(brief)
                .filter(|b| !b.1 && b.3 == "NIC=mlx5_1 NICPort=1")
                .collect();
            assert_eq!(down.len(), 1, "{what}: the readable DOWN is reported: {report:#}");
        }
    }
}

#[test]
fn odd_structures_never_hang_or_panic() {
    type Break = Box<dyn Fn(&Node)>;
    let cases: Vec<(&str, Break)> = vec![
        (
            "ports is a FIFO",
            Box::new(|n: &Node| apply(&n.sys().join(&n.info["mlx5_1"].ib_dir).join("ports"), Bad::Fifo)),
        ),
        (
            "class/infiniband entry dangling",
            Box::new(|n: &Node| apply(&n.sys().join("class/infiniband/mlx5_1"), Bad::Dangling)),
        ),
        ("class/infiniband is a file", Box::new(|n: &Node| apply(&n.sys().join("class/infiniband"), Bad::Empty))),
        (
            "device link is /dev/zero",
            Box::new(|n: &Node| apply(&n.sys().join(&n.info["mlx5_1"].ib_dir).join("device"), Bad::DevZero)),
        ),
        (
            "port 1 is a file",
            Box::new(|n: &Node| apply(&n.sys().join(&n.info["mlx5_1"].ib_dir).join("ports/1"), Bad::Binary)),
        ),
        (
            "counters is a FIFO",
            Box::new(|n: &Node| apply(&n.sys().join(&n.info["mlx5_1"].ib_dir).join("ports/1/counters"), Bad::Fifo)),
        ),
        ("procfs missing", Box::new(|n: &Node| std::fs::remove_dir_all(n.proc()).unwrap())),
    ];
    for (what, break_it) in cases {
        let node = node();
        break_it(&node);
        let (status, _, stderr) = check(&node, &[], what);
        assert!(status.success(), "{what}: {stderr}");
    }
}

#[test]
fn broken_state_config_metadata_and_kmsg_files_never_hang() {
    for bad in [Bad::Fifo, Bad::DevZero, Bad::Directory, Bad::Huge, Bad::Binary, Bad::Dangling, Bad::Empty] {
        // State file: unusable → a fresh start (exit 0), then a normal save.
        let node = node();
        let state = node.root().join("state.json");
        apply(&state, bad);
        let what = format!("state file as {bad:?}");
        let (status, report, stderr) = check(&node, &["--state-file", state.to_str().unwrap()], &what);
        if matches!(bad, Bad::Directory) {
            assert!(!status.success(), "{what}: a directory cannot be replaced by the state file");
        } else {
            assert!(status.success(), "{what}: {stderr}");
            assert!(fatal_events(&report).is_empty(), "{what}: {report:#}");
        }

        // Config: unusable → exit 2 with a message naming the file (a dangling link is a
        // missing file: defaults).
        let cfg = node.root().join("config.toml");
        apply(&cfg, bad);
        let what = format!("config as {bad:?}");
        let out =
            // `--node-name`: `--check-config` also checks that the gRPC sink has a node name.
            bounded_output(Command::new(nicmon_bin()).args(["run", "--check-config", "--node-name", "n", "--config"]).arg(&cfg), &what);
        match bad {
            Bad::Dangling | Bad::Empty => assert!(out.status.success(), "{what}"),
            _ => {
                assert_eq!(out.status.code(), Some(2), "{what}");
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(err.contains(cfg.to_str().unwrap()) && err.lines().count() == 1, "{what}: {err}");
            }
        }

        // Metadata: unusable → the sysfs fallback, with a warning naming the file.
        let node = self::node();
        apply(&node.metadata_path(), bad);
        let what = format!("metadata as {bad:?}");
        let (status, report, _) = check(&node, &[], &what);
        assert!(status.success(), "{what}");
        assert_ne!(report["topology_source"], "metadata", "{what}");

        // `check --kmsg FILE`: unusable → exit 2 naming the file, never a hang.
        let kmsg = node.root().join("kmsg.txt");
        apply(&kmsg, bad);
        let what = format!("--kmsg as {bad:?}");
        let (status, _, stderr) = check(&node, &["--kmsg", kmsg.to_str().unwrap()], &what);
        match bad {
            Bad::Empty | Bad::Binary | Bad::Huge => assert!(status.success(), "{what}: {stderr}"),
            _ => assert_eq!(status.code(), Some(2), "{what}: {stderr}"),
        }
    }
}

fn bounded_output(cmd: &mut Command, what: &str) -> Output {
    // The gRPC sink (the default) requires a node name: given, so the case under test decides.
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("RUST_LOG", "warn")
        .env("NODE_NAME", "adversarial")
        .spawn()
        .unwrap();
    let (status, stderr, _) = wait_bounded(child, CHECK_LIMIT, what);
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    Output { status, stdout: Vec::new(), stderr: stderr.into_bytes() }
}

#[test]
fn check_saves_no_state_for_a_cycle_whose_output_failed() {
    let mut node = node();
    let state = node.root().join("state.json");
    let (status, _, _) = check(&node, &["--state-file", state.to_str().unwrap()], "baseline");
    assert!(status.success());
    let saved = std::fs::read(&state).unwrap();
    // After a reboot the first cycle has events to report (the clear-all); stdout is a full
    // device, so writing them fails.
    node.set_boot_id("11111111-0000-4000-8000-000000000002");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let child = check_command(&node, &["--state-file", state.to_str().unwrap()])
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr, _) = wait_bounded(child, CHECK_LIMIT, "stdout full");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("writing the report to stdout"), "{stderr}");
    assert_eq!(std::fs::read(&state).unwrap(), saved, "state saved for a cycle whose events were not output");
    // Written, the same cycle is saved.
    let (status, report, stderr) = check(&node, &["--state-file", state.to_str().unwrap()], "after");
    assert!(status.success(), "{stderr}");
    assert!(!report["events"].as_array().unwrap().is_empty(), "the cycle's events are reported again");
    assert_ne!(std::fs::read(&state).unwrap(), saved);
}

/// `--now` accepts only times the report can print: refused at parse (exit 2, naming the
/// flag, before any poll) — at year 0's first second the clear backdated 1 s would fall in
/// year -1 — while the edges inside RFC 3339's range run (times print at their own offset).
#[test]
fn check_refuses_a_now_the_report_cannot_print() {
    let node = node();
    let state = node.root().join("state.json");
    for bad in ["0000-01-01T00:00:00Z", "0000-01-01T00:00:00.5Z", "2026-13-01T00:00:00Z", "yesterday", ""] {
        let (status, _, stderr) = check(&node, &["--state-file", state.to_str().unwrap(), "--now", bad], bad);
        assert_eq!(status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--now"), "{bad}: {stderr}");
        assert!(!state.exists(), "{bad}: a poll ran");
    }
    for good in
        ["0000-01-01T00:00:01Z", "0000-01-01T00:30:00+01:00", "9999-12-31T23:59:59Z", "2026-01-01T00:00:00+05:30"]
    {
        let (status, report, stderr) = check(&node, &["--now", good], good);
        assert!(status.success(), "{good}: {stderr}");
        assert!(!report["events"].as_array().unwrap().is_empty(), "{good}: {report}");
    }
}

#[test]
fn duration_flags_are_validated_at_parse() {
    for v in ["0s", "1ns", "99999999999999999s", "banana", "-1s"] {
        let out = bounded_output(
            Command::new(nicmon_bin())
                .args(["run", "--check-config", "--config", "/nonexistent/x.toml"])
                .arg(format!("--state-polling-interval={v}")),
            v,
        );
        assert_eq!(out.status.code(), Some(2), "--state-polling-interval {v}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--state-polling-interval"));
    }
}

// ---- the daemon ----

struct Daemon {
    child: Option<Child>,
}

impl Daemon {
    fn start(node: &Node, extra: &[&str]) -> Daemon {
        let child = node
            .run_command(&nicmon_bin(), "state.json", "node-a")
            .args(["--no-kmsg", "--no-wake", "--state-polling-interval", "200ms"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nicmon run");
        Daemon { child: Some(child) }
    }

    /// SIGTERM; the exit status, its log and how long the exit took.
    fn terminate(mut self) -> (ExitStatus, String, Duration) {
        let child = self.child.take().unwrap();
        let ok = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap().success();
        assert!(ok);
        wait_bounded(child, EXIT_LIMIT, "exit after SIGTERM")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, buf)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Probe `path` until `pred` holds (bounded).
fn wait_http(port: u16, path: &str, limit: Duration, pred: impl Fn(u16, &str) -> bool) -> Option<String> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let (code, body) = http_get(port, path);
        if pred(code, &body) {
            return Some(body);
        }
        // Probing an HTTP endpoint, bounded by `limit`.
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn a_stuck_read_never_stops_the_daemon_and_sigterm_exits_in_time() {
    let Some(blocking) = BlockingFile::new("adversarial") else { return };
    let node = node();
    let port = free_port();
    let sink = node.root().join("events.jsonl");
    let d = Daemon::start(&node, &["--metrics-port", &port.to_string(), "--sink", &format!("file:{}", sink.display())]);
    assert!(wait_http(port, "/healthz", Duration::from_secs(20), |c, _| c == 200).is_some(), "daemon up");
    // A counter read now blocks, and a FIFO replaces the rate.
    let ctr = node.sys().join(&node.info["mlx5_2"].ib_dir).join("ports/1/counters/link_downed");
    std::fs::remove_file(&ctr).unwrap();
    std::os::unix::fs::symlink(blocking.pipe(), &ctr).unwrap();
    apply(&node.sys().join(&node.info["mlx5_3"].ib_dir).join("ports/1/rate"), Bad::Fifo);
    let body = wait_http(port, "/healthz", Duration::from_secs(20), |c, b| c == 200 && b.contains("stuck read:"))
        .expect("/healthz names the stuck read");
    assert!(body.contains("link_downed"), "{body}");
    let metrics = wait_http(port, "/metrics", Duration::from_secs(10), |c, b| {
        c == 200 && b.contains("nicmon_reads_stuck 1") && b.contains("nicmon_reads_abandoned_total 1")
    });
    assert!(metrics.is_some(), "stuck and abandoned reads are exported");
    // The loop keeps completing cycles: /healthz stays 200 over many intervals, and a real
    // fault on another port is still reported.
    node.pull_cable("mlx5_0", 1);
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(&sink).unwrap_or_default();
        if text.lines().any(|l| l.contains("\"isHealthy\":false") && l.contains("mlx5_0")) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the cable pull was not reported: {text}");
        assert_eq!(http_get(port, "/healthz").0, 200);
        // Waiting for the sink file to grow, bounded above.
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, log, took) = d.terminate();
    assert!(status.success(), "{log}");
    assert!(took < EXIT_LIMIT, "exit took {took:?}");
    assert!(log.contains("read did not return in time"), "the stuck read is logged: {log}");
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_fifo_sink_without_reader_never_blocks_shutdown() {
    let node = node();
    let sink = node.root().join("sink.fifo");
    mkfifo(&sink);
    let port = free_port();
    let d = Daemon::start(&node, &["--metrics-port", &port.to_string(), "--sink", &format!("file:{}", sink.display())]);
    assert!(
        wait_http(port, "/metrics", Duration::from_secs(20), |_, b| b.contains("nicmon_events_failed_total{"))
            .is_some(),
        "the failed send is counted"
    );
    let (status, log, took) = d.terminate();
    assert!(status.success(), "{log}");
    assert!(took < EXIT_LIMIT, "exit took {took:?}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.root().join("state.json")).unwrap()).unwrap();
    assert!(!state["outbox"].as_array().unwrap().is_empty(), "undelivered batches stay in the outbox");
}

#[test]
fn a_huge_poll_interval_does_not_break_healthz() {
    let node = node();
    let port = free_port();
    // The largest accepted interval: /healthz answers (no overflow) and SIGTERM still exits.
    let child = node
        .run_command(&nicmon_bin(), "state.json", "node-a")
        .args(["--no-kmsg", "--no-wake", "--state-polling-interval", "1h", "--sink", "stdout"])
        .args(["--metrics-port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let d = Daemon { child: Some(child) };
    assert!(wait_http(port, "/healthz", Duration::from_secs(20), |c, _| c == 200).is_some());
    let (status, log, _) = d.terminate();
    assert!(status.success() && !log.contains("panicked"), "{log}");
}

#[test]
fn kmsg_path_on_a_regular_file_is_followed_and_another_device_refused_without_spinning() {
    // `None`: followed (a regular file), else refused with this reason.
    for (bad, says) in [(Bad::Huge, None), (Bad::DevZero, Some("not the kernel log (1:11)"))] {
        let node = node();
        let kmsg = node.root().join("kmsg");
        apply(&kmsg, bad);
        let state = node.root().join("state.json");
        let child = node
            .run_command(&nicmon_bin(), "state.json", "node-a")
            .args(["--no-wake", "--state-polling-interval", "200ms", "--no-metrics", "--sink", "stdout"])
            .args(["--kmsg-path", kmsg.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let d = Daemon { child: Some(child) };
        let started = Instant::now();
        while !state.exists() {
            assert!(started.elapsed() < Duration::from_secs(20), "{bad:?}: no first cycle");
            // Waiting for the first saved cycle, bounded above.
            std::thread::sleep(Duration::from_millis(50));
        }
        let ticks = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            // After the ')' of the command name come fields 3 (state), 4, ...: utime and
            // stime are fields 14 and 15.
            let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
            f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
        };
        if says.is_none() {
            // More junk appended to the followed file: a 1 MiB line without a newline.
            std::fs::OpenOptions::new().append(true).open(&kmsg).unwrap().write_all(&vec![b'7'; 1 << 20]).unwrap();
        }
        // CPU use over fixed wall-clock windows: the first takes reading the junk once (a
        // debug build spends up to ~0.6 s of CPU scanning 1 MiB); the second is measured —
        // a reader that spins on the file keeps burning there, one that waits does not.
        let window = |d: Duration| {
            let at = Instant::now();
            while at.elapsed() < d {
                std::thread::sleep(Duration::from_millis(100));
            }
        };
        window(Duration::from_secs(2));
        let before = ticks();
        window(Duration::from_secs(2));
        let used = ticks() - before;
        let (status, log, _) = d.terminate();
        assert!(status.success(), "{log}");
        match says {
            Some(says) => {
                assert!(log.contains("kernel log watcher not started") && log.contains(says), "{bad:?}: {log}")
            }
            None => assert!(!log.contains("kernel log watcher") && !log.contains("panicked"), "{bad:?}: {log}"),
        }
        // 100 ticks per second on Linux: a spinning reader burns ~200 ticks in 2 s.
        assert!(used < 60, "{bad:?}: {used} ticks of CPU in 2 s");
    }
}

/// The events of a poll about mlx5_1 port 1, briefly.
fn port_events(events: &[serde_json::Value]) -> Vec<(String, bool, bool, String, String)> {
    events.iter().map(brief).filter(|b| b.3 == "NIC=mlx5_1 NICPort=1").collect()
}

#[test]
fn an_unknown_state_is_no_decision_then_one_non_fatal_event_then_cleared() {
    for (attr, bad) in [("state", Bad::Fifo), ("phys_state", Bad::NoPma), ("state", Bad::Directory)] {
        let node = node();
        let tl = Timeline::new(&node);
        let what = format!("{attr} as {bad:?}");
        assert!(tl.poll(0).iter().all(|e| !e["isFatal"].as_bool().unwrap()), "{what}: baseline");
        let path = node.port_file("mlx5_1", 1, attr);
        apply(&path, bad);
        // No decision while unknown: no event at all, the card is not compared.
        for t in [1, 10, 20] {
            let ev = tl.poll(t);
            assert!(ev.is_empty(), "{what} at t={t}: {ev:#?}");
        }
        // Past the 30 s grace: one non-fatal event naming the attribute and why.
        let ev = tl.poll(31);
        assert_eq!(ev.len(), 1, "{what} at t=31: {ev:#?}");
        let b = &port_events(&ev)[0];
        assert_eq!((b.0.as_str(), b.1, b.2), ("InfiniBandStateCheck", false, false), "{what}: non-fatal");
        let msg = ev[0]["message"].as_str().unwrap();
        assert!(msg.contains(&format!("{attr} unknown (")), "{what}: {msg}");
        assert!(tl.poll(40).is_empty(), "{what}: said once");
        // Readable again: one healthy event clears it.
        apply(&path, Bad::Empty);
        node.repair("mlx5_1", 1);
        let ev = tl.poll(41);
        assert_eq!(port_events(&ev).len(), 1, "{what}: {ev:#?}");
        assert!(ev.len() == 1 && port_events(&ev)[0].1, "{what}: healthy {ev:#?}");
        assert!(tl.poll(42).is_empty(), "{what}");
    }
}

#[test]
fn a_real_cable_pull_is_reported_while_link_layer_is_unreadable() {
    for bad in [Bad::Fifo, Bad::Empty, Bad::Binary, Bad::Dangling] {
        let node = node();
        let tl = Timeline::new(&node);
        let what = format!("link_layer as {bad:?}");
        tl.poll(0);
        apply(&node.port_file("mlx5_1", 1, "link_layer"), bad);
        assert!(tl.poll(1).is_empty(), "{what}: a healthy port stays quiet");
        node.pull_cable("mlx5_1", 1);
        let ev = port_events(&tl.poll(2));
        assert_eq!(ev.len(), 1, "{what}: the readable DOWN is reported: {ev:?}");
        assert_eq!((ev[0].0.as_str(), ev[0].1), ("InfiniBandStateCheck", false), "{what}");
    }
}

#[test]
fn a_pix_nic_with_an_unreadable_numa_node_keeps_its_role_and_its_down_is_reported() {
    for bad in [Bad::Fifo, Bad::Empty, Bad::NoPma, Bad::DevZero] {
        let node = node();
        let numa = node.sys().join(&node.info["mlx5_1"].pci_dir).join("numa_node");
        apply(&numa, bad);
        let what = format!("numa_node as {bad:?}");
        let tl = Timeline::new(&node);
        let report = tl.report(0);
        let dev = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_1").unwrap();
        assert_eq!(dev["role"], "compute", "{what}: {dev:#}");
        node.pull_cable("mlx5_1", 1);
        let ev = port_events(&tl.poll(1));
        assert_eq!(ev.len(), 1, "{what}: the DOWN is reported: {ev:?}");
        assert!(!ev[0].1, "{what}");
    }
}

#[test]
fn an_unknown_link_layer_or_state_on_the_first_poll_gives_no_card_event() {
    // No state file: no last known link layer to judge with, so the card is undecided.
    for attr in ["link_layer", "state"] {
        for bad in [Bad::Empty, Bad::Fifo, Bad::Binary] {
            let node = node();
            apply(&node.port_file("mlx5_1", 1, attr), bad);
            let what = format!("{attr} as {bad:?} on the first poll");
            let (status, report, stderr) = check(&node, &[], &what);
            assert!(status.success(), "{what}: {stderr}");
            assert!(fatal_events(&report).is_empty(), "{what}: {report:#}");
        }
    }
}
