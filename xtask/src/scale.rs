//! The scale series of `cargo xtask bench`: the DGX-H100-like testbed node with 0, 16 and 64
//! SR-IOV VFs per InfiniBand PF, and the node whose first PF has 1,000 ports. For each: the
//! poll (median, p99, CPU per poll; `cargo bench --bench poll` on the tree, release build),
//! node_exporter's infiniband collector on the same tree, and the daemon's peak RSS
//! (`VmHWM`) after its first polls at a 50 ms interval. Bars (issue "performance at scale"):
//! the 512-VF node polls in ≤ 1.5× and peaks ≤ +4 MiB of the node without VFs; the
//! 1,000-port device stays ≤ 32 MiB.
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nicmon_tests::Node;
use nicmon_tests::platforms::{self, Platform};

use crate::measure::{PollFigures, poll_bench, proc_kib};

/// One row of the series.
struct Row {
    label: String,
    devices: usize,
    poll: PollFigures,
    peer_ms: Option<f64>,
    hwm_mib: f64,
}

/// Builds a case's tree under the given directory.
type Build = Box<dyn Fn(&Path) -> Result<Node>>;

/// One case of the series: its label, the poll bench's environment for the same node, and
/// the builder of its tree (for node_exporter and the daemon).
type Case = (String, Vec<(&'static str, String)>, Build);

/// The cases of the series.
fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    for per_pf in [0u32, 16, 64] {
        v.push((
            format!("{per_pf} VFs per IB PF ({} VFs)", per_pf * 8),
            vec![("NICMON_BENCH_VFS", per_pf.to_string())],
            Box::new(move |root: &Path| Ok(platforms::dgx_h100_with_vfs(per_pf, Some(root)))),
        ));
    }
    v.push((
        "a device with 1,000 ports".to_string(),
        vec![("NICMON_BENCH_PORTS", "1000".to_string())],
        Box::new(|root: &Path| {
            let node = Platform::DgxH100.build_at(root);
            crate::measure::thousand_ports(&node)?;
            Ok(node)
        }),
    ));
    v
}

/// The daemon's peak RSS (MiB) on `node`: polls every 50 ms for 5 s, no state file.
fn daemon_hwm(bin: &Path, node: &Node) -> Result<f64> {
    let mut d = node
        .run_command(bin, "state-scale.json", "bench")
        .args(["--no-kmsg", "--sink", "file:/dev/null", "--metrics-port", "0", "--state-polling-interval", "50ms"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nicmon run")?;
    let pid = d.id();
    std::thread::sleep(Duration::from_secs(5)); // the measurement window itself
    let alive = d.try_wait()?.is_none();
    let hwm = if alive { proc_kib(pid, "VmHWM:")? as f64 / 1024.0 } else { f64::NAN };
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = d.wait();
    if !alive {
        bail!("the daemon exited on the scale case");
    }
    Ok(hwm)
}

fn rdma_devices(node: &Node) -> usize {
    std::fs::read_dir(node.sys().join("class/infiniband")).map(|d| d.count()).unwrap_or(0)
}

/// Runs the series and prints it; returns whether its bars hold.
pub fn run(root: &Path, bin: &Path, peer: Option<&Path>, polls: usize) -> Result<bool> {
    let mut rows = Vec::new();
    for (label, env, build) in cases() {
        eprintln!("==> scale series: {label}");
        let tmp = tempfile::Builder::new().prefix("nicmon-scale-").tempdir()?;
        let node = build(tmp.path())?;
        let poll = poll_bench(root, &env, polls)?;
        let peer_ms = match peer {
            Some(p) => Some(crate::node_exporter::collector_ms(p, tmp.path(), 20)?[10]),
            None => None,
        };
        let hwm_mib = daemon_hwm(bin, &node)?;
        rows.push(Row { label, devices: rdma_devices(&node), poll, peer_ms, hwm_mib });
    }
    println!("scale series (poll: cargo bench --bench poll, {polls} polls; RSS: the daemon at 50 ms for 5 s):");
    println!(
        "  {:<32} {:>8} {:>12} {:>10} {:>12} {:>16} {:>10}",
        "node", "devices", "poll median", "poll p99", "CPU/poll", "node_exporter", "peak RSS"
    );
    for r in &rows {
        println!(
            "  {:<32} {:>8} {:>9.3} ms {:>7.3} ms {:>9.3} ms {:>16} {:>6.1} MiB",
            r.label,
            r.devices,
            r.poll.median_ms,
            r.poll.p99_ms,
            r.poll.cpu_ms,
            r.peer_ms.map(|m| format!("{m:.3} ms")).unwrap_or_else(|| "-".into()),
            r.hwm_mib
        );
    }
    let (base, vfs, ports) = (&rows[0], &rows[2], &rows[3]);
    // The bench's own comparison (the two nodes polled alternately, the same load on both)
    // where it gave one, else the two rows' medians.
    let poll_ratio = vfs.poll.versus_base.unwrap_or(vfs.poll.median_ms / base.poll.median_ms);
    let rss_delta = vfs.hwm_mib - base.hwm_mib;
    println!(
        "  512 VFs vs none: poll {poll_ratio:.2}x   [bar: <= 1.5x]; peak RSS {rss_delta:+.1} MiB   [bar: <= +4 MiB]\n  \
         1,000-port device: peak RSS {:.1} MiB   [bar: <= 32 MiB]",
        ports.hwm_mib
    );
    Ok(poll_ratio <= 1.5 && rss_delta <= 4.0 && ports.hwm_mib <= 32.0)
}
