//! `cargo xtask demo`: the real daemon (`nicmon trace`, which is `nicmon run` printing each
//! wake-up) against a simulated DGX-H100-like node, a local platform connector, and a
//! scripted fault timeline — a RoCE cable pull caught by eBPF, an InfiniBand cable pull,
//! a counter burst, device loss, a firmware fatal in the kernel log, recovery. Prints what
//! was detected, how, and how long after each fault.
//!
//! What it touches on the host: nothing but a veth pair (`nmdemoa`/`nmdemob`, as root),
//! removed at the end. The kernel-log fault goes through a private stand-in for
//! `/dev/kmsg` (a FIFO given to `--kmsg-path`, same record format), never into the real
//! log, where other monitors (NVSentinel's syslog monitor, node-problem-detector) would
//! act on it; the demo checks at the end that the real log gained no mlx5/AER/Xid line.
use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use nicmon_tests::connector::Connector;
use nicmon_tests::kernel_log::KernelLogWatch;
use nicmon_tests::latency::Veth;
use nicmon_tests::platforms::Platform;

#[derive(clap::Args)]
pub struct Options {
    /// Keep the simulated node's files and the daemon's log in this directory (default: a
    /// temporary directory, removed at the end unless a fault was missed).
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Seconds between faults.
    #[arg(long, default_value_t = 3)]
    step: u64,
    /// Do not build or use the eBPF programs (no veth either): polling and rtnetlink only.
    #[arg(long)]
    no_ebpf: bool,
}

/// The RoCE NIC backed by a real veth (as root).
const VETH_NIC: &str = "mlx5_8";
const VETH_TAG: &str = "nmdemo";

fn build_nicmon(root: &Path) -> Result<PathBuf> {
    eprintln!("==> building nicmon (cargo build -p nicmon; the first build takes a few minutes)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo).current_dir(root).args(["build", "-p", "nicmon"]).status()?;
    if !st.success() {
        bail!("cargo build -p nicmon failed");
    }
    Ok(root.join("target/debug/nicmon"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|u| u.split_whitespace().nth(1) == Some("0"))))
        .unwrap_or(false)
}

/// One `wake hook=...` line of `nicmon trace`.
#[derive(Debug)]
struct TraceWake {
    hook: String,
    /// Kernel timestamp → the agent received the record (eBPF hooks only).
    kernel_to_agent_ms: Option<f64>,
}

/// The wake-ups of the first poll in `trace` (lines of `nicmon trace` output) whose events
/// include an unhealthy one naming `needle`; empty when that poll had none (the interval's
/// poll). `None` while no such poll is in `trace` yet: the daemon prints a targeted poll's
/// trace only after its events were delivered, so the connector can have the event before
/// the trace has the poll.
fn wakes_that_caught(trace: &str, needle: &str) -> Option<Vec<TraceWake>> {
    /// What the previous line was: a poll's block is its wake lines, then its indented lines.
    #[derive(PartialEq)]
    enum Last {
        Wake,
        InPoll,
        Other,
    }
    let mut group: Vec<TraceWake> = Vec::new();
    let mut last = Last::Other;
    for line in trace.lines() {
        if let Some(rest) = line.strip_prefix("wake ") {
            if last != Last::Wake {
                group.clear();
            }
            let field = |k: &str| rest.split_whitespace().find_map(|f| f.strip_prefix(k)).map(str::to_string);
            group.push(TraceWake {
                hook: field("hook=").unwrap_or_default(),
                kernel_to_agent_ms: field("kernel->agent_ms=").and_then(|v| v.parse().ok()),
            });
            last = Last::Wake;
        } else if line.starts_with("  ") {
            // A poll without wake-ups (the interval's) prints its events only.
            if last == Last::Other {
                group.clear();
            }
            last = Last::InPoll;
            if line.starts_with("  event ") && line.contains(needle) && line.contains("healthy=false") {
                return Some(group);
            }
        } else {
            last = Last::Other;
        }
    }
    None
}

/// How long the demo waits for the trace to show the poll that reported the event.
const TRACE_WAIT: Duration = Duration::from_secs(3);

/// [`wakes_that_caught`] in the trace file after byte `from`, re-read until the poll is
/// there or [`TRACE_WAIT`] has passed (`None` then).
fn await_wakes(trace_path: &Path, from: usize, needle: &str) -> Option<Vec<TraceWake>> {
    let deadline = Instant::now() + TRACE_WAIT;
    loop {
        let trace = std::fs::read_to_string(trace_path).unwrap_or_default();
        if let Some(w) = wakes_that_caught(trace.get(from..).unwrap_or(""), needle) {
            return Some(w);
        }
        if Instant::now() >= deadline {
            return None;
        }
        // The trace file has no change notification worth its cost here: a short re-read.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How the first (RoCE) fault was caught, said plainly: through the eBPF ring buffer (the
/// hook and its kernel -> agent milliseconds), woken otherwise, or by the 1 s poll — and then
/// why no wake-up carried it.
fn how_caught(wakes: Option<&[TraceWake]>, no_ebpf_why: Option<&str>, stamped: Option<Duration>) -> String {
    let stamped = stamped
        .map(|d| format!(", event generated {:.1} ms after the fault", d.as_secs_f64() * 1e3))
        .unwrap_or_default();
    let Some(wakes) = wakes else {
        return format!(" — the trace did not show the poll that reported it within {TRACE_WAIT:?}{stamped}");
    };
    match wakes.iter().find(|w| w.kernel_to_agent_ms.is_some()) {
        Some(w) => format!(
            " — caught through the eBPF ring buffer: hook {}, kernel -> agent {:.2} ms{stamped}",
            w.hook,
            w.kernel_to_agent_ms.unwrap_or_default()
        ),
        None if !wakes.is_empty() => {
            let hooks: Vec<&str> = wakes.iter().map(|w| w.hook.as_str()).collect();
            format!(" — woken by {} (not eBPF){stamped}", hooks.join(", "))
        }
        None => {
            let why = no_ebpf_why.unwrap_or("eBPF was loaded, but no wake-up preceded the poll that saw it");
            format!(" — caught by the 1 s poll (no wake-up: {why})")
        }
    }
}

/// The daemon's start-up log condensed: the wake-up path, the hooks attached, how many
/// were not (and why eBPF did not load, when it did not).
fn wake_path_summary(log: &str) -> (bool, Vec<String>) {
    let value = |l: &str, key: &str| -> Option<String> {
        let rest = l.split(&format!("{key}=")).nth(1)?;
        Some(rest.trim_start_matches('"').split(['"', ' ']).next()?.to_string())
    };
    let mode = log.lines().filter(|l| l.contains("wake-up path")).find_map(|l| value(l, "mode"));
    let attached: Vec<String> =
        log.lines().filter(|l| l.contains("wake-up hook attached")).filter_map(|l| value(l, "hook")).collect();
    let not_attached = log.lines().filter(|l| l.contains("wake-up hook not attached")).count();
    let mut out = vec![format!("wake-up path: {}", mode.as_deref().unwrap_or("unknown"))];
    let others = match not_attached {
        0 => String::new(),
        n => format!(" ({n} others not attached on this kernel; --keep DIR keeps the log that says why)"),
    };
    out.push(format!("hooks attached: {}{others}", attached.join(", ")));
    for l in log.lines().filter(|l| l.contains("eBPF unavailable")) {
        out.push(l.split("nicmon::daemon: ").nth(1).unwrap_or(l).to_string());
    }
    (mode.as_deref() == Some("ebpf"), out)
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::build_ebpf::repo_root()?;
    let mut real_log = KernelLogWatch::start();

    // eBPF needs root (loading) and the kernel programs built into the binary.
    let mut no_ebpf_why: Option<String> = None;
    if opts.no_ebpf {
        no_ebpf_why = Some("--no-ebpf".into());
    } else if !is_root() {
        no_ebpf_why = Some("not root: loading eBPF programs and creating a veth need root".into());
    } else {
        eprintln!("==> building the eBPF programs (cargo xtask build-ebpf)");
        if let Err(e) = crate::build_ebpf::run(&crate::build_ebpf::Options::default()) {
            no_ebpf_why = Some(format!("the eBPF build failed: {e:#}"));
        }
    }
    let bin = build_nicmon(&root)?;

    let tmp = tempfile::Builder::new().prefix("nicmon-demo-").tempdir()?;
    let dir = opts.keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let mut node = Platform::DgxH100.build_at(&dir.join("node"));
    let veth = match &no_ebpf_why {
        Some(_) => None,
        None => match Veth::create(VETH_TAG) {
            Ok(v) => {
                node.rename_netdev(VETH_NIC, &v.a);
                node.use_host_netdev(&v.a);
                Some(RefCell::new(v))
            }
            Err(e) => {
                no_ebpf_why = Some(format!("cannot create a veth: {e}"));
                None
            }
        },
    };
    let conn = Connector::start(&dir.join("nvsentinel.sock"));
    let kmsg = dir.join("kmsg");
    let st = Command::new("mkfifo").arg(&kmsg).status().context("mkfifo")?;
    if !st.success() {
        bail!("mkfifo {} failed", kmsg.display());
    }

    println!("simulated node: DGX-H100-like (8 IB compute NICs, 4 RoCE storage NICs, 16 VFs) at {}", dir.display());
    match &veth {
        Some(v) => println!(
            "{VETH_NIC} (RoCE) is backed by a real veth on this host: {} (peer {})",
            v.borrow().a,
            v.borrow().b
        ),
        None => println!("{VETH_NIC} (RoCE) is simulated like the others ({})", no_ebpf_why.as_deref().unwrap_or("-")),
    }
    println!("kernel log: a private stand-in at {} (never the host's /dev/kmsg)", kmsg.display());
    println!("platform connector: {}", conn.target());

    let log_path = dir.join("nicmon.log");
    let trace_path = dir.join("trace.txt");
    let mut cmd = Command::new(&bin);
    cmd.arg("trace")
        .arg("--sysfs")
        .arg(node.sys())
        .arg("--procfs")
        .arg(node.proc())
        .arg("--metadata")
        .arg(node.metadata_path())
        .arg("--state-file")
        .arg(dir.join("state.json"))
        .args(["--config", "/nonexistent/nicmon.toml", "--node-name", "demo-node", "--no-metrics"])
        .args(["--platform-connector-socket", &conn.target()])
        .arg("--kmsg-path")
        .arg(&kmsg)
        // The NICs' transceivers and devlink health reporters, as the node's replay files.
        .arg("--ethtool-replay")
        .arg(node.ethtool_dir())
        .arg("--devlink-replay")
        .arg(node.devlink_dir())
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(std::fs::File::create(&trace_path)?))
        .stderr(Stdio::from(std::fs::File::create(&log_path)?));
    if veth.is_some() {
        // rtnetlink sees the same carrier change; off, so the catch is the ring buffer's.
        cmd.arg("--no-rtnetlink");
    } else if no_ebpf_why.is_some() {
        cmd.arg("--no-ebpf");
    }
    let mut child = cmd.spawn().context("starting nicmon trace")?;
    let t0 = Instant::now();

    let baseline_ok = conn.wait_until(Duration::from_secs(30), |ev| ev.iter().filter(|e| e.is_healthy).count() >= 12);
    println!(
        "[{:>5.1}s] nicmon up: {} healthy baselines received (one per monitored port)",
        t0.elapsed().as_secs_f64(),
        conn.events().len()
    );
    if !baseline_ok {
        let _ = child.kill();
        let _ = tmp.keep();
        bail!("no baselines from nicmon within 30 s: see {}", log_path.display());
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let (ebpf_live, path_lines) = wake_path_summary(&log);
    for l in &path_lines {
        println!("          {l}");
    }
    if veth.is_some() && !ebpf_live {
        println!("          eBPF did not load (reason above): the veth's cable pull is left to polling");
    }

    let card_bdf = node.info["mlx5_2"].bdf.clone();
    let bdfs: Vec<String> = node.info.values().map(|i| i.bdf.clone()).collect();
    type Ev = nicmon_proto::datamodels::HealthEvent;
    type Step<'a> = (String, Box<dyn Fn() + 'a>, Box<dyn Fn(&[Ev]) -> bool + 'a>);
    let has = |dev: &'static str| {
        move |ev: &[Ev]| ev.iter().any(|e| e.entities_impacted.iter().any(|x| x.entity_value == dev) && !e.is_healthy)
    };
    let node = &node;
    let mut steps: Vec<Step> = Vec::new();
    match &veth {
        Some(v) => steps.push((
            format!("cable pull on {VETH_NIC} (RoCE; its veth loses carrier)"),
            Box::new(move || {
                // The far end goes dark: no light on the module's lanes, then the port.
                node.set_module(VETH_NIC, nicmon_tests::optics::Module::dark);
                node.set_port(VETH_NIC, 1, "1: DOWN", "3: Disabled");
                let a = v.borrow().a.clone();
                v.borrow_mut().ip(&format!("link set {a} down"));
            }),
            Box::new(has(VETH_NIC)),
        )),
        None => steps.push((
            format!("cable pull on {VETH_NIC} (RoCE, simulated)"),
            Box::new(move || node.pull_cable(VETH_NIC, 1)),
            Box::new(has(VETH_NIC)),
        )),
    }
    steps.push((
        "cable pull on mlx5_3 port 1 (InfiniBand)".into(),
        Box::new(|| node.pull_cable("mlx5_3", 1)),
        Box::new(has("mlx5_3")),
    ));
    steps.push((
        "link_downed 0 -> 1 on mlx5_1 port 1".into(),
        Box::new(|| node.set_counter("mlx5_1", 1, "counters/link_downed", 1)),
        Box::new(|ev: &[Ev]| ev.iter().any(|e| e.error_code.iter().any(|c| c == "link_downed"))),
    ));
    steps.push((
        "mlx5_6 falls off the PCI bus".into(),
        Box::new(|| node.fall_off_bus("mlx5_6")),
        Box::new(has("mlx5_6")),
    ));
    let record = format!(
        "3,1,{},-;mlx5_core {card_bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count\n SUBSYSTEM=pci\n DEVICE=+pci:{card_bdf}\n",
        t0.elapsed().as_micros()
    );
    let stand_in = kmsg.clone();
    steps.push((
        "firmware fatal in the kernel log stand-in (mlx5_2's card)".into(),
        Box::new(move || {
            if let Err(e) = std::fs::OpenOptions::new()
                .append(true)
                .open(&stand_in)
                .and_then(|mut f| f.write_all(record.as_bytes()))
            {
                eprintln!("writing {}: {e}", stand_in.display());
            }
        }),
        Box::new(|ev: &[Ev]| ev.iter().any(|e| e.check_name == "NICKernelLogCheck")),
    ));
    steps.push((
        "recovery: cables reseated, counters cleared, device back".into(),
        Box::new(|| {
            node.repair("mlx5_3", 1);
            node.set_counter("mlx5_1", 1, "counters/link_downed", 0);
            node.restore_device("mlx5_6");
            match &veth {
                Some(v) => {
                    node.set_module(VETH_NIC, |m| m);
                    node.set_port(VETH_NIC, 1, "4: ACTIVE", "5: LinkUp");
                    let a = v.borrow().a.clone();
                    v.borrow_mut().ip(&format!("link set {a} up"));
                }
                None => node.repair(VETH_NIC, 1),
            }
        }),
        Box::new(|ev: &[Ev]| {
            let healthy = |dev: &str| {
                ev.iter().any(|e| e.is_healthy && e.entities_impacted.iter().any(|x| x.entity_value == dev))
            };
            healthy("mlx5_6")
                && healthy("mlx5_3")
                && healthy(VETH_NIC)
                && ev.iter().any(|e| e.is_healthy && e.error_code.iter().any(|c| c == "link_downed"))
        }),
    ));

    let mut summary = Vec::new();
    for (i, (name, inject, detected)) in steps.iter().enumerate() {
        std::thread::sleep(Duration::from_secs(opts.step)); // the timeline's pacing, not synchronisation
        let seen_before = conn.events().len();
        let trace_before = std::fs::read_to_string(&trace_path).unwrap_or_default().len();
        let at = Instant::now();
        let at_wall = SystemTime::now();
        println!("[{:>5.1}s] FAULT  {name}", t0.elapsed().as_secs_f64());
        inject();
        let ok = conn.wait_until(Duration::from_secs(15), |ev| detected(&ev[seen_before..]));
        let latency = at.elapsed();
        let new = conn.events()[seen_before..].to_vec();
        for e in &new {
            let what = if e.is_healthy {
                "healthy"
            } else if e.is_fatal {
                "FATAL"
            } else {
                "non-fatal"
            };
            let ents: Vec<String> =
                e.entities_impacted.iter().map(|x| format!("{}={}", x.entity_type, x.entity_value)).collect();
            println!(
                "          -> {what:<9} {:<27} {:<22} {}{}",
                e.check_name,
                ents.join(" "),
                e.message,
                if e.error_code.is_empty() { String::new() } else { format!(" [{}]", e.error_code.join(",")) }
            );
        }
        let mut how = String::new();
        if i == 0 && ok {
            // How the first (RoCE) fault was caught: the wake-ups of the poll that reported it.
            let wakes = await_wakes(&trace_path, trace_before, &format!("NIC={VETH_NIC}"));
            let stamped = new
                .iter()
                .find(|e| !e.is_healthy && e.entities_impacted.iter().any(|x| x.entity_value == VETH_NIC))
                .and_then(|e| e.generated_timestamp)
                .and_then(|t| {
                    let ts = SystemTime::UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos as u32);
                    ts.duration_since(at_wall).ok()
                });
            how = how_caught(wakes.as_deref(), no_ebpf_why.as_deref(), stamped);
        }
        let verdict = if ok {
            format!("detected in {:.2}s{how}", latency.as_secs_f64())
        } else {
            "NOT detected within 15 s".into()
        };
        println!("          {verdict}");
        summary.push((name.clone(), ok, latency, how));
    }

    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = child.wait()?;
    println!("\nsummary ({} events received by the connector, nicmon exited {}):", conn.events().len(), status);
    for (name, ok, lat, how) in &summary {
        let ms = match how.find("ring buffer") {
            Some(_) => format!(" ({})", how.trim_start_matches(" — ")),
            None => String::new(),
        };
        println!(
            "  {:<58} {}{ms}",
            name,
            if *ok { format!("detected after {:.2}s", lat.as_secs_f64()) } else { "MISSED".into() }
        );
    }
    drop(steps);
    if let Some(v) = veth {
        let name = v.borrow().a.clone();
        drop(v); // deletes the pair
        let gone = !Path::new("/sys/class/net").join(&name).exists();
        println!("veth {name}: {}", if gone { "removed" } else { "could NOT be removed (ip link del it)" });
    }
    let mut leaked = Vec::new();
    match real_log.as_mut() {
        Ok(w) => {
            let (ours, others): (Vec<String>, Vec<String>) =
                w.watched_lines().into_iter().partition(|l| bdfs.iter().any(|b| l.contains(b.as_str())));
            leaked = ours;
            match (leaked.is_empty(), others.is_empty()) {
                (true, true) => println!("host kernel log: no new mlx5/AER/NVRM/Xid line during the demo"),
                (true, false) => println!(
                    "host kernel log: nothing from the demo (no line names a simulated NIC); another process \
                     wrote {} mlx5/AER/NVRM/Xid line(s) meanwhile: {others:?}",
                    others.len()
                ),
                (false, _) => println!("host kernel log: NEW lines naming the simulated NICs: {leaked:?}"),
            }
        }
        Err(e) => println!("host kernel log: not checked ({e}); the demo writes nothing there"),
    }
    let missed = summary.iter().any(|(_, ok, _, _)| !ok);
    if missed && opts.keep.is_none() {
        let _ = tmp.keep();
    }
    if opts.keep.is_some() || missed {
        println!("log: {} (trace: {})", log_path.display(), trace_path.display());
    }
    if missed {
        bail!("some faults were not detected");
    }
    if !leaked.is_empty() {
        bail!("the host's kernel log gained lines naming the demo's simulated NICs");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A targeted poll woken by the ring buffer, as `nicmon trace` prints it.
    const TARGETED: &str = "wake hook=qdisc_reset poll=targeted(mlx5_8) kernel_ns=1 hint=Name(\"nmdemoa\") \
                            kernel->agent_ms=0.200 coalesce_wait_ms=0.010 poll_ms=0.300 events=1 last_batch=3\n  \
                            event EthernetStateCheck healthy=false fatal=true [NIC=mlx5_8 NICPort=1] down\n";

    #[test]
    fn the_poll_that_reported_the_event_names_its_wake_ups() {
        let w = wakes_that_caught(TARGETED, "NIC=mlx5_8").expect("the poll is in the trace");
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].hook.as_str(), w[0].kernel_to_agent_ms), ("qdisc_reset", Some(0.2)));
        let how = how_caught(Some(&w), None, None);
        assert_eq!(how, " — caught through the eBPF ring buffer: hook qdisc_reset, kernel -> agent 0.20 ms");
    }

    #[test]
    fn an_event_delivered_before_its_trace_line_is_waited_for_not_credited_to_polling() {
        // The connector has the event; the daemon prints the targeted poll's trace after
        // the delivery: only the wake line (or nothing) is in the file yet.
        let partial = TARGETED.lines().next().unwrap();
        assert!(wakes_that_caught(partial, "NIC=mlx5_8").is_none());
        assert!(wakes_that_caught("", "NIC=mlx5_8").is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.txt");
        std::fs::write(&path, format!("earlier line\n{TARGETED}")).unwrap();
        let w = await_wakes(&path, "earlier line\n".len(), "NIC=mlx5_8").expect("found");
        assert_eq!(w[0].hook, "qdisc_reset");
    }

    #[test]
    fn a_poll_without_wake_ups_is_the_interval_poll_and_says_why() {
        // A wake-up's poll that reported something else, then the interval's poll (no wake
        // line) that reported the port: the wake-up is not credited.
        let trace = "wake hook=qdisc_reset poll=full kernel_ns=1 kernel->agent_ms=0.1 events=1\n  \
                     event EthernetStateCheck healthy=false fatal=true [NIC=mlx5_9 NICPort=1] down\n  \
                     event EthernetStateCheck healthy=false fatal=true [NIC=mlx5_8 NICPort=1] down\n";
        // (the same poll reported both: credited)
        assert_eq!(wakes_that_caught(trace, "NIC=mlx5_8").unwrap().len(), 1);
        let trace = "wake hook=qdisc_reset poll=full kernel_ns=1 kernel->agent_ms=0.1 events=1\n  \
                     event EthernetStateCheck healthy=false fatal=true [NIC=mlx5_9 NICPort=1] down\n\
                     sent batch=4\n  \
                     event EthernetStateCheck healthy=false fatal=true [NIC=mlx5_8 NICPort=1] down\n";
        let w = wakes_that_caught(trace, "NIC=mlx5_8").expect("reported");
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(how_caught(Some(&w), Some("--no-ebpf"), None), " — caught by the 1 s poll (no wake-up: --no-ebpf)");
        assert!(how_caught(Some(&w), None, None).contains("eBPF was loaded, but no wake-up preceded"));
        assert!(how_caught(None, None, None).contains("did not show the poll"));
    }
}
