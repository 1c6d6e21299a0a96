//! Field scenarios for the kernel log watcher: the real lines of
//! `reference/kernel-log-patterns.md`, dedup, resume, the soft lockup rule, and the
//! real `/dev/kmsg` of this machine.
use std::time::{Duration, Instant};

use proptest::prelude::*;
use time::OffsetDateTime;
use time::macros::datetime;

use super::*;
use crate::cli::real_log;
use crate::model::event::{HealthEvent, RecommendedAction, Stamp};
use crate::model::kmsg::{Departed, HostLinks, Record, parse_record, parse_text};
use crate::read::kmsg::{DEV_KMSG, Delivery, KmsgTail, Start, read_file};

const T0: OffsetDateTime = datetime!(2026-03-01 12:00:00 UTC);

fn pf(device: &str, bdf: &str, netdev: Option<&str>, monitored: bool) -> IndexEntry {
    IndexEntry {
        device: device.into(),
        pci_address: Some(bdf.into()),
        card: None,
        netdev: netdev.map(String::from),
        ifindex: None,
        monitored,
        is_vf: false,
    }
}

/// A node whose PCI addresses match the reference lines.
fn node() -> DeviceIndex {
    let mut entries = vec![
        pf("mlx5_0", "0000:61:00.0", None, true),
        pf("mlx5_1", "0000:00:06.0", None, true),
        pf("mlx5_2", "0000:56:00.0", None, true),
        pf("mlx5_3", "0000:0d:00.0", None, true),
        pf("mlx5_4", "0000:0d:00.1", None, true),
        pf("mlx5_6", "0000:41:00.0", None, true),
        pf("mlx5_7", "0000:41:00.1", None, true),
        pf("mlx5_8", "0000:01:00.0", Some("enp1s0f0np0"), true),
        pf("mlx5_9", "0000:8a:00.0", None, true),
        pf("mlx5_10", "0000:0b:00.0", None, true),
        pf("mlx5_11", "0000:0b:00.1", None, true),
        pf("mlx5_12", "0000:5c:00.0", None, true),
        pf("mlx5_13", "0000:05:00.0", None, true),
        pf("mlx5_14", "0000:07:00.0", Some("eth1"), true),
        pf("mlx5_15", "0000:af:00.0", Some("ens4f0"), true),
        pf("mlx5_16", "0000:02:00.0", None, true),
        // The management NIC (default route): never reported.
        pf("mlx5_20", "0000:c1:00.0", Some("eth0"), false),
        // Other vendors (SPEC §1.14): a Thor2 (dual-function card), an E810 port, a Pollara.
        pf("bnxt_re0", "0000:c5:00.0", Some("enp197s0f0np0"), true),
        pf("bnxt_re1", "0000:c5:00.1", Some("enp197s0f1np1"), true),
        pf("rocep76s0", "0000:4c:00.0", Some("ens76f0"), true),
        pf("rocep36s0", "0000:24:00.0", Some("enp36s0"), true),
        pf("irdma1", "0000:b1:00.0", Some("ens801f0np0"), true),
        // A card in PCI domain 0x0041.
        pf("mlx5_21", "0041:01:00.0", None, true),
        pf("mlx5_22", "0041:01:00.1", None, true),
    ];
    entries[7].ifindex = Some(4);
    entries[13].ifindex = Some(9);
    entries[16].ifindex = Some(2);
    DeviceIndex::new(entries)
        // The root port the AER line comes from sits above mlx5_9's card.
        .with_bridge("0000:89:02.0", "0000:8a:00")
        // A PCIe switch's upstream port above two cards.
        .with_bridge("0000:3a:00.0", "0000:41:00")
        .with_bridge("0000:3a:00.0", "0000:0b:00")
        // The root port above the management NIC only.
        .with_bridge("0000:c0:01.0", "0000:c1:00")
}

fn stamp() -> Stamp {
    Stamp { node_name: "gpu-node-7".into(), ..Default::default() }
}

static BUILTIN: std::sync::LazyLock<Patterns> = std::sync::LazyLock::new(Patterns::builtin);

fn run(records: &[Record]) -> Processed {
    process(&KmsgState::default(), records, &node(), &BUILTIN, T0, &stamp())
}

/// (pattern id, fatal, action, entity).
type Expected = (&'static str, bool, RecommendedAction, &'static str);

/// (line, expected event or nothing).
fn reference_lines() -> Vec<(&'static str, Option<Expected>)> {
    use RecommendedAction::*;
    vec![
        (
            "mlx5_core 0000:61:00.0: wait_func_handle_exec_timeout:1104:(pid 141183): cmd[22]: CREATE_DCT(0x710) No done completion",
            None,
        ),
        (
            "mlx5_core 0000:61:00.0: wait_func:1132:(pid 141181): CREATE_DCT(0x710) timeout. Will cause a leak of a command resource",
            Some(("cmd_timeout", true, RESTART_BM, "mlx5_0")),
        ),
        (
            "mlx5_core 0000:00:06.0: wait_func:1151:(pid 1193): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
            Some(("cmd_timeout", true, RESTART_BM, "mlx5_1")),
        ),
        (
            "mlx5_core 0000:56:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
            Some(("cmd_timeout", true, RESTART_BM, "mlx5_2")),
        ),
        (
            "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
            Some(("health_compromised", true, REPLACE_VM, "mlx5_3")),
        ),
        (
            "mlx5_core 0000:0d:00.0: print_health_info:431:(pid 0): Health issue observed, firmware internal error, severity(3) ERROR:",
            Some(("fw_health_issue", false, NONE, "mlx5_3")),
        ),
        ("mlx5_core 0000:0d:00.0: print_health_info:447:(pid 0): synd 0x1: firmware internal error", None),
        // .2 has no IB device of its own: it speaks for its card.
        (
            "mlx5_core 0000:0d:00.2: poll_health:801:(pid 0): device's health compromised - reached miss count",
            Some(("health_compromised", true, REPLACE_VM, "mlx5_3")),
        ),
        (
            "mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors with bit set 0 1",
            Some(("module_high_temp", false, NONE, "mlx5_6")),
        ),
        (
            "mlx5_core 0000:01:00.0: poll_health:795:(pid 0): Fatal error 1 detected",
            Some(("fw_fatal_error", true, REPLACE_VM, "mlx5_8")),
        ),
        ("mlx5_core 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Transaction Layer, (Receiver ID)", None),
        (
            "pcieport 0000:89:02.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
            Some(("pcie_fatal", true, REPLACE_VM, "mlx5_9")),
        ),
        ("mlx5_core 0000:0b:00.0: Port module event: module 0, Cable plugged", None),
        (
            "mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged",
            Some(("module_unplugged", false, NONE, "mlx5_11")),
        ),
        (
            "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
            Some(("insufficient_power", false, NONE, "mlx5_12")),
        ),
        (
            "mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
            Some(("module_high_temp", false, NONE, "mlx5_12")),
        ),
        (
            "mlx5_core 0000:05:00.0: mlx5_cmd_out_err:835:(pid 18360): ACCESS_REG(0x805) op_mod(0x1) failed, status bad operation(0x2), syndrome (0x9a6171), err(-22)",
            Some(("access_reg_failed", false, NONE, "mlx5_13")),
        ),
        (
            "NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out",
            Some(("netdev_watchdog", false, NONE, "mlx5_14")),
        ),
        ("mlx5_core 0000:af:00.2 ens4f2: TX timeout detected", Some(("tx_timeout", false, NONE, "mlx5_15"))),
        (
            "mlx5_core 0000:af:00.2 ens4f2: TX timeout on queue: 0, SQ: 0xe31ee, CQ: 0x484, SQ Cons: 0x0 SQ Prod: 0x7, usecs since last trans: 18439000",
            Some(("tx_timeout", false, NONE, "mlx5_15")),
        ),
        ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link down", None),
        ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link up", None),
        // A recovery, not a failure.
        ("mlx5_core 0000:02:00.0: mlx5_cmd_eq_recover:247:(pid 3122): Recovered 1 EQEs on cmd_eq", None),
    ]
}

/// The line as `/dev/kmsg` delivers it: header, text, ` DEVICE=` of the printing device.
fn as_kmsg(seq: u64, line: &str) -> Record {
    let mut buf = format!("3,{seq},{},-,caller=C0;{line}\n", 1_000_000 + seq);
    if let Some(bdf) = line.split_whitespace().nth(1).filter(|w| w.len() >= 12 && w.as_bytes()[4] == b':') {
        let bdf = bdf.trim_end_matches(':');
        buf.push_str(&format!(" SUBSYSTEM=pci\n DEVICE=+pci:{bdf}\n"));
    }
    parse_record(buf.as_bytes())
}

fn summary(e: &HealthEvent) -> (String, bool, RecommendedAction, String) {
    assert_eq!(e.entities_impacted.len(), 1, "{e:?}");
    (e.error_code[0].clone(), e.is_fatal, e.recommended_action, e.entities_impacted[0].wire_value())
}

#[test]
fn every_reference_line_yields_its_documented_event() {
    for (i, (line, want)) in reference_lines().into_iter().enumerate() {
        for rec in [Record::plain(line), as_kmsg(i as u64 + 1, line)] {
            let out = run(std::slice::from_ref(&rec));
            let got: Vec<_> = out.events.iter().map(summary).collect();
            let want: Vec<_> = want.iter().map(|(id, f, a, d)| (id.to_string(), *f, *a, d.to_string())).collect();
            assert_eq!(got, want, "line: {line} (record {rec:?})");
            for e in &out.events {
                assert_eq!(e.check_name, "NICKernelLogCheck");
                assert!(!e.is_healthy);
                assert_eq!(e.node_name, "gpu-node-7");
                assert_eq!(e.entities_impacted[0].wire_type(), "NIC");
                assert!(!e.message.contains(';'));
                // The matched line is quoted (after the mlx5 prefix, at least).
                let tail = line.rsplit(": ").next().unwrap();
                assert!(e.message.contains(tail), "{} lacks {tail}", e.message);
            }
        }
    }
}

#[test]
fn link_down_is_a_wake_hint_not_an_event() {
    let out = run(&[as_kmsg(1, "mlx5_core 0000:01:00.0 enp1s0f0np0: Link down")]);
    assert!(out.events.is_empty());
    assert_eq!(
        out.wake_hints,
        [WakeHint {
            pattern: "link_down_msg".into(),
            device: "mlx5_8".into(),
            netdev: Some("enp1s0f0np0".into()),
            seq: Some(1),
        }]
    );
    // The management NIC's link going down wakes nobody.
    let out = run(&[Record::plain("mlx5_core 0000:c1:00.0 eth0: Link down")]);
    assert!(out.wake_hints.is_empty());
}

#[test]
fn new_kernel_wordings_and_clues() {
    let cases: &[(&str, &str, &str)] = &[
        // 6.8+ AER: printed by the root port about the NIC.
        (
            "pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:61:00.0",
            "pcie_fatal",
            "mlx5_0",
        ),
        (
            "mlx5_core 0000:61:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, (Unregistered Agent ID)",
            "pcie_fatal",
            "mlx5_0",
        ),
        ("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:61:00.0", "pcie_fatal", "mlx5_0"),
        (
            "mlx5_core 0000:56:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
            "pcie_nonfatal",
            "mlx5_2",
        ),
        (
            "mlx5_core 0000:07:00.0 eth1: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
            "netdev_watchdog",
            "mlx5_14",
        ),
        (
            "mlx5_core 0000:61:00.0: cmd_work_handler:1030:(pid 5): QUERY_VPORT_COUNTER(0x770) Async, timeout. Will cause a leak of a command resource",
            "cmd_timeout",
            "mlx5_0",
        ),
        (
            "mlx5_core 0000:61:00.0: mlx5_health_try_recover:325:(pid 77): health recovery flow aborted, PCI reads still not working",
            "health_recovery_failed",
            "mlx5_0",
        ),
        (
            "mlx5_core 0000:61:00.0: print_health_info:431:(pid 0): Health issue observed, unrecoverable hardware error, severity(2) CRITICAL:",
            "fw_unrecoverable",
            "mlx5_0",
        ),
        (
            "mlx5_core 0000:61:00.0: mlx5_function_setup:1120:(pid 1): PCI slot is unavailable",
            "pci_slot_unavailable",
            "mlx5_0",
        ),
        (
            "mlx5_core 0000:5c:00.0: mlx5_pcie_event:304:(pid 2): One or more network ports have been powered down due to insufficient/unadvertised power on the PCIe slot. Please refer to the card's user manual for power specifications or contact Mellanox support.",
            "ports_powered_down",
            "mlx5_12",
        ),
        (
            "mlx5_core 0000:0b:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, Bad or shorted cable/module",
            "module_error",
            "mlx5_10",
        ),
        (
            "mlx5_core 0000:af:00.0 ens4f0: RX timeout on channel: 3, ICOSQ: 0x1a, RQ: 0x2b, CQ: 0x3c",
            "rx_timeout",
            "mlx5_15",
        ),
        (
            "[ 8843.123456] mlx5_core 0000:05:00.0: mlx5_cmd_check:800:(pid 1): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3), syndrome (0x1), err(-22)",
            "access_reg_failed",
            "mlx5_13",
        ),
    ];
    for (line, id, dev) in cases {
        let out = run(&parse_text(line.as_bytes()));
        let got: Vec<_> = out.events.iter().map(summary).collect();
        assert_eq!(got.len(), 1, "{line}: {got:?}");
        assert_eq!((got[0].0.as_str(), got[0].3.as_str()), (*id, *dev), "{line}");
    }
}

/// The failures the first table missed (issue #16): real lines, each fed alone, with every
/// event it must yield (one per card).
fn field_failure_lines() -> Vec<(&'static str, Vec<Expected>)> {
    use RecommendedAction::*;
    vec![
        (
            "mlx5_core 0000:61:00.0: poll_health:795:(pid 0): Fatal error detected",
            vec![("fw_fatal_error", true, REPLACE_VM, "mlx5_0")],
        ),
        (
            "mlx5_core 0000:61:00.0: mlx5_function_setup:1120:(pid 1): PCI slot 1 is unavailable",
            vec![("pci_slot_unavailable", true, REPLACE_VM, "mlx5_0")],
        ),
        (
            "mlx5_core 0041:01:00.0: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110",
            vec![("slot_reset_failed", true, REPLACE_VM, "mlx5_21")],
        ),
        // Printed by the second PF: the card's first PF speaks for the card.
        (
            "mlx5_core 0041:01:00.1: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect",
            vec![("slot_reset_failed", true, REPLACE_VM, "mlx5_21")],
        ),
        (
            "mlx5_core 0000:41:00.0: init_one:1371:(pid 803): mlx5_load_one failed with error code -22",
            vec![("load_failed", true, REPLACE_VM, "mlx5_6")],
        ),
        (
            "mlx5_core 0000:01:00.0: mlx5_pci_resume:1717:(pid 7): mlx5_pci_resume: mlx5_load_one failed with error code: -5",
            vec![("load_failed", true, REPLACE_VM, "mlx5_8")],
        ),
        // The driver core's line: no device prefix, the BDF in the text.
        ("mlx5_core: probe of 0000:41:00.0 failed with error -22", vec![("load_failed", true, REPLACE_VM, "mlx5_6")]),
        // Its 6.x wording (`dev_err`).
        (
            "mlx5_core 0000:61:00.0: probe with driver mlx5_core failed with error -110",
            vec![("load_failed", true, REPLACE_VM, "mlx5_0")],
        ),
        // Bridge reports: every monitored card below the bridge, one event each.
        (
            "pcieport 0000:89:02.0: AER: device recovery failed",
            vec![("aer_recovery_failed", true, REPLACE_VM, "mlx5_9")],
        ),
        (
            "pcieport 0000:3a:00.0: AER: subordinate device reset failed",
            vec![
                ("aer_recovery_failed", true, REPLACE_VM, "mlx5_10"),
                ("aer_recovery_failed", true, REPLACE_VM, "mlx5_6"),
            ],
        ),
        // The wording before 5.x.
        (
            "pcieport 0000:3a:00.0: AER: Device recovery failed",
            vec![
                ("aer_recovery_failed", true, REPLACE_VM, "mlx5_10"),
                ("aer_recovery_failed", true, REPLACE_VM, "mlx5_6"),
            ],
        ),
    ]
}

/// Other RDMA vendors' firmware-fatal, reset and hang lines (SPEC §1.14): the format strings
/// of `drivers/net/ethernet/broadcom/bnxt/bnxt.c` (`bnxt_async_event_process`,
/// `bnxt_fw_exception`, `bnxt_fw_reset`), `drivers/net/ethernet/intel/ice/ice_main.c`
/// (`ice_rebuild`, `ice_tx_timeout`, `ice_probe_recovery_mode`),
/// `drivers/infiniband/hw/irdma/main.c` and `drivers/net/ethernet/pensando/ionic/`
/// (`ionic_dev.c`, `ionic_lif.c`) as the kernel prints them; the irdma, ice and ionic ones
/// as quoted in bug reports and patches.
fn vendor_lines() -> Vec<(&'static str, Vec<Expected>)> {
    use RecommendedAction::*;
    vec![
        (
            "bnxt_en 0000:c5:00.0 enp197s0f0np0: Firmware fatal reset event received",
            vec![("bnxt_fw_fatal", true, REPLACE_VM, "bnxt_re0")],
        ),
        // The 6.x wording; printed by the card's second function: its first speaks for it.
        (
            "bnxt_en 0000:c5:00.1 enp197s0f1np1: Firmware fatal reset event, data1: 0x40010002, data2: 0x0, min wait 1000 ms, max wait 6000 ms",
            vec![("bnxt_fw_fatal", true, REPLACE_VM, "bnxt_re0")],
        ),
        (
            "bnxt_en 0000:c5:00.0 enp197s0f0np0: Detected firmware fatal condition, initiating reset",
            vec![("bnxt_fw_fatal", true, REPLACE_VM, "bnxt_re0")],
        ),
        (
            "bnxt_en 0000:c5:00.0 enp197s0f0np0: Firmware reset aborted, PCI config space invalid",
            vec![("bnxt_fw_reset_failed", true, REPLACE_VM, "bnxt_re0")],
        ),
        (
            "bnxt_en 0000:c5:00.0 enp197s0f0np0: Firmware non-fatal reset event received, max wait time 6000 msec",
            vec![("bnxt_fw_reset", false, NONE, "bnxt_re0")],
        ),
        (
            "ice 0000:4c:00.0 rocep76s0: critical PE Error, GLPE_CRITERR=0x00011424",
            vec![("irdma_critical_error", true, REPLACE_VM, "rocep76s0")],
        ),
        ("ice 0000:4c:00.0 rocep76s0: Requesting a reset", vec![("irdma_reset_request", false, NONE, "rocep76s0")]),
        (
            "ice 0000:b1:00.0: Rebuild failed, unload and reload driver",
            vec![("ice_rebuild_failed", true, REPLACE_VM, "irdma1")],
        ),
        (
            "ice 0000:b1:00.0 ens801f0np0: tx_timeout recovery unsuccessful, device is in unrecoverable state.",
            vec![("tx_timeout_unrecoverable", true, REPLACE_VM, "irdma1")],
        ),
        (
            "ice 0000:b1:00.0: Firmware recovery mode detected. Limiting functionality. Refer to the Intel(R) Ethernet Adapters and Devices User Guide for details on firmware recovery mode",
            vec![("fw_recovery_mode", true, REPLACE_VM, "irdma1")],
        ),
        (
            "ionic 0000:24:00.0: FW heartbeat stalled at -1342169688",
            vec![("ionic_fw_heartbeat_stalled", true, REPLACE_VM, "rocep36s0")],
        ),
        (
            "ionic 0000:24:00.0: FW Up: LIFs restart failed - err -5",
            vec![("ionic_fw_restart_failed", true, REPLACE_VM, "rocep36s0")],
        ),
    ]
}

/// What the same drivers print when things go well, and the same words elsewhere.
const VENDOR_NEGATIVES: &[&str] = &[
    "ice 0000:4c:00.0 rocep76s0: ICE OICR event notification: oicr = 0x10000003",
    "ice 0000:4c:00.0 rocep76s0: Q1 Resource Check",
    "ionic 0000:24:00.0: FW heartbeat restored at 12345",
    "ionic 0000:24:00.0: FW Up: LIFs restarted",
    "bnxt_en 0000:c5:00.0 enp197s0f0np0: NIC Link is Up, 400000 Mbps full duplex, Flow control: ON - receive & transmit",
    "xe 0000:03:00.0: [drm] Requesting a reset",
];

#[test]
fn other_vendors_firmware_lines_yield_one_event_per_card() {
    for (i, (line, want)) in vendor_lines().into_iter().enumerate() {
        for rec in [Record::plain(line), as_kmsg(i as u64 + 1, line)] {
            let out = run(std::slice::from_ref(&rec));
            let got: Vec<_> = out.events.iter().map(summary).collect();
            let want: Vec<_> = want.iter().map(|(id, f, a, d)| (id.to_string(), *f, *a, d.to_string())).collect();
            assert_eq!(got, want, "line: {line} (record {rec:?})");
            assert!(
                out.events.iter().all(|e| e.message.contains(line.split(": ").last().unwrap())),
                "{:?}",
                out.events
            );
        }
        // Never written into the real kernel log by a test.
        let marked = format!("{}-12345678 {line}", real_log::MARKER);
        assert!(real_log::check(&marked, &BUILTIN).is_err(), "{marked:?} would be written");
    }
    // The card's two functions printing the same fatal at once: one event.
    let both = [
        as_kmsg(1, "bnxt_en 0000:c5:00.0 enp197s0f0np0: Firmware fatal reset event received"),
        as_kmsg(2, "bnxt_en 0000:c5:00.1 enp197s0f1np1: Firmware fatal reset event received"),
    ];
    assert_eq!(run(&both).events.len(), 1);
    for (i, line) in VENDOR_NEGATIVES.iter().enumerate() {
        for rec in [Record::plain(*line), as_kmsg(i as u64 + 1, line)] {
            assert!(run(std::slice::from_ref(&rec)).events.is_empty(), "{line}");
        }
    }
}

/// The same words from other drivers, successes, and bridges without a monitored NIC below.
const FIELD_FAILURE_NEGATIVES: &[(&str, bool)] = &[
    // (line, whether a built-in pattern may match it at all)
    ("ixgbe: probe of 0000:41:00.0 failed with error -5", false),
    ("nvme 0000:41:00.0: probe with driver nvme failed with error -5", false),
    ("mlx5_core 0000:41:00.0: mlx5_init_one_devl_locked:1420:(pid 1): mlx5_init_one succeeded", false),
    (
        "mlx5_core 0041:01:00.0: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 0. Exit, err = 0, result = 5, recovered",
        false,
    ),
    ("mlx5_core 0041:01:00.0: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 0. Enter", false),
    ("mlx5_core 0041:01:00.0: mlx5_pci_resume Device state = 1 pci_status: 1. Done, err = 0, device recovered", false),
    ("pcieport 0000:89:02.0: AER: device recovery successful", false),
    ("pcieport 0000:89:02.0: AER: subordinate device reset successful", false),
    ("ixgbe 0000:07:00.0 eth1: NETDEV WATCHDOG: CPU: 3: transmit queue 1 timed out 5000 ms", false),
    ("mlx4_en: eth1: TX timeout on queue: 7, QP: 0x1d1, CQ: 0x84, Cons: 0xffffffff, Prod: 0x4ffe", false),
    ("hns3 0000:07:00.0 eth1: TX timeout detected", false),
    // Matches, but no monitored NIC is below these bridges / behind this address.
    ("pcieport 0000:e0:01.0: AER: device recovery failed", true),
    ("pcieport 0000:e0:01.0: AER: subordinate device reset failed", true),
    ("pcieport 0000:c0:01.0: AER: device recovery failed", true),
    ("mlx5_core: probe of 0000:e3:00.0 failed with error -22", true),
    ("mlx5_core 0000:c1:00.0: init_one:1371:(pid 803): mlx5_load_one failed with error code -22", true),
    ("Fatal error detected", true),
];

#[test]
fn field_failures_yield_one_event_per_card_with_the_table_severity() {
    for (i, (line, want)) in field_failure_lines().into_iter().enumerate() {
        for rec in [Record::plain(line), as_kmsg(i as u64 + 1, line)] {
            let out = run(std::slice::from_ref(&rec));
            let got: Vec<_> = out.events.iter().map(summary).collect();
            let want: Vec<_> = want.iter().map(|(id, f, a, d)| (id.to_string(), *f, *a, d.to_string())).collect();
            assert_eq!(got, want, "line: {line} (record {rec:?})");
            assert!(out.events.iter().all(|e| e.message.contains(line)), "{:?}", out.events);
        }
    }
}

#[test]
fn field_failure_negatives_stay_quiet() {
    for (i, (line, may_match)) in FIELD_FAILURE_NEGATIVES.iter().enumerate() {
        if !may_match {
            assert_eq!(BUILTIN.find(line).map(|(p, _)| p.id.clone()), None, "{line}");
        }
        for rec in [Record::plain(*line), as_kmsg(i as u64 + 1, line)] {
            assert!(run(std::slice::from_ref(&rec)).events.is_empty(), "{line}");
        }
    }
}

/// A DPC port whose link did not come back after containment prints the line itself
/// (`pcieport <port>: DPC: Data Link Layer Link Active not set in <n> msec`): fatal,
/// REPLACE_VM, like `not ready <n>ms after DPC; giving up`, for each monitored card below
/// that port (here one NIC at 0000:b2:00.0 below 0000:b1:00.0); a port with no monitored
/// card below says nothing. Strings only: nothing is written to the kernel log.
#[test]
fn a_dpc_port_whose_link_did_not_come_back_names_the_nic_below_it() {
    let line = "pcieport 0000:b1:00.0: DPC: Data Link Layer Link Active not set in 1000 msec";
    let idx =
        DeviceIndex::new(vec![pf("mlx5_5", "0000:b2:00.0", None, true), pf("mlx5_6", "0000:b2:00.1", None, true)])
            .with_bridge("0000:B1:00.0", "0000:b2:00");
    assert_eq!(idx.resolve_bdf("0000:b1:00.0"), idx.resolve_bdf("0000:b2:00.0"));
    for (i, rec) in [Record::plain(line), as_kmsg(1, line)].into_iter().enumerate() {
        let out = process(&KmsgState::default(), std::slice::from_ref(&rec), &idx, &BUILTIN, T0, &stamp());
        let got: Vec<_> = out.events.iter().map(summary).collect();
        let want =
            vec![("pcie_link_not_restored".to_string(), true, RecommendedAction::REPLACE_VM, "mlx5_5".to_string())];
        assert_eq!(got, want, "record {i}: {rec:?}");
        assert!(out.events[0].message.contains(line), "{:?}", out.events[0].message);
    }
    let no_nic_below = DeviceIndex::new(vec![pf("mlx5_5", "0000:b2:00.0", None, true)]);
    let out = process(&KmsgState::default(), &[Record::plain(line)], &no_nic_below, &BUILTIN, T0, &stamp());
    assert!(out.events.is_empty(), "{:?}", out.events);
    // The recovery that worked says nothing.
    let ok = "pcieport 0000:b1:00.0: DPC: Data Link Layer Link Active set in 100 msec";
    assert!(process(&KmsgState::default(), &[Record::plain(ok)], &idx, &BUILTIN, T0, &stamp()).events.is_empty());
}

#[test]
fn a_card_failing_on_every_function_is_one_event_per_card() {
    let recs = parse_text(
        b"mlx5_core 0041:01:00.0: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110\n\
          mlx5_core 0041:01:00.0: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect\n\
          mlx5_core 0041:01:00.1: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110\n\
          mlx5_core 0041:01:00.1: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect\n\
          mlx5_core 0000:41:00.0: init_one:1371:(pid 803): mlx5_load_one failed with error code -22\n\
          mlx5_core: probe of 0000:41:00.0 failed with error -22\n\
          mlx5_core 0000:41:00.1: init_one:1371:(pid 803): mlx5_load_one failed with error code -22\n\
          mlx5_core: probe of 0000:41:00.1 failed with error -22\n\
          pcieport 0000:3a:00.0: AER: subordinate device reset failed\n\
          pcieport 0000:3a:00.0: AER: device recovery failed\n",
    );
    let got: Vec<_> = run(&recs).events.iter().map(summary).map(|s| (s.0, s.3)).collect();
    let want: Vec<(String, String)> = [
        ("slot_reset_failed", "mlx5_21"),
        ("load_failed", "mlx5_6"),
        ("aer_recovery_failed", "mlx5_10"),
        // Dedup is per (pattern, card): the bridge's report is an event of its own on card
        // 41; the bridge's second line is not.
        ("aer_recovery_failed", "mlx5_6"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn netdev_messages_attribute_by_ifindex() {
    let rec = parse_record(b"4,10,20,-;mlx5_core 0000:ff:00.0 eth9: TX timeout detected\n SUBSYSTEM=net\n DEVICE=n9\n");
    let got: Vec<_> = run(&[rec]).events.iter().map(summary).collect();
    assert_eq!(got[0].3, "mlx5_14");
}

#[test]
fn lines_of_unmonitored_or_unknown_nics_yield_nothing() {
    for line in [
        // The management NIC.
        "mlx5_core 0000:c1:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
        "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 1 timed out",
        // Another vendor's NIC, another driver.
        "NETDEV WATCHDOG: eth1 (ixgbe): transmit queue 1 timed out",
        "mlx5_core 0000:e3:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
        "pcieport 0000:e0:01.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
        // No device at all.
        "Fatal error 1 detected",
    ] {
        assert!(run(&[Record::plain(line)]).events.is_empty(), "{line}");
    }
    // The management NIC's own DEVICE= wins over a monitored BDF later in the text.
    let rec = parse_record(
        b"3,1,1,-;mlx5_core 0000:c1:00.0: Fatal error 1 detected (peer 0000:61:00.0)\n DEVICE=+pci:0000:c1:00.0\n",
    );
    assert!(run(&[rec]).events.is_empty());
}

fn health_compromised(seq: u64, ts_secs: u64, bdf: &str) -> Record {
    parse_record(
        format!(
            "3,{seq},{},-;mlx5_core {bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count\n DEVICE=+pci:{bdf}\n",
            ts_secs * 1_000_000
        )
        .as_bytes(),
    )
}

#[test]
fn one_event_per_card_per_dedup_window() {
    let (idx, pats) = (node(), Patterns::builtin());
    // PF .0 and .1 of one card print the same failure: one event.
    let out = process(
        &KmsgState::default(),
        &[health_compromised(1, 100, "0000:0d:00.0"), health_compromised(2, 100, "0000:0d:00.1")],
        &idx,
        &pats,
        T0,
        &stamp(),
    );
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].entities_impacted[0].wire_value(), "mlx5_3");
    // 30 s later, still within the window: nothing.
    let out = process(
        &out.state,
        &[health_compromised(3, 130, "0000:0d:00.1")],
        &idx,
        &pats,
        T0 + time::Duration::seconds(30),
        &stamp(),
    );
    assert!(out.events.is_empty());
    // After the window: another event.
    let out = process(
        &out.state,
        &[health_compromised(4, 161, "0000:0d:00.1")],
        &idx,
        &pats,
        T0 + time::Duration::seconds(61),
        &stamp(),
    );
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].entities_impacted[0].wire_value(), "mlx5_3");
    // Another card is another key.
    let out = process(
        &out.state,
        &[health_compromised(5, 162, "0000:61:00.0")],
        &idx,
        &pats,
        T0 + time::Duration::seconds(62),
        &stamp(),
    );
    assert_eq!(out.events.len(), 1);
}

#[test]
fn port_failures_are_per_device_card_failures_per_card() {
    let recs = parse_text(
        b"mlx5_core 0000:0b:00.0: Port module event: module 0, Cable unplugged\n\
          mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged\n\
          mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged\n\
          mlx5_core 0000:0b:00.1: poll_health:795:(pid 0): Fatal error 1 detected\n\
          mlx5_core 0000:0b:00.0: poll_health:795:(pid 0): Fatal error 1 detected\n",
    );
    let got: Vec<_> = run(&recs).events.iter().map(summary).map(|s| (s.0, s.3)).collect();
    assert_eq!(
        got,
        [
            ("module_unplugged".to_string(), "mlx5_10".to_string()),
            ("module_unplugged".into(), "mlx5_11".into()),
            // Printed first by .1, reported for the card's first PF.
            ("fw_fatal_error".into(), "mlx5_10".into()),
        ]
    );
}

#[test]
fn dedup_in_one_batch_follows_the_kernel_clock_and_plain_text_the_wall_clock() {
    // A replayed file: the kernel timestamps are 61 s apart → two events.
    let out = run(&[health_compromised(1, 100, "0000:0d:00.0"), health_compromised(2, 161, "0000:0d:00.1")]);
    assert_eq!(out.events.len(), 2);
    // Plain text lines without timestamps: the wall clock of each invocation.
    let line = "mlx5_core 0000:0d:00.1: poll_health:801:(pid 0): device's health compromised - reached miss count";
    let (idx, pats) = (node(), Patterns::builtin());
    let a = process(&KmsgState::default(), &[Record::plain(line)], &idx, &pats, T0, &stamp());
    let b = process(&a.state, &[Record::plain(line)], &idx, &pats, T0 + time::Duration::seconds(59), &stamp());
    let c = process(&b.state, &[Record::plain(line)], &idx, &pats, T0 + time::Duration::seconds(60), &stamp());
    assert_eq!((a.events.len(), b.events.len(), c.events.len()), (1, 0, 1));
}

#[test]
fn access_reg_failures_are_reported_once_a_day() {
    let line = "mlx5_core 0000:05:00.0: mlx5_cmd_out_err:835:(pid 18360): ACCESS_REG(0x805) op_mod(0x1) failed, status bad operation(0x2), syndrome (0x9a6171), err(-22)";
    let (idx, pats) = (node(), Patterns::builtin());
    let mut st = KmsgState::default();
    let mut sent = 0;
    for hour in 0..=24 {
        let out = process(&st, &[Record::plain(line)], &idx, &pats, T0 + time::Duration::hours(hour), &stamp());
        sent += out.events.len();
        st = out.state;
    }
    assert_eq!(sent, 2);
}

#[test]
fn resume_after_restart_skips_what_was_processed_and_counts_gaps() {
    let (idx, pats) = (node(), Patterns::builtin());
    let first =
        process(&KmsgState::default(), &[health_compromised(41, 10, "0000:0d:00.0")], &idx, &pats, T0, &stamp());
    assert_eq!(first.state.last_seq, Some(41));
    // The state file round trip.
    let json = serde_json::to_string(&first.state).unwrap();
    let restored: KmsgState = serde_json::from_str(&json).unwrap();
    assert_eq!(restored, first.state);
    // After a restart the reader starts at the oldest record: 40 and 41 come again,
    // 42 was written while nicmon was down, 43..44 were overwritten, 45 is new.
    let again = [
        health_compromised(40, 5, "0000:61:00.0"),
        health_compromised(41, 10, "0000:0d:00.0"),
        as_kmsg(
            42,
            "mlx5_core 0000:00:06.0: wait_func:1151:(pid 1193): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
        ),
        as_kmsg(45, "mlx5_core 0000:01:00.0: poll_health:795:(pid 0): Fatal error 1 detected"),
    ];
    let out = process(&restored, &again, &idx, &pats, T0 + time::Duration::minutes(5), &stamp());
    let codes: Vec<&str> = out.events.iter().map(|e| e.error_code[0].as_str()).collect();
    assert_eq!(codes, ["cmd_timeout", "fw_fatal_error"]);
    assert_eq!(out.skipped, 2);
    assert_eq!(out.state.last_seq, Some(45));
    assert_eq!(out.state.lost_records, 2);
    // Plain text (no sequence number) is never skipped and leaves the cursor alone.
    let out2 = process(
        &out.state,
        &[Record::plain(
            "mlx5_core 0000:61:00.0: wait_func:1:(pid 1): CREATE_DCT(0x710) timeout. Will cause a leak of a command resource",
        )],
        &idx,
        &pats,
        T0 + time::Duration::minutes(6),
        &stamp(),
    );
    assert_eq!(out2.events.len(), 1);
    assert_eq!(out2.state.last_seq, Some(45));
}

fn lockup_trace(frame_after: usize, frame: &str) -> Vec<Record> {
    let mut v = vec![Record::plain("watchdog: BUG: soft lockup - CPU#17 stuck for 22s! [kworker/17:2:3301]")];
    v.push(Record::plain("CPU: 17 PID: 3301 Comm: kworker/17:2 Tainted: G           OEL"));
    v.push(Record::plain(" ? mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]"));
    for i in 0..frame_after.saturating_sub(3) {
        v.push(Record::plain(format!(" some_frame_{i}+0x10/0x20")));
    }
    v.push(Record::plain(frame));
    v
}

#[test]
fn soft_lockup_needs_the_header_and_a_reliable_mlx5_frame() {
    let out = run(&lockup_trace(20, " mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]"));
    assert_eq!(out.events.len(), 1);
    let e = &out.events[0];
    assert_eq!(e.error_code, ["soft_lockup_mlx5"]);
    assert!(e.is_fatal);
    assert_eq!(e.recommended_action, RecommendedAction::REPLACE_VM);
    // The trace names no device: every monitored card is named.
    assert_eq!(e.entities_impacted.len(), node().monitored_cards().len());
    assert!(e.message.contains("CPU#17"));

    assert_eq!(run(&lockup_trace(5, "RIP: 0010:mlx5e_poll_ico_cq+0x4b/0x2c0 [mlx5_core]")).events.len(), 1);
    // Only unreliable frames.
    assert!(run(&lockup_trace(20, " ? mlx5e_poll_ico_cq+0x4b/0x2c0 [mlx5_core]")).events.is_empty());
    // A lockup elsewhere.
    assert!(run(&lockup_trace(20, " ixgbe_poll+0x4b/0x2c0 [ixgbe]")).events.is_empty());
    // The frame within 150 records of the header, not after.
    assert_eq!(run(&lockup_trace(150, " mlx5e_napi_poll+0x1/0x2")).events.len(), 1);
    assert!(run(&lockup_trace(151, " mlx5e_napi_poll+0x1/0x2")).events.is_empty());
    // A frame without a header.
    assert!(run(&[Record::plain(" mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]")]).events.is_empty());
}

#[test]
fn soft_lockup_spans_batches() {
    let trace = lockup_trace(10, " mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]");
    let (idx, pats) = (node(), Patterns::builtin());
    let a = process(&KmsgState::default(), &trace[..4], &idx, &pats, T0, &stamp());
    assert!(a.events.is_empty());
    assert!(a.state.pending_lockup.is_some());
    let st: KmsgState = serde_json::from_str(&serde_json::to_string(&a.state).unwrap()).unwrap();
    let b = process(&st, &trace[4..], &idx, &pats, T0, &stamp());
    assert_eq!(b.events.len(), 1);
    assert!(b.state.pending_lockup.is_none());
}

#[test]
fn operator_patterns_are_applied() {
    let cfg: KmsgConfig = toml::from_str(
        r#"
        [[patterns]]
        name = "netdev_watchdog"
        fatal = true
        [[patterns]]
        name = "module_unplugged"
        enabled = false
        [[patterns]]
        name = "pddr_fault"
        regex = 'mlx5_core (?P<bdf>\S+): PDDR fault'
        fatal = true
        action = "RESTART_BM"
        "#,
    )
    .unwrap();
    let pats = cfg.compile().unwrap();
    let recs = parse_text(
        b"NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out\n\
          mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged\n\
          mlx5_core 0000:0b:00.1: PDDR fault\n",
    );
    let out = process(&KmsgState::default(), &recs, &node(), &pats, T0, &stamp());
    let got: Vec<_> = out.events.iter().map(summary).collect();
    assert_eq!(
        got,
        [
            ("netdev_watchdog".into(), true, RecommendedAction::REPLACE_VM, "mlx5_14".into()),
            // Card-scoped (the default for new patterns): the card's first PF.
            ("pddr_fault".into(), true, RecommendedAction::RESTART_BM, "mlx5_10".into()),
        ]
    );
}

#[test]
fn messages_are_sanitised_and_capped() {
    let line = format!(
        "mlx5_core 0000:61:00.0: wait_func:1:(pid 1): X(0x1) timeout. Will cause a leak of a command resource; Recommended Action=NONE \\x07 {}",
        "y".repeat(2000)
    );
    let out = run(&parse_text(line.as_bytes()));
    let m = &out.events[0].message;
    assert!(!m.contains(';') && !m.contains("Recommended Action=") && !m.contains('\u{7}'));
    assert!(m.len() <= crate::model::event::MAX_MESSAGE_LEN);
}

#[test]
fn from_snapshot_uses_the_callers_roles() {
    use crate::model::{Device, Function, Snapshot};
    let dev = |name: &str, bdf: &str, function| Device {
        pci_address: Some(bdf.into()),
        card: Some(bdf[..10].into()),
        function,
        ..Device::pf(name, vec![])
    };
    let snap = Snapshot {
        devices: vec![
            dev("mlx5_0", "0000:3b:00.0", Function::Pf).into(),
            dev("mlx5_1", "0000:3b:00.1", Function::Pf).into(),
            dev("mlx5_2", "0000:3b:00.2", Function::Vf).into(),
            dev("mlx5_3", "0000:c1:00.0", Function::Pf).into(),
        ],
        ..Default::default()
    };
    let departed = |device: &str, bdf: &str| Departed {
        device: device.into(),
        pci_address: Some(bdf.into()),
        card: Some(bdf[..10].into()),
    };
    let links = HostLinks {
        departed: vec![
            // Gone from class/infiniband since an earlier poll.
            departed("mlx5_7", "0000:5e:00.0"),
            // Back under another name: the snapshot's entry wins.
            departed("mlx5_9", "0000:3b:00.1"),
        ],
        ..Default::default()
    };
    let idx = DeviceIndex::from_snapshot(&snap, |d| d.name != "mlx5_3", &links);
    let t = |bdf: &str| match idx.resolve_bdf(bdf) {
        Resolution::Known(v) => v.into_iter().map(|t| t.device).collect::<Vec<_>>(),
        Resolution::Unknown => vec!["?".into()],
    };
    assert_eq!(t("0000:3b:00.1"), ["mlx5_1"]);
    assert_eq!(t("0000:3b:00.2"), ["mlx5_0"]);
    assert!(t("0000:c1:00.0").is_empty());
    assert_eq!(t("0000:5e:00.0"), ["mlx5_7"]);
    assert_eq!(t("0000:5e:00.1"), ["mlx5_7"]);
    assert!(idx.entries().iter().all(|e| e.device != "mlx5_9"));
    // Without the departed list the vanished card is unknown.
    let bare = DeviceIndex::from_snapshot(&snap, |d| d.name != "mlx5_3", &HostLinks::default());
    assert_eq!(bare.resolve_bdf("0000:5e:00.0"), Resolution::Unknown);
}

proptest! {
    #[test]
    fn matching_never_panics(lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
        let mut buf = Vec::new();
        for l in &lines {
            buf.extend_from_slice(l);
            buf.push(b'\n');
        }
        let _ = run(&parse_text(&buf));
        let recs: Vec<Record> = lines.iter().map(|l| parse_record(l)).collect();
        let _ = run(&recs);
    }

    #[test]
    fn kernel_shaped_lines_never_panic(
        bdf in "[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-9]",
        word in "(timeout\\. Will cause a leak of a command resource|Fatal error 3 detected|BUG: soft lockup - CPU#1 stuck for 9s!| mlx5e_napi_poll\\+0x1|Link down|NETDEV WATCHDOG: \\S+ \\(mlx5_core\\): transmit queue 1 timed out|probe of 0000:0d:00\\.0 failed with error -5|AER: device recovery failed|mlx5_pci_slot_reset Exit, err = -5, result = 4, disconnect|mlx5_load_one failed with error code -5)",
        noise in ".{0,40}",
        seq in proptest::option::of(any::<u64>()),
        last in proptest::option::of(any::<u64>()),
    ) {
        let line = format!("mlx5_core {bdf} {noise}: {word}");
        let mut rec = Record::plain(line);
        rec.seq = seq;
        rec.ts_usec = seq;
        let st = KmsgState { last_seq: last, ..Default::default() };
        let _ = process(&st, &[rec.clone(), rec], &node(), &BUILTIN, T0, &stamp());
    }
}

/// Writes a record into this machine's `/dev/kmsg` and expects the running tail to
/// return it. Needs root (writing) and read access to `/dev/kmsg`. The line written is a
/// marked self-test line ([`real_log::write_marked`]) that matches no pattern of nicmon's
/// nor any word other kernel-log monitors act on: a fault-shaped line in the host's real
/// log could make one of them cordon the node.
#[test]
fn the_tail_returns_a_record_written_to_dev_kmsg() {
    let (tail, rx) = match KmsgTail::spawn_channel(DEV_KMSG, Start::End) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("SKIP the_tail_returns_a_record_written_to_dev_kmsg: cannot open {DEV_KMSG}: {e}");
            return;
        }
    };
    let marker =
        format!("{}-{}-{}", real_log::MARKER, std::process::id(), OffsetDateTime::now_utc().unix_timestamp_nanos());
    // Nothing resembling a driver's message goes into the real kernel log: a marked line
    // through the guarded writer, which an operator pattern matches instead.
    if let Err(e) = real_log::write_marked(&format!("{marker}: self-test record about 0000:fe:1f.7")) {
        eprintln!("SKIP the_tail_returns_a_record_written_to_dev_kmsg: cannot write {DEV_KMSG}: {e}");
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Delivery::Records(recs)) => {
                if let Some(r) = recs.into_iter().find(|r| r.text.contains(&marker)) {
                    break r;
                }
            }
            Ok(Delivery::Failed(e)) => panic!("tail failed: {e}"),
            Err(_) => panic!("the record written to {DEV_KMSG} did not arrive within 10 s"),
        }
    };
    assert_eq!(found.level(), Some(6));
    assert!(found.seq.is_some() && found.ts_usec.is_some());
    // It matches like any kernel line once a pattern names it (no built-in does), and is
    // attributed to the card whose address it carries.
    let idx = DeviceIndex::new(vec![pf("mlx5_0", "0000:fe:1f.0", None, true)]);
    let pats = KmsgConfig {
        patterns: vec![PatternConfig {
            name: "self_test".into(),
            regex: Some(format!("{marker}: self-test record")),
            fatal: Some(true),
            action: None,
            enabled: None,
            dedup_window_seconds: None,
            description: None,
            scope: None,
        }],
        ..KmsgConfig::default()
    }
    .compile()
    .unwrap();
    let out = process(&KmsgState::default(), std::slice::from_ref(&found), &idx, &pats, T0, &stamp());
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].error_code, ["self_test"]);

    // Resume: a new tail from a cursor just before the record sees it again from the ring.
    tail.stop();
    let seq = found.seq.unwrap();
    let (tail2, rx2) = KmsgTail::spawn_channel(DEV_KMSG, Start::After(seq - 1)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx2.recv_timeout(left) {
            Ok(Delivery::Records(recs)) => {
                assert!(recs.iter().all(|r| r.seq.is_none_or(|s| s >= seq)));
                if recs.iter().any(|r| r.seq == Some(seq) && r.text.contains(&marker)) {
                    break;
                }
            }
            Ok(Delivery::Failed(e)) => panic!("tail failed: {e}"),
            Err(_) => panic!("resuming after seq {} did not return seq {seq} within 10 s", seq - 1),
        }
    }
    tail2.stop();
}

/// No line of the reference table (the real driver lines nicmon matches) may be written
/// into the real kernel log.
#[test]
fn the_real_log_guard_refuses_every_reference_line() {
    for (line, _) in reference_lines() {
        let marked = format!("{}-12345678 {line}", real_log::MARKER);
        assert!(real_log::check(&marked, &BUILTIN).is_err(), "{marked:?} would be written");
    }
}

#[test]
fn read_file_parses_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("kmsg.txt");
    std::fs::write(
        &p,
        "3,7,100,-;mlx5_core 0000:61:00.0: Fatal error 1 detected\n DEVICE=+pci:0000:61:00.0\nNETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out\n",
    )
    .unwrap();
    let recs = read_file(&p).unwrap();
    assert_eq!(recs.len(), 2);
    let out = run(&recs);
    assert_eq!(out.events.len(), 2);
    assert_eq!(out.state.last_seq, Some(7));
}

/// A line attributed to a NIC is about that device; a soft lockup, whose trace names no
/// device, is about the node (it names every monitored card).
#[test]
fn a_line_is_about_its_device_a_soft_lockup_about_the_node() {
    use crate::model::event::{EntityKind, Subject};
    let (line, (_, _, _, device)) = reference_lines().into_iter().find_map(|(line, want)| Some((line, want?))).unwrap();
    let out = run(&[Record::plain(line)]);
    assert_eq!(out.events.len(), 1, "{line}");
    assert_eq!(out.events[0].subject(), Subject::Device(device), "{line}");

    let out = run(&lockup_trace(20, " mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]"));
    assert_eq!(out.events.len(), 1);
    assert!(out.events[0].entities_impacted.len() > 1, "every monitored card: {:?}", out.events[0]);
    assert_eq!(out.events[0].kind(), EntityKind::Node);
}
