//! JSON-lines sinks for users without NVSentinel: one event per line in proto3 JSON form
//! (`serde_json::to_string(&HealthEvent)`), the same form `nicmon check` prints.
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::SendError;
use crate::model::event::HealthEvent;

/// `events` as JSON lines, each ending in `\n`.
pub fn encode(events: &[HealthEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    write_lines(&mut out, events).expect("writing to a Vec cannot fail");
    out
}

/// Bytes of lines gathered before each `write` when a batch is streamed: a batch is never
/// held whole as text (a reboot's baselines on a device with 1,000 ports are ~14,000 lines).
const WRITE_CHUNK: usize = 64 << 10;

/// Events per blocking `write` to a file that is not a regular one ([`FileSink::deliver`]).
const EVENTS_PER_WRITE: usize = 128;

/// Write `events` to `out` as JSON lines through a [`WRITE_CHUNK`] buffer, then flush.
pub fn write_lines<W: Write>(out: W, events: &[HealthEvent]) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(WRITE_CHUNK, out);
    for ev in events {
        // The event model is plain strings, numbers, maps and enums: serialising it
        // cannot fail (only the write can).
        serde_json::to_writer(&mut out, ev).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// JSON lines written to `W` (stdout in the daemon), flushed per batch.
pub struct LineSink<W: Write> {
    out: W,
    name: &'static str,
}

impl LineSink<std::io::Stdout> {
    pub fn stdout() -> Self {
        LineSink { out: std::io::stdout(), name: "stdout" }
    }
}

impl<W: Write> LineSink<W> {
    pub fn new(out: W, name: &'static str) -> Self {
        LineSink { out, name }
    }

    pub fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        if events.is_empty() {
            return Ok(());
        }
        write_lines(&mut self.out, events)
            .and_then(|()| self.out.flush())
            .map_err(|source| SendError::Write { target: self.name.to_string(), source })
    }

    pub fn get_ref(&self) -> &W {
        &self.out
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// JSON lines appended to a file, which is opened per batch (so it can be rotated
/// underneath). [`FileSink::deliver`] writes a batch: once `write` has returned, the lines
/// are in the file for every reader — delivered. [`FileSink::make_durable`] then syncs the
/// file's data (`fdatasync`); the outbox acknowledges a batch (and so removes it from the
/// state file) only after both, so a power loss between the write and the sync loses
/// nothing: the batch is still owed and is written again (see [`crate::act::outbox`]).
/// [`FileSink::send`] is both in one.
///
/// Whole records only: a write that fails part-way (disk full) is rolled back to the
/// file's previous length before the error is returned, so a retry never appends after a
/// torn line. A write that does not return within [`WRITE_TIMEOUT`] (a FIFO whose reader
/// stopped reading) fails the send; no other write starts until it has returned, and the
/// batch stays queued.
pub struct FileSink {
    path: PathBuf,
    busy: Arc<AtomicBool>,
    /// The regular file the last delivered batch was written to, not synced yet.
    unsynced: Option<std::fs::File>,
}

/// How long one batch's write may take before the send fails (and is retried later).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

impl FileSink {
    pub fn new(path: PathBuf) -> FileSink {
        FileSink { path, busy: Arc::default(), unsynced: None }
    }

    /// Write `events` and sync them: [`FileSink::deliver`], then [`FileSink::make_durable`].
    pub async fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        self.deliver(events).await?;
        self.make_durable().await
    }

    /// Append `events` as whole lines (not synced: [`FileSink::make_durable`]).
    pub async fn deliver(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        if events.is_empty() {
            return Ok(());
        }
        let fail = |source| self.write_error(source);
        self.idle()?;
        // Opening cannot wait (O_NONBLOCK). A regular file is written here: its append
        // returns once the lines are in the page cache, so the delivery takes no thread
        // hop (the sync, which waits for the disk, runs on a blocking thread). Anything else
        // (a FIFO whose reader may stall) is written on a blocking thread, bounded.
        let file = open_append(&self.path).map_err(fail)?;
        let md = file.metadata().map_err(fail)?;
        // Either way the lines are streamed, never held whole.
        if !md.is_file() {
            return self.deliver_blocking(file, events).await;
        }
        let file = append_regular(file, md.len(), events, |f, evs| write_lines(f, evs)).map_err(fail)?;
        self.unsynced = Some(file);
        Ok(())
    }

    /// [`FileSink::deliver`] to a file that is not a regular one (a FIFO, `/dev/null`): a
    /// few lines at a time on a blocking thread, each write bounded.
    async fn deliver_blocking(&mut self, file: std::fs::File, events: &[HealthEvent]) -> Result<(), SendError> {
        set_blocking(&file).map_err(|source| self.write_error(source))?;
        let mut file = file;
        for chunk in events.chunks(EVENTS_PER_WRITE) {
            let bytes = encode(chunk);
            file = self
                .blocking(move || {
                    let mut f = file;
                    f.write_all(&bytes)?;
                    f.flush()?;
                    Ok(f)
                })
                .await?;
        }
        Ok(())
    }

    /// Sync the data of the batches delivered since the last call (`fdatasync`); nothing to
    /// do when none was written to a regular file.
    pub async fn make_durable(&mut self) -> Result<(), SendError> {
        let Some(file) = self.unsynced.take() else { return Ok(()) };
        self.blocking(move || file.sync_data()).await
    }

    fn write_error(&self, source: io::Error) -> SendError {
        SendError::Write { target: self.path.display().to_string(), source }
    }

    /// Refuse while a write or sync on a blocking thread has not returned.
    fn idle(&self) -> Result<(), SendError> {
        if self.busy.load(Ordering::Acquire) {
            return Err(self.write_error(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the previous write has not returned: not writing again until it does",
            )));
        }
        Ok(())
    }

    /// Run `op` on a blocking thread, bounded by [`WRITE_TIMEOUT`]; no second one starts
    /// until it has returned.
    async fn blocking<T: Send + 'static>(
        &mut self,
        op: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> Result<T, SendError> {
        let fail = |source| self.write_error(source);
        self.idle()?;
        self.busy.store(true, Ordering::Release);
        let busy = Arc::clone(&self.busy);
        let run = tokio::task::spawn_blocking(move || {
            let r = op();
            busy.store(false, Ordering::Release);
            r
        });
        match tokio::time::timeout(WRITE_TIMEOUT, run).await {
            Ok(joined) => joined.unwrap_or_else(|join| Err(io::Error::other(join))).map_err(fail),
            Err(_) => Err(fail(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {WRITE_TIMEOUT:?} (a FIFO nobody reads?): the batch stays queued"),
            ))),
        }
    }
}

/// Open `path` for appending, created if missing, without waiting: a FIFO with no reader
/// is an error at once (`ENXIO`), not a wait.
fn open_append(path: &Path) -> io::Result<std::fs::File> {
    let opened = std::fs::OpenOptions::new().create(true).append(true).custom_flags(libc::O_NONBLOCK).open(path);
    opened.map_err(|e| match e.raw_os_error() {
        Some(libc::ENXIO) => io::Error::new(e.kind(), "a FIFO with no reader"),
        _ => e,
    })
}

/// Append `bytes` to the regular `file` ([`open_append`]), `before` bytes long, as a whole:
/// a failed `write` is rolled back (truncated to `before`). Returns the file (its data to
/// be synced).
fn append_regular<T: ?Sized>(
    mut file: std::fs::File,
    before: u64,
    bytes: &T,
    write: impl FnOnce(&mut std::fs::File, &T) -> io::Result<()>,
) -> io::Result<std::fs::File> {
    if let Err(e) = write(&mut file, bytes).and_then(|()| file.flush()) {
        return match file.set_len(before) {
            Ok(()) => Err(e),
            Err(t) => Err(io::Error::new(e.kind(), format!("{e}; removing the partial record failed too: {t}"))),
        };
    }
    Ok(file)
}

/// Clear `O_NONBLOCK` (set only so that opening a FIFO cannot wait for a reader).
fn set_blocking(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Check, Entity, Stamp};

    fn events() -> Vec<HealthEvent> {
        let stamp = Stamp { node_name: "n1".into(), ..Stamp::default() };
        let t = time::macros::datetime!(2026-01-02 03:04:05 UTC);
        vec![
            HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "mlx5_0 port 1 down")
                .unhealthy(true)
                .entities(vec![Entity::device("mlx5_0"), Entity::port(1)]),
            HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "mlx5_1 port 1 up")
                .entities(vec![Entity::device("mlx5_1"), Entity::port(1)]),
        ]
    }

    #[tokio::test]
    async fn a_device_file_is_a_valid_target() {
        let mut sink = FileSink::new("/dev/null".into());
        sink.send(&events()).await.unwrap();
    }

    fn parse_lines(text: &str) -> Vec<HealthEvent> {
        assert!(text.ends_with('\n'));
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    #[test]
    fn writer_sink_writes_one_json_object_per_line() {
        let mut sink = LineSink::new(Vec::new(), "buffer");
        sink.send(&events()).unwrap();
        let text = String::from_utf8(sink.into_inner()).unwrap();
        assert_eq!(parse_lines(&text), events());
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["recommendedAction"], "REPLACE_VM");
        assert_eq!(first["generatedTimestamp"], "2026-01-02T03:04:05Z");
    }

    #[tokio::test]
    async fn file_sink_appends_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut sink = FileSink::new(path.clone());
        sink.send(&events()).await.unwrap();
        sink.send(&events()[..1]).await.unwrap();
        let got = parse_lines(&std::fs::read_to_string(&path).unwrap());
        assert_eq!(got.len(), 3);
        assert_eq!(got[..2], events()[..]);
        assert_eq!(got[2], events()[0]);
    }

    /// Delivered = the lines are readable at once; the sync is owed until `make_durable`
    /// (which the outbox runs before it acknowledges the batch).
    #[tokio::test]
    async fn delivered_lines_are_readable_before_the_sync_which_stays_owed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let mut sink = FileSink::new(path.clone());
        sink.deliver(&events()).await.unwrap();
        assert_eq!(parse_lines(&std::fs::read_to_string(&path).unwrap()), events());
        assert!(sink.unsynced.is_some(), "the sync is owed");
        sink.make_durable().await.unwrap();
        assert!(sink.unsynced.is_none());
        sink.make_durable().await.unwrap();
        // Not a regular file: nothing to sync.
        let mut null = FileSink::new("/dev/null".into());
        null.deliver(&events()).await.unwrap();
        assert!(null.unsynced.is_none());
    }

    /// [`append_regular`] to a regular file, as the sink appends a batch.
    fn append_whole<T: ?Sized>(
        file: std::fs::File,
        bytes: &T,
        write: impl FnOnce(&mut std::fs::File, &T) -> io::Result<()>,
    ) -> io::Result<std::fs::File> {
        let before = file.metadata()?.len();
        append_regular(file, before, bytes, write)
    }

    #[test]
    fn a_partial_write_is_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let first = encode(&events()[..1]);
        append_whole(open_append(&path).unwrap(), &first, |f, b| f.write_all(b)).unwrap();
        // The disk fills half-way through the next batch.
        let second = encode(&events());
        let e = append_whole(open_append(&path).unwrap(), &second, |f, b| {
            f.write_all(&b[..b.len() / 2])?;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert_eq!(std::fs::read(&path).unwrap(), first, "the torn record was removed");
        // The retry appends whole records after whole records.
        append_whole(open_append(&path).unwrap(), &second, |f, b| f.write_all(b)).unwrap();
        assert_eq!(parse_lines(&std::fs::read_to_string(&path).unwrap()).len(), 3);
    }

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[tokio::test]
    async fn a_fifo_without_reader_fails_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        mkfifo(&path);
        let started = std::time::Instant::now();
        let e = FileSink::new(path).send(&events()).await.unwrap_err();
        assert!(e.is_retryable());
        assert!(e.to_string().contains("no reader"), "{e}");
        assert!(started.elapsed() < WRITE_TIMEOUT);
    }

    #[tokio::test]
    async fn a_stuck_write_times_out_and_blocks_no_second_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        mkfifo(&path);
        // A reader that opens the FIFO and never reads: a batch larger than the pipe blocks.
        let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
        let big: Vec<HealthEvent> = (0..2000).flat_map(|_| events()).collect();
        let mut sink = FileSink::new(path.clone());
        let started = std::time::Instant::now();
        let e = sink.send(&big).await.unwrap_err();
        assert!(e.to_string().contains("no answer within"), "{e}");
        assert!(started.elapsed() < WRITE_TIMEOUT + Duration::from_secs(1));
        let e = sink.send(&events()).await.unwrap_err();
        assert!(e.to_string().contains("previous write has not returned"), "{e}");
        // The reader goes away: the stuck write fails (EPIPE) and writing is possible again.
        drop(reader);
        let waited = std::time::Instant::now();
        while sink.busy.load(Ordering::Acquire) {
            assert!(waited.elapsed() < Duration::from_secs(5));
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn file_sink_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("events.jsonl");
        let e = FileSink::new(path).send(&events()).await.unwrap_err();
        assert!(e.is_retryable());
        assert!(e.to_string().contains("no-such-dir"), "{e}");
    }
}
