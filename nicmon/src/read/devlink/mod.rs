//! Firmware health from devlink (SPEC §1.13): each monitored PCI function's health
//! reporters, from the kernel ([`netlink`]: one dump per read, on a worker thread under the
//! poll's read deadline — devlink takes the instance lock, which a recovery in progress
//! holds) or from `--devlink-replay DIR` ([`replay`]: `DIR/<BDF>.json`). A function with no
//! reporters is absent from [`crate::model::Snapshot::devlink`]; what is not supported or
//! failed is said once.
pub mod netlink;
pub mod replay;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::Snapshot;
use crate::model::devlink::Reporters;
use crate::model::ethtool::Absent;

/// `sysfs`'s filesystem magic (`statfs(2)`).
const SYSFS_MAGIC: u64 = 0x6265_6572;

/// The worker socket's own receive bound (the caller's deadline is shorter).
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);

/// What answers a dump: the kernel, or a stand-in in tests.
pub type Dump = Arc<dyn Fn() -> Result<BTreeMap<String, Reporters>, Absent> + Send + Sync>;

/// Where devlink data comes from.
pub enum DevlinkSource {
    /// The kernel (or a stand-in): one dump per read, under a deadline.
    Kernel { dump: Dump, busy: Arc<Mutex<bool>> },
    /// `--devlink-replay DIR`.
    Replay(PathBuf),
}

impl std::fmt::Debug for DevlinkSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevlinkSource::Kernel { .. } => f.write_str("DevlinkSource::Kernel"),
            DevlinkSource::Replay(d) => write!(f, "DevlinkSource::Replay({})", d.display()),
        }
    }
}

/// The source of a monitor: `--devlink-replay DIR`; else the kernel when `sysfs` is the live
/// sysfs (a host tree's PCI addresses are not this host's); else none. `None` as well when
/// `[firmwareCheck] enabled = false`.
pub fn source(enabled: bool, replay: Option<&Path>, sysfs: &Path) -> Option<DevlinkSource> {
    if !enabled {
        return None;
    }
    if let Some(dir) = replay {
        return Some(DevlinkSource::Replay(dir.to_path_buf()));
    }
    let live = rustix::fs::statfs(sysfs).is_ok_and(|s| s.f_type as u64 == SYSFS_MAGIC);
    live.then(|| DevlinkSource::kernel(Arc::new(|| netlink::dump(SOCKET_TIMEOUT))))
}

impl DevlinkSource {
    pub fn kernel(dump: Dump) -> DevlinkSource {
        DevlinkSource::Kernel { dump, busy: Arc::default() }
    }

    /// The reporters of the PCI functions `pcis`, within `timeout`: by address (a function
    /// without any is absent), or why none could be had. Per function in replay: the second
    /// part lists the files that could not be used.
    pub fn read(&self, pcis: &BTreeSet<String>, timeout: Duration) -> (BTreeMap<String, Reporters>, Vec<Absent>) {
        match self {
            DevlinkSource::Replay(dir) => {
                let mut out = BTreeMap::new();
                let mut bad = Vec::new();
                for a in pcis {
                    match replay::read(dir, a) {
                        Ok(Some(r)) => {
                            out.insert(a.clone(), r);
                        }
                        Ok(None) => {}
                        Err(e) => bad.push(Absent::Failed(e)),
                    }
                }
                (out, bad)
            }
            DevlinkSource::Kernel { dump, busy } => match kernel_read(dump, busy, timeout) {
                Ok(mut all) => {
                    all.retain(|a, _| pcis.contains(a));
                    (all, Vec::new())
                }
                Err(why) => (BTreeMap::new(), vec![why]),
            },
        }
    }
}

/// One dump on a worker thread, waited for at most `timeout`; one at a time (a dump stuck in
/// the kernel is not asked again until it returns).
fn kernel_read(dump: &Dump, busy: &Arc<Mutex<bool>>, timeout: Duration) -> Result<BTreeMap<String, Reporters>, Absent> {
    if timeout.is_zero() {
        return Err(Absent::Failed("the poll's read deadline had passed: not read".into()));
    }
    {
        let mut b = busy.lock().unwrap_or_else(|p| p.into_inner());
        if *b {
            return Err(Absent::Failed("an earlier devlink read has not returned".into()));
        }
        *b = true;
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let (dump, flag) = (dump.clone(), busy.clone());
    let spawned = std::thread::Builder::new().name("nicmon-devlink".into()).spawn(move || {
        let r = dump();
        *flag.lock().unwrap_or_else(|p| p.into_inner()) = false;
        let _ = tx.send(r);
    });
    if spawned.is_err() {
        *busy.lock().unwrap_or_else(|p| p.into_inner()) = false;
        return Err(Absent::Failed("could not start a devlink reader thread".into()));
    }
    rx.recv_timeout(timeout)
        .unwrap_or_else(|_| Err(Absent::Failed(format!("no answer within {} ms: abandoned", timeout.as_millis()))))
}

/// Reads the monitored functions' reporters into a snapshot, saying once what is absent.
#[derive(Debug, Default)]
pub struct DevlinkReader {
    said: Mutex<BTreeSet<String>>,
}

impl DevlinkReader {
    /// The reporters of `pcis` into `snapshot.devlink`; the notes (each said once; a failure
    /// again after a read that worked).
    pub fn read(
        &self,
        source: &DevlinkSource,
        snapshot: &mut Snapshot,
        pcis: &BTreeSet<String>,
        timeout: Duration,
    ) -> Vec<String> {
        let (found, absent) = source.read(pcis, timeout);
        let mut said = self.said.lock().unwrap_or_else(|p| p.into_inner());
        let mut notes = Vec::new();
        let answered = absent.is_empty();
        if answered {
            said.retain(|k| k.starts_with("none:"));
        }
        for why in absent {
            let key = format!("{}:{why}", if why.is_unsupported() { "none" } else { "failed" });
            if said.insert(key) {
                notes.push(format!("devlink health: {why} (firmware health checks see it as unknown)"));
            }
        }
        if answered
            && matches!(source, DevlinkSource::Kernel { .. })
            && found.is_empty()
            && !pcis.is_empty()
            && said.insert("none:empty".into())
        {
            notes.push("devlink health: not supported: no devlink health reporter on the monitored NICs".into());
        }
        // A function not read this time keeps its verdicts in the decider's state.
        snapshot.devlink = found;
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::devlink::{Reporter, ReporterState};

    fn reporters(errors: u64) -> Reporters {
        Reporters {
            reporters: vec![Reporter {
                name: "fw_fatal".into(),
                state: ReporterState::Healthy,
                error_count: errors,
                recover_count: 0,
            }],
        }
    }

    fn pcis(a: &[&str]) -> BTreeSet<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kernel_reads_keep_the_monitored_functions_and_say_unsupported_once() {
        let src = DevlinkSource::kernel(Arc::new(|| {
            Ok([("0000:3b:00.0".to_string(), reporters(2)), ("0000:99:00.0".to_string(), reporters(0))].into())
        }));
        let r = DevlinkReader::default();
        let mut snap = Snapshot::default();
        let notes = r.read(&src, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5));
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(snap.devlink.keys().collect::<Vec<_>>(), ["0000:3b:00.0"]);
        let none = DevlinkSource::kernel(Arc::new(|| {
            Err(Absent::Unsupported("the kernel has no devlink netlink family".into()))
        }));
        let notes = r.read(&none, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("not supported"), "{notes:?}");
        assert!(r.read(&none, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5)).is_empty());
        assert!(snap.devlink.is_empty());
    }

    #[test]
    fn a_stuck_dump_is_abandoned() {
        let (release, wait) = mpsc::channel::<()>();
        let wait = Arc::new(Mutex::new(wait));
        let src = DevlinkSource::kernel(Arc::new(move || {
            let _ = wait.lock().unwrap().recv();
            Ok(BTreeMap::new())
        }));
        let (_, absent) = src.read(&pcis(&["0000:3b:00.0"]), Duration::from_millis(30));
        assert!(matches!(&absent[..], [Absent::Failed(w)] if w.contains("abandoned")), "{absent:?}");
        let (_, absent) = src.read(&pcis(&["0000:3b:00.0"]), Duration::from_millis(30));
        assert!(matches!(&absent[..], [Absent::Failed(w)] if w.contains("not returned")), "{absent:?}");
        release.send(()).unwrap();
    }

    #[test]
    fn replay_reads_per_function() {
        let dir = tempfile::tempdir().unwrap();
        replay::write(dir.path(), "0000:3b:00.0", &reporters(1)).unwrap();
        std::fs::write(dir.path().join("0000:3b:00.1.json"), "junk").unwrap();
        let src = DevlinkSource::Replay(dir.path().to_path_buf());
        let r = DevlinkReader::default();
        let mut snap = Snapshot::default();
        let notes =
            r.read(&src, &mut snap, &pcis(&["0000:3b:00.0", "0000:3b:00.1", "0000:3b:00.2"]), Duration::from_secs(5));
        assert_eq!(snap.devlink.len(), 1);
        assert_eq!(snap.devlink["0000:3b:00.0"].get("fw_fatal").unwrap().error_count, 1);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("0000:3b:00.1.json"), "{notes:?}");
    }
}
