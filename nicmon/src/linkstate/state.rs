//! What the state checks remember between polls (persisted in the state file under
//! `port_states`, `known_devices` and `cards_below_mode`).
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::flap::FlapState;

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
    pub link_layer: String,
    /// Raw names of the last state seen (`ACTIVE`, `LinkUp`).
    pub state: Option<String>,
    pub phys_state: Option<String>,
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
    format!("{dev}_{port}")
}
