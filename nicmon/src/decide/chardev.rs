//! `InfiniBandCharDeviceCheck`: the `/dev/infiniband` nodes a device's workloads open.
//!
//! udev makes `/dev/infiniband/{uverbs,umad,issm}N` from the entries of
//! `class/infiniband_verbs` and `class/infiniband_mad`, so a missing class entry is a
//! missing device node: ports ACTIVE/LinkUp, yet pods fail to start. Per monitored device
//! with an InfiniBand port the check expects one `uverbs` entry, one `umad` per InfiniBand
//! port and, with `[charDeviceCheck] issm = "always"`, one `issm` per InfiniBand port
//! (whether issm nodes exist depends on the architecture: opt-in). Each entry is mapped to
//! its device and port by its own `ibdev`/`port` attributes.
//!
//! Pure: `(previous state, snapshot, roles, mode, now) → (events, next state)`.
//! - expected and missing [`MISSES_BEFORE_REPORT`] polls in a row → one fatal event
//!   (`REPLACE_VM`, `errorCode = [<kind>]`), latched;
//! - a latched entry recovers (one healthy event, same error code) only when it is seen
//!   again; a latched entry no longer expected (its device gone or unreadable) is held;
//! - a class directory that is needed and absent or unreadable holds the whole check's
//!   state for that poll (no miss counted, nothing reported or recovered, for the entries
//!   of both directories): an absent `infiniband_mad` is a node without `ib_umad`, not a
//!   mass failure, and a half-listed class tree is no evidence either (upstream's rule);
//! - changing the issm mode while entries are latched re-baselines: one check-scoped clear
//!   (healthy, no entities, 1 s earlier), then the latched entries still expected and
//!   still missing are reported again; the others are dropped.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::decide::roles::Classification;
use crate::model::event::{Check, Entity, HealthEvent, Stamp};
use crate::model::{CharKind, ClassDir, LinkLayer, Snapshot};

/// Consecutive polls an expected entry must be missing before it is reported (the device
/// list and the class directories are read at slightly different instants).
pub const MISSES_BEFORE_REPORT: u32 = 3;

/// `[charDeviceCheck] issm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IssmMode {
    /// No issm entry is expected (the default).
    #[default]
    Never,
    /// One issm entry per InfiniBand port.
    Always,
}

impl IssmMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IssmMode::Never => "never",
            IssmMode::Always => "always",
        }
    }

    pub fn parse(s: &str) -> Option<IssmMode> {
        match s {
            "never" => Some(IssmMode::Never),
            "always" => Some(IssmMode::Always),
            _ => None,
        }
    }
}

/// One expected character device: `uverbs` of a device (port 0), `umad`/`issm` of a port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CharKey {
    pub kind: CharKind,
    pub device: String,
    /// The IB port; 0 for the device-level `uverbs`.
    pub port: u32,
}

impl CharKey {
    /// The state key: `umad/mlx5_0_1`, `uverbs/mlx5_0_0`.
    pub fn key(&self) -> String {
        format!("{}/{}_{}", self.kind.name(), self.device, self.port)
    }

    fn entities(&self) -> Vec<Entity> {
        match self.kind {
            CharKind::Uverbs => vec![Entity::device(self.device.clone())],
            CharKind::Umad | CharKind::Issm => vec![Entity::device(self.device.clone()), Entity::port(self.port)],
        }
    }

    fn what(&self) -> String {
        match self.kind {
            CharKind::Uverbs => format!("Device {}", self.device),
            CharKind::Umad | CharKind::Issm => format!("Device {} port {}", self.device, self.port),
        }
    }
}

/// What the check carries between polls; persisted in the state file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CharDevState {
    /// Consecutive polls each expected, not yet reported entry has been missing.
    #[serde(default)]
    pub misses: BTreeMap<String, u32>,
    /// Entries with a missing-node fatal event outstanding (`missing_char_devices`).
    #[serde(default)]
    pub missing_char_devices: BTreeMap<String, CharKey>,
    /// The issm mode the latches were made under (a change re-baselines).
    #[serde(default)]
    pub issm_mode: Option<IssmMode>,
    /// Class directories whose state is held (absent/unreadable), so that the note is
    /// logged when this starts, not every poll.
    #[serde(default)]
    pub held_dirs: BTreeSet<String>,
}

impl CharDevState {
    /// Whether an entry is missing or latched, or a directory held: then an entry that comes
    /// back must be seen, and discovery lists the class directories on every poll.
    pub fn watching(&self) -> bool {
        !self.misses.is_empty() || !self.missing_char_devices.is_empty() || !self.held_dirs.is_empty()
    }
}

/// One expected (or latched) entry as `nicmon check` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: CharKind,
    pub device: String,
    /// `None` for `uverbs`.
    pub port: Option<u32>,
    /// `Some(present)` when its class directory was read; `None` when held.
    pub present: Option<bool>,
    /// Consecutive polls missing so far.
    pub misses: u32,
    /// A missing-node fatal event is outstanding.
    pub reported_missing: bool,
}

/// The check's output for one poll.
pub struct Outcome {
    pub events: Vec<HealthEvent>,
    pub state: CharDevState,
    pub notes: Vec<String>,
    pub findings: Vec<Finding>,
}

/// The entries expected from the monitored PF devices with an InfiniBand port.
pub fn expected(snap: &Snapshot, roles: &BTreeMap<String, Classification>, mode: IssmMode) -> BTreeSet<CharKey> {
    let mut out = BTreeSet::new();
    for d in snap.devices.iter().filter(|d| !d.is_vf() && roles.get(&d.name).is_some_and(|c| c.monitored)) {
        let ib_ports: Vec<u32> =
            d.ports.iter().filter(|p| p.link_layer == Some(LinkLayer::InfiniBand)).map(|p| p.number).collect();
        if ib_ports.is_empty() {
            continue;
        }
        out.insert(CharKey { kind: CharKind::Uverbs, device: d.name.clone(), port: 0 });
        for p in ib_ports {
            out.insert(CharKey { kind: CharKind::Umad, device: d.name.clone(), port: p });
            if mode == IssmMode::Always {
                out.insert(CharKey { kind: CharKind::Issm, device: d.name.clone(), port: p });
            }
        }
    }
    out
}

/// Evaluate one poll, in named steps: what each class directory lists; which needed
/// directories hold the check's state; the re-baseline of a changed issm mode; each
/// expected entry; the latched entries no longer expected.
pub fn evaluate(
    prev: &CharDevState,
    snap: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    mode: IssmMode,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> Outcome {
    let expected = expected(snap, roles, mode);
    let mut out = Outcome {
        events: Vec::new(),
        state: CharDevState { issm_mode: Some(mode), ..CharDevState::default() },
        notes: Vec::new(),
        findings: Vec::new(),
    };
    let present = listings(snap, &expected);
    hold_unlisted_dirs(prev, snap, &expected, &mut out);
    let hold_all = !out.state.held_dirs.is_empty();
    let poll = Poll { prev, now, stamp, rebaseline: rebaseline(prev, mode, now, stamp, &mut out.events) };
    for key in &expected {
        let seen = present
            .get(&key.kind)
            .and_then(Option::as_ref)
            .filter(|_| !hold_all)
            .map(|s| s.contains(&(key.device.as_str(), key.port)));
        poll.entry(key, seen, &mut out);
    }
    if !poll.rebaseline {
        hold_unexpected_latches(prev, &expected, &mut out);
    }
    out
}

/// Which entries of the `expected` devices each readable class directory lists, as
/// (device, port); `None` for a directory that is absent or cannot be listed.
fn listings<'s>(
    snap: &'s Snapshot,
    expected: &BTreeSet<CharKey>,
) -> BTreeMap<CharKind, Option<BTreeSet<(&'s str, u32)>>> {
    // Hashed: on an SR-IOV node the directories list an entry per VF, each looked up here.
    let devices: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        expected.iter().map(|k| k.device.as_str()).collect();
    let mut present = BTreeMap::new();
    for kind in CharKind::ALL {
        let seen = match snap.char_devices.dir(kind) {
            ClassDir::Listed(nodes) => Some(
                nodes
                    .iter()
                    .filter(|n| n.kind == kind)
                    .filter_map(|n| Some((n.device.as_deref()?, if kind == CharKind::Uverbs { 0 } else { n.port? })))
                    .filter(|(d, _)| devices.contains(d))
                    .collect(),
            ),
            ClassDir::Absent | ClassDir::Unreadable(_) => None,
        };
        present.insert(kind, seen);
    }
    present
}

/// A needed class directory that is absent or cannot be listed holds the check's state
/// (said once, when the hold starts).
fn hold_unlisted_dirs(prev: &CharDevState, snap: &Snapshot, expected: &BTreeSet<CharKey>, out: &mut Outcome) {
    let needed_dirs: BTreeSet<&str> = expected.iter().map(|k| k.kind.class_dir()).collect();
    for dir in needed_dirs {
        let kind = if dir == CharKind::Uverbs.class_dir() { CharKind::Uverbs } else { CharKind::Umad };
        let why = match snap.char_devices.dir(kind) {
            ClassDir::Listed(_) => continue,
            ClassDir::Absent => format!("class/{dir} is absent"),
            ClassDir::Unreadable(e) => format!("class/{dir} cannot be listed ({e})"),
        };
        if !prev.held_dirs.contains(dir) {
            out.notes.push(format!(
                "InfiniBandCharDeviceCheck: {why}: the state of every character device is held until it can be read"
            ));
        }
        out.state.held_dirs.insert(dir.to_string());
    }
}

/// A changed issm mode with faults latched: clear everything this check reported (one
/// event, 1 s earlier), then re-assert what is still missing (an issm latch made under
/// "always" would otherwise be held forever once issm is no longer expected). Whether
/// this poll re-baselines.
fn rebaseline(
    prev: &CharDevState,
    mode: IssmMode,
    now: OffsetDateTime,
    stamp: &Stamp,
    events: &mut Vec<HealthEvent>,
) -> bool {
    let rebaseline = prev.issm_mode.is_some_and(|m| m != mode) && !prev.missing_char_devices.is_empty();
    if rebaseline {
        events.push(HealthEvent::new(
            Check::InfiniBandCharDeviceCheck,
            stamp,
            now - Duration::seconds(1),
            &format!(
                "InfiniBand character-device check: charDeviceCheck.issm changed to {}, clearing previous conditions",
                mode.as_str()
            ),
        ));
    }
    rebaseline
}

/// What judging one expected entry reads.
struct Poll<'a> {
    prev: &'a CharDevState,
    now: OffsetDateTime,
    stamp: &'a Stamp,
    /// This poll re-baselines ([`rebaseline`]).
    rebaseline: bool,
}

impl Poll<'_> {
    /// One expected entry: `seen` is `None` when its directory is held, else whether it is
    /// listed.
    fn entry(&self, key: &CharKey, seen: Option<bool>, out: &mut Outcome) {
        let k = key.key();
        let latched = self.prev.missing_char_devices.contains_key(&k);
        let misses = self.prev.misses.get(&k).copied().unwrap_or(0);
        let mut finding = Finding {
            kind: key.kind,
            device: key.device.clone(),
            port: (key.kind != CharKind::Uverbs).then_some(key.port),
            present: seen,
            misses,
            reported_missing: latched,
        };
        match seen {
            // Held: keep whatever was known.
            None => {
                if latched {
                    self.still_missing(key, k.clone(), out);
                }
                if misses > 0 {
                    out.state.misses.insert(k, misses);
                }
            }
            Some(true) => {
                finding.misses = 0;
                finding.reported_missing = false;
                if latched && !self.rebaseline {
                    out.events.push(present_again_event(key, self.stamp, self.now));
                }
            }
            Some(false) if latched => self.still_missing(key, k, out),
            Some(false) => {
                let misses = misses + 1;
                finding.misses = misses;
                if misses >= MISSES_BEFORE_REPORT {
                    finding.reported_missing = true;
                    out.events.push(missing_event(key, self.stamp, self.now));
                    out.state.missing_char_devices.insert(k, key.clone());
                } else {
                    out.state.misses.insert(k, misses);
                }
            }
        }
        out.findings.push(finding);
    }

    /// A latched entry stays latched; a re-baseline reports it again.
    fn still_missing(&self, key: &CharKey, k: String, out: &mut Outcome) {
        out.state.missing_char_devices.insert(k, key.clone());
        if self.rebaseline {
            out.events.push(missing_event(key, self.stamp, self.now));
        }
    }
}

/// Latched entries not expected now (device absent, unreadable, no longer monitored):
/// absence is no evidence of recovery — held.
fn hold_unexpected_latches(prev: &CharDevState, expected: &BTreeSet<CharKey>, out: &mut Outcome) {
    for (k, key) in &prev.missing_char_devices {
        if !expected.contains(key) {
            out.state.missing_char_devices.insert(k.clone(), key.clone());
            out.findings.push(Finding {
                kind: key.kind,
                device: key.device.clone(),
                port: (key.kind != CharKind::Uverbs).then_some(key.port),
                present: None,
                misses: 0,
                reported_missing: true,
            });
        }
    }
}

fn present_again_event(key: &CharKey, stamp: &Stamp, now: OffsetDateTime) -> HealthEvent {
    let msg = format!(
        "{}: InfiniBand character device {} is present again in class/{}",
        key.what(),
        key.kind.name(),
        key.kind.class_dir()
    );
    HealthEvent::new(Check::InfiniBandCharDeviceCheck, stamp, now, &msg)
        .error_code(key.kind.name())
        .entities(key.entities())
}

fn missing_event(key: &CharKey, stamp: &Stamp, now: OffsetDateTime) -> HealthEvent {
    let dev_node = format!("/dev/infiniband/{}*", key.kind.name());
    let msg = format!(
        "{}: InfiniBand character device {} missing from class/{} for {MISSES_BEFORE_REPORT} polls - \
         workloads cannot open {dev_node}",
        key.what(),
        key.kind.name(),
        key.kind.class_dir()
    );
    HealthEvent::new(Check::InfiniBandCharDeviceCheck, stamp, now, &msg)
        .unhealthy(true)
        .error_code(key.kind.name())
        .entities(key.entities())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::roles::Role;
    use crate::model::{CharDevices, CharNode, Device, Function, Port};

    fn device(name: &str, ll: LinkLayer, ports: u32) -> Device {
        Device {
            name: name.into(),
            unsupported: None,
            pci_address: None,
            card: None,
            numa_node: Some(0),
            hca_type: None,
            fw_ver: None,
            board_id: None,
            driver: Some("mlx5_core".into()),
            rdma_driver: None,
            function: Function::Pf,
            netdev: None,
            ports: (1..=ports).map(|n| Port { number: n, link_layer: Some(ll.clone()), ..Port::default() }).collect(),
            unknown: Default::default(),
            pcie: None,
        }
    }

    fn roles(names: &[&str]) -> BTreeMap<String, Classification> {
        names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    Classification { monitored: true, reason: None, role: Some(Role::Compute), role_reason: None },
                )
            })
            .collect()
    }

    fn node(kind: CharKind, i: usize, dev: &str, port: Option<u32>) -> CharNode {
        CharNode { kind, name: format!("{}{i}", kind.name()), device: Some(dev.into()), port }
    }

    /// Two IB devices (mlx5_0 with 2 ports), one RoCE device; every node present.
    fn snap() -> Snapshot {
        Snapshot {
            devices: vec![
                device("mlx5_0", LinkLayer::InfiniBand, 2).into(),
                device("mlx5_1", LinkLayer::InfiniBand, 1).into(),
                device("mlx5_2", LinkLayer::Ethernet, 1).into(),
            ],
            char_devices: CharDevices {
                verbs: ClassDir::Listed(vec![
                    node(CharKind::Uverbs, 0, "mlx5_0", None),
                    node(CharKind::Uverbs, 1, "mlx5_1", None),
                    node(CharKind::Uverbs, 2, "mlx5_2", None),
                ]),
                mad: ClassDir::Listed(vec![
                    node(CharKind::Umad, 0, "mlx5_0", Some(1)),
                    node(CharKind::Umad, 1, "mlx5_0", Some(2)),
                    node(CharKind::Umad, 2, "mlx5_1", Some(1)),
                    node(CharKind::Issm, 0, "mlx5_0", Some(1)),
                    node(CharKind::Issm, 1, "mlx5_0", Some(2)),
                    node(CharKind::Issm, 2, "mlx5_1", Some(1)),
                ]),
            }
            .into(),
            ..Snapshot::default()
        }
    }

    fn remove(s: &mut Snapshot, kind: CharKind, dev: &str, port: Option<u32>) {
        let chars = std::sync::Arc::make_mut(&mut s.char_devices);
        let dir = if kind == CharKind::Uverbs { &mut chars.verbs } else { &mut chars.mad };
        if let ClassDir::Listed(nodes) = dir {
            nodes.retain(|n| !(n.kind == kind && n.device.as_deref() == Some(dev) && n.port == port));
        }
    }

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_790_000_000 + s).unwrap()
    }

    fn run(st: &CharDevState, s: &Snapshot, mode: IssmMode, at: i64) -> Outcome {
        evaluate(st, s, &roles(&["mlx5_0", "mlx5_1", "mlx5_2"]), mode, t(at), &Stamp::default())
    }

    /// Polls at 0, 1 and 2 s from a fresh state: the state after them and every event fired.
    fn three_polls(s: &Snapshot, mode: IssmMode) -> (CharDevState, Vec<HealthEvent>) {
        let (mut st, mut fired) = (CharDevState::default(), Vec::new());
        for at in 0..3 {
            let out = run(&st, s, mode, at);
            fired.extend(out.events);
            st = out.state;
        }
        (st, fired)
    }

    #[test]
    fn expectation_per_ib_device_and_port() {
        let r = roles(&["mlx5_0", "mlx5_1", "mlx5_2"]);
        let never: Vec<String> = expected(&snap(), &r, IssmMode::Never).iter().map(CharKey::key).collect();
        assert_eq!(never, ["uverbs/mlx5_0_0", "uverbs/mlx5_1_0", "umad/mlx5_0_1", "umad/mlx5_0_2", "umad/mlx5_1_1"]);
        assert_eq!(expected(&snap(), &r, IssmMode::Always).len(), 8);
        // Unmonitored devices expect nothing.
        assert!(expected(&snap(), &roles(&["mlx5_2"]), IssmMode::Always).is_empty());
    }

    #[test]
    fn missing_three_polls_is_fatal_latched_and_recovers_when_seen() {
        let mut s = snap();
        let out = run(&CharDevState::default(), &s, IssmMode::Never, 0);
        assert!(out.events.is_empty() && out.notes.is_empty());
        remove(&mut s, CharKind::Umad, "mlx5_0", Some(2));
        let mut st = out.state;
        for at in 1..=2 {
            let out = run(&st, &s, IssmMode::Never, at);
            assert!(out.events.is_empty(), "poll {at}: {:?}", out.events);
            st = out.state;
        }
        let out = run(&st, &s, IssmMode::Never, 3);
        assert_eq!(out.events.len(), 1);
        let e = &out.events[0];
        assert!(e.is_fatal && !e.is_healthy);
        assert_eq!(e.error_code, ["umad"]);
        assert_eq!(e.entities_text(), "NIC=mlx5_0 NICPort=2");
        assert!(e.message.contains("umad missing from class/infiniband_mad"), "{}", e.message);
        st = out.state;
        assert!(run(&st, &s, IssmMode::Never, 4).events.is_empty(), "latched: reported once");
        // Its device drops out of the snapshot: held, not recovered.
        let mut gone = s.clone();
        gone.devices.remove(0);
        let out = run(&st, &gone, IssmMode::Never, 5);
        assert!(out.events.is_empty());
        assert!(out.state.missing_char_devices.contains_key("umad/mlx5_0_2"));
        st = out.state;
        // Seen again: one healthy event with the same code.
        let out = run(&st, &snap(), IssmMode::Never, 6);
        assert_eq!(out.events.len(), 1);
        assert!(out.events[0].is_healthy);
        assert_eq!(out.events[0].error_code, ["umad"]);
        assert!(out.state.missing_char_devices.is_empty());
    }

    #[test]
    fn a_blip_shorter_than_three_polls_is_forgotten() {
        let mut s = snap();
        remove(&mut s, CharKind::Uverbs, "mlx5_1", None);
        let st = run(&CharDevState::default(), &s, IssmMode::Never, 0).state;
        let st = run(&st, &s, IssmMode::Never, 1).state;
        assert_eq!(st.misses.get("uverbs/mlx5_1_0"), Some(&2));
        let st = run(&st, &snap(), IssmMode::Never, 2).state;
        assert!(st.misses.is_empty());
        let out = run(&st, &s, IssmMode::Never, 3);
        assert!(out.events.is_empty());
        assert_eq!(out.state.misses.get("uverbs/mlx5_1_0"), Some(&1));
    }

    #[test]
    fn an_absent_or_unreadable_directory_holds_the_whole_check() {
        let mut s = snap();
        remove(&mut s, CharKind::Umad, "mlx5_1", Some(1));
        let mut st = CharDevState::default();
        for at in 0..3 {
            st = run(&st, &s, IssmMode::Never, at).state;
        }
        assert!(st.missing_char_devices.contains_key("umad/mlx5_1_1"));
        // ib_umad unloaded: no recovery, no new misses (the verbs entries included), one note.
        std::sync::Arc::make_mut(&mut s.char_devices).mad = ClassDir::Absent;
        remove(&mut s, CharKind::Uverbs, "mlx5_0", None);
        let out = run(&st, &s, IssmMode::Never, 3);
        assert!(out.events.is_empty());
        assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
        assert!(out.notes[0].contains("class/infiniband_mad is absent"), "{:?}", out.notes);
        assert!(out.state.missing_char_devices.contains_key("umad/mlx5_1_1"));
        assert!(out.state.misses.is_empty(), "the verbs directory's entries are held too: {:?}", out.state.misses);
        assert!(out.findings.iter().all(|f| f.present.is_none()));
        let mut st = out.state;
        for at in 4..8 {
            let out = run(&st, &s, IssmMode::Never, at);
            assert!(out.notes.is_empty(), "noted once");
            assert!(out.events.is_empty(), "{:?}", out.events);
            st = out.state;
        }
        std::sync::Arc::make_mut(&mut s.char_devices).mad = ClassDir::Unreadable("not a directory".into());
        assert!(run(&st, &s, IssmMode::Never, 8).events.is_empty());
        // Readable again: the uverbs loss now counts from its first miss.
        let mut s2 = snap();
        remove(&mut s2, CharKind::Umad, "mlx5_1", Some(1));
        remove(&mut s2, CharKind::Uverbs, "mlx5_0", None);
        let out = run(&st, &s2, IssmMode::Never, 9);
        assert!(out.events.is_empty());
        assert_eq!(out.state.misses.get("uverbs/mlx5_0_0"), Some(&1));
    }

    #[test]
    fn issm_mode_change_with_latches_rebaselines() {
        let mut s = snap();
        remove(&mut s, CharKind::Issm, "mlx5_0", Some(1));
        remove(&mut s, CharKind::Umad, "mlx5_1", Some(1));
        let (st, fired) = three_polls(&s, IssmMode::Always);
        assert_eq!(fired.len(), 2);
        // Switching to never: a check-scoped clear first, then the umad fault again; the
        // issm latch is dropped with the clear.
        let out = run(&st, &s, IssmMode::Never, 3);
        assert_eq!(out.events.len(), 2, "{:?}", out.events);
        assert!(out.events[0].is_healthy && out.events[0].entities_impacted.is_empty());
        assert!(out.events[0].generated_timestamp < t(3));
        assert_eq!(out.events[1].error_code, ["umad"]);
        assert!(out.events[1].is_fatal);
        assert_eq!(out.state.missing_char_devices.keys().collect::<Vec<_>>(), ["umad/mlx5_1_1"]);
        assert!(run(&out.state, &s, IssmMode::Never, 4).events.is_empty());
        // A mode change without latches is quiet.
        let quiet =
            run(&CharDevState { issm_mode: Some(IssmMode::Always), ..Default::default() }, &snap(), IssmMode::Never, 0);
        assert!(quiet.events.is_empty());
    }

    /// A missing `uverbs` is about its device, a missing `umad`/`issm` about its port, and
    /// the clear of an issm mode change about the node (no entity).
    #[test]
    fn each_event_names_its_device_port_or_the_node() {
        use crate::model::event::{EntityKind, Subject};
        let mut s = snap();
        remove(&mut s, CharKind::Uverbs, "mlx5_1", None);
        remove(&mut s, CharKind::Issm, "mlx5_0", Some(2));
        let (st, fired) = three_polls(&s, IssmMode::Always);
        let mut subjects: Vec<Subject<'_>> = fired.iter().map(HealthEvent::subject).collect();
        subjects.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(subjects, [Subject::Device("mlx5_1"), Subject::Port { device: "mlx5_0", port: 2 }]);
        let out = run(&st, &s, IssmMode::Never, 3);
        assert_eq!(out.events[0].kind(), EntityKind::Node, "{:?}", out.events);
        assert!(out.events[0].is_healthy);
    }

    #[test]
    fn entries_with_unreadable_attributes_do_not_count() {
        let mut s = snap();
        if let ClassDir::Listed(nodes) = &mut std::sync::Arc::make_mut(&mut s.char_devices).verbs {
            nodes[0].device = None;
        }
        let (_, all) = three_polls(&s, IssmMode::Never);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].entities_text(), "NIC=mlx5_0");
    }
}
