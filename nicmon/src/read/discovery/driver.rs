//! Which RDMA driver a device belongs to (SPEC §1.14), from what its statics read: the PCI
//! function's driver and vendor, or — for a device with no PCI function (no `device` link:
//! `class/infiniband/<dev>` resolves under `devices/virtual/infiniband`) — rxe's `parent`
//! attribute (the netdev it rides on) or an iWARP `node_type` (siw).
use super::*;
use crate::model::driver::RdmaDriver;

/// mlx5's own device names (SPEC §1.1): the one name rule, kept for devices whose driver
/// and vendor cannot be read.
static MLX5_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^mlx5_(bond_)?\d+$").expect("static regex"));

/// What identifies a device's driver, as read once per incarnation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Identity<'a> {
    /// The `device/driver` link's name (`bnxt_en`); `None`: no PCI function or unreadable.
    pub pci_driver: Option<&'a str>,
    pub vendor: Option<u32>,
    /// No `device` link at all: no parent device (rxe, siw since 5.11).
    pub virtual_device: bool,
    /// rxe's `parent` attribute: the netdev it rides on.
    pub parent: Option<&'a str>,
    /// The device's `node_type` (`"4: RNIC"` for iWARP).
    pub node_type: Option<&'a str>,
}

/// The RDMA driver of device `name`, or `None` when nicmon does not know it.
///
/// A PCI driver nicmon knows decides; a PCI function whose driver is unreadable is known by
/// its vendor (each vendor here has one RDMA driver); a function bound to another driver is
/// not recognised (an Amazon ENA is no EFA) — except Mellanox's vendor and mlx5's names,
/// which SPEC §1.1 accepts whatever the driver link says.
pub(super) fn recognise(name: &str, id: &Identity<'_>) -> Option<RdmaDriver> {
    if id.virtual_device {
        if id.parent.is_some() {
            return Some(RdmaDriver::Rxe);
        }
        return id.node_type.is_some_and(|t| t.contains("RNIC")).then_some(RdmaDriver::Siw);
    }
    if let Some(d) = id.pci_driver.and_then(RdmaDriver::of_pci_driver) {
        return Some(d);
    }
    if id.pci_driver.is_none()
        && let Some(d) = id.vendor.and_then(RdmaDriver::of_vendor)
    {
        return Some(d);
    }
    (id.vendor == Some(MELLANOX_VENDOR) || MLX5_NAME.is_match(name)).then_some(RdmaDriver::Mlx5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci<'a>(driver: Option<&'a str>, vendor: Option<u32>) -> Identity<'a> {
        Identity { pci_driver: driver, vendor, ..Identity::default() }
    }

    #[test]
    fn devices_are_recognised_by_driver_and_vendor_not_by_name() {
        use RdmaDriver::*;
        let cases: &[(&str, Identity<'_>, Option<RdmaDriver>)] = &[
            ("mlx5_0", pci(Some("mlx5_core"), Some(0x15b3)), Some(Mlx5)),
            ("ibp3s0", pci(Some("mlx5_core"), Some(0x15b3)), Some(Mlx5)),
            // SPEC §1.1: the Mellanox vendor or an mlx5 name, whatever the link says.
            ("mlx5_3", pci(None, None), Some(Mlx5)),
            ("weird0", pci(Some("vfio-pci"), Some(0x15b3)), Some(Mlx5)),
            ("rdmap79s0", pci(Some("efa"), Some(0x1d0f)), Some(Efa)),
            ("rdmap79s0", pci(None, Some(0x1d0f)), Some(Efa)),
            // An Amazon function bound to another driver is not an EFA.
            ("rdmap79s0", pci(Some("ena"), Some(0x1d0f)), None),
            ("bnxt_re0", pci(Some("bnxt_en"), Some(0x14e4)), Some(BnxtRe)),
            // rdma-core's udev rules rename devices: the name says nothing.
            ("rocep65s0", pci(Some("ionic"), Some(0x1dd8)), Some(Ionic)),
            ("rocep65s0", pci(None, Some(0x1dd8)), Some(Ionic)),
            ("irdma0", pci(Some("ice"), Some(0x8086)), Some(Irdma)),
            ("iwp24s0f0", pci(Some("i40e"), Some(0x8086)), Some(Irdma)),
            ("hns_0", pci(Some("hns3"), Some(0x19e5)), None),
            ("bnxt_re0", pci(Some("foo"), Some(0x14e4)), None),
        ];
        for (name, id, want) in cases {
            assert_eq!(recognise(name, id), *want, "{name} {id:?}");
        }
        let virt = |parent, node_type| Identity { virtual_device: true, parent, node_type, ..Identity::default() };
        assert_eq!(recognise("rxe0", &virt(Some("eth1"), Some("1: CA"))), Some(Rxe));
        assert_eq!(recognise("siw0", &virt(None, Some("4: RNIC"))), Some(Siw));
        assert_eq!(recognise("mlx5_0", &virt(None, Some("1: CA"))), None, "no PCI function, not soft RoCE");
    }
}
