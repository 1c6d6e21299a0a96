//! Discovery: turn the host into a [`Snapshot`] (SPEC §1.1, 000 §5, §8, §9).
//!
//! Reads only; decides nothing except what a value *is* (parsing). A bad file never
//! aborts a poll: it makes that one value unknown.
use std::collections::BTreeMap;

use regex::Regex;
use std::sync::LazyLock;

use crate::host::{Host, ReadError};
use crate::model::{
    CharDevices, CharKind, CharNode, ClassDir, Device, Function, LinkLayer, PciGpu, PciPresence, PhysState, Port,
    PortState, Snapshot,
};
use crate::parse;

/// What to read beyond the fixed set of files.
#[derive(Debug, Clone, Default)]
pub struct ReadPlan {
    /// Counter paths as configured: relative to the port directory (`counters/link_downed`)
    /// or a netdev template (`/sys/class/net/{interface}/carrier_changes`).
    pub counter_paths: Vec<String>,
    /// Devices (name, PCI address) known from earlier polls: when one is missing from
    /// `class/infiniband`, its PCI function is probed (002 §5.9).
    pub known: Vec<(String, String)>,
}

static MLX5_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^mlx5_(bond_)?\d+$").expect("static regex"));

const MELLANOX_VENDOR: u32 = 0x15b3;
const NVIDIA_VENDOR: u32 = 0x10de;
/// Amazon (the `efa` driver's adapters).
const AMAZON_VENDOR: u32 = 0x1d0f;

/// Read every RDMA device, its ports and counters, the default route and the PCI probes.
pub fn discover(host: &Host, plan: &ReadPlan) -> Snapshot {
    let names = host.list_sys("class/infiniband");
    let devices: Vec<Device> = names.iter().map(|n| read_device(host, n, plan)).collect();

    let default_route_ifaces =
        host.read_proc("net/route").map(|raw| parse::default_route_ifaces(&raw)).unwrap_or_default();
    let mut default_route_devices = Vec::new();
    for iface in &default_route_ifaces {
        for dev in ib_devices_of_iface(host, iface) {
            if !default_route_devices.contains(&dev) {
                default_route_devices.push(dev);
            }
        }
    }

    let mut pci_probes = BTreeMap::new();
    for (name, pci) in &plan.known {
        if !names.contains(name) {
            pci_probes.insert(name.clone(), probe_pci(host, pci));
        }
    }

    Snapshot { devices, default_route_ifaces, default_route_devices, pci_probes, char_devices: char_devices(host) }
}

/// The InfiniBand character-device class directories, each entry mapped to its device and
/// port through its own `ibdev` and `port` attributes (never through its number).
pub fn char_devices(host: &Host) -> CharDevices {
    let read_dir = |dir: &str, kinds: &[CharKind]| -> ClassDir {
        let rel = format!("class/{dir}");
        let names = match host.list_sys_dir(&rel) {
            Ok(names) => names,
            Err(ReadError::Missing) => return ClassDir::Absent,
            Err(e) => return ClassDir::Unreadable(format!("{}: {e}", host.sys(&rel).display())),
        };
        let nodes = names
            .into_iter()
            .filter_map(|name| {
                let kind = CharKind::of_entry(&name).filter(|k| kinds.contains(k))?;
                let attr = |a: &str| opt(host.read_sys(&format!("{rel}/{name}/{a}")));
                let device = attr("ibdev");
                let port = match kind {
                    CharKind::Uverbs => None,
                    CharKind::Umad | CharKind::Issm => attr("port").and_then(|p| p.parse::<u32>().ok()),
                };
                Some(CharNode { kind, name, device, port })
            })
            .collect();
        ClassDir::Listed(nodes)
    };
    CharDevices {
        verbs: read_dir(CharKind::Uverbs.class_dir(), &[CharKind::Uverbs]),
        mad: read_dir(CharKind::Umad.class_dir(), &[CharKind::Umad, CharKind::Issm]),
    }
}

fn opt(r: Result<String, ReadError>) -> Option<String> {
    r.ok().and_then(|s| parse::text(&s).map(str::to_string))
}

/// An attribute read and parsed, or why it is unknown: the read failed, it was empty, or
/// `known` says the parsed value is not one nicmon can judge (an `Unknown` variant).
fn attribute<T>(
    r: Result<String, ReadError>,
    parse: impl Fn(&str) -> Option<T>,
    known: impl Fn(&T) -> bool,
) -> (Option<T>, Option<String>) {
    match r {
        Err(e) => (None, Some(e.to_string())),
        Ok(raw) => match (parse(&raw), parse::text(&raw)) {
            (_, None) => (None, Some("empty".to_string())),
            (Some(v), _) if known(&v) => (Some(v), None),
            (v, Some(t)) => (v, Some(format!("unparsable value {:?}", clip(t)))),
        },
    }
}

/// At most 64 characters of a value, for a message.
fn clip(t: &str) -> String {
    let mut out: String = t.chars().take(64).collect();
    if out.len() < t.len() {
        out.push('…');
    }
    out
}

fn read_device(host: &Host, name: &str, plan: &ReadPlan) -> Device {
    let base = format!("class/infiniband/{name}");
    let pci_address = host
        .read_sys(&format!("{base}/device/uevent"))
        .ok()
        .and_then(|u| parse::uevent_pci_slot(&u))
        .or_else(|| host.link_name_sys(&format!("{base}/device")).and_then(|n| parse::pci_address(&n)));
    let card = pci_address.as_deref().and_then(parse::card_of);
    let driver = host.link_name_sys(&format!("{base}/device/driver"));
    let vendor = host.read_sys(&format!("{base}/device/vendor")).ok().and_then(|v| parse::hex_u32(&v));

    // AWS EFA: bound to `efa`; by the Amazon vendor only when the driver is unknown (an
    // Amazon function bound to another driver is not an EFA).
    let efa = match driver.as_deref() {
        Some(d) => d == "efa",
        None => vendor == Some(AMAZON_VENDOR),
    };
    let supported =
        efa || MLX5_NAME.is_match(name) || driver.as_deref() == Some("mlx5_core") || vendor == Some(MELLANOX_VENDOR);
    let unsupported = (!supported).then(|| {
        format!(
            "not an NVIDIA/Mellanox mlx5 or AWS EFA device (driver {}, PCI vendor {})",
            driver.as_deref().unwrap_or("unknown"),
            vendor.map(|v| format!("{v:#06x}")).unwrap_or_else(|| "unknown".into())
        )
    });

    let function = if host.exists_sys(&format!("{base}/device/physfn")) {
        Function::Vf
    } else if host.exists_sys(&format!("{base}/device/sriov_totalvfs")) {
        Function::Pf
    } else {
        Function::Unknown
    };

    let netdevs = host.list_sys(&format!("{base}/device/net"));
    let netdev = netdevs.first().cloned();

    // Unsupported devices and VFs are listed, not monitored: read their ports' states
    // for the report, but no counters.
    let read_counters = supported && function != Function::Vf;
    let ports = host
        .list_sys(&format!("{base}/ports"))
        .into_iter()
        .filter_map(|p| p.parse::<u32>().ok())
        .map(|n| {
            let port_netdev = port_netdev(host, &base, &netdevs, n).or_else(|| netdev.clone());
            let mut port = read_port(host, name, n, port_netdev.as_deref(), read_counters.then_some(plan));
            if efa {
                // The efa driver reports an unspecified link layer (`Unknown`).
                port.link_layer = Some(LinkLayer::Efa);
                port.unknown.remove("link_layer");
            }
            port
        })
        .collect();

    // `-1` is a value (no NUMA affinity); unreadable or garbage is unknown.
    let (numa_node, numa_unknown) = attribute(
        host.read_sys(&format!("{base}/device/numa_node")),
        |v| parse::text(v).and_then(|t| t.parse::<i32>().ok()),
        |n| *n >= -1,
    );
    let mut unknown = BTreeMap::new();
    if let Some(why) = numa_unknown {
        unknown.insert("numa_node".to_string(), why);
    }
    Device {
        name: name.to_string(),
        unsupported,
        pci_address,
        card,
        numa_node: numa_node.filter(|n| *n >= 0),
        hca_type: opt(host.read_sys(&format!("{base}/hca_type"))),
        fw_ver: opt(host.read_sys(&format!("{base}/fw_ver"))),
        board_id: opt(host.read_sys(&format!("{base}/board_id"))),
        driver,
        function,
        netdev,
        ports,
        unknown,
    }
}

/// The netdev of port `n` when a device has several: the one whose `dev_port` is `n - 1`.
fn port_netdev(host: &Host, base: &str, netdevs: &[String], n: u32) -> Option<String> {
    if netdevs.len() < 2 {
        return None;
    }
    netdevs
        .iter()
        .find(|nd| {
            host.read_sys(&format!("{base}/device/net/{nd}/dev_port"))
                .ok()
                .and_then(|v| parse::text(&v).and_then(|t| t.parse::<u32>().ok()))
                == Some(n.saturating_sub(1))
        })
        .cloned()
}

fn read_port(host: &Host, dev: &str, n: u32, netdev: Option<&str>, plan: Option<&ReadPlan>) -> Port {
    let dir = format!("class/infiniband/{dev}/ports/{n}");
    let read = |f: &str| host.read_sys(&format!("{dir}/{f}")).ok();
    let mut unknown = BTreeMap::new();
    let (link_layer, why) = attribute(host.read_sys(&format!("{dir}/link_layer")), parse::link_layer, |l| {
        !matches!(l, LinkLayer::Unknown(_))
    });
    if let Some(why) = why {
        unknown.insert("link_layer".to_string(), why);
    }
    let (state, why) =
        attribute(host.read_sys(&format!("{dir}/state")), parse::port_state, |s| !matches!(s, PortState::Unknown(_)));
    if let Some(why) = why {
        unknown.insert("state".to_string(), why);
    }
    let (phys_state, why) = attribute(host.read_sys(&format!("{dir}/phys_state")), parse::phys_state, |s| {
        !matches!(s, PhysState::Unknown(_))
    });
    if let Some(why) = why {
        unknown.insert("phys_state".to_string(), why);
    }
    let mut counters = BTreeMap::new();
    if let Some(plan) = plan {
        for path in &plan.counter_paths {
            let rel = match counter_file(dev, n, path, netdev) {
                Some(rel) => rel,
                None => continue,
            };
            if let Some(v) = host.read_sys(&rel).ok().and_then(|raw| parse::counter(&raw)) {
                counters.insert(path.clone(), v);
            }
        }
    }
    Port {
        number: n,
        link_layer,
        state,
        phys_state,
        rate: read("rate").and_then(|v| parse::rate(&v)),
        lid: read("lid").and_then(|v| parse::hex_u32(&v)),
        sm_lid: read("sm_lid").and_then(|v| parse::hex_u32(&v)),
        operstate: netdev
            .and_then(|nd| host.read_sys(&format!("class/net/{nd}/operstate")).ok())
            .and_then(|v| parse::operstate(&v)),
        carrier: netdev
            .and_then(|nd| host.read_sys(&format!("class/net/{nd}/carrier")).ok())
            .and_then(|v| parse::carrier(&v)),
        counters,
        unknown,
    }
}

/// The sysfs-relative file of a configured counter path for port `port` of `dev`: relative
/// to the port directory, a netdev template (`{interface}`), or a device-level template
/// (`{device}`, EFA's `<dev>/hw_counters/`), which is read on port 1 only and reported
/// against it.
pub fn counter_file(dev: &str, port: u32, path: &str, netdev: Option<&str>) -> Option<String> {
    let port_dir = format!("class/infiniband/{dev}/ports/{port}");
    if let Some(abs) = path.strip_prefix("/sys/") {
        if abs.contains("{interface}") {
            return netdev.map(|nd| abs.replace("{interface}", nd));
        }
        if abs.contains("{device}") {
            return (port == 1).then(|| abs.replace("{device}", dev));
        }
        return Some(abs.to_string());
    }
    if path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    Some(format!("{port_dir}/{path}"))
}

/// IB devices behind a netdev: `class/net/<if>/device/infiniband/*`, following a bond's
/// `lower_*` links one level.
fn ib_devices_of_iface(host: &Host, iface: &str) -> Vec<String> {
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

/// GPUs on the PCI bus: vendor `0x10de`, class `0x0300xx` (VGA) or `0x0302xx` (3D).
pub fn pci_gpus(host: &Host) -> Vec<PciGpu> {
    host.list_sys("bus/pci/devices")
        .into_iter()
        .filter(|bdf| {
            let dir = format!("bus/pci/devices/{bdf}");
            let vendor = host.read_sys(&format!("{dir}/vendor")).ok().and_then(|v| parse::hex_u32(&v));
            let class = host.read_sys(&format!("{dir}/class")).ok().and_then(|v| parse::hex_u32(&v));
            vendor == Some(NVIDIA_VENDOR) && matches!(class.map(|c| c >> 8), Some(0x0300) | Some(0x0302))
        })
        .filter_map(|bdf| {
            let pci_address = parse::pci_address(&bdf)?;
            let numa_node =
                host.read_sys(&format!("bus/pci/devices/{bdf}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
            Some(PciGpu { pci_address, numa_node })
        })
        .collect()
}

/// Where a PCI function sits in the tree (`bus/pci/devices/<bdf>` → `devices/pci.../<bdf>`).
pub fn pci_node(host: &Host, address: &str) -> Option<PciNode> {
    let rel = format!("bus/pci/devices/{address}");
    let comps = host.link_target_sys(&rel)?;
    let start = comps.iter().position(|c| c == "devices")? + 1;
    let path: Vec<String> = comps[start..].to_vec();
    if path.len() < 2 || path.last().map(String::as_str) != Some(address) {
        return None;
    }
    let numa_node = host.read_sys(&format!("{rel}/numa_node")).ok().and_then(|v| parse::numa_node(&v));
    let root_port_vendor = path
        .get(1)
        .filter(|rp| rp.as_str() != address)
        .and_then(|rp| host.read_sys(&format!("bus/pci/devices/{rp}/vendor")).ok())
        .and_then(|v| parse::hex_u32(&v));
    Some(PciNode { address: address.to_string(), path, numa_node, root_port_vendor })
}
