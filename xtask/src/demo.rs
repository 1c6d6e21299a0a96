//! `cargo xtask demo`: the real `nicmon run` against a simulated DGX-H100-like node, a
//! local platform connector, and a scripted fault timeline — cable pull, counter burst,
//! device loss, firmware fatal in the kernel log, recovery. Prints what was detected and
//! how long after each fault.
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nicmon_tests::connector::Connector;
use nicmon_tests::platforms::Platform;

#[derive(clap::Args)]
pub struct Options {
    /// Keep the simulated node's files in this directory (default: a temporary directory).
    #[arg(long)]
    keep: Option<PathBuf>,
    /// Seconds between faults.
    #[arg(long, default_value_t = 3)]
    step: u64,
}

fn build_nicmon(root: &std::path::Path) -> Result<PathBuf> {
    eprintln!("==> building nicmon");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo).current_dir(root).args(["build", "--quiet", "-p", "nicmon"]).status()?;
    if !st.success() {
        bail!("cargo build -p nicmon failed");
    }
    Ok(root.join("target/debug/nicmon"))
}

fn kmsg_writable() -> bool {
    std::fs::OpenOptions::new().write(true).open("/dev/kmsg").is_ok()
}

pub fn run(opts: &Options) -> Result<()> {
    let root = crate::build_ebpf::repo_root()?;
    let bin = build_nicmon(&root)?;
    let tmp = tempfile::Builder::new().prefix("nicmon-demo-").tempdir()?;
    let dir = opts.keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let node = Platform::DgxH100.build_at(&dir.join("node"));
    let conn = Connector::start(&dir.join("nvsentinel.sock"));
    let kmsg = kmsg_writable();
    println!("simulated node: DGX-H100-like (8 IB compute NICs, 4 Ethernet storage NICs, 16 VFs) at {}", dir.display());
    println!("platform connector: {}", conn.target());

    let mut cmd = node.run_command(&bin, "state.json", "demo-node");
    cmd.arg("--no-metrics")
        .args(["--platform-connector-socket", &conn.target()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.join("nicmon.log"))?));
    if !kmsg {
        cmd.arg("--no-kmsg");
    }
    let mut child = cmd.spawn().context("starting nicmon run")?;
    let t0 = Instant::now();

    let baseline_ok = conn.wait_until(Duration::from_secs(30), |ev| ev.iter().filter(|e| e.is_healthy).count() >= 12);
    println!(
        "[{:>5.1}s] nicmon up: {} healthy baselines received (one per monitored port)",
        t0.elapsed().as_secs_f64(),
        conn.events().len()
    );
    if !baseline_ok {
        let _ = child.kill();
        bail!("no baselines from nicmon within 30 s: see {}/nicmon.log", dir.display());
    }

    let card_bdf = node.info["mlx5_2"].bdf.clone();
    type Ev = nicmon_proto::datamodels::HealthEvent;
    type Step<'a> = (&'a str, Box<dyn Fn() + 'a>, Box<dyn Fn(&[Ev]) -> bool + 'a>);
    let has = |dev: &'static str| {
        move |ev: &[Ev]| ev.iter().any(|e| e.entities_impacted.iter().any(|x| x.entity_value == dev) && !e.is_healthy)
    };
    let mut steps: Vec<Step> = vec![
        ("cable pull on mlx5_3 port 1", Box::new(|| node.pull_cable("mlx5_3", 1)), Box::new(has("mlx5_3"))),
        (
            "link_downed 0 -> 1 on mlx5_1 port 1",
            Box::new(|| node.set_counter("mlx5_1", 1, "counters/link_downed", 1)),
            Box::new(|ev: &[Ev]| ev.iter().any(|e| e.error_code.iter().any(|c| c == "link_downed"))),
        ),
        ("mlx5_6 falls off the PCI bus", Box::new(|| node.fall_off_bus("mlx5_6")), Box::new(has("mlx5_6"))),
    ];
    if kmsg {
        let line = format!(
            "<3>mlx5_core {card_bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count\n"
        );
        steps.push((
            "firmware fatal in the kernel log (mlx5_2's card)",
            Box::new(move || {
                if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
                    let _ = f.write_all(line.as_bytes());
                }
            }),
            Box::new(|ev: &[Ev]| ev.iter().any(|e| e.check_name == "NICKernelLogCheck")),
        ));
    } else {
        println!("(kernel log step skipped: /dev/kmsg is not writable without root)");
    }
    steps.push((
        "recovery: cable reseated, counters cleared, device back",
        Box::new(|| {
            node.repair("mlx5_3", 1);
            node.set_counter("mlx5_1", 1, "counters/link_downed", 0);
            node.restore_device("mlx5_6");
        }),
        Box::new(|ev: &[Ev]| {
            let healthy = |dev: &str| {
                ev.iter().any(|e| e.is_healthy && e.entities_impacted.iter().any(|x| x.entity_value == dev))
            };
            healthy("mlx5_6")
                && healthy("mlx5_3")
                && ev.iter().any(|e| e.is_healthy && e.error_code.iter().any(|c| c == "link_downed"))
        }),
    ));

    let mut summary = Vec::new();
    for (name, inject, detected) in &steps {
        std::thread::sleep(Duration::from_secs(opts.step)); // the timeline's pacing, not synchronisation
        let seen_before = conn.events().len();
        let at = Instant::now();
        println!("[{:>5.1}s] FAULT  {name}", t0.elapsed().as_secs_f64());
        inject();
        let ok = conn.wait_until(Duration::from_secs(15), |ev| detected(&ev[seen_before..]));
        let latency = at.elapsed();
        for e in conn.events()[seen_before..].iter() {
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
        let verdict =
            if ok { format!("detected in {:.2}s", latency.as_secs_f64()) } else { "NOT detected within 15 s".into() };
        println!("          {verdict}");
        summary.push((name.to_string(), ok, latency));
    }

    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = child.wait()?;
    println!("\nsummary ({} events received by the connector, nicmon exited {}):", conn.events().len(), status);
    for (name, ok, lat) in &summary {
        println!(
            "  {:<58} {}",
            name,
            if *ok { format!("detected after {:.2}s", lat.as_secs_f64()) } else { "MISSED".into() }
        );
    }
    println!("log: {}/nicmon.log", dir.display());
    if opts.keep.is_some() {
        let _ = tmp.keep();
    }
    if summary.iter().any(|(_, ok, _)| !ok) {
        bail!("some faults were not detected");
    }
    Ok(())
}
