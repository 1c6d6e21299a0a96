//! The InfiniBand character-device class directories (`class/infiniband_verbs`,
//! `class/infiniband_mad`): each entry mapped to its device and port through its own
//! `ibdev` and `port` attributes (never through its number).
//!
//! With a [`StaticCache`] (the monitor's polls), the entries naming a frozen (unmonitored)
//! device are not read ([`super::unmonitored`]). And the directories are not listed again
//! while the last listing stands: no device came or went and no entry was frozen or thawed
//! since, every entry read then (those of the devices read on every poll) is still there
//! (looked up in the directory, kept open, which is still the one at its path), it is
//! less than [`STATIC_REFRESH`] old, and the plan lets it stand (the monitor's does while
//! the check has no entry missing: one that comes back must be seen). Then only
//! those entries are read again, and the last result is the poll's while they read the
//! same: a directory of a thousand entries, most of them a VF's, costs a few lookups.
use std::sync::Arc;
use std::time::Instant;

use super::unmonitored::CharEntry;
use super::{Batch, STATIC_REFRESH, StaticCache, opt};
use crate::model::{CharDevices, CharKind, CharNode, ClassDir};
use crate::read::host::{Host, Listing, ReadError, SysDir, Texts};

/// The class directories (below `class/`), with the entry kinds each holds.
const DIRS: [(&str, &[CharKind]); 2] =
    [("infiniband_verbs", &[CharKind::Uverbs]), ("infiniband_mad", &[CharKind::Umad, CharKind::Issm])];

/// What a [`StaticCache`] keeps of the class directories between full polls.
#[derive(Debug, Default)]
pub(super) struct Kept {
    listings: [Listing; 2],
    /// The directories as last listed, kept open for the lookups.
    dirs: [Option<SysDir>; 2],
    last: Option<Last>,
}

/// A full poll's class directories: the result, the positions (per directory) of the
/// entries read, the frozen entries' generation, and when they were listed.
#[derive(Debug, Clone)]
pub(super) struct Last {
    chars: Arc<CharDevices>,
    read: [Vec<usize>; 2],
    generation: u64,
    listed_at: Instant,
}

/// The class directories listed, their entries' attribute files added to a [`Batch`], not
/// read yet.
pub(super) enum CharRead {
    /// As the last full poll listed them: the entries read then, with the indices of their
    /// `ibdev` and `port` in the batch.
    Same {
        last: Last,
        read: [Vec<(usize, usize, Option<usize>)>; 2],
    },
    Listed([ListedChars; 2]),
}

/// A class directory listed.
pub(super) enum ListedChars {
    Done(ClassDir),
    Entries(Vec<(CharKind, String, CharAttrs)>),
}

/// Where an entry's `ibdev` and `port` come from.
pub(super) enum CharAttrs {
    /// Read now: their indices in the batch.
    Read(usize, Option<usize>),
    /// An entry of a frozen (unmonitored) device: as read in its incarnation.
    Frozen(CharEntry),
}

/// The class directories of `host` read now, nothing kept.
pub fn char_devices(host: &Host) -> CharDevices {
    let mut batch = Batch::default();
    let listed = plan(host, None, true, true, &mut batch);
    let files = batch.finish(host, false);
    let results = if files.is_empty() { Texts::default() } else { host.read_files(&files) };
    Arc::unwrap_or_clone(finish(listed, &results, None))
}

impl StaticCache {
    /// The last poll's class directories when their listing stands (see the module notes).
    /// Between walks (`walk` false, see [`super::walk`]) the entries are not looked up.
    fn standing_chars(&self, host: &Host, walk: bool) -> Option<Last> {
        let c = self.inner.lock().ok()?;
        let last = c.chars.last.as_ref()?;
        if last.generation != c.frozen.generation() || last.listed_at.elapsed() >= STATIC_REFRESH {
            return None;
        }
        for (k, dir) in c.chars.dirs.iter().enumerate() {
            // A directory absent or unreadable then is listed again (that costs nothing).
            let (Some(dir), Some(nodes)) = (dir, listed(&last.chars, k)) else { return None };
            if !walk {
                continue;
            }
            let there = |i: &usize| nodes.get(*i).is_some_and(|n| host.exists_in(dir, &n.name));
            if !host.still_at_path(dir) || !last.read[k].iter().all(there) {
                return None;
            }
        }
        Some(last.clone())
    }

    /// List both class directories again: their names, or why not. Between walks (`walk`
    /// false) through the directories as last opened.
    fn relist_chars(&self, host: &Host, walk: bool) -> Option<[Result<Arc<[String]>, ReadError>; 2]> {
        let mut c = self.inner.lock().ok()?;
        let mut listings = std::mem::take(&mut c.chars.listings);
        for (k, (l, (dir, _))) in listings.iter_mut().zip(DIRS).enumerate() {
            let rel = format!("class/{dir}");
            if !walk {
                host.relist_sys_kept(&rel, l);
                continue;
            }
            host.relist_sys(&rel, l);
            host.watch_dir_sys(&rel);
            c.chars.dirs[k] = l.names().is_ok().then(|| host.open_dir_sys(&rel)).flatten();
        }
        let names = [0, 1].map(|k| listings[k].names().cloned().map_err(Clone::clone));
        c.chars.listings = listings;
        Some(names)
    }

    /// The class entry `name` of directory `dir` (0: verbs, 1: mad) when it names a frozen
    /// device.
    fn char_entry(&self, dir: usize, name: &str) -> Option<CharEntry> {
        self.inner.lock().ok()?.frozen.char_entry(dir, name)
    }

    /// Keep this poll's result (`listed_at`: when its directories were listed); the entries
    /// read now that name a frozen device are frozen with it.
    fn keep_chars(&self, chars: &Arc<CharDevices>, read: [Vec<usize>; 2], listed_at: Instant) {
        if let Ok(mut c) = self.inner.lock() {
            let c = &mut *c;
            // Entries frozen now make this result stale: the next poll lists them anew.
            let generation = c.frozen.generation();
            if read.iter().any(|r| !r.is_empty()) {
                let names = c.listing.names().cloned().unwrap_or_else(|_| Arc::from([]));
                let position = |d: &str| names.binary_search_by(|n| n.as_str().cmp(d)).ok();
                c.frozen.freeze_chars(chars, &read, position);
            }
            if c.frozen.generation() != generation {
                // Their files are not the next poll's: nothing is read ahead.
                c.last_batch = None;
            }
            c.chars.last = Some(Last { chars: chars.clone(), read, generation, listed_at });
        }
    }
}

/// List both class directories (with `cache`: through its listings, unless the last
/// listing stands and `list` does not ask for one) and add the attribute files to read to
/// `batch`.
/// `walk`: whether this poll walks paths ([`super::walk`]).
pub(super) fn plan(host: &Host, cache: Option<&StaticCache>, list: bool, walk: bool, batch: &mut Batch) -> CharRead {
    if let Some(last) = cache.filter(|_| !list).and_then(|c| c.standing_chars(host, walk)) {
        // Between walks, while the signs answer for both directories' listings (watched off
        // sysfs, the kernel's uevents heard on sysfs: `read::host::walks`), an entry that goes
        // is a sign and the next poll walks: nothing needs reading until then.
        let stand = !walk && DIRS.iter().all(|(dir, _)| host.listing_stands(&format!("class/{dir}")));
        return plan_same(last, (walk, stand), batch);
    }
    let listed = match cache.and_then(|c| c.relist_chars(host, walk)) {
        Some(names) => names,
        None => DIRS.map(|(dir, _)| host.list_sys_dir(&format!("class/{dir}")).map(Arc::from)),
    };
    let mut k = 0;
    CharRead::Listed(listed.map(|names| {
        let (dir, kinds) = DIRS[k];
        k += 1;
        plan_dir(host, (k - 1, dir, kinds), names, cache, batch)
    }))
}

/// The entries read at the last full poll, read again: each entry's `ibdev` (an entry
/// removed fails its read), and its `port` only on a walk (an entry's port is fixed while it
/// exists: between walks it is the last one read). Nothing while the listings `stand`
/// (an entry's `ibdev` is fixed while it exists too): the last result is this poll's.
fn plan_same(last: Last, (walk, stand): (bool, bool), batch: &mut Batch) -> CharRead {
    let mut read: [Vec<(usize, usize, Option<usize>)>; 2] = Default::default();
    for k in (0..2).filter(|_| !stand) {
        let Some(nodes) = listed(&last.chars, k) else { continue };
        let rel = DIRS[k].0;
        for &i in &last.read[k] {
            let Some(n) = nodes.get(i) else { continue };
            let ibdev = batch.add(format_args!("class/{rel}/{}/ibdev", n.name));
            let port =
                (walk && n.kind != CharKind::Uverbs).then(|| batch.add(format_args!("class/{rel}/{}/port", n.name)));
            read[k].push((i, ibdev, port));
        }
    }
    CharRead::Same { last, read }
}

/// One class directory listed: every entry's attributes go into `batch`, except those of an
/// entry naming a frozen device (`cache`).
fn plan_dir(
    host: &Host,
    (k, dir, kinds): (usize, &str, &[CharKind]),
    names: Result<Arc<[String]>, ReadError>,
    cache: Option<&StaticCache>,
    batch: &mut Batch,
) -> ListedChars {
    let rel = format!("class/{dir}");
    let names = match names {
        Ok(names) => names,
        Err(ReadError::Missing) => return ListedChars::Done(ClassDir::Absent),
        Err(e) => return ListedChars::Done(ClassDir::Unreadable(format!("{}: {e}", host.sys(&rel).display()))),
    };
    ListedChars::Entries(
        names
            .iter()
            .filter_map(|name| {
                let kind = CharKind::of_entry(name).filter(|kd| kinds.contains(kd))?;
                if let Some(e) = cache.and_then(|c| c.char_entry(k, name)) {
                    return Some((kind, name.clone(), CharAttrs::Frozen(e)));
                }
                let ibdev = batch.add(format_args!("{rel}/{name}/ibdev"));
                let port = match kind {
                    CharKind::Uverbs => None,
                    CharKind::Umad | CharKind::Issm => Some(batch.add(format_args!("{rel}/{name}/port"))),
                };
                Some((kind, name.clone(), CharAttrs::Read(ibdev, port)))
            })
            .collect(),
    )
}

/// An entry's device and port from the batch's results.
fn read_entry(results: &Texts, ibdev: usize, port: Option<usize>) -> CharEntry {
    CharEntry {
        device: opt(results.text(ibdev)),
        port: port.and_then(|i| opt(results.text(i))).and_then(|p| p.parse::<u32>().ok()),
    }
}

/// The class directories from their listings and the batch's results (with a cache: kept
/// for the next poll).
pub(super) fn finish(read: CharRead, results: &Texts, cache: Option<&StaticCache>) -> Arc<CharDevices> {
    match read {
        CharRead::Same { last, read } => {
            let mut chars = last.chars.clone();
            for (k, entries) in read.iter().enumerate() {
                for &(i, ibdev, port) in entries {
                    let mut e = read_entry(results, ibdev, port);
                    if port.is_none() {
                        // Not read (between walks, or a verbs entry, which has none): as kept.
                        e.port = listed(&chars, k).and_then(|nodes| nodes.get(i)).and_then(|n| n.port);
                    }
                    let same = |n: &CharNode| n.device == e.device && n.port == e.port;
                    if listed(&chars, k).is_none_or(|nodes| nodes.get(i).is_none_or(same)) {
                        continue;
                    }
                    let c = Arc::make_mut(&mut chars);
                    if let ClassDir::Listed(nodes) = if k == 0 { &mut c.verbs } else { &mut c.mad }
                        && let Some(n) = nodes.get_mut(i)
                    {
                        (n.device, n.port) = (e.device, e.port);
                    }
                }
            }
            if let Some(cache) = cache {
                cache.keep_chars(&chars, last.read, last.listed_at);
            }
            chars
        }
        CharRead::Listed(listed) => finish_listed(listed, results, cache),
    }
}

/// The entries of directory `k` (0: verbs, 1: mad), if it was listed.
fn listed(chars: &CharDevices, k: usize) -> Option<&[CharNode]> {
    match if k == 0 { &chars.verbs } else { &chars.mad } {
        ClassDir::Listed(nodes) => Some(nodes),
        ClassDir::Absent | ClassDir::Unreadable(_) => None,
    }
}

/// [`finish`] of directories listed anew.
fn finish_listed(listed: [ListedChars; 2], results: &Texts, cache: Option<&StaticCache>) -> Arc<CharDevices> {
    // Per directory, the positions of the entries read now.
    let listed_at = Instant::now();
    let mut read_now: [Vec<usize>; 2] = Default::default();
    let mut finish = |k: usize, l: ListedChars| match l {
        ListedChars::Done(d) => d,
        ListedChars::Entries(entries) => ClassDir::Listed(
            entries
                .into_iter()
                .enumerate()
                .map(|(i, (kind, name, attrs))| {
                    let e = match attrs {
                        CharAttrs::Read(ibdev, port) => {
                            read_now[k].push(i);
                            read_entry(results, ibdev, port)
                        }
                        CharAttrs::Frozen(e) => e,
                    };
                    CharNode { kind, name, device: e.device, port: e.port }
                })
                .collect(),
        ),
    };
    let [verbs, mad] = listed;
    let chars = Arc::new(CharDevices { verbs: finish(0, verbs), mad: finish(1, mad) });
    if let Some(cache) = cache {
        cache.keep_chars(&chars, read_now, listed_at);
    }
    chars
}
