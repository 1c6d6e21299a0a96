//! Parsers for the values the kernel prints in sysfs and procfs.
//!
//! Pure functions of the file's bytes; none panics on any input (proptests below). A value
//! that cannot be understood is `None` (or an `Unknown` variant carrying the raw text),
//! never a healthy-looking default. Formats: `reference/sysfs-formats.md`.
use crate::model::{LinkLayer, OperState, PhysState, PortState, Rate};

/// Trim the trailing newline(s) and surrounding blanks; `None` when nothing is left.
pub fn text(raw: &str) -> Option<&str> {
    let t = raw.trim();
    (!t.is_empty()).then_some(t)
}

/// Split `"4: ACTIVE"` into `(Some(4), "ACTIVE")`; a value without a number gives `(None, s)`.
fn numbered(raw: &str) -> Option<(Option<u32>, &str)> {
    let t = text(raw)?;
    match t.split_once(':') {
        Some((n, name)) => match n.trim().parse::<u32>() {
            Ok(n) => Some((Some(n), name.trim())),
            Err(_) => Some((None, t)),
        },
        None => Some((None, t)),
    }
}

/// `ports/<n>/state`: `"%d: %s"` — 0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.
pub fn port_state(raw: &str) -> Option<PortState> {
    let (num, name) = numbered(raw)?;
    let by_name = match name.to_ascii_uppercase().as_str() {
        "NOP" => Some(PortState::Nop),
        "DOWN" => Some(PortState::Down),
        "INIT" => Some(PortState::Init),
        "ARMED" => Some(PortState::Armed),
        "ACTIVE" => Some(PortState::Active),
        "ACTIVE_DEFER" => Some(PortState::ActiveDefer),
        _ => None,
    };
    let by_num = match num {
        Some(0) => Some(PortState::Nop),
        Some(1) => Some(PortState::Down),
        Some(2) => Some(PortState::Init),
        Some(3) => Some(PortState::Armed),
        Some(4) => Some(PortState::Active),
        Some(5) => Some(PortState::ActiveDefer),
        _ => None,
    };
    // The name and the number must agree when both are known; otherwise the value is garbage.
    Some(match (by_num, by_name) {
        (Some(a), Some(b)) if a == b => a,
        (None, Some(b)) => b,
        _ => PortState::Unknown(text(raw).unwrap_or_default().to_string()),
    })
}

/// `ports/<n>/phys_state`: `"%u: %s"` — 1 Sleep … 7 Phy Test.
pub fn phys_state(raw: &str) -> Option<PhysState> {
    let (num, name) = numbered(raw)?;
    let by_name = match name {
        "Sleep" => Some(PhysState::Sleep),
        "Polling" => Some(PhysState::Polling),
        "Disabled" => Some(PhysState::Disabled),
        "PortConfigurationTraining" => Some(PhysState::PortConfigurationTraining),
        "LinkUp" => Some(PhysState::LinkUp),
        "LinkErrorRecovery" => Some(PhysState::LinkErrorRecovery),
        "Phy Test" => Some(PhysState::PhyTest),
        _ => None,
    };
    let by_num = match num {
        Some(1) => Some(PhysState::Sleep),
        Some(2) => Some(PhysState::Polling),
        Some(3) => Some(PhysState::Disabled),
        Some(4) => Some(PhysState::PortConfigurationTraining),
        Some(5) => Some(PhysState::LinkUp),
        Some(6) => Some(PhysState::LinkErrorRecovery),
        Some(7) => Some(PhysState::PhyTest),
        _ => None,
    };
    // A ConnectX-4 dump shows phys_state "4: ACTIVE": number and name disagree → unknown.
    Some(match (by_num, by_name) {
        (Some(a), Some(b)) if a == b => a,
        (None, Some(b)) => b,
        _ => PhysState::Unknown(text(raw).unwrap_or_default().to_string()),
    })
}

/// `ports/<n>/link_layer`.
pub fn link_layer(raw: &str) -> Option<LinkLayer> {
    let t = text(raw)?;
    Some(match t {
        "InfiniBand" => LinkLayer::InfiniBand,
        "Ethernet" => LinkLayer::Ethernet,
        other => LinkLayer::Unknown(other.to_string()),
    })
}

/// `ports/<n>/rate`: `"%d%s Gb/sec (%dX%s)"` — `"400 Gb/sec (4X NDR)"`, `"2.5 Gb/sec (1X SDR)"`,
/// `"10 Gb/sec (4X)"`.
pub fn rate(raw: &str) -> Option<Rate> {
    let t = text(raw)?;
    let (num, rest) = t.split_once(' ')?;
    let gbps: f64 = num.parse().ok().filter(|v: &f64| v.is_finite() && *v >= 0.0)?;
    let rest = rest.trim_start();
    if !rest.starts_with("Gb/sec") {
        return None;
    }
    let detail = rest["Gb/sec".len()..].trim();
    let (width, speed) = match detail.strip_prefix('(').and_then(|d| d.strip_suffix(')')) {
        Some(inner) => {
            let mut parts = inner.split_whitespace();
            let width = parts.next().map(str::to_string);
            let speed = parts.next().map(str::to_string);
            (width, speed)
        }
        None => (None, None),
    };
    Some(Rate { gbps, width, speed })
}

/// A counter file: a decimal `u64` (`%llu`). `"N/A (no PMA)"` and anything else → `None`.
pub fn counter(raw: &str) -> Option<u64> {
    text(raw)?.parse().ok()
}

/// A netdev's `carrier`: `1` → up, `0` → down, anything else → `None`.
pub fn carrier(raw: &str) -> Option<bool> {
    match text(raw)? {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// `lid`, `sm_lid` (`"0x%x"`); PCI `vendor`, `device`, `class` (`"0x15b3"`, `"0x030200"`).
pub fn hex_u32(raw: &str) -> Option<u32> {
    let t = text(raw)?;
    let digits = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"))?;
    u32::from_str_radix(digits, 16).ok()
}

/// `numa_node`: decimal, `-1` when unknown (→ `None`).
pub fn numa_node(raw: &str) -> Option<i32> {
    text(raw)?.parse::<i32>().ok().filter(|n| *n >= 0)
}

/// `class/net/<if>/speed`: Mb/s in decimal (`%d`); `-1` (`SPEED_UNKNOWN`: no link), `0`
/// and anything else → `None`.
pub fn netdev_speed(raw: &str) -> Option<u64> {
    text(raw)?.parse::<u64>().ok().filter(|n| *n > 0)
}

/// `class/net/<if>/operstate`.
pub fn operstate(raw: &str) -> Option<OperState> {
    let t = text(raw)?;
    Some(match t {
        "unknown" => OperState::Unknown,
        "notpresent" => OperState::NotPresent,
        "down" => OperState::Down,
        "lowerlayerdown" => OperState::LowerLayerDown,
        "testing" => OperState::Testing,
        "dormant" => OperState::Dormant,
        "up" => OperState::Up,
        other => OperState::Other(other.to_string()),
    })
}

/// `device/uevent`: the `PCI_SLOT_NAME=` line.
pub fn uevent_pci_slot(raw: &str) -> Option<String> {
    raw.lines().find_map(|l| l.trim().strip_prefix("PCI_SLOT_NAME=")).and_then(|v| pci_address(v.trim()))
}

/// Normalise a PCI address to `dddd:bb:dd.f` lowercase (NVML prints 8-digit domains:
/// `00000000:0F:00.0`). `None` when it is not a PCI address.
pub fn pci_address(raw: &str) -> Option<String> {
    let t = raw.trim();
    let (dbd, func) = t.rsplit_once('.')?;
    let mut parts = dbd.split(':');
    let (dom, bus, dev) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(v), None) => (d, b, v),
        (Some(b), Some(v), None, None) => ("0", b, v),
        _ => return None,
    };
    let dom = u32::from_str_radix(dom, 16).ok().filter(|_| dom.len() <= 8)?;
    let bus = u8::from_str_radix(bus, 16).ok().filter(|_| bus.len() <= 2)?;
    let dev = u8::from_str_radix(dev, 16).ok().filter(|d| *d < 32 && dev.len() <= 2)?;
    let func = u8::from_str_radix(func, 16).ok().filter(|f| *f < 8 && func.len() == 1)?;
    if dom > 0xffff {
        return None;
    }
    Some(format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// The physical card of a PCI function: `domain:bus:device` of a normalised address.
pub fn card_of(pci: &str) -> Option<String> {
    let norm = pci_address(pci)?;
    norm.rsplit_once('.').map(|(card, _)| card.to_string())
}

/// Interfaces carrying a default route in `/proc/net/route` (destination and mask 0).
pub fn default_route_ifaces(raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in raw.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let (iface, dest, flags, mask) = (f[0], f[1], f[3], f[7]);
        let up = u32::from_str_radix(flags, 16).map(|fl| fl & 0x1 != 0).unwrap_or(false);
        if dest == "00000000" && mask == "00000000" && up && !out.iter().any(|o| o == iface) {
            out.push(iface.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn port_states_from_the_kernel() {
        let table = [
            ("0: NOP\n", PortState::Nop),
            ("1: DOWN\n", PortState::Down),
            ("2: INIT\n", PortState::Init),
            ("3: ARMED\n", PortState::Armed),
            ("4: ACTIVE\n", PortState::Active),
            ("4: ACTIVE", PortState::Active),
            ("5: ACTIVE_DEFER\n", PortState::ActiveDefer),
            ("\n4: ACTIVE\n\n", PortState::Active),
            ("ACTIVE", PortState::Active),
            ("9: UNKNOWN\n", PortState::Unknown("9: UNKNOWN".into())),
            ("4: DOWN\n", PortState::Unknown("4: DOWN".into())),
        ];
        for (raw, want) in table {
            assert_eq!(port_state(raw), Some(want), "{raw:?}");
        }
        assert_eq!(port_state(""), None);
        assert_eq!(port_state("\n"), None);
    }

    #[test]
    fn phys_states_from_the_kernel() {
        let table = [
            ("1: Sleep\n", PhysState::Sleep),
            ("2: Polling\n", PhysState::Polling),
            ("3: Disabled\n", PhysState::Disabled),
            ("4: PortConfigurationTraining\n", PhysState::PortConfigurationTraining),
            ("5: LinkUp\n", PhysState::LinkUp),
            ("5: LinkUp", PhysState::LinkUp),
            ("6: LinkErrorRecovery\n", PhysState::LinkErrorRecovery),
            ("7: Phy Test\n", PhysState::PhyTest),
            ("8: <unknown>\n", PhysState::Unknown("8: <unknown>".into())),
            // ConnectX-4 driver garbage seen in a real dump.
            ("4: ACTIVE\n", PhysState::Unknown("4: ACTIVE".into())),
        ];
        for (raw, want) in table {
            assert_eq!(phys_state(raw), Some(want), "{raw:?}");
        }
        assert!(PhysState::Polling.is_training());
        assert!(!PhysState::Disabled.is_training());
    }

    #[test]
    fn rates_from_the_kernel() {
        let table = [
            ("400 Gb/sec (4X NDR)\n", 400.0, Some("4X"), Some("NDR")),
            ("200 Gb/sec (2X NDR)\n", 200.0, Some("2X"), Some("NDR")),
            ("25 Gb/sec (1X EDR)\n", 25.0, Some("1X"), Some("EDR")),
            ("40 Gb/sec (4X QDR)\n", 40.0, Some("4X"), Some("QDR")),
            ("2.5 Gb/sec (1X SDR)\n", 2.5, Some("1X"), Some("SDR")),
            ("56 Gb/sec (4X FDR)\n", 56.0, Some("4X"), Some("FDR")),
            ("100 Gb/sec (4X FDR10)", 100.0, Some("4X"), Some("FDR10")),
            ("800 Gb/sec (4X XDR)\n", 800.0, Some("4X"), Some("XDR")),
            ("10 Gb/sec (4X)\n", 10.0, Some("4X"), None),
        ];
        for (raw, gbps, width, speed) in table {
            let r = rate(raw).unwrap_or_else(|| panic!("{raw:?}"));
            assert_eq!(r.gbps, gbps);
            assert_eq!(r.width.as_deref(), width);
            assert_eq!(r.speed.as_deref(), speed);
        }
        assert_eq!(rate(""), None);
        assert_eq!(rate("fast"), None);
        assert_eq!(rate("-5 Gb/sec (4X)"), None);
    }

    #[test]
    fn counters_link_layers_and_numbers() {
        assert_eq!(counter("0\n"), Some(0));
        assert_eq!(counter("4294967295\n"), Some(4294967295));
        assert_eq!(counter("18446744073709551615"), Some(u64::MAX));
        assert_eq!(counter("N/A (no PMA)\n"), None);
        assert_eq!(counter(""), None);
        assert_eq!(counter("-1"), None);
        assert_eq!(link_layer("InfiniBand\n"), Some(LinkLayer::InfiniBand));
        assert_eq!(link_layer("Ethernet"), Some(LinkLayer::Ethernet));
        assert_eq!(link_layer("Unknown\n"), Some(LinkLayer::Unknown("Unknown".into())));
        assert_eq!(hex_u32("0x1a\n"), Some(0x1a));
        assert_eq!(hex_u32("0x0"), Some(0));
        assert_eq!(hex_u32("12"), None);
        assert_eq!(hex_u32("0x15b3\n"), Some(0x15b3));
        assert_eq!(numa_node("1\n"), Some(1));
        assert_eq!(numa_node("-1\n"), None);
        for s in ["unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up"] {
            assert_eq!(operstate(&format!("{s}\n")).unwrap().name(), s);
        }
    }

    #[test]
    fn pci_addresses_and_cards() {
        assert_eq!(pci_address("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(pci_address("00000000:0F:00.0").as_deref(), Some("0000:0f:00.0"));
        assert_eq!(pci_address("0f:00.1").as_deref(), Some("0000:0f:00.1"));
        assert_eq!(pci_address("0002:03:00.0").as_deref(), Some("0002:03:00.0"));
        assert_eq!(pci_address("pci0000:17"), None);
        assert_eq!(pci_address("0000:3b:00.8"), None);
        assert_eq!(card_of("0000:47:00.1").as_deref(), Some("0000:47:00"));
        assert_eq!(
            uevent_pci_slot("DRIVER=mlx5_core\nPCI_CLASS=20700\nPCI_SLOT_NAME=0000:3b:00.0\n").as_deref(),
            Some("0000:3b:00.0")
        );
    }

    #[test]
    fn default_route_from_proc_net_route() {
        let raw = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                   eth0\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                   eth0\t0000A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
                   ib0\t0000100A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
        assert_eq!(default_route_ifaces(raw), vec!["eth0".to_string()]);
        assert!(default_route_ifaces("").is_empty());
    }

    #[test]
    fn netdev_speed_values() {
        assert_eq!(netdev_speed("200000\n"), Some(200_000));
        assert_eq!(netdev_speed("25000"), Some(25_000));
        for unknown in ["-1\n", "0\n", "", "fast\n", "4294967295000000000000\n"] {
            assert_eq!(netdev_speed(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn carrier_values() {
        assert_eq!(carrier("1\n"), Some(true));
        assert_eq!(carrier("0"), Some(false));
        assert_eq!(carrier("up\n"), None);
        assert_eq!(carrier(""), None);
        assert_eq!(counter("N/A\n"), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = port_state(&s);
            let _ = phys_state(&s);
            let _ = link_layer(&s);
            let _ = rate(&s);
            let _ = counter(&s);
            let _ = hex_u32(&s);
            let _ = numa_node(&s);
            let _ = operstate(&s);
            let _ = carrier(&s);
            let _ = netdev_speed(&s);
            let _ = uevent_pci_slot(&s);
            let _ = pci_address(&s);
            let _ = card_of(&s);
            let _ = default_route_ifaces(&s);
        }

        #[test]
        fn parsers_never_panic_on_near_misses(
            n in 0u32..12,
            name in "(ACTIVE|DOWN|LinkUp|Phy Test|Polling|[A-Za-z: ]{0,12})",
            nl in proptest::bool::ANY,
        ) {
            let raw = format!("{n}: {name}{}", if nl { "\n" } else { "" });
            let _ = port_state(&raw);
            let _ = phys_state(&raw);
            let _ = rate(&format!("{n}.5 Gb/sec ({n}X {name})"));
        }
    }
}
