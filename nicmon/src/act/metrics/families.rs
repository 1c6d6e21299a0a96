//! Every metric family nicmon exports, declared once: field, type, constructor, name and
//! help text on one entry of [`families!`]'s table. (Counters get a `_total` suffix from the
//! encoder: their names are written without it.) The label sets are below the table.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::replaced::Replaced;

/// The table's rows become the fields of [`Families`], their constructors
/// [`Families::new`] and their registration [`Families::register`], in this order.
macro_rules! families {
    ($($field:ident: $ty:ty = $init:expr => $name:literal, $help:literal;)*) => {
        /// The metric families (the table in `families.rs`).
        pub(super) struct Families {
            $(pub(super) $field: $ty,)*
        }

        impl Families {
            pub(super) fn new() -> Families {
                Families { $($field: $init,)* }
            }

            /// Register every family under its name and help text.
            pub(super) fn register(&self, registry: &mut Registry) {
                $(registry.register($name, $help, Declared(self.$field.clone()));)*
            }
        }
    };
}

families! {
    devices: Replaced<RoleLabels, Gauge> = Replaced::default() => "nicmon_devices",
        "RDMA devices by role (compute, storage, management); management devices are not monitored";
    port_healthy: Replaced<PortLabels, Gauge> = Replaced::default() => "nicmon_port_healthy",
        "1 while a monitored port is healthy, 0 while it is not; absent while its state is unknown";
    port_flap_transitions: Family<PortLabels, Counter> = Family::default() => "nicmon_port_flap_transitions",
        "Unhealthy transitions (healthy to unhealthy) of a monitored port, reported or held by flap \
         damping";
    port_flapping: Replaced<PortLabels, Gauge> = Replaced::default() => "nicmon_port_flapping",
        "1 while a port is held as flapping (one fatal event sent, further transitions not \
         published)";
    port_attribute_unknown: Replaced<AttributeLabels, Gauge> = Replaced::default() => "nicmon_port_attribute_unknown",
        "1 while a monitored port's attribute (state, phys_state, link_layer) is unknown: \
         unreadable, stuck, empty or unparsable";
    events_sent: Family<CheckLabels, Counter> = Family::default() => "nicmon_events_sent",
        "Health events accepted by the sink, by check";
    unhealthy_events: Family<UnhealthyLabels, Counter> = Family::default() => "nicmon_unhealthy_events",
        "Unhealthy health events raised by the polls, by check, NIC (device and port; port 0: the \
         device as a whole, device empty: the node), error code and fatality. A series is created \
         at its first event, at 1: count it with `(X unless X offset W) or increase(X[W])`";
    unhealthy_by_cause: Family<CauseLabels, Counter> = Family::default() => "nicmon_unhealthy_events_by_cause",
        "Unhealthy health events by check and probable cause (nic, nic-firmware, nic-thermal, optic, \
         cable-or-far-end, pcie, driver, unknown; metadata.probableCause): a fleet's share of dead \
         links by the part that failed. A series is created at its first event, at 1";
    unhealthy_ports_by_cause: Family<NodeCause, Gauge> = Family::default() => "nicmon_unhealthy_ports",
        "Ports (and devices) unhealthy now by their state check, by the probable cause of the event \
         that made them so; every cause is exported, 0 when none";
    events_failed: Family<FailedLabels, Counter> = Family::default() => "nicmon_events_failed",
        "Health events in batches the sink did not accept, by check and failure kind";
    poll_duration: Histogram = Histogram::new(POLL_BUCKETS) => "nicmon_poll_duration_seconds",
        "Wall time of one poll: reading sysfs and evaluating every check (dispatch is asynchronous)";
    wakeups: Family<HookLabels, Counter> = Family::default() => "nicmon_wakeups",
        "Wake-ups that triggered an immediate poll, by source (eBPF hook name, or rtnetlink)";
    wakeup_latency: HistogramFamily<HookLabels> = Family::new_with_constructor(wakeup_histogram)
        => "nicmon_wakeup_latency_seconds",
        "Time from the kernel program that saw a change to userspace receiving its wake record, by \
         eBPF hook (hooks without a kernel timestamp, such as rtnetlink, are not observed)";
    ebpf_hook_attached: Family<HookLabels, Gauge> = Family::default() => "nicmon_ebpf_hook_attached",
        "1 when the eBPF hook is attached, 0 when it could not attach";
    topology_source: Family<SourceLabels, Gauge> = Family::default() => "nicmon_topology_source",
        "1 for the source the NIC roles come from (metadata, sysfs, none)";
    counter_saturated: Replaced<CounterLabels, Gauge> = Replaced::default() => "nicmon_counter_saturated",
        "1 while a counter reads at its maximum and no longer counts";
    counter_value: Family<CounterLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
        => "nicmon_port_counter",
        "The value of a port counter a counter rule reads, as the last poll read it (the kernel's own \
         counter: use rate() or increase())";
    port_pre_fec_ber: Replaced<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_port_pre_fec_ber",
        "Pre-FEC bit error rate of a RoCE port over the last full counter window (FEC-corrected \
         bits / (port rate x window)); absent until a window was measured";
    port_fec_limit: Replaced<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_port_fec_correction_limit",
        "The pre-FEC BER the RS-FEC code of a RoCE port can still correct (about 2.4e-4 for \
         RS(544,514), 2.3e-5 for RS(528,514)); absent where the code is not known";
    port_fec_mode: Replaced<FecModeLabels, Gauge> = Replaced::default() => "nicmon_port_fec_mode",
        "1 for the FEC encoding active on a RoCE port (RS, BASER, LLRS, off), as its driver \
         reports it";
    port_fec_uncorrectable: Replaced<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_port_fec_uncorrectable_blocks",
        "Codewords the FEC of a RoCE port could not correct (uncorrectable blocks, else mlx5's \
         rx_pcs_symbol_err_phy), as the last poll read it (the driver's counter: use increase())";
    port_pause_share: Replaced<PortLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_port_pause_time_share",
        "Share (0 to 1) of the last full counter window the fabric held a RoCE port paused (PFC \
         or link-level pause)";
    port_congestion: Replaced<CounterLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_port_congestion",
        "ECN/CNP counters of a RoCE port (np_ecn_marked_roce_packets, np_cnp_sent, \
         rp_cnp_handled), as the last poll read them (the NIC's counters: use rate()); congestion, \
         never an event";
    pcie_link_speed: Replaced<DeviceLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_pcie_link_speed_gts",
        "PCIe link speed of a monitored PF in GT/s per lane (32 = Gen5); absent while the link is down";
    pcie_link_width: Replaced<DeviceLabels, Gauge> = Replaced::default() => "nicmon_pcie_link_width",
        "PCIe link width of a monitored PF in lanes; absent while the link is down";
    pcie_link_max_speed: Replaced<DeviceLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_pcie_link_max_speed_gts",
        "The PCIe link speed a monitored PF can train at in GT/s per lane: the lower of its own \
         and its upstream port's maximum (below it: downtrained); absent while unknown";
    pcie_link_max_width: Replaced<DeviceLabels, Gauge> = Replaced::default() => "nicmon_pcie_link_max_width",
        "The PCIe link width a monitored PF can train at in lanes: the lower of its own and its \
         upstream port's maximum (below it: downtrained); absent while unknown";
    pcie_aer_errors: Replaced<AerLabels, Gauge> = Replaced::default() => "nicmon_pcie_aer_errors",
        "AER error total of a monitored PF by severity (the kernel's TOTAL_ERR_COR|NONFATAL|FATAL since \
         boot); absent without AER";
    nic_temperature: Replaced<SensorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_nic_temperature_celsius",
        "Temperature of a monitored NIC's hwmon sensor (ASIC, module) in degrees Celsius, as the \
         last full poll read it; absent while unreadable";
    nic_temperature_crit: Replaced<SensorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_nic_temperature_crit_celsius",
        "Critical temperature of a monitored NIC's hwmon sensor in degrees Celsius (nic_overheating \
         at this less [thermalCheck] marginCelsius); absent where the driver gives none";
    nic_temperature_highest: Replaced<SensorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_nic_temperature_highest_celsius",
        "Highest temperature a monitored NIC's hwmon sensor recorded in degrees Celsius (the \
         driver's own record); absent where the driver gives none";
    devlink_errors: Replaced<ReporterLabels, Gauge> = Replaced::default() => "nicmon_devlink_health_errors",
        "Error count of a monitored NIC's devlink health reporter (fw, fw_fatal, tx, rx, ...) since \
         the driver loaded (use increase())";
    devlink_healthy: Replaced<ReporterLabels, Gauge> = Replaced::default() => "nicmon_devlink_health_healthy",
        "1 while a monitored NIC's devlink health reporter is in the healthy state, 0 in error";
    optic_rx_power: Replaced<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_rx_power_dbm",
        "Receive optical power of a lane of a monitored port's module in dBm, as last read (reads \
         are paced by [opticsCheck] readInterval); absent with no light (see nicmon_optic_rx_los) \
         or where the module does not measure it";
    optic_rx_power_low_warning: Replaced<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_rx_power_low_warning_dbm",
        "The module's own low-warning threshold for a lane's receive power in dBm (below it: \
         optic_rx_power_low while the link is up); absent where the module gives none";
    optic_rx_power_low_alarm: Replaced<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_rx_power_low_alarm_dbm",
        "The module's own low-alarm threshold for a lane's receive power in dBm; absent where the \
         module gives none";
    optic_tx_power: Replaced<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_tx_power_dbm",
        "Transmit optical power of a lane of a monitored port's module in dBm; absent where not \
         measured or zero";
    optic_tx_bias: Replaced<LaneLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_tx_bias_milliamperes",
        "Laser bias current of a lane of a monitored port's module in mA; absent where not measured";
    optic_rx_los: Replaced<LaneLabels, Gauge> = Replaced::default() => "nicmon_optic_rx_los",
        "1 while a lane's latched Rx loss-of-signal flag was set at the module's last read";
    optic_tx_fault: Replaced<LaneLabels, Gauge> = Replaced::default() => "nicmon_optic_tx_fault",
        "1 while a lane's latched Tx fault flag was set at the module's last read";
    optic_temperature: Replaced<ModuleLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_temperature_celsius",
        "Temperature of a monitored port's module in degrees Celsius, as last read";
    optic_temperature_high_warning: Replaced<ModuleLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_temperature_high_warning_celsius",
        "The module's own high-warning temperature in degrees Celsius (above it: optic_temperature)";
    optic_supply: Replaced<ModuleLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Replaced::default()
        => "nicmon_optic_supply_volts",
        "Supply voltage (Vcc) of a monitored port's module in volts, as last read";
    kmsg_records_lost: Counter = Counter::default() => "nicmon_kmsg_records_lost",
        "Kernel log records overwritten before they were read";
    ebpf_wake_records_lost: Counter = Counter::default() => "nicmon_ebpf_wake_records_lost",
        "Wake records the eBPF programs dropped because their ring buffer was full; harmless for \
         detection: the 1 s full poll still runs and sees what they announced";
    ebpf_embedded: Gauge = Gauge::default() => "nicmon_ebpf_embedded",
        "1 when this binary carries the eBPF programs";
    ebpf_available: Gauge = Gauge::default() => "nicmon_ebpf_available",
        "1 when the eBPF programs loaded and at least one hook is attached";
    kernel_log_watching: Gauge = Gauge::default() => "nicmon_kernel_log_watching",
        "1 while the kernel log (/dev/kmsg) is watched, 0 when NICKernelLogCheck cannot see it";
    reads_abandoned: Counter = Counter::default() => "nicmon_reads_abandoned",
        "Host reads (sysfs, procfs) abandoned at their deadline; the value read is unknown for that \
         poll";
    reads_stuck: Gauge = Gauge::default() => "nicmon_reads_stuck",
        "Host reads abandoned at their deadline that have not returned yet (each holds a reader \
         thread)";
    legacy_devices_discovered: Family<NodeCheck, Gauge> = Family::default()
        => "nic_health_monitor_devices_discovered",
        "Number of monitored NIC ports (the existing monitor's name; labelled \
         check=InfiniBandStateCheck)";
    legacy_events_sent: Family<NodeCheckFatal, Counter> = Family::default()
        => "nic_health_monitor_health_events_sent",
        "Total number of health events sent to the platform connector";
    legacy_poll_duration: HistogramFamily<NodeCategory> = Family::new_with_constructor(legacy_histogram)
        => "nic_health_monitor_poll_cycle_duration_seconds",
        "Duration of each poll cycle in seconds";
    legacy_state_check_errors: Family<NodeCheckDevicePort, Counter> = Family::default()
        => "nic_health_monitor_state_check_errors",
        "Total number of state check error events";
    port_state_blips: Family<NodeCheckDevicePort, Counter> = Family::default()
        => "nic_health_monitor_port_state_blips",
        "Total number of port state transitions that recovered within the hold-down (not reported)";
    legacy_breaches: Family<NodeCounterDevicePortFatal, Counter> = Family::default()
        => "nic_health_monitor_counter_threshold_breaches",
        "Total number of counter threshold breaches detected";
    legacy_last_completed: Family<NodeCategory, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default()
        => "nic_health_monitor_poll_cycle_last_completed_timestamp_seconds",
        "Unix time at which the last poll cycle of the category completed";
    legacy_poll_stalled: Family<NodeCategory, Gauge> = Family::default()
        => "nic_health_monitor_poll_stalled",
        "1 while a poll of the category has been in flight for the stall deadline or longer \
         (--poll-stall-deadline), 0 otherwise";
    legacy_first_poll_deferred: Family<NodeCheck, Counter> = Family::default()
        => "nic_health_monitor_first_poll_deferred",
        "Polls a check skipped before its first evaluation because devices were unreadable (at most \
         3 per start)";
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeviceLabels {
    pub(super) device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SensorLabels {
    pub(super) device: String,
    /// `hwmon3/temp1`.
    pub(super) sensor: String,
    /// `asic`, `module0` (empty: no label).
    pub(super) label: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LaneLabels {
    pub(super) device: String,
    pub(super) port: u32,
    /// As the module numbers its lanes, from 1.
    pub(super) lane: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModuleLabels {
    pub(super) device: String,
    pub(super) port: u32,
    /// `QSFP28`, `OSFP`, ...
    pub(super) module: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReporterLabels {
    pub(super) device: String,
    pub(super) reporter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AerLabels {
    pub(super) device: String,
    /// `correctable`, `nonfatal` or `fatal`.
    pub(super) severity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RoleLabels {
    pub(super) role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PortLabels {
    pub(super) device: String,
    pub(super) port: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AttributeLabels {
    pub(super) device: String,
    pub(super) port: u32,
    pub(super) attribute: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CheckLabels {
    pub(super) check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailedLabels {
    pub(super) check: String,
    /// `retryable` or `permanent`.
    pub(super) kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HookLabels {
    pub(super) hook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SourceLabels {
    pub(super) source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FecModeLabels {
    pub(super) device: String,
    pub(super) port: u32,
    pub(super) mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CounterLabels {
    /// Shared ([`super::Metrics::set_counter_values`]): a device of a thousand ports has
    /// tens of thousands of counter series, over a handful of devices and counters.
    pub(super) device: std::sync::Arc<str>,
    pub(super) port: u32,
    pub(super) counter: std::sync::Arc<str>,
}

// The existing monitor's label sets (`node` on every series).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCheck {
    pub(super) node: String,
    pub(super) check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCheckFatal {
    pub(super) node: String,
    pub(super) check: String,
    pub(super) is_fatal: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCategory {
    pub(super) node: String,
    pub(super) category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCheckDevicePort {
    pub(super) node: String,
    pub(super) check: String,
    pub(super) device: String,
    pub(super) port: u32,
}

/// [`Families::unhealthy_events`]: the node as upstream's series carry it, the check, the
/// NIC, the event's (first) error code and its fatality.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UnhealthyLabels {
    pub(super) node: String,
    pub(super) check: String,
    pub(super) device: String,
    pub(super) port: u32,
    pub(super) error_code: String,
    pub(super) is_fatal: bool,
}

/// [`Families::unhealthy_by_cause`]: the node, the check and the probable cause.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CauseLabels {
    pub(super) node: String,
    pub(super) check: String,
    pub(super) probable_cause: String,
}

/// [`Families::unhealthy_ports_by_cause`]: the node and the probable cause.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCause {
    pub(super) node: String,
    pub(super) probable_cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NodeCounterDevicePortFatal {
    pub(super) node: String,
    pub(super) counter: String,
    pub(super) device: String,
    pub(super) port: u32,
    pub(super) is_fatal: bool,
}

pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets of the existing monitor's poll histogram (Prometheus' default buckets).
const LEGACY_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// A poll of a full node takes ~2 ms (SPEC §3): finer buckets at the bottom.
const POLL_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// eBPF wake records reach userspace in about a millisecond (p50 0.8 ms, p99 2.4 ms on an
/// idle machine, `cargo xtask bench-latency`): fine buckets below 10 ms.
const WAKEUP_BUCKETS: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// The existing monitor's poll categories (`category` label).
pub(super) const POLL_CATEGORIES: [&str; 2] = ["state", "counter"];

fn legacy_histogram() -> Histogram {
    Histogram::new(LEGACY_BUCKETS)
}

fn wakeup_histogram() -> Histogram {
    Histogram::new(WAKEUP_BUCKETS)
}

/// A metric whose HELP and TYPE are exported before its first series: prometheus-client
/// leaves out a family without series, and then neither Prometheus' metadata nor a check of
/// the alert rules against `/metrics` would know the family exists.
#[derive(Debug)]
struct Declared<M>(M);

impl<M: prometheus_client::encoding::EncodeMetric> prometheus_client::encoding::EncodeMetric for Declared<M> {
    fn encode(&self, encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        self.0.metric_type()
    }
}
