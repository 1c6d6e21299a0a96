//! Ready-made nodes: the six platforms of seed 000 §4 (field-validated role results), and
//! two AWS EFA instance types built from public facts (p5: 8 H100 and 32 EFA; p4d: 8 A100
//! and 4 EFA).
//!
//! Each builder places GPUs and NICs in a PCI tree shaped like the real machine, so that
//! the metadata the collector would publish and the tree nicmon derives from sysfs give
//! the same roles. The expected role counts are in [`Platform::expected_roles`].
use crate::Link;
use crate::NicSpec;
use crate::Node;
use crate::vendors::Vendor;

/// The six platforms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    A100Oci,
    H100Oci,
    L40sOci,
    OnPremL40s,
    Gb200Nvl4,
    DgxH100,
    AwsP5,
    AwsP4d,
    /// AMD MI300X-like: 8 Broadcom Thor2 (`bnxt_re`) compute NICs (SPEC §1.14).
    Mi300xThor2,
    /// AMD MI300X-like: 8 AMD Pensando Pollara 400 (`ionic`) compute NICs.
    Mi300xPollara,
    /// 8 H100 and 8 Intel E810 (`irdma` over `ice`) compute ports.
    E810,
    /// A CI node: soft RoCE (`rxe0`) over a plain netdev.
    RxeCi,
}

impl Platform {
    pub const ALL: [Platform; 8] = [
        Platform::A100Oci,
        Platform::H100Oci,
        Platform::L40sOci,
        Platform::OnPremL40s,
        Platform::Gb200Nvl4,
        Platform::DgxH100,
        Platform::AwsP5,
        Platform::AwsP4d,
    ];

    /// The other vendors' node shapes (SPEC §1.14): not in [`Platform::ALL`], whose tests
    /// expect NVIDIA's metadata and mlx5 or EFA NICs.
    pub const VENDORS: [Platform; 4] =
        [Platform::Mi300xThor2, Platform::Mi300xPollara, Platform::E810, Platform::RxeCi];

    pub fn name(self) -> &'static str {
        match self {
            Platform::A100Oci => "a100-oci",
            Platform::H100Oci => "h100-oci",
            Platform::L40sOci => "l40s-oci",
            Platform::OnPremL40s => "onprem-l40s",
            Platform::Gb200Nvl4 => "gb200-nvl4",
            Platform::DgxH100 => "dgx-h100",
            Platform::AwsP5 => "aws-p5",
            Platform::AwsP4d => "aws-p4d",
            Platform::Mi300xThor2 => "mi300x-thor2",
            Platform::Mi300xPollara => "mi300x-pollara",
            Platform::E810 => "e810",
            Platform::RxeCi => "rxe-ci",
        }
    }

    pub fn parse(s: &str) -> Option<Platform> {
        Platform::ALL.into_iter().chain(Platform::VENDORS).find(|p| p.name() == s)
    }

    /// (management, compute, storage) — 000 §4.1.3 / §4.2.4; DGX-like: 8 IB compute +
    /// 4 Ethernet storage, VFs have no role.
    pub fn expected_roles(self) -> (usize, usize, usize) {
        match self {
            Platform::A100Oci => (2, 16, 0),
            Platform::H100Oci => (0, 16, 2),
            Platform::L40sOci => (0, 0, 6),
            Platform::OnPremL40s => (1, 4, 0),
            Platform::Gb200Nvl4 => (2, 4, 0),
            Platform::DgxH100 => (0, 8, 4),
            Platform::AwsP5 => (0, 32, 0),
            Platform::AwsP4d => (0, 4, 0),
            // The management card's second port: storage (NODE to its socket's GPUs).
            Platform::Mi300xThor2 | Platform::Mi300xPollara | Platform::E810 => (1, 8, 1),
            Platform::RxeCi => (0, 1, 0),
        }
    }

    /// Whether NVIDIA's metadata collector runs there (not on AMD GPU nodes, nor on a node
    /// without GPUs): without it the roles come from the PCI tree.
    pub fn has_metadata(self) -> bool {
        !matches!(self, Platform::Mi300xThor2 | Platform::Mi300xPollara | Platform::RxeCi)
    }

    /// Build the node in a temporary directory, metadata file included.
    pub fn build(self) -> Node {
        let mut n = Node::new(self.name());
        self.populate(&mut n);
        n
    }

    /// Build the node under `root` (kept on disk).
    pub fn build_at(self, root: &std::path::Path) -> Node {
        let mut n = Node::at(self.name(), root);
        self.populate(&mut n);
        n
    }

    fn populate(self, n: &mut Node) {
        match self {
            Platform::A100Oci => a100_oci(n),
            Platform::H100Oci => h100_oci(n),
            Platform::L40sOci => l40s_oci(n),
            Platform::OnPremL40s => onprem_l40s(n),
            Platform::Gb200Nvl4 => gb200_nvl4(n),
            Platform::DgxH100 => dgx_h100(n, 2),
            Platform::AwsP5 => aws_p5(n),
            Platform::AwsP4d => aws_p4d(n),
            Platform::Mi300xThor2 => mi300x(n, Vendor::Broadcom),
            Platform::Mi300xPollara => mi300x(n, Vendor::Pensando),
            Platform::E810 => e810(n),
            Platform::RxeCi => rxe_ci(n),
        }
        n.plain_netdev("lo");
        if self.has_metadata() {
            n.write_metadata();
        }
    }
}

/// A GPU and a NIC card below one upper switch, each behind its own lower switch:
/// `PXB` between them (the OCI shapes).
fn pxb_pair(n: &mut Node, domain: u16, numa: i32, pfs: Vec<NicSpec>) {
    let rc = n.root_complex(domain, numa);
    let rp = n.root_port(&rc, 1);
    let upper = n.switch(&rp);
    let a = n.switch_port(&upper, 0);
    let b = n.switch_port(&upper, 4);
    let gpu_sw = n.switch(&a);
    let gpu_port = n.switch_port(&gpu_sw, 0);
    n.gpu(&gpu_port, 0);
    let nic_sw = n.switch(&b);
    let nic_port = n.switch_port(&nic_sw, 0);
    n.card(&nic_port, 0, pfs);
}

/// A card on a root port of its own root complex.
fn own_rc_card(n: &mut Node, domain: u16, numa: i32, pfs: Vec<NicSpec>) {
    let rc = n.root_complex(domain, numa);
    let rp = n.root_port(&rc, 1);
    n.card(&rp, 0, pfs);
}

/// A GPU on a root port of its own root complex (PCIe cards: L40S).
fn own_rc_gpu(n: &mut Node, domain: u16, numa: i32) {
    let rc = n.root_complex(domain, numa);
    let rp = n.root_port(&rc, 1);
    n.gpu(&rp, 0);
}

fn roce(i: usize) -> NicSpec {
    NicSpec::eth(&format!("mlx5_{i}"), &format!("rdma{i}")).rate("200 Gb/sec (4X HDR)").hca("MT4123")
}

/// A100 OCI RoCE: 4-socket AMD (8 NUMA nodes), 8 GPUs on NUMA 1/3/5/7, 16 RoCE compute
/// NICs PXB to their paired GPU (8 dual-port cards), management NICs mlx5_0 (NUMA 0) and
/// mlx5_13 (NUMA 6).
fn a100_oci(n: &mut Node) {
    own_rc_card(n, 0, 0, vec![roce(0).rate("100 Gb/sec (4X EDR)")]);
    let mut next = 1;
    for g in 0..8 {
        if next == 13 {
            own_rc_card(n, 0, 6, vec![roce(13).rate("100 Gb/sec (4X EDR)")]);
            next = 14;
        }
        let numa = [1, 1, 3, 3, 5, 5, 7, 7][g];
        pxb_pair(n, 0, numa, vec![roce(next), roce(next + 1)]);
        next += 2;
    }
}

/// H100 OCI: 2 sockets, 8 GPUs (4 per socket), 8 dual-port IB compute cards PXB to their
/// GPU (16 PFs), storage NICs mlx5_2 and mlx5_11 (single-port Ethernet, own root complex).
fn h100_oci(n: &mut Node) {
    let mut next = 0;
    for g in 0..8 {
        let numa = if g < 4 { 0 } else { 1 };
        if next == 2 || next == 11 {
            own_rc_card(n, 0, numa, vec![roce(next).rate("100 Gb/sec (4X EDR)")]);
            next += 1;
        }
        let ib = |i: usize| NicSpec::ib(&format!("mlx5_{i}"));
        pxb_pair(n, 0, numa, vec![ib(next), ib(next + 1)]);
        next += 2;
    }
}

/// L40S OCI: 2 sockets, 4 PCIe GPUs, 3 dual-port RoCE cards (6 PFs) — NODE/SYS only.
fn l40s_oci(n: &mut Node) {
    own_rc_gpu(n, 0, 0);
    own_rc_gpu(n, 0, 0);
    own_rc_gpu(n, 0, 1);
    own_rc_gpu(n, 0, 1);
    own_rc_card(n, 0, 0, vec![roce(0), roce(1)]);
    own_rc_card(n, 0, 0, vec![roce(2), roce(3)]);
    own_rc_card(n, 0, 1, vec![roce(4), roce(5)]);
}

/// On-prem L40S: 2 sockets, 8 PCIe GPUs, mlx5_0 Ethernet carrying the default route,
/// mlx5_1..4 single-port InfiniBand compute NICs.
fn onprem_l40s(n: &mut Node) {
    for g in 0..8 {
        own_rc_gpu(n, 0, if g < 4 { 0 } else { 1 });
    }
    own_rc_card(n, 0, 0, vec![NicSpec::eth("mlx5_0", "eno1np0").rate("25 Gb/sec (1X EDR)").hca("MT4119")]);
    for i in 1..=4 {
        own_rc_card(
            n,
            0,
            if i <= 2 { 0 } else { 1 },
            vec![NicSpec::ib(&format!("mlx5_{i}")).hca("MT4123").rate("200 Gb/sec (4X HDR)")],
        );
    }
    n.default_route("eno1np0");
}

/// GB200 NVL4: 2 Grace sockets, 4 GPUs attached through NVLink-C2C (behind NVIDIA root
/// ports), 4 ConnectX-7 IB NICs and 2 BlueField-3 DPUs, each on its own PCI domain.
fn gb200_nvl4(n: &mut Node) {
    for (domain, numa) in [(0x0008u16, 0), (0x0009, 0), (0x0018, 1), (0x0019, 1)] {
        let rc = n.root_complex(domain, numa);
        let rp = n.nvidia_root_port(&rc, 0);
        n.gpu(&rp, 0);
    }
    let nics: [(u16, i32, &str, Link); 6] = [
        (0x0000, 0, "ibp3s0", Link::Ib),
        (0x0002, 0, "ibP2p3s0", Link::Ib),
        (0x0006, 0, "roceP6p3s0", Link::Eth),
        (0x0010, 1, "ibP16p3s0", Link::Ib),
        (0x0012, 1, "ibP18p3s0", Link::Ib),
        (0x0016, 1, "roceP22p3s0", Link::Eth),
    ];
    for (domain, numa, name, link) in nics {
        let rc = n.root_complex(domain, numa);
        let rp = n.nvidia_root_port(&rc, 0);
        let spec = match link {
            Link::Ib => NicSpec::ib(name),
            Link::Eth => NicSpec::eth(name, &format!("{name}np0")).hca("MT41692").rate("200 Gb/sec (2X NDR)"),
            Link::Efa => NicSpec::efa(name, None),
        };
        n.card(&rp, 0, vec![spec]);
    }
}

/// DGX-H100-like: 2 sockets, 8 GPUs each PIX to one single-port IB compute NIC (same
/// PCIe switch), NVSwitch functions, 2 dual-port Ethernet storage cards on CPU root ports
/// (4 PFs), and `vfs` SR-IOV VFs per compute PF (2 on the platform: 16 VFs, DOWN).
fn dgx_h100(n: &mut Node, vfs: u32) {
    for g in 0..8 {
        let numa = if g < 4 { 0 } else { 1 };
        let rc = n.root_complex(0, numa);
        let rp = n.root_port(&rc, 1);
        let sw = n.switch(&rp);
        let gp = n.switch_port(&sw, 0);
        let np = n.switch_port(&sw, 1);
        n.gpu(&gp, 0);
        n.card(&np, 0, vec![NicSpec::ib(&format!("mlx5_{g}")).netdev(&format!("ibp{g}s0"))]);
        if g % 4 == 0 {
            let nvp = n.switch_port(&sw, 2);
            n.nvswitch(&nvp, 0);
        }
    }
    own_rc_card(n, 0, 0, vec![roce(8), roce(9)]);
    own_rc_card(n, 0, 1, vec![roce(10), roce(11)]);
    for g in 0..8 {
        n.vfs(&format!("mlx5_{g}"), vfs);
    }
}

/// The DGX-H100-like node with `vfs` SR-IOV VFs per InfiniBand PF instead of 2 (0: none),
/// under `root` when given (kept on disk), else in a temporary directory: what unmonitored
/// functions cost is measured on it.
pub fn dgx_h100_with_vfs(vfs: u32, root: Option<&std::path::Path>) -> Node {
    let name = Platform::DgxH100.name();
    let mut n = match root {
        Some(root) => Node::at(name, root),
        None => Node::new(name),
    };
    dgx_h100(&mut n, vfs);
    n.plain_netdev("lo");
    n.write_metadata();
    n
}

/// Give PF `dev` of `node` ports 2 to `ports`, each a copy of its port 1 (state, rate,
/// every counter): a device with that many ports.
pub fn copy_ports(node: &Node, dev: &str, ports: u32) -> std::io::Result<()> {
    let dir = node.sys().join(&node.info[dev].ib_dir).join("ports");
    for p in 2..=ports {
        let st = std::process::Command::new("cp").arg("-r").arg(dir.join("1")).arg(dir.join(p.to_string())).status()?;
        if !st.success() {
            return Err(std::io::Error::other(format!("copying {}/1 to port {p} failed", dir.display())));
        }
    }
    Ok(())
}

/// The primary ENA interface of an AWS instance: a plain netdev (no RDMA device) that
/// carries the default route.
fn aws_primary_ena(n: &mut Node) {
    n.plain_netdev("ens32");
    n.default_route("ens32");
}

/// An EFA named the way the kernel names it after its PCI address (`rdmap<bus>s<slot>`).
fn efa_on(n: &mut Node, slot: &crate::Slot, netdev: Option<&str>, pci_id: &str) -> String {
    let name = format!("rdmap{}s0", slot.bus());
    n.card(slot, 0, vec![NicSpec::efa(&name, netdev).hca(pci_id)]);
    name
}

/// AWS p5.48xlarge: 2 sockets, 8 H100 GPUs, 32 EFA devices (4 per GPU, on the GPU's PCIe
/// switch). The first EFA of each GPU is an ENA+EFA interface with a netdev; the other
/// three are EFA-only (no netdev). The primary ENA carries the default route.
fn aws_p5(n: &mut Node) {
    for g in 0..8 {
        let numa = if g < 4 { 0 } else { 1 };
        let rc = n.root_complex(0, numa);
        let rp = n.root_port(&rc, 1);
        let sw = n.switch(&rp);
        let gp = n.switch_port(&sw, 0);
        n.gpu(&gp, 0);
        for k in 0..4u8 {
            let np = n.switch_port(&sw, 1 + k);
            let nd = (k == 0).then(|| format!("ens{}", 33 + g));
            efa_on(n, &np, nd.as_deref(), "efa1");
        }
    }
    aws_primary_ena(n);
}

/// AWS p4d.24xlarge: 2 sockets, 8 A100 GPUs, 4 EFA devices (ENA+EFA, each with a netdev),
/// each EFA on the PCIe switch of a pair of GPUs. The primary ENA carries the default route.
fn aws_p4d(n: &mut Node) {
    for pair in 0..4 {
        let numa = if pair < 2 { 0 } else { 1 };
        let rc = n.root_complex(0, numa);
        let rp = n.root_port(&rc, 1);
        let sw = n.switch(&rp);
        for k in 0..2u8 {
            let gp = n.switch_port(&sw, k);
            n.gpu(&gp, 0);
        }
        let np = n.switch_port(&sw, 2);
        efa_on(n, &np, Some(&format!("ens{}", 33 + pair)), "efa0");
    }
    aws_primary_ena(n);
}

/// An AMD MI300X-like node (Dell XE9680-style): 2 sockets, 8 MI300X each beside one 400 G
/// RoCE NIC of `vendor` on its own PCIe switch (PIX), and a Broadcom BCM57414 dual-port
/// 25 G OCP management card on a CPU root port, its first port carrying the default route.
/// Thor2 (`Vendor::Broadcom`, `BroadcomLegacy`): `bnxt_re0..7`; Pollara: `rocep<bus>s0`
/// (rdma-core's udev names).
fn mi300x(n: &mut Node, vendor: Vendor) {
    for g in 0..8 {
        let numa = if g < 4 { 0 } else { 1 };
        let rc = n.root_complex(0, numa);
        let rp = n.root_port(&rc, 1);
        let sw = n.switch(&rp);
        let gp = n.switch_port(&sw, 0);
        let np = n.switch_port(&sw, 1);
        n.amd_gpu(&gp, 0);
        let bus = np.bus();
        let spec = match vendor {
            Vendor::Pensando => NicSpec::roce(&format!("rocep{bus}s0"), &format!("enp{bus}s0"), vendor),
            _ => NicSpec::roce(&format!("bnxt_re{g}"), &format!("enp{bus}s0np0"), vendor),
        };
        n.card(&np, 0, vec![spec]);
    }
    management_bcm57414(n, 8);
}

/// A Broadcom BCM57414 dual-port 25 G management card on a root port of socket 0:
/// `bnxt_re<first>` (`eno8303np0`, the default route) and `bnxt_re<first + 1>`.
fn management_bcm57414(n: &mut Node, first: usize) {
    let port =
        |i: usize, nd: &str| NicSpec::roce(&format!("bnxt_re{i}"), nd, Vendor::Broadcom).rate("25 Gb/sec (1X EDR)");
    own_rc_card(n, 0, 0, vec![port(first, "eno8303np0"), port(first + 1, "eno8403np1")]);
    n.default_route("eno8303np0");
}

/// The MI300X-like node with Thor2 NICs whose driver writes the counter names of before
/// 2025 (`to_retransmits`, ...): both generations are in the field.
pub fn mi300x_thor2_legacy() -> Node {
    let mut n = Node::new(Platform::Mi300xThor2.name());
    mi300x(&mut n, Vendor::BroadcomLegacy);
    n.plain_netdev("lo");
    n
}

/// 2 sockets, 8 H100 and 4 dual-port Intel E810-C 100 G cards (8 PFs, `irdma` over `ice`,
/// named `rocep<bus>s0f<fn>` by rdma-core), each card on the PCIe switch of a pair of GPUs
/// (PIX); an E810-XXV dual-port 25 G management card on a CPU root port, its first port
/// carrying the default route.
fn e810(n: &mut Node) {
    let spec = |bus: u8, f: u8| {
        NicSpec::roce(&format!("rocep{bus}s0f{f}"), &format!("ens{bus}f{f}"), Vendor::Intel).rate("100 Gb/sec (4X EDR)")
    };
    for pair in 0..4 {
        let numa = if pair < 2 { 0 } else { 1 };
        let rc = n.root_complex(0, numa);
        let rp = n.root_port(&rc, 1);
        let sw = n.switch(&rp);
        for k in 0..2u8 {
            let gp = n.switch_port(&sw, k);
            n.gpu(&gp, 0);
        }
        let np = n.switch_port(&sw, 2);
        let bus = np.bus();
        n.card(&np, 0, vec![spec(bus, 0), spec(bus, 1)]);
    }
    let rc = n.root_complex(0, 0);
    let rp = n.root_port(&rc, 1);
    let bus = rp.bus();
    let mgmt = |f: u8| spec(bus, f).rate("25 Gb/sec (1X EDR)");
    n.card(&rp, 0, vec![mgmt(0), mgmt(1)]);
    n.default_route(&format!("ens{bus}f0"));
}

/// A CI node without GPUs: `eth0` (a plain netdev, no RDMA) carries the default route;
/// soft RoCE `rxe0` rides on `eth1`.
fn rxe_ci(n: &mut Node) {
    n.plain_netdev("eth0");
    n.default_route("eth0");
    n.rxe("rxe0", "eth1");
}
