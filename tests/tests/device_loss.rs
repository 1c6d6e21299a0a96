//! Device loss on the kernel's own word (SPEC §1.15): a RoCE NIC whose netdev is a real
//! veth leaves the fixture tree and the host deletes its veth. The kernel announces the
//! netdev's removal (uevent `remove`, `RTM_DELLINK`), the poll it wakes finds the device gone
//! from sysfs, and the disappearance is reported at once instead of after three polls.
use nicmon_tests::latency::device_loss;
use nicmon_tests::nicmon_bin;

fn run(flags: &[&str], tag: &str, what: &str) -> Option<nicmon_tests::latency::DeviceLoss> {
    match device_loss(&nicmon_bin(), flags, "1s", tag) {
        Ok(l) => Some(l),
        Err(e) if e.starts_with("ip") => {
            eprintln!("SKIPPED device_loss {what}: cannot create a veth pair here ({e})");
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

#[test]
fn the_kernel_word_reports_a_lost_device_without_three_polls() {
    let tag = format!("nml{}u", std::process::id() % 100000);
    // eBPF off: the kernel's word comes from the uevent (and rtnetlink) sockets.
    let Some(loss) = run(&["--no-ebpf"], &tag, "uevent") else { return };
    println!(
        "device loss, kernel's word: fatal event delivered {:.1} ms (generated {:.1} ms) after the veth's deletion",
        loss.delivered_ms, loss.generated_ms
    );
    assert!(loss.message.contains("NIC mlx5_0 disappeared"), "{}", loss.message);
    assert!(loss.log.contains("uevent"), "the start-up line names the uevent source:\n{}", loss.log);
    // Three 1 s polls would take ≥ 2 s after the device left; the kernel's word: one poll.
    assert!(loss.delivered_ms < 1500.0, "{:.1} ms: not reported on the kernel's word\n{}", loss.delivered_ms, loss.log);
}

#[test]
fn without_the_kernel_word_three_polls_are_needed() {
    let tag = format!("nml{}p", std::process::id() % 100000);
    let Some(loss) = run(&["--no-wake"], &tag, "polling") else { return };
    println!("device loss, polling only: fatal event delivered {:.1} ms after the veth's deletion", loss.delivered_ms);
    assert!(loss.message.contains("NIC mlx5_0 disappeared"), "{}", loss.message);
    assert!(loss.delivered_ms > 1500.0, "{:.1} ms: reported before three 1 s polls", loss.delivered_ms);
}
