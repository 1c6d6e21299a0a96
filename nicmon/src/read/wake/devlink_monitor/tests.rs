//! Messages built as the kernel builds them (`net/devlink/health.c`
//! `devlink_nl_health_reporter_fill`: `genlmsg_put` of the command, the handle `BUS_NAME`,
//! `DEV_NAME`, a port reporter's `PORT_INDEX`, then `HEALTH_REPORTER` nested with `NAME`,
//! `STATE` u8, `ERR_COUNT`, `RECOVER_COUNT`, `GRACEFUL_PERIOD`, `AUTO_RECOVER`…; `dev.c`
//! `devlink_nl_fill` for `NEW`/`DEL`: the handle, `RELOAD_FAILED`, …), then any bytes; and, as
//! root where netdevsim exists, the kernel's own.
use proptest::prelude::*;

use super::*;
use crate::read::ethtool::netlink::put_attr;

/// The family id these crafted messages carry (the kernel picks one at boot).
const FAMILY: u16 = 27;
/// `NLA_F_NESTED`.
const NESTED: u16 = 1 << 15;

fn z(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// One generic netlink message of `family`: `nlmsghdr`, `genlmsghdr` (`cmd`, version 1),
/// attributes.
fn message(family: u16, cmd: u8, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((NLMSG_HDRLEN + GENL_HDRLEN + attrs.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

fn handle(bus: &str, dev: &str) -> Vec<u8> {
    let mut a = Vec::new();
    put_attr(&mut a, 1, &z(bus)); // DEVLINK_ATTR_BUS_NAME
    put_attr(&mut a, 2, &z(dev)); // DEVLINK_ATTR_DEV_NAME
    a
}

/// `DEVLINK_CMD_HEALTH_REPORTER_RECOVER` for reporter `name` in `state`.
fn recover(bus: &str, dev: &str, port: Option<u32>, name: &str, state: u8) -> Vec<u8> {
    let mut a = handle(bus, dev);
    if let Some(p) = port {
        put_attr(&mut a, 3, &p.to_ne_bytes()); // DEVLINK_ATTR_PORT_INDEX
    }
    let mut nested = Vec::new();
    put_attr(&mut nested, 115, &z(name)); // HEALTH_REPORTER_NAME
    put_attr(&mut nested, 116, &[state]); // HEALTH_REPORTER_STATE
    put_attr(&mut nested, 117, &3u64.to_ne_bytes()); // ERR_COUNT
    put_attr(&mut nested, 118, &2u64.to_ne_bytes()); // RECOVER_COUNT
    put_attr(&mut nested, 120, &500u64.to_ne_bytes()); // GRACEFUL_PERIOD
    put_attr(&mut nested, 121, &[1]); // AUTO_RECOVER
    put_attr(&mut a, 114 | NESTED, &nested); // DEVLINK_ATTR_HEALTH_REPORTER
    message(FAMILY, CMD_HEALTH_REPORTER_RECOVER, &a)
}

fn instance(cmd: u8, bus: &str, dev: &str) -> Vec<u8> {
    let mut a = handle(bus, dev);
    put_attr(&mut a, 136, &[0]); // DEVLINK_ATTR_RELOAD_FAILED
    message(FAMILY, cmd, &a)
}

#[test]
fn a_reporter_in_error_wakes_with_the_pci_address() {
    let got = parse(&recover("pci", "0000:3b:00.1", None, "fw_fatal", 1), FAMILY);
    assert_eq!(
        got,
        [Notice {
            event: Event::Health,
            bus: "pci".into(),
            dev: "0000:3b:00.1".into(),
            reporter: Some(("fw_fatal".into(), ReporterState::Error)),
        }]
    );
    let wake = got[0].clone().into_wake(Instant::now(), 1);
    assert_eq!(
        (wake.hook, &wake.hint, wake.removed),
        (Hook::DevlinkMonitor, &Hint::Name("0000:3b:00.1".into()), false)
    );
    assert!(super::super::is_devlink(wake.hook), "its targeted poll reads the reporters");
    // Recovered (healthy again), a port reporter: the same hint.
    let got = parse(&recover("pci", "0000:3b:00.0", Some(65535), "tx", 0), FAMILY);
    assert_eq!(got[0].reporter, Some(("tx".into(), ReporterState::Healthy)));
    assert_eq!(got[0].dev, "0000:3b:00.0");
}

#[test]
fn an_unregistered_instance_is_a_removal_and_a_new_one_is_not() {
    let got = parse(&instance(CMD_DEL, "pci", "0000:15:00.0"), FAMILY);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].event, got[0].reporter.as_ref()), (Event::Del, None));
    let wake = got[0].clone().into_wake(Instant::now(), 1);
    assert_eq!((wake.hint, wake.removed), (Hint::Name("0000:15:00.0".into()), true));
    let got = parse(&instance(CMD_NEW, "netdevsim", "netdevsim10"), FAMILY);
    assert_eq!((got[0].event, got[0].bus.as_str(), got[0].dev.as_str()), (Event::New, "netdevsim", "netdevsim10"));
    assert!(!got[0].clone().into_wake(Instant::now(), 1).removed);
}

#[test]
fn several_messages_in_one_datagram_and_others_skipped() {
    let mut buf = recover("pci", "0000:3b:00.0", None, "fw", 1);
    buf.extend(instance(7, "pci", "0000:3b:00.0")); // DEVLINK_CMD_PORT_NEW: not a wake-up
    buf.extend(message(FAMILY + 1, CMD_DEL, &handle("pci", "0000:99:00.0"))); // another family
    buf.extend(instance(CMD_DEL, "auxiliary", "mlx5_core.eth.0"));
    let devs: Vec<String> = parse(&buf, FAMILY).into_iter().map(|n| n.dev).collect();
    assert_eq!(devs, ["0000:3b:00.0", "mlx5_core.eth.0"]);
    // No bus or no device name: skipped; a reporter that does not parse leaves only the handle.
    let mut no_bus = Vec::new();
    put_attr(&mut no_bus, 2, &z("0000:3b:00.0"));
    assert!(parse(&message(FAMILY, CMD_DEL, &no_bus), FAMILY).is_empty());
    let mut bad_reporter = handle("pci", "0000:3b:00.0");
    put_attr(&mut bad_reporter, 114 | NESTED, &[1, 2, 3]);
    let got = parse(&message(FAMILY, CMD_HEALTH_REPORTER_RECOVER, &bad_reporter), FAMILY);
    assert_eq!((got.len(), got[0].reporter.as_ref()), (1, None));
    assert!(parse(&[], FAMILY).is_empty());
    assert!(parse(&message(FAMILY, CMD_DEL, &[]), FAMILY).is_empty());
}

proptest! {
    /// Any bytes, any family id, every truncation of a real message: never a panic.
    #[test]
    fn any_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        family in any::<u16>(),
        cut in 0usize..160,
    ) {
        let _ = parse(&bytes, family);
        let m = recover("pci", "0000:3b:00.0", Some(1), "fw_fatal", 1);
        let _ = parse(&m[..cut.min(m.len())], FAMILY);
        // Arbitrary bytes behind a valid header of the right family.
        let mut framed = message(FAMILY, CMD_HEALTH_REPORTER_RECOVER, &[]);
        framed.extend_from_slice(&bytes);
        let len = framed.len() as u32;
        framed[..4].copy_from_slice(&len.to_ne_bytes());
        let _ = parse(&framed, FAMILY);
    }
}

/// The probe's answer here, in one line: the socket opens and joins the `config` group where
/// the kernel has devlink; otherwise the kernel's refusal is the reason reported.
#[test]
fn the_socket_opens_or_says_why_not() {
    match MonitorSocket::open() {
        Ok(s) => {
            assert!(s.as_raw_fd() >= 0);
            assert!(s.family() >= 16, "a generic netlink family id (GENL_MIN_ID)");
        }
        Err(e) => println!("devlink netlink monitor refused here ({e}): the wake source reports it as not attached"),
    }
}

mod live;
