//! Discovery: turn the host into a [`Snapshot`] (SPEC §1.1, 000 §5, §8, §9).
//!
//! Reads only; decides nothing except what a value *is* (parsing). A bad file never
//! aborts a poll: it makes that one value unknown.
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use regex::Regex;

use crate::model::pcie::parse::AerSeverity;
use crate::model::pcie::reading::Aer;
use crate::model::pcie::reading::PcieLink;
use crate::model::pcie::reading::PcieReading;
use crate::model::pcie::reading::UpstreamPort;
use crate::model::pcie::reading::aer_file;
use crate::model::{Device, Function, LinkLayer, PciGpu, PciPresence, PhysState, Port, PortState, Snapshot};
use crate::read::host::{FileSet, Host, Listing, PendingReads, ReadError, Rels, SysDir, Texts};
use crate::read::parse;
use std::sync::atomic::Ordering;

mod chars;
mod driver;
mod kept_plan;
mod pci;
mod plan;
mod statics;
mod unmonitored;
mod walk;
pub use chars::char_devices;
use pci::ib_devices_of_iface;
pub use pci::{PciNode, pci_gpus, pci_node, pci_path, probe_pci, upstream_port};
pub use plan::counter_file;
use plan::*;
use statics::*;
pub use statics::{STATIC_REFRESH, StaticCache};
use unmonitored::Frozen;
pub use unmonitored::Unmonitored;

/// What to read beyond the fixed set of files.
#[derive(Clone, Default)]
pub struct ReadPlan<'a> {
    /// Counter paths as configured: relative to the port directory (`counters/link_downed`)
    /// or a netdev template (`/sys/class/net/{interface}/carrier_changes`).
    /// Shared with every port's counter values ([`Port::counters`]' keys).
    pub counter_paths: Arc<[Arc<str>]>,
    /// Per path of `counter_paths` (same index), the RDMA drivers whose devices read it (a
    /// `hw_counters/` file means what its driver says); a path without an entry: every
    /// device.
    pub counter_drivers: Arc<[crate::model::driver::Drivers]>,
    /// Devices (name, PCI address) known from earlier polls: when one is missing from
    /// `class/infiniband`, its PCI function is probed (002 §5.9).
    pub known: Vec<(&'a str, &'a str)>,
    /// Where the static attributes of each device incarnation are kept between reads;
    /// `None`: read everything every time.
    pub statics: Option<Arc<StaticCache>>,
    /// What RoCE ports read besides (SPEC §1.11); nothing by default.
    pub roce: RoceReads,
    /// Which devices are not monitored (the role classification): with a static cache,
    /// such a device is read once per incarnation and then only looked for in the listing
    /// ([`unmonitored`]). `None`: every device is read every time.
    pub unmonitored: Option<Unmonitored<'a>>,
    /// With a static cache: the character-device class directories need not be listed
    /// again while the last listing stands ([`chars`]), because no entry that comes or goes
    /// unseen then matters (the check has none missing). `false`: listed on every read.
    pub char_listing_may_stand: bool,
    /// A targeted read ([`rediscover`]): only the files the state checks judge a port by
    /// (its state, link layer, rate, LIDs, netdev carrier and operstate). The counter, RoCE
    /// and PCIe files are left to the full poll, whose checks judge them over the interval;
    /// each device read keeps the base snapshot's counter, netdev speed and PCIe readings.
    pub link_only: bool,
}

impl std::fmt::Debug for ReadPlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPlan")
            .field("counter_paths", &self.counter_paths)
            .field("counter_drivers", &self.counter_drivers)
            .field("known", &self.known)
            .field("statics", &self.statics)
            .field("roce", &self.roce)
            .field("unmonitored", &self.unmonitored.is_some())
            .field("char_listing_may_stand", &self.char_listing_may_stand)
            .field("link_only", &self.link_only)
            .finish()
    }
}

/// The files read on RoCE (Ethernet link layer) ports of monitored PFs only, while
/// `[phyCheck]` is enabled. A port's link layer is known before its files are planned from
/// its device's static attributes; a port whose link layer was not known then has them
/// read too, and kept only if the poll reads it Ethernet.
#[derive(Debug, Clone, Default)]
pub struct RoceReads {
    /// Paths relative to the port directory (the ECN/CNP `hw_counters/`), kept in the
    /// port's `counters` under the path (shared, like [`ReadPlan::counter_paths`]).
    pub counter_paths: Arc<[Arc<str>]>,
    /// The netdev's `speed` ([`Port::netdev_speed`]).
    pub speed: bool,
}

/// Where the RDMA devices are listed.
const DEVICES: &str = "class/infiniband";

const MELLANOX_VENDOR: u32 = 0x15b3;
const NVIDIA_VENDOR: u32 = 0x10de;
/// AMD (Instinct accelerators: a GPU node's GPUs when they are not NVIDIA's).
const AMD_VENDOR: u32 = 0x1002;

/// Read every RDMA device, its ports and counters, the default route and the PCI probes.
pub fn discover(host: &Host, plan: &ReadPlan) -> Snapshot {
    // The reader starts on the last full poll's files while this thread lists the devices
    // and plans this poll's files; used only if those are the same files.
    let last = plan.statics.as_ref().and_then(|c| c.last_batch());
    let mut prefetch = last
        .as_ref()
        .map(|files| Prefetch { generation: host.kept_generation(), reads: host.start_files(files).patient() });
    // Whether this poll walks its paths ([`walk`]); always without a static cache.
    let mut walk = plan.statics.as_ref().is_none_or(|c| c.walk_due(host));
    let names: Arc<[String]> = match &plan.statics {
        Some(cache) => {
            let (names, changed) = cache.relist(host, walk);
            if changed {
                // A device came or went: every kept-open file is opened again.
                host.forget_kept(None);
                walk = true;
            }
            names
        }
        None => host.list_sys(DEVICES).into(),
    };
    // Attributes that change are kept open between polls where the reads are kept across
    // polls (a plan with a static cache: the monitor's polls).
    let keep = plan.statics.is_some();
    // The default route first: whether a device is a management NIC (not monitored, not
    // read) depends on it.
    let (default_route_ifaces, default_route_devices) = match &plan.statics {
        Some(cache) => cache.route(host, walk),
        None => default_route(host),
    };
    let DevicePlan { reads, mut batch, made, finished } =
        plan_devices(host, plan, (&names, walk), &default_route_devices, last);
    let chars = chars::plan(host, plan.statics.as_deref(), !plan.char_listing_may_stand, walk, &mut batch);
    let same = batch.is_prev(keep);
    if !same {
        // Other files than the last poll's: the last batch (and what was read ahead of it)
        // goes before this one is made (a device of a thousand ports: one set of tens of
        // thousands of paths at a time).
        drop_prefetch(host, prefetch.take());
        if let Some(cache) = &plan.statics {
            cache.clear_last_batch();
        }
    }
    let files = batch.finish(host, keep);
    let results = read_batch(host, &files, prefetch);
    if keep && !same {
        // Those no longer read are not kept open.
        host.keep_only(&files);
    }
    if let Some(cache) = &plan.statics {
        cache.set_last_batch(files.clone());
        if let Some(made) = made {
            cache.keep_plan(made, &files);
        }
    }
    let devices = finish_devices(&reads, &results, (&files, finished.as_deref()), plan, &default_route_devices);
    let char_devices = chars::finish(chars, &results, plan.statics.as_deref());
    if let Some(cache) = &plan.statics {
        cache.keep_finished(&files, &devices, results);
    }

    let mut pci_probes = BTreeMap::new();
    for &(name, pci) in &plan.known {
        if !names.iter().any(|n| n == name) {
            pci_probes.insert(name.to_string(), probe_pci(host, pci));
        }
    }

    Snapshot { devices, default_route_ifaces, default_route_devices, pci_probes, char_devices, ..Snapshot::default() }
}

/// A full poll's plan of its devices ([`plan_devices`]).
struct DevicePlan {
    /// Shared with the kept plan.
    reads: Arc<[Planned]>,
    batch: Batch,
    /// A plan made now, to be kept once its batch is made.
    made: Option<kept_plan::KeptPlan>,
    /// The kept plan's last finished devices, when it is the kept plan.
    finished: Option<Arc<kept_plan::Finished>>,
}

/// The plan of the devices `names` (`walk`: whether this poll walks) into a batch made
/// against `last` (the last batch): the kept plan when it stands ([`kept_plan`]), else made
/// now.
fn plan_devices(
    host: &Host,
    plan: &ReadPlan,
    (names, walk): (&[String], bool),
    route: &[String],
    last: Option<Arc<FileSet>>,
) -> DevicePlan {
    let judged = plan.statics.as_ref().zip(plan.unmonitored);
    if let Some((cache, judge)) = judged {
        cache.thaw_monitored(judge, route);
    }
    let cache = plan.statics.as_ref().filter(|_| !plan.link_only);
    if let Some(kept) = cache.and_then(|c| c.kept_plan(walk, route)) {
        host.stats.plans_kept.fetch_add(1, Ordering::Relaxed);
        let batch = kept.batch();
        return DevicePlan { reads: kept.reads, batch, made: None, finished: kept.finished };
    }
    // The frozen readings are copied only for a plan made anew (a kept one holds them).
    let frozen = judged.map(|(cache, _)| cache.frozen()).unwrap_or_default();
    let mut batch = Batch::against(last);
    let reads: Arc<[Planned]> = names
        .iter()
        .enumerate()
        .map(|(i, n)| match frozen.get(i).cloned().flatten() {
            Some(d) => Planned::Frozen(d),
            None => Planned::Read(read_device(host, n, plan, walk, &mut batch)),
        })
        .collect();
    let made = cache
        .filter(|_| kept_plan::KeptPlan::keepable(&reads))
        .map(|c| kept_plan::KeptPlan::new(&reads, &batch, route, c.frozen_generation()));
    DevicePlan { reads, batch, made, finished: None }
}

/// The interfaces that carry a default route (`<procfs>/net/route`) and the IB devices
/// behind them.
fn default_route(host: &Host) -> (Vec<String>, Vec<String>) {
    let ifaces = host.read_proc("net/route").map(|raw| parse::default_route_ifaces(&raw)).unwrap_or_default();
    let mut devices = Vec::new();
    for iface in &ifaces {
        for dev in ib_devices_of_iface(host, iface) {
            if !devices.contains(&dev) {
                devices.push(dev);
            }
        }
    }
    (ifaces, devices)
}

/// The devices of a poll from their reads: a frozen reading as it is, a device read now
/// finished from the results (and frozen when it may be, see [`unmonitored`]) — or, by a
/// kept plan whose last poll's devices are `finished`, that poll's reading of a device whose
/// files all read the same.
fn finish_devices(
    reads: &[Planned],
    results: &Texts,
    (files, finished): (&FileSet, Option<&kept_plan::Finished>),
    plan: &ReadPlan,
    route: &[String],
) -> Vec<Arc<Device>> {
    reads
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            Planned::Frozen(d) => d.clone(),
            Planned::Read(r) => {
                if let Some(d) = finished.and_then(|f| f.reuse(i, r, results)) {
                    return d;
                }
                let d = Arc::new(finish_device(r, results, files, plan));
                if let (Some(cache), Some(judge)) = (&plan.statics, plan.unmonitored)
                    && unmonitored::freezable(&d, judge, route)
                {
                    cache.freeze(d.clone());
                }
                d
            }
        })
        .collect()
}

/// The targeted read of a hinted wake-up (SPEC §1.8): `base` (the previous full poll's
/// snapshot) with only the devices in `names` read again, by the same code as a full poll
/// (with `plan.link_only`: their link-state files only). `None` when the device set is not
/// `base`'s any more (a full poll must see that).
pub fn rediscover(host: &Host, plan: &ReadPlan, base: &Snapshot, names: &[String]) -> Option<Snapshot> {
    let same =
        |listed: &[String]| listed.len() == base.devices.len() && base.devices.iter().all(|d| listed.contains(&d.name));
    // With a static cache the devices are listed through the directory kept open for it
    // (no path walk), and their kept attributes and netdevs stand (no incarnation check, no
    // netdev listing): a device replaced since the full poll fails its kept files' reads,
    // which reopens them by path and makes the next full poll walk (`read::host::walks`).
    let unchanged = match &plan.statics {
        Some(cache) => cache.listed_now(host, same),
        None => same(&host.list_sys(DEVICES)),
    };
    if !unchanged {
        return None;
    }
    let mut s = base.clone();
    let named: Vec<String> = s.devices.iter().filter(|d| names.contains(&d.name)).map(|d| d.name.clone()).collect();
    let mut batch = Batch::default();
    let route = &base.default_route_devices;
    let walk = plan.statics.is_none();
    let reads: Vec<Planned> = named.iter().map(|n| plan_device(host, n, plan, (route, walk), &mut batch)).collect();
    let files = batch.finish(host, plan.statics.is_some());
    let results = host.read_files(&files);
    let mut read = finish_devices(&reads, &results, (&files, None), plan, route).into_iter();
    for d in s.devices.iter_mut().filter(|d| names.contains(&d.name)) {
        if let Some(mut new) = read.next() {
            if plan.link_only {
                keep_base_readings(Arc::make_mut(&mut new), d);
            }
            *d = new;
        }
    }
    Some(s)
}

/// What a link-only read ([`ReadPlan::link_only`]) of `new` did not read, as `base` has
/// it: the PCIe reading, and each port's counters, netdev speed, ethtool data and module.
fn keep_base_readings(new: &mut Device, base: &Device) {
    new.pcie = base.pcie.clone();
    for p in &mut new.ports {
        if let Some(old) = base.ports.iter().find(|o| o.number == p.number) {
            p.counters = old.counters.clone();
            p.netdev_speed = old.netdev_speed;
            p.ethtool = old.ethtool.clone();
            p.ethtool_age = old.ethtool_age;
            p.module = old.module.clone();
        }
    }
}

/// The devices of `snapshot` a wake-up hint names directly: a device by its name, its
/// netdev or its PCI address (of the function, or the card's `dddd:bb:dd`). No host read.
pub fn devices_in(snapshot: &Snapshot, hint: &str) -> Vec<String> {
    snapshot
        .devices
        .iter()
        .filter(|d| {
            d.name == hint
                || d.netdev.as_deref() == Some(hint)
                || d.pci_address.as_deref() == Some(hint)
                || d.card.as_deref() == Some(hint)
        })
        .map(|d| d.name.clone())
        .collect()
}

/// The devices of `snapshot` behind the netdev `hint` as sysfs shows it now: its
/// `device/infiniband` (a second port's netdev), or a bond's lower links'. Empty for a
/// name that cannot be a netdev's.
pub fn devices_probed(host: &Host, snapshot: &Snapshot, hint: &str) -> Vec<String> {
    if hint.is_empty() || hint.contains('/') || hint.starts_with('.') {
        return Vec::new();
    }
    ib_devices_of_iface(host, hint).into_iter().filter(|n| snapshot.devices.iter().any(|d| &d.name == n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CharKind, ClassDir};
    use nicmon_tests::platforms::Platform;

    fn fw_of(s: &Snapshot, dev: &str) -> Option<String> {
        s.devices.iter().find(|d| d.name == dev).and_then(|d| d.fw_ver.clone())
    }

    fn counter_of(s: &Snapshot, dev: &str, path: &str) -> Option<u64> {
        s.devices.iter().find(|d| d.name == dev).and_then(|d| d.ports[0].counters.get(path).copied())
    }

    #[test]
    fn absent_counters_are_remembered_per_device_incarnation() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let path = "hw_counters/not_on_this_card";
        let plan =
            ReadPlan { statics: Some(cache.clone()), counter_paths: vec![path.into()].into(), ..ReadPlan::default() };
        let first = discover(&host, &plan);
        assert_eq!(counter_of(&first, "mlx5_0", path), None);
        let file = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1").join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "7\n").unwrap();
        // Same incarnation: the absent file is not tried again.
        assert_eq!(counter_of(&discover(&host, &plan), "mlx5_0", path), None);
        // A wake-up naming the device (or a new incarnation, or the 60 s refresh): tried again.
        cache.invalidate("mlx5_0");
        assert_eq!(counter_of(&discover(&host, &plan), "mlx5_0", path), Some(7));
        // Without a cache every poll tries every file.
        std::fs::remove_file(&file).unwrap();
        let plain = ReadPlan { counter_paths: vec![path.into()].into(), ..ReadPlan::default() };
        assert_eq!(counter_of(&discover(&host, &plain), "mlx5_0", path), None);
        std::fs::write(&file, "8\n").unwrap();
        assert_eq!(counter_of(&discover(&host, &plain), "mlx5_0", path), Some(8));
    }

    #[test]
    fn roce_ports_read_congestion_counters_and_the_speed_where_the_rate_is_missing() {
        // H100 OCI: InfiniBand mlx5_0, RoCE mlx5_2 (100G); every port lists the ECN/CNP files.
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let cnp = "hw_counters/np_cnp_sent";
        let roce = RoceReads { counter_paths: vec![cnp.into()].into(), speed: true };
        let plan = ReadPlan { statics: Some(cache.clone()), roce, ..ReadPlan::default() };
        let port = |s: &Snapshot, dev: &str| s.devices.iter().find(|d| d.name == dev).unwrap().ports[0].clone();
        let first = discover(&host, &plan);
        // The congestion counter on the RoCE port only; the speed read on the first poll.
        assert_eq!((counter_of(&first, "mlx5_2", cnp), counter_of(&first, "mlx5_0", cnp)), (Some(0), None));
        assert_eq!((port(&first, "mlx5_2").netdev_speed, port(&first, "mlx5_0").netdev_speed), (Some(100_000), None));
        // The rate gave a rate: the speed is not read again.
        assert_eq!(port(&discover(&host, &plan), "mlx5_2").netdev_speed, None);
        // The rate goes: the next poll notes it, the one after reads the speed, which
        // gives the port its rate.
        node.remove_port_file("mlx5_2", 1, "rate");
        assert_eq!(port(&discover(&host, &plan), "mlx5_2").netdev_speed, None);
        let p = port(&discover(&host, &plan), "mlx5_2");
        assert_eq!((p.rate.clone(), p.netdev_speed, p.rate_bps()), (None, Some(100_000), Some(100e9)));
        // No link (-1): unknown, no rate at all.
        node.set_speed(node.info["mlx5_2"].netdev.as_deref().unwrap(), "-1");
        let p = port(&discover(&host, &plan), "mlx5_2");
        assert_eq!((p.netdev_speed, p.rate_bps()), (None, None));
        // Nothing of it without the RoCE reads (`[phyCheck] enabled = false`).
        let off = ReadPlan { statics: Some(Arc::new(StaticCache::default())), ..ReadPlan::default() };
        let s = discover(&host, &off);
        assert_eq!((counter_of(&s, "mlx5_2", cnp), port(&s, "mlx5_2").netdev_speed), (None, None));
    }

    /// Between walks, while the class directories' listings stand (watched here: a fixture
    /// tree; on sysfs, while the kernel's uevents are heard), no character-device entry is
    /// read; one that goes is a sign, and the next poll walks and sees it gone.
    #[test]
    fn character_device_entries_are_not_read_between_walks_while_their_listings_stand() {
        use crate::read::host::Access;
        let node = Platform::H100Oci.build();
        let log = crate::read::host::AccessLog::default();
        let host = Host::new(node.sys(), node.proc()).with_access_log(log.clone());
        let plan = ReadPlan {
            statics: Some(Arc::new(StaticCache::default())),
            char_listing_may_stand: true,
            ..ReadPlan::default()
        };
        let entries = |log: &crate::read::host::AccessLog| {
            let read = std::mem::take(&mut *log.lock().unwrap());
            read.into_iter().filter(|a| matches!(a, Access::Read { rel, .. } if rel.ends_with("/ibdev"))).count()
        };
        let first = discover(&host, &plan);
        assert!(entries(&log) > 0, "the first poll walks and reads every entry");
        // The second poll's reader still starts on the first poll's batch (read ahead, then
        // dropped: the batch is another one now); from the third on, nothing.
        discover(&host, &plan);
        entries(&log);
        let second = discover(&host, &plan);
        assert_eq!(entries(&log), 0, "between walks nothing is read");
        assert_eq!(second.char_devices, first.char_devices);
        let ClassDir::Listed(verbs) = &first.char_devices.verbs else { panic!("listed") };
        let gone = verbs.iter().find(|n| n.device.is_some()).expect("a uverbs entry with its device").clone();
        node.remove_char_node("uverbs", gone.device.as_deref().unwrap(), None);
        let third = discover(&host, &plan);
        let ClassDir::Listed(verbs) = &third.char_devices.verbs else { panic!("listed") };
        assert!(!verbs.iter().any(|n| n.name == gone.name), "{} is seen gone at once", gone.name);
    }

    #[test]
    fn static_attributes_are_read_once_per_device_incarnation() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan = ReadPlan { statics: Some(cache.clone()), ..ReadPlan::default() };
        let first = discover(&host, &plan);
        let n = first.devices.len() as u64;
        assert!(n >= 2);
        assert_eq!(cache.reads(), n, "one read of the static attributes per device");
        let fw_file = node.sys().join(&node.info["mlx5_0"].ib_dir).join("fw_ver");
        let old = fw_of(&first, "mlx5_0").expect("fw_ver");

        // Same incarnation: not read again (a changed file is not even looked at).
        std::fs::write(&fw_file, "99.99.9999\n").unwrap();
        let again = discover(&host, &plan);
        assert_eq!(cache.reads(), n);
        assert_eq!(fw_of(&again, "mlx5_0"), Some(old.clone()));
        assert_eq!(again.devices, first.devices, "the same snapshot from the cache");

        // Removed, then re-added with new firmware: a new incarnation, read again.
        node.remove_device("mlx5_0");
        let gone = discover(&host, &plan);
        assert!(gone.devices.iter().all(|d| d.name != "mlx5_0"));
        node.restore_device("mlx5_0");
        std::fs::write(&fw_file, "28.40.1000\n").unwrap();
        let back = discover(&host, &plan);
        assert_eq!(fw_of(&back, "mlx5_0").as_deref(), Some("28.40.1000"));
        assert!(cache.reads() > n, "read again after the device set changed");

        // A wake-up naming the device: read again.
        std::fs::write(&fw_file, "28.41.1000\n").unwrap();
        let before = cache.reads();
        cache.invalidate("mlx5_0");
        let woken = discover(&host, &plan);
        assert_eq!(fw_of(&woken, "mlx5_0").as_deref(), Some("28.41.1000"));
        assert_eq!(cache.reads(), before + 1, "only the named device");

        // Without a cache every read is fresh.
        std::fs::write(&fw_file, "28.42.1000\n").unwrap();
        assert_eq!(fw_of(&discover(&host, &ReadPlan::default()), "mlx5_0").as_deref(), Some("28.42.1000"));
    }

    #[test]
    fn files_read_ahead_are_used_only_when_they_are_the_polls_files() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let path = "counters/port_rcv_errors";
        let plan =
            ReadPlan { statics: Some(cache.clone()), counter_paths: vec![path.into()].into(), ..ReadPlan::default() };
        let plain = ReadPlan { counter_paths: vec![path.into()].into(), ..ReadPlan::default() };
        let stat = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        // Every poll sees what a poll with nothing cached and nothing read ahead sees.
        let same = |why: &str| {
            let s = discover(&host, &plan);
            let uncached = discover(&host, &plain);
            assert_eq!(s.devices, uncached.devices, "{why}");
            assert_eq!(s.char_devices, uncached.char_devices, "{why}: character devices");
            s
        };
        same("first poll");
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (0, 0));
        node.set_port("mlx5_0", 1, "1: DOWN", "3: Disabled");
        node.set_counter("mlx5_0", 1, path, 5);
        let s = same("a port went down, a counter moved");
        assert_eq!(counter_of(&s, "mlx5_0", path), Some(5));
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (1, 0));
        // A device went: the files read ahead are not this poll's (dropped, read again).
        node.remove_device("mlx5_1");
        let s = same("a device went");
        assert!(s.devices.iter().all(|d| d.name != "mlx5_1"));
        assert_eq!(stat(&host.stats.read_ahead_dropped), 1);
        node.restore_device("mlx5_1");
        node.set_counter("mlx5_1", 1, path, 9);
        let s = same("the device came back");
        assert_eq!(counter_of(&s, "mlx5_1", path), Some(9));
        assert_eq!(stat(&host.stats.read_ahead_dropped), 2);
        // Steady again: used.
        node.set_counter("mlx5_1", 1, path, 10);
        let s = same("steady");
        assert_eq!(counter_of(&s, "mlx5_1", path), Some(10));
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (2, 2));
        // The character devices' files are part of the batch read ahead: one gone, then back.
        let files = cache.last_batch().expect("a batch");
        assert!(files.rels().iter().any(|r| r.starts_with("class/infiniband_mad/")), "{:?}", files.rels());
        node.remove_char_node("umad", "mlx5_0", Some(1));
        let s = same("a umad node went");
        assert_eq!(stat(&host.stats.read_ahead_dropped), 3);
        let ClassDir::Listed(mad) = &s.char_devices.mad else { panic!("{:?}", s.char_devices.mad) };
        assert!(!mad.iter().any(|n| n.kind == CharKind::Umad && n.device.as_deref() == Some("mlx5_0")));
        node.restore_char_node("umad", "mlx5_0", Some(1));
        same("the umad node came back");
        assert_eq!(stat(&host.stats.read_ahead_dropped), 4);
        // Steady: the same files are the same set, read ahead and used.
        let before = cache.last_batch().expect("a batch");
        same("steady again");
        assert!(Arc::ptr_eq(&before, &cache.last_batch().expect("a batch")), "the batch is made again");
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (3, 4));
    }

    #[test]
    fn a_device_directory_replaced_under_the_same_name_is_a_new_incarnation() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan = ReadPlan { statics: Some(cache.clone()), ..ReadPlan::default() };
        let first = discover(&host, &plan);
        let reads = cache.reads();
        // A device with a netdev (its listing is looked up in the kept directory too).
        let dev = first.devices.iter().find(|d| d.netdev.is_some()).expect("a device with a netdev").name.clone();
        let dir = node.sys().join(&node.info[&dev].ib_dir);
        // Same incarnation: the kept directory answers, nothing is read again.
        discover(&host, &plan);
        assert_eq!(cache.reads(), reads);
        // The device unregistered and registered again between two polls (same name, same
        // PCI function, the listing never saw it gone): its directory is a new one.
        let copy = node.root().join("device-copy");
        assert!(std::process::Command::new("cp").arg("-a").arg(&dir).arg(&copy).status().unwrap().success());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::rename(&copy, &dir).unwrap();
        std::fs::write(dir.join("fw_ver"), "28.50.1000\n").unwrap();
        let back = discover(&host, &plan);
        assert_eq!(fw_of(&back, &dev).as_deref(), Some("28.50.1000"));
        assert_ne!(fw_of(&first, &dev).as_deref(), Some("28.50.1000"));
        assert_eq!(cache.reads(), reads + 1, "only the replaced device is read again");
        assert_eq!(back.devices.len(), first.devices.len());
        let netdev = |s: &Snapshot| s.devices.iter().find(|d| d.name == dev).and_then(|d| d.netdev.clone());
        assert_eq!(netdev(&back), netdev(&first));
        assert!(netdev(&back).is_some());
    }

    #[test]
    fn a_batch_is_the_last_one_while_its_files_are_the_same() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let build = |prev: Option<Arc<FileSet>>, files: &[&str]| {
            let mut b = Batch::against(prev);
            for (i, f) in files.iter().enumerate() {
                assert_eq!(b.add(format_args!("{f}")), i);
            }
            b.finish(&host, true)
        };
        let first = build(None, &["a", "b", "c"]);
        assert_eq!(first.rels(), ["a", "b", "c"]);
        let again = build(Some(first.clone()), &["a", "b", "c"]);
        assert!(Arc::ptr_eq(&first, &again));
        for files in [&["a", "b"][..], &["a", "b", "c", "d"], &["a", "x", "c"], &["x"], &[]] {
            let other = build(Some(first.clone()), files);
            assert!(!Arc::ptr_eq(&first, &other), "{files:?}");
            assert_eq!(other.rels(), files);
        }
        let mut b = Batch::against(Some(first.clone()));
        assert_eq!(b.add_unless(format_args!("a"), |_| false), Some(0));
        assert_eq!(b.add_unless(format_args!("b"), |f| f == "b"), None);
        assert_eq!(b.add(format_args!("c")), 1);
        assert_eq!(b.finish(&host, true).rels(), ["a", "c"]);
    }

    #[test]
    fn a_device_seen_without_ports_is_listed_again_until_its_ports_appear() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan = ReadPlan { statics: Some(cache.clone()), ..ReadPlan::default() };
        let ports = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports");
        let away = ports.with_file_name("ports.registering");
        let ports_of = |s: &Snapshot| s.devices.iter().find(|d| d.name == "mlx5_0").map(|d| d.ports.len());
        // Caught registering: no ports yet.
        std::fs::rename(&ports, &away).unwrap();
        assert_eq!(ports_of(&discover(&host, &plan)), Some(0));
        let reads = cache.reads();
        // Its ports appear: seen by the next poll, in the same incarnation.
        std::fs::rename(&away, &ports).unwrap();
        assert_eq!(ports_of(&discover(&host, &plan)), Some(1));
        assert_eq!(cache.reads(), reads, "the static attributes were not read again");
    }
}
