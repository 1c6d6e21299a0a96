//! `nicmon run` (and `nicmon trace`): the daemon loop. One poll → evaluate → commit cycle
//! at a time, on a 1 s tick and on every wake-up (eBPF, rtnetlink, kernel log), until
//! SIGTERM or SIGINT, which finish the cycle; then flush what can be sent within a bound,
//! save, exit. Its rooms:
//! - `startup.rs`: everything before the first poll ([`Daemon::start`]), in named steps, and
//!   what stops it ([`StartError`]);
//! - `wakeup.rs`: where a wake-up becomes a poll (coalescing, targeted then full polls);
//! - `options.rs`: what `nicmon run` is told;
//! - `trace.rs`: what trace mode prints; `log.rs`: the log lines about a poll's outcome.
//!
//! Metrics observe each poll ([`crate::act::metrics::Metrics::observe`]). When an event is sent
//! and when it leaves the outbox: [`crate::act::courier`].
//!
//! Threads: the loop, the wake sources' tasks (the eBPF ring buffer's reader, rtnetlink) and
//! the courier's sender share one thread (`nicmon run` builds a single-threaded runtime): a
//! wake-up reaches the loop, and a commit the sink, without a thread wake-up in between — on
//! a virtual machine whose idle vCPUs halt, each such wake-up cost 0.05–0.15 ms. Whatever
//! may block or must answer while a poll runs has a thread of its own: the host reads (the
//! reader threads, [`crate::read::host`]), the metrics endpoint
//! ([`crate::act::metrics::server::ServerThread`]), the poll-stall watchdog ([`crate::act::stall`]),
//! the sink's syncs and FIFO writes (blocking threads).
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::Signal;
use tokio::sync::mpsc;

use crate::act::courier::Courier;
use crate::act::metrics::Metrics;
use crate::act::metrics::server::Liveness;
use crate::act::state::Loaded;
use crate::act::state::State;
use crate::decide::poll::Poll;
use crate::model::kmsg::Record;
use crate::monitor::Monitor;
use crate::read::kmsg::Delivery;
use crate::read::kmsg::KmsgTail;
use crate::read::wake::{Wake, WakeSource};

mod log;
mod options;
mod startup;
mod tick;
mod trace;
mod wakeup;

pub use options::{PollStall, RunOptions, parse_checks};
pub use startup::StartError;
use trace::PollKind;
pub use trace::trace_summary;
use wakeup::{TRAILING_POLL, Wakeup};

/// How long a signal waits for queued batches to be delivered. With the last poll (at most
/// [`crate::read::host::Deadlines::poll`]) and the final save, exit comes within 5 s of SIGTERM
/// whatever is stuck; what was not delivered stays in the outbox for the next start.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);

/// A full poll that queues at least this many events waits for their delivery before its
/// save ([`LARGE_COMMIT_WAIT`] at most).
pub const LARGE_COMMIT: usize = 1000;

/// How long a [`LARGE_COMMIT`] waits for its delivery before the save goes ahead without it.
pub const LARGE_COMMIT_WAIT: Duration = Duration::from_secs(1);

/// The runtime `nicmon run` drives [`run`] on: one thread for the loop, its wake sources
/// and the courier's sender (a wake-up, its poll and the sink's write take no thread hop);
/// the metrics endpoint, the host readers and the watchdog have threads of their own. Its
/// blocking threads (a file sink's sync, a write to a FIFO) are off the latency path: they
/// run with the scheduler's default slice, not the daemon's short one ([`crate::read::sched`]),
/// so a sync never gets the CPU ahead of the process reading the line just written.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(|| {
            let _ = crate::read::sched::default_slice();
        })
        .build()
}

/// Run the daemon until a signal.
pub async fn run(opts: RunOptions) -> Result<(), StartError> {
    let mut daemon = Daemon::start(&opts).await?;
    daemon.run_loop().await;
    daemon.shutdown().await;
    Ok(())
}

/// The running daemon.
pub struct Daemon<'a> {
    opts: &'a RunOptions,
    monitor: Monitor,
    state: State,
    loaded: Loaded,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    _server: Option<crate::act::metrics::server::ServerThread>,
    wakes: Option<WakeSource>,
    /// Declared before `_tail`, so dropped first: a tail thread blocked on a full channel
    /// then ends, and dropping the tail (which joins it) cannot wait for ever.
    kmsg: mpsc::Receiver<Delivery>,
    _tail: Option<KmsgTail>,
    courier: Courier,
    sigterm: Signal,
    tick: tick::Tick,
    /// When the earliest port held by `portStateHoldDown` is due: a poll then reports it
    /// (or finds it recovered) without waiting for the next tick.
    hold_due: Option<tokio::time::Instant>,
    pending_records: Vec<Record>,
    /// When the last wake-driven poll started (the rate limit's reference).
    last_wake_poll: Option<tokio::time::Instant>,
    /// When the last wake-driven poll for the kernel's word that a device or netdev was
    /// removed started: such a wake-up is polled at once, inside the rate limit's gap too,
    /// once per gap ([`wakeup::WAKE_POLL_GAP`]).
    last_removal_poll: Option<tokio::time::Instant>,
    /// When the last full poll started.
    last_full_poll: Option<Instant>,
    /// Within a burst, the shortest gap between two full polls after a targeted one
    /// ([`wakeup::BURST_FULL_POLL_GAP`]; a field so that tests on a loaded machine can
    /// hold a burst open however slow their polls are).
    burst_gap: Duration,
    /// When the trailing poll of the last wake-driven one is due ([`TRAILING_POLL`]).
    trailing_due: Option<tokio::time::Instant>,
    /// The last full poll's snapshot: what a wake-up's hint can name, and the base of a
    /// targeted poll.
    last_snapshot: Option<crate::model::Snapshot>,
    /// Devices named by wake-ups since the last full poll: it reads their static
    /// attributes again.
    statics_owed: BTreeSet<String>,
    /// What the kernel said was removed, and when ([`wakeup::KERNEL_WORD_KEPT`]).
    kernel_removed: std::collections::BTreeMap<String, Instant>,
    /// Whether the targeted poll's path ran once ([`Daemon::prime_targeted_poll`]).
    targeted_primed: bool,
    /// When a hinted eBPF record may wake the reader thread early ([`crate::read::wake::EarlyWake`]):
    /// `u64::MAX` until the first full poll, then the end of the rate limit's gap.
    early_gate: Arc<std::sync::atomic::AtomicU64>,
    /// Trace mode's kernel → poll-end latencies.
    trace_latencies: trace::Latencies,
    /// Wake records the kernel programs lost to a full ring buffer, as last read.
    lost_wakes: crate::read::wake::LostWakes,
    /// The poll-stall watchdog (`None`: `--poll-stall-deadline=0s`).
    stall: Option<crate::act::stall::Watchdog>,
}

impl<'a> Daemon<'a> {
    /// The loop: wait, then poll (or take acknowledgements), until a signal.
    pub async fn run_loop(&mut self) {
        loop {
            let woke = match self.wait().await {
                Wakeup::Acks(ids) => {
                    self.courier.delivered(&mut self.state, ids);
                    continue;
                }
                Wakeup::Poll(woke) => {
                    if !woke.is_empty() {
                        let now = tokio::time::Instant::now();
                        self.last_wake_poll = Some(now);
                        if woke.iter().any(|w| w.removed) {
                            self.last_removal_poll = Some(now);
                        }
                        self.trailing_due = Some(now + TRAILING_POLL);
                        let gap =
                            crate::read::wake::monotonic_ns().saturating_add(wakeup::WAKE_POLL_GAP.as_nanos() as u64);
                        self.early_gate.store(gap, std::sync::atomic::Ordering::Relaxed);
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
                    return;
                }
            };
            self.cycle(&woke).await;
        }
    }

    /// Shutdown: give the sender a bounded time to deliver what is queued, save.
    pub async fn shutdown(&mut self) {
        let deadline = tokio::time::Instant::now() + SHUTDOWN_FLUSH;
        self.courier.flush(&mut self.state, deadline).await;
        if !self.state.outbox.is_empty() {
            tracing::warn!(
                pending = self.state.outbox.len(),
                "exiting with undelivered batches: they are sent after the next start"
            );
        }
        if self.opts.trace {
            let lost = self.count_lost_wakes();
            println!("{}", self.trace_latencies.summary(lost));
        }
    }

    /// One cycle: read → decide, then act — metrics, logs, trace, and the courier's commit
    /// ([`Daemon::polls`]), watched by the poll-stall watchdog.
    async fn cycle(&mut self, woke: &[Wake]) {
        if let Some(s) = &self.stall {
            s.begin();
        }
        self.polls(woke).await;
        if let Some(s) = &self.stall {
            s.end();
        }
    }

    /// Read the kernel programs' count of wake records lost to a full ring buffer (once per
    /// full poll, off the latency path): the metric, a trace line, and a warning at most
    /// once per [`crate::read::wake::LOST_WARN_EVERY`]. The total, when it could be read.
    fn count_lost_wakes(&mut self) -> Option<u64> {
        let total = self.wakes.as_ref().and_then(|w| w.lost_records())?;
        let update = self.lost_wakes.update(total, Instant::now());
        if update.new > 0 {
            self.metrics.ebpf_wake_records_lost(update.new);
            if self.opts.trace {
                trace::print_lost(update.new, update.total);
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

    /// Right after a commit that queued batches (ids above `before`): the sender task runs
    /// on this thread (the daemon's runtime has one), so yield to it — it writes the new
    /// batches now rather than after the trace, metrics, logs and the save. A targeted
    /// poll's batches are delivered before anything else runs here: this thread waits
    /// meanwhile, so the process reading the sink gets the CPU as soon as the line is
    /// written (or after [`wakeup::TARGETED_DELIVERY_WAIT`]: a connector that is down).
    async fn let_the_sender_run(&mut self, before: u64, kind: &PollKind<'_>) {
        let sent = self.state.outbox.last_id();
        if sent <= before {
            return;
        }
        if let PollKind::Targeted(_) = kind {
            let deadline = tokio::time::Instant::now() + wakeup::TARGETED_DELIVERY_WAIT;
            self.courier.await_delivery(&mut self.state, sent, deadline).await;
        } else {
            tokio::task::yield_now().await;
        }
    }

    /// Act on one poll's result: the courier's commit, then trace, metrics, logs and the
    /// save. `records`: the kernel log records the poll consumed (kept for the next poll when
    /// the commit is refused).
    async fn act(
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
        // state file is saved after them, see crate::act::courier for why that order is safe).
        let mut poll = poll;
        let next = std::mem::take(&mut poll.next);
        let before = self.state.outbox.last_id();
        // The events move into the outbox's batches (the trace prints them in the poll's
        // order: a copy is kept for it); the logs and metrics read them there.
        let events = if self.opts.trace { poll.events.clone() } else { std::mem::take(&mut poll.events) };
        let (batches, committed) = self.courier.commit_events(&mut self.state, next, events);
        let handed_at = Instant::now();
        self.let_the_sender_run(before, &kind).await;
        let next = match &committed {
            Ok(()) => &self.state.checks,
            Err((_, checks)) => checks.as_ref(),
        };
        if self.opts.trace {
            trace::print_trace(woke, woke_at, &poll, elapsed, &kind, handed_at, self.state.outbox.last_id());
            self.trace_latencies.record(woke, &kind);
        }
        let events = || batches.iter().flat_map(|b| b.events.iter());
        self.metrics.observe_with_events(&poll, events(), next);
        log::poll(&poll, events());
        let queued: usize = batches.iter().map(|b| b.events.len()).sum();
        drop(batches);

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
        // The trace's copy of the events goes before the save.
        drop(std::mem::take(&mut poll.events));
        match committed {
            Ok(()) => {
                // A targeted poll's batches are on the latency path: its commit is saved
                // once they are delivered (`wakeup::targeted_poll`), so the state file's write and
                // sync do not compete with the sink's write.
                if !matches!(kind, PollKind::Targeted(_)) {
                    if queued >= LARGE_COMMIT {
                        // A large commit (a reboot's baselines on a node of many ports) is
                        // delivered before it is saved, for a bounded time: the state file is
                        // then written without it (once, not with the events and again
                        // without them), and its events are freed before the next poll
                        // reads. The journal covers a crash before the save, as for a
                        // targeted poll.
                        let deadline = tokio::time::Instant::now() + LARGE_COMMIT_WAIT;
                        let last = self.state.outbox.last_id();
                        self.courier.await_delivery(&mut self.state, last, deadline).await;
                    }
                    self.save();
                }
                // A deferred first poll ran nothing: the first poll (and the baselines a reboot
                // owes) is still to come.
                if !deferred {
                    self.loaded = Loaded::Resumed;
                }
                // Counted once committed: a poll that runs again finds the same blip.
                log::blips(&poll.holds.blips);
                for b in &poll.holds.blips {
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

    fn save(&mut self) {
        self.courier.save(&self.state);
    }
}
