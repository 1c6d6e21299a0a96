//! A regular file read as a stream (the state file): parsed as it is read, never held
//! whole. The reads run on a thread of their own, as the reader pool's do
//! ([`super::reader`]), each chunk under [`FILE_READ_TIMEOUT`]: a read stuck on a hung
//! filesystem is abandoned with its thread, and the stream fails (it never hangs).
use std::io::{self, Read};
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};

use super::file::{Past, open_checked};
use super::{FILE_READ_TIMEOUT, ReadError, classify};

/// The bytes read per chunk (two chunks wait at most: the stream holds ~3 chunks).
const CHUNK: usize = 64 << 10;

/// A regular file of at most `limit` bytes, read in chunks ([`stream_file`]).
pub struct FileStream {
    chunks: Receiver<Result<Vec<u8>, ReadError>>,
    chunk: Vec<u8>,
    at: usize,
    read: usize,
    limit: usize,
    /// Why the stream failed (the parser sees an I/O error).
    pub failed: Option<ReadError>,
}

/// Open `path` for a stream of at most `limit` bytes: only a regular file (its size said
/// no more than `limit`), opened on the stream's thread under [`FILE_READ_TIMEOUT`].
pub fn stream_file(path: &Path, limit: usize) -> Result<FileStream, ReadError> {
    let (tx, chunks) = sync_channel(2);
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("nicmon-stream".into()).spawn(move || {
        let file = match open_checked(&path, limit, Past::Error) {
            Ok(f) => f,
            Err(e) => return drop(tx.send(Err(e))),
        };
        if tx.send(Ok(Vec::new())).is_err() {
            return;
        }
        // One byte past the limit tells a file grown since it was opened.
        let mut rest = file.take(limit as u64 + 1);
        loop {
            let mut buf = vec![0; CHUNK];
            let sent = match rest.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    tx.send(Ok(buf))
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => tx.send(Err(classify(&e))),
            };
            if sent.is_err() {
                return;
            }
        }
    });
    spawned.map_err(|e| ReadError::Io(format!("cannot start a reader thread: {e}")))?;
    let mut stream = FileStream { chunks, chunk: Vec::new(), at: 0, read: 0, limit, failed: None };
    match stream.next_chunk() {
        Ok(true) => Ok(stream),
        Ok(false) => Err(ReadError::Io("the reader thread ended".into())),
        Err(e) => Err(e),
    }
}

impl FileStream {
    /// The next chunk into `self.chunk`; `false`: the end of the file.
    fn next_chunk(&mut self) -> Result<bool, ReadError> {
        match self.chunks.recv_timeout(FILE_READ_TIMEOUT) {
            Ok(Ok(chunk)) => {
                self.read += chunk.len();
                if self.read > self.limit {
                    return Err(ReadError::TooLarge(self.limit));
                }
                (self.chunk, self.at) = (chunk, 0);
                Ok(true)
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Disconnected) => Ok(false),
            Err(RecvTimeoutError::Timeout) => {
                Err(ReadError::Stuck(format!("no answer within {} ms: abandoned", FILE_READ_TIMEOUT.as_millis())))
            }
        }
    }
}

impl Read for FileStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = &self.failed {
            return Err(io::Error::other(e.to_string()));
        }
        while self.at == self.chunk.len() {
            match self.next_chunk() {
                Ok(true) => {}
                Ok(false) => return Ok(0),
                Err(e) => {
                    let err = io::Error::other(e.to_string());
                    self.failed = Some(e);
                    return Err(err);
                }
            }
        }
        let n = out.len().min(self.chunk.len() - self.at);
        out[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_streams_whole_and_one_past_its_limit_fails() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let text: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &text).unwrap();
        let mut got = Vec::new();
        stream_file(&p, text.len()).unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got, text);
        assert!(matches!(stream_file(&p, text.len() - 1).err(), Some(ReadError::TooLarge(_))));
        assert!(matches!(stream_file(&dir.path().join("none"), 10).err(), Some(ReadError::Missing)));
        assert!(matches!(stream_file(dir.path(), 10).err(), Some(ReadError::NotRegular(_))));
    }
}
