//! Watching the host's real kernel log for lines that other monitors act on.
//!
//! The demo and the test suite must leave `/dev/kmsg` without a single new mlx5, AER or
//! NVRM/Xid line (a syslog-based health monitor on a GPU node can cordon, drain or replace
//! the node on one). [`KernelLogWatch`] remembers where the log ended when it started and
//! returns what was added since, so a run can check and say so.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;

/// What the check looks for (case-sensitive, as the kernel prints them).
pub const WATCHED: [&str; 4] = ["mlx5", "AER", "NVRM", "Xid"];

/// The real kernel log from a point in time on.
pub struct KernelLogWatch {
    file: File,
}

impl KernelLogWatch {
    /// Start at the log's current end. `Err` (with the reason) where `/dev/kmsg` cannot be
    /// read (not root, `kernel.dmesg_restrict`, a container).
    pub fn start() -> Result<KernelLogWatch, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|e| format!("/dev/kmsg: {e}"))?;
        file.seek(SeekFrom::End(0)).map_err(|e| format!("/dev/kmsg: seek to the end: {e}"))?;
        Ok(KernelLogWatch { file })
    }

    /// The text of every record added since [`KernelLogWatch::start`] (or the last call).
    pub fn new_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let first = rec.lines().next().unwrap_or_default();
                    out.push(first.split_once(';').map_or(first, |(_, text)| text).to_string());
                }
                // Records overwritten before they were read: the next read returns the oldest left.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // EAGAIN: nothing more
            }
        }
        out
    }

    /// The new lines naming mlx5, AER, NVRM or Xid.
    pub fn watched_lines(&mut self) -> Vec<String> {
        self.new_lines().into_iter().filter(|l| WATCHED.iter().any(|w| l.contains(w))).collect()
    }
}
