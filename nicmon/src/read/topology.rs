//! GPU↔NIC topology: from `gpu_metadata.json` (000 §12.2) or, when that is missing,
//! unreadable or empty, derived from the PCI tree in sysfs (SPEC §1.2, the rules NCCL uses).
use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::model::Snapshot;
use crate::read::discovery::{self, PciNode};
use crate::read::host::Host;
use crate::read::parse;

pub use crate::model::topology::{Level, Source, Topology};

/// Why the metadata file could not be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MetadataError {
    #[error("GPU metadata file {path}: cannot read: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("GPU metadata file {path}: malformed JSON: {reason}")]
    Malformed { path: String, reason: String },
    #[error("GPU metadata file {path}: nic_topology is missing or empty")]
    EmptyTopology { path: String },
}

#[derive(Debug, Deserialize)]
struct RawMetadata {
    #[serde(default)]
    gpus: Vec<RawGpu>,
    #[serde(default)]
    nic_topology: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct RawGpu {
    #[serde(default)]
    pci_address: Option<String>,
    #[serde(default)]
    numa_node: Option<i64>,
}

/// Parsed `gpu_metadata.json`: only the fields nicmon uses; unknown fields are ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    pub gpus: Vec<(Option<String>, Option<i32>)>,
    pub nic_topology: BTreeMap<String, Vec<Level>>,
}

/// Parse the metadata file's bytes. Never panics.
pub fn parse_metadata(path: &str, bytes: &[u8]) -> Result<Metadata, MetadataError> {
    let raw: RawMetadata = serde_json::from_slice(bytes)
        .map_err(|e| MetadataError::Malformed { path: path.to_string(), reason: e.to_string() })?;
    let gpus = raw
        .gpus
        .iter()
        .map(|g| {
            let pci = g.pci_address.as_deref().and_then(parse::pci_address);
            let numa = g.numa_node.and_then(|n| i32::try_from(n).ok()).filter(|n| *n >= 0);
            (pci, numa)
        })
        .collect();
    let nic_topology: BTreeMap<String, Vec<Level>> = raw
        .nic_topology
        .into_iter()
        .map(|(nic, levels)| (nic, levels.iter().map(|l| Level::parse(l).unwrap_or(Level::Sys)).collect()))
        .collect();
    if nic_topology.is_empty() {
        return Err(MetadataError::EmptyTopology { path: path.to_string() });
    }
    Ok(Metadata { gpus, nic_topology })
}

/// The largest metadata file nicmon reads (a node's is a few KiB).
pub const METADATA_MAX_BYTES: usize = 4 << 20;

/// Read the metadata file (a regular file of at most [`METADATA_MAX_BYTES`], read with a
/// deadline: a FIFO or a `/dev/zero` link in its place is unreadable, not a hang).
pub fn load_metadata(path: &Path) -> Result<Metadata, MetadataError> {
    let shown = path.display().to_string();
    let bytes = crate::read::host::read_file(path, METADATA_MAX_BYTES).map_err(|e| MetadataError::Unreadable {
        path: shown.clone(),
        reason: match e {
            crate::read::host::ReadError::Missing => "No such file or directory".into(),
            e => e.to_string(),
        },
    })?;
    parse_metadata(&shown, &bytes)
}

/// The topology from the metadata file, or from sysfs when the metadata cannot be used.
/// Under `fail_fast` (the seed's behaviour) an unusable metadata file is an error.
pub fn resolve(
    host: &Host,
    snapshot: &Snapshot,
    metadata_path: Option<&Path>,
    fail_fast: bool,
) -> Result<Topology, MetadataError> {
    let meta = match metadata_path {
        Some(p) => load_metadata(p),
        None => Err(MetadataError::Unreadable { path: "(none)".into(), reason: "no metadata path given".into() }),
    };
    match meta {
        Ok(m) => Ok(from_metadata(host, snapshot, m)),
        Err(e) if fail_fast => Err(e),
        Err(e) => {
            let mut t = from_sysfs(host, snapshot);
            t.notes.insert(0, format!("{e}: using the PCI topology from sysfs"));
            Ok(t)
        }
    }
}

fn from_metadata(host: &Host, snapshot: &Snapshot, m: Metadata) -> Topology {
    let gpus: Vec<String> = m.gpus.iter().map(|(pci, _)| pci.clone().unwrap_or_default()).collect();
    let gpu_numa = m.gpus.iter().filter_map(|(_, n)| *n).collect();
    let mut levels = m.nic_topology;
    let mut notes = Vec::new();
    // A NIC the collector did not list (renamed, added later): derive its row from sysfs.
    let missing: Vec<&str> = snapshot
        .devices
        .iter()
        .filter(|d| !d.is_vf() && d.unsupported.is_none() && !levels.contains_key(&d.name))
        .map(|d| d.name.as_str())
        .collect();
    if !missing.is_empty() {
        let gpu_nodes: Vec<Option<PciNode>> = gpus.iter().map(|g| discovery::pci_node(host, g)).collect();
        for name in missing {
            if let Some(row) = sysfs_row(host, snapshot, name, &gpu_nodes) {
                notes.push(format!("{name} is not in the metadata's nic_topology: its row was derived from sysfs"));
                levels.insert(name.to_string(), row);
            }
        }
    }
    Topology { source: Source::Metadata, gpus, gpu_numa, levels, notes }
}

fn sysfs_row(host: &Host, snapshot: &Snapshot, nic: &str, gpus: &[Option<PciNode>]) -> Option<Vec<Level>> {
    let dev = snapshot.device(nic)?;
    let node = discovery::pci_node(host, dev.pci_address.as_deref()?)?;
    Some(gpus.iter().map(|g| g.as_ref().map(|g| level_between(&node, g)).unwrap_or(Level::Sys)).collect())
}

/// The topology derived from the PCI tree alone.
pub fn from_sysfs(host: &Host, snapshot: &Snapshot) -> Topology {
    let found = discovery::pci_gpus(host);
    let gpus: Vec<String> = found.iter().map(|g| g.pci_address.clone()).collect();
    let gpu_numa = found.iter().filter_map(|g| g.numa_node).collect();
    let gpu_nodes: Vec<Option<PciNode>> = gpus.iter().map(|g| discovery::pci_node(host, g)).collect();
    let mut levels = BTreeMap::new();
    for dev in snapshot.devices.iter().filter(|d| !d.is_vf() && d.unsupported.is_none()) {
        if let Some(row) = sysfs_row(host, snapshot, &dev.name, &gpu_nodes) {
            levels.insert(dev.name.clone(), row);
        }
    }
    let source = if gpus.is_empty() { Source::None } else { Source::Sysfs };
    let mut notes = Vec::new();
    if gpus.is_empty() {
        notes.push("no GPU found on the PCI bus: NICs are grouped by link layer".into());
    }
    Topology { source, gpus, gpu_numa, levels, notes }
}

/// The relationship between two PCI functions from their places in the PCI tree.
///
/// Path components are `[root complex, bridge, ..., device]`. Below their lowest common
/// bridge, each device at most one bridge deep (the downstream ports of one switch) →
/// `PIX`; deeper → `PXB`; only the root complex in common → `PHB`; different root
/// complexes → `NODE` on one NUMA node, else `SYS`. A GPU behind an NVIDIA root port is
/// attached through NVLink-C2C (Grace): `SYS` to every NIC, as `nvidia-smi` reports.
pub fn level_between(nic: &PciNode, gpu: &PciNode) -> Level {
    if gpu.root_port_vendor == Some(0x10de) {
        return Level::Sys;
    }
    if nic.address == gpu.address {
        return Level::X;
    }
    let a = &nic.path[..nic.path.len().saturating_sub(1)];
    let b = &gpu.path[..gpu.path.len().saturating_sub(1)];
    let common = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
    match common {
        0 => match (nic.numa_node, gpu.numa_node) {
            (Some(x), Some(y)) if x == y => Level::Node,
            _ => Level::Sys,
        },
        1 => Level::Phb,
        _ => {
            if a.len() - common <= 1 && b.len() - common <= 1 {
                Level::Pix
            } else {
                Level::Pxb
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(path: &[&str], numa: i32) -> PciNode {
        PciNode {
            address: path.last().unwrap().to_string(),
            path: path.iter().map(|s| s.to_string()).collect(),
            numa_node: Some(numa),
            root_port_vendor: None,
        }
    }

    #[test]
    fn levels_follow_the_pci_tree() {
        let nic = node(&["pci0000:17", "0000:17:01.0", "0000:18:00.0", "0000:19:08.0", "0000:1a:00.0"], 0);
        let same_switch = node(&["pci0000:17", "0000:17:01.0", "0000:18:00.0", "0000:19:10.0", "0000:1b:00.0"], 0);
        let nested = node(
            &[
                "pci0000:17",
                "0000:17:01.0",
                "0000:18:00.0",
                "0000:19:10.0",
                "0000:1c:00.0",
                "0000:1d:00.0",
                "0000:1e:00.0",
            ],
            0,
        );
        let same_rc = node(&["pci0000:17", "0000:17:02.0", "0000:20:00.0"], 0);
        let other_rc = node(&["pci0000:30", "0000:30:01.0", "0000:31:00.0"], 0);
        let other_numa = node(&["pci0000:90", "0000:90:01.0", "0000:91:00.0"], 1);
        assert_eq!(level_between(&nic, &same_switch), Level::Pix);
        assert_eq!(level_between(&nic, &nested), Level::Pxb);
        assert_eq!(level_between(&nic, &same_rc), Level::Phb);
        assert_eq!(level_between(&nic, &other_rc), Level::Node);
        assert_eq!(level_between(&nic, &other_numa), Level::Sys);
        let mut grace_gpu = other_rc.clone();
        grace_gpu.root_port_vendor = Some(0x10de);
        assert_eq!(level_between(&nic, &grace_gpu), Level::Sys);
    }

    #[test]
    fn metadata_parses_and_ignores_unknown_fields() {
        let raw = br#"{"version":"1.0","node_name":"n","gpus":[
            {"gpu_id":0,"pci_address":"00000000:0F:00.0","numa_node":0,"uuid":"GPU-1","nvlinks":[]},
            {"gpu_id":1,"pci_address":"0000:15:00.0","numa_node":-1}],
            "nic_topology":{"mlx5_0":["PIX","SYS"],"mlx5_1":["NODE","NV18"]},"extra":{"a":1}}"#;
        let m = parse_metadata("m.json", raw).unwrap();
        assert_eq!(m.gpus[0], (Some("0000:0f:00.0".into()), Some(0)));
        assert_eq!(m.gpus[1].1, None);
        assert_eq!(m.nic_topology["mlx5_0"], vec![Level::Pix, Level::Sys]);
        assert_eq!(m.nic_topology["mlx5_1"], vec![Level::Node, Level::Nv(18)]);
        assert!(matches!(parse_metadata("m.json", b"{\"gpus\":[]}"), Err(MetadataError::EmptyTopology { .. })));
        assert!(matches!(
            parse_metadata("m.json", b"{\"gpus\":[],\"nic_topology\":{}}"),
            Err(MetadataError::EmptyTopology { .. })
        ));
        let err = parse_metadata("/x/m.json", b"{not json").unwrap_err();
        assert!(err.to_string().contains("/x/m.json"), "{err}");
    }

    proptest! {
        #[test]
        fn metadata_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_metadata("p", &bytes);
        }

        #[test]
        fn metadata_parser_never_panics_on_json_shapes(
            pci in "[0-9a-fA-F:.]{0,16}", numa in any::<i64>(), lvl in "[A-Z0-9]{0,5}",
        ) {
            let raw = format!(r#"{{"gpus":[{{"pci_address":"{pci}","numa_node":{numa}}}],"nic_topology":{{"mlx5_0":["{lvl}"]}}}}"#);
            let _ = parse_metadata("p", raw.as_bytes());
        }
    }
}
