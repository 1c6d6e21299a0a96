//! The `nicmon` command line.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use nicmon::check::{self, CheckArgs};

#[derive(Parser)]
#[command(
    name = "nicmon",
    version,
    about = "NIC health monitor for GPU nodes: RDMA (InfiniBand/RoCE) ports, counters and kernel log",
    long_about = "nicmon watches a node's NVIDIA/Mellanox InfiniBand and RoCE NICs, decides for each port \
whether a running job will fail because of it, and reports health events to NVSentinel's platform \
connector (gRPC) or, standalone, as JSON lines and Prometheus metrics.\n\n\
Start with `nicmon check` to see what nicmon sees on this node, and `nicmon topology` for why each NIC \
got its role.",
    after_help = "Exit status: 0 when the command ran (whatever the health found), 2 on bad flags, \
config or (with --metadata-required) metadata."
)]
struct Cli {
    /// Log as JSON lines instead of text (logs go to stderr).
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Poll once, evaluate, print and exit (with --state-file: exactly one daemon cycle).
    #[command(long_about = "Poll the node once, classify every NIC, evaluate health and print the result.\n\n\
With --state-file, one invocation is exactly one poll cycle of the daemon: load state, poll, \
evaluate, print, save — successive invocations replay a timeline (use --now to set the clock).\n\n\
Examples:\n  nicmon check\n  nicmon check --format json\n  nicmon check --sysfs /tmp/node/sys --procfs /tmp/node/proc \\\n      --state-file /tmp/state.json --now 2026-01-01T00:00:10Z --format json")]
    Check(CheckCli),
    /// Print each NIC's role (compute, storage, management) and why.
    Topology(TopologyCli),
    /// Print the version and whether the eBPF programs are built in.
    Version,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(clap::Args)]
struct HostArgs {
    /// Root of sysfs: class/infiniband, class/net, bus/pci/devices are read under it.
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    sysfs: PathBuf,
    /// Root of procfs: net/route and sys/kernel/random/boot_id are read under it.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    procfs: PathBuf,
    /// GPU metadata written by NVSentinel's metadata collector. Missing, unreadable or
    /// empty → the topology is derived from sysfs (with a warning).
    #[arg(long, alias = "metadata-path", value_name = "FILE", default_value = nicmon::check::DEFAULT_METADATA_PATH)]
    metadata: PathBuf,
    /// Fail (exit 2) instead of falling back to sysfs when the metadata cannot be used
    /// (the seed design's fail-fast behaviour).
    #[arg(long)]
    metadata_required: bool,
    /// TOML config (NVSentinel ConfigMap keys). Missing → defaults; invalid → exit 2.
    #[arg(long, value_name = "FILE", default_value = nicmon::config::DEFAULT_PATH)]
    config: PathBuf,
}

#[derive(clap::Args)]
struct CheckCli {
    #[command(flatten)]
    host: HostArgs,
    /// State file: load before the poll, save after (one daemon cycle per invocation).
    #[arg(long, value_name = "FILE")]
    state_file: Option<PathBuf>,
    /// Boot ID file [default: <procfs>/sys/kernel/random/boot_id].
    #[arg(long, value_name = "FILE")]
    boot_id_path: Option<PathBuf>,
    /// Node name stamped on events [default: $NODE_NAME, else the host name].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// The time of this poll, RFC 3339 (replay and tests) [default: the wall clock].
    #[arg(long, value_name = "RFC3339")]
    now: Option<String>,
    /// Kernel log records (/dev/kmsg format or plain lines) that arrived since the last poll.
    #[arg(long, value_name = "FILE")]
    kmsg: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(clap::Args)]
struct TopologyCli {
    #[command(flatten)]
    host: HostArgs,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    nicmon::logging::init(cli.log_json);
    let result = match cli.command {
        Command::Check(c) => check::run_check(&CheckArgs {
            sysfs: c.host.sysfs,
            procfs: c.host.procfs,
            metadata: Some(c.host.metadata),
            metadata_required: c.host.metadata_required,
            config: c.host.config,
            state_file: c.state_file,
            boot_id_path: c.boot_id_path,
            node_name: c.node_name,
            now: c.now,
            kmsg: c.kmsg,
            json: matches!(c.format, Format::Json),
        }),
        Command::Topology(t) => check::run_topology(
            &t.host.sysfs,
            &t.host.procfs,
            &t.host.metadata,
            t.host.metadata_required,
            &t.host.config,
            matches!(t.format, Format::Json),
        ),
        Command::Version => {
            println!("nicmon {}", env!("CARGO_PKG_VERSION"));
            Ok(String::new())
        }
    };
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nicmon: {e}");
            ExitCode::from(2)
        }
    }
}
