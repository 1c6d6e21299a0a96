//! What the checks are told: the settings of every decider, gathered in one [`Config`]
//! (the config file's keys, read by [`crate::config`]; each decider's own settings type
//! lives with its decider).
use std::collections::BTreeSet;

use time::Duration;

use crate::decide::chardev::IssmMode;
use crate::decide::counters::{CounterDetection, CounterRule};
use crate::decide::kmsg::{KmsgConfig, Patterns};
use crate::decide::linkstate::{FlapConfig, StateConfig};
use crate::decide::pcie::aer::AerThresholds;
use crate::decide::roles::NicFilters;
use crate::model::event::Check;

#[derive(Debug, Clone)]
pub struct Config {
    pub filters: NicFilters,
    /// `sysClassInfinibandPath` / `sysClassNetPath`, when set: without `--sysfs` they decide
    /// the sysfs root ([`crate::read::paths`]).
    pub sys_class_infiniband_path: Option<String>,
    pub sys_class_net_path: Option<String>,
    /// `[stateDetection] escalationGraceSeconds`: a port that was healthy and is still in a
    /// training/INIT/ARMED state after this long escalates to fatal (SPEC §1.3).
    pub escalation_grace_secs: u64,
    /// `[stateDetection] speedDegradationFatal`: make `LinkSpeedDegraded` fatal.
    pub speed_degradation_fatal: bool,
    /// `[stateCheck] portStateHoldDown` (Go duration): how long a port that was reported
    /// healthy may be unhealthy before it is reported; shorter is a blip (0: off).
    pub port_state_hold_down: std::time::Duration,
    /// `[stateCheck] flapThreshold`, `flapWindow`, `flapSettle`: flap damping (SPEC §1.3).
    pub flap: FlapConfig,
    /// `[counterDetection]`: the merged, validated counter rules (001 §10); empty when
    /// `enabled = false`.
    pub counter_rules: Vec<CounterRule>,
    /// `[phyCheck]`: the RoCE physical layer and lossless fabric (SPEC §1.11).
    pub phy: PhyConfig,
    /// `[counterDetection] enabled = false`: the degradation checks are skipped and the
    /// section's entries are not validated (as upstream); `None` when counters are on.
    pub counters_off: Option<CountersOff>,
    /// `[charDeviceCheck] issm`: whether an `issm` node is expected per InfiniBand port.
    pub issm: IssmMode,
    /// `[pcieCheck]`: the PCIe check's settings (SPEC §1.10).
    pub pcie: PcieConfig,
    /// `[thermalCheck]`: NIC temperature from hwmon (SPEC §1.13).
    pub thermal: ThermalConfig,
    /// `[firmwareCheck]`: devlink health reporters (SPEC §1.13).
    pub firmware: FirmwareConfig,
    /// `[opticsCheck]`: the ports' transceivers (SPEC §1.13).
    pub optics: OpticsConfig,
    /// `[kernelLog]`: the watcher's settings and its compiled pattern table.
    pub kernel_log: KmsgConfig,
    pub patterns: Patterns,
    /// Keys present in the file that nicmon does not use.
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            filters: NicFilters::default(),
            sys_class_infiniband_path: None,
            phy: PhyConfig::default(),
            sys_class_net_path: None,
            escalation_grace_secs: 30,
            speed_degradation_fatal: false,
            port_state_hold_down: std::time::Duration::ZERO,
            flap: FlapConfig::default(),
            counter_rules: CounterDetection::default().rules().unwrap_or_default(),
            counters_off: None,
            issm: IssmMode::default(),
            pcie: PcieConfig::default(),
            thermal: ThermalConfig::default(),
            firmware: FirmwareConfig::default(),
            optics: OpticsConfig::default(),
            kernel_log: KmsgConfig::default(),
            patterns: Patterns::builtin(),
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// The state checks' settings from this config, with the checks `--checks` enabled
    /// (less the PCIe check under `[pcieCheck] enabled = false`).
    pub fn state_config(&self, mut checks: BTreeSet<Check>) -> StateConfig {
        if !self.pcie.enabled {
            checks.remove(&Check::NICPCIeCheck);
        }
        if !self.thermal.enabled {
            checks.remove(&Check::NICThermalCheck);
        }
        if !self.firmware.enabled {
            checks.remove(&Check::NICFirmwareCheck);
        }
        StateConfig {
            escalation_grace: Duration::seconds(self.escalation_grace_secs as i64),
            speed_degradation_fatal: self.speed_degradation_fatal,
            port_state_hold_down: Duration::try_from(self.port_state_hold_down).unwrap_or(Duration::MAX),
            flap: self.flap,
            checks,
        }
    }
}

/// `[phyCheck]`: whether the RoCE ports' ethtool data is read, and the thresholds of the
/// rates judged from it (the rules are `[counterDetection]`'s `pre_fec_ber` and
/// `pause_victim`; these keys, when given, set their thresholds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhyConfig {
    /// `enabled`: read each monitored RoCE netdev's ethtool data (default true).
    pub enabled: bool,
    /// `preFecBerThreshold`: `None` = the default of each port's FEC code
    /// ([`crate::decide::phy::RsCode::default_threshold`]; the rule's default where it is not known).
    pub pre_fec_ber_threshold: Option<f64>,
    /// `pauseVictimShare`: share of a minute paused by the fabric above which a port is a
    /// pause victim (default 0.5).
    pub pause_victim_share: Option<f64>,
    /// `readInterval`: a netdev's ethtool data is read at most once per this (default
    /// [`DEFAULT_PHY_READ_INTERVAL`]; zero: every poll), the last reading kept in between.
    pub read_interval: std::time::Duration,
}

/// How often a RoCE netdev's ethtool data is read by default. mlx5 answers every read with
/// firmware register reads (`PPCNT`, one per counter group); the rules judging the data need
/// far less than the 1 s poll: `pre_fec_ber` and `pause_victim` are one-minute windows (a
/// 10 s pace closes each within 10 s of its minute, measured between the reads), and
/// `fec_uncorrectable` and `pfc_storm` latch on an increase, which a 10 s pace reports at
/// most 10 s later. A tenth of the firmware commands, no rule weakened.
pub const DEFAULT_PHY_READ_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

impl Default for PhyConfig {
    fn default() -> PhyConfig {
        PhyConfig {
            enabled: true,
            pre_fec_ber_threshold: None,
            pause_victim_share: None,
            read_interval: DEFAULT_PHY_READ_INTERVAL,
        }
    }
}

impl PhyConfig {
    /// Set the thresholds given here on their rules.
    pub fn apply(&self, rules: &mut [CounterRule]) {
        for r in rules {
            match (r.name.as_str(), self.pre_fec_ber_threshold, self.pause_victim_share) {
                ("pre_fec_ber", Some(t), _) | ("pause_victim", _, Some(t)) => {
                    r.threshold = t;
                    r.threshold_set = true;
                }
                _ => {}
            }
        }
    }
}

/// The state checks' defaults are the config file's: every check enabled.
impl Default for StateConfig {
    fn default() -> StateConfig {
        Config::default().state_config(Check::ALL.into_iter().collect())
    }
}

/// `[pcieCheck]` (SPEC §1.10).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PcieConfig {
    /// `enabled` (default true): `false` turns the check off whatever `--checks` says.
    pub enabled: bool,
    /// `correctableThreshold` (default 60) per `correctableVelocityUnit` (default `minute`).
    pub aer: AerThresholds,
}

impl Default for PcieConfig {
    fn default() -> PcieConfig {
        PcieConfig { enabled: true, aer: AerThresholds::default() }
    }
}

/// `[thermalCheck]` (SPEC §1.13).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThermalConfig {
    /// `enabled` (default true): `false` turns the check off (and its hwmon reads).
    pub enabled: bool,
    /// `marginCelsius` (default 5): `nic_overheating` at `_crit` − this or above.
    pub margin_celsius: f64,
    /// `readInterval` (default 10 s): a NIC's temperatures are read at most this often.
    pub read_interval: std::time::Duration,
}

impl Default for ThermalConfig {
    fn default() -> ThermalConfig {
        ThermalConfig { enabled: true, margin_celsius: 5.0, read_interval: std::time::Duration::from_secs(10) }
    }
}

impl ThermalConfig {
    /// The margin in millidegrees.
    pub fn margin_millidegrees(&self) -> i64 {
        (self.margin_celsius * 1000.0).round() as i64
    }
}

/// `[firmwareCheck]` (SPEC §1.13).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirmwareConfig {
    /// `enabled` (default true): `false` turns the check off (and its devlink reads).
    pub enabled: bool,
    /// `readInterval` (default 5 s): the reporters are read at most this often (a devlink
    /// tracepoint's wake-up reads its function at once).
    pub read_interval: std::time::Duration,
}

impl Default for FirmwareConfig {
    fn default() -> FirmwareConfig {
        FirmwareConfig { enabled: true, read_interval: std::time::Duration::from_secs(5) }
    }
}

/// `[opticsCheck]` (SPEC §1.13).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpticsConfig {
    /// `enabled` (default true): `false` turns the module reads off, and with them the optic
    /// events and the module facts of the probable cause.
    pub enabled: bool,
    /// `readInterval` (default 60 s): a port's module is read at most this often (mlx5
    /// answers with firmware commands), and at once when the port's state changes.
    pub read_interval: std::time::Duration,
}

impl Default for OpticsConfig {
    fn default() -> OpticsConfig {
        OpticsConfig { enabled: true, read_interval: std::time::Duration::from_secs(60) }
    }
}

/// `[counterDetection] enabled = false`: the file it was read from, and what in the section
/// would stop start-up were it enabled.
#[derive(Debug, Clone, PartialEq)]
pub struct CountersOff {
    pub path: String,
    pub invalid: Option<String>,
}
