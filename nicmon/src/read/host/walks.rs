//! Path walks on demand (issue 47, "poll cost"): what a poll finds by walking paths — the
//! device listing, each device's `device` link and netdev listing, the character-device
//! entries — is walked again only when something says the topology may have moved, or
//! every [`WALK_PERIOD`]. The signs, summed into one number ([`Walks::moved`]):
//! - a hint: a wake-up naming a device, an interface or a PCI function (a uevent, an
//!   rtnetlink or eBPF record; [`super::Host::topology_hint`]);
//! - a kept-open file that failed its read (`ENODEV`: sysfs says its device went) or was
//!   found removed ([`super::kept`]);
//! - off sysfs (a fixture tree, which sysfs's rules do not bind): an `inotify` event on a
//!   directory the last walk went through (an entry created, removed or renamed there, or
//!   the directory itself removed or moved). A directory that cannot be watched (no
//!   inotify, the watch limit reached) makes every poll walk, as before.
//!
//! A listing the signs answer for ([`Walks::stands`]) is not read again between walks: a
//! directory off sysfs watched since the last event, or on sysfs while the kernel announces
//! what comes and goes there (the uevent listener runs: [`Walks::kernel_announces`]).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How long a walk's result stands without a sign that the topology moved.
pub const WALK_PERIOD: Duration = Duration::from_secs(30);

/// The hints and the watch on the directories walked.
#[derive(Default)]
pub(super) struct Walks {
    /// Bumped by each hint and each event of the watch.
    epoch: AtomicU64,
    watch: Mutex<DirWatch>,
    /// The kernel's uevents are heard (an `add`, `remove` or `move` is a hint): on sysfs, a
    /// listing the last walk read stands until one comes.
    kernel: AtomicBool,
}

impl std::fmt::Debug for Walks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Walks").field("epoch", &self.epoch).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct DirWatch {
    /// Made with the first directory off sysfs; `Err`: none could be had.
    inotify: Option<Result<inotify::Inotify, ()>>,
    /// The directories seen since the last event: watched (`true`), or on sysfs or procfs
    /// (`false`: nothing to watch).
    seen: BTreeMap<PathBuf, bool>,
    /// A directory off sysfs could not be watched: every poll walks.
    blind: bool,
}

/// `statfs`'s magic number of sysfs.
const SYSFS_MAGIC: i64 = 0x6265_6572;
/// `statfs`'s magic number of procfs.
const PROC_MAGIC: i64 = 0x9fa0;

/// Whether `path` is on sysfs or procfs, whose files the kernel makes (no `inotify` event
/// for them).
fn on_kernel_fs(path: &Path) -> bool {
    // `f_type`'s width differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(path).is_ok_and(|st| matches!(st.f_type as i64, SYSFS_MAGIC | PROC_MAGIC))
}

impl Walks {
    pub(super) fn hint(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// Watch directory `path` (off sysfs) for entries coming, going or renamed, and for its
    /// own removal; nothing for a directory already seen since the last event, or absent
    /// (its parent, watched, says when it comes).
    /// `writes`: also for files in it written (a fixture's file rewritten in place).
    pub(super) fn watch_dir(&self, path: &Path, writes: bool) {
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if w.blind || w.seen.contains_key(path) {
            return;
        }
        if on_kernel_fs(path) {
            w.seen.insert(path.to_path_buf(), false);
            return;
        }
        let inotify = w.inotify.get_or_insert_with(|| inotify::Inotify::init().map_err(|_| ()));
        let Ok(inotify) = inotify else {
            w.blind = true;
            return;
        };
        use inotify::WatchMask as M;
        let mut mask = M::CREATE | M::DELETE | M::MOVED_FROM | M::MOVED_TO | M::DELETE_SELF | M::MOVE_SELF | M::ONLYDIR;
        if writes {
            mask |= M::CLOSE_WRITE;
        }
        match inotify.watches().add(path, mask) {
            Ok(_) => {
                w.seen.insert(path.to_path_buf(), true);
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {}
            Err(_) => w.blind = true,
        }
    }

    /// Whether the kernel's word on what comes and goes is heard ([`Walks::stands`]).
    pub(super) fn kernel_announces(&self, heard: bool) {
        self.kernel.store(heard, Ordering::Relaxed);
    }

    /// Whether the signs answer for directory `path`'s listing as the last walk read it:
    /// it was seen since the last event and is watched, or it is on sysfs or procfs and
    /// the kernel's uevents are heard. Call after [`Walks::moved`] (which drains the
    /// watch's events): an entry that came or went since is then its sign.
    pub(super) fn stands(&self, path: &Path) -> bool {
        let w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        !w.blind && w.seen.get(path).is_some_and(|watched| *watched || self.kernel.load(Ordering::Relaxed))
    }

    /// The sum of the signs so far (drains the watch: one `read` when it exists); `None`
    /// while a directory off sysfs could not be watched (every poll walks).
    pub(super) fn moved(&self, kept_failures: u64) -> Option<u64> {
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        if w.blind {
            return None;
        }
        let mut events = 0u64;
        if let Some(Ok(inotify)) = &mut w.inotify {
            let mut buf = [0u8; 4096];
            loop {
                match inotify.read_events(&mut buf) {
                    Ok(evs) => {
                        let n = evs.count() as u64;
                        if n == 0 {
                            break;
                        }
                        events += n;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        w.blind = true;
                        return None;
                    }
                }
            }
        }
        if events > 0 {
            // The next walk watches what it goes through again (a directory removed lost
            // its watch; one made anew at the same path has none yet).
            w.seen.clear();
            self.epoch.fetch_add(events, Ordering::Relaxed);
        }
        Some(self.epoch.load(Ordering::Relaxed).wrapping_add(kept_failures))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_coming_or_going_in_a_watched_directory_moves_the_sum() {
        let dir = tempfile::tempdir().unwrap();
        let w = Walks::default();
        w.watch_dir(dir.path(), false);
        let s0 = w.moved(0).unwrap();
        assert_eq!(w.moved(0), Some(s0), "nothing happened");
        std::fs::write(dir.path().join("x"), "1").unwrap();
        let s1 = w.moved(0).unwrap();
        assert_ne!(s1, s0, "an entry created");
        // In-place writes (as sysfs values change) are no sign.
        std::fs::write(dir.path().join("x"), "2").unwrap();
        assert_eq!(w.moved(0), Some(s1));
        // The event cleared what was seen: the directory is watched again by the next walk.
        w.watch_dir(dir.path(), false);
        std::fs::rename(dir.path().join("x"), dir.path().join("y")).unwrap();
        let s2 = w.moved(0).unwrap();
        assert_ne!(s2, s1, "an entry renamed");
        w.hint();
        assert_ne!(w.moved(0), Some(s2), "a hint");
        let s3 = w.moved(0).unwrap();
        assert_ne!(w.moved(1), Some(s3), "a kept file's failure");
    }

    #[test]
    fn a_directory_watched_for_writes_moves_the_sum_when_a_file_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("route"), "a").unwrap();
        let w = Walks::default();
        w.watch_dir(dir.path(), true);
        let s0 = w.moved(0).unwrap();
        assert_eq!(w.moved(0), Some(s0), "nothing happened");
        std::fs::write(dir.path().join("route"), "b").unwrap();
        assert_ne!(w.moved(0), Some(s0), "the file rewritten in place");
    }

    #[test]
    fn a_listing_stands_while_watched_and_no_event_came_or_on_a_kernel_fs_while_uevents_are_heard() {
        let dir = tempfile::tempdir().unwrap();
        let w = Walks::default();
        assert!(!w.stands(dir.path()), "not walked yet");
        w.watch_dir(dir.path(), false);
        w.moved(0);
        assert!(w.stands(dir.path()), "watched, nothing happened");
        std::fs::write(dir.path().join("x"), "1").unwrap();
        w.moved(0);
        assert!(!w.stands(dir.path()), "an entry came: listed again until the next walk watches it");
        w.watch_dir(dir.path(), false);
        assert!(w.stands(dir.path()));
        // procfs sends no events: its listing stands only while the kernel's uevents are heard.
        let proc = Path::new("/proc/self");
        w.watch_dir(proc, false);
        assert!(!w.stands(proc));
        w.kernel_announces(true);
        assert!(w.stands(proc));
        w.kernel_announces(false);
        assert!(!w.stands(proc));
    }

    #[test]
    fn an_absent_directory_is_not_watched_and_blinds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let w = Walks::default();
        w.watch_dir(&dir.path().join("absent"), false);
        assert!(w.moved(0).is_some());
    }
}
