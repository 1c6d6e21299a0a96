//! What the sources of SPEC §1.13 (the ports' transceivers, the NICs' hwmon sensors and
//! devlink health reporters) add to a full poll, on the DGX-H100-like testbed node (its four
//! RoCE PFs' modules and every PF's reporters as replay files, every PF's hwmon): the same
//! node polled alternately by a monitor with the three sources and one without them
//! (`[opticsCheck]`, `[thermalCheck]`, `[firmwareCheck]` off), median and p99 of each and
//! the ratio. Two rounds: the default read intervals (modules 60 s, sensors 10 s, reporters
//! 5 s: the steady daemon's cost) and every source read on every poll (the worst case: a
//! poll right after a state change reads every module).
//! Run with `cargo bench -p nicmon --bench sources` (`NICMON_BENCH_POLLS`, default 2000).
use std::time::{Duration, Instant};

use nicmon::act::state::Loaded;
use nicmon::decide::settings::Config;
use nicmon::decide::state::CheckState;
use nicmon::model::event::{Check, Stamp};
use nicmon::monitor::Monitor;
use nicmon::read::devlink::DevlinkSource;
use nicmon::read::discovery::{self, ReadPlan};
use nicmon::read::ethtool::EthtoolSource;
use nicmon::read::host::Host;
use nicmon::read::topology;
use nicmon_tests::platforms;

/// A monitor of `node` with the three sources (read at most every `every`; `None`: the
/// defaults) or without them.
fn monitor_of(node: &nicmon_tests::Node, with: bool, every: Option<Duration>) -> Monitor {
    let host = Host::new(node.sys(), node.proc());
    let snap0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snap0, Some(&node.metadata_path()), false).expect("topology");
    let mut config = Config::default();
    config.optics.enabled = with;
    config.thermal.enabled = with;
    config.firmware.enabled = with;
    if let Some(every) = every {
        config.optics.read_interval = every;
        config.thermal.read_interval = every;
        config.firmware.read_interval = every;
    }
    let stamp = Stamp { node_name: "bench".into(), processing_strategy: Default::default() };
    let mut m = Monitor::new(host, config, topo, stamp, Check::ALL.into_iter().collect(), Some("bench".into()));
    if with {
        m.observer.modules = Some(EthtoolSource::Replay(node.ethtool_dir()));
        m.observer.devlink = Some(DevlinkSource::Replay(node.devlink_dir()));
    }
    m
}

/// A monitor polled one poll at a time, from a first poll with no state.
struct Polled {
    monitor: Monitor,
    state: CheckState,
    loaded: Loaded,
    t: time::OffsetDateTime,
}

impl Polled {
    fn new(monitor: Monitor) -> Polled {
        let mut p =
            Polled { monitor, state: CheckState::default(), loaded: Loaded::Missing { reboot: false }, t: time::OffsetDateTime::now_utc() };
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

/// Median and p99 of `v`.
fn spread(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|x, y| x.total_cmp(y));
    (v[v.len() / 2], v[(v.len() - 1) * 99 / 100])
}

fn main() {
    let polls: usize = std::env::var("NICMON_BENCH_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let node = platforms::dgx_h100_with_vfs(0, None);
    for (round, every) in [("default read intervals", None), ("every source read on every poll", Some(Duration::ZERO))] {
        let mut with = Polled::new(monitor_of(&node, true, every));
        let mut without = Polled::new(monitor_of(&node, false, every));
        let modules = with.state.links.port_states.len();
        let (mut a, mut b) = (Vec::with_capacity(polls), Vec::with_capacity(polls));
        for _ in 0..polls {
            a.push(with.poll());
            b.push(without.poll());
        }
        let ((ma, pa), (mb, pb)) = (spread(&mut a), spread(&mut b));
        println!(
            "sources ({round}), DGX-H100-like node (12 PFs, {modules} ports), {polls} polls each, alternately: \
             with modules, sensors and reporters median {:.3} ms (p99 {:.3}), without {:.3} ms (p99 {:.3}): \
             +{:.1} %   [bar: <= +10 %]",
            ma / 1000.0,
            pa / 1000.0,
            mb / 1000.0,
            pb / 1000.0,
            (ma / mb - 1.0) * 100.0
        );
    }
}
