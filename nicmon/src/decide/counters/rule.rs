//! A counter rule: what is read, how it is judged, on which ports (001 §10.1, §10.4). The
//! built-in rules are in [`super::defaults`]; the operator's entries are merged over them in
//! [`super::config`].
use serde::{Deserialize, Serialize};

/// How a rule's threshold is compared (001 §10.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdType {
    /// Increase since the previous poll, compared with `threshold`.
    Delta,
    /// Increase per `velocityUnit`, measured over at least one whole unit of real time.
    Velocity,
}

impl ThresholdType {
    pub fn as_str(self) -> &'static str {
        match self {
            ThresholdType::Delta => "delta",
            ThresholdType::Velocity => "velocity",
        }
    }

    pub(super) fn parse(s: &str) -> Option<ThresholdType> {
        match s {
            "delta" => Some(ThresholdType::Delta),
            "velocity" => Some(ThresholdType::Velocity),
            _ => None,
        }
    }
}

/// The unit of a velocity threshold, which is also its evaluation window (001 §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VelocityUnit {
    Second,
    Minute,
    Hour,
}

impl VelocityUnit {
    pub fn as_str(self) -> &'static str {
        match self {
            VelocityUnit::Second => "second",
            VelocityUnit::Minute => "minute",
            VelocityUnit::Hour => "hour",
        }
    }

    /// Length of the unit (and of the evaluation window) in seconds.
    pub fn seconds(self) -> u32 {
        match self {
            VelocityUnit::Second => 1,
            VelocityUnit::Minute => 60,
            VelocityUnit::Hour => 3600,
        }
    }

    /// Suffix used in event messages: `rate=20.00/sec` (001 §11).
    pub fn suffix(self) -> &'static str {
        match self {
            VelocityUnit::Second => "sec",
            VelocityUnit::Minute => "min",
            VelocityUnit::Hour => "hour",
        }
    }

    pub(super) fn parse(s: &str) -> Option<VelocityUnit> {
        match s {
            "second" => Some(VelocityUnit::Second),
            "minute" => Some(VelocityUnit::Minute),
            "hour" => Some(VelocityUnit::Hour),
            _ => None,
        }
    }
}

/// One counter to watch, after merging the operator's entries with the defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterRule {
    /// Identity of the rule: used in state keys, in `[counterDetection]` and, unless
    /// [`CounterRule::error_code`] says otherwise, as the events' `errorCode`. Unique.
    pub name: String,
    /// Relative to the port directory (`counters/link_downed`), or a
    /// `/sys/class/net/{interface}/...` template. Two rules may share a path
    /// (`symbol_error` and `symbol_error_fatal`).
    pub path: String,
    pub enabled: bool,
    pub is_fatal: bool,
    pub threshold_type: ThresholdType,
    /// A breach is strictly greater than this.
    pub threshold: f64,
    /// `Some` exactly when `threshold_type` is `Velocity`.
    pub velocity_unit: Option<VelocityUnit>,
    pub description: String,
    /// The link layers whose ports this counter is read on (owned by the code for the
    /// built-in rules; every layer for a counter the operator adds).
    #[serde(default)]
    pub layers: Layers,
    /// What a velocity rule's threshold is compared with (owned by the code: a count for
    /// every rule but the RoCE physical-layer rates).
    #[serde(default)]
    pub measure: Measure,
    /// The events' `errorCode` when it is not `name` (owned by the code): two rules that
    /// watch one condition at two stages (`pfc_storm`'s warning and error) file it under one
    /// code. The evaluator then sends a healthy event for the code only when no rule sharing
    /// it is still breached on the port (lesson 12: one recovery must not clear a sibling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// The operator gave this rule's threshold (a `[counterDetection]` entry, or a section key
    /// such as `[phyCheck] preFecBerThreshold`): it holds on every port, whatever its value,
    /// never replaced by a port's own default (the pre-FEC BER of a KR4 port).
    #[serde(skip)]
    pub threshold_set: bool,
    /// The RDMA drivers whose ports this counter is read on (owned by the code for the
    /// built-in rules: a `hw_counters/` name means what its driver says; every driver for a
    /// counter the operator adds).
    #[serde(skip)]
    pub drivers: crate::model::driver::Drivers,
    /// The path of the same counter under its other generation's name (bnxt_re renamed its
    /// counters in 2025): while that file is read on a port, this one's absence there is no
    /// news (no startup note).
    #[serde(skip)]
    pub alias: Option<String>,
}

impl CounterRule {
    /// The `errorCode` of this rule's events.
    pub fn code(&self) -> &str {
        self.error_code.as_deref().unwrap_or(&self.name)
    }
}

/// What a velocity window measures, and whether its breach latches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Measure {
    /// Increase per `velocityUnit` (or per poll, for delta): a breach latches until a
    /// counter reset or a reboot (001 §6.3).
    #[default]
    Count,
    /// Increase per second over the port's rate in bit/s: a bit error rate (pre-FEC BER,
    /// SPEC §1.11). A breach clears at the first full window at or below the threshold.
    BitErrorRate,
    /// Increase of a microsecond duration per second of real time: the share of the
    /// window (0 to 1) something lasted (time paused by the fabric, SPEC §1.11). Clears
    /// like [`Measure::BitErrorRate`].
    TimeShare,
}

impl Measure {
    /// Whether a breach clears when a later window measures at or below the threshold
    /// (a rate that falls back), instead of latching until a reset.
    pub fn clears(self) -> bool {
        self != Measure::Count
    }
}

/// Which ports a counter applies to, by link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layers {
    /// InfiniBand and Ethernet (RoCE) ports: the mlx5 PMA and `hw_counters/` counters.
    Rdma,
    /// AWS EFA ports only.
    Efa,
    /// Every port.
    #[default]
    All,
    /// RoCE (Ethernet link layer) ports only: their netdev's ethtool data (SPEC §1.11).
    Roce,
}

impl Layers {
    /// Whether a port of link layer `ll` (unknown when unreadable) gets this counter.
    pub fn covers(self, ll: Option<&crate::model::LinkLayer>) -> bool {
        use crate::model::LinkLayer;
        match self {
            Layers::All => true,
            Layers::Efa => ll == Some(&LinkLayer::Efa),
            Layers::Rdma => ll != Some(&LinkLayer::Efa),
            Layers::Roce => ll == Some(&LinkLayer::Ethernet),
        }
    }
}

/// Prefix of the only absolute paths a rule may have; `{interface}` is the port's netdev.
pub const NET_TEMPLATE_PREFIX: &str = "/sys/class/net/{interface}/";
/// Prefix of a device-level counter (EFA's `<dev>/hw_counters/`): read on port 1 and
/// reported against it.
pub const DEVICE_TEMPLATE_PREFIX: &str = "/sys/class/infiniband/{device}/";

pub use crate::model::ethtool::ETHTOOL_PREFIX;

/// The RoCE rule whose measure is the pre-FEC BER ([`Measure::BitErrorRate`]).
pub const PRE_FEC_BER_RULE: &str = "pre_fec_ber";
/// The RoCE rule whose measure is the share of time the fabric paused the port
/// ([`Measure::TimeShare`]).
pub const PAUSE_VICTIM_RULE: &str = "pause_victim";
