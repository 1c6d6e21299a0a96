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
//! The thread reads every available record (one per `read()`), hands them over as one
//! batch, then sleeps in `poll(2)` until the kernel has more or it is told to stop. No
//! decisions here: matching happens in [`super::process`].
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use super::attribution::HostLinks;
use super::record::{Record, parse_record, parse_text};
use crate::model::Snapshot;

/// The device file.
pub const DEV_KMSG: &str = "/dev/kmsg";
/// Larger than the kernel's longest record (`PRINTK_MESSAGE_MAX`, 2 KiB, plus the dict):
/// a smaller buffer makes `read()` fail with `EINVAL`.
const READ_BUF: usize = 16 * 1024;

/// The largest `--kmsg FILE` read by `nicmon check`.
pub const FILE_MAX_BYTES: usize = 16 << 20;

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
    reads: Arc<AtomicU64>,
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
        let path: PathBuf = path.as_ref().to_path_buf();
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(&path)?;
        let md = file.metadata()?;
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
        if kind.is_dir() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{}: a directory", path.display())));
        }
        let mode = if kind.is_char_device() { Mode::Records } else { Mode::Lines };
        let whence = match start {
            Start::End => libc::SEEK_END,
            Start::After(_) => libc::SEEK_SET,
        };
        // SAFETY: lseek on a descriptor we own; no memory is passed. A FIFO cannot seek.
        if !kind.is_fifo() && unsafe { libc::lseek(file.as_raw_fd(), 0, whence) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let stop = Arc::new(eventfd()?);
        let overruns = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let cursor = match start {
            Start::End => None,
            Start::After(c) => Some(c),
        };
        let (stop_t, overruns_t, reads_t) = (Arc::clone(&stop), Arc::clone(&overruns), Arc::clone(&reads));
        let thread = std::thread::Builder::new()
            .name("kmsg-tail".into())
            .spawn(move || tail(file, mode, cursor, &stop_t, (&overruns_t, &reads_t), &mut sink))?;
        Ok(KmsgTail { stop, thread: Some(thread), overruns, reads })
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
    /// were lost is counted from the sequence gap, in [`super::KmsgState::lost_records`].
    pub fn overruns(&self) -> u64 {
        self.overruns.load(Ordering::Relaxed)
    }

    /// How many `read()` calls the thread has made (a busy loop shows here).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
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

/// How the bytes of one `read()` map to records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The `/dev/kmsg` device: each `read()` returns exactly one record.
    Records,
    /// A regular file or a FIFO (tests, replays): a byte stream of lines, any number of
    /// records per `read()`, the last line possibly incomplete.
    Lines,
}

/// The most records handed over at once (a flood is handed over in parts).
const MAX_BATCH: usize = 4096;

/// How long a tail of a regular file (or a FIFO without a writer) waits at its end before
/// looking again: `poll(2)` says such a file is always readable, so it cannot be waited on.
const EOF_RETRY_MS: i32 = 500;

fn tail(
    file: File,
    mode: Mode,
    cursor: Option<u64>,
    stop: &OwnedFd,
    (overruns, reads): (&AtomicU64, &AtomicU64),
    sink: &mut dyn FnMut(Delivery) -> bool,
) {
    let fd = file.as_raw_fd();
    let mut buf = vec![0u8; READ_BUF];
    // Lines mode: the incomplete last line of the previous read.
    let mut partial: Vec<u8> = Vec::new();
    let keep = |rec: &Record| !matches!((cursor, rec.seq), (Some(c), Some(s)) if s <= c);
    loop {
        let mut batch = Vec::new();
        let (failure, at_eof) = loop {
            if batch.len() >= MAX_BATCH {
                break (None, false);
            }
            reads.fetch_add(1, Ordering::Relaxed);
            match read_one(fd, &mut buf) {
                Ok(Got::Bytes(n)) if mode == Mode::Records => {
                    let rec = parse_record(&buf[..n]);
                    if keep(&rec) {
                        batch.push(rec);
                    }
                }
                Ok(Got::Bytes(n)) => {
                    partial.extend_from_slice(&buf[..n]);
                    let complete = match partial.iter().rposition(|b| *b == b'\n') {
                        Some(i) => i + 1,
                        // One line longer than a kernel record can be: taken as it is.
                        None if partial.len() >= READ_BUF => partial.len(),
                        None => continue,
                    };
                    batch.extend(parse_text(&partial[..complete]).into_iter().filter(|r| keep(r)));
                    partial.drain(..complete);
                }
                Ok(Got::Again) => break (None, false),
                Ok(Got::Eof) => break (None, true),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    // Records were overwritten; the next read returns the oldest left.
                    overruns.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break (Some(e), false),
            }
        };
        if !batch.is_empty() && !sink(Delivery::Records(batch)) {
            return;
        }
        if let Some(e) = failure {
            sink(Delivery::Failed(e));
            return;
        }
        let waited = if at_eof { wait_stop(stop.as_raw_fd(), EOF_RETRY_MS) } else { wait(fd, stop.as_raw_fd()) };
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

/// What one `read()` gave.
enum Got {
    Bytes(usize),
    /// Nothing yet (`EAGAIN`): the device will say when there is more.
    Again,
    /// End of file (a regular file, or a FIFO without a writer).
    Eof,
}

fn read_one(fd: RawFd, buf: &mut [u8]) -> io::Result<Got> {
    // SAFETY: reads at most buf.len() bytes into buf.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(Got::Again);
        }
        return Err(e);
    }
    if n == 0 {
        return Ok(Got::Eof);
    }
    Ok(Got::Bytes(n as usize))
}

/// Sleep `ms` or until `stop` is signalled (`false`).
fn wait_stop(stop: RawFd, ms: i32) -> io::Result<bool> {
    let mut fds = [libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 }];
    // SAFETY: fds is a live array of one pollfd.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(true) } else { Err(e) };
    }
    Ok(fds[0].revents == 0)
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
    let bytes = crate::host::read_file(path, FILE_MAX_BYTES).map_err(|e| e.into_io(path))?;
    Ok(parse_text(&bytes))
}

impl HostLinks {
    /// Read the facts the index needs beyond the snapshot, through the host reader: each
    /// netdev's `ifindex` and the PCI bridges above each device (nearest first).
    /// Unreadable values are left out.
    pub fn read(host: &crate::host::Host, snapshot: &Snapshot) -> HostLinks {
        let mut links = HostLinks::default();
        for d in &snapshot.devices {
            if let Some(n) = &d.netdev
                && let Ok(s) = host.read_sys(&format!("class/net/{n}/ifindex"))
                && let Ok(i) = s.trim().parse()
            {
                links.ifindex.insert(n.clone(), i);
            }
            if let Some(bdf) = &d.pci_address
                && let Some(node) = crate::discovery::pci_node(host, bdf)
            {
                let bridges: Vec<String> = node
                    .path
                    .iter()
                    .rev()
                    .skip(1)
                    .filter(|n| super::attribution::card_of(n).is_some() && n.len() == 12)
                    .cloned()
                    .collect();
                if !bridges.is_empty() {
                    links.bridges.insert(d.name.clone(), bridges);
                }
            }
        }
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
            devices: vec![crate::model::Device {
                name: "mlx5_0".into(),
                unsupported: None,
                pci_address: Some("0000:03:00.0".into()),
                card: Some("0000:03:00".into()),
                numa_node: None,
                hca_type: None,
                fw_ver: None,
                board_id: None,
                driver: None,
                function: crate::model::Function::Pf,
                netdev: Some("ib0".into()),
                ports: vec![],
            }],
            ..Default::default()
        };
        let links = HostLinks::read(&crate::host::Host::new(root, "/nonexistent"), &snap);
        assert_eq!(links.ifindex.get("ib0"), Some(&7));
        assert_eq!(links.bridges.get("mlx5_0").unwrap(), &["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]);
    }

    #[test]
    fn a_regular_file_is_tailed_line_by_line_without_spinning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kmsg.txt");
        std::fs::write(&path, "3,1,10,-;first\n3,2,20,-;second\n3,3,30,-;thi").unwrap();
        let (tail, rx) = KmsgTail::spawn_channel(&path, Start::After(1)).unwrap();
        let got = |rx: &std::sync::mpsc::Receiver<Delivery>| match rx.recv_timeout(std::time::Duration::from_secs(5)) {
            Ok(Delivery::Records(r)) => r.into_iter().map(|r| r.text).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        // Every record of one read, after the cursor; the incomplete line waits.
        assert_eq!(got(&rx), vec!["second"]);
        let before = tail.reads();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        std::io::Write::write_all(&mut f, b"rd\n").unwrap();
        assert_eq!(got(&rx), vec!["third"]);
        assert!(rx.recv_timeout(std::time::Duration::from_millis(1200)).is_err(), "nothing more");
        // At the end of the file the thread sleeps between looks (every 500 ms), not spins.
        let reads = tail.reads() - before;
        assert!(reads < 20, "the tail spins at the end of a regular file: {reads} reads in 1.2 s");
        tail.stop();
    }

    #[test]
    fn only_the_kernel_log_device_is_tailed() {
        let e = KmsgTail::spawn_channel("/dev/zero", Start::End).err().unwrap();
        assert!(e.to_string().contains("not the kernel log"), "{e}");
        let e = KmsgTail::spawn_channel("/", Start::End).err().unwrap();
        assert!(e.to_string().contains("a directory"), "{e}");
    }

    #[test]
    fn read_file_names_the_file_on_error() {
        let e = read_file("/nonexistent/kmsg.txt").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kmsg.txt"));
    }
}
