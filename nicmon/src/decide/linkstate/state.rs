//! What the state checks remember between polls (persisted in the state file under
//! `port_states`, `known_devices` and `cards_below_mode`).
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::flap::FlapState;
use crate::model::{LinkLayer, PhysState, PortState};

/// What was last reported to the platform for a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reported {
    /// Nothing reported: an unhealthy port treated as uncabled (never healthy this boot).
    Nothing,
    Healthy,
    NonFatal,
    Fatal,
}

/// One port's memory (key `<device>_<port>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortRecord {
    pub device: String,
    pub port: u32,
    /// Persisted by name (`"InfiniBand"`), like the states below.
    #[serde(with = "by_name")]
    pub link_layer: LinkLayer,
    /// The last state seen, persisted by name (`"ACTIVE"`, `"LinkUp"`); a name this version
    /// does not know (an older or newer file) loads as `Unknown`.
    #[serde(with = "by_name::option")]
    pub state: Option<PortState>,
    #[serde(with = "by_name::option")]
    pub phys_state: Option<PhysState>,
    pub reported: Reported,
    /// The port was healthy at some point in this boot (only such ports escalate by time).
    pub was_healthy: bool,
    /// Since when it has been unhealthy (after having been healthy).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub unhealthy_since: Option<OffsetDateTime>,
    /// Polls an unhealthy port has been deferred as "maybe uncabled" (lesson 11: ≤ 3).
    #[serde(default)]
    pub deferred_polls: u32,
    #[serde(default)]
    pub speed_degraded: bool,
    #[serde(default)]
    pub lid: Option<u32>,
    #[serde(default)]
    pub sm_lid: Option<u32>,
    /// Since when its state or phys_state has been unknown (no decision), if it is now.
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub unknown_since: Option<OffsetDateTime>,
    /// A non-fatal "unknown" event was sent for the current unknown episode (its end sends
    /// a healthy one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown_reported: bool,
    /// Since when a healthy→unhealthy transition has been held (`portStateHoldDown`).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub held_since: Option<OffsetDateTime>,
    /// Flap damping: recent unhealthy transitions, the hold and its settle clock.
    #[serde(default, skip_serializing_if = "FlapState::is_quiet")]
    pub flap: FlapState,
}

/// A monitored device seen in this boot (disappearance detection across restarts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownDevice {
    pub pci_address: Option<String>,
    pub card: Option<String>,
    pub link_layer: String,
    /// Consecutive polls it was absent from `class/infiniband`.
    pub misses: u32,
    /// A disappearance event was sent (a reappearance then sends a healthy event).
    pub reported_missing: bool,
    /// Its netdev when last seen (the kernel may announce the loss by that name).
    #[serde(default)]
    pub netdev: Option<String>,
    /// A software RDMA device (rxe, siw): its disappearance is not fatal.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub software: bool,
}

/// The state checks' memory.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LinkState {
    #[serde(default)]
    pub port_states: BTreeMap<String, PortRecord>,
    #[serde(default)]
    pub known_devices: BTreeMap<String, KnownDevice>,
    /// Cards with a card-level (homogeneity) fatal event outstanding.
    #[serde(default)]
    pub cards_below_mode: BTreeSet<String>,
}

/// The key of a port in [`LinkState::port_states`]: `mlx5_0_1`.
pub fn port_key(dev: &str, port: u32) -> String {
    let mut key = String::new();
    write_port_key(&mut key, dev, port);
    key
}

/// [`port_key`] into `out` (cleared first): a poll looks every port up.
pub fn write_port_key(out: &mut String, dev: &str, port: u32) {
    use std::fmt::Write;
    out.clear();
    let _ = write!(out, "{dev}_{port}");
}

/// A value persisted as its kernel name (`"ACTIVE"`), the state file's format since its
/// first version.
pub trait Named: Sized {
    fn name(&self) -> &str;
    fn from_name(name: &str) -> Self;
}

impl Named for LinkLayer {
    fn name(&self) -> &str {
        LinkLayer::name(self)
    }
    fn from_name(name: &str) -> Self {
        LinkLayer::from_name(name)
    }
}

impl Named for PortState {
    fn name(&self) -> &str {
        PortState::name(self)
    }
    fn from_name(name: &str) -> Self {
        PortState::from_name(name)
    }
}

impl Named for PhysState {
    fn name(&self) -> &str {
        PhysState::name(self)
    }
    fn from_name(name: &str) -> Self {
        PhysState::from_name(name)
    }
}

/// `#[serde(with = "by_name")]` for a [`Named`] value (and `by_name::option`).
mod by_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Named;

    pub fn serialize<T: Named, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        Ok(T::from_name(&String::deserialize(d)?))
    }

    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        use super::Named;

        pub fn serialize<T: Named, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(v) => s.serialize_some(v.name()),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
            Ok(Option::<String>::deserialize(d)?.map(|n| T::from_name(&n)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the state file has held it since its first version.
    const OLD: &str = r#"{"device":"mlx5_0","port":1,"link_layer":"InfiniBand","state":"ACTIVE",
        "phys_state":"LinkUp","reported":"healthy","was_healthy":true,"unhealthy_since":null,
        "deferred_polls":0,"speed_degraded":false,"lid":null,"sm_lid":null,"held_since":null}"#;

    #[test]
    fn typed_records_keep_the_persisted_strings() {
        let r: PortRecord = serde_json::from_str(OLD).unwrap();
        assert_eq!(r.link_layer, LinkLayer::InfiniBand);
        assert_eq!(r.state, Some(PortState::Active));
        assert_eq!(r.phys_state, Some(PhysState::LinkUp));
        let back: serde_json::Value = serde_json::to_value(&r).unwrap();
        let old: serde_json::Value = serde_json::from_str(OLD).unwrap();
        assert_eq!(back, old, "the same JSON, string for string");
        for (ll, st, ph) in [
            ("Ethernet", "DOWN", "Disabled"),
            ("EFA", "ACTIVE_DEFER", "Phy Test"),
            ("InfiniBand", "INIT", "PortConfigurationTraining"),
            ("InfiniBand", "ARMED", "LinkErrorRecovery"),
            ("InfiniBand", "NOP", "Sleep"),
        ] {
            let json = OLD.replace("InfiniBand", ll).replace("\"ACTIVE\"", &format!("{st:?}")).replace("LinkUp", ph);
            let r: PortRecord = serde_json::from_str(&json).unwrap();
            assert!(!matches!(r.link_layer, LinkLayer::Unknown(_)), "{ll}");
            assert!(!matches!(r.state, Some(PortState::Unknown(_))), "{st}");
            assert!(!matches!(r.phys_state, Some(PhysState::Unknown(_))), "{ph}");
            assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::from_str::<serde_json::Value>(&json).unwrap());
        }
    }

    #[test]
    fn unknown_strings_from_old_files_still_load() {
        let json = OLD.replace("InfiniBand", "Omni-Path").replace("\"ACTIVE\"", "\"4: ACTIVE\"").replace("LinkUp", "");
        let r: PortRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(r.link_layer, LinkLayer::Unknown("Omni-Path".into()));
        assert_eq!(r.state, Some(PortState::Unknown("4: ACTIVE".into())));
        assert_eq!(r.phys_state, Some(PhysState::Unknown(String::new())));
        // And are written back as they were.
        assert_eq!(serde_json::to_value(&r).unwrap(), serde_json::from_str::<serde_json::Value>(&json).unwrap());
        let none = OLD.replace("\"ACTIVE\"", "null");
        assert_eq!(serde_json::from_str::<PortRecord>(&none).unwrap().state, None);
    }
}
