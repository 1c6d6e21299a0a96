//! NIC temperature from hwmon (SPEC §1.13): the `class/hwmon/hwmon*` devices whose `device`
//! link names a monitored PCI function, and their `temp<N>_{input,crit,highest,label}` files.
//!
//! **Topology, then readings.** Which hwmon device belongs to which PCI function, and which
//! channels it has, is found by walking `class/hwmon` — only when the set of monitored PCI
//! functions changes (discovery found a device come or go) or a known hwmon device vanished;
//! in between a poll reads just the channels' files, in one batch through [`Host`] (bounded
//! reads under the poll's deadlines).
//!
//! **Links.** The `device` link is not followed: its target's last name is the PCI address
//! (mlx5's hwmon hangs below its PCI function). `class/hwmon/hwmonN` itself is resolved
//! lexically inside the sysfs root ([`Host::link_target_sys`]): a host tree or bundle whose
//! link points outside it is skipped.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::model::ReadError;
use crate::model::Snapshot;
use crate::model::thermal::{SENSOR_FILES, Sensor, input_channel};
use crate::read::host::Host;

/// At most this many hwmon devices are looked at, and this many channels per device.
const MAX_HWMON: usize = 4096;
const MAX_CHANNELS: usize = 64;

/// A hwmon device of a monitored PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The PCI function's address (`0000:08:00.0`).
    pub pci: String,
    /// `hwmon3`.
    pub name: String,
    /// Its directory, relative to the sysfs root (the class link resolved).
    pub dir: String,
    pub channels: Vec<u32>,
}

/// Walk `class/hwmon` for the devices of the PCI functions `pcis`.
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
        out.push(Found { pci, name, dir, channels });
    }
    out
}

/// The sysfs-relative files of `found`'s channels, [`SENSOR_FILES`] per channel.
fn files(found: &[Found]) -> Vec<String> {
    let mut rels = Vec::new();
    for f in found {
        for c in &f.channels {
            rels.extend(SENSOR_FILES.iter().map(|s| format!("{}/temp{c}_{s}", f.dir)));
        }
    }
    rels
}

/// Reads the sensors of the monitored PCI functions, walking `class/hwmon` only when needed
/// (module doc).
#[derive(Debug, Default)]
pub struct HwmonReader {
    /// The PCI functions the last walk was for, and what it found.
    walked: Mutex<Option<(BTreeSet<String>, Vec<Found>)>>,
    /// Walks so far (for tests and the trace).
    pub walks: std::sync::atomic::AtomicU64,
}

impl HwmonReader {
    /// The sensors of the PCI functions `pcis` into `snapshot.thermal`.
    pub fn read(&self, host: &Host, snapshot: &mut Snapshot, pcis: BTreeSet<String>) {
        let mut walked = self.walked.lock().unwrap_or_else(|p| p.into_inner());
        if walked.as_ref().is_none_or(|(set, _)| *set != pcis) {
            *walked = Some((pcis.clone(), self.walk(host, &pcis)));
        }
        let mut sensors = self.read_found(host, walked.as_ref().map(|(_, f)| f.as_slice()).unwrap_or(&[]));
        if sensors.is_none() {
            // A known hwmon device is gone (driver reloaded): walk again, once.
            *walked = Some((pcis.clone(), self.walk(host, &pcis)));
            sensors = self.read_found(host, walked.as_ref().map(|(_, f)| f.as_slice()).unwrap_or(&[]));
        }
        snapshot.thermal = sensors.unwrap_or_default();
    }

    fn walk(&self, host: &Host, pcis: &BTreeSet<String>) -> Vec<Found> {
        self.walks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        walk(host, pcis)
    }

    /// The sensors of `found`, by PCI address; `None` when a channel's input is missing (the
    /// hwmon device went: the walk is stale).
    fn read_found(&self, host: &Host, found: &[Found]) -> Option<BTreeMap<String, Vec<Sensor>>> {
        let rels = files(found);
        if rels.is_empty() {
            return Some(BTreeMap::new());
        }
        let set = host.file_set(rels, false);
        let results = host.read_files(&set);
        let mut out: BTreeMap<String, Vec<Sensor>> = BTreeMap::new();
        let mut at = 0;
        for f in found {
            for &c in &f.channels {
                let texts: [Option<&str>; 4] =
                    std::array::from_fn(|i| results.get(at + i).and_then(|r| r.as_ref().ok()).map(String::as_str));
                if matches!(results.get(at), Some(Err(ReadError::Missing))) {
                    return None;
                }
                at += SENSOR_FILES.len();
                out.entry(f.pci.clone()).or_default().push(Sensor::from_texts(&f.name, c, texts));
            }
        }
        Some(out)
    }
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
        let r = HwmonReader::default();
        let mut snap = Snapshot::default();
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]));
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
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]));
        assert_eq!(snap.thermal["0000:08:00.0"][0].input, Some(103_000));
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Another function set: walked again; no hwmon there: nothing.
        r.read(&host, &mut snap, pcis(&["0000:09:00.0"]));
        assert!(snap.thermal.is_empty());
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 2);
        // The hwmon device goes: the stale walk is redone and finds nothing.
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]));
        std::fs::remove_dir_all(&hw).unwrap();
        r.read(&host, &mut snap, pcis(&["0000:08:00.0"]));
        assert!(snap.thermal.is_empty());
        assert_eq!(r.walks.load(std::sync::atomic::Ordering::Relaxed), 4);
    }

    #[test]
    fn junk_files_are_no_values() {
        let t = tree();
        let hw = t.path().join("sys/devices/pci0000:00/0000:00:01.0/0000:08:00.0/hwmon/hwmon2");
        std::fs::write(hw.join("temp1_input"), "hot\n").unwrap();
        std::fs::write(hw.join("temp1_crit"), vec![0xffu8; 5000]).unwrap();
        let host = Host::new(t.path().join("sys"), t.path().join("proc"));
        let mut snap = Snapshot::default();
        HwmonReader::default().read(&host, &mut snap, pcis(&["0000:08:00.0"]));
        let s = &snap.thermal["0000:08:00.0"][0];
        assert_eq!((s.input, s.crit), (None, None));
    }
}
