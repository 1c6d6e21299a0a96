//! `cargo xtask <task>`: project tasks that need more than cargo.
mod build_ebpf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "nicmon project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the eBPF kernel programs (provisions nightly rust-src and bpf-linker on first use).
    BuildEbpf(build_ebpf::Options),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::BuildEbpf(opts) => build_ebpf::run(&opts),
    }
}
