//! A regular file whose `read()` blocks: a private tracefs instance's `trace_pipe` (no event
//! is enabled in it, so it never has data). Stands in for a sysfs read stuck behind a
//! firmware command (a FIFO would not do: nicmon opens only regular files).
use std::path::PathBuf;

pub struct BlockingFile(PathBuf);

impl BlockingFile {
    /// `None` (with a line saying why) where tracefs instances are not available.
    pub fn new(tag: &str) -> Option<BlockingFile> {
        let base = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("instances").is_dir());
        let Some(base) = base else {
            eprintln!("skipped: no tracefs instances directory (a blocking regular file is needed)");
            return None;
        };
        let dir = base.join(format!("instances/nicmon-{tag}-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            eprintln!("skipped: cannot create a tracefs instance ({e})");
            return None;
        }
        Some(BlockingFile(dir))
    }

    /// The file whose reads block.
    pub fn pipe(&self) -> PathBuf {
        self.0.join("trace_pipe")
    }
}

impl Drop for BlockingFile {
    fn drop(&mut self) {
        // Stop the process reading trace_pipe first: the instance is busy while it is open.
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("cannot remove tracefs instance {}: {e}", self.0.display());
        }
    }
}

/// `<dir>/{name}`, a FIFO with no writer: opening it for reading would block.
pub fn fifo_in(dir: &std::path::Path, name: &str) -> PathBuf {
    let fifo = dir.join(name);
    let c = std::ffi::CString::new(fifo.to_str().expect("a UTF-8 path")).expect("no NUL in the path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", fifo.display());
    fifo
}

/// `f` on a thread, its answer within 10 s (a guard: a regression that blocks fails the test
/// instead of hanging it).
pub fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10)).expect("blocked on a FIFO")
}
