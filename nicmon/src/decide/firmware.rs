//! `NICFirmwareCheck` (SPEC §1.13): the devlink health reporters of each monitored PF.
//! Pure.
//!
//! - A reporter's `error_count` is baselined when first read (a count already there is no
//!   new fault, unless the reporter is in the `error` state then); a rise afterwards is a
//!   fault, by [`REPORTER_RULES`]: `fw_fatal` → fatal `fw_fatal` (`REPLACE_VM`), `fw` →
//!   `fw_error`, `tx` → `tx_timeout`, `rx` → `rx_error` (non-fatal). A count that fell (the
//!   driver reloaded) is a new baseline.
//! - A non-fatal fault clears (healthy event, same error code) once its reporter is
//!   `healthy` and its count has not risen for [`CLEAR_AFTER`]; a firmware fatal does not
//!   clear (the node is to be replaced; the reboot's clear ends it).
//! - **One event per firmware fatal** whichever source sees it first ([`dedup_fatals`]):
//!   the kernel log's firmware-fatal lines (`health_compromised`, `fw_fatal_error`,
//!   `fw_unrecoverable`, `health_recovery_failed`) and devlink's `fw_fatal` rise are the
//!   same failure; the second to see it within `[kernelLog] dedupWindowSeconds` of the
//!   first, for the same card (PCI `domain:bus:device`), sends nothing.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::decide::roles::Classification;
use crate::model::devlink::{REPORTER_RULES, ReporterState, Reporters, rule};
use crate::model::event::{Check, Entity, HealthEvent, Stamp, Subject};
use crate::model::{Device, Snapshot};

/// How long a non-fatal fault's reporter must be healthy with no new error to clear.
pub const CLEAR_AFTER: Duration = Duration::minutes(5);

/// The kernel-log pattern ids that report a firmware fatal ([`dedup_fatals`]).
pub const KERNEL_LOG_FIRMWARE_FATALS: [&str; 4] =
    ["health_compromised", "fw_fatal_error", "fw_unrecoverable", "health_recovery_failed"];

/// The error code of devlink's firmware fatal.
pub const FW_FATAL: &str = "fw_fatal";

/// What the check carries between polls (persisted in the state file).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FirmwareState {
    /// The last `error_count` of each judged reporter, by device then reporter.
    #[serde(default)]
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
    /// The non-fatal faults raised and not cleared, by device then error code: when the
    /// count last rose.
    #[serde(default, with = "times")]
    pub raised: BTreeMap<String, BTreeMap<String, OffsetDateTime>>,
    /// The last firmware fatal sent for each card, by either source (the dedup).
    #[serde(default, with = "card_times")]
    pub last_fatal: BTreeMap<String, OffsetDateTime>,
}

impl FirmwareState {
    pub fn is_empty(&self) -> bool {
        *self == FirmwareState::default()
    }

    /// Whether `device` has a raised fault `code`.
    pub fn is_raised(&self, device: &str, code: &str) -> bool {
        self.raised.get(device).is_some_and(|m| m.contains_key(code))
    }
}

/// The monitored PFs with devlink reporters, in name order.
pub fn judged<'s>(
    snapshot: &'s Snapshot,
    roles: &BTreeMap<String, Classification>,
) -> Vec<(&'s Device, &'s Reporters)> {
    let mut out: Vec<(&Device, &Reporters)> = snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && roles.get(&d.name).is_some_and(|c| c.monitored))
        .filter_map(|d| Some((&**d, snapshot.devlink.get(d.pci_address.as_deref()?)?)))
        .collect();
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    out
}

/// Judge every monitored PF's reporters (the dedup across sources is [`dedup_fatals`]').
pub fn evaluate(
    prev: &FirmwareState,
    snapshot: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, FirmwareState) {
    let mut events = Vec::new();
    let mut next = FirmwareState { last_fatal: prev.last_fatal.clone(), ..FirmwareState::default() };
    let judged = judged(snapshot, roles);
    for (d, reporters) in &judged {
        let seen = prev.counts.get(&d.name);
        let mut raised = prev.raised.get(&d.name).cloned().unwrap_or_default();
        for r in reporters.reporters.iter() {
            let Some(rule) = rule(&r.name) else { continue };
            next.counts.entry(d.name.clone()).or_default().insert(r.name.clone(), r.error_count);
            let before = seen.and_then(|m| m.get(&r.name)).copied();
            let rose = match before {
                Some(b) => r.error_count > b,
                None => r.state == ReporterState::Error && r.error_count > 0,
            };
            let base = HealthEvent::new(Check::NICFirmwareCheck, stamp, now, "")
                .entities(vec![Entity::device(&d.name)])
                .error_code(rule.code);
            if rose {
                let from = before.map(|b| format!("{b} → ")).unwrap_or_default();
                let msg = format!(
                    "{} devlink health reporter {}: error count {from}{} (state {}, recovered {})",
                    d.name,
                    r.name,
                    r.error_count,
                    if r.state == ReporterState::Error { "error" } else { "healthy" },
                    r.recover_count
                );
                events.push(HealthEvent { message: msg, ..base.unhealthy(rule.fatal) });
                if !rule.fatal {
                    raised.insert(rule.code.to_string(), now);
                }
            } else if let Some(at) = raised.get(rule.code).copied()
                && r.state == ReporterState::Healthy
                && now - at >= CLEAR_AFTER
            {
                raised.remove(rule.code);
                let msg = format!("{} devlink health reporter {} healthy, no new error since {at}", d.name, r.name);
                events.push(HealthEvent { message: msg, ..base });
            }
        }
        if !raised.is_empty() {
            next.raised.insert(d.name.clone(), raised);
        }
    }
    // A PF not read this poll (gone, devlink failed) keeps what it had.
    for (name, counts) in &prev.counts {
        if !judged.iter().any(|(d, _)| &d.name == name) {
            next.counts.insert(name.clone(), counts.clone());
            if let Some(r) = prev.raised.get(name) {
                next.raised.insert(name.clone(), r.clone());
            }
        }
    }
    debug_assert!(REPORTER_RULES.iter().any(|r| r.code == FW_FATAL));
    (events, next)
}

/// Whether `e` reports a firmware fatal: devlink's `fw_fatal` or a kernel-log firmware fatal.
pub fn is_firmware_fatal(e: &HealthEvent) -> bool {
    if e.is_healthy || !e.is_fatal {
        return false;
    }
    let code = e.error_code.first().map(String::as_str).unwrap_or("");
    match e.check() {
        Some(Check::NICFirmwareCheck) => code == FW_FATAL,
        Some(Check::NICKernelLogCheck) => KERNEL_LOG_FIRMWARE_FATALS.contains(&code),
        _ => false,
    }
}

/// One firmware fatal per card per `window`, whichever source saw it first: drops from
/// `events` (in order: the earlier in the list wins) each firmware fatal ([`is_firmware_fatal`])
/// of a card that had one sent within `window` before `now`, and records the others in
/// `last_fatal`. `card_of`: a device's card (its name when unknown). An event of no single
/// device (the node) is kept and not recorded.
pub fn dedup_fatals(
    events: &mut Vec<HealthEvent>,
    last_fatal: &mut BTreeMap<String, OffsetDateTime>,
    card_of: impl Fn(&str) -> Option<String>,
    window: Duration,
    now: OffsetDateTime,
) {
    last_fatal.retain(|_, at| now - *at < window);
    events.retain(|e| {
        if !is_firmware_fatal(e) {
            return true;
        }
        let card = match e.subject() {
            Subject::Device(d) | Subject::Port { device: d, .. } => card_of(d).unwrap_or_else(|| d.to_string()),
            Subject::Card(c) => c.to_string(),
            Subject::Node => return true,
        };
        if last_fatal.contains_key(&card) {
            return false;
        }
        last_fatal.insert(card, now);
        true
    });
}

/// Serde of the raised faults' times (RFC 3339).
mod times {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;
    use time::OffsetDateTime;

    type Raised = BTreeMap<String, BTreeMap<String, OffsetDateTime>>;

    #[derive(Serialize, Deserialize)]
    struct At(#[serde(with = "time::serde::rfc3339")] OffsetDateTime);

    pub fn serialize<S: Serializer>(v: &Raised, s: S) -> Result<S::Ok, S::Error> {
        let m: BTreeMap<&String, BTreeMap<&String, At>> =
            v.iter().map(|(d, c)| (d, c.iter().map(|(k, t)| (k, At(*t))).collect())).collect();
        m.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Raised, D::Error> {
        let m: BTreeMap<String, BTreeMap<String, At>> = BTreeMap::deserialize(d)?;
        Ok(m.into_iter().map(|(d, c)| (d, c.into_iter().map(|(k, t)| (k, t.0)).collect())).collect())
    }
}

/// Serde of the cards' last fatal times (RFC 3339).
mod card_times {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;
    use time::OffsetDateTime;

    #[derive(Serialize, Deserialize)]
    struct At(#[serde(with = "time::serde::rfc3339")] OffsetDateTime);

    pub fn serialize<S: Serializer>(v: &BTreeMap<String, OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        v.iter().map(|(k, t)| (k, At(*t))).collect::<BTreeMap<_, _>>().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, OffsetDateTime>, D::Error> {
        Ok(BTreeMap::<String, At>::deserialize(d)?.into_iter().map(|(k, t)| (k, t.0)).collect())
    }
}

#[cfg(test)]
mod tests;
