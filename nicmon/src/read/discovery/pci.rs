//! The PCI tree as discovery and the topology read it: the inline probe of a missing
//! device, the GPUs on the bus, a function's path, node and upstream bridge port, and the IB
//! devices behind a netdev.
use super::*;

/// IB devices behind a netdev: `class/net/<if>/device/infiniband/*`, following a bond's
/// `lower_*` links one level.
pub(super) fn ib_devices_of_iface(host: &Host, iface: &str) -> Vec<String> {
    let mut out = host.list_sys(&format!("class/net/{iface}/device/infiniband"));
    if out.is_empty() {
        for entry in host.list_sys(&format!("class/net/{iface}")) {
            if let Some(lower) = entry.strip_prefix("lower_") {
                out.extend(host.list_sys(&format!("class/net/{lower}/device/infiniband")));
            }
        }
    }
    out
}

/// The inline PCI check of 002 §5.9 for a device missing from `class/infiniband`.
pub fn probe_pci(host: &Host, pci: &str) -> PciPresence {
    let dir = format!("bus/pci/devices/{pci}");
    if !host.resolves_sys(&dir) {
        return PciPresence::Gone;
    }
    match host.read_sys_bytes(&format!("{dir}/config"), 64) {
        Ok(bytes) if bytes.is_empty() => PciPresence::ReadError("config space read returned no bytes".into()),
        Ok(bytes) if bytes.iter().all(|b| *b == 0xff) => PciPresence::AllOnes,
        Ok(_) => PciPresence::Present,
        Err(ReadError::Missing) => PciPresence::Gone,
        Err(e) => PciPresence::ReadError(e.to_string()),
    }
}

/// A PCI function's place in the PCI tree, for the topology fallback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciNode {
    pub address: String,
    /// Path components below `devices/`: `["pci0000:17", "0000:17:01.0", ..., address]`.
    pub path: Vec<String>,
    pub numa_node: Option<i32>,
    /// PCI vendor of the root port above it (an NVIDIA root port: Grace's NVLink-C2C).
    pub root_port_vendor: Option<u32>,
}

/// GPUs on the PCI bus: NVIDIA's (vendor `0x10de`, class `0x0300xx` VGA or `0x0302xx` 3D)
/// and AMD Instinct accelerators (vendor `0x1002`, class `0x1200xx` processing accelerator —
/// MI300 — or `0x0380xx` display controller — MI100/MI200); an AMD GPU node has no
/// NVIDIA metadata, its roles come from this tree.
pub fn pci_gpus(host: &Host) -> Vec<PciGpu> {
    host.list_sys("bus/pci/devices")
        .into_iter()
        .filter(|bdf| {
            let dir = format!("bus/pci/devices/{bdf}");
            let vendor = host.read_sys(&format!("{dir}/vendor")).ok().and_then(|v| parse::hex_u32(&v));
            let class = host.read_sys(&format!("{dir}/class")).ok().and_then(|v| parse::hex_u32(&v));
            matches!(
                (vendor, class.map(|c| c >> 8)),
                (Some(NVIDIA_VENDOR), Some(0x0300 | 0x0302)) | (Some(AMD_VENDOR), Some(0x1200 | 0x0380))
            )
        })
        .filter_map(|bdf| {
            let pci_address = parse::pci_address(&bdf)?;
            let numa_node =
                host.read_sys(&format!("bus/pci/devices/{bdf}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
            Some(PciGpu { pci_address, numa_node })
        })
        .collect()
}

/// A PCI function's path in the tree, below `devices/`: `bus/pci/devices/<bdf>` resolved
/// to `["pci0000:17", "0000:17:01.0", ..., "<bdf>"]` (root complex first, the function last).
pub fn pci_path(host: &Host, address: &str) -> Option<Vec<String>> {
    let rel = format!("bus/pci/devices/{address}");
    let comps = host.link_target_sys(&rel)?;
    let start = comps.iter().position(|c| c == "devices")? + 1;
    let path: Vec<String> = comps[start..].to_vec();
    (path.len() >= 2 && path.last().map(String::as_str) == Some(address)).then_some(path)
}

/// The bridge port a PCI function hangs from — the other end of its PCIe link: the parent
/// of its directory in the tree, when that is a PCI function (a root port or a switch's
/// downstream port) and not the root complex (`pci0000:17`: no link to read).
pub fn upstream_port(host: &Host, address: &str) -> Option<String> {
    let path = pci_path(host, address)?;
    let parent = &path[path.len() - 2];
    parse::pci_address(parent).map(|_| parent.clone())
}

/// Where a PCI function sits in the tree (`bus/pci/devices/<bdf>` → `devices/pci.../<bdf>`).
pub fn pci_node(host: &Host, address: &str) -> Option<PciNode> {
    let rel = format!("bus/pci/devices/{address}");
    let path = pci_path(host, address)?;
    let numa_node = host.read_sys(&format!("{rel}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
    let root_port_vendor = path
        .get(1)
        .filter(|rp| rp.as_str() != address)
        .and_then(|rp| host.read_sys(&format!("bus/pci/devices/{rp}/vendor")).ok())
        .and_then(|v| parse::hex_u32(&v));
    Some(PciNode { address: address.to_string(), path, numa_node, root_port_vendor })
}
