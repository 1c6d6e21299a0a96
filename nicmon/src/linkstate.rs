//! Link state checks (SPEC §1.3, 000 §3–§9; `InfiniBandStateCheck`, `EthernetStateCheck`).
//!
//! Pure: `(previous state, snapshot, roles, config, now) → (events, next state)`. No clock,
//! no I/O. Decisions made here, in order:
//! - port health per poll, one event per health boundary crossing (and one more for an
//!   escalation from non-fatal to fatal);
//! - card homogeneity per role group `(role, link layer)`;
//! - device disappearance after 3 consecutive misses, with the inline PCI probe's verdict;
//! - speed degradation against the group's rate mode; Subnet Manager / LID changes.
use std::collections::{BTreeMap, BTreeSet};

use time::{Duration, OffsetDateTime};

use crate::event::{Check, Entity, HealthEvent, Stamp};
use crate::model::{Device, LinkLayer, PciPresence, PhysState, Port, PortState, Snapshot};
use crate::roles::{Classification, Role, device_link_layer};
use crate::state::{KnownDevice, PortRecord, Reported, State};

/// Consecutive polls a known device must be absent before it is reported (lesson 8).
pub const MISSES_BEFORE_REPORT: u32 = 3;
/// A port deferred as "maybe uncabled" on the first poll is decided within this many polls.
pub const MAX_DEFERRED_POLLS: u32 = 3;

/// The knobs of the state checks.
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// A non-fatal port that was healthy in this boot escalates to fatal after this long.
    pub escalation_grace: Duration,
    pub speed_degradation_fatal: bool,
    /// Checks enabled (`--checks`).
    pub checks: BTreeSet<Check>,
}

impl Default for StateConfig {
    fn default() -> StateConfig {
        StateConfig {
            escalation_grace: Duration::seconds(30),
            speed_degradation_fatal: false,
            checks: Check::ALL.into_iter().collect(),
        }
    }
}

/// How unhealthy a port is, before escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortHealth {
    Healthy,
    /// Unhealthy but not (yet) fatal. `escalates`: logical DOWN while training, INIT, ARMED —
    /// fatal after the grace, or at once when its card is below its peers.
    NonFatal {
        escalates: bool,
    },
    Fatal,
    /// An Ethernet port in a state that is not reported (INIT, ARMED: sub-second transients).
    Quiet,
    /// State unreadable: no decision this poll.
    Unknown,
}

/// The state check of a link layer.
pub fn state_check(ll: &LinkLayer) -> Option<Check> {
    match ll {
        LinkLayer::InfiniBand => Some(Check::InfiniBandStateCheck),
        LinkLayer::Ethernet => Some(Check::EthernetStateCheck),
        // EFA state (from the netdev) is judged by its own check, not from these files:
        // the efa driver hard-codes ACTIVE/LinkUp in them.
        LinkLayer::Efa | LinkLayer::Unknown(_) => None,
    }
}

/// The state check of a device whose link layer is known only by name (state file):
/// Ethernet's, else InfiniBand's (a disappearance is reported once, under one check: lesson 7).
fn state_check_named(link_layer: &str) -> Check {
    if link_layer == LinkLayer::Ethernet.name() { Check::EthernetStateCheck } else { Check::InfiniBandStateCheck }
}

/// Classify a port's state (000 §3, SPEC §1.3).
pub fn port_health(port: &Port, ll: &LinkLayer) -> PortHealth {
    let (Some(state), Some(phys)) = (&port.state, &port.phys_state) else {
        return PortHealth::Unknown;
    };
    if port.is_healthy() {
        return PortHealth::Healthy;
    }
    if matches!(state, PortState::Unknown(_)) && matches!(phys, PhysState::Unknown(_)) {
        return PortHealth::Unknown;
    }
    if *phys == PhysState::Disabled {
        return PortHealth::Fatal;
    }
    if *ll == LinkLayer::Ethernet {
        // RoCE: DOWN is fatal (with the operstate in the message); the rest is not reported.
        return if *state == PortState::Down { PortHealth::Fatal } else { PortHealth::Quiet };
    }
    match state {
        // A pulled cable and a brief retrain look alike for a moment: non-fatal, escalating.
        PortState::Down if phys.is_training() => PortHealth::NonFatal { escalates: true },
        PortState::Down => PortHealth::Fatal,
        PortState::Init | PortState::Armed => PortHealth::NonFatal { escalates: true },
        _ => PortHealth::NonFatal { escalates: false },
    }
}

fn port_key(dev: &str, port: u32) -> String {
    format!("{dev}_{port}")
}

fn name_or_unknown(s: Option<&str>) -> &str {
    s.unwrap_or("unknown")
}

/// `"Port mlx5_0 port 1: state DOWN, phys_state Disabled"` (000 §13), RoCE with operstate.
fn state_text(dev: &str, port: &Port, ll: &LinkLayer) -> String {
    let st = name_or_unknown(port.state.as_ref().map(|s| s.name()));
    let ph = name_or_unknown(port.phys_state.as_ref().map(|s| s.name()));
    match ll {
        LinkLayer::Ethernet => format!(
            "RoCE port {dev} port {}: state {st}, phys_state {ph}, operstate {}",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name()))
        ),
        _ => format!("Port {dev} port {}: state {st}, phys_state {ph}", port.number),
    }
}

fn healthy_text(dev: &str, port: &Port, ll: &LinkLayer) -> String {
    match ll {
        LinkLayer::Ethernet => format!(
            "RoCE port {dev} port {}: healthy (ACTIVE, LinkUp, operstate {})",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name()))
        ),
        _ => format!("Port {dev} port {}: healthy (ACTIVE, LinkUp)", port.number),
    }
}

/// The mode of `values` when there are at least two and one value is strictly most common.
fn unique_mode<T: Ord + Copy>(values: impl IntoIterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    let mut n = 0;
    for v in values {
        *counts.entry(v).or_default() += 1;
        n += 1;
    }
    if n < 2 {
        return None;
    }
    let best = counts.values().copied().max()?;
    let mut modes = counts.iter().filter(|(_, c)| **c == best).map(|(v, _)| *v);
    let m = modes.next()?;
    modes.next().is_none().then_some(m)
}

/// A role group: cards are only compared with cards of the same role and link layer.
type Group = (Role, LinkLayer);

struct CardView {
    group: Group,
    active: usize,
}

/// The evaluator's output.
pub struct Outcome {
    pub events: Vec<HealthEvent>,
    pub state: State,
    /// Things worth a log line (deferred ports, settled uncabled ports).
    pub notes: Vec<String>,
}

/// Evaluate the state checks for one poll.
pub fn evaluate(
    prev: &State,
    snap: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    cfg: &StateConfig,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> Outcome {
    let mut next = prev.clone();
    let mut events = Vec::new();
    let mut notes = Vec::new();
    let first_poll = prev.polls == 0;
    let enabled = |c: Check| cfg.checks.contains(&c);

    let monitored: Vec<&Device> = snap
        .devices
        .iter()
        .filter(|d| roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) && !d.is_vf())
        .collect();
    let role_of = |d: &Device| roles.get(&d.name).and_then(|c| c.role);

    // ---- Disappearance (000 §7, 002 §5.9): 3 consecutive misses, reported once. ----
    let present: BTreeSet<&str> = snap.devices.iter().map(|d| d.name.as_str()).collect();
    let mut missing_cards: BTreeSet<String> = BTreeSet::new();
    for (name, known) in next.known_devices.iter_mut() {
        if present.contains(name.as_str()) {
            continue;
        }
        known.misses = known.misses.saturating_add(1);
        if let Some(card) = &known.card {
            missing_cards.insert(card.clone());
        }
        let check = state_check_named(&known.link_layer);
        if known.misses >= MISSES_BEFORE_REPORT && !known.reported_missing && enabled(check) {
            known.reported_missing = true;
            let pci = known.pci_address.clone().unwrap_or_else(|| "unknown".into());
            let why = match snap.pci_probes.get(name) {
                Some(PciPresence::Gone) => {
                    format!("PCI function {pci} gone from the bus (clean removal or hot unplug)")
                }
                Some(PciPresence::AllOnes) => {
                    format!("PCI config space of {pci} reads 0xFF - the device fell off the bus")
                }
                Some(PciPresence::Present) => {
                    format!("PCI function {pci} still present - RDMA device gone (driver unbound or failed)")
                }
                Some(PciPresence::ReadError(e)) => {
                    format!("PCI config space read of {pci} failed ({e}) - bus error")
                }
                None => format!("PCI function {pci} not probed"),
            };
            events.push(
                HealthEvent::new(
                    check,
                    stamp,
                    now,
                    &format!("NIC {name} disappeared from /sys/class/infiniband/ - {why}"),
                )
                .unhealthy(true)
                .entities(vec![Entity::nic(name.clone())]),
            );
        }
    }
    for d in &monitored {
        let ll = device_link_layer(d).map(|l| l.name().to_string()).unwrap_or_else(|| "Unknown".into());
        let entry = next.known_devices.entry(d.name.clone()).or_insert(KnownDevice {
            pci_address: d.pci_address.clone(),
            card: d.card.clone(),
            link_layer: ll.clone(),
            misses: 0,
            reported_missing: false,
        });
        if entry.reported_missing {
            let check = state_check_named(&ll);
            if enabled(check) {
                events.push(
                    HealthEvent::new(
                        check,
                        stamp,
                        now,
                        &format!("NIC {} is present again in /sys/class/infiniband/", d.name),
                    )
                    .entities(vec![Entity::nic(d.name.clone())]),
                );
            }
        }
        entry.misses = 0;
        entry.reported_missing = false;
        entry.pci_address = d.pci_address.clone();
        entry.card = d.card.clone();
        entry.link_layer = ll;
    }

    // ---- Card homogeneity inputs (000 §4.3): active ports per card, mode per group. ----
    let mut cards: BTreeMap<String, CardView> = BTreeMap::new();
    for d in &monitored {
        let (Some(role), Some(ll), Some(card)) = (role_of(d), device_link_layer(d), d.card.as_ref()) else {
            continue;
        };
        let view = cards.entry(card.clone()).or_insert(CardView { group: (role, ll.clone()), active: 0 });
        view.active += d.ports.iter().filter(|p| p.is_healthy()).count();
    }
    let mut group_counts: BTreeMap<Group, Vec<usize>> = BTreeMap::new();
    for (card, v) in &cards {
        if !missing_cards.contains(card) {
            group_counts.entry(v.group.clone()).or_default().push(v.active);
        }
    }
    let group_mode: BTreeMap<Group, usize> = group_counts
        .iter()
        .filter_map(|(g, counts)| unique_mode(counts.iter().copied()).map(|m| (g.clone(), m)))
        .collect();
    let below_mode: BTreeMap<&str, usize> = cards
        .iter()
        .filter(|(card, _)| !missing_cards.contains(*card))
        .filter_map(|(card, v)| group_mode.get(&v.group).filter(|m| v.active < **m).map(|m| (card.as_str(), *m)))
        .collect();

    // ---- Port health boundary crossings (000 §3.4). ----
    for d in &monitored {
        for port in &d.ports {
            let Some(ll) = port.link_layer.as_ref().or(device_link_layer(d)) else {
                continue;
            };
            let Some(check) = state_check(ll) else {
                continue;
            };
            let health = port_health(port, ll);
            let key = port_key(&d.name, port.number);
            let card_below = d.card.as_deref().and_then(|c| below_mode.get(c).copied());
            let rec = next.port_states.get(&key).cloned();
            let mut r = rec.clone().unwrap_or(PortRecord {
                device: d.name.clone(),
                port: port.number,
                link_layer: ll.name().to_string(),
                state: None,
                phys_state: None,
                reported: Reported::Nothing,
                was_healthy: false,
                unhealthy_since: None,
                deferred_polls: 0,
                speed_degraded: false,
                lid: None,
                sm_lid: None,
            });
            let emit = |ev: HealthEvent, events: &mut Vec<HealthEvent>| {
                if enabled(check) {
                    events.push(ev.entities(vec![Entity::nic(d.name.clone()), Entity::port(port.number)]));
                }
            };
            match health {
                PortHealth::Unknown | PortHealth::Quiet => {}
                PortHealth::Healthy => {
                    if r.reported != Reported::Healthy {
                        emit(HealthEvent::new(check, stamp, now, &healthy_text(&d.name, port, ll)), &mut events);
                    }
                    r.reported = Reported::Healthy;
                    r.was_healthy = true;
                    r.unhealthy_since = None;
                    r.deferred_polls = 0;
                }
                PortHealth::Fatal | PortHealth::NonFatal { .. } if first_poll || rec.is_none() || !r.was_healthy => {
                    // No usable previous state, or never healthy in this boot: an unhealthy
                    // port is reported only through its card (peer evidence, lesson 1);
                    // otherwise it is treated as uncabled (decided within 3 polls, lesson 11).
                    if r.deferred_polls < MAX_DEFERRED_POLLS {
                        r.deferred_polls += 1;
                        if r.deferred_polls == MAX_DEFERRED_POLLS && card_below.is_none() {
                            notes.push(format!(
                                "{}: treated as uncabled (never healthy in this boot, card at its peers' mode)",
                                state_text(&d.name, port, ll)
                            ));
                        }
                    }
                }
                PortHealth::Fatal | PortHealth::NonFatal { .. } => {
                    let since = r.unhealthy_since.unwrap_or(now);
                    r.unhealthy_since = Some(since);
                    let (fatal, why) = match health {
                        PortHealth::Fatal => (true, String::new()),
                        PortHealth::NonFatal { escalates } => {
                            if escalates && let Some(mode) = card_below {
                                let active = d.card.as_ref().and_then(|c| cards.get(c)).map(|v| v.active).unwrap_or(0);
                                (
                                    true,
                                    format!(
                                        " - card {} has {active} active ports, its peers {mode}",
                                        d.card.as_deref().unwrap_or("?")
                                    ),
                                )
                            } else if now - since >= cfg.escalation_grace {
                                (true, format!(" - still unhealthy after {} s", (now - since).whole_seconds()))
                            } else {
                                (false, String::new())
                            }
                        }
                        _ => unreachable!("healthy and unknown handled above"),
                    };
                    let now_reported = if fatal { Reported::Fatal } else { Reported::NonFatal };
                    let crosses = match r.reported {
                        Reported::Healthy | Reported::Nothing => true,
                        Reported::NonFatal => fatal,
                        Reported::Fatal => false,
                    };
                    if crosses {
                        let msg = format!("{}{why}", state_text(&d.name, port, ll));
                        emit(HealthEvent::new(check, stamp, now, &msg).unhealthy(fatal), &mut events);
                        r.reported = now_reported;
                    }
                }
            }
            // Subnet Manager failover / heavy sweep evidence (003): LID or SM LID changed
            // while the port stayed ACTIVE.
            let active_now = port.state == Some(PortState::Active);
            let was_active = r.state.as_deref() == Some("ACTIVE");
            if active_now && was_active && *ll == LinkLayer::InfiniBand {
                for (what, old, new) in [("sm_lid", r.sm_lid, port.sm_lid), ("lid", r.lid, port.lid)] {
                    if let (Some(o), Some(n)) = (old, new)
                        && o != n
                    {
                        let code = if what == "sm_lid" { "SubnetManagerChanged" } else { "LidChanged" };
                        let msg = format!(
                            "Port {} port {}: {what} changed from {o:#x} to {n:#x} while ACTIVE (Subnet Manager failover or heavy sweep)",
                            d.name, port.number
                        );
                        emit(HealthEvent::new(check, stamp, now, &msg).unhealthy(false).error_code(code), &mut events);
                    }
                }
            }
            r.state = port.state.as_ref().map(|s| s.name().to_string());
            r.phys_state = port.phys_state.as_ref().map(|s| s.name().to_string());
            r.lid = port.lid.or(r.lid);
            r.sm_lid = port.sm_lid.or(r.sm_lid);
            next.port_states.insert(key, r);
        }
    }

    // ---- Card-level events: a shortfall that no port-level event explains. ----
    let mut still_below = BTreeSet::new();
    for (card, mode) in &below_mode {
        let view = &cards[*card];
        let unexplained = monitored.iter().filter(|d| d.card.as_deref() == Some(*card)).any(|d| {
            d.ports.iter().any(|p| {
                !p.is_healthy()
                    && next
                        .port_states
                        .get(&port_key(&d.name, p.number))
                        .map(|r| !matches!(r.reported, Reported::NonFatal | Reported::Fatal))
                        .unwrap_or(true)
            })
        });
        if !unexplained {
            continue;
        }
        still_below.insert(card.to_string());
        let Some(check) = state_check(&view.group.1) else {
            continue;
        };
        if !next.cards_below_mode.contains(*card) && enabled(check) {
            let msg = format!(
                "Card {card} ({}, {}) has {} active ports, expected {mode} (peer mode)",
                view.group.0.as_str(),
                view.group.1.name(),
                view.active
            );
            events.push(
                HealthEvent::new(check, stamp, now, &msg).unhealthy(true).entities(vec![Entity::nic(card.to_string())]),
            );
        }
    }
    for card in next.cards_below_mode.clone() {
        if still_below.contains(&card) {
            continue;
        }
        if let Some(view) = cards.get(&card)
            && let Some(check) = state_check(&view.group.1)
            && enabled(check)
        {
            let msg = format!(
                "Card {card} ({}, {}) is back at its peers' active port count",
                view.group.0.as_str(),
                view.group.1.name()
            );
            events.push(HealthEvent::new(check, stamp, now, &msg).entities(vec![Entity::nic(card.clone())]));
        }
    }
    next.cards_below_mode = still_below;

    // ---- Speed degradation against the group's rate mode (no static target). ----
    let mut rates: BTreeMap<Group, Vec<u64>> = BTreeMap::new();
    let rate_key = |g: f64| (g * 1000.0).round() as u64;
    for d in &monitored {
        let (Some(role), Some(ll)) = (role_of(d), device_link_layer(d)) else {
            continue;
        };
        for p in d.ports.iter().filter(|p| p.is_healthy()) {
            if let Some(r) = &p.rate {
                rates.entry((role, ll.clone())).or_default().push(rate_key(r.gbps));
            }
        }
    }
    for d in &monitored {
        let (Some(role), Some(ll)) = (role_of(d), device_link_layer(d)) else {
            continue;
        };
        let Some(check) = state_check(ll) else {
            continue;
        };
        let mode = rates.get(&(role, ll.clone())).and_then(|v| unique_mode(v.iter().copied()));
        for p in d.ports.iter().filter(|p| p.is_healthy()) {
            let (Some(mode), Some(rate)) = (mode, &p.rate) else {
                continue;
            };
            let key = port_key(&d.name, p.number);
            let Some(r) = next.port_states.get_mut(&key) else {
                continue;
            };
            let below = rate_key(rate.gbps) < mode;
            let ents = vec![Entity::nic(d.name.clone()), Entity::port(p.number)];
            let mode_gbps = mode as f64 / 1000.0;
            if below && !r.speed_degraded {
                r.speed_degraded = true;
                if enabled(check) {
                    let msg = format!(
                        "Port {} port {}: link speed {} Gb/s is below its group's {} Gb/s ({}, {}) - LinkSpeedDegraded",
                        d.name,
                        p.number,
                        rate.gbps,
                        mode_gbps,
                        role.as_str(),
                        ll.name()
                    );
                    events.push(
                        HealthEvent::new(check, stamp, now, &msg)
                            .unhealthy(cfg.speed_degradation_fatal)
                            .error_code("LinkSpeedDegraded")
                            .entities(ents),
                    );
                }
            } else if !below && r.speed_degraded {
                r.speed_degraded = false;
                if enabled(check) {
                    let msg = format!(
                        "Port {} port {}: link speed {} Gb/s is back at its group's rate",
                        d.name, p.number, rate.gbps
                    );
                    events
                        .push(HealthEvent::new(check, stamp, now, &msg).error_code("LinkSpeedDegraded").entities(ents));
                }
            }
        }
    }

    next.polls = prev.polls.saturating_add(1);
    Outcome { events, state: next, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, phys: &str) -> Port {
        Port {
            number: 1,
            state: crate::parse::port_state(state),
            phys_state: crate::parse::phys_state(phys),
            ..Port::default()
        }
    }

    #[test]
    fn port_health_table() {
        let ib = LinkLayer::InfiniBand;
        let eth = LinkLayer::Ethernet;
        assert_eq!(port_health(&port("4: ACTIVE", "5: LinkUp"), &ib), PortHealth::Healthy);
        assert_eq!(port_health(&port("1: DOWN", "3: Disabled"), &ib), PortHealth::Fatal);
        assert_eq!(port_health(&port("1: DOWN", "2: Polling"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(
            port_health(&port("1: DOWN", "6: LinkErrorRecovery"), &ib),
            PortHealth::NonFatal { escalates: true }
        );
        assert_eq!(port_health(&port("1: DOWN", "1: Sleep"), &ib), PortHealth::Fatal);
        assert_eq!(port_health(&port("2: INIT", "5: LinkUp"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(port_health(&port("3: ARMED", "5: LinkUp"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(
            port_health(&port("4: ACTIVE", "6: LinkErrorRecovery"), &ib),
            PortHealth::NonFatal { escalates: false }
        );
        assert_eq!(port_health(&port("1: DOWN", "2: Polling"), &eth), PortHealth::Fatal);
        assert_eq!(port_health(&port("2: INIT", "5: LinkUp"), &eth), PortHealth::Quiet);
        assert_eq!(port_health(&port("", "5: LinkUp"), &ib), PortHealth::Unknown);
    }

    #[test]
    fn unique_mode_needs_two_values_and_no_tie() {
        assert_eq!(unique_mode([2, 2, 1]), Some(2));
        assert_eq!(unique_mode([2, 1]), None);
        assert_eq!(unique_mode([2]), None);
        assert_eq!(unique_mode([1, 1]), Some(1));
    }
}
