//! One full poll (read the host tree + evaluate every check) on the DGX-H100-like testbed
//! node: median and p99 wall time, and in the same run the floor: open/read/close of every
//! file a cold poll reads (the files a naive poller reads each time), and the ratio.
//! Run with `cargo bench -p nicmon --bench poll`.
use std::time::Instant;

use nicmon::config::Config;
use nicmon::cycle::Monitor;
use nicmon::discovery::{self, ReadPlan};
use nicmon::event::{Check, Stamp};
use nicmon::host::Host;
use nicmon::state::{CheckState, Loaded};
use nicmon::topology;
use nicmon_tests::platforms::Platform;

fn main() {
    let polls: usize = std::env::var("NICMON_BENCH_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let node = Platform::DgxH100.build();
    let host = Host::new(node.sys(), node.proc());
    let snap0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snap0, Some(&node.metadata_path()), false).expect("topology");
    let config = Config::default();
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    let monitor = Monitor::new(host, config, topo, stamp, Check::ALL.into_iter().collect(), Some("bench".into()));
    let files_before = monitor.host.stats.files_read.load(std::sync::atomic::Ordering::Relaxed);
    let mut state = CheckState::default();
    let mut loaded = Loaded::Missing { reboot: false };
    let mut t = time::OffsetDateTime::now_utc();
    // Warm-up (first poll emits baselines); the first poll is cold: record what it reads.
    *monitor.host.stats.recorded.lock().unwrap() = Some(Vec::new());
    let mut cold = Vec::new();
    for i in 0..20 {
        if i == 1 {
            cold = monitor.host.stats.recorded.lock().unwrap().take().unwrap_or_default();
        }
        let p = monitor.poll(&state, &loaded, t, &[]);
        state = p.next;
        loaded = Loaded::Resumed;
        t += time::Duration::seconds(1);
    }
    let mut us = Vec::with_capacity(polls);
    for _ in 0..polls {
        let start = Instant::now();
        let p = monitor.poll(&state, &loaded, t, &[]);
        us.push(start.elapsed().as_secs_f64() * 1e6);
        state = p.next;
        t += time::Duration::seconds(1);
    }
    let files = (monitor.host.stats.files_read.load(std::sync::atomic::Ordering::Relaxed) - files_before) as f64
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
    floor_us.sort_by(|a, b| a.total_cmp(b));
    let floor = floor_us[floor_us.len() / 2];
    us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| us[((us.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "poll: DGX-H100-like node (12 PFs, 16 VFs), {files:.0} files read per poll, {polls} polls: \
         median {:.3} ms, p99 {:.3} ms, max {:.3} ms   [bar: median <= 2 ms]",
        pct(0.5) / 1000.0,
        pct(0.99) / 1000.0,
        us[us.len() - 1] / 1000.0
    );
    println!(
        "read alone: median {:.3} ms ({} files kept open)",
        read_us[read_us.len() / 2] / 1000.0,
        monitor.host.kept_files()
    );
    println!(
        "floor: open/read/close of the {} files a cold poll reads: median {:.3} ms; poll / floor = {:.2}x   [bar: <= 0.5x]",
        cold.len(),
        floor / 1000.0,
        pct(0.5) / floor
    );
}
