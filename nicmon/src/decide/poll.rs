//! One poll's decision (pure): (previous [`CheckState`], [`Observation`], kernel log records,
//! now) → ([`Poll`]: events, next state, notes). No clock, no I/O: the same step serves the
//! daemon, `nicmon check`, `nicmon trace` and replay. Reading is
//! [`crate::read::observe`]'s; the two are composed in [`crate::monitor`].
//!
//! The steps, each a method of [`Decider`]: first-poll deferral; the clears of a reboot or a
//! rescope; link state; counters; character devices; PCIe; NIC temperature; firmware health;
//! kernel log; the filter by enabled check; one firmware fatal per card; the port history.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use time::{Duration, OffsetDateTime};

use crate::decide::cause;
use crate::decide::chardev;
use crate::decide::counters::{self, CounterPort};
use crate::decide::firmware::{self, FirmwareState};
use crate::decide::kmsg::{self, DeviceIndex};
use crate::decide::linkstate::{self, StateConfig};
use crate::decide::optics::{self, OpticsState};
use crate::decide::pcie::{self, PcieState};
use crate::decide::phy;
use crate::decide::roles::{self, Classification};
use crate::decide::settings::Config;
use crate::decide::software;
use crate::decide::state::CheckState;
use crate::decide::thermal::{self, ThermalState};
use crate::model::event::{Check, CheckKind, HealthEvent, Stamp, Subject};
use crate::model::history;
use crate::model::kmsg::{HostLinks, Record};
use crate::model::observation::Observation;
use crate::model::topology::Topology;
use crate::model::{Device, Snapshot};

/// What the decision is made with: the settings, the topology, the stamp of every event.
pub struct Decider {
    pub config: Config,
    pub topology: Topology,
    pub stamp: Stamp,
    pub state_config: StateConfig,
    /// Defer the first poll of a boot while devices are unreadable, at most
    /// [`MAX_FIRST_POLL_DEFERRALS`] times (the daemon, as upstream's monitor; a one-shot
    /// `nicmon check` reports what it reads).
    pub defer_first_poll: bool,
    /// What the counter evaluation needs of `config.counter_rules` as a set, made once.
    counter_facts: counters::RuleFacts,
}

/// Upstream's first-poll deferral limit: after this many deferred polls the first poll runs
/// with the readable devices.
pub const MAX_FIRST_POLL_DEFERRALS: u32 = 3;

/// The result of one poll.
#[derive(Default)]
pub struct Poll {
    pub snapshot: Snapshot,
    pub roles: BTreeMap<String, Classification>,
    pub events: Vec<HealthEvent>,
    /// The checks' state after this poll (the outbox is the caller's).
    pub next: CheckState,
    pub notes: Vec<String>,
    /// Host reads abandoned at their deadline so far (cumulative), and those not returned yet.
    pub reads_abandoned: u64,
    pub stuck_reads: Vec<(std::path::PathBuf, std::time::Duration)>,
    /// The character devices expected (and those held latched), for the report.
    pub char_devices: Vec<chardev::Finding>,
    /// Ports held by `portStateHoldDown` this poll, and held transitions that were blips.
    pub holds: linkstate::Holds,
    /// Unhealthy port transitions flap damping counted this poll (published or held).
    pub flaps: Vec<linkstate::FlapTransition>,
    /// The checks whose first poll this one deferred (devices unreadable): nothing was
    /// evaluated, `next` is the previous state, and the first poll (with its baselines) is
    /// still owed. Empty for a poll that ran.
    pub deferred: Vec<Check>,
}

impl Decider {
    /// A decider with these settings (the state checks' own from `config` and `checks`).
    pub fn new(config: Config, topology: Topology, stamp: Stamp, checks: BTreeSet<Check>) -> Decider {
        let counter_facts = counters::RuleFacts::of(&config.counter_rules);
        Decider {
            state_config: config.state_config(checks),
            config,
            topology,
            stamp,
            defer_first_poll: false,
            counter_facts,
        }
    }

    /// Whether `device` is not monitored, as [`Decider::decide`] classifies it (given the
    /// devices behind the default route): discovery reads such a device once per
    /// incarnation ([`crate::read::discovery::Unmonitored`]).
    pub fn unmonitored(&self, device: &Device, route: &[String]) -> bool {
        !roles::is_monitored(device, route, &self.topology, &self.config.filters)
    }

    /// Evaluate every check: pure over its arguments. `baselines_owed`: `prev` was not this
    /// boot's (or its baselines were never sent): after a reboot, each enabled check first
    /// gets one "clear everything" healthy event with no entities, 1 s before the baselines
    /// (lesson 4).
    ///
    /// The steps, in order: first-poll deferral; the clears of a reboot or a rescope; link
    /// state; counters; character devices; PCIe; kernel log; the filter by enabled check.
    pub fn decide(
        &self,
        prev: &CheckState,
        baselines_owed: bool,
        obs: Observation,
        now: OffsetDateTime,
        kmsg_records: &[Record],
    ) -> Poll {
        let (mut notes, kernel_removed) = (obs.ethtool_notes, obs.kernel_removed);
        let Observation { snapshot, links, einval, reads_abandoned, stuck_reads, targeted, woken_by, .. } = obs;
        // A port whose link layer is unreadable is judged with its last known one.
        let snapshot = linkstate::with_known_link_layers(&prev.links, snapshot);
        let roles = roles::classify(&snapshot, &self.topology, &self.config.filters);
        let first_poll = prev.polls == 0;
        if let Some((next, deferred)) = self.defer_first_poll(prev, &snapshot, &roles, targeted.is_some(), &mut notes) {
            return Poll { snapshot, roles, next, notes, reads_abandoned, stuck_reads, deferred, ..Poll::default() };
        }
        let reboot = baselines_owed && first_poll;
        // The discovery scope changed since the state was made (the regexes edited): the state
        // checks forget their ports and re-baseline; counters and latches are kept.
        let scope = self.config.filters.fingerprint();
        let rescope = !first_poll && prev.scope.as_ref().is_some_and(|s| *s != scope);
        let mut events = self.clears(reboot, rescope, now);

        let links_out = self.link_state(prev, rescope, first_poll, &snapshot, &roles, now, &kernel_removed);
        events.extend(links_out.events);
        notes.extend(links_out.notes);
        // A targeted read (its devices' link-state files): the counters, the character
        // devices, PCIe and the kernel log records wait for the full poll that follows.
        let full = targeted.is_none();
        let mut ports = if full { counter_ports(&snapshot, &roles) } else { Vec::new() };
        with_ber_thresholds(&mut ports, &snapshot, &self.config);
        let (counter_events, counter_state) = self.counters(&prev.counters, &ports, now, reboot, &mut notes);
        let mut events = concat(events, counter_events);

        let char_devices = self.char_devices(&prev.char_devices, &snapshot, &roles, now, full);
        let (char_state, char_findings) = match char_devices {
            Some(cd) => {
                events.extend(cd.events);
                notes.extend(cd.notes);
                (Arc::new(cd.state), cd.findings)
            }
            None => (Arc::clone(&prev.char_devices), Vec::new()),
        };
        if first_poll && full {
            notes.extend(missing_counter_notes(&ports, &self.config.counter_rules));
        }

        let (pcie_events, pcie_state) = self.pcie(&prev.pcie, &snapshot, &roles, now, full, &mut notes);
        events.extend(pcie_events);

        let (thermal_events, thermal_state) = self.thermal(&prev.thermal, &snapshot, &roles, now);
        events.extend(thermal_events);
        let (optics_events, optics_state) = self.optics(&prev.optics, &snapshot, &roles, now);
        events.extend(optics_events);
        let (firmware_events, mut firmware_state) = self.firmware(&prev.firmware, &snapshot, &roles, now);
        events.extend(firmware_events);

        let (kmsg_events, kmsg_state) = match full {
            true => self.kernel_log(&prev.kmsg, kmsg_records, &snapshot, &roles, links, now),
            false => (Vec::new(), Arc::clone(&prev.kmsg)),
        };
        events.extend(kmsg_events);

        events.retain(|e| e.check().map(|c| self.state_config.checks.contains(&c)).unwrap_or(true));
        software::never_fatal(&mut events, &software::devices(&snapshot, &links_out.state));
        self.one_firmware_fatal(&mut events, &mut firmware_state, &snapshot, now);
        let facts = cause::base_facts(&snapshot, &events, &held_pcie(&pcie_state, &snapshot));
        cause::annotate(&mut events, &facts);
        let decided = port_decisions(&events, &links_out.holds, &links_out.flaps, &links_out.state);
        let history = history::record(&prev.history, port_readings(&snapshot, &roles), &decided, now, &woken_by);
        let next = CheckState {
            polls: prev.polls.saturating_add(1),
            links: links_out.state,
            counters: counter_state,
            kmsg: kmsg_state,
            char_devices: char_state,
            pcie: pcie_state,
            thermal: thermal_state,
            optics: optics_state,
            firmware: firmware_state,
            einval,
            scope: Some(scope),
            first_poll_deferrals: prev.first_poll_deferrals,
            history,
        };
        Poll {
            snapshot,
            roles,
            events,
            next,
            notes,
            reads_abandoned,
            stuck_reads,
            char_devices: char_findings,
            holds: links_out.holds,
            flaps: links_out.flaps,
            deferred: Vec::new(),
        }
    }

    /// Step 1, first-poll deferral: on the daemon's first poll of a boot, while monitored
    /// devices are unreadable, nothing is evaluated, a bounded number of polls. `Some((the
    /// state to keep, the checks deferred))` when this poll is deferred.
    fn defer_first_poll(
        &self,
        prev: &CheckState,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        targeted: bool,
        notes: &mut Vec<String>,
    ) -> Option<(CheckState, Vec<Check>)> {
        if prev.polls != 0 || !self.defer_first_poll {
            return None;
        }
        let unreadable = unreadable_devices(snapshot, roles);
        if unreadable.is_empty() {
            return None;
        }
        if prev.first_poll_deferrals >= MAX_FIRST_POLL_DEFERRALS {
            notes.push(format!(
                "first-poll deferral limit ({MAX_FIRST_POLL_DEFERRALS}) reached: proceeding with the readable \
                 devices (unreadable: {})",
                unreadable.join(", ")
            ));
            return None;
        }
        // Card homogeneity and the first-seen verdicts need the whole device set: wait for
        // it, a bounded number of polls.
        let mut next = prev.clone();
        if targeted {
            return Some((next, Vec::new()));
        }
        next.first_poll_deferrals += 1;
        notes.push(format!(
            "first poll deferred ({}/{MAX_FIRST_POLL_DEFERRALS}): devices unreadable: {}",
            next.first_poll_deferrals,
            unreadable.join(", ")
        ));
        let deferred = self.state_config.checks.iter().copied().filter(|c| c.defers_first_poll()).collect();
        Some((next, deferred))
    }

    /// Step 2: after a reboot, every enabled check's clear; after a rescope, the state
    /// checks'. Both 1 s before the baselines.
    fn clears(&self, reboot: bool, rescope: bool, now: OffsetDateTime) -> Vec<HealthEvent> {
        if reboot {
            clear_all(&self.state_config, &self.stamp, now - Duration::seconds(1))
        } else if rescope {
            clear_scope(&self.state_config, &self.stamp, now - Duration::seconds(1))
        } else {
            Vec::new()
        }
    }

    /// Step 3, link state (after a rescope, from no memory of ports and devices).
    #[allow(clippy::too_many_arguments)]
    fn link_state(
        &self,
        prev: &CheckState,
        rescope: bool,
        first_poll: bool,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
        kernel_removed: &BTreeSet<String>,
    ) -> linkstate::Outcome {
        let no_links = linkstate::LinkState::default();
        let prev_links = if rescope { &no_links } else { &prev.links };
        let fresh = first_poll || rescope;
        linkstate::evaluate(prev_links, fresh, snapshot, roles, &self.state_config, now, &self.stamp, kernel_removed)
    }

    /// Step 4, counters: the rules over `ports` (none on a targeted poll: every counter's
    /// state is kept); a counter that went unreadable is a note.
    fn counters(
        &self,
        prev: &Arc<counters::CounterState>,
        ports: &[CounterPort<'_>],
        now: OffsetDateTime,
        reboot: bool,
        notes: &mut Vec<String>,
    ) -> (Vec<HealthEvent>, Arc<counters::CounterState>) {
        // No port to evaluate (a targeted poll): the state as it was, shared, not copied.
        if ports.is_empty() {
            return (Vec::new(), Arc::clone(prev));
        }
        let rules = &self.config.counter_rules;
        let (events, mut state) =
            counters::evaluate_with(prev, ports, rules, &self.counter_facts, now, reboot, &self.stamp);
        for (device, port, rule) in counters::went_unreadable(prev, &mut state, ports, rules) {
            notes.push(format!(
                "counter {rule} on {device} port {port}: unreadable (file gone, or not a number such as N/A): \
                 not evaluated until it reads a number again"
            ));
        }
        (events, Arc::new(state))
    }

    /// Step 5, character devices: on a full read, when the check is enabled.
    fn char_devices(
        &self,
        prev: &chardev::CharDevState,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
        full: bool,
    ) -> Option<chardev::Outcome> {
        (full && self.state_config.checks.contains(&Check::InfiniBandCharDeviceCheck))
            .then(|| chardev::evaluate(prev, snapshot, roles, self.config.issm, now, &self.stamp))
    }

    /// Step 6, PCIe (SPEC §1.10): on a full read, when the check is enabled (its state is
    /// kept as it was otherwise).
    fn pcie(
        &self,
        prev: &Arc<PcieState>,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
        full: bool,
        notes: &mut Vec<String>,
    ) -> (Vec<HealthEvent>, Arc<PcieState>) {
        if !full || !self.state_config.checks.contains(&Check::NICPCIeCheck) {
            return (Vec::new(), Arc::clone(prev));
        }
        let out = pcie::check::evaluate(prev, snapshot, roles, &self.config.pcie.aer, now, &self.stamp);
        notes.extend(out.notes);
        (out.events, Arc::new(out.state))
    }

    /// Step 7, NIC temperature (SPEC §1.13): the monitored NICs' hwmon sensors (a targeted
    /// poll carries the full poll's readings: nothing changes), when the check is enabled.
    fn thermal(
        &self,
        prev: &ThermalState,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
    ) -> (Vec<HealthEvent>, ThermalState) {
        if !self.state_config.checks.contains(&Check::NICThermalCheck) {
            return (Vec::new(), prev.clone());
        }
        let margin = self.config.thermal.margin_millidegrees();
        thermal::evaluate(prev, snapshot, roles, margin, now, &self.stamp)
    }

    /// Step 7b, optics (SPEC §1.13): each monitored port's module as last read (reads are
    /// paced; a state change reads at once), when its degradation check is enabled. The
    /// events are filtered by check with the others.
    fn optics(
        &self,
        prev: &OpticsState,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
    ) -> (Vec<HealthEvent>, OpticsState) {
        let checks = &self.state_config.checks;
        if !checks.contains(&Check::EthernetDegradationCheck) && !checks.contains(&Check::InfiniBandDegradationCheck) {
            return (Vec::new(), prev.clone());
        }
        optics::evaluate(prev, snapshot, roles, now, &self.stamp)
    }

    /// Step 8, firmware health (SPEC §1.13): the monitored NICs' devlink health reporters
    /// (a wake-up's targeted poll reads them too), when the check is enabled.
    fn firmware(
        &self,
        prev: &FirmwareState,
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        now: OffsetDateTime,
    ) -> (Vec<HealthEvent>, FirmwareState) {
        if !self.state_config.checks.contains(&Check::NICFirmwareCheck) {
            return (Vec::new(), prev.clone());
        }
        firmware::evaluate(prev, snapshot, roles, now, &self.stamp)
    }

    /// Step 11: one firmware fatal per card per kernel-log dedup window, whichever source
    /// (devlink, the kernel log) saw it first ([`firmware::dedup_fatals`]).
    fn one_firmware_fatal(
        &self,
        events: &mut Vec<HealthEvent>,
        state: &mut FirmwareState,
        snapshot: &Snapshot,
        now: OffsetDateTime,
    ) {
        let window = Duration::seconds(self.config.kernel_log.dedup_window_seconds.min(i64::MAX as u64) as i64);
        let card_of = |name: &str| snapshot.devices.iter().find(|d| d.name == name).and_then(|d| d.card.clone());
        firmware::dedup_fatals(events, &mut state.last_fatal, card_of, window, now);
    }

    /// Step 9, kernel log: the records that arrived since the previous poll, attributed to
    /// the monitored devices.
    fn kernel_log(
        &self,
        prev: &Arc<kmsg::KmsgState>,
        records: &[Record],
        snapshot: &Snapshot,
        roles: &BTreeMap<String, Classification>,
        links: Option<HostLinks>,
        now: OffsetDateTime,
    ) -> (Vec<HealthEvent>, Arc<kmsg::KmsgState>) {
        // No record: the state as it was, shared.
        if records.is_empty() {
            return (Vec::new(), Arc::clone(prev));
        }
        let links = links.unwrap_or_default();
        let index = DeviceIndex::from_snapshot(snapshot, |d| monitored(roles, &d.name), &links);
        let processed = kmsg::process(prev, records, &index, &self.config.patterns, now, &self.stamp);
        (processed.events, Arc::new(processed.state))
    }
}

/// The PCIe conditions the check holds, by device: a downtrained card (every function of
/// it), an AER fatal or non-fatal breach still latched.
fn held_pcie(state: &PcieState, snapshot: &Snapshot) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for d in &snapshot.devices {
        if let Some(card) = &d.card
            && state.link.downtrained.contains_key(card)
        {
            out.insert(d.name.clone(), format!("PCIe: {}", pcie::link::DOWNTRAINED));
        }
    }
    for (key, b) in &state.aer.counters.breach_flags {
        let mut parts = key.splitn(3, ':');
        let (Some(nic), Some(_), Some(code)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if b.breached && matches!(code, "aer_fatal" | "aer_nonfatal") {
            out.entry(nic.to_string()).or_insert_with(|| format!("PCIe: {code}"));
        }
    }
    out
}

/// Whether `name` is a monitored device (management NICs are not).
fn monitored(roles: &BTreeMap<String, Classification>, name: &str) -> bool {
    roles.get(name).map(|c| c.monitored).unwrap_or(false)
}

/// The ports whose counters are evaluated (on a full poll): of monitored PFs only
/// (management NICs and VFs are never evaluated).
fn counter_ports<'s>(snapshot: &'s Snapshot, roles: &BTreeMap<String, Classification>) -> Vec<CounterPort<'s>> {
    snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && monitored(roles, &d.name))
        .flat_map(|d| d.ports.iter().map(move |p| CounterPort::new(&d.name, d.rdma_driver, p)))
        .collect()
}

/// Monitored PF ports whose state and phys_state were read, for the port history.
fn port_readings<'a>(
    snapshot: &'a crate::model::Snapshot,
    roles: &'a BTreeMap<String, roles::Classification>,
) -> impl Iterator<Item = history::PortReading<'a>> {
    snapshot.devices.iter().filter(|d| !d.is_vf() && roles.get(&d.name).is_some_and(|c| c.monitored)).flat_map(|d| {
        d.ports.iter().filter_map(move |p| {
            Some(history::PortReading {
                device: &d.name,
                port: p.number,
                state: p.state.as_ref()?.name(),
                phys_state: p.phys_state.as_ref()?.name(),
                healthy: p.is_healthy(),
            })
        })
    })
}

/// What the state checks did about each port this poll: its events, the hold-down's holds
/// and blips, flap damping.
fn port_decisions(
    events: &[HealthEvent],
    holds: &linkstate::Holds,
    flaps: &[linkstate::FlapTransition],
    links: &linkstate::LinkState,
) -> history::PortDecisions {
    let state_check = |e: &&HealthEvent| e.check().map(Check::kind) == Some(CheckKind::PortState);
    let reported = events
        .iter()
        .filter(state_check)
        .filter_map(|e| match e.subject() {
            Subject::Port { device, port } => Some((device.to_string(), port)),
            _ => None,
        })
        .collect();
    let flapping = flaps
        .iter()
        .filter(|f| !f.published)
        .map(|f| (f.device.clone(), f.port))
        .chain(links.port_states.values().filter(|r| r.flap.is_flapping()).map(|r| (r.device.clone(), r.port)))
        .collect();
    let causes = events
        .iter()
        .filter(state_check)
        .filter(|e| !e.is_healthy)
        .filter_map(|e| match e.subject() {
            Subject::Port { device, port } => {
                Some(((device.to_string(), port), e.metadata.get(crate::model::cause::CAUSE_KEY)?.clone()))
            }
            _ => None,
        })
        .collect();
    history::PortDecisions {
        reported,
        causes,
        held: holds.held.iter().map(|h| (h.device.clone(), h.port)).collect(),
        blips: holds.blips.iter().map(|b| (b.device.clone(), b.port)).collect(),
        flapping,
    }
}

/// `front` then `back` in one vector, that of whichever has room for both (a reboot's
/// counter baselines on a device of a thousand ports are tens of thousands of events: they
/// are not copied into a third vector).
fn concat<T>(mut front: Vec<T>, mut back: Vec<T>) -> Vec<T> {
    if front.capacity() - front.len() >= back.len() || front.len() >= back.len() {
        front.append(&mut back);
        front
    } else {
        back.splice(0..0, front);
        back
    }
}

/// Each RoCE port's pre-FEC BER threshold where its FEC code sets it
/// ([`crate::decide::phy::port_ber_threshold`]): the code from the port's FEC mode and lane
/// rate, the lanes named by its RDMA `rate` or else its FEC statistics.
fn with_ber_thresholds(ports: &mut [CounterPort<'_>], snapshot: &Snapshot, config: &Config) {
    let Some(rule) = config.counter_rules.iter().find(|r| r.name == crate::decide::counters::rule::PRE_FEC_BER_RULE)
    else {
        return;
    };
    for cp in ports.iter_mut() {
        let port = snapshot
            .devices
            .iter()
            .find(|d| d.name == cp.device)
            .and_then(|d| d.ports.iter().find(|p| p.number == cp.port));
        let Some(port) = port else { continue };
        let Some(fec) = port.ethtool.as_ref().and_then(|e| e.fec.as_ref()) else {
            continue;
        };
        let named = phy::rate_lanes(port.rate.as_ref().and_then(|r| r.width.as_deref()));
        let lanes = named.or((!fec.lanes.is_empty()).then_some(fec.lanes.len()));
        let code = phy::rs_code(fec.active, cp.rate_bps.unwrap_or(0.0), lanes);
        cp.ber_threshold = phy::port_ber_threshold(rule.threshold_set, code);
    }
}

/// Monitored devices (PFs of a supported vendor) with a port whose `state`, `phys_state`
/// or `link_layer` could not be read: upstream's "unreadable devices".
fn unreadable_devices(
    snapshot: &crate::model::Snapshot,
    roles: &BTreeMap<String, roles::Classification>,
) -> Vec<String> {
    snapshot
        .devices
        .iter()
        .filter(|d| d.unsupported.is_none() && !d.is_vf())
        .filter(|d| roles.get(&d.name).is_none_or(|c| c.monitored))
        .filter(|d| d.ports.iter().any(|p| p.state.is_none() || p.phys_state.is_none() || p.link_layer.is_none()))
        .map(|d| d.name.clone())
        .collect()
}

/// 001 §7.1: an enabled counter a port does not have is not evaluated there (fail open) and
/// said once, on the first poll of a boot — one line per counter, naming the ports. The
/// counters of a RoCE port's ethtool data go or come together (a netdev whose driver gives
/// none: veth, virtio), and so do the IBTA PMA counters of a port without any (`counters/`
/// exists only for drivers with a PMA agent: not bnxt_re, ionic, irdma, rxe): one line names
/// them with the ports that lack the same ones.
fn missing_counter_notes(ports: &[CounterPort<'_>], rules: &[counters::CounterRule]) -> Vec<String> {
    use crate::decide::counters::rule::ETHTOOL_PREFIX;
    const PMA: &str = "counters/";
    let path_of = |name: &str| rules.iter().find(|r| r.name == name).map_or("", |r| r.path.as_str());
    let no_pma = |device: &str, port: u32| {
        ports.iter().any(|p| p.device == device && p.port == port && !p.counters.keys().any(|k| k.starts_with(PMA)))
    };
    let mut by_rule: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // (kind: 0 ethtool, 1 PMA) → port → its missing rules.
    let mut by_port: [BTreeMap<String, Vec<String>>; 2] = Default::default();
    for (device, port, rule) in counters::missing(ports, rules) {
        let at = format!("{device} port {port}");
        let path = path_of(&rule);
        if path.starts_with(ETHTOOL_PREFIX) {
            by_port[0].entry(at).or_default().push(rule);
        } else if path.starts_with(PMA) && no_pma(&device, port) {
            by_port[1].entry(at).or_default().push(rule);
        } else {
            by_rule.entry(rule).or_default().push(at);
        }
    }
    let counters = by_rule
        .into_iter()
        .map(|(rule, at)| format!("counter {rule} absent on {}: not evaluated there", at.join(", ")));
    let [phy, pma] = by_port.map(|by_port| {
        let mut by_set: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        for (at, rules) in by_port {
            by_set.entry(rules).or_default().push(at);
        }
        by_set
    });
    let phy = phy.into_iter().map(|(rules, at)| {
        format!(
            "RoCE physical-layer counters {} absent on {} (not in the ethtool data of their netdev's driver): not \
             evaluated there",
            rules.join(", "),
            at.join(", ")
        )
    });
    let pma = pma.into_iter().map(|(rules, at)| {
        format!(
            "IBTA PMA counters {} absent on {} (no counters/ directory: their driver has no PMA agent): not \
             evaluated there",
            rules.join(", "),
            at.join(", ")
        )
    });
    counters.chain(phy).chain(pma).collect()
}

/// After a discovery-scope change: one entity-less healthy event per enabled state check
/// (the port and device conditions made under the old scope), before its baselines.
pub fn clear_scope(cfg: &StateConfig, stamp: &Stamp, at: OffsetDateTime) -> Vec<HealthEvent> {
    Check::ALL
        .into_iter()
        .filter(|c| c.kind() == CheckKind::PortState && cfg.checks.contains(c))
        .map(|c| {
            HealthEvent::new(
                c,
                stamp,
                at,
                "Discovery scope changed: clearing port and device conditions, re-baselining",
            )
        })
        .collect()
}

/// One healthy event with an empty entity list per enabled check.
pub fn clear_all(cfg: &StateConfig, stamp: &Stamp, at: OffsetDateTime) -> Vec<HealthEvent> {
    Check::ALL
        .into_iter()
        .filter(|c| cfg.checks.contains(c))
        .map(|c| HealthEvent::new(c, stamp, at, "Host rebooted: clearing all conditions from the previous boot"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_keeps_the_order_in_whichever_vector_has_room() {
        let big = |n: usize| -> Vec<usize> {
            let mut v = Vec::with_capacity(2 * n);
            v.extend(100..100 + n);
            v
        };
        let (front, back) = (vec![1, 2, 3], big(10));
        let at = back.as_ptr();
        let all = concat(front, back);
        assert_eq!(all, [1, 2, 3].into_iter().chain(100..110).collect::<Vec<_>>());
        assert_eq!(all.as_ptr(), at, "the back vector's buffer");
        let (front, back) = (big(10), vec![1, 2, 3]);
        let at = front.as_ptr();
        let all = concat(front, back);
        assert_eq!(all, (100..110).chain([1, 2, 3]).collect::<Vec<_>>());
        assert_eq!(all.as_ptr(), at, "the front vector's buffer");
        assert_eq!(concat(vec![1], Vec::<i32>::new()), [1]);
        assert_eq!(concat(Vec::<i32>::new(), vec![2]), [2]);
        // Neither has room: one buffer grows.
        let (mut front, mut back) = (Vec::with_capacity(2), Vec::with_capacity(3));
        front.extend([1, 2]);
        back.extend([3, 4, 5]);
        assert_eq!(concat(front, back), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn missing_ethtool_counters_are_one_line_per_set_of_ports() {
        let rules = Config::default().counter_rules;
        let ll = crate::model::LinkLayer::Ethernet;
        let with = |paths: &[&str]| -> BTreeMap<std::sync::Arc<str>, u64> {
            let mut c: BTreeMap<std::sync::Arc<str>, u64> = rules.iter().map(|r| (r.path.as_str().into(), 0)).collect();
            c.retain(|k, _| !k.starts_with("ethtool/") || paths.contains(&&**k));
            c
        };
        // Two ports without ethtool data, one with FEC data only, one with everything.
        let (none, fec, all) = (with(&[]), with(&["ethtool/fec_corrected_bits", "ethtool/fec_uncorrectable"]), {
            let paths: Vec<&str> = rules.iter().map(|r| r.path.as_str()).collect();
            with(&paths)
        });
        let mut no_carrier = none.clone();
        no_carrier.remove("/sys/class/net/{interface}/carrier_changes");
        let port = |device, counters| CounterPort {
            device,
            port: 1,
            link_layer: Some(&ll),
            driver: Some(crate::model::driver::RdmaDriver::Mlx5),
            counters,
            rate_bps: None,
            ber_threshold: None,
            ethtool_age: Default::default(),
        };
        let ports = [port("mlx5_0", &no_carrier), port("mlx5_1", &none), port("mlx5_2", &fec), port("mlx5_3", &all)];
        let notes = missing_counter_notes(&ports, &rules);
        assert_eq!(
            notes,
            [
                "counter carrier_changes absent on mlx5_0 port 1: not evaluated there",
                "RoCE physical-layer counters pfc_storm, pfc_storm_error, pause_victim absent on mlx5_2 port 1 (not in \
                 the ethtool data of their netdev's driver): not evaluated there",
                "RoCE physical-layer counters pre_fec_ber, fec_uncorrectable, pfc_storm, pfc_storm_error, pause_victim \
                 absent on mlx5_0 port 1, mlx5_1 port 1 (not in the ethtool data of their netdev's driver): not \
                 evaluated there",
            ]
        );
    }

    /// The clears of a reboot and of a scope change are about the node: one per check,
    /// no entity.
    #[test]
    fn clears_are_about_the_node() {
        let cfg = StateConfig::default();
        let at = OffsetDateTime::UNIX_EPOCH;
        let clears = [clear_all(&cfg, &Stamp::default(), at), clear_scope(&cfg, &Stamp::default(), at)].concat();
        assert!(clears.len() > Check::ALL.len(), "{clears:?}");
        for e in &clears {
            assert_eq!(e.subject(), Subject::Node, "{e:?}");
        }
    }
}
