//! `cargo xtask bench`: the performance bars of SPEC §3 on the DGX-H100-like testbed node
//! (12 PFs, 16 VFs, ~2,000 sysfs files):
//! - one full poll (read + evaluate), median and p99 over many polls, release build;
//! - the daemon at a 1 s interval over a measured window: CPU share of one core (utime +
//!   stime from `/proc/<pid>/stat`), peak RSS (`VmHWM`) and state-file writes (its debug
//!   log line per write).
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nicmon_tests::platforms::Platform;

#[derive(clap::Args)]
pub struct Options {
    /// Seconds the daemon is measured for.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Polls timed for the poll-duration figure.
    #[arg(long, default_value_t = 2000)]
    polls: usize,
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
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

fn proc_cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("bad /proc stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state(0) ... utime(11) stime(12).
    Ok(f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?)
}

fn proc_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(key)).with_context(|| format!("{key} not in status"))?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::build_ebpf::repo_root()?;
    eprintln!("==> building nicmon (release)");
    let st =
        Command::new(cargo()).current_dir(&root).args(["build", "--release", "--quiet", "-p", "nicmon"]).status()?;
    if !st.success() {
        bail!("cargo build --release -p nicmon failed");
    }
    let bin = root.join("target/release/nicmon");
    let tmp = tempfile::Builder::new().prefix("nicmon-bench-").tempdir()?;
    let node = Platform::DgxH100.build_at(tmp.path());
    let files = count_files(&node.sys());
    println!("node: DGX-H100-like testbed, 12 PFs + 16 VFs, {files} files under sys/");

    // 1. Poll duration, in-process and in release mode.
    let st = Command::new(cargo())
        .current_dir(&root)
        .args(["bench", "--quiet", "-p", "nicmon", "--bench", "poll"])
        .env("NICMON_BENCH_POLLS", opts.polls.to_string())
        .output()?;
    let out = String::from_utf8_lossy(&st.stdout);
    print!("{out}");
    if !st.status.success() {
        bail!("cargo bench -p nicmon --bench poll failed: {}", String::from_utf8_lossy(&st.stderr));
    }
    let ratio: f64 = out
        .split("poll / floor = ")
        .nth(1)
        .and_then(|r| r.split('x').next())
        .and_then(|v| v.parse().ok())
        .context("no poll / floor ratio in the bench output")?;
    let median_ms: f64 = out
        .split("median ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no median in the bench output")?;

    // 2. Steady-state CPU and RSS at the default 1 s interval.
    let log_path = tmp.path().join("daemon.log");
    let mut d = node
        .run_command(&bin, "state-b.json", "bench")
        .args(["--no-kmsg", "--sink", "file:/dev/null", "--metrics-port", "0"])
        .env("RUST_LOG", "warn,nicmon::state=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()
        .context("starting nicmon run")?;
    let pid = d.id();
    std::thread::sleep(Duration::from_secs(3)); // start-up (topology, first poll) is excluded
    let hz = 100.0; // USER_HZ on Linux
    let t0 = Instant::now();
    let writes = || std::fs::read_to_string(&log_path).unwrap_or_default().matches("state file written").count();
    let w0 = writes();
    let c0 = proc_cpu_ticks(pid)?;
    for i in 0..opts.seconds {
        std::thread::sleep(Duration::from_secs(1)); // the measurement window itself
        eprint!("\r  measuring daemon CPU/RSS: {}/{} s", i + 1, opts.seconds);
    }
    eprintln!();
    let c1 = proc_cpu_ticks(pid)?;
    let w1 = writes();
    let wall = t0.elapsed().as_secs_f64();
    let rss = proc_kib(pid, "VmRSS:")?;
    let hwm = proc_kib(pid, "VmHWM:")?;
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = d.wait();
    let cpu_pct = (c1 - c0) as f64 / hz / wall * 100.0;
    println!(
        "daemon at 1 s interval over {wall:.0} s: CPU {cpu_pct:.3} % of one core   [bar: <= 0.5 %]\n\
         daemon RSS: {:.1} MiB now, {:.1} MiB peak   [bar: <= 16 MiB]\n\
         state file writes: {} in {wall:.0} s ({:.2}/min)   [bar: <= 1/min]",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        w1 - w0,
        (w1 - w0) as f64 / wall * 60.0
    );
    let writes_per_min = (w1 - w0) as f64 / wall * 60.0;
    let ok = median_ms <= 2.0 && ratio <= 0.5 && cpu_pct <= 0.5 && hwm as f64 / 1024.0 <= 16.0 && writes_per_min <= 1.0;
    println!("{}", if ok { "all bars met" } else { "SOME BARS NOT MET" });
    Ok(())
}
