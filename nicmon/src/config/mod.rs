//! The TOML configuration file (000 §12.1, SPEC §1.9): the NVSentinel ConfigMap's keys.
//!
//! A missing file means defaults. An invalid file stops startup with one line naming the
//! file, the key and the value (lesson 2: never silently disable monitoring). Keys nicmon
//! does not know are reported as warnings, so an NVSentinel ConfigMap works unchanged.
//!
//! One schema: [`Config::default`] holds every default, the key tables (`TOP_LEVEL` and
//! the sections under it) every key with its validation; the state checks' settings
//! ([`Config::state_config`]) are derived from them.
pub mod upstream;

pub use crate::decide::settings::{
    Config, CountersOff, DEFAULT_PHY_READ_INTERVAL, OpticsConfig, PcieConfig, PhyConfig,
};

use std::collections::BTreeSet;
use std::path::Path;

use crate::decide::chardev::IssmMode;
use crate::decide::counters::{CounterDetection, VelocityUnit};
use crate::decide::kmsg;
use crate::decide::kmsg::KmsgConfig;
use crate::decide::linkstate::flap::MAX_THRESHOLD;
use crate::decide::roles::{self};
use crate::model::event::{Check, CheckKind};

/// The known keys, as the warning about an unknown one names them: the top-level keys and
/// those of `[stateDetection]`, `[stateCheck]`, `[charDeviceCheck]`, `[pcieCheck]`, `[phyCheck]`,
/// `[thermalCheck]`, `[firmwareCheck]` and `[opticsCheck]` (the other sections' keys are their
/// structs' fields).
pub const TOP_LEVEL_KEYS: [&str; 14] = key_names(&TOP_LEVEL);
pub const STATE_DETECTION_KEYS: [&str; 2] = key_names(&STATE_DETECTION);
pub const STATE_CHECK_KEYS: [&str; 4] = key_names(&STATE_CHECK);
pub const CHAR_DEVICE_CHECK_KEYS: [&str; 1] = key_names(&CHAR_DEVICE_CHECK);
pub const PCIE_CHECK_KEYS: [&str; 3] = key_names(&PCIE_CHECK);
pub const PHY_CHECK_KEYS: [&str; 4] = key_names(&PHY_CHECK);
pub const THERMAL_CHECK_KEYS: [&str; 3] = key_names(&THERMAL_CHECK);
pub const FIRMWARE_CHECK_KEYS: [&str; 2] = key_names(&FIRMWARE_CHECK);
pub const OPTICS_CHECK_KEYS: [&str; 2] = key_names(&OPTICS_CHECK);

/// Default location of the config file in the DaemonSet.
pub const DEFAULT_PATH: &str = "/etc/nic-health-monitor/config.toml";

/// The longest `[phyCheck] readInterval` accepted.
const MAX_PHY_READ_INTERVAL: time::Duration = time::Duration::hours(1);

/// The largest config file nicmon reads.
pub const MAX_BYTES: usize = 1 << 20;

/// A config file that cannot be used: the file and what is wrong with it. Its text is the
/// whole one-line error (`config <path>: <kind>`).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("config {path}: {kind}")]
pub struct ConfigError {
    pub path: String,
    pub kind: ConfigErrorKind,
}

/// What is wrong with a config file. Each kind's text names the key and the value at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigErrorKind {
    /// The file exists but cannot be read.
    #[error("cannot read: {0}")]
    Read(String),
    /// The file is not UTF-8 text.
    #[error("not UTF-8 text: {0}")]
    Encoding(String),
    /// Not valid TOML.
    #[error("{0}")]
    Syntax(String),
    /// A key with an unusable value: top-level, `[stateDetection]`, or a section's key or
    /// entry (`counterDetection.counters = ...: ...`, `kernelLog.enabled = ...: ...`).
    #[error("{0}")]
    Value(String),
    /// A `[kernelLog]` pattern that does not compile.
    #[error("{}", one_line(&.0.to_string()))]
    KernelLog(kmsg::ConfigError),
}

impl Config {
    /// Load `path`; a missing file gives the defaults. Only a regular file of at most
    /// [`MAX_BYTES`] is read (with a deadline); anything else is an error naming the file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        match crate::read::host::read_file(path, MAX_BYTES) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => Config::parse(&shown, &text),
                Err(e) => Err(ConfigError { path: shown, kind: ConfigErrorKind::Encoding(e.to_string()) }),
            },
            Err(crate::read::host::ReadError::Missing) => Ok(Config::default()),
            Err(e) => Err(ConfigError { path: shown, kind: ConfigErrorKind::Read(e.to_string()) }),
        }
    }

    /// Parse the file's text against `TOP_LEVEL`. Never panics.
    pub fn parse(path: &str, text: &str) -> Result<Config, ConfigError> {
        let fail = |kind: ConfigErrorKind| ConfigError { path: path.to_string(), kind };
        let table: toml::Table =
            text.parse().map_err(|e: toml::de::Error| fail(ConfigErrorKind::Syntax(one_line(&e.to_string()))))?;
        let mut cfg = Config::default();
        read_keys(&mut cfg, path, None, &table, &TOP_LEVEL).map_err(fail)?;
        cfg.phy.apply(&mut cfg.counter_rules);
        Ok(cfg)
    }
}

/// One key of the config file: its name and how its value is checked and stored.
struct Key {
    name: &'static str,
    read: fn(&mut Config, &KeyAt<'_>, &toml::Value) -> Result<(), ConfigErrorKind>,
}

/// Where a key is: the file, and the key's full name (`stateCheck.flapWindow`).
struct KeyAt<'a> {
    path: &'a str,
    name: &'a str,
}

impl KeyAt<'_> {
    /// A value that is not what the key takes: `<key> = <value>: <expected>`.
    fn bad(&self, v: &toml::Value, expected: impl std::fmt::Display) -> ConfigErrorKind {
        ConfigErrorKind::Value(format!("{} = {v}: {expected}", self.name))
    }

    fn string<'v>(&self, v: &'v toml::Value) -> Result<&'v str, ConfigErrorKind> {
        string(self.name, v)
    }

    /// The keys of the table this key holds, read against `keys`.
    fn table(&self, cfg: &mut Config, v: &toml::Value, keys: &[Key]) -> Result<(), ConfigErrorKind> {
        let t = v.as_table().ok_or_else(|| ConfigErrorKind::Value(format!("{}: expected a table", self.name)))?;
        read_keys(cfg, self.path, Some(self.name), t, keys)
    }

    /// The section this key holds, deserialized whole ([`section`]).
    fn section<T: serde::de::DeserializeOwned>(&self, v: &toml::Value) -> Result<T, ConfigErrorKind> {
        section(self.name, v)
    }
}

/// Read every key of `table` (under `prefix`) against `keys`; a key not among them is a
/// warning naming the known ones.
fn read_keys(
    cfg: &mut Config,
    path: &str,
    prefix: Option<&str>,
    table: &toml::Table,
    keys: &[Key],
) -> Result<(), ConfigErrorKind> {
    for (k, v) in table {
        let full = match prefix {
            Some(p) => format!("{p}.{k}"),
            None => k.clone(),
        };
        match keys.iter().find(|key| key.name == k) {
            Some(key) => (key.read)(cfg, &KeyAt { path, name: &full }, v)?,
            None => {
                let known: Vec<&str> = keys.iter().map(|key| key.name).collect();
                cfg.warnings
                    .push(format!("config {path}: unknown key {full} ignored (known keys: {})", known.join(", ")))
            }
        }
    }
    Ok(())
}

/// The names of `keys`, in order (the known keys a warning lists).
const fn key_names<const N: usize>(keys: &[Key; N]) -> [&'static str; N] {
    let mut names = [""; N];
    let mut i = 0;
    while i < N {
        names[i] = keys[i].name;
        i += 1;
    }
    names
}

/// The file's top-level keys; the other sections' keys are their structs' fields.
const TOP_LEVEL: [Key; 14] = [
    Key {
        name: "nicExclusionRegex",
        read: |cfg, at, v| {
            cfg.filters.exclude = roles::parse_regex_list(at.name, at.string(v)?).map_err(regex_error)?;
            Ok(())
        },
    },
    Key {
        name: "nicInclusionRegexOverride",
        read: |cfg, at, v| {
            cfg.filters.include_override = roles::parse_regex_list(at.name, at.string(v)?).map_err(regex_error)?;
            Ok(())
        },
    },
    Key {
        name: "sysClassInfinibandPath",
        read: |cfg, at, v| {
            cfg.sys_class_infiniband_path = Some(at.string(v)?.into());
            Ok(())
        },
    },
    Key {
        name: "sysClassNetPath",
        read: |cfg, at, v| {
            cfg.sys_class_net_path = Some(at.string(v)?.into());
            Ok(())
        },
    },
    Key { name: "stateDetection", read: |cfg, at, v| at.table(cfg, v, &STATE_DETECTION) },
    Key { name: "stateCheck", read: |cfg, at, v| at.table(cfg, v, &STATE_CHECK) },
    Key { name: "counterDetection", read: read_counter_detection },
    Key {
        name: "kernelLog",
        read: |cfg, at, v| {
            let k: KmsgConfig = at.section(v)?;
            cfg.patterns = k.compile().map_err(ConfigErrorKind::KernelLog)?;
            cfg.kernel_log = k;
            Ok(())
        },
    },
    Key { name: "charDeviceCheck", read: |cfg, at, v| at.table(cfg, v, &CHAR_DEVICE_CHECK) },
    Key { name: "pcieCheck", read: |cfg, at, v| at.table(cfg, v, &PCIE_CHECK) },
    Key { name: "phyCheck", read: |cfg, at, v| at.table(cfg, v, &PHY_CHECK) },
    Key { name: "thermalCheck", read: |cfg, at, v| at.table(cfg, v, &THERMAL_CHECK) },
    Key { name: "firmwareCheck", read: |cfg, at, v| at.table(cfg, v, &FIRMWARE_CHECK) },
    Key { name: "opticsCheck", read: |cfg, at, v| at.table(cfg, v, &OPTICS_CHECK) },
];

/// `[counterDetection]`: with `enabled = false` nothing else in it is validated (what would
/// be invalid is kept for the warning), else the rules are merged and validated.
fn read_counter_detection(cfg: &mut Config, at: &KeyAt<'_>, v: &toml::Value) -> Result<(), ConfigErrorKind> {
    let disabled = v.as_table().and_then(|t| t.get("enabled")).and_then(toml::Value::as_bool) == Some(false);
    let cd = at.section::<CounterDetection>(v);
    if disabled {
        cfg.counter_rules = Vec::new();
        cfg.counters_off = Some(CountersOff { path: at.path.to_string(), invalid: cd.err().map(|e| e.to_string()) });
        return Ok(());
    }
    cfg.counter_rules = cd?.rules().map_err(|e| ConfigErrorKind::Value(one_line(&e.to_string())))?;
    Ok(())
}

/// Every requested check is a degradation check and `counterDetection.enabled = false`.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "config {path}: no check is enabled: counterDetection.enabled = false skips {} (the only checks \
     requested)", names(.skipped)
)]
pub struct NoCheckEnabled {
    pub path: String,
    pub skipped: Vec<Check>,
}

/// The checks that run: those requested, less the degradation checks when
/// `counterDetection.enabled = false` (skipped with one warning, which also names what in the
/// section would be invalid). An error when that leaves none of a non-empty request.
pub struct EnabledChecks {
    pub checks: BTreeSet<Check>,
    pub warning: Option<String>,
}

impl Config {
    /// [`EnabledChecks`] of `requested` under this config.
    pub fn enabled_checks(&self, requested: &BTreeSet<Check>) -> Result<EnabledChecks, NoCheckEnabled> {
        let Some(off) = &self.counters_off else {
            return Ok(EnabledChecks { checks: requested.clone(), warning: None });
        };
        let skipped: Vec<Check> = requested.iter().copied().filter(|c| c.kind() == CheckKind::Counters).collect();
        let checks: BTreeSet<Check> = requested.iter().copied().filter(|c| c.kind() != CheckKind::Counters).collect();
        if checks.is_empty() && !skipped.is_empty() {
            return Err(NoCheckEnabled { path: off.path.clone(), skipped });
        }
        let not_validated = off.invalid.as_ref().map(|e| {
            format!(
                "; its counter entries are not validated (with enabled = true start-up would fail: {})",
                one_line(e)
            )
        });
        let warning = match (skipped.is_empty(), not_validated) {
            (true, None) => None,
            (true, Some(nv)) => Some(format!("config {}: counterDetection.enabled = false{nv}", off.path)),
            (false, nv) => Some(format!(
                "config {}: counterDetection.enabled = false: skipping {}{}",
                off.path,
                names(&skipped),
                nv.unwrap_or_default()
            )),
        };
        Ok(EnabledChecks { checks, warning })
    }
}

fn names(checks: &[Check]) -> String {
    checks.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
}

/// `[stateDetection]`.
const STATE_DETECTION: [Key; 2] = [
    Key {
        name: "escalationGraceSeconds",
        read: |cfg, at, v| {
            cfg.escalation_grace_secs = v
                .as_integer()
                .and_then(|i| u64::try_from(i).ok())
                .ok_or_else(|| at.bad(v, "expected a whole number of seconds ≥ 0"))?;
            Ok(())
        },
    },
    Key {
        name: "speedDegradationFatal",
        read: |cfg, at, v| {
            cfg.speed_degradation_fatal = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
];

/// `[stateCheck]`.
const STATE_CHECK: [Key; 4] = [
    Key {
        name: "portStateHoldDown",
        read: |cfg, at, v| {
            cfg.port_state_hold_down = v
                .as_str()
                .ok_or_else(|| at.bad(v, "expected a string"))
                .and_then(|s| crate::config::upstream::go_duration(s).map_err(|e| at.bad(v, e)))?;
            Ok(())
        },
    },
    Key {
        name: "flapThreshold",
        read: |cfg, at, v| {
            cfg.flap.threshold = v
                .as_integer()
                .and_then(|i| u32::try_from(i).ok())
                .filter(|n| *n != 1 && *n <= MAX_THRESHOLD)
                .ok_or_else(|| at.bad(v, format!("expected 0 (off) or a whole number from 2 to {MAX_THRESHOLD}")))?;
            Ok(())
        },
    },
    Key {
        name: "flapWindow",
        read: |cfg, at, v| {
            cfg.flap.window = flap_duration(at.name, v)?;
            Ok(())
        },
    },
    Key {
        name: "flapSettle",
        read: |cfg, at, v| {
            cfg.flap.settle = flap_duration(at.name, v)?;
            Ok(())
        },
    },
];

/// `[charDeviceCheck]`.
const CHAR_DEVICE_CHECK: [Key; 1] = [Key {
    name: "issm",
    read: |cfg, at, v| {
        cfg.issm = v.as_str().and_then(IssmMode::parse).ok_or_else(|| at.bad(v, "expected \"never\" or \"always\""))?;
        Ok(())
    },
}];

/// `[pcieCheck]`.
const PCIE_CHECK: [Key; 3] = [
    Key {
        name: "enabled",
        read: |cfg, at, v| {
            cfg.pcie.enabled = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
    Key {
        name: "correctableThreshold",
        read: |cfg, at, v| {
            let t = match v {
                toml::Value::Integer(i) => Some(*i as f64),
                toml::Value::Float(f) => Some(*f),
                _ => None,
            };
            cfg.pcie.aer.correctable = t
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| at.bad(v, "expected a number of errors ≥ 0 per correctableVelocityUnit"))?;
            Ok(())
        },
    },
    Key {
        name: "correctableVelocityUnit",
        read: |cfg, at, v| {
            cfg.pcie.aer.correctable_unit = v
                .as_str()
                .and_then(|s| {
                    [VelocityUnit::Second, VelocityUnit::Minute, VelocityUnit::Hour]
                        .into_iter()
                        .find(|u| u.as_str() == s)
                })
                .ok_or_else(|| at.bad(v, "expected \"second\", \"minute\" or \"hour\""))?;
            Ok(())
        },
    },
];

/// `[thermalCheck]`.
const THERMAL_CHECK: [Key; 3] = [
    Key {
        name: "enabled",
        read: |cfg, at, v| {
            cfg.thermal.enabled = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
    Key {
        name: "marginCelsius",
        read: |cfg, at, v| {
            let m = match v {
                toml::Value::Integer(i) => Some(*i as f64),
                toml::Value::Float(f) => Some(*f),
                _ => None,
            };
            cfg.thermal.margin_celsius = m
                .filter(|m| m.is_finite() && (0.0..=100.0).contains(m))
                .ok_or_else(|| at.bad(v, "expected degrees Celsius from 0 to 100"))?;
            Ok(())
        },
    },
    Key {
        name: "readInterval",
        read: |cfg, at, v| {
            let d = duration(at.name, v, MAX_PHY_READ_INTERVAL)?;
            cfg.thermal.read_interval = d.try_into().unwrap_or(std::time::Duration::from_secs(10));
            Ok(())
        },
    },
];

/// `[firmwareCheck]`.
const FIRMWARE_CHECK: [Key; 2] = [
    Key {
        name: "enabled",
        read: |cfg, at, v| {
            cfg.firmware.enabled = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
    Key {
        name: "readInterval",
        read: |cfg, at, v| {
            let d = duration(at.name, v, MAX_PHY_READ_INTERVAL)?;
            cfg.firmware.read_interval = d.try_into().unwrap_or(std::time::Duration::from_secs(5));
            Ok(())
        },
    },
];

/// `[opticsCheck]`.
const OPTICS_CHECK: [Key; 2] = [
    Key {
        name: "enabled",
        read: |cfg, at, v| {
            cfg.optics.enabled = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
    Key {
        name: "readInterval",
        read: |cfg, at, v| {
            let d = duration(at.name, v, MAX_PHY_READ_INTERVAL)?;
            cfg.optics.read_interval = d.try_into().unwrap_or(std::time::Duration::from_secs(60));
            Ok(())
        },
    },
];

/// `[phyCheck]`.
const PHY_CHECK: [Key; 4] = [
    Key {
        name: "enabled",
        read: |cfg, at, v| {
            cfg.phy.enabled = v.as_bool().ok_or_else(|| at.bad(v, "expected true or false"))?;
            Ok(())
        },
    },
    Key {
        name: "preFecBerThreshold",
        read: |cfg, at, v| {
            let t = fraction(v).filter(|t| *t < 1.0);
            cfg.phy.pre_fec_ber_threshold =
                Some(t.ok_or_else(|| at.bad(v, "expected a bit error rate above 0 and below 1 (1e-4)"))?);
            Ok(())
        },
    },
    Key {
        name: "pauseVictimShare",
        read: |cfg, at, v| {
            cfg.phy.pause_victim_share =
                Some(fraction(v).ok_or_else(|| at.bad(v, "expected a share of time above 0 and at most 1 (0.5)"))?);
            Ok(())
        },
    },
    Key {
        name: "readInterval",
        read: |cfg, at, v| {
            let d = duration(at.name, v, MAX_PHY_READ_INTERVAL)?;
            cfg.phy.read_interval = d.try_into().unwrap_or(DEFAULT_PHY_READ_INTERVAL);
            Ok(())
        },
    },
];

/// A number in (0, 1] (an integer 1 too).
fn fraction(v: &toml::Value) -> Option<f64> {
    let x = v.as_float().or_else(|| v.as_integer().map(|i| i as f64))?;
    (x.is_finite() && x > 0.0 && x <= 1.0).then_some(x)
}

fn regex_error(e: roles::RegexListError) -> ConfigErrorKind {
    ConfigErrorKind::Value(one_line(&e.to_string()))
}

/// Deserialize the section `name`; an error names the key at fault (`kernelLog.enabled =
/// 1: invalid type: ...`), found by deserializing each key on its own.
fn section<T: serde::de::DeserializeOwned>(name: &str, value: &toml::Value) -> Result<T, ConfigErrorKind> {
    let whole = match value.clone().try_into::<T>() {
        Ok(t) => return Ok(t),
        Err(e) => one_line(e.message()),
    };
    let Some(table) = value.as_table() else {
        return Err(ConfigErrorKind::Value(format!("{name} = {}: expected a table", one_line(&value.to_string()))));
    };
    for (k, v) in table {
        let alone = toml::Value::Table(toml::Table::from_iter([(k.clone(), v.clone())]));
        if let Err(e) = alone.try_into::<T>() {
            let shown: String = one_line(&v.to_string()).chars().take(60).collect();
            return Err(ConfigErrorKind::Value(format!("{name}.{k} = {shown}: {}", one_line(e.message()))));
        }
    }
    Err(ConfigErrorKind::Value(format!("{name}: {whole}")))
}

/// The longest `flapWindow` / `flapSettle` accepted.
const MAX_FLAP_DURATION: time::Duration = time::Duration::hours(24);

/// A flap damping duration: whole seconds (`60`) or a Go duration string (`"60s"`, `"2m"`),
/// at most a day.
fn flap_duration(key: &str, v: &toml::Value) -> Result<time::Duration, ConfigErrorKind> {
    duration(key, v, MAX_FLAP_DURATION)
}

/// A duration key: whole seconds (`60`) or a Go duration string (`"60s"`, `"2m"`), from
/// zero to `max` (a whole number of hours).
fn duration(key: &str, v: &toml::Value, max: time::Duration) -> Result<time::Duration, ConfigErrorKind> {
    let expected = || {
        let max = max.whole_hours();
        ConfigErrorKind::Value(format!(
            "{key} = {v}: expected seconds (60) or a duration (\"60s\", \"2m\") of at most {max}h"
        ))
    };
    let d = match v {
        toml::Value::Integer(i) => u32::try_from(*i).ok().map(|s| time::Duration::seconds(i64::from(s))),
        toml::Value::String(s) => {
            crate::config::upstream::go_duration(s).ok().and_then(|d| time::Duration::try_from(d).ok())
        }
        _ => None,
    };
    d.filter(|d| *d <= max).ok_or_else(expected)
}

fn string<'a>(key: &str, v: &'a toml::Value) -> Result<&'a str, ConfigErrorKind> {
    v.as_str().ok_or_else(|| ConfigErrorKind::Value(format!("{key} = {v}: expected a string")))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::linkstate::FlapConfig;
    use crate::decide::pcie::aer::AerThresholds;
    use proptest::prelude::*;

    #[test]
    fn nvsentinel_keys() {
        let c = Config::parse(
            "c.toml",
            r#"
nicExclusionRegex = "^veth.*,^docker.*,^br-.*,^lo$"
nicInclusionRegexOverride = ""
sysClassInfinibandPath = "/nvsentinel/sys/class/infiniband"
sysClassNetPath = "/nvsentinel/sys/class/net"
[counterDetection]
enabled = true
"#,
        )
        .unwrap();
        assert_eq!(c.filters.exclude.len(), 4);
        assert!(c.filters.include_override.is_empty());
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    #[test]
    fn counter_and_kernel_log_sections() {
        let e = Config::parse(
            "c.toml",
            "[counterDetection]\n[[counterDetection.counters]]\nname = \"symbol_error\"\nvelocityUnit = \"fortnight\"\n",
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("symbol_error") && msg.contains("velocityUnit") && msg.contains("fortnight"), "{msg}");
        assert!(!msg.contains('\n'));
        let c = Config::parse(
            "c.toml",
            "[counterDetection]\n[[counterDetection.counters]]\nname = \"port_xmit_wait\"\nenabled = false\n",
        )
        .unwrap();
        // Replace, not merge: a list whose one entry is disabled watches nothing.
        assert!(c.counter_rules.is_empty(), "{:?}", c.counter_rules);
        let e = Config::parse("c.toml", "[[kernelLog.patterns]]\nname = \"x\"\nregex = \"(\"\n").unwrap_err();
        assert!(e.to_string().contains("regex"), "{e}");
    }

    #[test]
    fn errors_name_key_and_value() {
        let e = Config::parse("/etc/x.toml", "nicExclusionRegex = \"(\"").unwrap_err();
        assert!(e.to_string().starts_with("config /etc/x.toml: nicExclusionRegex"), "{e}");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
        let e = Config::parse("x.toml", "[stateDetection]\nescalationGraceSeconds = -3").unwrap_err();
        assert!(e.to_string().contains("stateDetection.escalationGraceSeconds = -3"), "{e}");
        let e = Config::parse("x.toml", "nicExclusionRegex = [").unwrap_err();
        assert!(!e.to_string().contains('\n'));
        assert_eq!(Config::parse("x.toml", "foo = 1").unwrap().warnings.len(), 1);
        // Every key the warning names as known is one the parser takes without a warning.
        let known = Config::parse("x.toml", "foo = 1").unwrap().warnings[0].clone();
        assert!(known.ends_with(&format!("(known keys: {})", TOP_LEVEL_KEYS.join(", "))), "{known}");
        let all = "nicExclusionRegex = \"^lo$\"\nnicInclusionRegexOverride = \"\"\nsysClassInfinibandPath = \"/a\"\n\
                   sysClassNetPath = \"/b\"\n[stateDetection]\nescalationGraceSeconds = 5\nspeedDegradationFatal = true\n\
                   [counterDetection]\n[kernelLog]\n[charDeviceCheck]\nissm = \"always\"\n\
                   [pcieCheck]\nenabled = false\ncorrectableThreshold = 10\ncorrectableVelocityUnit = \"hour\"\n\
                   [phyCheck]\nenabled = true\npreFecBerThreshold = 2e-5\npauseVictimShare = 0.8\nreadInterval = \"30s\"\n\
                   [stateCheck]\nportStateHoldDown = \"2s\"\nflapThreshold = 4\nflapWindow = \"2m\"\nflapSettle = 30\n\
                   [thermalCheck]\nenabled = true\nmarginCelsius = 7.5\nreadInterval = \"30s\"\n[firmwareCheck]\nenabled = false\nreadInterval = \"1s\"\n\
                   [opticsCheck]\nenabled = false\nreadInterval = \"5m\"\n";
        let c = Config::parse("x.toml", all).unwrap();
        assert_eq!(c.optics, OpticsConfig { enabled: false, read_interval: std::time::Duration::from_secs(300) });
        assert_eq!(Config::default().optics.read_interval, std::time::Duration::from_secs(60));
        assert!(OPTICS_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        let e = Config::parse("x.toml", "[opticsCheck]\nreadInterval = \"2h\"").unwrap_err();
        assert!(e.to_string().contains("opticsCheck.readInterval"), "{e}");
        assert_eq!((c.thermal.margin_millidegrees(), c.firmware.enabled), (7_500, false));
        assert_eq!(c.thermal.read_interval, std::time::Duration::from_secs(30));
        assert!(THERMAL_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert!(FIRMWARE_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        let e = Config::parse("x.toml", "[thermalCheck]\nmarginCelsius = -1").unwrap_err();
        assert!(e.to_string().contains("thermalCheck.marginCelsius"), "{e}");
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert!(TOP_LEVEL_KEYS.iter().all(|k| all.contains(&format!("{k} =")) || all.contains(&format!("[{k}]"))));
        assert!(STATE_DETECTION_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert!(CHAR_DEVICE_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert!(PHY_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert!(STATE_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert!(PCIE_CHECK_KEYS.iter().all(|k| all.contains(&format!("{k} ="))));
        assert_eq!(c.issm, IssmMode::Always);
        assert_eq!(
            c.pcie,
            PcieConfig {
                enabled: false,
                aer: AerThresholds { correctable: 10.0, correctable_unit: crate::decide::counters::VelocityUnit::Hour }
            }
        );
        assert_eq!(
            c.flap,
            FlapConfig { threshold: 4, window: time::Duration::minutes(2), settle: time::Duration::seconds(30) }
        );
    }

    #[test]
    fn flap_damping_keys() {
        assert_eq!(Config::parse("x.toml", "").unwrap().flap, FlapConfig::default());
        let c = Config::parse("x.toml", "[stateCheck]\nflapThreshold = 0").unwrap();
        assert!(!c.flap.enabled());
        let c = Config::parse("x.toml", "[stateCheck]\nflapWindow = \"1m30s\"\nflapSettle = \"0\"").unwrap();
        assert_eq!((c.flap.window, c.flap.settle), (time::Duration::seconds(90), time::Duration::ZERO));
        for (text, key) in [
            ("[stateCheck]\nflapThreshold = 1", "stateCheck.flapThreshold = 1:"),
            ("[stateCheck]\nflapThreshold = -2", "stateCheck.flapThreshold = -2:"),
            ("[stateCheck]\nflapThreshold = 100000", "stateCheck.flapThreshold = 100000:"),
            ("[stateCheck]\nflapThreshold = \"3\"", "stateCheck.flapThreshold = \"3\":"),
            ("[stateCheck]\nflapWindow = -1", "stateCheck.flapWindow = -1:"),
            ("[stateCheck]\nflapWindow = \"soon\"", "stateCheck.flapWindow = \"soon\":"),
            ("[stateCheck]\nflapSettle = \"25h\"", "stateCheck.flapSettle = \"25h\":"),
            ("[stateCheck]\nflapSettle = 1.5", "stateCheck.flapSettle = 1.5:"),
            ("stateCheck = 3", "stateCheck: expected a table"),
        ] {
            let e = Config::parse("c.toml", text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("config c.toml: {key}")), "{text:?} → {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let w = Config::parse("x.toml", "[stateCheck]\nflapz = 1").unwrap().warnings;
        assert!(w.len() == 1 && w[0].contains("stateCheck.flapz"), "{w:?}");
    }

    #[test]
    fn issm_mode() {
        assert_eq!(Config::parse("x.toml", "").unwrap().issm, IssmMode::Never);
        assert_eq!(Config::parse("x.toml", "[charDeviceCheck]\nissm = \"never\"").unwrap().issm, IssmMode::Never);
        let hd = |v: &str| Config::parse("x.toml", &format!("[stateCheck]\nportStateHoldDown = {v}"));
        assert_eq!(hd("\"1m30s\"").unwrap().port_state_hold_down, std::time::Duration::from_secs(90));
        assert_eq!(hd("\"0\"").unwrap().port_state_hold_down, std::time::Duration::ZERO);
        assert_eq!(Config::default().port_state_hold_down, std::time::Duration::ZERO);
        for bad in ["\"soon\"", "5", "\"-1s\""] {
            let e = hd(bad).unwrap_err().to_string();
            assert!(e.contains("x.toml") && e.contains(&format!("stateCheck.portStateHoldDown = {bad}")), "{e}");
        }
        let e = Config::parse("x.toml", "[charDeviceCheck]\nissm = \"auto\"").unwrap_err().to_string();
        assert!(e.contains("charDeviceCheck.issm = \"auto\"") && e.contains("never"), "{e}");
        assert!(Config::parse("x.toml", "[charDeviceCheck]\nissm = 1").is_err());
        assert!(Config::parse("x.toml", "charDeviceCheck = 1").is_err());
        assert_eq!(Config::parse("x.toml", "[charDeviceCheck]\nfoo = 1").unwrap().warnings.len(), 1);
    }

    #[test]
    fn section_errors_name_the_key() {
        for (text, key) in [
            ("[kernelLog]\nenabled = 1", "kernelLog.enabled = 1:"),
            ("[kernelLog]\nenabled = \"yes\"", "kernelLog.enabled = \"yes\":"),
            ("[kernelLog]\ndedupWindowSeconds = \"x\"", "kernelLog.dedupWindowSeconds = \"x\":"),
            ("[kernelLog]\ndedupWindowSeconds = -1", "kernelLog.dedupWindowSeconds = -1:"),
            ("[kernelLog]\npatterns = \"x\"", "kernelLog.patterns = \"x\":"),
            ("[kernelLog]\nmaxRecords = 3", "kernelLog.maxRecords = 3:"),
            ("[counterDetection]\nenabled = 1", "counterDetection.enabled = 1:"),
            ("[counterDetection]\ncounters = \"x\"", "counterDetection.counters = \"x\":"),
            ("kernelLog = 3", "kernelLog = 3: expected a table"),
        ] {
            let e = Config::parse("c.toml", text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("config c.toml: {key}")), "{text:?} → {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn errors_say_their_kind() {
        let kind = |text: &str| Config::parse("c.toml", text).unwrap_err().kind;
        assert!(matches!(kind("nicExclusionRegex = ["), ConfigErrorKind::Syntax(_)));
        assert!(matches!(kind("nicExclusionRegex = 3"), ConfigErrorKind::Value(_)));
        assert!(matches!(
            kind(
                "[[counterDetection.counters]]\nname = \"link_downed\"\n[[counterDetection.counters]]\nname = \"link_downed\"\n"
            ),
            ConfigErrorKind::Value(_)
        ));
        assert!(matches!(kind("[[kernelLog.patterns]]\nname = \"x\"\nregex = \"(\"\n"), ConfigErrorKind::KernelLog(_)));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(Config::load(dir.path()).unwrap_err().kind, ConfigErrorKind::Read(_)));
    }

    #[test]
    fn counters_disabled_skip_the_degradation_checks_and_validate_nothing() {
        let all: BTreeSet<Check> = Check::ALL.into_iter().collect();
        let degradation: BTreeSet<Check> = all.iter().copied().filter(|c| c.kind() == CheckKind::Counters).collect();
        // Counters on: the request is the set, no warning.
        let on = Config::parse("c.toml", "[counterDetection]\nenabled = true\n").unwrap();
        let e = on.enabled_checks(&all).unwrap();
        assert_eq!((e.checks, e.warning), (all.clone(), None));
        // Off with an entry that would not validate (an unknown name, an unknown key): loads,
        // no rules, the degradation checks skipped with one warning naming the entry.
        let text = "[counterDetection]\nenabled = false\n[[counterDetection.counters]]\nname = \"symbol_errors\"\n";
        let off = Config::parse("c.toml", text).unwrap();
        assert!(off.counter_rules.is_empty() && off.warnings.is_empty(), "{off:?}");
        let e = off.enabled_checks(&all).unwrap();
        assert_eq!(e.checks, &all - &degradation);
        let w = e.warning.unwrap();
        assert!(
            w.starts_with("config c.toml: counterDetection.enabled = false: skipping InfiniBandDegradationCheck"),
            "{w}"
        );
        assert!(w.contains("counterDetection.counters[0] (name \"symbol_errors\")") && !w.contains('\n'), "{w}");
        let off = Config::parse("c.toml", "[counterDetection]\nenabled = false\nthreshold = 3\n").unwrap();
        assert!(off.enabled_checks(&all).unwrap().warning.unwrap().contains("threshold"));
        // Off and valid: the skip alone; no degradation check requested: nothing to say.
        let off = Config::parse("c.toml", "[counterDetection]\nenabled = false\n").unwrap();
        let w = off.enabled_checks(&all).unwrap().warning.unwrap();
        assert!(!w.contains("not validated"), "{w}");
        let state: BTreeSet<Check> = [Check::InfiniBandStateCheck].into();
        assert_eq!(off.enabled_checks(&state).unwrap().warning, None);
        // Only degradation checks requested: none is enabled.
        let err = off.enabled_checks(&degradation).err().unwrap();
        assert_eq!(err.skipped, degradation.iter().copied().collect::<Vec<_>>());
        assert!(err.to_string().starts_with("config c.toml: no check is enabled"), "{err}");
        // `enabled` itself must still be a boolean.
        assert!(Config::parse("c.toml", "[counterDetection]\nenabled = \"false\"\n").is_err());
    }

    #[test]
    fn phy_check_sets_the_rate_thresholds_and_rejects_nonsense() {
        use crate::decide::phy::{RsCode, port_ber_threshold};
        let find = |c: &Config, n: &str| c.counter_rules.iter().find(|r| r.name == n).unwrap().threshold;
        let set = |c: &Config| c.counter_rules.iter().find(|r| r.name == "pre_fec_ber").unwrap().threshold_set;
        let d = Config::default();
        assert!(d.phy.enabled);
        assert_eq!((find(&d, "pre_fec_ber"), find(&d, "pause_victim")), (1e-4, 0.5));
        // No threshold set: each port's FEC code picks its own default.
        assert_eq!(port_ber_threshold(set(&d), Some(RsCode::Kr4)), Some(1e-5));
        assert_eq!(port_ber_threshold(set(&d), None), None);
        let c = Config::parse("x.toml", "[phyCheck]\npreFecBerThreshold = 3e-5\npauseVictimShare = 1\nenabled = false")
            .unwrap();
        assert_eq!((find(&c, "pre_fec_ber"), find(&c, "pause_victim"), c.phy.enabled), (3e-5, 1.0, false));
        assert_eq!(port_ber_threshold(set(&c), Some(RsCode::Kr4)), None, "the operator's holds");
        // The read pace: 10 s unless set; seconds or a duration, 0 = every poll.
        assert_eq!(d.phy.read_interval, std::time::Duration::from_secs(10));
        for (text, want) in [("30", 30), ("\"1m\"", 60), ("0", 0), ("\"1h\"", 3600)] {
            let c = Config::parse("x.toml", &format!("[phyCheck]\nreadInterval = {text}")).unwrap();
            assert_eq!(c.phy.read_interval, std::time::Duration::from_secs(want), "{text}");
        }
        // A threshold set on the rule holds too.
        let c =
            Config::parse("x.toml", "[[counterDetection.counters]]\nname = \"pre_fec_ber\"\nthreshold = 1e-6").unwrap();
        assert_eq!(port_ber_threshold(set(&c), Some(RsCode::Kr4)), None);
        // An explicit value equal to the default is set all the same (issue #43, #11): on
        // the rule, or in [phyCheck].
        for text in [
            "[[counterDetection.counters]]\nname = \"pre_fec_ber\"\nthreshold = 1e-4",
            "[phyCheck]\npreFecBerThreshold = 1e-4",
        ] {
            let c = Config::parse("x.toml", text).unwrap();
            assert_eq!(find(&c, "pre_fec_ber"), 1e-4, "{text}");
            assert_eq!(port_ber_threshold(set(&c), Some(RsCode::Kr4)), None, "{text}: the operator's 1e-4 holds");
        }
        for (text, key) in [
            ("preFecBerThreshold = 0", "phyCheck.preFecBerThreshold = 0"),
            ("preFecBerThreshold = 1.0", "phyCheck.preFecBerThreshold = 1.0"),
            ("preFecBerThreshold = \"1e-4\"", "phyCheck.preFecBerThreshold"),
            ("pauseVictimShare = 1.5", "phyCheck.pauseVictimShare = 1.5"),
            ("pauseVictimShare = nan", "phyCheck.pauseVictimShare = nan"),
            ("enabled = 1", "phyCheck.enabled = 1"),
            ("readInterval = -1", "phyCheck.readInterval = -1"),
            ("readInterval = \"2h\"", "phyCheck.readInterval = \"2h\": expected seconds (60) or a duration"),
            ("readInterval = 1.5", "phyCheck.readInterval = 1.5"),
        ] {
            let e = Config::parse("x.toml", &format!("[phyCheck]\n{text}")).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    proptest! {
        #[test]
    #[test]
        fn never_panics(s in "\\PC{0,200}") {
            let _ = Config::parse("p", &s);
        }
    }
}
