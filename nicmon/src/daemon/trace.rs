//! `nicmon trace`: what the daemon prints in trace mode — a line per wake-up and the poll
//! it caused (with the poll's events, held ports, blips and flaps), wake records the kernel
//! lost, and the latency summary at exit. (The courier prints its own `sent` lines.)
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::decide::poll::Poll;
use crate::read::wake::Wake;

/// Kernel timestamp → end of the first poll that served the wake-up, per hook (ms).
#[derive(Default)]
pub(super) struct Latencies {
    by_hook: BTreeMap<&'static str, Vec<f64>>,
    /// The wake-ups the last poll recorded (when each was received): a second targeted
    /// poll of the same cycle (devices found in sysfs) did not serve them first.
    last: Vec<u64>,
}

impl Latencies {
    /// The wake-ups `woke` were served by a poll of `kind` that ended now.
    pub(super) fn record(&mut self, woke: &[Wake], kind: &PollKind<'_>) {
        // The full poll after a targeted one did not serve them first.
        if matches!(kind, PollKind::FullAfterTargeted) {
            return;
        }
        let end = crate::read::wake::monotonic_ns();
        let mut recorded = Vec::with_capacity(woke.len());
        for w in woke.iter().filter(|w| !self.last.contains(&w.received_ns)) {
            if let Some(k) = w.kernel_ts_ns {
                self.by_hook.entry(w.hook.name()).or_default().push(end.saturating_sub(k) as f64 / 1e6);
            }
            recorded.push(w.received_ns);
        }
        self.last = recorded;
    }

    /// The exit summary ([`trace_summary`]).
    pub(super) fn summary(&self, lost: Option<u64>) -> String {
        trace_summary(&self.by_hook, lost)
    }
}

/// `new` wake records the kernel programs lost (of `total` so far).
pub(super) fn print_lost(new: u64, total: u64) {
    println!("lost wake_records={new} total={total} (eBPF ring buffer full)");
}

/// Which poll of a cycle (`nicmon trace` says it).
pub(super) enum PollKind<'a> {
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
pub(super) fn print_trace(
    woke: &[Wake],
    woke_at: Instant,
    poll: &Poll,
    elapsed: Duration,
    kind: &PollKind<'_>,
    handed_at: Instant,
    last_batch: u64,
) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let now_ns = crate::read::wake::monotonic_ns();
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

/// Per-hook counts and kernel→poll-end latency percentiles (trace mode's exit summary),
/// and the wake records the kernel programs lost to a full ring buffer (`None`: not counted,
/// no eBPF).
pub fn trace_summary(lat: &BTreeMap<&'static str, Vec<f64>>, lost: Option<u64>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A wake-up served by two targeted polls of one cycle (a device its hint names found
    /// in sysfs after the first) is counted once, at the first.
    #[test]
    fn a_wake_up_is_counted_at_the_first_poll_that_served_it() {
        let wake = |received_ns| Wake {
            hook: crate::read::wake::Hook::Rtnetlink,
            kernel_ts_ns: Some(1),
            hint: crate::read::wake::Hint::Name("eth0".into()),
            removed: false,
            received: Instant::now(),
            received_ns,
        };
        let (a, b) = (wake(10), wake(11));
        let devs = ["mlx5_0".to_string()];
        let mut lat = Latencies::default();
        lat.record(&[a.clone(), b.clone()], &PollKind::Targeted(&devs));
        lat.record(std::slice::from_ref(&b), &PollKind::Targeted(&devs));
        lat.record(&[a.clone(), b.clone()], &PollKind::FullAfterTargeted);
        assert_eq!(lat.by_hook["rtnetlink"].len(), 2);
        lat.record(&[wake(12)], &PollKind::Full);
        assert_eq!(lat.by_hook["rtnetlink"].len(), 3);
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
}
