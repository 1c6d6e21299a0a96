//! The counter evaluator: pure `(previous state, counter readings, rules, now) -> (events,
//! next state)` (001 §6.3, §10.4).
//!
//! Per (port, rule) — state key `<device>:<port>:<rule name>`:
//! 1. first sight: with `reboot`, a healthy baseline event; the snapshot starts here;
//! 2. a value below the last one (or, without a last value, below the snapshot) is a
//!    reset: a breached or saturated counter recovers (one healthy event), the snapshot
//!    restarts from the new value;
//! 3. a value at the maximum of a saturating counter: one non-fatal saturation event per
//!    episode, no threshold evaluation (SPEC §1.4);
//! 4. a breached counter stays latched: nothing is evaluated, nothing is sent — except a
//!    rate of the RoCE physical layer ([`Measure::clears`]: pre-FEC BER, time paused),
//!    which is still measured each window and clears (one healthy event) when a window
//!    measures at or below its threshold again;
//! 5. delta: `value - snapshot > threshold`, snapshot advanced every poll; velocity: once
//!    at least one `velocityUnit` of real time has passed since the snapshot,
//!    `(value - snapshot) / elapsed` in that unit `> threshold`, then the snapshot advances
//!    (never extrapolated from a shorter sample); a [`Measure::BitErrorRate`] rule divides
//!    the per-second increase by the port's rate, a [`Measure::TimeShare`] rule the
//!    microseconds per second by 10^6;
//! 6. a breach emits one unhealthy event and latches.
//!
//! A rule is evaluated only on ports of its link layers ([`super::rule::Layers`]).
//! Every event is filed under the port's degradation check (`InfiniBandDegradationCheck` /
//! `EthernetDegradationCheck` / `EFADegradationCheck`) with `errorCode = [<rule name>]`, so a
//! counter's recovery clears only that counter's condition (lessons 5, 12). Rules that
//! share an error code ([`CounterRule::error_code`]: two stages of one condition) file
//! their breaches under it; a healthy event for it (a recovery, a reboot's baseline) is sent
//! once, when no rule sharing it still holds a breach or a saturation on the port.
//!
//! Time: a reading is stamped with the poll's `now`, except a port's ethtool counters
//! ([`super::rule::ETHTOOL_PREFIX`]), which are read at their own pace and kept in between:
//! they are stamped with the time they were read ([`CounterPort::ethtool_age`] before
//! `now`), so deltas and velocity windows span the reads, not the polls. Events carry `now`.
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use super::rule::{CounterRule, DEVICE_TEMPLATE_PREFIX, ETHTOOL_PREFIX, Measure, ThresholdType, VelocityUnit};
use super::width;
use crate::model::driver::RdmaDriver;
use crate::model::event::{Check, Entity, HealthEvent, Stamp};
use crate::model::{LinkLayer, Port};

/// The counter readings of one monitored PF port (the caller leaves out management NICs,
/// VFs and unmonitored devices).
#[derive(Debug, Clone, Copy)]
pub struct CounterPort<'a> {
    pub device: &'a str,
    pub port: u32,
    pub link_layer: Option<&'a LinkLayer>,
    /// The device's RDMA driver (`None`: not recognised): a rule is evaluated only on ports
    /// of its drivers ([`CounterRule::drivers`]).
    pub driver: Option<RdmaDriver>,
    /// Values keyed by rule path (`counters/link_downed`); unreadable ones absent.
    pub counters: &'a BTreeMap<std::sync::Arc<str>, u64>,
    /// The port's rate in bit/s (its RDMA `rate`), for [`Measure::BitErrorRate`] rules;
    /// `None`: unknown, and such rules are not evaluated on the port.
    pub rate_bps: Option<f64>,
    /// The pre-FEC BER threshold of this port's FEC code, where the operator set none and
    /// the code is known ([`crate::decide::phy::rs_code`]); else the rule's threshold.
    pub ber_threshold: Option<f64>,
    /// How long before `now` the port's ethtool counters were read (zero: this poll).
    pub ethtool_age: std::time::Duration,
}

impl<'a> CounterPort<'a> {
    pub fn new(device: &'a str, driver: Option<RdmaDriver>, port: &'a Port) -> CounterPort<'a> {
        CounterPort {
            device,
            port: port.number,
            link_layer: port.link_layer.as_ref(),
            driver,
            counters: &port.counters,
            rate_bps: port.rate_bps(),
            ber_threshold: None,
            ethtool_age: port.ethtool_age.unwrap_or_default(),
        }
    }

    /// Whether `rule` is evaluated on this port: enabled, and the port of one of its link
    /// layers and drivers.
    pub fn applies(&self, rule: &CounterRule) -> bool {
        rule.enabled && rule.layers.covers(self.link_layer) && rule.drivers.covers(self.driver)
    }

    /// The check this port's counter events are filed under. Anything not Ethernet or EFA
    /// (InfiniBand, an unknown or unreadable link layer) goes to the InfiniBand check.
    pub fn check(&self) -> Check {
        match self.link_layer {
            Some(LinkLayer::Ethernet) => Check::EthernetDegradationCheck,
            Some(LinkLayer::Efa) => Check::EFADegradationCheck,
            _ => Check::InfiniBandDegradationCheck,
        }
    }
}

/// State key of a (port, rule): `mlx5_0:1:link_downed` (001 §6.6).
pub fn counter_key(device: &str, port: u32, rule_name: &str) -> String {
    let mut key = String::with_capacity(device.len() + rule_name.len() + 12);
    write_counter_key(&mut key, device, port, rule_name);
    key
}

/// [`counter_key`] into `out` (cleared first): a poll makes one key per counter, in one buffer.
pub fn write_counter_key(out: &mut String, device: &str, port: u32, rule_name: &str) {
    out.clear();
    out.push_str(device);
    out.push(':');
    // The port's digits without the formatting machinery (a poll makes thousands of keys).
    let mut digits = [0u8; 10];
    let mut n = port;
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
    out.push(':');
    out.push_str(rule_name);
}

/// The parts of a [`counter_key`]: `(device, port, rule name)`. Rule names and port numbers
/// have no `:`; a device name with one still splits right.
pub fn parse_counter_key(key: &str) -> Option<(&str, u32, &str)> {
    let (rest, rule) = key.rsplit_once(':')?;
    let (device, port) = rest.rsplit_once(':')?;
    Some((device, port.parse().ok()?, rule))
}

/// A counter reading kept as the base of the next delta or velocity window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSnapshot {
    pub value: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub timestamp: OffsetDateTime,
}

/// A latched threshold breach (001 §6.6 `CounterBreachFlag`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breach {
    pub breached: bool,
    /// The check the breach event was filed under; its recovery uses the same one.
    pub check_name: String,
    pub is_fatal: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

/// A reported saturation episode: the counter sits at the maximum of its width.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saturation {
    pub check_name: String,
    pub value: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

/// What the counter checks carry from one poll to the next; persisted in the state file.
/// All maps are keyed by [`counter_key`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CounterState {
    /// Keyed by a shared key: the snapshots and the last values of a counter (and the
    /// copies a poll makes of the state) hold one allocation of its key — a device of a
    /// thousand ports has tens of thousands of counters.
    #[serde(default)]
    pub counter_snapshots: BTreeMap<Arc<str>, CounterSnapshot>,
    /// The value read at the previous poll (reset detection, 001 §6.3). Shared with the
    /// previous poll's state until a value moves ([`LastValues::set`]): on a quiet node no
    /// poll copies it (a device of a thousand ports: tens of thousands of values), and what
    /// reads it every poll (the metrics) can tell it is the same.
    #[serde(default)]
    pub last_values: LastValues,
    /// Only latched breaches are kept; a recovered counter's entry is removed.
    #[serde(default)]
    pub breach_flags: BTreeMap<String, Breach>,
    #[serde(default)]
    pub saturation_flags: BTreeMap<String, Saturation>,
    /// The last full window's measure of each [`Measure::BitErrorRate`] and
    /// [`Measure::TimeShare`] rule (the BER, the share of time paused), for the report and
    /// the metrics.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub measured: BTreeMap<String, f64>,
}

impl CounterState {
    pub fn is_breached(&self, key: &str) -> bool {
        self.breach_flags.get(key).is_some_and(|b| b.breached)
    }

    /// Number of (port, rule) pairs currently saturated (the `counters saturated` metric).
    pub fn saturated_count(&self) -> usize {
        self.saturation_flags.len()
    }

    /// Whether this counter is saturated now. While it is, its thresholds are not evaluated:
    /// an unhealthy event about it this poll is its saturation event, not a breach.
    pub fn is_saturated(&self, device: &str, port: u32, rule_name: &str) -> bool {
        self.saturation_flags.contains_key(&counter_key(device, port, rule_name))
    }

    /// The last full window's measure of `rule_name` on a port ([`CounterState::measured`]).
    pub fn measured(&self, device: &str, port: u32, rule_name: &str) -> Option<f64> {
        self.measured.get(&counter_key(device, port, rule_name)).copied()
    }

    /// The (device, port, rule name) of every counter saturated now.
    pub fn saturated(&self) -> impl Iterator<Item = (&str, u32, &str)> {
        self.saturation_flags.keys().filter_map(|k| parse_counter_key(k))
    }
}

/// The last value read of each counter ([`CounterState::last_values`]): a map shared with
/// the states it was copied into, copied on the first write that changes it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LastValues(Arc<BTreeMap<Arc<str>, u64>>);

impl LastValues {
    pub fn get(&self, key: &str) -> Option<u64> {
        self.0.get(key).copied()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &u64)> {
        self.0.iter()
    }

    /// Set `key` to `value` (its key shared with `shared`'s where that has it); the value
    /// before. The map is copied (when shared) only if `value` is new.
    pub fn set<W>(&mut self, shared: &BTreeMap<Arc<str>, W>, key: &str, value: u64) -> Option<u64> {
        let before = self.get(key);
        if before != Some(value) {
            put_shared(Arc::make_mut(&mut self.0), shared, key, value);
        }
        before
    }

    /// Set `key` to `value` as given; the value before.
    pub fn insert(&mut self, key: Arc<str>, value: u64) -> Option<u64> {
        Arc::make_mut(&mut self.0).insert(key, value)
    }

    /// Forget `key`; its value if it had one.
    pub fn remove(&mut self, key: &str) -> Option<u64> {
        self.0.contains_key(key).then(|| Arc::make_mut(&mut self.0).remove(key)).flatten()
    }

    pub fn clear(&mut self) {
        if !self.0.is_empty() {
            Arc::make_mut(&mut self.0).clear();
        }
    }

    /// Whether `self` and `other` are the same map, not a copy or an equal one (then
    /// nothing was set since one was cloned from the other).
    pub fn same_as(&self, other: &LastValues) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A handle that tells, later, whether a map is still this one ([`LastValues::same_as`])
    /// without keeping its values alive.
    pub fn handle(&self) -> std::sync::Weak<BTreeMap<Arc<str>, u64>> {
        Arc::downgrade(&self.0)
    }

    /// Whether `handle` is this map's ([`LastValues::handle`]).
    pub fn is(&self, handle: &std::sync::Weak<BTreeMap<Arc<str>, u64>>) -> bool {
        std::ptr::eq(handle.as_ptr(), Arc::as_ptr(&self.0))
    }
}

impl FromIterator<(Arc<str>, u64)> for LastValues {
    fn from_iter<I: IntoIterator<Item = (Arc<str>, u64)>>(iter: I) -> Self {
        LastValues(Arc::new(iter.into_iter().collect()))
    }
}

/// Evaluate one poll's counter readings.
///
/// `reboot`: the boot ID changed at startup and the counter state was cleared (001 §6.5);
/// every (port, rule) seen for the first time then gets a healthy baseline event.
/// Disabled rules and counters absent from a port are skipped silently (fail open, 001 §7).
pub fn evaluate(
    prev: &CounterState,
    ports: &[CounterPort<'_>],
    rules: &[CounterRule],
    now: OffsetDateTime,
    reboot: bool,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, CounterState) {
    evaluate_shared(prev, ports, rules, &shared_of(rules), now, reboot, stamp)
}

/// [`evaluate`] with the rules' [`RuleFacts`] made beforehand (once per rule set: the
/// daemon's rules do not change between polls).
pub fn evaluate_with(
    prev: &CounterState,
    ports: &[CounterPort<'_>],
    rules: &[CounterRule],
    facts: &RuleFacts,
    now: OffsetDateTime,
    reboot: bool,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, CounterState) {
    evaluate_shared(prev, ports, rules, &facts.for_rules(rules), now, reboot, stamp)
}

/// [`evaluate`] with each rule's [`Shared`] facts, in rule order.
fn evaluate_shared(
    prev: &CounterState,
    ports: &[CounterPort<'_>],
    rules: &[CounterRule],
    shared: &[Shared],
    now: OffsetDateTime,
    reboot: bool,
    stamp: &Stamp,
) -> (Vec<HealthEvent>, CounterState) {
    let mut next = prev.clone();
    let mut events = Vec::new();
    let mut key = String::new();
    for p in ports {
        let ethtool_at = now - p.ethtool_age;
        for (i, rule) in rules.iter().enumerate().filter(|(_, r)| p.applies(r)) {
            let Some(&value) = p.counters.get(rule.path.as_str()) else {
                continue;
            };
            let read_at = if rule.path.starts_with(ETHTOOL_PREFIX) { ethtool_at } else { now };
            let at = Reading { port: p, rule, rules, value, now, read_at, stamp, shared: &shared[i] };
            write_counter_key(&mut key, p.device, p.port, &rule.name);
            step(&mut next, &mut events, &key, &at, reboot);
        }
    }
    (events, next)
}

/// What the evaluation needs to know of each rule beyond the rule itself, per rule in the
/// rules' order ([`RuleFacts::of`]): made from the whole rule set, so once per set rather
/// than once per poll (~80 default rules compared with each other).
#[derive(Debug, Clone, PartialEq)]
pub struct RuleFacts {
    shared: Vec<Shared>,
    /// Of each rule, what the facts were made from: (name, error code, enabled, path).
    made_from: Vec<(String, String, bool, String)>,
}

/// The other enabled rules that share a rule's error code, and whether it is the first of
/// them in rule order (the one that says a reboot's baseline for the code).
#[derive(Debug, Clone, PartialEq)]
struct Shared {
    /// Indices of those rules.
    others: Vec<usize>,
    first: bool,
    /// The rule's counter's width ([`width::width`] of its path).
    width: Option<width::Width>,
}

impl RuleFacts {
    pub fn of(rules: &[CounterRule]) -> RuleFacts {
        let made_from =
            rules.iter().map(|r| (r.name.clone(), r.code().to_owned(), r.enabled, r.path.clone())).collect();
        RuleFacts { shared: shared_of(rules), made_from }
    }

    /// These facts when they were made from `rules`, else `rules`' own made now: facts of
    /// another rule set are never used.
    fn for_rules(&self, rules: &[CounterRule]) -> std::borrow::Cow<'_, [Shared]> {
        let same = |(r, (name, code, enabled, path)): (&CounterRule, &(String, String, bool, String))| {
            r.name == *name && r.code() == code && r.enabled == *enabled && r.path == *path
        };
        match self.made_from.len() == rules.len() && rules.iter().zip(&self.made_from).all(same) {
            true => std::borrow::Cow::Borrowed(&self.shared),
            false => std::borrow::Cow::Owned(shared_of(rules)),
        }
    }
}

/// Each rule's [`Shared`] facts, in rule order.
fn shared_of(rules: &[CounterRule]) -> Vec<Shared> {
    let shared = rules.iter().enumerate().map(|(i, r)| {
        let same = |o: &&CounterRule| o.enabled && o.code() == r.code();
        let others = rules.iter().enumerate().filter(|(_, o)| same(o) && o.name != r.name).map(|(j, _)| j).collect();
        Shared { others, first: !rules[..i].iter().any(|o| same(&o)), width: width::width(&r.path) }
    });
    shared.collect()
}

/// Counters read at the previous poll that are unreadable at this one (the file gone, or
/// not a number, such as EFA's `N/A`): `(device, port, rule name)`. They are not evaluated
/// this poll; their last value is forgotten in `next`, so each episode is said once and the
/// next number read is compared with the window's snapshot (a lower one is a reset).
pub fn went_unreadable(
    prev: &CounterState,
    next: &mut CounterState,
    ports: &[CounterPort<'_>],
    rules: &[CounterRule],
) -> Vec<(String, u32, String)> {
    let mut out = Vec::new();
    let mut key = String::new();
    for p in ports {
        for rule in rules.iter().filter(|r| p.applies(r)) {
            if p.counters.contains_key(rule.path.as_str()) {
                continue;
            }
            write_counter_key(&mut key, p.device, p.port, &rule.name);
            if prev.last_values.contains_key(key.as_str()) {
                next.last_values.remove(key.as_str());
                out.push((p.device.to_owned(), p.port, rule.name.clone()));
            }
        }
    }
    out
}

struct Reading<'a> {
    port: &'a CounterPort<'a>,
    rule: &'a CounterRule,
    /// All the rules ([`Shared::others`] are indices into them).
    rules: &'a [CounterRule],
    value: u64,
    /// The poll's time: the events'.
    now: OffsetDateTime,
    /// When the value was read: the windows' (see the module doc).
    read_at: OffsetDateTime,
    stamp: &'a Stamp,
    shared: &'a Shared,
}

impl Reading<'_> {
    fn event(&self, check: Check, message: &str) -> HealthEvent {
        HealthEvent::new(check, self.stamp, self.now, message)
            .entities(vec![Entity::device(self.port.device), Entity::port(self.port.port)])
            .error_code(self.rule.code())
    }

    /// A healthy event for this rule's error code, unless a rule sharing the code still
    /// holds a breach or a saturation on the port (its own recovery says it later).
    fn healthy(&self, st: &CounterState, check: Check, message: &str) -> Option<HealthEvent> {
        let held = self.shared.others.iter().any(|&other| {
            let key = counter_key(self.port.device, self.port.port, &self.rules[other].name);
            st.is_breached(&key) || st.saturation_flags.contains_key(&key)
        });
        (!held).then(|| self.event(check, message))
    }

    /// This reading as the base of the next window.
    fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot { value: self.value, timestamp: self.read_at }
    }

    fn where_(&self) -> String {
        format!("port {} port {}", self.port.device, self.port.port)
    }
}

/// `map[key] = value`, the key allocated only when it is new (a poll updates every
/// counter's entries); the value it replaces.
fn put<K: std::borrow::Borrow<str> + Ord + for<'k> From<&'k str>, V>(
    map: &mut BTreeMap<K, V>,
    key: &str,
    value: V,
) -> Option<V> {
    match map.get_mut(key) {
        Some(slot) => Some(std::mem::replace(slot, value)),
        None => {
            map.insert(K::from(key), value);
            None
        }
    }
}

/// [`put`] into a map keyed by a shared key: the key of the counter's entry in `shared`
/// when it has one (its snapshots and last values: one allocation for both).
fn put_shared<V, W>(map: &mut BTreeMap<Arc<str>, V>, shared: &BTreeMap<Arc<str>, W>, key: &str, value: V) -> Option<V> {
    match map.get_mut(key) {
        Some(slot) => Some(std::mem::replace(slot, value)),
        None => {
            let k = shared.get_key_value(key).map(|(k, _)| k.clone()).unwrap_or_else(|| Arc::from(key));
            map.insert(k, value);
            None
        }
    }
}

/// One (port, rule) reading through the steps of the module doc, in order.
fn step(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>, reboot: bool) {
    let snapshot = st.counter_snapshots.get(key).copied();
    let last = st.last_values.set(&st.counter_snapshots, key, at.value);
    let Some(snap) = snapshot else {
        return first_sight(st, events, key, at, reboot);
    };
    // 001 §6.3: the last poll's value first (a reset mid-window), the snapshot after a
    // restart; a value below the snapshot is a reset in any case (monotonic in between).
    if at.value < last.unwrap_or(snap.value) || at.value < snap.value {
        return reset(st, events, key, at);
    }
    if saturation(st, events, key, at) {
        return;
    }
    let breached = st.is_breached(key);
    if breached && !at.rule.measure.clears() {
        return; // latched until a reset or a reboot (001 §6.3)
    }
    match (threshold(st, key, at, snap), breached) {
        (Judged::Above(rate), false) => breach(st, events, key, at, at.value - snap.value, &rate),
        (Judged::Below, true) => fell_back(st, events, key, at),
        _ => {}
    }
}

/// Step 1: the first reading of this (port, rule) starts its snapshot; after a reboot it is
/// said healthy.
fn first_sight(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>, reboot: bool) {
    if reboot && at.shared.first {
        events.push(
            at.event(at.port.check(), &format!("Counter {} healthy after reboot on {}", at.rule.name, at.where_())),
        );
    }
    put_shared(&mut st.counter_snapshots, &st.last_values.0, key, at.snapshot());
    saturation(st, events, key, at);
}

/// Step 2: a reset ends a breach or a saturation episode (one healthy event, under the
/// check it was filed under) and restarts the snapshot.
fn reset(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>) {
    let breach = st.breach_flags.remove(key).filter(|b| b.breached);
    let saturated = st.saturation_flags.remove(key);
    let check_name = breach.map(|b| b.check_name).or(saturated.map(|s| s.check_name));
    if let Some(name) = check_name {
        let check = Check::parse(&name).unwrap_or_else(|| at.port.check());
        events.extend(at.healthy(st, check, &format!("Counter {} recovered on {}", at.rule.name, at.where_())));
    }
    put_shared(&mut st.counter_snapshots, &st.last_values.0, key, at.snapshot());
}

/// What a threshold comparison found.
enum Judged {
    /// No window to judge yet (velocity: the window is not full; the rate is unknown).
    NotYet,
    Below,
    /// A breach, with the rate as said in its message.
    Above(String),
}

/// Step 5: the rule's threshold against the snapshot, advancing the snapshot as the
/// threshold type says.
fn threshold(st: &mut CounterState, key: &str, at: &Reading<'_>, snap: CounterSnapshot) -> Judged {
    let delta = at.value - snap.value;
    let elapsed = at.read_at - snap.timestamp;
    match at.rule.threshold_type {
        ThresholdType::Delta => {
            put_shared(&mut st.counter_snapshots, &st.last_values.0, key, at.snapshot());
            if delta as f64 <= at.rule.threshold {
                return Judged::Below;
            }
            // The rate is only said in a breach's message: made only then.
            Judged::Above(match elapsed.is_positive() {
                true => format!("{:.2}/sec", delta as f64 / elapsed.as_seconds_f64()),
                false => "n/a".to_owned(),
            })
        }
        ThresholdType::Velocity => {
            let unit = at.rule.velocity_unit.unwrap_or(VelocityUnit::Second);
            if elapsed.is_negative() {
                // The wall clock stepped back: no window can be measured against the
                // snapshot any more, start a new one.
                put_shared(&mut st.counter_snapshots, &st.last_values.0, key, at.snapshot());
                return Judged::NotYet;
            }
            if elapsed < Duration::seconds(i64::from(unit.seconds())) {
                return Judged::NotYet; // window not full yet: hold the snapshot
            }
            put_shared(&mut st.counter_snapshots, &st.last_values.0, key, at.snapshot());
            let per_second = delta as f64 / elapsed.as_seconds_f64();
            match at.rule.measure {
                Measure::Count => {
                    let rate = per_second * f64::from(unit.seconds());
                    judge(rate > at.rule.threshold, || format!("{rate:.2}/{}", unit.suffix()))
                }
                Measure::BitErrorRate | Measure::TimeShare => measured(st, key, at, per_second),
            }
        }
    }
}

fn judge(above: bool, rate: impl FnOnce() -> String) -> Judged {
    if above { Judged::Above(rate()) } else { Judged::Below }
}

/// A [`Measure::BitErrorRate`] or [`Measure::TimeShare`] window: the measure kept in
/// [`CounterState::measured`] and compared with the rule's (or the port's) threshold.
fn measured(st: &mut CounterState, key: &str, at: &Reading<'_>, per_second: f64) -> Judged {
    let (value, threshold, label) = match at.rule.measure {
        Measure::BitErrorRate => {
            let Some(rate) = at.port.rate_bps else {
                st.measured.remove(key);
                return Judged::NotYet; // no port rate: no BER
            };
            (per_second / rate, at.port.ber_threshold.unwrap_or(at.rule.threshold), "BER")
        }
        _ => ((per_second / 1e6).min(1.0), at.rule.threshold, "share of time"),
    };
    put(&mut st.measured, key, value);
    judge(value > threshold, || format!("{label} {value:.2e} > {threshold:.2e} over the last window"))
}

/// A [`Measure::clears`] rule whose window measured at or below its threshold again: one
/// healthy event under the check the breach was filed under; the latch is lifted.
fn fell_back(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>) {
    let Some(b) = st.breach_flags.remove(key) else {
        return;
    };
    let check = Check::parse(&b.check_name).unwrap_or_else(|| at.port.check());
    let now = st.measured.get(key).map(|v| format!(" ({v:.2e})")).unwrap_or_default();
    let message = format!("Counter {} back below its threshold{now} on {}", at.rule.name, at.where_());
    events.extend(at.healthy(st, check, &message));
}

/// Step 6: a breach emits one unhealthy event and latches.
fn breach(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>, delta: u64, rate: &str) {
    let check = at.port.check();
    let what = if at.rule.description.is_empty() {
        at.rule.name.clone()
    } else {
        format!("{} - {}", at.rule.name, at.rule.description)
    };
    let value = at.value;
    events.push(
        at.event(
            check,
            &format!(
                "Port {} port {}: {what} (value={value}, delta={delta}, rate={rate})",
                at.port.device, at.port.port
            ),
        )
        .unhealthy(at.rule.is_fatal),
    );
    st.breach_flags.insert(
        key.to_owned(),
        Breach { breached: true, check_name: check.as_str().to_owned(), is_fatal: at.rule.is_fatal, since: at.now },
    );
}

/// Step 3, saturation episodes (SPEC §1.4): report a counter at its maximum once. Returns
/// whether the counter is saturated now (then its thresholds are not evaluated).
fn saturation(st: &mut CounterState, events: &mut Vec<HealthEvent>, key: &str, at: &Reading<'_>) -> bool {
    let w = at.shared.width;
    let max = w.and_then(|w| w.saturation_value());
    if max != Some(at.value) {
        // Left the maximum upwards: it was a wider counter after all (width.rs), and the
        // episode ends. (A value below the maximum is a reset, handled by the caller.)
        if let Some(s) = st.saturation_flags.remove(key)
            && !st.is_breached(key)
        {
            let check = Check::parse(&s.check_name).unwrap_or_else(|| at.port.check());
            events.extend(at.healthy(st, check, &format!("Counter {} recovered on {}", at.rule.name, at.where_())));
        }
        return false;
    }
    if !st.saturation_flags.contains_key(key) {
        let check = at.port.check();
        let bits = w.map(|w| w.bits()).unwrap_or(64);
        events.push(
            at.event(
                check,
                &format!(
                    "Port {} port {}: {} counter saturated (CounterSaturated): value {} is the \
                     maximum of this {bits}-bit counter, further increments are not counted - \
                     a counter reset is needed",
                    at.port.device, at.port.port, at.rule.name, at.value
                ),
            )
            .unhealthy(false),
        );
        st.saturation_flags.insert(
            key.to_owned(),
            Saturation { check_name: check.as_str().to_owned(), value: at.value, since: at.now },
        );
    }
    true
}

/// The (device, port, rule name) of every enabled rule whose counter a port does not have:
/// for one startup log line each (001 §7.1), never an error or an event. A counter whose
/// other generation's name is read there ([`CounterRule::alias`]) is not missing.
pub fn missing(ports: &[CounterPort<'_>], rules: &[CounterRule]) -> Vec<(String, u32, String)> {
    let mut out = Vec::new();
    for p in ports {
        // A device-level counter is read on port 1 only: not missing elsewhere.
        let device_level = |r: &CounterRule| r.path.starts_with(DEVICE_TEMPLATE_PREFIX);
        let renamed = |r: &CounterRule| r.alias.as_deref().is_some_and(|a| p.counters.contains_key(a));
        for r in rules.iter().filter(|r| p.applies(r) && (p.port == 1 || !device_level(r)) && !renamed(r)) {
            if !p.counters.contains_key(r.path.as_str()) {
                out.push((p.device.to_owned(), p.port, r.name.clone()));
            }
        }
    }
    out
}
