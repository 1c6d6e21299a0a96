//! The capture loop (`nicmon bundle`, the module notes of [`super`]): run the read code
//! against a staging tree, copy from the node every path it asked about, repeat until it
//! asks for nothing new; then the facts beside the trees, the manifest and the archive.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;

use super::archive::{archive, write_staging};
use super::copier::read_all;
use super::error::BundleError;
use super::replay::{Replay, unpack_from};
use super::side::{kernel_log, side_file, version_text, wake_hooks};
use super::{
    BOOT_ID, Bundle, CONFIG, CaptureArgs, DEVLINK, ETHTOOL, EthtoolFiles, FORMAT, Failure, HostPaths, KMSG, Limits,
    METADATA, Manifest, Node, Nodes, STATE, SideFile, VERSION, WAKE,
};
use crate::act::state;
use crate::act::state::Loaded;
use crate::act::state::State;
use crate::cli::check;
use crate::decide::linkstate::StateConfig;
use crate::decide::roles;
use crate::decide::settings::Config;
use crate::model::ethtool;
use crate::model::event::Stamp;
use crate::monitor::Monitor;
use crate::read::discovery::{self, ReadPlan};
use crate::read::host::{Access, AccessLog, Host, Tree};
use crate::read::topology;

/// Passes of the capture loop before it gives up converging (a tree that keeps changing).
const MAX_PASSES: u32 = 16;
/// Symlinks followed while resolving one path (as the kernel's `MAXSYMLINKS`).
const MAX_LINKS: u32 = 40;

/// Everything captured so far.
pub(super) struct Capture {
    pub(super) sysfs: PathBuf,
    pub(super) procfs: PathBuf,
    pub(super) nodes: Nodes,
    /// `EINVAL` memo keys carried by the state file: failed without reading them again.
    pub(super) einval_memo: BTreeSet<String>,
    pub(super) limits: Limits,
    pub(super) deadline: Instant,
    pub(super) bytes: u64,
    pub(super) changes: u64,
    pub(super) cut_short: bool,
    /// Files to read at the end of the pass: (tree, canonical path, live path, memo key).
    pub(super) pending: BTreeMap<(Tree, String), (PathBuf, String)>,
    /// Entries added or changed since the staging tree was last written.
    pub(super) dirty: BTreeSet<(Tree, String)>,
}

impl Capture {
    /// Nothing captured yet, from the trees `args` names.
    fn new(args: &CaptureArgs, einval_memo: BTreeSet<String>, deadline: Instant) -> Capture {
        Capture {
            sysfs: args.sysfs.clone(),
            procfs: args.procfs.clone(),
            nodes: BTreeMap::new(),
            einval_memo,
            limits: args.limits,
            deadline,
            bytes: 0,
            changes: 0,
            cut_short: false,
            pending: BTreeMap::new(),
            dirty: BTreeSet::new(),
        }
    }

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
    pub(super) fn take(&mut self, access: &Access) {
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
                let kind = crate::read::host::non_regular_kind(&meta).unwrap_or("not a file");
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
    pub(super) fn read_pending(&mut self) {
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
pub(super) fn inside_target(root: &Path, parent: &[String], target: &Path) -> Option<(String, Vec<String>)> {
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

/// Everything the read code of `check` and `topology` asks for on a (staging) tree.
fn reads_of(replay: &Replay) -> BTreeSet<Access> {
    let log = AccessLog::default();
    let host = Host::new(replay.sysfs(), replay.procfs())
        .with_boot_id_path(replay.boot_id_path())
        .with_access_log(log.clone());
    let config = Config::load(&replay.config()).unwrap_or_default();
    let boot_id = host.boot_id().ok();
    let (prev, loaded) = match replay.state_file() {
        Some(p) => state::file::load(&p, boot_id.as_deref()),
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
    let poll =
        monitor.poll(&prev.checks, &loaded, time::OffsetDateTime::now_utc(), &[crate::model::kmsg::Record::plain("")]);
    let _ = roles::classify(&poll.snapshot, &monitor.decider.topology, &monitor.decider.config.filters);
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Capture this node (see the module documentation).
pub fn capture(args: &CaptureArgs) -> Result<Bundle, BundleError> {
    let started = Instant::now();
    let deadline = started + args.limits.total;
    let mut side = read_side_files(args, deadline);
    let mut cap = Capture::new(args, einval_memo(&side), deadline);
    // The staging tree: the side files once, then each pass's new entries.
    let staging = unpack_from(&archive(&cap.nodes, &side, &[], None)?[..], "staging tree")?;
    let (passes, converged) = converge(&mut cap, &staging)?;
    write_staging(&cap.nodes, std::mem::take(&mut cap.dirty), staging.dir.path())?;
    let config = match &side[CONFIG] {
        Ok(_) => Config::load(&args.config).unwrap_or_default(),
        Err(_) => Config::default(),
    };
    let ethtool = ethtool_files(args, &staging, &config);
    let devlink = devlink_files(args, &staging, &config);
    let kmsg_records = add_facts(args, &mut side, &staging, &config, deadline);
    let complete = converged && !cap.cut_short;
    let manifest = manifest(args, &cap, &side, Progress { passes, complete, kmsg_records, started });
    let tar = archive(&cap.nodes, &side, &[(ETHTOOL, &ethtool), (DEVLINK, &devlink)], Some(&manifest))?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).map_err(BundleError::Compress)?;
    let bytes = gz.finish().map_err(BundleError::Compress)?;
    Ok(Bundle { bytes, manifest })
}

/// The files nicmon reads outside the trees: metadata, config, and the state and boot ID
/// files when given.
fn read_side_files(args: &CaptureArgs, deadline: Instant) -> BTreeMap<&'static str, SideFile> {
    let limits = &args.limits;
    let mut side: BTreeMap<&'static str, SideFile> = BTreeMap::new();
    side.insert(METADATA, side_file(&args.metadata, limits, deadline));
    side.insert(CONFIG, side_file(&args.config, limits, deadline));
    if let Some(s) = &args.state_file {
        side.insert(STATE, side_file(s, limits, deadline));
    }
    if let Some(b) = &args.boot_id_path {
        side.insert(BOOT_ID, side_file(b, limits, deadline));
    }
    side
}

/// The `EINVAL` memo the captured state file carries.
fn einval_memo(side: &BTreeMap<&'static str, SideFile>) -> BTreeSet<String> {
    match side.get(STATE) {
        Some(Ok(bytes)) => state::file::parse(bytes).map(|s| s.checks.einval).unwrap_or_default(),
        _ => BTreeSet::new(),
    }
}

/// The passes: write the staging tree, run the read code against it, copy what it asked
/// for, until it asks for nothing new (or [`MAX_PASSES`]). The passes run, and whether
/// the capture converged.
fn converge(cap: &mut Capture, staging: &Replay) -> Result<(u32, bool), BundleError> {
    let mut passes = 0;
    while passes < MAX_PASSES {
        passes += 1;
        write_staging(&cap.nodes, std::mem::take(&mut cap.dirty), staging.dir.path())?;
        let before = cap.changes;
        for a in reads_of(staging) {
            cap.take(&a);
        }
        cap.read_pending();
        if cap.changes == before {
            return Ok((passes, true));
        }
    }
    Ok((passes, false))
}

/// The facts beside the trees: the kernel log records, the version, the wake-up hooks.
/// The kernel log records captured.
fn add_facts(
    args: &CaptureArgs,
    side: &mut BTreeMap<&'static str, SideFile>,
    staging: &Replay,
    config: &Config,
    deadline: Instant,
) -> usize {
    let (kmsg_text, kmsg_records) = match &args.kmsg {
        Some(p) => match kernel_log(p, staging, config, &args.limits, deadline) {
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
    kmsg_records
}

/// The ethtool data of every RoCE netdev of the captured tree and the transceiver of every
/// PF's netdev, as replay files: what the driver answered, written by
/// [`crate::read::ethtool::replay::to_json`] (a netdev with nothing offered has no file: not
/// supported, as on replay).
fn ethtool_files(args: &CaptureArgs, staging: &Replay, config: &Config) -> EthtoolFiles {
    let replay = args.ethtool_replay.as_deref();
    let phy = crate::read::ethtool::ports::source(config.phy.enabled, replay, &args.sysfs);
    let optics = crate::read::ethtool::ports::source(config.optics.enabled, replay, &args.sysfs);
    if phy.is_none() && optics.is_none() {
        return EthtoolFiles::new();
    }
    let host = Host::new(staging.sysfs(), staging.procfs());
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let mut out = EthtoolFiles::new();
    for d in snapshot.devices.iter().filter(|d| !d.is_vf()) {
        let Some(netdev) = d.netdev.as_ref() else {
            continue;
        };
        let roce = d.ports.iter().any(|p| p.link_layer == Some(crate::model::LinkLayer::Ethernet));
        let mut snap = match (&phy, roce) {
            (Some(source), true) => source.read(netdev, host.timeout()).snapshot(),
            _ => ethtool::EthtoolSnapshot::default(),
        };
        if let Some(source) = &optics {
            snap.module = source.read_module(netdev, host.timeout()).ok().map(|pages| ethtool::ModuleRead { pages });
        }
        if snap != ethtool::EthtoolSnapshot::default()
            && crate::read::ethtool::replay::path(Path::new(ETHTOOL), netdev).is_ok()
        {
            out.insert(netdev.clone(), crate::read::ethtool::replay::to_json(&snap).into_bytes());
        }
    }
    out
}

/// The devlink health reporters of every monitored PF of the captured tree, as replay files
/// (written by [`crate::read::devlink::replay::to_json`]; a function with none has no file:
/// not supported, as on replay).
fn devlink_files(args: &CaptureArgs, staging: &Replay, config: &Config) -> EthtoolFiles {
    let Some(source) =
        crate::read::devlink::source(config.firmware.enabled, args.devlink_replay.as_deref(), &args.sysfs)
    else {
        return EthtoolFiles::new();
    };
    let host = Host::new(staging.sysfs(), staging.procfs());
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let pcis = snapshot.devices.iter().filter(|d| !d.is_vf()).filter_map(|d| d.pci_address.clone()).collect();
    let live = Host::new(&args.sysfs, &args.procfs);
    let (found, _) = source.read(&pcis, host.timeout(), &|i| crate::read::devlink::pci_of(&live, i));
    found
        .iter()
        .filter(|(a, _)| crate::read::devlink::replay::path(Path::new(DEVLINK), a).is_some())
        .map(|(a, r)| (a.clone(), crate::read::devlink::replay::to_json(r).into_bytes()))
        .collect()
}

/// How the capture went, for the manifest.
struct Progress {
    passes: u32,
    complete: bool,
    kmsg_records: usize,
    started: Instant,
}

/// `manifest.json`: what was captured, counted by kind, and every failure.
fn manifest(args: &CaptureArgs, cap: &Capture, side: &BTreeMap<&'static str, SideFile>, p: Progress) -> Manifest {
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
    Manifest {
        format: FORMAT,
        nicmon_version: env!("CARGO_PKG_VERSION").into(),
        captured_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        node_name: check::node_name(args.node_name.as_deref()),
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
        kmsg_records: p.kmsg_records,
        passes: p.passes,
        complete: p.complete,
        elapsed_ms: p.started.elapsed().as_millis() as u64,
    }
}
