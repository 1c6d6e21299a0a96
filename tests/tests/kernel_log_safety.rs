//! Kernel-log faults never reach the host's real kernel log (issue #12): the daemon reads
//! them from a private stand-in (a FIFO at `--kmsg-path`), the real log gains nothing, and
//! no code of the project writes into `/dev/kmsg` except the guarded self-test writer.
//! Also: `nicmon_kernel_log_watching` and `/healthz` say whether the log is watched, and
//! `--metrics-bind-address` limits where the endpoint listens.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::kernel_log::KernelLogWatch;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};

const WAIT: Duration = Duration::from_secs(20);

fn start(node: &Node, extra: &[&str]) -> Daemon {
    Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-9")
            .args(["--no-wake", "--state-polling-interval", "200ms", "--metrics-bind-address", "127.0.0.1"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )
}

fn http_get(addr: &str, port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((addr, port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, buf))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `/healthz`'s body once the endpoint answers and the daemon has set up (or given up on)
/// the kernel log watcher: the endpoint is up before that, and says `(not started)`.
fn healthz(port: u16) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok((200, response)) = http_get("127.0.0.1", port, "/healthz") {
            let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
            if !body.contains("(not started)") {
                return body;
            }
        }
        assert!(Instant::now() < deadline, "no /healthz past start-up on 127.0.0.1:{port}");
        std::thread::sleep(Duration::from_millis(50)); // waiting for a listener to appear
    }
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(st.success(), "mkfifo {}", path.display());
}

#[test]
fn a_kernel_log_fault_through_the_stand_in_is_detected_and_the_real_log_gains_nothing() {
    let mut real = match KernelLogWatch::start() {
        Ok(w) => Some(w),
        Err(e) => {
            eprintln!("SKIP (real-log part only): cannot read the real kernel log: {e}");
            None
        }
    };
    let node = Platform::DgxH100.build();
    let fifo = node.root().join("kmsg");
    mkfifo(&fifo);
    let conn = Connector::start(&node.root().join("c.sock"));
    let port = free_port();
    let _d = start(
        &node,
        &[
            "--kmsg-path",
            fifo.to_str().unwrap(),
            "--platform-connector-socket",
            &conn.target(),
            "--metrics-port",
            &port.to_string(),
        ],
    );
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 12), "baselines");
    let body = healthz(port);
    assert!(body.contains("kernel_log_watching 1"), "{body}");
    let (_, metrics) = http_get("127.0.0.1", port, "/metrics").unwrap();
    assert!(metrics.lines().any(|l| l == "nicmon_kernel_log_watching 1"), "{metrics}");
    // Bound to 127.0.0.1 only: another loopback address of the same host is refused.
    assert!(http_get("127.0.0.2", port, "/healthz").is_err(), "listening beyond --metrics-bind-address");

    let marker = format!("nicmon-test-{}-{}", std::process::id(), time::OffsetDateTime::now_utc().unix_timestamp());
    let bdf = &node.info["mlx5_2"].bdf;
    let record = format!(
        "3,1001,5000000,-;mlx5_core {bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count {marker}\n SUBSYSTEM=pci\n DEVICE=+pci:{bdf}\n"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .and_then(|mut f| std::io::Write::write_all(&mut f, record.as_bytes()))
        .expect("writing the stand-in");
    let is_kmsg_event = |e: &nicmon_proto::datamodels::HealthEvent| {
        e.check_name == "NICKernelLogCheck"
            && !e.is_healthy
            && e.entities_impacted.iter().any(|x| x.entity_value == "mlx5_2")
            && e.error_code.iter().any(|c| c == "health_compromised")
    };
    assert!(conn.wait_until(WAIT, |ev| ev.iter().any(is_kmsg_event)), "kernel log event through the stand-in");

    if let Some(w) = real.as_mut() {
        let leaked: Vec<String> = w.new_lines().into_iter().filter(|l| l.contains(&marker)).collect();
        assert!(leaked.is_empty(), "the stand-in's record reached the real kernel log: {leaked:?}");
    }
}

#[test]
fn healthz_and_the_gauge_say_why_the_kernel_log_is_not_watched() {
    let node = Platform::H100Oci.build();
    let sink = format!("file:{}", node.root().join("events.jsonl").display());
    for (flags, why) in [
        (vec!["--no-kmsg"], "kernel_log_watching 0 (off: --no-kmsg)".to_string()),
        (
            vec!["--kmsg-path", "/nonexistent/kmsg"],
            "kernel_log_watching 0 (/nonexistent/kmsg: No such file or directory".to_string(),
        ),
    ] {
        let port = free_port();
        let mut args = vec!["--sink", &sink, "--metrics-port"];
        let p = port.to_string();
        args.push(&p);
        args.extend(flags.iter().copied());
        let d = start(&node, &args);
        let body = healthz(port);
        assert!(body.starts_with("ok\n") && body.contains(&why), "{flags:?}: {body}");
        let (_, metrics) = http_get("127.0.0.1", port, "/metrics").unwrap();
        assert!(metrics.lines().any(|l| l == "nicmon_kernel_log_watching 0"), "{flags:?}");
        drop(d);
    }
}

/// Where a line of a source file opens the kernel log for writing. The window is the
/// reference's line and three on either side (one statement, formatted).
fn kmsg_writes(text: &str) -> Vec<usize> {
    const WRITES: [&str; 11] = [
        ".write(true)",
        "fs::write(",
        "File::create(",
        ".append(true)",
        "O_WRONLY",
        "O_RDWR",
        "> /dev/kmsg",
        ">/dev/kmsg",
        "tee /dev/kmsg",
        "tee -a /dev/kmsg",
        "open(\"/dev/kmsg\", \"w",
    ];
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !(l.contains("/dev/kmsg") || l.contains("DEV_KMSG")) || l.contains("pub const DEV_KMSG") {
            continue;
        }
        let window = &lines[i.saturating_sub(3)..(i + 4).min(lines.len())];
        if window.iter().any(|w| WRITES.iter().any(|n| w.contains(n))) {
            out.push(i + 1);
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | ".tools" | "node_modules") {
                sources(&p, out);
            }
        } else if [".rs", ".sh", ".py", ".md", ".yaml", ".toml"].iter().any(|x| name.ends_with(x))
            || name == "Dockerfile"
        {
            out.push(p);
        }
    }
}

/// Nothing in the project writes into the real `/dev/kmsg` except
/// `nicmon::cli::real_log` (marked, pattern- and keyword-checked self-test lines).
#[test]
fn no_source_writes_into_the_real_kernel_log_but_the_guarded_writer() {
    // The scan finds the kind of write the demo used to do.
    let bad = "let mut f = std::fs::OpenOptions::new()\n    .write(true)\n    .open(\"/dev/kmsg\")?;\n";
    assert_eq!(kmsg_writes(bad), [3]);
    assert_eq!(kmsg_writes("echo hi > /dev/kmsg\n"), [1]);
    assert!(kmsg_writes("let t = KmsgTail::spawn(DEV_KMSG, Start::End)?;\n").is_empty());

    let root = nicmon_tests::deploy::repo_root();
    let mut files = Vec::new();
    for d in ["nicmon", "nicmon-ebpf", "nicmon-common", "tests", "xtask", "deploy", "docs", "proto"] {
        sources(&root.join(d), &mut files);
    }
    files.push(root.join("README.md"));
    assert!(files.len() > 50, "{} files", files.len());
    let allowed = [root.join("nicmon/src/cli/real_log.rs"), root.join(file!())];
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !allowed.iter().any(|a| a.ends_with(f.strip_prefix(&root).unwrap()))) {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in kmsg_writes(&text) {
            found.push(format!("{}:{line}", f.strip_prefix(&root).unwrap().display()));
        }
    }
    assert!(
        found.is_empty(),
        "writes into the real kernel log outside nicmon::cli::real_log (use a stand-in FIFO and \
         --kmsg-path, or real_log::write_marked): {found:?}"
    );
}
