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

/// What answers a dump: the kernel, or a stand-in in tests. By devlink instance
/// (`pci/<BDF>`, `auxiliary/mlx5_core.eth.0`).
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
    /// part lists the files that could not be used. `pci_of`: the PCI function of a devlink
    /// instance (`pci/<BDF>` is its own; an auxiliary device's is its parent, [`pci_of`]).
    pub fn read(
        &self,
        pcis: &BTreeSet<String>,
        timeout: Duration,
        pci_of: &dyn Fn(&str) -> Option<String>,
    ) -> (BTreeMap<String, Reporters>, Vec<Absent>) {
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
                Ok(all) => {
                    let mut out: BTreeMap<String, Reporters> = BTreeMap::new();
                    for (instance, r) in all {
                        if let Some(a) = pci_of(&instance).filter(|a| pcis.contains(a)) {
                            out.entry(a).or_default().reporters.extend(r.reporters);
                        }
                    }
                    (out.into_iter().map(|(a, r)| (a, r.normalised())).collect(), Vec::new())
                }
                Err(why) => (BTreeMap::new(), vec![why]),
            },
        }
    }
}

/// The PCI function of devlink instance `instance` (`bus/name`): a `pci` instance's name; for
/// another bus (mlx5's `auxiliary/mlx5_core.eth.0`), the PCI function its device hangs below
/// in sysfs (`bus/<bus>/devices/<name>`, resolved lexically inside the root).
pub fn pci_of(host: &crate::read::host::Host, instance: &str) -> Option<String> {
    let (bus, name) = instance.split_once('/')?;
    if bus == "pci" {
        return Some(name.to_string());
    }
    let ok = |s: &str| !s.is_empty() && !s.contains("..") && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    if !ok(bus) || !ok(name) {
        return None;
    }
    let parts = host.link_target_sys(&format!("bus/{bus}/devices/{name}"))?;
    parts.iter().rev().skip(1).find(|p| is_pci_address(p)).cloned()
}

/// `dddd:bb:dd.f`.
fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
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
    /// The kernel said it has no devlink (no family): not asked again before this.
    quiet_until: Mutex<Option<std::time::Instant>>,
    /// [`DevlinkReader::read_paced`]: the functions are read at most this often...
    interval: Duration,
    /// ...and between reads they get the last reading: when, of which functions, what.
    kept: Mutex<Option<Kept>>,
}

type Kept = (std::time::Instant, BTreeSet<String>, BTreeMap<String, Reporters>);

/// How long a kernel without devlink is left alone before it is asked again (a poll's dump
/// costs a socket, a family lookup and a thread).
pub const UNSUPPORTED_RETRY: Duration = Duration::from_secs(60);

impl DevlinkReader {
    /// A reader whose [`DevlinkReader::read_paced`] reads at most once per `interval`.
    pub fn new(interval: Duration) -> DevlinkReader {
        DevlinkReader { interval, ..DevlinkReader::default() }
    }

    /// [`DevlinkReader::read`] at most once per interval for the same functions (the last
    /// reading between).
    pub fn read_paced(
        &self,
        source: &DevlinkSource,
        snapshot: &mut Snapshot,
        pcis: &BTreeSet<String>,
        timeout: Duration,
        pci_of: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let now = std::time::Instant::now();
        {
            let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, set, map)) = kept.as_ref()
                && set == pcis
                && now.saturating_duration_since(*at) < self.interval
            {
                snapshot.devlink = map.clone();
                return Vec::new();
            }
        }
        let notes = self.read(source, snapshot, pcis, timeout, pci_of);
        *self.kept.lock().unwrap_or_else(|p| p.into_inner()) = Some((now, pcis.clone(), snapshot.devlink.clone()));
        notes
    }

    /// The freshest reading (the last paced one, with the wake-ups' since) into `snapshot`:
    /// a targeted poll's base snapshot may be older than a wake-up's reading.
    pub fn kept_into(&self, snapshot: &mut Snapshot) {
        if let Some((_, _, map)) = self.kept.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            snapshot.devlink = map.clone();
        }
    }

    /// A wake-up's fresh reading of `pcis` (`fresh`): the kept reading takes it, so the paced
    /// reads between do not hand out older counts.
    pub fn keep_fresh(&self, pcis: &BTreeSet<String>, fresh: &BTreeMap<String, Reporters>) {
        if let Some((_, _, map)) = self.kept.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            map.retain(|a, _| !pcis.contains(a));
            map.extend(fresh.iter().map(|(a, r)| (a.clone(), r.clone())));
        }
    }

    /// The reporters of `pcis` into `snapshot.devlink`; the notes (each said once; a failure
    /// again after a read that worked).
    pub fn read(
        &self,
        source: &DevlinkSource,
        snapshot: &mut Snapshot,
        pcis: &BTreeSet<String>,
        timeout: Duration,
        pci_of: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let now = std::time::Instant::now();
        let mut quiet = self.quiet_until.lock().unwrap_or_else(|p| p.into_inner());
        if quiet.is_some_and(|t| now < t) {
            snapshot.devlink.clear();
            return Vec::new();
        }
        let (found, absent) = source.read(pcis, timeout, pci_of);
        let no_family = matches!(source, DevlinkSource::Kernel { .. }) && absent.iter().any(|a| a.is_unsupported());
        *quiet = no_family.then(|| now + UNSUPPORTED_RETRY);
        drop(quiet);
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

    fn tx(errors: u64) -> Reporters {
        Reporters {
            reporters: vec![Reporter {
                name: "tx".into(),
                state: ReporterState::Healthy,
                error_count: errors,
                recover_count: 0,
            }],
        }
    }

    /// `pci/<BDF>`, and `auxiliary/mlx5_core.eth.0` below 0000:3b:00.0.
    fn aux(instance: &str) -> Option<String> {
        match instance.split_once('/')? {
            ("pci", a) => Some(a.to_string()),
            ("auxiliary", "mlx5_core.eth.0") => Some("0000:3b:00.0".into()),
            _ => None,
        }
    }

    #[test]
    fn an_auxiliary_instance_resolves_to_its_pci_function_in_sysfs() {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path().join("sys");
        let dev = sys.join("devices/pci0000:00/0000:00:01.0/0000:3b:00.0/mlx5_core.eth.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(sys.join("bus/auxiliary/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0/0000:3b:00.0/mlx5_core.eth.0",
            sys.join("bus/auxiliary/devices/mlx5_core.eth.0"),
        )
        .unwrap();
        let host = crate::read::host::Host::new(&sys, t.path().join("proc"));
        assert_eq!(pci_of(&host, "pci/0000:3b:00.1").as_deref(), Some("0000:3b:00.1"));
        assert_eq!(pci_of(&host, "auxiliary/mlx5_core.eth.0").as_deref(), Some("0000:3b:00.0"));
        assert_eq!(pci_of(&host, "auxiliary/mlx5_core.eth.9"), None);
        assert_eq!(pci_of(&host, "auxiliary/../x"), None);
        assert_eq!(pci_of(&host, "netdevsim"), None);
    }

    #[test]
    fn kernel_reads_keep_the_monitored_functions_and_say_unsupported_once() {
        let src = DevlinkSource::kernel(Arc::new(|| {
            Ok([
                ("pci/0000:3b:00.0".to_string(), reporters(2)),
                ("pci/0000:99:00.0".to_string(), reporters(0)),
                ("auxiliary/mlx5_core.eth.0".to_string(), tx(4)),
                ("auxiliary/unknown.0".to_string(), tx(9)),
            ]
            .into())
        }));
        let r = DevlinkReader::default();
        let mut snap = Snapshot::default();
        let notes = r.read(&src, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5), &aux);
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(snap.devlink.keys().collect::<Vec<_>>(), ["0000:3b:00.0"]);
        // The PF's own reporters and its Ethernet auxiliary device's, merged.
        let names: Vec<&str> = snap.devlink["0000:3b:00.0"].reporters.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["fw_fatal", "tx"]);
        let none = DevlinkSource::kernel(Arc::new(|| {
            Err(Absent::Unsupported("the kernel has no devlink netlink family".into()))
        }));
        let notes = r.read(&none, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5), &aux);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("not supported"), "{notes:?}");
        assert!(r.read(&none, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5), &aux).is_empty());
        assert!(snap.devlink.is_empty());
        // Not asked again for a while: even a source that would answer is not read.
        let answers = DevlinkSource::kernel(Arc::new(|| Ok([("pci/0000:3b:00.0".to_string(), reporters(1))].into())));
        r.read(&answers, &mut snap, &pcis(&["0000:3b:00.0"]), Duration::from_secs(5), &aux);
        assert!(snap.devlink.is_empty(), "within UNSUPPORTED_RETRY");
    }

    #[test]
    fn a_stuck_dump_is_abandoned() {
        let (release, wait) = mpsc::channel::<()>();
        let wait = Arc::new(Mutex::new(wait));
        let src = DevlinkSource::kernel(Arc::new(move || {
            let _ = wait.lock().unwrap().recv();
            Ok(BTreeMap::new())
        }));
        let (_, absent) = src.read(&pcis(&["0000:3b:00.0"]), Duration::from_millis(30), &aux);
        assert!(matches!(&absent[..], [Absent::Failed(w)] if w.contains("abandoned")), "{absent:?}");
        let (_, absent) = src.read(&pcis(&["0000:3b:00.0"]), Duration::from_millis(30), &aux);
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
        let notes = r.read(
            &src,
            &mut snap,
            &pcis(&["0000:3b:00.0", "0000:3b:00.1", "0000:3b:00.2"]),
            Duration::from_secs(5),
            &aux,
        );
        assert_eq!(snap.devlink.len(), 1);
        assert_eq!(snap.devlink["0000:3b:00.0"].get("fw_fatal").unwrap().error_count, 1);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("0000:3b:00.1.json"), "{notes:?}");
    }
}
