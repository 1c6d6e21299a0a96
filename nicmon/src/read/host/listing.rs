//! A directory listed poll after poll ([`Listing`]): the entries as the directory gives
//! them are compared with the last listing's, byte for byte, and parsed and sorted only when
//! they differ, so an unchanged directory of a thousand entries costs its `getdents` calls
//! and one comparison, no allocation. The directory stays open: a listing that need not
//! walk its path ([`Listing::relist_kept`]) rewinds it (`lseek` and `getdents64`, no
//! `open`, no path walk).
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::ReadError;

/// A directory's listing, kept between polls ([`super::Host::relist_sys`]).
#[derive(Debug, Clone)]
pub struct Listing {
    /// The directory as last opened by its path.
    dir: KeptDir,
    /// The entry names in the directory's order, each followed by a NUL.
    raw: Vec<u8>,
    /// The buffer the next listing is read into (swapped with `raw` when it differs).
    scratch: Vec<u8>,
    /// The names, sorted (not `.` and `..`), or why the directory could not be listed.
    names: Result<Arc<[String]>, ReadError>,
    /// Whether the directory was listed yet.
    listed: bool,
}

impl Default for Listing {
    fn default() -> Listing {
        Listing { dir: KeptDir(None), raw: Vec::new(), scratch: Vec::new(), names: Ok(Arc::from([])), listed: false }
    }
}

impl Listing {
    /// The names of the last listing, sorted, or why it failed.
    pub fn names(&self) -> Result<&Arc<[String]>, &ReadError> {
        self.names.as_ref()
    }

    /// List `path` again (opened by its path): whether the names (or the failure) differ
    /// from the last listing's.
    pub(super) fn relist(&mut self, path: &Path) -> bool {
        let listed = list_raw(path, &mut self.scratch);
        let (listed, dir) = match listed {
            Ok(dir) => (Ok(()), Some(dir)),
            Err(e) => (Err(e), None),
        };
        self.dir.0 = dir;
        self.compare(listed)
    }

    /// List the directory again as it was last opened (rewound, read), or by `path` when
    /// it was not: as [`Listing::relist`].
    pub(super) fn relist_kept(&mut self, path: &Path) -> bool {
        let Some(dir) = &mut self.dir.0 else { return self.relist(path) };
        let listed = read_entries(dir, &mut self.scratch);
        if listed.is_err() {
            self.dir.0 = None;
        }
        self.compare(listed)
    }

    /// Take the listing just read into `scratch` (or its failure).
    fn compare(&mut self, listed: io::Result<()>) -> bool {
        let first = !self.listed;
        self.listed = true;
        let names = match listed {
            Ok(()) if self.names.is_ok() && self.scratch == self.raw && !first => return false,
            Ok(()) => {
                std::mem::swap(&mut self.raw, &mut self.scratch);
                Ok(parse(&self.raw))
            }
            Err(e) => {
                self.raw.clear();
                Err(match e.kind() {
                    io::ErrorKind::NotFound => ReadError::Missing,
                    io::ErrorKind::NotADirectory => ReadError::Io("not a directory".into()),
                    _ => ReadError::Io(e.to_string()),
                })
            }
        };
        // The same names in another order are the same listing.
        let changed = first || names != self.names;
        self.names = names;
        changed
    }
}

/// The names of `raw` (NUL-terminated, as [`list_raw`] writes them), sorted.
fn parse(raw: &[u8]) -> Arc<[String]> {
    let mut names: Vec<String> =
        raw.split(|b| *b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect();
    names.sort();
    names.into()
}

/// A directory kept open between listings (not cloned with its [`Listing`]).
struct KeptDir(Option<rustix::fs::Dir>);

impl Clone for KeptDir {
    fn clone(&self) -> KeptDir {
        KeptDir(None)
    }
}

impl std::fmt::Debug for KeptDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("KeptDir").field(&self.0.is_some()).finish()
    }
}

/// The entry names of directory `path` in its order, each followed by a NUL, into `out`
/// (cleared first): one `open`, `getdents64` until the end. The directory, open, is
/// returned.
fn list_raw(path: &Path, out: &mut Vec<u8>) -> io::Result<rustix::fs::Dir> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NONBLOCK;
    let mut dir = rustix::fs::Dir::new(rustix::fs::openat(rustix::fs::CWD, path, flags, Mode::empty())?)?;
    read_entries(&mut dir, out)?;
    Ok(dir)
}

/// The entry names of the open directory `dir` from its start, as [`list_raw`] writes
/// them: rewound (one `lseek`), `getdents64` until the end.
fn read_entries(dir: &mut rustix::fs::Dir, out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    dir.rewind();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.extend_from_slice(name);
            out.push(0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_changes_only_when_its_names_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Listing::default();
        assert!(l.relist(dir.path()), "the first listing is a change");
        assert_eq!(l.names().unwrap().len(), 0);
        assert!(!l.relist(dir.path()));
        for n in ["b", "a", "c"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        assert!(l.relist(dir.path()));
        assert_eq!(&**l.names().unwrap(), ["a", "b", "c"]);
        let before = l.names().unwrap().clone();
        assert!(!l.relist(dir.path()));
        assert!(Arc::ptr_eq(&before, l.names().unwrap()), "an unchanged listing is the same list");
        std::fs::remove_file(dir.path().join("b")).unwrap();
        assert!(l.relist(dir.path()));
        assert_eq!(&**l.names().unwrap(), ["a", "c"]);
        // Gone: the failure is the listing; back: a change again.
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(l.relist(&path));
        assert_eq!(l.names(), Err(&ReadError::Missing));
        assert!(!l.relist(&path), "still missing: no change");
        std::fs::create_dir_all(&path).unwrap();
        assert!(l.relist(&path));
        assert_eq!(l.names().unwrap().len(), 0);
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "").unwrap();
        assert!(l.relist(&path));
        assert!(matches!(l.names(), Err(ReadError::Io(_))));
        std::fs::remove_file(&path).unwrap();
    }
}
