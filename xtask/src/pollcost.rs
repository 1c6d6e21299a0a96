//! The daemon's poll cost (issue 47, item 1) of `cargo xtask bench`: nicmon's daemon on a
//! plain 12-NIC node (the DGX-H100-like node without VFs) and on the SR-IOV node (64 VFs per
//! IB PF, 512 VFs), polling every 50 ms, measured from outside over a window of polls:
//! - wall per poll: `nicmon_poll_duration_seconds` (sum / count over the window);
//! - CPU per poll: the task clock of every thread (`/proc/<pid>/task/*/schedstat`, ns);
//! - context switches per poll: voluntary + involuntary of every thread
//!   (`/proc/<pid>/task/*/status`);
//! - CPU migrations per poll: `perf stat -e cpu-migrations -p <pid>` where perf runs, else
//!   said so;
//! - node_exporter's infiniband collector on the same tree in the same run;
//! - on the plain node, the reads alone at the same cadence ([`crate::readfloor`]): the
//!   floor under the CPU bar on this machine.
//!
//! Bars: wall ≤ 0.35× node_exporter's collector, ≤ 0.5 ms CPU, ≤ 3 switches and no
//! migration per poll on the plain node; the 512-VF node ≤ 1.5× the plain node's wall.
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nicmon_tests::Node;
use nicmon_tests::platforms;

/// What one daemon measured over its window.
pub struct Cost {
    pub polls: f64,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub switches: f64,
    pub migrations: Option<f64>,
}

/// Task clock (ns) and context switches summed over the threads of `pid`.
fn threads(pid: u32) -> (u64, u64) {
    let (mut ns, mut cs) = (0, 0);
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    for t in rd.flatten() {
        let p = t.path();
        if let Ok(s) = std::fs::read_to_string(p.join("schedstat")) {
            ns += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        if let Ok(s) = std::fs::read_to_string(p.join("status")) {
            for l in s.lines() {
                if let Some(v) =
                    l.strip_prefix("voluntary_ctxt_switches:").or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    cs += v.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
    }
    (ns, cs)
}

/// `nicmon_poll_duration_seconds` (sum, count) from the daemon's metrics.
fn poll_metric(port: u16) -> Result<(f64, f64)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let get = |k: &str| {
        body.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
    };
    Ok((
        get("nicmon_poll_duration_seconds_sum ").context("no nicmon_poll_duration_seconds_sum")?,
        get("nicmon_poll_duration_seconds_count ").context("no nicmon_poll_duration_seconds_count")?,
    ))
}

/// `perf stat -e cpu-migrations` of `pid` for `secs`: the count, or `None` where perf does
/// not run here.
fn perf_migrations(pid: u32, secs: u64) -> Option<std::process::Child> {
    Command::new("perf")
        .args(["stat", "-x", ",", "-e", "cpu-migrations", "-p", &pid.to_string(), "--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .ok()
}

fn perf_count(child: Option<std::process::Child>) -> Option<f64> {
    let out = child?.wait_with_output().ok()?;
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines().find(|l| l.contains("cpu-migrations")).and_then(|l| l.split(',').next()?.trim().parse().ok())
}

/// The daemon on `node` polling every 50 ms: its cost per poll over `secs` after 3 s of
/// warm-up.
pub fn daemon_cost(bin: &Path, node: &Node, secs: u64) -> Result<Cost> {
    daemon_cost_with(bin, node, secs, "state-cost.json")
}

/// [`daemon_cost`] with its state file `state` in the node's directory (two daemons at once
/// on one node each have their own).
fn daemon_cost_with(bin: &Path, node: &Node, secs: u64, state: &str) -> Result<Cost> {
    let port = crate::node_exporter::free_port()?;
    let mut d = node
        .run_command(bin, state, "bench")
        .args(["--no-kmsg", "--sink", "file:/dev/null", "--state-polling-interval", "50ms"])
        .args(["--metrics-port", &port.to_string()])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nicmon run")?;
    let pid = d.id();
    let t0 = Instant::now();
    let first = loop {
        match poll_metric(port) {
            Ok(m) if t0.elapsed() >= Duration::from_secs(3) => break m,
            _ if t0.elapsed() > Duration::from_secs(30) => {
                let _ = d.kill();
                let _ = d.wait();
                bail!("the daemon's metrics did not answer on 127.0.0.1:{port}");
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let (ns0, cs0) = threads(pid);
    let perf = perf_migrations(pid, secs);
    std::thread::sleep(Duration::from_secs(secs)); // the measurement window
    let (ns1, cs1) = threads(pid);
    let last = poll_metric(port)?;
    let migrations = perf_count(perf);
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = d.wait();
    let polls = last.1 - first.1;
    if polls < 1.0 {
        bail!("the daemon did not poll in {secs} s");
    }
    Ok(Cost {
        polls,
        wall_ms: (last.0 - first.0) * 1000.0 / polls,
        cpu_ms: (ns1 - ns0) as f64 / 1e6 / polls,
        // The two scrapes of the window's ends are in it: not the poll's.
        switches: (cs1 - cs0) as f64 / polls,
        migrations: migrations.map(|m| m / polls),
    })
}

/// The poll-cost figures: the plain node and the 512-VF node, each beside node_exporter on
/// the same tree. Returns whether every bar is met.
pub fn run(bin: &Path, peer: Option<&Path>, secs: u64, scrapes: usize) -> Result<bool> {
    let mut ok = true;
    let mut plain_wall = None;
    for (label, vfs) in [("plain node: 12 PFs, no VFs", 0u32), ("SR-IOV node: 12 PFs + 512 VFs", 64)] {
        let tmp = tempfile::Builder::new().prefix("nicmon-cost-").tempdir()?;
        let node = platforms::dgx_h100_with_vfs(vfs, Some(tmp.path()));
        let c = daemon_cost(bin, &node, secs)?;
        let peer_ms = match peer {
            Some(p) => {
                let ms = crate::node_exporter::collector_ms(p, tmp.path(), scrapes)?;
                Some(ms[ms.len() / 2])
            }
            None => None,
        };
        let migr = match c.migrations {
            Some(m) => format!("{m:.2}"),
            None => "not measured (perf stat does not run here)".into(),
        };
        println!(
            "daemon poll cost, {label}, 50 ms interval, {:.0} polls in {secs} s: wall {:.3} ms, CPU {:.3} ms, \
             {:.2} context switches, {migr} CPU migrations per poll",
            c.polls, c.wall_ms, c.cpu_ms, c.switches
        );
        if let Some(p) = peer_ms {
            println!(
                "  node_exporter infiniband collector, same tree, {scrapes} scrapes: median {p:.3} ms; nicmon / \
                 node_exporter = {:.2}x",
                c.wall_ms / p
            );
        }
        if vfs == 0 {
            let floor = crate::readfloor::measure(&node, 100, Duration::from_millis(50))?;
            let left = match 0.5 - floor.cpu_ms {
                l if l > 0.0 => format!("the 0.5 ms bar leaves {l:.3} ms for everything else"),
                l => format!("over the 0.5 ms bar by {:.3} ms on their own", -l),
            };
            println!(
                "  the reads alone: one pread each of the {} files a poll reads, kept open, 100 passes 50 ms apart, \
                 no other work: CPU {:.3} ms per pass ({left})",
                floor.files, floor.cpu_ms
            );
            plain_wall = Some(c.wall_ms);
            let r = peer_ms.map(|p| c.wall_ms / p <= 0.35).unwrap_or(true);
            let met = r && c.cpu_ms <= 0.5 && c.switches <= 3.0 && c.migrations.is_none_or(|m| m < 0.05);
            println!(
                "  bars: <= 0.35x node_exporter, <= 0.5 ms CPU, <= 3 switches, no migration per poll: {}",
                if met { "met" } else { "NOT MET" }
            );
            ok &= met;
        } else if let Some(base) = plain_wall {
            let x = c.wall_ms / base;
            println!("  512 VFs / no VFs = {x:.2}x   [bar: <= 1.5x]");
            ok &= x <= 1.5;
        }
    }
    Ok(ok)
}

/// Two builds side by side (`--against`): both daemons at once on the plain node, so that
/// whatever else the machine does in the window weighs on both (on a VM whose speed drifts
/// between runs, an A/B of runs one after the other measures the drift as much as the
/// change). `pairs` windows of `secs`, the order of start swapped in each (the daemon started
/// second tends to be placed beside the first: more switches); per window the CPU and
/// switches per poll of each, then the spread of `b / a`.
pub fn paired(a: &Path, b: &Path, secs: u64, pairs: usize) -> Result<()> {
    let tmp = tempfile::Builder::new().prefix("nicmon-pair-").tempdir()?;
    let node = platforms::dgx_h100_with_vfs(0, Some(tmp.path()));
    println!("side by side on the plain node (12 PFs, no VFs), 50 ms interval, {pairs} windows of {secs} s:");
    println!("  a = {}\n  b = {}", a.display(), b.display());
    let mut ratios = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let b_first = i % 2 == 1;
        let (first, second) = if b_first { (b, a) } else { (a, b) };
        let (one, two) = std::thread::scope(|s| {
            let one = s.spawn(|| daemon_cost_with(first, &node, secs, "state-pair-1.json"));
            let two = s.spawn(|| daemon_cost_with(second, &node, secs, "state-pair-2.json"));
            (one.join(), two.join())
        });
        let joined = |r: std::thread::Result<Result<Cost>>| r.unwrap_or_else(|_| bail!("a measuring thread panicked"));
        let (one, two) = (joined(one)?, joined(two)?);
        let (ca, cb) = if b_first { (two, one) } else { (one, two) };
        let ratio = cb.cpu_ms / ca.cpu_ms;
        ratios.push(ratio);
        println!(
            "  window {}: {} started first; CPU per poll a {:.3} ms ({:.2} switches), b {:.3} ms ({:.2} switches); \
             b / a = {ratio:.3}",
            i + 1,
            if b_first { "b" } else { "a" },
            ca.cpu_ms,
            ca.switches,
            cb.cpu_ms,
            cb.switches
        );
    }
    ratios.sort_by(|x, y| x.total_cmp(y));
    let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
    println!(
        "b / a, CPU per poll: mean {mean:.3}, median {:.3}, from {:.3} to {:.3} over {pairs} windows",
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
        ratios.first().copied().unwrap_or(f64::NAN),
        ratios.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}
