//! Start-up of `nicmon run`: everything before the first poll, in named steps.
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::SignalKind;
use tokio::sync::mpsc;

use super::{Daemon, RunOptions};
use crate::act::courier::Courier;
use crate::act::dispatch::Sink;
use crate::act::metrics::Metrics;
use crate::act::metrics::server::{self as metrics_server, Liveness};
use crate::act::outbox::QueueBounds;
use crate::act::state::Loaded;
use crate::act::state::State;
use crate::model::event::Check;
use crate::monitor::Monitor;
use crate::monitor::OpenError;
use crate::read::kmsg::Delivery;
use crate::read::kmsg::KmsgTail;
use crate::read::kmsg::Start;
use crate::read::wake::{WakeOptions, WakeSource};

/// Kernel log batches handed over but not yet taken by the loop (each at most
/// [`crate::read::kmsg::MAX_BATCH_BYTES`] of text).
const KMSG_CHANNEL_BATCHES: usize = 2;

/// Why `nicmon run` could not start: what must stop the daemon. A kind that wraps a cause
/// names the operation; the cause is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The SIGTERM handler could not be installed.
    #[error(transparent)]
    Signal(std::io::Error),
    /// The shared start-up: an invalid config, no check left, unusable required metadata.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The poll-stall watchdog's thread or runtime could not be started.
    #[error("cannot start the poll stall watchdog")]
    StallWatchdog(#[source] std::io::Error),
    /// The metrics endpoint's thread could not be started (a port that cannot be bound is
    /// not this: it is logged and tried again).
    #[error("starting the metrics endpoint's thread")]
    MetricsThread(#[source] std::io::Error),
}

impl<'a> Daemon<'a> {
    /// Start-up: everything before the first poll. Fails only on what must stop the
    /// daemon (invalid config, unusable required metadata).
    pub async fn start(opts: &'a RunOptions) -> Result<Daemon<'a>, StartError> {
        // First: a SIGTERM that arrives while the daemon starts is kept and handled by the
        // loop (one last poll, flush, exit 0) instead of killing it half-started.
        let sigterm = tokio::signal::unix::signal(SignalKind::terminate()).map_err(StartError::Signal)?;
        let monitor = open_monitor(opts)?;
        let (mut state, loaded) = load_state(&opts.state_file, monitor.boot_id.as_deref());
        log_topology(&monitor);
        let metrics = Arc::new(Metrics::new(&monitor.decider.stamp.node_name));
        metrics.set_topology_source(monitor.decider.topology.source.as_str());
        let liveness = Liveness::new(opts.interval.max(Duration::from_secs(1)));
        let server = start_metrics_server(opts, &metrics, &liveness).await?;
        let wakes = if opts.no_wake { None } else { Some(start_wakes(&opts.wake, &metrics)) };
        let early_gate = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        if let Some(w) = &wakes {
            let reader = monitor.observer.host.read_waker();
            w.set_early_wake(crate::read::wake::EarlyWake {
                wake: Box::new(move || reader.wake()),
                not_before_ns: Arc::clone(&early_gate),
            });
        }
        // Bounded: a kernel log flood (or a huge file at --kmsg-path) waits in the kernel's
        // ring or the file, not in the daemon's memory.
        let (kmsg_tx, kmsg) = mpsc::channel::<Delivery>(KMSG_CHANNEL_BATCHES);
        let tail = start_kernel_log(opts, &monitor, state.checks.kmsg.last_seq, kmsg_tx, &metrics);
        let courier = start_courier(opts, &mut state, &loaded, &metrics);
        let stall = start_stall_watchdog(opts, &monitor, &metrics)?;
        let tick = super::tick::Tick::new(opts.interval.min(Duration::from_secs(1)));
        tracing::info!(node = %monitor.decider.stamp.node_name, interval = ?opts.interval, "nicmon running");
        Ok(Daemon {
            opts,
            monitor,
            state,
            loaded,
            metrics,
            liveness,
            _server: server,
            wakes,
            kmsg,
            _tail: tail,
            courier,
            sigterm,
            tick,
            hold_due: None,
            pending_records: Vec::new(),
            last_wake_poll: None,
            last_removal_poll: None,
            trailing_due: None,
            last_full_poll: None,
            burst_gap: super::wakeup::BURST_FULL_POLL_GAP,
            last_snapshot: None,
            statics_owed: BTreeSet::new(),
            kernel_removed: Default::default(),
            targeted_primed: false,
            early_gate,
            trace_latencies: Default::default(),
            lost_wakes: crate::read::wake::LostWakes::default(),
            stall,
        })
    }
}

/// The shared start-up ([`Monitor::open`]), with the daemon's first-poll deferral.
fn open_monitor(opts: &RunOptions) -> Result<Monitor, OpenError> {
    let mut monitor = Monitor::open(&opts.monitor)?;
    monitor.decider.defer_first_poll = true;
    if monitor.boot_id.is_none() {
        tracing::warn!("boot ID unreadable: reboots cannot be told from restarts");
    }
    Ok(monitor)
}

/// Say where the roles come from and how many RDMA devices there are.
fn log_topology(monitor: &Monitor) {
    let devices = monitor.observer.host.list_sys("class/infiniband").len();
    tracing::info!(
        source = monitor.decider.topology.source.as_str(),
        gpus = monitor.decider.topology.gpus.len(),
        devices,
        "topology"
    );
    if devices == 0 {
        tracing::warn!(
            "no RDMA devices found under {}: polling anyway",
            monitor.observer.host.sys("class/infiniband").display()
        );
    }
}

/// The `/metrics` and `/healthz` endpoint on its own thread (`None`: disabled). A port that
/// cannot be bound is logged and tried again; the monitor runs without it.
async fn start_metrics_server(
    opts: &RunOptions,
    metrics: &Arc<Metrics>,
    liveness: &Liveness,
) -> Result<Option<metrics_server::ServerThread>, StartError> {
    let Some(port) = opts.metrics_port else { return Ok(None) };
    let addr = (opts.metrics_bind_address, port).into();
    let every = metrics_server::REBIND_EVERY;
    let server = metrics_server::ServerThread::start(addr, metrics.clone(), liveness.clone(), every).await;
    Ok(Some(server.map_err(StartError::MetricsThread)?))
}

/// The kernel log watcher, when `NICKernelLogCheck` runs and a path is given (else the
/// metric says why not).
fn start_kernel_log(
    opts: &RunOptions,
    monitor: &Monitor,
    last_seq: Option<u64>,
    tx: mpsc::Sender<Delivery>,
    metrics: &Metrics,
) -> Option<KmsgTail> {
    let wanted = opts.monitor.checks.contains(&Check::NICKernelLogCheck) && monitor.decider.config.kernel_log.enabled;
    match &opts.kmsg_path {
        Some(p) if wanted => start_kmsg(p, last_seq, tx, metrics),
        _ => {
            let why = match &opts.kmsg_path {
                None => "--no-kmsg",
                Some(_) if !monitor.decider.config.kernel_log.enabled => "[kernelLog] enabled = false",
                Some(_) => "NICKernelLogCheck not in --checks",
            };
            metrics.set_kernel_log_watching(false, &format!("off: {why}"));
            None
        }
    }
}

/// The courier on the configured sink: what the journal holds is queued again, and what
/// the outbox holds is sent first.
fn start_courier(opts: &RunOptions, state: &mut State, loaded: &Loaded, metrics: &Arc<Metrics>) -> Courier {
    let sink = Sink::lazy(&opts.sink, opts.grpc.clone());
    let pause = opts.grpc.retry.initial_backoff.max(Duration::from_millis(50));
    let courier = Courier::resume(
        sink,
        &opts.state_file,
        state,
        *loaded == Loaded::Resumed,
        QueueBounds::for_sink(&opts.sink, &opts.grpc),
        metrics.clone(),
        pause,
    );
    courier.set_trace(opts.trace);
    courier
}

/// The poll-stall watchdog (`None`: `--poll-stall-deadline=0s`).
fn start_stall_watchdog(
    opts: &RunOptions,
    monitor: &Monitor,
    metrics: &Arc<Metrics>,
) -> Result<Option<crate::act::stall::Watchdog>, StartError> {
    if opts.poll_stall.deadline.is_zero() {
        tracing::info!("NIC poll stall detection off (--poll-stall-deadline=0s)");
        return Ok(None);
    }
    let stamp = crate::model::event::Stamp {
        node_name: monitor.decider.stamp.node_name.clone(),
        processing_strategy: crate::act::stall::strategy(
            opts.poll_stall.store_only,
            monitor.decider.stamp.processing_strategy,
        ),
    };
    let watchdog = crate::act::stall::Watchdog::start(
        opts.poll_stall.deadline,
        stamp,
        &opts.sink,
        opts.grpc.clone(),
        Some(metrics.clone()),
    )
    .map_err(StartError::StallWatchdog)?;
    Ok(Some(watchdog))
}

/// Load the state file for this boot, saying how it was found.
fn load_state(path: &Path, boot_id: Option<&str>) -> (State, Loaded) {
    let (st, mut loaded) = crate::act::state::file::load(path, boot_id);
    if let Loaded::Missing { reboot } = &mut loaded {
        // Upstream's rule: a missing file is a reboot (state on tmpfs, or a deleted file):
        // the first poll clears what the platform may hold and sends the baselines.
        *reboot = true;
    }
    match &loaded {
        Loaded::Corrupt(why) => tracing::warn!("{why}: starting fresh"),
        Loaded::Rebooted { .. } => tracing::info!("boot ID changed: state from the previous boot cleared"),
        Loaded::Missing { .. } => {
            tracing::info!(path = %path.display(), "no state file: treated as a reboot (clear-all, then baselines)")
        }
        Loaded::Resumed => tracing::info!(pending = st.outbox.len(), "resuming from the state file"),
        Loaded::Imported { baselines_owed } => {
            tracing::info!(baselines_owed, "imported NVSentinel's schema-v2 state file of this boot")
        }
    }
    (st, loaded)
}

/// Start the wake sources and say which hooks attached (logs and metrics).
fn start_wakes(opts: &WakeOptions, metrics: &Metrics) -> WakeSource {
    let w = WakeSource::start(opts);
    // Attaching the fentry programs builds a stand-in kernel BTF (~7 MiB, freed again;
    // nicmon/src/read/wake/btf.rs): hand that memory back to the OS instead of keeping it resident.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; no memory in use is touched.
    unsafe {
        libc::malloc_trim(0);
    }
    for h in w.hooks() {
        if let Some(via) = h.via
            && h.attached
        {
            tracing::info!(hook = h.hook.name(), via = ?via, "wake-up hook attached");
        } else {
            tracing::info!(
                hook = h.hook.name(),
                reason = h.reason.as_deref().unwrap_or("-"),
                "wake-up hook not attached"
            );
        }
        metrics.set_ebpf_hook_attached(h.hook.name(), h.attached);
    }
    if let Some(e) = w.ebpf_error() {
        tracing::warn!("eBPF unavailable: {e}");
    }
    metrics.set_ebpf(crate::read::wake::EBPF_EMBEDDED, w.mode() == crate::read::wake::WakeMode::Ebpf);
    tracing::info!(mode = w.mode().name(), "wake-up path");
    w
}

/// Start the kernel log watcher: after the persisted cursor (same boot), else at the end.
fn start_kmsg(path: &Path, last_seq: Option<u64>, tx: mpsc::Sender<Delivery>, metrics: &Metrics) -> Option<KmsgTail> {
    // The tail is a plain thread: it may block on the bounded channel.
    match KmsgTail::spawn(path, Start::from_cursor(last_seq), move |d| tx.blocking_send(d).is_ok()) {
        Ok(t) => {
            tracing::info!(path = %path.display(), "kernel log watched");
            metrics.set_kernel_log_watching(true, "");
            Some(t)
        }
        Err(e) => {
            metrics.set_kernel_log_watching(false, &format!("{}: {e}", path.display()));
            let hint = match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    "; reading it needs CAP_SYSLOG and, in a container, a device cgroup that allows \
                     /dev/kmsg (the chart's securityContext.privileged=true fallback)"
                }
                _ => "",
            };
            tracing::warn!(path = %path.display(), error = %e, "kernel log watcher not started{hint}");
            None
        }
    }
}
