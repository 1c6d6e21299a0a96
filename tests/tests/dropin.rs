//! NVSentinel drop-in at the binary's edge (issue #20): upstream's chart arguments start
//! nicmon without a subcommand, older charts' retired flags are accepted with one warning,
//! and direct publishing (`HEALTH_PUBLISH_TARGET`) reaches a real TLS gRPC server with a
//! generated CA, a bearer token and per-batch idempotency keys.
//!
//! Waits are condition-based (woken by each arrival), bounded by timeouts.
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nicmon_proto::datamodels::HealthEvent;
use nicmon_tests::connector::{Connector, Received, TestPki};
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-node-7";
/// Upstream's current checks (`--checks` as its chart renders it).
const UPSTREAM_CHECKS: &str =
    "InfiniBandStateCheck,InfiniBandDegradationCheck,EthernetStateCheck,EthernetDegradationCheck";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The args upstream's current chart renders (flags only, `--flag=value`), with the paths
/// pointed at the testbed node and its temporary directory.
fn current_chart_args(node: &Node, socket: &str) -> Vec<String> {
    let root = node.root();
    vec![
        format!("--checks={UPSTREAM_CHECKS}"),
        format!("--platform-connector-socket={socket}"),
        "--state-polling-interval=1s".into(),
        format!("--metrics-port={}", free_port()),
        format!("--config={}", root.join("etc/nic-health-monitor/config.toml").display()),
        format!("--metadata-path={}", node.metadata_path().display()),
        format!("--state-file={}", root.join("state.json").display()),
        format!("--boot-id-path={}", node.proc().join("sys/kernel/random/boot_id").display()),
        "--processing-strategy=EXECUTE_REMEDIATION".into(),
        "--poll-stall-deadline=10s".into(),
        "--poll-stall-store-only=true".into(),
    ]
}

/// The testbed's host trees (nicmon's own flags; the host paths from the ConfigMap are
/// another part of the drop-in) and no wake-up sources, to keep the test light.
fn testbed_args(node: &Node) -> Vec<String> {
    vec![
        format!("--sysfs={}", node.sys().display()),
        format!("--procfs={}", node.proc().display()),
        "--no-kmsg".into(),
        "--no-wake".into(),
    ]
}

/// A running daemon. Its log is read as it is written (a pipe nobody drains blocks the
/// daemon once it fills: a reboot's baselines on a 16-port node log more than 64 KiB).
struct Daemon(Child, Option<std::thread::JoinHandle<String>>);

impl Daemon {
    fn spawn(mut cmd: Command) -> Daemon {
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn nicmon");
        let mut err = child.stderr.take().expect("piped stderr");
        let reader = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut log);
            log
        });
        Daemon(child, Some(reader))
    }

    /// SIGTERM, wait, and return the exit status and what it logged.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let _ = Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let status = self.0.wait().unwrap();
        let log = self.1.take().map(|r| r.join().unwrap_or_default()).unwrap_or_default();
        (status, log)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nicmon(args: &[String]) -> Command {
    let mut cmd = Command::new(nicmon_bin());
    cmd.args(args).env("RUST_LOG", "warn,nicmon=info");
    for var in ["NODE_NAME", "HEALTH_PUBLISH_TARGET", "HEALTH_PUBLISH_TOKEN_PATH", "HEALTH_PUBLISH_TLS_CA_FILE"] {
        cmd.env_remove(var);
    }
    cmd
}

fn is_port_event(e: &HealthEvent, dev: &str, healthy: bool) -> bool {
    e.check_name == "InfiniBandStateCheck"
        && e.is_healthy == healthy
        && e.entities_impacted.iter().any(|x| x.entity_type == "NIC" && x.entity_value == dev)
}

fn baselines(ev: &[HealthEvent]) -> bool {
    ev.iter().filter(|e| e.is_healthy && e.check_name == "InfiniBandStateCheck").count() >= 16
}

/// Poll the state file (written by the daemon after each acknowledgement) until `pred`.
fn wait_for_outbox(node: &Node, pred: impl Fn(usize) -> bool) -> bool {
    let deadline = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < deadline {
        if pred(outbox_len(node)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn outbox_len(node: &Node) -> usize {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.root().join("state.json")).unwrap_or_default()).unwrap_or_default();
    v["outbox"].as_array().map(Vec::len).unwrap_or(0)
}

/// A testbed node, the direct-publishing environment for a TLS connector and a token file.
struct Direct {
    node: Node,
    pki: TestPki,
    conn: Connector,
    token: std::path::PathBuf,
}

impl Direct {
    fn new() -> Direct {
        let node = Platform::H100Oci.build();
        let pki = TestPki::generate(&node.root().join("pki"));
        let conn = Connector::start_tls(&pki);
        let token = node.root().join("token");
        std::fs::write(&token, "projected-sa-token-1\n").unwrap();
        Direct { node, pki, conn, token }
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut args = current_chart_args(&self.node, "unix:///nonexistent/nvsentinel.sock");
        // A flag given in `extra` replaces the chart's (clap refuses a flag given twice).
        args.retain(|a| !extra.iter().any(|e| e.split('=').next() == a.split('=').next()));
        args.extend(testbed_args(&self.node));
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut cmd = nicmon(&args);
        cmd.env("NODE_NAME", NODE)
            .env("HEALTH_PUBLISH_TARGET", self.conn.address.unwrap().to_string())
            .env("HEALTH_PUBLISH_TOKEN_PATH", &self.token)
            .env("HEALTH_PUBLISH_TLS_CA_FILE", &self.pki.ca_file);
        cmd
    }
}

#[test]
fn upstream_chart_args_publish_directly_over_tls_with_token_and_idempotency_keys() {
    let t = Direct::new();
    let d = Daemon::spawn(t.command(&[]));
    if !t.conn.wait_until(WAIT, baselines) {
        let calls = t.conn.received().len();
        let (_, log) = d.stop();
        panic!("baselines over TLS: {calls} calls\n{log}");
    }
    t.node.pull_cable("mlx5_3", 1);
    assert!(t.conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_3", false))), "cable pull");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("publishing directly to the deployment platform connector"), "{log}");
    // Upstream's chart's poll-stall flags start the watchdog (10s, store-only).
    assert!(log.contains("NIC poll stall detection enabled deadline=10s processing_strategy=STORE_ONLY"), "{log}");
    assert!(!log.contains("accepted but ignored"), "{log}");

    let calls = t.conn.received();
    assert!(calls.iter().all(|c| c.refused.is_none()), "every call accepted");
    for c in &calls {
        assert_eq!(c.authorization.as_deref(), Some("Bearer projected-sa-token-1"), "bearer token on every call");
        let key = c.idempotency_key.as_deref().expect("idempotency-key on every call");
        assert!(key.len() <= 128 && key.chars().all(|ch| ch.is_ascii_alphanumeric() || "._:-".contains(ch)), "{key}");
        assert!(c.batch.events.iter().all(|e| e.node_name == NODE));
    }
    let mut keys: Vec<&str> = calls.iter().filter_map(|c| c.idempotency_key.as_deref()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), calls.len(), "one key per batch");
    assert_eq!(outbox_len(&t.node), 0, "every batch acknowledged");
}

#[test]
fn a_retryable_failure_is_resent_with_the_same_key_and_a_permanent_rejection_is_dropped() {
    let t = Direct::new();
    // The first batch (the baselines of one check): Unavailable twice, then stored.
    t.conn.refuse_next(&[Code::Unavailable, Code::Unavailable]);
    // The poll-stall watchdog is off: it publishes over its own connection, and its calls
    // would interleave with the outbox's that this test counts.
    let d = Daemon::spawn(t.command(&["--connector-retry-base=100ms", "--poll-stall-deadline=0s"]));
    assert!(t.conn.wait_for_calls(WAIT, |c| c.iter().filter(|c| c.refused.is_none()).count() >= 1), "delivered");
    let calls = t.conn.received();
    assert_eq!(calls[0].refused, Some(Code::Unavailable));
    assert_eq!(calls[1].refused, Some(Code::Unavailable));
    assert_eq!(calls[2].refused, None);
    assert_eq!(calls[0].idempotency_key, calls[2].idempotency_key, "a retry carries the batch's key");
    assert_eq!(calls[0].batch, calls[2].batch, "and the same batch");

    // Wait for the baselines, then refuse the cable pull's batch for good.
    assert!(t.conn.wait_until(WAIT, baselines), "baselines");
    assert!(wait_for_outbox(&t.node, |n| n == 0), "start-up batches all delivered");
    let before = t.conn.received().len();
    t.conn.refuse_next(&[Code::PermissionDenied]);
    t.node.pull_cable("mlx5_3", 1);
    assert!(t.conn.wait_for_calls(WAIT, |c| c.len() > before), "the pull's batch is offered");
    let rejected: Received = t.conn.received()[before].clone();
    assert_eq!(rejected.refused, Some(Code::PermissionDenied));
    assert!(rejected.batch.events.iter().any(|e| is_port_event(e, "mlx5_3", false)), "{rejected:?}");

    // Dropped, not retried: the next fault's batch is the next call, and no call repeats
    // the rejected key.
    t.node.pull_cable("mlx5_5", 1);
    assert!(t.conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_5", false))), "later batches flow");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("rejected permanently"), "{log}");
    let again = t.conn.received().iter().filter(|c| c.idempotency_key == rejected.idempotency_key).count();
    assert_eq!(again, 1, "a permanently rejected batch is not sent again");
    assert!(!t.conn.events().iter().any(|e| is_port_event(e, "mlx5_3", false)));
    assert_eq!(outbox_len(&t.node), 0);
}

#[test]
fn direct_publishing_settings_are_checked_at_start() {
    let t = Direct::new();
    let out = t.command(&["--check-config"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let addr = t.conn.address.unwrap().to_string();
    assert!(text.contains(&format!("direct publish:    {addr} (TLS, CA {}", t.pki.ca_file.display())), "{text}");
    assert!(text.contains("queue 1024 batches / 67108864 bytes"), "{text}");

    // Without a token path, a CA (and no insecure switch), or with a bad window: exit 2
    // naming the variable, for the daemon as for --check-config.
    for (unset, set, named) in [
        ("HEALTH_PUBLISH_TOKEN_PATH", None, "HEALTH_PUBLISH_TOKEN_PATH"),
        ("HEALTH_PUBLISH_TLS_CA_FILE", None, "HEALTH_PUBLISH_TLS_CA_FILE"),
        ("", Some(("HEALTH_PUBLISH_RETRY_WINDOW", "soon")), "HEALTH_PUBLISH_RETRY_WINDOW=\"soon\""),
    ] {
        for extra in [&["--check-config"][..], &[][..]] {
            let mut cmd = t.command(extra);
            if !unset.is_empty() {
                cmd.env_remove(unset);
            }
            if let Some((k, v)) = set {
                cmd.env(k, v);
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{named}: {err}");
            assert!(err.contains(named), "{named}: {err}");
        }
    }
}

fn check_config(args: &[String], node_name: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = nicmon(args);
    if let Some(n) = node_name {
        cmd.env("NODE_NAME", n);
    }
    let out = cmd.output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn invocation_without_a_subcommand_and_its_errors() {
    let node = Platform::H100Oci.build();
    let mut args = current_chart_args(&node, "unix:///var/run/nvsentinel.sock");
    args.push("--check-config".into());

    let (code, out) = check_config(&args, Some(NODE));
    assert_eq!(code, Some(0), "{out}");
    let checks = out.lines().find_map(|l| l.strip_prefix("checks:")).unwrap_or_default().trim();
    let mut checks: Vec<&str> = checks.split(',').collect();
    checks.sort();
    let mut want: Vec<&str> = UPSTREAM_CHECKS.split(',').collect();
    want.sort();
    assert_eq!(checks, want, "{out}");
    assert!(out.contains(&format!("node name:         {NODE}")), "{out}");

    // The gRPC sink needs the node name (upstream refuses to start without it).
    let (code, out) = check_config(&args, None);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--node-name (or the NODE_NAME environment variable) is required"), "{out}");
    let (code, out) = check_config(&args, Some(""));
    assert_eq!(code, Some(2), "an empty NODE_NAME is none: {out}");
    let mut with_flag = args.clone();
    with_flag.push("--node-name=gpu-node-9".into());
    let (code, out) = check_config(&with_flag, None);
    assert_eq!((code, out.contains("node name:         gpu-node-9")), (Some(0), true), "{out}");
    // The daemon itself refuses too, before touching the host.
    let (code, out) = check_config(&args[..args.len() - 1], None);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("NODE_NAME"), "{out}");

    // JSON-lines sinks keep the host-name fallback.
    let mut stdout_sink = args.clone();
    stdout_sink.push("--sink=stdout".into());
    let (code, out) = check_config(&stdout_sink, None);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("node name:         \n"), "{out}");

    // Unknown flags still exit 2, with or without the subcommand.
    for bad in [vec!["--no-such-flag".to_string()], vec!["run".into(), "--no-such-flag".into()]] {
        let (code, out) = check_config(&bad, Some(NODE));
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains("unexpected argument '--no-such-flag'"), "{out}");
    }
    // A bad Go value names the flag.
    let (code, out) = check_config(&["--poll-stall-store-only=maybe".into()], Some(NODE));
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--poll-stall-store-only"), "{out}");
    // The top-level help and version are not taken for `run`.
    let (code, out) = check_config(&["--version".into()], None);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("nicmon "), "{out}");
}

/// The args of upstream's Kata-era chart (`_helpers.tpl`), exactly: flag and value as
/// separate args, `--config …/config.yaml` (a TOML file despite its name), no
/// `--boot-id-path`, `--state-file` or host-path flags. The socket and state file it left at
/// their defaults are pointed at the testbed; `--no-kmsg --no-wake` keep the test light.
fn kata_chart_args(node: &Node, socket: &str, config: &Path) -> Vec<String> {
    let port = free_port().to_string();
    let meta = node.metadata_path().display().to_string();
    let mut args: Vec<String> = [
        "--state-polling-interval",
        "1s",
        "--counter-polling-interval",
        "5s",
        "--metrics-port",
        &port,
        "--kata-enabled",
        "false",
        "--checks",
        "InfiniBandStateCheck,InfiniBandDegradationCheck,EthernetStateCheck,EthernetDegradationCheck",
        "--metadata-path",
        &meta,
        "--processing-strategy",
        "EXECUTE_REMEDIATION",
        "--config",
        config.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--platform-connector-socket={socket}"));
    args.push(format!("--state-file={}", node.root().join("state.json").display()));
    args.extend(["--no-kmsg".to_string(), "--no-wake".to_string()]);
    args
}

/// An older chart: its exact args, its ConfigMap file (`nic-health-monitor-config`,
/// `config.yaml`) with the class paths under the testbed's `/nvsentinel`-like prefix, and
/// upstream's v2 state file of an earlier boot with `link_downed` latched. The host trees
/// come from the ConfigMap (no `--sysfs`); with no `--boot-id-path` the boot ID is this
/// machine's, not the file's: a reboot, so the latch is cleared. Baselines and a cable pull
/// reach a real connector.
#[test]
fn an_older_charts_args_run_with_one_warning_for_the_retired_flags() {
    let node = Platform::H100Oci.build();
    let config = node.root().join("etc/nic-health-monitor/config.yaml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, upstream_configmap(&node)).unwrap();
    std::fs::write(node.root().join("state.json"), upstream_v2_state("boot-before-the-migration")).unwrap();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let args = kata_chart_args(&node, &conn.target(), &config);
    assert!(!args.iter().any(|a| a.starts_with("--sysfs") || a.starts_with("--procfs")), "{args:?}");

    let mut probe = args.clone();
    probe.push("--check-config".into());
    let (code, out) = check_config(&probe, Some(NODE));
    assert_eq!(code, Some(0), "{out}");
    let sys = node.sys().display().to_string();
    assert!(
        out.contains(&format!("sysfs root:        {sys} (config sysClassInfinibandPath, sysClassNetPath)")),
        "{out}"
    );
    assert!(out.contains("counter rules:     3"), "the listed counters are the set: {out}");

    let mut cmd = nicmon(&args);
    cmd.env("NODE_NAME", NODE);
    let d = Daemon::spawn(cmd);
    let cleared = |ev: &[HealthEvent]| {
        ev.iter()
            .any(|e| e.check_name == "InfiniBandDegradationCheck" && e.is_healthy && e.entities_impacted.is_empty())
    };
    assert!(
        conn.wait_until(WAIT, |ev| cleared(ev) && baselines(ev)),
        "the latch's clear after the boot change, then baselines: {:#?}",
        conn.events()
    );
    let ev = conn.events();
    assert!(ev.iter().all(|e| e.is_healthy), "{ev:#?}");
    let first = ev.iter().find(|e| e.check_name == "InfiniBandDegradationCheck").unwrap();
    assert!(first.entities_impacted.is_empty(), "the check's clear comes before its baselines: {ev:#?}");
    let first_state = ev.iter().find(|e| e.check_name == "InfiniBandStateCheck").unwrap();
    assert!(first_state.entities_impacted.is_empty(), "clear-all first: {ev:#?}");
    node.pull_cable("mlx5_3", 1);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_3", false))), "cable pull");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("retired")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {log}");
    assert!(
        warnings[0].contains("ignored retired NVSentinel flag(s) --counter-polling-interval, --kata-enabled"),
        "{log}"
    );
    assert!(!log.contains("ERROR"), "{log}");
    assert!(log.contains("boot ID changed"), "{log}");
}

/// Upstream's ConfigMap (`config.toml`) as its chart renders it, with the host class
/// directories under the testbed's `/nvsentinel`-like prefix (its `sys/` and `proc/`).
fn upstream_configmap(node: &Node) -> String {
    format!(
        r#"nicExclusionRegex = "^veth.*,^docker.*,^br-.*,^lo$"
nicInclusionRegexOverride = ""
sysClassNetPath = "{sys}/class/net"
sysClassInfinibandPath = "{sys}/class/infiniband"

[charDeviceCheck]
issm = "never"

[counterDetection]
enabled = true

[[counterDetection.counters]]
name = "link_downed"
enabled = true
thresholdType = "delta"
threshold = 0

[[counterDetection.counters]]
name = "efa_no_completion_cmds"
enabled = true
thresholdType = "delta"
threshold = 0

[[counterDetection.counters]]
name = "symbol_error"
enabled = true
thresholdType = "velocity"
threshold = 10
velocityUnit = "second"
"#,
        sys = node.sys().display()
    )
}

/// An upstream schema-v2 state file of an earlier boot with `link_downed` latched on
/// mlx5_3 port 1 (outstanding on the platform).
fn upstream_v2_state(boot_id: &str) -> String {
    format!(
        r#"{{"version": 2, "boot_id": "{boot_id}", "scope": "incl=;excl=^veth.*,^docker.*,^br-.*,^lo$",
  "known_devices": ["mlx5_3"], "chardev_issm_mode": "never",
  "port_states": {{"mlx5_3_1": {{"device": "mlx5_3", "port": 1, "state": "ACTIVE", "physical_state": "LinkUp", "link_layer": "InfiniBand"}}}},
  "counter_snapshots": {{"mlx5_3:1:link_downed": {{"value": 0, "timestamp": "2026-01-01T00:00:00Z"}}}},
  "breach_flags": {{"mlx5_3:1:link_downed": {{"breached": true, "check_name": "InfiniBandDegradationCheck", "is_fatal": true, "since": "2026-01-01T00:00:00Z", "device": "mlx5_3", "port": 1}}}},
  "pending_baselines": {{}}}}"#
    )
}

fn write_configmap(node: &Node) -> std::path::PathBuf {
    let config = node.root().join("etc/nic-health-monitor/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, upstream_configmap(node)).unwrap();
    config
}

/// The whole drop-in: upstream's current chart args (no --sysfs/--procfs: the ConfigMap's
/// class paths and the --boot-id-path prefix place the host trees), its ConfigMap, and its
/// v2 state file of the previous boot; a real gRPC connector receives the clear of the
/// latched counter, the baselines and a cable pull.
#[test]
fn upstream_chart_configmap_and_v2_state_file_run_unchanged() {
    let node = Platform::H100Oci.build();
    write_configmap(&node);
    std::fs::write(node.root().join("state.json"), upstream_v2_state("boot-before-the-migration")).unwrap();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let mut args = current_chart_args(&node, &conn.target());
    // Light on the test machine: no eBPF or kernel log (polling finds the same changes).
    args.extend(["--no-kmsg".to_string(), "--no-wake".to_string()]);

    let mut probe = args.clone();
    probe.push("--check-config".into());
    let (code, out) = check_config(&probe, Some(NODE));
    assert_eq!(code, Some(0), "{out}");
    let sys = node.sys().display().to_string();
    let proc = node.proc().display().to_string();
    assert!(
        out.contains(&format!("sysfs root:        {sys} (config sysClassInfinibandPath, sysClassNetPath)")),
        "{out}"
    );
    assert!(out.contains(&format!("procfs root:       {proc} (--boot-id-path prefix)")), "{out}");
    assert!(out.contains("counter rules:     3"), "the listed counters are the set: {out}");
    assert!(out.contains("poll stall:        10s, events STORE_ONLY"), "{out}");

    let mut cmd = nicmon(&args);
    cmd.env("NODE_NAME", NODE);
    let d = Daemon::spawn(cmd);
    let cleared = |ev: &[HealthEvent]| {
        ev.iter()
            .any(|e| e.check_name == "InfiniBandDegradationCheck" && e.is_healthy && e.entities_impacted.is_empty())
    };
    assert!(
        conn.wait_until(WAIT, |ev| cleared(ev) && baselines(ev)),
        "clear-all after the boot change, then baselines"
    );
    let ev = conn.events();
    assert!(ev.iter().all(|e| e.is_healthy), "{ev:#?}");
    let degradation = |e: &&HealthEvent| e.check_name == "InfiniBandDegradationCheck";
    let first = ev.iter().find(degradation).unwrap();
    assert!(first.entities_impacted.is_empty(), "the check's clear comes before its baselines: {ev:#?}");
    node.pull_cable("mlx5_3", 1);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(|e| is_port_event(e, "mlx5_3", false))), "cable pull");
    let (status, log) = d.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains("ERROR"), "{log}");
    assert!(log.contains("boot ID changed"), "{log}");
}

/// Bad input stops start-up with exit 2 naming the key; a truncated v2 file is a reboot.
#[test]
fn upstream_configmap_errors_exit_2_and_a_truncated_v2_file_is_a_reboot() {
    let node = Platform::H100Oci.build();
    let config = write_configmap(&node);
    let good = upstream_configmap(&node);
    let mut args = current_chart_args(&node, "unix:///var/run/nvsentinel.sock");
    args.push("--check-config".into());
    let cases = [
        (
            good.replace("name = \"symbol_error\"", "name = \"symbol_errors\""),
            "counterDetection.counters[2] (name \"symbol_errors\"): name = \"symbol_errors\": not a known counter",
        ),
        (
            good.replace("name = \"symbol_error\"", "name = \"link_downed\""),
            "counterDetection.counters[2] (name \"link_downed\"): name = \"link_downed\": duplicate of counterDetection.counters[0]",
        ),
        (good.replace("^lo$", "^lo($"), "nicExclusionRegex"),
        (good.replace("issm = \"never\"", "issm = \"sometimes\""), "charDeviceCheck.issm = \"sometimes\""),
        (good.replace("/class/net\"", "/net\""), "sysClassNetPath"),
        (format!("{good}\n[stateCheck]\nportStateHoldDown = \"-1s\"\n"), "stateCheck.portStateHoldDown = \"-1s\""),
    ];
    for (text, named) in cases {
        std::fs::write(&config, text).unwrap();
        let (code, out) = check_config(&args, Some(NODE));
        assert_eq!(code, Some(2), "{named}: {out}");
        assert!(out.contains(named), "{named}: {out}");
        assert!(out.contains(config.to_str().unwrap()), "names the file: {out}");
    }
    std::fs::write(&config, good).unwrap();

    // A truncated v2 file: reboot semantics (clear-all, then baselines), no crash.
    let state = node.root().join("state.json");
    let v2 = upstream_v2_state("00000000-0000-4000-8000-000000000001");
    std::fs::write(&state, &v2[..v2.len() / 2]).unwrap();
    let out = node.nicmon(
        "check",
        &["--format", "json", "--config", config.to_str().unwrap(), "--state-file", state.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("starting fresh"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = v["events"].as_array().unwrap();
    assert!(
        ev.iter()
            .any(|e| e["checkName"] == "InfiniBandDegradationCheck"
                && e["entitiesImpacted"].as_array().unwrap().is_empty()),
        "{ev:#?}"
    );
    // The whole v2 file of this boot: imported, the latch kept (nothing cleared, no baseline).
    std::fs::write(&state, &v2).unwrap();
    let out = node.nicmon(
        "check",
        &["--format", "json", "--config", config.to_str().unwrap(), "--state-file", state.to_str().unwrap()],
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["events"].as_array().unwrap().iter().all(|e| !e["entitiesImpacted"].as_array().unwrap().is_empty()),
        "{v:#}"
    );
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(saved["version"], 1);
    assert_eq!(saved["counters"]["breach_flags"]["mlx5_3:1:link_downed"]["breached"], true, "{saved:#}");
}

/// `counterDetection.enabled = false` as upstream reads it: the degradation checks are
/// skipped with one warning, the section's entries are not validated (an entry upstream
/// rejects is named in the warning, not an exit), and the other checks run; a request of
/// degradation checks only has no check left and exits 2 saying so.
#[test]
fn counters_disabled_skip_the_degradation_checks_without_validating_their_entries() {
    let node = Platform::H100Oci.build();
    let config = write_configmap(&node);
    let off = upstream_configmap(&node)
        .replace("[counterDetection]\nenabled = true", "[counterDetection]\nenabled = false")
        .replace("name = \"symbol_error\"", "name = \"symbol_errors\"");
    assert!(off.contains("enabled = false") && off.contains("symbol_errors"), "{off}");
    std::fs::write(&config, &off).unwrap();
    let cfg = config.to_str().unwrap();
    let meta = node.metadata_path().display().to_string();
    let check = |checks: &str| {
        let args = ["--format", "json", "--config", cfg, "--metadata-path", &meta, "--checks", checks];
        node.nicmon("check", &args)
    };

    let out = check(UPSTREAM_CHECKS);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {err}");
    let w = warnings[0];
    assert!(
        w.contains("counterDetection.enabled = false: skipping InfiniBandDegradationCheck, EthernetDegradationCheck"),
        "{w}"
    );
    assert!(w.contains("counterDetection.counters[2] (name \"symbol_errors\")"), "what would be invalid: {w}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ev = v["events"].as_array().unwrap();
    assert!(ev.iter().any(|e| e["checkName"] == "InfiniBandStateCheck"), "the state checks ran: {v:#}");
    assert!(ev.iter().all(|e| !e["checkName"].as_str().unwrap().contains("Degradation")), "{v:#}");
    // The daemon's probe says the same.
    let mut probe = current_chart_args(&node, "unix:///var/run/nvsentinel.sock");
    probe.push("--check-config".into());
    let (code, out) = check_config(&probe, Some(NODE));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("checks:            InfiniBandStateCheck,EthernetStateCheck\n"), "{out}");
    assert!(out.contains("warning: config ") && out.contains("symbol_errors"), "{out}");

    // The same file with counters enabled is the error upstream also stops at.
    std::fs::write(&config, off.replace("enabled = false", "enabled = true")).unwrap();
    let out = check(UPSTREAM_CHECKS);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a known counter"));

    // Only degradation checks requested: nothing left to run.
    std::fs::write(&config, &off).unwrap();
    let out = check("InfiniBandDegradationCheck,EthernetDegradationCheck");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no check is enabled") && err.contains(cfg), "{err}");
    assert!(out.stdout.is_empty());
}

/// Upstream's scope fingerprint: an edited `nicExclusionRegex` re-baselines the state checks
/// (their clear, then healthy events) while counter snapshots and latched breaches are kept;
/// the unchanged scope (also the one recorded in an imported v2 file) clears nothing.
#[test]
fn a_scope_change_rebaselines_the_state_checks_and_keeps_counters_and_latches() {
    let node = Platform::H100Oci.build();
    let config = write_configmap(&node);
    let state = node.root().join("state.json");
    std::fs::write(&state, upstream_v2_state("00000000-0000-4000-8000-000000000001")).unwrap();
    let check = || -> Vec<serde_json::Value> {
        let out = node.nicmon(
            "check",
            &["--format", "json", "--config", config.to_str().unwrap(), "--state-file", state.to_str().unwrap()],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["events"].as_array().unwrap().clone()
    };
    let entityless = |ev: &[serde_json::Value]| -> Vec<String> {
        ev.iter()
            .filter(|e| e["entitiesImpacted"].as_array().unwrap().is_empty())
            .map(|e| e["checkName"].as_str().unwrap().to_string())
            .collect()
    };
    let saved = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap() };

    // The v2 file's scope is the ConfigMap's: resumed, nothing cleared.
    assert!(entityless(&check()).is_empty());
    let before = saved();
    assert_eq!(before["scope"], "incl=;excl=^veth.*,^docker.*,^br-.*,^lo$");

    std::fs::write(&config, upstream_configmap(&node).replace("^lo$\"", "^lo$,^eth9$\"")).unwrap();
    let ev = check();
    assert_eq!(entityless(&ev), ["InfiniBandStateCheck", "EthernetStateCheck", "EFAStateCheck"], "{ev:#?}");
    assert!(ev[0]["message"].as_str().unwrap().contains("Discovery scope changed"), "{ev:#?}");
    let baselines = ev
        .iter()
        .filter(|e| {
            e["checkName"] == "InfiniBandStateCheck"
                && e["isHealthy"] == true
                && !e["entitiesImpacted"].as_array().unwrap().is_empty()
        })
        .count();
    assert!(baselines >= 8, "healthy baselines of the state checks: {ev:#?}");
    assert!(!ev.iter().any(|e| e["checkName"] == "InfiniBandDegradationCheck"), "counters not re-baselined: {ev:#?}");
    let after = saved();
    assert_eq!(after["scope"], "incl=;excl=^veth.*,^docker.*,^br-.*,^lo$,^eth9$");
    assert_eq!(after["counters"]["breach_flags"]["mlx5_3:1:link_downed"]["breached"], true, "latch kept: {after:#}");
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v["counters"]["counter_snapshots"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    };
    assert!(!keys(&before).is_empty() && keys(&after) == keys(&before), "counter snapshots kept: {after:#}");

    // The new scope recorded: the next poll resumes.
    assert!(entityless(&check()).is_empty());
}
