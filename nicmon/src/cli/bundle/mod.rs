//! Support bundles: capture what nicmon reads on a node into one archive (`nicmon bundle`),
//! and replay it anywhere (`nicmon check --bundle`, `nicmon topology --bundle`).
//!
//! **What is captured is what the read code asks for.** The capture runs the same read
//! code as `nicmon check` (discovery, the topology from metadata *and* from sysfs, one poll
//! cycle with the node's state, the kernel-log attribution facts) through a [`Host`](crate::read::host::Host) with
//! an [`AccessLog`](crate::read::host::AccessLog), against a *staging* tree unpacked from the bundle built so far. Every
//! path asked about is then copied from the node — with each symlink on the way kept as a
//! symlink — and the pass repeats until it asks for nothing new. The live node is touched
//! only by the bounded copier below, never by the read code, so a stuck file cannot hang a
//! capture; and the last pass ran against exactly the tree the bundle holds, so a replay
//! reads what the node gave.
//!
//! **Files that cannot be read** are kept as symlinks to `nicmon-bundle:<why>`
//! ([`FAILURE_LINK_PREFIX`](crate::read::host::FAILURE_LINK_PREFIX)), which the host reader turns back into the same failure:
//! `errno=22` replays `EINVAL` (and its memo), `not-regular:a FIFO` a FIFO (the kind as the reader names it), `stuck` a file
//! whose read did not finish within the per-file limit. Each is listed in the manifest.
//! Entries that were only listed (a directory's names were read, the entry never was) are
//! empty files, counted in the manifest.
//!
//! **Bounds:** a per-file read timeout, a total time budget, a per-file size cap and a
//! total size cap; files past a bound become failure links and are listed. Nothing else is
//! read: no token files, nothing nicmon does not read, except the matched kernel-log
//! records, `nicmon version` and the running daemon's wake-up hook metrics.
//!
//! Rooms: `capture.rs` (the capture loop, in named steps), `copier.rs` (the bounded copier:
//! the only code that touches the live node), `side.rs` (the files beside the trees: the
//! kernel log, the version, the daemon's wake-up hooks), `archive.rs` (the tar archive and
//! the staging tree), `replay.rs` (unpacking a bundle and replaying `check`/`topology`),
//! `unpack.rs` (the bounded unpacker: what a bundle may hold, and how much),
//! `error.rs` (why a capture or a replay failed: [`BundleError`]).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::read::host::Tree;

mod archive;
pub mod capture;
mod copier;
mod error;
pub mod replay;
mod side;
mod unpack;

pub use capture::capture;
pub use error::BundleError;
pub use replay::{Replay, replay_check, replay_topology, unpack};
pub use side::version_text;

/// The bundle format version in the manifest.
pub const FORMAT: u32 = 1;

pub(super) const MANIFEST: &str = "manifest.json";
pub(super) const SYS: &str = "sys";
pub(super) const PROC: &str = "proc";
pub(super) const METADATA: &str = "metadata.json";
pub(super) const CONFIG: &str = "config.toml";
pub(super) const STATE: &str = "state.json";
pub(super) const BOOT_ID: &str = "boot_id";
pub(super) const KMSG: &str = "kmsg.txt";
pub(super) const VERSION: &str = "version.txt";
pub(super) const WAKE: &str = "wake-hooks.txt";
/// The RoCE netdevs' ethtool replay files (`ethtool/<netdev>.json`, SPEC §1.11).
pub(super) const ETHTOOL: &str = "ethtool";
/// The PCI functions' devlink health replay files (`devlink/<BDF>.json`, SPEC §1.13).
pub(super) const DEVLINK: &str = "devlink";

/// What `nicmon bundle` reads and where it writes.
#[derive(Debug, Clone)]
pub struct CaptureArgs {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
    pub metadata: PathBuf,
    pub config: PathBuf,
    pub state_file: Option<PathBuf>,
    pub boot_id_path: Option<PathBuf>,
    pub node_name: Option<String>,
    /// The kernel log to take matched records from (`/dev/kmsg`, or a file of records).
    pub kmsg: Option<PathBuf>,
    /// Port of the running daemon's `/metrics` (wake-up hook status).
    pub metrics_port: Option<u16>,
    pub limits: Limits,
    /// Where the RoCE netdevs' ethtool data is read from (`--ethtool-replay`; `None`: the
    /// kernel, when `sysfs` is the live sysfs). Captured as `ethtool/<netdev>.json`.
    pub ethtool_replay: Option<PathBuf>,
    /// Where the NICs' devlink health reporters are read from (`--devlink-replay`; `None`:
    /// the kernel, when `sysfs` is the live sysfs). Captured as `devlink/<BDF>.json`.
    pub devlink_replay: Option<PathBuf>,
}

/// The bounds of one capture.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A file whose read has not finished after this long is skipped (`stuck`).
    pub per_file: Duration,
    /// The whole capture; files not read by then are skipped (`time-budget`).
    pub total: Duration,
    /// A larger file is skipped (`too-large`).
    pub file_bytes: u64,
    /// Once the captured files add up to this, further files are skipped (`size-budget`).
    pub total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_file: Duration::from_secs(2),
            total: Duration::from_secs(120),
            file_bytes: FILE_BYTES,
            total_bytes: TOTAL_BYTES,
        }
    }
}

/// A capture's per-file size cap ([`Limits::file_bytes`]); a replay holds bundles to it too.
pub(super) const FILE_BYTES: u64 = 1 << 20;
/// A capture's total size cap ([`Limits::total_bytes`]); a replay holds bundles to it too.
pub(super) const TOTAL_BYTES: u64 = 64 << 20;

/// The host paths a bundle was captured from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostPaths {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
    pub metadata: PathBuf,
    pub config: PathBuf,
    pub state_file: Option<PathBuf>,
    pub boot_id_path: Option<PathBuf>,
}

/// A file nicmon reads that the bundle holds as a failure, and why.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Failure {
    pub path: String,
    pub why: String,
}

/// `manifest.json`: what the bundle is and what it holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub format: u32,
    pub nicmon_version: String,
    pub captured_at: String,
    pub node_name: String,
    pub host_paths: HostPaths,
    /// Bundle file → `captured`, or why not (`missing: ...`, `not captured: ...`).
    pub files: BTreeMap<String, String>,
    /// Tree entries by kind: `file`, `dir`, `link`, `listed-only`, `failure`.
    pub entries: BTreeMap<String, usize>,
    /// Files kept as failure links (unreadable, EINVAL, FIFO, stuck, over a bound).
    pub failures: Vec<Failure>,
    pub kmsg_records: usize,
    /// Capture passes until nothing new was asked for.
    pub passes: u32,
    /// False when a bound cut the capture short or it did not converge.
    pub complete: bool,
    pub elapsed_ms: u64,
}

/// A finished capture: the compressed archive and its manifest.
pub struct Bundle {
    pub bytes: Vec<u8>,
    pub manifest: Manifest,
}

/// One entry of the captured trees, by its canonical (symlink-free) path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Node {
    Dir {
        listed: bool,
    },
    File(Vec<u8>),
    /// Listed in a directory nicmon lists, never read: an empty file in the bundle.
    ListedOnly,
    Link(String),
    /// A file that could not be read: a link to `nicmon-bundle:<why>`.
    Failed(String),
}

/// The captured trees' entries, by tree and canonical path.
pub(super) type Nodes = BTreeMap<(Tree, String), Node>;

/// A file outside the trees (metadata, config, state, boot ID): its bytes, or why not.
pub(super) type SideFile = std::result::Result<Vec<u8>, String>;

/// `ethtool/<netdev>.json` replay files (SPEC §1.11), by netdev.
pub(super) type EthtoolFiles = BTreeMap<String, Vec<u8>>;

/// The top directory of `tree` in a bundle.
pub(super) fn top(tree: Tree) -> &'static str {
    match tree {
        Tree::Sys => SYS,
        Tree::Proc => PROC,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::time::Instant;

    use proptest::prelude::*;

    use super::archive::archive;
    use super::capture::{Capture, inside_target};
    use super::copier::{read_all, read_all_with};
    use super::replay::unpack_from;
    use super::side::split_records;

    use nicmon_tests::blocking::{fifo_in, promptly};

    /// A FIFO given as `--bundle FILE` is refused before it is opened.
    #[test]
    fn a_fifo_bundle_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_in(dir.path(), "b.tar.gz");
        let why = promptly(move || super::unpack(&fifo).map(|_| ()).map_err(|e| e.to_string())).unwrap_err();
        assert!(why.contains("b.tar.gz") && why.contains("not a regular file: a FIFO"), "{why}");
    }

    use super::*;
    use crate::read::host::{Access, Host};

    proptest! {
        #[test]
        fn any_bytes_unpack_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = unpack_from(&bytes[..], "p");
            let _ = unpack_from(flate2::read::GzDecoder::new(&bytes[..]), "p");
        }

        #[test]
        fn record_splitting_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let recs = split_records(&bytes);
            prop_assert!(recs.iter().all(|r| !r.is_empty()));
        }
    }

    #[test]
    fn a_manifest_survives_the_archive() {
        let cap = Capture {
            sysfs: "/sys".into(),
            procfs: "/proc".into(),
            nodes: BTreeMap::new(),
            einval_memo: BTreeSet::new(),
            limits: Limits::default(),
            deadline: Instant::now(),
            bytes: 0,
            changes: 0,
            cut_short: false,
            pending: BTreeMap::new(),
            dirty: BTreeSet::new(),
        };
        let m = Manifest {
            format: FORMAT,
            nicmon_version: "0".into(),
            captured_at: "t".into(),
            node_name: "n".into(),
            host_paths: HostPaths {
                sysfs: "/sys".into(),
                procfs: "/proc".into(),
                metadata: "/m.json".into(),
                config: "/c.toml".into(),
                state_file: None,
                boot_id_path: None,
            },
            files: BTreeMap::new(),
            entries: BTreeMap::new(),
            failures: vec![Failure { path: "/sys/x".into(), why: "stuck".into() }],
            kmsg_records: 0,
            passes: 1,
            complete: true,
            elapsed_ms: 0,
        };
        let mut side = BTreeMap::new();
        side.insert(METADATA, Ok(b"{}".to_vec()));
        let replay = unpack_from(&archive(&cap.nodes, &side, &[], Some(&m)).unwrap()[..], "t").unwrap();
        assert_eq!(replay.manifest.as_ref(), Some(&m));
        assert_eq!(std::fs::read(replay.metadata()).unwrap(), b"{}");
        assert!(replay.state_file().is_none());
        // Output naming the replay tree names the node's paths.
        let shown = replay.show_as_node(format!("{}: bad", replay.metadata().display()));
        assert_eq!(shown, "/m.json: bad");
        // A newer format is refused with a message naming it.
        let newer = Manifest { format: FORMAT + 1, ..m };
        let err = unpack_from(&archive(&cap.nodes, &side, &[], Some(&newer)).unwrap()[..], "bundle x").err().unwrap();
        assert!(err.to_string().contains("bundle x: bundle format 2"), "{err}");
    }

    #[test]
    fn link_targets_stay_inside_the_tree() {
        let root = Path::new("/r/sys");
        let parent: Vec<String> = ["class", "infiniband"].iter().map(|s| s.to_string()).collect();
        let (text, at) = inside_target(root, &parent, Path::new("../../devices/pci0000:00/x")).unwrap();
        assert_eq!(text, "../../devices/pci0000:00/x");
        assert_eq!(at, ["devices", "pci0000:00", "x"]);
        // An absolute link into the tree is stored relative, so the bundle stands alone.
        let (text, at) = inside_target(root, &parent, Path::new("/r/sys/devices/y")).unwrap();
        assert_eq!(text, "../../devices/y");
        assert_eq!(at, ["devices", "y"]);
        assert!(inside_target(root, &parent, Path::new("/sys/class/net/lo/speed")).is_none());
        assert!(inside_target(root, &parent, Path::new("../../../etc")).is_none());
    }

    #[test]
    fn a_read_that_does_not_finish_is_given_up() {
        // A pipe nobody writes to would block a read forever: it is never opened.
        let mut fds = [0; 2];
        // SAFETY: fds is a live array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let stuck = PathBuf::from(format!("/proc/self/fd/{}", fds[0]));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ok"), "1\n").unwrap();
        let limits = Limits { per_file: Duration::from_millis(200), ..Limits::default() };
        let got = read_all(
            vec![dir.path().join("ok"), stuck, dir.path().join("ok"), dir.path().join("none")],
            1 << 20,
            &limits,
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(got[0], Ok(b"1\n".to_vec()));
        assert_eq!(got[1], Err("not-regular:a FIFO".into()), "a pipe is not a regular file");
        assert_eq!(got[2], Ok(b"1\n".to_vec()));
        assert_eq!(got[3], Err(format!("errno={}", libc::ENOENT)));

        // A read that never returns (a driver stuck in show()): skipped, the rest still read.
        let reader = |p: &Path| {
            if p.ends_with("stuck") {
                loop {
                    std::thread::park();
                }
            }
            Ok(p.to_string_lossy().into_owned().into_bytes())
        };
        let got = read_all_with(
            vec!["a".into(), "stuck".into(), "b".into()],
            reader,
            1 << 20,
            &limits,
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(got, vec![Ok(b"a".to_vec()), Err("stuck".into()), Ok(b"b".to_vec())]);
    }

    #[test]
    fn records_split_with_their_continuation_lines() {
        let raw = b"6,1,5,-;mlx5_core 0000:1a:00.0: x\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0\nplain line\n\n";
        let recs = split_records(raw);
        assert_eq!(recs.len(), 2);
        assert_eq!(
            crate::model::kmsg::parse_record(&recs[0]).device.as_ref().and_then(|d| d.pci()),
            Some("0000:1a:00.0")
        );
        assert_eq!(recs[1], b"plain line");
    }

    #[test]
    fn a_fifo_and_a_dangling_link_are_captured_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("a")).unwrap();
        let fifo = std::ffi::CString::new(sys.join("a/fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::os::unix::fs::symlink("../nowhere", sys.join("a/dangling")).unwrap();
        std::fs::write(sys.join("a/file"), "1\n").unwrap();
        let mut cap = Capture {
            sysfs: sys.clone(),
            procfs: dir.path().join("proc"),
            nodes: BTreeMap::new(),
            einval_memo: BTreeSet::new(),
            limits: Limits::default(),
            deadline: Instant::now() + Duration::from_secs(60),
            bytes: 0,
            changes: 0,
            cut_short: false,
            pending: BTreeMap::new(),
            dirty: BTreeSet::new(),
        };
        for f in ["a/fifo", "a/dangling", "a/file"] {
            cap.take(&Access::Read { tree: Tree::Sys, rel: f.into() });
        }
        cap.read_pending();
        assert_eq!(cap.nodes[&(Tree::Sys, "a/fifo".into())], Node::Failed("not-regular:a FIFO".into()));
        assert_eq!(cap.nodes[&(Tree::Sys, "a/dangling".into())], Node::Link("../nowhere".into()));
        assert_eq!(cap.nodes[&(Tree::Sys, "a/file".into())], Node::File(b"1\n".to_vec()));
        // The replayed tree fails the same way through the host reader.
        let replay = unpack_from(&archive(&cap.nodes, &BTreeMap::new(), &[], None).unwrap()[..], "t").unwrap();
        let live = Host::new(&sys, "/nonexistent");
        let again = Host::new(replay.sysfs(), "/nonexistent");
        for f in ["a/fifo", "a/dangling", "a/file", "a/none"] {
            assert_eq!(live.read_sys(f), again.read_sys(f), "{f}");
        }
    }
}
