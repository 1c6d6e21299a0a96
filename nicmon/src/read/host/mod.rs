//! The host reader: the only code that reads sysfs and procfs.
//!
//! Rooted at `--sysfs` / `--procfs` (defaults `/sys`, `/proc`); the real host and the
//! testbed's fixture trees go through this same code, only the roots differ. It makes no
//! decisions: it returns bytes, link targets and directory listings, or says why it could
//! not. Rules that live here because they are about *reading*:
//! - a file whose `read()` failed with `EINVAL` is never opened again for the life of this
//!   reader (SPEC §1.1 — reading restricted counters makes mlx5 log `ACCESS_REG ... failed`
//!   on every read). The set is data, not reader state: a cycle seeds it from the state
//!   file before its read ([`Host::remember_einval`]) and takes it back out after
//!   ([`Host::take_einval`]) into its observation, so the state file carries it across
//!   polls and restarts within one boot. Except a netdev's `speed` and `carrier`
//!   ([`einval_is_a_state`]), which answer `EINVAL` whenever the netdev is down: a state
//!   of the link, not a restricted attribute;
//! - no read can stall the monitor: every read runs on a reader thread with a deadline (per
//!   read, and per poll — see [`Host::begin_poll`]). A read past it is abandoned for that
//!   poll ([`ReadError::Stuck`]); the path is not read again until the abandoned read has
//!   returned, and at most [`MAX_STUCK`] reader threads may be stuck at once;
//! - every read is bounded (a sysfs attribute is at most a [`PAGE`]) and only regular files
//!   are opened: a FIFO, a device (`/dev/zero`) or a directory where an attribute is
//!   expected is an error, never a read.
//!
//! **Batches.** A poll hands its files to the reader thread together
//! ([`Host::read_files`]: every port file of every device and the character-device
//! attributes, one [`FileSet`]), not one by one: the thread reads them in order and answers
//! once, so a poll costs one thread wake-up each way instead of one per file. A file set's
//! paths are joined once; discovery reads the last poll's set again while its files are the
//! same (and starts it before listing the devices). The deadlines are unchanged:
//! the caller watches the item in progress (noted by the thread under an uncontended lock)
//! and abandons a read past [`Deadlines::read`] from its start, or past the poll's deadline,
//! exactly as a single read; the results read before it stand, the rest of the batch goes
//! to a fresh thread (or is refused when the poll's deadline has passed or [`MAX_STUCK`]
//! reads are stuck).
//!
//! **Kept-open files.** The attributes read every poll (port `state`, `phys_state`, `rate`,
//! `lid`, `sm_lid`, `link_layer`, the counters, the netdev's `operstate`/`carrier`/
//! statistics, the character devices' `ibdev`/`port`) stay open between polls and are read
//! with `pread` at offset 0: sysfs (kernfs) generates an attribute's value again on a read
//! at offset 0, so no path walk and no open/close per poll. A kept file is opened again by
//! its path when a `pread` fails (`ENODEV`: the attribute's device went; not on `EINVAL`,
//! which is a sysfs attribute's answer — a down netdev's `carrier` — from a file still
//! there), when its device is a new incarnation or the device set changes (discovery calls
//! [`Host::forget_kept`]), and at least every [`KEPT_REFRESH`]; at most a quarter of the
//! open-file limit is kept (the soft limit is raised to the hard one, at most 65536, once
//! per process). A stuck read holds only the file it is in; an abandoned thread closes it.
//!
//! The testbed (fixture trees on an ordinary filesystem) must behave like sysfs for this:
//! its writers change a value **in place** (`std::fs::write`: the same inode, truncated and
//! written), as sysfs's values change under an open file, so a kept descriptor sees every
//! change. A reader racing such a write sees the old value, the new one, or an empty file
//! (never a mix: the new value is one write of less than a page, and the file's size
//! changes only once it is copied), and an empty value parses as unknown for that one poll
//! (`parse::text`), never as a value. What a fixture can do that sysfs cannot — remove a file
//! or replace it with another (a link to an `EINVAL` file, a FIFO) — is caught by an
//! `inotify` watch on each kept file that is not on sysfs (`IN_ATTRIB`: its link count
//! changed; `IN_DELETE_SELF`, `IN_MOVE_SELF`): the reader drains the watch's events once per
//! batch, before its first read, and a file named in one is read by its path again, as an
//! open-per-read reader would — one `read` per batch instead of an `fstat` per file. Where a
//! watch cannot be added (no inotify, the watch limit reached), that file is checked after
//! each `pread` instead (no name left, `st_nlink` 0: read by its path). On sysfs neither is
//! needed (a removed node answers `ENODEV`); sysfs does not report changes to inotify.
//!
//! [`read_file`] applies the same rules to the files nicmon reads outside sysfs (state,
//! config, metadata, `--kmsg`), each with its own size limit.
//!
//! For support bundles (`nicmon bundle`, [`crate::cli::bundle`]): a symlink whose target is
//! [`FAILURE_LINK_PREFIX`]`<why>` reads as the failure a bundle recorded there (`errno=22` is
//! `EINVAL`, `not-regular:a FIFO` a FIFO), so a replayed tree fails the way the node did; with
//! an [`AccessLog`] the reader also notes every path it was asked about.
//!
//! Rooms: `reader.rs` (the reader pool and its deadlines), `kept.rs` (kept-open files),
//! `listing.rs` (a directory listed poll after poll), `file.rs` (one regular file, read
//! whole and bounded), `access.rs` (the access log and a bundle's failure links); the
//! [`Host`] facade is here.
use std::collections::BTreeSet;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod access;
mod answers;
mod file;
mod handoff;
mod kept;
mod listing;
mod reader;
mod stream;
mod texts;
mod walks;

pub use access::{Access, AccessLog, FAILURE_LINK_PREFIX, failure_link_error};
pub use file::{NOT_REGULAR, non_regular_kind, open_regular};
use file::{Past, list_dir, list_dir_at};
pub use kept::KEPT_REFRESH;
pub use listing::Listing;
pub use reader::{Deadlines, FILE_READ_TIMEOUT, FileSet, PendingReads, ReadStats, ReadWaker, Rels, read_file};
use reader::{Item, Reader};
pub use stream::{FileStream, stream_file};
pub use texts::Texts;
pub use walks::WALK_PERIOD;

/// The most a sysfs attribute can hold (`PAGE_SIZE`; `sysfs_emit` writes at most a page).
pub const PAGE: usize = 4096;
/// The most nicmon reads of a procfs file (`net/route`: 8192 routes).
pub const PROC_LIMIT: usize = 1 << 20;
/// How many reader threads may be stuck in a read at once (per reader). Past that, reads
/// fail at once instead of starting another thread.
pub const MAX_STUCK: usize = 8;

pub use crate::model::ReadError;

/// Which tree a path is relative to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tree {
    Sys,
    Proc,
}

/// A sysfs directory kept open (`O_PATH`): a lookup relative to it walks no path from the
/// root (`class/infiniband/mlx5_0` is a link to a path ten components deep). It stays the
/// directory it was when opened: on sysfs, once that directory is removed, every lookup in
/// it fails (`ENOENT`), even when a directory of the same name is back.
#[derive(Debug, Clone)]
pub struct SysDir {
    fd: Arc<std::os::fd::OwnedFd>,
    rel: String,
}

/// A host (or a fixture tree standing in for one).
#[derive(Debug)]
pub struct Host {
    sysfs: Arc<Path>,
    procfs: PathBuf,
    boot_id_path: Option<PathBuf>,
    einval: Mutex<BTreeSet<String>>,
    reader: Reader,
    deadlines: Deadlines,
    poll_deadline: Mutex<Option<Instant>>,
    accesses: Option<AccessLog>,
    read_ahead: Mutex<ReadAhead>,
    walks: walks::Walks,
    pub stats: ReadStats,
}

/// The read-ahead of a wake-up's targeted read ([`Host::read_ahead`]).
#[derive(Default)]
struct ReadAhead {
    /// The next [`Host::read_files`] is the targeted read of these devices.
    armed: Option<Vec<String>>,
    /// The devices the last targeted read was of, and the files it read.
    last: Option<(Vec<String>, Arc<FileSet>)>,
    /// The read-ahead begun, under this kept-file generation.
    begun: Option<(u64, PendingReads)>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead").field("armed", &self.armed).field("begun", &self.begun.is_some()).finish()
    }
}

impl Host {
    pub fn new(sysfs: impl Into<PathBuf>, procfs: impl Into<PathBuf>) -> Host {
        Host {
            sysfs: Arc::from(sysfs.into()),
            procfs: procfs.into(),
            boot_id_path: None,
            einval: Mutex::new(BTreeSet::new()),
            reader: Reader::default(),
            deadlines: Deadlines::default(),
            poll_deadline: Mutex::new(None),
            accesses: None,
            read_ahead: Mutex::default(),
            walks: walks::Walks::default(),
            stats: ReadStats::default(),
        }
    }

    /// Note every path this reader is asked about in `log`.
    pub fn with_access_log(mut self, log: AccessLog) -> Host {
        self.accesses = Some(log);
        self
    }

    fn note(&self, access: impl FnOnce() -> Access) {
        if let Some(log) = &self.accesses
            && let Ok(mut l) = log.lock()
        {
            l.insert(access());
        }
    }

    fn note_sys(&self, rel: &str, make: fn(Tree, String) -> Access) {
        self.note(|| make(Tree::Sys, rel.to_string()));
    }

    /// Use these read deadlines instead of the defaults.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Host {
        self.deadlines = deadlines;
        self
    }

    /// Start a poll: its reads together get [`Deadlines::poll`] from now.
    pub fn begin_poll(&self) {
        *self.poll_deadline.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + self.deadlines.poll);
    }

    /// Reads are coming soon (a wake-up's targeted poll is being planned): the reader
    /// thread wakes now instead of when they are handed over, and waits for them awake (at
    /// most 0.5 ms, `reader::EXPECT_SPIN`).
    pub fn expect_reads(&self) {
        self.reader.expect();
    }

    /// [`Host::expect_reads`] as a handle another task can call: the daemon's eBPF ring
    /// buffer drain wakes the reader thread as soon as a hinted record arrives.
    pub fn read_waker(&self) -> ReadWaker {
        self.reader.waker()
    }

    /// Sysfs/procfs paths whose read has not returned (abandoned at a deadline), with how
    /// long ago each started: for the log, metrics and `/healthz`.
    pub fn stuck_reads(&self) -> Vec<(PathBuf, Duration)> {
        self.reader.stuck_paths()
    }

    /// When the current poll's reads must be done (`None`: no poll begun).
    fn poll_end(&self) -> Option<Instant> {
        *self.poll_deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The time one read may take now: the read deadline, cut to what is left of the poll's.
    /// Other readers under the same deadlines (ethtool) ask it too.
    pub fn timeout(&self) -> Duration {
        let poll = *self.poll_deadline.lock().unwrap_or_else(|p| p.into_inner());
        match poll {
            Some(end) => self.deadlines.read.min(end.saturating_duration_since(Instant::now())),
            None => self.deadlines.read,
        }
    }

    fn read_bytes(&self, path: &Path, limit: usize, past: Past) -> Result<Vec<u8>, ReadError> {
        let r = self.reader.read(path, limit, past, self.timeout());
        self.after_read(path, r)
    }

    /// What every read's result goes through: a bundle's failure link, the abandoned count.
    fn after_read(&self, path: &Path, r: Result<Vec<u8>, ReadError>) -> Result<Vec<u8>, ReadError> {
        r.map_err(|e| self.after_failure(path, e))
    }

    /// [`Host::after_read`] of a failed read.
    fn after_failure(&self, path: &Path, e: ReadError) -> ReadError {
        // A bundle's failure link dangles: replay the failure it records instead.
        if e == ReadError::Missing
            && let Ok(target) = std::fs::read_link(path)
            && let Some(why) = target.to_str().and_then(|t| t.strip_prefix(FAILURE_LINK_PREFIX))
        {
            return failure_link_error(why);
        }
        if matches!(&e, ReadError::Stuck(why) if why.starts_with("no answer")) {
            self.stats.reads_abandoned.fetch_add(1, Ordering::Relaxed);
        }
        e
    }

    /// The sysfs-relative files `rels` as a [`FileSet`]. `keep`: these are attributes that
    /// change, read every poll: keep them open and read them again with `pread` at offset 0
    /// (see the module doc, "Kept-open files").
    pub fn file_set(&self, rels: Vec<String>, keep: bool) -> Arc<FileSet> {
        self.file_set_keeping(rels.into_iter().collect(), |_| keep)
    }

    /// [`Host::file_set`], keeping open the files whose index `keep` says.
    pub fn file_set_keeping(&self, rels: Rels, keep: impl Fn(usize) -> bool) -> Arc<FileSet> {
        let items = rels
            .split
            .into_iter()
            .enumerate()
            .map(|(i, (dir, name))| Item {
                root: self.sysfs.clone(),
                dir,
                name,
                limit: PAGE,
                past: Past::Error,
                keep: keep(i),
            })
            .collect();
        Arc::new(FileSet { items })
    }

    /// Read the files of `set` as text, in one hand-off to the reader thread: the same rules
    /// and results as [`Host::read_sys`] on each (the `EINVAL` memo, the deadlines per read
    /// and per poll, stuck reads), at the cost of one thread wake-up for them all.
    pub fn read_files(&self, set: &Arc<FileSet>) -> Texts {
        if let Some(results) = self.take_read_ahead(set) {
            return results;
        }
        let pending = self.start_files(set);
        self.finish_files(pending)
    }

    /// [`Host::read_files`] for a batch no wake-up waits for (a full poll's): its thread is
    /// brought to this one's CPU only when it is late ([`PendingReads::patient`]).
    pub fn read_files_patient(&self, set: &Arc<FileSet>) -> Texts {
        if let Some(results) = self.take_read_ahead(set) {
            return results;
        }
        let pending = self.start_files(set).patient();
        self.finish_files(pending)
    }

    /// A wake-up's targeted read of `devices` begins (after its `EINVAL` memo was seeded,
    /// [`Host::remember_einval`]): the files the last targeted read of the same devices
    /// read are read again now, while the caller plans this one (lists the devices, checks
    /// their `device` links) — the next [`Host::read_files`] is that read, and uses them
    /// when it asks for exactly those files and no kept-open file was forgotten meanwhile
    /// (a new incarnation); otherwise they are dropped and its files are read then.
    /// [`Host::end_read_ahead`] ends the targeted read. Counted in
    /// [`ReadStats::read_ahead_used`] and [`ReadStats::read_ahead_dropped`].
    pub fn read_ahead(&self, devices: &[String]) {
        let last = {
            let mut ra = self.read_ahead.lock().unwrap_or_else(|p| p.into_inner());
            ra.armed = Some(devices.to_vec());
            ra.last.as_ref().filter(|(d, _)| d == devices).map(|(_, set)| set.clone())
        };
        self.end_unused_read_ahead();
        if let Some(set) = last {
            let begun = (self.kept_generation(), self.start_files(&set));
            self.read_ahead.lock().unwrap_or_else(|p| p.into_inner()).begun = Some(begun);
        }
    }

    /// The targeted read [`Host::read_ahead`] announced is over: a read-ahead it did not use
    /// is collected (its results dropped; an `EINVAL` it met is remembered all the same).
    pub fn end_read_ahead(&self) {
        self.read_ahead.lock().unwrap_or_else(|p| p.into_inner()).armed = None;
        self.end_unused_read_ahead();
    }

    fn end_unused_read_ahead(&self) {
        let begun = self.read_ahead.lock().unwrap_or_else(|p| p.into_inner()).begun.take();
        if let Some((_, reads)) = begun {
            // Collected: the reader must be free for the next batch.
            self.finish_files(reads);
            self.stats.read_ahead_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// When a targeted read was announced ([`Host::read_ahead`]): `set` is its files,
    /// remembered for the next one; the read-ahead's results when it read exactly these.
    fn take_read_ahead(&self, set: &Arc<FileSet>) -> Option<Texts> {
        let begun = {
            let mut ra = self.read_ahead.lock().unwrap_or_else(|p| p.into_inner());
            let devices = ra.armed.take()?;
            ra.last = Some((devices, set.clone()));
            ra.begun.take()
        };
        let (generation, reads) = begun?;
        if reads.set.same_files(set) && generation == self.kept_generation() {
            self.stats.read_ahead_used.fetch_add(1, Ordering::Relaxed);
            return Some(self.finish_files(reads));
        }
        self.finish_files(reads);
        self.stats.read_ahead_dropped.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// [`Host::read_files`] begun: the reader thread reads `set` while the caller goes on;
    /// [`Host::finish_files`] waits for the results (the deadlines run meanwhile).
    pub fn start_files(&self, set: &Arc<FileSet>) -> PendingReads {
        let (items, memo) = {
            let einval = self.einval.lock().unwrap_or_else(|p| p.into_inner());
            let mut buf = String::new();
            let mut memoized = |i: usize| set.items.get(i).is_some_and(|item| einval.contains(item.rel_in(&mut buf)));
            if einval.is_empty() || !(0..set.len()).any(&mut memoized) {
                (set.items.clone(), None)
            } else {
                let mut at = Vec::new();
                let mut items = Vec::new();
                for (i, item) in set.items.iter().enumerate() {
                    if !memoized(i) {
                        at.push(i);
                        items.push(item.clone());
                    }
                }
                (Arc::from(items), Some(at))
            }
        };
        let skipped = set.len() - items.len();
        if skipped > 0 {
            self.stats.einval_skipped.fetch_add(skipped as u64, Ordering::Relaxed);
        }
        self.stats.files_read.fetch_add(items.len() as u64, Ordering::Relaxed);
        if self.accesses.is_some() {
            for rel in set.rels() {
                self.note_sys(&rel, |tree, rel| Access::Read { tree, rel });
            }
        }
        if self.stats.recording() {
            for item in items.iter() {
                self.stats.record(&item.path());
            }
        }
        let pending = self.reader.start_many(items, self.deadlines.read, self.poll_end());
        PendingReads { set: set.clone(), memo, pending }
    }

    /// The results of [`Host::start_files`], in its set's order.
    pub fn finish_files(&self, reads: PendingReads) -> Texts {
        let PendingReads { set, memo, pending } = reads;
        let mut answers = self.reader.finish_many(pending, self.deadlines.read, self.poll_end());
        for j in 0..answers.len() {
            // Item `j` handed to the reader is file `i` of the set.
            let i = memo.as_ref().map_or(j, |at| at.get(j).copied().unwrap_or(j));
            let fixed = match answers.get(j) {
                Some(Ok(bytes)) => match std::str::from_utf8(bytes) {
                    Ok(_) => continue,
                    Err(_) => Ok(String::from_utf8_lossy(bytes).into_owned()),
                },
                Some(Err(e)) => {
                    // The path matters only to a failure (its bundle link, its log line).
                    let path = set.items.get(i).map(Item::path).unwrap_or_default();
                    let e = self.after_failure(&path, e.clone());
                    Err(self.failed(&path, || set.rel(i).unwrap_or_default(), e))
                }
                None => Err(ReadError::Io("not read".into())),
            };
            answers.put(j, fixed.as_ref().map(|s| s.as_bytes()).map_err(Clone::clone));
        }
        if let Some(at) = memo {
            // The files in the memo answered `EINVAL` before: not read again.
            let mut all = self.reader.answers(set.len());
            all.fail_from(0, &ReadError::Invalid);
            for (j, &i) in at.iter().enumerate() {
                all.put(i, answers.result(j));
            }
            self.reader.recycle(std::mem::replace(&mut answers, all));
        }
        Texts::new(answers, Some(self.reader.spares.clone()))
    }

    /// A number that changes whenever kept-open files are forgotten ([`Host::forget_kept`]):
    /// reads begun before a change may have used a descriptor that was forgotten.
    pub fn kept_generation(&self) -> u64 {
        self.reader.shared.kept_generation.load(Ordering::Relaxed)
    }

    /// A sign that the topology may have moved (a wake-up's hint): the next poll walks its
    /// paths again ([`walks`]).
    pub fn topology_hint(&self) {
        self.walks.hint();
    }

    /// Whether the kernel's uevents are heard: on sysfs, a listing the last walk read then
    /// stands until a sign comes ([`Host::listing_stands`]).
    pub fn kernel_announces(&self, heard: bool) {
        self.walks.kernel_announces(heard);
    }

    /// Whether sysfs directory `rel`'s listing, as the last walk read it, stands: the signs
    /// answer for it (watched off sysfs, uevents heard on sysfs) and none has come. Asked
    /// after [`Host::topology_signs`].
    pub fn listing_stands(&self, rel: &str) -> bool {
        self.walks.stands(&self.sys(rel))
    }

    /// Watch sysfs directory `rel` for entries coming and going, where sysfs's rules do not
    /// hold (a fixture tree; see [`walks`]).
    pub fn watch_dir_sys(&self, rel: &str) {
        self.walks.watch_dir(&self.sys(rel), false);
    }

    /// Watch procfs directory `rel` for its files being written as well (a fixture's
    /// `net/route` rewritten; the real procfs sends no events: nothing is watched there).
    pub fn watch_proc_writes(&self, rel: &str) {
        self.walks.watch_dir(&self.procfs.join(rel), true);
    }

    /// The sum of the signs that the topology moved (a hint, a kept file's failure, an event
    /// on a watched directory): a walk is owed when it differs from the last walk's. `None`:
    /// a directory could not be watched, every poll walks.
    pub fn topology_signs(&self) -> Option<u64> {
        let failures = self.reader.shared.kept_failures.load(Ordering::Relaxed);
        self.walks.moved(failures)
    }

    /// Close the kept-open files under sysfs-relative `rel` (all of them: `None`): the
    /// device they belong to went, or is a new incarnation.
    pub fn forget_kept(&self, rel: Option<&str>) {
        match rel {
            Some(rel) => self.reader.forget_kept(Some(rel)),
            None => self.reader.forget_kept(None),
        }
    }

    /// Close the kept-open files that are not files of `set` (a poll's batch: files read
    /// before and no longer, such as a device's that is now read once per incarnation).
    pub fn keep_only(&self, set: &FileSet) {
        self.reader.keep_only(&set.items);
    }

    /// How many files are kept open now.
    pub fn kept_files(&self) -> usize {
        self.reader.kept_count()
    }

    /// Read the boot ID from `path` instead of `<procfs>/sys/kernel/random/boot_id`.
    pub fn with_boot_id_path(mut self, path: Option<PathBuf>) -> Host {
        self.boot_id_path = path;
        self
    }

    pub fn sysfs_root(&self) -> &Path {
        &self.sysfs
    }

    pub fn procfs_root(&self) -> &Path {
        &self.procfs
    }

    /// The absolute path of a sysfs-relative path (`class/infiniband/mlx5_0`).
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.sysfs.join(rel)
    }

    /// Read a sysfs file as text (lossy UTF-8).
    pub fn read_sys(&self, rel: &str) -> Result<String, ReadError> {
        self.note_sys(rel, |tree, rel| Access::Read { tree, rel });
        self.read_at(&self.sys(rel), rel, PAGE)
    }

    /// Read a procfs file as text.
    pub fn read_proc(&self, rel: &str) -> Result<String, ReadError> {
        self.note(|| Access::Read { tree: Tree::Proc, rel: rel.to_string() });
        let key = format!("proc:{rel}");
        // Not an attribute: `net/route` has a line per route (128 bytes each).
        self.read_at(&self.procfs.join(rel), &key, PROC_LIMIT)
    }

    /// Read the first `n` bytes of a sysfs file (PCI config space).
    pub fn read_sys_bytes(&self, rel: &str, n: usize) -> Result<Vec<u8>, ReadError> {
        self.note_sys(rel, |tree, rel| Access::Read { tree, rel });
        self.stats.files_read.fetch_add(1, Ordering::Relaxed);
        self.stats.record(&self.sys(rel));
        self.read_bytes(&self.sys(rel), n, Past::Ignore)
    }

    /// The boot ID (`--boot-id-path`, else `<procfs>/sys/kernel/random/boot_id`).
    pub fn boot_id(&self) -> Result<String, ReadError> {
        let raw = match &self.boot_id_path {
            Some(p) => {
                self.note(|| Access::BootIdFile);
                self.read_at(p, "boot_id", PAGE)?
            }
            None => self.read_proc("sys/kernel/random/boot_id")?,
        };
        let t = raw.trim();
        if t.is_empty() { Err(ReadError::Io("empty boot ID".into())) } else { Ok(t.to_string()) }
    }

    /// Names in a sysfs directory, sorted. A missing directory is an empty listing.
    pub fn list_sys(&self, rel: &str) -> Vec<String> {
        self.note_sys(rel, |tree, rel| Access::List { tree, rel });
        list_dir(&self.sys(rel)).unwrap_or_default()
    }

    /// List sysfs directory `rel` again into `listing` (kept by the caller between polls):
    /// whether its names differ from the last time (see [`Listing`]).
    pub fn relist_sys(&self, rel: &str, listing: &mut Listing) -> bool {
        self.note_sys(rel, |tree, rel| Access::List { tree, rel });
        listing.relist(&self.sys(rel))
    }

    /// [`Host::relist_sys`] through the directory as `listing` last opened it (rewound: no
    /// path walk), or by its path when it has none open.
    pub fn relist_sys_kept(&self, rel: &str, listing: &mut Listing) -> bool {
        self.note_sys(rel, |tree, rel| Access::List { tree, rel });
        listing.relist_kept(&self.sys(rel))
    }

    /// Names in a sysfs directory, sorted, or why it could not be listed: `Missing` when
    /// absent, `Io` naming the cause otherwise (a file where a directory should be).
    pub fn list_sys_dir(&self, rel: &str) -> Result<Vec<String>, ReadError> {
        self.note_sys(rel, |tree, rel| Access::List { tree, rel });
        list_dir(&self.sys(rel)).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing,
            io::ErrorKind::NotADirectory => ReadError::Io("not a directory".into()),
            _ => ReadError::Io(e.to_string()),
        })
    }

    /// Whether a sysfs entry exists (a dangling symlink counts: `physfn` is a link).
    pub fn exists_sys(&self, rel: &str) -> bool {
        self.note_sys(rel, |tree, rel| Access::Entry { tree, rel });
        std::fs::symlink_metadata(self.sys(rel)).is_ok()
    }

    /// Whether a sysfs entry exists and resolves (follows links).
    pub fn resolves_sys(&self, rel: &str) -> bool {
        self.note_sys(rel, |tree, rel| Access::Entry { tree, rel });
        std::fs::metadata(self.sys(rel)).is_ok()
    }

    /// The sysfs directory `rel`, kept open for lookups in it ([`SysDir`]).
    pub fn open_dir_sys(&self, rel: &str) -> Option<SysDir> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(self.sys(rel), flags, Mode::empty()).ok()?;
        Some(SysDir { fd: Arc::new(fd), rel: rel.to_string() })
    }

    /// Whether entry `name` exists in `dir` (a dangling link counts).
    pub fn exists_in(&self, dir: &SysDir, name: &str) -> bool {
        self.note(|| Access::Entry { tree: Tree::Sys, rel: format!("{}/{name}", dir.rel) });
        rustix::fs::statat(&*dir.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Whether `dir` is still the directory at its path (not removed, renamed or replaced).
    pub fn still_at_path(&self, dir: &SysDir) -> bool {
        self.note(|| Access::Entry { tree: Tree::Sys, rel: dir.rel.clone() });
        let (Ok(kept), Ok(now)) = (rustix::fs::fstat(&*dir.fd), rustix::fs::stat(self.sys(&dir.rel))) else {
            return false;
        };
        (kept.st_dev, kept.st_ino) == (now.st_dev, now.st_ino)
    }

    /// [`Host::link_name_sys`] of `name` in `dir`.
    pub fn link_name_in(&self, dir: &SysDir, name: &str) -> Option<String> {
        self.note(|| Access::Entry { tree: Tree::Sys, rel: format!("{}/{name}", dir.rel) });
        let target = rustix::fs::readlinkat(&*dir.fd, name, Vec::new()).ok()?;
        last_name(Path::new(std::ffi::OsStr::from_bytes(target.to_bytes())))
    }

    /// [`Host::list_sys`] of `name` in `dir`.
    pub fn list_in(&self, dir: &SysDir, name: &str) -> Vec<String> {
        self.note(|| Access::List { tree: Tree::Sys, rel: format!("{}/{name}", dir.rel) });
        list_dir_at(&*dir.fd, Path::new(name)).unwrap_or_default()
    }

    /// The last component of a sysfs symlink's target (`device/driver` → `mlx5_core`).
    pub fn link_name_sys(&self, rel: &str) -> Option<String> {
        self.note_sys(rel, |tree, rel| Access::Entry { tree, rel });
        last_name(&std::fs::read_link(self.sys(rel)).ok()?)
    }

    /// A sysfs symlink's target resolved lexically against the link's directory and made
    /// relative to the sysfs root, as components: `bus/pci/devices/0000:1a:00.0` →
    /// `["devices", "pci0000:17", "0000:17:01.0", ..., "0000:1a:00.0"]`. Lexical, so a
    /// fixture tree resolves exactly like `/sys` does.
    pub fn link_target_sys(&self, rel: &str) -> Option<Vec<String>> {
        self.note_sys(rel, |tree, rel| Access::Entry { tree, rel });
        let target = std::fs::read_link(self.sys(rel)).ok()?;
        let base: Vec<String> =
            Path::new(rel).parent().map(|p| p.components().filter_map(comp_name).collect()).unwrap_or_default();
        let mut parts = if target.is_absolute() {
            // An absolute target on the real host (`/sys/devices/...`).
            match target.strip_prefix(&self.sysfs) {
                Ok(_) => Vec::new(),
                Err(_) => return None,
            }
        } else {
            base
        };
        let rest = if target.is_absolute() { target.strip_prefix(&self.sysfs).ok()?.to_path_buf() } else { target };
        for c in rest.components() {
            match c {
                Component::ParentDir => {
                    parts.pop()?;
                }
                Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
                _ => {}
            }
        }
        Some(parts)
    }

    /// Files that failed with `EINVAL` so far (sysfs-relative), for the state file.
    pub fn einval_paths(&self) -> Vec<String> {
        self.einval.lock().map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// Take the `EINVAL` set out of the reader (it then remembers nothing).
    pub fn take_einval(&self) -> BTreeSet<String> {
        self.einval.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default()
    }

    /// Seed the `EINVAL` set (from the state file of the same boot).
    pub fn remember_einval(&self, paths: impl IntoIterator<Item = String>) {
        if let Ok(mut s) = self.einval.lock() {
            s.extend(paths);
        }
    }

    fn read_at(&self, path: &Path, key: &str, limit: usize) -> Result<String, ReadError> {
        if self.einval.lock().map(|s| s.contains(key)).unwrap_or(false) {
            self.stats.einval_skipped.fetch_add(1, Ordering::Relaxed);
            return Err(ReadError::Invalid);
        }
        self.stats.files_read.fetch_add(1, Ordering::Relaxed);
        self.stats.record(path);
        let r = self.read_bytes(path, limit, Past::Error);
        self.text_of(path, || key.to_string(), r)
    }

    /// A read's bytes as text (lossy UTF-8); an `EINVAL` goes into the memo.
    fn text_of(
        &self,
        path: &Path,
        key: impl FnOnce() -> String,
        r: Result<Vec<u8>, ReadError>,
    ) -> Result<String, ReadError> {
        // In place when the bytes are UTF-8.
        r.map(|bytes| String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
            .map_err(|e| self.failed(path, key, e))
    }

    /// A read's failure: an `EINVAL` (of an attribute that does not say a passing state)
    /// goes into the memo.
    fn failed(&self, path: &Path, key: impl FnOnce() -> String, err: ReadError) -> ReadError {
        if err == ReadError::Invalid {
            let key = key();
            if !einval_is_a_state(&key) {
                if let Ok(mut s) = self.einval.lock() {
                    s.insert(key);
                }
                tracing::warn!(path = %path.display(), "read failed with EINVAL: not reading it again in this boot");
            }
        }
        err
    }
}

/// Whether a file's `EINVAL` says a state that passes rather than a restricted attribute
/// (not memoized): a netdev's `speed` and `carrier`, which the kernel answers only while the
/// netdev is running (`EINVAL` while it is administratively down: memoizing that would
/// leave the port's carrier unknown for the rest of the boot once it is brought up again).
pub fn einval_is_a_state(key: &str) -> bool {
    key.strip_prefix("class/net/")
        .and_then(|rest| rest.strip_suffix("/speed").or_else(|| rest.strip_suffix("/carrier")))
        .is_some_and(|nd| !nd.contains('/'))
}

/// The last component of a link's target (`../../devices/.../mlx5_core` → `mlx5_core`).
fn last_name(target: &Path) -> Option<String> {
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

fn comp_name(c: Component<'_>) -> Option<String> {
    match c {
        Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
        _ => None,
    }
}

fn classify(e: &io::Error) -> ReadError {
    match e.raw_os_error() {
        Some(libc::EINVAL) => ReadError::Invalid,
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => ReadError::Missing,
        _ if e.kind() == io::ErrorKind::NotFound => ReadError::Missing,
        _ => ReadError::Io(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::kept::Guard;
    use super::*;

    #[test]
    fn einval_file_is_opened_once() {
        // `/sys/class/net/lo/speed` fails with EINVAL on every Linux host: a real EINVAL.
        if std::fs::read("/sys/class/net/lo/speed").map_err(|e| e.raw_os_error()) != Err(Some(libc::EINVAL)) {
            eprintln!("skipped: /sys/class/net/lo/speed does not fail with EINVAL on this host");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("x")).unwrap();
        std::os::unix::fs::symlink("/sys/class/net/lo/speed", sys.join("x/restricted")).unwrap();
        std::fs::write(sys.join("x/fine"), "7\n").unwrap();
        let host = Host::new(&sys, dir.path().join("proc"));
        assert_eq!(host.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(host.stats.files_read.load(Ordering::Relaxed), 1);
        assert_eq!(host.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(host.stats.files_read.load(Ordering::Relaxed), 1, "opened again");
        assert_eq!(host.stats.einval_skipped.load(Ordering::Relaxed), 1);
        assert_eq!(host.einval_paths(), vec!["x/restricted".to_string()]);
        assert_eq!(host.read_sys("x/fine").as_deref(), Ok("7\n"));
        assert_eq!(host.read_sys("x/none"), Err(ReadError::Missing));
        // A new reader seeded from the state file does not open it either.
        let again = Host::new(&sys, dir.path().join("proc"));
        again.remember_einval(host.einval_paths());
        assert_eq!(again.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(again.stats.files_read.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_netdev_speed_failing_with_einval_is_read_again() {
        if std::fs::read("/sys/class/net/lo/speed").map_err(|e| e.raw_os_error()) != Err(Some(libc::EINVAL)) {
            eprintln!("skipped: /sys/class/net/lo/speed does not fail with EINVAL on this host");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("class/net/eth0")).unwrap();
        std::os::unix::fs::symlink("/sys/class/net/lo/speed", sys.join("class/net/eth0/speed")).unwrap();
        let host = Host::new(&sys, dir.path().join("proc"));
        // Down: EINVAL, not memoized; up again: read.
        assert_eq!(host.read_sys("class/net/eth0/speed"), Err(ReadError::Invalid));
        assert!(host.einval_paths().is_empty());
        std::fs::remove_file(sys.join("class/net/eth0/speed")).unwrap();
        std::fs::write(sys.join("class/net/eth0/speed"), "200000\n").unwrap();
        assert_eq!(host.read_sys("class/net/eth0/speed").as_deref(), Ok("200000\n"));
        for (key, state) in [
            ("class/net/eth0/speed", true),
            ("class/net/eth0/carrier", true),
            ("class/net/eth0/carrier_changes", false),
            ("class/net/eth0/x/speed", false),
            ("class/infiniband/mlx5_0/ports/1/speed", false),
        ] {
            assert_eq!(einval_is_a_state(key), state, "{key}");
        }
    }

    /// A veth pair made for a test (its first end's name), deleted on drop; `None` (said
    /// in one line) where this host cannot make one.
    struct Veth(String);

    impl Veth {
        fn add(prefix: &str) -> Option<Veth> {
            let pid = std::process::id() % 100_000;
            let (a, b) = (format!("{prefix}{pid}a"), format!("{prefix}{pid}b"));
            let added = std::process::Command::new("ip")
                .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
                .stderr(std::process::Stdio::null())
                .status();
            if !added.is_ok_and(|s| s.success()) {
                eprintln!("skipped: cannot create a veth on this host (needs root and `ip`)");
                return None;
            }
            Some(Veth(a))
        }
    }

    impl Drop for Veth {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["link", "del", &self.0]).status();
        }
    }

    /// A fixture tree whose `class/net/eth0/carrier` is a new veth's real `carrier` (the veth
    /// administratively down); `None` where no veth can be made.
    fn carrier_fixture(prefix: &str) -> Option<(Veth, tempfile::TempDir, Host)> {
        let veth = Veth::add(prefix)?;
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("class/net/eth0")).unwrap();
        let carrier = format!("/sys/class/net/{}/carrier", veth.0);
        std::os::unix::fs::symlink(carrier, sys.join("class/net/eth0/carrier")).unwrap();
        let host = Host::new(&sys, dir.path().join("proc"));
        Some((veth, dir, host))
    }

    /// A veth is created administratively down: its `carrier` answers `EINVAL` (the real
    /// kernel), which is not memoized, and once the netdev is brought up it is read again.
    #[test]
    fn a_netdev_carrier_failing_with_einval_while_down_is_read_again_once_up() {
        let Some((veth, _dir, host)) = carrier_fixture("nmcar") else { return };
        let a = veth.0.clone();
        assert_eq!(host.read_sys("class/net/eth0/carrier"), Err(ReadError::Invalid), "admin-down veth");
        assert!(host.einval_paths().is_empty(), "a down netdev's carrier is a state, not a restricted file");
        nicmon_tests::latency::set_link_up(&a, true).unwrap();
        let up = host.read_sys("class/net/eth0/carrier");
        assert!(matches!(up.as_deref(), Ok("0\n") | Ok("1\n")), "read again once up: {up:?}");
    }

    /// A kept-open netdev `carrier` that answers `EINVAL` (its veth taken down) stays open:
    /// the next read is a `pread` of the same descriptor, not a path walk to hear `EINVAL`
    /// again, and it reads the carrier again once the netdev is up.
    #[test]
    fn a_kept_carrier_answering_einval_stays_open() {
        let Some((veth, _dir, host)) = carrier_fixture("nmkep") else { return };
        let a = veth.0.clone();
        let set = host.file_set(vec!["class/net/eth0/carrier".into()], true);
        let read = |host: &Host| host.read_files(&set).owned().pop().unwrap();
        nicmon_tests::latency::set_link_up(&a, true).unwrap();
        assert!(matches!(read(&host).as_deref(), Ok("0\n") | Ok("1\n")));
        assert_eq!(host.kept_files(), 1, "an attribute read every poll is kept open");
        nicmon_tests::latency::set_link_up(&a, false).unwrap();
        assert_eq!(read(&host), Err(ReadError::Invalid), "admin-down veth");
        assert_eq!(host.kept_files(), 1, "EINVAL is the attribute's answer: the file stays open");
        nicmon_tests::latency::set_link_up(&a, true).unwrap();
        assert!(matches!(read(&host).as_deref(), Ok("0\n") | Ok("1\n")), "read again once up");
        assert_eq!(host.kept_files(), 1);
    }

    fn fixture() -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/p")).unwrap();
        let host = Host::new(dir.path().join("sys"), dir.path().join("proc"));
        (dir, host)
    }

    /// A listing larger than one `getdents64` buffer comes whole and sorted (a node with
    /// hundreds of VFs lists `class/net` so); a missing directory is `Missing`, a file where
    /// a directory should be is an error, `.` and `..` are never names.
    #[test]
    fn listings_span_several_getdents_calls() {
        let (dir, host) = fixture();
        let mut want: Vec<String> = (0..700).map(|i| format!("ib_device_with_a_long_sysfs_name_{i:04}")).collect();
        for name in want.iter().rev() {
            std::fs::write(dir.path().join("sys/p").join(name), "").unwrap();
        }
        want.sort();
        assert_eq!(host.list_sys("p"), want);
        assert_eq!(host.list_sys_dir("p"), Ok(want));
        std::fs::create_dir_all(dir.path().join("sys/empty")).unwrap();
        assert_eq!(host.list_sys_dir("empty"), Ok(Vec::new()));
        assert_eq!(host.list_sys_dir("none"), Err(ReadError::Missing));
        assert_eq!(host.list_sys("none"), Vec::<String>::new());
        let not_dir = host.list_sys_dir("p/ib_device_with_a_long_sysfs_name_0001");
        assert_eq!(not_dir, Err(ReadError::Io("not a directory".into())));
    }

    /// A targeted read's read-ahead: the last targeted read's files of the same devices,
    /// used when the read asks for exactly those and no kept file was forgotten; dropped
    /// otherwise (the read then reads its own); a file in the `EINVAL` memo is not opened.
    #[test]
    fn a_targeted_read_uses_its_read_ahead_only_when_it_reads_the_same_files() {
        let (dir, host) = fixture();
        let p = dir.path().join("sys/p");
        for (f, v) in [("a", "1\n"), ("b", "2\n"), ("c", "3\n")] {
            std::fs::write(p.join(f), v).unwrap();
        }
        let stat = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let set = |files: &[&str]| host.file_set(files.iter().map(|f| format!("p/{f}")).collect(), true);
        let text = |r: Texts| r.owned().into_iter().map(|r| r.unwrap()).collect::<Vec<_>>();
        let d = ["mlx5_0".to_string()];
        // The first targeted read of a device has nothing to read ahead.
        host.read_ahead(&d);
        assert_eq!(text(host.read_files(&set(&["a", "b"]))), ["1\n", "2\n"]);
        host.end_read_ahead();
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (0, 0));
        // The next one reads the same files ahead (their values now) and uses them.
        std::fs::write(p.join("a"), "5\n").unwrap();
        host.read_ahead(&d);
        assert_eq!(text(host.read_files(&set(&["a", "b"]))), ["5\n", "2\n"]);
        host.end_read_ahead();
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (1, 0));
        // Other files than those read ahead: dropped, the read's own files are read.
        host.read_ahead(&d);
        assert_eq!(text(host.read_files(&set(&["a", "c"]))), ["5\n", "3\n"]);
        host.end_read_ahead();
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (1, 1));
        // Another device: nothing read ahead (the last read was of mlx5_0).
        let before = stat(&host.stats.files_read);
        host.read_ahead(&["mlx5_1".to_string()]);
        assert_eq!(stat(&host.stats.files_read), before, "nothing read ahead");
        host.end_read_ahead();
        // A kept file forgotten meanwhile (a new incarnation): dropped.
        host.read_ahead(&d);
        host.forget_kept(Some("p"));
        assert_eq!(text(host.read_files(&set(&["a", "c"]))), ["5\n", "3\n"]);
        host.end_read_ahead();
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (1, 2));
        // Not used at all (the read ended before its files were read): collected, dropped;
        // a later read that was not announced is not remembered.
        host.read_ahead(&d);
        host.end_read_ahead();
        assert_eq!(stat(&host.stats.read_ahead_dropped), 3);
        assert_eq!(text(host.read_files(&set(&["b"]))), ["2\n"]);
        // A file in the EINVAL memo is not opened by the read-ahead either.
        host.remember_einval(["p/c".to_string()]);
        let before = stat(&host.stats.files_read);
        host.read_ahead(&d);
        let r = host.read_files(&set(&["a", "c"]));
        host.end_read_ahead();
        assert_eq!(r.owned(), vec![Ok("5\n".to_string()), Err(ReadError::Invalid)]);
        assert_eq!(stat(&host.stats.files_read), before + 1, "only p/a was read");
        assert_eq!((stat(&host.stats.read_ahead_used), stat(&host.stats.read_ahead_dropped)), (2, 3));
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
    }

    /// The guards of the kept files, by file name.
    fn guards(host: &Host) -> BTreeMap<String, Guard> {
        let k = host.reader.shared.kept();
        k.files
            .iter()
            .map(|(p, f)| (Path::new(p).file_name().unwrap().to_string_lossy().into_owned(), f.guard))
            .collect()
    }

    /// A fixture's kept files see what a fresh open would: a value changed in place, a file
    /// replaced by a rename, a removed file, a FIFO or a link put in a file's place — with
    /// the inotify watch (`watched`) and, where no watch can be had, the check after each read.
    fn kept_files_follow_removal_and_replacement(watched: bool) {
        let (dir, host) = fixture();
        if !watched {
            host.reader.shared.kept().watch = Some(Err(()));
        }
        let p = dir.path().join("sys/p");
        let names = ["a", "b", "c", "d", "e"];
        for n in names {
            std::fs::write(p.join(n), format!("{n}1\n")).unwrap();
        }
        std::fs::write(p.join("other"), "linked\n").unwrap();
        let rels: Vec<String> = names.iter().map(|n| format!("p/{n}")).collect();
        let set = host.file_set(rels, true);
        let read = || host.read_files(&set).owned();
        let ok = |v: &str| Ok(format!("{v}\n"));
        assert_eq!(read(), vec![ok("a1"), ok("b1"), ok("c1"), ok("d1"), ok("e1")]);
        let want = if watched { Guard::Watched } else { Guard::Links };
        assert_eq!(guards(&host).values().copied().collect::<Vec<_>>(), vec![want; 5]);
        // Read again through the kept descriptors: the same values.
        assert_eq!(read(), vec![ok("a1"), ok("b1"), ok("c1"), ok("d1"), ok("e1")]);

        std::fs::write(p.join("a"), "a2\n").unwrap(); // in place
        std::fs::write(p.join("b.new"), "b2\n").unwrap();
        std::fs::rename(p.join("b.new"), p.join("b")).unwrap(); // replaced
        std::fs::remove_file(p.join("c")).unwrap(); // removed
        std::fs::remove_file(p.join("d")).unwrap();
        mkfifo(&p.join("d")); // a FIFO in its place
        std::fs::remove_file(p.join("e")).unwrap();
        std::os::unix::fs::symlink("other", p.join("e")).unwrap(); // a link in its place
        assert_eq!(
            read(),
            vec![ok("a2"), ok("b2"), Err(ReadError::Missing), Err(ReadError::NotRegular("a FIFO")), ok("linked")]
        );
        std::fs::write(p.join("c"), "c3\n").unwrap(); // back
        assert_eq!(read()[2], ok("c3"));
        // A kept file renamed away from its name (it still has one: only the watch sees
        // that; a fixture does not do this to a file, and sysfs cannot).
        std::fs::rename(p.join("a"), p.join("a.gone")).unwrap();
        if watched {
            assert_eq!(read()[0], Err(ReadError::Missing));
        }
    }

    #[test]
    fn kept_files_are_watched_off_sysfs() {
        kept_files_follow_removal_and_replacement(true);
    }

    #[test]
    fn kept_files_are_checked_after_each_read_without_a_watch() {
        kept_files_follow_removal_and_replacement(false);
    }

    #[test]
    fn only_regular_files_are_opened() {
        let (dir, host) = fixture();
        let p = dir.path().join("sys/p");
        mkfifo(&p.join("fifo"));
        std::os::unix::fs::symlink("/dev/zero", p.join("zero")).unwrap();
        std::os::unix::fs::symlink("fifo", p.join("to-fifo")).unwrap();
        std::os::unix::fs::symlink("nowhere", p.join("dangling")).unwrap();
        std::fs::create_dir(p.join("dir")).unwrap();
        let started = Instant::now();
        assert_eq!(host.read_sys("p/fifo"), Err(ReadError::NotRegular("a FIFO")));
        assert_eq!(host.read_sys("p/to-fifo"), Err(ReadError::NotRegular("a FIFO")));
        assert_eq!(host.read_sys("p/zero"), Err(ReadError::NotRegular("a character device")));
        assert_eq!(host.read_sys("p/dir"), Err(ReadError::NotRegular("a directory")));
        assert_eq!(host.read_sys("p/dangling"), Err(ReadError::Missing));
        assert_eq!(host.read_sys_bytes("p/zero", 64), Err(ReadError::NotRegular("a character device")));
        assert!(started.elapsed() < Duration::from_millis(500), "refused without waiting");
        assert!(host.stuck_reads().is_empty());
        assert!(read_file(&p.join("fifo"), 10).unwrap_err().to_string().contains("FIFO"));
    }

    #[test]
    fn reads_are_bounded() {
        let (dir, host) = fixture();
        let p = dir.path().join("sys/p");
        std::fs::write(p.join("page"), vec![b'1'; PAGE]).unwrap();
        std::fs::write(p.join("big"), vec![b'1'; PAGE + 1]).unwrap();
        assert_eq!(host.read_sys("p/page").unwrap().len(), PAGE);
        assert_eq!(host.read_sys("p/big"), Err(ReadError::TooLarge(PAGE)));
        assert_eq!(host.read_sys_bytes("p/big", 64).unwrap().len(), 64, "a prefix read is not an error");
        assert_eq!(read_file(&p.join("big"), 100), Err(ReadError::TooLarge(100)));
        assert_eq!(read_file(&p.join("page"), PAGE).unwrap().len(), PAGE);
        assert_eq!(read_file(&p.join("none"), PAGE), Err(ReadError::Missing));
        let e = read_file(&p.join("big"), 100).unwrap_err().into_io(&p.join("big"));
        assert!(e.to_string().contains("big: larger than 100 bytes"), "{e}");
    }

    /// A read that blocks (a FIFO opened the blocking way stands in for a sysfs read stuck
    /// behind a firmware command).
    fn blocking_read(path: &Path, _limit: usize, _past: Past) -> Result<Vec<u8>, ReadError> {
        std::fs::read(path).map_err(|e| classify(&e))
    }

    /// [`fixture`] whose reads block like a stuck sysfs read ([`blocking_read`]), with
    /// `deadlines`.
    fn blocking_fixture(deadlines: Deadlines) -> (tempfile::TempDir, Host) {
        let (dir, host) = fixture();
        (dir, Host { reader: Reader { read_fn: blocking_read, ..Reader::default() }, ..host }.with_deadlines(deadlines))
    }

    #[test]
    fn a_stuck_read_is_abandoned_and_not_retried_until_it_returns() {
        let (dir, host) = blocking_fixture(Deadlines { read: Duration::from_secs(1), poll: Duration::from_secs(3) });
        let p = dir.path().join("sys/p");
        mkfifo(&p.join("state"));
        std::fs::write(p.join("rate"), "100 Gb/sec\n").unwrap();
        host.begin_poll();
        let started = Instant::now();
        let e = host.read_sys("p/state").unwrap_err();
        assert!(matches!(&e, ReadError::Stuck(w) if w.starts_with("no answer")), "{e}");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(host.stats.reads_abandoned.load(Ordering::Relaxed), 1);
        // Other files are read by a new thread; the stuck path is not read again.
        assert_eq!(host.read_sys("p/rate").as_deref(), Ok("100 Gb/sec\n"));
        let again = Instant::now();
        assert!(matches!(host.read_sys("p/state"), Err(ReadError::Stuck(w)) if w.contains("earlier read")));
        // Refused, not waited for (the read deadline is 1 s; a loaded machine's margin).
        assert!(again.elapsed() < Duration::from_millis(500), "refused at once");
        assert_eq!(host.stuck_reads().len(), 1);
        assert_eq!(host.stuck_reads()[0].0, p.join("state"));
        // The stuck read returns (a writer appears): the path is read again.
        std::fs::write(p.join("state"), "4: ACTIVE\n").unwrap();
        let waited = Instant::now();
        while !host.stuck_reads().is_empty() {
            assert!(waited.elapsed() < Duration::from_secs(5), "the returned read was not noticed");
            std::thread::yield_now();
        }
        host.begin_poll();
        std::fs::remove_file(p.join("state")).unwrap();
        std::fs::write(p.join("state"), "4: ACTIVE\n").unwrap();
        assert_eq!(host.read_sys("p/state").as_deref(), Ok("4: ACTIVE\n"));
    }

    #[test]
    fn a_single_read_does_not_wait_behind_a_stuck_batch() {
        let (dir, host) = blocking_fixture(Deadlines { read: Duration::from_secs(2), poll: Duration::from_secs(60) });
        let p = dir.path().join("sys/p");
        mkfifo(&p.join("counter"));
        std::fs::write(p.join("rate"), "100 Gb/sec\n").unwrap();
        host.begin_poll();
        // A batch read ahead (as the last poll's files are, while discovery reads the
        // default route) sticks on its first file.
        let pending = host.start_files(&host.file_set(vec!["p/counter".into()], false));
        let started = Instant::now();
        assert_eq!(host.read_sys("p/rate").as_deref(), Ok("100 Gb/sec\n"));
        assert!(started.elapsed() < Duration::from_secs(1), "answered before the batch's deadline");
        assert!(matches!(host.finish_files(pending).get(0), Some(Err(ReadError::Stuck(_)))));
        let stuck: Vec<PathBuf> = host.stuck_reads().into_iter().map(|(p, _)| p).collect();
        assert_eq!(stuck, vec![p.join("counter")], "only the batch's file is stuck");
        // Release the stuck reader.
        std::fs::write(p.join("counter"), "1").unwrap();
    }

    #[test]
    fn stuck_readers_are_bounded_and_the_poll_has_a_deadline() {
        let (dir, host) =
            blocking_fixture(Deadlines { read: Duration::from_millis(50), poll: Duration::from_secs(60) });
        let p = dir.path().join("sys/p");
        for i in 0..MAX_STUCK + 3 {
            mkfifo(&p.join(format!("f{i}")));
        }
        std::fs::write(p.join("ok"), "1\n").unwrap();
        host.begin_poll();
        for i in 0..MAX_STUCK + 3 {
            assert!(matches!(host.read_sys(&format!("p/f{i}")), Err(ReadError::Stuck(_))));
        }
        assert_eq!(host.stuck_reads().len(), MAX_STUCK, "no more threads than the bound");
        assert_eq!(host.stats.reads_abandoned.load(Ordering::Relaxed), MAX_STUCK as u64);
        assert!(matches!(host.read_sys("p/ok"), Err(ReadError::Stuck(w)) if w.contains("no reader thread left")));
        // The poll's deadline: once passed, reads are not even started.
        let host = host.with_deadlines(Deadlines { read: Duration::from_millis(50), poll: Duration::ZERO });
        host.begin_poll();
        assert!(matches!(host.read_sys("p/ok"), Err(ReadError::Stuck(w)) if w.contains("deadline")));
        // Release the stuck readers (a writer for each FIFO) so the test leaves no thread behind.
        for i in 0..MAX_STUCK {
            std::fs::write(p.join(format!("f{i}")), "x").unwrap();
        }
    }

    #[test]
    fn link_targets_resolve_lexically() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        std::fs::create_dir_all(sys.join("devices/pci0000:17/0000:17:01.0/0000:18:00.0")).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0",
            sys.join("bus/pci/devices/0000:18:00.0"),
        )
        .unwrap();
        let host = Host::new(sys, "/nonexistent");
        assert_eq!(
            host.link_target_sys("bus/pci/devices/0000:18:00.0").unwrap(),
            vec!["devices", "pci0000:17", "0000:17:01.0", "0000:18:00.0"]
        );
        assert_eq!(host.link_name_sys("bus/pci/devices/0000:18:00.0").as_deref(), Some("0000:18:00.0"));
        assert!(host.link_target_sys("bus/pci/devices/nope").is_none());
    }
}
