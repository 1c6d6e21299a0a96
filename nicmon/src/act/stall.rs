//! `NICPollStallCheck`: NVSentinel's poll-stall watchdog (`--poll-stall-deadline`,
//! `--poll-stall-store-only`).
//!
//! A poll whose host reads hang would leave NIC state unobserved without anything saying so
//! (until `/healthz` restarts the pod, and again after). The watchdog says it: once a poll
//! has been in flight for the deadline, one node-level `NICPollStallCheck` event (unhealthy,
//! non-fatal, action `NONE`) is published; when a poll completes again, a healthy one. The
//! first poll to complete after start publishes a healthy event too, which closes a stall left
//! open by a restart. A stall whose publish failed stays owed: it is published even after the
//! poll ended, then the recovery. Events carry `STORE_ONLY` with `--poll-stall-store-only`,
//! else the daemon's `--processing-strategy`.
//!
//! The message is upstream's: `NIC state cannot be observed: counter poll in flight for 11s,
//! state poll in flight for 11s` — upstream names each of its two loops (state, counter)
//! that is stalled, sorted; nicmon's one poll reads both, so a stalled poll is both.
//!
//! Independence: the watchdog is its own OS thread with its own sink (its own connection
//! to the connector), so a poll stuck in a read cannot hold it, and its publishes never wait
//! behind the outbox. The poll loop only marks [`Watchdog::begin`] and [`Watchdog::end`].
//! What a poll is: read → decide → queue into the outbox. The poll never waits on the
//! connector (the outbox's sender delivers in its own task), so a slow or absent connector
//! is never counted as a stall; the watchdog's own publishes wait on the server in its
//! thread, during which it checks nothing (a stall is reported once that publish settles).
//!
//! Split as elsewhere: [`Tracker`] decides (pure, on given instants); the thread acts.
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::act::dispatch::{GrpcConfig, Sink, SinkSpec};
use crate::act::metrics::SendOutcome;
use crate::model::event::{Check, HealthEvent, ProcessingStrategy, RecommendedAction, Stamp};

/// The event's `checkName` (not a `--checks` name: the watchdog runs whatever checks run).
pub const CHECK_NAME: &str = "NICPollStallCheck";
/// `--poll-stall-deadline` when not given: upstream's chart value.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(10);

/// The loops a stalled poll stops, as upstream names them (its `category` label, sorted):
/// nicmon's poll reads both the state and the counters.
pub const STALLED_LOOPS: [&str; 2] = ["counter", "state"];

/// What the watchdog owes the connector now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// A poll has been in flight this long (≥ the deadline) and no stall is reported yet
    /// (the poll may have ended since: a stall whose publish failed is still owed).
    Stalled(Duration),
    /// No poll is stalled, one has completed, and a stall is reported (or nothing has been
    /// published since start).
    Healthy,
}

/// The watchdog's state. Instants are given, so tests decide without a clock.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    /// When the poll in flight began.
    started: Option<Instant>,
    /// A poll completed since the last stall was reported (or since start).
    completed: bool,
    /// A stall event is the last one published.
    reported: bool,
    /// A healthy event has been published since start.
    baselined: bool,
    /// A stall seen and not yet published.
    owed: Option<Owed>,
}

/// A stall seen by [`Tracker::due`] whose publish has not settled.
#[derive(Debug, Clone, Copy)]
struct Owed {
    in_flight: Duration,
    /// Its poll has completed since (the recovery follows the stall at once).
    ended: bool,
}

impl Tracker {
    pub fn begin(&mut self, now: Instant) {
        self.started = Some(now);
    }

    /// The poll in flight completed. Returns whether the watchdog has something to publish
    /// now (a stall owed or reported, its recovery, or the start-up baseline): only then is
    /// it woken, so a steady stream of polls costs its thread nothing.
    pub fn end(&mut self) -> bool {
        self.started = None;
        self.completed = true;
        if let Some(o) = &mut self.owed {
            o.ended = true;
        }
        self.owed.is_some() || self.reported || !self.baselined
    }

    /// What is due at `now` with this deadline. A stall seen here stays owed until it is
    /// [`settled`](Tracker::settled), whether or not its poll ends first.
    pub fn due(&mut self, now: Instant, deadline: Duration) -> Due {
        if let Some(started) = self.started {
            let in_flight = now.saturating_duration_since(started);
            if in_flight >= deadline && !self.reported {
                self.owed = Some(Owed { in_flight, ended: false });
            }
        }
        if let Some(o) = self.owed {
            return Due::Stalled(o.in_flight);
        }
        if !self.stalled_now(now, deadline) && self.completed && (self.reported || !self.baselined) {
            Due::Healthy
        } else {
            Due::Nothing
        }
    }

    /// Whether the poll in flight has been so for `deadline` or longer at `now`: upstream's
    /// `nic_health_monitor_poll_stalled` (whatever has been published).
    pub fn stalled_now(&self, now: Instant, deadline: Duration) -> bool {
        self.started.is_some_and(|s| now.saturating_duration_since(s) >= deadline)
    }

    /// How long the watchdog may wait before it looks again, unless woken: until the poll
    /// in flight reaches `deadline`; a whole `deadline` when none is in flight (a poll that
    /// begins later cannot stall sooner) or the one in flight is past it already (its end
    /// wakes the watchdog). So a steady stream of polls wakes the watchdog's thread once
    /// per deadline, not every [`check_interval`], and a stall is seen as it comes due.
    pub fn next_look(&self, now: Instant, deadline: Duration) -> Duration {
        match self.started.map(|s| (s + deadline).saturating_duration_since(now)) {
            Some(left) if !left.is_zero() => left,
            _ => deadline,
        }
    }

    /// `due` was published (accepted, or rejected for good: it will not be accepted later).
    pub fn settled(&mut self, due: Due) {
        match due {
            Due::Stalled(_) => {
                self.reported = true;
                // A poll completed after the stalled one began: the recovery is due now.
                self.completed = self.owed.take().is_some_and(|o| o.ended);
            }
            Due::Healthy => {
                self.reported = false;
                self.baselined = true;
            }
            Due::Nothing => {}
        }
    }
}

/// The shortest wait between two looks.
const MIN_LOOK: Duration = Duration::from_millis(1);

/// How long a publish that failed waits before it is tried again: upstream's look
/// interval, `min(1s, deadline/4)` (at least 10 ms; the looks themselves come as a stall
/// comes due: [`Tracker::next_look`]).
pub fn check_interval(deadline: Duration) -> Duration {
    (deadline / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The event for `due` (`None` for [`Due::Nothing`]).
pub fn event(due: Due, stamp: &Stamp, now: OffsetDateTime) -> Option<HealthEvent> {
    let (message, healthy) = match due {
        Due::Nothing => return None,
        Due::Stalled(d) => (stall_message(d), false),
        Due::Healthy => ("NIC polls are completing".to_string(), true),
    };
    // Built as any event, then filed under the watchdog's own check name.
    let mut e = HealthEvent::new(Check::InfiniBandStateCheck, stamp, now, &message);
    e.check_name = std::borrow::Cow::Borrowed(CHECK_NAME);
    if !healthy {
        e = e.unhealthy(false).action(RecommendedAction::NONE);
    }
    Some(e)
}

/// Upstream's message: each stalled loop, sorted, comma-joined.
fn stall_message(in_flight: Duration) -> String {
    let loops: Vec<String> =
        STALLED_LOOPS.iter().map(|l| format!("{l} poll in flight for {}", go_seconds(in_flight))).collect();
    format!("NIC state cannot be observed: {}", loops.join(", "))
}

/// `d` as Go prints `d.Round(time.Second)`: `0s`, `11s`, `1m30s`, `2h0m5s`.
fn go_seconds(d: Duration) -> String {
    let s = (d.as_millis() + 500) / 1000;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// The strategy stall events carry.
pub fn strategy(store_only: bool, daemon: ProcessingStrategy) -> ProcessingStrategy {
    if store_only { ProcessingStrategy::STORE_ONLY } else { daemon }
}

struct Shared {
    tracker: Mutex<Tracker>,
    /// Notified (`notify_waiters`: as a condition variable, only who waits hears it) when a
    /// poll ends and at stop.
    wake: tokio::sync::Notify,
    stop: std::sync::atomic::AtomicBool,
    /// Where `nic_health_monitor_poll_stalled` is set (`None`: no metrics).
    metrics: Option<Arc<crate::act::metrics::Metrics>>,
}

impl Shared {
    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is due at `now`; the stall gauge set from the same look, under the tracker's
    /// lock, so a poll's end ([`Watchdog::end`]) never lands between the two.
    fn look(&self, now: Instant, deadline: Duration) -> Due {
        let mut t = self.tracker();
        let due = t.due(now, deadline);
        if let Some(m) = &self.metrics {
            m.set_poll_stalled(t.stalled_now(now, deadline));
        }
        due
    }
}

/// The running watchdog. Dropping it stops the thread at its next look (a publish in
/// progress is left to finish or to end with the process).
pub struct Watchdog {
    shared: Arc<Shared>,
}

impl Watchdog {
    /// Start the watchdog thread. `stamp` carries the node name and the events' strategy;
    /// `metrics` gets `nic_health_monitor_poll_stalled` at every look and poll end, and
    /// counts every publish's outcome under `NICPollStallCheck` (`nicmon_events_sent_total`,
    /// `nicmon_events_failed_total`, `nic_health_monitor_health_events_sent_total`).
    pub fn start(
        deadline: Duration,
        stamp: Stamp,
        sink: &SinkSpec,
        grpc: GrpcConfig,
        metrics: Option<Arc<crate::act::metrics::Metrics>>,
    ) -> std::io::Result<Watchdog> {
        if let Some(m) = &metrics {
            m.send_series(CHECK_NAME);
        }
        let shared = Arc::new(Shared {
            tracker: Mutex::new(Tracker::default()),
            wake: tokio::sync::Notify::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            metrics,
        });
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let sink = Sink::lazy(sink, grpc);
        let thread_shared = shared.clone();
        let strategy = stamp.processing_strategy;
        std::thread::Builder::new()
            .name("nicmon-stall".into())
            .spawn(move || watch(&thread_shared, deadline, &stamp, sink, &rt))?;
        tracing::info!(
            deadline = ?deadline,
            processing_strategy = ?strategy,
            "NIC poll stall detection enabled"
        );
        Ok(Watchdog { shared })
    }

    /// A poll begins.
    pub fn begin(&self) {
        self.shared.tracker().begin(Instant::now());
    }

    /// The poll completed.
    pub fn end(&self) {
        let owed = {
            let mut t = self.shared.tracker();
            let owed = t.end();
            if let Some(m) = &self.shared.metrics {
                m.set_poll_stalled(false);
            }
            owed
        };
        if owed {
            self.shared.wake.notify_waiters();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared.wake.notify_waiters();
    }
}

/// The watchdog thread: look when the poll in flight comes due ([`Tracker::next_look`]; at
/// once when a poll ends with something to publish),
/// publish what is due, one event at a time, so a recovery never overtakes its stall.
/// All of it runs on the thread's own runtime, waits included: the sink's connection is
/// served between publishes too (a connector's shutdown waits for its peers to answer).
fn watch(shared: &Shared, deadline: Duration, stamp: &Stamp, sink: Sink, rt: &tokio::runtime::Runtime) {
    rt.block_on(watch_loop(shared, deadline, stamp, sink));
}

async fn watch_loop(shared: &Shared, deadline: Duration, stamp: &Stamp, mut sink: Sink) {
    let every = check_interval(deadline);
    loop {
        let due = loop {
            if shared.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            // Listening before the look: a poll that ends after it wakes the wait.
            let woken = shared.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let due = shared.look(Instant::now(), deadline);
            match due {
                Due::Nothing => {
                    let wait = shared.tracker().next_look(Instant::now(), deadline).max(MIN_LOOK);
                    let _ = tokio::time::timeout(wait, woken).await;
                }
                due => break due,
            }
        };
        let Some(e) = event(due, stamp, OffsetDateTime::now_utc()) else { continue };
        let sent = sink.send(std::slice::from_ref(&e)).await;
        // Counted as every batch is, under its check: a stall event rejected for good is a
        // dropped event (`nicmon_events_failed_total{check="NICPollStallCheck"}`).
        if let Some(m) = &shared.metrics {
            m.record_send(CHECK_NAME, std::slice::from_ref(&e), SendOutcome::of(&sent));
        }
        match sent {
            Ok(()) => {
                if e.is_healthy {
                    tracing::info!(check = CHECK_NAME, "NIC polls are completing: healthy event sent");
                } else {
                    tracing::warn!(check = CHECK_NAME, message = %e.message, "NIC poll stalled: event sent");
                }
                shared.tracker().settled(due);
            }
            Err(err) if !err.is_retryable() => {
                tracing::error!(check = CHECK_NAME, healthy = e.is_healthy, error = %err, "poll stall event rejected for good: dropped");
                shared.tracker().settled(due);
            }
            Err(err) => {
                tracing::warn!(check = CHECK_NAME, healthy = e.is_healthy, error = %err, "poll stall event not sent: retried");
                let _ = tokio::time::timeout(every.max(Duration::from_millis(100)), shared.wake.notified()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(10);

    /// The stall gauge's view: stalled from the deadline while the poll is in flight, not
    /// once it ended (whatever is still owed to the connector).
    #[test]
    fn stalled_now_follows_the_poll_in_flight() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        assert!(!t.stalled_now(t0, D));
        t.begin(t0);
        assert!(!t.stalled_now(t0 + Duration::from_secs(9), D));
        assert!(t.stalled_now(t0 + D, D));
        assert!(matches!(t.due(t0 + D, D), Due::Stalled(_)));
        t.end();
        assert!(!t.stalled_now(t0 + Duration::from_secs(11), D));
    }

    #[test]
    fn nothing_is_due_before_the_first_completed_poll_then_one_healthy_baseline() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        assert_eq!(t.due(t0, D), Due::Nothing);
        t.begin(t0);
        assert_eq!(t.due(t0 + Duration::from_secs(9), D), Due::Nothing);
        assert!(t.end(), "the baseline is owed: the watchdog is woken");
        assert_eq!(t.due(t0 + Duration::from_secs(9), D), Due::Healthy);
        t.settled(Due::Healthy);
        assert_eq!(t.due(t0 + Duration::from_secs(9), D), Due::Nothing);
        // Later polls within the deadline: nothing more, and the watchdog is not woken.
        t.begin(t0 + Duration::from_secs(20));
        assert!(!t.end(), "a quiet poll's end wakes nothing");
        assert_eq!(t.due(t0 + Duration::from_secs(21), D), Due::Nothing);
    }

    #[test]
    fn a_stall_is_reported_once_and_cleared_by_the_next_completed_poll() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.begin(t0);
        t.end();
        t.settled(Due::Healthy);
        t.begin(t0 + Duration::from_secs(1));
        let due = t.due(t0 + Duration::from_secs(11), D);
        assert_eq!(due, Due::Stalled(Duration::from_secs(10)));
        // Not settled (the publish failed): still due.
        assert_eq!(t.due(t0 + Duration::from_secs(12), D), Due::Stalled(Duration::from_secs(11)));
        t.settled(due);
        assert_eq!(t.due(t0 + Duration::from_secs(30), D), Due::Nothing, "reported once");
        assert!(t.end(), "the recovery is owed: the watchdog is woken");
        assert_eq!(t.due(t0 + Duration::from_secs(31), D), Due::Healthy);
        t.settled(Due::Healthy);
        assert_eq!(t.due(t0 + Duration::from_secs(31), D), Due::Nothing);
    }

    #[test]
    fn a_stall_before_the_first_completed_poll_is_reported_then_cleared() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.begin(t0);
        let due = t.due(t0 + D, D);
        assert_eq!(due, Due::Stalled(D));
        t.settled(due);
        t.end();
        assert_eq!(t.due(t0 + D, D), Due::Healthy);
    }

    #[test]
    fn a_new_poll_stalling_again_before_the_recovery_is_sent_stays_reported() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.begin(t0);
        let due = t.due(t0 + D, D);
        t.settled(due);
        t.end();
        t.begin(t0 + D);
        // The recovery was not published and the next poll is stalled too: nothing new.
        assert_eq!(t.due(t0 + D * 3, D), Due::Nothing);
        t.end();
        assert_eq!(t.due(t0 + D * 3, D), Due::Healthy);
    }

    /// A stall and its recovery are about the node: no device, no port.
    #[test]
    fn a_stall_is_about_the_node() {
        let now = OffsetDateTime::UNIX_EPOCH;
        for due in [Due::Stalled(Duration::from_secs(11)), Due::Healthy] {
            let e = event(due, &Stamp::default(), now).unwrap();
            assert_eq!(e.kind(), crate::model::event::EntityKind::Node, "{e:?}");
        }
    }

    #[test]
    fn events_are_node_level_non_fatal_with_action_none() {
        let stamp = Stamp {
            node_name: "n1".into(),
            processing_strategy: strategy(true, ProcessingStrategy::EXECUTE_REMEDIATION),
        };
        let now = OffsetDateTime::UNIX_EPOCH;
        let e = event(Due::Stalled(Duration::from_millis(10_400)), &stamp, now).unwrap();
        assert_eq!(e.check_name, CHECK_NAME);
        assert!(!e.is_healthy && !e.is_fatal);
        assert_eq!(e.recommended_action, RecommendedAction::NONE);
        assert!(e.entities_impacted.is_empty());
        assert_eq!(e.processing_strategy, ProcessingStrategy::STORE_ONLY);
        assert_eq!(
            e.message,
            "NIC state cannot be observed: counter poll in flight for 10s, state poll in flight for 10s"
        );
        let h = event(Due::Healthy, &stamp, now).unwrap();
        assert!(h.is_healthy && !h.is_fatal && h.check_name == CHECK_NAME);
        assert!(event(Due::Nothing, &stamp, now).is_none());
        let short = event(Due::Stalled(Duration::from_millis(312)), &stamp, now).unwrap();
        assert_eq!(
            short.message,
            "NIC state cannot be observed: counter poll in flight for 0s, state poll in flight for 0s"
        );
        assert_eq!(strategy(false, ProcessingStrategy::STORE_AND_ANALYSE), ProcessingStrategy::STORE_AND_ANALYSE);
    }

    #[test]
    fn a_stall_whose_publish_failed_is_still_owed_after_the_poll_ended_then_the_recovery() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.begin(t0);
        t.end();
        t.settled(Due::Healthy);
        t.begin(t0 + Duration::from_secs(1));
        assert_eq!(t.due(t0 + Duration::from_secs(12), D), Due::Stalled(Duration::from_secs(11)));
        // The publish failed (not settled); the poll ends before the retry.
        t.end();
        let due = t.due(t0 + Duration::from_secs(13), D);
        assert_eq!(due, Due::Stalled(Duration::from_secs(11)), "still owed, as it was seen");
        assert_eq!(t.due(t0 + Duration::from_secs(14), D), due, "until settled");
        t.settled(due);
        // The poll has completed since: the recovery is due at once.
        let due = t.due(t0 + Duration::from_secs(14), D);
        assert_eq!(due, Due::Healthy);
        t.settled(due);
        assert_eq!(t.due(t0 + Duration::from_secs(15), D), Due::Nothing);
    }

    #[test]
    fn an_owed_stall_settled_while_its_poll_is_still_stuck_waits_for_the_poll() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.begin(t0);
        t.end();
        t.settled(Due::Healthy);
        t.begin(t0);
        let due = t.due(t0 + D, D);
        t.settled(due);
        assert_eq!(t.due(t0 + D * 2, D), Due::Nothing, "still stuck: reported once, no recovery");
        t.end();
        assert_eq!(t.due(t0 + D * 2, D), Due::Healthy);
    }

    #[test]
    fn durations_print_as_go_rounds_them_to_seconds() {
        let ms = Duration::from_millis;
        for (d, want) in [
            (ms(0), "0s"),
            (ms(499), "0s"),
            (ms(500), "1s"),
            (ms(10_400), "10s"),
            (ms(59_500), "1m0s"),
            (ms(90_000), "1m30s"),
            (ms(3_600_000), "1h0m0s"),
            (ms(7_205_000), "2h0m5s"),
        ] {
            assert_eq!(go_seconds(d), want, "{d:?}");
        }
    }

    /// Every publish of the watchdog is counted under its check, as the courier counts a
    /// batch: rejected for good (the baseline, then the stall: a connector refusing
    /// everything), then accepted (the recovery). The series exist at 0 from the start.
    #[test]
    fn every_stall_publish_is_counted_under_its_check_rejected_for_good_or_accepted() {
        use nicmon_tests::connector::Connector;
        let dir = tempfile::tempdir().unwrap();
        let conn = Connector::start(&dir.path().join("pc.sock"));
        conn.refuse_all(tonic::Code::InvalidArgument);
        let metrics = Arc::new(crate::act::metrics::Metrics::new("n1"));
        let grpc = GrpcConfig::new(conn.target().parse().unwrap());
        let stamp = Stamp { node_name: "n1".into(), processing_strategy: ProcessingStrategy::EXECUTE_REMEDIATION };
        let failed = |n: u32| format!("nicmon_events_failed_total{{check=\"{CHECK_NAME}\",kind=\"permanent\"}} {n}\n");
        let sent = |n: u32| format!("nicmon_events_sent_total{{check=\"{CHECK_NAME}\"}} {n}\n");
        let legacy = |n: u32| {
            format!(
                "nic_health_monitor_health_events_sent_total{{node=\"n1\",check=\"{CHECK_NAME}\",is_fatal=\"false\"}} {n}\n"
            )
        };
        let wait_for = |line: String| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !metrics.encode().contains(&line) {
                assert!(Instant::now() < deadline, "no {line:?} in {}", metrics.encode());
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let w =
            Watchdog::start(Duration::from_millis(200), stamp, &SinkSpec::Grpc, grpc, Some(metrics.clone())).unwrap();
        let body = metrics.encode();
        for zero in [failed(0), sent(0), legacy(0)] {
            assert!(body.contains(&zero), "{zero:?} in {body}");
        }
        // The baseline: rejected for good.
        w.begin();
        w.end();
        wait_for(failed(1));
        // A stall: rejected for good.
        w.begin();
        wait_for(failed(2));
        let calls = conn.received();
        assert_eq!(calls.len(), 2, "{calls:#?}");
        assert!(calls.iter().all(|c| c.refused == Some(tonic::Code::InvalidArgument)));
        assert!(calls[0].batch.events[0].is_healthy && !calls[1].batch.events[0].is_healthy, "{calls:#?}");
        // The recovery: accepted.
        conn.accept_all();
        w.end();
        wait_for(sent(1));
        wait_for(legacy(1));
        assert!(metrics.encode().contains(&failed(2)), "{}", metrics.encode());
    }

    #[test]
    fn the_next_look_is_when_the_poll_in_flight_comes_due_else_a_deadline_away() {
        let (t0, deadline) = (Instant::now(), Duration::from_secs(10));
        let mut t = Tracker::default();
        assert_eq!(t.next_look(t0, deadline), deadline, "no poll in flight");
        t.begin(t0);
        assert_eq!(t.next_look(t0 + Duration::from_secs(3), deadline), Duration::from_secs(7));
        assert_eq!(t.next_look(t0 + deadline, deadline), deadline, "due: seen at this look; its end wakes");
        assert!(matches!(t.due(t0 + deadline, deadline), Due::Stalled(_)));
        t.end();
        assert_eq!(t.next_look(t0 + deadline, deadline), deadline);
    }

    #[test]
    fn the_check_interval_is_a_quarter_of_the_deadline_at_most_a_second() {
        assert_eq!(check_interval(Duration::from_secs(10)), Duration::from_secs(1));
        assert_eq!(check_interval(Duration::from_millis(400)), Duration::from_millis(100));
        assert_eq!(check_interval(Duration::from_millis(1)), Duration::from_millis(10));
    }
}
