//! What `cargo xtask bench` and its scale series (`scale.rs`) both measure with: the poll
//! bench's figures, a process's CPU time and memory, the 1,000-port device.
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// What `cargo bench --bench poll` measured on one tree.
pub struct PollFigures {
    pub median_ms: f64,
    pub p99_ms: f64,
    pub cpu_ms: f64,
    /// Poll / open-read-close floor.
    pub floor_ratio: f64,
    /// With VFs or ports asked for: the poll against the same node without them, polled
    /// alternately in the same run.
    pub versus_base: Option<f64>,
}

/// The number after `key` in `out` (up to the next space or `x`).
fn figure(out: &str, key: &str) -> Result<f64> {
    out.split(key)
        .nth(1)
        .and_then(|r| r.split(|c: char| c.is_whitespace() || c == 'x' || c == ';' || c == ',').next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no `{key}` figure in the poll bench's output"))
}

/// `cargo bench -p nicmon --bench poll` (release build) with `polls` polls, on the
/// DGX-H100-like node as `env` asks for it (`NICMON_BENCH_VFS`, `NICMON_BENCH_PORTS`: see
/// the bench); prints its output.
pub fn poll_bench(root: &Path, env: &[(&str, String)], polls: usize) -> Result<PollFigures> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root)
        .args(["bench", "--quiet", "-p", "nicmon", "--bench", "poll"])
        .env("NICMON_BENCH_POLLS", polls.to_string())
        .env_remove("NICMON_BENCH_TREE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let st = cmd.output()?;
    let out = String::from_utf8_lossy(&st.stdout);
    print!("{out}");
    if !st.status.success() {
        bail!("cargo bench -p nicmon --bench poll failed: {}", String::from_utf8_lossy(&st.stderr));
    }
    Ok(PollFigures {
        median_ms: figure(&out, "median ")?,
        p99_ms: figure(&out, "p99 ")?,
        cpu_ms: figure(&out, "per poll: ")?,
        floor_ratio: figure(&out, "poll / floor = ")?,
        versus_base: out
            .lines()
            .find(|l| l.starts_with("against the same node without them"))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|r| r.trim_end_matches('x').trim().parse().ok()),
    })
}

/// The cargo that runs xtask.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// A process's CPU time so far (utime + stime, clock ticks).
pub fn proc_cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("bad /proc stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state(0) ... utime(11) stime(12).
    Ok(f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?)
}

/// A `/proc/<pid>/status` figure in KiB (`VmRSS:`, `VmHWM:`, ...).
pub fn proc_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(key)).with_context(|| format!("{key} not in status"))?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

/// The node's first PF gets ports 2 to 1,000, each a copy of its port 1 (state, rate,
/// every counter): with no state file, the first poll baselines them all.
pub fn thousand_ports(node: &nicmon_tests::Node) -> Result<()> {
    let dev = node.pfs().into_iter().next().context("the node has no PF")?;
    Ok(nicmon_tests::platforms::copy_ports(node, &dev, 1000)?)
}
