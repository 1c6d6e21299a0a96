//! Port history: the last transitions of every monitored port, kept in the state file, so
//! that after a drain (or the reboot that followed it) an operator can see what happened to
//! which port and when — including what published nothing: DOWNs the hold-down swallowed
//! (blips), transitions held by flap damping — and which wake-up made the poll that saw it.
//!
//! Decided like the checks: [`record`] is a pure function of the previous history, the
//! ports as read and what the state check made of them this poll. `nicmon history` prints
//! [`timeline`], `nicmon check --format json` carries the history, and support bundles hold
//! it in their state file. It survives a reboot (the state file's checks do not).
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Transitions kept per port (the oldest go first; SPEC §1.12).
pub const PER_PORT: usize = 64;
/// Ports kept (those whose last transition is oldest go first): bounds a node whose device
/// names keep changing. Once full, only an unhealthy port is taken in ([`record`]).
pub const MAX_PORTS: usize = 256;

/// Every port's last transitions, oldest first, by `<device>/<port>`. Each port's list is
/// shared with the history it was recorded on until a poll changes it (a poll copies the
/// history, and most ports' lists are the same after it); a list a poll changes is copied
/// as its transitions' handles, each transition shared with the previous list.
///
/// Loaded bounded as [`record`] keeps it: at most [`MAX_PORTS`] ports of at most
/// [`PER_PORT`] transitions each, whatever the file holds; the transitions and ports beyond
/// the bounds are dropped as they are read, never all built first ([`HistoryVisitor`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct History(pub BTreeMap<String, PortList>);

/// One port's transitions, oldest first ([`History`]).
pub type PortList = Arc<Vec<Arc<Transition>>>;

/// A port seen in a new condition (`state`/`phys_state`) by one poll.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// When the poll that saw it read the port: Unix time in milliseconds.
    pub at_ms: i64,
    pub state: String,
    pub phys_state: String,
    pub healthy: bool,
    pub outcome: Outcome,
    /// The wake-ups that made the poll that saw it (`qdisc_reset`, `rtnetlink`, ...); empty:
    /// the interval's poll.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub woken_by: Vec<String>,
    /// The probable cause of the unhealthy event reported for it (`metadata.probableCause`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

/// What nicmon published for a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A health event went out for it (in the poll that saw it, or when its hold-down was due).
    Reported,
    /// Held by `portStateHoldDown`: reported if the port is still unhealthy when it is due.
    Held,
    /// A blip: held by the hold-down and healthy again before it was due (the DOWN, and the
    /// recovery that ended it). Nothing was published.
    Blip,
    /// The port is held as flapping: nothing published.
    Flapping,
    /// Nothing to publish: a first sight without an event, a port never healthy in this boot,
    /// a transient state, or a change between unhealthy states that crosses no boundary.
    Quiet,
}

/// A monitored port as this poll read it (state and phys_state known).
#[derive(Debug, Clone, Copy)]
pub struct PortReading<'a> {
    pub device: &'a str,
    pub port: u32,
    pub state: &'a str,
    pub phys_state: &'a str,
    pub healthy: bool,
}

/// What the state check did about ports this poll, by `(device, port)`.
#[derive(Debug, Default)]
pub struct PortDecisions {
    /// Ports with a state-check event this poll.
    pub reported: BTreeSet<(String, u32)>,
    /// Ports held by the hold-down this poll.
    pub held: BTreeSet<(String, u32)>,
    /// Held ports that recovered in time this poll (blips).
    pub blips: BTreeSet<(String, u32)>,
    /// Ports held as flapping after this poll, or whose transition flap damping held.
    pub flapping: BTreeSet<(String, u32)>,
    /// The probable cause of each unhealthy state-check event of a port this poll.
    pub causes: BTreeMap<(String, u32), String>,
}

/// A port's key in the history: `<device>/<port>`.
pub fn key(device: &str, port: u32) -> String {
    format!("{device}/{port}")
}

/// The history after one poll: each port whose condition changed gets a transition (what
/// was done about it, when, woken by what); a held DOWN becomes a blip when its port
/// recovered in time, and reported when its hold-down came due.
pub fn record<'a>(
    prev: &History,
    ports: impl IntoIterator<Item = PortReading<'a>>,
    decided: &PortDecisions,
    at: OffsetDateTime,
    woken_by: &[String],
) -> History {
    let mut next = prev.clone();
    let at_ms = (at.unix_timestamp_nanos() / 1_000_000) as i64;
    // The ports read now (see `bound`).
    let mut present = BTreeSet::new();
    for p in ports {
        let k = key(p.device, p.port);
        present.insert((p.device, p.port));
        let id = (p.device.to_string(), p.port);
        let shared = next.0.entry(k).or_default();
        let changed = shared.last().is_none_or(|t| t.state != p.state || t.phys_state != p.phys_state);
        if !changed {
            // Still unhealthy: a held DOWN whose hold-down came due was reported now.
            if shared.last().is_some_and(|t| t.outcome == Outcome::Held && decided.reported.contains(&id))
                && let Some(last) = Arc::make_mut(shared).last_mut()
            {
                let last = Arc::make_mut(last);
                last.outcome = Outcome::Reported;
                last.cause = decided.causes.get(&id).cloned();
            }
            continue;
        }
        let list = Arc::make_mut(shared);
        let outcome = if decided.blips.contains(&id) {
            if let Some(down) = list.iter_mut().rev().find(|t| t.outcome == Outcome::Held) {
                Arc::make_mut(down).outcome = Outcome::Blip;
            }
            Outcome::Blip
        } else if decided.held.contains(&id) {
            Outcome::Held
        } else if decided.reported.contains(&id) {
            Outcome::Reported
        } else if decided.flapping.contains(&id) {
            Outcome::Flapping
        } else {
            Outcome::Quiet
        };
        list.push(Arc::new(Transition {
            at_ms,
            state: p.state.to_string(),
            phys_state: p.phys_state.to_string(),
            healthy: p.healthy,
            outcome,
            woken_by: woken_by.to_vec(),
            cause: (outcome == Outcome::Reported).then(|| decided.causes.get(&id).cloned()).flatten(),
        }));
        if list.len() > PER_PORT {
            list.drain(..list.len() - PER_PORT);
        }
    }
    bound(&mut next, prev, &present);
    next
}

/// At most [`MAX_PORTS`] ports, taken from the device that holds the most ports in the
/// history (one device never erases another's: a device of 1,000 ports keeps what is left
/// after every other device's ports). Within a device (and between devices of as many
/// ports) those not read this poll go first (a device renamed), then those first seen this
/// poll and healthy (nothing to tell yet: a node of more ports than the history holds would
/// otherwise evict, every poll, ports that come back as new at the next, and its state file
/// would change every poll), then the others; oldest last transition first within each.
fn bound(history: &mut History, prev: &History, present: &BTreeSet<(&str, u32)>) {
    let read = |k: &str| {
        k.rsplit_once('/').and_then(|(dev, port)| port.parse().ok().map(|port| present.contains(&(dev, port))))
    };
    // First seen this poll (not in `prev`) and healthy: its one transition says so.
    let fresh = |k: &str, l: &PortList| !prev.0.contains_key(k) && l.last().is_some_and(|t| t.healthy);
    evict(history, MAX_PORTS, |k, l| (read(k).unwrap_or(false), !fresh(k, l)));
}

/// The device a history key belongs to (`mlx5_0` of `mlx5_0/1`).
fn device_of(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(dev, _)| dev)
}

/// Keep at most `max` ports of `history`: each victim is taken from the device holding the
/// most ports; within it, and between devices of as many ports, the first in the order of
/// `rank` (lower first), then — between devices read this poll — the device whose history
/// began last (500 devices that appear and go down never erase the history of the NICs that
/// were there before them), then of the oldest last transition, then of the key.
fn evict(history: &mut History, max: usize, rank: impl Fn(&str, &PortList) -> (bool, bool)) {
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    let Some(excess) = history.0.len().checked_sub(max).filter(|&n| n > 0) else { return };
    type Order<'a> = (bool, bool, Reverse<Option<i64>>, Option<i64>, &'a String);
    // When each device's history began: its ports' earliest kept transition.
    let mut since: BTreeMap<&str, Option<i64>> = BTreeMap::new();
    for (k, l) in &history.0 {
        let first = l.first().map(|t| t.at_ms);
        let s = since.entry(device_of(k)).or_insert(first);
        *s = match (*s, first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let mut devices: BTreeMap<&str, Vec<Order<'_>>> = BTreeMap::new();
    for (k, l) in &history.0 {
        let (a, b) = rank(k, l);
        let dev = device_of(k);
        // Only between devices read now: of those gone, the oldest go first as before.
        let began = if a { since[dev] } else { None };
        devices.entry(dev).or_default().push((a, b, Reverse(began), l.last().map(|t| t.at_ms), k));
    }
    let mut queues: Vec<VecDeque<Order<'_>>> = devices
        .into_values()
        .map(|mut v| {
            v.sort_unstable();
            v.into()
        })
        .collect();
    // The device of the most ports first; between equals, the one whose next victim goes first.
    let mut heap: BinaryHeap<(usize, Reverse<Order<'_>>, usize)> =
        queues.iter().enumerate().filter_map(|(i, q)| q.front().map(|&o| (q.len(), Reverse(o), i))).collect();
    let mut victims = Vec::with_capacity(excess);
    while victims.len() < excess
        && let Some((_, _, i)) = heap.pop()
    {
        let Some(victim) = queues[i].pop_front() else { continue };
        victims.push(victim.4.clone());
        if let Some(&next) = queues[i].front() {
            heap.push((queues[i].len(), Reverse(next), i));
        }
    }
    for k in victims {
        history.0.remove(&k);
    }
}

/// Loads a [`History`] within its bounds: each port's newest [`PER_PORT`] transitions (a
/// ring of that many as the list is read), and the ports [`record`] would keep of
/// [`MAX_PORTS`] (trimmed each time twice as many were read, and at the end).
struct HistoryVisitor;

impl<'de> serde::de::Visitor<'de> for HistoryVisitor {
    type Value = History;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of ports to their transitions")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<History, A::Error> {
        let mut history = History::default();
        while let Some(port) = map.next_key::<String>()? {
            let LastTransitions(list) = map.next_value()?;
            history.0.insert(port, Arc::new(list));
            if history.0.len() >= 2 * MAX_PORTS {
                history.trim();
            }
        }
        history.trim();
        Ok(history)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<History, D::Error> {
        d.deserialize_map(HistoryVisitor)
    }
}

/// One port's transitions as loaded: the newest [`PER_PORT`], oldest first.
struct LastTransitions(Vec<Arc<Transition>>);

impl<'de> Deserialize<'de> for LastTransitions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LastTransitions, D::Error> {
        struct Newest;
        impl<'de> serde::de::Visitor<'de> for Newest {
            type Value = LastTransitions;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of transitions")
            }

            fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<LastTransitions, S::Error> {
                let mut kept = std::collections::VecDeque::with_capacity(seq.size_hint().unwrap_or(0).min(PER_PORT));
                while let Some(t) = seq.next_element::<Transition>()? {
                    if kept.len() == PER_PORT {
                        kept.pop_front();
                    }
                    kept.push_back(Arc::new(t));
                }
                Ok(LastTransitions(kept.into()))
            }
        }
        d.deserialize_seq(Newest)
    }
}

impl History {
    /// At most [`MAX_PORTS`] ports, evicted as [`record`] evicts them (no port is read
    /// now, none is new).
    fn trim(&mut self) {
        evict(self, MAX_PORTS, |_, _| (false, false));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ports `filter` names: `NIC` (all its ports) or `NIC/PORT`; `None`: all.
    pub fn select(&self, filter: Option<&str>) -> History {
        let keep = |k: &str| match filter {
            None => true,
            Some(f) if f.contains('/') => k == f,
            Some(f) => k.rsplit_once('/').is_some_and(|(dev, _)| dev == f),
        };
        History(self.0.iter().filter(|(k, _)| keep(k)).map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

fn outcome_text(t: &Transition, prev: Option<&Transition>) -> String {
    match t.outcome {
        Outcome::Reported => "reported".into(),
        Outcome::Held => "held by portStateHoldDown (reported if still down when due)".into(),
        Outcome::Blip if !t.healthy => "blip: held by portStateHoldDown, not reported".into(),
        Outcome::Blip => match prev.filter(|p| p.outcome == Outcome::Blip && !p.healthy) {
            Some(down) => format!("blip over after {} ms: not reported", t.at_ms - down.at_ms),
            None => "blip over: not reported".into(),
        },
        Outcome::Flapping => "held as flapping: not reported".into(),
        Outcome::Quiet => "no event".into(),
    }
}

/// UTC to the millisecond.
const MILLIS: &[time::format_description::FormatItem<'_>] =
    time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// The ports' transitions as one timeline, oldest first, one line each:
/// `2026-11-26T06:30:12.345Z  mlx5_0/1  DOWN/Disabled  blip: ...  woken by qdisc_reset`.
pub fn timeline(history: &History) -> String {
    let mut lines: Vec<(i64, &str, String)> = Vec::new();
    for (port, list) in &history.0 {
        for (i, t) in list.iter().enumerate() {
            let when = OffsetDateTime::from_unix_timestamp_nanos(i128::from(t.at_ms) * 1_000_000)
                .ok()
                .and_then(|d| d.format(MILLIS).ok())
                .unwrap_or_else(|| t.at_ms.to_string());
            let by = if t.woken_by.is_empty() {
                "no wake-up".to_string()
            } else {
                format!("woken by {}", t.woken_by.join(", "))
            };
            let condition = format!("{}/{}", t.state, t.phys_state);
            let mut what = outcome_text(t, i.checked_sub(1).and_then(|j| list.get(j)).map(|t| &**t));
            if let Some(cause) = &t.cause {
                what.push_str(&format!(", probable cause: {cause}"));
            }
            lines.push((t.at_ms, port, format!("{when:<24}  {port:<10}  {condition:<24}  {what}  ({by})")));
        }
    }
    lines.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    if lines.is_empty() {
        return "no port transitions recorded\n".into();
    }
    lines.into_iter().map(|(_, _, l)| l + "\n").collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(state: &'static str, phys: &'static str) -> PortReading<'static> {
        PortReading { device: "mlx5_0", port: 1, state, phys_state: phys, healthy: state == "ACTIVE" }
    }

    fn port() -> BTreeSet<(String, u32)> {
        [("mlx5_0".to_string(), 1)].into()
    }

    /// `ms` after 2026-09-21T14:13:20Z (Unix 1,790,000,000 s).
    fn t(ms: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(1_790_000_000_000_000_000 + i128::from(ms) * 1_000_000).unwrap()
    }

    fn ms(x: i64) -> i64 {
        1_790_000_000_000 + x
    }

    const UP: (&str, &str) = ("ACTIVE", "LinkUp");
    const DOWN: (&str, &str) = ("DOWN", "Disabled");

    /// A transition recorded on a port whose list is full copies none of the transitions
    /// it keeps: they are shared with the previous history's list (a flapping port's poll
    /// used to copy its 64 transitions, ~250 allocations, on the wake-up's path).
    #[test]
    fn a_new_transition_shares_the_ones_it_keeps() {
        let none = PortDecisions::default();
        let mut h = History::default();
        for i in 0..PER_PORT as i64 + 3 {
            let (state, phys) = if i % 2 == 0 { DOWN } else { UP };
            h = record(&h, [reading(state, phys)], &none, t(i * 1000), &["qdisc_reset".to_string()]);
        }
        let before = h.0["mlx5_0/1"].clone();
        assert_eq!(before.len(), PER_PORT);
        assert_eq!(before.last().unwrap().state, DOWN.0);
        let after = record(&h, [reading(UP.0, UP.1)], &none, t(1_000_000), &[]);
        let list = &after.0["mlx5_0/1"];
        assert_eq!(list.len(), PER_PORT);
        assert_eq!(list.last().unwrap().state, UP.0);
        for (kept, was) in list.iter().zip(before.iter().skip(1)) {
            assert!(Arc::ptr_eq(kept, was), "a kept transition was copied");
        }
    }

    /// A device with more ports than the history holds: the history fills and then stays
    /// the same poll after poll (no port evicted to come back as new); a port it did not
    /// take in is taken in when it goes down.
    #[test]
    fn more_ports_than_the_history_holds_do_not_churn_it() {
        let n = MAX_PORTS as u32 + 100;
        let readings = |down: Option<u32>| {
            (1..=n).map(move |port| {
                let (state, phys_state) = if Some(port) == down { DOWN } else { UP };
                PortReading { device: "mlx5_0", port, state, phys_state, healthy: Some(port) != down }
            })
        };
        let none = PortDecisions::default();
        let first = record(&History::default(), readings(None), &none, t(0), &[]);
        assert_eq!(first.0.len(), MAX_PORTS);
        let second = record(&first, readings(None), &none, t(1000), &[]);
        assert_eq!(second, first, "a second poll of the same ports changes nothing");
        let down = record(&second, readings(Some(n)), &none, t(2000), &[]);
        assert_eq!(down.0.len(), MAX_PORTS);
        let last = down.0.get(&key("mlx5_0", n)).and_then(|l| l.last()).expect("the port that went down is held");
        assert_eq!((last.state.as_str(), last.healthy, last.at_ms), ("DOWN", false, ms(2000)));
    }

    /// A 300 ms DOWN under a 2 s hold-down, each edge seen by a wake-up's poll: the DOWN is
    /// held, then both edges are a blip, with their times and the hook; polls that see no
    /// change add nothing.
    #[test]
    fn a_300_ms_blip_under_the_hold_down_is_recorded_with_its_time_and_hook() {
        let hook = vec!["qdisc_reset".to_string()];
        let reported = PortDecisions { reported: port(), ..Default::default() };
        let h = record(&History::default(), [reading(UP.0, UP.1)], &reported, t(0), &[]);
        let h = record(&h, [reading(UP.0, UP.1)], &PortDecisions::default(), t(1000), &[]);
        let held = PortDecisions { held: port(), ..Default::default() };
        let h = record(&h, [reading(DOWN.0, DOWN.1)], &held, t(1500), &hook);
        let h = record(&h, [reading(DOWN.0, DOWN.1)], &held, t(1600), &[]);
        let blip = PortDecisions { blips: port(), ..Default::default() };
        let h = record(&h, [reading(UP.0, UP.1)], &blip, t(1800), &hook);
        let list = &h.0["mlx5_0/1"];
        let got: Vec<(i64, &str, Outcome, &[String])> =
            list.iter().map(|x| (x.at_ms, x.state.as_str(), x.outcome, &x.woken_by[..])).collect();
        assert_eq!(
            got,
            [
                (ms(0), "ACTIVE", Outcome::Reported, &[][..]),
                (ms(1500), "DOWN", Outcome::Blip, &hook[..]),
                (ms(1800), "ACTIVE", Outcome::Blip, &hook[..]),
            ]
        );
        let text = timeline(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].starts_with("2026-09-21T14:13:21.500Z  mlx5_0/1"), "{text}");
        assert!(lines[2].starts_with("2026-09-21T14:13:21.800Z  mlx5_0/1"), "{text}");
        assert!(lines[1].contains("mlx5_0/1") && lines[1].contains("DOWN/Disabled"), "{text}");
        assert!(lines[1].contains("blip: held by portStateHoldDown, not reported  (woken by qdisc_reset)"), "{text}");
        assert!(
            lines[2].contains("ACTIVE/LinkUp") && lines[2].contains("blip over after 300 ms: not reported"),
            "{text}"
        );
        assert!(lines[0].contains("reported  (no wake-up)"), "{text}");
    }

    #[test]
    fn a_held_down_that_outlasts_the_hold_down_is_reported_when_due() {
        let held = PortDecisions { held: port(), ..Default::default() };
        let reported = PortDecisions { reported: port(), ..Default::default() };
        let h = record(&History::default(), [reading(UP.0, UP.1)], &reported, t(0), &[]);
        let h = record(&h, [reading(DOWN.0, DOWN.1)], &held, t(100), &[]);
        let due = PortDecisions {
            causes: [(("mlx5_0".to_string(), 1), "cable-or-far-end".to_string())].into(),
            ..PortDecisions { reported: port(), ..Default::default() }
        };
        let h = record(&h, [reading(DOWN.0, DOWN.1)], &due, t(2100), &[]);
        let h = record(&h, [reading(UP.0, UP.1)], &reported, t(5000), &[]);
        let outcomes: Vec<Outcome> = h.0["mlx5_0/1"].iter().map(|x| x.outcome).collect();
        assert_eq!(outcomes, [Outcome::Reported, Outcome::Reported, Outcome::Reported]);
        assert_eq!(h.0["mlx5_0/1"][1].at_ms, ms(100), "the time the DOWN was seen, not when it was reported");
        let causes: Vec<Option<&str>> = h.0["mlx5_0/1"].iter().map(|x| x.cause.as_deref()).collect();
        assert_eq!(causes, [None, Some("cable-or-far-end"), None], "the cause of the event that reported it");
        assert!(timeline(&h).lines().nth(1).unwrap().contains("reported, probable cause: cable-or-far-end"));
    }

    #[test]
    fn flapping_and_quiet_transitions_are_kept_and_history_is_bounded() {
        let flapping = PortDecisions { flapping: port(), ..Default::default() };
        let mut h = History::default();
        for i in 0..(PER_PORT as i64 + 10) {
            let (s, p) = if i % 2 == 0 { DOWN } else { UP };
            h = record(&h, [reading(s, p)], &flapping, t(i * 10), &[]);
        }
        let list = &h.0["mlx5_0/1"];
        assert_eq!(list.len(), PER_PORT);
        assert!(list.iter().all(|x| x.outcome == Outcome::Flapping));
        assert_eq!(list.last().unwrap().at_ms, ms((PER_PORT as i64 + 9) * 10), "the newest kept");
        assert_eq!(list[0].at_ms, ms(10 * 10), "the oldest dropped");
        let quiet = record(
            &h,
            [PortReading { device: "mlx5_1", port: 1, state: "DOWN", phys_state: "Polling", healthy: false }],
            &PortDecisions::default(),
            t(0),
            &[],
        );
        assert_eq!(quiet.0["mlx5_1/1"][0].outcome, Outcome::Quiet);

        let mut many = History::default();
        for i in 0..(MAX_PORTS + 5) {
            let dev = format!("mlx5_{i}");
            many = record(
                &many,
                [PortReading { device: &dev, port: 1, state: "ACTIVE", phys_state: "LinkUp", healthy: true }],
                &PortDecisions::default(),
                t(i as i64),
                &[],
            );
        }
        assert_eq!(many.0.len(), MAX_PORTS);
        assert!(!many.0.contains_key("mlx5_0/1") && many.0.contains_key(&format!("mlx5_{}/1", MAX_PORTS + 4)));
    }

    /// Eight NICs with history, then a device of 1,000 ports whose ports go down and come
    /// back: the history is full, and every port evicted is the big device's; the eight
    /// NICs' transitions are all still there (they used to be evicted: their last
    /// transitions were the oldest).
    #[test]
    fn eight_nics_keep_their_history_beside_a_device_of_1000_ports() {
        let none = PortDecisions::default();
        let nics: Vec<String> = (0..8).map(|i| format!("mlx5_{i}")).collect();
        let nic = |i: usize, (state, phys_state): (&'static str, &'static str)| PortReading {
            device: &nics[i],
            port: 1,
            state,
            phys_state,
            healthy: state == UP.0,
        };
        let mut h = History::default();
        for (poll, cond) in [UP, DOWN, UP].into_iter().enumerate() {
            h = record(&h, (0..8).map(|i| nic(i, cond)), &none, t(poll as i64 * 1000), &[]);
        }
        let before: Vec<PortList> = nics.iter().map(|n| h.0[&key(n, 1)].clone()).collect();
        assert!(before.iter().all(|l| l.len() == 3));
        for poll in 0..4i64 {
            let (state, phys_state) = if poll % 2 == 0 { DOWN } else { UP };
            let big = (1..=1000).map(|port| PortReading {
                device: "mlx5_99",
                port,
                state,
                phys_state,
                healthy: state == UP.0,
            });
            h = record(&h, (0..8).map(|i| nic(i, UP)).chain(big), &none, t(10_000 + poll * 1000), &[]);
            assert_eq!(h.0.len(), MAX_PORTS);
            for (n, was) in nics.iter().zip(&before) {
                assert_eq!(h.0.get(&key(n, 1)), Some(was), "{n}'s history survives poll {poll}");
            }
        }
        assert_eq!(h.0.keys().filter(|k| k.starts_with("mlx5_99/")).count(), MAX_PORTS - 8);
    }

    /// Eight NICs with history, then 500 single-port devices that appear and go down and
    /// come back: the history is full, the devices evicted are the newcomers, and the eight
    /// NICs' transitions are all still there (ties between devices of one port each used to
    /// go by the oldest last transition: the eight NICs').
    #[test]
    fn eight_nics_keep_their_history_beside_500_new_devices() {
        let none = PortDecisions::default();
        let nics: Vec<String> = (0..8).map(|i| format!("mlx5_{i}")).collect();
        let extra: Vec<String> = (0..500).map(|i| format!("rxe_{i}")).collect();
        fn reading<'a>(device: &'a str, (state, phys_state): (&'static str, &'static str)) -> PortReading<'a> {
            PortReading { device, port: 1, state, phys_state, healthy: state == UP.0 }
        }
        let mut h = History::default();
        for (poll, cond) in [UP, DOWN, UP].into_iter().enumerate() {
            h = record(&h, nics.iter().map(|n| reading(n, cond)), &none, t(poll as i64 * 1000), &[]);
        }
        let before: Vec<PortList> = nics.iter().map(|n| h.0[&key(n, 1)].clone()).collect();
        for poll in 0..4i64 {
            let cond = if poll % 2 == 0 { DOWN } else { UP };
            let ports = nics.iter().map(|n| reading(n, UP)).chain(extra.iter().map(|n| reading(n, cond)));
            h = record(&h, ports, &none, t(10_000 + poll * 1000), &[]);
            assert_eq!(h.0.len(), MAX_PORTS);
            for (n, was) in nics.iter().zip(&before) {
                assert_eq!(h.0.get(&key(n, 1)), Some(was), "{n}'s history survives poll {poll}");
            }
        }
        assert_eq!(h.0.keys().filter(|k| k.starts_with("rxe_")).count(), MAX_PORTS - 8);
    }

    /// A history of more ports and longer lists than the bounds (a file nicmon never
    /// wrote): loaded, it holds at most [`MAX_PORTS`] ports of at most [`PER_PORT`]
    /// transitions, each port's newest, and the big device's ports are the ones dropped.
    #[test]
    fn a_loaded_history_keeps_at_most_the_bound() {
        let transition = |i: usize| {
            format!(r#"{{"at_ms":{i},"state":"DOWN","phys_state":"Disabled","healthy":false,"outcome":"quiet"}}"#)
        };
        let list = |n: usize| format!("[{}]", (0..n).map(transition).collect::<Vec<_>>().join(","));
        let mut ports: Vec<String> = (0..8).map(|i| format!(r#""mlx5_{i}/1":{}"#, list(3))).collect();
        ports.extend((1..=1000).map(|p| format!(r#""mlx5_99/{p}":{}"#, list(PER_PORT + 10))));
        let text = format!("{{{}}}", ports.join(","));
        let h: History = serde_json::from_str(&text).unwrap();
        assert_eq!(h.0.len(), MAX_PORTS);
        assert!(h.0.values().all(|l| l.len() <= PER_PORT));
        let big = h.0.iter().find(|(k, _)| k.starts_with("mlx5_99/")).map(|(_, l)| l).unwrap();
        assert_eq!((big.len(), big[0].at_ms, big[PER_PORT - 1].at_ms), (PER_PORT, 10, PER_PORT as i64 + 9));
        assert!((0..8).all(|i| h.0[&format!("mlx5_{i}/1")].len() == 3), "the small NICs are all kept");
        // What nicmon writes loads as it was.
        let back: History = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn select_takes_a_nic_or_a_port() {
        let mut h = History::default();
        for (dev, port) in [("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_10", 1)] {
            h = record(
                &h,
                [PortReading { device: dev, port, state: "ACTIVE", phys_state: "LinkUp", healthy: true }],
                &PortDecisions::default(),
                t(0),
                &[],
            );
        }
        let keys = |h: History| h.0.into_keys().collect::<Vec<_>>();
        assert_eq!(keys(h.select(Some("mlx5_0"))), ["mlx5_0/1", "mlx5_0/2"]);
        assert_eq!(keys(h.select(Some("mlx5_0/2"))), ["mlx5_0/2"]);
        assert_eq!(keys(h.select(None)).len(), 3);
        assert_eq!(timeline(&h.select(Some("mlx5_9"))), "no port transitions recorded\n");
    }
}
