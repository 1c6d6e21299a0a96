//! Device disappearance (000 §7, 002 §5.9): a known device absent from `class/infiniband`
//! for [`MISSES_BEFORE_REPORT`] consecutive polls is reported once, with the inline PCI
//! probe's verdict; its return is reported as healthy. When the kernel said lately that the
//! device, its netdev or its PCI function was removed ([`Ctx::kernel_removed`]: a uevent
//! `remove`, an `RTM_DELLINK`, an RDMA or devlink unregistration), the first poll that finds it absent reports it (SPEC §1.15).
use std::collections::BTreeSet;

use super::health::state_check_named;
use super::state::{KnownDevice, LinkState};
use super::{Ctx, Emitted};
use crate::decide::roles::device_link_layer;
use crate::model::PciPresence;
use crate::model::event::{Entity, HealthEvent};

/// Consecutive polls a known device must be absent before it is reported (lesson 8).
pub const MISSES_BEFORE_REPORT: u32 = 3;

/// Count misses of known devices that are absent, report those at the limit; returns the
/// cards of absent devices (left out of the homogeneity comparison).
pub(super) fn missing_devices(ctx: &Ctx<'_>, st: &mut LinkState, out: &mut Emitted) -> BTreeSet<String> {
    let present: BTreeSet<&str> = ctx.snap.devices.iter().map(|d| d.name.as_str()).collect();
    let mut missing_cards = BTreeSet::new();
    for (name, known) in st.known_devices.iter_mut() {
        if present.contains(name.as_str()) {
            continue;
        }
        known.misses = known.misses.saturating_add(1);
        if let Some(card) = &known.card {
            missing_cards.insert(card.clone());
        }
        let check = state_check_named(&known.link_layer);
        let due = known.misses >= MISSES_BEFORE_REPORT || kernel_said_removed(ctx, name, known);
        if due && !known.reported_missing && ctx.enabled(check) {
            known.reported_missing = true;
            let pci = known.pci_address.clone().unwrap_or_else(|| "unknown".into());
            let why = match ctx.snap.pci_probes.get(name) {
                Some(PciPresence::Gone) => {
                    format!("PCI function {pci} gone from the bus (clean removal or hot unplug)")
                }
                Some(PciPresence::AllOnes) => {
                    format!("PCI config space of {pci} reads 0xFF - the device fell off the bus")
                }
                Some(PciPresence::Present) => {
                    format!("PCI function {pci} still present - RDMA device gone (driver unbound or failed)")
                }
                Some(PciPresence::ReadError(e)) => {
                    format!("PCI config space read of {pci} failed ({e}) - bus error")
                }
                None => format!("PCI function {pci} not probed"),
            };
            out.push(
                ctx,
                check,
                HealthEvent::new(
                    check,
                    ctx.stamp,
                    ctx.now,
                    &format!("NIC {name} disappeared from /sys/class/infiniband/ - {why}"),
                )
                .unhealthy(!known.software)
                .entities(vec![Entity::device(name.clone())]),
            );
        }
    }
    missing_cards
}

/// Whether the kernel said lately that `name`, its netdev or its PCI function was removed.
fn kernel_said_removed(ctx: &Ctx<'_>, name: &str, known: &KnownDevice) -> bool {
    let said = |n: &Option<String>| n.as_ref().is_some_and(|n| ctx.kernel_removed.contains(n));
    ctx.kernel_removed.contains(name) || said(&known.netdev) || said(&known.pci_address)
}

/// Remember every monitored device present now; one that was reported missing is back.
pub(super) fn present_devices(ctx: &Ctx<'_>, st: &mut LinkState, out: &mut Emitted) {
    for d in &ctx.monitored {
        let ll = device_link_layer(d).map_or("Unknown", |l| l.name());
        // A device seen before keeps its entry; a field is copied only when it changed (a
        // poll sees every device: nothing is allocated on a quiet one).
        if !st.known_devices.contains_key(d.name.as_str()) {
            let known = KnownDevice {
                pci_address: d.pci_address.clone(),
                card: d.card.clone(),
                link_layer: ll.to_string(),
                misses: 0,
                reported_missing: false,
                netdev: d.netdev.clone(),
                software: d.is_software(),
            };
            st.known_devices.insert(d.name.clone(), known);
        }
        let Some(entry) = st.known_devices.get_mut(d.name.as_str()) else { continue };
        if entry.reported_missing {
            let check = state_check_named(ll);
            out.push(
                ctx,
                check,
                HealthEvent::new(
                    check,
                    ctx.stamp,
                    ctx.now,
                    &format!("NIC {} is present again in /sys/class/infiniband/", d.name),
                )
                .entities(vec![Entity::device(d.name.clone())]),
            );
        }
        entry.misses = 0;
        entry.reported_missing = false;
        entry.software = d.is_software();
        copy_if_changed(&mut entry.pci_address, &d.pci_address);
        copy_if_changed(&mut entry.card, &d.card);
        copy_if_changed(&mut entry.netdev, &d.netdev);
        if entry.link_layer != ll {
            entry.link_layer = ll.to_string();
        }
    }
}

/// `*slot = value.clone()`, unless it already holds an equal value.
fn copy_if_changed<T: PartialEq + Clone>(slot: &mut T, value: &T) {
    if slot != value {
        slot.clone_from(value);
    }
}
