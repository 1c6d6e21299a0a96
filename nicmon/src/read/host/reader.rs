//! The reader pool and its deadlines: every read runs on a reader thread, handed over in
//! batches; the caller watches each item's deadline (per read, and per poll) and abandons a
//! read past it with its thread (marked stuck; at most [`MAX_STUCK`] at once).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, mpsc};
use std::time::{Duration, Instant};

use super::answers::Answers;
use super::file::{Past, read_regular};
use super::kept::{Got, Handle, Kept, KeptFile, KeptKey, KeptPath, read_kept};
use super::texts::{SPARES, Spares};
use super::{MAX_STUCK, PAGE, ReadError};
use crate::read::sched::Helper;

/// How long reads may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// One read (sysfs attributes normally answer in microseconds; a firmware command
    /// behind one can take seconds).
    pub read: Duration,
    /// All the reads of one poll together: past it, the poll's remaining reads are
    /// abandoned (unknown), so a cycle always completes.
    pub poll: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        // Well inside /healthz's window (3 poll intervals of at least 1 s) and SIGTERM's 5 s.
        Deadlines { read: Duration::from_millis(1000), poll: Duration::from_millis(2000) }
    }
}

/// Counts of what the reader did, for metrics and tests.
#[derive(Debug, Default)]
pub struct ReadStats {
    pub files_read: AtomicU64,
    pub einval_skipped: AtomicU64,
    /// Reads abandoned at their deadline.
    pub reads_abandoned: AtomicU64,
    /// Batches read ahead of the poll's listings and used ([`crate::read::discovery::discover`],
    /// and a targeted read's: [`super::Host::read_ahead`]).
    pub read_ahead_used: AtomicU64,
    /// Batches read ahead and dropped (the poll's files were not the same).
    pub read_ahead_dropped: AtomicU64,
    /// Full polls whose devices' plan was the last poll's, kept
    /// ([`crate::read::discovery`]'s `kept_plan`).
    pub plans_kept: AtomicU64,
    /// When `Some`: every file read is appended (benchmarks measure the open/read/close
    /// floor of exactly the files a poll reads).
    pub recorded: Mutex<Option<Vec<PathBuf>>>,
}

impl ReadStats {
    /// Whether files read are recorded ([`ReadStats::recorded`]).
    pub(super) fn recording(&self) -> bool {
        self.recorded.lock().is_ok_and(|r| r.is_some())
    }

    pub(super) fn record(&self, path: &Path) {
        if let Ok(mut r) = self.recorded.lock()
            && let Some(v) = r.as_mut()
        {
            v.push(path.to_path_buf());
        }
    }
}

/// One file of a batch handed to the reader thread.
#[derive(Debug, Clone)]
pub(super) struct Item {
    /// The directory the file is under (a file set's: the sysfs root), and its path below it
    /// split at its last `/` (both empty: `root` is the file). A set of tens of thousands of
    /// files holds the root once, each port's directory once and each file name once
    /// ([`Rels`]).
    pub(super) root: Arc<Path>,
    pub(super) dir: Arc<str>,
    pub(super) name: Arc<str>,
    pub(super) limit: usize,
    pub(super) past: Past,
    /// Keep the file open after the read and `pread` it next time ([`Kept`]).
    pub(super) keep: bool,
}

impl KeptPath for Item {
    fn rel_in<'b>(&self, buf: &'b mut String) -> &'b str {
        Item::rel_in(self, buf)
    }

    fn path(&self) -> PathBuf {
        Item::path(self)
    }

    fn bounds(&self) -> (usize, Past) {
        (self.limit, self.past)
    }
}

impl Item {
    /// The file's path.
    pub(super) fn path(&self) -> PathBuf {
        let mut buf = PathBuf::new();
        self.path_in(&mut buf);
        buf
    }

    /// The file's path, written into `buf` (no allocation once it is long enough).
    pub(super) fn path_in<'b>(&self, buf: &'b mut PathBuf) -> &'b Path {
        buf.as_mut_os_string().clear();
        buf.push(&*self.root);
        for part in [&*self.dir, &*self.name] {
            if !part.is_empty() {
                buf.push(part);
            }
        }
        buf
    }

    /// The root-relative path, written into `buf`.
    pub(super) fn rel_in<'b>(&self, buf: &'b mut String) -> &'b str {
        buf.clear();
        if !self.dir.is_empty() {
            buf.push_str(&self.dir);
            buf.push('/');
        }
        buf.push_str(&self.name);
        buf
    }

    /// The root-relative path.
    pub(super) fn rel(&self) -> String {
        let mut buf = String::with_capacity(self.dir.len() + 1 + self.name.len());
        self.rel_in(&mut buf);
        buf
    }

    /// Whether the root-relative path is `rel`: `rel` split at its last `/` is (`dir`,
    /// `name`). `name` never holds a `/` (it is what follows the last one, [`Rels::push`]),
    /// so the lengths and the two ends decide, without searching `rel` for the `/` (asked
    /// for every file of every batch).
    pub(super) fn rel_is(&self, rel: &str) -> bool {
        let (dir, name) = (self.dir.as_bytes(), self.name.as_bytes());
        let rel = rel.as_bytes();
        let Some(head) = rel.len().checked_sub(name.len()) else { return false };
        if &rel[head..] != name {
            return false;
        }
        match head.checked_sub(1) {
            // `rel` is `name` alone: it has no `/`, and `dir` is empty.
            None => dir.is_empty(),
            Some(slash) => rel[slash] == b'/' && &rel[..slash] == dir,
        }
    }

    /// The same file as `other`.
    fn same_file(&self, other: &Item) -> bool {
        self.root == other.root && self.dir == other.dir && self.name == other.name
    }
}

/// Root-relative paths split at their last `/`, each directory and each name held once (a
/// port's directory is shared by its files, a counter's name by every port's): what
/// [`super::Host::file_set_keeping`] makes a [`FileSet`] of.
#[derive(Debug, Default)]
pub struct Rels {
    dirs: InternSet,
    names: InternSet,
    pub(super) split: Vec<(Arc<str>, Arc<str>)>,
}

impl Rels {
    pub fn with_capacity(n: usize) -> Rels {
        Rels { split: Vec::with_capacity(n), ..Rels::default() }
    }

    pub fn push(&mut self, rel: &str) {
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let (dir, name) = (intern(&mut self.dirs, dir), intern(&mut self.names, name));
        self.split.push((dir, name));
    }

    pub fn len(&self) -> usize {
        self.split.len()
    }

    pub fn is_empty(&self) -> bool {
        self.split.is_empty()
    }
}

impl<S: AsRef<str>> FromIterator<S> for Rels {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Rels {
        let mut rels = Rels::default();
        for rel in iter {
            rels.push(rel.as_ref());
        }
        rels
    }
}

/// The strings [`intern`] hands out (a fast hash: these are our own paths).
type InternSet = std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>;

/// `s`, shared with the copy in `set` (added if missing).
fn intern(set: &mut InternSet, s: &str) -> Arc<str> {
    if let Some(a) = set.get(s) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(s);
    set.insert(a.clone());
    a
}

/// A batch: the thread reads its items from `start` on, in order, notes each result in
/// `progress`, and says `done` when all are read.
pub(super) struct Job {
    items: Arc<[Item]>,
    start: usize,
    progress: Arc<Progress>,
    done: mpsc::SyncSender<()>,
}

/// What the reader thread is handed.
pub(super) enum Msg {
    Job(Job),
    /// A batch is coming soon ([`Reader::expect`]): wake now and wait for it awake.
    Expect,
}

/// How long the reader thread, woken by [`Reader::expect`], waits for the batch without
/// sleeping (yielding the CPU to whatever else is runnable) before it sleeps again.
pub const EXPECT_SPIN: Duration = Duration::from_micros(500);

/// How long a batch handed to the reader thread may wait for the thread to begin it before
/// the caller brings the thread to its own CPU ([`crate::read::sched::Helper`]). A thread that was
/// awake begins within microseconds, one woken on an idle CPU within ~0.1 ms on a VM.
pub const NOT_BEGUN: Duration = Duration::from_micros(150);

/// [`NOT_BEGUN`] for a batch no wake-up waits for (a full poll's, [`PendingReads::patient`]):
/// a reader thread woken on an idle CPU of a VM may take a few hundred microseconds to run,
/// and bringing it over then costs a migration and two `sched_setaffinity` calls per poll
/// for nothing; only a batch this late (its CPU busy with something else) is brought over.
pub const PATIENT: Duration = Duration::from_millis(2);

/// How far a batch is: the item being read (its index) and since when, and the results so
/// far (by index). Uncontended locks: the caller looks only when a deadline comes.
struct Progress {
    current: Mutex<(usize, Instant)>,
    results: Mutex<Answers>,
}

/// A batch handed to the reader and not collected yet ([`Reader::start_many`]).
pub(super) struct Pending {
    pub(super) items: Arc<[Item]>,
    /// The results gathered (empty until a result has to be merged in: a batch read whole
    /// by one thread hands over its own answers).
    out: Answers,
    /// The first item not handed to a thread yet (or handed to the one in `flight`).
    next: usize,
    flight: Option<Flight>,
    lane: Lane,
    /// How long a batch may wait for its thread to begin before the thread is brought to
    /// the waiting one's CPU ([`NOT_BEGUN`], or [`PATIENT`] for a full poll's batch).
    pub(super) late: Duration,
}

/// Which reader thread a read goes to. A file set's batch may be read ahead while the
/// caller does other reads (the last poll's files while discovery reads `net/route` and
/// static attributes): those go to a thread of their own, so that a batch stuck on one
/// file does not hold them up, nor they the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lane {
    /// File sets ([`Reader::start_many`]).
    Batch = 0,
    /// Single reads ([`Reader::read`]).
    Single = 1,
}

/// The part of a [`Pending`] batch a reader thread is reading.
struct Flight {
    progress: Arc<Progress>,
    finished: mpsc::Receiver<()>,
    id: u64,
    /// When it was handed over (the thread restamps `progress.current` as it begins).
    launched: Instant,
}

impl Pending {
    /// The results gathered, one slot per item.
    fn out(&mut self) -> &mut Answers {
        if self.out.is_empty() {
            self.out.reset(self.items.len());
        }
        &mut self.out
    }

    /// Give the items from `next` on `e` as their result.
    fn fill(&mut self, e: ReadError) {
        let next = self.next;
        self.out().fail_from(next, &e);
        self.next = self.items.len();
    }

    /// Take the results the thread has stored so far.
    fn collect(&mut self, progress: &Progress) {
        let results = progress.results.lock().unwrap_or_else(|p| p.into_inner());
        self.out().take_from(&results);
    }

    /// Take the results of a thread done with its job: its answers whole when nothing was
    /// gathered before (no second copy of a batch's results).
    fn collect_done(&mut self, progress: &Progress) {
        if self.out.is_empty() {
            self.out = std::mem::take(&mut *progress.results.lock().unwrap_or_else(|p| p.into_inner()));
        } else {
            self.collect(progress);
        }
    }
}

/// Sysfs files read together ([`super::Host::start_files`]), their paths joined once: a poll's
/// batch is the same files poll after poll, so it is made once and read again and again.
/// Each path is held once, relative to the root.
#[derive(Debug)]
pub struct FileSet {
    pub(super) items: Arc<[Item]>,
}

impl FileSet {
    /// How many files.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The sysfs-relative path of file `i`.
    pub fn rel(&self, i: usize) -> Option<String> {
        self.items.get(i).map(Item::rel)
    }

    /// Whether file `i`'s sysfs-relative path is `rel`.
    pub fn rel_is(&self, i: usize, rel: &str) -> bool {
        self.items.get(i).is_some_and(|item| item.rel_is(rel))
    }

    /// Whether file `i` is kept open between reads ([`super::Host::file_set`]).
    pub fn kept(&self, i: usize) -> bool {
        self.items.get(i).is_some_and(|item| item.keep)
    }

    /// The sysfs-relative files, in read order.
    pub fn rels(&self) -> Vec<String> {
        self.items.iter().map(Item::rel).collect()
    }

    /// The same files, read the same way (kept open or not).
    pub(super) fn same_files(&self, other: &FileSet) -> bool {
        self.len() == other.len()
            && self.items.iter().zip(other.items.iter()).all(|(a, b)| a.keep == b.keep && a.same_file(b))
    }
}

/// Where each file handed to the reader goes in its set, when files of the set were left
/// out (those in the `EINVAL` memo: their result is known before reading).
pub(super) type Memo = Vec<usize>;

/// Sysfs reads begun with [`super::Host::start_files`], not collected yet.
pub struct PendingReads {
    pub(super) set: Arc<FileSet>,
    /// Only when files of the set are in the `EINVAL` memo (not handed to the reader): where
    /// each item handed to the reader goes in the set.
    pub(super) memo: Option<Memo>,
    pub(super) pending: Pending,
}

impl PendingReads {
    /// The reads of a batch no wake-up waits for: its thread is brought over only when it
    /// has not begun within [`PATIENT`].
    pub fn patient(mut self) -> PendingReads {
        self.pending.late = PATIENT;
        self
    }

    /// The files being read.
    pub fn files(&self) -> &Arc<FileSet> {
        &self.set
    }
}

/// A read that has not returned: which thread is in it, since when.
#[derive(Debug, Clone)]
pub(super) struct Stuck {
    pub(super) worker: u64,
    pub(super) since: Instant,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) stuck: Mutex<BTreeMap<PathBuf, Stuck>>,
    pub(super) kept: Mutex<Kept>,
    /// Batches whose thread was brought to the waiting thread's CPU ([`Reader::nudge`]).
    pub(super) nudged: AtomicU64,
    /// [`Kept::generation`] as last set, and the kept files that failed their read or were
    /// found removed: read by the polling thread without taking the kept files' lock (which
    /// the reader thread takes for each file it holds no handle to, [`KeptHandles`]).
    pub(super) kept_generation: AtomicU64,
    pub(super) kept_failures: AtomicU64,
}

impl Shared {
    pub(super) fn stuck(&self) -> MutexGuard<'_, BTreeMap<PathBuf, Stuck>> {
        self.stuck.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn kept(&self) -> MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep a file just opened, if the budget allows (else it is closed).
    fn keep(&self, key: KeptKey, file: KeptFile, generation: u64) {
        self.kept().put(key, file, generation);
    }
}

/// Reads files on a reader thread per [`Lane`], with a deadline. When a read passes its
/// deadline the thread is left to it (marked stuck, not joined) and the lane's next read
/// starts a new thread.
pub struct Reader {
    pub(super) shared: Arc<Shared>,
    /// Shared with the [`ReadWaker`]s handed out.
    pub(super) workers: Arc<[Worker; 2]>,
    pub(super) next_id: AtomicU64,
    pub(super) read_fn: ReadFn,
    /// Answers of batches gone, for the next ones ([`Reader::recycle`], [`super::Texts`]).
    pub(super) spares: Spares,
}

/// A lane's reader thread, if one is running: its id and its queue.
pub(super) type Worker = Mutex<Option<(u64, super::handoff::Tx<Msg>, Arc<Helper>)>>;

/// Wakes the batch lane's reader thread, if there is one, to wait awake for a batch
/// ([`Reader::expect`]); see [`super::Host::read_waker`].
#[derive(Clone)]
pub struct ReadWaker(Arc<[Worker; 2]>);

impl ReadWaker {
    pub fn wake(&self) {
        let w = self.0[Lane::Batch as usize].lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, tx, _)) = w.as_ref() {
            let _ = tx.send(Msg::Expect);
        }
    }
}

pub(super) type ReadFn = fn(&Path, usize, Past) -> Result<Vec<u8>, ReadError>;

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("stuck", &self.stuck_paths()).finish()
    }
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            shared: Arc::default(),
            workers: Default::default(),
            next_id: AtomicU64::new(1),
            read_fn: read_regular,
            spares: Spares::default(),
        }
    }
}

impl Reader {
    /// Read at most `limit` bytes of the regular file `path`, waiting at most `timeout`.
    pub(super) fn read(&self, path: &Path, limit: usize, past: Past, timeout: Duration) -> Result<Vec<u8>, ReadError> {
        let item = Item { root: Arc::from(path), dir: Arc::from(""), name: Arc::from(""), limit, past, keep: false };
        let pending = self.start_lane(Arc::from([item]), (timeout, None), Lane::Single);
        self.finish_many(pending, timeout, None).result(0).map(<[u8]>::to_vec)
    }

    /// Hand `items` to the batch lane's reader thread in one hand-off, without waiting: the
    /// thread reads them in order and answers once, when all are read (one thread wake-up
    /// each way per batch), while the caller does something else; [`Reader::finish_many`]
    /// collects. Meanwhile the collector watches the item in progress: one that has not
    /// returned within `read` of its start, or by `poll_end`, is abandoned with its thread
    /// (marked stuck, as a single read is), the items read before it keep their results,
    /// and the items after it go to a fresh thread, or are refused when the poll's deadline
    /// has passed or too many reads are stuck.
    pub(super) fn start_many(&self, items: Arc<[Item]>, read: Duration, poll_end: Option<Instant>) -> Pending {
        self.start_lane(items, (read, poll_end), Lane::Batch)
    }

    fn start_lane(&self, items: Arc<[Item]>, (read, poll_end): (Duration, Option<Instant>), lane: Lane) -> Pending {
        let n = items.len();
        let mut pending = Pending { items, out: Answers::default(), next: 0, flight: None, lane, late: NOT_BEGUN };
        if n > 0 {
            self.launch(&mut pending, read, poll_end);
        }
        pending
    }

    /// Hand the items of `p` from `p.next` on to a reader thread; `false` (the rest filled
    /// with why) when they cannot be read now.
    fn launch(&self, p: &mut Pending, read: Duration, poll_end: Option<Instant>) -> bool {
        if read.is_zero() || poll_end.is_some_and(|end| end <= Instant::now()) {
            p.fill(ReadError::Stuck("the poll's read deadline had passed: not read".into()));
            return false;
        }
        {
            let stuck = self.shared.stuck();
            if stuck.len() >= MAX_STUCK {
                let e = ReadError::Stuck(format!("{} reads are stuck: no reader thread left", stuck.len()));
                drop(stuck);
                p.fill(e);
                return false;
            }
        }
        let n = p.items.len();
        let launched = Instant::now();
        let progress =
            Arc::new(Progress { current: Mutex::new((p.next, launched)), results: Mutex::new(self.answers(n)) });
        let (done, finished) = mpsc::sync_channel(1);
        let job = Job { items: p.items.clone(), start: p.next, progress: progress.clone(), done };
        match self.submit(job, p.lane) {
            Ok(id) => {
                p.flight = Some(Flight { progress, finished, id, launched });
                true
            }
            Err(e) => {
                p.fill(e);
                false
            }
        }
    }

    /// Answers for a batch of `n` items: an earlier batch's buffers when they were given back
    /// ([`Reader::recycle`]).
    pub(super) fn answers(&self, n: usize) -> Answers {
        let spare = self.spares.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            Some(mut a) => {
                a.reset(n);
                a
            }
            None => Answers::for_items(n),
        }
    }

    /// A batch's answers, no longer needed: their buffers serve a later batch (unless they
    /// are too large to keep between batches, [`Answers::worth_keeping`]).
    pub(super) fn recycle(&self, answers: Answers) {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        if answers.worth_keeping() && spares.len() < SPARES {
            spares.push(answers);
        }
    }

    /// Wait for the reads of `p` (see [`Reader::start_many`]); an answer for each of its
    /// items, by index (an item left unread: [`Answers::result`] says so).
    pub(super) fn finish_many(&self, mut p: Pending, read: Duration, poll_end: Option<Instant>) -> Answers {
        let n = p.items.len();
        'batches: while p.next < n {
            let Some(Flight { progress, finished, id, launched }) = p.flight.take() else {
                if self.launch(&mut p, read, poll_end) {
                    continue;
                }
                break;
            };
            let mut nudge = Some(launched + p.late);
            loop {
                let (current, since) = *progress.current.lock().unwrap_or_else(|p| p.into_inner());
                let mut until = since + read;
                if let Some(end) = poll_end {
                    until = until.min(end);
                }
                // Not begun yet: wake when the nudge is due first.
                let nudge_due = nudge.filter(|n| since == launched && *n < until);
                match finished.recv_timeout(nudge_due.unwrap_or(until).saturating_duration_since(Instant::now())) {
                    Ok(()) => {
                        p.collect_done(&progress);
                        break 'batches;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) if nudge_due.is_some() => {
                        nudge = None;
                        self.nudge(p.lane, id, &progress, launched);
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        p.collect(&progress);
                        p.next = p.out().first_unanswered();
                        p.fill(ReadError::Io("the reader thread ended".into()));
                        break 'batches;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let mut stuck = self.shared.stuck();
                        // The thread stores each result while holding this lock: either the
                        // item was answered before we took it (it moved on: keep waiting), or
                        // the thread will find the path marked stuck and end.
                        if finished.try_recv().is_ok() {
                            drop(stuck);
                            p.collect(&progress);
                            break 'batches;
                        }
                        let (now_at, now_since) = *progress.current.lock().unwrap_or_else(|p| p.into_inner());
                        let answered = progress.results.lock().unwrap_or_else(|p| p.into_inner()).is_answered(current);
                        if answered || now_at != current || now_since != since {
                            continue;
                        }
                        let path = p.items[current].path();
                        stuck.insert(path.clone(), Stuck { worker: id, since });
                        drop(stuck);
                        let mut w = self.workers[p.lane as usize].lock().unwrap_or_else(|p| p.into_inner());
                        if w.as_ref().is_some_and(|(wid, _, _)| *wid == id) {
                            *w = None;
                        }
                        drop(w);
                        let waited = since.elapsed();
                        tracing::warn!(
                            path = %path.display(),
                            timeout = ?waited,
                            "read did not return in time: abandoned for this poll, not retried until it returns"
                        );
                        p.collect(&progress);
                        p.out().put(current, Err(ReadError::Stuck(format!("no answer within {waited:.1?}"))));
                        p.next = current + 1;
                        continue 'batches;
                    }
                }
            }
        }
        p.out();
        p.out
    }

    /// A batch handed to thread `id` of `lane` [`NOT_BEGUN`] ago that it has not begun: the
    /// thread waits for a busy CPU (see [`Helper`]) — bring it to this thread's, which
    /// this thread leaves to it while it waits. Counted in `nudged`.
    fn nudge(&self, lane: Lane, id: u64, progress: &Progress, launched: Instant) {
        let w = self.workers[lane as usize].lock().unwrap_or_else(|p| p.into_inner());
        let Some((wid, _, helper)) = w.as_ref() else { return };
        let begun = progress.current.lock().unwrap_or_else(|p| p.into_inner()).1 != launched;
        if *wid == id && !begun && helper.bring_here() {
            self.shared.nudged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hand `job` to `lane`'s reader thread (starting one if needed); its id.
    fn submit(&self, job: Job, lane: Lane) -> Result<u64, ReadError> {
        let mut w = self.workers[lane as usize].lock().unwrap_or_else(|p| p.into_inner());
        let mut job = job;
        for _ in 0..2 {
            if w.is_none() {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let (tx, rx) = super::handoff::queue::<Msg>();
                let shared = Arc::clone(&self.shared);
                let read_fn = self.read_fn;
                let helper = Arc::new(Helper::default());
                let place = Arc::clone(&helper);
                std::thread::Builder::new()
                    .name("nicmon-read".into())
                    .spawn(move || {
                        place.register();
                        reader_thread(id, &rx, &shared, read_fn, &place)
                    })
                    .map_err(|e| ReadError::Io(format!("cannot start a reader thread: {e}")))?;
                *w = Some((id, tx, helper));
            }
            let (id, tx, _) = w.as_ref().expect("set above");
            match tx.send(Msg::Job(job)) {
                Ok(()) => return Ok(*id),
                Err(Msg::Job(back)) => {
                    job = back;
                    *w = None;
                }
                Err(Msg::Expect) => unreachable!("a job was sent"),
            }
        }
        Err(ReadError::Io("no reader thread".into()))
    }

    /// A batch is coming soon (a wake-up's targeted read is being planned): the reader
    /// thread, if there is one, wakes now — the caller's planning hides its wake-up (on an
    /// idle virtual machine, waking a halted vCPU costs ~0.1 ms) — and waits for the batch
    /// awake for at most [`EXPECT_SPIN`].
    pub(super) fn expect(&self) {
        self.waker().wake();
    }

    /// A handle that does [`Reader::expect`] from elsewhere (another task, before the
    /// caller knows a batch is coming for sure).
    pub(super) fn waker(&self) -> ReadWaker {
        ReadWaker(Arc::clone(&self.workers))
    }

    /// Paths whose read has not returned, with how long ago it started.
    pub fn stuck_paths(&self) -> Vec<(PathBuf, Duration)> {
        self.shared.stuck().iter().map(|(p, s)| (p.clone(), s.since.elapsed())).collect()
    }

    /// Close the kept-open files whose root-relative path starts with `prefix` (all of
    /// them: `None`).
    pub(super) fn forget_kept(&self, prefix: Option<&str>) {
        let mut k = self.shared.kept();
        k.generation = k.generation.wrapping_add(1);
        self.shared.kept_generation.store(k.generation, Ordering::Relaxed);
        match prefix {
            None => k.files.clear(),
            Some(p) => k.files.retain(|key, _| !Path::new(&*key.0).starts_with(p)),
        }
        k.changed();
    }

    /// Close the kept-open files that are not among `items`.
    pub(super) fn keep_only(&self, items: &[Item]) {
        let wanted: std::collections::HashSet<(&str, &str), foldhash::fast::RandomState> =
            items.iter().map(|i| (&*i.dir, &*i.name)).collect();
        let mut k = self.shared.kept();
        let before = k.files.len();
        k.files.retain(|key, _| wanted.contains(&key.0.rsplit_once('/').unwrap_or(("", &key.0))));
        if k.files.len() != before {
            k.generation = k.generation.wrapping_add(1);
            self.shared.kept_generation.store(k.generation, Ordering::Relaxed);
            k.changed();
        }
    }

    pub(super) fn kept_count(&self) -> usize {
        self.shared.kept().files.len()
    }
}

/// The next batch for the reader thread; `None` once the reader is gone. Woken by
/// [`Msg::Expect`], it waits for the batch awake (yielding the CPU) for [`EXPECT_SPIN`].
fn next_job(jobs: &super::handoff::Rx<Msg>) -> Option<Job> {
    let mut awake_until: Option<Instant> = None;
    loop {
        let msg = match awake_until {
            None => jobs.recv()?,
            Some(until) => match jobs.try_recv() {
                Ok(msg) => msg,
                Err(super::handoff::Empty::Closed) => return None,
                Err(super::handoff::Empty::Now) => {
                    if Instant::now() >= until {
                        awake_until = None;
                    } else {
                        std::thread::yield_now();
                    }
                    continue;
                }
            },
        };
        match msg {
            Msg::Job(job) => return Some(job),
            Msg::Expect => awake_until = Some(Instant::now() + EXPECT_SPIN),
        }
    }
}

fn reader_thread(id: u64, jobs: &super::handoff::Rx<Msg>, shared: &Shared, read_fn: ReadFn, place: &Helper) {
    // The first read of a kept file lands here (on the heap, zeroed once per thread).
    let mut scratch = vec![0u8; PAGE + 1].into_boxed_slice();
    let mut path_buf = PathBuf::new();
    let mut rel_buf = String::new();
    let mut handles = KeptHandles::default();
    while let Some(job) = next_job(jobs) {
        place.begin_work();
        if job.items[job.start..].iter().any(|item| item.keep) {
            let mut kept = shared.kept();
            kept.drop_changed();
            handles.follow(job.items.len(), kept.version);
        }
        for (index, item) in job.items.iter().enumerate().skip(job.start) {
            let started = Instant::now();
            *job.progress.current.lock().unwrap_or_else(|p| p.into_inner()) = (index, started);
            // The path is made only where it is asked for: a read stuck somewhere (looked
            // up by path), a file read once or opened anew. A kept file's `pread` needs none.
            let earlier = {
                let stuck = shared.stuck();
                match stuck.is_empty() {
                    true => None,
                    false => stuck.get(item.path_in(&mut path_buf)).map(|s| s.since.elapsed()),
                }
            };
            if let Some(ago) = earlier {
                let e = ReadError::Stuck(format!(
                    "an earlier read has not returned ({ago:.1?} ago): not read again until it does"
                ));
                job.progress.results.lock().unwrap_or_else(|p| p.into_inner()).put(index, Err(e));
                continue;
            }
            let (result, keep) = if item.keep {
                let kept = (&shared.kept, &shared.kept_failures);
                let mut none = None;
                let slot = handles.at(index, item).unwrap_or(&mut none);
                read_kept(kept, (item, &mut rel_buf), slot, (&mut scratch, started))
            } else {
                (read_fn(item.path_in(&mut path_buf), item.limit, item.past).map(Got::Owned), None)
            };
            let mut stuck = shared.stuck();
            {
                let mut results = job.progress.results.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(got) => results.put(index, Ok(got.bytes(&scratch))),
                    Err(e) => results.put(index, Err(e)),
                }
            }
            if !stuck.is_empty() && stuck.get(item.path_in(&mut path_buf)).is_some_and(|s| s.worker == id) {
                let s = stuck.remove(item.path_in(&mut path_buf)).expect("checked above");
                tracing::info!(path = %item.path().display(), after = ?s.since.elapsed(), "a stuck read returned");
                // Abandoned: a newer thread serves the reader now (and the rest of this
                // batch was handed to it). A file it had kept is closed here.
                return;
            }
            drop(stuck);
            if let Some((file, generation)) = keep {
                shared.keep(KeptKey(Arc::from(item.rel_in(&mut rel_buf))), file, generation);
            }
        }
        let _ = job.done.send(());
    }
}

/// A reader thread's handles to the kept files it read last, by their index in the batch:
/// while the kept files stay as they were ([`Kept::version`]), a kept file's read takes its
/// handle here when the handle at its index is for its path (a batch of the same files as
/// the last one: every handle), instead of looking the path up in the shared map (a lock,
/// the path written out, hashed and compared, per file). Whatever changes the map bumps the
/// version; every handle is then dropped at the next batch.
#[derive(Default)]
pub(super) struct KeptHandles {
    version: u64,
    slots: Vec<HandleSlot>,
}

/// One index of [`KeptHandles`]: the handle, and the item (its directory and name, the file
/// set's shared strings, held here) it was last handed out for — the handle is for nothing
/// but that item's path. The next batch of the same file set (a quiet node's every poll) has
/// the same strings at that index: known by their addresses, no path compared.
#[derive(Default, Clone)]
struct HandleSlot {
    handle: Option<Handle>,
    item: Option<(Arc<str>, Arc<str>)>,
}

impl KeptHandles {
    /// A batch of `len` files under the kept files' `version`. A batch of more than
    /// [`HANDLES_MAX`] files holds no handles.
    fn follow(&mut self, len: usize, version: u64) {
        if self.version != version {
            self.version = version;
            self.slots.clear();
        }
        match len <= HANDLES_MAX {
            true => self.slots.resize(len, HandleSlot::default()),
            false => self.slots = Vec::new(),
        }
    }

    /// The slot of the file at `index` (none past the batch, or in a batch without
    /// handles), emptied unless it holds `item`'s handle.
    fn at(&mut self, index: usize, item: &Item) -> Option<&mut Option<Handle>> {
        let slot = self.slots.get_mut(index)?;
        let same_item =
            slot.item.as_ref().is_some_and(|(d, n)| Arc::ptr_eq(d, &item.dir) && Arc::ptr_eq(n, &item.name));
        if !same_item {
            if slot.handle.as_ref().is_some_and(|(key, _)| !item.rel_is(&key.0)) {
                slot.handle = None;
            }
            slot.item = Some((Arc::clone(&item.dir), Arc::clone(&item.name)));
        }
        Some(&mut slot.handle)
    }
}

/// The most files of a batch whose kept files' handles a reader thread holds (24 bytes
/// each): a node's poll reads a few hundred (12 NICs: 312); a device of a thousand ports,
/// ~26,000 files per poll, reads through the map rather than hold ~0.6 MiB of handles.
const HANDLES_MAX: usize = 2048;

/// How long [`read_file`] waits for one file.
pub const FILE_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Read a whole file nicmon reads outside sysfs (state, config, metadata, `--kmsg`): only a
/// regular file, at most `limit` bytes (more is [`ReadError::TooLarge`]), within
/// [`FILE_READ_TIMEOUT`] — the same rules as sysfs reads, on a shared reader.
pub fn read_file(path: &Path, limit: usize) -> Result<Vec<u8>, ReadError> {
    static FILES: OnceLock<Reader> = OnceLock::new();
    FILES.get_or_init(Reader::default).read(path, limit, Past::Error, FILE_READ_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
        // SAFETY: a zeroed set with CPUs below CPU_SETSIZE set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for c in cpus {
                libc::CPU_SET(*c, &mut set);
            }
            set
        }
    }

    fn pin(tid: i32, cpu: usize) -> bool {
        // SAFETY: sched_setaffinity(2) of a thread of this process with a valid set.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &cpu_set(&[cpu])) == 0 }
    }

    /// A reader thread queued on a CPU that does not let it run (here a real-time spinner;
    /// on a node a kernel thread, a long system call, a preempted vCPU) is brought to the
    /// waiting thread's CPU: the batch is read at once, not when that CPU frees up (the
    /// spinner holds it for up to 2 s; the fair class gets it back after ~0.95 s).
    #[test]
    fn kept_handles_stand_only_for_their_paths_under_the_same_kept_files() {
        let item = |name: &str| Item {
            root: Arc::from(Path::new("/sys")),
            dir: Arc::from("class/infiniband/mlx5_0/ports/1"),
            name: Arc::from(name),
            limit: 64,
            past: Past::Error,
            keep: true,
        };
        let handle = |item: &Item| {
            let file = KeptFile::of(std::fs::File::open("/dev/null").unwrap());
            Some((KeptKey(Arc::from(item.rel())), Arc::new(file)))
        };
        let (state, phys) = (item("state"), item("phys_state"));
        let mut handles = KeptHandles::default();
        let held = |h: &mut KeptHandles, i: usize, item: &Item| h.at(i, item).is_some_and(|slot| slot.is_some());
        handles.follow(2, 7);
        assert!(!held(&mut handles, 0, &state) && !held(&mut handles, 1, &phys), "none at first");
        *handles.at(1, &phys).unwrap() = handle(&phys);
        handles.follow(2, 7);
        assert!(held(&mut handles, 1, &phys), "the same file at the same index, the kept files unchanged: kept");
        assert!(!held(&mut handles, 1, &state), "another file at that index: not its handle");
        *handles.at(1, &phys).unwrap() = handle(&phys);
        let phys_anew = item("phys_state");
        assert!(held(&mut handles, 1, &phys_anew), "the same path in another file set's strings: its handle");
        assert!(held(&mut handles, 1, &phys), "the first strings again: still its handle");
        assert!(!held(&mut handles, 1, &state), "then another file: not its handle");
        *handles.at(0, &state).unwrap() = handle(&state);
        handles.follow(1, 8);
        assert!(!held(&mut handles, 0, &state), "a change to the kept files drops every handle");
        assert!(handles.at(5, &state).is_none(), "past the batch: no slot");
        *handles.at(0, &state).unwrap() = handle(&state);
        handles.follow(HANDLES_MAX + 1, 8);
        assert!(handles.at(0, &state).is_none(), "a batch past the bound holds no handles");
        let mut kept_files = Kept::default();
        let before = kept_files.version;
        kept_files.put(KeptKey(Arc::from("a")), KeptFile::of(std::fs::File::open("/dev/null").unwrap()), 0);
        assert_ne!(kept_files.version, before, "keeping a file is a change");
    }

    proptest::proptest! {
        /// `rel_is` answers as splitting `rel` at its last `/` would, for every item
        /// [`Rels`] makes (its name never holds a `/`).
        #[test]
        fn rel_is_is_the_split_at_the_last_slash(made in "[a/]{0,6}", rel in "[a/]{0,6}") {
            let mut rels = Rels::default();
            rels.push(&made);
            let (dir, name) = rels.split[0].clone();
            let item = Item { root: Arc::from(Path::new("/sys")), dir, name, limit: 8, past: Past::Error, keep: true };
            let split = match rel.rsplit_once('/') {
                Some((d, n)) => *item.dir == *d && *item.name == *n,
                None => item.dir.is_empty() && *item.name == *rel,
            };
            proptest::prop_assert_eq!(item.rel_is(&rel), split, "made {:?} rel {:?}", made, rel);
        }
    }

    #[test]
    fn a_reader_queued_behind_a_busy_cpu_is_brought_to_the_waiting_one() {
        // SAFETY: sched_getaffinity(2) of the calling thread into a zeroed set.
        let cpus: Vec<usize> = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            (0..libc::CPU_SETSIZE as usize).filter(|c| libc::CPU_ISSET(*c, &set)).collect()
        };
        if cpus.len() < 2 {
            eprintln!("skipped: one CPU, nowhere to bring a reader thread");
            return;
        }
        let (busy, mine) = (cpus[0], cpus[1]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state");
        std::fs::write(&file, "4: ACTIVE\n").unwrap();
        std::thread::spawn(move || {
            assert!(pin(0, mine));
            let reader = Reader::default();
            // The single lane's thread starts with a first read.
            let first = reader.read(&file, 64, Past::Error, Duration::from_secs(5));
            assert_eq!(first.as_deref(), Ok(&b"4: ACTIVE\n"[..]));
            let tid = reader.workers[Lane::Single as usize].lock().unwrap().as_ref().map(|(_, _, h)| h.tid()).unwrap();
            let before = reader.shared.nudged.load(Ordering::Relaxed);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (ready, spinning) = mpsc::channel();
            let halt = Arc::clone(&stop);
            let spinner = std::thread::spawn(move || {
                let param = libc::sched_param { sched_priority: 1 };
                // SAFETY: sched_setscheduler(2) of the calling thread with a valid param.
                let rt = pin(0, busy) && unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
                ready.send(rt).unwrap();
                let until = Instant::now() + Duration::from_secs(2);
                while rt && !halt.load(Ordering::Relaxed) && Instant::now() < until {
                    std::hint::spin_loop();
                }
            });
            if !spinning.recv().unwrap() {
                eprintln!("skipped: a real-time thread is not allowed here (SCHED_FIFO refused)");
                return;
            }
            assert!(pin(tid, busy), "the reader thread pinned beside the spinner");
            let start = Instant::now();
            let read = reader.read(&file, 64, Past::Error, Duration::from_secs(5));
            let took = start.elapsed();
            stop.store(true, Ordering::Relaxed);
            spinner.join().unwrap();
            assert_eq!(read.as_deref(), Ok(&b"4: ACTIVE\n"[..]));
            assert!(took < Duration::from_millis(300), "the read waited for the busy CPU: {took:?}");
            assert!(reader.shared.nudged.load(Ordering::Relaxed) > before, "brought over");
        })
        .join()
        .unwrap();
    }
}
