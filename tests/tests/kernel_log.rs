//! Kernel log scenarios (issue: kernel log watcher): the real lines of
//! `reference/kernel-log-patterns.md`, fed through `nicmon check --kmsg FILE` on a node whose
//! NICs sit at the PCI addresses those lines name, in `/dev/kmsg` record format and as plain
//! text; dedup per card, the resume cursor across restarts and reboots.
use std::process::Stdio;
use std::time::Duration;

use nicmon_tests::connector::Connector;
use nicmon_tests::daemon::Daemon;
use nicmon_tests::platforms::Platform;
use nicmon_tests::{NicSpec, Node, Timeline, brief, nicmon_bin};

type Brief = (String, bool, bool, String, String);

fn kernel_log(fatal: bool, dev: &str, code: &str) -> Brief {
    ("NICKernelLogCheck".into(), false, fatal, format!("NIC={dev}"), code.into())
}

/// A bare-metal node with cards at the addresses of the reference lines (no GPUs: IB
/// cards are compute, Ethernet cards storage), two PFs per card so that every card is at
/// its group's mode, plus a management NIC (`eno1`, default route) at `0000:03:00.0`.
///
/// | card | PFs | |
/// | --- | --- | --- |
/// | 0000:00:06 | mlx5_0, mlx5_1 | IB, on the root bus like a VM's passthrough NIC |
/// | 0000:01:00 | mlx5_2, mlx5_3 | Ethernet `enp1s0f0np0`, `enp1s0f1np1` |
/// | 0000:02:00 | mlx5_4, mlx5_5 | IB |
/// | 0000:03:00 | mlx5_6 | Ethernet `eno1`, management |
/// | 0000:05:00 | mlx5_7, mlx5_8 | Ethernet `eth0`, `eth1` |
/// | 0000:0b:00 … 0000:61:00 | mlx5_9 … mlx5_20 | IB (0b, 0d, 41, 56, 5c, 61) |
/// | 0000:8a:00 | mlx5_21, mlx5_22 | IB, behind root port 0000:89:02.0 |
/// | 0000:af:00 | mlx5_23 … mlx5_25 | Ethernet `ens4f0` … `ens4f2` |
fn field_node() -> Node {
    let mut n = Node::new("field");
    n.next_bus(0, 0x00);
    let rc = n.root_complex(0, 0);
    n.card(&rc, 6, vec![NicSpec::ib("mlx5_0"), NicSpec::ib("mlx5_1")]);
    let ib2 = |a: usize| vec![NicSpec::ib(&format!("mlx5_{a}")), NicSpec::ib(&format!("mlx5_{}", a + 1))];
    let cards: Vec<(u8, Vec<NicSpec>)> = vec![
        (0x01, vec![NicSpec::eth("mlx5_2", "enp1s0f0np0"), NicSpec::eth("mlx5_3", "enp1s0f1np1")]),
        (0x02, ib2(4)),
        (0x03, vec![NicSpec::eth("mlx5_6", "eno1")]),
        (0x05, vec![NicSpec::eth("mlx5_7", "eth0"), NicSpec::eth("mlx5_8", "eth1")]),
        (0x0b, ib2(9)),
        (0x0d, ib2(11)),
        (0x41, ib2(13)),
        (0x56, ib2(15)),
        (0x5c, ib2(17)),
        (0x61, ib2(19)),
    ];
    for (i, (bus, pfs)) in cards.into_iter().enumerate() {
        n.next_bus(0, bus);
        let rp = n.root_port(&rc, 0x10 + i as u8);
        n.card(&rp, 0, pfs);
    }
    n.next_bus(0, 0x89);
    let rc89 = n.root_complex(0, 0);
    n.next_bus(0, 0x8a);
    let rp = n.root_port(&rc89, 2);
    n.card(&rp, 0, ib2(21));
    n.next_bus(0, 0xaf);
    let rp = n.root_port(&rc, 0x1f);
    n.card(
        &rp,
        0,
        vec![NicSpec::eth("mlx5_23", "ens4f0"), NicSpec::eth("mlx5_24", "ens4f1"), NicSpec::eth("mlx5_25", "ens4f2")],
    );
    n.default_route("eno1");
    n
}

/// How lines are written into a `--kmsg` file.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    /// `/dev/kmsg` records: `prio,seq,ts_usec,-;text` and ` KEY=VALUE` continuation lines.
    Kmsg,
    /// Plain text, one message per line, bare.
    Plain,
    /// Plain text as `dmesg` prints it: `[   86.123456] text`.
    Dmesg,
    /// Plain text as `journalctl -k` prints it: `Nov 19 19:26:01 node-a kernel: text`.
    Journal,
}

const ALL: [Format; 4] = [Format::Kmsg, Format::Plain, Format::Dmesg, Format::Journal];

/// The continuation lines the kernel attaches to `line`: ` DEVICE=+pci:<BDF>` for device
/// messages (`mlx5_core <BDF>: …`, `pcieport <BDF>: …`), ` DEVICE=n<ifindex>` for netdev
/// messages (`mlx5_core <BDF> <if>: …`), nothing for a WARN without device.
/// Any driver's `<driver> <BDF>: …` (`dev_err`) carries its device.
fn continuation(node: &Node, line: &str) -> String {
    let mut words = line.split(' ');
    let (Some(driver), Some(bdf)) = (words.next(), words.next()) else {
        return String::new();
    };
    let is_bdf = |s: &str| s.len() == 12 && s.as_bytes()[4] == b':' && s.as_bytes()[7] == b':';
    match bdf.strip_suffix(':') {
        Some(bdf) if is_bdf(bdf) => format!(" SUBSYSTEM=pci\n DEVICE=+pci:{bdf}\n"),
        None if driver == "mlx5_core" && is_bdf(bdf) => {
            let ifname = words.next().unwrap_or_default().trim_end_matches(':');
            let ifindex = std::fs::read_to_string(node.sys().join(format!("class/net/{ifname}/ifindex")))
                .unwrap_or_else(|e| panic!("netdev {ifname}: {e}"));
            format!(" SUBSYSTEM=net\n DEVICE=n{}\n", ifindex.trim())
        }
        _ => String::new(),
    }
}

/// A `--kmsg` file's text: `records` as (seq, seconds since boot, line).
fn kmsg_text(node: &Node, format: Format, records: &[(u64, i64, &str)]) -> String {
    records
        .iter()
        .map(|(seq, secs, line)| match format {
            Format::Kmsg => {
                format!("3,{seq},{},-;{line}\n{}", secs * 1_000_000 + *seq as i64 % 1000, continuation(node, line))
            }
            Format::Plain => format!("{line}\n"),
            Format::Dmesg => format!("[{secs:>5}.{:06}] {line}\n", *seq % 1000),
            Format::Journal => {
                let s = 19 * 3600 + 26 * 60 + secs;
                format!("Nov 19 {:02}:{:02}:{:02} node-a kernel: {line}\n", s / 3600 % 24, s / 60 % 60, s % 60)
            }
        })
        .collect()
}

/// One poll at `t` with `text` as the kernel log records that arrived since the last one.
fn poll_kmsg(tl: &mut Timeline, t: i64, text: &str) -> Vec<serde_json::Value> {
    let file = tl.node.root().join(format!("kmsg-{}-{t}.txt", tl.state_file.file_stem().unwrap().to_string_lossy()));
    std::fs::write(&file, text).unwrap();
    tl.extra = vec!["--kmsg".into(), file.to_string_lossy().into_owned()];
    let ev = tl.poll(t);
    tl.extra.clear();
    ev
}

/// A timeline on its own state file, past the first poll's healthy baselines.
fn started<'n>(node: &'n Node, name: &str, ports: usize) -> Timeline<'n> {
    let mut tl = Timeline::new(node);
    tl.state_file = node.root().join(format!("{name}.json"));
    let ev = tl.poll(0);
    assert_eq!(ev.len(), ports, "{ev:#?}");
    assert!(ev.iter().all(|e| e["isHealthy"] == true && e["checkName"].as_str().unwrap().ends_with("StateCheck")));
    tl
}

/// Monitored PF ports of [`field_node`]: 26 PFs, one of them management.
const FIELD_PORTS: usize = 25;

/// The real lines of `reference/kernel-log-patterns.md`, each with what it must yield on
/// [`field_node`]: (pattern id, fatal, recommended action, `NIC=` device), or nothing.
#[allow(clippy::type_complexity)]
const REAL_LINES: &[(&str, Option<(&str, bool, &str, &str)>)] = &[
    (
        "mlx5_core 0000:61:00.0: wait_func_handle_exec_timeout:1104:(pid 141183): cmd[22]: CREATE_DCT(0x710) No done completion",
        None,
    ),
    (
        "mlx5_core 0000:61:00.0: wait_func:1132:(pid 141181): CREATE_DCT(0x710) timeout. Will cause a leak of a command resource",
        Some(("cmd_timeout", true, "RESTART_BM", "mlx5_19")),
    ),
    (
        "mlx5_core 0000:00:06.0: wait_func:1151:(pid 1193): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
        Some(("cmd_timeout", true, "RESTART_BM", "mlx5_0")),
    ),
    (
        "mlx5_core 0000:56:00.0: wait_func:1189:(pid 72061): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
        Some(("cmd_timeout", true, "RESTART_BM", "mlx5_15")),
    ),
    (
        "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
        Some(("health_compromised", true, "REPLACE_VM", "mlx5_11")),
    ),
    (
        "mlx5_core 0000:0d:00.0: print_health_info:431:(pid 0): Health issue observed, firmware internal error, severity(3) ERROR:",
        Some(("fw_health_issue", false, "NONE", "mlx5_11")),
    ),
    ("mlx5_core 0000:0d:00.0: print_health_info:447:(pid 0): synd 0x1: firmware internal error", None),
    // A function of the card without an IB device of its own: the card's first PF.
    (
        "mlx5_core 0000:0d:00.2: poll_health:801:(pid 0): device's health compromised - reached miss count",
        Some(("health_compromised", true, "REPLACE_VM", "mlx5_11")),
    ),
    // A card-wide sensor: the card's first PF speaks for it.
    (
        "mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors with bit set 0 1",
        Some(("module_high_temp", false, "NONE", "mlx5_13")),
    ),
    (
        "mlx5_core 0000:01:00.0: poll_health:795:(pid 0): Fatal error 1 detected",
        Some(("fw_fatal_error", true, "REPLACE_VM", "mlx5_2")),
    ),
    ("mlx5_core 0000:01:00.0: PCIe Bus Error: severity=Corrected, type=Transaction Layer, (Receiver ID)", None),
    // Printed by the root port above the card.
    (
        "pcieport 0000:89:02.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
        Some(("pcie_fatal", true, "REPLACE_VM", "mlx5_21")),
    ),
    ("mlx5_core 0000:0b:00.0: Port module event: module 0, Cable plugged", None),
    // A port's own cable: that PF.
    (
        "mlx5_core 0000:0b:00.1: Port module event: module 1, Cable unplugged",
        Some(("module_unplugged", false, "NONE", "mlx5_10")),
    ),
    (
        "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
        Some(("insufficient_power", false, "NONE", "mlx5_17")),
    ),
    (
        "mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High Temperature",
        Some(("module_high_temp", false, "NONE", "mlx5_17")),
    ),
    (
        "mlx5_core 0000:05:00.0: mlx5_cmd_out_err:835:(pid 18360): ACCESS_REG(0x805) op_mod(0x1) failed, status bad operation(0x2), syndrome (0x9a6171), err(-22)",
        Some(("access_reg_failed", false, "NONE", "mlx5_7")),
    ),
    // Attributed by the interface name.
    (
        "NETDEV WATCHDOG: eth1 (mlx5_core): transmit queue 19 timed out",
        Some(("netdev_watchdog", false, "NONE", "mlx5_8")),
    ),
    ("mlx5_core 0000:af:00.2 ens4f2: TX timeout detected", Some(("tx_timeout", false, "NONE", "mlx5_25"))),
    (
        "mlx5_core 0000:af:00.2 ens4f2: TX timeout on queue: 0, SQ: 0xe31ee, CQ: 0x484, SQ Cons: 0x0 SQ Prod: 0x7, usecs since last trans: 18439000",
        Some(("tx_timeout", false, "NONE", "mlx5_25")),
    ),
    // A wake-up hint for an immediate poll, never an event.
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link down", None),
    ("mlx5_core 0000:01:00.0 enp1s0f0np0: Link up", None),
    // A recovery, not a command timeout.
    ("mlx5_core 0000:02:00.0: mlx5_cmd_eq_recover:247:(pid 3122): Recovered 1 EQEs on cmd_eq", None),
];

#[test]
fn field_node_places_cards_at_the_reference_addresses() {
    let node = field_node();
    let bdf = |d: &str| node.info[d].bdf.clone();
    assert_eq!(bdf("mlx5_0"), "0000:00:06.0");
    assert_eq!(bdf("mlx5_2"), "0000:01:00.0");
    assert_eq!(bdf("mlx5_6"), "0000:03:00.0");
    assert_eq!(bdf("mlx5_11"), "0000:0d:00.0");
    assert_eq!(bdf("mlx5_19"), "0000:61:00.0");
    assert_eq!(bdf("mlx5_21"), "0000:8a:00.0");
    assert_eq!(bdf("mlx5_25"), "0000:af:00.2");
    assert!(node.info["mlx5_21"].pci_dir.contains("/0000:89:02.0/0000:8a:00.0"), "{}", node.info["mlx5_21"].pci_dir);
    let r = node.check_json(&[]);
    assert_eq!(nicmon_tests::role_counts(&r), (1, 18, 7));
}

#[test]
fn every_reference_line_yields_its_pattern_on_the_right_nic() {
    let node = field_node();
    for format in ALL {
        let mut tl = started(&node, &format!("{format:?}"), FIELD_PORTS);
        for (i, (line, want)) in REAL_LINES.iter().enumerate() {
            // 100 s apart: no dedup window joins two lines.
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(1000 + i as u64, t, line)]));
            let got: Vec<Brief> = ev.iter().map(brief).collect();
            match want {
                None => assert!(got.is_empty(), "{format:?} {line}: {ev:#?}"),
                Some((id, fatal, action, dev)) => {
                    assert_eq!(got, vec![kernel_log(*fatal, dev, id)], "{format:?} {line}");
                    let e = &ev[0];
                    assert_eq!(e["recommendedAction"], *action, "{line}");
                    assert_eq!(e["agent"], "nic-health-monitor");
                    assert_eq!(e["componentClass"], "NIC");
                    assert_eq!(e["generatedTimestamp"], tl.at(t));
                    let (msg, cause) = e["message"].as_str().unwrap().split_once(" - probable cause: ").unwrap();
                    assert!(msg.ends_with(&format!(" on {dev}: {line}")), "{format:?}: {msg}");
                    assert!(cause.starts_with(e["metadata"]["probableCause"].as_str().unwrap()), "{cause}");
                }
            }
        }
    }
}

#[test]
fn one_card_printing_from_both_pfs_is_one_event_per_dedup_window() {
    let node = field_node();
    let line = |f: u8| {
        format!("mlx5_core 0000:0d:00.{f}: poll_health:801:(pid 0): device's health compromised - reached miss count")
    };
    let (pf0, pf1) = (line(0), line(1));
    for format in ALL {
        let mut tl = started(&node, &format!("{format:?}"), FIELD_PORTS);
        let mut seq = 40;
        let mut both = |t: i64| {
            seq += 2;
            kmsg_text(&node, format, &[(seq - 1, t, &pf0), (seq, t, &pf1)])
        };
        let text = both(1);
        let ev = poll_kmsg(&mut tl, 1, &text);
        assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_11", "health_compromised")]);
        // The driver repeats itself 30 s later: inside the window, nothing.
        let text = both(31);
        assert!(poll_kmsg(&mut tl, 31, &text).is_empty(), "{format:?}");
        // 61 s after the first event: a second one.
        let text = both(62);
        let ev = poll_kmsg(&mut tl, 62, &text);
        assert_eq!(
            ev.iter().map(brief).collect::<Vec<_>>(),
            vec![kernel_log(true, "mlx5_11", "health_compromised")],
            "{format:?}"
        );
        assert_eq!(ev[0]["generatedTimestamp"], tl.at(62));
    }
}

#[test]
fn a_restart_in_the_same_boot_resumes_after_the_cursor() {
    let node = field_node();
    let mut tl = started(&node, "restart", FIELD_PORTS);
    let compromised =
        "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count";
    let fatal = "mlx5_core 0000:01:00.0: poll_health:795:(pid 0): Fatal error 1 detected";
    let timeout = "mlx5_core 0000:61:00.0: wait_func:1132:(pid 141181): CREATE_DCT(0x710) timeout. Will cause a leak of a command resource";
    let first = kmsg_text(&node, Format::Kmsg, &[(200, 1, compromised), (201, 1, fatal)]);
    let ev = poll_kmsg(&mut tl, 1, &first);
    assert_eq!(
        ev.iter().map(brief).collect::<Vec<_>>(),
        vec![kernel_log(true, "mlx5_11", "health_compromised"), kernel_log(true, "mlx5_2", "fw_fatal_error")]
    );

    // The agent restarts 5 minutes later (dedup windows long over) and reads the ring from
    // its oldest record: what it already reported is not reported again.
    assert!(poll_kmsg(&mut tl, 300, &first).is_empty());
    // The ring also holds a newer record: only that one.
    let more = kmsg_text(&node, Format::Kmsg, &[(200, 1, compromised), (201, 1, fatal), (202, 290, timeout)]);
    let ev = poll_kmsg(&mut tl, 301, &more);
    assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_19", "cmd_timeout")]);
    assert!(poll_kmsg(&mut tl, 302, &more).is_empty());
    // A poll without kernel log records keeps the cursor.
    assert!(tl.poll(303).is_empty());
    assert!(poll_kmsg(&mut tl, 304, &more).is_empty());
}

#[test]
fn management_nic_failure_lines_yield_nothing() {
    let node = field_node();
    let lines = [
        "mlx5_core 0000:03:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count",
        "mlx5_core 0000:03:00.0: poll_health:795:(pid 0): Fatal error 1 detected",
        "mlx5_core 0000:03:00.0: wait_func:1132:(pid 141181): CREATE_DCT(0x710) timeout. Will cause a leak of a command resource",
        "mlx5_core 0000:03:00.0 eno1: TX timeout detected",
        "NETDEV WATCHDOG: eno1 (mlx5_core): transmit queue 3 timed out",
    ];
    for format in ALL {
        let mut tl = started(&node, &format!("{format:?}"), FIELD_PORTS);
        let records: Vec<(u64, i64, &str)> = lines.iter().enumerate().map(|(i, l)| (10 + i as u64, 1, *l)).collect();
        assert!(poll_kmsg(&mut tl, 1, &kmsg_text(&node, format, &records)).is_empty(), "{format:?}");
    }

    // A100 OCI: mlx5_0 (NUMA 0, no GPU there) is the management NIC.
    let node = Platform::A100Oci.build();
    let mgmt = node.info["mlx5_0"].bdf.clone();
    let compute = node.info["mlx5_1"].bdf.clone();
    let line = |bdf: &str| {
        format!("mlx5_core {bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count")
    };
    let (m, c) = (line(&mgmt), line(&compute));
    for format in ALL {
        let mut tl = started(&node, &format!("a100-{format:?}"), 16);
        assert!(poll_kmsg(&mut tl, 1, &kmsg_text(&node, format, &[(7, 1, &m)])).is_empty(), "{format:?}");
        // The same line from a compute NIC is reported.
        let ev = poll_kmsg(&mut tl, 2, &kmsg_text(&node, format, &[(8, 2, &c)]));
        assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_1", "health_compromised")]);
    }
}

#[test]
fn a_reboot_clears_the_cursor() {
    let mut node = field_node();
    let compromised =
        "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count";
    let fatal = "mlx5_core 0000:01:00.0: poll_health:795:(pid 0): Fatal error 1 detected";
    let state_file;
    {
        let mut tl = started(&node, "reboot", FIELD_PORTS);
        let ev = poll_kmsg(&mut tl, 1, &kmsg_text(&node, Format::Kmsg, &[(5000, 86_000, compromised)]));
        assert_eq!(ev.len(), 1);
        state_file = tl.state_file.clone();
    }

    // The node reboots: the new kernel numbers its records from 0 again.
    node.set_boot_id("7f1c2a9e-0000-4000-8000-00000000beef");
    let mut tl = Timeline::new(&node);
    tl.state_file = state_file;
    let ev = poll_kmsg(&mut tl, 600, &kmsg_text(&node, Format::Kmsg, &[(12, 40, compromised)]));
    let kernel: Vec<Brief> = ev.iter().map(brief).filter(|b| b.0 == "NICKernelLogCheck" && !b.1).collect();
    assert_eq!(kernel, vec![kernel_log(true, "mlx5_11", "health_compromised")], "{ev:#?}");
    // Everything else of the first poll after a reboot is healthy: the clear-all events and
    // the state baselines.
    assert!(
        ev.iter()
            .filter(|e| e["checkName"] != "NICKernelLogCheck" || e["isHealthy"] == true)
            .all(|e| e["isHealthy"] == true)
    );

    // The cursor is now the new boot's.
    let ev = poll_kmsg(&mut tl, 601, &kmsg_text(&node, Format::Kmsg, &[(12, 40, compromised), (13, 41, fatal)]));
    assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_2", "fw_fatal_error")]);
}

#[test]
fn newer_kernel_wordings_and_vfs_are_attributed_to_their_card() {
    let node = field_node();
    for format in ALL {
        let mut tl = started(&node, &format!("{format:?}"), FIELD_PORTS);
        let cases: [(&str, Brief); 3] = [
            // 6.8+: the root port names the NIC in the text.
            (
                "pcieport 0000:89:02.0: AER: Uncorrectable (Fatal) error message received from 0000:8a:00.1",
                kernel_log(true, "mlx5_21", "pcie_fatal"),
            ),
            (
                "mlx5_core 0000:8a:00.0: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
                kernel_log(false, "mlx5_21", "pcie_nonfatal"),
            ),
            (
                "mlx5_core 0000:af:00.2 ens4f2: NETDEV WATCHDOG: CPU: 5: transmit queue 3 timed out 5120 ms",
                kernel_log(false, "mlx5_25", "netdev_watchdog"),
            ),
        ];
        for (i, (line, want)) in cases.iter().enumerate() {
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(300 + i as u64, t, line)]));
            assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![want.clone()], "{format:?} {line}");
        }
    }

    // DGX-H100: mlx5_12 and mlx5_13 are VFs of mlx5_0; the PF and both VFs print the same
    // firmware failure: one event, on the PF.
    let node = Platform::DgxH100.build();
    let line = |d: &str| format!("mlx5_core {}: poll_health:795:(pid 0): Fatal error 1 detected", node.info[d].bdf);
    let (pf, vf1, vf2) = (line("mlx5_0"), line("mlx5_12"), line("mlx5_13"));
    assert!(node.info["mlx5_12"].is_vf && node.info["mlx5_13"].is_vf);
    for format in ALL {
        let mut tl = started(&node, &format!("dgx-{format:?}"), 12);
        let ev = poll_kmsg(&mut tl, 1, &kmsg_text(&node, format, &[(1, 1, &vf1), (2, 1, &pf), (3, 1, &vf2)]));
        assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_0", "fw_fatal_error")]);
    }
}

#[test]
fn quoted_lines_are_sanitised_and_capped() {
    let node = field_node();
    let mut tl = started(&node, "quote", FIELD_PORTS);
    let line = format!(
        "mlx5_core 0000:0d:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count; extra=\\x1b[31m{}",
        "x".repeat(600)
    );
    for (t, format) in [(1, Format::Kmsg), (100, Format::Plain)] {
        let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(9 + t as u64, t, &line)]));
        assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), vec![kernel_log(true, "mlx5_11", "health_compromised")]);
        let msg = ev[0]["message"].as_str().unwrap();
        assert!(!msg.contains(';') && !msg.chars().any(char::is_control), "{format:?}: {msg:?}");
        assert!(msg.len() <= 512, "{format:?}: {} bytes", msg.len());
        // The quoted line is cut; the probable cause ends the message.
        let (quoted, cause) = msg.split_once(" - probable cause: ").unwrap();
        assert!(quoted.ends_with("..."), "{format:?}: {msg}");
        assert_eq!(cause, "nic-firmware (kernel log: health_compromised)");
        assert!(msg.contains("device's health compromised - reached miss count"), "{msg}");
    }
}

#[test]
fn soft_lockup_in_the_mlx5_napi_path_names_every_monitored_card() {
    let node = Platform::H100Oci.build();
    let mut tl = started(&node, "lockup", 18);
    let trace = [
        "watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [ksoftirqd/12:86]",
        "CPU: 12 PID: 86 Comm: ksoftirqd/12 Tainted: G           OE     5.15.0-1045-oracle #51",
        "RIP: 0010:mlx5e_poll_tx_cq+0x1a4/0x5e0 [mlx5_core]",
        "Call Trace:",
        " <IRQ>",
        " ? mlx5e_napi_poll+0x12c/0x6f0 [mlx5_core]",
        " mlx5e_napi_poll+0x12c/0x6f0 [mlx5_core]",
        " __napi_poll+0x30/0x180",
    ];
    let records: Vec<(u64, i64, &str)> = trace.iter().enumerate().map(|(i, l)| (700 + i as u64, 1, *l)).collect();
    let ev = poll_kmsg(&mut tl, 1, &kmsg_text(&node, Format::Kmsg, &records));
    assert_eq!(ev.len(), 1, "{ev:#?}");
    let b = brief(&ev[0]);
    assert_eq!((b.0.as_str(), b.1, b.2, b.4.as_str()), ("NICKernelLogCheck", false, true, "soft_lockup_mlx5"));
    // One entity per monitored card (the H100's 8 IB cards and 2 storage cards).
    assert_eq!(ev[0]["entitiesImpacted"].as_array().unwrap().len(), 10, "{ev:#?}");

    // Without an mlx5 frame (only an unreliable `? ` one): nothing.
    let other = [
        "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [kworker/3:1:99]",
        " ? mlx5e_napi_poll+0x12c/0x6f0 [mlx5_core]",
        " nvme_poll+0x10/0x40",
    ];
    let records: Vec<(u64, i64, &str)> = other.iter().enumerate().map(|(i, l)| (800 + i as u64, 100, *l)).collect();
    assert!(poll_kmsg(&mut tl, 100, &kmsg_text(&node, Format::Kmsg, &records)).is_empty());
}

/// The failures the first table missed (issue #16), on [`field_node`]: real lines, each fed
/// alone, with every event it must yield (pattern id, fatal, recommended action, `NIC=`).
#[allow(clippy::type_complexity)]
const FIELD_FAILURES: &[(&str, &[(&str, bool, &str, &str)])] = &[
    (
        "mlx5_core 0000:61:00.0: poll_health:795:(pid 0): Fatal error detected",
        &[("fw_fatal_error", true, "REPLACE_VM", "mlx5_19")],
    ),
    // Printed by the second PF: the card's first PF speaks for the card.
    (
        "mlx5_core 0000:61:00.1: mlx5_function_setup:1120:(pid 1): PCI slot 1 is unavailable",
        &[("pci_slot_unavailable", true, "REPLACE_VM", "mlx5_19")],
    ),
    (
        "mlx5_core 0000:0d:00.0: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110",
        &[("slot_reset_failed", true, "REPLACE_VM", "mlx5_11")],
    ),
    (
        "mlx5_core 0000:0d:00.1: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect",
        &[("slot_reset_failed", true, "REPLACE_VM", "mlx5_11")],
    ),
    (
        "mlx5_core 0000:41:00.0: init_one:1371:(pid 803): mlx5_load_one failed with error code -22",
        &[("load_failed", true, "REPLACE_VM", "mlx5_13")],
    ),
    // The driver core's line: no device prefix, no DEVICE=; the BDF is in the text.
    ("mlx5_core: probe of 0000:41:00.1 failed with error -22", &[("load_failed", true, "REPLACE_VM", "mlx5_13")]),
    (
        "mlx5_core 0000:01:00.0: init_one:1349:(pid 26): mlx5_load_one failed with error code -28",
        &[("load_failed", true, "REPLACE_VM", "mlx5_2")],
    ),
    (
        "mlx5_core 0000:56:00.0: probe with driver mlx5_core failed with error -110",
        &[("load_failed", true, "REPLACE_VM", "mlx5_15")],
    ),
    // Printed by the root port above the card.
    ("pcieport 0000:89:02.0: AER: device recovery failed", &[("aer_recovery_failed", true, "REPLACE_VM", "mlx5_21")]),
    (
        "pcieport 0000:89:02.0: AER: subordinate device reset failed",
        &[("aer_recovery_failed", true, "REPLACE_VM", "mlx5_21")],
    ),
];

/// The same words from other drivers, recoveries that worked, the management NIC.
const FIELD_NEGATIVES: &[&str] = &[
    "ixgbe: probe of 0000:41:00.0 failed with error -5",
    "nvme 0000:41:00.0: probe with driver nvme failed with error -5",
    "mlx5_core 0000:61:00.0: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 0. Exit, err = 0, result = 5, recovered",
    "mlx5_core 0000:61:00.0: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 0. Enter",
    "pcieport 0000:89:02.0: AER: device recovery successful",
    "mlx4_en: eth1: TX timeout on queue: 7, QP: 0x1d1, CQ: 0x84, Cons: 0xffffffff, Prod: 0x4ffe",
    "ixgbe 0000:41:00.0: NETDEV WATCHDOG: CPU: 3: transmit queue 1 timed out 5000 ms",
    "mlx5_core 0000:03:00.0: init_one:1371:(pid 803): mlx5_load_one failed with error code -22",
    "mlx5_core: probe of 0000:03:00.0 failed with error -22",
    "mlx5_core 0000:03:00.0: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110",
];

#[test]
fn field_failures_fire_once_per_card_with_the_table_severity() {
    let node = field_node();
    for format in ALL {
        let mut tl = started(&node, &format!("field-{format:?}"), FIELD_PORTS);
        for (i, (line, want)) in FIELD_FAILURES.iter().enumerate() {
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(2000 + i as u64, t, line)]));
            let got: Vec<Brief> = ev.iter().map(brief).collect();
            let expected: Vec<Brief> = want.iter().map(|(id, fatal, _, dev)| kernel_log(*fatal, dev, id)).collect();
            assert_eq!(got, expected, "{format:?} {line}");
            for (e, (_, _, action, dev)) in ev.iter().zip(want.iter()) {
                assert_eq!(e["recommendedAction"], *action, "{line}");
                let (msg, cause) = e["message"].as_str().unwrap().split_once(" - probable cause: ").unwrap();
                assert!(msg.ends_with(&format!(" on {dev}: {line}")), "{format:?}: {msg}");
                assert!(cause.starts_with(e["metadata"]["probableCause"].as_str().unwrap()), "{cause}");
            }
        }
        // All of them again, printed by every PF within one window: nothing new.
        let t = 100 * (FIELD_FAILURES.len() as i64 + 1);
        let all: Vec<(u64, i64, &str)> =
            FIELD_FAILURES.iter().enumerate().map(|(i, (l, _))| (3000 + i as u64, t, *l)).collect();
        let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &all));
        // One event per (pattern, card): 6 cards × their patterns, each once.
        let got: Vec<Brief> = ev.iter().map(brief).collect();
        assert_eq!(
            got,
            vec![
                kernel_log(true, "mlx5_19", "fw_fatal_error"),
                kernel_log(true, "mlx5_19", "pci_slot_unavailable"),
                kernel_log(true, "mlx5_11", "slot_reset_failed"),
                kernel_log(true, "mlx5_13", "load_failed"),
                kernel_log(true, "mlx5_2", "load_failed"),
                kernel_log(true, "mlx5_15", "load_failed"),
                kernel_log(true, "mlx5_21", "aer_recovery_failed"),
            ],
            "{format:?}"
        );
    }
}

#[test]
fn field_failure_negatives_stay_quiet() {
    let node = field_node();
    for format in ALL {
        let mut tl = started(&node, &format!("neg-{format:?}"), FIELD_PORTS);
        for (i, line) in FIELD_NEGATIVES.iter().enumerate() {
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(4000 + i as u64, t, line)]));
            assert!(ev.is_empty(), "{format:?} {line}: {ev:#?}");
        }
    }
}

/// A PCIe switch with a GPU and two IB cards below it, each on a downstream port; a second
/// root complex with a card on one root port and a GPU alone on another.
fn switch_node() -> Node {
    let mut n = Node::new("switch");
    let ib2 = |a: usize| vec![NicSpec::ib(&format!("mlx5_{a}")), NicSpec::ib(&format!("mlx5_{}", a + 1))];
    let rc = n.root_complex(0, 0);
    let rp = n.root_port(&rc, 1);
    let sw = n.switch(&rp);
    let gpu_port = n.switch_port(&sw, 0);
    n.gpu(&gpu_port, 0);
    let p = n.switch_port(&sw, 1);
    n.card(&p, 0, ib2(0));
    let p = n.switch_port(&sw, 2);
    n.card(&p, 0, ib2(2));
    let rc = n.root_complex(0, 1);
    let rp = n.root_port(&rc, 1);
    n.card(&rp, 0, ib2(4));
    let rp = n.root_port(&rc, 2);
    n.gpu(&rp, 0);
    n.write_metadata();
    n
}

/// The PCI addresses on the path from the root complex down to `bdf` (`bdf` last).
fn pci_path(node: &Node, bdf: &str) -> Vec<String> {
    let target = std::fs::read_link(node.sys().join(format!("bus/pci/devices/{bdf}"))).unwrap();
    target
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|c| c.len() == 12 && c.as_bytes()[4] == b':')
        .collect()
}

/// The bridges right above each GPU (no NIC below them), in PCI address order.
fn gpu_ports(node: &Node) -> Vec<String> {
    let mut gpus: Vec<String> = std::fs::read_dir(node.sys().join("bus/pci/devices"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|b| {
            std::fs::read_to_string(node.sys().join(format!("bus/pci/devices/{b}/class")))
                .unwrap()
                .starts_with("0x0302")
        })
        .collect();
    gpus.sort();
    gpus.iter().map(|g| pci_path(node, g).into_iter().rev().nth(1).unwrap()).collect()
}

#[test]
fn bridge_reports_name_every_monitored_card_below_the_bridge() {
    let node = switch_node();
    let nic = pci_path(&node, &node.info["mlx5_0"].bdf);
    let [root_port, upstream, downstream, _] = &nic[..] else { panic!("{nic:?}") };
    // The bridges right above each GPU (a switch port, a root port): no NIC below either.
    let gpu_ports = gpu_ports(&node);
    assert_eq!(gpu_ports.len(), 2);
    let both =
        vec![kernel_log(true, "mlx5_0", "aer_recovery_failed"), kernel_log(true, "mlx5_2", "aer_recovery_failed")];
    let mut cases: Vec<(String, Vec<Brief>)> = vec![
        (format!("pcieport {upstream}: AER: device recovery failed"), both.clone()),
        (format!("pcieport {root_port}: AER: subordinate device reset failed"), both.clone()),
        (
            format!("pcieport {downstream}: AER: device recovery failed"),
            vec![kernel_log(true, "mlx5_0", "aer_recovery_failed")],
        ),
    ];
    for port in &gpu_ports {
        cases.push((format!("pcieport {port}: AER: device recovery failed"), vec![]));
        cases.push((format!("pcieport {port}: AER: subordinate device reset failed"), vec![]));
    }
    for format in ALL {
        let mut tl = started(&node, &format!("bridge-{format:?}"), 6);
        for (i, (line, want)) in cases.iter().enumerate() {
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(500 + i as u64, t, line)]));
            assert_eq!(ev.iter().map(brief).collect::<Vec<_>>(), *want, "{format:?} {line}");
            assert!(ev.iter().all(|e| e["recommendedAction"] == "REPLACE_VM"), "{ev:#?}");
        }
    }
}

/// The GPUs' PCI addresses, in order.
fn gpus(node: &Node) -> Vec<String> {
    let mut gpus: Vec<String> = std::fs::read_dir(node.sys().join("bus/pci/devices"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|b| {
            std::fs::read_to_string(node.sys().join(format!("bus/pci/devices/{b}/class")))
                .unwrap()
                .starts_with("0x0302")
        })
        .collect();
    gpus.sort();
    gpus
}

/// mlx5 probe and initialisation failures beyond load/init, pciehp surprise removal, a
/// reset that did not bring the link back, and AER lines naming their source — on
/// [`switch_node`], where a GPU shares a switch with cards A and B: each line yields its
/// pattern on the right card, and only there.
#[test]
fn pcie_and_initialisation_failures_name_the_right_card() {
    let node = switch_node();
    let bdf = |d: &str| node.info[d].bdf.clone();
    let (a0, a1, b0, b1, c0) = (bdf("mlx5_0"), bdf("mlx5_1"), bdf("mlx5_2"), bdf("mlx5_3"), bdf("mlx5_4"));
    let path_a = pci_path(&node, &a0);
    let [root_port, _upstream, downstream_a, _] = &path_a[..] else { panic!("{path_a:?}") };
    let port_c = pci_path(&node, &c0).into_iter().rev().nth(1).unwrap();
    let gpu = gpus(&node).remove(0);
    assert!(pci_path(&node, &gpu).contains(root_port), "the GPU shares the switch with cards A and B");
    let gpu_port = gpu_ports(&node).remove(0);
    let cases: Vec<(String, Vec<Brief>)> = vec![
        (
            format!(
                "mlx5_core {a0}: wait_fw_init:1150:(pid 5): Firmware over 120000 MS in pre-initializing state, aborting"
            ),
            vec![kernel_log(true, "mlx5_0", "init_failed")],
        ),
        (
            format!("mlx5_core {b1}: probe_one:2011:(pid 1): mlx5_pci_init failed with error code -19"),
            vec![kernel_log(true, "mlx5_2", "init_failed")],
        ),
        (
            format!("mlx5_core {c0}: mlx5_function_enable:1220:(pid 1): enable hca failed"),
            vec![kernel_log(true, "mlx5_4", "init_failed")],
        ),
        (
            format!("mlx5_core {a1}: mlx5_load:1380:(pid 1): Failed to create EQs"),
            vec![kernel_log(true, "mlx5_0", "init_failed")],
        ),
        (
            format!("mlx5_core {b0}: add_drivers:355:(pid 1): Device[1] (rdma) failed to load"),
            vec![kernel_log(true, "mlx5_2", "init_failed")],
        ),
        (
            format!("mlx5_core {c0}: mlx5_function_setup:1183:(pid 1): set_hca_cap failed"),
            vec![kernel_log(true, "mlx5_4", "init_failed")],
        ),
        (
            format!("pcieport {downstream_a}: pciehp: Slot(3): Card not present"),
            vec![kernel_log(true, "mlx5_0", "pcie_surprise_removal")],
        ),
        (
            format!("pcieport {port_c}: Data Link Layer Link Active not set in 1000 msec"),
            vec![kernel_log(true, "mlx5_4", "pcie_link_not_restored")],
        ),
        (
            format!("mlx5_core {b0}: not ready 65535ms after DPC; giving up"),
            vec![kernel_log(true, "mlx5_2", "pcie_link_not_restored")],
        ),
        // The root port above the shared switch names the source: that card alone.
        (
            format!("pcieport {root_port}: AER: Uncorrectable (Fatal) error message received from {b1}"),
            vec![kernel_log(true, "mlx5_2", "pcie_fatal")],
        ),
        (
            format!("pcieport {root_port}: AER: Uncorrected (Fatal) error received: {a0}"),
            vec![kernel_log(true, "mlx5_0", "pcie_fatal")],
        ),
        (
            format!("pcieport {root_port}: AER: Uncorrectable (Non-Fatal) error message received from {a1}"),
            vec![kernel_log(false, "mlx5_0", "pcie_nonfatal")],
        ),
        // Negatives: a GPU as the AER source below the switch shared with cards A and B;
        // hot-plug of the GPU's slot; a slot's card coming back; recoveries that worked; a
        // GPU that did not come back; the driver still waiting for its firmware.
        (format!("pcieport {root_port}: AER: Uncorrectable (Fatal) error message received from {gpu}"), vec![]),
        (format!("pcieport {root_port}: AER: Uncorrected (Fatal) error received: {gpu}"), vec![]),
        (format!("pcieport {root_port}: AER: Uncorrected (Non-Fatal) error received: {gpu}"), vec![]),
        (
            format!(
                "nvidia {gpu}: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)"
            ),
            vec![],
        ),
        (format!("pcieport {gpu_port}: pciehp: Slot(1): Card not present"), vec![]),
        (format!("pcieport {gpu_port}: Data Link Layer Link Active not set in 1000 msec"), vec![]),
        (format!("nvidia {gpu}: not ready 65535ms after DPC; giving up"), vec![]),
        (format!("pcieport {downstream_a}: pciehp: Slot(3): Card present"), vec![]),
        (format!("pcieport {downstream_a}: pciehp: Slot(3): Link Up"), vec![]),
        (format!("pcieport {root_port}: DPC: containment event, status:0x1f01 source:0x0000"), vec![]),
        (format!("mlx5_core {a0}: ready 1023ms after DPC"), vec![]),
        (format!("pcieport {root_port}: AER: device recovery successful"), vec![]),
        (
            format!(
                "mlx5_core {a0}: wait_fw_init:1141:(pid 5): Waiting for FW pre-initializing, timeout abort in 120s (0xffffffff)"
            ),
            vec![],
        ),
    ];
    for format in ALL {
        let mut tl = started(&node, &format!("pcie-{format:?}"), 6);
        for (i, (line, want)) in cases.iter().enumerate() {
            let t = 100 * (i as i64 + 1);
            let ev = poll_kmsg(&mut tl, t, &kmsg_text(&node, format, &[(700 + i as u64, t, line)]));
            assert_eq!(kernel_events(&ev), *want, "{format:?} {line}");
            for e in ev.iter().filter(|e| e["isFatal"] == true) {
                assert_eq!(e["recommendedAction"], "REPLACE_VM", "{line}");
            }
        }
    }
}

/// Each line of a kernel log poll that is a `NICKernelLogCheck` event.
fn kernel_events(ev: &[serde_json::Value]) -> Vec<Brief> {
    ev.iter().map(brief).filter(|b| b.0 == "NICKernelLogCheck").collect()
}

#[test]
fn lines_about_a_card_that_already_left_sysfs_are_still_its_own() {
    let node = field_node();
    for format in ALL {
        let mut tl = started(&node, &format!("gone-{format:?}"), FIELD_PORTS);
        // Recovery of card 61 fails; its functions leave class/infiniband (config space 0xFF)
        // before the poll that reads the lines. Card 8a's driver is unbound: the same, its
        // PCI functions still readable. Card 41 leaves the bus entirely.
        for d in ["mlx5_19", "mlx5_20", "mlx5_21", "mlx5_22"] {
            node.fall_off_bus(d);
        }
        for d in ["mlx5_13", "mlx5_14"] {
            node.remove_device(d);
        }
        let lines = [
            "mlx5_core 0000:61:00.0: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110",
            "mlx5_core 0000:61:00.1: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect",
            "pcieport 0000:89:02.0: AER: device recovery failed",
            "mlx5_core: probe of 0000:41:00.0 failed with error -22",
        ];
        let records: Vec<(u64, i64, &str)> = lines.iter().enumerate().map(|(i, l)| (600 + i as u64, 1, *l)).collect();
        let ev = poll_kmsg(&mut tl, 1, &kmsg_text(&node, format, &records));
        assert_eq!(
            kernel_events(&ev),
            vec![
                kernel_log(true, "mlx5_19", "slot_reset_failed"),
                kernel_log(true, "mlx5_21", "aer_recovery_failed"),
                kernel_log(true, "mlx5_13", "load_failed"),
            ],
            "{format:?}: {ev:#?}"
        );
        for d in ["mlx5_19", "mlx5_20", "mlx5_21", "mlx5_22", "mlx5_13", "mlx5_14"] {
            node.restore_device(d);
        }
    }
}

/// The daemon on [`switch_node`] reads the kernel log from a private FIFO (`--kmsg-path`;
/// nothing is written to the real `/dev/kmsg`): each new pattern arrives at the connector
/// once per card with the table's severity; negatives and repeats within the window do not.
#[test]
fn the_daemon_reports_the_new_patterns_once_per_card() {
    let node = switch_node();
    let fifo = node.root().join("kmsg.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    // Read-write: opening never blocks, and the FIFO holds what is written before the
    // daemon opens it.
    let mut kmsg = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).unwrap();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let _d = Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-wake", "--no-metrics", "--kmsg-path", fifo.to_str().unwrap()])
            .args(["--platform-connector-socket", &conn.target(), "--connector-retry-base", "100ms"])
            .args(["--state-polling-interval", "200ms"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    const WAIT: Duration = Duration::from_secs(30);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 6), "baselines");

    let bdf = |d: &str| node.info[d].bdf.clone();
    let (a0, a1, b0, b1, c0, c1) =
        (bdf("mlx5_0"), bdf("mlx5_1"), bdf("mlx5_2"), bdf("mlx5_3"), bdf("mlx5_4"), bdf("mlx5_5"));
    let upstream = pci_path(&node, &a0).into_iter().rev().nth(2).unwrap();
    // The switch port of the GPU beside cards A and B (the first GPU by address).
    let gpu_port = gpu_ports(&node).remove(0);
    assert!(pci_path(&node, &a0).contains(&upstream) && !pci_path(&node, &a0).contains(&gpu_port));
    let lines: Vec<String> = vec![
        format!("mlx5_core {a1}: poll_health:795:(pid 0): Fatal error detected"),
        format!("mlx5_core {a0}: poll_health:795:(pid 0): Fatal error detected"),
        format!("mlx5_core {b1}: mlx5_function_setup:1120:(pid 1): PCI slot 3 is unavailable"),
        format!(
            "mlx5_core {c0}: mlx5_pci_slot_reset:1856:(pid 198): mlx5_pci_slot_reset: wait vital failed with error code: -110"
        ),
        format!(
            "mlx5_core {c0}: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect"
        ),
        format!(
            "mlx5_core {c1}: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 1. Exit, err = -110, result = 4, disconnect"
        ),
        format!("mlx5_core {a0}: init_one:1371:(pid 803): mlx5_load_one failed with error code -22"),
        format!("mlx5_core: probe of {a0} failed with error -22"),
        format!("pcieport {upstream}: AER: device recovery failed"),
        format!("pcieport {upstream}: AER: subordinate device reset failed"),
        // Negatives: another driver, a recovery that worked, a bridge with only a GPU below.
        format!("ixgbe: probe of {b0} failed with error -5"),
        format!(
            "mlx5_core {b0}: mlx5_pci_slot_reset Device state = 2 health sensors: 1 pci_status: 0. Exit, err = 0, result = 5, recovered"
        ),
        format!("pcieport {gpu_port}: AER: device recovery failed"),
        // Last: once its event is in, every line above has been processed.
        format!("mlx5_core {c1}: poll_health:801:(pid 0): device's health compromised - reached miss count"),
    ];
    let records: Vec<(u64, i64, &str)> =
        lines.iter().enumerate().map(|(i, l)| (900 + i as u64, 50, l.as_str())).collect();
    std::io::Write::write_all(&mut kmsg, kmsg_text(&node, Format::Kmsg, &records).as_bytes()).unwrap();

    let kernel = |ev: &[nicmon_proto::datamodels::HealthEvent]| -> Vec<(String, bool, i32, String)> {
        ev.iter()
            // (A start without a state file is a reboot: the check's entity-less clear comes first.)
            .filter(|e| e.check_name == "NICKernelLogCheck" && !e.entities_impacted.is_empty())
            .map(|e| {
                let ents: Vec<String> =
                    e.entities_impacted.iter().map(|x| format!("{}={}", x.entity_type, x.entity_value)).collect();
                (e.error_code.join(","), e.is_fatal, e.recommended_action, ents.join(" "))
            })
            .collect()
    };
    let sentinel =
        |ev: &[nicmon_proto::datamodels::HealthEvent]| kernel(ev).iter().any(|k| k.0 == "health_compromised");
    assert!(conn.wait_until(WAIT, sentinel), "kernel log events: {:#?}", kernel(&conn.events()));
    const REPLACE_VM: i32 = 25;
    let want: Vec<(String, bool, i32, String)> = [
        ("fw_fatal_error", "mlx5_0"),
        ("pci_slot_unavailable", "mlx5_2"),
        ("slot_reset_failed", "mlx5_4"),
        ("load_failed", "mlx5_0"),
        ("aer_recovery_failed", "mlx5_0"),
        ("aer_recovery_failed", "mlx5_2"),
        ("health_compromised", "mlx5_4"),
    ]
    .iter()
    .map(|(id, dev)| (id.to_string(), true, REPLACE_VM, format!("NIC={dev}")))
    .collect();
    let events = conn.events();
    assert_eq!(kernel(&events), want);
    for e in events.iter().filter(|e| e.check_name == "NICKernelLogCheck" && !e.entities_impacted.is_empty()) {
        assert!(!e.is_healthy && e.agent == "nic-health-monitor" && e.node_name == "gpu-node-7", "{e:?}");
    }
}

/// CPU time (clock ticks) used so far by the `kmsg-tail` thread of process `pid`.
fn tail_thread_ticks(pid: u32) -> u64 {
    let mut ticks = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        if std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "kmsg-tail")
            && let Ok(stat) = std::fs::read_to_string(t.path().join("stat"))
            && let Some((_, after)) = stat.rsplit_once(") ")
        {
            let f: Vec<&str> = after.split(' ').collect();
            ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    ticks
}

/// `--kmsg-path` on a regular file (a private file; nothing is written to the real
/// `/dev/kmsg`): followed from its end like `tail -F`, every record of an append parsed
/// (several in one write, continuation lines, one split over two writes), and no busy
/// loop while nothing is written.
#[test]
fn the_daemon_follows_a_regular_kmsg_file() {
    let node = switch_node();
    let file = node.root().join("kmsg.log");
    let bdf = |d: &str| node.info[d].bdf.clone();
    let (a0, b1, c1) = (bdf("mlx5_0"), bdf("mlx5_3"), bdf("mlx5_5"));
    // Already in the file at start (no cursor): from before the daemon, not reported.
    let before = format!("mlx5_core {b1}: mlx5_function_setup:1120:(pid 1): PCI slot 3 is unavailable");
    std::fs::write(&file, kmsg_text(&node, Format::Kmsg, &[(100, 10, before.as_str())])).unwrap();
    let conn = Connector::start(&node.root().join("nvsentinel.sock"));
    let d = Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-wake", "--no-metrics", "--kmsg-path", file.to_str().unwrap()])
            .args(["--platform-connector-socket", &conn.target(), "--connector-retry-base", "100ms"])
            .args(["--state-polling-interval", "200ms"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    const WAIT: Duration = Duration::from_secs(30);
    assert!(conn.wait_until(WAIT, |ev| ev.iter().filter(|e| e.is_healthy).count() >= 6), "baselines");

    let fatal = format!("mlx5_core {a0}: poll_health:795:(pid 0): Fatal error detected");
    let compromised =
        format!("mlx5_core {c1}: poll_health:801:(pid 0): device's health compromised - reached miss count");
    let text = kmsg_text(&node, Format::Kmsg, &[(101, 50, fatal.as_str()), (102, 50, compromised.as_str())]);
    let (first, rest) = text.split_at(text.len() - 10);
    let mut w = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut w, first.as_bytes()).unwrap();
    std::io::Write::write_all(&mut w, rest.as_bytes()).unwrap();
    let codes = |ev: &[nicmon_proto::datamodels::HealthEvent]| -> Vec<(String, String)> {
        ev.iter()
            // (A start without a state file is a reboot: the check's entity-less clear comes first.)
            .filter(|e| e.check_name == "NICKernelLogCheck" && !e.entities_impacted.is_empty())
            .map(|e| {
                let ents: Vec<String> =
                    e.entities_impacted.iter().map(|x| format!("{}={}", x.entity_type, x.entity_value)).collect();
                (e.error_code.join(","), ents.join(" "))
            })
            .collect()
    };
    assert!(conn.wait_until(WAIT, |ev| codes(ev).len() >= 2), "kernel log events: {:#?}", codes(&conn.events()));
    assert_eq!(
        codes(&conn.events()),
        [("fw_fatal_error".to_string(), "NIC=mlx5_0".to_string()), ("health_compromised".into(), "NIC=mlx5_4".into())]
    );

    // Nothing written for 2 s: the tail thread sleeps (a busy loop uses ~200 ticks at 100 Hz).
    let t0 = tail_thread_ticks(d.id());
    assert!(!conn.wait_until(Duration::from_secs(2), |ev| codes(ev).len() > 2), "no new kernel log event");
    let used = tail_thread_ticks(d.id()) - t0;
    assert!(used < 20, "the kmsg-tail thread used {used} ticks while the file was idle");
}
