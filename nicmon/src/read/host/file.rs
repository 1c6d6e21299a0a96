//! One regular file, read whole and bounded: what every read does once it is on a reader
//! thread. Only regular files are opened (a FIFO, a device or a directory where an
//! attribute is expected is an error, never a read), and at most a limit of bytes is read.
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{ReadError, classify};

/// What happens to bytes past the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Past {
    /// The file is too large: an error.
    Error,
    /// Only the first bytes are wanted (PCI config space).
    Ignore,
}

/// The names [`file_kind`] gives non-regular files.
pub(super) const FILE_KINDS: [&str; 6] =
    ["a directory", "a FIFO", "a character device", "a block device", "a socket", "not a file"];

/// Open a file for reading only if it is a regular file (following links): a FIFO, socket
/// or device is never opened, so it cannot block the reader. The error for another kind of
/// file says `not a regular file: <kind>`.
pub fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    if let Err(ReadError::NotRegular(kind)) = file_kind(&std::fs::metadata(path)?) {
        return Err(io::Error::other(format!("{NOT_REGULAR}: {kind}")));
    }
    std::fs::File::open(path)
}

/// The start of [`open_regular`]'s error for a file that is not a regular file.
pub const NOT_REGULAR: &str = "not a regular file";

/// The names in directory `path` (not `.` and `..`), sorted: one `open`, `getdents64`
/// until the end (into a buffer on the stack: no heap buffer grown per listing), one
/// `close` (no `fstat`, which `opendir` adds; a poll lists ~60 directories). A directory
/// removed while it is listed ends the listing.
pub(super) fn list_dir(path: &Path) -> io::Result<Vec<String>> {
    list_dir_at(rustix::fs::CWD, path)
}

/// [`list_dir`] of `path` relative to the directory `at`.
pub(super) fn list_dir_at<Fd: std::os::fd::AsFd>(at: Fd, path: &Path) -> io::Result<Vec<String>> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let fd = rustix::fs::openat(at, path, flags, Mode::empty())?;
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut dir = rustix::fs::RawDir::new(fd, &mut buf);
    let mut names = Vec::new();
    while let Some(entry) = dir.next() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::NOENT) => break,
            Err(e) => return Err(e.into()),
        };
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Open `path` only if it is a regular file, and read at most `limit` bytes of it.
pub(super) fn read_regular(path: &Path, limit: usize, past: Past) -> Result<Vec<u8>, ReadError> {
    open_read(path, limit, past).map(|(_, buf)| buf)
}

/// [`read_regular`], keeping the open file.
pub(super) fn open_read(path: &Path, limit: usize, past: Past) -> Result<(std::fs::File, Vec<u8>), ReadError> {
    let file = open_checked(path, limit, past)?;
    // Read to the end (a procfs file answers a page or so per read). The buffer starts
    // empty: std probes on the stack first, so an attribute's value is held in a buffer of
    // its own size, not a page (a poll of a device with 1,000 ports holds tens of thousands).
    let cap = limit.saturating_add(1);
    let mut buf = Vec::new();
    let mut take = (&file).take(cap as u64);
    loop {
        match take.read_to_end(&mut buf) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(classify(&e)),
        }
    }
    if buf.len() > limit {
        match past {
            Past::Error => return Err(ReadError::TooLarge(limit)),
            Past::Ignore => buf.truncate(limit),
        }
    }
    Ok((file, buf))
}

/// `path` opened for reading if it is a regular file, and (`Past::Error`) says it holds at
/// most `limit` bytes.
pub(super) fn open_checked(path: &Path, limit: usize, past: Past) -> Result<std::fs::File, ReadError> {
    // Refuse before opening: opening a FIFO blocks, a device may do anything.
    let md = std::fs::metadata(path).map_err(|e| classify(&e))?;
    file_kind(&md)?;
    // A blocking open and read, as the kernel's own readers do (a file that honours
    // O_NONBLOCK would answer EAGAIN instead of its value). Were the path swapped for a
    // FIFO since the check above, the open would block: on this reader thread, under the
    // read's deadline, like any stuck read.
    // No access-time update per read (attributes are read every second; an owner or
    // CAP_FOWNER may ask), else a plain open.
    let open = |flags| std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path);
    let file = match open(libc::O_NOCTTY | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(libc::O_NOCTTY),
        r => r,
    }
    .map_err(|e| classify(&e))?;
    let opened = file.metadata().map_err(|e| classify(&e))?;
    file_kind(&opened)?;
    // A file that says it is bigger than the limit is refused unread (sysfs and procfs
    // files give a page or 0 as their size, so they are read and measured instead).
    if past == Past::Error && opened.len() > limit as u64 {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(file)
}

/// What a non-regular file is (`a FIFO`, `a directory`, ...), or `None` for a regular file.
pub fn non_regular_kind(md: &std::fs::Metadata) -> Option<&'static str> {
    match file_kind(md) {
        Err(ReadError::NotRegular(kind)) => Some(kind),
        _ => None,
    }
}

pub(super) fn file_kind(md: &std::fs::Metadata) -> Result<(), ReadError> {
    use std::os::unix::fs::FileTypeExt;
    let t = md.file_type();
    if t.is_file() {
        return Ok(());
    }
    Err(ReadError::NotRegular(if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    }))
}
