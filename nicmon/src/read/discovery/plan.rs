//! One poll's read of the devices: each device's per-poll files planned into one
//! [`Batch`] (read together, one hand-off to the reader thread), then each device, port,
//! counter and PCIe reading finished from the batch's results.
use super::*;
use crate::model::driver::RdmaDriver;

pub(super) fn opt<S: AsRef<str>>(r: Result<S, ReadError>) -> Option<String> {
    r.ok().and_then(|s| parse::text(s.as_ref()).map(str::to_string))
}

/// An attribute read and parsed, or why it is unknown: the read failed, it was empty, or
/// `known` says the parsed value is not one nicmon can judge (an `Unknown` variant).
pub(super) fn attribute<T, S: AsRef<str>>(
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
pub(super) fn clip(t: &str) -> String {
    let mut out: String = t.chars().take(64).collect();
    if out.len() < t.len() {
        out.push('…');
    }
    out
}

/// The files of one read, read together ([`Host::read_files`]): one hand-off to the reader
/// thread for all of them. Built against the last poll's files: while each file added is
/// the one at the same place there, nothing is allocated, and when all are, the last poll's
/// [`FileSet`] itself is read again (so a read begun ahead on it is this poll's read).
#[derive(Default)]
pub(super) struct Batch {
    pub(super) prev: Option<Arc<FileSet>>,
    /// Files added so far.
    pub(super) len: usize,
    /// Every file added, once one differed from `prev`'s (`None` while they are the same).
    pub(super) rels: Option<Rels>,
    pub(super) scratch: String,
    /// The files added that are read once, not kept open (by index, ascending).
    pub(super) once: Vec<usize>,
    /// Whether the files added now are read once ([`Batch::read_once`]).
    pub(super) reading_once: bool,
}

impl Batch {
    pub(super) fn against(prev: Option<Arc<FileSet>>) -> Batch {
        Batch { prev, ..Batch::default() }
    }

    /// Add a file; its index in the results.
    pub(super) fn add(&mut self, rel: std::fmt::Arguments<'_>) -> usize {
        self.add_unless(rel, |_| false).unwrap_or_default()
    }

    /// The files added from now on are read once, not kept open (`once`), or kept open as
    /// the batch's files are (see [`Batch::finish`]).
    pub(super) fn read_once(&mut self, once: bool) {
        self.reading_once = once;
    }

    /// Add a file unless `skip` says so (given its path); its index in the results.
    pub(super) fn add_unless(
        &mut self,
        rel: std::fmt::Arguments<'_>,
        skip: impl FnOnce(&str) -> bool,
    ) -> Option<usize> {
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
    pub(super) fn finish(self, host: &Host, keep: bool) -> Arc<FileSet> {
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
    pub(super) fn is_prev(&self, keep: bool) -> bool {
        let kept = |i: usize| keep && self.once.binary_search(&i).is_err();
        self.rels.is_none()
            && self.prev.as_ref().is_some_and(|p| p.len() == self.len && (0..p.len()).all(|i| p.kept(i) == kept(i)))
    }
}

/// A device's read before its per-poll files are read: its static attributes, listings,
/// and where each port's files are in the [`Batch`].
#[derive(Clone)]
pub(super) struct DeviceRead {
    pub(super) name: String,
    pub(super) statics: Arc<Statics>,
    pub(super) efa: bool,
    pub(super) unsupported: Option<String>,
    pub(super) netdev: Option<String>,
    pub(super) ports: Vec<PortRead>,
    pub(super) pcie: Option<PcieRead>,
}

/// Where a PF's per-poll PCIe files are in the [`Batch`]: `current_link_speed`,
/// `current_link_width`, and the AER files not found absent in this incarnation.
#[derive(Clone)]
pub(super) struct PcieRead {
    pub(super) speed: usize,
    pub(super) width: usize,
    pub(super) aer: Vec<(AerSeverity, usize)>,
}

/// Where one port's files are in the [`Batch`].
#[derive(Clone)]
pub(super) struct PortRead {
    pub(super) number: u32,
    /// The `link_layer` file's index, or the link layer the device's static attributes
    /// read ([`super::Statics::link_layers`]: fixed while the device exists, not read again).
    pub(super) link_layer: Result<usize, LinkLayer>,
    pub(super) state: usize,
    pub(super) phys_state: usize,
    pub(super) rate: usize,
    pub(super) lid: usize,
    pub(super) sm_lid: usize,
    pub(super) operstate: Option<usize>,
    pub(super) carrier: Option<usize>,
    /// (index of the configured path in the plan, index of the file)
    pub(super) counters: Vec<(usize, usize)>,
    /// The same for [`RoceReads::counter_paths`], and the netdev's `speed`: read on a port
    /// that may be RoCE, kept on one that is.
    pub(super) roce_counters: Vec<(usize, usize)>,
    pub(super) speed: Option<usize>,
}

impl DeviceRead {
    /// Every place in the batch this device's reading is finished from
    /// ([`finish_device`]): what a kept plan compares to reuse the last reading
    /// ([`super::kept_plan::Finished`]).
    pub(super) fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        // Destructured so that a field added to either read is seen here.
        let DeviceRead { name: _, statics: _, efa: _, unsupported: _, netdev: _, ports, pcie } = self;
        let pcie = pcie
            .iter()
            .flat_map(|PcieRead { speed, width, aer }| [*speed, *width].into_iter().chain(aer.iter().map(|&(_, i)| i)));
        pcie.chain(ports.iter().flat_map(PortRead::indices))
    }
}

impl PortRead {
    fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        let PortRead {
            number: _,
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
        } = self;
        [*state, *phys_state, *rate, *lid, *sm_lid]
            .into_iter()
            .chain(link_layer.as_ref().ok().copied())
            .chain(*operstate)
            .chain(*carrier)
            .chain(*speed)
            .chain(counters.iter().chain(roce_counters).map(|&(_, i)| i))
    }
}

/// What a monitored port reads beyond its fixed files: the plan's counters and, on a port
/// that may be RoCE, the plan's [`RoceReads`].
#[derive(Clone, Copy)]
pub(super) struct PortPlan<'p> {
    pub(super) plan: &'p ReadPlan<'p>,
    pub(super) roce: bool,
    /// The device's RDMA driver: only the counter paths of its driver are read.
    pub(super) driver: Option<RdmaDriver>,
}

/// Files read ahead: begun before the listings, under the kept-file generation then.
pub(super) struct Prefetch {
    pub(super) generation: u64,
    pub(super) reads: PendingReads,
}

/// The results of `files`: `prefetch`'s when it read exactly these files and no kept file
/// was forgotten since it began (a device's new incarnation); otherwise read now.
pub(super) fn read_batch(host: &Host, files: &Arc<FileSet>, prefetch: Option<Prefetch>) -> Texts {
    match prefetch {
        Some(p) if Arc::ptr_eq(p.reads.files(), files) && host.kept_generation() == p.generation => {
            host.stats.read_ahead_used.fetch_add(1, Ordering::Relaxed);
            host.finish_files(p.reads)
        }
        other => {
            drop_prefetch(host, other);
            if files.is_empty() { Texts::default() } else { host.read_files_patient(files) }
        }
    }
}

/// Files read ahead and not used: collected (the reader must be free for the poll's batch)
/// and dropped.
pub(super) fn drop_prefetch(host: &Host, prefetch: Option<Prefetch>) {
    if let Some(p) = prefetch {
        host.finish_files(p.reads);
        host.stats.read_ahead_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// The port numbers under `<base>/ports`, in listing order.
pub(super) fn list_ports(host: &Host, base: &str) -> Vec<u32> {
    host.list_sys(&format!("{base}/ports")).into_iter().filter_map(|p| p.parse::<u32>().ok()).collect()
}

/// A device of a poll before its per-poll files are read.
#[derive(Clone)]
pub(super) enum Planned {
    /// Its frozen reading: nothing of it is read ([`unmonitored`]).
    Frozen(Arc<Device>),
    Read(DeviceRead),
}

/// Plan device `name` (a targeted read): its frozen reading while it has one, else its read
/// (`walk`: its incarnation checked and its netdevs listed again, see [`read_device`]).
pub(super) fn plan_device(
    host: &Host,
    name: &str,
    plan: &ReadPlan,
    (route, walk): (&[String], bool),
    batch: &mut Batch,
) -> Planned {
    if let (Some(cache), Some(judge)) = (&plan.statics, plan.unmonitored)
        && let Some(d) = cache.frozen_named(name, judge, route)
    {
        return Planned::Frozen(d);
    }
    Planned::Read(read_device(host, name, plan, walk, batch))
}

/// Plan the read of a device: its static attributes (kept or read now), its listings, and
/// its per-poll files into `batch`. Between walks (`walk` false, [`super::walk`]) the kept
/// attributes and listings stand without a look at the device's paths.
pub(super) fn read_device(host: &Host, name: &str, plan: &ReadPlan, walk: bool, batch: &mut Batch) -> DeviceRead {
    let base = format!("class/infiniband/{name}");
    let link_by_path = || host.link_name_sys(&format!("{base}/device"));
    // The incarnation check: the `device` link read again, in the kept directory when there
    // is one (a removed directory answers nothing there: a new incarnation).
    let kept = plan.statics.as_ref().and_then(|c| c.get(name, Instant::now())).filter(|s| {
        if !walk {
            return true;
        }
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
    let efa = statics.rdma_driver == Some(RdmaDriver::Efa);
    let unsupported = statics.rdma_driver.is_none().then(|| {
        format!(
            "RDMA driver not recognised (PCI driver {}, PCI vendor {}): list it in nicInclusionRegexOverride to \
             monitor it",
            statics.driver.as_deref().unwrap_or("unknown"),
            statics.vendor.map(|v| format!("{v:#06x}")).unwrap_or_else(|| "unknown".into())
        )
    });

    let netdevs = super::walk::netdevs(host, name, &base, &statics, plan, walk || fresh);
    // A software device has no `device/net`: its netdev is rxe's `parent`.
    let netdev = netdevs.list.first().cloned().or_else(|| statics.parent.clone());
    if fresh {
        // A new incarnation (or the periodic re-read): its kept-open files are opened again.
        host.forget_kept(Some(&base));
        for nd in &netdevs.list {
            host.forget_kept(Some(&format!("class/net/{nd}")));
        }
        if let Some(address) = &statics.pci_address {
            host.forget_kept(Some(&format!("bus/pci/devices/{address}")));
        }
    }

    // VFs are listed, not monitored: their ports' states are read for the report, but no
    // counters. A device of an unrecognised driver is read whole: `nicInclusionRegexOverride`
    // may bring it in (a monitor reads an unmonitored one once per incarnation).
    let read_counters = statics.function != Function::Vf;
    let numbers = if statics.ports.is_empty() { list_ports(host, &base) } else { statics.ports.clone() };
    // Their files are not kept open: a monitor reads such a device once per incarnation
    // ([`unmonitored`]).
    batch.read_once(!read_counters);
    let ports = numbers
        .into_iter()
        .map(|n| {
            let port_netdev = netdevs.of_port(host, &base, n).or_else(|| netdev.clone());
            let roce = !efa && statics.link_layers.get(&n).is_none_or(|l| *l == LinkLayer::Ethernet);
            let driver = statics.rdma_driver;
            let reads = (read_counters && !plan.link_only).then_some(PortPlan { plan, roce, driver });
            let known = statics.link_layers.get(&n).cloned();
            plan_port(name, (n, known), port_netdev.as_deref(), reads, batch)
        })
        .collect();
    batch.read_once(false);
    let pcie = (read_counters && !plan.link_only).then(|| plan_pcie(name, &statics, plan, batch)).flatten();
    DeviceRead { name: name.to_string(), statics, efa, unsupported, netdev, ports, pcie }
}

/// The per-poll PCIe files of a monitored PF, added to `batch`.
pub(super) fn plan_pcie(dev: &str, statics: &Statics, plan: &ReadPlan, batch: &mut Batch) -> Option<PcieRead> {
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
pub(super) fn finish_pcie(
    dev: &str,
    statics: &Statics,
    p: &PcieRead,
    results: &Texts,
    files: &FileSet,
    plan: &ReadPlan,
) -> Option<PcieReading> {
    let st = statics.pcie.as_ref()?;
    let get = |i: usize| results.get(i).and_then(Result::ok);
    let link = st.own.link(get(p.speed), get(p.width));
    let upstream = st
        .upstream
        .as_ref()
        .map(|(address, max)| UpstreamPort { address: address.clone(), link: max.link(None, None) });
    let mut aer = Aer::default();
    for &(s, i) in &p.aer {
        let raw = results.get(i);
        if let (Some(Err(ReadError::Missing)), Some(c), Some(rel)) = (raw, plan.statics.as_deref(), files.rel(i)) {
            c.mark_absent(dev, AbsentFile::File(&rel));
        }
        *aer.slot(s) = raw.and_then(|r| aer_file(r, s));
    }
    Some(PcieReading { link, upstream, aer })
}

pub(super) fn finish_device(r: &DeviceRead, results: &Texts, files: &FileSet, plan: &ReadPlan) -> Device {
    let DeviceRead { name, statics, efa, unsupported, netdev, ports, pcie } = r;
    let pcie = pcie.as_ref().and_then(|p| finish_pcie(name, statics, p, results, files, plan));
    let Statics { pci_address, driver, rdma_driver, function, numa_node, hca_type, fw_ver, board_id, .. } = &**statics;
    let (pci_address, driver, function, numa_node) =
        (pci_address.clone(), driver.clone(), *function, numa_node.clone());
    let (hca_type, fw_ver, board_id) = (hca_type.clone(), fw_ver.clone(), board_id.clone());
    let card = pci_address.as_deref().and_then(parse::card_of);
    let ports = ports
        .iter()
        .map(|p| {
            let mut port = finish_port(name, p, results, plan);
            if *efa {
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
        name: name.clone(),
        unsupported: unsupported.clone(),
        pci_address,
        card,
        numa_node: numa_node.filter(|n| *n >= 0),
        hca_type,
        fw_ver,
        board_id,
        driver,
        rdma_driver: *rdma_driver,
        function,
        netdev: netdev.clone(),
        ports,
        unknown,
        pcie,
    }
}

/// The netdev of port `n` when a device has several: the one whose `dev_port` is `n - 1`.
pub(super) fn port_netdev(host: &Host, base: &str, netdevs: &[String], n: u32) -> Option<String> {
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

/// The files of port `n` that every poll reads, added to `batch`; `known`: its link layer
/// as the device's static attributes read it (then its file is not read).
pub(super) fn plan_port(
    dev: &str,
    (n, known): (u32, Option<LinkLayer>),
    netdev: Option<&str>,
    reads: Option<PortPlan<'_>>,
    batch: &mut Batch,
) -> PortRead {
    let mut file = |f: &str| batch.add(format_args!("class/infiniband/{dev}/ports/{n}/{f}"));
    let link_layer = match known {
        Some(l) => Err(l),
        None => Ok(file("link_layer")),
    };
    let (state, phys_state, rate, lid, sm_lid) =
        (file("state"), file("phys_state"), file("rate"), file("lid"), file("sm_lid"));
    let operstate = netdev.map(|nd| batch.add(format_args!("class/net/{nd}/operstate")));
    let carrier = netdev.map(|nd| batch.add(format_args!("class/net/{nd}/carrier")));
    let (mut counters, mut roce_counters, mut speed) = (Vec::new(), Vec::new(), None);
    if let Some(PortPlan { plan, roce, driver }) = reads {
        let cache = plan.statics.as_deref();
        let own = |k: usize| plan.counter_drivers.get(k).is_none_or(|d| d.covers(driver));
        counters = plan_counters((dev, n, netdev), &plan.counter_paths, (0, &own), cache, batch);
        if roce {
            let base = plan.counter_paths.len();
            roce_counters = plan_counters((dev, n, netdev), &plan.roce.counter_paths, (base, &|_| true), cache, batch);
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

/// The counter files of `paths` on port `n` of `dev` (netdev `netdev`) that `read` says the
/// device reads (its driver's), added to `batch` unless found absent in this incarnation:
/// (index in `paths`, index of the file). A counter is remembered absent by (port, `base` +
/// its index): the rules' paths come first, the RoCE reads' after them.
pub(super) fn plan_counters(
    (dev, n, netdev): (&str, u32, Option<&str>),
    paths: &[Arc<str>],
    (base, read): (usize, &dyn Fn(usize) -> bool),
    cache: Option<&StaticCache>,
    batch: &mut Batch,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (k, path) in paths.iter().enumerate().filter(|(k, _)| read(*k)) {
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
pub(super) fn finish_counters(
    (dev, n): (&str, u32),
    planned: &[(usize, usize)],
    (paths, base): (&[Arc<str>], usize),
    (results, plan): (&Texts, &ReadPlan),
    out: &mut BTreeMap<Arc<str>, u64>,
) {
    for &(k, i) in planned {
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

pub(super) fn finish_port(dev: &str, p: &PortRead, results: &Texts, plan: &ReadPlan) -> Port {
    let get = |i: usize| results.text(i);
    let read = |i: usize| get(i).ok();
    let mut unknown = BTreeMap::new();
    let link_layer = match &p.link_layer {
        Ok(i) => {
            let (l, why) = attribute(get(*i), parse::link_layer, |l| !matches!(l, LinkLayer::Unknown(_)));
            if let Some(why) = why {
                unknown.insert("link_layer".to_string(), why);
            }
            l
        }
        Err(known) => Some(known.clone()),
    };
    let (state, why) = attribute(get(p.state), parse::port_state, |s| !matches!(s, PortState::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("state".to_string(), why);
    }
    let (phys_state, why) = attribute(get(p.phys_state), parse::phys_state, |s| !matches!(s, PhysState::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("phys_state".to_string(), why);
    }
    let mut counters = BTreeMap::new();
    let rule_paths = (&plan.counter_paths[..], 0);
    finish_counters((dev, p.number), &p.counters, rule_paths, (results, plan), &mut counters);
    // Read where the port may have been RoCE; kept where it is.
    let mut roce_counters = BTreeMap::new();
    let roce_paths = (&plan.roce.counter_paths[..], plan.counter_paths.len());
    finish_counters((dev, p.number), &p.roce_counters, roce_paths, (results, plan), &mut roce_counters);
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
        module: None,
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
pub(super) enum CounterFile<'a> {
    /// Under the port directory.
    Port { dev: &'a str, port: u32, path: &'a str },
    /// A sysfs-relative template with `key` replaced by `value` (none: taken as it is).
    Template { template: &'a str, key: &'static str, value: &'a str },
}

impl<'a> CounterFile<'a> {
    pub(super) fn of(dev: &'a str, port: u32, path: &'a str, netdev: Option<&'a str>) -> Option<CounterFile<'a>> {
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
