//! Which NIC a kernel log line is about.
//!
//! The index is built from the caller's data (the snapshot and the roles decided for it).
//! A line names a device by a PCI address (` DEVICE=+pci:<BDF>`, or in its text), by an
//! ifindex (` DEVICE=n<ifindex>`) or by a netdev name (`NETDEV WATCHDOG: eth1 (mlx5_core)`).
//! The same failure is printed by every PF and VF of a card, so lines resolve to a
//! [`Target`]: the card (the dedup key) and the device that speaks for it in events.
use std::collections::{BTreeMap, BTreeSet};

use crate::model::kmsg::{Departed, HostLinks, card_of};
use crate::model::{Device, Snapshot};

/// One RDMA device as the watcher needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// IB device name (`mlx5_0`): the `NIC=` entity.
    pub device: String,
    /// PCI address, lower case (`0000:3b:00.0`).
    pub pci_address: Option<String>,
    /// PCI `domain:bus:device` (`0000:3b:00`).
    pub card: Option<String>,
    pub netdev: Option<String>,
    pub ifindex: Option<u32>,
    /// Whether nicmon monitors this device (management NICs and VFs: false).
    pub monitored: bool,
    /// A VF speaks for its card, never for itself.
    pub is_vf: bool,
}

/// Where a line's events go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    /// Dedup key: the card (`domain:bus:device`), or the device name when the card is unknown.
    pub card: String,
    /// The device the line names when it is a monitored PF, else the card's first
    /// monitored PF (a VF, a function without an IB device, a bridge above the card).
    pub device: String,
    /// The card's first monitored PF: the `NIC=` entity of card-level failures.
    pub card_device: String,
}

/// What the index knows about one name a line mentions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The index knows nothing about it: try the line's next clue.
    Unknown,
    /// Known; these monitored targets (empty: it belongs to an unmonitored NIC — the line
    /// yields nothing, and no other clue of the line is tried).
    Known(Vec<Target>),
}

/// The lookup table of the monitored NICs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIndex {
    entries: Vec<IndexEntry>,
    /// Bridge BDF → the cards below it.
    bridges: BTreeMap<String, BTreeSet<String>>,
}

impl DeviceIndex {
    pub fn new(entries: Vec<IndexEntry>) -> DeviceIndex {
        let mut entries: Vec<IndexEntry> = entries
            .into_iter()
            .map(|mut e| {
                e.pci_address = e.pci_address.map(|a| a.to_ascii_lowercase());
                e.card = e
                    .card
                    .map(|c| c.to_ascii_lowercase())
                    .or_else(|| e.pci_address.as_deref().and_then(card_of).map(String::from));
                e
            })
            .collect();
        // "First PF" of a card = lowest PCI address.
        entries.sort_by(|a, b| (&a.pci_address, &a.device).cmp(&(&b.pci_address, &b.device)));
        DeviceIndex { entries, bridges: BTreeMap::new() }
    }

    /// Build from a snapshot. `monitored` is the caller's decision (role ≠ management,
    /// not excluded, Mellanox); VFs are never monitored themselves.
    /// `links.departed` are added as monitored PFs unless the snapshot has that name or PCI
    /// address (a device that came back, perhaps under another name).
    pub fn from_snapshot(snapshot: &Snapshot, monitored: impl Fn(&Device) -> bool, links: &HostLinks) -> DeviceIndex {
        let mut entries: Vec<IndexEntry> = snapshot
            .devices
            .iter()
            .map(|d| IndexEntry {
                device: d.name.clone(),
                pci_address: d.pci_address.clone(),
                card: d.card.clone(),
                netdev: d.netdev.clone(),
                ifindex: d.netdev.as_ref().and_then(|n| links.ifindex.get(n).copied()),
                monitored: !d.is_vf() && monitored(d),
                is_vf: d.is_vf(),
            })
            .collect();
        let present = |p: &Departed| {
            snapshot.devices.iter().any(|d| {
                d.name == p.device
                    || (p.pci_address.is_some()
                        && d.pci_address.as_deref().map(str::to_ascii_lowercase)
                            == p.pci_address.as_deref().map(str::to_ascii_lowercase))
            })
        };
        entries.extend(links.departed.iter().filter(|p| !present(p)).map(|p| IndexEntry {
            device: p.device.clone(),
            pci_address: p.pci_address.clone(),
            card: p.card.clone(),
            netdev: None,
            ifindex: None,
            monitored: true,
            is_vf: false,
        }));
        let mut index = DeviceIndex::new(entries);
        for (device, bridges) in &links.bridges {
            let card = index.entries.iter().find(|e| &e.device == device).and_then(|e| e.card.clone());
            if let Some(card) = card {
                for b in bridges {
                    index = index.with_bridge(b, &card);
                }
            }
        }
        index
    }

    /// Declare that PCI bridge `bridge` is above `card`. A bridge above several cards (a
    /// root port above a PCIe switch) attributes its lines to each of them: a fatal
    /// error on that link cuts them all off.
    pub fn with_bridge(mut self, bridge: &str, card: &str) -> DeviceIndex {
        self.bridges.entry(bridge.to_ascii_lowercase()).or_default().insert(card.to_ascii_lowercase());
        self
    }

    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Every monitored card, once, with its first monitored PF.
    pub fn monitored_cards(&self) -> Vec<Target> {
        let cards: BTreeSet<String> = self
            .entries
            .iter()
            .filter(|e| e.monitored)
            .map(|e| e.card.clone().unwrap_or_else(|| e.device.clone()))
            .collect();
        cards.into_iter().filter_map(|c| self.card_target(&c)).collect()
    }

    /// A PCI address: the device itself, a function on a known card (VF, other PF),
    /// or a bridge above known cards.
    pub fn resolve_bdf(&self, bdf: &str) -> Resolution {
        let bdf = bdf.to_ascii_lowercase();
        if let Some(e) = self.entries.iter().find(|e| e.pci_address.as_deref() == Some(bdf.as_str())) {
            return self.resolve_entry(e);
        }
        let card = card_of(&bdf);
        if let Some(r) = card.and_then(|c| self.resolve_card(c, false)) {
            return r;
        }
        if let Some(cards) = self.bridges.get(&bdf) {
            return Resolution::Known(cards.iter().filter_map(|c| self.card_target(c)).collect());
        }
        if let Some(r) = card.and_then(|c| self.resolve_card(c, true)) {
            return r;
        }
        Resolution::Unknown
    }

    pub fn resolve_netdev(&self, name: &str) -> Resolution {
        match self.entries.iter().find(|e| e.netdev.as_deref() == Some(name)) {
            Some(e) => self.resolve_entry(e),
            None => Resolution::Unknown,
        }
    }

    pub fn resolve_ifindex(&self, ifindex: u32) -> Resolution {
        match self.entries.iter().find(|e| e.ifindex == Some(ifindex)) {
            Some(e) => self.resolve_entry(e),
            None => Resolution::Unknown,
        }
    }

    fn resolve_entry(&self, e: &IndexEntry) -> Resolution {
        if e.monitored {
            let card = e.card.clone().unwrap_or_else(|| e.device.clone());
            let card_device = self.card_target(&card).map_or_else(|| e.device.clone(), |t| t.device);
            return Resolution::Known(vec![Target { card, device: e.device.clone(), card_device }]);
        }
        if e.is_vf {
            // A VF's BDF may sit on another device number of the PF's bus (3b:01.2).
            if let Some(card) = &e.card
                && let Some(r) = self.resolve_card(card, false).or_else(|| self.resolve_card(card, true))
            {
                return r;
            }
        }
        // An unmonitored PF (management NIC, excluded): its lines are not ours.
        Resolution::Known(Vec::new())
    }

    /// A card by `domain:bus:device`, or with `by_bus` by `domain:bus` when exactly one
    /// card sits on that bus at device 0: a PCIe endpoint behind a port is device 0 of a
    /// bus of its own, and its VFs (ARI) spill into the device numbers beyond (3b:01.2).
    /// A card at another device number (bus 0 of a VM: `0000:00:06`) shares its bus with
    /// unrelated devices, so the bus says nothing.
    fn resolve_card(&self, card: &str, by_bus: bool) -> Option<Resolution> {
        let pfs = |pred: &dyn Fn(&IndexEntry) -> bool| -> Vec<&IndexEntry> {
            self.entries.iter().filter(|e| !e.is_vf && pred(e)).collect()
        };
        let mut on_card = pfs(&|e| e.card.as_deref() == Some(card));
        if by_bus {
            let bus = bus_of(card)?;
            on_card = pfs(&|e| e.card.as_deref().and_then(bus_of) == Some(bus));
            let cards: BTreeSet<&str> = on_card.iter().filter_map(|e| e.card.as_deref()).collect();
            if cards.len() != 1 || !cards.iter().all(|c| c.ends_with(":00")) {
                return None;
            }
        } else if on_card.is_empty() {
            return None;
        }
        let Some(first) = on_card.iter().find(|e| e.monitored) else {
            // A card of unmonitored NICs only (management): known, not ours.
            return Some(Resolution::Known(Vec::new()));
        };
        let card = first.card.clone().unwrap_or_else(|| first.device.clone());
        Some(Resolution::Known(self.card_target(&card).into_iter().collect()))
    }

    fn card_target(&self, card: &str) -> Option<Target> {
        self.entries.iter().find(|e| e.monitored && e.card.as_deref().unwrap_or(&e.device) == card).map(|e| Target {
            card: card.to_string(),
            device: e.device.clone(),
            card_device: e.device.clone(),
        })
    }
}

/// `0000:3b:00` → `0000:3b`.
fn bus_of(card: &str) -> Option<&str> {
    card.rsplit_once(':').map(|(bus, _)| bus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(device: &str, bdf: &str, monitored: bool, is_vf: bool) -> IndexEntry {
        IndexEntry {
            device: device.into(),
            pci_address: Some(bdf.into()),
            card: None,
            netdev: None,
            ifindex: None,
            monitored,
            is_vf,
        }
    }

    fn index() -> DeviceIndex {
        DeviceIndex::new(vec![
            entry("mlx5_1", "0000:3B:00.1", true, false),
            entry("mlx5_0", "0000:3b:00.0", true, false),
            entry("mlx5_18", "0000:3b:01.2", false, true),
            entry("mlx5_4", "0000:5e:00.0", false, false),
            entry("mlx5_5", "0000:5e:00.1", true, false),
            entry("mlx5_9", "0000:9a:00.0", false, false),
        ])
        .with_bridge("0000:3a:02.0", "0000:3b:00")
    }

    fn known(device: &str, card: &str) -> Resolution {
        let first = if card == "0000:3b:00" { "mlx5_0" } else { device };
        Resolution::Known(vec![Target { device: device.into(), card: card.into(), card_device: first.into() }])
    }

    #[test]
    fn resolves_devices_cards_vfs_and_bridges() {
        let i = index();
        assert_eq!(i.resolve_bdf("0000:3b:00.1"), known("mlx5_1", "0000:3b:00"));
        // A function without an IB device on a known card → the card's first PF.
        assert_eq!(i.resolve_bdf("0000:3b:00.5"), known("mlx5_0", "0000:3b:00"));
        // A VF, on another device number of the PF's bus.
        assert_eq!(i.resolve_bdf("0000:3b:01.2"), known("mlx5_0", "0000:3b:00"));
        assert_eq!(i.resolve_bdf("0000:3b:02.7"), known("mlx5_0", "0000:3b:00"));
        // The root port above the card.
        assert_eq!(i.resolve_bdf("0000:3a:02.0"), known("mlx5_0", "0000:3b:00"));
        // A management PF: known, nothing to report — even when its sibling is monitored.
        assert_eq!(i.resolve_bdf("0000:5e:00.0"), Resolution::Known(vec![]));
        assert_eq!(i.resolve_bdf("0000:5e:00.3"), known("mlx5_5", "0000:5e:00"));
        assert_eq!(i.resolve_bdf("0000:9a:00.4"), Resolution::Known(vec![]));
        assert_eq!(i.resolve_bdf("0000:c1:00.0"), Resolution::Unknown);
        assert_eq!(i.resolve_bdf("garbage"), Resolution::Unknown);
        // Bus 0 of a VM: other functions on the bus are not the NIC's.
        let vm = DeviceIndex::new(vec![entry("mlx5_0", "0000:00:06.0", true, false)]);
        assert_eq!(vm.resolve_bdf("0000:00:03.0"), Resolution::Unknown);
        assert_eq!(vm.resolve_bdf("0000:00:06.1"), known("mlx5_0", "0000:00:06"));
        assert_eq!(i.monitored_cards().len(), 2);
    }
}
