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

/// A regular file whose every read returns late: a [`BlockingFile`] whose tracefs instance
/// is given one page-sized trace marker every `every`. A read blocks until the next marker,
/// then has more than a page (`trace_pipe` never ends a file, so a reader bounded at a page,
/// as nicmon's are, stops there: the file is too large). Stands in for an attribute behind a
/// slow firmware command: each read answers, seconds late, read after read (a
/// [`BlockingFile`]'s read never answers). (Ending the read at the marker by switching
/// tracing off after it does not do: that wake-up is lost now and then, and the read stays
/// blocked for several ticks.)
pub struct SlowFile {
    /// Dropped after the ticking thread is stopped (fields drop in order: `stop` first).
    stop: Option<std::sync::mpsc::Sender<()>>,
    ticker: Option<std::thread::JoinHandle<()>>,
    file: BlockingFile,
}

impl SlowFile {
    /// `None` (with a line saying why) where tracefs instances are not available.
    pub fn new(tag: &str, every: std::time::Duration) -> Option<SlowFile> {
        let file = BlockingFile::new(tag)?;
        let marker = file.0.join("trace_marker");
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let ticker = std::thread::spawn(move || {
            // The device's latency, not a synchronisation: a read in flight answers at the
            // next tick. (A kernel that cuts markers at 1 KiB, before 6.x's 4 KiB, answers
            // a read bounded at a page only every fourth tick: later still.)
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let _ = std::fs::write(&marker, "x".repeat(4096));
            }
        });
        Some(SlowFile { stop: Some(stop), ticker: Some(ticker), file })
    }

    /// The file whose reads answer late.
    pub fn pipe(&self) -> PathBuf {
        self.file.pipe()
    }
}

impl Drop for SlowFile {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}
