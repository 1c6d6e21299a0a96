//! A one-off read of a PF's PCIe state through [`Host`] (the poll's read is batched with
//! the other files, [`crate::read::discovery`]): its link, the upstream bridge port's and its AER
//! statistics.
use crate::model::pcie::parse::AerSeverity;
use crate::model::pcie::reading::{Aer, LINK_FILES, PcieLink, PcieReading, UpstreamPort, aer_file};
use crate::read::discovery;
use crate::read::host::Host;

/// The link figures of the PCI function at `address` (`bus/pci/devices/<address>/`).
pub fn read_link(host: &Host, address: &str) -> PcieLink {
    let [a, b, c, d] = LINK_FILES.map(|f| host.read_sys(&format!("bus/pci/devices/{address}/{f}")));
    PcieLink::from_texts(a.as_deref().ok(), b.as_deref().ok(), c.as_deref().ok(), d.as_deref().ok())
}

/// The AER files of the PCI function at `address`.
pub fn read_aer(host: &Host, address: &str) -> Aer {
    let mut aer = Aer::default();
    for s in AerSeverity::ALL {
        *aer.slot(s) = aer_file(host.read_sys(&format!("bus/pci/devices/{address}/{}", s.file())).as_deref(), s);
    }
    aer
}

/// Everything the PCIe check needs of the PF at `address`: its link, the upstream port's
/// (found through the PF's place in the PCI tree, [`discovery::upstream_port`]) and its AER
/// statistics.
pub fn read(host: &Host, address: &str) -> PcieReading {
    let upstream =
        discovery::upstream_port(host, address).map(|up| UpstreamPort { link: read_link(host, &up), address: up });
    PcieReading { link: read_link(host, address), upstream, aer: read_aer(host, address) }
}
