//! The floor under the daemon's CPU per poll (issue 47, item 1), in the poll-cost bench's
//! run: the files one steady poll of the node reads (as nicmon's library polls it), each
//! opened once and then read with one `pread` per pass — no parsing, no deciding, no thread
//! but this one — a pass every 50 ms like the daemon's polls, so each pass finds the caches
//! as cold as a poll does. Its CPU per pass (this thread's task clock over the passes, its
//! timer wake-ups included) is what the reads alone cost on this machine: the part of the
//! 0.5 ms bar no bookkeeping around them can give back.
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nicmon::act::state::Loaded;
use nicmon::decide::settings::Config;
use nicmon::decide::state::CheckState;
use nicmon::model::event::{Check, Stamp};
use nicmon::monitor::Monitor;
use nicmon::read::discovery::{self, ReadPlan};
use nicmon::read::host::Host;
use nicmon::read::topology;
use nicmon_tests::Node;

/// The reads alone: how many files, and the CPU per pass (ms).
pub struct Floor {
    pub files: usize,
    pub cpu_ms: f64,
}

/// The files a steady poll of `node` reads (the third poll's: after the first's walk and
/// baselines).
fn files_of_a_poll(node: &Node) -> Result<Vec<PathBuf>> {
    let host = Host::new(node.sys(), node.proc());
    let snap0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snap0, Some(&node.metadata_path()), false)
        .map_err(|e| anyhow::anyhow!("resolving the node's topology: {e}"))?;
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    let monitor = Monitor::new(host, Config::default(), topo, stamp, Check::ALL.into_iter().collect(), None);
    let (mut state, mut loaded) = (CheckState::default(), Loaded::Missing { reboot: false });
    let mut t = time::OffsetDateTime::now_utc();
    let stats = &monitor.observer.host.stats;
    for i in 0..3 {
        if i == 2 {
            *stats.recorded.lock().map_err(|_| anyhow::anyhow!("read stats poisoned"))? = Some(Vec::new());
        }
        state = monitor.poll(&state, &loaded, t, &[]).next;
        loaded = Loaded::Resumed;
        t += time::Duration::seconds(1);
    }
    let files = stats.recorded.lock().map_err(|_| anyhow::anyhow!("read stats poisoned"))?.take().unwrap_or_default();
    Ok(files)
}

/// This thread's task clock (ns).
fn thread_ns() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").context("reading /proc/thread-self/schedstat")?;
    s.split_whitespace().next().and_then(|v| v.parse().ok()).context("parsing /proc/thread-self/schedstat")
}

/// `passes` passes over the files a poll of `node` reads, `interval` apart.
pub fn measure(node: &Node, passes: usize, interval: Duration) -> Result<Floor> {
    let paths = files_of_a_poll(node)?;
    let files: Vec<std::fs::File> = paths.iter().filter_map(|p| std::fs::File::open(p).ok()).collect();
    if files.is_empty() || passes == 0 {
        bail!("no file to read on the node (of {} a poll reads)", paths.len());
    }
    let mut buf = vec![0u8; 8192];
    let start = thread_ns()?;
    for _ in 0..passes {
        std::thread::sleep(interval); // the daemon's cadence: each pass as cold as a poll
        for f in &files {
            std::hint::black_box(f.read_at(&mut buf, 0).ok());
        }
    }
    let ns = thread_ns()? - start;
    Ok(Floor { files: files.len(), cpu_ms: ns as f64 / 1e6 / passes as f64 })
}
