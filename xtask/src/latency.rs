//! `cargo xtask bench-latency`: detection latency, veth carrier loss → event emitted, for
//! the eBPF wake path, rtnetlink only and polling only, in one run (SPEC §3).
use std::process::Command;

use anyhow::{Result, bail};
use nicmon_tests::latency::{Mode, measure};

#[derive(clap::Args)]
pub struct Options {
    /// Faults per mode.
    #[arg(long, default_value_t = 50)]
    reps: usize,
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::build_ebpf::repo_root()?;
    crate::build_ebpf::run(&crate::build_ebpf::Options::default())?;
    eprintln!("==> building nicmon (release, eBPF built in)");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "-p", "nicmon"])
        .status()?
        .success()
    {
        bail!("cargo build --release -p nicmon failed");
    }
    let bin = root.join("target/release/nicmon");
    println!(
        "detection latency, veth carrier loss + fixture port DOWN -> event generatedTimestamp, {} faults per mode, 1 s poll interval",
        opts.reps
    );
    let mut rows = Vec::new();
    for mode in [Mode::Ebpf, Mode::Rtnetlink, Mode::Polling] {
        eprintln!("==> {} ({} faults)", mode.name(), opts.reps);
        let tag = format!("nmb{}{}", std::process::id() % 10000, &mode.name()[..1]);
        match measure(&bin, mode, opts.reps, "1s", &tag) {
            Ok(s) => {
                if mode == Mode::Ebpf {
                    for l in s.hooks_log.lines().filter(|l| l.contains("wake-up hook") || l.contains("wake-up path")) {
                        eprintln!("   {}", l.split("nicmon::daemon: ").nth(1).unwrap_or(l));
                    }
                }
                rows.push((mode, s.percentile(0.5), s.percentile(0.99), s.ms.len()));
            }
            Err(e) => bail!("{}: {e}", mode.name()),
        }
    }
    println!("{:<10} {:>8} {:>10} {:>10}", "mode", "faults", "p50 ms", "p99 ms");
    for (mode, p50, p99, n) in &rows {
        println!("{:<10} {:>8} {:>10.2} {:>10.2}", mode.name(), n, p50, p99);
    }
    let (_, p50, p99, _) = rows[0];
    println!(
        "eBPF path: p50 {p50:.2} ms [bar <= 5], p99 {p99:.2} ms [bar <= 25]: {}",
        if p50 <= 5.0 && p99 <= 25.0 { "met" } else { "NOT met" }
    );
    Ok(())
}
