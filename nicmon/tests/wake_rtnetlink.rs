//! The rtnetlink fallback: a carrier loss on a veth pair wakes the agent with the
//! interface's name, without any eBPF.
mod support;

use nicmon::read::wake::{Hint, Hook, Mechanism, WakeMode, WakeOptions, WakeSource};
use std::time::Duration;
use support::{VethPair, is_root, skip};

const TEST: &str = "wake_rtnetlink";
const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn link_down_wakes_through_rtnetlink() {
    if !is_root() {
        return skip(TEST, "needs root (veth)");
    }
    let opts = WakeOptions {
        object: None,
        rtnetlink: true,
        uevent: false,
        rdma_monitor: false,
        devlink_monitor: false,
        ..WakeOptions::default()
    };
    let mut source = WakeSource::start(&opts);
    assert_eq!(source.mode(), WakeMode::RtnetlinkOnly, "{:?}", source.hooks());
    assert_eq!(source.live_hooks().collect::<Vec<_>>(), vec![Hook::Rtnetlink]);
    assert_eq!(source.hooks()[0].via, Some(Mechanism::Rtnetlink));
    assert!(source.ebpf_error().is_some());

    let pair = match VethPair::create("r") {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot create a veth pair: {e}")),
    };
    pair.set_down(&pair.b);
    let wake = tokio::time::timeout(DEADLINE, async {
        loop {
            let w = source.recv().await.expect("wake source stopped");
            if matches!(&w.hint, Hint::Name(n) if *n == pair.b) {
                return w;
            }
        }
    })
    .await
    .expect("no rtnetlink wake-up for the veth within the deadline");
    assert_eq!(wake.hook, Hook::Rtnetlink);
    assert_eq!(wake.kernel_ts_ns, None);
}

#[tokio::test]
async fn nothing_enabled_means_no_wake_source() {
    let source = WakeSource::start(&WakeOptions {
        object: None,
        rtnetlink: false,
        uevent: false,
        rdma_monitor: false,
        devlink_monitor: false,
        ..WakeOptions::default()
    });
    assert_eq!(source.mode(), WakeMode::None);
    assert!(source.hooks().is_empty());
}

/// The devlink notification source alone: one hook, attached through devlink netlink where
/// the kernel has devlink, else not attached with the kernel's answer — the same answer
/// `nicmon version`'s probe gives. The mode stays "none": it is not a carrier source.
#[tokio::test]
async fn the_devlink_monitor_is_reported_attached_or_with_the_kernels_reason() {
    let source = WakeSource::start(&WakeOptions {
        object: None,
        rtnetlink: false,
        uevent: false,
        rdma_monitor: false,
        devlink_monitor: true,
        ..WakeOptions::default()
    });
    assert_eq!(source.mode(), WakeMode::None);
    let [h] = source.hooks() else { panic!("one hook: {:?}", source.hooks()) };
    assert_eq!(h.hook, Hook::DevlinkMonitor);
    let probe = nicmon::read::wake::probe_userspace();
    let (_, probed) = probe.iter().find(|(hook, _)| *hook == Hook::DevlinkMonitor).expect("the probe covers it");
    if h.attached {
        assert_eq!(h.via, Some(Mechanism::DevlinkNetlink));
        assert!(probed.is_ok(), "{probed:?}");
    } else {
        let reason = h.reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with("devlink netlink: "), "{reason}");
        assert_eq!(probed.as_ref().err().map(String::as_str), Some(reason), "the probe says the same");
        println!("devlink monitor not attached here: {reason}");
    }
}
