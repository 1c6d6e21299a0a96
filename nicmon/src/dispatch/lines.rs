//! JSON-lines sinks for users without NVSentinel: one event per line in proto3 JSON form
//! (`serde_json::to_string(&HealthEvent)`), the same form `nicmon check` prints.
use std::io::Write;
use std::path::PathBuf;

use super::SendError;
use crate::event::HealthEvent;

/// `events` as JSON lines, each ending in `\n`.
pub fn encode(events: &[HealthEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for ev in events {
        // The event model is plain strings, numbers, maps and enums: serialising it
        // cannot fail.
        serde_json::to_writer(&mut out, ev).expect("HealthEvent serialises to JSON");
        out.push(b'\n');
    }
    out
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
        let bytes = encode(events);
        self.out
            .write_all(&bytes)
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
/// underneath) and fsynced before the batch counts as accepted.
pub struct FileSink {
    path: PathBuf,
}

impl FileSink {
    pub fn new(path: PathBuf) -> FileSink {
        FileSink { path }
    }

    pub async fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        if events.is_empty() {
            return Ok(());
        }
        let bytes = encode(events);
        let path = self.path.clone();
        let result = tokio::task::spawn_blocking(move || append_synced(&path, &bytes))
            .await
            .unwrap_or_else(|join| Err(std::io::Error::other(join)));
        result.map_err(|source| SendError::Write { target: self.path.display().to_string(), source })
    }
}

fn append_synced(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(bytes)?;
    file.flush()?;
    // Durability is a property of regular files; a FIFO, /dev/null or a tty has nothing
    // to sync (and answers EINVAL).
    match file.metadata()?.is_file() {
        true => file.sync_data(),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Check, Entity, Stamp};

    fn events() -> Vec<HealthEvent> {
        let stamp = Stamp { node_name: "n1".into(), ..Stamp::default() };
        let t = time::macros::datetime!(2026-01-02 03:04:05 UTC);
        vec![
            HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "mlx5_0 port 1 down")
                .unhealthy(true)
                .entities(vec![Entity::nic("mlx5_0"), Entity::port(1)]),
            HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "mlx5_1 port 1 up")
                .entities(vec![Entity::nic("mlx5_1"), Entity::port(1)]),
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

    #[tokio::test]
    async fn file_sink_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("events.jsonl");
        let e = FileSink::new(path).send(&events()).await.unwrap_err();
        assert!(e.is_retryable());
        assert!(e.to_string().contains("no-such-dir"), "{e}");
    }
}
