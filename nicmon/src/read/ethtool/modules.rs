//! The transceivers of a poll's ports (SPEC §1.13): which netdevs' modules are read, when,
//! and what is said of those that cannot be. The pages themselves come from the kernel
//! ([`super::module`]) or a replay file ([`super::replay::load_module`]).
//!
//! **Which ports.** Every monitored PF's netdev, RoCE and InfiniBand alike (an IPoIB
//! netdev: mlx5's answers "not supported", see the operator guide).
//!
//! **Pace** ([`due`]). mlx5 answers every half page with an MCIA firmware command (five to
//! eight of them a module), so a netdev's module is read at most once per `[opticsCheck]
//! readInterval` (default 60 s), and at once when its port's state (`state`, `phys_state`,
//! `operstate`, `carrier`) is not what it was at the last read — so the poll that sees a
//! link go down, a wake-up's targeted poll included, has the module as it is then. In
//! between, the port gets the last reading again.
//!
//! **Not supported** (`EOPNOTSUPP`: veth, mlx5's IPoIB; a replay file without `module`) is
//! said once per netdev and asked again only at the interval, never on a targeted poll. A
//! read that failed (a deadline, no module in the cage) leaves the port without a module
//! that poll (unknown, not the old reading), is said once until a read succeeds again, and
//! is tried again at the next poll.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::EthtoolSource;
use crate::model::ethtool::Absent;
use crate::model::module::Pages;
use crate::model::{Device, OperState, PhysState, Port, PortState, Snapshot};

/// What a port looked like to nicmon: its module is read again when this changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkLook {
    pub state: Option<PortState>,
    pub phys_state: Option<PhysState>,
    pub operstate: Option<OperState>,
    pub carrier: Option<bool>,
}

impl LinkLook {
    pub fn of(p: &Port) -> LinkLook {
        LinkLook {
            state: p.state.clone(),
            phys_state: p.phys_state.clone(),
            operstate: p.operstate.clone(),
            carrier: p.carrier,
        }
    }
}

/// Whether a module last read at `last` (when its ports looked as `last` says) is read again
/// at `now`, its ports looking `look`: it never was, `interval` has passed, or a port's state
/// changed. Pure.
pub fn due(last: Option<(Instant, &[LinkLook])>, look: &[LinkLook], now: Instant, interval: Duration) -> bool {
    match last {
        None => true,
        Some((at, seen)) => seen != look || now.saturating_duration_since(at) >= interval,
    }
}

/// A netdev's last read.
struct Kept {
    /// `None`: not supported.
    pages: Option<Arc<Pages>>,
    at: Instant,
    look: Vec<LinkLook>,
}

/// Reads the modules of a poll's ports at their pace, and says once per netdev what is not
/// there.
#[derive(Default)]
pub struct ModuleReader {
    interval: Duration,
    kept: Mutex<BTreeMap<String, Kept>>,
    /// Netdevs whose absent module was said (each said once).
    said: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for ModuleReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleReader").field("interval", &self.interval).finish_non_exhaustive()
    }
}

/// Which reads a call makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// A full poll: every wanted netdev that is due.
    Full,
    /// A wake-up's targeted poll: only netdevs read before, supported, whose ports changed.
    Changed,
}

impl ModuleReader {
    /// A reader that reads a netdev's module at most once per `interval` (and on a change).
    pub fn new(interval: Duration) -> ModuleReader {
        ModuleReader { interval, ..ModuleReader::default() }
    }

    /// A full poll: the module of every PF `wanted` keeps that has a netdev, each within
    /// `timeout` when due ([`due`]), else its last reading, into its ports'
    /// [`Port::module`]. Returns the notes, each said once.
    pub fn read(
        &self,
        source: &EthtoolSource,
        snapshot: &mut Snapshot,
        wanted: impl Fn(&str) -> bool,
        timeout: impl Fn() -> Duration,
        now: Instant,
    ) -> Vec<String> {
        let notes = self.visit(source, snapshot, &|d: &Device| wanted(&d.name), Scope::Full, &timeout, now);
        let netdevs: BTreeSet<&String> = snapshot.devices.iter().filter_map(|d| d.netdev.as_ref()).collect();
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).retain(|n, _| netdevs.contains(n));
        notes
    }

    /// A wake-up's targeted poll of `devices`: the modules of those whose port state changed
    /// since their last read (read before and supported), at once; the others keep theirs.
    pub fn read_changed(
        &self,
        source: &EthtoolSource,
        snapshot: &mut Snapshot,
        devices: &[String],
        timeout: impl Fn() -> Duration,
        now: Instant,
    ) -> Vec<String> {
        self.visit(source, snapshot, &|d: &Device| devices.contains(&d.name), Scope::Changed, &timeout, now)
    }

    fn visit(
        &self,
        source: &EthtoolSource,
        snapshot: &mut Snapshot,
        pick: &dyn Fn(&Device) -> bool,
        scope: Scope,
        timeout: &dyn Fn() -> Duration,
        now: Instant,
    ) -> Vec<String> {
        let mut notes = Vec::new();
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        for d in snapshot.devices.iter_mut().filter(|d| !d.is_vf() && pick(d)) {
            let Some(netdev) = d.netdev.clone() else { continue };
            let look: Vec<LinkLook> = d.ports.iter().map(LinkLook::of).collect();
            let last = kept.get(&netdev);
            let ask = match scope {
                Scope::Full => due(last.map(|k| (k.at, k.look.as_slice())), &look, now, self.interval),
                Scope::Changed => last.is_some_and(|k| k.pages.is_some() && k.look != look),
            };
            if ask {
                match source.read_module(&netdev, timeout()) {
                    Ok(pages) => {
                        self.said.lock().unwrap_or_else(|p| p.into_inner()).remove(&netdev);
                        kept.insert(netdev.clone(), Kept { pages: Some(Arc::new(pages)), at: now, look });
                    }
                    Err(why) => {
                        notes.extend(self.note_once(&netdev, &why));
                        match why.is_unsupported() {
                            true => kept.insert(netdev.clone(), Kept { pages: None, at: now, look }),
                            false => kept.remove(&netdev),
                        };
                    }
                }
            } else if scope == Scope::Changed {
                continue; // the base's reading stands
            }
            let module = kept.get(&netdev).and_then(|k| k.pages.clone());
            for p in &mut Arc::make_mut(d).ports {
                p.module = module.clone();
            }
        }
        notes
    }

    /// The note for `netdev`'s absent module, the first time since it was last read.
    fn note_once(&self, netdev: &str, why: &Absent) -> Option<String> {
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        said.insert(netdev.to_string()).then(|| {
            format!("transceiver module of {netdev}: {why} (optics checks and probable causes see it as unknown)")
        })
    }
}

#[cfg(test)]
mod tests;
