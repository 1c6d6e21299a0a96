//! Prometheus metrics (SPEC §1.9) and the HTTP endpoint that serves them with `/healthz`.
//!
//! [`Metrics`] owns the registry; the daemon loop holds an `Arc<Metrics>` and calls its
//! update methods ([`Metrics::observe`] for each poll: `observe.rs`), [`server::start_or_retry`]
//! serves it (in the daemon on a thread of its own: [`server::ServerThread`]). Every family
//! is declared once, in `families.rs`. Two sets of names are exported:
//! - `nicmon_*`: this monitor's own view (roles, eBPF hooks, wake-ups, ...);
//! - `nic_health_monitor_*`: the existing NIC monitor's names and labels, so the
//!   dashboards people already have keep working after the switch.
mod families;
mod observe;
mod optics;
mod phy;
mod replaced;
pub mod server;
mod thermal;

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::registry::Registry;

pub use server::{Liveness, MetricsServer};

use families::{
    AerLabels, AttributeLabels, CheckLabels, CounterLabels, DeviceLabels, FailedLabels, Families, HookLabels,
    NodeCategory, NodeCause, NodeCheck, NodeCheckDevicePort, NodeCheckFatal, NodeCounterDevicePortFatal,
    POLL_CATEGORIES, PortLabels, RoleLabels, SourceLabels, UnhealthyLabels,
};

use crate::model::event::{Check, HealthEvent};

/// How one send of a batch ended, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// Delivered and made durable.
    Accepted,
    /// Not delivered; a later send of the same batch may be (`kind="retryable"`).
    Retryable,
    /// Rejected for good (`kind="permanent"`).
    Permanent,
}

impl SendOutcome {
    /// How a send that returned `result` ended.
    pub fn of(result: &Result<(), crate::act::dispatch::SendError>) -> SendOutcome {
        match result {
            Ok(()) => SendOutcome::Accepted,
            Err(e) if e.is_retryable() => SendOutcome::Retryable,
            Err(_) => SendOutcome::Permanent,
        }
    }
}

/// Default of `--metrics-port`.
pub const DEFAULT_PORT: u16 = 2112;

/// Default of `--metrics-bind-address`.
pub const DEFAULT_BIND: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// `--metrics-port` and `--metrics-bind-address`, for `#[command(flatten)]`.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Port of the Prometheus `/metrics` and `/healthz` endpoint.
    #[arg(long, default_value_t = DEFAULT_PORT, value_name = "PORT")]
    pub metrics_port: u16,
    /// Address the endpoint listens on (0.0.0.0: every interface; the chart passes the
    /// node's IP, 127.0.0.1 keeps it local).
    #[arg(long, default_value_t = DEFAULT_BIND, value_name = "IP")]
    pub metrics_bind_address: std::net::IpAddr,
}

/// Every metric nicmon exports. Cheap to share (`Arc<Metrics>`); all updates take `&self`.
pub struct Metrics {
    registry: Registry,
    node: String,
    /// Every family ([`families`]'s table).
    f: Families,
    /// The boot's cumulative lost-record count last added to `kmsg_records_lost`.
    kmsg_lost_seen: std::sync::atomic::AtomicU64,
    /// Why the kernel log is not watched (empty while it is).
    kernel_log_reason: std::sync::Mutex<String>,
    /// The reader's cumulative abandoned-read count last added to `reads_abandoned`.
    reads_abandoned_seen: std::sync::atomic::AtomicU64,
    /// The stuck reads as `/healthz` lists them.
    stuck_reads: std::sync::Mutex<Vec<String>>,
    /// The device and counter names of the counter series, each allocated once.
    label_values: std::sync::Mutex<std::collections::BTreeSet<std::sync::Arc<str>>>,
    /// The counter series set by the last [`Metrics::set_counter_values`], by the counter's
    /// key: the next sets only the values that moved and removes only the series gone (no
    /// series made or looked up again on every poll).
    counter_series: std::sync::Mutex<CounterSeries>,
    /// The device readings and roles the device families were last set from
    /// ([`Metrics::observe`]).
    devices_seen: std::sync::Mutex<Option<DevicesSeen>>,
    /// The sensor reading the temperature families were last set from (held weakly, as the
    /// device readings are): the sensors are read every `thermal.readInterval`, and a poll in
    /// between shares the last reading.
    thermal_seen: std::sync::Mutex<std::sync::Weak<crate::model::Thermal>>,
    /// The ports (and devices) unhealthy now by their state check, and the probable cause of
    /// the event that made them so (`nicmon_unhealthy_ports`).
    causes_now: std::sync::Mutex<BTreeMap<(String, u32), crate::model::cause::Cause>>,
}

/// The device readings (held weakly: compared by identity, kept alive by the snapshot
/// only) and roles a poll's device families were set from.
#[derive(Debug)]
struct DevicesSeen {
    devices: Vec<std::sync::Weak<crate::model::Device>>,
    roles: BTreeMap<String, crate::decide::roles::Classification>,
}

/// The counter series of [`Metrics::set_counter_values`].
#[derive(Debug, Default)]
struct CounterSeries {
    by_key: std::collections::HashMap<std::sync::Arc<str>, CounterSeriesEntry, foldhash::fast::RandomState>,
    /// The call that last set each series (one not set by the latest call is gone).
    round: u64,
    /// The values the last call set (a handle: their map is not kept alive by it).
    last: Option<std::sync::Weak<std::collections::BTreeMap<std::sync::Arc<str>, u64>>>,
}

#[derive(Debug)]
struct CounterSeriesEntry {
    value: u64,
    round: u64,
}

impl Metrics {
    /// A registry with every metric; `node` fills the existing monitor's `node` label.
    pub fn new(node: &str) -> Metrics {
        let f = Families::new();
        let mut registry = Registry::default();
        f.register(&mut registry);
        let m = Metrics {
            registry,
            node: node.to_string(),
            f,
            kmsg_lost_seen: Default::default(),
            kernel_log_reason: std::sync::Mutex::new("not started".into()),
            reads_abandoned_seen: Default::default(),
            stuck_reads: Default::default(),
            label_values: Default::default(),
            counter_series: Default::default(),
            devices_seen: Default::default(),
            thermal_seen: Default::default(),
            causes_now: Default::default(),
        };
        for cause in crate::model::cause::Cause::ALL {
            let labels = NodeCause { node: m.node.clone(), probable_cause: cause.as_str().into() };
            let _ = m.f.unhealthy_ports_by_cause.get_or_create(&labels);
        }
        // Series of change-gated counters exist at 0 from the start, so that rate() and
        // alerts see them before the first event.
        for check in Check::ALL.into_iter().filter(|c| c.defers_first_poll()) {
            let _ =
                m.f.legacy_first_poll_deferred
                    .get_or_create(&NodeCheck { node: m.node.clone(), check: check.to_string() });
        }
        // Not stalled until the watchdog says so (always, without it).
        m.set_poll_stalled(false);
        for check in Check::ALL {
            m.send_series(check.as_str());
        }
        m
    }

    /// The send counters of the check named `check` (a [`Check`]'s name, or the poll-stall
    /// watchdog's `NICPollStallCheck`), created at 0: rate() and the alerts see them before
    /// the first send.
    pub fn send_series(&self, check: &str) {
        let _ = self.f.events_sent.get_or_create(&CheckLabels { check: check.into() });
        for kind in ["retryable", "permanent"] {
            let _ = self.f.events_failed.get_or_create(&FailedLabels { check: check.into(), kind: kind.into() });
        }
        for is_fatal in [false, true] {
            let _ = self.f.legacy_events_sent.get_or_create(&NodeCheckFatal {
                node: self.node.clone(),
                check: check.into(),
                is_fatal,
            });
        }
    }

    /// The exposition text (OpenMetrics, ending in `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Monitored devices per role, replacing the previous cycle's numbers. `role` is the
    /// role's name (`compute`, `storage`, `management`) or `none`.
    pub fn set_devices_by_role<'a>(&self, counts: impl IntoIterator<Item = (&'a str, usize)>) {
        let mut r = self.f.devices.round();
        for (role, n) in counts {
            r.with(&RoleLabels { role: role.into() }, |g| g.set(n as i64));
        }
    }

    /// The existing monitor's per-check device count.
    pub fn set_devices_discovered(&self, check: Check, n: usize) {
        self.f
            .legacy_devices_discovered
            .get_or_create(&NodeCheck { node: self.node.clone(), check: check.to_string() })
            .set(n as i64);
    }

    /// Health of every monitored port `(device, port, healthy)`, replacing the previous
    /// cycle's set (a port that vanished stops being exported).
    pub fn set_port_health<'a>(&self, ports: impl IntoIterator<Item = (&'a str, u32, bool)>) {
        let mut r = self.f.port_healthy.round();
        for (device, port, healthy) in ports {
            r.with(&PortLabels { device: device.into(), port }, |g| g.set(i64::from(healthy)));
        }
    }

    /// The unknown attributes of monitored ports `(device, port, attribute)`, replacing the
    /// previous cycle's set.
    pub fn set_unknown_attributes<'a>(&self, unknown: impl IntoIterator<Item = (&'a str, u32, &'a str)>) {
        let mut r = self.f.port_attribute_unknown.round();
        for (device, port, attribute) in unknown {
            r.with(&AttributeLabels { device: device.into(), port, attribute: attribute.into() }, |g| g.set(1));
        }
    }

    /// An unhealthy transition of `device` port `port` (flap damping counted it).
    pub fn port_flap_transition(&self, device: &str, port: u32) {
        self.f.port_flap_transitions.get_or_create(&PortLabels { device: device.into(), port }).inc();
    }

    /// The ports held as flapping `(device, port)`, replacing the previous set.
    pub fn set_flapping_ports<'a>(&self, ports: impl IntoIterator<Item = (&'a str, u32)>) {
        let mut r = self.f.port_flapping.round();
        for (device, port) in ports {
            r.with(&PortLabels { device: device.into(), port }, |g| g.set(1));
        }
    }

    /// Count the outcome of one send of `events` (one check's batch; `check`: the check's
    /// name, as the events carry it — the courier's batches and the poll-stall watchdog's
    /// events alike).
    pub fn record_send(&self, check: &str, events: &[HealthEvent], outcome: SendOutcome) {
        if events.is_empty() {
            return;
        }
        match outcome {
            SendOutcome::Accepted => {
                self.f.events_sent.get_or_create(&CheckLabels { check: check.into() }).inc_by(events.len() as u64);
                for ev in events {
                    self.f
                        .legacy_events_sent
                        .get_or_create(&NodeCheckFatal {
                            node: self.node.clone(),
                            check: check.into(),
                            is_fatal: ev.is_fatal,
                        })
                        .inc();
                }
            }
            SendOutcome::Retryable | SendOutcome::Permanent => {
                let kind = if outcome == SendOutcome::Retryable { "retryable" } else { "permanent" };
                self.f
                    .events_failed
                    .get_or_create(&FailedLabels { check: check.into(), kind: kind.into() })
                    .inc_by(events.len() as u64);
            }
        }
    }

    /// An unhealthy event `e` of the NIC `device` port `port` (port 0: the device as a whole;
    /// device empty: the node) was raised.
    fn unhealthy_event(&self, e: &HealthEvent, device: &str, port: u32) {
        let labels = UnhealthyLabels {
            node: self.node.clone(),
            check: e.check_name.to_string(),
            device: device.into(),
            port,
            error_code: e.error_code.first().cloned().unwrap_or_default(),
            is_fatal: e.is_fatal,
        };
        self.f.unhealthy_events.get_or_create(&labels).inc();
    }

    /// One poll cycle took `d` and completed at `completed` (Unix seconds). nicmon reads the
    /// state and the counters in the same cycle: the existing monitor's two categories
    /// (`state`, `counter`) both observe it.
    pub fn observe_poll(&self, d: Duration, completed: f64) {
        let secs = d.as_secs_f64();
        self.f.poll_duration.observe(secs);
        for category in POLL_CATEGORIES {
            let labels = NodeCategory { node: self.node.clone(), category: category.into() };
            self.f.legacy_poll_duration.get_or_create(&labels).observe(secs);
            self.f.legacy_last_completed.get_or_create(&labels).set(completed);
        }
    }

    /// Whether the poll in flight has passed the stall deadline (the poll-stall watchdog's
    /// look): both categories, as nicmon's one poll reads the state and the counters.
    pub fn set_poll_stalled(&self, stalled: bool) {
        for category in POLL_CATEGORIES {
            let labels = NodeCategory { node: self.node.clone(), category: category.into() };
            self.f.legacy_poll_stalled.get_or_create(&labels).set(i64::from(stalled));
        }
    }

    /// `check`'s first poll was deferred `polls` more times (devices unreadable).
    pub fn first_poll_deferred(&self, check: Check, polls: u64) {
        self.f
            .legacy_first_poll_deferred
            .get_or_create(&NodeCheck { node: self.node.clone(), check: check.to_string() })
            .inc_by(polls);
    }

    /// A wake-up from `hook` (an eBPF hook name, `rtnetlink`, ...) triggered a poll;
    /// `delivery`: how long its record took from the kernel program to userspace, when the
    /// hook has a kernel timestamp.
    pub fn wakeup(&self, hook: &str, delivery: Option<Duration>) {
        let labels = HookLabels { hook: hook.into() };
        self.f.wakeups.get_or_create(&labels).inc();
        if let Some(d) = delivery {
            self.f.wakeup_latency.get_or_create(&labels).observe(d.as_secs_f64());
        }
    }

    /// Whether eBPF hook `hook` is attached (set once per hook after attaching).
    pub fn set_ebpf_hook_attached(&self, hook: &str, attached: bool) {
        self.f.ebpf_hook_attached.get_or_create(&HookLabels { hook: hook.into() }).set(i64::from(attached));
    }

    /// Whether the binary embeds the eBPF programs, and whether they are in use.
    pub fn set_ebpf(&self, embedded: bool, available: bool) {
        self.f.ebpf_embedded.set(i64::from(embedded));
        self.f.ebpf_available.set(i64::from(available));
    }

    /// Whether the kernel log is watched; `why_not` says why it is not (ignored when it is).
    pub fn set_kernel_log_watching(&self, watching: bool, why_not: &str) {
        self.f.kernel_log_watching.set(i64::from(watching));
        let mut reason = self.kernel_log_reason.lock().unwrap_or_else(|p| p.into_inner());
        *reason = if watching { String::new() } else { why_not.to_string() };
    }

    /// Whether the kernel log is watched, and why not when it is not.
    pub fn kernel_log_watching(&self) -> (bool, String) {
        let reason = self.kernel_log_reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.f.kernel_log_watching.get() == 1, reason)
    }

    /// Where the roles came from: `metadata`, `sysfs` or `none` (set once, at start-up: the
    /// topology is resolved once per run).
    pub fn set_topology_source(&self, source: &str) {
        self.f.topology_source.clear();
        self.f.topology_source.get_or_create(&SourceLabels { source: source.into() }).set(1);
    }

    /// Counters currently saturated `(device, port, counter)`, replacing the previous set.
    pub fn set_saturated_counters<'a>(&self, counters: impl IntoIterator<Item = (&'a str, u32, &'a str)>) {
        let mut r = self.f.counter_saturated.round();
        for (device, port, counter) in counters {
            r.with(&CounterLabels { device: device.into(), port, counter: counter.into() }, |g| g.set(1));
        }
    }

    /// The PCIe link and AER totals of every monitored PF, replacing the previous cycle's
    /// (an unknown figure is not exported).
    pub fn set_pcie<'a>(&self, pfs: impl IntoIterator<Item = crate::decide::pcie::check::Figures<'a>>) {
        let (mut speeds, mut widths) = (self.f.pcie_link_speed.round(), self.f.pcie_link_width.round());
        let mut aers = self.f.pcie_aer_errors.round();
        for (device, speed, width, aer) in pfs {
            let labels = DeviceLabels { device: device.into() };
            if let Some(s) = speed {
                speeds.with(&labels, |g| g.set(s));
            }
            if let Some(w) = width {
                widths.with(&labels, |g| g.set(i64::from(w)));
            }
            for (severity, total) in aer {
                if let Some(t) = total {
                    let labels = AerLabels { device: device.into(), severity: severity.into() };
                    aers.with(&labels, |g| g.set(i64::try_from(t).unwrap_or(i64::MAX)));
                }
            }
        }
    }

    /// What each monitored PF's PCIe link can train at (`(device, capability)`: the lower of
    /// its and its upstream port's maxima), after [`Metrics::set_pcie`] of the same poll.
    pub fn set_pcie_capability<'a>(
        &self,
        pfs: impl IntoIterator<Item = (&'a str, crate::decide::pcie::link::Capability)>,
    ) {
        let (mut speeds, mut widths) = (self.f.pcie_link_max_speed.round(), self.f.pcie_link_max_width.round());
        for (device, cap) in pfs {
            let labels = DeviceLabels { device: device.into() };
            if let Some(s) = cap.speed {
                speeds.with(&labels, |g| g.set(f64::from(s.mts()) / 1000.0));
            }
            if let Some(w) = cap.width {
                widths.with(&labels, |g| g.set(i64::from(w)));
            }
        }
    }

    /// The counters the rules read, `(key, value)` with the counter state's key
    /// (`device:port:rule`, [`crate::decide::counters::counter_key`]), replacing the previous
    /// set. A series whose value did not move is not touched.
    pub fn set_counter_values(&self, values: &crate::decide::counters::LastValues) {
        let mut series = self.counter_series.lock().unwrap_or_else(|p| p.into_inner());
        // The same map as the last call's: no value moved, no counter came or went.
        if series.last.as_ref().is_some_and(|h| values.is(h)) {
            return;
        }
        series.last = Some(values.handle());
        series.round = series.round.wrapping_add(1);
        let round = series.round;
        let mut added = false;
        // Sized once for every series (no table regrown, old and new alive, as they come).
        let more = values.len().saturating_sub(series.by_key.len());
        series.by_key.reserve(more);
        for (key, &value) in values.iter() {
            if let Some(e) = series.by_key.get_mut(&**key) {
                if e.value != value
                    && let Some(labels) = self.counter_labels(key)
                {
                    self.f.counter_value.get_or_create(&labels).set(value as f64);
                    e.value = value;
                }
                e.round = round;
                continue;
            }
            let Some(labels) = self.counter_labels(key) else { continue };
            self.f.counter_value.get_or_create(&labels).set(value as f64);
            // The state's key itself (one allocation for both).
            series.by_key.insert(key.clone(), CounterSeriesEntry { value, round });
            added = true;
        }
        let before = series.by_key.len();
        series.by_key.retain(|key, e| {
            let kept = e.round == round;
            if !kept && let Some(labels) = self.counter_labels(key) {
                self.f.counter_value.remove(&labels);
            }
            kept
        });
        if added || series.by_key.len() != before {
            // Names no series uses any more are let go.
            self.label_values.lock().unwrap_or_else(|p| p.into_inner()).retain(|s| std::sync::Arc::strong_count(s) > 1);
        }
    }

    /// The label set of the counter series of `key` (`device:port:rule`), its names shared
    /// (made from the key when asked for: the series map keeps no label set per counter).
    fn counter_labels(&self, key: &str) -> Option<CounterLabels> {
        let (device, port, counter) = crate::decide::counters::parse_counter_key(key)?;
        let mut names = self.label_values.lock().unwrap_or_else(|p| p.into_inner());
        let mut shared = |v: &str| match names.get(v) {
            Some(s) => s.clone(),
            None => {
                let s: std::sync::Arc<str> = v.into();
                names.insert(s.clone());
                s
            }
        };
        Some(CounterLabels { device: shared(device), port, counter: shared(counter) })
    }

    /// `n` kernel log records were lost (`/dev/kmsg` returned `EPIPE` / a sequence gap).
    /// `total` is the boot's cumulative count (from the state): the counter grows by what is
    /// new since the last call. A smaller total (new boot, state reset) starts over.
    pub fn kmsg_records_lost(&self, total: u64) {
        use std::sync::atomic::Ordering;
        let seen = self.kmsg_lost_seen.swap(total, Ordering::Relaxed);
        if total > seen {
            self.f.kmsg_records_lost.inc_by(total - seen);
        }
    }

    /// `new` more wake records were dropped by the eBPF programs (ring buffer full).
    pub fn ebpf_wake_records_lost(&self, new: u64) {
        self.f.ebpf_wake_records_lost.inc_by(new);
    }

    /// The host reader's health: its cumulative abandoned-read count and the reads that have
    /// not returned (path, how long ago each started).
    pub fn set_read_health(&self, abandoned_total: u64, stuck: &[(std::path::PathBuf, std::time::Duration)]) {
        use std::sync::atomic::Ordering;
        let seen = self.reads_abandoned_seen.swap(abandoned_total, Ordering::Relaxed);
        if abandoned_total > seen {
            self.f.reads_abandoned.inc_by(abandoned_total - seen);
        }
        self.f.reads_stuck.set(stuck.len() as i64);
        let lines = stuck.iter().map(|(p, age)| format!("stuck read: {} (for {:.1?})", p.display(), age)).collect();
        *self.stuck_reads.lock().unwrap_or_else(|p| p.into_inner()) = lines;
    }

    /// One line per stuck host read, for `/healthz`'s body.
    pub fn stuck_reads(&self) -> Vec<String> {
        self.stuck_reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A state-check error event for `device` port `port` (the existing monitor's metric).
    pub fn state_check_error(&self, check: Check, device: &str, port: u32) {
        self.f
            .legacy_state_check_errors
            .get_or_create(&NodeCheckDevicePort {
                node: self.node.clone(),
                check: check.to_string(),
                device: device.into(),
                port,
            })
            .inc();
    }

    /// A held port transition that recovered within `portStateHoldDown` (published nothing).
    pub fn port_state_blip(&self, check: Check, device: &str, port: u32) {
        self.f
            .port_state_blips
            .get_or_create(&NodeCheckDevicePort {
                node: self.node.clone(),
                check: check.to_string(),
                device: device.into(),
                port,
            })
            .inc();
    }

    /// A counter threshold breach (the existing monitor's metric).
    pub fn counter_threshold_breach(&self, counter: &str, device: &str, port: u32, fatal: bool) {
        self.f
            .legacy_breaches
            .get_or_create(&NodeCounterDevicePortFatal {
                node: self.node.clone(),
                counter: counter.into(),
                device: device.into(),
                port,
                is_fatal: fatal,
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::counters::LastValues;
    use crate::model::event::Stamp;

    /// Upstream's stall gauge: 0 for both categories from the start, 1 while stalled.
    #[test]
    fn the_poll_stalled_gauge_starts_at_zero_for_both_categories() {
        let m = Metrics::new("gpu-node-1");
        let line =
            |c: &str, v: u8| format!(r#"nic_health_monitor_poll_stalled{{node="gpu-node-1",category="{c}"}} {v}"#);
        let text = m.encode();
        assert!(text.contains(&line("state", 0)) && text.contains(&line("counter", 0)), "{text}");
        m.set_poll_stalled(true);
        let text = m.encode();
        assert!(text.contains(&line("state", 1)) && text.contains(&line("counter", 1)), "{text}");
    }

    /// The counter series follow each map of last values set: the same map again changes
    /// nothing; a copy with a value moved, or an older map, sets what it holds.
    #[test]
    fn the_counter_series_follow_each_new_map_of_values() {
        let m = Metrics::new("gpu-node-1");
        let line = |c: &str, v: u64| format!(r#"nicmon_port_counter{{device="mlx5_0",port="1",counter="{c}"}} {v}.0"#);
        let a: LastValues =
            [("mlx5_0:1:link_downed".into(), 3), ("mlx5_0:1:symbol_error".into(), 70)].into_iter().collect();
        m.set_counter_values(&a);
        m.set_counter_values(&a);
        let text = m.encode();
        assert!(text.contains(&line("link_downed", 3)) && text.contains(&line("symbol_error", 70)), "{text}");
        let mut b = a.clone();
        b.remove("mlx5_0:1:link_downed");
        b.set(&std::collections::BTreeMap::<std::sync::Arc<str>, ()>::new(), "mlx5_0:1:symbol_error", 71);
        m.set_counter_values(&b);
        let text = m.encode();
        assert!(text.contains(&line("symbol_error", 71)), "{text}");
        assert!(!text.contains(r#"counter="link_downed""#), "a counter gone is still exported:\n{text}");
        m.set_counter_values(&a);
        let text = m.encode();
        assert!(text.contains(&line("link_downed", 3)) && text.contains(&line("symbol_error", 70)), "{text}");
    }

    #[test]
    fn exports_the_named_metrics() {
        let m = Metrics::new("gpu-node-1");
        m.set_devices_by_role([("compute", 8), ("storage", 2)]);
        m.set_devices_discovered(Check::InfiniBandStateCheck, 10);
        m.set_port_health([("mlx5_0", 1, true), ("mlx5_3", 1, false)]);
        m.port_flap_transition("mlx5_3", 1);
        m.port_flap_transition("mlx5_3", 1);
        m.set_flapping_ports([("mlx5_0", 1)]);
        m.set_flapping_ports([("mlx5_3", 1)]);
        let ev =
            HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, "down")
                .unhealthy(true);
        m.record_send(Check::InfiniBandStateCheck.as_str(), std::slice::from_ref(&ev), SendOutcome::Accepted);
        m.record_send(Check::EthernetStateCheck.as_str(), &[ev.clone(), ev], SendOutcome::Retryable);
        m.observe_poll(Duration::from_millis(2), 1_790_000_000.5);
        m.first_poll_deferred(Check::InfiniBandStateCheck, 2);
        m.wakeup("qdisc_reset", Some(Duration::from_micros(800)));
        m.wakeup("rtnetlink", None);
        m.set_ebpf_hook_attached("qdisc_reset", true);
        m.set_ebpf_hook_attached("netif_carrier_off", false);
        m.set_ebpf(true, true);
        assert_eq!(m.kernel_log_watching(), (false, "not started".to_string()));
        m.set_kernel_log_watching(true, "");
        assert_eq!(m.kernel_log_watching(), (true, String::new()));
        m.set_topology_source("metadata");
        m.set_topology_source("sysfs");
        m.set_saturated_counters([("mlx5_0", 1, "port_rcv_errors")]);
        let values = |v: &[(&str, u64)]| v.iter().map(|&(k, n)| (k.into(), n)).collect::<LastValues>();
        m.set_counter_values(&values(&[("mlx5_0:1:link_downed", 3), ("mlx5_0:1:symbol_error", 70)]));
        m.set_counter_values(&values(&[("mlx5_0:1:symbol_error", 65535)]));
        m.set_unknown_attributes([("mlx5_9", 1, "state"), ("mlx5_9", 1, "link_layer")]);
        m.kmsg_records_lost(3); // cumulative totals, one per cycle
        m.kmsg_records_lost(3);
        m.kmsg_records_lost(5);
        m.ebpf_wake_records_lost(2);
        m.ebpf_wake_records_lost(0);
        m.state_check_error(Check::InfiniBandStateCheck, "mlx5_3", 1);
        m.counter_threshold_breach("symbol_error", "mlx5_0", 1, false);
        m.port_state_blip(Check::InfiniBandStateCheck, "mlx5_0", 1);
        m.port_state_blip(Check::InfiniBandStateCheck, "mlx5_0", 1);
        let quiet = [("correctable", Some(0)), ("nonfatal", Some(0)), ("fatal", Some(0))];
        m.set_pcie([("mlx5_9", Some(32.0), Some(16), quiet)]);
        m.set_pcie([
            ("mlx5_0", Some(32.0), Some(8), [("correctable", Some(118)), ("nonfatal", Some(0)), ("fatal", Some(1))]),
            ("mlx5_1", None, None, [("correctable", None), ("nonfatal", None), ("fatal", None)]),
        ]);

        let text = m.encode();
        // The previous cycle's PFs and unknown figures are not exported.
        assert!(!text.contains("nicmon_pcie_link_width{device=\"mlx5_9\"}"), "{text}");
        assert!(!text.contains("nicmon_pcie_link_speed_gts{device=\"mlx5_1\"}"), "{text}");
        assert!(!text.contains("nicmon_pcie_aer_errors{device=\"mlx5_1\""), "{text}");
        let expect = [
            r#"nicmon_devices{role="compute"} 8"#,
            r#"nicmon_devices{role="storage"} 2"#,
            r#"nicmon_port_healthy{device="mlx5_0",port="1"} 1"#,
            r#"nicmon_pcie_link_speed_gts{device="mlx5_0"} 32.0"#,
            r#"nicmon_pcie_link_width{device="mlx5_0"} 8"#,
            r#"nicmon_pcie_aer_errors{device="mlx5_0",severity="correctable"} 118"#,
            r#"nicmon_pcie_aer_errors{device="mlx5_0",severity="fatal"} 1"#,
            r#"nicmon_port_healthy{device="mlx5_3",port="1"} 0"#,
            r#"nicmon_port_flap_transitions_total{device="mlx5_3",port="1"} 2"#,
            r#"nicmon_port_flapping{device="mlx5_3",port="1"} 1"#,
            r#"nicmon_port_attribute_unknown{device="mlx5_9",port="1",attribute="state"} 1"#,
            r#"nicmon_port_attribute_unknown{device="mlx5_9",port="1",attribute="link_layer"} 1"#,
            r#"nicmon_events_sent_total{check="InfiniBandStateCheck"} 1"#,
            r#"nicmon_events_sent_total{check="NICKernelLogCheck"} 0"#,
            r#"nicmon_events_failed_total{check="EthernetStateCheck",kind="retryable"} 2"#,
            r#"nicmon_events_failed_total{check="EthernetStateCheck",kind="permanent"} 0"#,
            "nicmon_poll_duration_seconds_count 1",
            r#"nicmon_wakeups_total{hook="qdisc_reset"} 1"#,
            r#"nicmon_wakeups_total{hook="rtnetlink"} 1"#,
            r#"nicmon_wakeup_latency_seconds_count{hook="qdisc_reset"} 1"#,
            r#"nicmon_wakeup_latency_seconds_bucket{le="0.0005",hook="qdisc_reset"} 0"#,
            r#"nicmon_wakeup_latency_seconds_bucket{le="0.001",hook="qdisc_reset"} 1"#,
            r#"nicmon_ebpf_hook_attached{hook="qdisc_reset"} 1"#,
            r#"nicmon_ebpf_hook_attached{hook="netif_carrier_off"} 0"#,
            r#"nicmon_topology_source{source="sysfs"} 1"#,
            r#"nicmon_counter_saturated{device="mlx5_0",port="1",counter="port_rcv_errors"} 1"#,
            r#"nicmon_port_counter{device="mlx5_0",port="1",counter="symbol_error"} 65535.0"#,
            "nicmon_kmsg_records_lost_total 5",
            "nicmon_ebpf_wake_records_lost_total 2",
            "nicmon_ebpf_embedded 1",
            "nicmon_ebpf_available 1",
            "nicmon_kernel_log_watching 1",
            r#"nic_health_monitor_devices_discovered{node="gpu-node-1",check="InfiniBandStateCheck"} 10"#,
            r#"nic_health_monitor_health_events_sent_total{node="gpu-node-1",check="InfiniBandStateCheck",is_fatal="true"} 1"#,
            r#"nic_health_monitor_health_events_sent_total{node="gpu-node-1",check="EthernetStateCheck",is_fatal="false"} 0"#,
            r#"nic_health_monitor_poll_cycle_duration_seconds_count{node="gpu-node-1",category="state"} 1"#,
            r#"nic_health_monitor_poll_cycle_duration_seconds_count{node="gpu-node-1",category="counter"} 1"#,
            r#"nic_health_monitor_poll_cycle_last_completed_timestamp_seconds{node="gpu-node-1",category="state"} 1790000000.5"#,
            r#"nic_health_monitor_poll_cycle_last_completed_timestamp_seconds{node="gpu-node-1",category="counter"} 1790000000.5"#,
            r#"nic_health_monitor_first_poll_deferred_total{node="gpu-node-1",check="InfiniBandStateCheck"} 2"#,
            r#"nic_health_monitor_first_poll_deferred_total{node="gpu-node-1",check="EthernetStateCheck"} 0"#,
            r#"nic_health_monitor_state_check_errors_total{node="gpu-node-1",check="InfiniBandStateCheck",device="mlx5_3",port="1"} 1"#,
            r#"nic_health_monitor_counter_threshold_breaches_total{node="gpu-node-1",counter="symbol_error",device="mlx5_0",port="1",is_fatal="false"} 1"#,
            r#"nic_health_monitor_port_state_blips_total{node="gpu-node-1",check="InfiniBandStateCheck",device="mlx5_0",port="1"} 2"#,
        ];
        for line in expect {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(!text.contains(r#"source="metadata""#), "old source kept:\n{text}");
        assert!(!text.contains(r#"counter="link_downed"} 3"#), "counter of the previous poll kept:\n{text}");
        assert!(!text.contains(r#"nicmon_wakeup_latency_seconds_count{hook="rtnetlink"}"#), "no kernel time:\n{text}");
        assert!(!text.contains(r#"nicmon_port_flapping{device="mlx5_0""#), "settled port kept:\n{text}");
        assert!(text.ends_with("# EOF\n"));

        // A family without series is declared all the same.
        let text = Metrics::new("n").encode();
        for line in ["# TYPE nicmon_port_flapping gauge", "# TYPE nicmon_wakeup_latency_seconds histogram"] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
