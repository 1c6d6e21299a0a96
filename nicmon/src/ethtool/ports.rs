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
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::phy::{corrected_bits, uncorrectable};
use super::{EthtoolRead, EthtoolReader, EthtoolSnapshot, EthtoolSource, numbered};
use crate::counters::rule::ETHTOOL_PREFIX;
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

/// Reads the ethtool data of a poll's RoCE ports, and says once per netdev what is absent.
#[derive(Default)]
pub struct PortReader {
    /// Netdevs whose absent parts were said (`<netdev>: <part>`), so each is said once.
    said: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for PortReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortReader").finish_non_exhaustive()
    }
}

impl PortReader {
    /// Read the netdev of every device `wanted` keeps that has a RoCE (Ethernet) port, each
    /// within `timeout`, into its Ethernet ports' [`crate::model::Port::ethtool`] and
    /// counters. Returns the notes: what is not supported or failed, each said once.
    pub fn read(
        &self,
        source: &EthtoolSource,
        snapshot: &mut Snapshot,
        wanted: impl Fn(&str) -> bool,
        timeout: impl Fn() -> Duration,
    ) -> Vec<String> {
        let mut notes = Vec::new();
        for d in snapshot.devices.iter_mut().filter(|d| !d.is_vf() && wanted(&d.name)) {
            let roce = |p: &crate::model::Port| p.link_layer == Some(LinkLayer::Ethernet);
            let Some(netdev) = d.netdev.clone().filter(|_| d.ports.iter().any(roce)) else {
                continue;
            };
            let read = source.read(&netdev, timeout());
            notes.extend(self.absent_notes(&netdev, &read));
            let snap = read.snapshot();
            if snap == EthtoolSnapshot::default() {
                continue; // nothing offered: unknown, said above
            }
            let values = counters(&snap);
            for p in std::sync::Arc::make_mut(d).ports.iter_mut().filter(|p| roce(p)) {
                p.counters.extend(values.iter().map(|(k, v)| (k.as_str().into(), *v)));
                p.ethtool = Some(snap.clone());
            }
        }
        notes
    }

    /// One note per (netdev, part) the first time it is absent; a failure is said again
    /// after the part was read once more.
    fn absent_notes(&self, netdev: &str, read: &EthtoolRead) -> Vec<String> {
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let parts = [
            ("FEC", read.fec.as_ref().err()),
            ("pause", read.pause.as_ref().err()),
            ("statistics", read.stats.as_ref().err()),
        ];
        let mut notes = Vec::new();
        for (part, why) in parts {
            let key = format!("{netdev}: {part}");
            match why {
                Some(why) if said.insert(key.clone()) => notes
                    .push(format!("ethtool {part} of {netdev}: {why} (RoCE physical-layer checks see it as unknown)")),
                Some(_) => {}
                None => {
                    said.remove(&key);
                }
            }
        }
        notes
    }
}

/// The replay directory of a bundle or host tree: `<root>/ethtool`.
pub fn replay_dir(root: &Path) -> PathBuf {
    root.join("ethtool")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethtool::{Absent, FecSnapshot};

    fn snap(fec: Option<FecSnapshot>, stats: &[(&str, u64)]) -> EthtoolSnapshot {
        EthtoolSnapshot { fec, pause: None, stats: Some(stats.iter().map(|(n, v)| (n.to_string(), *v)).collect()) }
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
        assert_eq!(r.absent_notes("eth0", &unsupported).len(), 3);
        assert!(r.absent_notes("eth0", &unsupported).is_empty());
        assert_eq!(r.absent_notes("eth1", &unsupported).len(), 3);
        // Read again, then failed: said again.
        let ok = EthtoolRead { fec: Ok(FecSnapshot::default()), ..unsupported.clone() };
        assert!(r.absent_notes("eth0", &ok).is_empty());
        let failed = EthtoolRead { fec: Err(Absent::Failed("deadline".into())), ..unsupported };
        let notes = r.absent_notes("eth0", &failed);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("deadline"), "{notes:?}");
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
