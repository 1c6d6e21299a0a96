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
//!
//! A FIFO instead of the device (`--kmsg-path`, for tests and replays into a running
//! daemon) is read as a stream of lines in either format of [`parse_text`]; it is opened
//! read-write so that it never reports end of file when a writer closes. A regular file
//! is refused: `poll(2)` always finds it readable, so it cannot be followed this way
//! (`nicmon check --kmsg FILE` replays one).
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use super::attribution::{Departed, HostLinks};
use super::record::{Record, parse_record, parse_text};
use crate::model::Snapshot;

/// The device file.
pub const DEV_KMSG: &str = "/dev/kmsg";
/// Larger than the kernel's longest record (`PRINTK_MESSAGE_MAX`, 2 KiB, plus the dict):
/// a smaller buffer makes `read()` fail with `EINVAL`.
const READ_BUF: usize = 16 * 1024;

/// The largest `--kmsg FILE` read by `nicmon check`.
pub const FILE_MAX_BYTES: usize = 16 << 20;
/// The most records handed over at once (a flood is handed over in parts).
const MAX_BATCH: usize = 4096;

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
        if kind.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a regular file: the watcher follows /dev/kmsg or a FIFO; `nicmon check --kmsg FILE` replays a file",
                    path.display()
                ),
            ));
        }
        let stream = kind.is_fifo();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(stream)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)?;
        if !stream {
            let whence = match start {
                Start::End => libc::SEEK_END,
                Start::After(_) => libc::SEEK_SET,
            };
            // SAFETY: lseek on a descriptor we own; no memory is passed.
            if unsafe { libc::lseek(file.as_raw_fd(), 0, whence) } < 0 {
                return Err(io::Error::last_os_error());
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
            .spawn(move || tail(file, stream, cursor, &stop_t, &overruns_t, &mut sink))?;
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
    /// were lost is counted from the sequence gap, in [`super::KmsgState::lost_records`].
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

/// `stream`: a FIFO, read as lines (a record may span reads; an incomplete last line waits
/// for the next read), not one record per `read()`.
fn tail(
    file: File,
    stream: bool,
    cursor: Option<u64>,
    stop: &OwnedFd,
    overruns: &AtomicU64,
    sink: &mut dyn FnMut(Delivery) -> bool,
) {
    let fd = file.as_raw_fd();
    let mut buf = vec![0u8; READ_BUF];
    let mut partial: Vec<u8> = Vec::new();
    let after_cursor = |rec: &Record| !matches!((cursor, rec.seq), (Some(c), Some(s)) if s <= c);
    loop {
        let mut batch = Vec::new();
        let failure = loop {
            if batch.len() >= MAX_BATCH {
                break None;
            }
            match read_one(fd, &mut buf) {
                Ok(Some(n)) if stream => {
                    partial.extend_from_slice(&buf[..n]);
                    let end = match partial.iter().rposition(|b| *b == b'\n') {
                        Some(end) => end + 1,
                        // A line longer than any kernel record: taken as it is, so that a
                        // writer without newlines cannot grow the buffer without bound.
                        None if partial.len() >= READ_BUF => partial.len(),
                        None => continue,
                    };
                    let lines: Vec<u8> = partial.drain(..end).collect();
                    batch.extend(parse_text(&lines).into_iter().filter(after_cursor));
                }
                Ok(Some(n)) => {
                    let rec = parse_record(&buf[..n]);
                    if after_cursor(&rec) {
                        batch.push(rec);
                    }
                }
                Ok(None) => break None,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    // Records were overwritten; the next read returns the oldest left.
                    overruns.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        if !batch.is_empty() && !sink(Delivery::Records(batch)) {
            return;
        }
        if let Some(e) = failure {
            sink(Delivery::Failed(e));
            return;
        }
        match wait(fd, stop.as_raw_fd()) {
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
    let bytes = crate::host::read_file(path, FILE_MAX_BYTES).map_err(|e| e.into_io(path))?;
    Ok(parse_text(&bytes))
}

impl HostLinks {
    /// Read the facts the index needs beyond the snapshot, through the host reader: each
    /// netdev's `ifindex` and the PCI bridges above each device (nearest first), departed
    /// devices included while their PCI function is still on the bus. Unreadable values
    /// are left out.
    pub fn read(host: &crate::host::Host, snapshot: &Snapshot, departed: Vec<Departed>) -> HostLinks {
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
        let links = HostLinks::read(&crate::host::Host::new(root, "/nonexistent"), &snap, Vec::new());
        assert_eq!(links.ifindex.get("ib0"), Some(&7));
        assert_eq!(links.bridges.get("mlx5_0").unwrap(), &["0000:02:00.0", "0000:01:00.0", "0000:00:01.0"]);
    }

    #[test]
    fn a_fifo_is_followed_as_lines_and_a_regular_file_is_refused() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("kmsg.txt");
        std::fs::write(&plain, "x\n").unwrap();
        let e = KmsgTail::spawn_channel(&plain, Start::End).err().expect("a regular file is refused");
        assert!(e.to_string().contains("kmsg.txt is a regular file"), "{e}");

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
        let mut got: Vec<Record> = Vec::new();
        while got.len() < 2 {
            match rx.recv_timeout(std::time::Duration::from_secs(10)) {
                Ok(Delivery::Records(r)) => got.extend(r),
                other => panic!("expected records, got {other:?}"),
            }
        }
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
