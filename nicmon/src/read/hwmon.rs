//! NIC temperature from hwmon (SPEC §1.13): the `class/hwmon/hwmon*` devices whose `device`
//! link names a monitored PCI function, and their `temp<N>_{input,crit,highest,label}` files.
//!
//! **Topology, then readings.** Which hwmon device belongs to which PCI function, and which
//! channels it has, is found by walking `class/hwmon` — only when the set of monitored PCI
//! functions changes (discovery found a device come or go) or a known hwmon device vanished;
//! the walk also reads the channels' labels and critical temperatures (they do not change).
//! In between, a poll reads the channels' `input` and `highest`, in one batch through
//! [`Host`] (bounded reads under the poll's deadlines), at most once per `[thermalCheck]
//! readInterval` (the last reading stands in between).
//!
//! **Links.** The `device` link is not followed: its target's last name is the PCI address
//! (mlx5's hwmon hangs below its PCI function). `class/hwmon/hwmonN` itself is resolved
//! lexically inside the sysfs root ([`Host::link_target_sys`]): a host tree or bundle whose
//! link points outside it is skipped.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::model::ReadError;
use crate::model::Snapshot;
use crate::model::thermal::{Sensor, input_channel};
use crate::read::host::Host;

/// At most this many hwmon devices are looked at, and this many channels per device.
const MAX_HWMON: usize = 4096;
const MAX_CHANNELS: usize = 64;

/// A hwmon device of a monitored PCI function, with what does not change while it stays:
/// its channels, their labels and critical temperatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The PCI function's address (`0000:08:00.0`).
    pub pci: String,
    /// `hwmon3`.
    pub name: String,
    /// Its directory, relative to the sysfs root (the class link resolved).
    pub dir: String,
    /// Each channel's sensor as the walk read it (label, crit; no reading yet).
    pub sensors: Vec<Sensor>,
}

/// The files read at the walk (static) and at each reading, per channel.
const STATIC_FILES: [&str; 2] = ["label", "crit"];
const READING_FILES: [&str; 2] = ["input", "highest"];

/// Walk `class/hwmon` for the devices of the PCI functions `pcis`, reading their channels'
/// labels and critical temperatures.
pub fn walk(host: &Host, pcis: &BTreeSet<String>) -> Vec<Found> {
    let mut out = Vec::new();
    for name in host.list_sys("class/hwmon").into_iter().filter(|n| n.starts_with("hwmon")).take(MAX_HWMON) {
        let class = format!("class/hwmon/{name}");
        let Some(pci) = host.link_name_sys(&format!("{class}/device")) else { continue };
        if !pcis.contains(&pci) {
            continue;
        }
        // A link (sysfs: to devices/…/hwmon/hwmonN) is resolved inside the root.
        let dir = match host.link_name_sys(&class) {
            Some(_) => match host.link_target_sys(&class) {
                Some(parts) if !parts.is_empty() => parts.join("/"),
                _ => continue,
            },
            None => class,
        };
        let mut channels: Vec<u32> = host.list_sys(&dir).iter().filter_map(|f| input_channel(f)).collect();
        channels.sort_unstable();
        channels.dedup();
        channels.truncate(MAX_CHANNELS);
        let results = host.read_files(&host.file_set(files(&dir, &channels, &STATIC_FILES), false));
        let text = |i: usize| results.get(i).and_then(Result::ok);
        let sensors = channels
            .iter()
            .enumerate()
            .map(|(i, &c)| Sensor::from_texts(&name, c, [None, text(2 * i + 1), None, text(2 * i)]))
            .collect();
        out.push(Found { pci, name: name.clone(), dir, sensors });
    }
    out
}

/// `<dir>/temp<N>_<file>` for each channel, then each file.
fn files(dir: &str, channels: &[u32], names: &[&str]) -> Vec<String> {
    channels.iter().flat_map(|c| names.iter().map(move |f| format!("{dir}/temp{c}_{f}"))).collect()
}

/// The last walk: for which PCI functions, what it found, and the last reading (when).
#[derive(Debug)]
struct Walked {
    pcis: BTreeSet<String>,
    found: Vec<Found>,
    reading: Option<(Instant, std::sync::Arc<crate::model::Thermal>)>,
}

/// Reads the sensors of the monitored PCI functions: walks `class/hwmon` only when needed,
/// reads the temperatures at most once per interval (module doc).
#[derive(Debug, Default)]
pub struct HwmonReader {
    walked: Mutex<Option<Walked>>,
    interval: Duration,
    /// Walks so far (for tests and the trace).
    pub walks: std::sync::atomic::AtomicU64,
}

impl HwmonReader {
    /// A reader that reads the temperatures at most once per `interval`.
    pub fn new(interval: Duration) -> HwmonReader {
        HwmonReader { interval, ..HwmonReader::default() }
    }

    /// The sensors of the PCI functions `pcis` into `snapshot.thermal` (the last reading
    /// when it is younger than the interval at `now`).
    pub fn read(&self, host: &Host, snapshot: &mut Snapshot, pcis: BTreeSet<String>, now: Instant) {
        let mut guard = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = |w: &Walked| w.pcis == pcis;
        let walked = match guard.take().filter(fresh) {
            Some(w) => w,
            None => self.walk(host, pcis.clone()),
        };
        let mut walked = walked;
        let young = walked.reading.as_ref().filter(|(at, _)| now.saturating_duration_since(*at) < self.interval);
        if let Some((_, r)) = young {
            snapshot.thermal = std::sync::Arc::clone(r);
            *guard = Some(walked);
            return;
        }
        let reading = std::sync::Arc::new(match read_found(host, &walked.found) {
            Some(r) => r,
            None => {
                // A known hwmon device is gone (driver reloaded): walk again, once.
                walked = self.walk(host, pcis);
                read_found(host, &walked.found).unwrap_or_default()
            }
        });
        snapshot.thermal = std::sync::Arc::clone(&reading);
        walked.reading = Some((now, reading));
        *guard = Some(walked);
    }

    fn walk(&self, host: &Host, pcis: BTreeSet<String>) -> Walked {
        self.walks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Walked { found: walk(host, &pcis), pcis, reading: None }
    }
}

/// The sensors of `found` read now, by PCI address; `None` when a channel's input is
/// missing (the hwmon device went: the walk is stale).
fn read_found(host: &Host, found: &[Found]) -> Option<BTreeMap<String, Vec<Sensor>>> {
    let mut rels = Vec::new();
    for f in found {
        let channels: Vec<u32> = f.sensors.iter().map(|s| s.channel).collect();
        rels.extend(files(&f.dir, &channels, &READING_FILES));
    }
    let mut out: BTreeMap<String, Vec<Sensor>> = BTreeMap::new();
    if rels.is_empty() {
        return Some(out);
    }
    let results = host.read_files(&host.file_set(rels, false));
    let mut at = 0;
    for f in found {
        for s in &f.sensors {
            if matches!(results.get(at), Some(Err(ReadError::Missing))) {
                return None;
            }
            let text = |i: usize| results.get(at + i).and_then(Result::ok);
            let now = Sensor::from_texts(&f.name, s.channel, [text(0), None, text(1), None]);
            at += READING_FILES.len();
            out.entry(f.pci.clone()).or_default().push(Sensor { input: now.input, highest: now.highest, ..s.clone() });
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A tree with one mlx5 hwmon below `0000:08:00.0` and one of another device.
    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let sys = t.path().join("sys");
        let dev = sys.join("devices/pci0000:00/0000:00:01.0/0000:08:00.0");
        let hw = dev.join("hwmon/hwmon2");
        std::fs::create_dir_all(&hw).unwrap();
        symlink("../../../0000:08:00.0", hw.join("device")).unwrap();
        for (f, v) in [
            ("temp1_input", "61000\n"),
            ("temp1_crit", "105000\n"),
            ("temp1_highest", "70000\n"),
            ("temp1_label", "asic\n"),
            ("temp2_input", "40000\n"),
            ("temp2_label", "module0\n"),
            ("name", "mlx5\n"),
        ] {
            std::fs::write(hw.join(f), v).unwrap();
        }
        let other = sys.join("devices/platform/coretemp.0/hwmon/hwmon0");
        std::fs::create_dir_all(&other).unwrap();
        symlink("../../../coretemp.0", other.join("device")).unwrap();
        std::fs::write(other.join("temp1_input"), "50000").unwrap();
        std::fs::create_dir_all(sys.join("class/hwmon")).unwrap();
        symlink("../../devices/pci0000:00/0000:00:01.0/0000:08:00.0/hwmon/hwmon2", sys.join("class/hwmon/hwmon2"))
            .unwrap();
        symlink("../../devices/platform/coretemp.0/hwmon/hwmon0", sys.join("class/hwmon/hwmon0")).unwrap();
        // A link out of the root is not followed.
        symlink("/sys/class/hwmon/hwmon0", sys.join("class/hwmon/hwmon9")).unwrap();
        t
    }

    fn pcis(a: &[&str]) -> BTreeSet<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reads_the_sensors_of_monitored_functions_and_walks_once() {
        let t = tree();
        let host = Host::new(t.path().join("sys"), t.path().join("proc"));
        let r = HwmonReader::new(Duration::ZERO);
        let mut snap = Snapshot::default();
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]), Instant::now());
        let s = &snap.thermal["0000:08:00.0"];
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].label.as_deref(), s[0].input, s[0].crit, s[0].highest),
            (Some("asic"), Some(61_000), Some(105_000), Some(70_000))
        );
        assert_eq!((s[1].label.as_deref(), s[1].input, s[1].crit), (Some("module0"), Some(40_000), None));
        assert_eq!(s[0].hwmon, "hwmon2");
        assert_eq!(snap.thermal.len(), 1, "coretemp is no NIC's");
        // Readings change, the walk stands.
        let hw = t.path().join("sys/devices/pci0000:00/0000:00:01.0/0000:08:00.0/hwmon/hwmon2");
        std::fs::write(hw.join("temp1_input"), "103000\n").unwrap();
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]), Instant::now());
        assert_eq!(snap.thermal["0000:08:00.0"][0].input, Some(103_000));
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Another function set: walked again; no hwmon there: nothing.
        r.read(&host, &mut snap, pcis(&["0000:09:00.0"]), Instant::now());
        assert!(snap.thermal.is_empty());
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 2);
        // The hwmon device goes: the stale walk is redone and finds nothing.
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]), Instant::now());
        std::fs::remove_dir_all(&hw).unwrap();
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]), Instant::now());
        assert!(snap.thermal.is_empty());
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 4);
    }

    #[test]
    fn temperatures_are_read_at_most_once_per_interval() {
        let t = tree();
        let host = Host::new(t.path().join("sys"), t.path().join("proc"));
        let r = HwmonReader::new(Duration::from_secs(10));
        let hw = t.path().join("sys/devices/pci0000:00/0000:00:01.0/0000:08:00.0/hwmon/hwmon2");
        let t0 = Instant::now();
        let input = |at: u64| {
            let mut snap = Snapshot::default();
            r.read(&host, &mut snap, pcis(&["0000:08:00.0"]), t0 + Duration::from_secs(at));
            snap.thermal["0000:08:00.0"][0].input
        };
        assert_eq!(input(0), Some(61_000));
        std::fs::write(hw.join("temp1_input"), "90000\n").unwrap();
        assert_eq!(input(9), Some(61_000), "the last reading stands");
        assert_eq!(input(10), Some(90_000));
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    #[test]
    fn junk_files_are_no_values() {
        let t = tree();
        let hw = t.path().join("sys/devices/pci0000:00/0000:00:01.0/0000:08:00.0/hwmon/hwmon2");
        std::fs::write(hw.join("temp1_input"), "hot\n").unwrap();
        std::fs::write(hw.join("temp1_crit"), vec![0xffu8; 5000]).unwrap();
        let host = Host::new(t.path().join("sys"), t.path().join("proc"));
        let mut snap = Snapshot::default();
        HwmonReader::new(Duration::ZERO).read(&host, &mut snap, pcis(&["0000:08:00.0"]), Instant::now());
        let s = &snap.thermal["0000:08:00.0"][0];
        assert_eq!((s.input, s.crit), (None, None));
    }
}
