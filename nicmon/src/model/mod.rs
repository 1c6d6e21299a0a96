//! The snapshot of a node: what the read layer produces and the decide layer consumes.
//!
//! Plain immutable data, no I/O. Every value read from the host that can be unreadable is
//! an `Option`; unrecognised kernel strings are kept in an `Unknown` variant.
pub mod cause;
pub mod devlink;
pub mod driver;
pub mod ethtool;
pub mod event;
pub mod history;
pub mod kmsg;
pub mod module;
pub mod observation;
pub mod pcie;
pub mod read_error;
pub mod thermal;
pub mod topology;

pub use read_error::ReadError;

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

    /// The state named `name` as [`PortState::name`] prints it; any other name is kept as
    /// `Unknown`.
    pub fn from_name(name: &str) -> PortState {
        [PortState::Nop, PortState::Down, PortState::Init, PortState::Armed, PortState::Active, PortState::ActiveDefer]
            .into_iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| PortState::Unknown(name.to_string()))
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
    /// An EFA port whose netdev is down (`linkstate::efa`): no kernel `phys_state` file
    /// says this, the efa driver hard-codes `LinkUp` there.
    LinkDown,
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
            PhysState::LinkDown => "LinkDown",
            PhysState::Unknown(s) => s,
        }
    }

    /// The state named `name` as [`PhysState::name`] prints it; any other name is kept as
    /// `Unknown`.
    pub fn from_name(name: &str) -> PhysState {
        [
            PhysState::Sleep,
            PhysState::Polling,
            PhysState::Disabled,
            PhysState::PortConfigurationTraining,
            PhysState::LinkUp,
            PhysState::LinkErrorRecovery,
            PhysState::PhyTest,
            PhysState::LinkDown,
        ]
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| PhysState::Unknown(name.to_string()))
    }

    /// The link is training: what a pulled cable and a brief retrain both look like.
    pub fn is_training(&self) -> bool {
        matches!(self, PhysState::Polling | PhysState::LinkErrorRecovery | PhysState::PortConfigurationTraining)
    }
}

/// `ports/<n>/link_layer`, except `Efa`: the `efa` driver's ports read `Unknown` there;
/// discovery names them by their driver (AWS Elastic Fabric Adapter).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Efa,
    Unknown(String),
}

impl LinkLayer {
    pub fn name(&self) -> &str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Efa => "EFA",
            LinkLayer::Unknown(s) => s,
        }
    }

    /// The link layer named `name` as [`LinkLayer::name`] prints it; any other name is kept
    /// as `Unknown`.
    pub fn from_name(name: &str) -> LinkLayer {
        [LinkLayer::InfiniBand, LinkLayer::Ethernet, LinkLayer::Efa]
            .into_iter()
            .find(|l| l.name() == name)
            .unwrap_or_else(|| LinkLayer::Unknown(name.to_string()))
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
    /// The netdev's `carrier` (`1` → true, `0` → false); `None` when there is no netdev or
    /// the file is unreadable or not a number (it fails with `EINVAL` while admin-down).
    #[serde(default)]
    pub carrier: Option<bool>,
    /// Counter values keyed by the counter rule's `path` as configured
    /// (`counters/link_downed`, `hw_counters/rnr_nak_retry_err`,
    /// `/sys/class/net/{interface}/carrier_changes`). Unreadable ones are absent.
    pub counters: BTreeMap<std::sync::Arc<str>, u64>,
    /// Attributes read as "unknown", and why (`state` → `"not a regular file (fifo): not
    /// read"`, `phys_state` → `"unparsable value \"N/A (no PMA)\""`). An unknown value is no
    /// value: the decide layer makes no decision from it (issue #14).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
    /// A RoCE port's ethtool data, as its netdev's driver answered this poll (SPEC §1.11);
    /// its values are in `counters` as `ethtool/...`. `None`: not read (not RoCE, not
    /// supported, no source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<crate::model::ethtool::EthtoolSnapshot>,
    /// How long before this poll `ethtool` was read: reads are paced
    /// (`[phyCheck] readInterval`) and the last one is kept in between. `None`: not read.
    #[serde(skip)]
    pub ethtool_age: Option<std::time::Duration>,
    /// The port's transceiver pages, as its netdev's driver answered (SPEC §1.13): read at
    /// most every `[opticsCheck] readInterval` and at once when the port's state changes,
    /// the last reading kept in between ([`crate::read::ethtool::modules`]). `None`: not
    /// read (no netdev, not supported, no module, no source). Decoded by
    /// [`crate::model::module::decode`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<std::sync::Arc<crate::model::module::Pages>>,
    /// A RoCE port's netdev `speed` in Mb/s, read while `[phyCheck]` is enabled: the port
    /// rate of the pre-FEC BER where `rate` gives none. `None`: not read, unreadable, or
    /// unknown (`-1`, no link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netdev_speed: Option<u64>,
}

impl Port {
    /// The port's rate in bit/s: the RDMA port's `rate`, else its netdev's `speed`; `None`
    /// when neither gives a rate above zero.
    pub fn rate_bps(&self) -> Option<f64> {
        let positive = |r: &f64| r.is_finite() && *r > 0.0;
        let rate = self.rate.as_ref().map(|r| r.gbps * 1e9).filter(positive);
        rate.or_else(|| self.netdev_speed.map(|mbps| mbps as f64 * 1e6).filter(positive))
    }

    /// Healthy = `ACTIVE` and `LinkUp` (000 §3.4).
    pub fn is_healthy(&self) -> bool {
        self.state == Some(PortState::Active) && self.phys_state == Some(PhysState::LinkUp)
    }

    /// The first of `state`, `phys_state` that is unknown (unreadable, empty or unparsable),
    /// with why: such a port gets no state decision this poll.
    pub fn unknown_state(&self) -> Option<(&'static str, String)> {
        let why = |attr: &str, raw: Option<&str>| {
            self.unknown.get(attr).cloned().unwrap_or_else(|| match raw {
                Some(t) => format!("unparsable value {:?}", t),
                None => "unreadable".to_string(),
            })
        };
        match &self.state {
            None => return Some(("state", why("state", None))),
            Some(PortState::Unknown(t)) => return Some(("state", why("state", Some(t)))),
            Some(_) => {}
        }
        match &self.phys_state {
            None => Some(("phys_state", why("phys_state", None))),
            Some(PhysState::Unknown(t)) => Some(("phys_state", why("phys_state", Some(t)))),
            Some(_) => None,
        }
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
    /// Why this device is not a candidate for monitoring (its RDMA driver not recognised),
    /// or `None`.
    pub unsupported: Option<String>,
    pub pci_address: Option<String>,
    /// PCI `domain:bus:device` (`0000:3b:00`): the physical card.
    pub card: Option<String>,
    pub numa_node: Option<i32>,
    pub hca_type: Option<String>,
    pub fw_ver: Option<String>,
    pub board_id: Option<String>,
    pub driver: Option<String>,
    /// The RDMA driver recognised from `driver`, the PCI vendor (or, for the software
    /// drivers, the absence of a PCI function); `None`: not recognised — not monitored
    /// unless `nicInclusionRegexOverride` lists it (SPEC §1.14).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_driver: Option<driver::RdmaDriver>,
    pub function: Function,
    pub netdev: Option<String>,
    pub ports: Vec<Port>,
    /// Device attributes read as "unknown", and why (`numa_node`); see [`Port::unknown`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
    /// The PCIe link and AER statistics of a monitored PF (SPEC §1.10); `None` for VFs,
    /// unsupported devices and a device without a PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<crate::model::pcie::reading::PcieReading>,
}

#[cfg(test)]
impl Device {
    /// A PF named `name` with `ports` and nothing else known (tests set what they need on it).
    pub fn pf(name: &str, ports: Vec<Port>) -> Device {
        Device {
            name: name.into(),
            unsupported: None,
            pci_address: None,
            card: None,
            numa_node: None,
            hca_type: None,
            fw_ver: None,
            board_id: None,
            driver: None,
            rdma_driver: None,
            function: Function::Pf,
            netdev: None,
            ports,
            unknown: Default::default(),
            pcie: None,
        }
    }
}

impl Device {
    pub fn is_vf(&self) -> bool {
        self.function == Function::Vf
    }

    /// A software RDMA device (`rxe`, `siw`): no PCI function, never fatal.
    pub fn is_software(&self) -> bool {
        self.rdma_driver.is_some_and(driver::RdmaDriver::is_software)
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
    /// Shared: an unmonitored device's reading is the same from poll to poll
    /// ([`crate::read::discovery::Unmonitored`]), and a poll's snapshot is kept by the next.
    pub devices: Vec<std::sync::Arc<Device>>,
    /// Interfaces that carry a default route (`<procfs>/net/route`).
    pub default_route_ifaces: Vec<String>,
    /// The IB devices behind those interfaces (`class/net/<if>/device/infiniband/*`).
    pub default_route_devices: Vec<String>,
    /// PCI probe results for devices the caller asked about (known devices now missing).
    pub pci_probes: BTreeMap<String, PciPresence>,
    /// The InfiniBand character-device class directories (`class/infiniband_verbs`,
    /// `class/infiniband_mad`): what udev makes `/dev/infiniband/*` from.
    /// Shared: the same from poll to poll while the directories list the same entries.
    #[serde(default)]
    pub char_devices: std::sync::Arc<CharDevices>,
    /// The hwmon temperature sensors of each monitored PCI function, by PCI address
    /// (SPEC §1.13): read on a full poll, kept by a targeted one. Shared: the same reading
    /// from poll to poll until the sensors are read again (every `thermal.readInterval`).
    #[serde(default, skip_serializing_if = "no_sensors")]
    pub thermal: std::sync::Arc<Thermal>,
    /// The devlink health reporters of each monitored PCI function, by PCI address (SPEC
    /// §1.13); a function that has none (no devlink, not supported) is absent.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devlink: BTreeMap<String, devlink::Reporters>,
}

/// The sensors of each PCI function, by PCI address ([`Snapshot::thermal`]).
pub type Thermal = BTreeMap<String, Vec<thermal::Sensor>>;

fn no_sensors(t: &std::sync::Arc<Thermal>) -> bool {
    t.is_empty()
}

/// The kind of an InfiniBand character device (the prefix of its class entry's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CharKind {
    /// `infiniband_verbs/uverbsN`: one per device (`/dev/infiniband/uverbsN`).
    Uverbs,
    /// `infiniband_mad/umadN`: one per port.
    Umad,
    /// `infiniband_mad/issmN`: one per port, on the architectures that create it.
    Issm,
}

impl CharKind {
    pub const ALL: [CharKind; 3] = [CharKind::Uverbs, CharKind::Umad, CharKind::Issm];

    pub fn name(self) -> &'static str {
        match self {
            CharKind::Uverbs => "uverbs",
            CharKind::Umad => "umad",
            CharKind::Issm => "issm",
        }
    }

    /// The class directory (below `class/`) its entries live in.
    pub fn class_dir(self) -> &'static str {
        match self {
            CharKind::Uverbs => "infiniband_verbs",
            CharKind::Umad | CharKind::Issm => "infiniband_mad",
        }
    }

    /// The kind of a class entry by its name (`umad3`); `abi_version` and others → `None`.
    pub fn of_entry(name: &str) -> Option<CharKind> {
        CharKind::ALL.into_iter().find(|k| {
            name.strip_prefix(k.name()).is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    }
}

/// One character-device class entry, mapped to its device (and port) by its own `ibdev`
/// and `port` attributes; `None` where those are unreadable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharNode {
    pub kind: CharKind,
    /// The entry's name (`umad3`).
    pub name: String,
    pub device: Option<String>,
    /// The IB port (`umad`, `issm`); `None` for `uverbs` and when unreadable.
    pub port: Option<u32>,
}

/// What reading one class directory gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ClassDir {
    /// The directory does not exist (the module is not loaded, or no such tree).
    #[default]
    Absent,
    /// It could not be listed (not a directory, permission, ...): why.
    Unreadable(String),
    Listed(Vec<CharNode>),
}

/// Both character-device class directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CharDevices {
    /// `class/infiniband_verbs`.
    pub verbs: ClassDir,
    /// `class/infiniband_mad`.
    pub mad: ClassDir,
}

impl CharDevices {
    /// The directory `kind`'s entries are read from.
    pub fn dir(&self, kind: CharKind) -> &ClassDir {
        match kind {
            CharKind::Uverbs => &self.verbs,
            CharKind::Umad | CharKind::Issm => &self.mad,
        }
    }
}

impl Snapshot {
    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name).map(|d| &**d)
    }
}
