//! One full poll (read the host tree + evaluate every check) on the DGX-H100-like testbed
//! node: median and p99 wall time, and in the same run the floor: open/read/close of every
//! file a cold poll reads (the files a naive poller reads each time), and the ratio.
//! Run with `cargo bench -p nicmon --bench poll`.
//!
//! The node: `NICMON_BENCH_VFS=N` gives each InfiniBand PF `N` SR-IOV VFs (unmonitored
//! functions; 2 by default, the platform's), `NICMON_BENCH_PORTS=N` gives the first PF `N`
//! ports (copies of its port 1). `NICMON_BENCH_TREE=DIR` only builds that node under `DIR`
//! (kept: a daemon can be run on it) and prints nothing else. With VFs or ports asked for
//! (either variable set), the same node without them (no VF, one port) is polled too, alternately with it (the
//! same load on the machine for both), and the ratio of their medians printed.
use std::time::Instant;

use nicmon::act::state::Loaded;
use nicmon::decide::settings::Config;
use nicmon::decide::state::CheckState;
use nicmon::model::event::{Check, Stamp};
use nicmon::monitor::Monitor;
use nicmon::read::discovery::{self, ReadPlan};
use nicmon::read::host::Host;
use nicmon::read::topology;
use nicmon_tests::platforms;

fn main() {
    let polls: usize = std::env::var("NICMON_BENCH_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let Some((node, what, compare)) = bench_node() else { return };
    let monitor = monitor_of(&node);
    let files_before = monitor.observer.host.stats.files_read.load(std::sync::atomic::Ordering::Relaxed);
    let mut state = CheckState::default();
    let mut loaded = Loaded::Missing { reboot: false };
    let mut t = time::OffsetDateTime::now_utc();
    // Warm-up (first poll emits baselines); the first poll is cold: record what it reads.
    *monitor.observer.host.stats.recorded.lock().unwrap() = Some(Vec::new());
    let mut cold = Vec::new();
    for i in 0..20 {
        if i == 1 {
            cold = monitor.observer.host.stats.recorded.lock().unwrap().take().unwrap_or_default();
        }
        let p = monitor.poll(&state, &loaded, t, &[]);
        state = p.next;
        loaded = Loaded::Resumed;
        t += time::Duration::seconds(1);
    }
    let mut us = Vec::with_capacity(polls);
    let cpu_before = cpu_time();
    for _ in 0..polls {
        let start = Instant::now();
        let p = monitor.poll(&state, &loaded, t, &[]);
        us.push(start.elapsed().as_secs_f64() * 1e6);
        state = p.next;
        t += time::Duration::seconds(1);
    }
    let cpu_poll_us = (cpu_time() - cpu_before) * 1e6 / polls as f64;
    let files = (monitor.observer.host.stats.files_read.load(std::sync::atomic::Ordering::Relaxed) - files_before)
        as f64
        / (polls + 20) as f64;
    // The read alone (what the poll spends outside decide), in the same run.
    let mut read_us = Vec::with_capacity(polls);
    for _ in 0..polls.min(1000) {
        let start = Instant::now();
        let obs = monitor.observe(&state, false);
        read_us.push(start.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(obs);
    }
    read_us.sort_by(|a, b| a.total_cmp(b));
    // The floor, in the same run: open/read/close of each file the cold poll read, in one
    // thread, nothing parsed or decided.
    let mut floor_us = Vec::with_capacity(polls);
    let cpu_before = cpu_time();
    let mut buf = vec![0u8; 8192];
    for _ in 0..polls.min(1000) {
        let start = Instant::now();
        for path in &cold {
            if let Ok(mut f) = std::fs::File::open(path) {
                let _ = std::io::Read::read(&mut f, &mut buf);
            }
        }
        floor_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let cpu_floor_us = (cpu_time() - cpu_before) * 1e6 / floor_us.len() as f64;
    floor_us.sort_by(|a, b| a.total_cmp(b));
    let floor = floor_us[floor_us.len() / 2];
    us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "poll: DGX-H100-like node ({what}), {files:.0} files read per poll, {polls} polls: \
         median {:.3} ms, p99 {:.3} ms, max {:.3} ms   [bar: median <= 2 ms]",
        pct(0.5) / 1000.0,
        pct(0.99) / 1000.0,
        us[us.len() - 1] / 1000.0
    );
    let stat = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "read alone: median {:.3} ms ({} files kept open; batches read ahead of the listings: {} used, {} dropped)",
        read_us[read_us.len() / 2] / 1000.0,
        monitor.observer.host.kept_files(),
        stat(&monitor.observer.host.stats.read_ahead_used),
        stat(&monitor.observer.host.stats.read_ahead_dropped),
    );
    println!(
        "floor: open/read/close of the {} files a cold poll reads: median {:.3} ms; poll / floor = {:.2}x   [bar: <= 0.5x]",
        cold.len(),
        floor / 1000.0,
        pct(0.5) / floor
    );
    println!(
        "cpu (user+system, all threads) per poll: {:.3} ms; per floor pass: {:.3} ms; ratio {:.2}x \
         (less sensitive than wall time to other load on the machine)",
        cpu_poll_us / 1000.0,
        cpu_floor_us / 1000.0,
        cpu_poll_us / cpu_floor_us
    );
    if compare {
        against_the_same_node_without_them(&node, polls);
    }
}

/// A monitor of `node` (every check, the default config).
fn monitor_of(node: &nicmon_tests::Node) -> Monitor {
    let host = Host::new(node.sys(), node.proc());
    let snap0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snap0, Some(&node.metadata_path()), false).expect("topology");
    let config = Config::default();
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    Monitor::new(host, config, topo, stamp, Check::ALL.into_iter().collect(), Some("bench".into()))
}

/// A monitor polled one poll at a time, from a first poll with no state.
struct Polled {
    monitor: Monitor,
    state: CheckState,
    loaded: Loaded,
    t: time::OffsetDateTime,
}

impl Polled {
    fn new(node: &nicmon_tests::Node) -> Polled {
        let mut p = Polled {
            monitor: monitor_of(node),
            state: CheckState::default(),
            loaded: Loaded::Missing { reboot: false },
            t: time::OffsetDateTime::now_utc(),
        };
        for _ in 0..20 {
            p.poll();
        }
        p
    }

    /// One poll; its wall time in µs.
    fn poll(&mut self) -> f64 {
        let start = Instant::now();
        let p = self.monitor.poll(&self.state, &self.loaded, self.t, &[]);
        let us = start.elapsed().as_secs_f64() * 1e6;
        self.state = p.next;
        self.loaded = Loaded::Resumed;
        self.t += time::Duration::seconds(1);
        us
    }
}

/// `node` and the same node without its VFs and extra ports, polled alternately: the
/// medians and their ratio.
fn against_the_same_node_without_them(node: &nicmon_tests::Node, polls: usize) {
    let base = platforms::dgx_h100_with_vfs(0, None);
    let (mut with, mut without) = (Polled::new(node), Polled::new(&base));
    let (mut a, mut b) = (Vec::with_capacity(polls), Vec::with_capacity(polls));
    for _ in 0..polls {
        a.push(with.poll());
        b.push(without.poll());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        (v[v.len() / 2], v[(v.len() - 1) * 99 / 100])
    };
    let ((ma, pa), (mb, pb)) = (median(&mut a), median(&mut b));
    println!(
        "against the same node without them (no VF, one port), {polls} polls each, alternately: \
         median {:.3} ms (p99 {:.3}) vs {:.3} ms (p99 {:.3}): {:.2}x",
        ma / 1000.0,
        pa / 1000.0,
        mb / 1000.0,
        pb / 1000.0,
        ma / mb
    );
}

/// The node the environment asks for, what it is, and whether it has VFs or ports to
/// compare it without; `None` when it was only to be built.
fn bench_node() -> Option<(nicmon_tests::Node, String, bool)> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
    let vfs = env("NICMON_BENCH_VFS").unwrap_or(2);
    let ports = env("NICMON_BENCH_PORTS").unwrap_or(1);
    let tree = std::env::var_os("NICMON_BENCH_TREE").map(std::path::PathBuf::from);
    let node = platforms::dgx_h100_with_vfs(vfs, tree.as_deref());
    if ports > 1 {
        let first = node.pfs().into_iter().next().expect("a PF");
        platforms::copy_ports(&node, &first, ports).expect("copying ports");
    }
    let what = format!("12 PFs, {} VFs, {ports} port(s) on the first PF", 8 * vfs);
    let asked = ["NICMON_BENCH_VFS", "NICMON_BENCH_PORTS"].iter().any(|k| std::env::var_os(k).is_some());
    tree.is_none().then_some((node, what, asked && (vfs > 0 || ports > 1)))
}

/// CPU time used by this process so far (user + system, all threads), in seconds.
fn cpu_time() -> f64 {
    // SAFETY: getrusage writes only the struct passed.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}
