//! Unmonitored functions (SR-IOV VFs, management NICs, excluded and unsupported devices):
//! read whole once per incarnation, then only looked for in the device listing.
//!
//! A device the plan's [`Unmonitored`] judgement says is not monitored, read with its
//! ports' link layers known, is kept as it was read (its *frozen* reading), and so are the
//! character-device class entries that name it (`umadN` → its `ibdev` and `port`). Later
//! polls serve both from here without a read: no `device` link, netdev listing, port or
//! class-entry file of it is read, no file of it kept open. The reading is dropped, and the
//! device read again, when the device listing changes (a device came or went: every
//! reading), on [`super::StaticCache::invalidate`] (a wake-up naming it), and on the poll
//! where the judgement says it is monitored (a default route that moved off a management
//! NIC): that poll reads it as any monitored device.
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{CharDevices, ClassDir, Device};

/// Whether a device is not monitored, judged from the device as read and the devices
/// behind the host's default route now (the role classification's inputs).
pub type Unmonitored<'a> = &'a dyn Fn(&Device, &[String]) -> bool;

/// The frozen readings of the unmonitored devices, by name.
#[derive(Debug, Default)]
pub(super) struct Frozen {
    devices: BTreeMap<String, Arc<Device>>,
    /// The class entries naming a frozen device, per class directory (`infiniband_verbs`,
    /// `infiniband_mad`): entry name → its `ibdev` and `port` as read.
    chars: [BTreeMap<String, CharEntry>; 2],
}

/// A class entry's attributes as read: its device and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CharEntry {
    pub(super) device: Option<String>,
    pub(super) port: Option<u32>,
}

impl Frozen {
    pub(super) fn clear(&mut self) {
        self.devices.clear();
        self.chars.iter_mut().for_each(BTreeMap::clear);
    }

    /// Drop `device`'s reading and the class entries naming it.
    pub(super) fn thaw(&mut self, device: &str) {
        if self.devices.remove(device).is_some() {
            for dir in &mut self.chars {
                dir.retain(|_, e| e.device.as_deref() != Some(device));
            }
        }
    }

    pub(super) fn get(&self, device: &str) -> Option<Arc<Device>> {
        self.devices.get(device).cloned()
    }

    pub(super) fn freeze(&mut self, device: Device) {
        self.devices.insert(device.name.clone(), Arc::new(device));
    }

    /// The entry `name` of class directory `dir` (0: verbs, 1: mad) when it names a frozen
    /// device.
    pub(super) fn char_entry(&self, dir: usize, name: &str) -> Option<CharEntry> {
        self.chars.get(dir)?.get(name).cloned()
    }

    /// Keep the class entries of `chars` that name a frozen device.
    pub(super) fn freeze_chars(&mut self, chars: &CharDevices) {
        for (dir, listed) in [&chars.verbs, &chars.mad].into_iter().enumerate() {
            let ClassDir::Listed(nodes) = listed else { continue };
            for n in nodes {
                if n.device.as_deref().is_some_and(|d| self.devices.contains_key(d)) && !self.chars[dir].contains_key(&n.name) {
                    self.chars[dir].insert(n.name.clone(), CharEntry { device: n.device.clone(), port: n.port });
                }
            }
        }
    }

    /// How many devices are frozen now.
    pub(super) fn len(&self) -> usize {
        self.devices.len()
    }
}

/// Whether `device`, just read, may be frozen: unmonitored by `judge`, with ports, each
/// with its link layer known (the classification's input; a device caught registering or
/// unreadable is read again).
pub(super) fn freezable(device: &Device, judge: Unmonitored<'_>, route: &[String]) -> bool {
    !device.ports.is_empty() && device.ports.iter().all(|p| p.link_layer.is_some()) && judge(device, route)
}
