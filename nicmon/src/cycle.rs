//! One poll cycle: read → decide. Shared by `nicmon check`, `nicmon run` and `nicmon trace`;
//! acting on the result (dispatch through the outbox, persistence) is the caller's.
//!
//! - [`Monitor::open`]: the one start-up of all three commands (config, host, boot ID,
//!   topology, enabled checks);
//! - [`Monitor::observe`]: **the** read of a cycle, into one [`Observation`];
//! - [`Monitor::decide`]: pure over (previous [`CheckState`], observation, kernel log
//!   records, now);
//! - [`Monitor::poll`]: observe, then decide.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Result;
use time::{Duration, OffsetDateTime};

use crate::chardev;
use crate::config::Config;
use crate::counters::{self, CounterPort};
use crate::discovery::{self, ReadPlan};
use crate::event::{Check, HealthEvent, Stamp};
use crate::host::Host;
use crate::kmsg::{self, DeviceIndex, HostLinks, Record};
use crate::linkstate::{self, StateConfig};
use crate::model::Snapshot;
use crate::roles::{self, Classification};
use crate::state::{CheckState, Loaded};
use crate::topology::{self, Topology};

/// What `nicmon check`, `run` and `trace` all start from, resolved from their flags.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
    pub config: PathBuf,
    /// GPU metadata file; `None`: derive the topology from sysfs.
    pub metadata: Option<PathBuf>,
    pub metadata_required: bool,
    pub boot_id_path: Option<PathBuf>,
    /// Checks enabled (`--checks`).
    pub checks: BTreeSet<Check>,
    pub stamp: Stamp,
}

/// What stays fixed between polls.
pub struct Monitor {
    pub host: Host,
    pub config: Config,
    pub topology: Topology,
    pub stamp: Stamp,
    pub state_config: StateConfig,
    pub counter_paths: Vec<String>,
    /// The boot ID read at start-up (`None`: unreadable).
    pub boot_id: Option<String>,
    /// Static device attributes kept between polls ([`discovery::StaticCache`]).
    pub statics: std::sync::Arc<discovery::StaticCache>,
}

/// Everything one cycle reads from the host, read once before anything is decided.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    pub snapshot: Snapshot,
    /// Network links for attributing kernel log lines; read only when there are records.
    pub links: Option<HostLinks>,
    /// The EINVAL memo after this read: the previous state's memo plus the files whose read
    /// failed with `EINVAL` now (never opened again in this boot, SPEC §1.1).
    pub einval: BTreeSet<String>,
    /// Host reads abandoned at their deadline so far (cumulative), and those not returned yet.
    pub reads_abandoned: u64,
    pub stuck_reads: Vec<(std::path::PathBuf, std::time::Duration)>,
}

/// The result of one poll.
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
    /// Unhealthy port transitions flap damping counted this poll (published or held).
    pub flaps: Vec<linkstate::FlapTransition>,
}

impl Monitor {
    /// The start-up of every command that polls: load the config (an invalid one is the
    /// error; its warnings are logged), open the host, read the boot ID, resolve the
    /// topology once (its notes are logged).
    pub fn open(opts: &MonitorOptions) -> Result<Monitor> {
        let config = Config::load(&opts.config)?;
        for w in config.warnings.iter().chain(&config.path_warnings(&opts.sysfs)) {
            tracing::warn!("{w}");
        }
        let host = Host::new(&opts.sysfs, &opts.procfs).with_boot_id_path(opts.boot_id_path.clone());
        let boot_id = host.boot_id().ok();
        let snapshot0 = discovery::discover(&host, &ReadPlan::default());
        let topology = topology::resolve(&host, &snapshot0, opts.metadata.as_deref(), opts.metadata_required)?;
        for n in &topology.notes {
            tracing::warn!("{n}");
        }
        Ok(Monitor::new(host, config, topology, opts.stamp.clone(), opts.checks.clone(), boot_id))
    }

    /// A monitor of `host` with these settings (what [`Monitor::open`] builds).
    pub fn new(
        host: Host,
        config: Config,
        topology: Topology,
        stamp: Stamp,
        checks: BTreeSet<Check>,
        boot_id: Option<String>,
    ) -> Monitor {
        Monitor {
            state_config: StateConfig {
                escalation_grace: Duration::seconds(config.escalation_grace_secs as i64),
                speed_degradation_fatal: config.speed_degradation_fatal,
                flap: config.flap,
                checks,
            },
            counter_paths: counters::read_paths(&config.counter_rules),
            host,
            config,
            topology,
            stamp,
            boot_id,
            statics: Default::default(),
        }
    }

    /// Read the host once. `links`: also read what attributing kernel log lines needs.
    pub fn observe(&self, prev: &CheckState, links: bool) -> Observation {
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            known: prev
                .links
                .known_devices
                .iter()
                .filter_map(|(n, k)| k.pci_address.clone().map(|p| (n.clone(), p)))
                .collect(),
            statics: Some(self.statics.clone()),
        };
        self.host.begin_poll();
        // The memo goes into the reader for this read and comes back out with it.
        self.host.remember_einval(prev.einval.iter().cloned());
        let snapshot = discovery::discover(&self.host, &plan);
        let links = links.then(|| {
            // Devices that went since an earlier poll: their last lines explain why.
            let departed = prev
                .links
                .known_devices
                .iter()
                .filter(|(name, _)| !snapshot.devices.iter().any(|d| &d.name == *name))
                .map(|(name, k)| kmsg::Departed {
                    device: name.clone(),
                    pci_address: k.pci_address.clone(),
                    card: k.card.clone(),
                })
                .collect();
            HostLinks::read(&self.host, &snapshot, departed)
        });
        let einval = self.host.take_einval();
        let reads_abandoned = self.host.stats.reads_abandoned.load(std::sync::atomic::Ordering::Relaxed);
        let stuck_reads = self.host.stuck_reads();
        Observation { snapshot, links, einval, reads_abandoned, stuck_reads }
    }

    /// Read the host and evaluate every check against `prev`.
    pub fn poll(&self, prev: &CheckState, loaded: &Loaded, now: OffsetDateTime, kmsg_records: &[Record]) -> Poll {
        let obs = self.observe(prev, !kmsg_records.is_empty());
        self.decide(prev, loaded, obs, now, kmsg_records)
    }

    /// Evaluate every check: pure over its arguments. `loaded` says how `prev` was found:
    /// after a reboot, each enabled check first gets one "clear everything" healthy event
    /// with no entities, 1 s before the baselines (lesson 4).
    pub fn decide(
        &self,
        prev: &CheckState,
        loaded: &Loaded,
        obs: Observation,
        now: OffsetDateTime,
        kmsg_records: &[Record],
    ) -> Poll {
        let Observation { snapshot, links, einval, reads_abandoned, stuck_reads } = obs;
        let roles = roles::classify(&snapshot, &self.topology, &self.config.filters);
        let first_poll = prev.polls == 0;
        let reboot = matches!(loaded, Loaded::Rebooted { .. }) && first_poll;

        let mut events = Vec::new();
        if reboot {
            events.extend(clear_all(&self.state_config, &self.stamp, now - Duration::seconds(1)));
        }
        let out = linkstate::evaluate(&prev.links, first_poll, &snapshot, &roles, &self.state_config, now, &self.stamp);
        events.extend(out.events);
        let mut notes = out.notes;
        let flaps = out.flaps;

        // Counters of monitored PF ports only: management NICs and VFs are never evaluated.
        let monitored = |name: &str| roles.get(name).map(|c| c.monitored).unwrap_or(false);
        let ports: Vec<CounterPort> = snapshot
            .devices
            .iter()
            .filter(|d| monitored(&d.name) && !d.is_vf())
            .flat_map(|d| d.ports.iter().map(move |p| CounterPort::new(&d.name, p)))
            .collect();
        let (counter_events, counter_state) =
            counters::evaluate(&prev.counters, &ports, &self.config.counter_rules, now, reboot, &self.stamp);
        events.extend(counter_events);
        let mut char_devices = Vec::new();
        let mut char_state = prev.char_devices.clone();
        if self.state_config.checks.contains(&Check::InfiniBandCharDeviceCheck) {
            let cd = chardev::evaluate(&prev.char_devices, &snapshot, &roles, self.config.issm, now, &self.stamp);
            events.extend(cd.events);
            notes.extend(cd.notes);
            char_state = cd.state;
            char_devices = cd.findings;
        }
        if first_poll {
            notes.extend(missing_counter_notes(&ports, &self.config.counter_rules));
        }

        // The kernel log records that arrived since the previous poll.
        let mut kmsg_state = prev.kmsg.clone();
        if !kmsg_records.is_empty() {
            let links = links.unwrap_or_default();
            let index = DeviceIndex::from_snapshot(&snapshot, |d| monitored(&d.name), &links);
            let processed = kmsg::process(&prev.kmsg, kmsg_records, &index, &self.config.patterns, now, &self.stamp);
            events.extend(processed.events);
            kmsg_state = processed.state;
        }

        events.retain(|e| e.check().map(|c| self.state_config.checks.contains(&c)).unwrap_or(true));
        let next = CheckState {
            polls: prev.polls.saturating_add(1),
            links: out.state,
            counters: counter_state,
            kmsg: kmsg_state,
            char_devices: char_state,
            einval,
        };
        Poll { snapshot, roles, events, next, notes, reads_abandoned, stuck_reads, char_devices, flaps }
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
