//! Unmonitored functions (SR-IOV VFs, management NICs, excluded and unsupported devices):
//! read whole once per incarnation, then only looked for in the device listing.
//!
//! A device the plan's [`Unmonitored`] judgement says is not monitored, read with its
//! ports' link layers known, is kept as it was read (its *frozen* reading), and so are the
//! character-device class entries that name it (`umadN` → its `ibdev` and `port`). Later
//! polls serve both from here without a read: no `device` link, netdev listing, port or
//! class-entry file of it is read, and no file of it is kept open. The reading is dropped,
//! and the device read again, when the device listing changes (a device came or went:
//! every reading), on [`super::StaticCache::invalidate`] (a wake-up naming it), and on the
//! poll where the judgement says it is monitored (a default route that moved off a
//! management NIC): that poll reads it as any monitored device. The judgement is asked
//! again on every poll (it is pure and allocates little: no file is read for it).
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{CharDevices, ClassDir, Device};

/// Whether a device is not monitored, judged from the device as read and the devices
/// behind the host's default route now (the role classification's inputs).
pub type Unmonitored<'a> = &'a dyn Fn(&Device, &[String]) -> bool;

/// The frozen readings of the unmonitored devices.
#[derive(Debug, Default)]
pub(super) struct Frozen {
    /// By position in the device listing (valid while it is unchanged: a new listing drops
    /// every reading).
    devices: Vec<Option<Arc<Device>>>,
    /// The class entries naming a frozen device, per class directory (`infiniband_verbs`,
    /// `infiniband_mad`): entry name → its `ibdev` and `port` as read.
    chars: [BTreeMap<String, CharEntry>; 2],
    /// Changes whenever `chars` does.
    generation: u64,
}

/// A class entry's attributes as read: its device and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CharEntry {
    pub(super) device: Option<String>,
    pub(super) port: Option<u32>,
}

impl Frozen {
    /// A new device listing of `n` devices: nothing frozen.
    pub(super) fn reset(&mut self, n: usize) {
        self.devices = vec![None; n];
        self.chars.iter_mut().for_each(BTreeMap::clear);
        self.generation += 1;
    }

    /// Drop the reading at position `i` and the class entries naming it.
    pub(super) fn thaw(&mut self, i: usize) {
        let Some(d) = self.devices.get_mut(i).and_then(Option::take) else { return };
        for dir in &mut self.chars {
            dir.retain(|_, e| e.device.as_deref() != Some(d.name.as_str()));
        }
        self.generation += 1;
    }

    pub(super) fn freeze(&mut self, i: usize, device: Arc<Device>) {
        if let Some(slot) = self.devices.get_mut(i) {
            *slot = Some(device);
        }
    }

    pub(super) fn get(&self, i: usize) -> Option<Arc<Device>> {
        self.devices.get(i).cloned().flatten()
    }

    /// Drop the readings `judge` says are monitored now.
    pub(super) fn thaw_monitored(&mut self, judge: Unmonitored<'_>, route: &[String]) {
        for i in 0..self.devices.len() {
            if self.devices[i].as_deref().is_some_and(|d| !judge(d, route)) {
                self.thaw(i);
            }
        }
    }

    /// The readings by position.
    pub(super) fn all(&self) -> Vec<Option<Arc<Device>>> {
        self.devices.clone()
    }

    /// The entry `name` of class directory `dir` (0: verbs, 1: mad) when it names a frozen
    /// device.
    pub(super) fn char_entry(&self, dir: usize, name: &str) -> Option<CharEntry> {
        self.chars.get(dir)?.get(name).cloned()
    }

    /// Keep the class entries of `chars` at the positions `read_now` (per directory: the
    /// entries read this poll) that name a frozen device (`position`: a device's position
    /// in the listing).
    pub(super) fn freeze_chars(
        &mut self,
        chars: &CharDevices,
        read_now: &[Vec<usize>; 2],
        position: impl Fn(&str) -> Option<usize>,
    ) {
        for (dir, listed) in [&chars.verbs, &chars.mad].into_iter().enumerate() {
            let ClassDir::Listed(nodes) = listed else { continue };
            for n in read_now[dir].iter().filter_map(|&i| nodes.get(i)) {
                let frozen =
                    |name: &str| position(name).is_some_and(|i| self.devices.get(i).is_some_and(Option::is_some));
                if n.device.as_deref().is_some_and(frozen) {
                    self.chars[dir].insert(n.name.clone(), CharEntry { device: n.device.clone(), port: n.port });
                    self.generation += 1;
                }
            }
        }
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// How many devices are frozen now.
    pub(super) fn len(&self) -> usize {
        self.devices.iter().flatten().count()
    }
}

/// Whether `device`, just read, may be frozen: unmonitored by `judge`, with ports, each
/// with its link layer known (the classification's input; a device caught registering or
/// unreadable is read again).
pub(super) fn freezable(device: &Device, judge: Unmonitored<'_>, route: &[String]) -> bool {
    !device.ports.is_empty() && device.ports.iter().all(|p| p.link_layer.is_some()) && judge(device, route)
}
