//! One observation of the node ([`Observation`]): **the** read of a poll, full or targeted.
//! What to read comes from the caller: the devices known earlier, the EINVAL memo, and
//! which devices are not monitored (decide's role classification, as a function) — so this
//! room reads and never decides.
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::model::Snapshot;
use crate::model::kmsg::{Departed, HostLinks};
use crate::model::observation::Observation;
use crate::read::devlink::{DevlinkReader, DevlinkSource};
use crate::read::discovery::{self, ReadPlan, RoceReads, StaticCache, Unmonitored};
use crate::read::ethtool::EthtoolSource;
use crate::read::ethtool::modules::ModuleReader;
use crate::read::ethtool::ports::PortReader;
use crate::read::host::Host;
use crate::read::hwmon::HwmonReader;

/// What the reads keep between polls: the host, what to read beyond the fixed files, the
/// static attributes of each device incarnation, and the ethtool source.
pub struct Observer {
    pub host: Host,
    pub counter_paths: Arc<[Arc<str>]>,
    /// Per path of `counter_paths`, the drivers whose devices read it.
    pub counter_drivers: Arc<[crate::model::driver::Drivers]>,
    /// What the RoCE ports read besides, while `[phyCheck]` is enabled.
    pub roce_reads: RoceReads,
    /// Static device attributes kept between polls ([`discovery::StaticCache`]).
    pub statics: Arc<StaticCache>,
    /// Where the RoCE ports' ethtool data comes from (`None`: not read), and its reader.
    pub ethtool: Option<EthtoolSource>,
    pub ethtool_ports: PortReader,
    /// Where the ports' transceiver pages come from (`None`: `[opticsCheck]` off, or no
    /// source), and their reader (SPEC §1.13).
    pub modules: Option<EthtoolSource>,
    pub module_reader: ModuleReader,
    /// The NICs' hwmon sensors (`None`: `[thermalCheck]` off).
    pub hwmon: Option<HwmonReader>,
    /// Where the NICs' devlink health reporters come from (`None`: not read), and its reader.
    pub devlink: Option<DevlinkSource>,
    pub devlink_reader: DevlinkReader,
}

/// What a read takes from the previous poll.
pub struct Prior<'a> {
    /// Devices known earlier in this boot, by name and PCI address: their PCI function is
    /// probed when one is missing from the listing.
    pub known: Vec<(&'a str, &'a str)>,
    /// The devices known earlier in this boot that a snapshot lacks (their last kernel-log
    /// lines explain why): asked only when the kernel log's links are read.
    pub departed: &'a dyn Fn(&Snapshot) -> Vec<Departed>,
    /// The files whose read failed with `EINVAL` in this boot: never read again.
    pub einval: &'a BTreeSet<String>,
    /// The character-device listing may stand (no character device is missing).
    pub char_listing_may_stand: bool,
}

impl Observer {
    /// Read the host once. `links`: also read what attributing kernel log lines needs.
    pub fn observe(&self, prior: Prior<'_>, unmonitored: Unmonitored<'_>, links: bool) -> Observation {
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            counter_drivers: self.counter_drivers.clone(),
            known: prior.known,
            statics: Some(self.statics.clone()),
            roce: self.roce_reads.clone(),
            unmonitored: Some(unmonitored),
            char_listing_may_stand: prior.char_listing_may_stand,
            link_only: false,
        };
        self.host.begin_poll();
        // The memo goes into the reader for this read and comes back out with it.
        self.host.remember_einval(prior.einval.iter().cloned());
        let mut snapshot = discovery::discover(&self.host, &plan);
        let mut ethtool_notes = self.read_ethtool(&mut snapshot, unmonitored);
        ethtool_notes.extend(self.read_modules(&mut snapshot, unmonitored));
        let pcis = pf_addresses(&snapshot);
        if let Some(hwmon) = &self.hwmon {
            hwmon.read(&self.host, &mut snapshot, pcis.clone(), std::time::Instant::now());
        }
        ethtool_notes.extend(self.read_devlink(&mut snapshot, &pcis));
        let links = links.then(|| {
            // Devices that went since an earlier poll: their last lines explain why.
            HostLinks::read(&self.host, &snapshot, (prior.departed)(&snapshot))
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
            kernel_removed: BTreeSet::new(),
            ethtool_notes,
        }
    }

    /// The RoCE ports' ethtool data into `snapshot` (of the monitored devices), under the
    /// host's read deadlines.
    fn read_ethtool(&self, snapshot: &mut Snapshot, unmonitored: Unmonitored<'_>) -> Vec<String> {
        let Some(source) = &self.ethtool else {
            return Vec::new();
        };
        // The PFs' roles (a VF is not read, nor classified).
        let route = &snapshot.default_route_devices;
        let monitored: BTreeSet<String> =
            snapshot.devices.iter().filter(|d| !d.is_vf() && !unmonitored(d, route)).map(|d| d.name.clone()).collect();
        let wanted = |name: &str| monitored.contains(name);
        self.ethtool_ports.read(source, snapshot, wanted, || self.host.timeout(), std::time::Instant::now())
    }

    /// The monitored PFs' transceiver pages into `snapshot` at their pace
    /// ([`crate::read::ethtool::modules`]), under the host's read deadlines; the notes.
    fn read_modules(&self, snapshot: &mut Snapshot, unmonitored: Unmonitored<'_>) -> Vec<String> {
        let Some(source) = &self.modules else {
            return Vec::new();
        };
        let route = &snapshot.default_route_devices;
        let monitored: BTreeSet<String> =
            snapshot.devices.iter().filter(|d| !d.is_vf() && !unmonitored(d, route)).map(|d| d.name.clone()).collect();
        let wanted = |name: &str| monitored.contains(name);
        self.module_reader.read(source, snapshot, wanted, || self.host.timeout(), std::time::Instant::now())
    }

    /// The monitored PCI functions' devlink health reporters into `snapshot`, under the
    /// host's read deadline; the notes.
    pub fn read_devlink(&self, snapshot: &mut Snapshot, pcis: &BTreeSet<String>) -> Vec<String> {
        match &self.devlink {
            Some(source) => {
                let pci_of = |instance: &str| crate::read::devlink::pci_of(&self.host, instance);
                self.devlink_reader.read_paced(source, snapshot, pcis, self.host.timeout(), &pci_of)
            }
            None => Vec::new(),
        }
    }

    /// A devlink wake-up's read (SPEC §1.13): the devlink health reporters of `devices` (by
    /// name, in `snapshot`) read again now into `snapshot`, the other functions' kept; the
    /// notes.
    pub fn reread_devlink(&self, snapshot: &mut Snapshot, devices: &[String]) -> Vec<String> {
        let pcis: BTreeSet<String> = snapshot
            .devices
            .iter()
            .filter(|d| !d.is_vf() && devices.contains(&d.name))
            .filter_map(|d| d.pci_address.clone())
            .collect();
        if self.devlink.is_none() || pcis.is_empty() {
            return Vec::new();
        }
        let Some(source) = &self.devlink else { return Vec::new() };
        let mut fresh = Snapshot::default();
        let pci_of = |instance: &str| crate::read::devlink::pci_of(&self.host, instance);
        let notes = self.devlink_reader.read(source, &mut fresh, &pcis, self.host.timeout(), &pci_of);
        self.devlink_reader.keep_fresh(&pcis, &fresh.devlink);
        snapshot.devlink.retain(|a, _| !pcis.contains(a));
        snapshot.devlink.extend(fresh.devlink);
        notes
    }

    /// The targeted read of a hinted wake-up (SPEC §1.8): `devices` read again now, by the
    /// same code as [`Observer::observe`], on top of `base`, the previous full poll's
    /// snapshot — their link-state files only: the counter, RoCE, ethtool and PCIe data
    /// are judged by the full poll's checks, over the interval, and the devices keep
    /// `base`'s readings of them ([`ReadPlan::link_only`]). `None` when the device set
    /// changed since `base` (only a full poll may decide about devices that came or went).
    pub fn observe_targeted(
        &self,
        einval: &BTreeSet<String>,
        unmonitored: Unmonitored<'_>,
        base: &Snapshot,
        devices: &[String],
    ) -> Option<Observation> {
        let plan = ReadPlan {
            counter_paths: self.counter_paths.clone(),
            counter_drivers: self.counter_drivers.clone(),
            known: Vec::new(),
            statics: Some(self.statics.clone()),
            roce: self.roce_reads.clone(),
            unmonitored: Some(unmonitored),
            char_listing_may_stand: false,
            link_only: true,
        };
        self.host.begin_poll();
        self.host.remember_einval(einval.iter().cloned());
        // The files the last targeted read of these devices read are read again while
        // the devices are listed and their reads planned (the same files: used).
        self.host.read_ahead(devices);
        let snapshot = discovery::rediscover(&self.host, &plan, base, devices);
        self.host.end_read_ahead();
        let einval = self.host.take_einval();
        let mut snapshot = snapshot?;
        // The devlink readings as fresh as a devlink wake-up since the base left them.
        self.devlink_reader.kept_into(&mut snapshot);
        // A port whose state changed has its module read now: the event knows why.
        let ethtool_notes = match &self.modules {
            Some(source) => {
                let now = std::time::Instant::now();
                self.module_reader.read_changed(source, &mut snapshot, devices, || self.host.timeout(), now)
            }
            None => Vec::new(),
        };
        let reads_abandoned = self.host.stats.reads_abandoned.load(std::sync::atomic::Ordering::Relaxed);
        let stuck_reads = self.host.stuck_reads();
        Some(Observation {
            snapshot,
            links: None,
            einval,
            reads_abandoned,
            stuck_reads,
            targeted: Some(devices.to_vec()),
            ethtool_notes,
            woken_by: Vec::new(),
            kernel_removed: BTreeSet::new(),
        })
    }
}

/// The PCI addresses of the PFs of `snapshot`: whose sensors and devlink reporters are read.
/// Every PF, not only the monitored ones: `nicmon check` reads before its topology (and so
/// the roles) is resolved, and a bundle's replay must read what the live run read; the
/// checks and the metrics judge the monitored ones only.
pub fn pf_addresses(snapshot: &Snapshot) -> BTreeSet<String> {
    snapshot.devices.iter().filter(|d| !d.is_vf()).filter_map(|d| d.pci_address.clone()).collect()
}
