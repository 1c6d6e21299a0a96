//! The bundle unpacker: a bundle is untrusted input, so a replay unpacks only what a
//! capture writes, within a capture's bounds, and refuses the whole archive, in one line
//! ([`BundleError::Refused`]), at the first entry that is not.
//!
//! **What is unpacked:** regular files, directories and symlinks, by relative paths without
//! `..`. Symlinks only under `sys/` and `proc/`, with a relative target of the form
//! `../../name/name…` that stays inside the bundle counted from the link's directory (the
//! sysfs links, and the failure links to `nicmon-bundle:<why>`). A `..` after a name is
//! refused: where it lands depends on whether the name is itself a link (`b -> ..` then
//! `a -> b/../..` is inside lexically, outside on disk). Every directory on an entry's way
//! was made by this unpacker, so nothing is ever written through a link; and since a link's
//! leading `..`s climb real directories and the rest only descends, no link resolves out
//! of the bundle. Hard links, devices, FIFOs, sparse files and PAX headers are refused;
//! GNU long names (which a capture writes for long paths) are read, bounded.
//!
//! **Bounds**, checked while streaming, before anything is written (from the header) and
//! while it is (the bytes actually copied): [`MAX_ENTRIES`], [`MAX_DEPTH`],
//! [`MAX_PATH_BYTES`], a capture's 1 MiB per file ([`FILE_BYTES`]; `kmsg.txt` and the
//! manifest have their own), a capture's 64 MiB in all for the trees ([`TREE_BYTES`]), and
//! [`ALL_BYTES`] for everything. The work per entry is linear in its path: the directories
//! made so far are remembered, so an entry's parents are not looked up on disk.
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::error::{BundleError, Refusal};
use super::{FILE_BYTES, KMSG, MANIFEST, PROC, SYS, TOTAL_BYTES};

/// Entries in one bundle (the test DGX-H100's capture has 1,638).
pub(super) const MAX_ENTRIES: u64 = 100_000;
/// Components of an entry's path (the test platforms' captures have 13 at most: sysfs
/// paths are shallow).
pub(super) const MAX_DEPTH: usize = 64;
/// Bytes of an entry's path or a link's target (Linux's `PATH_MAX`).
pub(super) const MAX_PATH_BYTES: usize = 4096;
/// `manifest.json` (one line per failure: a few hundred KiB at most in practice).
pub(super) const MANIFEST_BYTES: u64 = 16 << 20;
/// The files under `sys/` and `proc/`: a capture stops adding files once they reach
/// [`TOTAL_BYTES`], so the last one may pass it by up to [`FILE_BYTES`].
pub(super) const TREE_BYTES: u64 = TOTAL_BYTES + FILE_BYTES;
/// Everything: the trees, the kernel log records (read up to [`TOTAL_BYTES`]), the manifest
/// and the side files.
pub(super) const ALL_BYTES: u64 = TREE_BYTES + TOTAL_BYTES + MANIFEST_BYTES + 16 * FILE_BYTES;

/// The largest file `rel` may be.
fn file_cap(rel: &Path) -> u64 {
    if rel == Path::new(KMSG) {
        TOTAL_BYTES
    } else if rel == Path::new(MANIFEST) {
        MANIFEST_BYTES
    } else {
        FILE_BYTES
    }
}

/// Whether `rel` is inside a tree (`sys/…`, `proc/…`), not a tree's top itself.
fn in_tree(rel: &Path) -> bool {
    let mut c = rel.components();
    matches!(c.next(), Some(Component::Normal(t)) if t == SYS || t == PROC) && c.next().is_some()
}

/// Unpack the tar stream `reader` into the existing, empty directory `root`.
pub(super) fn unpack_into(reader: impl Read, root: &Path, what: &str) -> Result<(), BundleError> {
    let io = |why| BundleError::Unpack { what: what.into(), why };
    let mut ar = tar::Archive::new(reader);
    let mut u = Unpacker::new(root, what);
    // GNU long name and long link entries: the next entry's path and target.
    let (mut long_name, mut long_link): (Option<Vec<u8>>, Option<Vec<u8>>) = (None, None);
    for entry in ar.entries().map_err(io)?.raw(true) {
        let mut entry = entry.map_err(io)?;
        u.entries += 1;
        if u.entries > MAX_ENTRIES {
            return Err(u.refuse(&entry.path_bytes(), Refusal::TooManyEntries { max: MAX_ENTRIES }));
        }
        let kind = entry.header().entry_type();
        if kind.is_gnu_longname() || kind.is_gnu_longlink() {
            let long = u.read_long(&mut entry)?;
            *(if kind.is_gnu_longname() { &mut long_name } else { &mut long_link }) = Some(long);
            continue;
        }
        let name = long_name.take().unwrap_or_else(|| entry.path_bytes().into_owned());
        let link = long_link.take().or_else(|| entry.link_name_bytes().map(|l| l.into_owned()));
        u.entry(&mut entry, &name, link.as_deref())?;
    }
    Ok(())
}

/// The unpacking so far.
struct Unpacker<'a> {
    root: &'a Path,
    what: &'a str,
    /// The directories made so far, relative to `root` (`""`: the root itself). Everything
    /// else that exists under `root` is a file or a link an entry made.
    dirs: HashSet<PathBuf>,
    entries: u64,
    tree_bytes: u64,
    all_bytes: u64,
}

impl<'a> Unpacker<'a> {
    fn new(root: &'a Path, what: &'a str) -> Unpacker<'a> {
        Unpacker { root, what, dirs: HashSet::from([PathBuf::new()]), entries: 0, tree_bytes: 0, all_bytes: 0 }
    }

    fn refuse(&self, entry: &[u8], why: Refusal) -> BundleError {
        BundleError::Refused { what: self.what.into(), entry: shown(entry), why }
    }

    fn io(&self, entry: &Path, why: std::io::Error) -> BundleError {
        let why = std::io::Error::new(why.kind(), format!("{}: {why}", shown(entry.as_os_str().as_bytes())));
        BundleError::Unpack { what: self.what.into(), why }
    }

    /// A GNU long name or long link: its bytes up to the first NUL, at most a path's length.
    fn read_long(&self, entry: &mut tar::Entry<impl Read>) -> Result<Vec<u8>, BundleError> {
        let size = entry.size();
        if size > MAX_PATH_BYTES as u64 + 1 {
            let why = Refusal::TooLong { len: size, max: MAX_PATH_BYTES };
            return Err(self.refuse(b"(a GNU long name)", why));
        }
        let mut buf = Vec::with_capacity(size as usize);
        entry
            .by_ref()
            .take(size)
            .read_to_end(&mut buf)
            .map_err(|why| BundleError::Unpack { what: self.what.into(), why })?;
        if let Some(nul) = buf.iter().position(|b| *b == 0) {
            buf.truncate(nul);
        }
        Ok(buf)
    }

    /// One entry (not a long name): checked, then made.
    fn entry(&mut self, e: &mut tar::Entry<impl Read>, name: &[u8], link: Option<&[u8]>) -> Result<(), BundleError> {
        let rel = relative(name).map_err(|why| self.refuse(name, why))?;
        let kind = e.header().entry_type();
        let known = kind.is_file() || kind.is_dir() || kind.is_symlink();
        if !known {
            return Err(self.refuse(name, Refusal::Kind { kind: kind_name(kind) }));
        }
        if !kind.is_file() && e.size() != 0 {
            return Err(self.refuse(name, Refusal::DataInNonFile { kind: kind_name(kind), size: e.size() }));
        }
        if rel.as_os_str().is_empty() {
            // `./`: the root, which exists.
            return if kind.is_dir() { Ok(()) } else { Err(self.refuse(name, Refusal::Empty)) };
        }
        self.parents(&rel, name)?;
        if kind.is_dir() {
            self.dir(&rel, name)
        } else if kind.is_symlink() {
            self.link(&rel, name, link.unwrap_or_default())
        } else {
            self.file(&rel, name, e)
        }
    }

    /// Make the directories on `rel`'s way that no entry made yet (as `tar` does), each
    /// only where nothing is: never through a file or a link.
    fn parents(&mut self, rel: &Path, name: &[u8]) -> Result<(), BundleError> {
        let mut missing = Vec::new();
        let mut at = rel.parent().unwrap_or(Path::new(""));
        while !self.dirs.contains(at) {
            missing.push(at.to_path_buf());
            at = at.parent().unwrap_or(Path::new(""));
        }
        for dir in missing.into_iter().rev() {
            match std::fs::create_dir(self.root.join(&dir)) {
                Ok(()) => {
                    self.dirs.insert(dir);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let parent = dir.to_string_lossy().into_owned();
                    return Err(self.refuse(name, Refusal::ParentNotDirectory { parent }));
                }
                Err(e) => return Err(self.io(&dir, e)),
            }
        }
        Ok(())
    }

    fn dir(&mut self, rel: &Path, name: &[u8]) -> Result<(), BundleError> {
        if self.dirs.contains(rel) {
            return Ok(());
        }
        match std::fs::create_dir(self.root.join(rel)) {
            Ok(()) => {
                self.dirs.insert(rel.to_path_buf());
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(self.refuse(name, Refusal::Clash)),
            Err(e) => Err(self.io(rel, e)),
        }
    }

    /// Make way for a file or a link at `rel`: not over a directory; an earlier file or link
    /// there is replaced (as `tar` does).
    fn make_way(&self, rel: &Path, name: &[u8]) -> Result<PathBuf, BundleError> {
        if self.dirs.contains(rel) {
            return Err(self.refuse(name, Refusal::Clash));
        }
        let path = self.root.join(rel);
        // Its parents are directories this unpacker made: unlink never follows a link.
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(self.io(rel, e)),
            _ => Ok(path),
        }
    }

    fn link(&mut self, rel: &Path, name: &[u8], target: &[u8]) -> Result<(), BundleError> {
        let shown_target = || shown(target);
        if !in_tree(rel) {
            return Err(self.refuse(name, Refusal::LinkNotInTree { target: shown_target() }));
        }
        let depth = rel.components().count() - 1;
        if !target_inside(depth, target) {
            return Err(self.refuse(name, Refusal::LinkOutside { target: shown_target() }));
        }
        let path = self.make_way(rel, name)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(target), path).map_err(|e| self.io(rel, e))
    }

    /// A regular file: its size checked against the bounds before it is written, and the
    /// bytes copied counted (at most one past the bound are read).
    fn file(&mut self, rel: &Path, name: &[u8], e: &mut tar::Entry<impl Read>) -> Result<(), BundleError> {
        let size = e.size();
        let max = file_cap(rel);
        let tree = in_tree(rel);
        self.account(name, size, max, tree)?;
        let path = self.make_way(rel, name)?;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| self.io(rel, e))?;
        let got = std::io::copy(&mut e.by_ref().take(max + 1), &mut f).map_err(|e| self.io(rel, e))?;
        // The header's size was counted; the bytes copied must not pass it.
        if got > size {
            self.account(name, got - size, max, tree)?;
        }
        if got > max {
            return Err(self.refuse(name, Refusal::FileTooLarge { size: got, max }));
        }
        if got < size {
            return Err(self.refuse(name, Refusal::Truncated { got, size }));
        }
        Ok(())
    }

    /// Count `bytes` more of a file against its cap and the totals.
    fn account(&mut self, name: &[u8], bytes: u64, max: u64, tree: bool) -> Result<(), BundleError> {
        if bytes > max {
            return Err(self.refuse(name, Refusal::FileTooLarge { size: bytes, max }));
        }
        if tree {
            self.tree_bytes = self.tree_bytes.saturating_add(bytes);
            if self.tree_bytes > TREE_BYTES {
                return Err(self.refuse(name, Refusal::TreesTooLarge { max: TREE_BYTES }));
            }
        }
        self.all_bytes = self.all_bytes.saturating_add(bytes);
        if self.all_bytes > ALL_BYTES {
            return Err(self.refuse(name, Refusal::BundleTooLarge { max: ALL_BYTES }));
        }
        Ok(())
    }
}

/// An entry's path as a relative path of plain names (`.` dropped), within the bounds.
fn relative(name: &[u8]) -> Result<PathBuf, Refusal> {
    if name.len() > MAX_PATH_BYTES {
        return Err(Refusal::TooLong { len: name.len() as u64, max: MAX_PATH_BYTES });
    }
    let path = Path::new(OsStr::from_bytes(name));
    let mut depth = 0;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => return Err(Refusal::ParentDir),
            Component::RootDir | Component::Prefix(_) => return Err(Refusal::Absolute),
        }
    }
    if depth > MAX_DEPTH {
        return Err(Refusal::TooDeep { depth, max: MAX_DEPTH });
    }
    Ok(path.components().filter(|c| matches!(c, Component::Normal(_))).collect())
}

/// Whether a link in a directory `depth` names below the root, to `target`, stays inside:
/// relative, its `..`s only leading and at most `depth` of them, within [`MAX_PATH_BYTES`].
/// A failure link (`nicmon-bundle:<why>`) is one name: inside.
pub(super) fn target_inside(depth: usize, target: &[u8]) -> bool {
    if target.is_empty() || target.len() > MAX_PATH_BYTES {
        return false;
    }
    let (mut up, mut named) = (0, false);
    for c in Path::new(OsStr::from_bytes(target)).components() {
        match c {
            Component::ParentDir if !named => up += 1,
            Component::Normal(_) => named = true,
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    up <= depth
}

/// An entry kind as a refusal names it.
fn kind_name(kind: tar::EntryType) -> String {
    match kind {
        tar::EntryType::Link => "hard link".into(),
        tar::EntryType::Char => "character device".into(),
        tar::EntryType::Block => "block device".into(),
        tar::EntryType::Fifo => "FIFO".into(),
        tar::EntryType::GNUSparse => "sparse file".into(),
        tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => "PAX header".into(),
        tar::EntryType::Directory => "directory".into(),
        tar::EntryType::Symlink => "symlink".into(),
        k => format!("type {:?}", k.as_byte() as char),
    }
}

/// A path or a target for a refusal line: lossy, at most 160 characters.
fn shown(bytes: &[u8]) -> String {
    const MAX: usize = 160;
    let s = String::from_utf8_lossy(bytes);
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}… ({} bytes)", &s[..i], bytes.len()),
        None => s.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::Cursor;
    use std::rc::Rc;

    use proptest::prelude::*;

    use super::super::replay::unpack_from;
    use super::*;

    /// One entry with its name and link target written into the header as given (no
    /// checks: `..`, absolute), at most 100 bytes each.
    fn raw(b: &mut tar::Builder<Vec<u8>>, kind: u8, name: &[u8], link: &[u8], data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        let g = h.as_gnu_mut().unwrap();
        g.name[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
        g.linkname[..link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    /// A tar archive of `(kind, name, link target)` entries without data.
    fn tar_of(entries: &[(u8, &str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (kind, name, link) in entries {
            raw(&mut b, *kind, name.as_bytes(), link.as_bytes(), b"");
        }
        b.into_inner().unwrap()
    }

    fn refusal(bytes: &[u8]) -> (String, Refusal) {
        match unpack_from(bytes, "bundle t") {
            Err(BundleError::Refused { entry, why, .. }) => (entry, why),
            Err(e) => panic!("not refused: {e}"),
            Ok(_) => panic!("unpacked"),
        }
    }

    #[test]
    fn a_link_out_of_the_bundle_is_refused_naming_it_and_its_target() {
        let base = [(b'5', "sys", ""), (b'5', "sys/class", ""), (b'2', "sys/class/ok", "../devices/x")];
        let outside: &[&[(u8, &str, &str)]] = &[
            &[(b'2', "sys/class/hostname", "/etc/hostname")],
            &[(b'2', "sys/class/up", "../../../etc/hostname")],
            &[(b'2', "proc/x", "../../x")],
            // Inside lexically, outside on disk: b is the root, b/.. above it.
            &[(b'2', "sys/b", ".."), (b'2', "sys/a", "b/../..")],
            &[(b'2', "sys/class/f", "nicmon-bundle:x/../../../../etc/hostname")],
        ];
        for extra in outside {
            let (entry, why) = refusal(&tar_of(&[&base[..], extra].concat()));
            let (name, target) = extra.last().map(|(_, n, t)| (n.to_string(), t.to_string())).unwrap();
            assert_eq!(entry, name);
            assert!(matches!(&why, Refusal::LinkOutside { target: t } if *t == target), "{why:?}");
        }
        // `sys` itself, or a side file, a link: only the trees' entries may be links.
        for (name, target) in [("sys", "/etc"), ("sys", "proc"), ("manifest.json", "/etc/hostname")] {
            let (entry, why) = refusal(&tar_of(&[(b'2', name, target)]));
            assert_eq!(entry, name);
            assert!(matches!(&why, Refusal::LinkNotInTree { target: t } if t == target), "{why:?}");
        }
        let line = unpack_from(&tar_of(&[(b'2', "sys/class/h", "/etc/hostname")])[..], "bundle b.tar.gz")
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            line,
            "bundle b.tar.gz: entry sys/class/h refused: a link to /etc/hostname, which leaves the bundle"
        );
        // Hard links, devices and FIFOs are refused too.
        for (kind, name) in [(b'1', "hard link"), (b'3', "character device"), (b'4', "block device"), (b'6', "FIFO")] {
            let (entry, why) = refusal(&tar_of(&[(kind, "sys/x", "/etc/hostname")]));
            assert_eq!(entry, "sys/x");
            assert!(matches!(&why, Refusal::Kind { kind } if kind == name), "{why:?}");
        }
        // Nothing is written through a link, even one inside.
        let (entry, why) = refusal(&tar_of(&[(b'2', "sys/l", "."), (b'5', "sys/l/d", "")]));
        assert_eq!(entry, "sys/l/d");
        assert!(matches!(&why, Refusal::ParentNotDirectory { parent } if parent == "sys/l"), "{why:?}");
    }

    #[test]
    fn links_inside_and_failure_links_are_kept() {
        let bytes = tar_of(&[
            (b'5', "sys/devices/pci0000:00/0000:00:01.0/infiniband/mlx5_0", ""),
            (b'2', "sys/class/infiniband/mlx5_0", "../../devices/pci0000:00/0000:00:01.0/infiniband/mlx5_0"),
            (b'2', "sys/class/infiniband/mlx5_0x", "./../.././devices"),
            (b'2', "sys/top", ".."),
            (b'2', "sys/class/failed", "nicmon-bundle:not-regular:a FIFO"),
            (b'2', "proc/self", "1234"),
        ]);
        let replay = unpack_from(&bytes[..], "t").unwrap();
        let dev = replay.sysfs().join("class/infiniband/mlx5_0");
        assert!(dev.canonicalize().unwrap().ends_with("devices/pci0000:00/0000:00:01.0/infiniband/mlx5_0"));
        let failed = std::fs::read_link(replay.sysfs().join("class/failed")).unwrap();
        assert_eq!(failed, Path::new("nicmon-bundle:not-regular:a FIFO"));
        assert!(target_inside(0, b"nicmon-bundle:errno=22"));
        assert!(!target_inside(0, b"../x") && !target_inside(3, b"/r/sys/x") && !target_inside(3, b""));
    }

    #[test]
    fn a_deep_or_long_path_is_refused() {
        let deep = |levels: usize| {
            let mut b = tar::Builder::new(Vec::new());
            let path = format!("sys/{}f", "d/".repeat(levels - 2));
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            b.append_data(&mut h, &path, std::io::empty()).unwrap();
            b.into_inner().unwrap()
        };
        // 1,900 levels in a 25 KB bundle: refused at once (it took > 30 s to unpack).
        let (entry, why) = refusal(&deep(1900));
        assert!(entry.starts_with("sys/d/d/") && entry.ends_with("… (3801 bytes)"), "{entry}");
        assert!(matches!(why, Refusal::TooDeep { depth: 1900, max: MAX_DEPTH }), "{why:?}");
        let replay = unpack_from(&deep(MAX_DEPTH)[..], "t").unwrap();
        assert!(replay.sysfs().join("d/".repeat(MAX_DEPTH - 2)).join("f").is_file());
        let long = format!("sys/{}", vec!["n".repeat(150); 30].join("/"));
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut tar::Header::new_gnu(), &long, std::io::empty()).unwrap();
        let (_, why) = refusal(&b.into_inner().unwrap());
        assert!(matches!(why, Refusal::TooLong { len: 4534, max: MAX_PATH_BYTES }), "{why:?}");
    }

    /// A tar stream of `(kind, name, size)` entries, `size` zero bytes each, made as it is
    /// read (nothing is held or written), counting the bytes read from it.
    struct LazyTar {
        entries: std::vec::IntoIter<(u8, String, u64)>,
        part: Box<dyn Read>,
        ended: bool,
        read: Rc<Cell<u64>>,
    }

    impl Read for LazyTar {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            loop {
                let n = self.part.read(buf)?;
                if n > 0 || buf.is_empty() {
                    self.read.set(self.read.get() + n as u64);
                    return Ok(n);
                }
                self.part = match self.entries.next() {
                    Some((kind, name, size)) => {
                        let mut h = tar::Header::new_gnu();
                        h.set_path(&name).unwrap();
                        h.set_entry_type(tar::EntryType::new(kind));
                        h.set_size(size);
                        h.set_cksum();
                        let data = std::io::repeat(0).take(size.div_ceil(512) * 512);
                        Box::new(Cursor::new(h.as_bytes().to_vec()).chain(data))
                    }
                    None if !self.ended => {
                        self.ended = true;
                        Box::new(std::io::repeat(0).take(1024))
                    }
                    None => return Ok(0),
                };
            }
        }
    }

    fn lazy_tar(entries: Vec<(u8, String, u64)>) -> (LazyTar, Rc<Cell<u64>>) {
        let read = Rc::new(Cell::new(0));
        let tar = LazyTar {
            entries: entries.into_iter(),
            part: Box::new(std::io::empty()),
            ended: false,
            read: read.clone(),
        };
        (tar, read)
    }

    fn refused_lazily(entries: Vec<(u8, String, u64)>) -> (String, Refusal, u64) {
        let (stream, read) = lazy_tar(entries);
        match unpack_from(stream, "bundle t") {
            Err(BundleError::Refused { entry, why, .. }) => (entry, why, read.get()),
            Err(e) => panic!("not refused: {e}"),
            Ok(_) => panic!("unpacked"),
        }
    }

    #[test]
    fn files_past_the_capture_bounds_are_refused_while_streaming() {
        const GB: u64 = 1_100_000_000;
        // A 1.1 GB file under sys/, a 1.1 GB state.json or manifest.json: refused from the
        // header, before its data is read.
        for (name, max) in
            [("sys/class/big", FILE_BYTES), ("state.json", FILE_BYTES), ("manifest.json", MANIFEST_BYTES)]
        {
            let (entry, why, read) = refused_lazily(vec![(b'0', name.into(), GB)]);
            assert_eq!(entry, name);
            assert!(matches!(why, Refusal::FileTooLarge { size: GB, max: m } if m == max), "{why:?}");
            assert!(read <= 64 << 10, "{read} bytes read");
        }
        // Files within the per-file bound adding up past the trees' bound: refused at the
        // first one past it, after at most the bound's bytes.
        let n = TREE_BYTES / FILE_BYTES + 1;
        let files = (0..n).map(|i| (b'0', format!("sys/f{i}"), FILE_BYTES)).collect();
        let (entry, why, read) = refused_lazily(files);
        assert_eq!(entry, format!("sys/f{}", n - 1));
        assert!(matches!(why, Refusal::TreesTooLarge { max: TREE_BYTES }), "{why:?}");
        assert!(read <= TREE_BYTES + (n + 2) * 512 + (64 << 10), "{read} bytes read");
        // Entries past the count.
        let dirs = (0..=MAX_ENTRIES).map(|_| (b'5', "sys".to_string(), 0)).collect();
        let (_, why, _) = refused_lazily(dirs);
        assert!(matches!(why, Refusal::TooManyEntries { max: MAX_ENTRIES }), "{why:?}");
        // A GNU long name claiming a gigabyte is not read into memory.
        let (_, why, read) = refused_lazily(vec![(b'L', "././@LongLink".into(), GB), (b'0', "x".into(), 0)]);
        assert!(matches!(why, Refusal::TooLong { len: GB, .. }), "{why:?}");
        assert!(read <= 64 << 10, "{read} bytes read");
    }

    #[test]
    fn a_capture_stays_well_within_the_replay_bounds() {
        use nicmon_tests::platforms::Platform;
        for p in [Platform::DgxH100, Platform::L40sOci] {
            let node = p.build();
            let args = super::super::CaptureArgs {
                sysfs: node.sys(),
                procfs: node.proc(),
                metadata: node.metadata_path(),
                config: "/nonexistent/nicmon.toml".into(),
                state_file: None,
                boot_id_path: None,
                node_name: Some("n".into()),
                kmsg: None,
                metrics_port: None,
                limits: super::super::Limits::default(),
                ethtool_replay: None,
                devlink_replay: None,
            };
            let bundle = super::super::capture(&args).unwrap();
            let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&bundle.bytes[..]));
            let (mut entries, mut depth) = (0, 0);
            for e in ar.entries().unwrap() {
                entries += 1;
                depth = depth.max(e.unwrap().path().unwrap().components().count());
            }
            eprintln!("{}: {entries} entries, {depth} components at most", p.name());
            assert!(depth <= MAX_DEPTH / 2, "{}: {depth} components", p.name());
            assert!(entries <= MAX_ENTRIES / 10, "{}: {entries} entries", p.name());
            unpack_from(flate2::read::GzDecoder::new(&bundle.bytes[..]), "t").unwrap();
        }
    }

    /// An arbitrary entry: kind, name, link target (`@` is the directory above the root),
    /// data size.
    fn any_entry() -> impl Strategy<Value = (u8, String, String, usize)> {
        let kinds = prop::sample::select(b"0525221346SxgLK7\0".to_vec());
        let part =
            prop::sample::select(vec!["a", "b", "sys", "proc", "..", ".", "", "nicmon-bundle:x", "manifest.json"]);
        let path = (prop::collection::vec(part, 1..5), prop::sample::select(vec!["", "/", "@/", "@/x/"]))
            .prop_map(|(parts, start)| format!("{start}{}", parts.join("/")));
        (kinds, path.clone(), path, 0usize..1500)
    }

    proptest! {
        #[test]
        fn arbitrary_archives_never_panic_nor_reach_outside(entries in prop::collection::vec(any_entry(), 0..12)) {
            let outer = tempfile::tempdir().unwrap();
            let root = outer.path().join("root");
            std::fs::create_dir(&root).unwrap();
            let at = outer.path().to_str().unwrap();
            let mut b = tar::Builder::new(Vec::new());
            for (kind, name, link, size) in &entries {
                let (name, link) = (name.replace('@', at), link.replace('@', at));
                let data = if matches!(kind, b'L' | b'K') { format!("{link}\0").into_bytes() } else { vec![0; *size] };
                raw(&mut b, *kind, name.as_bytes(), link.as_bytes(), &data);
            }
            let bytes = b.into_inner().unwrap();
            let _ = unpack_into(&bytes[..], &root, "p");
            let _ = unpack_into(&bytes[..bytes.len() / 2], &root, "p");
            let beside: Vec<_> = std::fs::read_dir(outer.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            prop_assert_eq!(beside, vec![std::ffi::OsString::from("root")]);
            let real_root = root.canonicalize().unwrap();
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap() {
                    let p = e.unwrap().path();
                    let meta = std::fs::symlink_metadata(&p).unwrap();
                    if meta.is_dir() {
                        stack.push(p);
                    } else if meta.file_type().is_symlink() {
                        if let Ok(to) = p.canonicalize() {
                            prop_assert!(to.starts_with(&real_root), "{} -> {}", p.display(), to.display());
                        }
                    } else {
                        prop_assert!(meta.is_file() && meta.len() <= FILE_BYTES, "{}", p.display());
                    }
                }
            }
        }
    }
}
