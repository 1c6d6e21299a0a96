//! `cargo xtask bench`: the performance bars of SPEC §3 on the DGX-H100-like testbed node
//! (12 PFs, 16 VFs, ~2,000 sysfs files):
//! - one full poll (read + evaluate), median and p99 over many polls, release build;
//! - the daemon at a 1 s interval over a measured window: CPU share of one core (utime +
//!   stime from `/proc/<pid>/stat`), peak RSS (`VmHWM`) and state-file writes (its debug
//!   log line per write);
//! - the daemon's peak RSS under hostile inputs (issue #14: "≤ 32 MiB whatever the
//!   inputs"), one fresh daemon per case: a 100 MB state file; every port file and the
//!   state file a link to `/dev/zero`; a long outage with the outbox at its bound while a
//!   100 MB kernel log file floods `--kmsg-path`; a device with 1,000 ports (no state
//!   file: the first poll baselines every port and counter);
//! - node_exporter's infiniband collector on the same tree in the same run, the peer the poll
//!   is compared with (`node_exporter.rs`);
//! - the scale series: 0, 16 and 64 VFs per PF and the 1,000-port device (`scale.rs`);
//! - the daemon's poll cost (wall, CPU, context switches, migrations per poll) on the plain
//!   12-NIC node without VFs and on the 512-VF node, node_exporter beside (`pollcost.rs`).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nicmon_tests::platforms::Platform;

use crate::measure::{cargo, poll_bench, proc_cpu_ticks, proc_kib, thousand_ports};

#[derive(clap::Args)]
pub struct Options {
    /// Seconds the daemon is measured for.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Polls timed for the poll-duration figure.
    #[arg(long, default_value_t = 2000)]
    polls: usize,
    /// Only the hostile-input peak RSS cases.
    #[arg(long)]
    hostile_only: bool,
    /// Only the steady daemon (CPU, RSS, writes), with its start-up RSS timeline
    /// (`VmRSS`/`VmHWM` sampled every millisecond for the first 3 s).
    #[arg(long, conflicts_with = "hostile_only")]
    daemon_only: bool,
    /// Only the scale series (0, 16, 64 VFs per PF; a device with 1,000 ports).
    #[arg(long, conflicts_with_all = ["hostile_only", "daemon_only"])]
    scale_only: bool,
    /// Polls timed per case of the scale series.
    #[arg(long, default_value_t = 300)]
    scale_polls: usize,
    /// Scrapes of node_exporter timed on the DGX-H100-like node.
    #[arg(long, default_value_t = 200)]
    scrapes: usize,
    /// Leave node_exporter out (a machine without apt or network).
    #[arg(long)]
    no_peer: bool,
    /// Only the daemon's poll cost (wall, CPU, context switches, migrations per poll) on the
    /// plain 12-NIC node and the 512-VF node, beside node_exporter.
    #[arg(long, conflicts_with_all = ["hostile_only", "daemon_only", "scale_only"])]
    poll_cost_only: bool,
    /// Seconds each daemon of the poll-cost figures is measured for (50 ms interval).
    #[arg(long, default_value_t = 20)]
    cost_seconds: u64,
    /// A nicmon binary to measure instead of building this tree's (an A/B of two builds).
    #[arg(long)]
    nicmon: Option<std::path::PathBuf>,
    /// With --poll-cost-only: instead of the figures, run this binary side by side with the
    /// measured one (both daemons at once on the plain node, the order of start swapped in
    /// each window) and print the ratio of their CPU per poll (`b / a`, a: the measured one).
    #[arg(long, requires = "poll_cost_only", value_name = "BIN")]
    against: Option<std::path::PathBuf>,
    /// Windows of `--cost-seconds` for --against.
    #[arg(long, default_value_t = 6, requires = "against")]
    pairs: usize,
}

fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                let ft = match e.file_type() {
                    Ok(ft) => ft,
                    Err(_) => continue,
                };
                if ft.is_dir() {
                    stack.push(e.path());
                } else {
                    n += 1;
                }
            }
        }
    }
    n
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::build_ebpf::repo_root()?;
    let bin = match &opts.nicmon {
        Some(bin) => bin.clone(),
        None => {
            eprintln!("==> building nicmon (release)");
            let st = Command::new(cargo())
                .current_dir(&root)
                .args(["build", "--release", "--quiet", "-p", "nicmon"])
                .status()?;
            if !st.success() {
                bail!("cargo build --release -p nicmon failed");
            }
            let target = std::env::var_os("CARGO_TARGET_DIR").map(std::path::PathBuf::from);
            target.unwrap_or_else(|| root.join("target")).join("release/nicmon")
        }
    };
    if let Some(other) = &opts.against {
        return crate::pollcost::paired(&bin, other, opts.cost_seconds, opts.pairs);
    }
    if opts.poll_cost_only {
        let peer = peer(&root, opts)?;
        let ok = crate::pollcost::run(&bin, peer.as_deref(), opts.cost_seconds, opts.scrapes)?;
        println!("{}", if ok { "all bars met" } else { "SOME BARS NOT MET" });
        return Ok(());
    }
    if opts.scale_only {
        let peer = peer(&root, opts)?;
        let ok = crate::scale::run(&root, &bin, peer.as_deref(), opts.scale_polls)?;
        println!("{}", if ok { "all bars met" } else { "SOME BARS NOT MET" });
        return Ok(());
    }
    if opts.hostile_only {
        let worst = hostile_rss(&bin)?;
        println!("{}", if worst <= 32.0 { "all bars met" } else { "SOME BARS NOT MET" });
        return Ok(());
    }
    let tmp = tempfile::Builder::new().prefix("nicmon-bench-").tempdir()?;
    let node = Platform::DgxH100.build_at(tmp.path());
    let files = count_files(&node.sys());
    println!("node: DGX-H100-like testbed, 12 PFs + 16 VFs, {files} files under sys/");

    if opts.daemon_only {
        let d = steady_daemon(&bin, &node, tmp.path(), opts.seconds)?;
        println!("{}", if d.met() { "all bars met" } else { "SOME BARS NOT MET" });
        return Ok(());
    }

    // 1. Poll duration, in-process and in release mode, and node_exporter on the same tree.
    let poll = poll_bench(&root, &[], opts.polls)?;
    let peer = peer(&root, opts)?;
    let peer_ok = match &peer {
        Some(bin) => {
            let ms = crate::node_exporter::collector_ms(bin, tmp.path(), opts.scrapes)?;
            let (median, p99) = (ms[ms.len() / 2], ms[((ms.len() - 1) as f64 * 0.99).round() as usize]);
            let ratio = poll.median_ms / median;
            println!(
                "node_exporter {} infiniband collector, same tree, {} scrapes: median {median:.3} ms, p99 {p99:.3} ms; \
                 nicmon poll / node_exporter = {ratio:.2}x   [bar: <= 0.35x]",
                bin.display(),
                ms.len()
            );
            ratio <= 0.35
        }
        None => true,
    };

    // 2. Steady-state CPU and RSS at the default 1 s interval.
    let d = steady_daemon(&bin, &node, tmp.path(), opts.seconds)?;
    let worst = hostile_rss(&bin)?;
    // 3. The scale series.
    let scale = crate::scale::run(&root, &bin, peer.as_deref(), opts.scale_polls)?;
    // 4. The daemon's poll cost on the plain node and the 512-VF node.
    let cost = crate::pollcost::run(&bin, peer.as_deref(), opts.cost_seconds, opts.scrapes)?;
    let ok = poll.median_ms <= 2.0 && poll.floor_ratio <= 0.5 && peer_ok && d.met() && worst <= 32.0 && scale && cost;
    println!("{}", if ok { "all bars met" } else { "SOME BARS NOT MET" });
    Ok(())
}

/// node_exporter's binary unless `--no-peer` (fetched where missing).
fn peer(root: &Path, opts: &Options) -> Result<Option<std::path::PathBuf>> {
    if opts.no_peer {
        return Ok(None);
    }
    crate::node_exporter::ensure(root).map(Some).context("node_exporter, the peer (--no-peer leaves it out)")
}

/// What the steady daemon measured.
struct Steady {
    cpu_pct: f64,
    hwm_mib: f64,
    writes_per_min: f64,
}

impl Steady {
    fn met(&self) -> bool {
        self.cpu_pct <= 0.5 && self.hwm_mib <= 16.0 && self.writes_per_min <= 1.0
    }
}

/// `(ms since spawn, VmRSS KiB, VmHWM KiB)` of `pid`, sampled every millisecond for
/// `window`; only the samples where either changed by 256 KiB or more are kept.
fn rss_timeline(pid: u32, window: Duration) -> Vec<(f64, u64, u64)> {
    let t0 = Instant::now();
    let mut out: Vec<(f64, u64, u64)> = Vec::new();
    while t0.elapsed() < window {
        let (Ok(rss), Ok(hwm)) = (proc_kib(pid, "VmRSS:"), proc_kib(pid, "VmHWM:")) else {
            break;
        };
        let moved = out.last().is_none_or(|&(_, r, h)| r.abs_diff(rss) >= 256 || h.abs_diff(hwm) >= 256);
        if moved {
            out.push((t0.elapsed().as_secs_f64() * 1000.0, rss, hwm));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// The daemon at the default 1 s interval on `node`: start-up RSS timeline (printed), then
/// CPU, RSS and state-file writes over `seconds`.
fn steady_daemon(bin: &Path, node: &nicmon_tests::Node, tmp: &Path, seconds: u64) -> Result<Steady> {
    let log_path = tmp.join("daemon.log");
    let mut d = node
        .run_command(bin, "state-b.json", "bench")
        .args(["--no-kmsg", "--sink", "file:/dev/null", "--metrics-port", "0"])
        .env("RUST_LOG", "warn,nicmon::act::state=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()
        .context("starting nicmon run")?;
    let pid = d.id();
    // Start-up (topology, eBPF load, first poll) is excluded from the CPU window; its
    // memory is sampled.
    let timeline = rss_timeline(pid, Duration::from_secs(3));
    println!("daemon start-up RSS (ms since spawn: VmRSS / VmHWM MiB, on each 0.25 MiB move):");
    for (ms, rss, hwm) in &timeline {
        println!("  {ms:7.1} ms: {:5.1} / {:5.1}", *rss as f64 / 1024.0, *hwm as f64 / 1024.0);
    }
    let hz = 100.0; // USER_HZ on Linux
    let t0 = Instant::now();
    let writes = || std::fs::read_to_string(&log_path).unwrap_or_default().matches("state file written").count();
    let w0 = writes();
    let c0 = proc_cpu_ticks(pid)?;
    for i in 0..seconds {
        std::thread::sleep(Duration::from_secs(1)); // the measurement window itself
        eprint!("\r  measuring daemon CPU/RSS: {}/{} s", i + 1, seconds);
    }
    eprintln!();
    let c1 = proc_cpu_ticks(pid)?;
    let w1 = writes();
    let wall = t0.elapsed().as_secs_f64();
    let rss = proc_kib(pid, "VmRSS:")?;
    let hwm = proc_kib(pid, "VmHWM:")?;
    let (anon, file) = (proc_kib(pid, "RssAnon:")?, proc_kib(pid, "RssFile:")?);
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = d.wait();
    let cpu_pct = (c1 - c0) as f64 / hz / wall * 100.0;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "daemon at 1 s interval over {wall:.0} s: CPU {cpu_pct:.3} % of one core   [bar: <= 0.5 %]\n\
         daemon RSS: {:.1} MiB now ({:.1} anonymous, {:.1} file-backed: code and libraries), {:.1} MiB peak   [bar: <= 16 MiB]\n\
         state file writes: {} in {wall:.0} s ({:.2}/min)   [bar: <= 1/min]",
        mib(rss),
        mib(anon),
        mib(file),
        mib(hwm),
        w1 - w0,
        (w1 - w0) as f64 / wall * 60.0
    );
    Ok(Steady { cpu_pct, hwm_mib: hwm as f64 / 1024.0, writes_per_min: (w1 - w0) as f64 / wall * 60.0 })
}

/// The position of `pid`'s open descriptor on `file`, if it has one.
fn fd_pos(pid: u32, file: &Path) -> Option<u64> {
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if std::fs::read_link(fd.path()).ok().as_deref() == Some(file) {
            let info =
                std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy())).ok()?;
            return info.lines().find_map(|l| l.strip_prefix("pos:")).and_then(|v| v.trim().parse().ok());
        }
    }
    None
}

/// A file of `size` bytes made of `chunk` repeated, written in 1 MiB pieces.
fn write_repeated(path: &Path, size: usize, mut chunk: impl FnMut(usize) -> String) -> Result<()> {
    use std::io::Write as _;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let (mut n, mut i) = (0, 0);
    while n < size {
        let c = chunk(i);
        w.write_all(c.as_bytes())?;
        n += c.len();
        i += 1;
    }
    w.flush()?;
    Ok(())
}

/// A state file for `node`'s boot whose outbox is at its bound (1024 batches, ~4 MiB) and
/// whose kernel log cursor makes the watcher read `--kmsg-path` from its start.
fn full_outbox_state(node: &nicmon_tests::Node, path: &Path) -> Result<()> {
    use nicmon::model::event::{Check, HealthEvent, Stamp};
    let boot = std::fs::read_to_string(node.proc().join("sys/kernel/random/boot_id"))?;
    let mut st = nicmon::act::state::State::fresh(Some(boot.trim().to_string()));
    std::sync::Arc::make_mut(&mut st.checks.kmsg).last_seq = Some(0);
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    let now = time::OffsetDateTime::now_utc();
    let text = "x".repeat(3000);
    for i in 0..nicmon::act::outbox::OUTBOX_BOUNDS.max_batches {
        let ev = HealthEvent::new(Check::InfiniBandStateCheck, &stamp, now, &format!("outage filler {i} {text}"));
        st.outbox.enqueue(&[ev]);
    }
    nicmon::act::state::file::save(path, &st)?;
    Ok(())
}

/// Peak RSS (MiB) of one fresh daemon per hostile case; returns the worst.
fn hostile_rss(bin: &Path) -> Result<f64> {
    const MB100: usize = 100 * 1000 * 1000;
    let mut worst = 0.0f64;
    for case in [
        "100 MB state file",
        "/dev/zero for every port file and the state file",
        "outage: full outbox + 100 MB kmsg file",
        "a device with 1,000 ports",
    ] {
        let tmp = tempfile::Builder::new().prefix("nicmon-hostile-").tempdir()?;
        let node = Platform::DgxH100.build_at(tmp.path());
        let state = tmp.path().join("state.json");
        let kmsg = tmp.path().join("kmsg.log");
        std::fs::write(&kmsg, "")?;
        let mut sink = vec!["--sink".to_string(), "file:/dev/null".to_string()];
        match case {
            "100 MB state file" => {
                write_repeated(&state, MB100, |i| if i == 0 { "{\"outbox\": [\"".into() } else { "x".repeat(4096) })?;
            }
            "/dev/zero for every port file and the state file" => {
                for dev in node.pfs() {
                    let ports = node.sys().join(format!("class/infiniband/{dev}/ports/1"));
                    for f in
                        ["state", "phys_state", "rate", "link_layer", "counters/link_downed", "counters/symbol_error"]
                    {
                        let p = ports.join(f);
                        let _ = std::fs::remove_file(&p);
                        std::os::unix::fs::symlink("/dev/zero", &p)?;
                    }
                }
                std::os::unix::fs::symlink("/dev/zero", &state)?;
            }
            "a device with 1,000 ports" => thousand_ports(&node)?,
            _ => {
                full_outbox_state(&node, &state)?;
                // Kernel log records that match, on every card, with sequence numbers.
                let bdfs: Vec<String> = node.pfs().iter().map(|d| node.info[d].bdf.clone()).collect();
                write_repeated(&kmsg, MB100, |i| {
                    let bdf = &bdfs[i % bdfs.len()];
                    format!(
                        "3,{},{},-;mlx5_core {bdf}: poll_health:795:(pid 0): Fatal error detected\n SUBSYSTEM=pci\n DEVICE=+pci:{bdf}\n",
                        i + 1,
                        i * 10
                    )
                })?;
                // The connector is down for the whole case.
                sink =
                    vec!["--platform-connector-socket".into(), format!("unix://{}/absent.sock", tmp.path().display())];
            }
        }
        let mut d = node
            .run_command(bin, "state.json", "bench")
            .args(["--metrics-port", "0", "--kmsg-path"])
            .arg(&kmsg)
            .args(&sink)
            .args(["--state-polling-interval", "200ms"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nicmon run")?;
        let pid = d.id();
        // The measurement window: until the kernel log file is read to its end (60 s at
        // most), then 5 s of polls.
        let size = std::fs::metadata(&kmsg)?.len();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) && fd_pos(pid, &kmsg).unwrap_or(size) < size {
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_secs(5));
        let alive = d.try_wait()?.is_none();
        let hwm = if alive { proc_kib(pid, "VmHWM:")? as f64 / 1024.0 } else { f64::NAN };
        let read = fd_pos(pid, &kmsg);
        let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        let _ = d.wait();
        if !alive {
            bail!("hostile case {case}: the daemon exited");
        }
        println!(
            "daemon peak RSS, {case}: {hwm:.1} MiB   [bar: <= 32 MiB]{}",
            if size > 0 {
                format!(" (kernel log read to {} of {size} bytes)", read.unwrap_or(size))
            } else {
                String::new()
            }
        );
        worst = worst.max(hwm);
    }
    Ok(worst)
}
