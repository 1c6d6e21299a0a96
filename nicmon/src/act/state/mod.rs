//! What nicmon remembers between polls and across restarts within one boot (SPEC §1.6,
//! 001 §6.5–6.6): the checks' state ([`CheckState`], decide's input and output) and the
//! outbox (act's data), persisted together as one file.
//!
//! - `file.rs`: nicmon's own state file — load, atomic save, the write policy;
//! - `upstream_import.rs`: importing upstream NVSentinel's old (schema-v2) state file.
use serde::{Deserialize, Serialize};

use crate::act::outbox::Outbox;
pub use crate::decide::state::CheckState;

pub mod file;
pub mod upstream_import;

pub use file::Loaded;

/// Version of the file format.
pub const VERSION: u32 = 1;

/// Default location in the DaemonSet (a hostPath directory).
pub const DEFAULT_PATH: &str = "/var/run/nic_health_monitor/state.json";

/// Everything persisted. Field names are the file's JSON keys; the flattened parts keep
/// the file's flat shape (`polls`, `port_states`, ..., `outbox`, `next_batch_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
