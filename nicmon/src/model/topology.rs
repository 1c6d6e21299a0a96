//! The inputs of role classification that come from the GPU side: each NIC's relationship
//! to each GPU (`nvidia-smi topo -m`'s levels), read by [`crate::read::topology`].
use std::collections::{BTreeMap, BTreeSet};

/// A GPU↔NIC relationship, as `nvidia-smi topo -m` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The device itself.
    X,
    /// At most one PCIe switch between them.
    Pix,
    /// Several PCIe bridges, below the host bridge.
    Pxb,
    /// Same PCIe host bridge (root complex).
    Phb,
    /// Different host bridges, same NUMA node.
    Node,
    /// Across NUMA nodes (or NVLink-C2C attached GPUs on Grace).
    Sys,
    /// NVLink bond of n links (GPU↔GPU only).
    Nv(u32),
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.trim() {
            "X" => Level::X,
            "PIX" => Level::Pix,
            "PXB" => Level::Pxb,
            "PHB" => Level::Phb,
            "NODE" => Level::Node,
            "SYS" => Level::Sys,
            other => Level::Nv(other.strip_prefix("NV")?.parse().ok()?),
        })
    }

    pub fn name(&self) -> String {
        match self {
            Level::X => "X".into(),
            Level::Pix => "PIX".into(),
            Level::Pxb => "PXB".into(),
            Level::Phb => "PHB".into(),
            Level::Node => "NODE".into(),
            Level::Sys => "SYS".into(),
            Level::Nv(n) => format!("NV{n}"),
        }
    }
}

/// Where the topology came from (exported as a metric and in `nicmon check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Metadata,
    Sysfs,
    None,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Metadata => "metadata",
            Source::Sysfs => "sysfs",
            Source::None => "none",
        }
    }
}

/// The inputs of role classification that come from the GPU side.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub source: Source,
    /// GPU PCI addresses, in metadata order.
    pub gpus: Vec<String>,
    /// NUMA nodes hosting a GPU (unknown ones left out).
    pub gpu_numa: BTreeSet<i32>,
    /// Level of each NIC to each GPU (same order as `gpus`).
    pub levels: BTreeMap<String, Vec<Level>>,
    /// Why the fallback was used, or other things worth a warning.
    pub notes: Vec<String>,
}
