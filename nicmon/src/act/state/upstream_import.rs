//! Import of upstream NVSentinel's old (schema-v2) state file (`reference/nvsentinel-upstream.md`
//! §6; SPEC §1.6), so that a node migrating from its `nic-health-monitor` keeps what is
//! outstanding on the platform: port states, counter snapshots and latched breaches.
//!
//! Pure: bytes in, state out; never panics (a truncated or odd file is an error, which the
//! loader treats like a corrupt one: reboot semantics).
use std::collections::BTreeMap;

use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{CheckState, State, VERSION};
use crate::decide::counters::eval::{Breach, CounterSnapshot};
use crate::decide::linkstate::{PortRecord, Reported};
use crate::model::{LinkLayer, PhysState, PortState};

/// The schema version upstream writes.
pub const UPSTREAM_VERSION: u32 = 2;

#[derive(Deserialize)]
struct V2 {
    version: u32,
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    port_states: BTreeMap<String, V2Port>,
    #[serde(default)]
    counter_snapshots: BTreeMap<String, V2Snapshot>,
    #[serde(default)]
    breach_flags: BTreeMap<String, V2Breach>,
    #[serde(default)]
    pending_baselines: BTreeMap<String, bool>,
    #[serde(default)]
    scope: Option<String>,
}

#[derive(Deserialize)]
struct V2Port {
    device: String,
    port: u32,
    #[serde(default)]
    state: String,
    #[serde(default)]
    physical_state: String,
    #[serde(default)]
    link_layer: String,
}

#[derive(Deserialize)]
struct V2Snapshot {
    value: u64,
    timestamp: String,
}

#[derive(Deserialize)]
struct V2Breach {
    breached: bool,
    check_name: String,
    is_fatal: bool,
    since: String,
}

/// What was imported from an upstream file.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub state: State,
    /// Checks whose baseline run upstream had not committed (`pending_baselines`): the
    /// baselines are still owed.
    pub pending_baselines: Vec<String>,
    /// Entries that have no nicmon counterpart (netdev-keyed counters), for the log.
    pub skipped: Vec<String>,
}

/// `4: ACTIVE` or `ACTIVE` → `ACTIVE`.
fn name_of(s: &str) -> Option<String> {
    let s = s.rsplit_once(':').map(|(_, n)| n).unwrap_or(s).trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// Upstream's link layer name, matched without regard to case (`ethernet`, `InfiniBand`).
fn link_layer_named(s: &str) -> LinkLayer {
    [LinkLayer::InfiniBand, LinkLayer::Ethernet, LinkLayer::Efa]
        .into_iter()
        .find(|l| l.name().eq_ignore_ascii_case(s))
        .unwrap_or_else(|| LinkLayer::from_name(s))
}

fn when(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// Why an upstream file could not be imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// Not upstream's schema (the parser's message).
    #[error("not an upstream v2 state file: {0}")]
    Parse(String),
    /// Upstream's schema, another version.
    #[error("unsupported state file version {0}")]
    Version(u32),
}

/// Parse an upstream v2 file. Errors say what is wrong; nothing panics.
pub fn import(bytes: &[u8]) -> Result<Imported, ImportError> {
    let v: V2 = serde_json::from_slice(bytes).map_err(|e| ImportError::Parse(e.to_string()))?;
    if v.version != UPSTREAM_VERSION {
        return Err(ImportError::Version(v.version));
    }
    let mut checks = CheckState { polls: 1, scope: v.scope.clone(), ..CheckState::default() };
    let mut skipped = Vec::new();
    for (key, p) in v.port_states {
        let state = name_of(&p.state);
        let phys_state = name_of(&p.physical_state);
        let healthy = matches!(state.as_deref(), Some("ACTIVE"))
            && (p.link_layer.eq_ignore_ascii_case("ethernet") || matches!(phys_state.as_deref(), Some("LinkUp")));
        let reported = match (healthy, state.as_deref(), phys_state.as_deref()) {
            (true, _, _) => Reported::Healthy,
            (false, Some("DOWN"), _) | (false, _, Some("Disabled")) => Reported::Fatal,
            (false, _, _) => Reported::NonFatal,
        };
        checks.links.port_states.insert(
            key,
            PortRecord {
                device: p.device,
                port: p.port,
                link_layer: link_layer_named(&p.link_layer),
                state: state.as_deref().map(PortState::from_name),
                phys_state: phys_state.as_deref().map(PhysState::from_name),
                reported,
                was_healthy: healthy,
                unhealthy_since: None,
                deferred_polls: 0,
                speed_degraded: false,
                lid: None,
                sm_lid: None,
                held_since: None,
                unknown_since: None,
                unknown_reported: false,
                flap: Default::default(),
            },
        );
    }
    let port_keyed = |key: &str| crate::decide::counters::parse_counter_key(key).is_some() && !key.starts_with("net:");
    let counters = std::sync::Arc::make_mut(&mut checks.counters);
    for (key, s) in v.counter_snapshots {
        match when(&s.timestamp) {
            Some(timestamp) if port_keyed(&key) => {
                let key: std::sync::Arc<str> = key.into();
                counters.last_values.insert(key.clone(), s.value);
                counters.counter_snapshots.insert(key, CounterSnapshot { value: s.value, timestamp });
            }
            _ => skipped.push(format!("counter_snapshots.{key}")),
        }
    }
    for (key, b) in v.breach_flags {
        match when(&b.since) {
            Some(since) if port_keyed(&key) && b.breached => {
                counters
                    .breach_flags
                    .insert(key, Breach { breached: true, check_name: b.check_name, is_fatal: b.is_fatal, since });
            }
            _ if !b.breached => {}
            _ => skipped.push(format!("breach_flags.{key}")),
        }
    }
    let pending_baselines = v.pending_baselines.into_iter().filter(|(_, owed)| *owed).map(|(c, _)| c).collect();
    let state = State { version: VERSION, boot_id: v.boot_id, checks, outbox: Default::default() };
    Ok(Imported { state, pending_baselines, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = r#"{
      "version": 2,
      "boot_id": "b-old",
      "scope": "incl=;excl=^veth.*",
      "known_devices": ["mlx5_0", "mlx5_1"],
      "chardev_issm_mode": "never",
      "port_states": {
        "mlx5_0_1": {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "physical_state": "LinkUp", "link_layer": "InfiniBand"},
        "mlx5_1_1": {"device": "mlx5_1", "port": 1, "state": "DOWN", "physical_state": "Disabled", "link_layer": "InfiniBand"}
      },
      "counter_snapshots": {
        "mlx5_0:1:link_downed": {"value": 3, "timestamp": "2026-01-01T00:00:00.123456789Z"},
        "net:ib0:carrier_changes": {"value": 7, "timestamp": "2026-01-01T00:00:00Z"}
      },
      "breach_flags": {
        "mlx5_0:1:link_downed": {"breached": true, "check_name": "InfiniBandDegradationCheck", "is_fatal": true,
                                 "since": "2026-01-01T00:00:00Z", "device": "mlx5_0", "port": 1}
      },
      "pending_baselines": {"InfiniBandStateCheck": true}
    }"#;

    #[test]
    fn imports_ports_snapshots_breaches_and_pending_baselines() {
        let i = import(SAMPLE.as_bytes()).unwrap();
        assert_eq!(i.state.boot_id.as_deref(), Some("b-old"));
        let ports = &i.state.checks.links.port_states;
        assert_eq!(ports["mlx5_0_1"].reported, Reported::Healthy);
        assert_eq!(ports["mlx5_1_1"].reported, Reported::Fatal);
        assert_eq!(ports["mlx5_1_1"].state, Some(PortState::Down));
        let c = &i.state.checks.counters;
        assert_eq!(c.counter_snapshots["mlx5_0:1:link_downed"].value, 3);
        assert!(c.is_breached("mlx5_0:1:link_downed"));
        assert_eq!(i.pending_baselines, ["InfiniBandStateCheck"]);
        assert_eq!(i.skipped, ["counter_snapshots.net:ib0:carrier_changes"]);
    }

    #[test]
    fn truncated_or_other_versions_are_errors() {
        for cut in [0, 1, 10, SAMPLE.len() / 2, SAMPLE.len() - 2] {
            assert!(import(&SAMPLE.as_bytes()[..cut]).is_err(), "cut at {cut}");
        }
        assert!(import(br#"{"version": 3}"#).unwrap_err().to_string().contains("version 3"));
        assert!(import(br#"{"version": 2}"#).is_ok());
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..2000) {
            let _ = import(&bytes);
            let _ = import(&SAMPLE.as_bytes()[..cut.min(SAMPLE.len())]);
        }
    }
}
