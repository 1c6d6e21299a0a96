//! A poll: the read layer's observation composed with the decide layer's step. Shared by
//! `nicmon check`, `nicmon run` and `nicmon trace`; acting on the result (dispatch through
//! the outbox, persistence) is the caller's.
//!
//! - [`Monitor::open`]: the one start-up of all three commands (config, host, boot ID,
//!   topology, enabled checks);
//! - [`Monitor::observe`]: **the** read of a cycle, into one [`Observation`]
//!   ([`crate::read::observe::Observer`]);
//! - [`Monitor::decide`]: pure over (previous [`CheckState`], observation, kernel log
//!   records, now) ([`crate::decide::poll::Decider`]);
//! - [`Monitor::poll`]: observe, then decide.
use std::collections::BTreeSet;
use std::path::PathBuf;

use time::OffsetDateTime;

use crate::act::state::Loaded;
use crate::config::{ConfigError, NoCheckEnabled};
use crate::decide::counters;
use crate::decide::poll::{Decider, Poll};
use crate::decide::settings::Config;
use crate::decide::state::CheckState;
use crate::model::event::{Check, Stamp};
use crate::model::kmsg::{Departed, Record};
use crate::model::observation::Observation;
use crate::model::topology::{Source, Topology};
use crate::model::{Device, Snapshot};
use crate::read::discovery::{self, ReadPlan, RoceReads};
use crate::read::ethtool;
use crate::read::host::Host;
use crate::read::observe::{Observer, Prior};
use crate::read::topology::{self, MetadataError};

pub use crate::decide::poll::MAX_FIRST_POLL_DEFERRALS;

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
    /// `--devlink-replay DIR`: the NICs' devlink health reporters from `DIR/<BDF>.json`
    /// instead of the kernel (SPEC §1.13).
    pub devlink_replay: Option<PathBuf>,
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

/// What stays fixed between polls: how the node is read, how it is judged.
pub struct Monitor {
    pub observer: Observer,
    pub decider: Decider,
    /// The boot ID read at start-up (`None`: unreadable).
    pub boot_id: Option<String>,
}

impl Monitor {
    /// The start-up of every command that polls: load the config (an invalid one is the
    /// error; its warnings are logged), open the host, read the boot ID, resolve the
    /// topology once (its notes are logged).
    pub fn open(opts: &MonitorOptions) -> Result<Monitor, OpenError> {
        let (mut monitor, opened) = Monitor::open_unresolved(opts)?;
        let snapshot0 = discovery::discover(&monitor.observer.host, &ReadPlan::default());
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
            source: Source::None,
            gpus: Vec::new(),
            gpu_numa: Default::default(),
            levels: Default::default(),
            notes: Vec::new(),
        };
        let ethtool = ethtool::ports::source(config.phy.enabled, opts.ethtool_replay.as_deref(), &opts.sysfs);
        let mut monitor = Monitor::new(host, config, topology, opts.stamp.clone(), enabled.checks, boot_id);
        monitor.observer.ethtool = ethtool;
        let optics = monitor.decider.config.optics.enabled;
        monitor.observer.modules = ethtool::ports::source(optics, opts.ethtool_replay.as_deref(), &opts.sysfs);
        monitor.observer.devlink = crate::read::devlink::source(
            monitor.decider.config.firmware.enabled,
            opts.devlink_replay.as_deref(),
            &opts.sysfs,
        );
        Ok((monitor, TopologySource { metadata: opts.metadata.clone(), required: opts.metadata_required }))
    }

    /// Resolve the topology from `snapshot` (its notes are logged).
    pub fn resolve_topology(&mut self, from: &TopologySource, snapshot: &Snapshot) -> Result<(), OpenError> {
        let topology = topology::resolve(&self.observer.host, snapshot, from.metadata.as_deref(), from.required)?;
        for n in &topology.notes {
            tracing::warn!("{n}");
        }
        self.decider.topology = topology;
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
        let observer = Observer {
            counter_paths: counters::read_paths(&config.counter_rules).into_iter().map(Into::into).collect(),
            counter_drivers: counters::read_path_drivers(&config.counter_rules).into(),
            roce_reads: roce_reads(&config),
            host,
            statics: Default::default(),
            ethtool: None,
            ethtool_ports: ethtool::ports::PortReader::new(config.phy.read_interval),
            modules: None,
            module_reader: ethtool::modules::ModuleReader::new(config.optics.read_interval),
            hwmon: config.thermal.enabled.then(|| crate::read::hwmon::HwmonReader::new(config.thermal.read_interval)),
            devlink: None,
            devlink_reader: crate::read::devlink::DevlinkReader::new(config.firmware.read_interval),
        };
        Monitor { observer, decider: Decider::new(config, topology, stamp, checks), boot_id }
    }

    /// Read the host once. `links`: also read what attributing kernel log lines needs.
    pub fn observe(&self, prev: &CheckState, links: bool) -> Observation {
        let judge = |d: &Device, route: &[String]| self.decider.unmonitored(d, route);
        let departed = |snapshot: &Snapshot| departed(prev, snapshot);
        self.observer.observe(prior(prev, &departed), &judge, links)
    }

    /// The targeted read of a hinted wake-up (SPEC §1.8,
    /// [`Observer::observe_targeted`]): `devices` read again now on top of `base`, the
    /// previous full poll's snapshot. `None` when the device set changed since `base`.
    pub fn observe_targeted(&self, prev: &CheckState, base: &Snapshot, devices: &[String]) -> Option<Observation> {
        let judge = |d: &Device, route: &[String]| self.decider.unmonitored(d, route);
        self.observer.observe_targeted(&prev.einval, &judge, base, devices)
    }

    /// Read the host and evaluate every check against `prev`.
    pub fn poll(&self, prev: &CheckState, loaded: &Loaded, now: OffsetDateTime, kmsg_records: &[Record]) -> Poll {
        let obs = self.observe(prev, !kmsg_records.is_empty());
        self.decide(prev, loaded, obs, now, kmsg_records)
    }

    /// Evaluate every check ([`Decider::decide`]): pure over its arguments. `loaded` says how
    /// `prev` was found: after a reboot, each enabled check first gets one "clear
    /// everything" healthy event with no entities, 1 s before the baselines (lesson 4).
    pub fn decide(
        &self,
        prev: &CheckState,
        loaded: &Loaded,
        obs: Observation,
        now: OffsetDateTime,
        kmsg_records: &[Record],
    ) -> Poll {
        self.decider.decide(prev, loaded.owes_baselines(), obs, now, kmsg_records)
    }
}

/// What a read takes from the previous poll's state.
fn prior<'a>(prev: &'a CheckState, departed: &'a dyn Fn(&Snapshot) -> Vec<Departed>) -> Prior<'a> {
    Prior {
        known: prev
            .links
            .known_devices
            .iter()
            .filter_map(|(n, k)| Some((n.as_str(), k.pci_address.as_deref()?)))
            .collect(),
        departed,
        einval: &prev.einval,
        char_listing_may_stand: !prev.char_devices.watching(),
    }
}

/// The devices known earlier in this boot that `snapshot` lacks.
fn departed(prev: &CheckState, snapshot: &Snapshot) -> Vec<Departed> {
    prev.links
        .known_devices
        .iter()
        .filter(|(name, _)| !snapshot.devices.iter().any(|d| &d.name == *name))
        .map(|(name, k)| Departed { device: name.clone(), pci_address: k.pci_address.clone(), card: k.card.clone() })
        .collect()
}

/// What RoCE ports read besides, while `[phyCheck]` is enabled: the ECN/CNP congestion
/// counters (metrics only) and the netdev's `speed` (the BER's port rate where the RDMA
/// port's `rate` gives none).
fn roce_reads(config: &Config) -> RoceReads {
    if !config.phy.enabled {
        return RoceReads::default();
    }
    let rules = counters::read_paths(&config.counter_rules);
    let counter_paths = crate::model::ethtool::CONGESTION
        .iter()
        .map(|n| crate::model::ethtool::congestion_path(n))
        .filter(|p| !rules.contains(p))
        .map(Into::into)
        .collect();
    RoceReads { counter_paths, speed: true }
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
        devlink_replay: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use nicmon_tests::platforms::Platform;
    use std::sync::Arc;
    use time::Duration;

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
    fn take(log: &crate::read::host::AccessLog) -> Vec<String> {
        use crate::read::host::Access;
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
    fn logged_monitor(node: &nicmon_tests::Node) -> (Monitor, crate::read::host::AccessLog) {
        let mut monitor = Monitor::open(&options(node)).unwrap();
        let log = crate::read::host::AccessLog::default();
        monitor.observer.host = Host::new(node.sys(), node.proc()).with_access_log(log.clone());
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
        assert_eq!(monitor.observer.statics.frozen_count(), vfs.len());

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
        // No walk: the device listing (through its kept directory), and nothing else looked
        // up — not the `device` link, not the netdev listing (the full poll's stand).
        let netdev = full.snapshot.devices.iter().find(|d| d.name == "mlx5_0").and_then(|d| d.netdev.clone());
        let netdev_files = netdev.map(|n| format!("class/net/{n}/"));
        let port_or_netdev = |r: &String| {
            r.starts_with("class/infiniband/mlx5_0/ports/") || netdev_files.as_ref().is_some_and(|n| r.starts_with(n))
        };
        let walked: Vec<&String> = read.iter().filter(|r| !port_or_netdev(r)).collect();
        assert_eq!(walked, vec!["class/infiniband"], "{read:?}");
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
        assert!(discovery::devices_probed(&monitor.observer.host, &base.snapshot, "nosuchdev").is_empty());

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
        use crate::act::courier::{Courier, Journal};
        use crate::act::state::State;
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
        crate::act::state::file::save(&state_file, &state).unwrap();

        // The port goes down; the poll's commit journals and sends; the sink accepts.
        node.pull_cable(&dev, 1);
        let down = monitor.poll(&state.checks, &Loaded::Resumed, t0 + Duration::seconds(1), &[]);
        let fatal: Vec<_> = down.events.iter().filter(|e| !e.is_healthy && e.entities_text().contains(&dev)).collect();
        assert!(!fatal.is_empty(), "the pull is detected: {:?}", down.events);
        let sink = crate::act::dispatch::Sink::lazy(
            &crate::act::dispatch::SinkSpec::File(sink_file.clone()),
            crate::act::dispatch::GrpcConfig::new(crate::act::dispatch::DEFAULT_SOCKET.parse().unwrap()),
        );
        let metrics = std::sync::Arc::new(crate::act::metrics::Metrics::new("n"));
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
        let (mut loaded_state, how) = crate::act::state::file::load(&state_file, None);
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
        let (bare, _) = crate::act::state::file::load(&state_file, None);
        let unaware = monitor.poll(&bare.checks, &Loaded::Resumed, t0 + Duration::seconds(2), &[]);
        assert!(unaware.events.iter().all(|e| !e.entities_text().contains(&dev)), "{:?}", unaware.events);

        // A save empties the journal: a later restart recovers nothing.
        let mut j = Journal::new(&state_file);
        crate::act::state::file::save(&state_file, &running).unwrap();
        j.saved();
        let (mut again, _) = crate::act::state::file::load(&state_file, None);
        assert!(j.recover(&mut again, true).is_empty());
    }
}
