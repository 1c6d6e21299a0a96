//! The persistent state file (SPEC §1.6, 001 §6.5–6.6): what nicmon remembers between
//! polls and across restarts within one boot.
//!
//! Written atomically (temp file in the same directory, fsync, rename, fsync of the
//! directory) and only when its bytes changed. A missing or corrupt file means a fresh start
//! with a warning; never a crash.
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::chardev::CharDevState;
use crate::counters::CounterState;
use crate::event::{Check, HealthEvent};
use crate::kmsg::KmsgState;

/// Version of the file format.
pub const VERSION: u32 = 1;

/// Default location in the DaemonSet (a hostPath directory).
pub const DEFAULT_PATH: &str = "/var/run/nic_health_monitor/state.json";

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

/// Events waiting for the connector, per check, in order (the transactional outbox).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingBatch {
    /// Increasing id: acknowledgements name it.
    pub id: u64,
    pub check: Check,
    pub events: Vec<HealthEvent>,
}

/// Everything persisted. Field names are the file's JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    pub boot_id: Option<String>,
    /// Polls evaluated in this boot (0 = no usable previous state).
    #[serde(default)]
    pub polls: u64,
    #[serde(default)]
    pub port_states: BTreeMap<String, PortRecord>,
    #[serde(default)]
    pub known_devices: BTreeMap<String, KnownDevice>,
    /// Cards with a card-level (homogeneity) fatal event outstanding.
    #[serde(default)]
    pub cards_below_mode: BTreeSet<String>,
    /// Counter snapshots, breach and saturation flags (the counter check's state).
    #[serde(default)]
    pub counters: CounterState,
    /// Kernel log cursor and dedup memory.
    #[serde(default)]
    pub kmsg: KmsgState,
    /// Character-device miss counts, latches and the issm mode they were made under.
    #[serde(default)]
    pub char_devices: CharDevState,
    /// sysfs files whose read failed with EINVAL in this boot: never read again.
    #[serde(default)]
    pub einval: Vec<String>,
    /// Batches not yet accepted by the connector, oldest first.
    #[serde(default)]
    pub outbox: Vec<PendingBatch>,
    /// The id of the last batch queued.
    #[serde(default)]
    pub next_batch_id: u64,
}

impl State {
    pub fn fresh(boot_id: Option<String>) -> State {
        State {
            version: VERSION,
            boot_id,
            polls: 0,
            port_states: BTreeMap::new(),
            known_devices: BTreeMap::new(),
            cards_below_mode: BTreeSet::new(),
            counters: CounterState::default(),
            kmsg: KmsgState::default(),
            char_devices: CharDevState::default(),
            einval: Vec::new(),
            outbox: Vec::new(),
            next_batch_id: 0,
        }
    }
}

/// How the previous state was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// Same boot: resume with full context.
    Resumed,
    /// No file: first start on this node.
    Missing,
    /// The file was unusable: fresh start (the reason is logged).
    Corrupt(String),
    /// The boot ID changed: the host rebooted. State from the previous boot is discarded.
    Rebooted { previous: Option<String> },
}

/// The largest state file nicmon reads back; a bigger one is treated as corrupt.
pub const MAX_BYTES: usize = 16 << 20;

/// Parse a state file's bytes; never panics.
pub fn parse(bytes: &[u8]) -> Result<State, String> {
    let s: State = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if s.version != VERSION {
        return Err(format!("unsupported state file version {}", s.version));
    }
    Ok(s)
}

/// Load the state for this boot. Missing/corrupt → fresh; boot change → fresh + `Rebooted`.
/// The outbox survives a reboot: events not yet delivered are still owed to the platform.
pub fn load(path: &Path, boot_id: Option<&str>) -> (State, Loaded) {
    remove_stale_temp_files(path);
    let fresh = || State::fresh(boot_id.map(str::to_string));
    let bytes = match crate::host::read_file(path, MAX_BYTES) {
        Ok(b) => b,
        Err(crate::host::ReadError::Missing) => return (fresh(), Loaded::Missing),
        Err(e) => {
            return (fresh(), Loaded::Corrupt(format!("state file {}: cannot read: {e}", path.display())));
        }
    };
    match parse(&bytes) {
        Err(e) => (fresh(), Loaded::Corrupt(format!("state file {}: {e}", path.display()))),
        Ok(prev) if prev.boot_id.as_deref() != boot_id => {
            let mut s = fresh();
            s.outbox = prev.outbox;
            s.next_batch_id = prev.next_batch_id;
            (s, Loaded::Rebooted { previous: prev.boot_id })
        }
        Ok(prev) => (prev, Loaded::Resumed),
    }
}

const TEMP_SUFFIX: &str = ".tmp";

/// Temp files of `save` are `.<state file name>.<random>.tmp` beside the state file.
fn temp_prefix(path: &Path) -> String {
    format!(".{}.", path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
}

/// Remove temp files a crash during `save` left beside the state file (called at start).
pub fn remove_stale_temp_files(path: &Path) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let prefix = temp_prefix(path);
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(TEMP_SUFFIX) && entry.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed a temp file left by an interrupted save")
                }
                Err(e) => tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a stale temp file"),
            }
        }
    }
}

/// The bytes nicmon writes for `state`.
pub fn to_bytes(state: &State) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(state).unwrap_or_default();
    v.push(b'\n');
    v
}

/// Write `state` atomically: a temp file in the same directory, fsync, rename over the old
/// file, fsync the directory. A crash at any point leaves either the old or the new file.
/// Returns false when the bytes on disk were already the same (nothing written).
pub fn save(path: &Path, state: &State) -> std::io::Result<bool> {
    let bytes = to_bytes(state);
    if crate::host::read_file(path, MAX_BYTES).map(|old| old == bytes).unwrap_or(false) {
        return Ok(false);
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(&temp_prefix(path)).suffix(TEMP_SUFFIX).tempfile_in(dir)?;
    tmp.write_all(&bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip_and_boot_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s/state.json");
        let mut s = State::fresh(Some("b1".into()));
        s.polls = 3;
        s.einval.push("class/infiniband/mlx5_0/ports/1/counters/x".into());
        assert!(save(&p, &s).unwrap());
        assert!(!save(&p, &s).unwrap(), "unchanged state is not rewritten");
        let (l, how) = load(&p, Some("b1"));
        assert_eq!(how, Loaded::Resumed);
        assert_eq!(l, s);
        let (l, how) = load(&p, Some("b2"));
        assert_eq!(how, Loaded::Rebooted { previous: Some("b1".into()) });
        assert_eq!(l.polls, 0);
        assert!(l.einval.is_empty());
        std::fs::write(&p, "{\"version\":1,").unwrap();
        assert!(matches!(load(&p, Some("b1")).1, Loaded::Corrupt(_)));
        assert_eq!(load(&dir.path().join("none.json"), None).1, Loaded::Missing);
    }

    #[test]
    fn stale_temp_files_are_removed_at_load_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        save(&p, &State::fresh(None)).unwrap();
        std::fs::write(dir.path().join(".state.json.Ab12Cd.tmp"), "{\"ver").unwrap();
        std::fs::write(dir.path().join(".other.json.Ab12Cd.tmp"), "x").unwrap();
        std::fs::write(dir.path().join("notes.tmp"), "x").unwrap();
        let (_, how) = load(&p, None);
        assert_eq!(how, Loaded::Resumed);
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        left.sort();
        assert_eq!(left, vec![".other.json.Ab12Cd.tmp", "notes.tmp", "state.json"]);
    }

    #[test]
    fn an_unreadable_state_file_is_a_fresh_start_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let (s, how) = load(&p, Some("b"));
        assert!(matches!(&how, Loaded::Corrupt(w) if w.contains("not a regular file")), "{how:?}");
        assert_eq!(s, State::fresh(Some("b".into())));
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, vec![b' '; MAX_BYTES + 1]).unwrap();
        assert!(matches!(load(&p, None).1, Loaded::Corrupt(w) if w.contains("larger than")));
        // Saving replaces whatever is there.
        assert!(save(&p, &s).unwrap());
        assert_eq!(load(&p, Some("b")).1, Loaded::Resumed);
    }

    proptest! {
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn parser_never_panics_on_json_shaped_input(s in "\\{\"version\":1(,\"[a-z_]{1,12}\":(null|1|\"x\"|\\[\\]|\\{\\}|true))*\\}") {
            let _ = parse(s.as_bytes());
        }
    }
}
