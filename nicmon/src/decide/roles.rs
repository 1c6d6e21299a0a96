//! NIC roles (SPEC §1.2, 000 §4): which NICs are monitored, and in which group their
//! cards are compared. Pure: a function of the snapshot, the topology and the filters.
use std::borrow::Cow;
use std::collections::BTreeMap;

use regex::Regex;
use serde::Serialize;

use crate::model::topology::Level;
use crate::model::topology::Topology;
use crate::model::{Device, LinkLayer, Snapshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Compute,
    Storage,
    Management,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Compute => "compute",
            Role::Storage => "storage",
            Role::Management => "management",
        }
    }
}

/// BlueField DPUs (BlueField-2, its variant, BlueField-3): management in the all-SYS case.
pub const BLUEFIELD_HCA_TYPES: [&str; 3] = ["MT41682", "MT41686", "MT41692"];

/// Name filters from the config file (000 §12.1).
#[derive(Debug, Clone, Default)]
pub struct NicFilters {
    /// `nicExclusionRegex`: names dropped before anything else.
    pub exclude: Vec<Regex>,
    /// `nicInclusionRegexOverride`: when non-empty, only these names, classification bypassed.
    pub include_override: Vec<Regex>,
}

impl NicFilters {
    /// The discovery-scope fingerprint, upstream's format: `incl=<override>;excl=<exclusion>`
    /// (each the comma-joined patterns). A change re-baselines the state checks.
    pub fn fingerprint(&self) -> String {
        let join = |v: &[Regex]| v.iter().map(Regex::as_str).collect::<Vec<_>>().join(",");
        format!("incl={};excl={}", join(&self.include_override), join(&self.exclude))
    }
}

/// The decision for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Classification {
    pub monitored: bool,
    /// Why not monitored (`None` when monitored).
    /// Static where it can be (a VF's, on a node of hundreds of VFs, every poll).
    pub reason: Option<Cow<'static, str>>,
    pub role: Option<Role>,
    pub role_reason: Option<String>,
}

impl Classification {
    fn skip(reason: impl Into<Cow<'static, str>>) -> Classification {
        Classification { monitored: false, reason: Some(reason.into()), role: None, role_reason: None }
    }
    fn role(role: Role, why: String) -> Classification {
        let monitored = role != Role::Management;
        Classification {
            monitored,
            reason: (!monitored).then(|| format!("management NIC: {why}").into()),
            role: Some(role),
            role_reason: Some(why),
        }
    }
}

/// A device's link layer: its first port's (mlx5 devices have one port per PCI function).
pub fn device_link_layer(dev: &Device) -> Option<&LinkLayer> {
    dev.ports.iter().find_map(|p| p.link_layer.as_ref())
}

/// Classify every device of the snapshot.
pub fn classify(snapshot: &Snapshot, topo: &Topology, filters: &NicFilters) -> BTreeMap<String, Classification> {
    snapshot
        .devices
        .iter()
        .map(|d| (d.name.clone(), classify_device(d, &snapshot.default_route_devices, topo, filters)))
        .collect()
}

/// Whether one device is monitored: [`classify_device`]'s answer, a VF's (never
/// monitored, whatever else) without classifying it.
pub fn is_monitored(dev: &Device, default_route_devices: &[String], topo: &Topology, filters: &NicFilters) -> bool {
    !dev.is_vf() && classify_device(dev, default_route_devices, topo, filters).monitored
}

/// Classify one device; `default_route_devices`: the snapshot's (the devices behind the
/// host's default route).
pub fn classify_device(
    dev: &Device,
    default_route_devices: &[String],
    topo: &Topology,
    filters: &NicFilters,
) -> Classification {
    if let Some(re) = filters.exclude.iter().find(|re| re.is_match(&dev.name)) {
        return Classification::skip(format!("excluded by nicExclusionRegex {:?}", re.as_str()));
    }
    if dev.is_vf() {
        return Classification::skip("SR-IOV virtual function: DOWN until assigned, not monitored");
    }
    let ll = device_link_layer(dev);
    // InfiniBand and AWS EFA are GPU compute fabrics; Ethernet may be storage.
    let is_ib = matches!(ll, Some(LinkLayer::InfiniBand | LinkLayer::Efa));
    // The override brings in any RDMA device, one of a driver nicmon does not know included.
    if !filters.include_override.is_empty() {
        return match filters.include_override.iter().find(|re| re.is_match(&dev.name)) {
            Some(re) => Classification::role(
                if is_ib { Role::Compute } else { Role::Storage },
                format!("listed by nicInclusionRegexOverride {:?}", re.as_str()),
            ),
            None => Classification::skip("not listed by nicInclusionRegexOverride"),
        };
    }
    if let Some(why) = &dev.unsupported {
        return Classification::skip(why.clone());
    }
    // 0. A software RDMA device (rxe, siw) has no PCI function: no topology to place it, no
    // card to compare. It is a test fabric: monitored, never fatal (`decide::software`).
    if let Some(driver) = dev.rdma_driver.filter(|d| d.is_software()) {
        let over = dev.netdev.as_deref().map(|n| format!(" over {n}")).unwrap_or_default();
        return Classification::role(
            Role::Compute,
            format!("software RDMA device ({}{over}): never fatal, not compared with cards", driver.name()),
        );
    }

    // 1. The default route.
    if default_route_devices.contains(&dev.name) {
        return Classification::role(Role::Management, "carries the host's default route".into());
    }
    // 2. The NUMA gate. Skipped when no GPU has a known NUMA node: it could not tell; and
    // when this NIC's `numa_node` is unknown (unreadable, garbage): unknown is not a value,
    // the other evidence decides. A readable `-1` (no NUMA affinity) is a value.
    if !topo.gpu_numa.is_empty() && !dev.unknown.contains_key("numa_node") {
        match dev.numa_node {
            None => return Classification::role(Role::Management, "NUMA node unknown (-1)".into()),
            Some(n) if !topo.gpu_numa.contains(&n) => {
                return Classification::role(Role::Management, format!("NUMA node {n} hosts no GPU"));
            }
            Some(_) => {}
        }
    }
    let row: &[Level] = topo.levels.get(&dev.name).map(Vec::as_slice).unwrap_or(&[]);
    let nearest = |want: &[Level]| {
        row.iter().enumerate().find(|(_, l)| want.contains(l)).map(|(i, l)| {
            let gpu = topo.gpus.get(i).map(String::as_str).filter(|g| !g.is_empty()).unwrap_or("?");
            format!("{} to GPU {i} ({gpu})", l.name())
        })
    };
    // 3. PCIe proximity to a GPU.
    if let Some(why) = nearest(&[Level::Pix, Level::Pxb]) {
        return Classification::role(Role::Compute, why);
    }
    // 4. InfiniBand is the compute fabric.
    if is_ib {
        let what = ll.map(|l| l.name()).unwrap_or("InfiniBand");
        return Classification::role(Role::Compute, format!("{what} link layer, no PIX/PXB to a GPU"));
    }
    // 5. Same socket or host bridge as a GPU.
    if let Some(why) = nearest(&[Level::Node, Level::Phb]) {
        return Classification::role(Role::Storage, format!("Ethernet, {why}"));
    }
    // 6. All SYS (Grace) or no GPU at all.
    let context = if topo.gpus.is_empty() { "no GPU on this node" } else { "all SYS to GPUs" };
    match dev.hca_type.as_deref() {
        Some(h) if BLUEFIELD_HCA_TYPES.contains(&h) => {
            Classification::role(Role::Management, format!("BlueField DPU ({h}), {context}"))
        }
        _ => Classification::role(Role::Storage, format!("Ethernet, {context}")),
    }
}

/// Compile a comma-separated list of regexes (the config's format). The error names the
/// key and the pattern at fault.
pub fn parse_regex_list(key: &str, value: &str) -> Result<Vec<Regex>, RegexListError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            Regex::new(p).map_err(|error| RegexListError {
                key: key.to_string(),
                value: value.to_string(),
                pattern: p.to_string(),
                error,
            })
        })
        .collect()
}

/// A pattern of a regex list that does not compile: the key, its value and the pattern.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key} = {value:?}: invalid regex {pattern:?}: {error}")]
pub struct RegexListError {
    pub key: String,
    pub value: String,
    pub pattern: String,
    pub error: regex::Error,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::discovery::{self, ReadPlan};
    use crate::read::host::Host;
    use nicmon_tests::platforms::Platform;

    #[test]
    fn is_monitored_answers_as_the_classification() {
        let excluded = NicFilters { exclude: parse_regex_list("x", "mlx5_1$").unwrap(), ..NicFilters::default() };
        for platform in Platform::ALL {
            let node = platform.build();
            let host = Host::new(node.sys(), node.proc());
            let snap = discovery::discover(&host, &ReadPlan::default());
            let topo = crate::read::topology::resolve(&host, &snap, Some(&node.metadata_path()), false).unwrap();
            for filters in [&NicFilters::default(), &excluded] {
                for d in &snap.devices {
                    let route = &snap.default_route_devices;
                    let c = classify_device(d, route, &topo, filters);
                    assert_eq!(is_monitored(d, route, &topo, filters), c.monitored, "{platform:?} {}: {c:?}", d.name);
                }
            }
        }
    }

    /// A device of a driver nicmon does not know (its PCI function bound to `foo_rdma`,
    /// vendor 0x1234): discovery marks it unsupported and it is not monitored, saying why;
    /// `nicInclusionRegexOverride` naming it brings it in (SPEC §1.14).
    #[test]
    fn the_inclusion_override_brings_in_a_device_of_an_unknown_driver() {
        let node = Platform::E810.build();
        let dev = node.pfs().into_iter().next().expect("a PF");
        let pci = node.sys().join(&node.info[&dev].pci_dir);
        std::fs::remove_file(pci.join("driver")).unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/foo_rdma", pci.join("driver")).unwrap();
        std::fs::write(pci.join("vendor"), "0x1234\n").unwrap();
        let host = Host::new(node.sys(), node.proc());
        let snap = discovery::discover(&host, &ReadPlan::default());
        let topo = crate::read::topology::resolve(&host, &snap, Some(&node.metadata_path()), false).unwrap();
        let d = snap.devices.iter().find(|d| d.name == dev).expect("still discovered");
        assert_eq!(d.rdma_driver, None, "{d:?}");
        let route = &snap.default_route_devices;
        let c = classify_device(d, route, &topo, &NicFilters::default());
        assert!(!c.monitored, "{c:?}");
        let why = c.reason.unwrap_or_default();
        assert!(why.contains("RDMA driver not recognised (PCI driver foo_rdma, PCI vendor 0x1234)"), "{why}");
        let filters = NicFilters {
            include_override: parse_regex_list("x", &format!("^{dev}$")).unwrap(),
            ..NicFilters::default()
        };
        let c = classify_device(d, route, &topo, &filters);
        assert!(c.monitored, "{c:?}");
        assert!(c.role_reason.unwrap_or_default().contains("listed by nicInclusionRegexOverride"));
    }
}
