//! RDMA NICs beyond NVIDIA's (SPEC §1.14): Broadcom Thor/Thor2 (`bnxt_re` over `bnxt_en`),
//! AMD Pensando Pollara (`ionic`), Intel E810 (`irdma` over `ice`), and soft RoCE (`rxe`)
//! over a plain netdev — what their sysfs looks like, for the testbed's node shapes.
//!
//! What differs from an mlx5 function (`Node::function`): the PCI vendor and driver, no
//! IBTA PMA `counters/` directory (the IB core makes one only for drivers with
//! `process_mad`), the driver's own `hw_counters/` names, and `rxe` has no PCI function at
//! all (`devices/virtual/infiniband/rxe0`, a `parent` attribute naming its netdev).
use crate::{Link, NicInfo, NicSpec, Node, Placed, Slot, link, up, write};

/// Whose NIC a [`NicSpec`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Mellanox,
    /// Broadcom with the 2025 counter names (`local_ack_timeout_err`, ...), as the kernels
    /// with the rename and Broadcom's own driver write them.
    Broadcom,
    /// Broadcom with the names before 2025 (`to_retransmits`, ...).
    BroadcomLegacy,
    /// AMD Pensando: the counters are named by the firmware.
    Pensando,
    /// Intel E810 (GEN2 hardware, names before the GEN3 rename).
    Intel,
}

/// bnxt_re's `hw_counters/` since the 2025 rename (`drivers/infiniband/hw/bnxt_re/hw_counters.c`).
pub const BNXT_RE_COUNTERS: &[&str] = &[
    "active_qps",
    "rx_pkts",
    "tx_pkts",
    "recoverable_errors",
    "rx_roce_errors",
    "rx_roce_discards",
    "local_ack_timeout_err",
    "packet_seq_err",
    "max_retry_exceeded",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
    "unrecoverable_err",
    "duplicate_request",
    "res_tx_pci_err",
    "res_rx_pci_err",
    "out_of_sequence",
    "out_of_buffer",
    "np_cnp_sent",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "req_cqe_error",
    "resp_cqe_error",
    "resp_remote_access_errors",
];

/// bnxt_re's `hw_counters/` before 2025.
pub const BNXT_RE_LEGACY_COUNTERS: &[&str] = &[
    "active_qps",
    "rx_pkts",
    "tx_pkts",
    "recoverable_errors",
    "rx_roce_errors",
    "rx_roce_discards",
    "to_retransmits",
    "seq_err_naks_rcvd",
    "max_retry_exceeded",
    "rnr_naks_rcvd",
    "missing_resp",
    "unrecoverable_err",
    "dup_req",
    "res_tx_pci_err",
    "res_rx_pci_err",
    "oos_drop_count",
    "rx_out_of_buffer",
    "tx_cnp_pkts",
    "rx_cnp_pkts",
    "rx_ecn_marked_pkts",
];

/// What a Pollara's firmware names (AMD's tools list these as its error counters).
pub const IONIC_COUNTERS: &[&str] = &[
    "tx_rdma_ucast_pkts",
    "rx_rdma_ucast_pkts",
    "tx_rdma_cnp_pkts",
    "rx_rdma_cnp_pkts",
    "rx_rdma_ecn_pkts",
    "tx_rdma_ack_timeout",
    "tx_rdma_retx_pkts",
    "req_rx_pkt_seq_err",
    "req_rx_rnr_retry_err",
    "req_rx_impl_nak_seq_err",
    "req_rx_cqe_err",
    "req_tx_retry_excd_err",
    "resp_rx_dup_request",
    "resp_rx_outof_buf",
    "resp_rx_outouf_seq",
    "resp_rx_cqe_err",
    "rx_rdma_mtu_discard_pkts",
];

/// irdma's `hw_counters/` on E810 (GEN2; `drivers/infiniband/hw/irdma/verbs.c`).
pub const IRDMA_COUNTERS: &[&str] = &[
    "ip4InDiscards",
    "ip4InTruncatedPkts",
    "ip4OutNoRoutes",
    "ip6InDiscards",
    "ip6InTruncatedPkts",
    "ip6OutNoRoutes",
    "rxVlanErrors",
    "tcpRetransSegs",
    "tcpInOptErrors",
    "tcpInProtoErrors",
    "ip4InOctets",
    "ip4InPkts",
    "ip4OutOctets",
    "ip4OutPkts",
    "cnpHandled",
    "cnpIgnored",
    "cnpSent",
    "RxECNMrkd",
];

/// The counters irdma adds on GEN3 hardware, with the spaces the kernel writes.
pub const IRDMA_GEN3_COUNTERS: &[&str] = &[
    "RNR sent",
    "RNR received",
    "Nak Sequence Error",
    "Nak Sequence Error Implied",
    "RTO",
    "Rcvd Out of order packets",
    "CRC errors",
];

/// rxe's `hw_counters/` (`drivers/infiniband/sw/rxe/rxe_hw_counters.c`).
pub const RXE_COUNTERS: &[&str] = &[
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

impl Vendor {
    /// PCI vendor id, the PCI driver the function is bound to, a device id.
    fn pci(self) -> (u16, &'static str, u16) {
        match self {
            Vendor::Mellanox => (0x15b3, "mlx5_core", 0x1021),
            // BCM57608 (Thor2, 400G).
            Vendor::Broadcom | Vendor::BroadcomLegacy => (0x14e4, "bnxt_en", 0x1760),
            Vendor::Pensando => (0x1dd8, "ionic", 0x1002),
            // E810-C QSFP.
            Vendor::Intel => (0x8086, "ice", 0x1592),
        }
    }

    fn fw_ver(self) -> &'static str {
        match self {
            Vendor::Mellanox => "28.39.1002",
            Vendor::Broadcom | Vendor::BroadcomLegacy => "230.0.156.0/pkg 230.2.49.0",
            Vendor::Pensando => "1.117.1-a-63",
            Vendor::Intel => "4.40",
        }
    }

    /// The `hw_counters/` files of its ports.
    pub fn hw_counters(self) -> &'static [&'static str] {
        match self {
            Vendor::Mellanox => crate::HW_COUNTERS,
            Vendor::Broadcom => BNXT_RE_COUNTERS,
            Vendor::BroadcomLegacy => BNXT_RE_LEGACY_COUNTERS,
            Vendor::Pensando => IONIC_COUNTERS,
            Vendor::Intel => IRDMA_COUNTERS,
        }
    }
}

impl NicSpec {
    /// A RoCE NIC of `vendor` (one PCI function, one port): `rate` as `ib_get_eth_speed`
    /// reports a 400 G netdev.
    pub fn roce(name: &str, netdev: &str, vendor: Vendor) -> NicSpec {
        NicSpec {
            name: name.into(),
            link: Link::Eth,
            hca_type: String::new(),
            rate: "400 Gb/sec (4X NDR)".into(),
            netdev: Some(netdev.into()),
            vendor,
        }
    }
}

impl Node {
    /// A PF of a vendor other than Mellanox and its RDMA device: no PMA `counters/`, the
    /// driver's own `hw_counters/`, ports ACTIVE/LinkUp with an Ethernet link layer (RoCE),
    /// a netdev, the character devices.
    pub(crate) fn vendor_function(&mut self, slot: &Slot, bdf: &str, spec: NicSpec) {
        let pci_dir = format!("{}/{bdf}", slot.dir);
        let (vendor, driver, device_id) = spec.vendor.pci();
        self.pci_function(&pci_dir, bdf, vendor, device_id, 0x020000, slot.numa, Some(driver));
        let pd = self.sys().join(&pci_dir);
        write(&pd.join("sriov_totalvfs"), "8\n");
        let ib_dir = format!("{pci_dir}/infiniband/{}", spec.name);
        let ib = self.sys().join(&ib_dir);
        write(&ib.join("fw_ver"), format!("{}\n", spec.vendor.fw_ver()));
        write(&ib.join("node_type"), "1: CA\n");
        write(&ib.join("node_guid"), "7ec2:55ff:fe00:0001\n");
        link(&format!("../../../{bdf}"), &ib.join("device"));
        link(
            &format!("{}{ib_dir}", up("class/infiniband")),
            &self.sys().join(format!("class/infiniband/{}", spec.name)),
        );
        self.roce_port(&ib_dir, &spec.rate, spec.vendor.hw_counters());
        self.char_node(&pci_dir, "uverbs", &spec.name, None);
        self.char_node(&pci_dir, "umad", &spec.name, Some(1));
        self.char_node(&pci_dir, "issm", &spec.name, Some(1));
        if let Some(nd) = &spec.netdev {
            let net_dir = format!("{pci_dir}/net/{nd}");
            self.netdev_files(&net_dir, &spec.rate);
            link(&format!("../../../{bdf}"), &self.sys().join(&net_dir).join("device"));
            link(&format!("{}{net_dir}", up("class/net")), &self.sys().join(format!("class/net/{nd}")));
        }
        self.info.insert(
            spec.name.clone(),
            NicInfo { bdf: bdf.into(), ib_dir, pci_dir, netdev: spec.netdev.clone(), is_vf: false },
        );
        let placed = Placed {
            bdf: bdf.into(),
            rc: slot.rc,
            numa: slot.numa,
            switch: slot.switch,
            group: slot.group,
            c2c: false,
        };
        self.nics.insert(spec.name, placed);
    }

    /// Soft RoCE `name` over `netdev` (made here, a plain virtual netdev, up): no PCI
    /// function — `devices/virtual/infiniband/<name>`, no `device` link, a `parent`
    /// attribute naming the netdev — one RoCE port, rxe's counters.
    pub fn rxe(&mut self, name: &str, netdev: &str) {
        let net_dir = format!("devices/virtual/net/{netdev}");
        self.netdev_files(&net_dir, "10 Gb/sec (1X QDR)");
        link(&format!("{}{net_dir}", up("class/net")), &self.sys().join(format!("class/net/{netdev}")));
        let ib_dir = format!("devices/virtual/infiniband/{name}");
        let ib = self.sys().join(&ib_dir);
        write(&ib.join("parent"), format!("{netdev}\n"));
        write(&ib.join("node_type"), "1: CA\n");
        write(&ib.join("node_desc"), "rxe\n");
        write(&ib.join("fw_ver"), "0.0.0\n");
        link(&format!("{}{ib_dir}", up("class/infiniband")), &self.sys().join(format!("class/infiniband/{name}")));
        self.roce_port(&ib_dir, "10 Gb/sec (1X QDR)", RXE_COUNTERS);
        let info = NicInfo {
            bdf: String::new(),
            ib_dir,
            pci_dir: format!("devices/virtual/net/{netdev}"),
            netdev: Some(netdev.into()),
            is_vf: false,
        };
        self.info.insert(name.into(), info);
    }

    /// An AMD Instinct MI300X (class 0x1200, processing accelerator) at `dev` on the slot's
    /// bus. NVIDIA's metadata collector knows none: an AMD node's roles come from the tree.
    pub fn amd_gpu(&mut self, slot: &Slot, dev: u8) -> String {
        let bdf = format!("{:04x}:{:02x}:{:02x}.0", slot.domain, slot.bus, dev);
        let dir = format!("{}/{bdf}", slot.dir);
        self.pci_function(&dir, &bdf, 0x1002, 0x74a1, 0x120000, slot.numa, Some("amdgpu"));
        bdf
    }

    /// Port 1 of the RDMA device at `ib_dir`: ACTIVE/LinkUp, Ethernet, `rate`, these
    /// `hw_counters/` at 0.
    fn roce_port(&self, ib_dir: &str, rate: &str, counters: &[&str]) {
        let port = self.sys().join(ib_dir).join("ports/1");
        write(&port.join("state"), "4: ACTIVE\n");
        write(&port.join("phys_state"), "5: LinkUp\n");
        write(&port.join("rate"), format!("{rate}\n"));
        write(&port.join("link_layer"), "Ethernet\n");
        write(&port.join("lid"), "0x0\n");
        write(&port.join("sm_lid"), "0x0\n");
        for c in counters {
            write(&port.join("hw_counters").join(c), "0\n");
        }
        write(&port.join("hw_counters/lifespan"), "10\n");
    }

    /// A netdev's attributes at `net_dir`: up, carrier, the speed of `rate`.
    fn netdev_files(&mut self, net_dir: &str, rate: &str) {
        let nd = self.sys().join(net_dir);
        write(&nd.join("operstate"), "up\n");
        write(&nd.join("carrier"), "1\n");
        write(&nd.join("carrier_changes"), "1\n");
        write(&nd.join("ifindex"), format!("{}\n", self.next_ifindex));
        write(&nd.join("dev_port"), "0\n");
        write(&nd.join("speed"), format!("{}\n", crate::speed_of(rate)));
        write(&nd.join("address"), "7c:c2:55:00:00:01\n");
        self.next_ifindex += 1;
    }
}
