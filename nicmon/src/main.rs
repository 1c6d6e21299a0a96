//! The `nicmon` command line.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use nicmon::cli::check::{self, CheckArgs};
use nicmon::daemon::RunOptions;
use nicmon::model::event::{Check, ProcessingStrategy, Stamp};
use nicmon::monitor::MonitorOptions;
use nicmon::read::paths::{HostPaths, PathInputs};
use nicmon::read::wake::WakeOptions;

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
    after_help = "Flags without a subcommand run the monitor: `nicmon --node-name n1` is `nicmon run --node-name n1`.\n\n\
Exit status: 0 when the command ran (whatever the health found), 2 on bad flags, \
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
the cycle, flush and save. Next to the state file, `<state file>.sent` holds the batches sent since the last save \
(a crash between the two resends them at the next start); keep both in the same directory.\n\nAccepts the flags of NVSentinel's nic-health-monitor unchanged (retired ones with a \
warning), and `nicmon --flags…` without a subcommand is `nicmon run --flags…`, as upstream's chart invokes it.\n\nExamples:\n  \
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
    /// Capture what nicmon reads on this node into one archive, to replay anywhere.
    #[command(long_about = "Capture a support bundle: one .tar.gz holding every host file nicmon reads on this \
node (the class trees, the PCI attributes and links it follows, net/route, boot_id; symlinks kept as symlinks, \
unreadable and EINVAL files recorded so a replay fails the same way), the metadata file, the config, the state \
file, the kernel-log records of the last 24 h that a pattern matches or that name a NIC, `nicmon version`, the \
running daemon's wake-up hook status, and a manifest. Token files are never included. Bounded: a file whose \
read does not finish within --file-timeout is skipped and listed in the manifest.\n\n\
Replay it anywhere with `nicmon check --bundle FILE [--now T]` or `nicmon topology --bundle FILE`.\n\n\
Examples:\n  nicmon bundle\n  kubectl exec -n nvsentinel POD -- nicmon bundle --sysfs /nvsentinel/sys \\\n      \
--procfs /nvsentinel/proc --state-file /var/lib/nicmon/state.json -o - > node.tar.gz")]
    Bundle(Box<BundleCli>),
    /// Print the ports' last transitions as a timeline, from the state file.
    #[command(long_about = "Print the last transitions of every port (or of NIC, or NIC/PORT) from the state \
file, oldest first, to the millisecond: the state and phys_state seen, what was published (reported, held by \
portStateHoldDown, a blip the hold-down swallowed, held as flapping, no event) and the wake-up that made the \
poll that saw it (or the interval's poll). The state file keeps the last 64 transitions per port, across \
reboots.\n\nExamples:\n  nicmon history\n  nicmon history mlx5_3/1 --state-file /var/lib/nicmon/state.json\n  \
nicmon history --bundle node.tar.gz --format json")]
    History(HistoryCli),
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
    /// Root of sysfs: class/infiniband, class/net, bus/pci/devices are read under it
    /// [default: the root above the config's sysClassInfinibandPath/sysClassNetPath, else /sys].
    #[arg(long, value_name = "DIR")]
    sysfs: Option<PathBuf>,
    /// Root of procfs: net/route and sys/kernel/random/boot_id are read under it [default: the
    /// --boot-id-path prefix (…/proc/sys/kernel/random/boot_id), else /nvsentinel/proc if present, else /proc].
    #[arg(long, value_name = "DIR")]
    procfs: Option<PathBuf>,
    /// GPU metadata written by NVSentinel's metadata collector. Missing, unreadable or
    /// empty → the topology is derived from sysfs (with a warning).
    #[arg(long, alias = "metadata-path", value_name = "FILE", default_value = nicmon::cli::check::DEFAULT_METADATA_PATH)]
    metadata: PathBuf,
    /// Fail (exit 2) instead of falling back to sysfs when the metadata cannot be used
    /// (the seed design's fail-fast behaviour).
    #[arg(long)]
    metadata_required: bool,
    /// TOML config (NVSentinel ConfigMap keys). Missing → defaults; invalid → exit 2.
    #[arg(long, value_name = "FILE", default_value = nicmon::config::DEFAULT_PATH)]
    config: PathBuf,
    /// Read the RoCE ports' ethtool data (FEC, pause, driver statistics) from
    /// DIR/<netdev>.json instead of the kernel; a missing file = not supported
    /// [default: the kernel when --sysfs is the live sysfs, else none].
    #[arg(long, value_name = "DIR")]
    ethtool_replay: Option<PathBuf>,
    /// Read the NICs' devlink health reporters from DIR/<PCI address>.json instead of the
    /// kernel; a missing file = not supported [default: the kernel when --sysfs is the live
    /// sysfs, else none].
    #[arg(long, value_name = "DIR")]
    devlink_replay: Option<PathBuf>,
}

#[derive(clap::Args)]
struct CheckCli {
    #[command(flatten)]
    host: HostArgs,
    /// Comma-separated checks to run; unknown names are logged and skipped.
    #[arg(long, default_value_t = Check::all_names())]
    checks: String,
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
    #[arg(long, value_name = "RFC3339", value_parser = check::parse_now)]
    now: Option<time::OffsetDateTime>,
    /// Kernel log records (/dev/kmsg format or plain lines) that arrived since the last poll.
    #[arg(long, value_name = "FILE")]
    kmsg: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Replay a support bundle (`nicmon bundle`) instead of reading this host: its trees,
    /// metadata, config and state (on a copy), at --now.
    #[arg(long, value_name = "FILE", conflicts_with_all = BUNDLE_CONFLICTS)]
    bundle: Option<PathBuf>,
    /// With --bundle: also feed the bundle's kernel-log records (as --kmsg would).
    #[arg(long, requires = "bundle", conflicts_with = "kmsg")]
    bundle_kmsg: bool,
}

#[derive(clap::Args)]
struct HistoryCli {
    /// A NIC (all its ports) or NIC/PORT [default: every port].
    #[arg(value_name = "NIC[/PORT]")]
    port: Option<String>,
    /// The state file to read.
    #[arg(long, value_name = "FILE", default_value = nicmon::act::state::DEFAULT_PATH, conflicts_with = "bundle")]
    state_file: PathBuf,
    /// Read the state file of a support bundle (`nicmon bundle`) instead.
    #[arg(long, value_name = "FILE")]
    bundle: Option<PathBuf>,
    /// Output format (json: the transitions by `NIC/PORT`).
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// The host-path flags a bundle replaces.
const BUNDLE_CONFLICTS: [&str; 6] = ["sysfs", "procfs", "metadata", "config", "state_file", "boot_id_path"];

#[derive(clap::Args)]
struct BundleCli {
    #[command(flatten)]
    host: HostArgs,
    /// State file to include.
    #[arg(long, value_name = "FILE", default_value = nicmon::act::state::DEFAULT_PATH)]
    state_file: PathBuf,
    /// Boot ID file [default: <procfs>/sys/kernel/random/boot_id].
    #[arg(long, value_name = "FILE")]
    boot_id_path: Option<PathBuf>,
    /// Node name recorded in the bundle [default: $NODE_NAME, else the host name].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Kernel log to take the matched records of (the device, or a file of records).
    #[arg(long, value_name = "FILE", default_value = "/dev/kmsg")]
    kmsg_path: PathBuf,
    /// Do not include kernel log records.
    #[arg(long)]
    no_kmsg: bool,
    /// Port of the running daemon's /metrics on 127.0.0.1, for the wake-up hooks' status.
    #[arg(long, default_value_t = nicmon::act::metrics::DEFAULT_PORT, value_name = "PORT")]
    metrics_port: u16,
    /// Do not ask the running daemon for its wake-up hooks' status.
    #[arg(long)]
    no_metrics: bool,
    /// Where to write the bundle; `-` writes it to stdout
    /// [default: /tmp/nicmon-bundle-<node>-<time>.tar.gz].
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Skip a file whose read has not finished after this long (listed in the manifest).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    file_timeout: std::time::Duration,
    /// Time budget of the whole capture.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
}

#[derive(clap::Args)]
struct RunCli {
    #[command(flatten)]
    host: HostArgs,
    /// Comma-separated checks to run; unknown names are logged and skipped.
    #[arg(long, default_value_t = Check::all_names())]
    checks: String,
    /// Poll interval (e.g. 1s, 500ms; 50ms to 1h). Counters are evaluated at least every second.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    state_polling_interval: std::time::Duration,
    /// Persistent state file (hostPath): port states, counter snapshots, kmsg cursor, outbox.
    #[arg(long, value_name = "FILE", default_value = nicmon::act::state::DEFAULT_PATH)]
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
    dispatch: nicmon::act::dispatch::DispatchArgs,
    #[command(flatten)]
    metrics: nicmon::act::metrics::MetricsArgs,
    /// Do not serve /metrics and /healthz.
    #[arg(long)]
    no_metrics: bool,
    /// Kernel log device to watch. A FIFO or a regular file of records or plain lines is
    /// also followed (replays, or a log another agent writes): a file from its end, like
    /// `tail -F`.
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
    /// Do not listen to kobject uevents (device add/remove, SPEC §1.15).
    #[arg(long)]
    no_uevent: bool,
    /// Do not listen to the RDMA netlink monitor (device register/unregister, netdev
    /// attach/detach; kernel 6.12+, SPEC §1.15).
    #[arg(long)]
    no_rdma_monitor: bool,
    /// Do not listen to devlink notifications (health reporter state changes and
    /// recoveries, devlink instances registered/unregistered; SPEC §1.15).
    #[arg(long)]
    no_devlink_monitor: bool,
    /// No wake-up sources at all: polling only.
    #[arg(long)]
    no_wake: bool,
    /// Check the flags and the config file, print the settings the daemon would run with, and
    /// exit: 0 when it would start, 2 when not. Reads only the config file (not the host).
    /// Use it on a rendered DaemonSet's arguments before a roll-out.
    #[arg(long)]
    check_config: bool,
    /// Poll-stall watchdog (NVSentinel's NICPollStallCheck): once a poll has been in flight
    /// this long (a host read hanging), one node-level NICPollStallCheck event is sent
    /// (unhealthy, non-fatal, action NONE), and a healthy one when polls complete again (and
    /// after the first poll). Go duration; 0s disables [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = nicmon::config::upstream::go_duration)]
    poll_stall_deadline: Option<std::time::Duration>,
    /// Send NICPollStallCheck events as STORE_ONLY (else with --processing-strategy).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = nicmon::config::upstream::go_bool)]
    poll_stall_store_only: Option<bool>,
    #[command(flatten)]
    retired: nicmon::config::upstream::RetiredFlags,
    /// Base of the connector retry backoff (the contract's 2 s); for tests and demos.
    #[arg(long, hide = true, value_parser = parse_retry_base)]
    connector_retry_base: Option<std::time::Duration>,
}

/// A duration flag within `[min, max]` (clap exits 2 with this message otherwise).
/// A duration flag: Go syntax (upstream's chart: `1s`, `1m30s`), else humantime's (`2 minutes`),
/// within `min..=max`.
fn parse_duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = nicmon::config::upstream::go_duration(s)
        .or_else(|_| humantime::parse_duration(s))
        .map_err(|e| format!("{s:?}: {e} (expected e.g. 1s, 500ms)"))?;
    if d < min || d > max {
        return Err(format!(
            "{s:?} is out of range: expected {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration_in(s, Duration::from_millis(50), Duration::from_secs(3600))
}

fn parse_retry_base(s: &str) -> Result<Duration, String> {
    parse_duration_in(s, Duration::from_millis(1), Duration::from_secs(60))
}

fn parse_strategy(s: &str) -> Result<ProcessingStrategy, String> {
    ProcessingStrategy::parse(s).ok_or_else(|| {
        format!("unknown processing strategy {s:?}: expected EXECUTE_REMEDIATION, STORE_ONLY, STORE_AND_ANALYSE or UNSPECIFIED")
    })
}

impl RunCli {
    /// Warnings about flags that are accepted but change nothing.
    fn flag_warnings(&self) -> Vec<String> {
        self.retired.warning().into_iter().collect()
    }

    /// The poll-stall watchdog's settings (upstream's chart default deadline when not given).
    fn poll_stall(&self) -> nicmon::daemon::PollStall {
        nicmon::daemon::PollStall {
            deadline: self.poll_stall_deadline.unwrap_or(nicmon::act::stall::DEFAULT_DEADLINE),
            store_only: self.poll_stall_store_only.unwrap_or(false),
        }
    }

    /// The node name stamped on events. The platform connector files events under it (and
    /// with token auth rejects a batch for another node), so the gRPC sink needs it given
    /// (as upstream's monitor does); the JSON-lines sinks fall back to the host name.
    fn node_name(&self) -> anyhow::Result<String> {
        match self.node_name.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
            Some(n) => Ok(n.to_string()),
            None if matches!(self.dispatch.sink, nicmon::act::dispatch::SinkSpec::Grpc) => anyhow::bail!(
                "--node-name (or the NODE_NAME environment variable) is required with --sink grpc: the platform \
                 connector files every event under the node name (in a DaemonSet set NODE_NAME from spec.nodeName)"
            ),
            None => Ok(nicmon::cli::check::node_name(None)),
        }
    }

    /// The gRPC sink's settings: the socket flags, or direct publishing when
    /// HEALTH_PUBLISH_TARGET is set (its companions checked now, as upstream does at start-up).
    fn grpc_config(&self) -> anyhow::Result<nicmon::act::dispatch::GrpcConfig> {
        let mut grpc = self.dispatch.grpc_config();
        grpc.direct = nicmon::act::dispatch::DirectConfig::from_process_env()?;
        if grpc.direct.is_some() && !matches!(self.dispatch.sink, nicmon::act::dispatch::SinkSpec::Grpc) {
            tracing::warn!(sink = %self.dispatch.sink, "HEALTH_PUBLISH_TARGET ignored: events go to the --sink given");
            grpc.direct = None;
        }
        if let Some(base) = self.connector_retry_base {
            grpc.retry.initial_backoff = base;
            grpc.connect.attempts = grpc.connect.attempts.min(2);
            if let Some(d) = grpc.direct.as_mut() {
                d.initial_backoff = base;
            }
        }
        Ok(grpc)
    }
}

fn run_daemon(r: RunCli, trace: bool) -> anyhow::Result<String> {
    if r.check_config {
        return check_config(&r);
    }
    let node = r.node_name()?;
    for w in r.flag_warnings() {
        tracing::warn!("{w}");
    }
    let grpc = r.grpc_config()?;
    if let Some(d) = &grpc.direct {
        let tls = matches!(d.transport, nicmon::act::dispatch::direct::Transport::Tls { .. });
        tracing::info!(target = %d.authority, tls, "publishing directly to the deployment platform connector");
    }
    let poll_stall = r.poll_stall();
    let opts = RunOptions {
        monitor: monitor_options(
            r.host,
            &r.checks,
            r.boot_id_path,
            Stamp { node_name: node, processing_strategy: r.processing_strategy },
        )?,
        state_file: r.state_file,
        interval: r.state_polling_interval,
        sink: r.dispatch.sink,
        grpc,
        metrics_port: (!r.no_metrics).then_some(r.metrics.metrics_port),
        metrics_bind_address: r.metrics.metrics_bind_address,
        kmsg_path: (!r.no_kmsg).then_some(r.kmsg_path),
        wake: WakeOptions {
            object: if r.no_ebpf { None } else { nicmon::read::wake::EMBEDDED_OBJECT },
            rtnetlink: !r.no_rtnetlink,
            uevent: !r.no_uevent,
            rdma_monitor: !r.no_rdma_monitor,
            devlink_monitor: !r.no_devlink_monitor,
            ..WakeOptions::default()
        },
        no_wake: r.no_wake,
        trace,
        poll_stall,
    };
    // Asked before any thread starts: they all inherit it (see nicmon::read::sched).
    match nicmon::read::sched::request_slice(nicmon::read::sched::DAEMON_SLICE) {
        Ok(Some(slice)) => tracing::info!(?slice, "scheduler: a short time slice for the daemon's threads"),
        Ok(None) => {
            tracing::info!("scheduler: this kernel keeps no time slice per task (Linux < 6.12): default slices")
        }
        Err(e) => tracing::warn!(error = %e, "scheduler: the short time slice was refused: default slices"),
    }
    // One thread for the loop, its wake sources and the courier's sender (see
    // nicmon::daemon::runtime).
    let rt = nicmon::daemon::runtime()?;
    let result = rt.block_on(nicmon::daemon::run(opts));
    // A sink write stuck in a blocking thread (a FIFO nobody reads) must not hold the exit:
    // dropping the runtime would wait for it forever.
    rt.shutdown_timeout(std::time::Duration::from_millis(300));
    result?;
    Ok(String::new())
}

/// The host paths from the flags and the config's `sysClass*Path` keys (SPEC §1.9). The
/// config is read here only for those keys; an invalid one is the error.
fn host_paths(host: &HostArgs, boot_id_path: Option<&std::path::Path>) -> anyhow::Result<HostPaths> {
    let config = nicmon::decide::settings::Config::load(&host.config)?;
    let inputs = PathInputs {
        sysfs: host.sysfs.as_deref(),
        procfs: host.procfs.as_deref(),
        boot_id_path,
        sys_class_infiniband: config.sys_class_infiniband_path.as_deref(),
        sys_class_net: config.sys_class_net_path.as_deref(),
    };
    nicmon::read::paths::resolve(&inputs, |p| p.is_dir()).map_err(|e| anyhow::anyhow!("{}: {e}", host.config.display()))
}

/// What `check`, `run` and `trace` share; unknown `--checks` names are logged and skipped.
fn monitor_options(
    host: HostArgs,
    checks: &str,
    boot_id_path: Option<PathBuf>,
    stamp: Stamp,
) -> anyhow::Result<MonitorOptions> {
    let paths = host_paths(&host, boot_id_path.as_deref())?;
    for w in &paths.warnings {
        tracing::warn!("{w}");
    }
    Ok(monitor_options_at(host, checks, boot_id_path, stamp, Some((paths.sysfs.path, paths.procfs.path))))
}

/// [`monitor_options`] with the sysfs/procfs roots already decided (`None`: the defaults,
/// for a caller that sets them itself, such as a bundle replay).
fn monitor_options_at(
    host: HostArgs,
    checks: &str,
    boot_id_path: Option<PathBuf>,
    stamp: Stamp,
    roots: Option<(PathBuf, PathBuf)>,
) -> MonitorOptions {
    let (checks, unknown) = nicmon::daemon::parse_checks(checks);
    for name in unknown {
        tracing::warn!(check = name, "unknown check name in --checks: skipped");
    }
    let (sysfs, procfs) = roots.unwrap_or_else(|| ("/sys".into(), "/proc".into()));
    MonitorOptions {
        sysfs,
        procfs,
        config: host.config,
        metadata: Some(host.metadata),
        metadata_required: host.metadata_required,
        boot_id_path,
        checks,
        stamp,
        ethtool_replay: host.ethtool_replay,
        devlink_replay: host.devlink_replay,
    }
}

/// `nicmon run --check-config`: the effective settings, or the one-line reason the daemon
/// would not start. Warnings (skipped check names, unknown config keys) are listed, not fatal,
/// as they are at start-up.
fn check_config(r: &RunCli) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let config = nicmon::decide::settings::Config::load(&r.host.config)?;
    let node = r.node_name()?;
    let grpc = r.grpc_config()?;
    let mut warnings = r.flag_warnings();
    warnings.extend(config.warnings.iter().cloned());
    let paths = host_paths(&r.host, r.boot_id_path.as_deref())?;
    warnings.extend(paths.warnings.iter().cloned());
    let (checks, unknown) = nicmon::daemon::parse_checks(&r.checks);
    warnings.extend(unknown.iter().map(|name| format!("--checks: unknown check {name:?} would be skipped")));
    if checks.is_empty() {
        anyhow::bail!("--checks {:?}: no known check left to run", r.checks);
    }
    let enabled = config.enabled_checks(&checks)?;
    warnings.extend(enabled.warning);
    let checks = enabled.checks;
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
    out.push_str(&paths.describe());
    let _ = writeln!(out, "metadata:          {} (required: {})", r.host.metadata.display(), r.host.metadata_required);
    let _ = writeln!(out, "state file:        {}", r.state_file.display());
    let _ = writeln!(out, "sink:              {}", r.dispatch.sink);
    match (&r.dispatch.sink, &grpc.direct) {
        (nicmon::act::dispatch::SinkSpec::Grpc, Some(d)) => {
            let transport = match &d.transport {
                nicmon::act::dispatch::direct::Transport::Tls { ca_file, server_name } => {
                    format!("TLS, CA {}, server name {server_name}", ca_file.display())
                }
                nicmon::act::dispatch::direct::Transport::Insecure => "plaintext (HEALTH_PUBLISH_INSECURE)".to_string(),
            };
            let _ = writeln!(out, "direct publish:    {} ({transport})", d.authority);
            let _ = writeln!(
                out,
                "  token / window:  {} / {:?}; queue {} batches / {} bytes",
                d.token.path().map(|p| p.display().to_string()).unwrap_or_default(),
                d.retry_window,
                d.queue_max_batches,
                d.queue_max_bytes
            );
        }
        (nicmon::act::dispatch::SinkSpec::Grpc, None) => {
            let _ = writeln!(out, "connector socket:  {}", r.dispatch.platform_connector_socket);
        }
        _ => {}
    }
    let _ = writeln!(out, "node name:         {node}");
    let _ = writeln!(out, "processing:        {:?}", r.processing_strategy);
    let stall = r.poll_stall();
    let stall_text = match stall.deadline.is_zero() {
        true => "off".to_string(),
        false => format!(
            "{:?}, events {:?}",
            stall.deadline,
            nicmon::act::stall::strategy(stall.store_only, r.processing_strategy)
        ),
    };
    let _ = writeln!(out, "poll stall:        {stall_text}");
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
        "wake-ups:          eBPF {}, rtnetlink {}, uevent {}, RDMA netlink monitor {}, devlink monitor {}",
        on_off(r.no_wake || r.no_ebpf),
        on_off(r.no_wake || r.no_rtnetlink),
        on_off(r.no_wake || r.no_uevent),
        on_off(r.no_wake || r.no_rdma_monitor),
        on_off(r.no_wake || r.no_devlink_monitor)
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
    /// Replay a support bundle (`nicmon bundle`) instead of reading this host.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sysfs", "procfs", "metadata", "config"])]
    bundle: Option<PathBuf>,
}

fn run_bundle(b: BundleCli) -> anyhow::Result<String> {
    use anyhow::Context;
    // The same roots the daemon reads: --sysfs/--procfs, else the config's sysClass*Path keys.
    let paths = host_paths(&b.host, b.boot_id_path.as_deref())?;
    let args = nicmon::cli::bundle::CaptureArgs {
        sysfs: paths.sysfs.path,
        procfs: paths.procfs.path,
        metadata: b.host.metadata,
        config: b.host.config,
        state_file: Some(b.state_file),
        boot_id_path: b.boot_id_path,
        node_name: b.node_name,
        kmsg: (!b.no_kmsg).then_some(b.kmsg_path),
        metrics_port: (!b.no_metrics).then_some(b.metrics_port),
        limits: nicmon::cli::bundle::Limits {
            per_file: b.file_timeout,
            total: b.timeout,
            ..nicmon::cli::bundle::Limits::default()
        },
        ethtool_replay: b.host.ethtool_replay,
        devlink_replay: b.host.devlink_replay,
    };
    let bundle = nicmon::cli::bundle::capture(&args)?;
    let m = &bundle.manifest;
    let out = b.output.unwrap_or_else(|| {
        let stamp = m.captured_at.replace([':', '-'], "");
        PathBuf::from(format!("/tmp/nicmon-bundle-{}-{stamp}.tar.gz", m.node_name))
    });
    let mut summary = String::new();
    if out.as_os_str() == "-" {
        use std::io::Write;
        std::io::stdout().write_all(&bundle.bytes).context("writing the bundle to stdout")?;
    } else {
        std::fs::write(&out, &bundle.bytes).with_context(|| format!("{}: cannot write the bundle", out.display()))?;
        summary.push_str(&format!("wrote {} ({} bytes)\n", out.display(), bundle.bytes.len()));
    }
    let counts: Vec<String> = m.entries.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let note = format!(
        "bundle of {}: {}; {} kernel log records; {} passes in {} ms{}",
        m.node_name,
        counts.join(", "),
        m.kmsg_records,
        m.passes,
        m.elapsed_ms,
        if m.complete { "" } else { " (INCOMPLETE: a bound cut it short, see manifest.json)" }
    );
    for f in &m.failures {
        tracing::warn!(path = %f.path, why = %f.why, "kept as a failure");
    }
    // With `-o -` stdout is the archive: the summary goes to the log.
    if out.as_os_str() == "-" {
        tracing::info!("{note}");
    } else {
        summary.push_str(&note);
        summary.push('\n');
    }
    Ok(summary)
}

fn run_history(h: HistoryCli) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let replay = h.bundle.as_deref().map(nicmon::cli::bundle::unpack).transpose()?;
    let path = match &replay {
        Some(r) => r.state_file().context("the bundle holds no state file")?,
        None => h.state_file,
    };
    // Streamed and bounded as it is read: `kubectl exec` runs this in the pod's memory limit.
    let history = nicmon::act::state::file::read_history(&path)
        .map_err(|e| anyhow::anyhow!("state file {}: {e}", path.display()))?
        .select(h.port.as_deref());
    Ok(match h.format {
        Format::Json => serde_json::to_string_pretty(&history).context("serialising the history")? + "\n",
        Format::Table => nicmon::model::history::timeline(&history),
    })
}

/// One malloc arena for the whole process. glibc otherwise gives threads arenas of their own
/// (up to 8 per core), each keeping the memory freed into it: a few MiB more resident under a
/// kernel-log flood (`cargo xtask bench --hostile-only`), for no speed this daemon needs.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() -> ExitCode {
    one_malloc_arena();
    // Upstream's chart passes flags only: `nicmon --flags…` is `nicmon run --flags…`.
    let cli = Cli::parse_from(nicmon::config::upstream::with_default_subcommand(std::env::args_os().collect()));
    nicmon::act::logging::init(cli.log_json);
    let result = match cli.command {
        Command::Check(c) => {
            let bundle = c.bundle.clone();
            let bundle_kmsg = c.bundle_kmsg;
            let node_flag_given = c.node_name.is_some();
            let stamp =
                Stamp { node_name: check::node_name(c.node_name.as_deref()), processing_strategy: Default::default() };
            // A replay reads the bundle's trees and config (set by replay_check), not this
            // host's paths: nothing here is resolved against the local config.
            let monitor = match &bundle {
                Some(_) => Ok(monitor_options_at(c.host, &c.checks, c.boot_id_path, stamp, None)),
                None => monitor_options(c.host, &c.checks, c.boot_id_path, stamp),
            };
            monitor
                .map(|monitor| CheckArgs {
                    monitor,
                    state_file: c.state_file,
                    now: c.now,
                    kmsg: c.kmsg,
                    json: matches!(c.format, Format::Json),
                })
                .and_then(|args| match bundle {
                    Some(b) => {
                        Ok(nicmon::cli::bundle::replay_check(&b, args, node_flag_given, bundle_kmsg, check::to_stdout)?)
                    }
                    None => Ok(check::run_check(&args, check::to_stdout)?),
                })
                .map(|()| String::new())
        }
        Command::Topology(t) if t.bundle.is_some() => nicmon::cli::bundle::replay_topology(
            t.bundle.as_deref().unwrap_or(std::path::Path::new("")),
            t.host.metadata_required,
            matches!(t.format, Format::Json),
        )
        .map_err(anyhow::Error::from),
        Command::Bundle(b) => run_bundle(*b),
        Command::Topology(t) => host_paths(&t.host, None).and_then(|paths| {
            Ok(check::run_topology(
                &paths.sysfs.path,
                &paths.procfs.path,
                &t.host.metadata,
                t.host.metadata_required,
                &t.host.config,
                matches!(t.format, Format::Json),
            )?)
        }),
        Command::Run(r) => run_daemon(*r, false),
        Command::Trace(r) => run_daemon(*r, true),
        Command::History(h) => run_history(h),
        Command::Version => Ok(nicmon::cli::bundle::version_text()),
    };
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nicmon: {e:#}");
            ExitCode::from(2)
        }
    }
}
