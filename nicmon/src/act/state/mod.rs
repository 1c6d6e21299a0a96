//! What nicmon remembers between polls and across restarts within one boot (SPEC §1.6,
//! 001 §6.5–6.6): the checks' state ([`CheckState`], decide's input and output) and the
//! outbox (act's data), persisted together as one file.
//!
//! - `file.rs`: nicmon's own state file — load, atomic save, the write policy;
//! - `upstream_import.rs`: importing upstream NVSentinel's old (schema-v2) state file.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::act::outbox::{Outbox, PendingBatch};
use crate::decide::chardev::CharDevState;
use crate::decide::counters::CounterState;
use crate::decide::kmsg::KmsgState;
use crate::decide::linkstate::{KnownDevice, LinkState, PortRecord};
use crate::decide::pcie::check::PcieState;
pub use crate::decide::state::CheckState;
use crate::model::history::History;

pub mod file;
pub mod upstream_import;

pub use file::Loaded;

/// Version of the file format.
pub const VERSION: u32 = 1;

/// Default location in the DaemonSet (a hostPath directory).
pub const DEFAULT_PATH: &str = "/var/run/nic_health_monitor/state.json";

/// Everything persisted. Field names are the file's JSON keys; the flattened parts keep
/// the file's flat shape (`polls`, `port_states`, ..., `outbox`, `next_batch_id`). Read
/// through [`Flat`]: the same keys, deserialized straight into their types (serde buffers
/// a flattened struct's input as a tree of values first: several times the file's size).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "Flat")]
pub struct State {
    pub version: u32,
    pub boot_id: Option<String>,
    #[serde(flatten)]
    pub checks: CheckState,
    /// Batches not yet accepted by the connector (see [`crate::act::outbox`]).
    #[serde(flatten)]
    pub outbox: Outbox,
}

impl State {
    pub fn fresh(boot_id: Option<String>) -> State {
        State { version: VERSION, boot_id, checks: CheckState::default(), outbox: Outbox::default() }
    }
}

/// The state file's keys, as [`State`] and its flattened parts ([`CheckState`], its
/// [`LinkState`], [`Outbox`]) write them, with their defaults. The conversion names every
/// field of each part: a field added to one of them must be added here.
#[derive(Deserialize)]
struct Flat {
    version: u32,
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    polls: u64,
    #[serde(default)]
    port_states: BTreeMap<String, PortRecord>,
    #[serde(default)]
    known_devices: BTreeMap<String, KnownDevice>,
    #[serde(default)]
    cards_below_mode: BTreeSet<String>,
    #[serde(default)]
    counters: Arc<CounterState>,
    #[serde(default)]
    kmsg: Arc<KmsgState>,
    #[serde(default)]
    char_devices: Arc<CharDevState>,
    #[serde(default)]
    pcie: Arc<PcieState>,
    #[serde(default)]
    thermal: crate::decide::thermal::ThermalState,
    #[serde(default)]
    optics: crate::decide::optics::OpticsState,
    #[serde(default)]
    firmware: crate::decide::firmware::FirmwareState,
    #[serde(default)]
    einval: BTreeSet<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    history: History,
    #[serde(default)]
    outbox: Vec<Arc<PendingBatch>>,
    #[serde(default)]
    next_batch_id: u64,
}

impl From<Flat> for State {
    fn from(f: Flat) -> State {
        let links = LinkState {
            port_states: f.port_states,
            known_devices: f.known_devices,
            cards_below_mode: f.cards_below_mode,
        };
        let checks = CheckState {
            polls: f.polls,
            links,
            counters: f.counters,
            kmsg: f.kmsg,
            char_devices: f.char_devices,
            pcie: f.pcie,
            thermal: f.thermal,
            optics: f.optics,
            firmware: f.firmware,
            einval: f.einval,
            scope: f.scope,
            first_poll_deferrals: 0,
            history: f.history,
        };
        State { version: f.version, boot_id: f.boot_id, checks, outbox: Outbox::from_parts(f.outbox, f.next_batch_id) }
    }
}
