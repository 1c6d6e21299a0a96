//! `[stateCheck] portStateHoldDown` through the wake path (eBPF when built in) on a RoCE
//! port backed by a real veth: the wake-up of a DOWN polls at once, but the poll holds the
//! port (nothing published, `nicmon trace` says "held"); a blip shorter than the hold-down
//! is never published and counted in `nic_health_monitor_port_state_blips_total`; a long
//! outage is published once, when the hold-down is due (not a poll interval later); and
//! `nicmon history` shows the blip with its time and the wake-up hook that saw it.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use nicmon_tests::latency::{Mode, Veth};
use nicmon_tests::{NicSpec, Node, nicmon_bin};

fn ebpf_built_in() -> bool {
    let out = Command::new(nicmon_bin()).arg("version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("eBPF programs: built in")
}

fn port_events(sink: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(sink)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // The port's state events (a start without a state file is a reboot: its counter
        // baselines for mlx5_0 come in their own batches and are not the port's).
        .filter(|e| e["checkName"] == "EthernetStateCheck")
        .filter(|e| e["entitiesImpacted"].as_array().is_some_and(|a| a.iter().any(|x| x["entityValue"] == "mlx5_0")))
        .collect()
}

/// Wait (bounded) until `done` holds for what `read` returns.
fn wait_for<T>(what: &str, timeout: Duration, read: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let v = read();
        if done(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10)); // reading files another process appends to
    }
}

fn metrics(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf
}

fn blips(port: u16) -> Option<u64> {
    metrics(port)
        .lines()
        .find(|l| l.starts_with("nic_health_monitor_port_state_blips_total{") && l.contains("device=\"mlx5_0\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn ts_of(e: &serde_json::Value) -> SystemTime {
    let t = time::OffsetDateTime::parse(
        e["generatedTimestamp"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t.unix_timestamp_nanos() as u64)
}

#[test]
fn a_wake_up_during_the_hold_down_publishes_nothing_and_the_outage_is_reported_when_due() {
    let mode = if ebpf_built_in() {
        Mode::Ebpf
    } else {
        eprintln!("hold_down_wake: eBPF programs not built in (cargo xtask build-ebpf): using rtnetlink wake-ups");
        Mode::Rtnetlink
    };
    let tag = format!("nmh{}", std::process::id() % 100000);
    let mut veth = match Veth::create(&tag) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("SKIPPED hold_down_wake: cannot create a veth pair here ({e})");
            return;
        }
    };
    let mut node = Node::new("hold-wake");
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", &veth.a)]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::eth("mlx5_1", "fixture1")]);
    node.use_host_netdev(&veth.a);
    let sink: PathBuf = node.root().join("events.jsonl");
    let trace: PathBuf = node.root().join("trace.txt");
    let config = node.root().join("nicmon.toml");
    std::fs::write(&config, "[stateCheck]\nportStateHoldDown = \"2s\"\nflapThreshold = 0\n").unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let no_other_wake: &[&str] = match mode {
        Mode::Ebpf => &["--no-rtnetlink"],
        _ => &["--no-ebpf"],
    };
    let mut child = node
        .daemon_command(&nicmon_bin(), "trace", Some(&config), "state.json", "hold")
        .args(["--no-kmsg", "--state-polling-interval", "5s"])
        .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &metrics_port.to_string()])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(no_other_wake)
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(std::fs::File::create(&trace).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(node.root().join("nicmon.log")).unwrap()))
        .spawn()
        .unwrap();
    let state = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1");
    let set = |s: &str, p: &str| {
        std::fs::write(state.join("state"), s).unwrap();
        std::fs::write(state.join("phys_state"), p).unwrap();
    };
    let read_trace = || std::fs::read_to_string(&trace).unwrap_or_default();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("the baseline", Duration::from_secs(30), || port_events(&sink), |e| !e.is_empty());
        let before = port_events(&sink).len();

        // A 300 ms blip: the wake-up's poll holds the port; healthy again → a blip.
        let blip_from = SystemTime::now();
        set("1: DOWN\n", "3: Disabled\n");
        veth.ip(&format!("link set {} down", veth.a));
        let t = wait_for("the held line", Duration::from_secs(5), read_trace, |t| {
            t.contains("held EthernetStateCheck [NIC=mlx5_0 NICPort=1] DOWN/Disabled")
        });
        let held_at = t.find("held EthernetStateCheck [NIC=mlx5_0 NICPort=1]").unwrap();
        let wake_before = t[..held_at].rfind("wake hook=").map(|i| &t[i..held_at]);
        assert!(wake_before.is_some(), "the hold came from a wake-up's poll:\n{t}");
        let blip_seen = SystemTime::now();
        std::thread::sleep(Duration::from_millis(300)); // the blip's length, not synchronisation
        set("4: ACTIVE\n", "5: LinkUp\n");
        veth.ip(&format!("link set {} up", veth.a));
        wait_for("the blip line", Duration::from_secs(5), read_trace, |t| {
            t.contains("blip EthernetStateCheck [NIC=mlx5_0 NICPort=1] recovered within portStateHoldDown")
        });
        wait_for("the blip metric", Duration::from_secs(5), || blips(metrics_port), |b| *b == Some(1));
        // Past the hold-down: nothing was published for the blip.
        std::thread::sleep(Duration::from_millis(2500)); // longer than the hold-down, to see nothing came
        assert_eq!(port_events(&sink).len(), before, "a blip publishes nothing: {:#?}", port_events(&sink));

        // A long outage: held, then published once when due (2 s after the DOWN's poll).
        let down_at = SystemTime::now();
        set("1: DOWN\n", "3: Disabled\n");
        veth.ip(&format!("link set {} down", veth.a));
        let ev = wait_for("the fatal event", Duration::from_secs(10), || port_events(&sink), |e| e.len() > before);
        let fatal = &ev[before];
        assert_eq!((fatal["isHealthy"].as_bool(), fatal["isFatal"].as_bool()), (Some(false), Some(true)), "{fatal:#}");
        let after = ts_of(fatal).duration_since(down_at).unwrap_or_default();
        eprintln!(
            "hold_down_wake ({}): outage published {:.0} ms after the DOWN",
            mode.name(),
            after.as_secs_f64() * 1e3
        );
        assert!(after >= Duration::from_secs(2), "published before the hold-down: {after:?}");
        assert!(after < Duration::from_millis(2300), "published well after it was due: {after:?}");
        std::thread::sleep(Duration::from_millis(1500)); // to see that nothing else follows
        assert_eq!(port_events(&sink).len(), before + 1, "{:#?}", port_events(&sink));
        // The recovery is not held (this kernel may give no wake-up for a carrier coming
        // up: then the next 1 s tick reports it, still well inside the 2 s hold-down).
        let up_at = SystemTime::now();
        set("4: ACTIVE\n", "5: LinkUp\n");
        veth.ip(&format!("link set {} up", veth.a));
        let ev = wait_for("the recovery", Duration::from_secs(5), || port_events(&sink), |e| e.len() > before + 1);
        let rec = &ev[before + 1];
        assert_eq!(rec["isHealthy"], true);
        let rec_after = ts_of(rec).duration_since(up_at).unwrap_or_default();
        assert!(rec_after < Duration::from_millis(1500), "recovery after {rec_after:?}: {rec:#}");
        assert_eq!(blips(metrics_port), Some(1), "an outage is no blip");
        if mode == Mode::Ebpf {
            // The kernel programs' count of records lost to a full ring buffer is read
            // (it would be absent from the summary if not) and, the agent keeping up, 0.
            let m = metrics(metrics_port);
            assert!(m.lines().any(|l| l == "nicmon_ebpf_wake_records_lost_total 0"), "{m}");
        }
        (blip_from, blip_seen)
    }));
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    drop(veth);
    let result = result.and_then(|blip| {
        std::panic::catch_unwind(|| {
            assert_history_shows_the_blip(&node, blip, mode);
            if mode == Mode::Ebpf {
                let t = read_trace();
                assert!(t.contains("\n  wake records lost in the kernel (eBPF ring buffer full): 0\n"), "{t}");
            }
        })
    });
    if let Err(e) = result {
        eprintln!("trace:\n{}", read_trace());
        eprintln!("log:\n{}", std::fs::read_to_string(node.root().join("nicmon.log")).unwrap_or_default());
        std::panic::resume_unwind(e);
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `nicmon history` after the daemon stopped: the port's 300 ms DOWN was held by the
/// hold-down and is a blip, seen (to the millisecond) between the moment it was caused and
/// the held line, by the poll of the wake-up hook; then the long outage, reported.
fn assert_history_shows_the_blip(node: &Node, (from, seen): (SystemTime, SystemTime), mode: Mode) {
    let history = |format: &str| {
        let out = Command::new(nicmon_bin())
            .args(["history", "mlx5_0/1", "--format", format, "--state-file"])
            .arg(node.root().join("state.json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&history("json")).unwrap();
    let list = json["mlx5_0/1"].as_array().unwrap();
    let outcomes: Vec<(&str, &str)> =
        list.iter().map(|t| (t["state"].as_str().unwrap(), t["outcome"].as_str().unwrap())).collect();
    assert_eq!(
        outcomes,
        [("ACTIVE", "reported"), ("DOWN", "blip"), ("ACTIVE", "blip"), ("DOWN", "reported"), ("ACTIVE", "reported")],
        "{json:#}"
    );
    let (down, up) = (&list[1], &list[2]);
    let at = down["at_ms"].as_i64().unwrap();
    assert!(unix_ms(from) <= at && at <= unix_ms(seen), "the DOWN at {at}, caused at {from:?}, held by {seen:?}");
    let hook = match mode {
        Mode::Ebpf => down["woken_by"][0].as_str().filter(|h| *h != "rtnetlink"),
        _ => down["woken_by"][0].as_str().filter(|h| *h == "rtnetlink"),
    };
    assert!(hook.is_some(), "the DOWN was seen by the wake-up's poll: {down:#}");
    let lasted = up["at_ms"].as_i64().unwrap() - at;
    assert!(lasted >= 300, "the blip lasted {lasted} ms");
    let text = history("table");
    let line = text.lines().nth(1).unwrap();
    assert!(line.contains("mlx5_0/1") && line.contains("DOWN/Disabled"), "{text}");
    assert!(
        line.contains(&format!("blip: held by portStateHoldDown, not reported  (woken by {}", hook.unwrap())),
        "{text}"
    );
    assert!(text.lines().nth(2).unwrap().contains(&format!("blip over after {lasted} ms: not reported")), "{text}");
    eprintln!("hold_down_wake ({}): history\n{text}", mode.name());
}
