//! Path walks between polls ([`crate::read::host`]'s `walks`): a monitor's poll walks the
//! paths of its topology — each device's `device` link (the incarnation check) and netdev
//! listing, the character-device entries — only when a sign says the topology may have
//! moved (a wake-up's hint, a kept-open file that failed, off sysfs an event on a directory
//! walked), when the device listing changed, and every [`WALK_PERIOD`]. In between, the
//! last walk's answers stand and a poll's only system calls are the reads of its kept-open
//! files — and the device listing through its kept directory where no sign answers for it
//! (on sysfs without the kernel's uevents; no path walk either way).
use super::*;
use crate::read::host::WALK_PERIOD;

/// A device's netdevs as the last walk listed them, and, where it has several, each port's
/// (its `dev_port`) as read since.
#[derive(Debug, Default)]
pub(super) struct Netdevs {
    pub(super) list: Vec<String>,
    by_port: Mutex<BTreeMap<u32, Option<String>>>,
}

impl Netdevs {
    /// The netdev of port `n` when the device has several ([`port_netdev`]), read once per
    /// walk.
    pub(super) fn of_port(&self, host: &Host, base: &str, n: u32) -> Option<String> {
        if self.list.len() < 2 {
            return None;
        }
        let Ok(mut m) = self.by_port.lock() else { return port_netdev(host, base, &self.list, n) };
        m.entry(n).or_insert_with(|| port_netdev(host, base, &self.list, n)).clone()
    }
}

impl StaticCache {
    /// Whether this poll walks: a sign moved since the last walk, or it is
    /// [`WALK_PERIOD`] old (or there was none).
    pub(super) fn walk_due(&self, host: &Host) -> bool {
        let signs = host.topology_signs();
        let Ok(mut c) = self.inner.lock() else { return true };
        let due = signs.is_none() || signs != c.walk.signs || c.walk.at.is_none_or(|t| t.elapsed() >= WALK_PERIOD);
        if due {
            c.walk = Walked { signs, at: Some(Instant::now()) };
        }
        due
    }

    fn kept_netdevs(&self, device: &str) -> Option<Arc<Netdevs>> {
        self.inner.lock().ok()?.netdevs.get(device).cloned()
    }

    fn keep_netdevs(&self, device: &str, netdevs: Arc<Netdevs>) {
        if let Ok(mut c) = self.inner.lock() {
            c.netdevs.insert(device.to_string(), netdevs);
            c.plan = None;
        }
    }
}

/// The interfaces that carry a default route and the IB devices behind them, as a walk
/// read them (`<procfs>/net/route` and each interface's `device/infiniband`).
pub(super) type Route = (Vec<String>, Vec<String>);

impl StaticCache {
    /// The default route: read on a walk (and watched, off procfs, for writes: a fixture's
    /// route file rewritten is a sign), else as the last walk read it. A route that moves
    /// to another interface without a sign is seen by the next walk (at most
    /// [`WALK_PERIOD`] later).
    pub(super) fn route(&self, host: &Host, walk: bool) -> Route {
        if !walk && let Some(r) = self.inner.lock().ok().and_then(|c| c.route.clone()) {
            return r;
        }
        let r = default_route(host);
        host.watch_proc_writes("net");
        if let Ok(mut c) = self.inner.lock() {
            c.route = Some(r.clone());
        }
        r
    }
}

/// When the last walk was, and the signs it saw ([`Host::topology_signs`]).
#[derive(Debug, Default)]
pub(super) struct Walked {
    signs: Option<u64>,
    at: Option<Instant>,
}

/// The netdevs of device `name` (`base`: its class directory): as the last walk listed
/// them unless this poll walks (`walk`); a walk lists them and (with a static cache, off
/// sysfs) watches the directories it went through.
pub(super) fn netdevs(
    host: &Host,
    name: &str,
    base: &str,
    statics: &Statics,
    plan: &ReadPlan,
    walk: bool,
) -> Arc<Netdevs> {
    if !walk && let Some(n) = plan.statics.as_ref().and_then(|c| c.kept_netdevs(name)) {
        return n;
    }
    let list = match &statics.dir {
        Some(dir) => host.list_in(dir, "device/net"),
        None => host.list_sys(&format!("{base}/device/net")),
    };
    let n = Arc::new(Netdevs { list, by_port: Mutex::default() });
    if let Some(cache) = &plan.statics {
        for rel in [base.to_string(), format!("{base}/device"), format!("{base}/device/net")] {
            host.watch_dir_sys(&rel);
        }
        cache.keep_netdevs(name, n.clone());
    }
    n
}
