//! Kept-open files: the attributes read every poll stay open between polls and are read
//! with `pread` at offset 0 (the module notes of [`super`] say when a kept file is opened by
//! its path again, and how a fixture tree is watched for what sysfs cannot do).
use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::file::{Past, open_read};
use super::{ReadError, classify};

/// How long a kept-open file is trusted before it is opened by its path again (a bound on
/// what a kept descriptor could miss: a file replaced under a name that still links it).
pub const KEPT_REFRESH: Duration = Duration::from_secs(60);

/// Files kept open between polls, by path (see [`Host::file_set`]).
#[derive(Default)]
pub(super) struct Kept {
    /// By the path's bytes (hashing a `PathBuf` walks its components), with a fast
    /// non-cryptographic hash (the keys are nicmon's own paths). A read takes its file as a
    /// second reference: it stays kept while it is read (one lookup, nothing put back).
    pub(super) files: std::collections::HashMap<KeptKey, Arc<KeptFile>, foldhash::fast::RandomState>,
    /// Bumped by every [`Reader::forget_kept`]: a file opened anew for a read under an older
    /// generation is closed after it, not kept (it may belong to a device forgotten
    /// meanwhile).
    pub(super) generation: u64,
    /// Bumped by every change to `files`: a reader thread's handles to the files it read
    /// last ([`super::reader::KeptHandles`]) stand while it does not move.
    pub(super) version: u64,
    /// The watch on kept files that are not on sysfs; made with the first such file.
    /// `Err`: inotify could not be set up (each such file is checked after its reads).
    pub(super) watch: Option<Result<Watch, ()>>,
}

/// An `inotify` watch on kept files that are not on sysfs: which kept paths each watch
/// descriptor stands for (one inode may be kept by several paths).
pub(super) struct Watch {
    inotify: inotify::Inotify,
    paths: std::collections::HashMap<inotify::WatchDescriptor, Vec<KeptKey>>,
}

/// A kept file's root-relative path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct KeptKey(pub(super) Arc<str>);

impl std::borrow::Borrow<str> for KeptKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<OsStr> for KeptKey {
    fn as_ref(&self) -> &OsStr {
        OsStr::new(&*self.0)
    }
}

impl Kept {
    /// Keep a file just opened (replacing the one kept under its path), if the budget
    /// allows (else it is closed).
    pub(super) fn put(&mut self, key: KeptKey, file: KeptFile, generation: u64) {
        if self.generation != generation {
            return;
        }
        if self.files.len() < kept_budget() || self.files.contains_key(&key) {
            self.files.insert(key, Arc::new(file));
            self.changed();
        }
    }

    /// Note a change to `files` ([`Kept::version`]).
    pub(super) fn changed(&mut self) {
        self.version = self.version.wrapping_add(1);
    }

    /// Close the file kept under `key` if it is still `file` (a failed read's: a newer one
    /// opened meanwhile stays).
    fn drop_failed(&mut self, key: &str, file: &Arc<KeptFile>) {
        if self.files.get(key).is_some_and(|k| Arc::ptr_eq(k, file)) {
            self.files.remove(key);
            self.changed();
        }
    }

    /// Close the kept files the watch says were removed, replaced, moved or changed their
    /// attributes since the last look (all of them when events were lost). One `read`.
    pub(super) fn drop_changed(&mut self) {
        let mut buf = [0u8; 4096];
        loop {
            let Some(Ok(watch)) = &mut self.watch else { return };
            let (wds, lost) = match watch.inotify.read_events(&mut buf) {
                Ok(events) => {
                    let mut lost = false;
                    let mut wds = Vec::new();
                    for e in events {
                        if e.mask.contains(inotify::EventMask::Q_OVERFLOW) {
                            lost = true;
                        } else {
                            wds.push(e.wd);
                        }
                    }
                    (wds, lost)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // The watch is broken: trust no watched file, and check each file kept
                    // from now on after its reads.
                    tracing::warn!(error = %e, "inotify watch on kept files failed: checking each file after its reads");
                    self.files.retain(|_, k| k.guard != Guard::Watched);
                    self.changed();
                    self.watch = Some(Err(()));
                    return;
                }
            };
            if lost {
                // Events were lost: every watched file is opened by its path again.
                watch.paths.clear();
                self.files.retain(|_, k| k.guard != Guard::Watched);
                self.changed();
                return;
            }
            if wds.is_empty() {
                return;
            }
            for wd in wds {
                for path in watch.paths.remove(&wd).unwrap_or_default() {
                    self.files.remove(&path);
                }
            }
            self.changed();
        }
    }

    /// [`Kept::watch`] while the budget has room for one more kept file; `false` (no
    /// watch) past it.
    fn watch_if_room(&mut self, path: &Path, key: &str, file: &std::fs::File) -> bool {
        self.files.len() < kept_budget() && self.watch(path, key, file)
    }

    /// Watch `path`, just opened as `file`, for being removed or replaced: `true` when the
    /// watch holds (the file needs no check after its reads).
    pub(super) fn watch(&mut self, path: &Path, key: &str, file: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        let watch = self.watch.get_or_insert_with(|| {
            inotify::Inotify::init().map(|inotify| Watch { inotify, paths: Default::default() }).map_err(|_| ())
        });
        let Ok(watch) = watch else { return false };
        let mask = inotify::WatchMask::ATTRIB | inotify::WatchMask::DELETE_SELF | inotify::WatchMask::MOVE_SELF;
        let Ok(wd) = watch.inotify.watches().add(path, mask) else { return false };
        // The watch is on what `path` names now: the file opened, unless it was replaced
        // between the open and the watch (then the file is not kept: read by its path next time).
        let same = match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()) && a.nlink() > 0,
            _ => false,
        };
        if same {
            // One path per inode as a rule: room for one (a default push makes room for four).
            let paths = watch.paths.entry(wd).or_insert_with(|| Vec::with_capacity(1));
            if !paths.iter().any(|p| *p.0 == *key) {
                paths.push(KeptKey(Arc::from(key)));
            }
        }
        same
    }
}

pub(super) struct KeptFile {
    file: std::fs::File,
    opened: Instant,
    pub(super) guard: Guard,
}

#[cfg(test)]
impl KeptFile {
    /// A kept file of `file`, opened now, on sysfs by its guard.
    pub(super) fn of(file: std::fs::File) -> KeptFile {
        KeptFile { file, opened: Instant::now(), guard: Guard::Sysfs }
    }
}

/// What tells a kept file was removed or replaced since it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guard {
    /// On sysfs: a `pread` of an attribute whose node was removed answers `ENODEV`.
    Sysfs,
    /// Off sysfs (a fixture tree, a replayed bundle), watched ([`Kept::watch`]).
    Watched,
    /// Off sysfs, no watch: checked after each read for a name left.
    Links,
}

/// `statfs`'s magic number of sysfs.
const SYSFS_MAGIC: i64 = 0x6265_6572;

/// Whether `file` is on sysfs.
fn on_sysfs(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatfs writes only the struct passed; the descriptor is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    rc == 0 && magic == SYSFS_MAGIC
}

/// How many names `file` has (0: removed, or replaced by a rename).
fn links(file: &std::fs::File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: fstat writes only the struct passed; the descriptor is open.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstat(file.as_raw_fd(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    (rc == 0).then_some(st.st_nlink as u64)
}

/// How many files one reader keeps open at most: a quarter of the open-file limit (raised
/// once per process to its hard limit, at most 65536), and never more than 8192.
fn kept_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit write/read only the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                return 0;
            }
            let want = lim.rlim_max.min(65536);
            if want > lim.rlim_cur {
                let raised = libc::rlimit { rlim_cur: want, rlim_max: lim.rlim_max };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    lim.rlim_cur = want;
                }
            }
        }
        usize::try_from(lim.rlim_cur / 4).unwrap_or(usize::MAX).min(8192)
    })
}

/// The file [`read_kept`] reads: its root-relative path (the key it is kept under), its
/// path, and how much of it is read.
pub(super) trait KeptPath {
    /// The root-relative path, written into `buf`.
    fn rel_in<'b>(&self, buf: &'b mut String) -> &'b str;
    fn path(&self) -> std::path::PathBuf;
    /// At most how many bytes are read, and what past them means.
    fn bounds(&self) -> (usize, Past);
}

/// What a read got: the first bytes of the reader's scratch page (an attribute: no
/// allocation per read), or a buffer of its own (a file opened anew, one past the page).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Got {
    Scratch(usize),
    Owned(Vec<u8>),
}

impl Got {
    /// The bytes read, `scratch` being the page the read was given.
    pub(super) fn bytes<'a>(&'a self, scratch: &'a [u8]) -> &'a [u8] {
        match self {
            Got::Scratch(n) => scratch.get(..*n).unwrap_or_default(),
            Got::Owned(v) => v,
        }
    }
}

/// A reader's handle to a kept file: the path it is kept under, and the file.
pub(super) type Handle = (KeptKey, Arc<KeptFile>);

/// A file opened anew by a read, to keep after it, and the [`Kept::generation`] it was read
/// under.
pub(super) type PutBack = (KeptFile, u64);

/// Read a file that is kept open: `pread` at offset 0 of the kept descriptor (sysfs
/// regenerates an attribute's value on a read at offset 0). Off sysfs, a file the watch
/// could not cover is then checked for a name (a file removed or replaced since it was
/// opened has none left: read by its path again, as a fresh open would); a watched one
/// was dropped before the batch if it changed ([`Kept::drop_changed`]). A failed `pread` (`ENODEV` once the attribute's device
/// is gone), or a descriptor older than [`KEPT_REFRESH`], is closed and the path opened
/// again; a file that opens and reads is kept for the next read.
///
/// `item`: the file (its root-relative path, written into `rel` where the map is asked,
/// is its key). `slot`: the reader's handle to the file kept for `item` when it has one
/// (then the map is not asked); left holding the handle of the kept file that answered,
/// empty otherwise.
pub(super) fn read_kept(
    (kept, failures): (&Mutex<Kept>, &std::sync::atomic::AtomicU64),
    (item, rel): (&impl KeptPath, &mut String),
    slot: &mut Option<Handle>,
    (scratch, now): (&mut [u8], Instant),
) -> (Result<Got, ReadError>, Option<PutBack>) {
    let lock = || kept.lock().unwrap_or_else(|p| p.into_inner());
    let (limit, past) = item.bounds();
    let kept = match slot.take() {
        Some(handle) => Some(handle),
        None => lock().files.get_key_value(item.rel_in(rel)).map(|(key, file)| (key.clone(), file.clone())),
    };
    if let Some((_, k)) = &kept
        && now.saturating_duration_since(k.opened) < KEPT_REFRESH
    {
        match pread_whole(&k.file, limit, past, scratch) {
            Ok(buf) if k.guard != Guard::Links || links(&k.file).is_some_and(|n| n > 0) => {
                *slot = kept;
                return (Ok(buf), None);
            }
            // The attribute refused to answer (`EINVAL`: a netdev's `carrier` while it is
            // down): the file is still there, and opening it again would only hear the
            // same answer. Kept; the answer is the read's.
            Err(ReadError::Invalid) if k.guard == Guard::Sysfs => {
                *slot = kept;
                return (Err(ReadError::Invalid), None);
            }
            // A sign that a device may have gone ([`super::walks`]).
            _ => {
                failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    // Failed or too old: not kept any more, whatever the path gives now. The generation is
    // taken before the open: a file opened after a forget is the path's file now.
    let generation = {
        let mut k = lock();
        if let Some((_, old)) = &kept {
            k.drop_failed(item.rel_in(rel), old);
        }
        k.generation
    };
    let path = item.path();
    match open_read(&path, limit, past) {
        Ok((file, buf)) => {
            // Off sysfs, a file is watched only where it can be kept (the budget has room):
            // one past the budget is closed after this read, and a watch would outlive it.
            let guard = if on_sysfs(&file) {
                Guard::Sysfs
            } else if lock().watch_if_room(&path, item.rel_in(rel), &file) {
                Guard::Watched
            } else {
                Guard::Links
            };
            (Ok(Got::Owned(buf)), Some((KeptFile { file, opened: Instant::now(), guard }, generation)))
        }
        Err(e) => (Err(e), None),
    }
}

/// Read a kept-open attribute from offset 0: at most `limit` bytes (past it: `past`). A
/// short read ends it (the end of a regular file; a sysfs attribute, at most a page,
/// answers whole on the first read), so an attribute costs one `pread`, into `first` (the
/// reader's scratch page: what fits there stays there). Only for attributes: a procfs file
/// answers a page or so per read ([`open_read`] reads those).
fn pread_whole(file: &std::fs::File, limit: usize, past: Past, first: &mut [u8]) -> Result<Got, ReadError> {
    use std::os::unix::fs::FileExt;
    let cap = limit.saturating_add(1);
    // An attribute fits the first buffer (the reader's own: no allocation, no zeroing per
    // read); only what was read is copied out.
    let want = cap.min(first.len());
    let n = loop {
        match file.read_at(&mut first[..want], 0) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(classify(&e)),
        }
    };
    if n < want || want == cap {
        if n > limit {
            return match past {
                Past::Error => Err(ReadError::TooLarge(limit)),
                Past::Ignore => Ok(Got::Scratch(limit)),
            };
        }
        return Ok(Got::Scratch(n));
    }
    let mut buf = first[..n].to_vec();
    let mut len = n;
    loop {
        if len == buf.len() {
            if buf.len() >= cap {
                break;
            }
            buf.resize(cap.min(buf.len().saturating_mul(2)), 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(classify(&e)),
        }
    }
    buf.truncate(len);
    if len > limit {
        match past {
            Past::Error => return Err(ReadError::TooLarge(limit)),
            Past::Ignore => buf.truncate(limit),
        }
    }
    Ok(Got::Owned(buf))
}
