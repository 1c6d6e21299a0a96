//! `cargo xtask <task>`: project tasks that need more than cargo.
mod bench;
mod build_ebpf;
mod demo;
mod deploy;
mod latency;
mod measure;
mod node_exporter;
mod pollcost;
mod prometheus;
mod readfloor;
mod scale;
mod test;

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
    /// Run the whole test suite, doing all set-up a fresh machine needs (the README's test command).
    Test(test::Options),
    /// Run the real daemon against a simulated node with a scripted fault timeline and a
    /// local platform connector; print what was detected and when.
    Demo(demo::Options),
    /// Measure the performance bars (poll time, daemon CPU and RSS) on the DGX-like testbed node.
    Bench(bench::Options),
    /// Measure detection latency (veth carrier loss -> event) for eBPF, rtnetlink and polling.
    BenchLatency(latency::Options),
    /// Provision .tools/deploy-venv: Helm's engine and the Kubernetes API schemas, for the
    /// offline deployment tests (pinned in tests/deploy/requirements.txt).
    DeployTools,
    /// Check the Prometheus rules: `promtool check rules` and the project's `promtool test
    /// rules` (unpacks Debian's prometheus package into .tools/prometheus where missing).
    PrometheusRules,
    /// Regenerate the derived files: deploy/manifests/*.yaml (the chart rendered), the chart's
    /// copy of the Prometheus rules, and the command-line reference in docs/operator-guide.md
    /// (`nicmon run --help`).
    Generate,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::BuildEbpf(opts) => build_ebpf::run(&opts),
        Task::Test(opts) => test::run(&opts),
        Task::Demo(opts) => demo::run(&opts),
        Task::Bench(opts) => bench::run(&opts),
        Task::BenchLatency(opts) => latency::run(&opts),
        Task::DeployTools => deploy::tools(),
        Task::PrometheusRules => prometheus::run(),
        Task::Generate => deploy::generate(),
    }
}
