//! Counter rules: the `[counterDetection]` section of the config file (001 §10).
//!
//! Upstream NVSentinel's semantics (`reference/nvsentinel-upstream.md` §2): a section that
//! lists counters monitors exactly the listed entries that are enabled (replace, not merge);
//! no list keeps the defaults of 001 §10.2 ([`super::defaults`]). Every counter of upstream's
//! allow-list is known by name, with its path, severity, description and link layers owned by
//! the code, so an entry may give only a name (its threshold is then nicmon's default for that
//! counter) and overrides only the keys it gives. A name outside the list is nicmon's
//! extension: it must give `path`, `thresholdType` and `threshold`. Any invalid value — an
//! unknown name without a path, a duplicate — stops startup with an error that names the
//! entry, the key and the value (lesson 2: an invalid config must never silently disable
//! monitoring).
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::defaults::COUNTER_DEFINITIONS;
pub use super::defaults::default_rules;
pub use super::rule::{
    CounterRule, DEVICE_TEMPLATE_PREFIX, ETHTOOL_PREFIX, Layers, Measure, NET_TEMPLATE_PREFIX, ThresholdType,
    VelocityUnit,
};
pub use crate::model::driver::Drivers;

/// The `[counterDetection]` section as the operator wrote it.
///
/// Deserialises from the NVSentinel-compatible keys:
/// ```toml
/// [counterDetection]
/// enabled = true
/// [[counterDetection.counters]]
/// name = "port_xmit_wait"
/// enabled = false
/// ```
/// Use [`CounterDetection::rules`] to get the merged, validated rules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawSection")]
pub struct CounterDetection {
    pub enabled: bool,
    /// The operator's entries, in file order (index = position in the file).
    pub counters: Vec<CounterEntry>,
}

impl Default for CounterDetection {
    fn default() -> Self {
        CounterDetection { enabled: true, counters: Vec::new() }
    }
}

/// One `[[counterDetection.counters]]` entry: every key optional, values kept as written
/// so that [`CounterDetection::rules`] can report a bad one verbatim.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_fatal: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub velocity_unit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

const ENTRY_KEYS: [&str; 8] =
    ["name", "path", "enabled", "isFatal", "thresholdType", "threshold", "velocityUnit", "description"];

/// A config error in `[counterDetection]`. The message names the entry (its index in
/// `counterDetection.counters` and its name), the key and the offending value.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{entry}: {problem}")]
pub struct CounterConfigError {
    /// `counterDetection.counters[3] (name "symbol_error")`, or `counterDetection` for the
    /// section itself.
    pub entry: String,
    /// `velocityUnit = "fortnight": expected one of second, minute, hour`.
    pub problem: String,
}

fn entry_label(index: usize, name: Option<&str>) -> String {
    match name {
        Some(n) => format!("counterDetection.counters[{index}] (name {n:?})"),
        None => format!("counterDetection.counters[{index}]"),
    }
}

fn err(index: usize, name: Option<&str>, problem: impl Into<String>) -> CounterConfigError {
    CounterConfigError { entry: entry_label(index, name), problem: problem.into() }
}

/// Shows a TOML value the way the operator wrote it (strings quoted).
struct Shown<'a>(&'a toml::Value);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            toml::Value::String(s) => write!(f, "{s:?}"),
            other => {
                let s = other.to_string();
                // Inline tables/arrays can be long; the first line is enough to find it.
                let s = s.lines().next().unwrap_or_default();
                if s.len() > 60 {
                    let mut cut = 57;
                    while !s.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    write!(f, "{}...", &s[..cut])
                } else {
                    f.write_str(s)
                }
            }
        }
    }
}

/// The section as parsed, before the per-entry checks that need the entry's index.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSection {
    #[serde(default = "default_true")]
    enabled: bool,
    #[serde(default)]
    counters: Vec<toml::Table>,
}

fn default_true() -> bool {
    true
}

impl TryFrom<RawSection> for CounterDetection {
    type Error = CounterConfigError;

    fn try_from(raw: RawSection) -> Result<Self, CounterConfigError> {
        let counters =
            raw.counters.iter().enumerate().map(|(i, t)| CounterEntry::from_table(i, t)).collect::<Result<_, _>>()?;
        let section = CounterDetection { enabled: raw.enabled, counters };
        // A section that parses is a valid one: the loader fails at load time, not later.
        section.rules()?;
        Ok(section)
    }
}

impl CounterEntry {
    fn from_table(index: usize, table: &toml::Table) -> Result<CounterEntry, CounterConfigError> {
        let name = table.get("name").and_then(|v| v.as_str());
        let bad = |key: &str, v: &toml::Value, expected: &str| {
            err(index, name, format!("{key} = {}: expected {expected}", Shown(v)))
        };
        let mut entry = CounterEntry::default();
        for (key, value) in table {
            match key.as_str() {
                "name" | "path" | "thresholdType" | "velocityUnit" | "description" => {
                    let s = value.as_str().ok_or_else(|| bad(key, value, "a string"))?.to_owned();
                    let slot = match key.as_str() {
                        "name" => &mut entry.name,
                        "path" => &mut entry.path,
                        "thresholdType" => &mut entry.threshold_type,
                        "velocityUnit" => &mut entry.velocity_unit,
                        _ => &mut entry.description,
                    };
                    *slot = Some(s);
                }
                "enabled" | "isFatal" => {
                    let b = value.as_bool().ok_or_else(|| bad(key, value, "true or false"))?;
                    if key == "enabled" {
                        entry.enabled = Some(b);
                    } else {
                        entry.is_fatal = Some(b);
                    }
                }
                "threshold" => {
                    let n = match value {
                        toml::Value::Integer(i) => *i as f64,
                        toml::Value::Float(f) => *f,
                        _ => return Err(bad(key, value, "a number")),
                    };
                    entry.threshold = Some(n);
                }
                _ => {
                    return Err(err(
                        index,
                        name,
                        format!("unknown key {key:?}: expected one of {}", ENTRY_KEYS.join(", ")),
                    ));
                }
            }
        }
        Ok(entry)
    }
}

impl CounterDetection {
    /// The rules to evaluate: the defaults when no counter is listed, else exactly the listed
    /// entries (each over its built-in rule, if any), validated.
    ///
    /// Disabled rules are left out, and everything is left out when the section is
    /// disabled; the entries are validated in either case (the config file's loader does
    /// not get here for a disabled section: [`crate::config`]).
    pub fn rules(&self) -> Result<Vec<CounterRule>, CounterConfigError> {
        let mut rules = merge(&default_rules(), &self.counters)?;
        if !self.enabled {
            return Ok(Vec::new());
        }
        if !self.counters.is_empty() {
            // Replace, not merge: the listed names in file order; a listed name is watched
            // unless its entry says `enabled = false` (an allow-listed counter nicmon does not
            // watch by default is enabled by being listed).
            let listed = self.counters.iter().filter_map(|e| {
                let name = e.name.as_deref()?;
                let mut rule = rules.iter().find(|r| r.name == name)?.clone();
                rule.enabled = e.enabled.unwrap_or(true);
                Some(rule)
            });
            rules = listed.collect();
        }
        Ok(rules.into_iter().filter(|r| r.enabled).collect())
    }
}

/// The distinct paths the read layer must read for `rules`, in rule order.
/// `ethtool/` counters are not files: they come from the netdev's ethtool data.
pub fn read_paths(rules: &[CounterRule]) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for r in rules.iter().filter(|r| r.enabled && !r.path.starts_with(ETHTOOL_PREFIX)) {
        if !paths.contains(&r.path) {
            paths.push(r.path.clone());
        }
    }
    paths
}

/// Per path of [`read_paths`] (same order), the drivers of the rules that read it: a
/// device reads a path only when one of its driver's rules needs it.
pub fn read_path_drivers(rules: &[CounterRule]) -> Vec<Drivers> {
    read_paths(rules)
        .iter()
        .map(|p| {
            let mut of_path = rules.iter().filter(|r| r.enabled && &r.path == p).map(|r| r.drivers);
            let first = of_path.next().unwrap_or(Drivers::ALL);
            of_path.fold(first, Drivers::union)
        })
        .collect()
}

/// Merge `entries` into `defaults` by name (001 §10.3) and validate the result (001 §10.5).
/// Returns every rule, disabled ones included, defaults first, then additions in file order.
pub fn merge(defaults: &[CounterRule], entries: &[CounterEntry]) -> Result<Vec<CounterRule>, CounterConfigError> {
    let mut rules: Vec<CounterRule> = defaults.to_vec();
    let mut seen: Vec<&str> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let name = entry_name(i, e, &seen)?;
        seen.push(name);
        let values = EntryValues::parse(i, e)?;
        let k = match rules.iter().position(|r| r.name == name) {
            Some(k) => k,
            None => {
                rules.push(added_rule(i, e, name)?);
                rules.len() - 1
            }
        };
        values.apply(e, &mut rules[k]).map_err(|problem| err(i, Some(name), problem))?;
    }
    Ok(rules)
}

/// The entry's name: present, not blank, not a duplicate of an earlier entry's.
fn entry_name<'e>(i: usize, e: &'e CounterEntry, seen: &[&str]) -> Result<&'e str, CounterConfigError> {
    let name = e.name.as_deref();
    let Some(n) = name else {
        return Err(err(i, None, "name: missing (every entry needs a name)"));
    };
    if n.trim().is_empty() {
        return Err(err(i, name, "name = \"\": expected a non-empty name"));
    }
    if let Some(j) = seen.iter().position(|s| *s == n) {
        return Err(err(i, name, format!("name = {n:?}: duplicate of counterDetection.counters[{j}]")));
    }
    Ok(n)
}

/// An entry's typed values, each checked on its own (before the merge).
struct EntryValues {
    threshold_type: Option<ThresholdType>,
    velocity_unit: Option<VelocityUnit>,
}

impl EntryValues {
    fn parse(i: usize, e: &CounterEntry) -> Result<EntryValues, CounterConfigError> {
        let name = e.name.as_deref();
        let threshold_type = match &e.threshold_type {
            Some(s) => Some(
                ThresholdType::parse(s)
                    .ok_or_else(|| err(i, name, format!("thresholdType = {s:?}: expected one of delta, velocity")))?,
            ),
            None => None,
        };
        let velocity_unit =
            match &e.velocity_unit {
                Some(s) => Some(VelocityUnit::parse(s).ok_or_else(|| {
                    err(i, name, format!("velocityUnit = {s:?}: expected one of second, minute, hour"))
                })?),
                None => None,
            };
        if let Some(t) = e.threshold
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(err(i, name, format!("threshold = {t}: expected a finite number >= 0")));
        }
        if let Some(p) = &e.path {
            check_path(p).map_err(|why| err(i, name, format!("path = {p:?}: {why}")))?;
        }
        Ok(EntryValues { threshold_type, velocity_unit })
    }

    /// Overrides the keys the entry gives, then checks the rule it makes.
    fn apply(&self, e: &CounterEntry, rule: &mut CounterRule) -> Result<(), &'static str> {
        if let Some(p) = &e.path {
            rule.path = p.clone();
        }
        if let Some(b) = e.enabled {
            rule.enabled = b;
        }
        if let Some(b) = e.is_fatal {
            rule.is_fatal = b;
        }
        if let Some(t) = self.threshold_type {
            rule.threshold_type = t;
        }
        if let Some(t) = e.threshold {
            rule.threshold = t;
            rule.threshold_set = true;
        }
        if let Some(d) = &e.description {
            rule.description = d.clone();
        }
        if rule.measure != Measure::Count && rule.threshold_type == ThresholdType::Delta {
            return Err("thresholdType = \"delta\": this counter is judged as a rate over a window: \
                 expected velocity");
        }
        match rule.threshold_type {
            // A velocityUnit on a delta rule is accepted (NVSentinel configs may carry one)
            // and ignored; an inherited one is dropped when an override switches to delta.
            ThresholdType::Delta => rule.velocity_unit = None,
            ThresholdType::Velocity => {
                if let Some(u) = self.velocity_unit {
                    rule.velocity_unit = Some(u);
                }
                if rule.velocity_unit.is_none() {
                    return Err("velocityUnit: missing (required when thresholdType = \"velocity\"): \
                         expected one of second, minute, hour");
                }
            }
        }
        Ok(())
    }
}

/// The blank rule an entry for a counter that is not a known one is merged over: such an
/// entry must give the path, the threshold type and the threshold.
fn added_rule(i: usize, e: &CounterEntry, name: &str) -> Result<CounterRule, CounterConfigError> {
    if e.path.is_none() {
        let known: Vec<&str> = COUNTER_DEFINITIONS.iter().map(|d| d.name).collect();
        return Err(err(
            i,
            Some(name),
            format!(
                "name = {name:?}: not a known counter (known: {}); to watch another counter give its \
                 path, thresholdType and threshold",
                known.join(", ")
            ),
        ));
    }
    let missing: Vec<&str> = [
        ("path", e.path.is_none()),
        ("thresholdType", e.threshold_type.is_none()),
        ("threshold", e.threshold.is_none()),
    ]
    .into_iter()
    .filter_map(|(k, m)| m.then_some(k))
    .collect();
    if !missing.is_empty() {
        return Err(err(
            i,
            Some(name),
            format!("{}: missing (required for a counter that is not a known one)", missing.join(", ")),
        ));
    }
    Ok(CounterRule {
        name: name.to_owned(),
        path: String::new(),
        enabled: true,
        is_fatal: false,
        threshold_type: ThresholdType::Delta,
        threshold: 0.0,
        velocity_unit: None,
        description: String::new(),
        layers: Layers::All,
        measure: Measure::Count,
        error_code: None,
        threshold_set: false,
        drivers: Drivers::ALL,
        alias: None,
    })
}

/// A rule path is relative to the port directory, or a `/sys/class/net/{interface}/`
/// template; `{interface}` means nothing anywhere else.
fn check_path(p: &str) -> Result<(), &'static str> {
    if p.trim().is_empty() {
        return Err("expected a non-empty path");
    }
    let rel = if let Some(rest) = p.strip_prefix(NET_TEMPLATE_PREFIX).or_else(|| p.strip_prefix(DEVICE_TEMPLATE_PREFIX))
    {
        rest
    } else if p.starts_with('/') {
        return Err("expected a path relative to the port directory (counters/..., hw_counters/...), \
             a /sys/class/net/{interface}/... or a /sys/class/infiniband/{device}/... template");
    } else {
        p
    };
    if rel.is_empty() || rel.ends_with('/') {
        return Err("expected a path that names a file");
    }
    if rel.contains('{') || rel.contains('}') {
        return Err("{interface} and {device} are only allowed as /sys/class/net/{interface}/... \
             and /sys/class/infiniband/{device}/...");
    }
    if rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("expected no empty, '.' or '..' path components");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Top {
        #[serde(rename = "counterDetection", default)]
        counter_detection: CounterDetection,
    }

    fn parse(s: &str) -> Result<CounterDetection, String> {
        toml::from_str::<Top>(s).map(|t| t.counter_detection).map_err(|e| e.message().to_string())
    }

    fn rules(s: &str) -> Result<Vec<CounterRule>, String> {
        parse(s)?.rules().map_err(|e| e.to_string())
    }

    fn find<'a>(rules: &'a [CounterRule], name: &str) -> &'a CounterRule {
        rules.iter().find(|r| r.name == name).unwrap()
    }

    use crate::model::driver::RdmaDriver;

    #[test]
    fn vendor_rules_pair_their_generations_and_keep_their_own_meaning() {
        let all = default_rules();
        // Each generation's name aliases the other, same driver, same judgement.
        for r in all.iter().filter(|r| r.alias.is_some()) {
            let other = all.iter().find(|o| Some(&o.path) == r.alias.as_ref() && o.drivers == r.drivers);
            let other = other.unwrap_or_else(|| panic!("{}: no rule reads its alias", r.name));
            assert_eq!(other.alias.as_deref(), Some(r.path.as_str()), "{}", r.name);
            assert_eq!(
                (other.threshold_type, other.threshold, other.velocity_unit),
                (r.threshold_type, r.threshold, r.velocity_unit)
            );
        }
        let on = |path: &str, driver: RdmaDriver| -> Vec<(String, bool)> {
            let of = all.iter().filter(|r| r.path == path && r.drivers.covers(Some(driver)));
            of.map(|r| (r.name.clone(), r.is_fatal)).collect()
        };
        // mlx5's rnr_nak_retry_err is the retries exhausted (fatal); bnxt_re's, since 2025,
        // counts RNR NAKs received: its own rule, not fatal.
        let rnr = "hw_counters/rnr_nak_retry_err";
        assert_eq!(on(rnr, RdmaDriver::Mlx5), [("rnr_nak_retry_err".to_string(), true)]);
        assert_eq!(on(rnr, RdmaDriver::BnxtRe), [("bnxt_re_rnr_nak_retry_err".to_string(), false)]);
        assert!(on(rnr, RdmaDriver::Ionic).is_empty());
        // Both bnxt_re generations, irdma's names with spaces, rxe's.
        for (path, driver, name) in [
            ("hw_counters/to_retransmits", RdmaDriver::BnxtRe, "bnxt_re_to_retransmits"),
            ("hw_counters/local_ack_timeout_err", RdmaDriver::BnxtRe, "bnxt_re_local_ack_timeout_err"),
            ("hw_counters/RNR received", RdmaDriver::Irdma, "irdma_RNR_received"),
            ("hw_counters/CRC errors", RdmaDriver::Irdma, "irdma_CRC_errors"),
            ("hw_counters/link_downed", RdmaDriver::Rxe, "rxe_link_downed"),
            ("hw_counters/req_tx_retry_excd_err", RdmaDriver::Ionic, "ionic_req_tx_retry_excd_err"),
        ] {
            assert_eq!(on(path, driver), [(name.to_string(), false)], "{path}");
        }
        // The IBTA PMA counters mean the same on every driver.
        assert_eq!(on("counters/link_downed", RdmaDriver::Irdma), [("link_downed".to_string(), true)]);
        // A path is read by the devices of the drivers of its rules only.
        let r = rules("").unwrap();
        let paths = read_paths(&r);
        let drivers = read_path_drivers(&r);
        let of = |p: &str| drivers[paths.iter().position(|x| x == p).unwrap()];
        assert!(of("hw_counters/local_ack_timeout_err").covers(Some(RdmaDriver::BnxtRe)));
        assert!(of("hw_counters/local_ack_timeout_err").covers(Some(RdmaDriver::Mlx5)));
        assert!(!of("hw_counters/local_ack_timeout_err").covers(Some(RdmaDriver::Irdma)));
        assert!(!of("hw_counters/out_of_buffer").covers(Some(RdmaDriver::Mlx5)), "mlx5 does not read bnxt_re's");
        assert!(of("counters/symbol_error").covers(None));
    }

    #[test]
    fn defaults_are_001_section_10_2() {
        let r = rules("").unwrap();
        // 14 mlx5/netdev rules, 6 of the 13 EFA rules (upstream chart's defaults), 5 RoCE
        // physical-layer rules; the rest of upstream's allow-list (38 names) is known but
        // not watched by default. Then the other drivers' own counters (SPEC §1.14), all
        // watched, none fatal.
        let vendor = |r: &CounterRule| r.drivers.listed().iter().any(|d| !matches!(d, RdmaDriver::Mlx5));
        let (vendors, upstream): (Vec<_>, Vec<_>) = r.iter().partition(|r| vendor(r));
        assert_eq!(upstream.len(), 25);
        assert_eq!(default_rules().iter().filter(|r| !vendor(r)).count(), 43);
        assert_eq!(vendors.len(), default_rules().iter().filter(|r| vendor(r)).count());
        assert!(vendors.iter().all(|r| !r.is_fatal && r.layers == Layers::Rdma), "{vendors:?}");
        assert_eq!(r, default_rules().into_iter().filter(|r| r.enabled).collect::<Vec<_>>());
        let fatal: Vec<&str> = r.iter().filter(|r| r.is_fatal).map(|r| r.name.as_str()).collect();
        assert_eq!(
            fatal,
            [
                "link_downed",
                "excessive_buffer_overrun_errors",
                "local_link_integrity_errors",
                "rnr_nak_retry_err",
                "symbol_error_fatal",
                "efa_no_completion_cmds"
            ]
        );
        // Layers are the code's: mlx5 counters on IB/RoCE ports, efa_* on EFA ports only.
        for r in default_rules() {
            let want = match r.name.as_str() {
                "carrier_changes" | "rx_crc_errors" | "rx_errors" | "rx_missed_errors" | "tx_carrier_errors"
                | "tx_errors" => Layers::All,
                n if n.starts_with("efa_") => Layers::Efa,
                "pre_fec_ber" | "fec_uncorrectable" | "pfc_storm" | "pfc_storm_error" | "pause_victim" => Layers::Roce,
                _ => Layers::Rdma,
            };
            assert_eq!(r.layers, want, "{}", r.name);
        }
        let nc = find(&r, "efa_no_completion_cmds");
        assert_eq!(nc.path, "/sys/class/infiniband/{device}/hw_counters/no_completion_cmds");
        assert_eq!(find(&r, "efa_rx_drops").path, "hw_counters/rx_drops");
        let sef = find(&r, "symbol_error_fatal");
        assert_eq!(sef.path, "counters/symbol_error");
        assert_eq!(sef.threshold, 120.0);
        assert_eq!(sef.velocity_unit, Some(VelocityUnit::Hour));
        let cc = find(&r, "carrier_changes");
        assert_eq!(cc.path, "/sys/class/net/{interface}/carrier_changes");
        assert_eq!((cc.threshold_type, cc.threshold), (ThresholdType::Delta, 2.0));
        // Every default passes the validation applied to operator entries.
        let entries: Vec<CounterEntry> = default_rules()
            .iter()
            .map(|r| CounterEntry {
                name: Some(r.name.clone()),
                path: Some(r.path.clone()),
                enabled: Some(r.enabled),
                is_fatal: Some(r.is_fatal),
                threshold_type: Some(r.threshold_type.as_str().into()),
                threshold: Some(r.threshold),
                velocity_unit: r.velocity_unit.map(|u| u.as_str().into()),
                description: Some(r.description.clone()),
            })
            .collect();
        let merged: Vec<CounterRule> = merge(&[], &entries)
            .unwrap()
            .into_iter()
            .zip(default_rules())
            .map(|(m, d)| CounterRule {
                layers: d.layers,
                measure: d.measure,
                error_code: d.error_code,
                threshold_set: false,
                drivers: d.drivers,
                alias: d.alias,
                ..m
            })
            .collect();
        assert_eq!(merged, default_rules());
    }

    #[test]
    fn read_paths_are_distinct_and_skip_disabled() {
        let r = rules(
            r#"
            [[counterDetection.counters]]
            name = "symbol_error"
            [[counterDetection.counters]]
            name = "symbol_error_fatal"
            [[counterDetection.counters]]
            name = "carrier_changes"
            [[counterDetection.counters]]
            name = "port_xmit_wait"
            enabled = false
            "#,
        )
        .unwrap();
        let p = read_paths(&r);
        assert_eq!(p.len(), 2); // symbol_error read once, carrier_changes
        assert_eq!(p.iter().filter(|p| *p == "counters/symbol_error").count(), 1);
        assert!(!p.contains(&"counters/port_xmit_wait".to_string()));
        assert!(p.contains(&"/sys/class/net/{interface}/carrier_changes".to_string()));
    }

    #[test]
    fn section_10_3_example_merges() {
        let r = rules(
            r#"
            [counterDetection]
            enabled = true

            [[counterDetection.counters]]
            name = "symbol_error"
            path = "counters/symbol_error"
            enabled = true
            isFatal = true
            thresholdType = "velocity"
            threshold = 120.0
            velocityUnit = "hour"
            description = "Symbol errors exceed IBTA BER threshold"

            [[counterDetection.counters]]
            name = "custom_vendor_error"
            path = "hw_counters/vendor_specific_err"
            enabled = true
            isFatal = false
            thresholdType = "delta"
            threshold = 100
            description = "Vendor-specific error counter"

            [[counterDetection.counters]]
            name = "port_xmit_wait"
            enabled = false
            "#,
        )
        .unwrap();
        // Replace, not merge: the two enabled entries, in file order.
        assert_eq!(r.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["symbol_error", "custom_vendor_error"]);
        let se = find(&r, "symbol_error");
        assert!(se.is_fatal);
        assert_eq!(se.velocity_unit, Some(VelocityUnit::Hour));
        assert_eq!(se.threshold, 120.0);
        assert_eq!(se.description, "Symbol errors exceed IBTA BER threshold");
        let c = r.last().unwrap();
        assert_eq!(c.name, "custom_vendor_error");
        assert_eq!((c.threshold_type, c.threshold), (ThresholdType::Delta, 100.0));
        assert_eq!(c.layers, Layers::All, "an operator's counter is read wherever its file is");
        assert!(r.iter().all(|r| r.name != "port_xmit_wait"));
    }

    #[test]
    fn an_upstream_list_is_the_set_with_code_owned_paths() {
        // Upstream's ConfigMap shape: name, enabled, thresholdType, threshold (no path, no
        // severity); plus a name-only entry and an allow-listed counter nicmon does not watch
        // by default.
        let r = rules(
            r#"
            [counterDetection]
            enabled = true
            [[counterDetection.counters]]
            name = "link_downed"
            enabled = true
            thresholdType = "delta"
            threshold = 0
            [[counterDetection.counters]]
            name = "efa_no_completion_cmds"
            [[counterDetection.counters]]
            name = "req_transport_retries_exceeded"
            enabled = true
            thresholdType = "delta"
            threshold = 0
            [[counterDetection.counters]]
            name = "rx_crc_errors"
            enabled = true
            thresholdType = "velocity"
            threshold = 5
            velocityUnit = "minute"
            [[counterDetection.counters]]
            name = "symbol_error"
            enabled = false
            thresholdType = "velocity"
            threshold = 10
            velocityUnit = "second"
            "#,
        )
        .unwrap();
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["link_downed", "efa_no_completion_cmds", "req_transport_retries_exceeded", "rx_crc_errors"]);
        let nc = find(&r, "efa_no_completion_cmds");
        assert_eq!((nc.is_fatal, nc.layers), (true, Layers::Efa));
        assert_eq!(nc.path, "/sys/class/infiniband/{device}/hw_counters/no_completion_cmds");
        let rt = find(&r, "req_transport_retries_exceeded");
        assert_eq!(
            (rt.path.as_str(), rt.is_fatal, rt.layers),
            ("hw_counters/req_transport_retries_exceeded", true, Layers::Rdma)
        );
        let crc = find(&r, "rx_crc_errors");
        assert_eq!(crc.path, "/sys/class/net/{interface}/statistics/rx_crc_errors");
        assert_eq!((crc.threshold, crc.velocity_unit, crc.layers), (5.0, Some(VelocityUnit::Minute), Layers::All));
        // Every name of upstream's allow-list is known.
        let known: Vec<String> = default_rules().into_iter().map(|r| r.name).collect();
        for n in [
            "excessive_buffer_overrun_errors",
            "link_downed",
            "link_error_recovery",
            "local_link_integrity_errors",
            "port_rcv_discards",
            "port_rcv_errors",
            "port_rcv_remote_physical_errors",
            "port_rcv_switch_relay_errors",
            "port_xmit_discards",
            "port_xmit_wait",
            "symbol_error",
            "symbol_error_fatal",
            "implied_nak_seq_err",
            "local_ack_timeout_err",
            "out_of_sequence",
            "packet_seq_err",
            "req_transport_retries_exceeded",
            "rnr_nak_retry_err",
            "roce_slow_restart",
            "efa_rx_drops",
            "efa_rdma_read_wr_err",
            "efa_rdma_write_wr_err",
            "efa_retrans_timeout_events",
            "efa_unresponsive_remote_events",
            "efa_impaired_remote_conn_events",
            "efa_no_completion_cmds",
            "efa_cmds_err",
            "efa_keep_alive_rcvd",
            "efa_reg_mr_err",
            "efa_create_qp_err",
            "efa_create_cq_err",
            "efa_create_ah_err",
            "carrier_changes",
            "rx_crc_errors",
            "rx_errors",
            "rx_missed_errors",
            "tx_carrier_errors",
            "tx_errors",
        ] {
            assert!(known.iter().any(|k| k == n), "{n}");
        }
        // Upstream's 38 and nicmon's RoCE physical-layer rules, then the other drivers' own.
        let vendor = ["bnxt_re_", "irdma_", "ionic_", "rxe_"];
        assert_eq!(known.iter().filter(|k| !vendor.iter().any(|v| k.starts_with(v))).count(), 43);
    }

    #[test]
    fn roce_phy_rules_take_operator_overrides_but_stay_rates() {
        let r = rules(
            r#"
            [[counterDetection.counters]]
            name = "fec_uncorrectable"
            isFatal = true
            [[counterDetection.counters]]
            name = "pre_fec_ber"
            threshold = 1e-6
            "#,
        )
        .unwrap();
        let fu = find(&r, "fec_uncorrectable");
        assert_eq!((fu.is_fatal, fu.layers, fu.path.as_str()), (true, Layers::Roce, "ethtool/fec_uncorrectable"));
        let ber = find(&r, "pre_fec_ber");
        assert_eq!((ber.threshold, ber.measure), (1e-6, Measure::BitErrorRate));
        let e = rules(
            r#"
            [[counterDetection.counters]]
            name = "pause_victim"
            thresholdType = "delta"
            "#,
        )
        .unwrap_err();
        assert!(e.contains("pause_victim") && e.contains("expected velocity"), "{e}");
        // The ethtool counters are not files: the read layer is not asked for them.
        assert!(read_paths(&default_rules()).iter().all(|p| !p.starts_with(ETHTOOL_PREFIX)));
    }

    #[test]
    fn partial_override_keeps_other_keys() {
        let r = rules(
            r#"
            [[counterDetection.counters]]
            name = "link_error_recovery"
            threshold = 20
            "#,
        )
        .unwrap();
        let d = default_rules();
        let want = CounterRule { threshold: 20.0, threshold_set: true, ..find(&d, "link_error_recovery").clone() };
        assert_eq!(find(&r, "link_error_recovery"), &want);
        // An override that switches to delta drops the inherited unit.
        let r = rules(
            r#"
            [[counterDetection.counters]]
            name = "symbol_error"
            thresholdType = "delta"
            "#,
        )
        .unwrap();
        assert_eq!(find(&r, "symbol_error").velocity_unit, None);
    }

    #[test]
    fn section_disabled_means_no_rules_but_still_validated() {
        assert!(rules("[counterDetection]\nenabled = false\n").unwrap().is_empty());
        assert!(rules("[counterDetection]\nenabled = false\n[[counterDetection.counters]]\nname = \"x\"\n").is_err());
    }

    #[test]
    fn fortnight_names_the_entry_key_and_value() {
        let e = rules(
            r#"
            [[counterDetection.counters]]
            name = "a"
            path = "counters/a"
            thresholdType = "delta"
            threshold = 1
            [[counterDetection.counters]]
            name = "b"
            enabled = true
            [[counterDetection.counters]]
            name = "c"
            path = "counters/c"
            thresholdType = "delta"
            threshold = 1
            [[counterDetection.counters]]
            name = "symbol_error"
            velocityUnit = "fortnight"
            "#,
        )
        .unwrap_err();
        // "b" is a new counter without path: reported first.
        assert!(e.contains("counterDetection.counters[1] (name \"b\")"), "{e}");
        let e = rules(
            r#"
            [[counterDetection.counters]]
            name = "symbol_error"
            velocityUnit = "fortnight"
            "#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "counterDetection.counters[0] (name \"symbol_error\"): velocityUnit = \"fortnight\": \
             expected one of second, minute, hour"
        );
    }

    #[test]
    fn invalid_values_are_rejected_with_names() {
        let cases = [
            (
                r#"name = "x"
                   path = "counters/x"
                   thresholdType = "rate"
                   threshold = 1"#,
                r#"counterDetection.counters[0] (name "x"): thresholdType = "rate": expected one of delta, velocity"#,
            ),
            (
                r#"name = "link_downed"
                   threshold = -1"#,
                r#"counterDetection.counters[0] (name "link_downed"): threshold = -1: expected a finite number >= 0"#,
            ),
            (
                r#"name = "link_downed"
                   threshold = nan"#,
                r#"counterDetection.counters[0] (name "link_downed"): threshold = NaN: expected a finite number >= 0"#,
            ),
            (
                r#"name = "link_downed"
                   threshold = inf"#,
                r#"counterDetection.counters[0] (name "link_downed"): threshold = inf: expected a finite number >= 0"#,
            ),
            (
                r#"name = "x"
                   path = "counters/x"
                   thresholdType = "velocity"
                   threshold = 1"#,
                r#"counterDetection.counters[0] (name "x"): velocityUnit: missing (required when thresholdType = "velocity"): expected one of second, minute, hour"#,
            ),
            (
                r#"name = "carrier_changes"
                   thresholdType = "velocity""#,
                r#"counterDetection.counters[0] (name "carrier_changes"): velocityUnit: missing"#,
            ),
            (
                r#"name = "x"
                   path = "counters/x"
                   thresholdType = "delta""#,
                r#"counterDetection.counters[0] (name "x"): threshold: missing"#,
            ),
            (
                r#"name = "x"
                   thresholdType = "delta""#,
                r#"counterDetection.counters[0] (name "x"): name = "x": not a known counter (known: link_downed,"#,
            ),
            (
                r#"name = "link_downed"
                   path = """#,
                r#"counterDetection.counters[0] (name "link_downed"): path = "": expected a non-empty path"#,
            ),
            (
                r#"name = "link_downed"
                   path = "counters/{interface}/x""#,
                r#"path = "counters/{interface}/x": {interface} and {device} are only allowed"#,
            ),
            (
                r#"name = "link_downed"
                   path = "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed""#,
                "expected a path relative to the port directory",
            ),
            (
                r#"name = "link_downed"
                   path = "../../x""#,
                "'..' path components",
            ),
            (r#"threshold = 1"#, "counterDetection.counters[0]: name: missing"),
            (r#"name = """#, "expected a non-empty name"),
            (
                r#"name = "link_downed"
                   isfatal = true"#,
                r#"counterDetection.counters[0] (name "link_downed"): unknown key "isfatal": expected one of name, path, enabled, isFatal"#,
            ),
            (
                r#"name = "link_downed"
                   threshold = "ten""#,
                r#"counterDetection.counters[0] (name "link_downed"): threshold = "ten": expected a number"#,
            ),
            (
                r#"name = "link_downed"
                   enabled = "no""#,
                r#"enabled = "no": expected true or false"#,
            ),
        ];
        for (entry, want) in cases {
            let doc = format!("[[counterDetection.counters]]\n{entry}\n");
            let e = rules(&doc).unwrap_err();
            assert!(e.contains(want), "for {entry:?}\n got: {e}\nwant: {want}");
        }
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let e = rules(
            r#"
            [[counterDetection.counters]]
            name = "link_downed"
            enabled = false
            [[counterDetection.counters]]
            name = "link_downed"
            enabled = true
            "#,
        )
        .unwrap_err();
        assert!(
            e.contains(
                r#"counterDetection.counters[1] (name "link_downed"): name = "link_downed": duplicate of counterDetection.counters[0]"#
            ),
            "{e}"
        );
    }

    #[test]
    fn parse_errors_have_a_one_line_message() {
        let doc = "[[counterDetection.counters]]\nname = \"symbol_error\"\nvelocityUnit = \"fortnight\"\n";
        let e = toml::from_str::<Top>(doc).unwrap_err();
        assert_eq!(
            e.message(),
            "counterDetection.counters[0] (name \"symbol_error\"): velocityUnit = \"fortnight\": \
             expected one of second, minute, hour"
        );
    }

    #[test]
    fn unknown_section_key_is_rejected() {
        let e = parse("[counterDetection]\nenabeld = false\n").unwrap_err();
        assert!(e.contains("enabeld"), "{e}");
    }

    #[test]
    fn velocity_unit_on_delta_is_ignored_and_net_templates_accepted() {
        let r = rules(
            r#"
            [[counterDetection.counters]]
            name = "rx_crc"
            path = "/sys/class/net/{interface}/statistics/rx_crc_errors"
            thresholdType = "delta"
            threshold = 0
            velocityUnit = "second"
            "#,
        )
        .unwrap();
        let c = find(&r, "rx_crc");
        assert_eq!(c.velocity_unit, None);
        assert!(c.enabled && !c.is_fatal && c.description.is_empty());
    }
}
