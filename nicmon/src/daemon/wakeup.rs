//! Where a wake-up becomes a poll. The wake sources (`crate::read::wake`: eBPF ring-buffer
//! records, rtnetlink, the kernel log) hand the loop [`Wake`]s; here they are coalesced and
//! rate-limited ([`Daemon::wait`]), their hints resolved to devices, and served by a
//! targeted poll of those devices followed by the full poll ([`Daemon::polls`], SPEC §1.8).
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::Daemon;
use super::trace::PollKind;
use crate::read::discovery;
use crate::read::kmsg;
use crate::read::kmsg::Delivery;
use crate::read::wake::Wake;

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

/// How long a targeted poll waits for its batches' delivery before its trace, metrics,
/// logs, save and the full poll that follows (so they do not compete with the sender for
/// the CPU on the latency path).
pub const TARGETED_DELIVERY_WAIT: Duration = Duration::from_millis(50);

/// How long the kernel's word that something was removed (a wake-up with
/// [`Wake::removed`]) goes with the polls: a uevent `remove` is sent before sysfs drops the
/// entry, so a poll of the next seconds may be the one that confirms it.
pub const KERNEL_WORD_KEPT: Duration = Duration::from_secs(10);

/// A cycle's wake-ups by what their hints name ([`Daemon::hints`]).
#[derive(Default)]
struct Hints {
    /// The devices of the last full poll's snapshot the hints name.
    named: Vec<String>,
    /// The wake-ups whose hint names nothing the snapshot holds: looked up in sysfs.
    probed: Vec<Wake>,
}

/// What woke the loop.
pub(super) enum Wakeup {
    /// The interval tick, a wake source (the coalesced burst) or kernel log records:
    /// poll now.
    Poll(Vec<Wake>),
    /// The trailing poll after a wake-driven one is due.
    Trailing,
    /// The courier's sender acknowledged these batches.
    Acks(Vec<u64>),
    /// SIGTERM or SIGINT: one last poll, then shut down.
    Stop,
}

/// Until when a wake-up received `now` waits before its poll (`None`: polled at once): the
/// end of the rate limit's gap after the last wake-driven poll, unless it is the kernel's
/// word that a device or netdev was removed (`removed`) and no such wake-up was polled in
/// the last gap — a device's loss is sent at once, and a mass removal still gets one poll
/// per gap.
fn held_until(
    removed: bool,
    last_wake_poll: Option<tokio::time::Instant>,
    last_removal_poll: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let until = last_wake_poll.map(|t| t + WAKE_POLL_GAP).filter(|u| *u > now)?;
    let at_once = removed && last_removal_poll.is_none_or(|t| t + WAKE_POLL_GAP <= now);
    (!at_once).then_some(until)
}

impl Daemon<'_> {
    /// Wait for the next reason to act. Kernel log records are collected on the way.
    pub(super) async fn wait(&mut self) -> Wakeup {
        let (wakes, kmsg, courier) = (&mut self.wakes, &mut self.kmsg, &mut self.courier);
        let metrics = &self.metrics;
        let (tick, sigterm, records) = (&mut self.tick, &mut self.sigterm, &mut self.pending_records);
        let (last_wake_poll, last_removal_poll) = (self.last_wake_poll, self.last_removal_poll);
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
                let held = held_until(w.removed, last_wake_poll, last_removal_poll, tokio::time::Instant::now());
                let mut woke = vec![w];
                // Rate limit: within the gap after the previous wake-driven poll, wait for
                // its end; everything that arrived by then is served by this one poll. Not
                // for the kernel's word that a device went (its event is sent at once).
                if let Some(until) = held {
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

    /// The polls of one cycle for the wake-ups `woke` (none: the tick's, the trailing or
    /// a held port's poll). Wake-ups whose hints name devices first get a targeted poll of
    /// those devices (its events are dispatched first), then the full poll follows — unless
    /// in a burst. A hint the last full poll's snapshot does not resolve is looked up in
    /// sysfs only after the targeted poll of the ones it does resolve (a veth's peer, a
    /// container's interface, a bond: [`Daemon::hints`]).
    pub(super) async fn polls(&mut self, woke: &[Wake]) {
        self.take_kernel_log_records();
        let woke_at = Instant::now();
        // A hint naming a device makes a targeted poll: the reads' thread wakes now, while
        // the hint is resolved and the read planned, not when the reads are handed over.
        let named = woke.iter().any(|w| matches!(w.hint, crate::read::wake::Hint::Name(_)));
        if self.last_snapshot.is_some() && named {
            self.monitor.observer.host.expect_reads();
        }
        // A hint is a sign that the topology may have moved: the next full poll walks its
        // paths again (listings, links; see `read::discovery::walk`). So is any uevent: one
        // without a hint says some were lost (the socket overran).
        if named || woke.iter().any(|w| w.hook == nicmon_common::Hook::Uevent) {
            self.monitor.observer.host.topology_hint();
        }
        let hints = self.hints(woke);
        let mut targeted = self.targeted_poll(woke, woke_at, &hints.named).await;
        let probed = self.devices_probed(&hints.probed, &hints.named);
        if !probed.is_empty() {
            let wakes = if targeted { &hints.probed } else { woke };
            targeted |= self.targeted_poll(wakes, woke_at, &probed).await;
        }
        // A burst (a full poll ran moments ago): the targeted poll served the named
        // devices; the rest waits for the trailing poll or the tick, so a storm of hinted
        // wake-ups costs targeted polls, not full ones.
        if targeted && self.last_full_poll.is_some_and(|t| t.elapsed() < self.burst_gap) {
            for w in woke {
                self.metrics.wakeup(w.hook.name(), w.delivery_latency_ns().map(Duration::from_nanos));
            }
            return;
        }
        self.full_poll(woke, (!targeted).then_some(woke_at)).await;
    }

    /// Kernel log records delivered since the last cycle, within their bound.
    fn take_kernel_log_records(&mut self) {
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
    }

    /// The wake-ups `woke` split by what their hints name in the last full poll's snapshot
    /// ([`discovery::devices_in`]: no host read). Each device named is owed a re-read of its
    /// static attributes by the next full poll (a targeted poll, on the latency path, uses
    /// the kept ones, as the last full poll checked them: see [`discovery::rediscover`]).
    fn hints(&mut self, woke: &[Wake]) -> Hints {
        let mut hints = Hints::default();
        let Some(last) = &self.last_snapshot else { return hints };
        for w in woke {
            let crate::read::wake::Hint::Name(n) = &w.hint else { continue };
            let named = discovery::devices_in(last, n);
            if named.is_empty() {
                hints.probed.push(w.clone());
            }
            for dev in named {
                if !hints.named.contains(&dev) {
                    hints.named.push(dev);
                }
            }
        }
        for dev in &hints.named {
            self.statics_owed.insert(dev.clone());
        }
        hints
    }

    /// The devices the hints of `wakes` name as sysfs shows them now
    /// ([`discovery::devices_probed`]: a second port's netdev, a bond's), less those in
    /// `served`. Each is owed a re-read of its static attributes, as in [`Daemon::hints`].
    fn devices_probed(&mut self, wakes: &[Wake], served: &[String]) -> Vec<String> {
        let mut targets: Vec<String> = Vec::new();
        let Some(last) = &self.last_snapshot else { return targets };
        for w in wakes {
            if let crate::read::wake::Hint::Name(n) = &w.hint {
                for dev in discovery::devices_probed(&self.monitor.observer.host, last, n) {
                    if !served.contains(&dev) && !targets.contains(&dev) {
                        targets.push(dev);
                    }
                }
            }
        }
        for dev in &targets {
            self.statics_owed.insert(dev.clone());
        }
        targets
    }

    /// What the kernel said was removed within [`KERNEL_WORD_KEPT`], the removals among
    /// `woke` included (names, netdevs, PCI addresses: for the decider).
    fn kernel_word(&mut self, woke: &[Wake]) -> std::collections::BTreeSet<String> {
        for w in woke.iter().filter(|w| w.removed) {
            if let crate::read::wake::Hint::Name(n) = &w.hint {
                self.kernel_removed.insert(n.clone(), w.received);
            }
        }
        self.kernel_removed.retain(|_, at| at.elapsed() < KERNEL_WORD_KEPT);
        self.kernel_removed.keys().cloned().collect()
    }

    /// The targeted poll of `targets` (read on the last full poll's snapshot), acted on and
    /// delivered before anything else. Whether it ran.
    async fn targeted_poll(&mut self, woke: &[Wake], woke_at: Instant, targets: &[String]) -> bool {
        let Some(base) = self.last_snapshot.as_ref().filter(|_| !targets.is_empty()) else { return false };
        let Some(mut obs) = self.monitor.observe_targeted(&self.state.checks, base, targets) else { return false };
        obs.woken_by = crate::read::wake::hook_names(woke);
        // A devlink health tracepoint: the reporters of the devices it named are read now.
        if woke.iter().any(|w| crate::read::wake::is_devlink(w.hook)) {
            let notes = self.monitor.observer.reread_devlink(&mut obs.snapshot, targets);
            obs.ethtool_notes.extend(notes);
        }
        obs.kernel_removed = self.kernel_word(woke);
        let poll = self.monitor.decide(&self.state.checks, &self.loaded, obs, OffsetDateTime::now_utc(), &[]);
        let elapsed = woke_at.elapsed();
        // The targeted poll's events go out before anything else (`act` waits for their
        // delivery): the full poll, which competes with the sender for the CPU, starts after.
        self.act(poll, woke, woke_at, elapsed, PollKind::Targeted(targets), Vec::new()).await;
        // The targeted commit's save (deferred by `act` until its batches were delivered:
        // the journal covers a crash before it).
        self.save();
        true
    }

    /// The full poll. `woke_at`: when the wake-ups woke the loop, unless a targeted poll
    /// served them first (then the trace measures this poll from its own start).
    async fn full_poll(&mut self, woke: &[Wake], woke_at: Option<Instant>) {
        // The static attributes of every device a wake-up named since the last full poll
        // are read again by this one.
        for dev in std::mem::take(&mut self.statics_owed) {
            self.monitor.observer.statics.invalidate(&dev);
        }
        // While the uevent listener runs, the kernel announces devices and netdevs coming
        // and going: the device listing stands between walks (`read::host::walks`); one
        // that stopped no longer answers for it. Set before every full poll's read (a
        // targeted poll comes only after one).
        if let Some(w) = &self.wakes {
            self.monitor.observer.host.kernel_announces(w.uevents_heard());
        }
        let started = Instant::now();
        self.last_full_poll = Some(started);
        // This poll's snapshot replaces the last one: the last goes before this one is read
        // (a device of a thousand ports: one snapshot at a time). So do the batches delivered
        // meanwhile: their acknowledgements are taken first.
        self.last_snapshot = None;
        let acked = self.courier.ready_acks();
        if !acked.is_empty() {
            self.courier.delivered(&mut self.state, acked);
        }
        let records = std::mem::take(&mut self.pending_records);
        let now = OffsetDateTime::now_utc();
        let mut obs = self.monitor.observe(&self.state.checks, !records.is_empty());
        obs.woken_by = crate::read::wake::hook_names(woke);
        obs.kernel_removed = self.kernel_word(woke);
        let poll = self.monitor.decide(&self.state.checks, &self.loaded, obs, now, &records);
        let elapsed = started.elapsed();
        let completed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.metrics.observe_poll(elapsed, completed);
        self.last_snapshot = Some(poll.snapshot.clone());
        // Targeted polls can follow now: hinted records may wake the reader early.
        let _ = self.early_gate.compare_exchange(u64::MAX, 0, Ordering::Relaxed, Ordering::Relaxed);
        for w in woke {
            self.metrics.wakeup(w.hook.name(), w.delivery_latency_ns().map(Duration::from_nanos));
        }
        let kind = if woke_at.is_some() { PollKind::Full } else { PollKind::FullAfterTargeted };
        let primer = (!self.targeted_primed && self.wakes.is_some()).then(|| primer(&poll)).flatten();
        self.act(poll, woke, woke_at.unwrap_or(started), elapsed, kind, records).await;
        let _ = self.count_lost_wakes();
        if let Some(device) = primer {
            self.prime_targeted_poll(&device);
        }
    }

    /// Once, after the first full poll, where wake-ups can make targeted polls: a dry
    /// targeted poll of `device` — read and decided, nothing acted on or kept. The first
    /// wake-up's targeted poll then runs code, allocations and a read-ahead that already ran
    /// once (on an idle VM the first one otherwise took ~1.2 ms, the later ones ~0.3 ms).
    fn prime_targeted_poll(&mut self, device: &str) {
        self.targeted_primed = true;
        let Some(base) = &self.last_snapshot else { return };
        let targets = [device.to_string()];
        if let Some(obs) = self.monitor.observe_targeted(&self.state.checks, base, &targets) {
            let _dry = self.monitor.decide(&self.state.checks, &self.loaded, obs, OffsetDateTime::now_utc(), &[]);
        }
    }
}

/// The device a dry targeted poll primes the path with: the first monitored PF with a
/// netdev (what a carrier wake-up names), else the first monitored PF.
fn primer(poll: &crate::decide::poll::Poll) -> Option<String> {
    let monitored =
        |d: &&std::sync::Arc<crate::model::Device>| !d.is_vf() && poll.roles.get(&d.name).is_some_and(|c| c.monitored);
    let mut pfs = poll.snapshot.devices.iter().filter(monitored);
    let first = pfs.clone().next();
    pfs.find(|d| d.netdev.is_some()).or(first).map(|d| d.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::dispatch::{GrpcConfig, SinkSpec};
    use crate::daemon::{PollStall, RunOptions};
    use crate::read::wake::WakeOptions;

    /// A daemon over a fixture node, with no wake source, metrics endpoint or kernel log
    /// (its loop's cycles are driven by the test).
    fn run_options(node: &nicmon_tests::Node) -> RunOptions {
        RunOptions {
            monitor: crate::monitor::fixture_options(node),
            state_file: node.root().join("state.json"),
            interval: Duration::from_secs(1),
            sink: SinkSpec::File(node.root().join("events.jsonl")),
            grpc: GrpcConfig::new(crate::act::dispatch::DEFAULT_SOCKET.parse().unwrap()),
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
            hook: crate::read::wake::Hook::Rtnetlink,
            kernel_ts_ns: None,
            hint: crate::read::wake::Hint::Name(netdev.to_string()),
            removed: false,
            received: Instant::now(),
            received_ns: crate::read::wake::monotonic_ns(),
        }
    }

    #[test]
    fn the_kernels_word_of_a_removal_is_not_held_by_the_gap_once_per_gap() {
        let t0 = tokio::time::Instant::now();
        let gap_end = t0 + WAKE_POLL_GAP;
        let now = t0 + Duration::from_millis(5);
        assert_eq!(held_until(false, None, None, now), None, "no wake-driven poll yet");
        assert_eq!(held_until(false, Some(t0), None, now), Some(gap_end), "inside the gap");
        assert_eq!(held_until(true, Some(t0), None, now), None, "a removal: at once");
        assert_eq!(held_until(true, Some(t0), Some(t0), now), Some(gap_end), "a second one in the same gap waits");
        let later = t0 + WAKE_POLL_GAP + Duration::from_millis(1);
        assert_eq!(held_until(false, Some(t0), Some(t0), later), None, "past the gap");
        let earlier = t0 - WAKE_POLL_GAP;
        assert_eq!(held_until(true, Some(t0), Some(earlier), now), None, "the last removal's gap is over");
    }

    /// A node of two RoCE NICs, `mlx5_0` (netdev `eth0`) and `mlx5_1` (`eth1`), each on a
    /// root port of its own.
    fn two_roce_nics(name: &str) -> nicmon_tests::Node {
        let mut node = nicmon_tests::Node::new(name);
        let rc = node.root_complex(0, 0);
        for (port, (dev, netdev)) in [("mlx5_0", "eth0"), ("mlx5_1", "eth1")].into_iter().enumerate() {
            let rp = node.root_port(&rc, port as u8 + 1);
            node.card(&rp, 0, vec![nicmon_tests::NicSpec::eth(dev, netdev)]);
        }
        node
    }

    /// The firmware version of `dev` in the last full poll's snapshot.
    fn fw_ver(daemon: &Daemon<'_>, dev: &str) -> Option<String> {
        let snap = daemon.last_snapshot.as_ref().expect("a full poll ran");
        snap.devices.iter().find(|d| d.name == dev).and_then(|d| d.fw_ver.clone())
    }

    /// The dry targeted poll after the first full poll acts on nothing and keeps nothing
    /// (no batch, the same checks' state); the first wake-up's targeted poll then uses the
    /// read-ahead it left. It primes with a monitored PF that has a netdev.
    #[tokio::test]
    async fn the_dry_targeted_poll_primes_the_first_one_and_changes_nothing() {
        use std::sync::atomic::Ordering::Relaxed;
        let node = two_roce_nics("prime");
        let opts = run_options(&node);
        let mut daemon = Daemon::start(&opts).await.unwrap();
        assert_eq!(daemon.early_gate.load(Ordering::Relaxed), u64::MAX, "no early wake-up before a full poll");
        daemon.cycle(&[]).await;
        assert_eq!(daemon.early_gate.load(Ordering::Relaxed), 0, "open once a full poll ran");
        let first = daemon.monitor.poll(&daemon.state.checks, &daemon.loaded, OffsetDateTime::now_utc(), &[]);
        assert_eq!(primer(&first).as_deref(), Some("mlx5_0"));

        let (checks, last_batch) = (daemon.state.checks.clone(), daemon.state.outbox.last_id());
        daemon.prime_targeted_poll("mlx5_0");
        assert!(daemon.targeted_primed);
        assert_eq!(daemon.state.checks, checks, "nothing kept");
        assert_eq!(daemon.state.outbox.last_id(), last_batch, "nothing acted on");
        let used = |d: &Daemon<'_>| d.monitor.observer.host.stats.read_ahead_used.load(Relaxed);
        assert_eq!(used(&daemon), 0);

        // The first wake-up (in a burst: the targeted poll alone) reads what the dry one read.
        node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
        daemon.burst_gap = HELD_BURST;
        daemon.last_full_poll = Some(Instant::now());
        daemon.cycle(&[wake_naming("eth0")]).await;
        assert_eq!(used(&daemon), 1, "the read-ahead the dry poll left is used");
        assert!(daemon.state.outbox.last_id() > last_batch, "the port's DOWN went out");
        daemon.shutdown().await;
    }

    /// A devlink health tracepoint's wake-up (its hint: the PCI address of the function)
    /// reads that function's reporters at once: in a burst (no full poll follows) the
    /// targeted poll alone sends the firmware fatal.
    #[tokio::test]
    async fn a_devlink_wake_reads_the_reporters_at_once() {
        devlink_wake_reads_the_reporters("devlink-wake", |bdf| {
            let mut wake = wake_naming(bdf);
            wake.hook = crate::read::wake::Hook::DevlinkHealthReport;
            wake
        })
        .await;
    }

    /// The same for the devlink netlink monitor's wake-up: the kernel's
    /// `DEVLINK_CMD_HEALTH_REPORTER_RECOVER` for `pci/<bdf>` (decoded from its bytes in
    /// `read::wake::devlink_monitor`'s tests) makes a targeted poll of that function's device
    /// that reads its reporters.
    #[tokio::test]
    async fn a_devlink_monitor_wake_reads_the_reporters_at_once() {
        use crate::read::wake::devlink_monitor::{Event, Notice};
        devlink_wake_reads_the_reporters("devlink-monitor-wake", |bdf| {
            let notice = Notice {
                event: Event::Health,
                bus: "pci".into(),
                dev: bdf.to_string(),
                reporter: Some(("fw_fatal".into(), crate::model::devlink::ReporterState::Error)),
            };
            let wake = notice.into_wake(Instant::now(), crate::read::wake::monotonic_ns());
            assert_eq!(wake.hook, crate::read::wake::Hook::DevlinkMonitor);
            wake
        })
        .await;
    }

    /// A wake-up `wake_for(<PCI address of mlx5_1>)` after mlx5_1's `fw_fatal` counted an
    /// error: in a burst, its targeted poll alone sends the fatal for mlx5_1, once.
    async fn devlink_wake_reads_the_reporters(name: &str, wake_for: impl Fn(&str) -> Wake) {
        let node = two_roce_nics(name);
        let mut opts = run_options(&node);
        opts.monitor.devlink_replay = Some(node.devlink_dir());
        let mut daemon = Daemon::start(&opts).await.unwrap();
        daemon.cycle(&[]).await;
        assert!(fatal_devices(&node).is_empty());
        node.bump_reporter("mlx5_1", "fw_fatal", 1);
        let full_before = Instant::now();
        daemon.burst_gap = HELD_BURST;
        daemon.last_full_poll = Some(full_before);
        daemon.cycle(&[wake_for(&node.info["mlx5_1"].bdf)]).await;
        assert_eq!(daemon.last_full_poll, Some(full_before), "no full poll ran");
        assert_eq!(wait_for_fatal(&node, 1).await, ["mlx5_1"]);
        // A wake-up of another hook (rtnetlink) does not read devlink on its targeted poll,
        // and its base (the last full poll's snapshot, older than the devlink wake-up's
        // reading) does not hand out the old count: no second fatal for mlx5_1 later.
        node.bump_reporter("mlx5_0", "fw_fatal", 1);
        daemon.burst_gap = HELD_BURST;
        daemon.last_full_poll = Some(Instant::now());
        daemon.cycle(&[wake_naming("eth0")]).await;
        daemon.cycle(&[wake_naming("eth1")]).await;
        daemon.last_full_poll = None;
        daemon.cycle(&[]).await;
        assert_eq!(fatal_devices(&node), ["mlx5_1"]);
        let fatals = || {
            let text = std::fs::read_to_string(node.root().join("events.jsonl")).unwrap_or_default();
            text.lines().filter(|l| l.contains("\"isFatal\":true")).count()
        };
        assert_eq!(fatals(), 1);
        daemon.shutdown().await;
    }

    /// The devices named in the sink's lines (fatal ones).
    /// A burst held open however long the test's polls take on a loaded machine (the
    /// shipped gap is 250 ms; two targeted polls under CI load can take longer).
    const HELD_BURST: Duration = Duration::from_secs(3600);

    /// The devices with a fatal event in the sink once `n` of them are there: the sink's
    /// line is written by the sender task (this thread's other task), which a targeted
    /// poll waits for only [`TARGETED_DELIVERY_WAIT`]; give it the CPU, within a bound.
    async fn wait_for_fatal(node: &nicmon_tests::Node, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while fatal_devices(node).len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fatal_devices(node)
    }

    fn fatal_devices(node: &nicmon_tests::Node) -> Vec<String> {
        let text = std::fs::read_to_string(node.root().join("events.jsonl")).unwrap_or_default();
        let mut out: Vec<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["isFatal"] == true)
            .flat_map(|e| {
                let ents = e["entitiesImpacted"].as_array().cloned().unwrap_or_default();
                ents.into_iter()
                    .filter(|x| x["entityType"] == "NIC")
                    .filter_map(|x| x["entityValue"].as_str().map(String::from))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// A hint the last full poll's snapshot resolves is served first, by the snapshot
    /// alone; one it does not (here a renamed netdev and a plain interface; a veth's peer
    /// and a bond too) is looked up in sysfs after that targeted poll, and a device found
    /// that way gets a targeted poll of its own — so in a burst every hinted device is
    /// still served by a targeted poll.
    #[tokio::test]
    async fn hints_the_snapshot_resolves_go_first_and_the_others_are_looked_up_after() {
        let mut node = two_roce_nics("hints");
        node.plain_netdev("veth9");
        let opts = run_options(&node);
        let mut daemon = Daemon::start(&opts).await.unwrap();
        daemon.cycle(&[]).await;
        node.rename_netdev("mlx5_1", "eth9");

        let woke = [wake_naming("eth0"), wake_naming("veth9"), wake_naming("eth9")];
        let hints = daemon.hints(&woke);
        assert_eq!(hints.named, ["mlx5_0"]);
        let probed: Vec<&crate::read::wake::Hint> = hints.probed.iter().map(|w| &w.hint).collect();
        assert_eq!(probed, [&woke[1].hint, &woke[2].hint]);
        assert_eq!(daemon.devices_probed(&hints.probed, &hints.named), ["mlx5_1"]);
        assert!(daemon.devices_probed(&hints.probed, &["mlx5_1".to_string()]).is_empty(), "served already");

        // In a burst (no full poll follows): both devices' DOWN go out, each through a
        // targeted poll.
        node.pull_cable("mlx5_0", 1);
        node.pull_cable("mlx5_1", 1);
        let full_before = Instant::now();
        daemon.burst_gap = HELD_BURST;
        daemon.last_full_poll = Some(full_before);
        daemon.cycle(&woke).await;
        assert_eq!(daemon.last_full_poll, Some(full_before), "no full poll ran");
        assert_eq!(wait_for_fatal(&node, 2).await, ["mlx5_0", "mlx5_1"]);
        assert!(daemon.statics_owed.contains("mlx5_0") && daemon.statics_owed.contains("mlx5_1"));
        daemon.shutdown().await;
    }

    /// Issue #18's read path through the daemon's own cycle: a wake-up naming a device
    /// (here by its netdev) makes the next full poll read that device's static attributes
    /// again — the targeted poll it causes does not (it uses the kept ones) — while a
    /// device no wake-up named keeps its kept attributes (until `STATIC_REFRESH`).
    #[tokio::test]
    async fn a_wake_naming_a_device_makes_the_next_full_poll_read_its_statics_again() {
        let node = two_roce_nics("statics-wake");
        let opts = run_options(&node);
        let mut daemon = Daemon::start(&opts).await.unwrap();

        // The tick's first full poll reads both devices' static attributes.
        daemon.cycle(&[]).await;
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.39.1002"));
        assert_eq!(daemon.monitor.observer.statics.reads(), 2);
        // The next tick reads none of them.
        daemon.cycle(&[]).await;
        assert_eq!(daemon.monitor.observer.statics.reads(), 2, "kept between full polls");

        // Both devices' firmware changes on disk (as a firmware reset would show it).
        node.write_device_file("mlx5_0", "fw_ver", "28.40.1000\n");
        node.write_device_file("mlx5_1", "fw_ver", "28.40.1000\n");

        // A hinted wake-up in a burst (a full poll ran moments ago): the targeted poll
        // alone runs; it reads no static attribute, and the device is owed a re-read.
        daemon.burst_gap = HELD_BURST;
        daemon.last_full_poll = Some(Instant::now());
        daemon.cycle(&[wake_naming("eth0")]).await;
        assert_eq!(daemon.monitor.observer.statics.reads(), 2, "a targeted poll uses the kept static attributes");
        assert!(daemon.statics_owed.contains("mlx5_0"), "{:?}", daemon.statics_owed);
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.39.1002"), "no full poll ran yet");

        // The trailing (or the tick's) full poll: mlx5_0 is read again, mlx5_1 is not.
        daemon.cycle(&[]).await;
        assert_eq!(daemon.monitor.observer.statics.reads(), 3, "exactly the named device's attributes are read again");
        assert!(daemon.statics_owed.is_empty());
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.40.1000"), "the named device is read again");
        assert_eq!(fw_ver(&daemon, "mlx5_1").as_deref(), Some("28.39.1002"), "an unnamed device keeps its kept value");

        // Outside a burst: one cycle runs the targeted poll and the full poll that follows,
        // which reads the named device again (here mlx5_1, named by its netdev too).
        node.write_device_file("mlx5_1", "fw_ver", "28.41.2000\n");
        daemon.last_full_poll = None;
        daemon.cycle(&[wake_naming("eth1")]).await;
        assert_eq!(daemon.monitor.observer.statics.reads(), 4);
        assert_eq!(fw_ver(&daemon, "mlx5_1").as_deref(), Some("28.41.2000"));
        assert_eq!(fw_ver(&daemon, "mlx5_0").as_deref(), Some("28.40.1000"));
        daemon.shutdown().await;
    }
}
