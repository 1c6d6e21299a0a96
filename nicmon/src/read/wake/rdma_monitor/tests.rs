//! Messages built as `rdma_nl_notify_event` builds them (`drivers/infiniband/core/nldev.c`:
//! `nlmsg_put` of `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_MONITOR)`, then
//! `EVENT_TYPE` u8, `DEV_INDEX` u32, `DEV_NAME` string, and for netdev events `PORT_INDEX`,
//! `NDEV_INDEX`, `NDEV_NAME`), then any bytes.
use proptest::prelude::*;

use super::*;

fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut a = Vec::new();
    a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(payload);
    while a.len() % 4 != 0 {
        a.push(0);
    }
    a
}

fn message(kind: u16, attrs: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = attrs.concat();
    let mut m = Vec::new();
    m.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&7u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&body);
    m
}

fn monitor(event: u8, dev: &str, ndev: Option<&str>) -> Vec<u8> {
    let mut attrs = vec![attr(102, &[event]), attr(1, &3u32.to_ne_bytes()), attr(2, format!("{dev}\0").as_bytes())];
    if let Some(nd) = ndev {
        attrs.push(attr(3, &1u32.to_ne_bytes()));
        attrs.push(attr(50, &9u32.to_ne_bytes()));
        attrs.push(attr(51, format!("{nd}\0").as_bytes()));
    }
    message(MONITOR_TYPE, &attrs)
}

#[test]
fn unregister_and_detach_are_removals_naming_the_device() {
    let got = parse(&monitor(1, "mlx5_3", None));
    assert_eq!(got, [Notice { event: Event::Unregister, device: "mlx5_3".into(), netdev: None }]);
    assert!(got[0].event.is_removal());
    let got = parse(&monitor(3, "mlx5_3", Some("eth2")));
    assert_eq!(got, [Notice { event: Event::NetdevDetach, device: "mlx5_3".into(), netdev: Some("eth2".into()) }]);
    assert!(got[0].event.is_removal());
    let wake = got[0].clone().into_wake(Instant::now(), 1);
    assert_eq!((wake.hook, wake.hint, wake.removed), (Hook::RdmaMonitor, Hint::Name("mlx5_3".into()), true));
}

#[test]
fn register_attach_and_renames_wake_without_a_removal() {
    for code in [0u8, 2, 4, 5] {
        let got = parse(&monitor(code, "rocep1s0", Some("ens1np0")));
        assert_eq!(got.len(), 1, "{code}");
        assert!(!got[0].event.is_removal(), "{code}");
    }
}

#[test]
fn several_messages_in_one_datagram_and_others_skipped() {
    let mut buf = monitor(1, "mlx5_0", None);
    buf.extend(message(20, &[attr(2, b"lo\0")])); // an unrelated message type
    buf.extend(monitor(1, "mlx5_1", None));
    let names: Vec<String> = parse(&buf).into_iter().map(|n| n.device).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1"]);
    // No event type, an unknown one, no device name: skipped.
    assert!(parse(&message(MONITOR_TYPE, &[attr(2, b"mlx5_0\0")])).is_empty());
    assert!(parse(&monitor(9, "mlx5_0", None)).is_empty());
    assert!(parse(&message(MONITOR_TYPE, &[attr(102, &[1])])).is_empty());
    assert!(parse(&[]).is_empty());
}

proptest! {
    /// Any bytes, and every truncation of a real message: never a panic.
    #[test]
    fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..120) {
        let _ = parse(&bytes);
        let m = monitor(3, "mlx5_3", Some("eth2"));
        let _ = parse(&m[..cut.min(m.len())]);
    }
}

/// As root: the socket opens and joins the notify group where the RDMA core is loaded;
/// otherwise the kernel's refusal is the reason reported (this VM has no InfiniBand).
#[test]
fn the_socket_opens_or_says_why_not() {
    match MonitorSocket::open() {
        Ok(s) => assert!(s.as_raw_fd() >= 0),
        Err(e) => println!("RDMA netlink monitor refused here ({e}): the wake source reports it as not attached"),
    }
}
