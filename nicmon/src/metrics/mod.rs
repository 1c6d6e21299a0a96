//! Prometheus metrics (SPEC §1.9) and the HTTP endpoint that serves them with `/healthz`.
//!
//! [`Metrics`] owns the registry; the daemon loop holds an `Arc<Metrics>` and calls its
//! update methods, [`server::start`] serves it. Two sets of names are exported:
//! - `nicmon_*`: this monitor's own view (roles, eBPF hooks, wake-ups, ...);
//! - `nic_health_monitor_*`: the existing NIC monitor's names and labels, so the
//!   dashboards people already have keep working after the switch.
pub mod server;

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use server::{Liveness, MetricsServer};

use crate::dispatch::SendError;
use crate::event::{Check, HealthEvent};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabels {
    device: String,
    port: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttributeLabels {
    device: String,
    port: u32,
    attribute: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailedLabels {
    check: String,
    /// `retryable` or `permanent`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    device: String,
    port: u32,
    counter: String,
}

// The existing monitor's label sets (`node` on every series).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCheck {
    node: String,
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCheckFatal {
    node: String,
    check: String,
    is_fatal: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCategory {
    node: String,
    category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCheckDevicePort {
    node: String,
    check: String,
    device: String,
    port: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCounterDevicePortFatal {
    node: String,
    counter: String,
    device: String,
    port: u32,
    is_fatal: bool,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets of the existing monitor's poll histogram (Prometheus' default buckets).
const LEGACY_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// A poll of a full node takes ~2 ms (SPEC §3): finer buckets at the bottom.
const POLL_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// The existing monitor's poll categories (`category` label).
const POLL_CATEGORIES: [&str; 2] = ["state", "counter"];

fn legacy_histogram() -> Histogram {
    Histogram::new(LEGACY_BUCKETS)
}

/// Every metric nicmon exports. Cheap to share (`Arc<Metrics>`); all updates take `&self`.
pub struct Metrics {
    registry: Registry,
    node: String,

    devices: Family<RoleLabels, Gauge>,
    port_healthy: Family<PortLabels, Gauge>,
    port_flap_transitions: Family<PortLabels, Counter>,
    port_flapping: Family<PortLabels, Gauge>,
    port_attribute_unknown: Family<AttributeLabels, Gauge>,
    events_sent: Family<CheckLabels, Counter>,
    events_failed: Family<FailedLabels, Counter>,
    poll_duration: Histogram,
    wakeups: Family<HookLabels, Counter>,
    ebpf_hook_attached: Family<HookLabels, Gauge>,
    topology_source: Family<SourceLabels, Gauge>,
    counter_saturated: Family<CounterLabels, Gauge>,
    kmsg_records_lost: Counter,
    /// The boot's cumulative lost-record count last added to `kmsg_records_lost`.
    kmsg_lost_seen: std::sync::atomic::AtomicU64,
    ebpf_wake_records_lost: Counter,
    ebpf_embedded: Gauge,
    ebpf_available: Gauge,
    kernel_log_watching: Gauge,
    /// Why the kernel log is not watched (empty while it is).
    kernel_log_reason: std::sync::Mutex<String>,
    reads_abandoned: Counter,
    /// The reader's cumulative abandoned-read count last added to `reads_abandoned`.
    reads_abandoned_seen: std::sync::atomic::AtomicU64,
    reads_stuck: Gauge,
    /// The stuck reads as `/healthz` lists them.
    stuck_reads: std::sync::Mutex<Vec<String>>,

    legacy_devices_discovered: Family<NodeCheck, Gauge>,
    legacy_events_sent: Family<NodeCheckFatal, Counter>,
    legacy_poll_duration: HistogramFamily<NodeCategory>,
    legacy_state_check_errors: Family<NodeCheckDevicePort, Counter>,
    port_state_blips: Family<NodeCheckDevicePort, Counter>,
    legacy_breaches: Family<NodeCounterDevicePortFatal, Counter>,
    legacy_last_completed: Family<NodeCategory, Gauge<f64, std::sync::atomic::AtomicU64>>,
    legacy_first_poll_deferred: Family<NodeCheck, Counter>,
}

impl Metrics {
    /// A registry with every metric; `node` fills the existing monitor's `node` label.
    pub fn new(node: &str) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            node: node.to_string(),
            devices: Family::default(),
            port_healthy: Family::default(),
            port_flap_transitions: Family::default(),
            port_flapping: Family::default(),
            port_attribute_unknown: Family::default(),
            events_sent: Family::default(),
            events_failed: Family::default(),
            poll_duration: Histogram::new(POLL_BUCKETS),
            wakeups: Family::default(),
            ebpf_hook_attached: Family::default(),
            topology_source: Family::default(),
            counter_saturated: Family::default(),
            kmsg_records_lost: Counter::default(),
            kmsg_lost_seen: Default::default(),
            ebpf_wake_records_lost: Counter::default(),
            ebpf_embedded: Gauge::default(),
            ebpf_available: Gauge::default(),
            kernel_log_watching: Gauge::default(),
            kernel_log_reason: std::sync::Mutex::new("not started".into()),
            reads_abandoned: Counter::default(),
            reads_abandoned_seen: Default::default(),
            reads_stuck: Gauge::default(),
            stuck_reads: Default::default(),
            legacy_devices_discovered: Family::default(),
            legacy_events_sent: Family::default(),
            legacy_poll_duration: Family::new_with_constructor(legacy_histogram),
            legacy_state_check_errors: Family::default(),
            port_state_blips: Family::default(),
            legacy_breaches: Family::default(),
            legacy_last_completed: Family::default(),
            legacy_first_poll_deferred: Family::default(),
        };
        // Counters get a `_total` suffix from the encoder: registered without it.
        registry.register(
            "nicmon_devices",
            "RDMA devices by role (compute, storage, management); management devices are not monitored",
            m.devices.clone(),
        );
        registry.register(
            "nicmon_port_healthy",
            "1 while a monitored port is healthy, 0 while it is not; absent while its state is unknown",
            m.port_healthy.clone(),
        );
        registry.register(
            "nicmon_port_flap_transitions",
            "Unhealthy transitions (healthy to unhealthy) of a monitored port, reported or held by flap damping",
            m.port_flap_transitions.clone(),
        );
        registry.register(
            "nicmon_port_flapping",
            "1 while a port is held as flapping (one fatal event sent, further transitions not published)",
            m.port_flapping.clone(),
        );
        registry.register(
            "nicmon_port_attribute_unknown",
            "1 while a monitored port's attribute (state, phys_state, link_layer) is unknown: unreadable, stuck, empty or unparsable",
            m.port_attribute_unknown.clone(),
        );
        registry.register("nicmon_events_sent", "Health events accepted by the sink, by check", m.events_sent.clone());
        registry.register(
            "nicmon_events_failed",
            "Health events in batches the sink did not accept, by check and failure kind",
            m.events_failed.clone(),
        );
        registry.register(
            "nicmon_poll_duration_seconds",
            "Wall time of one poll: reading sysfs and evaluating every check (dispatch is asynchronous)",
            m.poll_duration.clone(),
        );
        registry.register(
            "nicmon_wakeups",
            "Wake-ups that triggered an immediate poll, by source (eBPF hook name, or rtnetlink)",
            m.wakeups.clone(),
        );
        registry.register(
            "nicmon_ebpf_hook_attached",
            "1 when the eBPF hook is attached, 0 when it could not attach",
            m.ebpf_hook_attached.clone(),
        );
        registry.register(
            "nicmon_topology_source",
            "1 for the source the NIC roles come from (metadata, sysfs, none)",
            m.topology_source.clone(),
        );
        registry.register(
            "nicmon_counter_saturated",
            "1 while a counter reads at its maximum and no longer counts",
            m.counter_saturated.clone(),
        );
        registry.register(
            "nicmon_kmsg_records_lost",
            "Kernel log records overwritten before they were read",
            m.kmsg_records_lost.clone(),
        );
        registry.register(
            "nicmon_ebpf_wake_records_lost",
            "Wake records the eBPF programs dropped because their ring buffer was full; harmless for detection: \
             the 1 s full poll still runs and sees what they announced",
            m.ebpf_wake_records_lost.clone(),
        );
        registry.register(
            "nicmon_ebpf_embedded",
            "1 when this binary carries the eBPF programs",
            m.ebpf_embedded.clone(),
        );
        registry.register(
            "nicmon_ebpf_available",
            "1 when the eBPF programs loaded and at least one hook is attached",
            m.ebpf_available.clone(),
        );
        registry.register(
            "nicmon_kernel_log_watching",
            "1 while the kernel log (/dev/kmsg) is watched, 0 when NICKernelLogCheck cannot see it",
            m.kernel_log_watching.clone(),
        );
        registry.register(
            "nicmon_reads_abandoned",
            "Host reads (sysfs, procfs) abandoned at their deadline; the value read is unknown for that poll",
            m.reads_abandoned.clone(),
        );
        registry.register(
            "nicmon_reads_stuck",
            "Host reads abandoned at their deadline that have not returned yet (each holds a reader thread)",
            m.reads_stuck.clone(),
        );
        registry.register(
            "nic_health_monitor_devices_discovered",
            "Number of monitored NIC ports (the existing monitor's name; labelled check=InfiniBandStateCheck)",
            m.legacy_devices_discovered.clone(),
        );
        registry.register(
            "nic_health_monitor_health_events_sent",
            "Total number of health events sent to the platform connector",
            m.legacy_events_sent.clone(),
        );
        registry.register(
            "nic_health_monitor_poll_cycle_duration_seconds",
            "Duration of each poll cycle in seconds",
            m.legacy_poll_duration.clone(),
        );
        registry.register(
            "nic_health_monitor_state_check_errors",
            "Total number of state check error events",
            m.legacy_state_check_errors.clone(),
        );
        registry.register(
            "nic_health_monitor_port_state_blips",
            "Total number of port state transitions that recovered within the hold-down (not reported)",
            m.port_state_blips.clone(),
        );
        registry.register(
            "nic_health_monitor_counter_threshold_breaches",
            "Total number of counter threshold breaches detected",
            m.legacy_breaches.clone(),
        );
        registry.register(
            "nic_health_monitor_poll_cycle_last_completed_timestamp_seconds",
            "Unix time at which the last poll cycle of the category completed",
            m.legacy_last_completed.clone(),
        );
        registry.register(
            "nic_health_monitor_first_poll_deferred",
            "Polls a check skipped before its first evaluation because devices were unreadable (at most 3 per start)",
            m.legacy_first_poll_deferred.clone(),
        );
        // Series of change-gated counters exist at 0 from the start, so that rate() and
        // alerts see them before the first event.
        for check in Check::ALL.into_iter().filter(|c| c.defers_first_poll()) {
            let _ = m
                .legacy_first_poll_deferred
                .get_or_create(&NodeCheck { node: m.node.clone(), check: check.to_string() });
        }
        for check in Check::ALL {
            let _ = m.events_sent.get_or_create(&check_labels(check));
            for is_fatal in [false, true] {
                let _ = m.legacy_events_sent.get_or_create(&NodeCheckFatal {
                    node: m.node.clone(),
                    check: check.to_string(),
                    is_fatal,
                });
            }
        }
        Metrics { registry, ..m }
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
        self.devices.clear();
        for (role, n) in counts {
            self.devices.get_or_create(&RoleLabels { role: role.into() }).set(n as i64);
        }
    }

    /// The existing monitor's per-check device count.
    pub fn set_devices_discovered(&self, check: Check, n: usize) {
        self.legacy_devices_discovered
            .get_or_create(&NodeCheck { node: self.node.clone(), check: check.to_string() })
            .set(n as i64);
    }

    /// Health of every monitored port `(device, port, healthy)`, replacing the previous
    /// cycle's set (a port that vanished stops being exported).
    pub fn set_port_health<'a>(&self, ports: impl IntoIterator<Item = (&'a str, u32, bool)>) {
        self.port_healthy.clear();
        for (device, port, healthy) in ports {
            self.port_healthy.get_or_create(&PortLabels { device: device.into(), port }).set(i64::from(healthy));
        }
    }

    /// The unknown attributes of monitored ports `(device, port, attribute)`, replacing the
    /// previous cycle's set.
    pub fn set_unknown_attributes<'a>(&self, unknown: impl IntoIterator<Item = (&'a str, u32, &'a str)>) {
        self.port_attribute_unknown.clear();
        for (device, port, attribute) in unknown {
            self.port_attribute_unknown
                .get_or_create(&AttributeLabels { device: device.into(), port, attribute: attribute.into() })
                .set(1);
        }
    }

    /// An unhealthy transition of `device` port `port` (flap damping counted it).
    pub fn port_flap_transition(&self, device: &str, port: u32) {
        self.port_flap_transitions.get_or_create(&PortLabels { device: device.into(), port }).inc();
    }

    /// The ports held as flapping `(device, port)`, replacing the previous set.
    pub fn set_flapping_ports<'a>(&self, ports: impl IntoIterator<Item = (&'a str, u32)>) {
        self.port_flapping.clear();
        for (device, port) in ports {
            self.port_flapping.get_or_create(&PortLabels { device: device.into(), port }).set(1);
        }
    }

    /// Count the outcome of one `Sink::send` of `events` (one check's batch).
    pub fn record_dispatch(&self, check: Check, events: &[HealthEvent], result: &Result<(), SendError>) {
        if events.is_empty() {
            return;
        }
        match result {
            Ok(()) => {
                self.events_sent.get_or_create(&check_labels(check)).inc_by(events.len() as u64);
                for ev in events {
                    self.legacy_events_sent
                        .get_or_create(&NodeCheckFatal {
                            node: self.node.clone(),
                            check: check.to_string(),
                            is_fatal: ev.is_fatal,
                        })
                        .inc();
                }
            }
            Err(e) => {
                let kind = if e.is_retryable() { "retryable" } else { "permanent" };
                self.events_failed
                    .get_or_create(&FailedLabels { check: check.to_string(), kind: kind.into() })
                    .inc_by(events.len() as u64);
            }
        }
    }

    /// One poll cycle took `d` and completed at `completed` (Unix seconds). nicmon reads the
    /// state and the counters in the same cycle: the existing monitor's two categories
    /// (`state`, `counter`) both observe it.
    pub fn observe_poll(&self, d: Duration, completed: f64) {
        let secs = d.as_secs_f64();
        self.poll_duration.observe(secs);
        for category in POLL_CATEGORIES {
            let labels = NodeCategory { node: self.node.clone(), category: category.into() };
            self.legacy_poll_duration.get_or_create(&labels).observe(secs);
            self.legacy_last_completed.get_or_create(&labels).set(completed);
        }
    }

    /// `check`'s first poll was deferred `polls` more times (devices unreadable).
    pub fn first_poll_deferred(&self, check: Check, polls: u64) {
        self.legacy_first_poll_deferred
            .get_or_create(&NodeCheck { node: self.node.clone(), check: check.to_string() })
            .inc_by(polls);
    }

    /// A wake-up from `hook` (an eBPF hook name, `rtnetlink`, ...) triggered a poll.
    pub fn wakeup(&self, hook: &str) {
        self.wakeups.get_or_create(&HookLabels { hook: hook.into() }).inc();
    }

    /// Whether eBPF hook `hook` is attached (set once per hook after attaching).
    pub fn set_ebpf_hook_attached(&self, hook: &str, attached: bool) {
        self.ebpf_hook_attached.get_or_create(&HookLabels { hook: hook.into() }).set(i64::from(attached));
    }

    /// Whether the binary embeds the eBPF programs, and whether they are in use.
    pub fn set_ebpf(&self, embedded: bool, available: bool) {
        self.ebpf_embedded.set(i64::from(embedded));
        self.ebpf_available.set(i64::from(available));
    }

    /// Whether the kernel log is watched; `why_not` says why it is not (ignored when it is).
    pub fn set_kernel_log_watching(&self, watching: bool, why_not: &str) {
        self.kernel_log_watching.set(i64::from(watching));
        let mut reason = self.kernel_log_reason.lock().unwrap_or_else(|p| p.into_inner());
        *reason = if watching { String::new() } else { why_not.to_string() };
    }

    /// Whether the kernel log is watched, and why not when it is not.
    pub fn kernel_log_watching(&self) -> (bool, String) {
        let reason = self.kernel_log_reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.kernel_log_watching.get() == 1, reason)
    }

    /// Where the roles came from this cycle: `metadata`, `sysfs` or `none`.
    pub fn set_topology_source(&self, source: &str) {
        self.topology_source.clear();
        self.topology_source.get_or_create(&SourceLabels { source: source.into() }).set(1);
    }

    /// Counters currently saturated `(device, port, counter)`, replacing the previous set.
    pub fn set_saturated_counters<'a>(&self, counters: impl IntoIterator<Item = (&'a str, u32, &'a str)>) {
        self.counter_saturated.clear();
        for (device, port, counter) in counters {
            self.counter_saturated
                .get_or_create(&CounterLabels { device: device.into(), port, counter: counter.into() })
                .set(1);
        }
    }

    /// `n` kernel log records were lost (`/dev/kmsg` returned `EPIPE` / a sequence gap).
    /// `total` is the boot's cumulative count (from the state): the counter grows by what is
    /// new since the last call. A smaller total (new boot, state reset) starts over.
    pub fn kmsg_records_lost(&self, total: u64) {
        use std::sync::atomic::Ordering;
        let seen = self.kmsg_lost_seen.swap(total, Ordering::Relaxed);
        if total > seen {
            self.kmsg_records_lost.inc_by(total - seen);
        }
    }

    /// `new` more wake records were dropped by the eBPF programs (ring buffer full).
    pub fn ebpf_wake_records_lost(&self, new: u64) {
        self.ebpf_wake_records_lost.inc_by(new);
    }

    /// The host reader's health: its cumulative abandoned-read count and the reads that have
    /// not returned (path, how long ago each started).
    pub fn set_read_health(&self, abandoned_total: u64, stuck: &[(std::path::PathBuf, std::time::Duration)]) {
        use std::sync::atomic::Ordering;
        let seen = self.reads_abandoned_seen.swap(abandoned_total, Ordering::Relaxed);
        if abandoned_total > seen {
            self.reads_abandoned.inc_by(abandoned_total - seen);
        }
        self.reads_stuck.set(stuck.len() as i64);
        let lines = stuck.iter().map(|(p, age)| format!("stuck read: {} (for {:.1?})", p.display(), age)).collect();
        *self.stuck_reads.lock().unwrap_or_else(|p| p.into_inner()) = lines;
    }

    /// One line per stuck host read, for `/healthz`'s body.
    pub fn stuck_reads(&self) -> Vec<String> {
        self.stuck_reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A state-check error event for `device` port `port` (the existing monitor's metric).
    pub fn state_check_error(&self, check: Check, device: &str, port: u32) {
        self.legacy_state_check_errors
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
        self.port_state_blips
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
        self.legacy_breaches
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

fn check_labels(check: Check) -> CheckLabels {
    CheckLabels { check: check.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Stamp;

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
        m.record_dispatch(Check::InfiniBandStateCheck, std::slice::from_ref(&ev), &Ok(()));
        let down = Err(SendError::Unavailable { target: "unix:///x".into(), attempts: 5, last: "gone".into() });
        m.record_dispatch(Check::EthernetStateCheck, &[ev.clone(), ev], &down);
        m.observe_poll(Duration::from_millis(2), 1_790_000_000.5);
        m.first_poll_deferred(Check::InfiniBandStateCheck, 2);
        m.wakeup("qdisc_reset");
        m.set_ebpf_hook_attached("qdisc_reset", true);
        m.set_ebpf_hook_attached("netif_carrier_off", false);
        m.set_ebpf(true, true);
        assert_eq!(m.kernel_log_watching(), (false, "not started".to_string()));
        m.set_kernel_log_watching(true, "");
        assert_eq!(m.kernel_log_watching(), (true, String::new()));
        m.set_topology_source("metadata");
        m.set_topology_source("sysfs");
        m.set_saturated_counters([("mlx5_0", 1, "port_rcv_errors")]);
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

        let text = m.encode();
        let expect = [
            r#"nicmon_devices{role="compute"} 8"#,
            r#"nicmon_devices{role="storage"} 2"#,
            r#"nicmon_port_healthy{device="mlx5_0",port="1"} 1"#,
            r#"nicmon_port_healthy{device="mlx5_3",port="1"} 0"#,
            r#"nicmon_port_flap_transitions_total{device="mlx5_3",port="1"} 2"#,
            r#"nicmon_port_flapping{device="mlx5_3",port="1"} 1"#,
            r#"nicmon_port_attribute_unknown{device="mlx5_9",port="1",attribute="state"} 1"#,
            r#"nicmon_port_attribute_unknown{device="mlx5_9",port="1",attribute="link_layer"} 1"#,
            r#"nicmon_events_sent_total{check="InfiniBandStateCheck"} 1"#,
            r#"nicmon_events_sent_total{check="NICKernelLogCheck"} 0"#,
            r#"nicmon_events_failed_total{check="EthernetStateCheck",kind="retryable"} 2"#,
            "nicmon_poll_duration_seconds_count 1",
            r#"nicmon_wakeups_total{hook="qdisc_reset"} 1"#,
            r#"nicmon_ebpf_hook_attached{hook="qdisc_reset"} 1"#,
            r#"nicmon_ebpf_hook_attached{hook="netif_carrier_off"} 0"#,
            r#"nicmon_topology_source{source="sysfs"} 1"#,
            r#"nicmon_counter_saturated{device="mlx5_0",port="1",counter="port_rcv_errors"} 1"#,
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
        assert!(!text.contains(r#"nicmon_port_flapping{device="mlx5_0""#), "settled port kept:\n{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
