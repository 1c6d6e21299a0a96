//! One poll cycle: read → decide. Shared by `nicmon check` and the daemon loop; acting on
//! the result (dispatch, persistence) is the caller's.
use std::collections::BTreeMap;

use time::{Duration, OffsetDateTime};

use crate::chardev;
use crate::config::Config;
use crate::counters::{self, CounterPort};
use crate::discovery::{self, ReadPlan};
use crate::event::{Check, HealthEvent, Stamp};
use crate::host::Host;
use crate::kmsg::{self, DeviceIndex, HostLinks, Record, WakeHint};
use crate::linkstate::{self, StateConfig};
use crate::model::Snapshot;
use crate::roles::{self, Classification};
use crate::state::{Loaded, State};
use crate::topology::Topology;

/// What stays fixed between polls.
pub struct Monitor {
    pub host: Host,
    pub config: Config,
    pub topology: Topology,
    pub stamp: Stamp,
    pub state_config: StateConfig,
    pub counter_paths: Vec<String>,
}

/// The result of one poll.
pub struct Poll {
    pub snapshot: Snapshot,
    pub roles: BTreeMap<String, Classification>,
    pub events: Vec<HealthEvent>,
    pub next: State,
    pub notes: Vec<String>,
    /// Kernel log lines that ask for an immediate poll (`Link down`).
    pub wake_hints: Vec<WakeHint>,
    /// Host reads abandoned at their deadline so far (cumulative), and those not returned yet.
    pub reads_abandoned: u64,
    pub stuck_reads: Vec<(std::path::PathBuf, std::time::Duration)>,
    /// The character devices expected (and those held latched), for the report.
    pub char_devices: Vec<chardev::Finding>,
}

impl Monitor {
    /// Read the host and evaluate every check against `prev`. `loaded` says how `prev` was
    /// found: after a reboot, each enabled check first gets one "clear everything" healthy
    /// event with no entities, 1 s before the baselines (lesson 4).
    pub fn poll(&self, prev: &State, loaded: &Loaded, now: OffsetDateTime, kmsg_records: &[Record]) -> Poll {
        self.host.begin_poll();
        self.host.remember_einval(prev.einval.iter().cloned());
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            known: prev
                .known_devices
                .iter()
                .filter_map(|(n, k)| k.pci_address.clone().map(|p| (n.clone(), p)))
                .collect(),
        };
        let snapshot = discovery::discover(&self.host, &plan);
        let roles = roles::classify(&snapshot, &self.topology, &self.config.filters);

        let mut events = Vec::new();
        if matches!(loaded, Loaded::Rebooted { .. }) && prev.polls == 0 {
            events.extend(clear_all(&self.state_config, &self.stamp, now - Duration::seconds(1)));
        }
        let out = linkstate::evaluate(prev, &snapshot, &roles, &self.state_config, now, &self.stamp);
        events.extend(out.events);
        let mut next = out.state;

        // Counters of monitored PF ports only: management NICs and VFs are never evaluated.
        let monitored = |name: &str| roles.get(name).map(|c| c.monitored).unwrap_or(false);
        let ports: Vec<CounterPort> = snapshot
            .devices
            .iter()
            .filter(|d| monitored(&d.name) && !d.is_vf())
            .flat_map(|d| d.ports.iter().map(move |p| CounterPort::new(&d.name, p)))
            .collect();
        let reboot = matches!(loaded, Loaded::Rebooted { .. }) && prev.polls == 0;
        let (counter_events, counter_state) =
            counters::evaluate(&prev.counters, &ports, &self.config.counter_rules, now, reboot, &self.stamp);
        events.extend(counter_events);
        next.counters = counter_state;
        let mut notes = out.notes;
        let mut char_devices = Vec::new();
        if self.state_config.checks.contains(&Check::InfiniBandCharDeviceCheck) {
            let cd = chardev::evaluate(&prev.char_devices, &snapshot, &roles, self.config.issm, now, &self.stamp);
            events.extend(cd.events);
            notes.extend(cd.notes);
            next.char_devices = cd.state;
            char_devices = cd.findings;
        }
        if prev.polls == 0 {
            notes.extend(missing_counter_notes(&ports, &self.config.counter_rules));
        }

        // The kernel log records that arrived since the previous poll.
        let mut wake_hints = Vec::new();
        if !kmsg_records.is_empty() {
            // Devices that went since an earlier poll: their last lines explain why.
            let departed = prev
                .known_devices
                .iter()
                .filter(|(name, _)| !snapshot.devices.iter().any(|d| &d.name == *name))
                .map(|(name, k)| kmsg::Departed {
                    device: name.clone(),
                    pci_address: k.pci_address.clone(),
                    card: k.card.clone(),
                })
                .collect();
            let links = HostLinks::read(&self.host, &snapshot, departed);
            let index = DeviceIndex::from_snapshot(&snapshot, |d| monitored(&d.name), &links);
            let processed = kmsg::process(&prev.kmsg, kmsg_records, &index, &self.config.patterns, now, &self.stamp);
            events.extend(processed.events);
            next.kmsg = processed.state;
            wake_hints = processed.wake_hints;
        }

        events.retain(|e| e.check().map(|c| self.state_config.checks.contains(&c)).unwrap_or(true));
        next.einval = self.host.einval_paths();
        let reads_abandoned = self.host.stats.reads_abandoned.load(std::sync::atomic::Ordering::Relaxed);
        let stuck_reads = self.host.stuck_reads();
        Poll { snapshot, roles, events, next, notes, wake_hints, reads_abandoned, stuck_reads, char_devices }
    }
}

/// 001 §7.1: an enabled counter a port does not have is not evaluated there (fail open) and
/// said once, on the first poll of a boot — one line per counter, naming the ports.
fn missing_counter_notes(ports: &[CounterPort<'_>], rules: &[counters::CounterRule]) -> Vec<String> {
    let mut by_rule: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (device, port, rule) in counters::missing(ports, rules) {
        by_rule.entry(rule).or_default().push(format!("{device} port {port}"));
    }
    by_rule
        .into_iter()
        .map(|(rule, at)| format!("counter {rule} absent on {}: not evaluated there", at.join(", ")))
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
