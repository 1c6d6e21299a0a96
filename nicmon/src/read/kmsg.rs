//! Reading the kernel log: a thread tailing `/dev/kmsg`, and files for `--kmsg FILE`.
//!
//! Where a fresh watcher starts: with a cursor (a `last_seq` from the state file, same
//! boot) it starts at the oldest record in the ring (`SEEK_SET`) and skips records at or
//! before the cursor, so records written while nicmon was stopped are still reported.
//! (Not `SEEK_DATA`: the kernel's `devkmsg_llseek` takes that to the last `dmesg -C`
//! clear point, which would silently skip records after an operator cleared the log.) Without one
//! (first start in this boot, or the state was lost) it starts at `SEEK_END`: replaying
//! the whole boot's ring on a long-running node would report failures that happened,
//! and were handled, before nicmon was deployed.
//!
//! The thread reads every available record (one per `read()` on the device; a read holding
//! several gives each), hands them over in batches (at most [`MAX_BATCH`] records and
//! [`MAX_BATCH_BYTES`] of text each), then sleeps in `poll(2)` until the kernel has more or
//! it is told to stop. No decisions here: matching happens in [`crate::decide::kmsg::process`].
//!
//! Instead of the device (`--kmsg-path`, for tests, replays into a running daemon, or a
//! kernel log another agent writes), either is read as a stream of lines in either format
//! of [`parse_text`] (a record may span reads; an incomplete last line waits for the rest):
//! - a FIFO, opened read-write so that it never reports end of file when a writer closes;
//! - a regular file, followed like `tail -F`: read to its end, then wait for `inotify` to
//!   say it changed (or [`FILE_RECHECK`] at the latest, for filesystems without inotify
//!   events): never a busy loop. A file that shrank (truncated) is read again from its
//!   start; one replaced at the path (rotated) is reopened and read from its start. Where it
//!   starts is the device's rule: at its end without a cursor, at its start with one
//!   (records at or before the cursor skipped; plain lines carry no sequence number and
//!   are taken again).
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use crate::model::Snapshot;
use crate::model::kmsg::{Departed, HostLinks, Record, card_of, parse_records, parse_text};

/// The device file.
pub const DEV_KMSG: &str = "/dev/kmsg";
/// Larger than the kernel's longest record (`PRINTK_MESSAGE_MAX`, 2 KiB, plus the dict):
/// a smaller buffer makes `read()` fail with `EINVAL`.
const READ_BUF: usize = 16 * 1024;

/// The largest `--kmsg FILE` read by `nicmon check`.
pub const FILE_MAX_BYTES: usize = 16 << 20;
/// The most records handed over at once (a flood is handed over in parts).
pub const MAX_BATCH: usize = 4096;
/// The most message text handed over at once: a batch of long lines stays small.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// A followed regular file is looked at again after this long even without an inotify
/// event (filesystems that send none; rotation checks).
pub const FILE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The most records kept waiting for a committed poll (while the outbox is full): beyond
/// it, or beyond [`MAX_PENDING_BYTES`] of text, the oldest are dropped, as the kernel's
/// ring drops its oldest (their sequence gap counts them as lost).
pub const MAX_PENDING_RECORDS: usize = 8192;
/// See [`MAX_PENDING_RECORDS`].
pub const MAX_PENDING_BYTES: usize = 2 << 20;

/// Drop the oldest of `records` beyond [`MAX_PENDING_RECORDS`] and [`MAX_PENDING_BYTES`];
/// how many were dropped.
pub fn keep_newest(records: &mut Vec<Record>) -> usize {
    let mut bytes = 0usize;
    let keep = records
        .iter()
        .rev()
        .take(MAX_PENDING_RECORDS)
        .take_while(|r| {
            bytes = bytes.saturating_add(r.text.len());
            bytes <= MAX_PENDING_BYTES
        })
        .count();
    let drop = records.len() - keep;
    records.drain(..drop);
    drop
}

/// What is tailed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The kernel log device: one record per `read()`, seekable to its ring's ends.
    Device,
    /// A FIFO: a stream of lines, never at end of file.
    Fifo,
    /// A regular file: lines, followed as it grows.
    File,
}

/// Where a new tail starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Only records written from now on (`SEEK_END`).
    End,
    /// The oldest record still in the ring (`SEEK_SET`), skipping sequence numbers up to
    /// and including the cursor.
    After(u64),
}

impl Start {
    /// The start matching a persisted cursor.
    pub fn from_cursor(last_seq: Option<u64>) -> Start {
        last_seq.map_or(Start::End, Start::After)
    }
}

/// What the tail thread hands over.
#[derive(Debug)]
pub enum Delivery {
    /// Records in kernel order (at least one).
    Records(Vec<Record>),
    /// Reading failed for good; the thread ends after this.
    Failed(io::Error),
}

/// A running `/dev/kmsg` tail. Dropping it stops the thread.
pub struct KmsgTail {
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    overruns: Arc<AtomicU64>,
}

impl KmsgTail {
    /// Open `path` (normally [`DEV_KMSG`]) and start the thread. Each batch goes to
    /// `sink`; when `sink` returns `false` the thread ends. Opening and seeking errors are
    /// returned here; later read errors arrive as [`Delivery::Failed`].
    pub fn spawn(
        path: impl AsRef<Path>,
        start: Start,
        mut sink: impl FnMut(Delivery) -> bool + Send + 'static,
    ) -> io::Result<KmsgTail> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let path: PathBuf = path.as_ref().to_path_buf();
        let md = std::fs::metadata(&path)?;
        let kind = md.file_type();
        // The kernel log device is char 1:11 wherever it is mounted; any other device (a
        // link to /dev/zero) would be read forever.
        if kind.is_char_device() && (libc::major(md.rdev()), libc::minor(md.rdev())) != (1, 11) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a character device {}:{}, not the kernel log (1:11)",
                    path.display(),
                    libc::major(md.rdev()),
                    libc::minor(md.rdev())
                ),
            ));
        }
        if !kind.is_char_device() && !kind.is_fifo() && !kind.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not the kernel log device nor a FIFO", path.display()),
            ));
        }
        let kind = if kind.is_fifo() {
            Kind::Fifo
        } else if kind.is_file() {
            Kind::File
        } else {
            Kind::Device
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(kind == Kind::Fifo)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)?;
        let mut follow = None;
        if kind != Kind::Fifo {
            let whence = match start {
                Start::End => libc::SEEK_END,
                Start::After(_) => libc::SEEK_SET,
            };
            // SAFETY: lseek on a descriptor we own; no memory is passed.
            let at = unsafe { libc::lseek(file.as_raw_fd(), 0, whence) };
            if at < 0 {
                return Err(io::Error::last_os_error());
            }
            if kind == Kind::File {
                follow = Some(Follow::new(path.clone(), &file, at as u64)?);
            }
        }
        let stop = Arc::new(eventfd()?);
        let overruns = Arc::new(AtomicU64::new(0));
        let cursor = match start {
            Start::End => None,
            Start::After(c) => Some(c),
        };
        let (stop_t, overruns_t) = (Arc::clone(&stop), Arc::clone(&overruns));
        let thread = std::thread::Builder::new()
            .name("kmsg-tail".into())
            .spawn(move || tail(file, kind, follow, cursor, &stop_t, &overruns_t, &mut sink))?;
        Ok(KmsgTail { stop, thread: Some(thread), overruns })
    }

    /// A tail that sends into a `std::sync::mpsc` channel.
    pub fn spawn_channel(
        path: impl AsRef<Path>,
        start: Start,
    ) -> io::Result<(KmsgTail, std::sync::mpsc::Receiver<Delivery>)> {
        let (tx, rx) = std::sync::mpsc::channel();
        let tail = KmsgTail::spawn(path, start, move |d| tx.send(d).is_ok())?;
        Ok((tail, rx))
    }

    /// How many times `read()` reported overwritten records (`EPIPE`). How many records
    /// were lost is counted from the sequence gap, in [`crate::decide::kmsg::KmsgState::lost_records`].
    pub fn overruns(&self) -> u64 {
        self.overruns.load(Ordering::Relaxed)
    }

    /// Stop the thread and wait for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), std::mem::size_of::<u64>());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KmsgTail {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the descriptor is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A followed regular file: where it is, which file it is, and its inotify watch.
struct Follow {
    path: PathBuf,
    /// `(st_dev, st_ino)` of the open file: another one at the path means it was rotated.
    id: (u64, u64),
    /// Bytes read so far: a file shorter than this was truncated.
    offset: u64,
    /// `None` where inotify is not available: the file is looked at every [`FILE_RECHECK`].
    inotify: Option<inotify::Inotify>,
}

impl Follow {
    fn new(path: PathBuf, file: &File, offset: u64) -> io::Result<Follow> {
        use std::os::unix::fs::MetadataExt;
        let md = file.metadata()?;
        let inotify = inotify::Inotify::init().ok().and_then(|i| {
            let mask = inotify::WatchMask::MODIFY
                | inotify::WatchMask::ATTRIB
                | inotify::WatchMask::CLOSE_WRITE
                | inotify::WatchMask::MOVE_SELF
                | inotify::WatchMask::DELETE_SELF;
            i.watches().add(&path, mask).ok().map(|_| i)
        });
        Ok(Follow { path, id: (md.dev(), md.ino()), offset, inotify })
    }

    /// Sleep until the file may have changed (`true`) or `stop` is signalled (`false`).
    fn wait(&mut self, stop: RawFd) -> io::Result<bool> {
        let watch = self.inotify.as_ref().map_or(-1, |i| i.as_raw_fd());
        let mut fds = [
            libc::pollfd { fd: watch, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: fds is a live array of two pollfd (a negative fd is ignored by poll).
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, FILE_RECHECK.as_millis() as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(true) } else { Err(e) };
        }
        if fds[1].revents != 0 {
            return Ok(false);
        }
        if let Some(i) = self.inotify.as_mut() {
            // Drain the events: what changed is found by reading the file.
            let mut buf = [0u8; 1024];
            while i.read_events(&mut buf).is_ok_and(|ev| ev.count() > 0) {}
        }
        Ok(true)
    }

    /// After a wait: the file to read from now (`Some` when the path now holds another
    /// file), or the same one rewound when it was truncated. `partial` is dropped then.
    fn check(&mut self, file: &File, partial: &mut Vec<u8>) -> io::Result<Option<File>> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(md) if md.is_file() && (md.dev(), md.ino()) != self.id => {
                let new = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                    .open(&self.path)?;
                *self = Follow::new(self.path.clone(), &new, 0)?;
                partial.clear();
                Ok(Some(new))
            }
            _ => {
                if file.metadata()?.len() < self.offset {
                    // SAFETY: lseek on a descriptor we own; no memory is passed.
                    if unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_SET) } < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    self.offset = 0;
                    partial.clear();
                }
                Ok(None)
            }
        }
    }
}

/// A FIFO or a regular file is read as lines (a record may span reads; an incomplete last
/// line waits for the next read); the device as one record per `read()`.
fn tail(
    mut file: File,
    kind: Kind,
    mut follow: Option<Follow>,
    cursor: Option<u64>,
    stop: &OwnedFd,
    overruns: &AtomicU64,
    sink: &mut dyn FnMut(Delivery) -> bool,
) {
    let mut buf = vec![0u8; READ_BUF];
    let mut partial: Vec<u8> = Vec::new();
    let after_cursor = |rec: &Record| !matches!((cursor, rec.seq), (Some(c), Some(s)) if s <= c);
    loop {
        let fd = file.as_raw_fd();
        let mut batch = Vec::new();
        let mut bytes = 0;
        let mut full = false;
        let failure = loop {
            if batch.len() >= MAX_BATCH || bytes >= MAX_BATCH_BYTES {
                full = true;
                break None;
            }
            let got = match read_one(fd, &mut buf) {
                Ok(Some(n)) if kind != Kind::Device => {
                    if let Some(f) = follow.as_mut() {
                        f.offset += n as u64;
                    }
                    partial.extend_from_slice(&buf[..n]);
                    let end = match partial.iter().rposition(|b| *b == b'\n') {
                        Some(end) => end + 1,
                        // A line longer than any kernel record: taken as it is, so that a
                        // writer without newlines cannot grow the buffer without bound.
                        None if partial.len() >= READ_BUF => partial.len(),
                        None => continue,
                    };
                    let lines: Vec<u8> = partial.drain(..end).collect();
                    parse_text(&lines)
                }
                Ok(Some(n)) => parse_records(&buf[..n]),
                Ok(None) => break None,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    // Records were overwritten; the next read returns the oldest left.
                    overruns.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Some(e),
            };
            for rec in got.into_iter().filter(after_cursor) {
                bytes += rec.text.len();
                batch.push(rec);
            }
        };
        if !batch.is_empty() && !sink(Delivery::Records(batch)) {
            return;
        }
        if let Some(e) = failure {
            sink(Delivery::Failed(e));
            return;
        }
        if full {
            // More is there already: hand it over without waiting.
            continue;
        }
        let waited = match follow.as_mut() {
            Some(f) => f.wait(stop.as_raw_fd()).and_then(|go| {
                if go && let Some(new) = f.check(&file, &mut partial)? {
                    file = new;
                }
                Ok(go)
            }),
            None => wait(fd, stop.as_raw_fd()),
        };
        match waited {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                sink(Delivery::Failed(e));
                return;
            }
        }
    }
}

/// One record, or `None` when there is none yet (`EAGAIN`).
fn read_one(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: reads at most buf.len() bytes into buf.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    if n == 0 {
        return Ok(None);
    }
    Ok(Some(n as usize))
}

/// Sleep until `fd` is readable (`true`) or `stop` is signalled (`false`).
fn wait(fd: RawFd, stop: RawFd) -> io::Result<bool> {
    loop {
        let mut fds = [
            libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: fds is a live array of two pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 {
            return Ok(false);
        }
        if fds[0].revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
            // POLLERR also signals an overrun: the next read reports EPIPE.
            return Ok(true);
        }
        if fds[0].revents & libc::POLLNVAL != 0 {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
    }
}

/// The records of a file for `nicmon check --kmsg FILE` (either format, see
/// [`parse_text`]).
pub fn read_file(path: impl AsRef<Path>) -> io::Result<Vec<Record>> {
    let path = path.as_ref();
    let bytes = crate::read::host::read_file(path, FILE_MAX_BYTES).map_err(|e| e.into_io(path))?;
    Ok(parse_text(&bytes))
}

impl HostLinks {
    /// Read the facts the index needs beyond the snapshot, through the host reader: each
    /// netdev's `ifindex` and the PCI bridges above each device (nearest first), departed
    /// devices included while their PCI function is still on the bus. Unreadable values
    /// are left out.
    pub fn read(host: &crate::read::host::Host, snapshot: &Snapshot, departed: Vec<Departed>) -> HostLinks {
        let mut links = HostLinks::default();
        for d in &snapshot.devices {
            if let Some(n) = &d.netdev
                && let Ok(s) = host.read_sys(&format!("class/net/{n}/ifindex"))
                && let Ok(i) = s.trim().parse()
            {
                links.ifindex.insert(n.clone(), i);
            }
        }
        let functions = snapshot
            .devices
            .iter()
            .map(|d| (&d.name, &d.pci_address))
            .chain(departed.iter().map(|p| (&p.device, &p.pci_address)));
        for (name, pci) in functions {
            if let Some(bdf) = pci
                && let Some(node) = crate::read::discovery::pci_node(host, bdf)
            {
                let bridges: Vec<String> =
                    node.path.iter().rev().skip(1).filter(|n| card_of(n).is_some() && n.len() == 12).cloned().collect();
                if !bridges.is_empty() {
                    links.bridges.insert(name.clone(), bridges);
                }
            }
        }
        links.departed = departed;
        links
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_links_from_a_sysfs_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let dev = root.join("devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&dev, root.join("bus/pci/devices/0000:03:00.0")).unwrap();
        std::fs::create_dir_all(root.join("class/net/ib0")).unwrap();
        std::fs::write(root.join("class/net/ib0/ifindex"), "7\n").unwrap();
        let snap = Snapshot {
            devices: vec![
                crate::model::Device {
                    pci_address: Some("0000:03:00.0".into()),
                    card: Some("0000:03:00".into()),
                    netdev: Some("ib0".into()),
                    ..crate::model::Device::pf("mlx5_0", vec![])
                }
                .into(),
            ],
            ..Default::default()
        };
        let links = HostLinks::read(&crate::read::host::Host::new(root, "/nonexistent"), &snap, Vec::new());
        assert_eq!(links.ifindex.get("ib0"), Some(&7));
        assert_eq!(links.bridges.get("mlx5_0").unwrap(), &["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]);
    }

    /// The records delivered until `n` have come (10 s at most).
    fn receive(rx: &std::sync::mpsc::Receiver<Delivery>, n: usize) -> Vec<Record> {
        let mut got: Vec<Record> = Vec::new();
        while got.len() < n {
            match rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(Delivery::Records(r)) => got.extend(r),
                other => panic!("expected records (have {got:?}), got {other:?}"),
            }
        }
        got
    }

    /// CPU time (clock ticks) used so far by this process's `kmsg-tail` threads.
    fn tail_threads_cpu_ticks() -> u64 {
        let mut ticks = 0;
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            if std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "kmsg-tail")
                && let Ok(stat) = std::fs::read_to_string(t.path().join("stat"))
                && let Some(after) = stat.rsplit_once(") ").map(|(_, a)| a)
            {
                let f: Vec<&str> = after.split(' ').collect();
                // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the name.
                ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
            }
        }
        ticks
    }

    #[test]
    fn a_regular_file_is_followed_every_record_parsed_without_spinning() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg.txt");
        // Several records in the file, one at the cursor (skipped), a continuation line.
        std::fs::write(&path, "3,7,1,-;old\n3,8,2,-;eight\n DEVICE=+pci:0000:01:00.0\n[ 1.5] plain\n").unwrap();
        let (tail, rx) = KmsgTail::spawn_channel(&path, Start::After(7)).unwrap();
        let got = receive(&rx, 2);
        assert_eq!(got.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(), ["eight", "plain"]);
        assert_eq!(got[0].device.as_ref().and_then(|d| d.pci()), Some("0000:01:00.0"));

        // Appended records, several in one write, one split across two writes.
        let mut w = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        w.write_all(b"3,9,3,-;nine\n3,10,4,-;ten\n SUBSYSTEM=pci\n3,11,5,-;elev").unwrap();
        w.flush().unwrap();
        let got = receive(&rx, 2);
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [Some(9), Some(10)]);
        assert_eq!(got[1].subsystem.as_deref(), Some("pci"));
        w.write_all(b"en\n").unwrap();
        let got = receive(&rx, 1);
        assert_eq!(got[0].text, "eleven");

        // Idle at the end of the file: the thread sleeps (a busy loop would use ~all of
        // the 1.5 s below: 150 ticks at 100 Hz).
        let before = tail_threads_cpu_ticks();
        assert!(rx.recv_timeout(std::time::Duration::from_millis(1500)).is_err(), "nothing new was written");
        let used = tail_threads_cpu_ticks() - before;
        assert!(used < 20, "the tail threads used {used} ticks while idle");

        // Truncated and rewritten: read from its start.
        std::fs::write(&path, "3,12,6,-;after truncation\n").unwrap();
        assert_eq!(receive(&rx, 1)[0].text, "after truncation");
        // Replaced at the path (rotated): the new file is read from its start.
        let new = dir.path().join("kmsg.new");
        std::fs::write(&new, "3,13,7,-;rotated\n").unwrap();
        std::fs::rename(&new, &path).unwrap();
        assert_eq!(receive(&rx, 1)[0].text, "rotated");
        drop(w);
        tail.stop();
    }

    #[test]
    fn a_regular_file_without_cursor_is_followed_from_its_end() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg.txt");
        std::fs::write(&path, "3,1,1,-;before the start\n").unwrap();
        let (tail, rx) = KmsgTail::spawn_channel(&path, Start::End).unwrap();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"3,2,2,-;new\n").unwrap();
        let got = receive(&rx, 1);
        assert_eq!(got.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(), ["new"]);
        tail.stop();
    }

    #[test]
    fn waiting_records_are_bounded_oldest_dropped() {
        let mut v: Vec<Record> =
            (0..MAX_PENDING_RECORDS as u64 + 5).map(|i| Record { seq: Some(i), ..Record::plain("x") }).collect();
        assert_eq!(keep_newest(&mut v), 5);
        assert_eq!(v.len(), MAX_PENDING_RECORDS);
        assert_eq!(v[0].seq, Some(5));
        let mut big: Vec<Record> = (0..4).map(|_| Record::plain("y".repeat(MAX_PENDING_BYTES / 3))).collect();
        assert_eq!(keep_newest(&mut big), 1);
        assert_eq!(keep_newest(&mut big), 0);
        assert_eq!(keep_newest(&mut Vec::new()), 0);
    }

    #[test]
    fn a_fifo_is_followed_as_lines() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();

        let fifo = dir.path().join("kmsg.fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", io::Error::last_os_error());
        let (tail, rx) = KmsgTail::spawn_channel(&fifo, Start::After(7)).unwrap();
        let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        // A record at the cursor (skipped), one after it split over two writes, plain text.
        w.write_all(b"3,7,1,-;old\n3,8,2,-;first half").unwrap();
        w.flush().unwrap();
        w.write_all(b" and the rest\n DEVICE=+pci:0000:01:00.0\nplain line\n").unwrap();
        drop(w);
        let got = receive(&rx, 2);
        assert_eq!(got[0].seq, Some(8));
        assert_eq!(got[0].text, "first half and the rest");
        assert_eq!(got[1].text, "plain line");
        // The writer closed: no end of file, no busy loop; the tail still stops cleanly.
        tail.stop();
    }

    #[test]
    fn only_the_kernel_log_device_or_a_fifo_is_tailed() {
        let e = KmsgTail::spawn_channel("/dev/zero", Start::End).err().unwrap();
        assert!(e.to_string().contains("not the kernel log (1:11)"), "{e}");
        let e = KmsgTail::spawn_channel("/", Start::End).err().unwrap();
        assert!(e.to_string().contains("not the kernel log device nor a FIFO"), "{e}");
    }

    #[test]
    fn read_file_names_the_file_on_error() {
        let e = read_file("/nonexistent/kmsg.txt").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kmsg.txt"));
    }
}
