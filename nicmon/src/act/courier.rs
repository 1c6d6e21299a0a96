//! The courier: how a health event is sent, and when it leaves the outbox.
//!
//! The [`Outbox`] is the data (batches, their bound, the commit rule); the courier moves
//! it. Every event a poll produces goes through here, nowhere else:
//!
//! 1. [`Courier::commit`] forms the cycle's events into **one batch per check**, each with
//!    the next increasing id, by the outbox's commit rule ([`Outbox::commit`]): a cycle
//!    whose batches do not all fit behind those queued is refused whole — nothing is
//!    queued, the checks' state does not advance, and the poll runs again;
//! 2. otherwise it appends them to the [`Outbox`], advances the checks' state, records them
//!    in the journal (below), **hands the new batches to the sender task at once** — and the
//!    caller then saves the state file ([`Courier::save`]; the outbox is part of it). The
//!    send does not wait for the fsync: the daemon's loop yields to the sender task (on
//!    the same thread) right after the commit, so the sink has the batches before the
//!    cycle's trace, metrics, logs and save (a targeted poll's commit, on the latency path,
//!    is saved once its batches were acknowledged, or after at most 50 ms:
//!    [`Courier::await_delivery`]);
//! 3. the sender task sends batches **strictly in order** through the [`Sink`], retrying a
//!    failing head batch forever (never skipping ahead);
//! 4. a batch the sink accepted — delivered, then made durable (below) — or rejected
//!    permanently, which no retry would change — is acknowledged; [`Courier::next_acks`]
//!    returns the ids and [`Courier::delivered`] removes them from the outbox
//!    ([`Outbox::ack`]) and saves again. **That is when an event leaves the outbox.**
//!    Acknowledgements are taken by the same loop that commits, so an id is never removed
//!    before the save that recorded it.
//!
//! ## Why sending before the save keeps at-least-once delivery
//!
//! The state file holds two things that move together: the checks' state (what was
//! already detected) and the outbox (what was detected and not yet acknowledged). A crash
//! can hit at three points of a commit:
//!
//! - **before the save** (the batch may or may not have reached the sink): the file still
//!   holds the previous checks' state, so after the restart the same poll sees the same
//!   host against the same previous state and **detects the same condition again** and
//!   sends it again (a duplicate at worst, never a loss). Kernel log records are re-read
//!   too: the cursor is saved with the checks' state;
//! - **after the save, before the acknowledgement**: the batch is in the saved outbox and
//!   is resent first after the restart ([`Courier::resume`]);
//! - **after the acknowledgement's save**: delivered, gone.
//!
//! What is re-detected is the *condition*, not the byte-identical event: a condition that
//! cleared while nicmon was down is reported by its current state (healthy) instead, which
//! is what a platform needs.
//!
//! ## Delivered, then durable, then acknowledged
//!
//! A send has two steps ([`Sink::deliver`], [`Sink::make_durable`]): the batch is
//! *delivered* when the connector replied (gRPC) or its lines are written to the file sink
//! (`write` returned: every reader of the file sees them) — that is the latency the
//! daemon is measured by; it is *durable* when the file sink has also synced the file's
//! data (`fdatasync`; a reply or a stream write is durable as it is). The sender
//! acknowledges a batch only once it is durable, and only an acknowledgement removes it
//! from the outbox (and so from the state file). So the sync is off the delivery path —
//! the line is readable before the disk has it — and at-least-once holds across a power
//! loss: a batch written but not synced when the power goes is still owed by the state
//! file (or, not saved either, re-detected) and is written again. A sync that fails is a
//! failed send: the batch is written again (a duplicate line at worst).
//!
//! ## The "sent, not yet saved" journal
//!
//! Re-detection alone leaves one hole: a crash between the send and the save, then a
//! recovery before the restarted daemon's first poll. The platform holds the fatal event
//! that reached it, the saved state says the port was last reported healthy, the port is
//! healthy again: nothing would clear the fatal. So before the hand-off
//! ([`Courier::commit`]) the new batches are appended to a small journal next to the state
//! file (`<state file>.sent`, one JSON batch a line, **not** fsynced: a killed process's
//! writes stay in the page cache; a power loss is a reboot, whose new boot ID makes the
//! first poll clear everything anyway). A successful save empties it. At start-up
//! ([`Courier::resume`]), [`Journal::recover`] takes the batches it holds that the loaded state does not
//! (ids above the saved `next_batch_id`) and
//!
//! - queues them again (resent first: the send may not have happened; a duplicate at
//!   worst), and
//! - applies what they told the platform to the state checks' port records (`reported`),
//!   so the first poll sees the difference to the port's current state and reports it
//!   (the healthy event that clears the fatal).
//!
//! Counter and kernel log events need no such step: their state (counter snapshots, the
//! kernel log cursor) was not saved either, so the condition is re-detected (a duplicate).
//! Not covered: a character device's missing-node fatal whose node came back before the
//! restart (the latch is not rebuilt from the journal; the fatal is resent, not cleared).
//! An unacknowledged batch may thus be sent twice (at-least-once delivery), never lost —
//! proven by the kill -9 test in `tests/tests/daemon.rs`.
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::act::dispatch::Sink;
use crate::act::metrics::{Metrics, SendOutcome};
use crate::act::outbox::{Outbox, PendingBatch, QueueBounds, QueueFull};
use crate::act::state::State;
use crate::act::state::file::Writer;
use crate::decide::state::CheckState;
use crate::model::event::HealthEvent;
use crate::model::event::{Check, CheckKind, Subject};

/// The "sent, not yet saved" journal (`<state file>.sent`; the rule: the module's notes).
pub struct Journal {
    path: PathBuf,
    /// Something was appended since the last save.
    dirty: bool,
    /// The journal as last opened, kept between appends while it is still the file at
    /// `path` (its open and close were most of an append's cost on the latency path).
    file: Option<std::fs::File>,
}

/// The most of a journal read back (a larger file is ignored with a warning).
const JOURNAL_MAX_BYTES: usize = 16 << 20;

impl Journal {
    pub fn new(state_file: &Path) -> Journal {
        let mut name = state_file.as_os_str().to_owned();
        name.push(".sent");
        Journal { path: name.into(), dirty: true, file: None }
    }

    /// The journal file, opened for appending (O_NONBLOCK: a FIFO at the journal's path
    /// fails the open, no reader, instead of blocking the courier; a regular file is
    /// written as without it), or the one kept since while it is still the file at its
    /// path (a journal removed, moved or replaced is opened anew there).
    fn file(&mut self) -> std::io::Result<&std::fs::File> {
        let f = match self.file.take().filter(|f| is_at(f, &self.path)) {
            Some(f) => f,
            None => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&self.path)?,
        };
        Ok(self.file.insert(f))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `batches` (before they are handed to the sender). Not fsynced (why: the
    /// module's notes). A failure is logged: the send goes ahead (delivery first).
    pub fn record(&mut self, batches: &[Arc<PendingBatch>]) {
        use std::io::Write;
        if batches.is_empty() {
            return;
        }
        // Streamed (a reboot's baselines on a device with 1,000 ports are ~14,000 events).
        let written = self.file().and_then(|f| {
            let mut out = std::io::BufWriter::with_capacity(64 << 10, f);
            for b in batches {
                serde_json::to_writer(&mut out, &**b).map_err(std::io::Error::from)?;
                out.write_all(b"\n")?;
            }
            out.flush()
        });
        if let Err(e) = written {
            // Opened anew for the next append.
            self.file = None;
            tracing::warn!(path = %self.path.display(), error = %e, "cannot append to the sent-batch journal");
        }
        self.dirty = true;
    }

    /// The state file now holds everything sent: empty the journal (once per save that
    /// follows a send).
    pub fn saved(&mut self) {
        if !self.dirty {
            return;
        }
        // Through the kept file while it is still the one at the path (appends then go
        // to its new end: O_APPEND).
        if let Some(f) = self.file.take().filter(|f| is_at(f, &self.path))
            && f.set_len(0).is_ok()
        {
            self.file = Some(f);
            self.dirty = false;
            return;
        }
        match std::fs::OpenOptions::new().write(true).truncate(true).custom_flags(libc::O_NONBLOCK).open(&self.path) {
            Ok(_) => self.dirty = false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.dirty = false,
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "cannot empty the sent-batch journal"),
        }
    }

    /// The batches of a journal's text that `state` does not hold (ids above its last
    /// batch id), in id order. Lines that do not parse (a torn last line) are skipped.
    pub fn unsaved(text: &[u8], state: &State) -> Vec<PendingBatch> {
        let last = state.outbox.last_id();
        let mut out: Vec<PendingBatch> = text
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice::<PendingBatch>(l).ok())
            .filter(|b| b.id > last)
            .collect();
        out.sort_by_key(|b| b.id);
        out.dedup_by_key(|b| b.id);
        out
    }

    /// Start-up, with the state loaded for this boot (`resumed`: the same boot's state was
    /// loaded; otherwise the first poll clears everything and the journal is only
    /// emptied): queue again what was sent but not saved, and apply what it told the
    /// platform to the port records, so the first poll reports each port's current
    /// state where it differs from what was sent. Returns the batches recovered.
    pub fn recover(&mut self, state: &mut State, resumed: bool) -> Vec<PendingBatch> {
        let text = match crate::read::host::read_file(&self.path, JOURNAL_MAX_BYTES) {
            Ok(t) => t,
            Err(crate::read::host::ReadError::Missing) => return Vec::new(),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "sent-batch journal unreadable: ignored");
                Vec::new()
            }
        };
        let unsaved = if resumed { Journal::unsaved(&text, state) } else { Vec::new() };
        apply_sent(state, &unsaved);
        state.outbox.restore(&unsaved);
        unsaved
    }
}

/// Whether `file` is the file at `path` (the same inode, still linked).
fn is_at(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(kept), Ok(there)) = (file.metadata(), std::fs::metadata(path)) else { return false };
    kept.nlink() > 0 && (kept.dev(), kept.ino()) == (there.dev(), there.ino())
}

/// What sent batches told the platform, written into the state checks' port records.
fn apply_sent(state: &mut State, batches: &[PendingBatch]) {
    use crate::decide::linkstate::state::{Reported, port_key};
    for e in batches.iter().flat_map(|b| &b.events) {
        if e.check().map(Check::kind) != Some(CheckKind::PortState) {
            continue;
        }
        let Subject::Port { device, port } = e.subject() else { continue };
        if let Some(r) = state.checks.links.port_states.get_mut(&port_key(device, port)) {
            r.reported = match (e.is_healthy, e.is_fatal) {
                (true, _) => Reported::Healthy,
                (false, true) => Reported::Fatal,
                (false, false) => Reported::NonFatal,
            };
        }
    }
}

/// Where the courier saves: the state file (through its write policy) and the journal
/// beside it.
struct Keep {
    writer: Writer,
    journal: Journal,
}

/// The live side of the outbox: the sender task and its two channels (batches out,
/// acknowledgements back), the journal, and the saves. Dropping it stops the sender.
pub struct Courier {
    /// Each batch with the monotonic instant (ns) it was handed over (trace mode's stages).
    tx: Option<mpsc::UnboundedSender<(Arc<PendingBatch>, u64)>>,
    /// Trace mode: the sender prints a line per batch it delivered (`nicmon trace`).
    trace: Arc<AtomicBool>,
    /// The outbox's bound ([`QueueBounds::for_sink`]); `None`: unbounded.
    bounds: Option<QueueBounds>,
    acks: mpsc::UnboundedReceiver<u64>,
    task: JoinHandle<()>,
    /// `None`: nothing is saved (a courier started without a state file).
    keep: Option<Keep>,
}

impl Drop for Courier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A commit the outbox's bound refused: why, and the checks' state given back.
pub type Refused = (QueueFull, Box<CheckState>);

impl Courier {
    /// The daemon's courier, at start-up: queue again what the journal beside `state_file`
    /// holds that `state` does not (`resumed`: `state` is this boot's, see
    /// [`Journal::recover`]), start the sender with everything `state`'s outbox holds
    /// (sent first, in order), and save to `state_file` from now on.
    pub fn resume(
        sink: Sink,
        state_file: &Path,
        state: &mut State,
        resumed: bool,
        bounds: QueueBounds,
        metrics: Arc<Metrics>,
        pause: Duration,
    ) -> Courier {
        let mut journal = Journal::new(state_file);
        let recovered = journal.recover(state, resumed);
        if !recovered.is_empty() {
            tracing::info!(
                batches = recovered.len(),
                path = %journal.path().display(),
                "batches sent but not saved before the last stop: queued again, and the first poll reports \
                 every port whose state differs from what they said"
            );
        }
        let mut courier = Courier::start(sink, &state.outbox, Some(bounds), metrics, pause);
        courier.keep = Some(Keep { writer: Writer::told(state_file), journal });
        courier
    }

    /// Start the sender task on `sink` and hand it what `outbox` still holds (batches
    /// loaded from the state file are sent first, in order). Saves nothing until
    /// [`Courier::keeping`] names a state file. `bounds`: the outbox's bound. `pause`: the
    /// wait between two tries of a failing head batch.
    pub fn start(
        sink: Sink,
        outbox: &Outbox,
        bounds: Option<QueueBounds>,
        metrics: Arc<Metrics>,
        pause: Duration,
    ) -> Courier {
        let (tx, rx) = mpsc::unbounded_channel();
        let (atx, acks) = mpsc::unbounded_channel();
        for b in outbox.pending() {
            let _ = tx.send((b.clone(), crate::read::wake::monotonic_ns()));
        }
        let trace = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(send_in_order(sink, rx, atx, metrics, pause, trace.clone()));
        Courier { tx: Some(tx), trace, bounds, acks, task, keep: None }
    }

    /// Save to `state_file` (and journal beside it) from now on.
    pub fn keeping(mut self, state_file: &Path) -> Courier {
        self.keep = Some(Keep { writer: Writer::told(state_file), journal: Journal::new(state_file) });
        self
    }

    /// Trace mode: print `sent batch=… handed_ns=… sender_ns=… accepted_ns=…` (monotonic
    /// clock) for each batch the sink accepted.
    pub fn set_trace(&self, on: bool) {
        self.trace.store(on, Ordering::Relaxed);
    }

    /// Queue `events` in the state's outbox by the commit rule and advance its checks to
    /// `checks`, record the new batches in the journal and hand them to the sender. The
    /// caller then saves ([`Courier::save`]; see the module's notes for why sending first is
    /// safe). A cycle the outbox's bound refuses changes nothing (`Err`, with `checks`
    /// given back).
    pub fn commit(&mut self, state: &mut State, checks: CheckState, events: &[HealthEvent]) -> Result<(), Refused> {
        self.commit_events(state, checks, events.to_vec()).1
    }

    /// [`Courier::commit`] of `events` taken whole: each moves into its batch
    /// ([`crate::act::outbox::Outbox::batches_of`]). Returns the batches made (queued, shared
    /// with the outbox and the sender, unless refused), for the caller's logs and metrics.
    pub fn commit_events(
        &mut self,
        state: &mut State,
        checks: CheckState,
        events: Vec<HealthEvent>,
    ) -> (Vec<Arc<PendingBatch>>, Result<(), Refused>) {
        let (new, queued) = state.outbox.commit_events(self.bounds.as_ref(), events);
        if let Err(full) = queued {
            return (new, Err((full, Box::new(checks))));
        }
        if let Some(keep) = &mut self.keep {
            // The writer is told what changed (it keeps no copy of what it wrote).
            keep.writer.checks_changed(&state.checks, &checks);
        }
        state.checks = checks;
        if let Some(keep) = &mut self.keep {
            keep.journal.record(&new);
        }
        if let Some(tx) = &self.tx {
            for b in &new {
                let _ = tx.send((b.clone(), crate::read::wake::monotonic_ns()));
            }
        }
        (new, Ok(()))
    }

    /// Save `state` by the state file's write policy; once saved, the journal is emptied.
    pub fn save(&mut self, state: &State) {
        if let Some(keep) = &mut self.keep
            && keep.writer.save(state, Instant::now())
        {
            keep.journal.saved();
        }
    }

    /// Wait for the next acknowledgement, then take every other one already there. `None`
    /// once the sender task is gone.
    pub async fn next_acks(&mut self) -> Option<Vec<u64>> {
        let first = self.acks.recv().await?;
        let mut ids = vec![first];
        while let Ok(id) = self.acks.try_recv() {
            ids.push(id);
        }
        Some(ids)
    }

    /// The acknowledgements already there, without waiting.
    pub fn ready_acks(&mut self) -> Vec<u64> {
        let mut ids = Vec::new();
        while let Ok(id) = self.acks.try_recv() {
            ids.push(id);
        }
        ids
    }

    /// The sender acknowledged these batches ([`Courier::next_acks`]): they leave the
    /// outbox, and the state is saved.
    pub fn delivered(&mut self, state: &mut State, ids: Vec<u64>) {
        for id in ids {
            state.outbox.ack(id);
        }
        self.save(state);
    }

    /// Take acknowledgements until every batch up to `id` has left the outbox, or until
    /// `deadline`. The batches acknowledged leave the outbox without a save: the caller
    /// saves once after (the journal covers a crash before that save).
    pub async fn await_delivery(&mut self, state: &mut State, id: u64, deadline: tokio::time::Instant) {
        while state.outbox.pending().first().is_some_and(|b| b.id <= id) {
            match tokio::time::timeout_at(deadline, self.next_acks()).await {
                Ok(Some(ids)) => {
                    for id in ids {
                        state.outbox.ack(id);
                    }
                }
                _ => return,
            }
        }
    }

    /// Shutdown: send nothing new, give the sender until `deadline` to deliver what the
    /// outbox holds (acknowledging as it goes), then write the state as it is.
    pub async fn flush(&mut self, state: &mut State, deadline: tokio::time::Instant) {
        self.tx = None;
        while !state.outbox.is_empty() {
            match tokio::time::timeout_at(deadline, self.acks.recv()).await {
                Ok(Some(id)) => state.outbox.ack(id),
                _ => break,
            }
        }
        if let Some(keep) = &mut self.keep
            && keep.writer.flush(state, Instant::now())
        {
            keep.journal.saved();
        }
    }
}

/// Send batches in order; retry a failing head batch forever (with the policy's backoff
/// inside each send and a pause between sends), never skip ahead.
async fn send_in_order(
    mut sink: Sink,
    mut rx: mpsc::UnboundedReceiver<(Arc<PendingBatch>, u64)>,
    acks: mpsc::UnboundedSender<u64>,
    metrics: Arc<Metrics>,
    pause: Duration,
    trace: Arc<AtomicBool>,
) {
    while let Some((batch, handed_ns)) = rx.recv().await {
        let taken_ns = crate::read::wake::monotonic_ns();
        loop {
            // Delivered first (the connector replied, the file's lines are written), then made
            // durable (the file sink's fdatasync) before the acknowledgement: see the
            // module's notes.
            let mut delivered_ns = 0;
            let result = match sink.deliver(&batch.events).await {
                Ok(()) => {
                    delivered_ns = crate::read::wake::monotonic_ns();
                    sink.make_durable().await
                }
                Err(e) => Err(e),
            };
            metrics.record_send(batch.check.as_str(), &batch.events, SendOutcome::of(&result));
            match result {
                Ok(()) => {
                    if trace.load(Ordering::Relaxed) {
                        println!(
                            "sent batch={} check={} events={} handed_ns={handed_ns} sender_ns={taken_ns} accepted_ns={delivered_ns} durable_ns={}",
                            batch.id,
                            batch.check,
                            batch.events.len(),
                            crate::read::wake::monotonic_ns()
                        );
                    }
                    tracing::debug!(check = %batch.check, events = batch.events.len(), "batch accepted");
                    let _ = acks.send(batch.id);
                    break;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(check = %batch.check, error = %e, "connector unavailable: batch kept, retrying");
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    // A permanent rejection will not succeed by retrying; keeping it would
                    // block every later batch forever.
                    tracing::error!(check = %batch.check, error = %e, events = ?batch.events, "batch rejected permanently: dropped");
                    let _ = acks.send(batch.id);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Stamp;

    fn ev(check: Check) -> HealthEvent {
        HealthEvent::new(check, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, "x")
    }

    #[tokio::test]
    async fn a_cycle_the_bound_refuses_changes_nothing() {
        let sink = Sink::lazy(
            &crate::act::dispatch::SinkSpec::Stdout,
            crate::act::dispatch::GrpcConfig::new(crate::act::dispatch::DEFAULT_SOCKET.parse().unwrap()),
        );
        let bounds = QueueBounds { max_batches: 1, max_bytes: usize::MAX };
        let mut state = State::fresh(None);
        let mut courier =
            Courier::start(sink, &state.outbox, Some(bounds), Arc::new(Metrics::new("n")), Duration::ZERO);
        let two = [ev(Check::InfiniBandStateCheck), ev(Check::NICKernelLogCheck)];
        let checks = CheckState { polls: 1, ..CheckState::default() };
        let refused = courier.commit(&mut state, checks, &two);
        assert!(refused.is_err());
        assert_eq!(state, State::fresh(None));
    }

    /// A long outage producing many events against a small bound: the outbox never grows
    /// past it, nothing queued is dropped, and once the connector is back the platform ends
    /// with the newest state of every entity — fatal ones included.
    #[tokio::test]
    async fn a_long_outage_stays_bounded_and_the_platform_ends_correct() {
        use crate::model::event::Entity;
        use std::collections::BTreeMap;
        // No connector listens here: every send fails and is retried.
        let sink = Sink::lazy(
            &crate::act::dispatch::SinkSpec::Grpc,
            crate::act::dispatch::GrpcConfig::new("unix:///nonexistent/nicmon-outage.sock".parse().unwrap()),
        );
        let bounds = QueueBounds { max_batches: 4, max_bytes: usize::MAX };
        let mut state = State::fresh(None);
        let mut courier =
            Courier::start(sink, &state.outbox, Some(bounds), Arc::new(Metrics::new("n")), Duration::from_secs(3600));
        // The node: 10 entities, each healthy, non-fatal or fatal. The checks' memory is what
        // was last committed; a cycle emits the difference (as the state checks do).
        let mut world: BTreeMap<u32, (bool, bool)> = (0..10).map(|e| (e, (true, false))).collect();
        let mut committed = world.clone();
        let event = |e: u32, (healthy, fatal): (bool, bool)| {
            let ev =
                HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, "x")
                    .entities(vec![Entity::device(format!("mlx5_{e}"))]);
            if healthy { ev } else { ev.unhealthy(fatal) }
        };
        let mut delivered: Vec<HealthEvent> = Vec::new();
        let mut polls = 0u64;
        let mut refused = 0;
        let mut cycle =
            |world: &BTreeMap<u32, (bool, bool)>, committed: &mut BTreeMap<u32, (bool, bool)>, state: &mut State| {
                let events: Vec<HealthEvent> =
                    world.iter().filter(|(e, s)| committed.get(e) != Some(s)).map(|(e, s)| event(*e, *s)).collect();
                polls += 1;
                let checks = CheckState { polls, ..CheckState::default() };
                let ok = courier.commit(state, checks, &events).is_ok();
                if ok {
                    *committed = world.clone();
                }
                assert!(state.outbox.len() <= bounds.max_batches, "the outbox stays within its bound");
                ok
            };
        for i in 0..500u32 {
            // Entities flap through every state; some end fatal.
            let e = i % 10;
            world.insert(
                e,
                match (i / 10) % 3 {
                    0 => (false, true),
                    1 => (true, false),
                    _ => (false, false),
                },
            );
            if !cycle(&world, &mut committed, &mut state) {
                refused += 1;
            }
        }
        assert!(refused > 0, "the outage filled the outbox");
        // A fatal event queued during the outage is still there (nothing queued is dropped).
        let queued_fatal = state.outbox.pending().iter().flat_map(|b| &b.events).filter(|e| e.is_fatal).count();
        assert!(queued_fatal > 0);
        // The connector is back: deliver in order, acknowledging; each cycle queues the rest.
        for _ in 0..20 {
            let ids: Vec<u64> = state.outbox.pending().iter().map(|b| b.id).collect();
            for b in state.outbox.pending() {
                delivered.extend(b.events.iter().cloned());
            }
            for id in ids {
                state.outbox.ack(id);
            }
            let _ = cycle(&world, &mut committed, &mut state);
        }
        assert!(state.outbox.is_empty());
        // The platform's view: the last event per entity.
        let mut platform: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for e in &delivered {
            platform.insert(e.entities_text(), (e.is_healthy, e.is_fatal));
        }
        for (e, s) in &world {
            let key = event(*e, *s).entities_text();
            let seen = platform.get(&key).copied().unwrap_or((true, false));
            assert_eq!(seen, *s, "{key}: the platform ends with the node's newest state");
        }
    }

    #[tokio::test]
    async fn sent_without_waiting_for_the_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev.jsonl");
        let sink = Sink::lazy(
            &crate::act::dispatch::SinkSpec::File(path.clone()),
            crate::act::dispatch::GrpcConfig::new(crate::act::dispatch::DEFAULT_SOCKET.parse().unwrap()),
        );
        let mut state = State::fresh(None);
        let mut courier =
            Courier::start(sink, &state.outbox, None, Arc::new(Metrics::new("n")), Duration::from_millis(10));
        let mut saved = None;
        let checks = CheckState { polls: 1, ..CheckState::default() };
        let (handed, handed_rx) = std::sync::mpsc::channel();
        let committed = courier.commit(&mut state, checks, &[ev(Check::EthernetStateCheck)]);
        // The save that follows the commit.
        let mut save = |s: &State| {
            assert_eq!(s.checks.polls, 1, "the checks advance with the outbox");
            assert_eq!(s.outbox.len(), 1, "the batch is in the outbox being saved");
            saved = Some(s.outbox.clone());
            let _ = handed.send(());
        };
        save(&state);
        assert!(committed.is_ok());
        assert!(handed_rx.try_recv().is_ok(), "save ran");
        assert_eq!(saved.unwrap().len(), 1);
        let mut outbox = state.outbox;
        let acks = courier.next_acks().await.unwrap();
        assert_eq!(acks, vec![1]);
        for id in acks {
            outbox.ack(id);
        }
        assert!(outbox.is_empty());
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
    }

    /// The sender does not wait for the save: a save that blocks until the sink has the
    /// batch completes (with sending after the save, it would wait forever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_sink_has_the_batch_while_the_save_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev.jsonl");
        let sink = Sink::lazy(
            &crate::act::dispatch::SinkSpec::File(path.clone()),
            crate::act::dispatch::GrpcConfig::new(crate::act::dispatch::DEFAULT_SOCKET.parse().unwrap()),
        );
        let mut state = State::fresh(None);
        let mut courier =
            Courier::start(sink, &state.outbox, None, Arc::new(Metrics::new("n")), Duration::from_millis(10));
        let checks = CheckState { polls: 1, ..CheckState::default() };
        let seen = tokio::task::block_in_place(|| {
            let mut seen = false;
            let _ = courier.commit(&mut state, checks, &[ev(Check::EthernetStateCheck)]);
            // The save that follows the commit. Bounded: a regression fails the assertion
            // below instead of hanging.
            for _ in 0..500 {
                if std::fs::read_to_string(&path).map(|t| t.lines().count() == 1).unwrap_or(false) {
                    seen = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10)); // waiting on another thread's file write
            }
            seen
        });
        assert!(seen, "the batch reached the sink while the state was being saved");
        assert_eq!(courier.next_acks().await.unwrap(), vec![1]);
    }

    /// The journal is kept open between appends and emptied through it; one removed or
    /// replaced at its path is opened anew there, so nothing recorded goes to a file no
    /// restart would read.
    #[test]
    fn the_kept_journal_follows_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::new(&dir.path().join("state.json"));
        let path = journal.path().to_path_buf();
        let mut o = Outbox::default();
        let lines = |p: &Path| std::fs::read_to_string(p).map(|t| t.lines().count()).unwrap_or(0);
        let mut one = || -> Vec<Arc<PendingBatch>> {
            o.enqueue(&[ev(Check::EthernetStateCheck)]).into_iter().map(Arc::new).collect()
        };
        journal.record(&one());
        journal.record(&one());
        assert_eq!(lines(&path), 2);
        journal.saved();
        assert_eq!(lines(&path), 0, "emptied");
        journal.record(&one());
        assert_eq!(lines(&path), 1, "appended after the emptying, from its start");
        std::fs::remove_file(&path).unwrap();
        journal.record(&one());
        assert_eq!(lines(&path), 1, "removed: made anew at its path");
        std::fs::rename(&path, dir.path().join("elsewhere")).unwrap();
        std::fs::write(&path, "").unwrap();
        journal.record(&one());
        assert_eq!(lines(&path), 1, "replaced: the file at its path is written");
        let state = State::fresh(None);
        assert_eq!(Journal::unsaved(std::fs::read(&path).unwrap().as_slice(), &state).len(), 1);
    }

    proptest::proptest! {
        /// The journal is outside data (a torn line after a kill): any bytes parse without
        /// a panic, only whole batches above the saved id come back, in id order.
        #[test]
        fn any_journal_text_parses_without_panic(text in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512), cut in 0usize..400) {
            let state = State::fresh(None);
            let _ = Journal::unsaved(&text, &state);
            let mut o = Outbox::default();
            let b = o.enqueue(&[ev(Check::EthernetStateCheck), ev(Check::NICKernelLogCheck)]);
            let mut good = Vec::new();
            for x in &b {
                serde_json::to_writer(&mut good, x).unwrap();
                good.push(b'\n');
            }
            let torn = &good[..cut.min(good.len())];
            let back = Journal::unsaved(torn, &state);
            proptest::prop_assert!(back.len() <= 2);
            proptest::prop_assert!(back.windows(2).all(|w| w[0].id < w[1].id));
            proptest::prop_assert_eq!(Journal::unsaved(&good, &state), b);
        }
    }
}
