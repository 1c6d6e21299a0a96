//! The snapshot of a node: what the read layer produces and the decide layer consumes.
//!
//! Plain immutable data, no I/O. Every value read from the host that can be unreadable is
//! an `Option`; unrecognised kernel strings are kept in an `Unknown` variant.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Logical port state, `ports/<n>/state` (`"4: ACTIVE"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Unknown(String),
}

impl PortState {
    pub fn name(&self) -> &str {
        match self {
            PortState::Nop => "NOP",
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Unknown(s) => s,
        }
    }
}

/// Physical port state, `ports/<n>/phys_state` (`"5: LinkUp"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PhysState {
    Sleep,
    Polling,
    Disabled,
    PortConfigurationTraining,
    LinkUp,
    LinkErrorRecovery,
    PhyTest,
    Unknown(String),
}

impl PhysState {
    pub fn name(&self) -> &str {
        match self {
            PhysState::Sleep => "Sleep",
            PhysState::Polling => "Polling",
            PhysState::Disabled => "Disabled",
            PhysState::PortConfigurationTraining => "PortConfigurationTraining",
            PhysState::LinkUp => "LinkUp",
            PhysState::LinkErrorRecovery => "LinkErrorRecovery",
            PhysState::PhyTest => "Phy Test",
            PhysState::Unknown(s) => s,
        }
    }

    /// The link is training: what a pulled cable and a brief retrain both look like.
    pub fn is_training(&self) -> bool {
        matches!(self, PhysState::Polling | PhysState::LinkErrorRecovery | PhysState::PortConfigurationTraining)
    }
}

/// `ports/<n>/link_layer`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unknown(String),
}

impl LinkLayer {
    pub fn name(&self) -> &str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unknown(s) => s,
        }
    }
}

/// `class/net/<if>/operstate` (RFC 2863 names as the kernel prints them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperState {
    Unknown,
    NotPresent,
    Down,
    LowerLayerDown,
    Testing,
    Dormant,
    Up,
    Other(String),
}

impl OperState {
    pub fn name(&self) -> &str {
        match self {
            OperState::Unknown => "unknown",
            OperState::NotPresent => "notpresent",
            OperState::Down => "down",
            OperState::LowerLayerDown => "lowerlayerdown",
            OperState::Testing => "testing",
            OperState::Dormant => "dormant",
            OperState::Up => "up",
            OperState::Other(s) => s,
        }
    }
}

/// `ports/<n>/rate`: `"400 Gb/sec (4X NDR)"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub gbps: f64,
    /// Lane width, e.g. `"4X"`.
    pub width: Option<String>,
    /// Speed name, e.g. `"NDR"`; absent on old kernels (`"10 Gb/sec (4X)"`).
    pub speed: Option<String>,
}

/// One port of an RDMA device, as read in one poll.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Port {
    pub number: u32,
    pub link_layer: Option<LinkLayer>,
    pub state: Option<PortState>,
    pub phys_state: Option<PhysState>,
    pub rate: Option<Rate>,
    pub lid: Option<u32>,
    pub sm_lid: Option<u32>,
    /// The netdev's `operstate` (RoCE ports; IB ports with an IPoIB netdev too).
    pub operstate: Option<OperState>,
    /// Counter values keyed by the counter rule's `path` as configured
    /// (`counters/link_downed`, `hw_counters/rnr_nak_retry_err`,
    /// `/sys/class/net/{interface}/carrier_changes`). Unreadable ones are absent.
    pub counters: BTreeMap<String, u64>,
}

impl Port {
    /// Healthy = `ACTIVE` and `LinkUp` (000 §3.4).
    pub fn is_healthy(&self) -> bool {
        self.state == Some(PortState::Active) && self.phys_state == Some(PhysState::LinkUp)
    }
}

/// Whether a device is a physical or a virtual PCI function (000 §8.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Function {
    Pf,
    Vf,
    /// Neither `physfn` nor `sriov_totalvfs`: treated as a PF.
    Unknown,
}

/// One entry of `class/infiniband`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// Why this device is not a candidate for monitoring (non-Mellanox), or `None`.
    pub unsupported: Option<String>,
    pub pci_address: Option<String>,
    /// PCI `domain:bus:device` (`0000:3b:00`): the physical card.
    pub card: Option<String>,
    pub numa_node: Option<i32>,
    pub hca_type: Option<String>,
    pub fw_ver: Option<String>,
    pub board_id: Option<String>,
    pub driver: Option<String>,
    pub function: Function,
    pub netdev: Option<String>,
    pub ports: Vec<Port>,
}

impl Device {
    pub fn is_vf(&self) -> bool {
        self.function == Function::Vf
    }
}

/// A GPU found on the PCI bus (the sysfs topology fallback).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PciGpu {
    pub pci_address: String,
    pub numa_node: Option<i32>,
}

/// What the inline PCI check (002 §5.9) found for a device missing from `class/infiniband`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PciPresence {
    /// `bus/pci/devices/<bdf>` is gone: clean removal (driver unload / hot removal).
    Gone,
    /// Config space reads all `0xFF`: the device fell off the bus.
    AllOnes,
    /// Config space reads back real bytes: the function is there, the RDMA device is not.
    Present,
    /// Reading config space failed: PCI bus error.
    ReadError(String),
}

/// Everything one poll read from the host.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    pub devices: Vec<Device>,
    /// Interfaces that carry a default route (`<procfs>/net/route`).
    pub default_route_ifaces: Vec<String>,
    /// The IB devices behind those interfaces (`class/net/<if>/device/infiniband/*`).
    pub default_route_devices: Vec<String>,
    /// PCI probe results for devices the caller asked about (known devices now missing).
    pub pci_probes: BTreeMap<String, PciPresence>,
}

impl Snapshot {
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }
}
