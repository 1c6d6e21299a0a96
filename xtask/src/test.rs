//! `cargo xtask test`: the whole test suite, with every set-up step a fresh machine needs.
//!
//! 1. build the eBPF programs (provisioning nightly rust-src and bpf-linker on first use),
//!    so the agent embeds them and the eBPF integration test runs for real;
//! 2. provision the offline Kubernetes tools for the deployment tests (`deploy-tools`);
//! 3. the Prometheus rules: `promtool check rules` and `promtool test rules`
//!    (`prometheus-rules`, which also provisions the Prometheus that
//!    tests/tests/prometheus.rs runs);
//! 4. `cargo test --workspace` (unit, property, scenario and integration tests);
//! 5. `cargo fmt --check` and `cargo clippy -D warnings` (host crates, then the eBPF crate
//!    on its own, as a workspace-wide run would unify features);
//! 6. the host's real kernel log gained no mlx5/AER/NVRM/Xid line while the tests ran
//!    (where it can be read): nothing the suite does may look like a fault to another
//!    monitor on the machine.
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct Options {
    /// Skip the eBPF build (the eBPF tests then say they are skipped).
    #[arg(long)]
    no_ebpf: bool,
    /// Skip fmt and clippy.
    #[arg(long)]
    no_lint: bool,
    /// Extra arguments for `cargo test` (after `--`).
    #[arg(last = true)]
    cargo_test_args: Vec<String>,
}

fn step(name: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("==> {name}");
    let status = cmd.status().with_context(|| format!("{name}: cannot start"))?;
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}

pub fn run(opts: &Options) -> Result<()> {
    let mut real_log = nicmon_tests::kernel_log::KernelLogWatch::start();
    let root = crate::build_ebpf::repo_root()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if !opts.no_ebpf {
        crate::build_ebpf::run(&crate::build_ebpf::Options::default())?;
    }
    crate::deploy::tools()?;
    eprintln!("==> prometheus rules");
    crate::prometheus::run()?;
    step(
        "cargo test --workspace",
        Command::new(&cargo).current_dir(&root).args(["test", "--workspace"]).args(&opts.cargo_test_args),
    )?;
    if !opts.no_lint {
        step("cargo fmt --check", Command::new(&cargo).current_dir(&root).args(["fmt", "--all", "--check"]))?;
        step(
            "cargo clippy",
            Command::new(&cargo).current_dir(&root).args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        )?;
        if !opts.no_ebpf {
            step(
                "cargo clippy (nicmon-ebpf)",
                // Through the rustup proxy with the pinned nightly toolchain, as build-ebpf builds it
                // ($CARGO is the stable cargo binary itself, which would ignore the toolchain).
                Command::new("cargo")
                    .current_dir(root.join("nicmon-ebpf"))
                    .env("RUSTUP_TOOLCHAIN", crate::build_ebpf::TOOLCHAIN)
                    .env_remove("CARGO_TARGET_DIR")
                    .env_remove("RUSTFLAGS")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS")
                    .args(["clippy", "--release", "--", "-D", "warnings"]),
            )?;
        }
    }
    eprintln!("==> the host's kernel log");
    match real_log.as_mut() {
        Ok(w) => {
            let lines = w.watched_lines();
            if !lines.is_empty() {
                bail!(
                    "the host's kernel log gained {} mlx5/AER/NVRM/Xid line(s) while the tests ran \
                     (a test, or another process on this machine, wrote them): {lines:?}",
                    lines.len()
                );
            }
            eprintln!("no new mlx5/AER/NVRM/Xid line in /dev/kmsg while the tests ran");
        }
        Err(e) => eprintln!("SKIP the kernel log check: {e}"),
    }
    eprintln!("==> all checks passed");
    Ok(())
}
