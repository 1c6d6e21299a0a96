//! The `nicmon` command line.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use nicmon::check::{self, CheckArgs};
use nicmon::daemon::RunOptions;
use nicmon::event::{ProcessingStrategy, Stamp};
use nicmon::wake::WakeOptions;

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
    /// Run the monitor: poll every interval and on every wake-up, report health events.
    #[command(long_about = "Run the monitor (the DaemonSet's command). Every --state-polling-interval (and at once \
on every eBPF/rtnetlink/kernel-log wake-up) it polls sysfs, evaluates the state, counter and kernel-log checks, \
queues the resulting events in the state file's outbox and sends them to the sink in order. SIGTERM/SIGINT finish \
the cycle, flush and save.\n\nAccepts the flags of NVSentinel's nic-health-monitor unchanged.\n\nExamples:\n  \
nicmon run --node-name gpu-node-1\n  nicmon run --sink stdout --state-file /tmp/nicmon-state.json --metrics-port 9112")]
    Run(Box<RunCli>),
    /// Trace mode for latency debugging: run the monitor and print every wake-up and poll.
    #[command(long_about = "Run the monitor in trace mode: for every wake-up print the hook, the kernel timestamp, \
when the agent woke, how long the poll took, the events it produced and the latencies between them; on exit \
(Ctrl-C) print per-hook counts and p50/p99 latencies. Takes the same flags as `nicmon run`, with the same \
defaults: next to a running daemon give it its own --state-file, a --metrics-port (or --no-metrics) and a --sink \
(e.g. file:/tmp/nicmon-trace.jsonl), or it would share the daemon's state and report the same events twice.\n\n\
Example (next to the DaemonSet's daemon):\n  nicmon trace --state-file /tmp/trace-state.json --no-metrics --sink \
file:/tmp/nicmon-trace.jsonl")]
    Trace(Box<RunCli>),
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
struct RunCli {
    #[command(flatten)]
    host: HostArgs,
    /// Comma-separated checks to run; unknown names are logged and skipped.
    #[arg(
        long,
        default_value = "InfiniBandStateCheck,InfiniBandDegradationCheck,EthernetStateCheck,EthernetDegradationCheck,EFADegradationCheck,InfiniBandCharDeviceCheck,NICKernelLogCheck"
    )]
    checks: String,
    /// Poll interval (e.g. 1s, 500ms). Counters are evaluated at least every second.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    state_polling_interval: std::time::Duration,
    /// Persistent state file (hostPath): port states, counter snapshots, kmsg cursor, outbox.
    #[arg(long, value_name = "FILE", default_value = nicmon::state::DEFAULT_PATH)]
    state_file: PathBuf,
    /// Boot ID file [default: <procfs>/sys/kernel/random/boot_id].
    #[arg(long, value_name = "FILE")]
    boot_id_path: Option<PathBuf>,
    /// Processing strategy stamped on events.
    #[arg(long, default_value = "EXECUTE_REMEDIATION", value_parser = parse_strategy)]
    processing_strategy: ProcessingStrategy,
    /// Node name stamped on events [default: $NODE_NAME, else the host name].
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node_name: Option<String>,
    #[command(flatten)]
    dispatch: nicmon::dispatch::DispatchArgs,
    #[command(flatten)]
    metrics: nicmon::metrics::MetricsArgs,
    /// Do not serve /metrics and /healthz.
    #[arg(long)]
    no_metrics: bool,
    /// Kernel log device to watch. A FIFO is also followed (records or plain lines written
    /// into it, to replay a log into a running daemon); a regular file is not.
    #[arg(long, value_name = "FILE", default_value = "/dev/kmsg")]
    kmsg_path: PathBuf,
    /// Do not watch the kernel log.
    #[arg(long)]
    no_kmsg: bool,
    /// Do not load the eBPF programs (rtnetlink and polling only).
    #[arg(long)]
    no_ebpf: bool,
    /// Do not listen to rtnetlink link notifications.
    #[arg(long)]
    no_rtnetlink: bool,
    /// No wake-up sources at all: polling only.
    #[arg(long)]
    no_wake: bool,
    /// Check the flags and the config file, print the settings the daemon would run with, and
    /// exit: 0 when it would start, 2 when not. Reads only the config file (not the host).
    /// Use it on a rendered DaemonSet's arguments before a roll-out.
    #[arg(long)]
    check_config: bool,
    /// Base of the connector retry backoff (the contract's 2 s); for tests and demos.
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    connector_retry_base: Option<std::time::Duration>,
}

fn parse_strategy(s: &str) -> Result<ProcessingStrategy, String> {
    ProcessingStrategy::parse(s).ok_or_else(|| {
        format!("unknown processing strategy {s:?}: expected EXECUTE_REMEDIATION, STORE_ONLY, STORE_AND_ANALYSE or UNSPECIFIED")
    })
}

fn run_daemon(r: RunCli, trace: bool) -> anyhow::Result<String> {
    if r.check_config {
        return check_config(&r);
    }
    let mut grpc = r.dispatch.grpc_config();
    if let Some(base) = r.connector_retry_base {
        grpc.retry.initial_backoff = base;
        grpc.connect.attempts = grpc.connect.attempts.min(2);
    }
    let node = nicmon::check::node_name(r.node_name.as_deref());
    let (checks, unknown) = nicmon::daemon::parse_checks(&r.checks);
    for name in unknown {
        tracing::warn!(check = name, "unknown check name in --checks: skipped");
    }
    let opts = RunOptions {
        sysfs: r.host.sysfs,
        procfs: r.host.procfs,
        config: r.host.config,
        metadata: r.host.metadata,
        metadata_required: r.host.metadata_required,
        state_file: r.state_file,
        boot_id_path: r.boot_id_path,
        interval: r.state_polling_interval.max(std::time::Duration::from_millis(50)),
        checks,
        stamp: Stamp { node_name: node, processing_strategy: r.processing_strategy },
        sink: r.dispatch.sink,
        grpc,
        metrics_port: (!r.no_metrics).then_some(r.metrics.metrics_port),
        metrics_bind_address: r.metrics.metrics_bind_address,
        kmsg_path: (!r.no_kmsg).then_some(r.kmsg_path),
        wake: WakeOptions {
            object: if r.no_ebpf { None } else { nicmon::wake::EMBEDDED_OBJECT },
            rtnetlink: !r.no_rtnetlink,
            ..WakeOptions::default()
        },
        no_wake: r.no_wake,
        trace,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(nicmon::daemon::run(opts))?;
    Ok(String::new())
}

/// `nicmon run --check-config`: the effective settings, or the one-line reason the daemon
/// would not start. Warnings (skipped check names, unknown config keys) are listed, not fatal,
/// as they are at start-up.
fn check_config(r: &RunCli) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let config = nicmon::config::Config::load(&r.host.config)?;
    let mut warnings = config.warnings.clone();
    warnings.extend(config.path_warnings(&r.host.sysfs));
    let (checks, unknown) = nicmon::daemon::parse_checks(&r.checks);
    warnings.extend(unknown.iter().map(|name| format!("--checks: unknown check {name:?} would be skipped")));
    if checks.is_empty() {
        anyhow::bail!("--checks {:?}: no known check left to run", r.checks);
    }
    let config_state = match r.host.config.exists() {
        true => "read",
        false => "not found: defaults apply",
    };
    let on_off = |off: bool| if off { "off" } else { "on" };
    let mut out = String::new();
    let _ = writeln!(out, "config file:       {} ({config_state})", r.host.config.display());
    let names: Vec<&str> = checks.iter().map(|c| c.as_str()).collect();
    let _ = writeln!(out, "checks:            {}", names.join(","));
    let _ = writeln!(out, "poll interval:     {:?}", r.state_polling_interval);
    let _ = writeln!(out, "sysfs / procfs:    {} / {}", r.host.sysfs.display(), r.host.procfs.display());
    let _ = writeln!(out, "metadata:          {} (required: {})", r.host.metadata.display(), r.host.metadata_required);
    let _ = writeln!(out, "state file:        {}", r.state_file.display());
    let _ = writeln!(out, "sink:              {}", r.dispatch.sink);
    if matches!(r.dispatch.sink, nicmon::dispatch::SinkSpec::Grpc) {
        let _ = writeln!(out, "connector socket:  {}", r.dispatch.platform_connector_socket);
    }
    let _ = writeln!(out, "processing:        {:?}", r.processing_strategy);
    let metrics = match r.no_metrics {
        true => "off".to_string(),
        false => std::net::SocketAddr::from((r.metrics.metrics_bind_address, r.metrics.metrics_port)).to_string(),
    };
    let _ = writeln!(out, "metrics:           {metrics}");
    let kmsg = match r.no_kmsg || !config.kernel_log.enabled {
        true => "off".to_string(),
        false => r.kmsg_path.display().to_string(),
    };
    let _ = writeln!(out, "kernel log:        {kmsg}");
    let _ = writeln!(
        out,
        "wake-ups:          eBPF {}, rtnetlink {}",
        on_off(r.no_wake || r.no_ebpf),
        on_off(r.no_wake || r.no_rtnetlink)
    );
    let _ = writeln!(out, "counter rules:     {}", config.counter_rules.len());
    for w in &warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "ok: nicmon run would start with these settings");
    Ok(out)
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
        Command::Run(r) => run_daemon(*r, false),
        Command::Trace(r) => run_daemon(*r, true),
        Command::Version => Ok(format!(
            "nicmon {}\neBPF programs: {}\n",
            env!("CARGO_PKG_VERSION"),
            if nicmon::wake::EBPF_EMBEDDED {
                "built in"
            } else {
                "not built in (polling and rtnetlink only; run `cargo xtask build-ebpf` and rebuild)"
            }
        )),
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
