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
use std::sync::Arc;

use time::{Duration, OffsetDateTime};

use crate::chardev;
use crate::config::{Config, ConfigError, NoCheckEnabled};
use crate::counters::{self, CounterPort};
use crate::discovery::{self, ReadPlan};
use crate::ethtool;
use crate::event::{Check, CheckKind, HealthEvent, Stamp, Subject};
use crate::history;
use crate::host::Host;
use crate::kmsg::{self, DeviceIndex, HostLinks, Record};
use crate::linkstate::{self, StateConfig};
use crate::model::Snapshot;
use crate::pcie::{self, PcieState};
use crate::roles::{self, Classification};
use crate::state::{CheckState, Loaded};
use crate::topology::{self, MetadataError, Topology};

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
    /// `--ethtool-replay DIR`: the RoCE ports' ethtool data from `DIR/<netdev>.json`
    /// instead of the kernel (SPEC §1.11).
    pub ethtool_replay: Option<PathBuf>,
}

/// Where the topology comes from ([`Monitor::resolve_topology`]).
#[derive(Debug, Clone)]
pub struct TopologySource {
    pub metadata: Option<PathBuf>,
    pub required: bool,
}

/// Why a polling command cannot start ([`Monitor::open`]): each kind's text is the one-line
/// error the command prints, naming the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The config file cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The config disables every check requested.
    #[error(transparent)]
    NoCheck(#[from] NoCheckEnabled),
    /// The GPU metadata file is required and cannot be used.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// What stays fixed between polls.
pub struct Monitor {
    pub host: Host,
    pub config: Config,
    pub topology: Topology,
    pub stamp: Stamp,
    pub state_config: StateConfig,
    pub counter_paths: Vec<std::sync::Arc<str>>,
    /// What the RoCE ports read besides, while `[phyCheck]` is enabled.
    pub roce_reads: discovery::RoceReads,
    /// The boot ID read at start-up (`None`: unreadable).
    pub boot_id: Option<String>,
    /// Static device attributes kept between polls ([`discovery::StaticCache`]).
    pub statics: std::sync::Arc<discovery::StaticCache>,
    /// Defer the first poll of a boot while devices are unreadable, at most
    /// [`MAX_FIRST_POLL_DEFERRALS`] times (the daemon, as upstream's monitor; a one-shot
    /// `nicmon check` reports what it reads).
    pub defer_first_poll: bool,
    /// Where the RoCE ports' ethtool data comes from (`None`: not read), and its reader.
    pub ethtool: Option<ethtool::EthtoolSource>,
    pub ethtool_ports: ethtool::ports::PortReader,
}

/// Upstream's first-poll deferral limit: after this many deferred polls the first poll runs
/// with the readable devices.
pub const MAX_FIRST_POLL_DEFERRALS: u32 = 3;

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
    /// A targeted read ([`Monitor::observe_targeted`]): only these devices were read now,
    /// the rest of the snapshot is the previous full poll's. `None`: a full read.
    pub targeted: Option<Vec<String>>,
    /// What the ethtool read of the RoCE ports found absent, said once per netdev.
    pub ethtool_notes: Vec<String>,
    /// The wake-ups this poll answers (hook names; empty: the interval's poll), for the port
    /// history. Set by the daemon.
    pub woken_by: Vec<String>,
}

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

impl Monitor {
    /// The start-up of every command that polls: load the config (an invalid one is the
    /// error; its warnings are logged), open the host, read the boot ID, resolve the
    /// topology once (its notes are logged).
    pub fn open(opts: &MonitorOptions) -> Result<Monitor, OpenError> {
        let (mut monitor, opened) = Monitor::open_unresolved(opts)?;
        let snapshot0 = discovery::discover(&monitor.host, &ReadPlan::default());
        monitor.resolve_topology(&opened, &snapshot0)?;
        Ok(monitor)
    }

    /// [`Monitor::open`] without the topology: the caller resolves it
    /// ([`Monitor::resolve_topology`]) from its first observation, so a one-shot command
    /// (`nicmon check`) reads the tree once.
    pub fn open_unresolved(opts: &MonitorOptions) -> Result<(Monitor, TopologySource), OpenError> {
        let config = Config::load(&opts.config)?;
        for w in &config.warnings {
            tracing::warn!("{w}");
        }
        let enabled = config.enabled_checks(&opts.checks)?;
        if let Some(w) = &enabled.warning {
            tracing::warn!("{w}");
        }
        let host = Host::new(&opts.sysfs, &opts.procfs).with_boot_id_path(opts.boot_id_path.clone());
        let boot_id = host.boot_id().ok();
        let topology = Topology {
            source: topology::Source::None,
            gpus: Vec::new(),
            gpu_numa: Default::default(),
            levels: Default::default(),
            notes: Vec::new(),
        };
        let ethtool = ethtool::ports::source(config.phy.enabled, opts.ethtool_replay.as_deref(), &opts.sysfs);
        let mut monitor = Monitor::new(host, config, topology, opts.stamp.clone(), enabled.checks, boot_id);
        monitor.ethtool = ethtool;
        Ok((monitor, TopologySource { metadata: opts.metadata.clone(), required: opts.metadata_required }))
    }

    /// Resolve the topology from `snapshot` (its notes are logged).
    pub fn resolve_topology(&mut self, from: &TopologySource, snapshot: &Snapshot) -> Result<(), OpenError> {
        self.topology = topology::resolve(&self.host, snapshot, from.metadata.as_deref(), from.required)?;
        for n in &self.topology.notes {
            tracing::warn!("{n}");
        }
        Ok(())
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
        let ethtool_ports = ethtool::ports::PortReader::new(config.phy.read_interval);
        Monitor {
            state_config: config.state_config(checks),
            counter_paths: counters::read_paths(&config.counter_rules).into_iter().map(Into::into).collect(),
            roce_reads: roce_reads(&config),
            host,
            config,
            topology,
            stamp,
            boot_id,
            statics: Default::default(),
            defer_first_poll: false,
            ethtool: None,
            ethtool_ports,
        }
    }

    /// Read the host once. `links`: also read what attributing kernel log lines needs.
    pub fn observe(&self, prev: &CheckState, links: bool) -> Observation {
        let judge = |d: &crate::model::Device, route: &[String]| self.unmonitored(d, route);
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            known: prev
                .links
                .known_devices
                .iter()
                .filter_map(|(n, k)| k.pci_address.clone().map(|p| (n.clone(), p)))
                .collect(),
            statics: Some(self.statics.clone()),
            roce: self.roce_reads.clone(),
            unmonitored: Some(&judge),
            char_listing_may_stand: !prev.char_devices.watching(),
            link_only: false,
        };
        self.host.begin_poll();
        // The memo goes into the reader for this read and comes back out with it.
        self.host.remember_einval(prev.einval.iter().cloned());
        let mut snapshot = discovery::discover(&self.host, &plan);
        let ethtool_notes = self.read_ethtool(&mut snapshot);
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
        Observation {
            snapshot,
            links,
            einval,
            reads_abandoned,
            stuck_reads,
            targeted: None,
            woken_by: Vec::new(),
            ethtool_notes,
        }
    }

    /// Whether `device` is not monitored, as [`Monitor::decide`] classifies it (given the
    /// devices behind the default route): discovery reads such a device once per
    /// incarnation ([`discovery::Unmonitored`]).
    fn unmonitored(&self, device: &crate::model::Device, route: &[String]) -> bool {
        !roles::is_monitored(device, route, &self.topology, &self.config.filters)
    }

    /// The RoCE ports' ethtool data into `snapshot` (of the monitored devices), under the
    /// host's read deadlines.
    fn read_ethtool(&self, snapshot: &mut Snapshot) -> Vec<String> {
        let Some(source) = &self.ethtool else {
            return Vec::new();
        };
        // The PFs' roles (a VF is not read, nor classified).
        let route = &snapshot.default_route_devices;
        let monitored: BTreeSet<String> = snapshot
            .devices
            .iter()
            .filter(|d| !d.is_vf() && !self.unmonitored(d, route))
            .map(|d| d.name.clone())
            .collect();
        let wanted = |name: &str| monitored.contains(name);
        self.ethtool_ports.read(source, snapshot, wanted, || self.host.timeout(), std::time::Instant::now())
    }

    /// The targeted read of a hinted wake-up (SPEC §1.8): `devices` read again now, by the
    /// same code as [`Monitor::observe`], on top of `base`, the previous full poll's
    /// snapshot — their link-state files only: the counter, RoCE, ethtool and PCIe data
    /// are judged by the full poll's checks, over the interval, and the devices keep
    /// `base`'s readings of them ([`ReadPlan::link_only`]). `None` when the device set
    /// changed since `base` (only a full poll may decide about devices that came or went).
    pub fn observe_targeted(&self, prev: &CheckState, base: &Snapshot, devices: &[String]) -> Option<Observation> {
        let judge = |d: &crate::model::Device, route: &[String]| self.unmonitored(d, route);
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            known: Vec::new(),
            statics: Some(self.statics.clone()),
            roce: self.roce_reads.clone(),
            unmonitored: Some(&judge),
            char_listing_may_stand: false,
            link_only: true,
        };
        self.host.begin_poll();
        self.host.remember_einval(prev.einval.iter().cloned());
        // The files the last targeted read of these devices read are read again while
        // the devices are listed and their reads planned (the same files: used).
        self.host.read_ahead(devices);
        let snapshot = discovery::rediscover(&self.host, &plan, base, devices);
        self.host.end_read_ahead();
        let einval = self.host.take_einval();
        let snapshot = snapshot?;
        let reads_abandoned = self.host.stats.reads_abandoned.load(std::sync::atomic::Ordering::Relaxed);
        let stuck_reads = self.host.stuck_reads();
        Some(Observation {
            snapshot,
            links: None,
            einval,
            reads_abandoned,
            stuck_reads,
            targeted: Some(devices.to_vec()),
            ethtool_notes: Vec::new(),
            woken_by: Vec::new(),
        })
    }

    /// Read the host and evaluate every check against `prev`.
    pub fn poll(&self, prev: &CheckState, loaded: &Loaded, now: OffsetDateTime, kmsg_records: &[Record]) -> Poll {
        let obs = self.observe(prev, !kmsg_records.is_empty());
        self.decide(prev, loaded, obs, now, kmsg_records)
    }

    /// Evaluate every check: pure over its arguments. `loaded` says how `prev` was found:
    /// after a reboot, each enabled check first gets one "clear everything" healthy event
    /// with no entities, 1 s before the baselines (lesson 4).
    ///
    /// The steps, in order: first-poll deferral; the clears of a reboot or a rescope; link
    /// state; counters; character devices; PCIe; kernel log; the filter by enabled check.
    pub fn decide(
        &self,
        prev: &CheckState,
        loaded: &Loaded,
        obs: Observation,
        now: OffsetDateTime,
        kmsg_records: &[Record],
    ) -> Poll {
        let mut notes = obs.ethtool_notes;
        let Observation { snapshot, links, einval, reads_abandoned, stuck_reads, targeted, woken_by, .. } = obs;
        // A port whose link layer is unreadable is judged with its last known one.
        let snapshot = linkstate::with_known_link_layers(&prev.links, snapshot);
        let roles = roles::classify(&snapshot, &self.topology, &self.config.filters);
        let first_poll = prev.polls == 0;
        if let Some((next, deferred)) = self.defer_first_poll(prev, &snapshot, &roles, targeted.is_some(), &mut notes) {
            return Poll { snapshot, roles, next, notes, reads_abandoned, stuck_reads, deferred, ..Poll::default() };
        }
        let reboot = loaded.owes_baselines() && first_poll;
        // The discovery scope changed since the state was made (nicExclusionRegex or
        // nicInclusionRegexOverride edited): the state checks forget their ports and devices
        // and re-baseline (their clear, then healthy events); counters and latches are kept.
        let scope = self.config.filters.fingerprint();
        let rescope = !first_poll && prev.scope.as_ref().is_some_and(|s| *s != scope);
        let mut events = self.clears(reboot, rescope, now);

        let no_links = linkstate::LinkState::default();
        let prev_links = if rescope { &no_links } else { &prev.links };
        let links_out = linkstate::evaluate(
            prev_links,
            first_poll || rescope,
            &snapshot,
            &roles,
            &self.state_config,
            now,
            &self.stamp,
        );
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

        let (kmsg_events, kmsg_state) = match full {
            true => self.kernel_log(&prev.kmsg, kmsg_records, &snapshot, &roles, links, now),
            false => (Vec::new(), Arc::clone(&prev.kmsg)),
        };
        events.extend(kmsg_events);

        events.retain(|e| e.check().map(|c| self.state_config.checks.contains(&c)).unwrap_or(true));
        let decided = port_decisions(&events, &links_out.holds, &links_out.flaps, &links_out.state);
        let history = history::record(&prev.history, port_readings(&snapshot, &roles), &decided, now, &woken_by);
        let next = CheckState {
            polls: prev.polls.saturating_add(1),
            links: links_out.state,
            counters: counter_state,
            kmsg: kmsg_state,
            char_devices: char_state,
            pcie: pcie_state,
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
        let (events, mut state) = counters::evaluate(prev, ports, rules, now, reboot, &self.stamp);
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

    /// Step 7, kernel log: the records that arrived since the previous poll, attributed to
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
        .flat_map(|d| d.ports.iter().map(move |p| CounterPort::new(&d.name, p)))
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
    let state_check = |e: &&HealthEvent| {
        matches!(e.check(), Some(Check::InfiniBandStateCheck | Check::EthernetStateCheck | Check::EFAStateCheck))
    };
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
    history::PortDecisions {
        reported,
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

/// What RoCE ports read besides, while `[phyCheck]` is enabled: the ECN/CNP congestion
/// counters (metrics only) and the netdev's `speed` (the BER's port rate where the RDMA
/// port's `rate` gives none).
fn roce_reads(config: &Config) -> discovery::RoceReads {
    if !config.phy.enabled {
        return discovery::RoceReads::default();
    }
    let rules = counters::read_paths(&config.counter_rules);
    let counter_paths = ethtool::CONGESTION
        .iter()
        .map(|n| ethtool::congestion_path(n))
        .filter(|p| !rules.contains(p))
        .map(Into::into)
        .collect();
    discovery::RoceReads { counter_paths, speed: true }
}

/// Each RoCE port's pre-FEC BER threshold where its FEC code sets it
/// ([`crate::config::PhyConfig::port_ber_threshold`]).
fn with_ber_thresholds(ports: &mut [CounterPort<'_>], snapshot: &Snapshot, config: &Config) {
    let Some(rule) = config.counter_rules.iter().find(|r| r.name == crate::counters::rule::PRE_FEC_BER_RULE) else {
        return;
    };
    for cp in ports.iter_mut() {
        let port = snapshot
            .devices
            .iter()
            .find(|d| d.name == cp.device)
            .and_then(|d| d.ports.iter().find(|p| p.number == cp.port));
        let Some(fec) = port.and_then(|p| p.ethtool.as_ref()).and_then(|e| e.fec.as_ref()) else {
            continue;
        };
        let lanes = (!fec.lanes.is_empty()).then_some(fec.lanes.len());
        let code = ethtool::phy::rs_code(fec.active, cp.rate_bps.unwrap_or(0.0), lanes);
        cp.ber_threshold = config.phy.port_ber_threshold(rule.threshold, code);
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
/// none: veth, virtio): one line names them with the ports that lack the same ones.
fn missing_counter_notes(ports: &[CounterPort<'_>], rules: &[counters::CounterRule]) -> Vec<String> {
    let from_ethtool =
        |name: &str| rules.iter().any(|r| r.name == name && r.path.starts_with(crate::counters::rule::ETHTOOL_PREFIX));
    let mut by_rule: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut by_port: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (device, port, rule) in counters::missing(ports, rules) {
        let at = format!("{device} port {port}");
        match from_ethtool(&rule) {
            true => by_port.entry(at).or_default().push(rule),
            false => by_rule.entry(rule).or_default().push(at),
        }
    }
    let mut by_set: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for (at, rules) in by_port {
        by_set.entry(rules).or_default().push(at);
    }
    let counters = by_rule
        .into_iter()
        .map(|(rule, at)| format!("counter {rule} absent on {}: not evaluated there", at.join(", ")));
    let phy = by_set.into_iter().map(|(rules, at)| {
        format!(
            "RoCE physical-layer counters {} absent on {} (not in the ethtool data of their netdev's driver): not \
             evaluated there",
            rules.join(", "),
            at.join(", ")
        )
    });
    counters.chain(phy).collect()
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

/// Monitor options over a fixture node: every check, no config file, no metadata.
#[cfg(test)]
pub(crate) fn fixture_options(node: &nicmon_tests::Node) -> MonitorOptions {
    MonitorOptions {
        sysfs: node.sys().to_path_buf(),
        procfs: node.proc().to_path_buf(),
        config: node.root().join("absent.toml"),
        metadata: None,
        metadata_required: false,
        boot_id_path: None,
        checks: Check::ALL.into_iter().collect(),
        stamp: Stamp { node_name: "n1".into(), ..Stamp::default() },
        ethtool_replay: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nicmon_tests::platforms::Platform;

    fn options(node: &nicmon_tests::Node) -> MonitorOptions {
        fixture_options(node)
    }

    fn fatal_on(poll: &Poll) -> Vec<String> {
        let mut v: Vec<String> = poll
            .events
            .iter()
            .filter(|e| !e.is_healthy)
            .map(|e| format!("{} {}", e.check_name, e.entities_text()))
            .collect();
        v.sort();
        v
    }

    /// The sysfs paths `log` holds (emptied).
    fn take(log: &crate::host::AccessLog) -> Vec<String> {
        use crate::host::Access;
        std::mem::take(&mut *log.lock().unwrap())
            .into_iter()
            .filter_map(|a| match a {
                Access::Read { rel, .. } | Access::List { rel, .. } | Access::Entry { rel, .. } => Some(rel),
                Access::BootIdFile => None,
            })
            .collect()
    }

    /// The paths of `rels` with any of `names` as a component.
    fn naming<'r>(rels: &'r [String], names: &[String]) -> Vec<&'r String> {
        rels.iter().filter(|rel| rel.split('/').any(|c| names.iter().any(|n| n == c))).collect()
    }

    /// A monitor of `node` whose host notes every path it is asked about in the log returned.
    fn logged_monitor(node: &nicmon_tests::Node) -> (Monitor, crate::host::AccessLog) {
        let mut monitor = Monitor::open(&options(node)).unwrap();
        let log = crate::host::AccessLog::default();
        monitor.host = Host::new(node.sys(), node.proc()).with_access_log(log.clone());
        (monitor, log)
    }

    /// Unmonitored functions cost nothing per poll: the poll that discovers a VF reads it
    /// whole (ports, `device` link, class entries); the polls after it read, list or look up
    /// nothing of it, whatever its port does, until the device listing changes.
    #[test]
    fn a_vf_is_read_once_per_incarnation() {
        let node = nicmon_tests::platforms::dgx_h100_with_vfs(4, None);
        let (monitor, log) = logged_monitor(&node);
        let vfs: Vec<String> = node.info.iter().filter(|(_, i)| i.is_vf).map(|(n, _)| n.clone()).collect();
        assert_eq!(vfs.len(), 32);
        let t0 = OffsetDateTime::now_utc();
        let first = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        // Their class entries (`uverbsN`, `umadN`, `issmN`) by name.
        let chars = |p: &Poll| -> Vec<String> {
            let (crate::model::ClassDir::Listed(v), crate::model::ClassDir::Listed(m)) =
                (&p.snapshot.char_devices.verbs, &p.snapshot.char_devices.mad)
            else {
                panic!("both class directories listed")
            };
            v.iter()
                .chain(m)
                .filter(|n| n.device.as_ref().is_some_and(|d| vfs.contains(d)))
                .map(|n| n.name.clone())
                .collect()
        };
        let entries = chars(&first);
        assert_eq!(entries.len(), 3 * vfs.len());
        let read = take(&log);
        for vf in &vfs {
            let state = format!("class/infiniband/{vf}/ports/1/state");
            assert!(naming(&read, &vfs).contains(&&state), "{vf} read on discovery");
        }
        assert_eq!(naming(&read, &entries).len(), 5 * vfs.len(), "ibdev of each, port of umad and issm");
        assert_eq!(monitor.statics.frozen_count(), vfs.len());

        // Its port comes up (a VF assigned to a guest): not even looked at.
        node.set_port(&vfs[0], 1, "4: ACTIVE", "5: LinkUp");
        let mut state = first.next.clone();
        for t in 1..4 {
            let p = monitor.poll(&state, &Loaded::Resumed, t0 + Duration::seconds(t), &[]);
            let read = take(&log);
            assert_eq!(naming(&read, &vfs), Vec::<&String>::new(), "poll {t}: nothing of a VF");
            assert_eq!(naming(&read, &entries), Vec::<&String>::new(), "poll {t}: nothing of a VF's class entries");
            // The VFs' readings are the first poll's (a PF's netdev `speed` is read on the
            // first poll only, so the PFs' readings may differ).
            let vf_devices =
                |s: &Snapshot| s.devices.iter().filter(|d| vfs.contains(&d.name)).cloned().collect::<Vec<_>>();
            assert_eq!(vf_devices(&p.snapshot), vf_devices(&first.snapshot), "poll {t}: the same VFs");
            assert_eq!(p.snapshot.char_devices, first.snapshot.char_devices, "poll {t}");
            let pf = naming(&read, &["mlx5_0".to_string()]);
            assert!(pf.iter().any(|r| r.ends_with("ports/1/state")), "PFs are read: {pf:?}");
            assert!(p.events.is_empty(), "{:?}", p.events);
            state = p.next;
        }

        // The VF goes and comes back: a new incarnation, read whole again (then not).
        node.remove_device(&vfs[0]);
        let gone = monitor.poll(&state, &Loaded::Resumed, t0 + Duration::seconds(5), &[]);
        assert!(gone.snapshot.devices.iter().all(|d| d.name != vfs[0]));
        node.restore_device(&vfs[0]);
        log.lock().unwrap().clear();
        let back = monitor.poll(&gone.next, &Loaded::Resumed, t0 + Duration::seconds(6), &[]);
        let read = take(&log);
        assert!(read.contains(&format!("class/infiniband/{}/ports/1/state", vfs[0])), "read again");
        let vf = back.snapshot.devices.iter().find(|d| d.name == vfs[0]).unwrap();
        assert_eq!(vf.ports[0].state, Some(crate::model::PortState::Active), "read again: its port as it is now");
        assert!(back.events.is_empty(), "{:?}", back.events);
        monitor.poll(&back.next, &Loaded::Resumed, t0 + Duration::seconds(7), &[]);
        assert_eq!(naming(&take(&log), &vfs), Vec::<&String>::new());
    }

    /// A targeted read reads the named device's ports and counters, not its PCIe files (the
    /// PCIe check runs on full polls only): the device keeps the full poll's PCIe reading.
    #[test]
    fn a_targeted_read_leaves_the_counter_and_pcie_files_to_the_full_poll() {
        let node = nicmon_tests::platforms::dgx_h100_with_vfs(0, None);
        let (monitor, log) = logged_monitor(&node);
        let full =
            monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, OffsetDateTime::now_utc(), &[]);
        let read = take(&log);
        let address = full.snapshot.devices.iter().find(|d| d.name == "mlx5_0").and_then(|d| d.pci_address.clone());
        let address = address.expect("mlx5_0 has a PCI address");
        let pcie_files =
            |read: &[String]| read.iter().filter(|r| r.contains(&address) && r.contains("aer_dev")).count();
        assert!(pcie_files(&read) > 0, "the full poll reads mlx5_0's AER files");
        let targets = vec!["mlx5_0".to_string()];
        let obs = monitor.observe_targeted(&full.next, &full.snapshot, &targets).expect("the same devices");
        let read = take(&log);
        assert!(read.iter().any(|r| r == "class/infiniband/mlx5_0/ports/1/state"), "its port is read");
        assert_eq!(pcie_files(&read), 0, "no PCIe file is read: {read:?}");
        let pcie = |s: &Snapshot| s.devices.iter().find(|d| d.name == "mlx5_0").and_then(|d| d.pcie.clone());
        assert!(pcie(&full.snapshot).is_some());
        assert_eq!(pcie(&obs.snapshot), pcie(&full.snapshot), "the full poll's PCIe reading stands");
        // Nor a counter file: the counters are the full poll's, and not evaluated.
        let counter_files = |read: &[String]| read.iter().filter(|r| r.contains("counters/")).count();
        assert_eq!(counter_files(&read), 0, "no counter file is read: {read:?}");
        let port = |s: &Snapshot| s.devices.iter().find(|d| d.name == "mlx5_0").map(|d| d.ports[0].clone());
        let (before, after) = (port(&full.snapshot).unwrap(), port(&obs.snapshot).unwrap());
        assert!(!before.counters.is_empty(), "the full poll read mlx5_0's counters");
        assert_eq!(after.counters, before.counters, "the full poll's counter values stand");
        let t = OffsetDateTime::now_utc() + Duration::seconds(1);
        let decided = monitor.decide(&full.next, &Loaded::Resumed, obs, t, &[]);
        assert_eq!(decided.next.counters, full.next.counters, "no counter evaluated");
        monitor.poll(&decided.next, &Loaded::Resumed, t, &[]);
        assert!(counter_files(&take(&log)) > 0, "the full poll that follows reads them");
    }

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

    /// A management NIC (the default route's) is read once too, while it is one: once the
    /// route leaves it, it is monitored and read on every poll, from that poll on.
    #[test]
    fn a_management_nic_is_read_again_once_it_is_monitored() {
        let node = Platform::OnPremL40s.build();
        let (monitor, log) = logged_monitor(&node);
        let mgmt = vec!["mlx5_0".to_string()];
        let t0 = OffsetDateTime::now_utc();
        let first = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        assert!(!first.roles["mlx5_0"].monitored);
        assert!(take(&log).contains(&"class/infiniband/mlx5_0/ports/1/state".to_string()));
        let second = monitor.poll(&first.next, &Loaded::Resumed, t0 + Duration::seconds(1), &[]);
        assert_eq!(naming(&take(&log), &mgmt), Vec::<&String>::new(), "not read while management");
        // Its port goes down, unseen; the route moves off it: read again, judged as it is now.
        node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
        std::fs::write(node.proc().join("net/route"), "Iface\tDestination\tGateway\n").unwrap();
        let third = monitor.poll(&second.next, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        assert!(third.roles["mlx5_0"].monitored, "{:?}", third.roles["mlx5_0"]);
        assert!(take(&log).contains(&"class/infiniband/mlx5_0/ports/1/state".to_string()));
        let dev = third.snapshot.devices.iter().find(|d| d.name == "mlx5_0").unwrap();
        assert_eq!(dev.ports[0].state, Some(crate::model::PortState::Down));
        monitor.poll(&third.next, &Loaded::Resumed, t0 + Duration::seconds(3), &[]);
        assert!(take(&log).contains(&"class/infiniband/mlx5_0/ports/1/state".to_string()), "read every poll now");
    }

    /// A targeted poll reports the named device's change, not another device's; the full
    /// poll that follows reports the other one, and neither reports an event twice.
    #[test]
    fn targeted_then_full_poll_never_repeats_an_event() {
        let node = Platform::H100Oci.build();
        let monitor = Monitor::open(&options(&node)).unwrap();
        let t0 = OffsetDateTime::now_utc();
        let base = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        assert!(fatal_on(&base).is_empty(), "a healthy node: {:?}", fatal_on(&base));
        let monitored: Vec<String> = base
            .snapshot
            .devices
            .iter()
            .filter(|d| base.roles.get(&d.name).is_some_and(|c| c.monitored) && !d.ports.is_empty())
            .map(|d| d.name.clone())
            .collect();
        let (a, b) = (&monitored[0], &monitored[1]);
        let state = base.next.clone();
        node.pull_cable(a, 1);
        node.pull_cable(b, 1);

        // The hint resolves by name, netdev and PCI address.
        let dev_a = base.snapshot.devices.iter().find(|d| &d.name == a).unwrap();
        assert_eq!(discovery::devices_in(&base.snapshot, a), vec![a.clone()]);
        if let Some(nd) = &dev_a.netdev {
            assert_eq!(discovery::devices_in(&base.snapshot, nd), vec![a.clone()]);
        }
        let pci = dev_a.pci_address.clone().unwrap();
        assert_eq!(discovery::devices_in(&base.snapshot, &pci), vec![a.clone()]);
        assert!(discovery::devices_in(&base.snapshot, "nosuchdev").is_empty());
        assert!(discovery::devices_probed(&monitor.host, &base.snapshot, "nosuchdev").is_empty());

        let obs = monitor.observe_targeted(&state, &base.snapshot, std::slice::from_ref(a)).expect("same device set");
        let targeted = monitor.decide(&state, &Loaded::Resumed, obs, t0 + Duration::seconds(1), &[]);
        let first = fatal_on(&targeted);
        let about = |e: &String, dev: &str| {
            let card = base.snapshot.devices.iter().find(|d| d.name == dev).and_then(|d| d.card.clone());
            e.contains(&format!("NIC={dev} ")) || card.is_some_and(|c| e.contains(&format!("NIC={c}")))
        };
        assert!(!first.is_empty() && first.iter().all(|e| about(e, a)), "only {a}: {first:?}");

        let full = monitor.poll(&targeted.next, &Loaded::Resumed, t0 + Duration::seconds(1), &[]);
        let second = fatal_on(&full);
        assert!(!second.is_empty() && second.iter().all(|e| about(e, b)), "only {b}: {second:?}");
        for e in &second {
            assert!(!first.contains(e), "{e} reported twice");
        }
        let again = monitor.poll(&full.next, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        assert!(again.events.is_empty(), "nothing new: {:?}", fatal_on(&again));

        // A device set that changed since the base: no targeted read.
        node.remove_device(b);
        assert!(monitor.observe_targeted(&again.next, &full.snapshot, std::slice::from_ref(a)).is_none());
    }

    /// A targeted poll evaluates no counter, kernel log record, character device or PCIe
    /// reading: it keeps their state as it was, shared with the previous poll's, not
    /// copied; a full poll makes them anew (the kernel log's only when it has records).
    #[test]
    fn a_targeted_poll_shares_the_state_it_does_not_evaluate() {
        let node = Platform::H100Oci.build();
        let monitor = Monitor::open(&options(&node)).unwrap();
        let t0 = OffsetDateTime::now_utc();
        let base = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        let prev = base.next.clone();
        let dev = base.snapshot.devices.iter().find(|d| base.roles.get(&d.name).is_some_and(|c| c.monitored)).unwrap();
        let obs = monitor.observe_targeted(&prev, &base.snapshot, std::slice::from_ref(&dev.name)).unwrap();
        let targeted = monitor.decide(&prev, &Loaded::Resumed, obs, t0 + Duration::seconds(1), &[]);
        let next = &targeted.next;
        assert!(Arc::ptr_eq(&prev.counters, &next.counters), "counters");
        assert!(Arc::ptr_eq(&prev.kmsg, &next.kmsg), "kernel log");
        assert!(Arc::ptr_eq(&prev.char_devices, &next.char_devices), "character devices");
        assert!(Arc::ptr_eq(&prev.pcie, &next.pcie), "PCIe");
        let full = monitor.poll(next, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        assert!(!Arc::ptr_eq(&next.counters, &full.next.counters));
        assert!(Arc::ptr_eq(&next.kmsg, &full.next.kmsg), "no kernel log record: kept as it was");
        assert!(!Arc::ptr_eq(&next.char_devices, &full.next.char_devices));
    }

    /// The at-least-once hole the sent-batch journal closes, exactly: a port goes down, the
    /// commit hands the fatal batch to the sender and the sink accepts it, the process dies
    /// before the save (the state file still says the port was reported healthy), the port
    /// recovers, the daemon restarts. The restarted daemon resends the fatal (it may not
    /// have been delivered) and its first poll reports the port healthy, which clears it.
    /// Without the journal the first poll reports nothing and the fatal stays.
    #[tokio::test]
    async fn a_crash_between_send_and_save_then_a_recovery_still_clears_the_fatal() {
        use crate::courier::{Courier, Journal};
        use crate::state::State;
        let node = Platform::H100Oci.build();
        let monitor = Monitor::open(&options(&node)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (state_file, sink_file) = (dir.path().join("state.json"), dir.path().join("events.jsonl"));
        let t0 = OffsetDateTime::now_utc();

        // Running, healthy, saved.
        let base = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        let dev = base
            .snapshot
            .devices
            .iter()
            .find(|d| base.roles.get(&d.name).is_some_and(|c| c.monitored) && !d.ports.is_empty() && !d.is_vf())
            .map(|d| d.name.clone())
            .unwrap();
        let mut state = State::fresh(None);
        state.checks = base.next.clone();
        crate::state::file::save(&state_file, &state).unwrap();

        // The port goes down; the poll's commit journals and sends; the sink accepts.
        node.pull_cable(&dev, 1);
        let down = monitor.poll(&state.checks, &Loaded::Resumed, t0 + Duration::seconds(1), &[]);
        let fatal: Vec<_> = down.events.iter().filter(|e| !e.is_healthy && e.entities_text().contains(&dev)).collect();
        assert!(!fatal.is_empty(), "the pull is detected: {:?}", down.events);
        let sink = crate::dispatch::Sink::lazy(
            &crate::dispatch::SinkSpec::File(sink_file.clone()),
            crate::dispatch::GrpcConfig::new(crate::dispatch::DEFAULT_SOCKET.parse().unwrap()),
        );
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new("n"));
        let mut courier =
            Courier::start(sink, &state.outbox, None, metrics.clone(), std::time::Duration::ZERO).keeping(&state_file);
        let mut running = state.clone();
        courier.commit(&mut running, down.next.clone(), &down.events).unwrap_or_else(|_| panic!("unbounded"));
        courier.next_acks().await.expect("the sink accepted the batch");
        // kill -9 here: no save, no journal.saved().
        drop(courier);
        let delivered = std::fs::read_to_string(&sink_file).unwrap();
        assert!(delivered.contains(r#""isFatal":true"#), "{delivered}");

        // The port recovers while nicmon is down; the daemon restarts.
        node.repair(&dev, 1);
        let (mut loaded_state, how) = crate::state::file::load(&state_file, None);
        assert_eq!(how, Loaded::Resumed);
        let recovered = Journal::new(&state_file).recover(&mut loaded_state, true);
        assert!(!recovered.is_empty(), "the journal holds the sent batch");
        assert_eq!(
            loaded_state.outbox.pending().iter().flat_map(|b| &b.events).filter(|e| !e.is_healthy).count(),
            down.events.iter().filter(|e| !e.is_healthy).count(),
            "the unsaved batches are queued again (resent first)"
        );
        let first = monitor.poll(&loaded_state.checks, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        let cleared: Vec<_> = first
            .events
            .iter()
            .filter(|e| {
                e.is_healthy
                    && fatal.iter().any(|f| f.check_name == e.check_name && f.entities_text() == e.entities_text())
            })
            .collect();
        assert_eq!(cleared.len(), fatal.len(), "each fatal sent is cleared by the first poll: {:?}", first.events);

        // The same restart without the journal (the hole): nothing would clear it.
        let (bare, _) = crate::state::file::load(&state_file, None);
        let unaware = monitor.poll(&bare.checks, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        assert!(unaware.events.iter().all(|e| !e.entities_text().contains(&dev)), "{:?}", unaware.events);

        // A save empties the journal: a later restart recovers nothing.
        let mut j = Journal::new(&state_file);
        crate::state::file::save(&state_file, &running).unwrap();
        j.saved();
        let (mut again, _) = crate::state::file::load(&state_file, None);
        assert!(j.recover(&mut again, true).is_empty());
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
