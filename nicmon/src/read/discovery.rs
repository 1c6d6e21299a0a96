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
use crate::read::host::{FileSet, Host, Listing, PendingReads, ReadError, Rels, SysDir};
use crate::read::parse;
use std::sync::atomic::Ordering;

mod chars;
mod unmonitored;
pub use chars::char_devices;
use unmonitored::Frozen;
pub use unmonitored::Unmonitored;

/// What to read beyond the fixed set of files.
#[derive(Clone, Default)]
pub struct ReadPlan<'a> {
    /// Counter paths as configured: relative to the port directory (`counters/link_downed`)
    /// or a netdev template (`/sys/class/net/{interface}/carrier_changes`).
    /// Shared with every port's counter values ([`Port::counters`]' keys).
    pub counter_paths: Vec<Arc<str>>,
    /// Devices (name, PCI address) known from earlier polls: when one is missing from
    /// `class/infiniband`, its PCI function is probed (002 §5.9).
    pub known: Vec<(String, String)>,
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
    pub counter_paths: Vec<Arc<str>>,
    /// The netdev's `speed` ([`Port::netdev_speed`]).
    pub speed: bool,
}

/// How long the static attributes of a device are trusted without a re-read.
pub const STATIC_REFRESH: Duration = Duration::from_secs(60);

/// The attributes of an RDMA device that cannot change while it exists: its PCI identity,
/// driver, vendor, function kind, NUMA node, HCA type, firmware version, board id and its
/// ports (a device's ports are fixed when it registers).
#[derive(Debug, Clone)]
struct Statics {
    /// The port numbers listed under `ports/`. Empty: listed again on every poll (a device
    /// caught registering, before its ports appeared, is not remembered without ports).
    ports: Vec<u32>,
    /// The `device` link's target name when read: a different one is a new incarnation.
    link: Option<String>,
    pci_address: Option<String>,
    driver: Option<String>,
    vendor: Option<u32>,
    function: Function,
    /// The value (`-1` included), and why it is unknown when it is.
    numa_node: (Option<i32>, Option<String>),
    hca_type: Option<String>,
    fw_ver: Option<String>,
    board_id: Option<String>,
    /// The PCIe maxima of a PF's link, both ends (`None` for a VF or without a PCI address).
    pcie: Option<PcieStatics>,
    /// The link layer of each listed port that read InfiniBand or Ethernet (fixed when the
    /// device registers, like its ports): which ports are RoCE ([`RoceReads`]).
    link_layers: BTreeMap<u32, LinkLayer>,
    read_at: Instant,
    /// The device's directory, kept open: the per-poll `device` link and netdev listing
    /// are looked up in it. Once the device is removed every lookup in it fails, which
    /// makes the next poll read the device afresh (a new incarnation under the same name).
    dir: Option<SysDir>,
}

/// The PCIe attributes of a PF that are fixed by the hardware (SPEC §1.10): its maxima and
/// the upstream bridge port's (the other end of its link).
#[derive(Debug, Clone)]
struct PcieStatics {
    own: LinkMaxima,
    /// The upstream port's address and its maxima; `None`: the PF hangs from no PCI bridge.
    upstream: Option<(String, LinkMaxima)>,
}

/// `max_link_speed` and `max_link_width` of one PCI function, as read.
#[derive(Debug, Clone)]
struct LinkMaxima {
    speed: Result<String, ReadError>,
    width: Result<String, ReadError>,
}

impl LinkMaxima {
    fn read(host: &Host, address: &str) -> LinkMaxima {
        let max = |f: &str| host.read_sys(&format!("bus/pci/devices/{address}/{f}"));
        LinkMaxima { speed: max("max_link_speed"), width: max("max_link_width") }
    }

    /// The link figures with these maxima and the current figures read now.
    fn link(&self, speed: &Result<String, ReadError>, width: &Result<String, ReadError>) -> PcieLink {
        PcieLink::from_texts(speed, width, &self.speed, &self.width)
    }
}

impl PcieStatics {
    fn read(host: &Host, address: &str) -> PcieStatics {
        PcieStatics {
            own: LinkMaxima::read(host, address),
            upstream: upstream_port(host, address).map(|up| {
                let max = LinkMaxima::read(host, &up);
                (up, max)
            }),
        }
    }
}

/// The static attributes of each device incarnation, read once (SPEC §1.1, the read path).
/// They are read again when the device set changes (a device came or went: every entry is
/// dropped), when the device's PCI identity (its `device` link) differs or its kept
/// directory is gone (it unregistered, even if it is back under the same name), after
/// [`StaticCache::invalidate`] (a wake-up naming the device) and at least every
/// [`STATIC_REFRESH`]. Everything that can change (port state, rate, counters, netdev
/// state, the netdev listing) is read on every poll.
#[derive(Debug, Default)]
pub struct StaticCache {
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    /// The device listing (`class/infiniband`) the entries were read under.
    listing: Listing,
    by_device: BTreeMap<String, Arc<Statics>>,
    /// Per device: files found absent (`ENOENT`) in this incarnation, not tried again until
    /// the device's static attributes are read again.
    absent: BTreeMap<String, Absent>,
    /// Per device: the ports whose `rate` gave a rate at the last poll in this incarnation.
    /// Their netdev's `speed` ([`RoceReads::speed`]) is not read: it only stands in for a
    /// missing rate, and each read of it costs mlx5 a firmware command.
    rated: BTreeMap<String, std::collections::BTreeSet<u32>>,
    /// Static attribute sets read so far (one per device read from the host).
    reads: u64,
    /// The per-poll files of the last full poll (its devices' and the character devices'):
    /// the next full poll has the reader read them while it lists the devices (they are the
    /// same files unless a device, port, netdev or character device came or went).
    last_batch: Option<Arc<FileSet>>,
    /// The unmonitored devices as read once in their incarnation ([`unmonitored`]).
    frozen: Frozen,
    /// The character-device class directories as the last full poll listed and read them.
    chars: chars::Kept,
}

impl CacheInner {
    /// The names of the last device listing.
    fn names(&self) -> &[String] {
        self.listing.names().map(|n| &**n).unwrap_or(&[])
    }

    /// Where `device` is in the last device listing.
    fn position(&self, device: &str) -> Option<usize> {
        self.names().binary_search_by(|n| n.as_str().cmp(device)).ok()
    }

    /// Forget everything about `device` but its presence.
    fn forget(&mut self, device: &str) {
        self.by_device.remove(device);
        self.absent.remove(device);
        self.rated.remove(device);
        if let Some(i) = self.position(device) {
            self.frozen.thaw(i);
        }
    }
}

impl StaticCache {
    /// Forget `device`'s static attributes: the next poll reads them again.
    pub fn invalidate(&self, device: &str) {
        if let Ok(mut c) = self.inner.lock() {
            c.forget(device);
        }
    }

    /// Whether `rel` was found absent on `device` in this incarnation.
    fn is_absent(&self, device: &str, rel: &str) -> bool {
        self.inner.lock().map(|c| c.absent.get(device).is_some_and(|a| a.files.contains(rel))).unwrap_or(false)
    }

    /// Whether counter `k` of the plan was found absent on port `port` of `device` in this
    /// incarnation.
    fn is_counter_absent(&self, device: &str, port: u32, k: usize) -> bool {
        let absent = |c: &CacheInner| c.absent.get(device).is_some_and(|a| a.counters.contains(&(port, k)));
        self.inner.lock().map(|c| absent(&c)).unwrap_or(false)
    }

    fn mark_absent(&self, device: &str, file: AbsentFile<'_>) {
        if let Ok(mut c) = self.inner.lock()
            && c.by_device.contains_key(device)
        {
            let a = c.absent.entry(device.to_string()).or_default();
            match file {
                AbsentFile::Counter(port, k) => a.counters.insert((port, k)),
                AbsentFile::File(rel) => a.files.insert(rel.to_string()),
            };
        }
    }

    /// Whether `port` of `device` gave a rate at its last poll in this incarnation.
    fn is_rated(&self, device: &str, port: u32) -> bool {
        self.inner.lock().map(|c| c.rated.get(device).is_some_and(|r| r.contains(&port))).unwrap_or(false)
    }

    fn set_rated(&self, device: &str, port: u32, rated: bool) {
        if let Ok(mut c) = self.inner.lock()
            && c.by_device.contains_key(device)
        {
            let ports = c.rated.entry(device.to_string()).or_default();
            if rated {
                ports.insert(port);
            } else {
                ports.remove(&port);
            }
        }
    }

    fn last_batch(&self) -> Option<Arc<FileSet>> {
        self.inner.lock().ok()?.last_batch.clone()
    }

    fn clear_last_batch(&self) {
        if let Ok(mut c) = self.inner.lock() {
            c.last_batch = None;
        }
    }

    fn set_last_batch(&self, files: Arc<FileSet>) {
        if let Ok(mut c) = self.inner.lock() {
            c.last_batch = Some(files);
        }
    }

    /// Static attribute sets read from the host so far.
    pub fn reads(&self) -> u64 {
        self.inner.lock().map(|c| c.reads).unwrap_or(0)
    }

    /// List the devices again: their names, and whether the set differs from the last
    /// listing's (then everything kept about the devices is dropped).
    fn relist(&self, host: &Host) -> (Arc<[String]>, bool) {
        let Ok(mut c) = self.inner.lock() else { return (host.list_sys(DEVICES).into(), true) };
        let mut listing = std::mem::take(&mut c.listing);
        let changed = host.relist_sys(DEVICES, &mut listing);
        c.listing = listing;
        let names: Arc<[String]> = c.listing.names().cloned().unwrap_or_else(|_| Arc::from([]));
        if changed {
            c.by_device.clear();
            c.absent.clear();
            c.rated.clear();
            c.frozen.reset(names.len());
        }
        (names, changed)
    }

    /// `device`'s static attributes as kept, if they are less than [`STATIC_REFRESH`] old.
    fn get(&self, device: &str, now: Instant) -> Option<Arc<Statics>> {
        let c = self.inner.lock().ok()?;
        c.by_device.get(device).filter(|s| now.duration_since(s.read_at) < STATIC_REFRESH).cloned()
    }

    fn put(&self, device: &str, statics: Arc<Statics>) {
        if let Ok(mut c) = self.inner.lock() {
            c.forget(device);
            c.reads += 1;
            c.by_device.insert(device.to_string(), statics);
        }
    }

    /// The frozen readings by position in the device listing, those `judge` says are
    /// monitored now dropped ([`unmonitored`]).
    fn frozen(&self, judge: Unmonitored<'_>, route: &[String]) -> Vec<Option<Arc<Device>>> {
        self.inner.lock().map(|mut c| c.frozen.judged(judge, route)).unwrap_or_default()
    }

    /// `device`'s frozen reading, unless `judge` says it is monitored now.
    fn frozen_named(&self, device: &str, judge: Unmonitored<'_>, route: &[String]) -> Option<Arc<Device>> {
        let mut c = self.inner.lock().ok()?;
        let i = c.position(device)?;
        let d = c.frozen.get(i)?;
        if judge(&d, route) {
            return Some(d);
        }
        c.frozen.thaw(i);
        None
    }

    /// Keep `device`, just read, as its incarnation's reading; its static attributes are
    /// not kept apart any more (read again should it be monitored).
    fn freeze(&self, device: Arc<Device>) {
        if let Ok(mut c) = self.inner.lock()
            && let Some(i) = c.position(&device.name)
        {
            c.by_device.remove(&device.name);
            c.absent.remove(&device.name);
            c.rated.remove(&device.name);
            c.frozen.freeze(i, device);
            // Its files are not the next poll's: nothing is read ahead.
            c.last_batch = None;
        }
    }

    /// How many unmonitored devices are served from their frozen reading.
    pub fn frozen_count(&self) -> usize {
        self.inner.lock().map(|c| c.frozen.len()).unwrap_or(0)
    }
}

/// A device's files found absent (`ENOENT`) in its incarnation: its ports' counters by
/// (port, index of the counter path in the plan) — a device of a thousand ports may lack a
/// counter on every one — and other files by path.
#[derive(Debug, Default)]
struct Absent {
    counters: std::collections::BTreeSet<(u32, usize)>,
    files: std::collections::BTreeSet<String>,
}

/// A file found absent ([`Absent`]).
enum AbsentFile<'a> {
    Counter(u32, usize),
    File(&'a str),
}

/// Where the RDMA devices are listed.
const DEVICES: &str = "class/infiniband";

static MLX5_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^mlx5_(bond_)?\d+$").expect("static regex"));

const MELLANOX_VENDOR: u32 = 0x15b3;
const NVIDIA_VENDOR: u32 = 0x10de;
/// Amazon (the `efa` driver's adapters).
const AMAZON_VENDOR: u32 = 0x1d0f;

/// Read every RDMA device, its ports and counters, the default route and the PCI probes.
pub fn discover(host: &Host, plan: &ReadPlan) -> Snapshot {
    // The reader starts on the last full poll's files while this thread lists the devices
    // and plans this poll's files; used only if those are the same files.
    let last = plan.statics.as_ref().and_then(|c| c.last_batch());
    let mut prefetch =
        last.as_ref().map(|files| Prefetch { generation: host.kept_generation(), reads: host.start_files(files) });
    let names: Arc<[String]> = match &plan.statics {
        Some(cache) => {
            let (names, changed) = cache.relist(host);
            if changed {
                // A device came or went: every kept-open file is opened again.
                host.forget_kept(None);
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
    let (default_route_ifaces, default_route_devices) = default_route(host);
    let mut batch = Batch::against(last);
    let frozen = match (&plan.statics, plan.unmonitored) {
        (Some(cache), Some(judge)) => cache.frozen(judge, &default_route_devices),
        _ => Vec::new(),
    };
    let reads: Vec<Planned> = names
        .iter()
        .enumerate()
        .map(|(i, n)| match frozen.get(i).cloned().flatten() {
            Some(d) => Planned::Frozen(d),
            None => Planned::Read(read_device(host, n, plan, &mut batch)),
        })
        .collect();
    let chars = chars::plan(host, plan.statics.as_deref(), !plan.char_listing_may_stand, &mut batch);
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
    }
    let devices = finish_devices(reads, &results, &files, plan, &default_route_devices);
    let char_devices = chars::finish(chars, &results, plan.statics.as_deref());

    let mut pci_probes = BTreeMap::new();
    for (name, pci) in &plan.known {
        if !names.contains(name) {
            pci_probes.insert(name.clone(), probe_pci(host, pci));
        }
    }

    Snapshot { devices, default_route_ifaces, default_route_devices, pci_probes, char_devices }
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
/// finished from the results (and frozen when it may be, see [`unmonitored`]).
fn finish_devices(
    reads: Vec<Planned>,
    results: &[Result<String, ReadError>],
    files: &FileSet,
    plan: &ReadPlan,
    route: &[String],
) -> Vec<Arc<Device>> {
    reads
        .into_iter()
        .map(|r| match r {
            Planned::Frozen(d) => d,
            Planned::Read(r) => {
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
    let listed = host.list_sys("class/infiniband");
    if listed.len() != base.devices.len() || !base.devices.iter().all(|d| listed.contains(&d.name)) {
        return None;
    }
    let mut s = base.clone();
    let named: Vec<String> = s.devices.iter().filter(|d| names.contains(&d.name)).map(|d| d.name.clone()).collect();
    let mut batch = Batch::default();
    let route = &base.default_route_devices;
    let reads: Vec<Planned> = named.iter().map(|n| plan_device(host, n, plan, route, &mut batch)).collect();
    let files = batch.finish(host, plan.statics.is_some());
    let results = host.read_files(&files);
    let mut read = finish_devices(reads, &results, &files, plan, route).into_iter();
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
/// it: the PCIe reading, and each port's counters, netdev speed and ethtool data.
fn keep_base_readings(new: &mut Device, base: &Device) {
    new.pcie = base.pcie.clone();
    for p in &mut new.ports {
        if let Some(old) = base.ports.iter().find(|o| o.number == p.number) {
            p.counters = old.counters.clone();
            p.netdev_speed = old.netdev_speed;
            p.ethtool = old.ethtool.clone();
            p.ethtool_age = old.ethtool_age;
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

/// The result of file `i` of a batch (by reference; an error cloned).
fn at(results: &[Result<String, ReadError>], i: usize) -> Result<&str, ReadError> {
    match results.get(i) {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(e.clone()),
        None => Err(ReadError::Io("not read".into())),
    }
}

fn opt<S: AsRef<str>>(r: Result<S, ReadError>) -> Option<String> {
    r.ok().and_then(|s| parse::text(s.as_ref()).map(str::to_string))
}

/// An attribute read and parsed, or why it is unknown: the read failed, it was empty, or
/// `known` says the parsed value is not one nicmon can judge (an `Unknown` variant).
fn attribute<T, S: AsRef<str>>(
    r: Result<S, ReadError>,
    parse: impl Fn(&str) -> Option<T>,
    known: impl Fn(&T) -> bool,
) -> (Option<T>, Option<String>) {
    match r {
        Err(e) => (None, Some(e.to_string())),
        Ok(raw) => match (parse(raw.as_ref()), parse::text(raw.as_ref())) {
            (_, None) => (None, Some("empty".to_string())),
            (Some(v), _) if known(&v) => (Some(v), None),
            (v, Some(t)) => (v, Some(format!("unparsable value {:?}", clip(t)))),
        },
    }
}

/// At most 64 characters of a value, for a message.
fn clip(t: &str) -> String {
    let mut out: String = t.chars().take(64).collect();
    if out.len() < t.len() {
        out.push('…');
    }
    out
}

/// Read the static attributes of device `name` (see [`StaticCache`]).
fn read_statics(host: &Host, base: &str, link: Option<String>) -> Statics {
    let pci_address = host
        .read_sys(&format!("{base}/device/uevent"))
        .ok()
        .and_then(|u| parse::uevent_pci_slot(&u))
        .or_else(|| link.as_deref().and_then(parse::pci_address));
    let function = if host.exists_sys(&format!("{base}/device/physfn")) {
        Function::Vf
    } else if host.exists_sys(&format!("{base}/device/sriov_totalvfs")) {
        Function::Pf
    } else {
        Function::Unknown
    };
    let pcie = pci_address.as_deref().filter(|_| function != Function::Vf).map(|a| PcieStatics::read(host, a));
    let ports = list_ports(host, base);
    let link_layers = ports
        .iter()
        .filter_map(|n| {
            let ll = host.read_sys(&format!("{base}/ports/{n}/link_layer")).ok().and_then(|v| parse::link_layer(&v))?;
            matches!(ll, LinkLayer::InfiniBand | LinkLayer::Ethernet).then_some((*n, ll))
        })
        .collect();
    Statics {
        ports,
        link_layers,
        link,
        pci_address,
        driver: host.link_name_sys(&format!("{base}/device/driver")),
        vendor: host.read_sys(&format!("{base}/device/vendor")).ok().and_then(|v| parse::hex_u32(&v)),
        function,
        // `-1` is a value (no NUMA affinity); unreadable or garbage is unknown.
        numa_node: attribute(
            host.read_sys(&format!("{base}/device/numa_node")),
            |v| parse::text(v).and_then(|t| t.parse::<i32>().ok()),
            |n| *n >= -1,
        ),
        hca_type: opt(host.read_sys(&format!("{base}/hca_type"))),
        fw_ver: opt(host.read_sys(&format!("{base}/fw_ver"))),
        board_id: opt(host.read_sys(&format!("{base}/board_id"))),
        pcie,
        read_at: Instant::now(),
        dir: host.open_dir_sys(base),
    }
}

/// The files of one read, read together ([`Host::read_files`]): one hand-off to the reader
/// thread for all of them. Built against the last poll's files: while each file added is
/// the one at the same place there, nothing is allocated, and when all are, the last poll's
/// [`FileSet`] itself is read again (so a read begun ahead on it is this poll's read).
#[derive(Default)]
struct Batch {
    prev: Option<Arc<FileSet>>,
    /// Files added so far.
    len: usize,
    /// Every file added, once one differed from `prev`'s (`None` while they are the same).
    rels: Option<Rels>,
    scratch: String,
    /// The files added that are read once, not kept open (by index, ascending).
    once: Vec<usize>,
    /// Whether the files added now are read once ([`Batch::read_once`]).
    reading_once: bool,
}

impl Batch {
    fn against(prev: Option<Arc<FileSet>>) -> Batch {
        Batch { prev, ..Batch::default() }
    }

    /// Add a file; its index in the results.
    fn add(&mut self, rel: std::fmt::Arguments<'_>) -> usize {
        self.add_unless(rel, |_| false).unwrap_or_default()
    }

    /// The files added from now on are read once, not kept open (`once`), or kept open as
    /// the batch's files are (see [`Batch::finish`]).
    fn read_once(&mut self, once: bool) {
        self.reading_once = once;
    }

    /// Add a file unless `skip` says so (given its path); its index in the results.
    fn add_unless(&mut self, rel: std::fmt::Arguments<'_>, skip: impl FnOnce(&str) -> bool) -> Option<usize> {
        use std::fmt::Write;
        self.scratch.clear();
        let _ = self.scratch.write_fmt(rel);
        if skip(&self.scratch) {
            return None;
        }
        let i = self.len;
        self.len += 1;
        if self.reading_once {
            self.once.push(i);
        }
        match &mut self.rels {
            Some(rels) => rels.push(&self.scratch),
            None => {
                // The same file as the last batch's at this place (whether it is kept open
                // the same way is seen in `finish`).
                if !self.prev.as_ref().is_some_and(|p| p.rel_is(i, &self.scratch)) {
                    let prev = self.prev.as_ref();
                    let mut rels: Rels = (0..i).filter_map(|j| prev.and_then(|p| p.rel(j))).collect();
                    rels.push(&self.scratch);
                    self.rels = Some(rels);
                }
            }
        }
        Some(i)
    }

    /// The files added (`keep`: see [`Host::file_set`]; those added to be read once are
    /// not kept whatever it says).
    fn finish(self, host: &Host, keep: bool) -> Arc<FileSet> {
        if self.is_prev(keep)
            && let Some(prev) = self.prev
        {
            return prev;
        }
        let kept = |i: usize| keep && self.once.binary_search(&i).is_err();
        let rels = match self.rels {
            Some(rels) => rels,
            None => (0..self.len).filter_map(|i| self.prev.as_ref().and_then(|p| p.rel(i))).collect(),
        };
        // This batch's reference to the last one goes before the new set is made.
        drop(self.prev);
        host.file_set_keeping(rels, kept)
    }

    /// Whether the files added are the last batch's, kept open the same way (`keep`: as
    /// [`Batch::finish`]'s): then it is that batch again.
    fn is_prev(&self, keep: bool) -> bool {
        let kept = |i: usize| keep && self.once.binary_search(&i).is_err();
        self.rels.is_none()
            && self.prev.as_ref().is_some_and(|p| p.len() == self.len && (0..p.len()).all(|i| p.kept(i) == kept(i)))
    }
}

/// A device's read before its per-poll files are read: its static attributes, listings,
/// and where each port's files are in the [`Batch`].
struct DeviceRead {
    name: String,
    statics: Arc<Statics>,
    efa: bool,
    unsupported: Option<String>,
    netdev: Option<String>,
    ports: Vec<PortRead>,
    pcie: Option<PcieRead>,
}

/// Where a PF's per-poll PCIe files are in the [`Batch`]: `current_link_speed`,
/// `current_link_width`, and the AER files not found absent in this incarnation.
struct PcieRead {
    speed: usize,
    width: usize,
    aer: Vec<(AerSeverity, usize)>,
}

/// Where one port's files are in the [`Batch`].
struct PortRead {
    number: u32,
    link_layer: usize,
    state: usize,
    phys_state: usize,
    rate: usize,
    lid: usize,
    sm_lid: usize,
    operstate: Option<usize>,
    carrier: Option<usize>,
    /// (index of the configured path in the plan, index of the file)
    counters: Vec<(usize, usize)>,
    /// The same for [`RoceReads::counter_paths`], and the netdev's `speed`: read on a port
    /// that may be RoCE, kept on one that is.
    roce_counters: Vec<(usize, usize)>,
    speed: Option<usize>,
}

/// What a monitored port reads beyond its fixed files: the plan's counters and, on a port
/// that may be RoCE, the plan's [`RoceReads`].
#[derive(Clone, Copy)]
struct PortPlan<'p> {
    plan: &'p ReadPlan<'p>,
    roce: bool,
}

/// Files read ahead: begun before the listings, under the kept-file generation then.
struct Prefetch {
    generation: u64,
    reads: PendingReads,
}

/// The results of `files`: `prefetch`'s when it read exactly these files and no kept file
/// was forgotten since it began (a device's new incarnation); otherwise read now.
fn read_batch(host: &Host, files: &Arc<FileSet>, prefetch: Option<Prefetch>) -> Vec<Result<String, ReadError>> {
    match prefetch {
        Some(p) if Arc::ptr_eq(p.reads.files(), files) && host.kept_generation() == p.generation => {
            host.stats.read_ahead_used.fetch_add(1, Ordering::Relaxed);
            host.finish_files(p.reads)
        }
        other => {
            drop_prefetch(host, other);
            if files.is_empty() { Vec::new() } else { host.read_files(files) }
        }
    }
}

/// Files read ahead and not used: collected (the reader must be free for the poll's batch)
/// and dropped.
fn drop_prefetch(host: &Host, prefetch: Option<Prefetch>) {
    if let Some(p) = prefetch {
        host.finish_files(p.reads);
        host.stats.read_ahead_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The port numbers under `<base>/ports`, in listing order.
fn list_ports(host: &Host, base: &str) -> Vec<u32> {
    host.list_sys(&format!("{base}/ports")).into_iter().filter_map(|p| p.parse::<u32>().ok()).collect()
}

/// A device of a poll before its per-poll files are read.
enum Planned {
    /// Its frozen reading: nothing of it is read ([`unmonitored`]).
    Frozen(Arc<Device>),
    Read(DeviceRead),
}

/// Plan device `name` (a targeted read): its frozen reading while it has one, else its read.
fn plan_device(host: &Host, name: &str, plan: &ReadPlan, route: &[String], batch: &mut Batch) -> Planned {
    if let (Some(cache), Some(judge)) = (&plan.statics, plan.unmonitored)
        && let Some(d) = cache.frozen_named(name, judge, route)
    {
        return Planned::Frozen(d);
    }
    Planned::Read(read_device(host, name, plan, batch))
}

/// Plan the read of a device: its static attributes (kept or read now), its listings, and
/// its per-poll files into `batch`.
fn read_device(host: &Host, name: &str, plan: &ReadPlan, batch: &mut Batch) -> DeviceRead {
    let base = format!("class/infiniband/{name}");
    let link_by_path = || host.link_name_sys(&format!("{base}/device"));
    // The incarnation check: the `device` link read again, in the kept directory when there
    // is one (a removed directory answers nothing there: a new incarnation).
    let kept = plan.statics.as_ref().and_then(|c| c.get(name, Instant::now())).filter(|s| {
        let link = match (&s.dir, &s.link) {
            (Some(dir), Some(_)) => host.link_name_in(dir, "device"),
            _ => link_by_path(),
        };
        link == s.link
    });
    let mut fresh = false;
    let statics = match (&plan.statics, kept) {
        (Some(_), Some(s)) => s,
        (Some(cache), None) => {
            fresh = true;
            let s = Arc::new(read_statics(host, &base, link_by_path()));
            cache.put(name, s.clone());
            s
        }
        (None, _) => Arc::new(read_statics(host, &base, link_by_path())),
    };
    let driver = statics.driver.as_deref();
    let vendor = statics.vendor;

    // AWS EFA: bound to `efa`; by the Amazon vendor only when the driver is unknown (an
    // Amazon function bound to another driver is not an EFA).
    let efa = match driver {
        Some(d) => d == "efa",
        None => vendor == Some(AMAZON_VENDOR),
    };
    let supported = efa || MLX5_NAME.is_match(name) || driver == Some("mlx5_core") || vendor == Some(MELLANOX_VENDOR);
    let unsupported = (!supported).then(|| {
        format!(
            "not an NVIDIA/Mellanox mlx5 or AWS EFA device (driver {}, PCI vendor {})",
            driver.unwrap_or("unknown"),
            vendor.map(|v| format!("{v:#06x}")).unwrap_or_else(|| "unknown".into())
        )
    });

    let netdevs = match &statics.dir {
        Some(dir) => host.list_in(dir, "device/net"),
        None => host.list_sys(&format!("{base}/device/net")),
    };
    let netdev = netdevs.first().cloned();
    if fresh {
        // A new incarnation (or the periodic re-read): its kept-open files are opened again.
        host.forget_kept(Some(&base));
        for nd in &netdevs {
            host.forget_kept(Some(&format!("class/net/{nd}")));
        }
        if let Some(address) = &statics.pci_address {
            host.forget_kept(Some(&format!("bus/pci/devices/{address}")));
        }
    }

    // Unsupported devices and VFs are listed, not monitored: read their ports' states
    // for the report, but no counters.
    let read_counters = supported && statics.function != Function::Vf;
    let numbers = if statics.ports.is_empty() { list_ports(host, &base) } else { statics.ports.clone() };
    // Their files are not kept open: a monitor reads such a device once per incarnation
    // ([`unmonitored`]).
    batch.read_once(!read_counters);
    let ports = numbers
        .into_iter()
        .map(|n| {
            let port_netdev = port_netdev(host, &base, &netdevs, n).or_else(|| netdev.clone());
            let roce = !efa && statics.link_layers.get(&n).is_none_or(|l| *l == LinkLayer::Ethernet);
            let reads = (read_counters && !plan.link_only).then_some(PortPlan { plan, roce });
            plan_port(name, n, port_netdev.as_deref(), reads, batch)
        })
        .collect();
    batch.read_once(false);
    let pcie = (read_counters && !plan.link_only).then(|| plan_pcie(name, &statics, plan, batch)).flatten();
    DeviceRead { name: name.to_string(), statics, efa, unsupported, netdev, ports, pcie }
}

/// The per-poll PCIe files of a monitored PF, added to `batch`.
fn plan_pcie(dev: &str, statics: &Statics, plan: &ReadPlan, batch: &mut Batch) -> Option<PcieRead> {
    statics.pcie.as_ref()?;
    let address = statics.pci_address.as_deref()?;
    let speed = batch.add(format_args!("bus/pci/devices/{address}/current_link_speed"));
    let width = batch.add(format_args!("bus/pci/devices/{address}/current_link_width"));
    let aer = AerSeverity::ALL
        .into_iter()
        .filter_map(|s| {
            let absent = |rel: &str| plan.statics.as_deref().is_some_and(|c| c.is_absent(dev, rel));
            batch.add_unless(format_args!("bus/pci/devices/{address}/{}", s.file()), absent).map(|i| (s, i))
        })
        .collect();
    Some(PcieRead { speed, width, aer })
}

/// A PF's PCIe reading from its statics and this poll's results; an AER file found absent
/// is remembered (not read again in this incarnation).
fn finish_pcie(
    dev: &str,
    statics: &Statics,
    p: PcieRead,
    results: &[Result<String, ReadError>],
    files: &FileSet,
    plan: &ReadPlan,
) -> Option<PcieReading> {
    let st = statics.pcie.as_ref()?;
    let get = |i: usize| results.get(i).cloned().unwrap_or(Err(ReadError::Missing));
    let link = st.own.link(&get(p.speed), &get(p.width));
    let unread = Err(ReadError::Missing);
    let upstream = st
        .upstream
        .as_ref()
        .map(|(address, max)| UpstreamPort { address: address.clone(), link: max.link(&unread, &unread) });
    let mut aer = Aer::default();
    for (s, i) in p.aer {
        let raw = results.get(i);
        if let (Some(Err(ReadError::Missing)), Some(c), Some(rel)) = (raw, plan.statics.as_deref(), files.rel(i)) {
            c.mark_absent(dev, AbsentFile::File(&rel));
        }
        *aer.slot(s) = raw.and_then(|r| aer_file(r.as_deref(), s));
    }
    Some(PcieReading { link, upstream, aer })
}

fn finish_device(r: DeviceRead, results: &[Result<String, ReadError>], files: &FileSet, plan: &ReadPlan) -> Device {
    let DeviceRead { name, statics, efa, unsupported, netdev, ports, pcie } = r;
    let pcie = pcie.and_then(|p| finish_pcie(&name, &statics, p, results, files, plan));
    let Statics { pci_address, driver, function, numa_node, hca_type, fw_ver, board_id, .. } = &*statics;
    let (pci_address, driver, function, numa_node) =
        (pci_address.clone(), driver.clone(), *function, numa_node.clone());
    let (hca_type, fw_ver, board_id) = (hca_type.clone(), fw_ver.clone(), board_id.clone());
    let card = pci_address.as_deref().and_then(parse::card_of);
    let ports = ports
        .into_iter()
        .map(|p| {
            let mut port = finish_port(&name, p, results, plan);
            if efa {
                // The efa driver reports an unspecified link layer (`Unknown`).
                port.link_layer = Some(LinkLayer::Efa);
                port.unknown.remove("link_layer");
            }
            port
        })
        .collect();
    let (numa_node, numa_unknown) = numa_node;
    let mut unknown = BTreeMap::new();
    if let Some(why) = numa_unknown {
        unknown.insert("numa_node".to_string(), why);
    }
    Device {
        name,
        unsupported,
        pci_address,
        card,
        numa_node: numa_node.filter(|n| *n >= 0),
        hca_type,
        fw_ver,
        board_id,
        driver,
        function,
        netdev,
        ports,
        unknown,
        pcie,
    }
}

/// The netdev of port `n` when a device has several: the one whose `dev_port` is `n - 1`.
fn port_netdev(host: &Host, base: &str, netdevs: &[String], n: u32) -> Option<String> {
    if netdevs.len() < 2 {
        return None;
    }
    netdevs
        .iter()
        .find(|nd| {
            host.read_sys(&format!("{base}/device/net/{nd}/dev_port"))
                .ok()
                .and_then(|v| parse::text(&v).and_then(|t| t.parse::<u32>().ok()))
                == Some(n.saturating_sub(1))
        })
        .cloned()
}

/// The files of port `n` that every poll reads, added to `batch`.
fn plan_port(dev: &str, n: u32, netdev: Option<&str>, reads: Option<PortPlan<'_>>, batch: &mut Batch) -> PortRead {
    let mut file = |f: &str| batch.add(format_args!("class/infiniband/{dev}/ports/{n}/{f}"));
    let (link_layer, state, phys_state, rate, lid, sm_lid) =
        (file("link_layer"), file("state"), file("phys_state"), file("rate"), file("lid"), file("sm_lid"));
    let operstate = netdev.map(|nd| batch.add(format_args!("class/net/{nd}/operstate")));
    let carrier = netdev.map(|nd| batch.add(format_args!("class/net/{nd}/carrier")));
    let (mut counters, mut roce_counters, mut speed) = (Vec::new(), Vec::new(), None);
    if let Some(PortPlan { plan, roce }) = reads {
        let cache = plan.statics.as_deref();
        counters = plan_counters((dev, n, netdev), &plan.counter_paths, 0, cache, batch);
        if roce {
            roce_counters =
                plan_counters((dev, n, netdev), &plan.roce.counter_paths, plan.counter_paths.len(), cache, batch);
            let rated = cache.is_some_and(|c| c.is_rated(dev, n));
            speed =
                netdev.filter(|_| plan.roce.speed && !rated).map(|nd| batch.add(format_args!("class/net/{nd}/speed")));
        }
    }
    PortRead {
        number: n,
        link_layer,
        state,
        phys_state,
        rate,
        lid,
        sm_lid,
        operstate,
        carrier,
        counters,
        roce_counters,
        speed,
    }
}

/// The counter files of `paths` on port `n` of `dev` (netdev `netdev`), added to `batch`
/// unless found absent in this incarnation: (index in `paths`, index of the file). A
/// counter is remembered absent by (port, `base` + its index): the rules' paths come first,
/// the RoCE reads' after them.
fn plan_counters(
    (dev, n, netdev): (&str, u32, Option<&str>),
    paths: &[Arc<str>],
    base: usize,
    cache: Option<&StaticCache>,
    batch: &mut Batch,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (k, path) in paths.iter().enumerate() {
        let Some(file) = CounterFile::of(dev, n, path, netdev) else { continue };
        if !cache.is_some_and(|c| c.is_counter_absent(dev, n, base + k)) {
            out.push((k, batch.add(format_args!("{file}"))));
        }
    }
    out
}

/// The values of the counter files planned by [`plan_counters`] (with the same `paths`
/// and `base`) into `out`, under their shared path; a file found absent is remembered (not
/// read again in this incarnation).
fn finish_counters(
    (dev, n): (&str, u32),
    planned: Vec<(usize, usize)>,
    (paths, base): (&[Arc<str>], usize),
    (results, plan): (&[Result<String, ReadError>], &ReadPlan),
    out: &mut BTreeMap<Arc<str>, u64>,
) {
    for (k, i) in planned {
        match results.get(i) {
            Some(Ok(raw)) => {
                if let Some(v) = parse::counter(raw) {
                    out.insert(paths[k].clone(), v);
                }
            }
            Some(Err(ReadError::Missing)) => {
                if let Some(c) = plan.statics.as_deref() {
                    c.mark_absent(dev, AbsentFile::Counter(n, base + k));
                }
            }
            _ => {}
        }
    }
}

fn finish_port(dev: &str, p: PortRead, results: &[Result<String, ReadError>], plan: &ReadPlan) -> Port {
    let get = |i: usize| at(results, i);
    let read = |i: usize| get(i).ok();
    let mut unknown = BTreeMap::new();
    let (link_layer, why) = attribute(get(p.link_layer), parse::link_layer, |l| !matches!(l, LinkLayer::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("link_layer".to_string(), why);
    }
    let (state, why) = attribute(get(p.state), parse::port_state, |s| !matches!(s, PortState::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("state".to_string(), why);
    }
    let (phys_state, why) = attribute(get(p.phys_state), parse::phys_state, |s| !matches!(s, PhysState::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("phys_state".to_string(), why);
    }
    let mut counters = BTreeMap::new();
    let rule_paths = (plan.counter_paths.as_slice(), 0);
    finish_counters((dev, p.number), p.counters, rule_paths, (results, plan), &mut counters);
    // Read where the port may have been RoCE; kept where it is.
    let mut roce_counters = BTreeMap::new();
    let roce_paths = (plan.roce.counter_paths.as_slice(), plan.counter_paths.len());
    finish_counters((dev, p.number), p.roce_counters, roce_paths, (results, plan), &mut roce_counters);
    let roce = link_layer == Some(LinkLayer::Ethernet);
    let netdev_speed = p.speed.and_then(read).and_then(parse::netdev_speed).filter(|_| roce);
    if roce {
        counters.extend(roce_counters);
    }
    let rate = read(p.rate).and_then(parse::rate);
    if let Some(c) = plan.statics.as_deref().filter(|_| roce && plan.roce.speed) {
        c.set_rated(dev, p.number, rate.as_ref().is_some_and(|r| r.gbps > 0.0));
    }
    Port {
        number: p.number,
        link_layer,
        state,
        phys_state,
        rate,
        lid: read(p.lid).and_then(parse::hex_u32),
        sm_lid: read(p.sm_lid).and_then(parse::hex_u32),
        operstate: p.operstate.and_then(read).and_then(parse::operstate),
        carrier: p.carrier.and_then(read).and_then(parse::carrier),
        counters,
        unknown,
        ethtool: None,
        ethtool_age: None,
        netdev_speed,
    }
}

/// The sysfs-relative file of a configured counter path for port `port` of `dev`: relative
/// to the port directory, a netdev template (`{interface}`), or a device-level template
/// (`{device}`, EFA's `<dev>/hw_counters/`), which is read on port 1 only and reported
/// against it.
pub fn counter_file(dev: &str, port: u32, path: &str, netdev: Option<&str>) -> Option<String> {
    CounterFile::of(dev, port, path, netdev).map(|f| f.to_string())
}

/// [`counter_file`], not formatted yet (a poll formats it into its batch).
enum CounterFile<'a> {
    /// Under the port directory.
    Port { dev: &'a str, port: u32, path: &'a str },
    /// A sysfs-relative template with `key` replaced by `value` (none: taken as it is).
    Template { template: &'a str, key: &'static str, value: &'a str },
}

impl<'a> CounterFile<'a> {
    fn of(dev: &'a str, port: u32, path: &'a str, netdev: Option<&'a str>) -> Option<CounterFile<'a>> {
        if let Some(abs) = path.strip_prefix("/sys/") {
            if abs.contains("{interface}") {
                return netdev.map(|nd| CounterFile::Template { template: abs, key: "{interface}", value: nd });
            }
            if abs.contains("{device}") {
                return (port == 1).then_some(CounterFile::Template { template: abs, key: "{device}", value: dev });
            }
            return Some(CounterFile::Template { template: abs, key: "", value: "" });
        }
        if path.starts_with('/') || path.split('/').any(|c| c == "..") {
            return None;
        }
        Some(CounterFile::Port { dev, port, path })
    }
}

impl std::fmt::Display for CounterFile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CounterFile::Port { dev, port, path } => write!(f, "class/infiniband/{dev}/ports/{port}/{path}"),
            CounterFile::Template { template, key: "", .. } => f.write_str(template),
            CounterFile::Template { template, key, value } => {
                for (i, part) in template.split(key).enumerate() {
                    if i > 0 {
                        f.write_str(value)?;
                    }
                    f.write_str(part)?;
                }
                Ok(())
            }
        }
    }
}

/// IB devices behind a netdev: `class/net/<if>/device/infiniband/*`, following a bond's
/// `lower_*` links one level.
fn ib_devices_of_iface(host: &Host, iface: &str) -> Vec<String> {
    let mut out = host.list_sys(&format!("class/net/{iface}/device/infiniband"));
    if out.is_empty() {
        for entry in host.list_sys(&format!("class/net/{iface}")) {
            if let Some(lower) = entry.strip_prefix("lower_") {
                out.extend(host.list_sys(&format!("class/net/{lower}/device/infiniband")));
            }
        }
    }
    out
}

/// The inline PCI check of 002 §5.9 for a device missing from `class/infiniband`.
pub fn probe_pci(host: &Host, pci: &str) -> PciPresence {
    let dir = format!("bus/pci/devices/{pci}");
    if !host.resolves_sys(&dir) {
        return PciPresence::Gone;
    }
    match host.read_sys_bytes(&format!("{dir}/config"), 64) {
        Ok(bytes) if bytes.is_empty() => PciPresence::ReadError("config space read returned no bytes".into()),
        Ok(bytes) if bytes.iter().all(|b| *b == 0xff) => PciPresence::AllOnes,
        Ok(_) => PciPresence::Present,
        Err(ReadError::Missing) => PciPresence::Gone,
        Err(e) => PciPresence::ReadError(e.to_string()),
    }
}

/// A PCI function's place in the PCI tree, for the topology fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciNode {
    pub address: String,
    /// Path components below `devices/`: `["pci0000:17", "0000:17:01.0", ..., address]`.
    pub path: Vec<String>,
    pub numa_node: Option<i32>,
    /// PCI vendor of the root port above it (an NVIDIA root port: Grace's NVLink-C2C).
    pub root_port_vendor: Option<u32>,
}

/// GPUs on the PCI bus: vendor `0x10de`, class `0x0300xx` (VGA) or `0x0302xx` (3D).
pub fn pci_gpus(host: &Host) -> Vec<PciGpu> {
    host.list_sys("bus/pci/devices")
        .into_iter()
        .filter(|bdf| {
            let dir = format!("bus/pci/devices/{bdf}");
            let vendor = host.read_sys(&format!("{dir}/vendor")).ok().and_then(|v| parse::hex_u32(&v));
            let class = host.read_sys(&format!("{dir}/class")).ok().and_then(|v| parse::hex_u32(&v));
            vendor == Some(NVIDIA_VENDOR) && matches!(class.map(|c| c >> 8), Some(0x0300) | Some(0x0302))
        })
        .filter_map(|bdf| {
            let pci_address = parse::pci_address(&bdf)?;
            let numa_node =
                host.read_sys(&format!("bus/pci/devices/{bdf}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
            Some(PciGpu { pci_address, numa_node })
        })
        .collect()
}

/// A PCI function's path in the tree, below `devices/`: `bus/pci/devices/<bdf>` resolved
/// to `["pci0000:17", "0000:17:01.0", ..., "<bdf>"]` (root complex first, the function last).
pub fn pci_path(host: &Host, address: &str) -> Option<Vec<String>> {
    let rel = format!("bus/pci/devices/{address}");
    let comps = host.link_target_sys(&rel)?;
    let start = comps.iter().position(|c| c == "devices")? + 1;
    let path: Vec<String> = comps[start..].to_vec();
    (path.len() >= 2 && path.last().map(String::as_str) == Some(address)).then_some(path)
}

/// The bridge port a PCI function hangs from — the other end of its PCIe link: the parent
/// of its directory in the tree, when that is a PCI function (a root port or a switch's
/// downstream port) and not the root complex (`pci0000:17`: no link to read).
pub fn upstream_port(host: &Host, address: &str) -> Option<String> {
    let path = pci_path(host, address)?;
    let parent = &path[path.len() - 2];
    parse::pci_address(parent).map(|_| parent.clone())
}

/// Where a PCI function sits in the tree (`bus/pci/devices/<bdf>` → `devices/pci.../<bdf>`).
pub fn pci_node(host: &Host, address: &str) -> Option<PciNode> {
    let rel = format!("bus/pci/devices/{address}");
    let path = pci_path(host, address)?;
    let numa_node = host.read_sys(&format!("{rel}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
    let root_port_vendor = path
        .get(1)
        .filter(|rp| rp.as_str() != address)
        .and_then(|rp| host.read_sys(&format!("bus/pci/devices/{rp}/vendor")).ok())
        .and_then(|v| parse::hex_u32(&v));
    Some(PciNode { address: address.to_string(), path, numa_node, root_port_vendor })
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
        let plan = ReadPlan { statics: Some(cache.clone()), counter_paths: vec![path.into()], ..ReadPlan::default() };
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
        let plain = ReadPlan { counter_paths: vec![path.into()], ..ReadPlan::default() };
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
        let roce = RoceReads { counter_paths: vec![cnp.into()], speed: true };
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
        let plan = ReadPlan { statics: Some(cache.clone()), counter_paths: vec![path.into()], ..ReadPlan::default() };
        let plain = ReadPlan { counter_paths: vec![path.into()], ..ReadPlan::default() };
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
