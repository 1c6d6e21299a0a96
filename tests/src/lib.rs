//! The simulated-node testbed: realistic host trees (sysfs, procfs, `gpu_metadata.json`)
//! written from a short description, ready-made nodes for the six platforms of seed 000 §4,
//! and mutation helpers to inject faults. `nicmon` reads these trees through the same code
//! that reads `/sys` and `/proc`; only the roots differ.
//!
//! The PCI tree is real-looking: root complexes (`devices/pci0000:17`), root ports, PCIe
//! switches (an upstream port with downstream ports), `bus/pci/devices/<bdf>` links,
//! `class/infiniband/<dev>` and `class/net/<if>` links into the device directories.
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub mod alerts;
pub mod blocking;
pub mod connector;
pub mod daemon;
pub mod debian;
pub mod deploy;
pub mod frozen;
pub mod kernel_log;
pub mod latency;
pub mod optics;
pub mod pcie;
pub mod platforms;
pub mod prom_server;
pub mod prometheus;
pub mod promql;
pub mod vendors;

/// Link layer of a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Ib,
    Eth,
    /// AWS Elastic Fabric Adapter (driver `efa`, vendor 0x1d0f).
    Efa,
}

/// Where a PCI function hangs: a bridge directory in the tree.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Path below `sys/` of the bridge (or root complex) directory.
    dir: String,
    domain: u16,
    bus: u8,
    rc: usize,
    numa: i32,
    /// The switch whose downstream port this is, and the outermost switch above it.
    switch: Option<usize>,
    group: Option<usize>,
}

impl Slot {
    /// The bus number devices placed on this slot sit on.
    pub fn bus(&self) -> u8 {
        self.bus
    }
}

/// A GPU or NIC placed in the tree (for metadata levels).
#[derive(Debug, Clone)]
struct Placed {
    bdf: String,
    rc: usize,
    numa: i32,
    switch: Option<usize>,
    group: Option<usize>,
    c2c: bool,
}

/// What a NIC (one PCI physical function, one IB device) looks like.
#[derive(Debug, Clone)]
pub struct NicSpec {
    pub name: String,
    pub link: Link,
    pub hca_type: String,
    pub rate: String,
    pub netdev: Option<String>,
    /// Whose NIC it is (its PCI vendor, driver and counters); Mellanox unless said.
    pub vendor: vendors::Vendor,
}

impl NicSpec {
    pub fn ib(name: &str) -> NicSpec {
        NicSpec {
            name: name.into(),
            link: Link::Ib,
            hca_type: "MT4129".into(),
            rate: "400 Gb/sec (4X NDR)".into(),
            netdev: None,
            vendor: vendors::Vendor::Mellanox,
        }
    }
    pub fn eth(name: &str, netdev: &str) -> NicSpec {
        NicSpec {
            name: name.into(),
            link: Link::Eth,
            hca_type: "MT4129".into(),
            rate: "200 Gb/sec (4X HDR)".into(),
            netdev: Some(netdev.into()),
            vendor: vendors::Vendor::Mellanox,
        }
    }
    pub fn hca(mut self, h: &str) -> NicSpec {
        self.hca_type = h.into();
        self
    }
    pub fn rate(mut self, r: &str) -> NicSpec {
        self.rate = r.into();
        self
    }
    pub fn netdev(mut self, n: &str) -> NicSpec {
        self.netdev = Some(n.into());
        self
    }
    /// An EFA device (`rdmap79s0`); `netdev` on ENA+EFA adapters, `None` on EFA-only ones.
    /// `hca` holds the PCI device id (`efa0` on p4d, `efa1` on p5).
    pub fn efa(name: &str, netdev: Option<&str>) -> NicSpec {
        NicSpec {
            name: name.into(),
            link: Link::Efa,
            hca_type: "efa1".into(),
            rate: "100 Gb/sec (4X EDR)".into(),
            netdev: netdev.map(str::to_string),
            vendor: vendors::Vendor::Mellanox,
        }
    }
}

/// The netdev `speed` (Mb/s) of a port whose RDMA `rate` is `rate` (`"200 Gb/sec (4X
/// HDR)"` → 200000); `-1` (unknown) when the rate names none.
fn speed_of(rate: &str) -> i64 {
    let gbps = rate.split_whitespace().next().and_then(|n| n.parse::<f64>().ok());
    gbps.filter(|g| g.is_finite() && *g > 0.0).map_or(-1, |g| (g * 1000.0) as i64)
}

/// Facts about a NIC the tests need to mutate it.
#[derive(Debug, Clone)]
pub struct NicInfo {
    pub bdf: String,
    /// Path below `sys/` of the IB device directory (inside the PCI device).
    pub ib_dir: String,
    pub pci_dir: String,
    pub netdev: Option<String>,
    pub is_vf: bool,
}

/// IB PMA counters (`counters/`) every port gets.
pub const PORT_COUNTERS: &[&str] = &[
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "port_xmit_wait",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
];

/// mlx5 `hw_counters/` every port gets (availability differs in the field; tests remove some).
pub const HW_COUNTERS: &[&str] = &[
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "req_transport_retries_exceeded",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
    "rx_atomic_requests",
    "req_cqe_error",
    "req_cqe_flush_error",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_remote_access_errors",
    "lifespan",
];

/// EFA per-port `hw_counters/` (the efa driver's port stats).
pub const EFA_PORT_COUNTERS: &[&str] = &[
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
    "lifespan",
];

/// EFA device-level `<dev>/hw_counters/` (admin queue and verbs error stats).
pub const EFA_DEVICE_COUNTERS: &[&str] = &[
    "alloc_pd_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "create_cq_err",
    "create_qp_err",
    "reg_mr_err",
    "mmap_err",
    "keep_alive_rcvd",
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "lifespan",
];

/// A node under construction and, once written, a host tree on disk.
pub struct Node {
    pub name: String,
    root: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    next_bus: BTreeMap<u16, u8>,
    rcs: Vec<(u16, i32)>,
    switches: usize,
    gpus: Vec<Placed>,
    nics: BTreeMap<String, Placed>,
    pub info: BTreeMap<String, NicInfo>,
    slots: BTreeMap<String, (Slot, u8)>,
    vf_count: BTreeMap<String, u32>,
    default_routes: Vec<String>,
    next_ifindex: u32,
    boot_id: String,
    /// Character-device class entries by (kind, device, port; 0 for uverbs).
    char_nodes: BTreeMap<(String, String, u32), String>,
}

/// A devlink replay file's text as nicmon writes it (`nicmon bundle`): pretty JSON, the
/// reporters sorted by name, each `name`, `state`, `error_count`, `recover_count` in that
/// order, one trailing newline — so a bundle's copy is byte-identical.
pub fn reporters_json(reporters: &[serde_json::Value]) -> String {
    let mut sorted: Vec<&serde_json::Value> = reporters.iter().collect();
    sorted.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let items: Vec<String> = sorted
        .iter()
        .map(|r| {
            format!(
                "    {{\n      \"name\": {},\n      \"state\": {},\n      \"error_count\": {},\n      \"recover_count\": {}\n    }}",
                r["name"], r["state"], r["error_count"], r["recover_count"]
            )
        })
        .collect();
    format!("{{\n  \"reporters\": [\n{}\n  ]\n}}\n", items.join(",\n"))
}

fn write(path: &Path, content: impl AsRef<[u8]>) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    }
    fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn link(target: &str, at: &Path) {
    if let Some(p) = at.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let _ = fs::remove_file(at);
    symlink(target, at).unwrap_or_else(|e| panic!("symlink {} -> {target}: {e}", at.display()));
}

/// `../` repeated for the depth of `from_dir` below `sys/`.
fn up(from_dir: &str) -> String {
    "../".repeat(from_dir.split('/').filter(|c| !c.is_empty()).count())
}

/// A PCI config space: vendor/device ids, then the rest of a 256-byte header.
fn config_space(vendor: u16, device: u16) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0..2].copy_from_slice(&vendor.to_le_bytes());
    c[2..4].copy_from_slice(&device.to_le_bytes());
    c[4] = 0x06;
    c[6] = 0x10;
    c
}

impl Node {
    /// A new, empty node in a temporary directory.
    pub fn new(name: &str) -> Node {
        let tmp = tempfile::Builder::new().prefix(&format!("nicmon-{name}-")).tempdir().expect("tempdir");
        Node::owning(name, tmp)
    }

    /// A new, empty node in a temporary directory in memory (tmpfs, `/dev/shm`) where
    /// there is one, else as [`Node::new`]. Sysfs is in memory: a write to this node's files
    /// (a fixture port going DOWN) then costs no block I/O — on a disk mounted with
    /// `discard`, truncating a file discards its blocks and closing it starts a writeback,
    /// whose interrupts land while the monitor is being timed. For latency measurements.
    pub fn in_memory(name: &str) -> Node {
        let shm = Path::new("/dev/shm");
        let prefix = format!("nicmon-{name}-");
        match shm.is_dir().then(|| tempfile::Builder::new().prefix(&prefix).tempdir_in(shm).ok()).flatten() {
            Some(tmp) => Node::owning(name, tmp),
            None => Node::new(name),
        }
    }

    /// A node in `tmp`, removed with the node.
    fn owning(name: &str, tmp: tempfile::TempDir) -> Node {
        let mut n = Node::at(name, tmp.path());
        n._tmp = Some(tmp);
        n
    }

    /// A new, empty node written under `root` (kept after the process exits).
    pub fn at(name: &str, root: &Path) -> Node {
        let n = Node {
            name: name.into(),
            root: root.to_path_buf(),
            _tmp: None,
            next_bus: BTreeMap::new(),
            rcs: Vec::new(),
            switches: 0,
            gpus: Vec::new(),
            nics: BTreeMap::new(),
            info: BTreeMap::new(),
            slots: BTreeMap::new(),
            vf_count: BTreeMap::new(),
            default_routes: Vec::new(),
            next_ifindex: 2,
            boot_id: "00000000-0000-4000-8000-000000000001".into(),
            char_nodes: BTreeMap::new(),
        };
        for d in [
            "class/infiniband",
            "class/net",
            "bus/pci/devices",
            "bus/pci/drivers/mlx5_core",
            "bus/pci/drivers/efa",
            "bus/pci/drivers/nvidia",
            "bus/pci/drivers/pcieport",
        ] {
            fs::create_dir_all(n.sys().join(d)).unwrap();
        }
        // The character-device classes (ib_uverbs, ib_umad): each has an `abi_version` file.
        write(&n.sys().join("class/infiniband_verbs/abi_version"), "6\n");
        write(&n.sys().join("class/infiniband_mad/abi_version"), "5\n");
        write(&n.proc().join("sys/kernel/random/boot_id"), format!("{}\n", n.boot_id));
        n.write_route();
        n
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn sys(&self) -> PathBuf {
        self.root.join("sys")
    }
    pub fn proc(&self) -> PathBuf {
        self.root.join("proc")
    }
    pub fn metadata_path(&self) -> PathBuf {
        self.root.join("gpu_metadata.json")
    }

    fn bus(&mut self, domain: u16) -> u8 {
        let b = self.next_bus.entry(domain).or_insert(0);
        *b = b.wrapping_add(1);
        *b
    }

    /// Make the next bus number handed out in `domain` (by [`Node::root_complex`] or as a
    /// bridge's secondary bus) be `bus`, to place cards at the PCI addresses of a real
    /// node (`0000:61:00.0` from a bug report). Bus numbers are otherwise sequential.
    pub fn next_bus(&mut self, domain: u16, bus: u8) {
        self.next_bus.insert(domain, bus.wrapping_sub(1));
    }

    /// A root complex (PCIe host bridge) on a NUMA node, in PCI domain `domain`.
    pub fn root_complex(&mut self, domain: u16, numa: i32) -> Slot {
        let bus = self.bus(domain);
        let rc = self.rcs.len();
        self.rcs.push((domain, numa));
        let dir = format!("devices/pci{domain:04x}:{bus:02x}");
        fs::create_dir_all(self.sys().join(&dir)).unwrap();
        Slot { dir, domain, bus, rc, numa, switch: None, group: None }
    }

    fn bridge(&mut self, parent: &Slot, dev: u8, vendor: u16) -> Slot {
        let bdf = format!("{:04x}:{:02x}:{:02x}.0", parent.domain, parent.bus, dev);
        let dir = format!("{}/{bdf}", parent.dir);
        self.pci_function(&dir, &bdf, vendor, 0x1234, 0x060400, parent.numa, Some("pcieport"));
        let bus = self.bus(parent.domain);
        Slot {
            dir,
            domain: parent.domain,
            bus,
            rc: parent.rc,
            numa: parent.numa,
            switch: parent.switch,
            group: parent.group,
        }
    }

    /// A root port of a root complex (device number `dev` on the root bus).
    pub fn root_port(&mut self, rc: &Slot, dev: u8) -> Slot {
        self.bridge(rc, dev, 0x8086)
    }

    /// A root port made by NVIDIA (Grace): GPUs behind it are NVLink-C2C attached.
    pub fn nvidia_root_port(&mut self, rc: &Slot, dev: u8) -> Slot {
        self.bridge(rc, dev, 0x10de)
    }

    /// A PCIe switch below `parent`: its upstream port. Add downstream ports with
    /// [`Node::switch_port`].
    pub fn switch(&mut self, parent: &Slot) -> Slot {
        let mut up = self.bridge(parent, 0, 0x1000);
        self.switches += 1;
        up.switch = Some(self.switches);
        up.group = parent.group.or(Some(self.switches));
        up
    }

    /// Downstream port `dev` of a switch.
    pub fn switch_port(&mut self, switch_up: &Slot, dev: u8) -> Slot {
        self.bridge(switch_up, dev, 0x1000)
    }

    #[allow(clippy::too_many_arguments)]
    fn pci_function(
        &self,
        dir: &str,
        bdf: &str,
        vendor: u16,
        device: u16,
        class: u32,
        numa: i32,
        driver: Option<&str>,
    ) {
        let d = self.sys().join(dir);
        write(&d.join("vendor"), format!("{vendor:#06x}\n"));
        write(&d.join("device"), format!("{device:#06x}\n"));
        write(&d.join("class"), format!("{class:#08x}\n"));
        write(&d.join("numa_node"), format!("{numa}\n"));
        write(&d.join("config"), config_space(vendor, device));
        let mut uevent = format!("PCI_CLASS={class:X}\nPCI_ID={vendor:04X}:{device:04X}\nPCI_SLOT_NAME={bdf}\n");
        if let Some(drv) = driver {
            uevent = format!("DRIVER={drv}\n{uevent}");
            link(&format!("{}bus/pci/drivers/{drv}", up(dir)), &d.join("driver"));
        }
        write(&d.join("uevent"), uevent);
        pcie::write_function(&d);
        link(&format!("../../../{dir}"), &self.sys().join(format!("bus/pci/devices/{bdf}")));
    }

    /// A GPU (NVIDIA 3D controller) at function 0 of `dev` on the slot's bus.
    pub fn gpu(&mut self, slot: &Slot, dev: u8) -> String {
        let bdf = format!("{:04x}:{:02x}:{:02x}.0", slot.domain, slot.bus, dev);
        let dir = format!("{}/{bdf}", slot.dir);
        self.pci_function(&dir, &bdf, 0x10de, 0x2330, 0x030200, slot.numa, Some("nvidia"));
        let c2c = self.sys().join(&slot.dir).join("vendor").exists()
            && fs::read_to_string(self.sys().join(&slot.dir).join("vendor")).unwrap_or_default().trim() == "0x10de";
        self.gpus.push(Placed {
            bdf: bdf.clone(),
            rc: slot.rc,
            numa: slot.numa,
            switch: slot.switch,
            group: slot.group,
            c2c,
        });
        bdf
    }

    /// An NVSwitch bridge function (class 0x0680): an NVIDIA device that is not a GPU.
    pub fn nvswitch(&mut self, slot: &Slot, dev: u8) {
        let bdf = format!("{:04x}:{:02x}:{:02x}.0", slot.domain, slot.bus, dev);
        let dir = format!("{}/{bdf}", slot.dir);
        self.pci_function(&dir, &bdf, 0x10de, 0x22a3, 0x068000, slot.numa, None);
    }

    /// A NIC card at `dev` on the slot's bus, one PF per spec (function 0, 1, ...).
    pub fn card(&mut self, slot: &Slot, dev: u8, pfs: Vec<NicSpec>) -> Vec<String> {
        let mut names = Vec::new();
        for (f, spec) in pfs.into_iter().enumerate() {
            let bdf = format!("{:04x}:{:02x}:{:02x}.{f}", slot.domain, slot.bus, dev);
            names.push(spec.name.clone());
            self.slots.insert(spec.name.clone(), (slot.clone(), dev));
            self.function(slot, &bdf, spec, None);
        }
        names
    }

    /// `n` SR-IOV VFs of PF `pf`, named after the last device (`mlx5_N+1`, ...), DOWN as
    /// unassigned VFs are. Call after all PFs exist so PF names stay in order.
    pub fn vfs(&mut self, pf: &str, n: u32) -> Vec<String> {
        let (slot, dev) = self.slots[pf].clone();
        let pf_bdf = self.info[pf].bdf.clone();
        let mut names = Vec::new();
        for _ in 0..n {
            let k = self.vf_count.entry(pf.to_string()).or_insert(0);
            *k += 1;
            let idx = *k;
            // VFs live on the PF's bus after its functions (ARI: device numbers above the card's).
            let (vdev, vfn) = (dev + 1 + (idx / 8) as u8, (idx % 8) as u8);
            let vbdf = format!("{:04x}:{:02x}:{:02x}.{vfn}", slot.domain, slot.bus, vdev);
            let vname = self.next_vf_name();
            let vspec = NicSpec { name: vname.clone(), netdev: None, ..self.spec_of(pf) };
            self.function(&slot, &vbdf, vspec, Some(&pf_bdf));
            names.push(vname);
        }
        names
    }

    fn spec_of(&self, name: &str) -> NicSpec {
        let info = &self.info[name];
        let ll = fs::read_to_string(self.sys().join(&info.ib_dir).join("ports/1/link_layer")).unwrap_or_default();
        let hca = fs::read_to_string(self.sys().join(&info.ib_dir).join("hca_type")).unwrap_or_default();
        NicSpec {
            name: name.into(),
            link: match ll.trim() {
                "InfiniBand" => Link::Ib,
                "Ethernet" => Link::Eth,
                _ => Link::Efa,
            },
            hca_type: hca.trim().into(),
            rate: "400 Gb/sec (4X NDR)".into(),
            netdev: None,
            vendor: vendors::Vendor::Mellanox,
        }
    }

    /// VFs are named after the PFs, continuing mlx5_N numbering.
    fn next_vf_name(&self) -> String {
        let mut n = self.info.len();
        while self.info.contains_key(&format!("mlx5_{n}")) {
            n += 1;
        }
        format!("mlx5_{n}")
    }

    fn function(&mut self, slot: &Slot, bdf: &str, spec: NicSpec, physfn: Option<&str>) {
        if spec.link == Link::Efa {
            return self.efa_function(slot, bdf, spec);
        }
        if spec.vendor != vendors::Vendor::Mellanox {
            return self.vendor_function(slot, bdf, spec);
        }
        let pci_dir = format!("{}/{bdf}", slot.dir);
        let class = if spec.link == Link::Ib { 0x020700 } else { 0x020000 };
        let device_id = if physfn.is_some() { 0x101e } else { 0x1021 };
        self.pci_function(&pci_dir, bdf, 0x15b3, device_id, class, slot.numa, Some("mlx5_core"));
        let pd = self.sys().join(&pci_dir);
        match physfn {
            Some(pf) => link(&format!("../{pf}"), &pd.join("physfn")),
            None => write(&pd.join("sriov_totalvfs"), "16\n"),
        }
        let ib_dir = format!("{pci_dir}/infiniband/{}", spec.name);
        let ib = self.sys().join(&ib_dir);
        write(&ib.join("hca_type"), format!("{}\n", spec.hca_type));
        write(&ib.join("fw_ver"), "28.39.1002\n");
        write(&ib.join("board_id"), "MT_0000000838\n");
        write(&ib.join("node_guid"), "b83f:d203:00c3:65c4\n");
        // `device` names the PCI function: ib_dir is <pci_dir>/infiniband/<name>.
        link(&format!("../../../{bdf}"), &ib.join("device"));
        link(
            &format!("{}{ib_dir}", up("class/infiniband")),
            &self.sys().join(format!("class/infiniband/{}", spec.name)),
        );
        let vf = physfn.is_some();
        if !vf {
            self.hwmon(&pci_dir, bdf);
            self.devlink_reporters(bdf, spec.netdev.is_some() && spec.link == Link::Eth);
        }
        let port = ib.join("ports/1");
        let (state, phys) = if vf { ("1: DOWN", "3: Disabled") } else { ("4: ACTIVE", "5: LinkUp") };
        write(&port.join("state"), format!("{state}\n"));
        write(&port.join("phys_state"), format!("{phys}\n"));
        write(&port.join("rate"), format!("{}\n", spec.rate));
        write(&port.join("link_layer"), if spec.link == Link::Ib { "InfiniBand\n" } else { "Ethernet\n" });
        let lid = if spec.link == Link::Ib { 0x10 + self.info.len() as u32 } else { 0 };
        write(&port.join("lid"), format!("{lid:#x}\n"));
        write(&port.join("sm_lid"), if spec.link == Link::Ib { "0x1\n" } else { "0x0\n" });
        write(&port.join("sm_sl"), "0\n");
        write(&port.join("lid_mask_count"), "0\n");
        write(&port.join("cap_mask"), "0x2651e848\n");
        for c in PORT_COUNTERS {
            write(&port.join("counters").join(c), "0\n");
        }
        for c in HW_COUNTERS {
            write(&port.join("hw_counters").join(c), if *c == "lifespan" { "12\n" } else { "0\n" });
        }
        // ib_uverbs: one uverbs per device; ib_umad: one umad and one issm per port.
        self.char_node(&pci_dir, "uverbs", &spec.name, None);
        self.char_node(&pci_dir, "umad", &spec.name, Some(1));
        self.char_node(&pci_dir, "issm", &spec.name, Some(1));
        if let Some(nd) = &spec.netdev {
            let net_dir = format!("{pci_dir}/net/{nd}");
            let nd_path = self.sys().join(&net_dir);
            write(&nd_path.join("operstate"), if vf { "down\n" } else { "up\n" });
            write(&nd_path.join("carrier"), if vf { "0\n" } else { "1\n" });
            write(&nd_path.join("carrier_changes"), "2\n");
            write(&nd_path.join("ifindex"), format!("{}\n", self.next_ifindex));
            write(&nd_path.join("dev_port"), "0\n");
            write(&nd_path.join("speed"), format!("{}\n", speed_of(&spec.rate)));
            write(&nd_path.join("address"), "b8:3f:d2:c3:65:c4\n");
            link(&format!("../../../{bdf}"), &nd_path.join("device"));
            link(&format!("{}{net_dir}", up("class/net")), &self.sys().join(format!("class/net/{nd}")));
            // device/infiniband is reached through the netdev's device link.
            self.next_ifindex += 1;
            // A RoCE PF's transceiver, in the ethtool replay directory: 400 G and up an OSFP
            // (CMIS), below a QSFP56 (SFF-8636). An IPoIB netdev answers no module read.
            if !vf && spec.link == Link::Eth {
                let form = if speed_of(&spec.rate) >= 400_000 { optics::Form::Osfp } else { optics::Form::Qsfp56 };
                self.put_module(nd, &optics::Module::healthy(form));
            }
        }
        self.info.insert(
            spec.name.clone(),
            NicInfo { bdf: bdf.into(), ib_dir, pci_dir, netdev: spec.netdev.clone(), is_vf: vf },
        );
        if !vf {
            self.nics.insert(
                spec.name,
                Placed {
                    bdf: bdf.into(),
                    rc: slot.rc,
                    numa: slot.numa,
                    switch: slot.switch,
                    group: slot.group,
                    c2c: false,
                },
            );
        }
    }

    /// An AWS EFA PCI function (vendor 0x1d0f, driver `efa`, no SR-IOV) and its RDMA
    /// device: one port that the driver reports ACTIVE/LinkUp with an unspecified link
    /// layer (`Unknown`), no PMA `counters/`, per-port and device-level `hw_counters/`,
    /// a uverbs node (no MAD: no umad/issm), and on ENA+EFA adapters a netdev.
    fn efa_function(&mut self, slot: &Slot, bdf: &str, spec: NicSpec) {
        let pci_dir = format!("{}/{bdf}", slot.dir);
        let device_id = if spec.hca_type == "efa0" { 0xefa0 } else { 0xefa1 };
        self.pci_function(&pci_dir, bdf, 0x1d0f, device_id, 0x020000, slot.numa, Some("efa"));
        let ib_dir = format!("{pci_dir}/infiniband/{}", spec.name);
        let ib = self.sys().join(&ib_dir);
        write(&ib.join("fw_ver"), "0.0.0.0\n");
        write(&ib.join("node_guid"), "0000:0000:0000:0000\n");
        write(&ib.join("node_type"), "6: unspecified\n");
        link(&format!("../../../{bdf}"), &ib.join("device"));
        link(
            &format!("{}{ib_dir}", up("class/infiniband")),
            &self.sys().join(format!("class/infiniband/{}", spec.name)),
        );
        let port = ib.join("ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("phys_state"), "5: LinkUp\n");
        write(&port.join("rate"), format!("{}\n", spec.rate));
        write(&port.join("link_layer"), "Unknown\n");
        write(&port.join("lid"), "0x0\n");
        write(&port.join("sm_lid"), "0x0\n");
        for c in EFA_PORT_COUNTERS {
            write(&port.join("hw_counters").join(c), if *c == "lifespan" { "12\n" } else { "0\n" });
        }
        for c in EFA_DEVICE_COUNTERS {
            write(&ib.join("hw_counters").join(c), if *c == "lifespan" { "12\n" } else { "0\n" });
        }
        self.char_node(&pci_dir, "uverbs", &spec.name, None);
        if let Some(nd) = &spec.netdev {
            let net_dir = format!("{pci_dir}/net/{nd}");
            let nd_path = self.sys().join(&net_dir);
            write(&nd_path.join("operstate"), "up\n");
            write(&nd_path.join("carrier"), "1\n");
            write(&nd_path.join("carrier_changes"), "1\n");
            write(&nd_path.join("ifindex"), format!("{}\n", self.next_ifindex));
            write(&nd_path.join("dev_port"), "0\n");
            write(&nd_path.join("speed"), "100000\n");
            write(&nd_path.join("address"), "02:5a:1c:3e:00:01\n");
            link(&format!("../../../{bdf}"), &nd_path.join("device"));
            link(&format!("{}{net_dir}", up("class/net")), &self.sys().join(format!("class/net/{nd}")));
            self.next_ifindex += 1;
        }
        self.info.insert(
            spec.name.clone(),
            NicInfo { bdf: bdf.into(), ib_dir, pci_dir, netdev: spec.netdev.clone(), is_vf: false },
        );
        self.nics.insert(
            spec.name,
            Placed {
                bdf: bdf.into(),
                rc: slot.rc,
                numa: slot.numa,
                switch: slot.switch,
                group: slot.group,
                c2c: false,
            },
        );
    }

    /// A character-device class entry (`class/infiniband_verbs/uverbs3`,
    /// `class/infiniband_mad/umad5`) inside the PCI function, as the kernel makes it:
    /// `ibdev`, `port` (MAD kinds), `dev`, and the class link.
    fn char_node(&mut self, pci_dir: &str, kind: &str, dev: &str, port: Option<u32>) {
        let class = if kind == "uverbs" { "infiniband_verbs" } else { "infiniband_mad" };
        let n = self.char_nodes.keys().filter(|(k, _, _)| k == kind).count();
        let name = format!("{kind}{n}");
        let dir = format!("{pci_dir}/{class}/{name}");
        let d = self.sys().join(&dir);
        write(&d.join("ibdev"), format!("{dev}\n"));
        if let Some(p) = port {
            write(&d.join("port"), format!("{p}\n"));
        }
        let major = 231; // infiniband_verbs and infiniband_mad share the IB char major
        let minor = match kind {
            "uverbs" => 192 + n,
            "umad" => n,
            _ => 64 + n,
        };
        write(&d.join("dev"), format!("{major}:{minor}\n"));
        link(&format!("{}{dir}", up(&format!("class/{class}"))), &self.sys().join(format!("class/{class}/{name}")));
        self.char_nodes.insert((kind.into(), dev.into(), port.unwrap_or(0)), name);
    }

    /// mlx5's hwmon device of a PF (6.5+, `drivers/net/ethernet/mellanox/mlx5/core/hwmon.c`):
    /// `name` `mlx5`, one channel per firmware sensor and one for the module, each with
    /// `temp<N>_input`, `_crit`, `_highest` (millidegrees) and `_label` — the firmware's
    /// sensor name, else the driver's `sensor<index>` (the module's index is 64 + its
    /// number). Here: `temp1` the ASIC (`asic`, 55 °C, crit 105 °C), `temp2` the module
    /// (`sensor64`, 45 °C, crit 75 °C). The `device` link names the PCI function.
    fn hwmon(&mut self, pci_dir: &str, bdf: &str) {
        let n = fs::read_dir(self.sys().join("class/hwmon")).map(|d| d.count()).unwrap_or(0);
        let name = format!("hwmon{n}");
        let dir = format!("{pci_dir}/hwmon/{name}");
        let d = self.sys().join(&dir);
        write(&d.join("name"), "mlx5\n");
        for (ch, label, input, crit) in [(1, "asic", 55_000, 105_000), (2, "sensor64", 45_000, 75_000)] {
            write(&d.join(format!("temp{ch}_label")), format!("{label}\n"));
            write(&d.join(format!("temp{ch}_input")), format!("{input}\n"));
            write(&d.join(format!("temp{ch}_highest")), format!("{input}\n"));
            write(&d.join(format!("temp{ch}_crit")), format!("{crit}\n"));
        }
        link(&format!("../../../{bdf}"), &d.join("device"));
        link(&format!("{}{dir}", up("class/hwmon")), &self.sys().join(format!("class/hwmon/{name}")));
    }

    /// The `--devlink-replay` directory of the node: `devlink/<BDF>.json` per mlx5 PF.
    pub fn devlink_dir(&self) -> PathBuf {
        self.root.join("devlink")
    }

    /// A PF's devlink health reporters as mlx5 registers them (`fw`, `fw_fatal`; an
    /// Ethernet netdev's `tx`, `rx`), healthy with no error.
    fn devlink_reporters(&self, bdf: &str, netdev: bool) {
        let mut names = vec!["fw", "fw_fatal"];
        if netdev {
            names.extend(["rx", "tx"]);
        }
        let reporters: Vec<serde_json::Value> = names
            .into_iter()
            .map(|n| serde_json::json!({"name": n, "state": "healthy", "error_count": 0, "recover_count": 0}))
            .collect();
        write(&self.devlink_dir().join(format!("{bdf}.json")), reporters_json(&reporters));
    }

    /// The hwmon directory of RDMA device `dev`'s PCI function.
    pub fn hwmon_dir(&self, dev: &str) -> PathBuf {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        let base = self.sys().join(&info.pci_dir).join("hwmon");
        let first = fs::read_dir(&base).ok().and_then(|mut d| d.next()).and_then(|e| e.ok());
        first.map(|e| e.path()).unwrap_or_else(|| panic!("{dev} has no hwmon device"))
    }

    /// Heat sensor `channel` of `dev` (`temp<channel>_input`, and `_highest` when above it)
    /// to `millidegrees`.
    pub fn set_temperature(&self, dev: &str, channel: u32, millidegrees: i64) {
        let d = self.hwmon_dir(dev);
        write(&d.join(format!("temp{channel}_input")), format!("{millidegrees}\n"));
        let highest = d.join(format!("temp{channel}_highest"));
        let was: i64 = fs::read_to_string(&highest).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(i64::MIN);
        if millidegrees > was {
            write(&highest, format!("{millidegrees}\n"));
        }
    }

    /// `dev`'s devlink health reporter `reporter` reports `errors` more errors: its
    /// `error_count` rises and its state is `error` (until [`Node::recover_reporter`]).
    pub fn bump_reporter(&self, dev: &str, reporter: &str, errors: u64) {
        self.edit_reporter(dev, reporter, |r| {
            let n = r["error_count"].as_u64().unwrap_or(0) + errors;
            r["error_count"] = n.into();
            r["state"] = "error".into();
        });
    }

    /// `dev`'s reporter `reporter` recovered: state `healthy`, `recover_count` = its errors.
    pub fn recover_reporter(&self, dev: &str, reporter: &str) {
        self.edit_reporter(dev, reporter, |r| {
            r["recover_count"] = r["error_count"].clone();
            r["state"] = "healthy".into();
        });
    }

    fn edit_reporter(&self, dev: &str, reporter: &str, f: impl FnOnce(&mut serde_json::Value)) {
        let bdf = &self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name)).bdf;
        let path = self.devlink_dir().join(format!("{bdf}.json"));
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let r = v["reporters"]
            .as_array_mut()
            .and_then(|a| a.iter_mut().find(|r| r["name"] == reporter))
            .unwrap_or_else(|| panic!("{dev} has no reporter {reporter}"));
        f(r);
        write(&path, reporters_json(v["reporters"].as_array().unwrap()));
    }

    /// A plain Ethernet interface (not RDMA) in `class/net`, e.g. the BMC-side `eth0`.
    pub fn plain_netdev(&mut self, name: &str) {
        let dir = format!("devices/virtual/net/{name}");
        write(&self.sys().join(&dir).join("operstate"), "up\n");
        link(&format!("{}{dir}", up("class/net")), &self.sys().join(format!("class/net/{name}")));
    }

    /// Make `iface` carry the default route (`/proc/net/route`).
    pub fn default_route(&mut self, iface: &str) {
        self.default_routes.push(iface.into());
        self.write_route();
    }

    fn write_route(&self) {
        let mut s =
            String::from("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n");
        for r in &self.default_routes {
            s.push_str(&format!("{r}\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"));
            s.push_str(&format!("{r}\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"));
        }
        write(&self.proc().join("net/route"), s);
    }

    /// The GPU↔NIC level as the metadata collector would publish it, from where the
    /// testbed placed each device (not from the PCI paths nicmon reads).
    fn level(nic: &Placed, gpu: &Placed) -> &'static str {
        if gpu.c2c {
            "SYS"
        } else if nic.switch.is_some() && nic.switch == gpu.switch {
            "PIX"
        } else if nic.group.is_some() && nic.group == gpu.group {
            "PXB"
        } else if nic.rc == gpu.rc {
            "PHB"
        } else if nic.numa == gpu.numa {
            "NODE"
        } else {
            "SYS"
        }
    }

    /// Write `gpu_metadata.json` as NVSentinel's metadata collector does.
    pub fn write_metadata(&self) {
        let gpus: Vec<serde_json::Value> = self
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                serde_json::json!({
                    "gpu_id": i, "uuid": format!("GPU-{i:08x}-0000-0000-0000-000000000000"),
                    "pci_address": format!("0000{}", g.bdf.to_uppercase()), "serial_number": format!("16{i:011}"),
                    "device_name": "NVIDIA H100 80GB HBM3", "nvlinks": [], "numa_node": g.numa,
                })
            })
            .collect();
        let topo: serde_json::Map<String, serde_json::Value> = self
            .nics
            .iter()
            .map(|(name, nic)| (name.clone(), self.gpus.iter().map(|g| Node::level(nic, g)).collect::<Vec<_>>().into()))
            .collect();
        let meta = serde_json::json!({
            "version": "1.0", "timestamp": "2026-11-01T00:00:00Z", "node_name": self.name,
            "driver_version": "570.124.06", "chassis_serial": "1654321098765",
            "gpus": gpus, "nvswitches": [], "nic_topology": topo,
        });
        write(&self.metadata_path(), serde_json::to_vec_pretty(&meta).unwrap());
    }

    // ---- mutation helpers ----

    /// The path of a port attribute (`state`, `link_layer`, ...).
    pub fn port_file(&self, dev: &str, port: u32, file: &str) -> PathBuf {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        self.sys().join(&info.ib_dir).join(format!("ports/{port}/{file}"))
    }

    /// Set a port's logical and physical state: `set_port(dev, 1, "1: DOWN", "2: Polling")`.
    pub fn set_port(&self, dev: &str, port: u32, state: &str, phys: &str) {
        write(&self.port_file(dev, port, "state"), format!("{state}\n"));
        write(&self.port_file(dev, port, "phys_state"), format!("{phys}\n"));
    }

    /// The `--ethtool-replay` directory of the node: `ethtool/<netdev>.json` per RoCE PF,
    /// with its transceiver (`module`).
    pub fn ethtool_dir(&self) -> PathBuf {
        self.root.join("ethtool")
    }

    /// Put `module` in `netdev`'s ethtool replay file (its other keys kept).
    pub fn put_module(&self, netdev: &str, module: &optics::Module) {
        let path = self.ethtool_dir().join(format!("{netdev}.json"));
        let mut v: serde_json::Value =
            fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_else(|| serde_json::json!({}));
        v["module"] = module.json();
        write(&path, serde_json::to_string_pretty(&v).unwrap());
    }

    /// The form of `dev`'s transceiver (`None`: no netdev or no module in its replay file).
    pub fn module_form(&self, dev: &str) -> Option<optics::Form> {
        let nd = self.info[dev].netdev.clone()?;
        let text = fs::read_to_string(self.ethtool_dir().join(format!("{nd}.json"))).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        match v["module"]["pages"]["0"].as_str()?.get(..2)? {
            "11" => Some(optics::Form::Qsfp56),
            "19" => Some(optics::Form::Osfp),
            _ => None,
        }
    }

    /// `dev`'s transceiver as `f` makes it from a healthy one of its form (nothing when it
    /// has none).
    pub fn set_module(&self, dev: &str, f: impl FnOnce(optics::Module) -> optics::Module) {
        if let (Some(form), Some(nd)) = (self.module_form(dev), self.info[dev].netdev.clone()) {
            self.put_module(&nd, &f(optics::Module::healthy(form)));
        }
    }

    /// A cable pull: `1: DOWN` / `2: Polling`, and the netdev (if any) loses carrier; its
    /// transceiver (if any) sees no light on any lane (written first: a poll that sees the
    /// port down sees the module dark).
    pub fn pull_cable(&self, dev: &str, port: u32) {
        self.set_module(dev, optics::Module::dark);
        self.set_port(dev, port, "1: DOWN", "2: Polling");
        if let Some(nd) = self.info[dev].netdev.clone() {
            self.set_operstate(&nd, "down");
        }
    }

    /// Back to `4: ACTIVE` / `5: LinkUp`, netdev up, light on its transceiver again.
    pub fn repair(&self, dev: &str, port: u32) {
        self.set_module(dev, |m| m);
        self.set_port(dev, port, "4: ACTIVE", "5: LinkUp");
        if let Some(nd) = self.info[dev].netdev.clone() {
            self.set_operstate(&nd, "up");
        }
    }

    /// Give `dev`'s netdev another name (before [`Node::use_host_netdev`], to back a NIC
    /// of a ready-made platform with a veth of that name).
    pub fn rename_netdev(&mut self, dev: &str, new: &str) {
        let info = self.info.get_mut(dev).unwrap_or_else(|| panic!("no device {dev}"));
        let old = info.netdev.replace(new.to_string()).unwrap_or_else(|| panic!("{dev} has no netdev"));
        let net = self.root.join("sys").join(&info.pci_dir).join("net");
        fs::rename(net.join(&old), net.join(new)).unwrap_or_else(|e| panic!("rename netdev {old}: {e}"));
        let _ = fs::remove_file(self.sys().join(format!("class/net/{old}")));
        let replay = self.ethtool_dir();
        let _ = fs::rename(replay.join(format!("{old}.json")), replay.join(format!("{new}.json")));
        let net_dir = format!("{}/net/{new}", self.info[dev].pci_dir);
        link(&format!("{}{net_dir}", up("class/net")), &self.sys().join(format!("class/net/{new}")));
    }

    /// A port blip: DOWN/Polling (netdev down) while `during` runs (a poll), then repaired.
    pub fn blip_port<T>(&self, dev: &str, port: u32, during: impl FnOnce() -> T) -> T {
        self.pull_cable(dev, port);
        let out = during();
        self.repair(dev, port);
        out
    }

    /// The class entry of a character device: `kind` `uverbs` (port `None`), `umad` or
    /// `issm` (port `Some(n)`).
    fn char_entry(&self, kind: &str, dev: &str, port: Option<u32>) -> (String, String) {
        let class = if kind == "uverbs" { "infiniband_verbs" } else { "infiniband_mad" };
        let name = self
            .char_nodes
            .get(&(kind.to_string(), dev.to_string(), port.unwrap_or(0)))
            .unwrap_or_else(|| panic!("no {kind} node for {dev} port {port:?} on node {}", self.name));
        (class.to_string(), name.clone())
    }

    /// The character device vanishes from its class directory (udev then removes
    /// `/dev/infiniband/<name>`): the ports stay ACTIVE/LinkUp.
    pub fn remove_char_node(&self, kind: &str, dev: &str, port: Option<u32>) {
        let (class, name) = self.char_entry(kind, dev, port);
        fs::create_dir_all(self.stash()).unwrap();
        let _ = fs::rename(self.sys().join(format!("class/{class}/{name}")), self.stash().join(format!("char-{name}")));
    }

    /// Undo [`Node::remove_char_node`].
    pub fn restore_char_node(&self, kind: &str, dev: &str, port: Option<u32>) {
        let (class, name) = self.char_entry(kind, dev, port);
        let _ = fs::rename(self.stash().join(format!("char-{name}")), self.sys().join(format!("class/{class}/{name}")));
    }

    /// Replace a whole class directory (`infiniband_mad`) with a plain file.
    pub fn class_dir_as_file(&self, class: &str) {
        let p = self.sys().join(format!("class/{class}"));
        fs::create_dir_all(self.stash()).unwrap();
        let _ = fs::rename(&p, self.stash().join(format!("class-{class}")));
        write(&p, "not a directory\n");
    }

    /// Remove a whole class directory (the module is unloaded).
    pub fn remove_class_dir(&self, class: &str) {
        fs::create_dir_all(self.stash()).unwrap();
        let _ = fs::rename(self.sys().join(format!("class/{class}")), self.stash().join(format!("class-{class}")));
    }

    /// Undo [`Node::class_dir_as_file`] / [`Node::remove_class_dir`].
    pub fn restore_class_dir(&self, class: &str) {
        let p = self.sys().join(format!("class/{class}"));
        let _ = fs::remove_file(&p);
        let _ = fs::rename(self.stash().join(format!("class-{class}")), &p);
    }

    /// An EFA adapter's netdev goes down: `operstate` down, `carrier` 0.
    pub fn efa_netdev_down(&self, dev: &str) {
        let nd = self.info[dev].netdev.clone().unwrap_or_else(|| panic!("{dev} has no netdev"));
        self.set_operstate(&nd, "down");
        self.set_carrier(&nd, "0");
    }

    /// Back up: `operstate` up, `carrier` 1.
    pub fn efa_netdev_up(&self, dev: &str) {
        let nd = self.info[dev].netdev.clone().unwrap_or_else(|| panic!("{dev} has no netdev"));
        self.set_operstate(&nd, "up");
        self.set_carrier(&nd, "1");
    }

    /// Write a netdev's `carrier` file verbatim (`"0"`, `"1"`, or something odd).
    pub fn set_carrier(&self, netdev: &str, text: &str) {
        write(&self.sys().join(format!("class/net/{netdev}/carrier")), format!("{text}\n"));
    }

    /// Write a device-level file of an RDMA device (`hw_counters/no_completion_cmds`).
    pub fn write_device_file(&self, dev: &str, file: &str, text: &str) {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        write(&self.sys().join(&info.ib_dir).join(file), text);
    }

    /// Point the fixture's `class/net/<netdev>` at this host's real interface of that name
    /// (a veth in the latency tests): operstate and carrier then come from the kernel.
    pub fn use_host_netdev(&self, netdev: &str) {
        link(&format!("/sys/class/net/{netdev}"), &self.sys().join(format!("class/net/{netdev}")));
    }

    pub fn set_operstate(&self, netdev: &str, state: &str) {
        write(&self.sys().join(format!("class/net/{netdev}/operstate")), format!("{state}\n"));
    }

    /// Write a netdev's `speed` verbatim (Mb/s: `"200000"`; `"-1"` without link).
    pub fn set_speed(&self, netdev: &str, text: &str) {
        write(&self.sys().join(format!("class/net/{netdev}/speed")), format!("{text}\n"));
    }

    pub fn set_rate(&self, dev: &str, port: u32, rate: &str) {
        write(&self.port_file(dev, port, "rate"), format!("{rate}\n"));
    }

    pub fn set_sm_lid(&self, dev: &str, port: u32, lid: u32) {
        write(&self.port_file(dev, port, "sm_lid"), format!("{lid:#x}\n"));
    }

    /// Set a counter: `path` relative to the port (`counters/link_downed`), or
    /// `carrier_changes` for the netdev's.
    pub fn set_counter(&self, dev: &str, port: u32, path: &str, value: u64) {
        if path == "carrier_changes" {
            let nd = self.info[dev].netdev.clone().expect("device has no netdev");
            write(&self.sys().join(format!("class/net/{nd}/carrier_changes")), format!("{value}\n"));
        } else {
            write(&self.port_file(dev, port, path), format!("{value}\n"));
        }
    }

    /// Write raw text into a port file (for odd values: `N/A (no PMA)`, empty files, ...).
    pub fn write_port_file(&self, dev: &str, port: u32, file: &str, text: &str) {
        write(&self.port_file(dev, port, file), text);
    }

    /// Remove a port file (a counter this NIC generation lacks).
    pub fn remove_port_file(&self, dev: &str, port: u32, file: &str) {
        let _ = fs::remove_file(self.port_file(dev, port, file));
    }

    /// Make a port file fail its `read()` with `EINVAL`, as restricted counters do:
    /// it becomes a link to a real kernel file that fails that way (`/sys/class/net/lo/speed`).
    /// Returns false when this host has no such file.
    pub fn make_einval(&self, dev: &str, port: u32, file: &str) -> bool {
        let target = "/sys/class/net/lo/speed";
        if fs::read(target).map_err(|e| e.raw_os_error()) != Err(Some(22)) {
            return false;
        }
        let p = self.port_file(dev, port, file);
        let _ = fs::remove_file(&p);
        symlink(target, &p).is_ok()
    }

    fn stash(&self) -> PathBuf {
        self.root.join("stash")
    }

    /// The device vanishes from `class/infiniband` and its PCI function from the bus
    /// (clean removal / hot unplug).
    pub fn remove_device(&self, dev: &str) {
        let info = &self.info[dev];
        fs::create_dir_all(self.stash()).unwrap();
        let _ = fs::rename(self.sys().join(format!("class/infiniband/{dev}")), self.stash().join(format!("ib-{dev}")));
        // A software device (rxe) has no PCI function.
        if !info.bdf.is_empty() {
            let _ = fs::rename(
                self.sys().join(format!("bus/pci/devices/{}", info.bdf)),
                self.stash().join(format!("pci-{dev}")),
            );
        }
    }

    /// The device falls off the bus: gone from `class/infiniband`, its config space reads `0xFF`.
    pub fn fall_off_bus(&self, dev: &str) {
        fs::create_dir_all(self.stash()).unwrap();
        let _ = fs::rename(self.sys().join(format!("class/infiniband/{dev}")), self.stash().join(format!("ib-{dev}")));
        self.set_config_space(dev, &[0xff; 256]);
    }

    /// Undo [`Node::remove_device`] / [`Node::fall_off_bus`].
    pub fn restore_device(&self, dev: &str) {
        let info = &self.info[dev];
        let _ = fs::rename(self.stash().join(format!("ib-{dev}")), self.sys().join(format!("class/infiniband/{dev}")));
        if info.bdf.is_empty() {
            return;
        }
        let _ = fs::rename(
            self.stash().join(format!("pci-{dev}")),
            self.sys().join(format!("bus/pci/devices/{}", info.bdf)),
        );
        // The function's own ids (`vendor`, `device`): its config space as it was.
        let id = |f: &str| {
            let text = fs::read_to_string(self.sys().join(&info.pci_dir).join(f)).unwrap_or_default();
            u16::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
        };
        match (id("vendor"), id("device")) {
            (Some(0x1d0f), _) => self.set_config_space(dev, &config_space(0x1d0f, 0xefa1)),
            (Some(0x15b3), _) | (None, _) | (_, None) => self.set_config_space(dev, &config_space(0x15b3, 0x1021)),
            (Some(vendor), Some(device)) => self.set_config_space(dev, &config_space(vendor, device)),
        }
    }

    /// Overwrite a device's PCI config space bytes.
    pub fn set_config_space(&self, dev: &str, bytes: &[u8]) {
        write(&self.sys().join(&self.info[dev].pci_dir).join("config"), bytes);
    }

    /// A reboot as far as nicmon can tell: a new boot ID.
    pub fn set_boot_id(&mut self, id: &str) {
        self.boot_id = id.into();
        write(&self.proc().join("sys/kernel/random/boot_id"), format!("{id}\n"));
    }

    /// Delete the metadata file (the sysfs fallback then applies).
    pub fn remove_metadata(&self) {
        let _ = fs::remove_file(self.metadata_path());
    }

    /// The names of the node's PFs (non-VF devices), sorted.
    pub fn pfs(&self) -> Vec<String> {
        self.info.iter().filter(|(_, i)| !i.is_vf).map(|(n, _)| n.clone()).collect()
    }

    /// Run `nicmon` with `--sysfs`/`--procfs` of this node plus `args`.
    pub fn nicmon(&self, sub: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(nicmon_bin());
        cmd.arg(sub)
            .arg("--sysfs")
            .arg(self.sys())
            .arg("--procfs")
            .arg(self.proc())
            .args(args)
            .env_remove("NODE_NAME")
            .env("RUST_LOG", "warn");
        cmd.output().expect("running nicmon")
    }

    /// `<bin> run` pointed at this node: its sysfs, procfs and metadata, the state file
    /// `<root>/<state>`, no config file, node name `node`. Callers add the rest.
    pub fn run_command(&self, bin: &Path, state: &str, node: &str) -> Command {
        self.daemon_command(bin, "run", None, state, node)
    }

    /// `<bin> <sub>` (`run` or `trace`) pointed at this node, as [`Node::run_command`], with
    /// the config file `config` (`None`: none).
    pub fn daemon_command(&self, bin: &Path, sub: &str, config: Option<&Path>, state: &str, node: &str) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg(sub)
            .arg("--sysfs")
            .arg(self.sys())
            .arg("--procfs")
            .arg(self.proc())
            .arg("--metadata")
            .arg(self.metadata_path())
            .arg("--state-file")
            .arg(self.root.join(state))
            .arg("--config")
            .arg(config.unwrap_or(Path::new("/nonexistent/nicmon.toml")))
            .args(["--node-name", node]);
        cmd
    }

    /// `nicmon check --format json` on this node, with the metadata file (if written) and
    /// `extra` arguments (no config file unless `extra` names one); panics unless it exits
    /// 0. Returns the parsed JSON.
    pub fn check_json(&self, extra: &[&str]) -> serde_json::Value {
        let meta = self.metadata_path();
        let meta = meta.to_str().unwrap();
        let mut args = vec!["--format", "json", "--metadata", meta];
        if !extra.contains(&"--config") {
            args.extend(["--config", "/nonexistent/nicmon.toml"]);
        }
        args.extend_from_slice(extra);
        let out = self.nicmon("check", &args);
        assert!(out.status.success(), "nicmon check failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }
}

/// Role counts of a `nicmon check` JSON report: (management, compute, storage).
pub fn role_counts(report: &serde_json::Value) -> (usize, usize, usize) {
    let devs = report["devices"].as_array().expect("devices");
    let count = |r: &str| devs.iter().filter(|d| d["role"] == r).count();
    (count("management"), count("compute"), count("storage"))
}

/// The `nicmon` binary of this workspace, built once per test process.
pub fn nicmon_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("NICMON_BIN") {
            return PathBuf::from(p);
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "--quiet", "-p", "nicmon", "--bin", "nicmon", "--message-format=json"])
            .output()
            .expect("cargo build -p nicmon");
        assert!(out.status.success(), "building nicmon failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "nicmon")
            .find_map(|v| v["executable"].as_str().map(PathBuf::from))
            .expect("cargo did not report the nicmon executable")
    })
    .clone()
}

/// A replayed timeline: successive `nicmon check --state-file … --now …` invocations on a
/// node, each exactly one daemon poll cycle.
pub struct Timeline<'a> {
    pub node: &'a Node,
    pub state_file: PathBuf,
    pub start: i64,
    pub extra: Vec<String>,
}

impl<'a> Timeline<'a> {
    pub fn new(node: &'a Node) -> Timeline<'a> {
        Timeline { node, state_file: node.root().join("state.json"), start: 1_790_000_000, extra: Vec::new() }
    }

    /// RFC 3339 of `start + t` seconds.
    pub fn at(&self, t: i64) -> String {
        let ts = time::OffsetDateTime::from_unix_timestamp(self.start + t).unwrap();
        ts.format(&time::format_description::well_known::Rfc3339).unwrap()
    }

    /// Poll at `t` seconds; returns the events.
    pub fn poll(&self, t: i64) -> Vec<serde_json::Value> {
        self.report(t)["events"].as_array().cloned().unwrap_or_default()
    }

    /// Poll at `t` seconds; returns the whole report.
    pub fn report(&self, t: i64) -> serde_json::Value {
        let now = self.at(t);
        let mut args = vec!["--state-file", self.state_file.to_str().unwrap(), "--now", &now, "--node-name", "node-a"];
        args.extend(self.extra.iter().map(String::as_str));
        self.node.check_json(&args)
    }
}

/// A compact view of an event for assertions: (check, healthy, fatal, entities, errorCode).
pub fn brief(e: &serde_json::Value) -> (String, bool, bool, String, String) {
    let ents: Vec<String> = e["entitiesImpacted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| format!("{}={}", x["entityType"].as_str().unwrap(), x["entityValue"].as_str().unwrap()))
        .collect();
    let codes: Vec<String> =
        e["errorCode"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
    (
        e["checkName"].as_str().unwrap().to_string(),
        e["isHealthy"].as_bool().unwrap(),
        e["isFatal"].as_bool().unwrap(),
        ents.join(" "),
        codes.join(","),
    )
}
