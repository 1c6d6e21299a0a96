//! The ethtool replay format (docs/ethtool-replay.md): `<dir>/<netdev>.json` holds what a
//! netdev's driver answered, as [`EthtoolSnapshot`]'s JSON. A key that is absent is a part
//! the driver did not offer; a missing file is a netdev with no ethtool data at all. The
//! testbed and host trees write these files by hand, `nicmon bundle` writes them from a
//! live read ([`to_json`]), and a replayed read serialises to the same bytes.
use crate::model::ReadError;
use crate::model::ethtool::{Absent, EthtoolRead, EthtoolSnapshot};
use crate::model::module::Pages;
use std::path::{Path, PathBuf};

/// A replay file larger than this is not read (a real one is well under a kilobyte).
const MAX_FILE: usize = 1 << 20;

/// Why a replay file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{path}: {kind}")]
    File { path: PathBuf, kind: ReplayFileError },
    #[error("{0:?} is not a netdev name")]
    Name(String),
}

/// The replay file's text of `snapshot`: pretty JSON, keys in a fixed order, statistics
/// sorted by name, one trailing newline. The same snapshot always gives the same bytes.
pub fn to_json(snapshot: &EthtoolSnapshot) -> String {
    // Serialising plain structs, Options, Vecs and a BTreeMap of u64s cannot fail.
    let mut s = serde_json::to_string_pretty(snapshot).unwrap_or_default();
    s.push('\n');
    s
}

/// Parses a replay file's text. Unknown keys are ignored (a newer writer); a known key of
/// the wrong type (a negative or fractional count, an unknown FEC mode) is an error.
pub fn from_json(bytes: &[u8]) -> Result<EthtoolSnapshot, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// What is wrong with a replay file.
#[derive(Debug, thiserror::Error)]
pub enum ReplayFileError {
    /// Not read: missing aside (that is no file), not a regular file, too large, unreadable.
    #[error(transparent)]
    Read(ReadError),
    /// Not the replay format.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// Writing it failed.
    #[error(transparent)]
    Write(#[from] std::io::Error),
}

/// The replay file of `netdev` in `dir`; an error for a name that is not one netdev's
/// (empty, `.`/`..`, a `/` or a NUL in it, longer than the kernel allows).
pub fn path(dir: &Path, netdev: &str) -> Result<PathBuf, ReplayError> {
    let bad = netdev.is_empty()
        || netdev == "."
        || netdev == ".."
        || netdev.len() >= libc::IFNAMSIZ
        || netdev.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace());
    if bad {
        return Err(ReplayError::Name(netdev.to_string()));
    }
    Ok(dir.join(format!("{netdev}.json")))
}

/// Reads `<dir>/<netdev>.json`: `Ok(None)` when there is none. Read as nicmon reads every
/// file outside sysfs ([`crate::read::host::read_file`]): only a regular file is opened (it
/// is checked before the open, so a FIFO left in a replay directory cannot block the poll),
/// at most [`MAX_FILE`] bytes, on a reader thread under a deadline.
pub fn read(dir: &Path, netdev: &str) -> Result<Option<EthtoolSnapshot>, ReplayError> {
    let path = path(dir, netdev)?;
    let fail = |kind: ReplayFileError| ReplayError::File { path: path.clone(), kind };
    let bytes = match crate::read::host::read_file(&path, MAX_FILE) {
        Ok(b) => b,
        Err(ReadError::Missing) => return Ok(None),
        Err(e) => return Err(fail(ReplayFileError::Read(e))),
    };
    from_json(&bytes).map(Some).map_err(|e| fail(e.into()))
}

/// Writes `<dir>/<netdev>.json` (creating `dir`).
pub fn write(dir: &Path, netdev: &str, snapshot: &EthtoolSnapshot) -> Result<(), ReplayError> {
    let path = path(dir, netdev)?;
    let fail = |e: std::io::Error| ReplayError::File { path: path.clone(), kind: e.into() };
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::write(&path, to_json(snapshot)).map_err(fail)
}

/// `netdev`'s read from the replay directory `dir`, part by part like a kernel read: an
/// absent key or file is unsupported, an unreadable file fails every part.
pub fn load(dir: &Path, netdev: &str) -> EthtoolRead {
    match read(dir, netdev) {
        Ok(Some(s)) => {
            let unsupported = |part: &str| Absent::Unsupported(format!("{netdev}: no {part} in the replay file"));
            EthtoolRead {
                fec: s.fec.ok_or_else(|| unsupported("fec")),
                pause: s.pause.ok_or_else(|| unsupported("pause")),
                stats: s.stats.ok_or_else(|| unsupported("stats")),
            }
        }
        Ok(None) => EthtoolRead::absent(Absent::Unsupported(format!("{netdev}: no replay file"))),
        Err(e) => EthtoolRead::absent(Absent::Failed(e.to_string())),
    }
}

/// `netdev`'s transceiver pages from the replay directory `dir` (the file's `module`): an
/// absent key or file is unsupported, an unreadable or malformed file (a bad page) fails.
pub fn load_module(dir: &Path, netdev: &str) -> Result<Pages, Absent> {
    match read(dir, netdev) {
        Ok(Some(s)) => s
            .module
            .map(|m| m.pages)
            .ok_or_else(|| Absent::Unsupported(format!("{netdev}: no module in the replay file"))),
        Ok(None) => Err(Absent::Unsupported(format!("{netdev}: no replay file"))),
        Err(e) => Err(Absent::Failed(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ethtool::FecLane;
    use crate::model::ethtool::FecMode;
    use crate::model::ethtool::FecSnapshot;
    use crate::model::ethtool::PauseSnapshot;
    use proptest::prelude::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn mlx5() -> EthtoolSnapshot {
        EthtoolSnapshot {
            fec: Some(FecSnapshot {
                active: Some(FecMode::Rs),
                corrected_blocks: Some(1_000),
                uncorrectable_blocks: Some(0),
                corrected_bits: Some(12_345_678_901),
                lanes: vec![
                    FecLane { corrected_blocks: Some(600), uncorrectable_blocks: Some(0), corrected_bits: None },
                    FecLane { corrected_blocks: Some(400), uncorrectable_blocks: Some(0), corrected_bits: None },
                ],
            }),
            pause: Some(PauseSnapshot { tx_frames: Some(0), rx_frames: Some(u64::MAX) }),
            stats: Some([("rx_prio3_pause_duration".to_string(), 5), ("rx_corrected_bits_phy".to_string(), 7)].into()),
            module: None,
        }
    }

    #[test]
    fn the_format_is_the_documented_one() {
        let text = to_json(&mlx5());
        let want = r#"{
  "fec": {
    "active": "RS",
    "corrected_blocks": 1000,
    "uncorrectable_blocks": 0,
    "corrected_bits": 12345678901,
    "lanes": [
      {
        "corrected_blocks": 600,
        "uncorrectable_blocks": 0
      },
      {
        "corrected_blocks": 400,
        "uncorrectable_blocks": 0
      }
    ]
  },
  "pause": {
    "tx_frames": 0,
    "rx_frames": 18446744073709551615
  },
  "stats": {
    "rx_corrected_bits_phy": 7,
    "rx_prio3_pause_duration": 5
  }
}
"#;
        assert_eq!(text, want);
        assert_eq!(to_json(&EthtoolSnapshot::default()), "{}\n");
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = include_str!("../../../../docs/ethtool-replay.md");
        let start = doc.find("```json\n").expect("an example") + "```json\n".len();
        let example = &doc[start..start + doc[start..].find("```").expect("its end")];
        let s = from_json(example.as_bytes()).unwrap();
        let fec = s.fec.as_ref().unwrap();
        assert_eq!((fec.active, fec.lanes.len(), fec.lanes[1].corrected_bits), (Some(FecMode::Rs), 2, None));
        assert_eq!(s.stats.as_ref().map(|m| m.len()), Some(2));
        assert_eq!(from_json(to_json(&s).as_bytes()).unwrap(), s);
    }

    #[test]
    fn written_files_load_back_identically() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "enp1s0f0", &mlx5()).unwrap();
        let read = load(dir.path(), "enp1s0f0");
        assert_eq!(read.snapshot(), mlx5());
        let bytes = std::fs::read(path(dir.path(), "enp1s0f0").unwrap()).unwrap();
        assert_eq!(to_json(&read.snapshot()).as_bytes(), bytes);
    }

    #[test]
    fn absent_keys_and_files_are_unsupported_bad_files_fail() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("veth0.json"), r#"{"stats": {}, "future": [1]}"#).unwrap();
        let read = load(dir.path(), "veth0");
        assert!(read.fec.as_ref().is_err_and(Absent::is_unsupported));
        assert!(read.pause.as_ref().is_err_and(Absent::is_unsupported));
        assert_eq!(read.stats, Ok(Default::default()));
        assert!(load(dir.path(), "eth9").fec.is_err_and(|e| e.is_unsupported()));
        for (name, text) in [
            ("neg", r#"{"pause": {"tx_frames": -1}}"#),
            ("frac", r#"{"fec": {"corrected_bits": 1.5}}"#),
            ("mode", r#"{"fec": {"active": "rs"}}"#),
            ("trunc", r#"{"fec": {"#),
        ] {
            std::fs::write(dir.path().join(format!("{name}.json")), text).unwrap();
            let read = load(dir.path(), name);
            assert!(matches!(&read.fec, Err(Absent::Failed(w)) if w.contains(name)), "{name}: {read:?}");
        }
        for bad in ["", "..", "a/b", "x\0", "abcdefghijklmnop"] {
            assert!(matches!(load(dir.path(), bad).fec, Err(Absent::Failed(_))), "{bad:?}");
        }
    }

    /// A FIFO named like a replay file is refused before it is opened: `read` answers at
    /// once with a one-line error naming the file, with no writer ever coming. (Opening a
    /// FIFO for reading blocks until a writer comes: on a regression the read never
    /// returns, and the guard below fails the test instead of hanging it.)
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("eth7.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let replay_dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send((read(&replay_dir, "eth7").map(|s| s.is_some()), load(&replay_dir, "eth7")));
        });
        let Ok((got, loaded)) = rx.recv_timeout(std::time::Duration::from_secs(10)) else {
            // Let the stuck open go (a writer that does not wait) before failing.
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
            panic!("reading a FIFO in the replay directory blocked");
        };
        let why = got.unwrap_err().to_string();
        assert!(why.contains("eth7.json") && why.contains("not a regular file (a FIFO)"), "{why}");
        assert!(!why.contains('\n'), "one line: {why}");
        assert!(matches!(&loaded.fec, Err(Absent::Failed(w)) if *w == why), "{loaded:?}");
        assert!(matches!(&loaded.stats, Err(Absent::Failed(w)) if *w == why), "{loaded:?}");
    }

    /// A key given twice (a statistic, a part, a field) is an error, never the last one's
    /// value: a file nicmon cannot understand says nothing.
    #[test]
    fn a_key_given_twice_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("stat", r#"{"stats": {"rx_prio3_pause_duration": 5, "rx_prio3_pause_duration": 9}}"#),
            ("part", r#"{"pause": {"tx_frames": 1}, "pause": {"tx_frames": 2}}"#),
            ("field", r#"{"pause": {"tx_frames": 1, "tx_frames": 2}}"#),
            ("lane", r#"{"fec": {"lanes": [{"corrected_blocks": 1, "corrected_blocks": 2}]}}"#),
        ] {
            assert!(from_json(text.as_bytes()).is_err(), "{name}: {:?}", from_json(text.as_bytes()));
            std::fs::write(dir.path().join(format!("{name}.json")), text).unwrap();
            let read = load(dir.path(), name);
            assert!(matches!(&read.stats, Err(Absent::Failed(w)) if w.contains(&format!("{name}.json"))), "{read:?}");
        }
        // Distinct names, and `null` for a part, still parse.
        let s = from_json(br#"{"stats": {"a": 1, "b": 2}, "pause": null}"#).unwrap();
        assert_eq!((s.stats.map(|m| m.len()), s.pause), (Some(2), None));
        assert_eq!(from_json(br#"{"stats": null}"#).unwrap(), EthtoolSnapshot::default());
    }

    /// A file larger than a replay file can be is refused; a directory by that name too.
    #[test]
    fn oversized_files_and_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big.json"), vec![b' '; MAX_FILE + 1]).unwrap();
        let why = read(dir.path(), "big").unwrap_err().to_string();
        assert!(why.contains("big.json") && why.contains("larger than"), "{why}");
        std::fs::create_dir(dir.path().join("d.json")).unwrap();
        let why = read(dir.path(), "d").unwrap_err().to_string();
        assert!(why.contains("d.json") && why.contains("not a regular file (a directory)"), "{why}");
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            prop_oneof![Just("RS".to_string()), Just("bit9".to_string()), ".*".prop_map(|s: String| s)]
                .prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            let keys = prop_oneof![
                Just("fec".to_string()),
                Just("pause".to_string()),
                Just("stats".to_string()),
                Just("active".to_string()),
                Just("lanes".to_string()),
                Just("corrected_bits".to_string()),
                Just("tx_frames".to_string()),
                "[a-z_]{1,8}".prop_map(|s: String| s),
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map(keys, inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = from_json(&bytes);
        }

        #[test]
        fn a_statistic_given_twice_never_parses(
            stats in proptest::collection::btree_map("[a-z_]{1,12}", any::<u64>(), 1..6),
            pick in any::<prop::sample::Index>(), again in any::<u64>(),
        ) {
            let mut pairs: Vec<String> = stats.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
            let dup = pick.get(&stats.keys().collect::<Vec<_>>()).to_string();
            pairs.insert(pick.index(pairs.len() + 1), format!("{dup:?}: {again}"));
            let text = format!("{{\"stats\": {{{}}}}}", pairs.join(", "));
            prop_assert!(from_json(text.as_bytes()).is_err(), "{}", text);
        }

        #[test]
        fn json_never_panics_and_what_parses_round_trips(v in json_value()) {
            let text = serde_json::to_vec(&v).unwrap();
            if let Ok(s) = from_json(&text) {
                let again = to_json(&s);
                prop_assert_eq!(from_json(again.as_bytes()).unwrap(), s.clone());
                prop_assert_eq!(to_json(&from_json(again.as_bytes()).unwrap()), again);
            }
        }
    }
}
