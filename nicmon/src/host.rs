//! The host reader: the only code that reads sysfs and procfs.
//!
//! Rooted at `--sysfs` / `--procfs` (defaults `/sys`, `/proc`); the real host and the
//! testbed's fixture trees go through this same code, only the roots differ. It makes no
//! decisions: it returns bytes, link targets and directory listings, or says why it could
//! not. One rule lives here because it is about *reading*: a file whose `read()` failed
//! with `EINVAL` is never opened again for the life of this reader (SPEC §1.1 — reading
//! restricted counters makes mlx5 log `ACCESS_REG ... failed` on every read). The set is
//! exported so the state file can carry it across restarts within one boot.
use std::collections::BTreeSet;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The file does not exist (or a dangling link).
    Missing,
    /// `read()` failed with `EINVAL` (now or earlier in this boot): not read again.
    Invalid,
    /// Any other I/O error (permission, EIO, ...).
    Io(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => f.write_str("missing"),
            ReadError::Invalid => f.write_str("read failed with EINVAL"),
            ReadError::Io(e) => f.write_str(e),
        }
    }
}

/// Counts of what the reader did, for metrics and tests.
#[derive(Debug, Default)]
pub struct ReadStats {
    pub files_read: AtomicU64,
    pub einval_skipped: AtomicU64,
}

/// A host (or a fixture tree standing in for one).
#[derive(Debug)]
pub struct Host {
    sysfs: PathBuf,
    procfs: PathBuf,
    boot_id_path: Option<PathBuf>,
    einval: Mutex<BTreeSet<String>>,
    pub stats: ReadStats,
}

impl Host {
    pub fn new(sysfs: impl Into<PathBuf>, procfs: impl Into<PathBuf>) -> Host {
        Host {
            sysfs: sysfs.into(),
            procfs: procfs.into(),
            boot_id_path: None,
            einval: Mutex::new(BTreeSet::new()),
            stats: ReadStats::default(),
        }
    }

    /// Read the boot ID from `path` instead of `<procfs>/sys/kernel/random/boot_id`.
    pub fn with_boot_id_path(mut self, path: Option<PathBuf>) -> Host {
        self.boot_id_path = path;
        self
    }

    pub fn sysfs_root(&self) -> &Path {
        &self.sysfs
    }

    pub fn procfs_root(&self) -> &Path {
        &self.procfs
    }

    /// The absolute path of a sysfs-relative path (`class/infiniband/mlx5_0`).
    pub fn sys(&self, rel: &str) -> PathBuf {
        self.sysfs.join(rel)
    }

    /// Read a sysfs file as text (lossy UTF-8).
    pub fn read_sys(&self, rel: &str) -> Result<String, ReadError> {
        self.read_at(&self.sys(rel), rel)
    }

    /// Read a procfs file as text.
    pub fn read_proc(&self, rel: &str) -> Result<String, ReadError> {
        let key = format!("proc:{rel}");
        self.read_at(&self.procfs.join(rel), &key)
    }

    /// Read the first `n` bytes of a sysfs file (PCI config space).
    pub fn read_sys_bytes(&self, rel: &str, n: usize) -> Result<Vec<u8>, ReadError> {
        use std::io::Read;
        let path = self.sys(rel);
        self.stats.files_read.fetch_add(1, Ordering::Relaxed);
        let mut f = std::fs::File::open(&path).map_err(|e| classify(&e))?;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match f.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(classify(&e)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// The boot ID (`--boot-id-path`, else `<procfs>/sys/kernel/random/boot_id`).
    pub fn boot_id(&self) -> Result<String, ReadError> {
        let raw = match &self.boot_id_path {
            Some(p) => self.read_at(p, "boot_id")?,
            None => self.read_proc("sys/kernel/random/boot_id")?,
        };
        let t = raw.trim();
        if t.is_empty() { Err(ReadError::Io("empty boot ID".into())) } else { Ok(t.to_string()) }
    }

    /// Names in a sysfs directory, sorted. A missing directory is an empty listing.
    pub fn list_sys(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = match std::fs::read_dir(self.sys(rel)) {
            Ok(rd) => rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    /// Names in a sysfs directory, sorted, or why it could not be listed: `Missing` when
    /// absent, `Io` naming the cause otherwise (a file where a directory should be).
    pub fn list_sys_dir(&self, rel: &str) -> Result<Vec<String>, ReadError> {
        let rd = std::fs::read_dir(self.sys(rel)).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ReadError::Missing,
            io::ErrorKind::NotADirectory => ReadError::Io("not a directory".into()),
            _ => ReadError::Io(e.to_string()),
        })?;
        let mut names: Vec<String> =
            rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        Ok(names)
    }

    /// Whether a sysfs entry exists (a dangling symlink counts: `physfn` is a link).
    pub fn exists_sys(&self, rel: &str) -> bool {
        std::fs::symlink_metadata(self.sys(rel)).is_ok()
    }

    /// Whether a sysfs entry exists and resolves (follows links).
    pub fn resolves_sys(&self, rel: &str) -> bool {
        std::fs::metadata(self.sys(rel)).is_ok()
    }

    /// The last component of a sysfs symlink's target (`device/driver` → `mlx5_core`).
    pub fn link_name_sys(&self, rel: &str) -> Option<String> {
        let target = std::fs::read_link(self.sys(rel)).ok()?;
        target.file_name().map(|n| n.to_string_lossy().into_owned())
    }

    /// A sysfs symlink's target resolved lexically against the link's directory and made
    /// relative to the sysfs root, as components: `bus/pci/devices/0000:1a:00.0` →
    /// `["devices", "pci0000:17", "0000:17:01.0", ..., "0000:1a:00.0"]`. Lexical, so a
    /// fixture tree resolves exactly like `/sys` does.
    pub fn link_target_sys(&self, rel: &str) -> Option<Vec<String>> {
        let target = std::fs::read_link(self.sys(rel)).ok()?;
        let base: Vec<String> =
            Path::new(rel).parent().map(|p| p.components().filter_map(comp_name).collect()).unwrap_or_default();
        let mut parts = if target.is_absolute() {
            // An absolute target on the real host (`/sys/devices/...`).
            match target.strip_prefix(&self.sysfs) {
                Ok(_) => Vec::new(),
                Err(_) => return None,
            }
        } else {
            base
        };
        let rest = if target.is_absolute() { target.strip_prefix(&self.sysfs).ok()?.to_path_buf() } else { target };
        for c in rest.components() {
            match c {
                Component::ParentDir => {
                    parts.pop()?;
                }
                Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
                _ => {}
            }
        }
        Some(parts)
    }

    /// Files that failed with `EINVAL` so far (sysfs-relative), for the state file.
    pub fn einval_paths(&self) -> Vec<String> {
        self.einval.lock().map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// Seed the `EINVAL` set (from the state file of the same boot).
    pub fn remember_einval(&self, paths: impl IntoIterator<Item = String>) {
        if let Ok(mut s) = self.einval.lock() {
            s.extend(paths);
        }
    }

    fn read_at(&self, path: &Path, key: &str) -> Result<String, ReadError> {
        if self.einval.lock().map(|s| s.contains(key)).unwrap_or(false) {
            self.stats.einval_skipped.fetch_add(1, Ordering::Relaxed);
            return Err(ReadError::Invalid);
        }
        self.stats.files_read.fetch_add(1, Ordering::Relaxed);
        match std::fs::read(path) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Err(e) => {
                let err = classify(&e);
                if err == ReadError::Invalid {
                    if let Ok(mut s) = self.einval.lock() {
                        s.insert(key.to_string());
                    }
                    tracing::warn!(path = %path.display(), "read failed with EINVAL: not reading it again in this boot");
                }
                Err(err)
            }
        }
    }
}

fn comp_name(c: Component<'_>) -> Option<String> {
    match c {
        Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
        _ => None,
    }
}

fn classify(e: &io::Error) -> ReadError {
    match e.raw_os_error() {
        Some(libc::EINVAL) => ReadError::Invalid,
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => ReadError::Missing,
        _ if e.kind() == io::ErrorKind::NotFound => ReadError::Missing,
        _ => ReadError::Io(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einval_file_is_opened_once() {
        // `/sys/class/net/lo/speed` fails with EINVAL on every Linux host: a real EINVAL.
        if std::fs::read("/sys/class/net/lo/speed").map_err(|e| e.raw_os_error()) != Err(Some(libc::EINVAL)) {
            eprintln!("skipped: /sys/class/net/lo/speed does not fail with EINVAL on this host");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("x")).unwrap();
        std::os::unix::fs::symlink("/sys/class/net/lo/speed", sys.join("x/restricted")).unwrap();
        std::fs::write(sys.join("x/fine"), "7\n").unwrap();
        let host = Host::new(&sys, dir.path().join("proc"));
        assert_eq!(host.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(host.stats.files_read.load(Ordering::Relaxed), 1);
        assert_eq!(host.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(host.stats.files_read.load(Ordering::Relaxed), 1, "opened again");
        assert_eq!(host.stats.einval_skipped.load(Ordering::Relaxed), 1);
        assert_eq!(host.einval_paths(), vec!["x/restricted".to_string()]);
        assert_eq!(host.read_sys("x/fine").as_deref(), Ok("7\n"));
        assert_eq!(host.read_sys("x/none"), Err(ReadError::Missing));
        // A new reader seeded from the state file does not open it either.
        let again = Host::new(&sys, dir.path().join("proc"));
        again.remember_einval(host.einval_paths());
        assert_eq!(again.read_sys("x/restricted"), Err(ReadError::Invalid));
        assert_eq!(again.stats.files_read.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn link_targets_resolve_lexically() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        std::fs::create_dir_all(sys.join("devices/pci0000:17/0000:17:01.0/0000:18:00.0")).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:17/0000:17:01.0/0000:18:00.0",
            sys.join("bus/pci/devices/0000:18:00.0"),
        )
        .unwrap();
        let host = Host::new(sys, "/nonexistent");
        assert_eq!(
            host.link_target_sys("bus/pci/devices/0000:18:00.0").unwrap(),
            vec!["devices", "pci0000:17", "0000:17:01.0", "0000:18:00.0"]
        );
        assert_eq!(host.link_name_sys("bus/pci/devices/0000:18:00.0").as_deref(), Some("0000:18:00.0"));
        assert!(host.link_target_sys("bus/pci/devices/nope").is_none());
    }
}
