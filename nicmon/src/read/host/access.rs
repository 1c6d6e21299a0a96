//! The access log: every path a [`super::Host`] was asked about (`nicmon bundle` captures
//! exactly those), and the failure links a support bundle leaves where a read failed, so a
//! replayed tree fails the way the node did.
use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex};

use super::file::FILE_KINDS;
use super::{ReadError, Tree, classify};

/// One question the reader was asked, for [`AccessLog`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// A file's contents.
    Read { tree: Tree, rel: String },
    /// A directory's entry names.
    List { tree: Tree, rel: String },
    /// Whether an entry exists, where a link points, whether it resolves.
    Entry { tree: Tree, rel: String },
    /// The boot ID file given by `--boot-id-path`.
    BootIdFile,
}

/// Every path a [`super::Host`] was asked about (shared with the caller).
pub type AccessLog = Arc<Mutex<BTreeSet<Access>>>;

/// The target prefix of a link that stands for a read failure recorded by a support bundle:
/// `nicmon-bundle:errno=22` (the `read()` failed with that errno), `nicmon-bundle:not-regular:a FIFO`,
/// `nicmon-bundle:stuck`, `nicmon-bundle:too-large`, `nicmon-bundle:outside-tree`.
pub const FAILURE_LINK_PREFIX: &str = "nicmon-bundle:";

/// The read error a failure link stands for.
pub fn failure_link_error(why: &str) -> ReadError {
    if let Some(n) = why.strip_prefix("errno=").and_then(|n| n.parse::<i32>().ok()) {
        return classify(&io::Error::from_raw_os_error(n));
    }
    if let Some(kind) = why.strip_prefix("not-regular") {
        let kind = kind.trim_start_matches(':');
        return ReadError::NotRegular(FILE_KINDS.iter().copied().find(|k| *k == kind).unwrap_or("not a file"));
    }
    ReadError::Io(format!("not captured in the support bundle ({why})"))
}
