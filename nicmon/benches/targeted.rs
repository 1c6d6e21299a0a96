//! The targeted poll of a wake-up (SPEC §1.8), as `cargo xtask bench-latency`'s node has
//! it (two RoCE NICs, one port each): the named device read again on the last full poll's
//! snapshot, then decided — its port flapped DOWN/ACTIVE between polls, so every other poll
//! emits an event. Median and p90 of the read and of the decision, and the CPU per poll.
//! Run with `cargo bench -p nicmon --bench targeted` (`NICMON_BENCH_POLLS`, default 5000).
use std::time::Instant;

use nicmon::act::state::Loaded;
use nicmon::decide::settings::Config;
use nicmon::decide::state::CheckState;
use nicmon::model::event::{Check, Stamp};
use nicmon::monitor::Monitor;
use nicmon::read::discovery::{self, ReadPlan};
use nicmon::read::host::Host;
use nicmon::read::topology;
use nicmon_tests::{NicSpec, Node};

fn main() {
    let polls: usize = std::env::var("NICMON_BENCH_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    // In memory, like sysfs: the fixture's writes between polls issue no block I/O.
    let mut node = Node::in_memory("bench-targeted");
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", "eth0")]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::eth("mlx5_1", "eth1")]);
    let config_path = node.root().join("nicmon.toml");
    std::fs::write(&config_path, "[stateCheck]\nflapThreshold = 0\n").expect("config");
    let config = Config::load(&config_path).expect("config");
    let host = Host::new(node.sys(), node.root().join("proc"));
    let snap0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snap0, None, false).expect("topology");
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    let checks = Check::ALL.into_iter().collect();
    let monitor = Monitor::new(host, config, topo, stamp, checks, Some("bench".into()));
    let mut state = CheckState::default();
    let mut loaded = Loaded::Missing { reboot: false };
    let mut t = time::OffsetDateTime::now_utc();
    let mut base = None;
    for _ in 0..5 {
        let p = monitor.poll(&state, &loaded, t, &[]);
        state = p.next;
        base = Some(p.snapshot);
        loaded = Loaded::Resumed;
        t += time::Duration::seconds(1);
    }
    let base = base.expect("a full poll ran");
    let port = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1");
    let targets = vec!["mlx5_0".to_string()];
    let (mut read_us, mut decide_us, mut events) = (Vec::new(), Vec::new(), 0);
    let cpu_before = cpu_time();
    for i in 0..polls {
        let (state_text, phys) =
            if i % 2 == 0 { ("1: DOWN\n", "3: Disabled\n") } else { ("4: ACTIVE\n", "5: LinkUp\n") };
        std::fs::write(port.join("state"), state_text).expect("fixture write");
        std::fs::write(port.join("phys_state"), phys).expect("fixture write");
        let start = Instant::now();
        let obs = monitor.observe_targeted(&state, &base, &targets).expect("the device set is unchanged");
        let read = start.elapsed();
        let p = monitor.decide(&state, &loaded, obs, t, &[]);
        decide_us.push((start.elapsed() - read).as_secs_f64() * 1e6);
        read_us.push(read.as_secs_f64() * 1e6);
        events += p.events.len();
        state = p.next;
        t += time::Duration::milliseconds(300);
    }
    let cpu_us = (cpu_time() - cpu_before) * 1e6 / polls as f64;
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    };
    let stat = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "targeted poll of one device, {polls} polls ({events} events): read median {:.1} us p90 {:.1} us; \
         decide median {:.1} us p90 {:.1} us; cpu (all threads, fixture writes included) {cpu_us:.1} us per poll; \
         reads ahead used {}, dropped {}",
        pct(&mut read_us, 0.5),
        pct(&mut read_us, 0.9),
        pct(&mut decide_us, 0.5),
        pct(&mut decide_us, 0.9),
        stat(&monitor.observer.host.stats.read_ahead_used),
        stat(&monitor.observer.host.stats.read_ahead_dropped),
    );
}

/// CPU time used by this process so far (user + system, all threads), in seconds.
fn cpu_time() -> f64 {
    // SAFETY: getrusage writes only the struct passed.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}
