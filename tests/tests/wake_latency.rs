//! A veth carrier loss travels through the real wake path into an immediate poll and the
//! resulting health event. The poll interval is 30 s, so an event within a second can only
//! come from a wake-up: eBPF ring buffer (when the programs are built in) and rtnetlink.
use nicmon_tests::latency::{Mode, measure};
use nicmon_tests::nicmon_bin;

fn ebpf_built_in() -> bool {
    let out = std::process::Command::new(nicmon_bin()).arg("version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("eBPF programs: built in")
}

fn run(mode: Mode, tag: &str) {
    let samples = match measure(&nicmon_bin(), mode, 3, "30s", tag) {
        Ok(s) => s,
        Err(e) if e.starts_with("ip") => {
            eprintln!("SKIPPED wake_latency {}: cannot create a veth pair here ({e})", mode.name());
            return;
        }
        Err(e) => panic!("{}: {e}", mode.name()),
    };
    assert_eq!(samples.ms.len(), 3);
    for ms in &samples.ms {
        assert!(
            *ms < 1000.0,
            "{}: event {ms:.1} ms after the carrier loss: not woken\n{}",
            mode.name(),
            samples.hooks_log
        );
    }
    if mode == Mode::Ebpf {
        assert!(samples.hooks_log.contains("mode=\"ebpf\""), "{}", samples.hooks_log);
        // The hooks this kernel refuses are reported, and the agent kept running.
        assert!(samples.hooks_log.contains("wake-up hook not attached"), "{}", samples.hooks_log);
    }
}

#[test]
fn ebpf_wake_up_drives_an_immediate_poll_and_event() {
    if !ebpf_built_in() {
        eprintln!("SKIPPED wake_latency ebpf: eBPF programs not built in (run cargo xtask build-ebpf)");
        return;
    }
    run(Mode::Ebpf, &format!("nmw{}e", std::process::id() % 100000));
}

#[test]
fn rtnetlink_wake_up_drives_an_immediate_poll_and_event() {
    run(Mode::Rtnetlink, &format!("nmw{}r", std::process::id() % 100000));
}
