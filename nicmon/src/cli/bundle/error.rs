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
