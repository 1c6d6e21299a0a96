//! nicmon's own state file: load, save and when to write.
//!
//! Written atomically (temp file in the same directory, fsync, rename, fsync of the
//! directory) and only when its bytes changed. A missing or corrupt file means a fresh start
//! with a warning; never a crash. A file upstream NVSentinel wrote is imported
//! ([`super::upstream_import`]).
use std::io::Write;
use std::path::{Path, PathBuf};

use super::upstream_import::ImportError;
use super::{CheckState, State, VERSION};
use crate::decide::counters::CounterState;
use crate::read::host::ReadError;

/// The largest state file nicmon reads back; a bigger one is treated as corrupt.
pub const MAX_BYTES: usize = 16 << 20;

/// How the previous state was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// Same boot: resume with full context.
    Resumed,
    /// No file. `reboot`: treated as a reboot (the daemon, as upstream NVSentinel does: a
    /// node whose state lived on tmpfs has lost what the platform still holds, so the first
    /// poll sends the clear-all and baselines); `false`: a plain first start (`nicmon check`).
    Missing { reboot: bool },
    /// The file was unusable: fresh start (the reason is logged).
    Corrupt(LoadError),
    /// The boot ID changed: the host rebooted. State from the previous boot is discarded.
    Rebooted { previous: Option<String> },
    /// Upstream NVSentinel's schema-v2 file of this boot was imported (port states, counter
    /// snapshots, latched breaches). `baselines_owed`: upstream had not committed a baseline
    /// run (`pending_baselines`), so the clear-all and baselines are sent now.
    Imported { baselines_owed: bool },
}

impl Loaded {
    /// Whether the first poll runs the reboot baseline (clear-all, then healthy baselines):
    /// after a reboot, a missing file in the daemon, a corrupt file (nothing is known of what the platform holds, as
    /// upstream does) and baselines an imported upstream file still owed.
    pub fn owes_baselines(&self) -> bool {
        matches!(
            self,
            Loaded::Rebooted { .. }
                | Loaded::Corrupt(_)
                | Loaded::Imported { baselines_owed: true }
                | Loaded::Missing { reboot: true }
        )
    }
}

/// Why a state file could not be used: the file, and what was wrong with it. The loader
/// then starts fresh ([`Loaded::Corrupt`]) and says this once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("state file {}: {kind}", path.display())]
pub struct LoadError {
    pub path: PathBuf,
    pub kind: LoadErrorKind,
}

/// What was wrong with a state file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadErrorKind {
    /// The read failed: unreadable, not a regular file, too large, stuck.
    #[error("cannot read: {0}")]
    Read(ReadError),
    /// Not nicmon's format (the parser's message).
    #[error("{0}")]
    Parse(String),
    /// nicmon's format, another version.
    #[error("unsupported state file version {0}")]
    Version(u32),
    /// It says it is upstream's schema v2, and the import failed.
    #[error(transparent)]
    Upstream(#[from] ImportError),
}

/// Parse a state file's bytes; never panics.
pub fn parse(bytes: &[u8]) -> Result<State, LoadErrorKind> {
    versioned(serde_json::from_slice(bytes).map_err(|e| LoadErrorKind::Parse(e.to_string()))?)
}

/// A state file's contents that carry the file's version.
trait Versioned {
    fn version(&self) -> u32;
}

impl Versioned for State {
    fn version(&self) -> u32 {
        self.version
    }
}

/// `s` if it is of nicmon's version.
fn versioned<T: Versioned>(s: T) -> Result<T, LoadErrorKind> {
    match s.version() {
        VERSION => Ok(s),
        v => Err(LoadErrorKind::Version(v)),
    }
}

/// The file at `path` parsed as it is read ([`crate::read::host::stream_file`]: at most
/// [`MAX_BYTES`], never held whole): `Err` when it cannot be read, else what parsing made
/// of it. Never panics.
fn stream<T: serde::de::DeserializeOwned + Versioned>(path: &Path) -> Result<Result<T, LoadErrorKind>, ReadError> {
    let mut file = crate::read::host::stream_file(path, MAX_BYTES)?;
    let parsed = serde_json::from_reader(std::io::BufReader::with_capacity(16 << 10, &mut file));
    if let Some(e) = file.failed.take() {
        return Err(e);
    }
    Ok(parsed.map_err(|e| LoadErrorKind::Parse(e.to_string())).and_then(versioned))
}

/// Only the port history of a state file (`nicmon history`): the other keys are skipped,
/// not built.
#[derive(serde::Deserialize)]
struct HistoryOnly {
    version: u32,
    #[serde(default)]
    history: crate::model::history::History,
}

impl Versioned for HistoryOnly {
    fn version(&self) -> u32 {
        self.version
    }
}

/// The port history of the state file at `path` (`nicmon history`), bounded as it is
/// loaded ([`crate::model::history::History`]), the file streamed as [`load`] streams it.
pub fn read_history(path: &Path) -> Result<crate::model::history::History, LoadErrorKind> {
    match stream::<HistoryOnly>(path) {
        Ok(parsed) => parsed.map(|h| h.history),
        Err(e) => Err(LoadErrorKind::Read(e)),
    }
}

/// The file at `path` as upstream's schema-v2 state file, once it failed to parse as
/// nicmon's (`own`: why): the state and whether baselines are owed, or the error to report.
fn import_upstream(path: &Path, own: LoadErrorKind) -> Result<(State, Option<bool>), LoadErrorKind> {
    let Ok(bytes) = crate::read::host::read_file(path, MAX_BYTES) else { return Err(own) };
    match super::upstream_import::import(&bytes) {
        Ok(i) => {
            for s in &i.skipped {
                tracing::info!(entry = %s, "upstream state file: entry with no nicmon counterpart not imported");
            }
            Ok((i.state, Some(!i.pending_baselines.is_empty())))
        }
        // Not a v2 file either: say what is wrong with it as nicmon's own format, unless it
        // says it is version 2.
        Err(v2) if bytes.windows(12).any(|w| w == b"\"version\": 2" || w.starts_with(b"\"version\":2")) => {
            Err(LoadErrorKind::Upstream(v2))
        }
        Err(_) => Err(own),
    }
}

/// Load the state for this boot. Missing/corrupt → fresh; boot change → fresh + `Rebooted`.
/// The outbox survives a reboot: events not yet delivered are still owed to the platform.
/// The file is parsed as it is read: its text is never held whole beside the state.
pub fn load(path: &Path, boot_id: Option<&str>) -> (State, Loaded) {
    remove_stale_temp_files(path);
    let fresh = || State::fresh(boot_id.map(str::to_string));
    let corrupt = |kind| Loaded::Corrupt(LoadError { path: path.to_path_buf(), kind });
    let parsed = match stream::<State>(path) {
        Ok(Ok(s)) => Ok((s, None)),
        Ok(Err(own)) => import_upstream(path, own),
        Err(ReadError::Missing) => return (fresh(), Loaded::Missing { reboot: false }),
        Err(e) => return (fresh(), corrupt(LoadErrorKind::Read(e))),
    };
    match parsed {
        Err(kind) => (fresh(), corrupt(kind)),
        Ok((prev, _)) if prev.boot_id.as_deref() != boot_id => {
            let mut s = fresh();
            s.outbox = prev.outbox;
            s.checks.history = prev.checks.history;
            (s, Loaded::Rebooted { previous: prev.boot_id })
        }
        Ok((prev, Some(baselines_owed))) => {
            let fresh_owed = || {
                let mut s = fresh();
                s.checks = CheckState { counters: prev.checks.counters.clone(), ..CheckState::default() };
                s
            };
            match baselines_owed {
                // Owed baselines: start the state checks over (they baseline), keep the counters.
                true => (fresh_owed(), Loaded::Imported { baselines_owed }),
                false => (prev, Loaded::Imported { baselines_owed }),
            }
        }
        Ok((prev, None)) => (prev, Loaded::Resumed),
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
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new().prefix(&temp_prefix(path)).suffix(TEMP_SUFFIX).tempfile_in(dir)?;
    // Streamed into the temp file and compared with the old file as it is written: a state
    // of tens of thousands of events (a reboot's baselines on a node of many ports) is
    // never held whole in memory, as text or as the old file's bytes.
    let tee = Tee { new: tmp.as_file_mut(), old: open_regular(path), same: true };
    let mut out = std::io::BufWriter::with_capacity(64 << 10, tee);
    serde_json::to_writer_pretty(&mut out, state)?;
    out.write_all(b"\n")?;
    if out.into_inner().map_err(std::io::IntoInnerError::into_error)?.finish() {
        return Ok(false);
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(true)
}

/// `path` opened for reading if it is a regular file (never waiting on a FIFO).
fn open_regular(path: &Path) -> Option<std::io::BufReader<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
    file.metadata().ok().filter(|m| m.is_file())?;
    Some(std::io::BufReader::new(file))
}

/// Writes the new state file and compares it, as it goes, with the old one.
struct Tee<W: Write> {
    new: W,
    old: Option<std::io::BufReader<std::fs::File>>,
    /// Every byte written so far matched the old file's.
    same: bool,
}

impl<W: Write> Tee<W> {
    /// Whether the old file held exactly what was written.
    fn finish(mut self) -> bool {
        let mut rest = [0u8; 1];
        self.same && self.old.as_mut().is_some_and(|old| matches!(std::io::Read::read(old, &mut rest), Ok(0)))
    }
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.new.write(buf)?;
        let mut theirs = [0u8; 4096];
        for ours in buf[..n].chunks(theirs.len()) {
            let theirs = &mut theirs[..ours.len()];
            self.same = self.same
                && self
                    .old
                    .as_mut()
                    .is_some_and(|old| std::io::Read::read_exact(old, theirs).is_ok() && theirs == ours);
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.new.flush()
    }
}

/// How long a change confined to the state's volatile parts (the poll count past the first
/// poll, the timestamps of counter snapshots whose value did not move) may stay unwritten.
pub const VOLATILE_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// When the daemon writes the state file (SPEC §1.6: only on change). A change to anything
/// the checks decide on or the outbox holds is written at once; a change only to the
/// volatile parts (see [`VOLATILE_REFRESH`]) at most once per refresh period — so a steady
/// node writes at most once a minute, not once a poll. Losing a volatile part in a crash
/// changes no detection: the first poll is still told from later ones, and a counter
/// snapshot kept with its value only measures its next window from an earlier instant.
pub struct Writer {
    path: std::path::PathBuf,
    /// What was last written, with the volatile parts settled ([`settled`]).
    written: Option<Settled>,
    /// A writer told of every change of the checks' state ([`Writer::told`]) keeps no copy
    /// of what it wrote: only the outbox's ids, and whether the checks changed since.
    told: Option<Told>,
    written_at: Option<std::time::Instant>,
    /// Files written by this writer.
    pub writes: u64,
}

/// What a told writer knows of what it wrote ([`Writer::told`]).
#[derive(Debug, Default)]
struct Told {
    /// The outbox's ids written (`None`: nothing written yet).
    outbox: Option<crate::act::outbox::OutboxIds>,
    /// The checks' state changed beyond its volatile parts since it was written.
    changed: bool,
}

/// A state without its volatile parts, as [`Writer`] remembers what it wrote: the outbox
/// by its batch ids ([`Outbox::ids`]: the events are not copied, a reboot's baselines on a
/// node of many ports are tens of thousands).
#[derive(Debug, PartialEq)]
struct Settled {
    /// The state with an empty outbox.
    state: State,
    outbox: crate::act::outbox::OutboxIds,
}

/// `state` without its volatile parts: the poll count capped at 1, counter snapshot
/// timestamps cleared (their values stay: a moved value is a change).
fn settled(state: &State) -> Settled {
    let State { version, boot_id, checks, outbox } = state;
    let mut s = State {
        version: *version,
        boot_id: boot_id.clone(),
        checks: checks.clone(),
        outbox: crate::act::outbox::Outbox::default(),
    };
    s.checks.polls = s.checks.polls.min(1);
    let snapshots = std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.values_mut();
    for snap in
        snapshots.chain(std::sync::Arc::make_mut(&mut s.checks.pcie).aer.counters.counter_snapshots.values_mut())
    {
        snap.timestamp = time::OffsetDateTime::UNIX_EPOCH;
    }
    Settled { state: s, outbox: outbox.ids() }
}

/// Whether `settled(state) == written`, without making `settled(state)` (a poll's state
/// is compared every second; it is written about once a minute). Every field is named, so
/// a field added to the state must be added here.
fn settles_to(state: &State, written: &Settled) -> bool {
    let State { version, boot_id, checks, outbox } = state;
    let (w, written_outbox) = (&written.state.checks, &written.outbox);
    let written = &written.state;
    *version == written.version
        && *boot_id == written.boot_id
        && outbox.has_ids(written_outbox)
        && same_but_volatile(checks, w)
}

/// Whether two checks' states differ in their volatile parts only (see [`settled`]). Every
/// field is named, so a field added to the state must be added here.
pub fn same_but_volatile(checks: &CheckState, w: &CheckState) -> bool {
    let CheckState {
        polls,
        links,
        counters,
        kmsg,
        char_devices,
        pcie,
        thermal,
        optics,
        firmware,
        einval,
        scope,
        first_poll_deferrals,
        history,
    } = checks;
    (*polls).min(1) == w.polls.min(1)
        && *links == w.links
        && *kmsg == w.kmsg
        && *char_devices == w.char_devices
        && *einval == w.einval
        && *scope == w.scope
        && *first_poll_deferrals == w.first_poll_deferrals
        && *history == w.history
        && *thermal == w.thermal
        && *optics == w.optics
        && *firmware == w.firmware
        && counters_settle_to(counters, &w.counters)
        && pcie.link == w.pcie.link
        && pcie.aer.window_bits == w.pcie.aer.window_bits
        && pcie.aer.unavailable == w.pcie.aer.unavailable
        && counters_settle_to(&pcie.aer.counters, &w.pcie.aer.counters)
}

/// [`same_but_volatile`] of a counter engine's state (every field named).
fn counters_settle_to(counters: &CounterState, w: &CounterState) -> bool {
    // `measured` (the last window's BER and pause share) is volatile like the timestamps.
    let CounterState { counter_snapshots, last_values, breach_flags, saturation_flags, measured: _ } = counters;
    (last_values.same_as(&w.last_values) || *last_values == w.last_values)
        && *breach_flags == w.breach_flags
        && *saturation_flags == w.saturation_flags
        && counter_snapshots.len() == w.counter_snapshots.len()
        && counter_snapshots.iter().zip(&w.counter_snapshots).all(|((k, v), (wk, wv))| k == wk && v.value == wv.value)
}

impl Writer {
    pub fn new(path: &Path) -> Writer {
        Writer { path: path.to_path_buf(), written: None, told: None, written_at: None, writes: 0 }
    }

    /// A writer that keeps no copy of what it wrote: it is told of every change of the
    /// checks' state instead ([`Writer::checks_changed`]; a change it is not told of is
    /// written only with the next change or refresh). The outbox it compares by its ids, as
    /// [`Writer::new`]'s does. A device of a thousand ports has tens of thousands of counter
    /// snapshots: the copy is that many more.
    pub fn told(path: &Path) -> Writer {
        Writer { told: Some(Told::default()), ..Writer::new(path) }
    }

    /// The checks' state is `new` now, `old` before ([`Writer::told`]).
    pub fn checks_changed(&mut self, old: &CheckState, new: &CheckState) {
        if let Some(t) = &mut self.told
            && !t.changed
        {
            t.changed = !same_but_volatile(new, old);
        }
    }

    /// Write `state` if it changed (volatile-only changes: once per [`VOLATILE_REFRESH`]).
    /// `now`: the caller's clock. Returns whether the file now holds `state` (up to its
    /// volatile parts): false when the write failed.
    pub fn save(&mut self, state: &State, now: std::time::Instant) -> bool {
        let stale = self.written_at.is_none_or(|t| now.duration_since(t) >= VOLATILE_REFRESH);
        let same = match &self.told {
            Some(t) => !t.changed && t.outbox.as_ref().is_some_and(|ids| state.outbox.has_ids(ids)),
            None => self.written.as_ref().is_some_and(|w| settles_to(state, w)),
        };
        if !stale && same {
            return true;
        }
        self.write(state, now)
    }

    /// Write `state` unless it is exactly what is on disk (shutdown). Returns as
    /// [`Writer::save`].
    pub fn flush(&mut self, state: &State, now: std::time::Instant) -> bool {
        self.write(state, now)
    }

    fn write(&mut self, state: &State, now: std::time::Instant) -> bool {
        match save(&self.path, state) {
            Ok(wrote) => {
                if wrote {
                    self.writes += 1;
                    tracing::debug!(path = %self.path.display(), writes = self.writes, "state file written");
                }
                match &mut self.told {
                    Some(t) => *t = Told { outbox: Some(state.outbox.ids()), changed: false },
                    None => {
                        // The old copy goes before the new one is made (one copy of the
                        // checks' state at a time).
                        self.written = None;
                        self.written = Some(settled(state));
                    }
                }
                self.written_at = Some(now);
                true
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot write the state file");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_state_settles_to_what_was_written_but_for_its_volatile_parts() {
        use crate::decide::counters::eval::CounterSnapshot;
        let t = |secs: i64| time::OffsetDateTime::from_unix_timestamp(secs).unwrap();
        let mut s = State::fresh(Some("b1".into()));
        s.checks.polls = 5;
        for (key, value) in [("mlx5_0/1/link_downed", 3), ("mlx5_0/1/symbol_error", 7)] {
            std::sync::Arc::make_mut(&mut s.checks.counters)
                .counter_snapshots
                .insert(key.into(), CounterSnapshot { value, timestamp: t(100) });
            std::sync::Arc::make_mut(&mut s.checks.counters).last_values.insert(key.into(), value);
        }
        let aer_key = "mlx5_0:0:aer_correctable";
        std::sync::Arc::make_mut(&mut s.checks.pcie)
            .aer
            .counters
            .counter_snapshots
            .insert(aer_key.into(), CounterSnapshot { value: 2, timestamp: t(100) });
        let written = settled(&s);
        type Change = Box<dyn Fn(&mut State)>;
        let variants: Vec<(&str, Change, bool)> = vec![
            ("unchanged", Box::new(|_| {}), true),
            ("a later poll", Box::new(|s| s.checks.polls = 99), true),
            (
                "snapshot timestamps moved",
                Box::new(move |s| {
                    for v in std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.values_mut() {
                        v.timestamp = t(200);
                    }
                }),
                true,
            ),
            (
                "an AER window's timestamp moved",
                Box::new(move |s| {
                    for v in std::sync::Arc::make_mut(&mut s.checks.pcie).aer.counters.counter_snapshots.values_mut() {
                        v.timestamp = t(200);
                    }
                }),
                true,
            ),
            (
                "an AER total moved",
                Box::new(|s| {
                    for v in std::sync::Arc::make_mut(&mut s.checks.pcie).aer.counters.counter_snapshots.values_mut() {
                        v.value += 1;
                    }
                }),
                false,
            ),
            (
                "a card reported downtrained",
                Box::new(|s| {
                    let r = crate::decide::pcie::link::Reported { nic: "mlx5_0".into() };
                    std::sync::Arc::make_mut(&mut s.checks.pcie).link.downtrained.insert("0000:3b:00".into(), r);
                }),
                false,
            ),
            (
                "a counter moved",
                Box::new(|s| {
                    std::sync::Arc::make_mut(&mut s.checks.counters)
                        .last_values
                        .insert("mlx5_0/1/link_downed".into(), 4)
                        .map(drop)
                        .unwrap_or(())
                }),
                false,
            ),
            (
                "a snapshot value moved",
                Box::new(|s| {
                    if let Some(v) =
                        std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.values_mut().next()
                    {
                        v.value += 1;
                    }
                }),
                false,
            ),
            (
                "a snapshot gone",
                Box::new(|s| {
                    std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.pop_first();
                }),
                false,
            ),
            (
                "an EINVAL file",
                Box::new(|s| {
                    s.checks.einval.insert("x".into());
                }),
                false,
            ),
            ("another boot", Box::new(|s| s.boot_id = Some("b2".into())), false),
            ("the first poll", Box::new(|s| s.checks.polls = 0), false),
            ("a scope", Box::new(|s| s.checks.scope = Some("incl=;excl=".into())), false),
        ];
        for (what, change, same) in variants {
            let mut v = s.clone();
            change(&mut v);
            assert_eq!(settles_to(&v, &written), same, "{what}");
            assert_eq!(settled(&v) == written, same, "{what}: the comparison agrees with settled()");
        }
    }

    #[test]
    fn roundtrip_and_boot_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s/state.json");
        let mut s = State::fresh(Some("b1".into()));
        s.checks.polls = 3;
        s.checks.einval.insert("class/infiniband/mlx5_0/ports/1/counters/x".into());
        assert!(save(&p, &s).unwrap());
        assert!(!save(&p, &s).unwrap(), "unchanged state is not rewritten");
        let (l, how) = load(&p, Some("b1"));
        assert_eq!(how, Loaded::Resumed);
        assert_eq!(l, s);
        let (l, how) = load(&p, Some("b2"));
        assert_eq!(how, Loaded::Rebooted { previous: Some("b1".into()) });
        assert_eq!(l.checks.polls, 0);
        assert!(l.checks.einval.is_empty());
        std::fs::write(&p, "{\"version\":1,").unwrap();
        assert!(matches!(load(&p, Some("b1")).1, Loaded::Corrupt(_)));
        assert_eq!(load(&dir.path().join("none.json"), None).1, Loaded::Missing { reboot: false });
    }

    #[test]
    fn the_file_keeps_its_flat_shape() {
        let text = String::from_utf8(to_bytes(&State::fresh(Some("b".into())))).unwrap();
        let keys = [
            "version",
            "boot_id",
            "polls",
            "port_states",
            "known_devices",
            "cards_below_mode",
            "counters",
            "kmsg",
            "char_devices",
            "einval",
            "outbox",
            "next_batch_id",
        ];
        let at: Vec<usize> = keys.iter().map(|k| text.find(&format!("\n  \"{k}\":")).expect(k)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "keys out of order:\n{text}");
        assert_eq!(text.matches("\n  \"").count(), keys.len(), "unexpected top-level keys:\n{text}");
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
        assert!(matches!(&how, Loaded::Corrupt(w) if w.to_string().contains("not a regular file")), "{how:?}");
        assert_eq!(s, State::fresh(Some("b".into())));
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, vec![b' '; MAX_BYTES + 1]).unwrap();
        assert!(matches!(load(&p, None).1, Loaded::Corrupt(w) if w.to_string().contains("larger than")));
        // Saving replaces whatever is there.
        assert!(save(&p, &s).unwrap());
        assert_eq!(load(&p, Some("b")).1, Loaded::Resumed);
    }

    /// A counter snapshot of `value` taken `secs` after the epoch.
    fn snap(value: u64, secs: i64) -> crate::decide::counters::eval::CounterSnapshot {
        crate::decide::counters::eval::CounterSnapshot {
            value,
            timestamp: time::OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(secs),
        }
    }

    #[test]
    fn volatile_changes_are_written_once_a_minute_and_real_changes_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        let mut w = Writer::new(&p);
        let t0 = std::time::Instant::now();
        let mut s = State::fresh(Some("b".into()));
        let key: std::sync::Arc<str> = "mlx5_0_1_symbol_error".into();
        s.checks.polls = 1;
        std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.insert(key.clone(), snap(5, 1));
        w.save(&s, t0);
        assert_eq!(w.writes, 1, "the first save writes");
        // Polls go by: the count and the snapshot's timestamp move, nothing else.
        for i in 1..59 {
            s.checks.polls = i + 1;
            std::sync::Arc::make_mut(&mut s.checks.counters)
                .counter_snapshots
                .insert(key.clone(), snap(5, 1 + i as i64));
            w.save(&s, t0 + std::time::Duration::from_secs(i));
        }
        assert_eq!(w.writes, 1, "volatile changes wait for the refresh period");
        s.checks.polls = 60;
        w.save(&s, t0 + VOLATILE_REFRESH);
        assert_eq!(w.writes, 2, "and are written once it has passed");
        assert_eq!(load(&p, Some("b")).0.checks.polls, 60);
        // A moved counter value is a change: written at once.
        std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.insert(key.clone(), snap(6, 61));
        w.save(&s, t0 + VOLATILE_REFRESH + std::time::Duration::from_secs(1));
        assert_eq!(w.writes, 3);
        // So is the outbox.
        s.outbox.enqueue(&[crate::model::event::HealthEvent::new(
            crate::model::event::Check::InfiniBandStateCheck,
            &crate::model::event::Stamp::default(),
            time::OffsetDateTime::UNIX_EPOCH,
            "x",
        )]);
        w.save(&s, t0 + VOLATILE_REFRESH + std::time::Duration::from_secs(2));
        assert_eq!(w.writes, 4);
        // Shutdown writes the exact state, volatile parts included.
        s.checks.polls = 99;
        w.flush(&s, t0 + VOLATILE_REFRESH + std::time::Duration::from_secs(3));
        assert_eq!(load(&p, Some("b")).0, s);
    }

    #[test]
    fn a_told_writer_writes_what_it_is_told_changed_and_keeps_no_copy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        let mut w = Writer::told(&p);
        let t0 = std::time::Instant::now();
        let at = |secs: u64| t0 + std::time::Duration::from_secs(secs);
        let mut s = State::fresh(Some("b".into()));
        let key: std::sync::Arc<str> = "mlx5_0_1_symbol_error".into();
        s.checks.polls = 1;
        std::sync::Arc::make_mut(&mut s.checks.counters).counter_snapshots.insert(key.clone(), snap(5, 1));
        w.save(&s, at(0));
        assert_eq!(w.writes, 1, "the first save writes");
        assert!(w.written.is_none(), "no copy kept");
        // A volatile change, told: not written before the refresh.
        let mut next = s.checks.clone();
        next.polls = 7;
        std::sync::Arc::make_mut(&mut next.counters).counter_snapshots.insert(key.clone(), snap(5, 9));
        w.checks_changed(&s.checks, &next);
        s.checks = next;
        w.save(&s, at(1));
        assert_eq!(w.writes, 1);
        // A moved value, told: written at once.
        let mut next = s.checks.clone();
        std::sync::Arc::make_mut(&mut next.counters).counter_snapshots.insert(key.clone(), snap(6, 10));
        w.checks_changed(&s.checks, &next);
        s.checks = next;
        w.save(&s, at(2));
        assert_eq!(w.writes, 2);
        assert_eq!(load(&p, Some("b")).0.checks.counters.counter_snapshots[&key].value, 6);
        w.save(&s, at(3));
        assert_eq!(w.writes, 2, "nothing changed since");
        // The outbox is compared by its ids.
        s.outbox.enqueue(&[crate::model::event::HealthEvent::new(
            crate::model::event::Check::InfiniBandStateCheck,
            &crate::model::event::Stamp::default(),
            time::OffsetDateTime::UNIX_EPOCH,
            "x",
        )]);
        w.save(&s, at(4));
        assert_eq!(w.writes, 3);
        // Past the refresh period the state is written whatever was told.
        s.checks.polls = 8;
        w.save(&s, at(4) + VOLATILE_REFRESH);
        assert_eq!(w.writes, 4);
        assert_eq!(load(&p, Some("b")).0, s);
    }

    /// A state file holding a history over its bounds (600 ports of 70 transitions, as
    /// no nicmon wrote it): `load` and `read_history` keep at most the bounds, and the rest
    /// of the file (version, boot, polls, outbox) loads as written.
    #[test]
    fn a_state_file_over_the_history_bounds_loads_within_them() {
        use crate::model::history::{MAX_PORTS, PER_PORT};
        let transition = |i: usize| {
            format!(
                r#"{{"at_ms":{i},"state":"ACTIVE","phys_state":"LinkUp","healthy":true,"outcome":"quiet","woken_by":["qdisc_reset"]}}"#
            )
        };
        let list = format!("[{}]", (0..PER_PORT + 6).map(transition).collect::<Vec<_>>().join(","));
        let ports: Vec<String> = (0..600).map(|p| format!(r#""mlx5_{}/{}":{list}"#, p / 2, p % 2 + 1)).collect();
        let text = format!(
            r#"{{"version":1,"boot_id":"b","polls":4,"history":{{{}}},"outbox":[],"next_batch_id":7}}"#,
            ports.join(",")
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        std::fs::write(&p, &text).unwrap();
        let (s, how) = load(&p, Some("b"));
        assert_eq!(how, Loaded::Resumed);
        assert_eq!((s.checks.polls, s.outbox.last_id(), s.outbox.is_empty()), (4, 7, true));
        for h in [s.checks.history, read_history(&p).unwrap()] {
            assert_eq!(h.0.len(), MAX_PORTS);
            assert!(h.0.values().all(|l| l.len() == PER_PORT && l[0].at_ms == 6), "each port's newest kept");
        }
    }

    /// A state nicmon wrote with a history and an outbox loads back as it was (the file's
    /// keys are read straight into their types, not through serde's flatten).
    #[test]
    fn a_state_with_history_and_outbox_round_trips() {
        use crate::model::history::{PortDecisions, PortReading, record};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        let mut s = State::fresh(Some("b".into()));
        s.checks.scope = Some("incl=;excl=".into());
        let up = PortReading { device: "mlx5_0", port: 1, state: "ACTIVE", phys_state: "LinkUp", healthy: true };
        let at = time::OffsetDateTime::UNIX_EPOCH;
        s.checks.history = record(&s.checks.history, [up], &PortDecisions::default(), at, &["rtnetlink".into()]);
        s.outbox.enqueue(&[crate::model::event::HealthEvent::new(
            crate::model::event::Check::InfiniBandStateCheck,
            &crate::model::event::Stamp::default(),
            at,
            "x",
        )]);
        save(&p, &s).unwrap();
        assert_eq!(load(&p, Some("b")), (s.clone(), Loaded::Resumed));
        assert_eq!(read_history(&p).unwrap(), s.checks.history);
    }

    proptest! {
        #[test]
        fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        /// Any bytes as the state file: `load` and `read_history` never panic.
        #[test]
        fn loading_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("state.json");
            std::fs::write(&p, &bytes).unwrap();
            let _ = load(&p, Some("b"));
            let _ = read_history(&p);
        }

        #[test]
        fn parser_never_panics_on_json_shaped_input(s in "\\{\"version\":1(,\"[a-z_]{1,12}\":(null|1|\"x\"|\\[\\]|\\{\\}|true))*\\}") {
            let _ = parse(s.as_bytes());
        }
    }
}
