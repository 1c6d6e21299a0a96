//! The devlink replay format (SPEC §1.13): `<dir>/<BDF>.json` holds a PCI function's health
//! reporters as [`Reporters`]' JSON; a missing file is a function without devlink (not
//! supported). Read like every file outside sysfs ([`crate::read::host::read_file`]: only
//! a regular file, bounded); `nicmon bundle` writes the files ([`write`]) and a replayed read
//! serialises to the same bytes ([`to_json`]).
use std::path::{Path, PathBuf};

use crate::model::ReadError;
use crate::model::devlink::Reporters;

/// A replay file larger than this is not read.
const MAX_FILE: usize = 1 << 20;

/// The replay file's text: pretty JSON, reporters sorted by name, one trailing newline.
pub fn to_json(r: &Reporters) -> String {
    let mut s = serde_json::to_string_pretty(&r.clone().normalised()).unwrap_or_default();
    s.push('\n');
    s
}

/// `<dir>/<address>.json`, or `None` for a name that is not a PCI address.
pub fn path(dir: &Path, address: &str) -> Option<PathBuf> {
    let ok = !address.is_empty()
        && address.len() <= 16
        && address.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    ok.then(|| dir.join(format!("{address}.json")))
}

/// Reads `<dir>/<address>.json`: `Ok(None)` when there is none; a one-line error naming the
/// file when it cannot be used.
pub fn read(dir: &Path, address: &str) -> Result<Option<Reporters>, String> {
    let Some(path) = path(dir, address) else {
        return Err(format!("{address:?} is not a PCI address"));
    };
    let bytes = match crate::read::host::read_file(&path, MAX_FILE) {
        Ok(b) => b,
        Err(ReadError::Missing) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let parsed: Reporters = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(parsed.normalised()))
}

/// Writes `<dir>/<address>.json` (creating `dir`).
pub fn write(dir: &Path, address: &str, r: &Reporters) -> Result<(), String> {
    let path = path(dir, address).ok_or_else(|| format!("{address:?} is not a PCI address"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(&path, to_json(r)).map_err(|e| format!("{}: {e}", path.display()))
}

/// The replay directory of a bundle or host tree: `<root>/devlink`.
pub fn replay_dir(root: &Path) -> PathBuf {
    root.join("devlink")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::devlink::{Reporter, ReporterState};
    use proptest::prelude::*;

    #[test]
    fn files_round_trip_and_refuse_junk() {
        let dir = tempfile::tempdir().unwrap();
        let r = Reporters {
            reporters: vec![
                Reporter { name: "fw_fatal".into(), state: ReporterState::Healthy, error_count: 0, recover_count: 0 },
                Reporter { name: "fw".into(), state: ReporterState::Error, error_count: 3, recover_count: 2 },
            ],
        };
        write(dir.path(), "0000:3b:00.0", &r).unwrap();
        let back = read(dir.path(), "0000:3b:00.0").unwrap().unwrap();
        assert_eq!(back, r.clone().normalised());
        let bytes = std::fs::read(dir.path().join("0000:3b:00.0.json")).unwrap();
        assert_eq!(to_json(&back).as_bytes(), bytes.as_slice(), "byte-identical");
        assert_eq!(read(dir.path(), "0000:3b:00.1").unwrap(), None);
        std::fs::write(dir.path().join("0000:3b:00.2.json"), "{\"reporters\": [1]}").unwrap();
        let e = read(dir.path(), "0000:3b:00.2").unwrap_err();
        assert!(e.contains("0000:3b:00.2.json") && !e.contains('\n'), "{e}");
        assert!(read(dir.path(), "../etc").is_err());
        // A FIFO is not opened (the poll would block).
        let fifo = dir.path().join("0000:3b:00.3.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read(dir.path(), "0000:3b:00.3").is_err());
    }

    proptest! {
        #[test]
        fn junk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("0000:01:00.0.json"), &bytes).unwrap();
            let _ = read(dir.path(), "0000:01:00.0");
        }
    }
}
