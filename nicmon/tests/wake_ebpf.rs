//! The real eBPF wake-up path on this kernel: the embedded object loads, the hooks the
//! kernel allows attach and the others say why not, and a carrier loss on a veth pair
//! reaches userspace through the ring buffer as a `qdisc_reset` wake-up.
mod support;

use nicmon::read::wake::{
    EMBEDDED_OBJECT, Hint, Hook, HookStatus, Mechanism, WakeMode, WakeOptions, WakeSource, tracefs,
};
use std::path::Path;
use std::time::Duration;
use support::{VethPair, is_root, skip};

const TEST: &str = "wake_ebpf";
/// Failure bound only: on this VM the record arrives within milliseconds.
const DEADLINE: Duration = Duration::from_secs(10);

fn status(source: &WakeSource, hook: Hook) -> &HookStatus {
    source.hooks().iter().find(|h| h.hook == hook).unwrap_or_else(|| panic!("no status for {}", hook.name()))
}

#[tokio::test]
async fn qdisc_reset_wake_arrives_through_the_ring_buffer() {
    let Some(object) = EMBEDDED_OBJECT else {
        return skip(TEST, "eBPF object not built (run `cargo xtask build-ebpf`, then rebuild)");
    };
    if !is_root() {
        return skip(TEST, "needs root (BPF, tracefs, veth)");
    }
    let opts = WakeOptions { object: Some(object), rtnetlink: false, ..WakeOptions::default() };
    let mut source = WakeSource::start(&opts);
    if let Some(e) = source.ebpf_error() {
        return skip(TEST, &format!("the kernel refuses BPF here: {e}"));
    }
    for h in source.hooks() {
        eprintln!("{h}");
    }
    assert_eq!(source.mode(), WakeMode::Ebpf);

    // Every hook is either attached or says why not.
    for h in source.hooks() {
        assert!(h.attached || h.reason.as_deref().is_some_and(|r| !r.is_empty()), "{h}");
        assert_eq!(h.attached, h.via.is_some(), "{h}");
    }

    // Tracepoints the kernel has are attached; those it lacks say so.
    let tfs = tracefs::locate(false).expect("tracefs is mounted after start()");
    for (hook, system, event) in [
        (Hook::QdiscReset, "qdisc", "qdisc_reset"),
        (Hook::NetDevXmitTimeout, "net", "net_dev_xmit_timeout"),
        (Hook::DevlinkHealthReport, "devlink", "devlink_health_report"),
        (Hook::DevlinkHwerr, "devlink", "devlink_hwerr"),
        (Hook::Mlx5Fw, "mlx5", "mlx5_fw"),
        (Hook::AerEvent, "ras", "aer_event"),
    ] {
        let s = status(&source, hook);
        if tracefs::event_dir(&tfs, system, event).is_dir() {
            assert!(s.attached && s.via == Some(Mechanism::Tracepoint), "{s}");
        } else {
            assert!(!s.attached, "{s}");
            assert!(s.reason.as_deref().unwrap().contains("not present"), "{s}");
        }
    }

    // fentry/kprobe hooks: attached, or refused with the reasons of both attempts.
    let kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists() || tfs.join("kprobe_events").exists();
    for hook in [Hook::NetifCarrierOff, Hook::NetifCarrierOn, Hook::NetifCarrierEvent, Hook::LinkwatchFireEvent] {
        let s = status(&source, hook);
        if !s.attached {
            let r = s.reason.as_deref().unwrap();
            assert!(r.contains("fentry"), "{s}");
            assert!(r.contains("kprobe"), "{s}");
        }
        if !kprobes {
            assert_ne!(s.via, Some(Mechanism::Kprobe), "{s}");
        }
    }
    for hook in [Hook::IbDispatchEvent, Hook::IbDispatchEventClients] {
        let s = status(&source, hook);
        if !kprobes {
            assert!(!s.attached, "{s}");
            assert!(s.reason.as_deref().unwrap().contains("kprobes unavailable"), "{s}");
        }
    }

    // A carrier loss: both qdiscs of the pair are reset on the way down.
    let pair = match VethPair::create("e") {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot create a veth pair: {e}")),
    };
    pair.set_down(&pair.a);
    let ours = |w: &nicmon::read::wake::Wake| {
        w.hook == Hook::QdiscReset && matches!(&w.hint, Hint::Name(n) if *n == pair.a || *n == pair.b)
    };
    let wake = tokio::time::timeout(DEADLINE, async {
        loop {
            let w = source.recv().await.expect("wake source stopped");
            if ours(&w) {
                return w;
            }
        }
    })
    .await
    .expect("no qdisc_reset wake-up for the veth pair within the deadline");
    let latency = wake.delivery_latency_ns().expect("eBPF wake-ups carry a kernel timestamp");
    eprintln!("qdisc_reset wake-up for {} after {} µs", wake.hint, latency / 1000);
    assert!(latency < DEADLINE.as_nanos() as u64);
}
