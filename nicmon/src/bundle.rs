//! Support bundles: capture what nicmon reads on a node into one archive (`nicmon bundle`),
//! and replay it anywhere (`nicmon check --bundle`, `nicmon topology --bundle`).
//!
//! **What is captured is what the read code asks for.** The capture runs the same read
//! code as `nicmon check` (discovery, the topology from metadata *and* from sysfs, one poll
//! cycle with the node's state, the kernel-log attribution facts) through a [`Host`] with
//! an [`AccessLog`], against a *staging* tree unpacked from the bundle built so far. Every
//! path asked about is then copied from the node — with each symlink on the way kept as a
//! symlink — and the pass repeats until it asks for nothing new. The live node is touched
//! only by the bounded copier below, never by the read code, so a stuck file cannot hang a
//! capture; and the last pass ran against exactly the tree the bundle holds, so a replay
//! reads what the node gave.
//!
//! **Files that cannot be read** are kept as symlinks to `nicmon-bundle:<why>`
//! ([`FAILURE_LINK_PREFIX`]), which the host reader turns back into the same failure:
//! `errno=22` replays `EINVAL` (and its memo), `not-regular:a FIFO` a FIFO (the kind as the reader names it), `stuck` a file
//! whose read did not finish within the per-file limit. Each is listed in the manifest.
//! Entries that were only listed (a directory's names were read, the entry never was) are
//! empty files, counted in the manifest.
//!
//! **Bounds:** a per-file read timeout, a total time budget, a per-file size cap and a
//! total size cap; files past a bound become failure links and are listed. Nothing else is
//! read: no token files, nothing nicmon does not read, except the matched kernel-log
//! records, `nicmon version` and the running daemon's wake-up hook metrics.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::check::{self, CheckArgs};
use crate::config::Config;
use crate::cycle::Monitor;
use crate::discovery::{self, ReadPlan};
use crate::ethtool;
use crate::event::Stamp;
use crate::host::{Access, AccessLog, FAILURE_LINK_PREFIX, Host, Tree, open_regular};
use crate::kmsg::{self, DeviceIndex, HostLinks, Resolution};
use crate::linkstate::StateConfig;
use crate::roles;
use crate::state::{self, Loaded, State};
use crate::topology;

/// The bundle format version in the manifest.
pub const FORMAT: u32 = 1;

const MANIFEST: &str = "manifest.json";
const SYS: &str = "sys";
const PROC: &str = "proc";
const METADATA: &str = "metadata.json";
const CONFIG: &str = "config.toml";
const STATE: &str = "state.json";
const BOOT_ID: &str = "boot_id";
const KMSG: &str = "kmsg.txt";
/// The RoCE netdevs' ethtool replay files (`ethtool/<netdev>.json`, SPEC §1.11).
const ETHTOOL: &str = "ethtool";
const VERSION: &str = "version.txt";
const WAKE: &str = "wake-hooks.txt";

/// Passes of the capture loop before it gives up converging (a tree that keeps changing).
const MAX_PASSES: u32 = 16;
/// Symlinks followed while resolving one path (as the kernel's `MAXSYMLINKS`).
const MAX_LINKS: u32 = 40;
/// Kernel-log records older than this are not included.
const KMSG_WINDOW: Duration = Duration::from_secs(24 * 3600);

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
            file_bytes: 1 << 20,
            total_bytes: 64 << 20,
        }
    }
}

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

/// One entry of the captured trees, by its canonical (symlink-free) path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
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

/// A file outside the trees (metadata, config, state, boot ID): its bytes, or why not.
type SideFile = std::result::Result<Vec<u8>, String>;

/// Everything captured so far.
struct Capture {
    sysfs: PathBuf,
    procfs: PathBuf,
    nodes: BTreeMap<(Tree, String), Node>,
    /// `EINVAL` memo keys carried by the state file: failed without reading them again.
    einval_memo: BTreeSet<String>,
    limits: Limits,
    deadline: Instant,
    bytes: u64,
    changes: u64,
    cut_short: bool,
    /// Files to read at the end of the pass: (tree, canonical path, live path, memo key).
    pending: BTreeMap<(Tree, String), (PathBuf, String)>,
    /// Entries added or changed since the staging tree was last written.
    dirty: BTreeSet<(Tree, String)>,
    /// `ethtool/<netdev>.json` replay files (SPEC §1.11), by netdev.
    ethtool: BTreeMap<String, Vec<u8>>,
}

impl Capture {
    fn root(&self, tree: Tree) -> &Path {
        match tree {
            Tree::Sys => &self.sysfs,
            Tree::Proc => &self.procfs,
        }
    }

    fn put(&mut self, tree: Tree, rel: &str, node: Node) {
        let key = (tree, rel.to_string());
        // Only upgrades: a listed entry read later, a directory listed later.
        let upgrade = matches!(
            (self.nodes.get(&key), &node),
            (None, _)
                | (Some(Node::ListedOnly), Node::File(_) | Node::Failed(_) | Node::Dir { .. } | Node::Link(_))
                | (Some(Node::Dir { listed: false }), Node::Dir { listed: true })
        );
        if upgrade {
            if let Node::File(b) = &node {
                self.bytes += b.len() as u64;
            }
            self.dirty.insert(key.clone());
            self.nodes.insert(key, node);
            self.changes += 1;
        }
    }

    /// Capture what answering `access` takes: every link and directory on the way to the
    /// path, then the entry itself (contents, listing, or just its kind).
    fn take(&mut self, access: &Access) {
        let (tree, rel, want) = match access {
            Access::Read { tree, rel } => (*tree, rel.as_str(), Want::Contents),
            Access::List { tree, rel } => (*tree, rel.as_str(), Want::Listing),
            Access::Entry { tree, rel } => (*tree, rel.as_str(), Want::Entry),
            Access::BootIdFile => return,
        };
        let memo_key = match tree {
            Tree::Sys => rel.to_string(),
            Tree::Proc => format!("proc:{rel}"),
        };
        let root = self.root(tree).to_path_buf();
        let mut queue: VecDeque<String> = components(Path::new(rel)).into();
        let mut at: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(c) = queue.pop_front() {
            if c == ".." {
                if at.pop().is_none() {
                    return; // above the root: nothing nicmon can read there
                }
                continue;
            }
            at.push(c);
            let canon = at.join("/");
            let live = root.join(&canon);
            let last = queue.is_empty();
            let Ok(meta) = std::fs::symlink_metadata(&live) else {
                return; // missing: the bundle does not have it either
            };
            if meta.file_type().is_symlink() {
                let Ok(target) = std::fs::read_link(&live) else { return };
                links += 1;
                let parent = &at[..at.len() - 1];
                match inside_target(&root, parent, &target) {
                    Some((text, mut resolved)) if links <= MAX_LINKS => {
                        self.put(tree, &canon, Node::Link(text));
                        // Continue from the target's place in the tree.
                        at.clear();
                        resolved.extend(queue.drain(..));
                        queue = resolved.into();
                    }
                    _ => {
                        // A link out of the tree (a test fixture's, or a loop): the bytes it
                        // gives when it is the file read, else a failure.
                        if last && want == Want::Contents {
                            self.pending.insert((tree, canon), (live, memo_key.clone()));
                        } else {
                            self.put(tree, &canon, Node::Failed("outside-tree".into()));
                        }
                        return;
                    }
                }
                continue;
            }
            if !last {
                if !meta.is_dir() {
                    return; // ENOTDIR: missing
                }
                self.put(tree, &canon, Node::Dir { listed: false });
                continue;
            }
            if meta.is_dir() {
                self.put(tree, &canon, Node::Dir { listed: want == Want::Listing });
                if want == Want::Listing {
                    self.take_listing(tree, &root, &at);
                }
            } else if !meta.is_file() {
                let kind = crate::host::non_regular_kind(&meta).unwrap_or("not a file");
                self.put(tree, &canon, Node::Failed(format!("not-regular:{kind}")));
            } else if want == Want::Contents {
                if !matches!(self.nodes.get(&(tree, canon.clone())), Some(Node::File(_) | Node::Failed(_))) {
                    self.pending.insert((tree, canon), (live, memo_key.clone()));
                }
            } else {
                self.put(tree, &canon, Node::ListedOnly);
            }
        }
    }

    /// Each entry of a listed directory, by kind only.
    fn take_listing(&mut self, tree: Tree, root: &Path, dir: &[String]) {
        let canon = dir.join("/");
        let Ok(rd) = std::fs::read_dir(root.join(&canon)) else { return };
        let mut names: Vec<String> =
            rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        for name in names {
            let rel = format!("{canon}/{name}");
            if self.nodes.contains_key(&(tree, rel.clone())) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(root.join(&rel)) else { continue };
            let node = if meta.file_type().is_symlink() {
                match std::fs::read_link(root.join(&rel)).ok().and_then(|t| inside_target(root, dir, &t)) {
                    Some((text, _)) => Node::Link(text),
                    None => Node::Failed("outside-tree".into()),
                }
            } else if meta.is_dir() {
                Node::Dir { listed: false }
            } else {
                Node::ListedOnly
            };
            self.put(tree, &rel, node);
        }
    }

    /// Read the files [`Capture::take`] asked for, within the bounds.
    fn read_pending(&mut self) {
        let mut jobs = Vec::new();
        for ((tree, canon), (live, memo_key)) in std::mem::take(&mut self.pending) {
            if self.einval_memo.contains(&memo_key) {
                // Reading a restricted counter again makes the driver log an error: the
                // state file already says it fails with EINVAL in this boot.
                self.settle(tree, &canon, Node::Failed(format!("errno={}", libc::EINVAL)));
            } else {
                jobs.push((tree, canon, live));
            }
        }
        let paths = jobs.iter().map(|(_, _, live)| live.clone()).collect();
        let results = read_all(paths, self.limits.file_bytes, &self.limits, self.deadline);
        for ((tree, canon, _), r) in jobs.into_iter().zip(results) {
            let node = match r {
                Ok(_) if self.bytes >= self.limits.total_bytes => Node::Failed("size-budget".into()),
                Ok(b) => Node::File(b),
                Err(why) => Node::Failed(why),
            };
            if matches!(&node, Node::Failed(w) if w == "time-budget" || w == "size-budget") {
                self.cut_short = true;
            }
            self.settle(tree, &canon, node);
        }
    }

    /// Store a file's contents: over a link out of the tree too (the bytes it gave).
    fn settle(&mut self, tree: Tree, canon: &str, node: Node) {
        if matches!(self.nodes.get(&(tree, canon.to_string())), Some(Node::Link(_))) {
            self.nodes.remove(&(tree, canon.to_string()));
        }
        self.put(tree, canon, node);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Contents,
    Listing,
    Entry,
}

fn components(p: &Path) -> Vec<String> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// A link target inside the tree, as the relative text to store and the components to
/// resolve from the root; `None` when it leaves the tree.
fn inside_target(root: &Path, parent: &[String], target: &Path) -> Option<(String, Vec<String>)> {
    let mut at: Vec<String> = if target.is_absolute() {
        components(target.strip_prefix(root).ok()?)
    } else {
        let mut v = parent.to_vec();
        v.extend(components(target));
        v
    };
    // Lexically: the kernel resolves `..` after each link, and `parent` is link-free.
    let mut out: Vec<String> = Vec::new();
    for c in at.drain(..) {
        if c == ".." {
            out.pop()?;
        } else {
            out.push(c);
        }
    }
    let text = if target.is_absolute() {
        let mut t = "../".repeat(parent.len());
        t.push_str(&out.join("/"));
        t
    } else {
        target.to_string_lossy().into_owned()
    };
    Some((text, out))
}

/// Read files on a worker thread, in order: regular files only, at most `cap` bytes each. A file whose read has not finished within the per-file limit is
/// `stuck` and left behind with its thread (a read stuck in the kernel cannot be
/// cancelled); a fresh worker goes on with the rest. After the deadline every file left is
/// `time-budget`. `Err` is the failure-link reason.
fn read_all(
    paths: Vec<PathBuf>,
    cap: u64,
    limits: &Limits,
    deadline: Instant,
) -> Vec<std::result::Result<Vec<u8>, String>> {
    let read = move |p: &Path| {
        let mut buf = Vec::new();
        open_regular(p)?.take(cap + 1).read_to_end(&mut buf).map(|_| buf)
    };
    read_all_with(paths, read, cap, limits, deadline)
}

fn read_all_with(
    paths: Vec<PathBuf>,
    read: impl Fn(&Path) -> std::io::Result<Vec<u8>> + Clone + Send + 'static,
    cap: u64,
    limits: &Limits,
    deadline: Instant,
) -> Vec<std::result::Result<Vec<u8>, String>> {
    let mut out: Vec<std::result::Result<Vec<u8>, String>> = Vec::with_capacity(paths.len());
    while out.len() < paths.len() {
        let rest: Vec<PathBuf> = paths[out.len()..].to_vec();
        let (tx, rx) = mpsc::channel();
        let read = read.clone();
        let spawned = std::thread::Builder::new().name("bundle-read".into()).spawn(move || {
            for p in rest {
                if tx.send(read(&p)).is_err() {
                    return;
                }
            }
        });
        if spawned.is_err() {
            out.resize_with(paths.len(), || Err("no-thread".into()));
            break;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = limits.per_file.min(left);
            match rx.recv_timeout(timeout) {
                Ok(r) => out.push(failure_of(r, cap)),
                Err(mpsc::RecvTimeoutError::Timeout) if timeout < limits.per_file => {
                    out.resize_with(paths.len(), || Err("time-budget".into()));
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    out.push(Err("stuck".into()));
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if out.len() == paths.len() {
                break;
            }
        }
    }
    out
}

fn failure_of(r: std::io::Result<Vec<u8>>, cap: u64) -> std::result::Result<Vec<u8>, String> {
    match r {
        Ok(b) if b.len() as u64 > cap => Err("too-large".into()),
        Ok(b) => Ok(b),
        Err(e) => match e.raw_os_error() {
            Some(n) => Err(format!("errno={n}")),
            None => match e.to_string().strip_prefix(crate::host::NOT_REGULAR) {
                Some(kind) => Err(format!("not-regular:{}", kind.trim_start_matches(':').trim())),
                None => Err(format!("errno={}", libc::EIO)),
            },
        },
    }
}

/// Read a file outside the trees (metadata, config, state): its bytes or why not.
fn side_file(path: &Path, limits: &Limits, deadline: Instant) -> SideFile {
    match read_all(vec![path.to_path_buf()], limits.file_bytes, limits, deadline).remove(0) {
        Ok(b) => Ok(b),
        Err(why) => Err(match why.strip_prefix("errno=").and_then(|n| n.parse().ok()) {
            Some(n) => format!("missing: {}: {}", path.display(), std::io::Error::from_raw_os_error(n)),
            None => format!("not captured: {}: {why}", path.display()),
        }),
    }
}

/// Write the entries added since the last call into a staging tree laid out as a bundle
/// unpacks (the same kinds as [`archive`] writes; replay tests compare the two).
fn write_staging(cap: &mut Capture, dir: &Path) -> Result<()> {
    for key in std::mem::take(&mut cap.dirty) {
        let Some(node) = cap.nodes.get(&key) else { continue };
        let top = match key.0 {
            Tree::Sys => SYS,
            Tree::Proc => PROC,
        };
        let path = dir.join(top).join(&key.1);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("staging {}", parent.display()))?;
        }
        if !matches!(node, Node::Dir { .. }) && std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path).with_context(|| format!("staging {}", path.display()))?;
        }
        let done = match node {
            Node::Dir { .. } => std::fs::create_dir_all(&path),
            Node::File(bytes) => std::fs::write(&path, bytes),
            Node::ListedOnly => std::fs::write(&path, b""),
            Node::Link(target) => std::os::unix::fs::symlink(target, &path),
            Node::Failed(why) => std::os::unix::fs::symlink(format!("{FAILURE_LINK_PREFIX}{why}"), &path),
        };
        done.with_context(|| format!("staging {}", path.display()))?;
    }
    Ok(())
}

/// The tar archive of everything captured (uncompressed; deterministic: sorted, no times).
fn archive(cap: &Capture, side: &BTreeMap<&'static str, SideFile>, manifest: Option<&Manifest>) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let dir = |b: &mut tar::Builder<Vec<u8>>, path: &str| -> Result<()> {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, path, std::io::empty()).with_context(|| format!("bundle: adding {path}"))
    };
    dir(&mut b, SYS)?;
    dir(&mut b, PROC)?;
    if let Some(m) = manifest {
        let bytes = serde_json::to_vec_pretty(m)?;
        append_file(&mut b, MANIFEST, &bytes)?;
    }
    for (name, f) in side {
        if let Ok(bytes) = f {
            append_file(&mut b, name, bytes)?;
        }
    }
    if !cap.ethtool.is_empty() {
        dir(&mut b, ETHTOOL)?;
    }
    for (netdev, bytes) in &cap.ethtool {
        append_file(&mut b, &format!("{ETHTOOL}/{netdev}.json"), bytes)?;
    }
    for ((tree, rel), node) in &cap.nodes {
        let top = match tree {
            Tree::Sys => SYS,
            Tree::Proc => PROC,
        };
        let path = format!("{top}/{rel}");
        match node {
            Node::Dir { .. } => dir(&mut b, &path)?,
            Node::File(bytes) => append_file(&mut b, &path, bytes)?,
            Node::ListedOnly => append_file(&mut b, &path, &[])?,
            Node::Link(target) => append_link(&mut b, &path, target)?,
            Node::Failed(why) => append_link(&mut b, &path, &format!("{FAILURE_LINK_PREFIX}{why}"))?,
        }
    }
    b.into_inner().context("bundle: finishing the archive")
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn append_file(b: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
    b.append_data(&mut h, path, bytes).with_context(|| format!("bundle: adding {path}"))
}

fn append_link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) -> Result<()> {
    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, path, target).with_context(|| format!("bundle: adding link {path} -> {target}"))
}

/// A bundle unpacked into a temporary directory (removed on drop).
pub struct Replay {
    dir: tempfile::TempDir,
    pub manifest: Option<Manifest>,
}

impl Replay {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn sysfs(&self) -> PathBuf {
        self.path(SYS)
    }

    pub fn procfs(&self) -> PathBuf {
        self.path(PROC)
    }

    /// The metadata file (absent when the node had none: the same fallback applies).
    pub fn metadata(&self) -> PathBuf {
        self.path(METADATA)
    }

    pub fn config(&self) -> PathBuf {
        self.path(CONFIG)
    }

    pub fn state_file(&self) -> Option<PathBuf> {
        Some(self.path(STATE)).filter(|p| p.exists())
    }

    pub fn boot_id_path(&self) -> Option<PathBuf> {
        Some(self.path(BOOT_ID)).filter(|p| p.exists())
    }

    /// The kernel log records the bundle holds, for `--kmsg`.
    pub fn kmsg(&self) -> Option<PathBuf> {
        Some(self.path(KMSG)).filter(|p| p.exists())
    }

    /// The ethtool replay directory (`None`: the bundle has none).
    pub fn ethtool(&self) -> Option<PathBuf> {
        Some(self.path(ETHTOOL)).filter(|p| p.is_dir())
    }

    /// Output with the replay tree's paths shown as the node's (notes name the metadata
    /// file, messages name the sysfs root), so a replay prints what the node printed.
    pub fn show_as_node(&self, out: String) -> String {
        let Some(m) = &self.manifest else { return out };
        let hp = &m.host_paths;
        let mut pairs = vec![
            (self.metadata(), hp.metadata.clone()),
            (self.config(), hp.config.clone()),
            (self.sysfs(), hp.sysfs.clone()),
            (self.procfs(), hp.procfs.clone()),
        ];
        if let Some(s) = &hp.state_file {
            pairs.push((self.path(STATE), s.clone()));
        }
        pairs.iter().fold(out, |acc, (from, to)| acc.replace(&*from.to_string_lossy(), &to.to_string_lossy()))
    }
}

/// Unpack a tar stream into a fresh temporary directory.
fn unpack_from(reader: impl Read, what: &str) -> Result<Replay> {
    let dir = tempfile::Builder::new().prefix("nicmon-bundle-").tempdir().context("creating a temporary directory")?;
    let mut ar = tar::Archive::new(reader);
    ar.set_preserve_permissions(false);
    ar.set_preserve_mtime(false);
    ar.set_overwrite(true);
    ar.unpack(dir.path()).map_err(|e| anyhow::anyhow!("{what}: cannot unpack (not a nicmon bundle?): {e}"))?;
    let mpath = dir.path().join(MANIFEST);
    let manifest = match std::fs::read(&mpath) {
        Ok(b) => {
            Some(serde_json::from_slice::<Manifest>(&b).with_context(|| format!("{what}: {MANIFEST} is invalid"))?)
        }
        Err(_) => None,
    };
    if let Some(m) = &manifest
        && m.format != FORMAT
    {
        bail!("{what}: bundle format {} (this nicmon reads format {FORMAT})", m.format);
    }
    Ok(Replay { dir, manifest })
}

/// Unpack a bundle file (`.tar.gz`) for a replay.
pub fn unpack(file: &Path) -> Result<Replay> {
    let f = std::fs::File::open(file).map_err(|e| anyhow::anyhow!("bundle {}: cannot open: {e}", file.display()))?;
    let shown = format!("bundle {}", file.display());
    let replay = unpack_from(flate2::read::GzDecoder::new(f), &shown)?;
    if replay.manifest.is_none() {
        bail!("{shown}: no {MANIFEST}: not a nicmon bundle");
    }
    Ok(replay)
}

/// Everything the read code of `check` and `topology` asks for on a (staging) tree.
fn reads_of(replay: &Replay) -> BTreeSet<Access> {
    let log = AccessLog::default();
    let host = Host::new(replay.sysfs(), replay.procfs())
        .with_boot_id_path(replay.boot_id_path())
        .with_access_log(log.clone());
    let config = Config::load(&replay.config()).unwrap_or_default();
    let boot_id = host.boot_id().ok();
    let (prev, loaded) = match replay.state_file() {
        Some(p) => state::load(&p, boot_id.as_deref()),
        None => (State::fresh(boot_id.clone()), Loaded::Missing { reboot: false }),
    };
    let snapshot0 = discovery::discover(&host, &ReadPlan::default());
    // Both topologies: the replay may be asked either way (--metadata-required, or not).
    let _ = topology::from_sysfs(&host, &snapshot0);
    let topo = topology::resolve(&host, &snapshot0, Some(&replay.metadata()), false)
        .unwrap_or_else(|_| topology::from_sysfs(&host, &snapshot0));
    let stamp = Stamp { node_name: String::new(), processing_strategy: Default::default() };
    let monitor = Monitor::new(host, config, topo, stamp, StateConfig::default().checks, boot_id);
    // One record, so the cycle also reads what attributing kernel-log records takes (the
    // bundle's records replay with --bundle-kmsg); the decisions are thrown away.
    let poll = monitor.poll(&prev.checks, &loaded, time::OffsetDateTime::now_utc(), &[kmsg::Record::plain("")]);
    let _ = roles::classify(&poll.snapshot, &monitor.topology, &monitor.config.filters);
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

/// A finished capture: the compressed archive and its manifest.
pub struct Bundle {
    pub bytes: Vec<u8>,
    pub manifest: Manifest,
}

/// Capture this node (see the module documentation).
pub fn capture(args: &CaptureArgs) -> Result<Bundle> {
    let started = Instant::now();
    let limits = args.limits;
    let deadline = started + limits.total;
    let mut side: BTreeMap<&'static str, SideFile> = BTreeMap::new();
    side.insert(METADATA, side_file(&args.metadata, &limits, deadline));
    side.insert(CONFIG, side_file(&args.config, &limits, deadline));
    if let Some(s) = &args.state_file {
        side.insert(STATE, side_file(s, &limits, deadline));
    }
    if let Some(b) = &args.boot_id_path {
        side.insert(BOOT_ID, side_file(b, &limits, deadline));
    }
    let einval_memo = match side.get(STATE) {
        Some(Ok(bytes)) => state::parse(bytes).map(|s| s.checks.einval).unwrap_or_default(),
        _ => BTreeSet::new(),
    };
    let mut cap = Capture {
        sysfs: args.sysfs.clone(),
        procfs: args.procfs.clone(),
        nodes: BTreeMap::new(),
        einval_memo,
        limits,
        deadline,
        bytes: 0,
        changes: 0,
        cut_short: false,
        pending: BTreeMap::new(),
        dirty: BTreeSet::new(),
        ethtool: BTreeMap::new(),
    };
    let mut passes = 0;
    let mut converged = false;
    // The staging tree: the side files once, then each pass's new entries.
    let staging = unpack_from(&archive(&cap, &side, None)?[..], "staging tree")?;
    while passes < MAX_PASSES {
        passes += 1;
        write_staging(&mut cap, staging.dir.path())?;
        let before = cap.changes;
        for a in reads_of(&staging) {
            cap.take(&a);
        }
        cap.read_pending();
        if cap.changes == before {
            converged = true;
            break;
        }
    }

    // The facts beside the trees.
    let node_name = check::node_name(args.node_name.as_deref());
    let config = match &side[CONFIG] {
        Ok(_) => Config::load(&args.config).unwrap_or_default(),
        Err(_) => Config::default(),
    };
    cap.ethtool = capture_ethtool(args, &staging, &config);
    write_staging(&mut cap, staging.dir.path())?;
    let (kmsg_text, kmsg_records) = match &args.kmsg {
        Some(p) => match kernel_log(p, &staging, &config, &limits, deadline) {
            Ok((text, n)) => (Ok(text), n),
            Err(e) => (Err(format!("not captured: {e}")), 0),
        },
        None => (Err("not captured: kernel log not requested".into()), 0),
    };
    side.insert(KMSG, kmsg_text.map(String::into_bytes));
    side.insert(VERSION, Ok(version_text().into_bytes()));
    side.insert(
        WAKE,
        match args.metrics_port {
            Some(port) => Ok(wake_hooks(port).into_bytes()),
            None => Err("not captured: --no-metrics".into()),
        },
    );

    let mut entries: BTreeMap<String, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for ((tree, rel), node) in &cap.nodes {
        let kind = match node {
            Node::Dir { .. } => "dir",
            Node::File(_) => "file",
            Node::ListedOnly => "listed-only",
            Node::Link(_) => "link",
            Node::Failed(why) => {
                failures.push(Failure { path: cap.root(*tree).join(rel).display().to_string(), why: why.clone() });
                "failure"
            }
        };
        *entries.entry(kind.into()).or_default() += 1;
    }
    let files = side
        .iter()
        .map(|(name, f)| (name.to_string(), f.as_ref().map(|_| "captured".to_string()).unwrap_or_else(|e| e.clone())))
        .collect();
    let manifest = Manifest {
        format: FORMAT,
        nicmon_version: env!("CARGO_PKG_VERSION").into(),
        captured_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        node_name,
        host_paths: HostPaths {
            sysfs: args.sysfs.clone(),
            procfs: args.procfs.clone(),
            metadata: args.metadata.clone(),
            config: args.config.clone(),
            state_file: args.state_file.clone(),
            boot_id_path: args.boot_id_path.clone(),
        },
        files,
        entries,
        failures,
        kmsg_records,
        passes,
        complete: converged && !cap.cut_short,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    let tar = archive(&cap, &side, Some(&manifest))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).context("bundle: compressing")?;
    let bytes = gz.finish().context("bundle: compressing")?;
    Ok(Bundle { bytes, manifest })
}

/// The ethtool data of every RoCE netdev of the captured tree, as replay files: what the
/// driver answered, written by [`ethtool::replay::to_json`] (a netdev with nothing offered
/// has no file: not supported, as on replay).
fn capture_ethtool(args: &CaptureArgs, staging: &Replay, config: &Config) -> BTreeMap<String, Vec<u8>> {
    let Some(source) = ethtool::ports::source(config.phy.enabled, args.ethtool_replay.as_deref(), &args.sysfs) else {
        return BTreeMap::new();
    };
    let host = Host::new(staging.sysfs(), staging.procfs());
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let mut out = BTreeMap::new();
    for d in snapshot.devices.iter().filter(|d| !d.is_vf()) {
        let roce = d.ports.iter().any(|p| p.link_layer == Some(crate::model::LinkLayer::Ethernet));
        let Some(netdev) = d.netdev.as_ref().filter(|_| roce) else {
            continue;
        };
        let snap = source.read(netdev, host.timeout()).snapshot();
        if snap != ethtool::EthtoolSnapshot::default() && ethtool::replay::path(Path::new(ETHTOOL), netdev).is_ok() {
            out.insert(netdev.clone(), ethtool::replay::to_json(&snap).into_bytes());
        }
    }
    out
}

/// `nicmon version`'s text.
pub fn version_text() -> String {
    format!(
        "nicmon {}\neBPF programs: {}\n",
        env!("CARGO_PKG_VERSION"),
        if crate::wake::EBPF_EMBEDDED {
            "built in"
        } else {
            "not built in (polling and rtnetlink only; run `cargo xtask build-ebpf` and rebuild)"
        }
    )
}

/// The kernel log records of the last 24 h that a pattern matches or that name a NIC of
/// this node, in `/dev/kmsg` format. `/dev/kmsg` is read without blocking, from its oldest
/// record; a regular file (records or plain lines) is read whole.
fn kernel_log(
    path: &Path,
    staging: &Replay,
    config: &Config,
    limits: &Limits,
    deadline: Instant,
) -> Result<(String, usize)> {
    let raw: Vec<Vec<u8>> = if std::fs::metadata(path).map(|m| m.is_file()).unwrap_or(false) {
        let bytes = read_all(vec![path.to_path_buf()], limits.total_bytes, limits, deadline)
            .remove(0)
            .map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
        split_records(&bytes)
    } else {
        read_kmsg_device(path).with_context(|| format!("{}", path.display()))?
    };
    let host = Host::new(staging.sysfs(), staging.procfs());
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let links = HostLinks::read(&host, &snapshot, Vec::new());
    let index = DeviceIndex::from_snapshot(&snapshot, |_| true, &links);
    let now_us = crate::wake::monotonic_ns() / 1000;
    let oldest = now_us.saturating_sub(KMSG_WINDOW.as_micros() as u64);
    let mut out = String::new();
    let mut n = 0;
    for r in raw {
        let rec = kmsg::parse_record(&r);
        if rec.ts_usec.is_some_and(|t| t < oldest) {
            continue;
        }
        let named = match &rec.device {
            Some(kmsg::DeviceRef::Netdev(i)) => index.resolve_ifindex(*i),
            Some(d) => d.pci().map(|p| index.resolve_bdf(p)).unwrap_or(Resolution::Unknown),
            None => Resolution::Unknown,
        };
        if config.patterns.find(&rec.text).is_some() || matches!(named, Resolution::Known(_)) {
            let text = String::from_utf8_lossy(&r);
            out.push_str(text.trim_end_matches('\n'));
            out.push('\n');
            n += 1;
        }
    }
    Ok((out, n))
}

/// Split a file of kernel log text into records: a line, with the ` KEY=VALUE`
/// continuation lines that follow it.
fn split_records(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if line.starts_with(b" ") => {
                last.push(b'\n');
                last.extend_from_slice(line);
            }
            _ => out.push(line.to_vec()),
        }
    }
    out
}

/// Every record `/dev/kmsg` still holds, read without blocking.
fn read_kmsg_device(path: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = Vec::new();
    loop {
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            out.push(buf[..n as usize].to_vec());
            continue;
        }
        if n == 0 {
            return Ok(out);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => return Ok(out),
            Some(libc::EPIPE) | Some(libc::EINTR) => continue, // overwritten records: go on
            _ => return Err(e),
        }
    }
}

/// The wake-up hooks' status as the running daemon exports it (`nicmon_ebpf*` and
/// `nicmon_wakeups*` lines of its `/metrics`), or why it could not be asked.
fn wake_hooks(port: u16) -> String {
    match fetch_metrics(port) {
        Ok(text) => {
            let mut out = format!("# from http://127.0.0.1:{port}/metrics\n");
            for line in text.lines() {
                let name = line.trim_start_matches("# HELP ").trim_start_matches("# TYPE ");
                if name.starts_with("nicmon_ebpf") || name.starts_with("nicmon_wakeups") {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            out
        }
        Err(e) => format!("the daemon's metrics at http://127.0.0.1:{port}/metrics could not be read: {e:#}\n"),
    }
}

fn fetch_metrics(port: u16) -> Result<String> {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(3), async move {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let req = hyper::Request::get("/metrics").header("host", "127.0.0.1").body(Empty::<Bytes>::new())?;
            let resp = send.send_request(req).await?;
            if !resp.status().is_success() {
                bail!("HTTP {}", resp.status());
            }
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(String::from_utf8_lossy(&body).into_owned())
        })
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 3 s"))?
    })
}

/// `nicmon check --bundle`: the same cycle as `check`, on the bundle's trees, with its
/// state (on a copy) and its node name unless `--node-name` was given (`node_flag_given`).
/// `--kmsg` is the caller's; `kmsg_from_bundle` feeds the bundle's own kernel-log records.
pub fn replay_check(file: &Path, mut args: CheckArgs, node_flag_given: bool, kmsg_from_bundle: bool) -> Result<String> {
    let replay = unpack(file)?;
    let m = replay.manifest.as_ref().expect("unpack checks the manifest");
    args.monitor.sysfs = replay.sysfs();
    args.monitor.procfs = replay.procfs();
    args.monitor.metadata = Some(replay.metadata());
    args.monitor.config = replay.config();
    args.state_file = replay.state_file();
    args.monitor.boot_id_path = replay.boot_id_path();
    // A bundle is not this host: its ethtool data is its own (none when it has none).
    args.monitor.ethtool_replay = Some(replay.ethtool().unwrap_or_else(|| replay.path(ETHTOOL)));
    if !node_flag_given {
        args.monitor.stamp.node_name = m.node_name.clone();
    }
    if kmsg_from_bundle {
        args.kmsg = replay.kmsg();
    }
    let out = check::run_check(&args)?;
    Ok(replay.show_as_node(out))
}

/// `nicmon topology --bundle`.
pub fn replay_topology(file: &Path, metadata_required: bool, json: bool) -> Result<String> {
    let replay = unpack(file)?;
    let out = check::run_topology(
        &replay.sysfs(),
        &replay.procfs(),
        &replay.metadata(),
        metadata_required,
        &replay.config(),
        json,
    )?;
    Ok(replay.show_as_node(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            ethtool: BTreeMap::new(),
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
        let replay = unpack_from(&archive(&cap, &side, Some(&m)).unwrap()[..], "t").unwrap();
        assert_eq!(replay.manifest.as_ref(), Some(&m));
        assert_eq!(std::fs::read(replay.metadata()).unwrap(), b"{}");
        assert!(replay.state_file().is_none());
        // Output naming the replay tree names the node's paths.
        let shown = replay.show_as_node(format!("{}: bad", replay.metadata().display()));
        assert_eq!(shown, "/m.json: bad");
        // A newer format is refused with a message naming it.
        let newer = Manifest { format: FORMAT + 1, ..m };
        let err = unpack_from(&archive(&cap, &side, Some(&newer)).unwrap()[..], "bundle x").err().unwrap();
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
        assert_eq!(kmsg::parse_record(&recs[0]).device.as_ref().and_then(|d| d.pci()), Some("0000:1a:00.0"));
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
            ethtool: BTreeMap::new(),
        };
        for f in ["a/fifo", "a/dangling", "a/file"] {
            cap.take(&Access::Read { tree: Tree::Sys, rel: f.into() });
        }
        cap.read_pending();
        assert_eq!(cap.nodes[&(Tree::Sys, "a/fifo".into())], Node::Failed("not-regular:a FIFO".into()));
        assert_eq!(cap.nodes[&(Tree::Sys, "a/dangling".into())], Node::Link("../nowhere".into()));
        assert_eq!(cap.nodes[&(Tree::Sys, "a/file".into())], Node::File(b"1\n".to_vec()));
        // The replayed tree fails the same way through the host reader.
        let replay = unpack_from(&archive(&cap, &BTreeMap::new(), None).unwrap()[..], "t").unwrap();
        let live = Host::new(&sys, "/nonexistent");
        let again = Host::new(replay.sysfs(), "/nonexistent");
        for f in ["a/fifo", "a/dangling", "a/file", "a/none"] {
            assert_eq!(live.read_sys(f), again.read_sys(f), "{f}");
        }
    }
}
