//! The ethtool data of a poll's RoCE ports: which netdevs are read, and how their data
//! becomes the port's `ethtool/` counters that the counter engine judges (SPEC §1.11).
//!
//! A port's counters get every picked driver statistic as `ethtool/<name>`, and three
//! port-level values that hold whichever source the driver gives:
//! - `ethtool/fec_corrected_bits`: FEC corrected bits, else `rx_corrected_bits_phy`
//!   (pre-FEC BER);
//! - `ethtool/fec_uncorrectable`: uncorrectable FEC blocks, else `rx_pcs_symbol_err_phy`;
//! - `ethtool/pause_duration`: the largest pause duration (µs) over the PFC priorities and
//!   link-level pause. The largest of monotonic counters is monotonic; RoCE runs on one
//!   lossless priority, whose increase it then is.
//!
//! **Pace.** A netdev is read at most once per `[phyCheck] readInterval` (mlx5 answers each
//! read with firmware commands); in between, its ports get the last reading again, with its
//! age ([`crate::model::Port::ethtool_age`]): the counter engine stamps the values with the
//! time they were read, so windows and deltas span reads, not polls. A one-shot
//! `nicmon check` reads once.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{EthtoolReader, EthtoolSource};
use crate::decide::counters::rule::ETHTOOL_PREFIX;
use crate::model::ethtool::{EthtoolRead, EthtoolSnapshot, corrected_bits, numbered, uncorrectable};
use crate::model::{LinkLayer, Snapshot};

/// The derived counters' names (after [`ETHTOOL_PREFIX`]).
pub const FEC_CORRECTED_BITS: &str = "fec_corrected_bits";
pub const FEC_UNCORRECTABLE: &str = "fec_uncorrectable";
pub const PAUSE_DURATION: &str = "pause_duration";

/// `sysfs`'s filesystem magic (`statfs(2)`).
const SYSFS_MAGIC: u64 = 0x6265_6572;

/// Where a monitor's ethtool data comes from: `--ethtool-replay DIR`; else the kernel when
/// `sysfs` is the live sysfs (a host tree is not: its netdev names are not this host's);
/// else none. `None` as well when `[phyCheck] enabled = false`.
pub fn source(enabled: bool, replay: Option<&Path>, sysfs: &Path) -> Option<EthtoolSource> {
    if !enabled {
        return None;
    }
    if let Some(dir) = replay {
        return Some(EthtoolSource::Replay(dir.to_path_buf()));
    }
    let live = rustix::fs::statfs(sysfs).is_ok_and(|s| s.f_type as u64 == SYSFS_MAGIC);
    live.then(|| EthtoolSource::Kernel(EthtoolReader::default()))
}

/// The counters a snapshot gives a port (module doc).
pub fn counters(s: &EthtoolSnapshot) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let mut put = |name: &str, v: u64| {
        out.insert(format!("{ETHTOOL_PREFIX}{name}"), v);
    };
    for (name, &v) in s.stats.iter().flatten() {
        put(name, v);
    }
    if let Some(v) = corrected_bits(s) {
        put(FEC_CORRECTED_BITS, v);
    }
    if let Some(v) = uncorrectable(s) {
        put(FEC_UNCORRECTABLE, v);
    }
    let paused = s.stats.iter().flatten().filter(|(n, _)| is_pause_duration(n)).map(|(_, &v)| v).max();
    if let Some(v) = paused {
        put(PAUSE_DURATION, v);
    }
    out
}

fn is_pause_duration(name: &str) -> bool {
    name == "rx_global_pause_duration" || numbered(name, "rx_prio", "_pause_duration").is_some()
}

/// Reads the ethtool data of a poll's RoCE ports at its pace, and says once per netdev
/// what is absent.
#[derive(Default)]
pub struct PortReader {
    /// Netdevs whose absent parts were said (`<netdev>: <part>`), so each is said once.
    said: Mutex<BTreeSet<String>>,
    /// The last reading of each netdev and when it was taken (module doc: pace).
    kept: Mutex<BTreeMap<String, (EthtoolSnapshot, Instant)>>,
    /// A netdev is read again once its last reading is this old (zero: every poll).
    interval: Duration,
}

impl std::fmt::Debug for PortReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortReader").finish_non_exhaustive()
    }
}

impl PortReader {
    /// A reader that reads a netdev at most once per `interval`.
    pub fn new(interval: Duration) -> PortReader {
        PortReader { interval, ..PortReader::default() }
    }

    /// Read the netdev of every device `wanted` keeps that has a RoCE (Ethernet) port, each
    /// within `timeout` (or take its last reading, younger than the interval at `now`), into
    /// its Ethernet ports' [`crate::model::Port::ethtool`], `ethtool_age` and counters.
    /// Returns the notes: what is not supported or failed, each said once.
    pub fn read(
        &self,
        source: &EthtoolSource,
        snapshot: &mut Snapshot,
        wanted: impl Fn(&str) -> bool,
        timeout: impl Fn() -> Duration,
        now: Instant,
    ) -> Vec<String> {
        let mut notes = Vec::new();
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|_, (_, at)| now.saturating_duration_since(*at) < self.interval);
        for d in snapshot.devices.iter_mut().filter(|d| !d.is_vf() && wanted(&d.name)) {
            let roce = |p: &crate::model::Port| p.link_layer == Some(LinkLayer::Ethernet);
            let Some(netdev) = d.netdev.clone().filter(|_| d.ports.iter().any(roce)) else {
                continue;
            };
            let (snap, age) = match kept.get(&netdev) {
                Some((snap, at)) => (snap.clone(), now.saturating_duration_since(*at)),
                None => {
                    let read = source.read(&netdev, timeout());
                    notes.extend(self.absent_notes(&netdev, &read));
                    let snap = read.snapshot();
                    // A read that failed altogether is tried again at the next poll.
                    if !failed(&read) {
                        kept.insert(netdev.clone(), (snap.clone(), now));
                    }
                    (snap, Duration::ZERO)
                }
            };
            if snap == EthtoolSnapshot::default() {
                continue; // nothing offered: unknown, said when read
            }
            let values = counters(&snap);
            for p in std::sync::Arc::make_mut(d).ports.iter_mut().filter(|p| roce(p)) {
                p.counters.extend(values.iter().map(|(k, v)| (k.as_str().into(), *v)));
                p.ethtool = Some(snap.clone());
                p.ethtool_age = Some(age);
            }
        }
        notes
    }

    /// One note per (netdev, part) the first time it is absent, the parts absent for the
    /// same reason in one note (`ethtool FEC, pause and statistics of veth0: not
    /// supported: ...`); a failure is said again after the part was read once more.
    fn absent_notes(&self, netdev: &str, read: &EthtoolRead) -> Vec<String> {
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let parts = [
            ("FEC", read.fec.as_ref().err()),
            ("pause", read.pause.as_ref().err()),
            ("statistics", read.stats.as_ref().err()),
        ];
        // Reason → the parts newly absent for it, in part order.
        let mut by_reason: Vec<(String, Vec<&str>)> = Vec::new();
        for (part, why) in parts {
            let key = format!("{netdev}: {part}");
            match why {
                Some(why) if !said.contains(&key) => {
                    said.insert(key);
                    let why = why.to_string();
                    match by_reason.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, ps)) => ps.push(part),
                        None => by_reason.push((why, vec![part])),
                    }
                }
                Some(_) => {}
                None => {
                    said.remove(&key);
                }
            }
        }
        by_reason
            .into_iter()
            .map(|(why, ps)| {
                let ps = match ps.as_slice() {
                    [one] => one.to_string(),
                    [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
                    [] => String::new(),
                };
                format!("ethtool {ps} of {netdev}: {why} (RoCE physical-layer checks see it as unknown)")
            })
            .collect()
    }
}

/// Whether every part of `read` failed (none read, none unsupported).
fn failed(read: &EthtoolRead) -> bool {
    let failed = |r: Option<&crate::model::ethtool::Absent>| r.is_some_and(|a| !a.is_unsupported());
    failed(read.fec.as_ref().err()) && failed(read.pause.as_ref().err()) && failed(read.stats.as_ref().err())
}

/// The replay directory of a bundle or host tree: `<root>/ethtool`.
pub fn replay_dir(root: &Path) -> PathBuf {
    root.join("ethtool")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ethtool::Absent;
    use crate::model::ethtool::FecSnapshot;

    fn snap(fec: Option<FecSnapshot>, stats: &[(&str, u64)]) -> EthtoolSnapshot {
        EthtoolSnapshot {
            fec,
            pause: None,
            stats: Some(stats.iter().map(|(n, v)| (n.to_string(), *v)).collect()),
            module: None,
        }
    }

    #[test]
    fn counters_derive_the_port_values() {
        let s = snap(
            Some(FecSnapshot { corrected_bits: Some(70), uncorrectable_blocks: Some(3), ..Default::default() }),
            &[("rx_prio3_pause_duration", 500), ("rx_global_pause_duration", 20), ("tx_pause_storm_error_events", 1)],
        );
        let c = counters(&s);
        assert_eq!(c["ethtool/fec_corrected_bits"], 70);
        assert_eq!(c["ethtool/fec_uncorrectable"], 3);
        assert_eq!(c["ethtool/pause_duration"], 500);
        assert_eq!(c["ethtool/tx_pause_storm_error_events"], 1);
        assert_eq!(c["ethtool/rx_prio3_pause_duration"], 500);
        // The driver's strings stand in for FEC statistics the kernel did not give.
        let c = counters(&snap(None, &[("rx_corrected_bits_phy", 9), ("rx_pcs_symbol_err_phy", 2)]));
        assert_eq!((c["ethtool/fec_corrected_bits"], c["ethtool/fec_uncorrectable"]), (9, 2));
        assert!(!c.contains_key("ethtool/pause_duration"));
        assert!(counters(&EthtoolSnapshot::default()).is_empty());
    }

    #[test]
    fn absent_parts_are_said_once() {
        let r = PortReader::default();
        let unsupported = EthtoolRead::absent(Absent::Unsupported("veth".into()));
        // Every part absent for one reason: one note.
        assert_eq!(
            r.absent_notes("eth0", &unsupported),
            [
                "ethtool FEC, pause and statistics of eth0: not supported: veth (RoCE physical-layer checks see it as unknown)"
            ]
        );
        assert!(r.absent_notes("eth0", &unsupported).is_empty());
        assert_eq!(r.absent_notes("eth1", &unsupported).len(), 1);
        // Two reasons: a note each.
        let mixed = EthtoolRead { pause: Err(Absent::Failed("deadline".into())), ..unsupported.clone() };
        let notes = r.absent_notes("eth2", &mixed);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].starts_with("ethtool FEC and statistics of eth2: not supported"), "{notes:?}");
        assert!(notes[1].starts_with("ethtool pause of eth2: deadline"), "{notes:?}");
        // Read again, then failed: said again.
        let ok = EthtoolRead { fec: Ok(FecSnapshot::default()), ..unsupported.clone() };
        assert!(r.absent_notes("eth0", &ok).is_empty());
        let failed = EthtoolRead { fec: Err(Absent::Failed("deadline".into())), ..unsupported };
        let notes = r.absent_notes("eth0", &failed);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("deadline"), "{notes:?}");
    }

    /// A probe that counts its reads and answers the count as the corrected bits.
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicU64>);

    impl crate::read::ethtool::reader::Probe for Counting {
        fn read(&mut self, _netdev: &str) -> EthtoolRead {
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let fec = FecSnapshot { corrected_bits: Some(n), ..Default::default() };
            EthtoolRead { fec: Ok(fec), ..EthtoolRead::absent(Absent::Unsupported("no pause".into())) }
        }
    }

    #[test]
    fn a_netdev_is_read_at_most_once_per_interval() {
        use nicmon_tests::platforms::Platform;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let node = Platform::L40sOci.build();
        let host = crate::read::host::Host::new(node.sys(), node.proc());
        let discovered = crate::read::discovery::discover(&host, &crate::read::discovery::ReadPlan::default());
        let reads = Arc::new(AtomicU64::new(0));
        let counted = reads.clone();
        let probe =
            Arc::new(move || Box::new(Counting(counted.clone())) as Box<dyn crate::read::ethtool::reader::Probe>);
        let source = EthtoolSource::Kernel(crate::read::ethtool::EthtoolReader::with_probe(probe));
        let r = PortReader::new(Duration::from_secs(10));
        let t0 = Instant::now();
        // The six RoCE netdevs, read once each; their ports get the reading, age zero.
        let poll = |at: Duration| {
            let mut snap = discovered.clone();
            r.read(&source, &mut snap, |_| true, || Duration::from_secs(5), t0 + at);
            let p = &snap.devices.iter().find(|d| d.name == "mlx5_0").unwrap().ports[0];
            (p.counters.get("ethtool/fec_corrected_bits").copied(), p.ethtool_age)
        };
        let (bits, age) = poll(Duration::ZERO);
        assert_eq!((reads.load(Ordering::SeqCst), age), (6, Some(Duration::ZERO)));
        assert!(bits.is_some());
        // 5 s and 9.9 s on: the last reading again, with its age; nothing asked.
        for secs in [5.0, 9.9] {
            let (again, age) = poll(Duration::from_secs_f64(secs));
            assert_eq!((reads.load(Ordering::SeqCst), again), (6, bits), "{secs}");
            assert_eq!(age, Some(Duration::from_secs_f64(secs)));
        }
        // 10 s on: read again.
        let (later, age) = poll(Duration::from_secs(10));
        assert_eq!((reads.load(Ordering::SeqCst), age), (12, Some(Duration::ZERO)));
        assert_ne!(later, bits);
        // No pace: every call reads.
        let every = PortReader::new(Duration::ZERO);
        let mut snap = discovered.clone();
        every.read(&source, &mut snap, |_| true, || Duration::from_secs(5), t0);
        every.read(&source, &mut snap, |_| true, || Duration::from_secs(5), t0);
        assert_eq!(reads.load(Ordering::SeqCst), 24);
    }

    #[test]
    fn a_read_that_failed_is_tried_again_at_the_next_poll() {
        use nicmon_tests::platforms::Platform;
        let node = Platform::L40sOci.build();
        let host = crate::read::host::Host::new(node.sys(), node.proc());
        let discovered = crate::read::discovery::discover(&host, &crate::read::discovery::ReadPlan::default());
        let dir = tempfile::tempdir().unwrap();
        let source = EthtoolSource::Replay(dir.path().to_path_buf());
        let r = PortReader::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let poll = |at: u64| {
            let mut snap = discovered.clone();
            r.read(&source, &mut snap, |_| true, || Duration::from_secs(5), t0 + Duration::from_secs(at));
            let has = |dev: &str| snap.devices.iter().find(|d| d.name == dev).unwrap().ports[0].ethtool.is_some();
            (has("mlx5_0"), has("mlx5_1"))
        };
        // rdma0's file is broken (a failed read), rdma1 has none (not supported).
        std::fs::write(dir.path().join("rdma0.json"), "not json").unwrap();
        assert_eq!(poll(0), (false, false));
        // A second later both have data: rdma0 is read again, rdma1 waits for the pace.
        let good = r#"{"fec": {"active": "RS", "corrected_bits": 5}}"#;
        std::fs::write(dir.path().join("rdma0.json"), good).unwrap();
        std::fs::write(dir.path().join("rdma1.json"), good).unwrap();
        assert_eq!(poll(1), (true, false));
        assert_eq!(poll(10), (true, true));
    }

    #[test]
    fn a_host_tree_is_not_read_from_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        assert!(source(true, None, dir.path()).is_none());
        assert!(matches!(source(true, Some(dir.path()), dir.path()), Some(EthtoolSource::Replay(_))));
        assert!(source(false, Some(dir.path()), dir.path()).is_none());
        if Path::new("/sys/class").exists() {
            assert!(matches!(source(true, None, Path::new("/sys")), Some(EthtoolSource::Kernel(_))));
        }
    }
}
