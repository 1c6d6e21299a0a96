//! Why a bundle could not be captured or replayed. A kind that wraps a cause names the
//! operation and the path; the cause is its [`source`](std::error::Error::source) (the
//! command line prints the chain).
use std::path::PathBuf;

use super::{FORMAT, MANIFEST};
use crate::cli::check::CheckError;

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// Writing an entry of the staging tree the capture passes read.
    #[error("staging {}", path.display())]
    Staging {
        path: PathBuf,
        #[source]
        why: std::io::Error,
    },
    /// Adding a file or directory to the archive.
    #[error("bundle: adding {path}")]
    Add {
        path: String,
        #[source]
        why: std::io::Error,
    },
    /// Adding a symlink (a kept link or a failure link) to the archive.
    #[error("bundle: adding link {path} -> {target}")]
    AddLink {
        path: String,
        target: String,
        #[source]
        why: std::io::Error,
    },
    #[error("bundle: finishing the archive")]
    Finish(#[source] std::io::Error),
    /// The manifest could not be serialised.
    #[error(transparent)]
    WriteManifest(serde_json::Error),
    #[error("bundle: compressing")]
    Compress(#[source] std::io::Error),
    /// The temporary directory a bundle is unpacked into.
    #[error("creating a temporary directory")]
    TempDir(#[source] std::io::Error),
    /// `what` (the bundle file, or the staging tree) is not a tar archive.
    #[error("{what}: cannot unpack (not a nicmon bundle?): {why}")]
    Unpack { what: String, why: std::io::Error },
    /// An entry a replay does not unpack (see [`Refusal`]): the archive is refused whole.
    #[error("{what}: entry {entry} refused: {why}")]
    Refused { what: String, entry: String, why: Refusal },
    #[error("{what}: {} is invalid", MANIFEST)]
    InvalidManifest {
        what: String,
        #[source]
        why: serde_json::Error,
    },
    /// A bundle of a format this nicmon does not read.
    #[error("{what}: bundle format {format} (this nicmon reads format {})", FORMAT)]
    Format { what: String, format: u32 },
    #[error("bundle {}: cannot open: {why}", path.display())]
    Open { path: PathBuf, why: std::io::Error },
    /// A tar archive without a manifest.
    #[error("{what}: no {}: not a nicmon bundle", MANIFEST)]
    NoManifest { what: String },
    /// The kernel log file (records or plain lines) could not be read (`why`: the copier's).
    #[error("{}: {why}", path.display())]
    KernelLogFile { path: PathBuf, why: String },
    /// The kernel log device could not be read.
    #[error("{}", path.display())]
    KernelLogDevice {
        path: PathBuf,
        #[source]
        why: std::io::Error,
    },
    /// The replayed `check` or `topology`.
    #[error(transparent)]
    Check(#[from] CheckError),
}

/// Why an entry of a bundle is refused on replay (the bundle unpacker's bounds and rules;
/// see `unpack.rs`). Shown inline: [`BundleError::Refused`] is one line.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A symlink whose target leaves the unpacked bundle (absolute, above the root, or a
    /// `..` after a name: where that lands depends on what the name is).
    #[error("a link to {target}, which leaves the bundle")]
    LinkOutside { target: String },
    /// A symlink outside `sys/` and `proc/` (or one of those two itself).
    #[error("a link to {target} outside sys/ and proc/ (only their entries may be links)")]
    LinkNotInTree { target: String },
    /// A hard link, device, FIFO, sparse file, PAX header...: not in a nicmon bundle.
    #[error("a {kind} entry (a bundle holds files, directories and symlinks only)")]
    Kind { kind: String },
    /// A directory or link whose header claims data.
    #[error("a {kind} entry with {size} bytes of data")]
    DataInNonFile { kind: String, size: u64 },
    #[error("an absolute path")]
    Absolute,
    #[error("a path with `..`")]
    ParentDir,
    #[error("an empty path")]
    Empty,
    #[error("{depth} path components, over the limit of {max}")]
    TooDeep { depth: usize, max: usize },
    #[error("a path of {len} bytes, over the limit of {max}")]
    TooLong { len: u64, max: usize },
    #[error("{size} bytes, over the limit of {max} bytes for this file")]
    FileTooLarge { size: u64, max: u64 },
    #[error("the files under sys/ and proc/ would pass {max} bytes in all")]
    TreesTooLarge { max: u64 },
    #[error("the bundle's files would pass {max} bytes in all")]
    BundleTooLarge { max: u64 },
    #[error("more than {max} entries")]
    TooManyEntries { max: u64 },
    /// An entry under something an earlier entry made a file or a link.
    #[error("{parent} is not a directory")]
    ParentNotDirectory { parent: String },
    /// A file or link where an earlier entry made a directory, or a directory where one
    /// made a file or a link.
    #[error("it clashes with an earlier entry")]
    Clash,
    /// The data ended before the size its header gives.
    #[error("its data ends after {got} of {size} bytes")]
    Truncated { got: u64, size: u64 },
}
