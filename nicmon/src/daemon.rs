//! `nicmon run` (and `nicmon trace`): the daemon, in three pieces —
//! - [`Daemon::start`]: the shared start-up ([`Monitor::open`]), the state file, the metrics
//!   endpoint, the wake sources, the kernel log watcher and the outbox's sender;
//! - [`Daemon::run_loop`]: one poll → evaluate → commit cycle at a time, on a 1 s tick and
//!   on every wake-up (eBPF, rtnetlink, kernel log), until SIGTERM or SIGINT, which finish
//!   the cycle;
//! - [`Daemon::shutdown`]: flush what can be sent within a bound, save, exit.
//!
//! When an event is sent and when it leaves the outbox: [`crate::outbox`].
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use time::OffsetDateTime;
use tokio::signal::unix::{Signal, SignalKind};
use tokio::sync::mpsc;

use crate::cycle::{Monitor, MonitorOptions, Poll};
use crate::discovery;
use crate::dispatch::{GrpcConfig, Sink, SinkSpec};
use crate::event::Check;
use crate::kmsg::{self, Delivery, KmsgTail, Record, Start};
use crate::metrics::Metrics;
use crate::metrics::server::{self as metrics_server, Liveness, MetricsServer};
use crate::outbox::{Courier, Journal};
use crate::state::{self, Loaded, State};
use crate::wake::{Wake, WakeOptions, WakeSource};

/// The shortest gap between the starts of two wake-driven polls. A wake-up after a quiet
/// spell is polled at once (no coalescing sleep); wake-ups arriving within this gap of the
/// previous wake-driven poll wait for its end and are all served by one poll — so a flood
/// (a flapping link, a tracepoint hit thousands of times a second) costs at most
/// 1 s / `WAKE_POLL_GAP` polls a second on top of the interval's.
pub const WAKE_POLL_GAP: Duration = Duration::from_millis(50);

/// The trailing edge of the wake-up rate limits: a full poll this long after each
/// wake-driven poll (unless another wake-driven poll came first and moved it). The kernel
/// programs drop records within `RATE_WINDOW_NS` of the previous one of the same key, and
/// this loop serves at most one wake-driven poll per [`WAKE_POLL_GAP`]: so the last change
/// of any burst is polled at most this long after the last poll that served the burst,
/// never left to the interval's tick.
pub const TRAILING_POLL: Duration =
    Duration::from_nanos(nicmon_common::RATE_WINDOW_NS).saturating_add(Duration::from_millis(5));

/// Within a burst, the shortest gap between the starts of two full polls that follow a
/// targeted one (the trailing poll and the tick's poll are not held back).
pub const BURST_FULL_POLL_GAP: Duration = Duration::from_millis(250);

/// How long the full poll that follows a targeted one waits for the targeted poll's
/// batches to be delivered (so the two do not compete for the CPU on the latency path).
pub const TARGETED_DELIVERY_WAIT: Duration = Duration::from_millis(50);

/// How long a signal waits for queued batches to be delivered. With the last poll (at most
/// [`crate::host::Deadlines::poll`]) and the final save, exit comes within 5 s of SIGTERM
/// whatever is stuck; what was not delivered stays in the outbox for the next start.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);
/// Kernel log batches handed over but not yet taken by the loop (each at most
/// [`kmsg::reader::MAX_BATCH_BYTES`] of text).
const KMSG_CHANNEL_BATCHES: usize = 2;

/// Everything `nicmon run` needs, resolved from flags.
pub struct RunOptions {
    /// What every polling command shares (host roots, config, metadata, checks, stamp).
    pub monitor: MonitorOptions,
    pub state_file: PathBuf,
    pub interval: Duration,
    pub sink: SinkSpec,
    pub grpc: GrpcConfig,
    /// `None` disables the HTTP endpoint.
    pub metrics_port: Option<u16>,
    /// `--metrics-bind-address`.
    pub metrics_bind_address: std::net::IpAddr,
    /// `None` disables the kernel log watcher.
    pub kmsg_path: Option<PathBuf>,
    pub wake: WakeOptions,
    /// Disable every wake source (polling only).
    pub no_wake: bool,
    /// Trace mode: print each wake-up and the poll it caused.
    pub trace: bool,
    /// `--poll-stall-deadline` (zero: no watchdog) and the strategy its events carry.
    pub poll_stall: PollStall,
}

/// The poll-stall watchdog's settings ([`crate::stall`]).
#[derive(Debug, Clone, Copy)]
pub struct PollStall {
    /// Zero disables the watchdog.
    pub deadline: Duration,
    pub store_only: bool,
}

/// Parse `--checks`: comma-separated names. Unknown names are returned, to be logged and
/// skipped (000 §12.1).
pub fn parse_checks(list: &str) -> (BTreeSet<Check>, Vec<String>) {
    let mut known = BTreeSet::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Check::parse(name) {
            Some(c) => {
                known.insert(c);
            }
            None => unknown.push(name.to_string()),
        }
    }
    (known, unknown)
}

/// Run the daemon until a signal.
pub async fn run(opts: RunOptions) -> Result<()> {
    let mut daemon = Daemon::start(&opts).await?;
    daemon.run_loop().await?;
    daemon.shutdown().await;
    Ok(())
}

/// What woke the loop.
enum Wakeup {
    /// The interval tick, a wake source (the coalesced burst) or kernel log records:
    /// poll now.
    Poll(Vec<Wake>),
    /// The trailing poll after a wake-driven one is due.
    Trailing,
    /// The outbox's sender acknowledged these batches.
    Acks(Vec<u64>),
    /// SIGTERM or SIGINT: one last poll, then shut down.
    Stop,
}

/// The running daemon.
pub struct Daemon<'a> {
    opts: &'a RunOptions,
    monitor: Monitor,
    state: State,
    loaded: Loaded,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    _server: Option<MetricsServer>,
    wakes: Option<WakeSource>,
    /// Declared before `_tail`, so dropped first: a tail thread blocked on a full channel
    /// then ends, and dropping the tail (which joins it) cannot wait for ever.
    kmsg: mpsc::Receiver<Delivery>,
    _tail: Option<KmsgTail>,
    courier: Courier,
    sigterm: Signal,
    tick: tokio::time::Interval,
    /// When the earliest port held by `portStateHoldDown` is due: a poll then reports it
    /// (or finds it recovered) without waiting for the next tick.
    hold_due: Option<tokio::time::Instant>,
    pending_records: Vec<Record>,
    /// When the last wake-driven poll started (the rate limit's reference).
    last_wake_poll: Option<tokio::time::Instant>,
    /// When the last full poll started.
    last_full_poll: Option<Instant>,
    /// When the trailing poll of the last wake-driven one is due ([`TRAILING_POLL`]).
    trailing_due: Option<tokio::time::Instant>,
    /// The last full poll's snapshot: what a wake-up's hint can name, and the base of a
    /// targeted poll.
    last_snapshot: Option<crate::model::Snapshot>,
    /// Devices named by wake-ups since the last full poll: it reads their static
    /// attributes again.
    statics_owed: BTreeSet<String>,
    writer: state::Writer,
    /// Batches sent and not yet saved ([`crate::outbox`]'s journal).
    journal: Journal,
    trace_latencies: BTreeMap<&'static str, Vec<f64>>,
    /// Wake records the kernel programs lost to a full ring buffer, as last read.
    lost_wakes: crate::wake::LostWakes,
    /// The poll-stall watchdog (`None`: `--poll-stall-deadline=0s`).
    stall: Option<crate::stall::Watchdog>,
}

impl<'a> Daemon<'a> {
    /// Start-up: everything before the first poll. Fails only on what must stop the
    /// daemon (invalid config, unusable required metadata, an unusable metrics port).
    pub async fn start(opts: &'a RunOptions) -> Result<Daemon<'a>> {
        // First: a SIGTERM that arrives while the daemon starts is kept and handled by the
        // loop (one last poll, flush, exit 0) instead of killing it half-started.
        let sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
        let mut monitor = Monitor::open(&opts.monitor)?;
        monitor.defer_first_poll = true;
        if monitor.boot_id.is_none() {
            tracing::warn!("boot ID unreadable: reboots cannot be told from restarts");
        }
        let (mut state, loaded) = load_state(&opts.state_file, monitor.boot_id.as_deref());
        let mut journal = Journal::new(&opts.state_file);
        let recovered = journal.recover(&mut state, loaded == Loaded::Resumed);
        if !recovered.is_empty() {
            tracing::info!(
                batches = recovered.len(),
                path = %journal.path().display(),
                "batches sent but not saved before the last stop: queued again, and the first poll reports \
                 every port whose state differs from what they said"
            );
        }
        let devices = monitor.host.list_sys("class/infiniband").len();
        tracing::info!(
            source = monitor.topology.source.as_str(),
            gpus = monitor.topology.gpus.len(),
            devices,
            "topology"
        );
        if devices == 0 {
            tracing::warn!(
                "no RDMA devices found under {}: polling anyway",
                monitor.host.sys("class/infiniband").display()
            );
        }

        let metrics = Arc::new(Metrics::new(&monitor.stamp.node_name));
        metrics.set_topology_source(monitor.topology.source.as_str());
        let liveness = Liveness::new(opts.interval.max(Duration::from_secs(1)));
        let server = match opts.metrics_port {
            Some(port) => Some(
                metrics_server::start((opts.metrics_bind_address, port).into(), metrics.clone(), liveness.clone())
                    .await
                    .with_context(|| {
                        format!(
                            "--metrics-bind-address {} --metrics-port {port}: cannot listen",
                            opts.metrics_bind_address
                        )
                    })?,
            ),
            None => None,
        };
        let wakes = if opts.no_wake { None } else { Some(start_wakes(&opts.wake, &metrics)) };
        // Bounded: a kernel log flood (or a huge file at --kmsg-path) waits in the kernel's
        // ring or the file, not in the daemon's memory.
        let (kmsg_tx, kmsg) = mpsc::channel::<Delivery>(KMSG_CHANNEL_BATCHES);
        let kmsg_wanted = opts.monitor.checks.contains(&Check::NICKernelLogCheck) && monitor.config.kernel_log.enabled;
        let tail = match &opts.kmsg_path {
            Some(p) if kmsg_wanted => start_kmsg(p, state.checks.kmsg.last_seq, kmsg_tx, &metrics),
            _ => {
                let why = match &opts.kmsg_path {
                    None => "--no-kmsg",
                    Some(_) if !monitor.config.kernel_log.enabled => "[kernelLog] enabled = false",
                    Some(_) => "NICKernelLogCheck not in --checks",
                };
                metrics.set_kernel_log_watching(false, &format!("off: {why}"));
                None
            }
        };
        let sink = Sink::lazy(&opts.sink, opts.grpc.clone());
        let pause = opts.grpc.retry.initial_backoff.max(Duration::from_millis(50));
        let courier =
            Courier::start(sink, &state.outbox, Some(opts.sink.queue_bounds(&opts.grpc)), metrics.clone(), pause);
        let stall = if opts.poll_stall.deadline.is_zero() {
            tracing::info!("NIC poll stall detection off (--poll-stall-deadline=0s)");
            None
        } else {
            let stamp = crate::event::Stamp {
                node_name: monitor.stamp.node_name.clone(),
                processing_strategy: crate::stall::strategy(
                    opts.poll_stall.store_only,
                    monitor.stamp.processing_strategy,
                ),
            };
            Some(
                crate::stall::Watchdog::start(opts.poll_stall.deadline, stamp, &opts.sink, opts.grpc.clone())
                    .context("cannot start the poll stall watchdog")?,
            )
        };
        courier.set_trace(opts.trace);
        let mut tick = tokio::time::interval(opts.interval.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(node = %monitor.stamp.node_name, interval = ?opts.interval, "nicmon running");
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
            trailing_due: None,
            last_full_poll: None,
            last_snapshot: None,
            statics_owed: BTreeSet::new(),
            writer: state::Writer::new(&opts.state_file),
            journal,
            trace_latencies: BTreeMap::new(),
            lost_wakes: crate::wake::LostWakes::default(),
            stall,
        })
    }

    /// The loop: wait, then poll (or take acknowledgements), until a signal.
    pub async fn run_loop(&mut self) -> Result<()> {
        loop {
            let woke = match self.wait().await {
                Wakeup::Acks(ids) => {
                    for id in ids {
                        self.state.outbox.ack(id);
                    }
                    self.save();
                    continue;
                }
                Wakeup::Poll(woke) => {
                    if !woke.is_empty() {
                        let now = tokio::time::Instant::now();
                        self.last_wake_poll = Some(now);
                        self.trailing_due = Some(now + TRAILING_POLL);
                    }
                    woke
                }
                Wakeup::Trailing => {
                    self.trailing_due = None;
                    Vec::new()
                }
                Wakeup::Stop => {
                    self.cycle(&[]).await;
                    tracing::info!("signal received: flushing and exiting");
                    return Ok(());
                }
            };
            self.cycle(&woke).await;
        }
    }

    /// Shutdown: give the sender a bounded time to deliver what is queued, save.
    pub async fn shutdown(&mut self) {
        let deadline = tokio::time::Instant::now() + SHUTDOWN_FLUSH;
        self.courier.flush(&mut self.state.outbox, deadline).await;
        if self.writer.flush(&self.state, Instant::now()) {
            self.journal.saved();
        }
        if !self.state.outbox.is_empty() {
            tracing::warn!(
                pending = self.state.outbox.len(),
                "exiting with undelivered batches: they are sent after the next start"
            );
        }
        if self.opts.trace {
            let lost = self.count_lost_wakes();
            println!("{}", trace_summary(&self.trace_latencies, lost));
        }
    }

    /// Wait for the next reason to act. Kernel log records are collected on the way.
    async fn wait(&mut self) -> Wakeup {
        let (wakes, kmsg, courier) = (&mut self.wakes, &mut self.kmsg, &mut self.courier);
        let metrics = &self.metrics;
        let (tick, sigterm, records) = (&mut self.tick, &mut self.sigterm, &mut self.pending_records);
        let rate_limit_until = self.last_wake_poll.map(|t| t + WAKE_POLL_GAP);
        let hold_due = self.hold_due;
        let trailing_due = self.trailing_due;
        tokio::select! {
            _ = async { match trailing_due { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                Wakeup::Trailing
            }
            _ = tick.tick() => Wakeup::Poll(Vec::new()),
            _ = async { match hold_due { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                Wakeup::Poll(Vec::new())
            }
            Some(w) = async { match wakes.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                let mut woke = vec![w];
                // Rate limit: within the gap after the previous wake-driven poll, wait for
                // its end; everything that arrived by then is served by this one poll.
                if let Some(until) = rate_limit_until.filter(|u| *u > tokio::time::Instant::now()) {
                    tokio::time::sleep_until(until).await;
                }
                if let Some(ws) = wakes.as_mut() {
                    while let Some(w) = ws.try_recv() { woke.push(w); }
                }
                Wakeup::Poll(woke)
            }
            Some(d) = kmsg.recv() => {
                match d {
                    Delivery::Records(r) => records.extend(r),
                    Delivery::Failed(e) => {
                        tracing::warn!(error = %e, "kernel log watcher stopped");
                        metrics.set_kernel_log_watching(false, &format!("watcher stopped: {e}"));
                    }
                }
                Wakeup::Poll(Vec::new())
            }
            Some(ids) = courier.next_acks() => Wakeup::Acks(ids),
            _ = tokio::signal::ctrl_c() => Wakeup::Stop,
            _ = sigterm.recv() => Wakeup::Stop,
        }
    }

    /// One cycle: read → decide, then act — metrics, logs, trace, and the outbox's commit.
    /// Wake-ups whose hints name devices first get a targeted poll of those devices (its
    /// events are dispatched first), then the full poll follows (SPEC §1.8).
    async fn cycle(&mut self, woke: &[Wake]) {
        if let Some(s) = &self.stall {
            s.begin();
        }
        self.cycle_watched(woke).await;
        if let Some(s) = &self.stall {
            s.end();
        }
    }

    async fn cycle_watched(&mut self, woke: &[Wake]) {
        while let Ok(d) = self.kmsg.try_recv() {
            if let Delivery::Records(r) = d {
                self.pending_records.extend(r);
            }
            if self.pending_records.len() >= kmsg::MAX_PENDING_RECORDS {
                break;
            }
        }
        let dropped = kmsg::keep_newest(&mut self.pending_records);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "kernel log records waiting for a committed poll exceed the bound: the oldest are dropped \
                 (counted as lost records by their sequence gap)"
            );
        }
        let woke_at = Instant::now();
        let mut targets: Vec<String> = Vec::new();
        if let Some(last) = &self.last_snapshot {
            for w in woke {
                if let crate::wake::Hint::Name(n) = &w.hint {
                    for dev in discovery::devices_named(&self.monitor.host, last, n) {
                        if !targets.contains(&dev) {
                            targets.push(dev);
                        }
                    }
                }
            }
        }
        // A wake-up naming a device: its static attributes are read again by the next full
        // poll (a targeted poll, on the latency path, uses the kept ones of the same
        // incarnation: the `device` link is read on every poll, targeted ones included).
        for dev in &targets {
            self.statics_owed.insert(dev.clone());
        }
        let mut traced = false;
        if let Some(base) = self.last_snapshot.as_ref().filter(|_| !targets.is_empty())
            && let Some(obs) = self.monitor.observe_targeted(&self.state.checks, base, &targets)
        {
            let poll = self.monitor.decide(&self.state.checks, &self.loaded, obs, OffsetDateTime::now_utc(), &[]);
            let elapsed = woke_at.elapsed();
            let kind = PollKind::Targeted(&targets);
            let before = self.state.outbox.last_id();
            self.act(poll, woke, woke_at, elapsed, kind, Vec::new());
            traced = true;
            // The targeted poll's events go out before anything else: the full poll (which
            // competes with the sender for the CPU) starts once they are delivered, or after
            // TARGETED_DELIVERY_WAIT at the latest (a connector that is down).
            let sent = self.state.outbox.last_id();
            if sent > before {
                self.await_delivery(sent, tokio::time::Instant::now() + TARGETED_DELIVERY_WAIT).await;
            }
            // The targeted commit's save (deferred by `act` until its batches were
            // delivered: the journal covers a crash before it).
            self.save();
            // A burst (a full poll ran moments ago): the targeted poll served the named
            // devices; the rest waits for the trailing poll or the tick, so a storm of
            // hinted wake-ups costs targeted polls, not full ones.
            if self.last_full_poll.is_some_and(|t| t.elapsed() < BURST_FULL_POLL_GAP) {
                for w in woke {
                    self.metrics.wakeup(w.hook.name());
                }
                return;
            }
        }
        // The static attributes of every device a wake-up named since the last full poll
        // are read again by this one.
        for dev in std::mem::take(&mut self.statics_owed) {
            self.monitor.statics.invalidate(&dev);
        }
        let started = Instant::now();
        self.last_full_poll = Some(started);
        let records = std::mem::take(&mut self.pending_records);
        let poll = self.monitor.poll(&self.state.checks, &self.loaded, OffsetDateTime::now_utc(), &records);
        let elapsed = started.elapsed();
        let completed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.metrics.observe_poll(elapsed, completed);
        self.last_snapshot = Some(poll.snapshot.clone());
        for w in woke {
            self.metrics.wakeup(w.hook.name());
        }
        let kind = if traced { PollKind::FullAfterTargeted } else { PollKind::Full };
        self.act(poll, woke, if traced { started } else { woke_at }, elapsed, kind, records);
        let _ = self.count_lost_wakes();
    }

    /// Read the kernel programs' count of wake records lost to a full ring buffer (once per
    /// full poll, off the latency path): the metric, a trace line, and a warning at most
    /// once per [`crate::wake::LOST_WARN_EVERY`]. The total, when it could be read.
    fn count_lost_wakes(&mut self) -> Option<u64> {
        let total = self.wakes.as_ref().and_then(|w| w.lost_records())?;
        let update = self.lost_wakes.update(total, Instant::now());
        if update.new > 0 {
            self.metrics.ebpf_wake_records_lost(update.new);
            if self.opts.trace {
                println!("lost wake_records={} total={} (eBPF ring buffer full)", update.new, update.total);
            }
        }
        if let Some(lost) = update.warn {
            tracing::warn!(
                lost,
                total = update.total,
                "wake records dropped in the kernel: the eBPF ring buffer was full (harmless: the 1 s full poll \
                 still runs; the agent fell behind, see nicmon_ebpf_wake_records_lost_total)"
            );
        }
        Some(update.total)
    }

    /// Act on one poll's result: notes, logs, trace, metrics, then the outbox's commit.
    /// `records`: the kernel log records the poll consumed (kept for the next poll when
    /// the commit is refused).
    fn act(
        &mut self,
        poll: Poll,
        woke: &[Wake],
        woke_at: Instant,
        elapsed: Duration,
        kind: PollKind<'_>,
        records: Vec<Record>,
    ) {
        // The send first: nothing but the commit's bookkeeping stands between the decision
        // and the hand-off to the sender task (logs, metrics and the trace come after; the
        // state file is saved after them, see crate::outbox for why that order is safe).
        let mut poll = poll;
        let next = std::mem::take(&mut poll.next);
        let journal = &mut self.journal;
        let committed = self.courier.commit(&mut self.state, next, &poll.events, |b| journal.record(b), |_| {});
        let handed_at = Instant::now();
        let next = match &committed {
            Ok(()) => &self.state.checks,
            Err((_, checks)) => checks.as_ref(),
        };
        for n in &poll.notes {
            tracing::info!("{n}");
        }
        log_flaps(&poll.flaps);
        if self.opts.trace {
            print_trace(woke, woke_at, &poll, elapsed, &kind, handed_at, self.state.outbox.last_id());
            // Kernel → the end of the first poll that served the wake-up.
            if !matches!(kind, PollKind::FullAfterTargeted) {
                let end = crate::wake::monotonic_ns();
                for w in woke {
                    if let Some(k) = w.kernel_ts_ns {
                        self.trace_latencies.entry(w.hook.name()).or_default().push(end.saturating_sub(k) as f64 / 1e6);
                    }
                }
            }
        }
        update_metrics(&self.metrics, &poll, next);
        for check in Check::ALL {
            for e in poll.events.iter().filter(|e| e.check() == Some(check)) {
                log_event(e);
            }
        }

        // The earliest held port's due time (rounded up; measured from after the poll, whose
        // clock reading was earlier, so the poll then finds it due).
        self.hold_due = poll
            .holds
            .held
            .iter()
            .map(|h| h.left_ms.max(0) as u64 + 1)
            .min()
            .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
        let deferred = !poll.deferred.is_empty();
        match committed {
            Ok(()) => {
                // A targeted poll's batches are on the latency path: its commit is saved
                // once they are delivered (`cycle_watched`), so the state file's write and
                // sync do not compete with the sink's write.
                if !matches!(kind, PollKind::Targeted(_)) {
                    self.save();
                }
                // A deferred first poll ran nothing: the first poll (and the baselines a reboot
                // owes) is still to come.
                if !deferred {
                    self.loaded = Loaded::Resumed;
                }
                // Counted once committed: a poll that runs again finds the same blip.
                for b in &poll.holds.blips {
                    tracing::info!(
                        check = %b.check,
                        device = %b.device,
                        port = b.port,
                        "port recovered within portStateHoldDown: blip, not reported"
                    );
                    self.metrics.port_state_blip(b.check, &b.device, b.port);
                }
            }
            Err((full, _)) => {
                // The bounded outbox: a poll whose events do not fit is not committed (its
                // state does not advance) and runs again on the next cycle. So nothing queued
                // is dropped, and once there is room the poll queues the newest state of every
                // (check, entity) against what was last committed.
                tracing::warn!("{full}: this poll is not committed and runs again");
                self.pending_records.splice(0..0, records);
            }
        }
        if !matches!(kind, PollKind::Targeted(_)) {
            self.liveness.cycle_completed();
        }
    }

    /// Take acknowledgements until every batch up to `id` has left the outbox, or until
    /// `deadline`.
    async fn await_delivery(&mut self, id: u64, deadline: tokio::time::Instant) {
        while self.state.outbox.pending().first().is_some_and(|b| b.id <= id) {
            match tokio::time::timeout_at(deadline, self.courier.next_acks()).await {
                Ok(Some(ids)) => {
                    for id in ids {
                        self.state.outbox.ack(id);
                    }
                    self.save();
                }
                _ => return,
            }
        }
    }

    fn save(&mut self) {
        if self.writer.save(&self.state, Instant::now()) {
            self.journal.saved();
        }
    }
}

/// Load the state file for this boot, saying how it was found.
fn load_state(path: &std::path::Path, boot_id: Option<&str>) -> (State, Loaded) {
    let (st, mut loaded) = state::load(path, boot_id);
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
    // nicmon/src/wake/btf.rs): hand that memory back to the OS instead of keeping it resident.
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
    metrics.set_ebpf(crate::wake::EBPF_EMBEDDED, w.mode() == crate::wake::WakeMode::Ebpf);
    tracing::info!(mode = w.mode().name(), "wake-up path");
    w
}

/// Start the kernel log watcher: after the persisted cursor (same boot), else at the end.
fn start_kmsg(
    path: &std::path::Path,
    last_seq: Option<u64>,
    tx: mpsc::Sender<Delivery>,
    metrics: &Metrics,
) -> Option<KmsgTail> {
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

/// Per-hook counts and kernel→poll-end latency percentiles (trace mode's exit summary),
/// and the wake records the kernel programs lost to a full ring buffer (`None`: not counted,
/// no eBPF).
pub fn trace_summary(lat: &std::collections::BTreeMap<&'static str, Vec<f64>>, lost: Option<u64>) -> String {
    let mut out = String::from("trace summary (kernel timestamp -> poll finished, ms):\n");
    if lat.is_empty() {
        out.push_str("  no wake-ups\n");
    }
    for (hook, v) in lat {
        let mut v = v.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        out.push_str(&format!(
            "  {hook:<28} count={:<6} p50={:.3} p99={:.3} max={:.3}\n",
            v.len(),
            pct(0.5),
            pct(0.99),
            v[v.len() - 1]
        ));
    }
    if let Some(n) = lost {
        out.push_str(&format!("  wake records lost in the kernel (eBPF ring buffer full): {n}\n"));
    }
    out
}

fn log_event(e: &crate::event::HealthEvent) {
    let ents = e.entities_text();
    tracing::info!(
        check = %e.check_name,
        healthy = e.is_healthy,
        fatal = e.is_fatal,
        action = ?e.recommended_action,
        entities = %ents,
        error_code = %e.error_code.join(","),
        "{}", e.message
    );
}

/// One line per unhealthy transition flap damping counted: those it held publish nothing,
/// so this line (and the metric) is where they show.
fn log_flaps(flaps: &[crate::linkstate::FlapTransition]) {
    for f in flaps {
        if f.flapping && !f.published {
            tracing::info!(
                device = %f.device, port = f.port, check = %f.check, transitions = f.transitions,
                "port held as flapping: unhealthy transition not published"
            );
        } else if f.flapping {
            tracing::warn!(
                device = %f.device, port = f.port, check = %f.check, transitions = f.transitions,
                "port flapping: one fatal event sent, further transitions held until it settles"
            );
        }
    }
}

/// `next`: the checks' state the poll produced (`poll.next` is moved out by the commit).
fn update_metrics(metrics: &Metrics, poll: &Poll, next: &crate::state::CheckState) {
    let mut by_role: std::collections::BTreeMap<&str, usize> = Default::default();
    for c in poll.roles.values() {
        if let Some(r) = c.role {
            *by_role.entry(r.as_str()).or_default() += 1;
        }
    }
    metrics.set_devices_by_role(by_role);
    let mut ports = Vec::new();
    let mut unknown = Vec::new();
    for d in &poll.snapshot.devices {
        if poll.roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) {
            for p in &d.ports {
                unknown.extend(p.unknown.keys().map(|a| (d.name.as_str(), p.number, a.as_str())));
                // Unknown is not a value: a port whose state is unknown is neither healthy
                // nor unhealthy, so it is left out of the health gauge.
                if p.unknown_state().is_none() {
                    ports.push((d.name.as_str(), p.number, p.is_healthy()));
                }
            }
        }
    }
    metrics.set_port_health(ports);
    metrics.set_unknown_attributes(unknown);
    // Monitored PFs per state check (by link layer); InfiniBand ones for the char-device check.
    let mut discovered: std::collections::BTreeMap<Check, usize> = Default::default();
    for d in poll.snapshot.devices.iter().filter(|d| !d.is_vf()) {
        if !poll.roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) {
            continue;
        }
        let ll = crate::roles::device_link_layer(d);
        if let Some(check) = ll.and_then(crate::linkstate::state_check) {
            *discovered.entry(check).or_default() += 1;
        }
        if ll == Some(&crate::model::LinkLayer::InfiniBand) {
            *discovered.entry(Check::InfiniBandCharDeviceCheck).or_default() += 1;
        }
    }
    for check in Check::ALL.into_iter().filter(|c| c.watches_devices()) {
        metrics.set_devices_discovered(check, discovered.get(&check).copied().unwrap_or(0));
    }
    for check in &poll.deferred {
        metrics.first_poll_deferred(*check, 1);
    }
    metrics.set_read_health(poll.reads_abandoned, &poll.stuck_reads);
    metrics.kmsg_records_lost(next.kmsg.lost_records);
    metrics.set_saturated_counters(next.counters.saturated());
    for f in &poll.flaps {
        metrics.port_flap_transition(&f.device, f.port);
    }
    metrics.set_flapping_ports(
        next.links.port_states.values().filter(|r| r.flap.is_flapping()).map(|r| (r.device.as_str(), r.port)),
    );
    for e in poll.events.iter().filter(|e| !e.is_healthy) {
        let dev = e.entities_impacted.iter().find(|x| x.entity_type == "NIC").map(|x| x.entity_value.as_str());
        let port = e
            .entities_impacted
            .iter()
            .find(|x| x.entity_type == "NICPort")
            .and_then(|x| x.entity_value.parse().ok())
            .unwrap_or(0);
        let Some(check) = e.check() else { continue };
        match check {
            Check::InfiniBandStateCheck
            | Check::EthernetStateCheck
            | Check::EFAStateCheck
            | Check::InfiniBandCharDeviceCheck => metrics.state_check_error(check, dev.unwrap_or(""), port),
            Check::InfiniBandDegradationCheck | Check::EthernetDegradationCheck | Check::EFADegradationCheck => {
                // The counter rule is the event's error code; a saturated counter's event is
                // not a threshold breach (no thresholds are evaluated while it is saturated).
                let counter = e.error_code.first().map(String::as_str).unwrap_or("");
                let dev = dev.unwrap_or("");
                if !next.counters.is_saturated(dev, port, counter) {
                    metrics.counter_threshold_breach(counter, dev, port, e.is_fatal)
                }
            }
            _ => {}
        }
    }
}

/// Which poll of a cycle (`nicmon trace` says it).
enum PollKind<'a> {
    /// Only these devices, read for a wake-up naming them.
    Targeted(&'a [String]),
    /// The full poll of a cycle without a targeted one.
    Full,
    /// The full poll following a targeted one.
    FullAfterTargeted,
}

impl std::fmt::Display for PollKind<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollKind::Targeted(d) => write!(f, "targeted({})", d.join(",")),
            PollKind::Full | PollKind::FullAfterTargeted => f.write_str("full"),
        }
    }
}

/// One trace line per wake-up and poll: the hook, the kernel timestamp, when the agent
/// woke, when the poll ended, the events it produced and the latencies between them.
/// `handed_at`: when the poll's batches were handed to the sender (whose own `sent` lines
/// say when the sink accepted them); `last_batch`: the outbox's last batch id after the
/// commit (the poll's batches are those up to it; the `sent` lines name them).
fn print_trace(
    woke: &[crate::wake::Wake],
    woke_at: Instant,
    poll: &Poll,
    elapsed: Duration,
    kind: &PollKind<'_>,
    handed_at: Instant,
    last_batch: u64,
) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let now_ns = crate::wake::monotonic_ns();
    let handed_ns = now_ns.saturating_sub(handed_at.elapsed().as_nanos() as u64);
    let poll_end_ns = handed_ns.saturating_sub(handed_at.duration_since(woke_at + elapsed).as_nanos() as u64);
    let handoff_ms = handed_at.duration_since(woke_at + elapsed).as_secs_f64() * 1e3;
    for w in woke {
        let kernel = w.kernel_ts_ns.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        let k2wake = w.delivery_latency_ns().map(|n| format!("{:.3}", n as f64 / 1e6)).unwrap_or_else(|| "-".into());
        let k2end = w
            .kernel_ts_ns
            .map(|t| format!("{:.3}", poll_end_ns.saturating_sub(t) as f64 / 1e6))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "wake hook={} poll={kind} kernel_ns={} hint={:?} kernel->agent_ms={} coalesce_wait_ms={:.3} poll_ms={:.3} kernel->poll_end_ms={} handoff_ms={handoff_ms:.3} handed_ns={handed_ns} events={} last_batch={last_batch}",
            w.hook.name(),
            kernel,
            w.hint,
            k2wake,
            woke_at.saturating_duration_since(w.received).as_secs_f64() * 1e3,
            elapsed.as_secs_f64() * 1e3,
            k2end,
            poll.events.len()
        );
    }
    for e in &poll.events {
        let ents = e.entities_text();
        let _ = writeln!(
            out,
            "  event {} healthy={} fatal={} [{}] {}",
            e.check_name, e.is_healthy, e.is_fatal, ents, e.message
        );
    }
    for h in &poll.holds.held {
        let _ = writeln!(
            out,
            "  held {} [NIC={} NICPort={}] {} - reported in {:.3} s unless it recovers (portStateHoldDown)",
            h.check,
            h.device,
            h.port,
            h.state,
            h.left_ms as f64 / 1e3
        );
    }
    for b in &poll.holds.blips {
        let flap = poll.flaps.iter().find(|f| f.device == b.device && f.port == b.port);
        let counted = match flap {
            Some(f) if f.flapping && f.published => {
                format!("; counted for flap damping ({} transitions): port flapping", f.transitions)
            }
            Some(f) if f.flapping => format!("; the port is held as flapping ({} transitions)", f.transitions),
            Some(f) if f.transitions > 0 => format!("; counted for flap damping ({} in the window)", f.transitions),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  blip {} [NIC={} NICPort={}] recovered within portStateHoldDown: not reported{counted}",
            b.check, b.device, b.port
        );
    }
    for f in poll.flaps.iter().filter(|f| !f.published && f.flapping) {
        let _ = writeln!(
            out,
            "  held {} [NIC={} NICPort={}] unhealthy transition while flapping ({} since the hold began): not published",
            f.check, f.device, f.port, f.transitions
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::eval::Saturation;
    use crate::event::{Entity, HealthEvent, Stamp};

    /// A daemon over a fixture node, with no wake source, metrics endpoint or kernel log
    /// (its loop's cycles are driven by the test).
    fn run_options(node: &nicmon_tests::Node) -> RunOptions {
        RunOptions {
            monitor: crate::cycle::fixture_options(node),
            state_file: node.root().join("state.json"),
            interval: Duration::from_secs(1),
            sink: SinkSpec::File(node.root().join("events.jsonl")),
            grpc: GrpcConfig::new(crate::dispatch::DEFAULT_SOCKET.parse().unwrap()),
            metrics_port: None,
            metrics_bind_address: std::net::Ipv4Addr::LOCALHOST.into(),
            kmsg_path: None,
            wake: WakeOptions::default(),
            no_wake: true,
            trace: false,
            poll_stall: PollStall { deadline: Duration::ZERO, store_only: false },
        }
    }

    fn wake_naming(netdev: &str) -> Wake {
        Wake {
            hook: crate::wake::Hook::Rtnetlink,
            kernel_ts_ns: None,
            hint: crate::wake::Hint::Name(netdev.to_string()),
            received: Instant::now(),
            received_ns: crate::wake::monotonic_ns(),
        }
    }

    /// The firmware version of `dev` in the last full poll's snapshot.
    fn fw_ver(daemon: &Daemon<'_>, dev: &str) -> Option<String> {
        let snap = daemon.last_snapshot.as_ref().expect("a full poll ran");
        snap.devices.iter().find(|d| d.name == dev).and_then(|d| d.fw_ver.clone())
    }

    /// Issue #18's read path through the daemon's own cycle: a wake-up naming a device
    /// (here by its netdev) makes the next full poll read that device's static attributes
    /// again — the targeted poll it causes does not (it uses the kept ones) — while a
    /// device no wake-up named keeps its kept attributes (until `STATIC_REFRESH`).
    #[tokio::test]
    async fn a_wake_naming_a_device_makes_the_next_full_poll_read_its_statics_again() {
        let mut node = nicmon_tests::Node::new("statics-wake");
        let rc = node.root_complex(0, 0);
        let rp = node.root_port(&rc, 1);
        node.card(&rp, 0, vec![nicmon_tests::NicSpec::eth("mlx5_0", "eth0")]);
        let rp2 = node.root_port(&rc, 2);
        node.card(&rp2, 0, vec![nicmon_tests::NicSpec::eth("mlx5_1", "eth1")]);
        let opts = run_options(&node);
        let mut daemon = Daemon::start(&opts).await.unwrap();

        // The tick's first full poll reads both devices' static attributes.
        daemon.cycle(&[]).await;
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.39.1002"));
        assert_eq!(daemon.monitor.statics.reads(), 2);
        // The next tick reads none of them.
        daemon.cycle(&[]).await;
        assert_eq!(daemon.monitor.statics.reads(), 2, "kept between full polls");

        // Both devices' firmware changes on disk (as a firmware reset would show it).
        node.write_device_file("mlx5_0", "fw_ver", "28.40.1000\n");
        node.write_device_file("mlx5_1", "fw_ver", "28.40.1000\n");

        // A hinted wake-up in a burst (a full poll ran moments ago): the targeted poll
        // alone runs; it reads no static attribute, and the device is owed a re-read.
        daemon.last_full_poll = Some(Instant::now());
        daemon.cycle(&[wake_naming("eth0")]).await;
        assert_eq!(daemon.monitor.statics.reads(), 2, "a targeted poll uses the kept static attributes");
        assert!(daemon.statics_owed.contains("mlx5_0"), "{:?}", daemon.statics_owed);
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.39.1002"), "no full poll ran yet");

        // The trailing (or the tick's) full poll: mlx5_0 is read again, mlx5_1 is not.
        daemon.cycle(&[]).await;
        assert_eq!(daemon.monitor.statics.reads(), 3, "exactly the named device's attributes are read again");
        assert!(daemon.statics_owed.is_empty());
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.40.1000"), "the named device is read again");
        assert_eq!(fw_ver(&daemon, "mlx5_1").as_deref(), Some("28.39.1002"), "an unnamed device keeps its kept value");

        // Outside a burst: one cycle runs the targeted poll and the full poll that follows,
        // which reads the named device again (here mlx5_1, named by its netdev too).
        node.write_device_file("mlx5_1", "fw_ver", "28.41.2000\n");
        daemon.last_full_poll = None;
        daemon.cycle(&[wake_naming("eth1")]).await;
        assert_eq!(daemon.monitor.statics.reads(), 4);
        assert_eq!(fw_ver(&daemon, "mlx5_1").as_deref(), Some("28.41.2000"));
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.40.1000"));
        daemon.shutdown().await;
    }

    #[test]
    fn the_trace_summary_says_how_many_wake_records_the_kernel_lost() {
        let lat: BTreeMap<&'static str, Vec<f64>> = [("qdisc_reset", vec![1.0, 2.0, 3.0])].into();
        let with = trace_summary(&lat, Some(4));
        assert!(with.contains("qdisc_reset                  count=3      p50=2.000"), "{with}");
        assert!(with.ends_with("  wake records lost in the kernel (eBPF ring buffer full): 4\n"), "{with}");
        let without = trace_summary(&BTreeMap::new(), None);
        assert_eq!(without, "trace summary (kernel timestamp -> poll finished, ms):\n  no wake-ups\n");
    }

    fn degradation(counter: &str, fatal: bool) -> HealthEvent {
        HealthEvent::new(Check::InfiniBandDegradationCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
            .entities(vec![Entity::nic("mlx5_0".to_string()), Entity::port(1)])
            .error_code(counter)
            .unhealthy(fatal)
    }

    /// The breach metric comes from the event's typed fields and the counters' state: a
    /// saturated counter's event is not a breach, whatever its message says.
    #[test]
    fn breaches_are_counted_from_typed_fields_saturation_excluded() {
        let mut next = crate::state::CheckState::default();
        next.counters.saturation_flags.insert(
            crate::counters::counter_key("mlx5_0", 1, "link_downed"),
            Saturation {
                check_name: Check::InfiniBandDegradationCheck.as_str().into(),
                value: 255,
                since: OffsetDateTime::UNIX_EPOCH,
            },
        );
        let poll = Poll {
            events: vec![degradation("symbol_error", true), degradation("link_downed", false)],
            next,
            ..Default::default()
        };
        let metrics = Metrics::new("n");
        update_metrics(&metrics, &poll, &poll.next);
        let text = metrics.encode();
        let breaches: Vec<&str> =
            text.lines().filter(|l| l.starts_with("nic_health_monitor_counter_threshold_breaches_total{")).collect();
        assert_eq!(breaches.len(), 1, "{breaches:#?}");
        assert!(breaches[0].contains("symbol_error") && breaches[0].ends_with(" 1"), "{}", breaches[0]);
    }

    /// A port whose state is unknown is neither healthy nor unhealthy in the metrics: it is
    /// left out of `nicmon_port_healthy` and shown by `nicmon_port_attribute_unknown`.
    #[test]
    fn an_unknown_port_is_not_exported_as_unhealthy() {
        use crate::model::{Device, Function, PhysState, Port, PortState};
        let port = |n: u32, state: Option<PortState>| Port {
            number: n,
            state: state.clone(),
            phys_state: Some(PhysState::LinkUp),
            unknown: if state.is_none() {
                [("state".to_string(), "empty".to_string())].into()
            } else {
                Default::default()
            },
            ..Port::default()
        };
        let dev = Device {
            name: "mlx5_0".into(),
            unsupported: None,
            pci_address: None,
            card: None,
            numa_node: None,
            hca_type: None,
            fw_ver: None,
            board_id: None,
            driver: None,
            function: Function::Pf,
            netdev: None,
            ports: vec![port(1, Some(PortState::Active)), port(2, None)],
            unknown: Default::default(),
        };
        let classification =
            crate::roles::Classification { monitored: true, reason: None, role: None, role_reason: None };
        let poll = Poll {
            snapshot: crate::model::Snapshot { devices: vec![dev], ..Default::default() },
            roles: [("mlx5_0".to_string(), classification)].into(),
            ..Default::default()
        };
        let metrics = Metrics::new("n");
        update_metrics(&metrics, &poll, &poll.next);
        let text = metrics.encode();
        assert!(text.contains(r#"nicmon_port_healthy{device="mlx5_0",port="1"} 1"#), "{text}");
        assert!(!text.contains(r#"nicmon_port_healthy{device="mlx5_0",port="2"}"#), "{text}");
        assert!(
            text.contains(r#"nicmon_port_attribute_unknown{device="mlx5_0",port="2",attribute="state"} 1"#),
            "{text}"
        );
    }
}
