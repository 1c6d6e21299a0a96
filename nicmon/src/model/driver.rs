//! Which RDMA driver a device belongs to (SPEC §1.14): recognised by discovery from the PCI
//! function's driver and vendor (`crate::read::discovery`), never from the device's name —
//! except mlx5's own names, which SPEC §1.1 has always accepted.
//!
//! The driver decides what a device's counters are called and what they mean (the one
//! counter table scopes its rules by [`Drivers`]), and whether the device is hardware at
//! all: `rxe` and `siw` have no PCI function and are never fatal.
use serde::{Deserialize, Serialize};

/// The RDMA drivers nicmon knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RdmaDriver {
    /// NVIDIA/Mellanox ConnectX and BlueField (`mlx5_ib` over `mlx5_core`, vendor 0x15b3).
    Mlx5,
    /// AWS Elastic Fabric Adapter (`efa`, vendor 0x1d0f).
    Efa,
    /// Broadcom NetXtreme-E/Thor (`bnxt_re` over `bnxt_en`, vendor 0x14e4).
    BnxtRe,
    /// AMD Pensando (Pollara 400; `ionic_rdma` over `ionic`, vendor 0x1dd8).
    Ionic,
    /// Intel E810/X722 (`irdma` over `ice` or `i40e`, vendor 0x8086).
    Irdma,
    /// Soft RoCE: no PCI function, over any netdev.
    Rxe,
    /// Soft iWARP: no PCI function, over any netdev.
    Siw,
}

impl RdmaDriver {
    pub const ALL: [RdmaDriver; 7] = [
        RdmaDriver::Mlx5,
        RdmaDriver::Efa,
        RdmaDriver::BnxtRe,
        RdmaDriver::Ionic,
        RdmaDriver::Irdma,
        RdmaDriver::Rxe,
        RdmaDriver::Siw,
    ];

    /// The RDMA driver's own name, as `rdma link` prints it.
    pub fn name(self) -> &'static str {
        match self {
            RdmaDriver::Mlx5 => "mlx5",
            RdmaDriver::Efa => "efa",
            RdmaDriver::BnxtRe => "bnxt_re",
            RdmaDriver::Ionic => "ionic",
            RdmaDriver::Irdma => "irdma",
            RdmaDriver::Rxe => "rxe",
            RdmaDriver::Siw => "siw",
        }
    }

    /// A driver that emulates RDMA over a netdev in software (no PCI function): never
    /// fatal, never compared with cards.
    pub fn is_software(self) -> bool {
        matches!(self, RdmaDriver::Rxe | RdmaDriver::Siw)
    }

    /// The driver of a PCI function bound to `pci_driver` (the `device/driver` link's
    /// name), if it is one of an RDMA driver nicmon knows.
    pub fn of_pci_driver(pci_driver: &str) -> Option<RdmaDriver> {
        match pci_driver {
            "mlx5_core" => Some(RdmaDriver::Mlx5),
            "efa" => Some(RdmaDriver::Efa),
            "bnxt_en" => Some(RdmaDriver::BnxtRe),
            "ionic" => Some(RdmaDriver::Ionic),
            // irdma rides on ice (E810) and i40e (X722), the Infrastructure Data Path
            // Function (idpf) on GEN3.
            "ice" | "i40e" | "idpf" => Some(RdmaDriver::Irdma),
            _ => None,
        }
    }

    /// The driver of a PCI function of `vendor` whose driver is not known (the link
    /// unreadable): each of these vendors has one RDMA driver.
    pub fn of_vendor(vendor: u32) -> Option<RdmaDriver> {
        match vendor {
            0x15b3 => Some(RdmaDriver::Mlx5),
            0x1d0f => Some(RdmaDriver::Efa),
            0x14e4 => Some(RdmaDriver::BnxtRe),
            0x1dd8 => Some(RdmaDriver::Ionic),
            0x8086 => Some(RdmaDriver::Irdma),
            _ => None,
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// Which drivers a counter rule applies to: every driver (the IBTA PMA counters, netdev
/// statistics, ethtool data mean the same everywhere), or only some (a `hw_counters/` file
/// means what its driver says; one name may mean different things on two drivers —
/// bnxt_re's `rnr_nak_retry_err` counts RNR NAKs received, mlx5's the retries exhausted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drivers(u16);

impl Drivers {
    /// Every driver, an unrecognised one (a device brought in by `nicInclusionRegexOverride`)
    /// included.
    pub const ALL: Drivers = Drivers(0);

    /// Only these drivers.
    pub const fn only(drivers: &[RdmaDriver]) -> Drivers {
        let mut bits = 0u16;
        let mut i = 0;
        while i < drivers.len() {
            bits |= 1 << (drivers[i] as u16);
            i += 1;
        }
        Drivers(bits)
    }

    /// Whether a device of driver `driver` (`None`: not recognised) gets the rule.
    pub fn covers(self, driver: Option<RdmaDriver>) -> bool {
        self == Drivers::ALL || driver.is_some_and(|d| self.0 & d.bit() != 0)
    }

    /// The drivers covered by either.
    pub fn union(self, other: Drivers) -> Drivers {
        if self == Drivers::ALL || other == Drivers::ALL { Drivers::ALL } else { Drivers(self.0 | other.0) }
    }

    /// The drivers listed (empty for [`Drivers::ALL`]).
    pub fn listed(self) -> Vec<RdmaDriver> {
        RdmaDriver::ALL.into_iter().filter(|d| self.0 & d.bit() != 0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_cover_what_they_list() {
        let bnxt = Drivers::only(&[RdmaDriver::BnxtRe]);
        assert!(bnxt.covers(Some(RdmaDriver::BnxtRe)));
        assert!(!bnxt.covers(Some(RdmaDriver::Mlx5)));
        assert!(!bnxt.covers(None), "an unrecognised driver gets only the rules of every driver");
        assert!(Drivers::ALL.covers(None) && Drivers::ALL.covers(Some(RdmaDriver::Rxe)));
        let both = bnxt.union(Drivers::only(&[RdmaDriver::Mlx5]));
        assert_eq!(both.listed(), [RdmaDriver::Mlx5, RdmaDriver::BnxtRe]);
        assert_eq!(bnxt.union(Drivers::ALL), Drivers::ALL);
    }

    #[test]
    fn pci_drivers_and_vendors() {
        assert_eq!(RdmaDriver::of_pci_driver("bnxt_en"), Some(RdmaDriver::BnxtRe));
        assert_eq!(RdmaDriver::of_pci_driver("ice"), Some(RdmaDriver::Irdma));
        assert_eq!(RdmaDriver::of_pci_driver("ena"), None);
        assert_eq!(RdmaDriver::of_vendor(0x1dd8), Some(RdmaDriver::Ionic));
        assert_eq!(RdmaDriver::of_vendor(0x10de), None);
        assert!(RdmaDriver::Rxe.is_software() && !RdmaDriver::Irdma.is_software());
    }
}
