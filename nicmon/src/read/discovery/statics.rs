//! The static attributes of each device incarnation, read once and kept between polls
//! ([`StaticCache`]): what cannot change while a device exists (PCI identity, driver,
//! firmware, ports, link layers, PCIe maxima), re-read when the device set changes, the
//! device's PCI identity differs, a wake-up names it, or every [`STATIC_REFRESH`].
use super::*;

/// How long the static attributes of a device are trusted without a re-read.
pub const STATIC_REFRESH: Duration = Duration::from_secs(60);

/// The attributes of an RDMA device that cannot change while it exists: its PCI identity,
/// driver, vendor, function kind, NUMA node, HCA type, firmware version, board id and its
/// ports (a device's ports are fixed when it registers).
#[derive(Debug, Clone)]
pub(super) struct Statics {
    /// The port numbers listed under `ports/`. Empty: listed again on every poll (a device
    /// caught registering, before its ports appeared, is not remembered without ports).
    pub(super) ports: Vec<u32>,
    /// The `device` link's target name when read: a different one is a new incarnation.
    pub(super) link: Option<String>,
    pub(super) pci_address: Option<String>,
    pub(super) driver: Option<String>,
    pub(super) vendor: Option<u32>,
    /// The RDMA driver recognised from the above ([`super::driver::recognise`]).
    pub(super) rdma_driver: Option<crate::model::driver::RdmaDriver>,
    /// rxe's `parent` attribute: the netdev a software device rides on (it has no
    /// `device/net`).
    pub(super) parent: Option<String>,
    pub(super) function: Function,
    /// The value (`-1` included), and why it is unknown when it is.
    pub(super) numa_node: (Option<i32>, Option<String>),
    pub(super) hca_type: Option<String>,
    pub(super) fw_ver: Option<String>,
    pub(super) board_id: Option<String>,
    /// The PCIe maxima of a PF's link, both ends (`None` for a VF or without a PCI address).
    pub(super) pcie: Option<PcieStatics>,
    /// The link layer of each listed port that read InfiniBand or Ethernet (fixed when the
    /// device registers, like its ports): which ports are RoCE ([`RoceReads`]).
    pub(super) link_layers: BTreeMap<u32, LinkLayer>,
    pub(super) read_at: Instant,
    /// The device's directory, kept open: the per-poll `device` link and netdev listing
    /// are looked up in it. Once the device is removed every lookup in it fails, which
    /// makes the next poll read the device afresh (a new incarnation under the same name).
    pub(super) dir: Option<SysDir>,
}

/// The PCIe attributes of a PF that are fixed by the hardware (SPEC §1.10): its maxima and
/// the upstream bridge port's (the other end of its link).
#[derive(Debug, Clone)]
pub(super) struct PcieStatics {
    pub(super) own: LinkMaxima,
    /// The upstream port's address and its maxima; `None`: the PF hangs from no PCI bridge.
    pub(super) upstream: Option<(String, LinkMaxima)>,
}

/// `max_link_speed` and `max_link_width` of one PCI function, as read.
#[derive(Debug, Clone)]
pub(super) struct LinkMaxima {
    pub(super) speed: Result<String, ReadError>,
    pub(super) width: Result<String, ReadError>,
}

impl LinkMaxima {
    pub(super) fn read(host: &Host, address: &str) -> LinkMaxima {
        let max = |f: &str| host.read_sys(&format!("bus/pci/devices/{address}/{f}"));
        LinkMaxima { speed: max("max_link_speed"), width: max("max_link_width") }
    }

    /// The link figures with these maxima and the current figures read now.
    pub(super) fn link(&self, speed: Option<&str>, width: Option<&str>) -> PcieLink {
        PcieLink::from_texts(speed, width, self.speed.as_deref().ok(), self.width.as_deref().ok())
    }
}

impl PcieStatics {
    pub(super) fn read(host: &Host, address: &str) -> PcieStatics {
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
    pub(super) inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
pub(super) struct CacheInner {
    /// The device listing (`class/infiniband`) the entries were read under.
    pub(super) listing: Listing,
    pub(super) by_device: BTreeMap<String, Arc<Statics>>,
    /// Per device: files found absent (`ENOENT`) in this incarnation, not tried again until
    /// the device's static attributes are read again.
    pub(super) absent: BTreeMap<String, Absent>,
    /// Per device: the ports whose `rate` gave a rate at the last poll in this incarnation.
    /// Their netdev's `speed` ([`RoceReads::speed`]) is not read: it only stands in for a
    /// missing rate, and each read of it costs mlx5 a firmware command.
    pub(super) rated: BTreeMap<String, std::collections::BTreeSet<u32>>,
    /// Static attribute sets read so far (one per device read from the host).
    pub(super) reads: u64,
    /// The per-poll files of the last full poll (its devices' and the character devices'):
    /// the next full poll has the reader read them while it lists the devices (they are the
    /// same files unless a device, port, netdev or character device came or went).
    pub(super) last_batch: Option<Arc<FileSet>>,
    /// The unmonitored devices as read once in their incarnation ([`unmonitored`]).
    pub(super) frozen: Frozen,
    /// The character-device class directories as the last full poll listed and read them.
    pub(super) chars: chars::Kept,
    /// Per device: its netdevs as the last walk listed them ([`walk`]).
    pub(super) netdevs: BTreeMap<String, Arc<walk::Netdevs>>,
    /// The last walk ([`walk`]).
    pub(super) walk: walk::Walked,
    /// The default route as the last walk read it ([`walk::Route`]).
    pub(super) route: Option<walk::Route>,
    /// The last full poll's plan of its devices, while it stands ([`kept_plan`]).
    pub(super) plan: Option<kept_plan::KeptPlan>,
    /// The device listing as targeted reads list it ([`StaticCache::listed_now`]), apart
    /// from the full polls' (`listing`, whose changes drop what is kept).
    pub(super) targeted_listing: Listing,
}

impl CacheInner {
    /// The names of the last device listing.
    pub(super) fn names(&self) -> &[String] {
        self.listing.names().map(|n| &**n).unwrap_or(&[])
    }

    /// Where `device` is in the last device listing.
    pub(super) fn position(&self, device: &str) -> Option<usize> {
        self.names().binary_search_by(|n| n.as_str().cmp(device)).ok()
    }

    /// Forget everything about `device` but its presence.
    pub(super) fn forget(&mut self, device: &str) {
        self.plan = None;
        self.by_device.remove(device);
        self.netdevs.remove(device);
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
    pub(super) fn is_absent(&self, device: &str, rel: &str) -> bool {
        self.inner.lock().map(|c| c.absent.get(device).is_some_and(|a| a.files.contains(rel))).unwrap_or(false)
    }

    /// Whether counter `k` of the plan was found absent on port `port` of `device` in this
    /// incarnation.
    pub(super) fn is_counter_absent(&self, device: &str, port: u32, k: usize) -> bool {
        let absent = |c: &CacheInner| c.absent.get(device).is_some_and(|a| a.counters.contains(&(port, k)));
        self.inner.lock().map(|c| absent(&c)).unwrap_or(false)
    }

    pub(super) fn mark_absent(&self, device: &str, file: AbsentFile<'_>) {
        if let Ok(mut c) = self.inner.lock()
            && c.by_device.contains_key(device)
        {
            let a = c.absent.entry(device.to_string()).or_default();
            let new = match file {
                AbsentFile::Counter(port, k) => a.counters.insert((port, k)),
                AbsentFile::File(rel) => a.files.insert(rel.to_string()),
            };
            if new {
                // The next plan leaves the file out.
                c.plan = None;
            }
        }
    }

    /// Whether `port` of `device` gave a rate at its last poll in this incarnation.
    pub(super) fn is_rated(&self, device: &str, port: u32) -> bool {
        self.inner.lock().map(|c| c.rated.get(device).is_some_and(|r| r.contains(&port))).unwrap_or(false)
    }

    pub(super) fn set_rated(&self, device: &str, port: u32, rated: bool) {
        if let Ok(mut c) = self.inner.lock()
            && c.by_device.contains_key(device)
        {
            let ports = c.rated.entry(device.to_string()).or_default();
            let changed = if rated { ports.insert(port) } else { ports.remove(&port) };
            if changed {
                // The next plan reads the netdev's speed, or stops reading it.
                c.plan = None;
            }
        }
    }

    pub(super) fn last_batch(&self) -> Option<Arc<FileSet>> {
        self.inner.lock().ok()?.last_batch.clone()
    }

    pub(super) fn clear_last_batch(&self) {
        if let Ok(mut c) = self.inner.lock() {
            c.last_batch = None;
            c.plan = None;
        }
    }

    pub(super) fn set_last_batch(&self, files: Arc<FileSet>) {
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
    /// Between walks (`walk` false) through the directory as last opened, or not at all
    /// while the signs answer for it ([`Host::listing_stands`]).
    pub(super) fn relist(&self, host: &Host, walk: bool) -> (Arc<[String]>, bool) {
        let Ok(mut c) = self.inner.lock() else { return (host.list_sys(DEVICES).into(), true) };
        let mut listing = std::mem::take(&mut c.listing);
        let changed = if walk {
            host.watch_dir_sys("class");
            host.watch_dir_sys(DEVICES);
            host.relist_sys(DEVICES, &mut listing)
        } else if listing.names().is_ok() && host.listing_stands(DEVICES) {
            // The signs answer for it (see `walk`): not read again.
            false
        } else {
            host.relist_sys_kept(DEVICES, &mut listing)
        };
        c.listing = listing;
        let names: Arc<[String]> = c.listing.names().cloned().unwrap_or_else(|_| Arc::from([]));
        if changed {
            c.plan = None;
            c.by_device.clear();
            c.netdevs.clear();
            c.absent.clear();
            c.rated.clear();
            c.frozen.reset(names.len());
        }
        (names, changed)
    }

    /// Whether the device listing as the host has it now passes `check` (a targeted read:
    /// the same devices as its base), listed through the directory kept open for it.
    pub(super) fn listed_now(&self, host: &Host, check: impl Fn(&[String]) -> bool) -> bool {
        let Ok(mut c) = self.inner.lock() else { return check(&host.list_sys(DEVICES)) };
        host.relist_sys_kept(DEVICES, &mut c.targeted_listing);
        c.targeted_listing.names().is_ok_and(|n| check(n))
    }

    /// `device`'s static attributes as kept, if they are less than [`STATIC_REFRESH`] old.
    pub(super) fn get(&self, device: &str, now: Instant) -> Option<Arc<Statics>> {
        let c = self.inner.lock().ok()?;
        c.by_device.get(device).filter(|s| now.duration_since(s.read_at) < STATIC_REFRESH).cloned()
    }

    pub(super) fn put(&self, device: &str, statics: Arc<Statics>) {
        if let Ok(mut c) = self.inner.lock() {
            c.forget(device);
            c.reads += 1;
            c.by_device.insert(device.to_string(), statics);
        }
    }

    /// Drop the frozen readings `judge` says are monitored now ([`unmonitored`]).
    pub(super) fn thaw_monitored(&self, judge: Unmonitored<'_>, route: &[String]) {
        if let Ok(mut c) = self.inner.lock() {
            c.frozen.thaw_monitored(judge, route);
        }
    }

    /// The frozen readings by position in the device listing.
    pub(super) fn frozen(&self) -> Vec<Option<Arc<Device>>> {
        self.inner.lock().map(|c| c.frozen.all()).unwrap_or_default()
    }

    /// `device`'s frozen reading, unless `judge` says it is monitored now.
    pub(super) fn frozen_named(&self, device: &str, judge: Unmonitored<'_>, route: &[String]) -> Option<Arc<Device>> {
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
    pub(super) fn freeze(&self, device: Arc<Device>) {
        if let Ok(mut c) = self.inner.lock()
            && let Some(i) = c.position(&device.name)
        {
            c.plan = None;
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
pub(super) struct Absent {
    pub(super) counters: std::collections::BTreeSet<(u32, usize)>,
    pub(super) files: std::collections::BTreeSet<String>,
}

/// A file found absent ([`Absent`]).
pub(super) enum AbsentFile<'a> {
    Counter(u32, usize),
    File(&'a str),
}

/// Read the static attributes of device `name` (see [`StaticCache`]).
pub(super) fn read_statics(host: &Host, base: &str, link: Option<String>) -> Statics {
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
    let driver = host.link_name_sys(&format!("{base}/device/driver"));
    let vendor = host.read_sys(&format!("{base}/device/vendor")).ok().and_then(|v| parse::hex_u32(&v));
    // No `device` link: no PCI function (rxe, siw). Only then are `parent` and `node_type`
    // read (a hardware device's reads stay what they were).
    let virtual_device = link.is_none();
    let (parent, node_type) = match virtual_device {
        true => (opt(host.read_sys(&format!("{base}/parent"))), opt(host.read_sys(&format!("{base}/node_type")))),
        false => (None, None),
    };
    let name = base.rsplit('/').next().unwrap_or(base);
    let identity = super::driver::Identity {
        pci_driver: driver.as_deref(),
        vendor,
        virtual_device,
        parent: parent.as_deref(),
        node_type: node_type.as_deref(),
    };
    let rdma_driver = super::driver::recognise(name, &identity);
    Statics {
        ports,
        link_layers,
        link,
        pci_address,
        driver,
        vendor,
        rdma_driver,
        parent,
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
