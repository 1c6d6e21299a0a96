//! Why a value could not be read from the host: what a snapshot keeps of a failed read.
use std::io;
use std::path::Path;

/// Why a value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The file does not exist (or a dangling link).
    Missing,
    /// `read()` failed with `EINVAL` (now or earlier in this boot): not read again.
    Invalid,
    /// Any other I/O error (permission, EIO, ...).
    Io(String),
    /// Not a regular file where one is expected: a FIFO, a device, a directory, a socket.
    NotRegular(&'static str),
    /// Longer than the limit for this kind of file (bytes).
    TooLarge(usize),
    /// The read did not return in time and was abandoned, or an earlier read of the same
    /// path has not returned yet, or too many reads are stuck.
    Stuck(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => f.write_str("missing"),
            ReadError::Invalid => f.write_str("read failed with EINVAL"),
            ReadError::Io(e) => f.write_str(e),
            ReadError::NotRegular(kind) => write!(f, "not a regular file ({kind}): not read"),
            ReadError::TooLarge(limit) => write!(f, "larger than {limit} bytes: not read"),
            ReadError::Stuck(why) => write!(f, "stuck read: {why}"),
        }
    }
}

impl ReadError {
    /// The same error as an `io::Error` (for callers whose errors are I/O errors).
    pub fn into_io(self, path: &Path) -> io::Error {
        io::Error::new(self.io_kind(), format!("{}: {self}", path.display()))
    }

    /// The same error as an `io::Error` whose text does not name the file (for an error
    /// type that names it itself).
    pub fn to_io(&self) -> io::Error {
        io::Error::new(self.io_kind(), self.to_string())
    }

    fn io_kind(&self) -> io::ErrorKind {
        match self {
            ReadError::Missing => io::ErrorKind::NotFound,
            ReadError::Invalid | ReadError::NotRegular(_) | ReadError::TooLarge(_) => io::ErrorKind::InvalidData,
            ReadError::Stuck(_) => io::ErrorKind::TimedOut,
            ReadError::Io(_) => io::ErrorKind::Other,
        }
    }
}

impl std::error::Error for ReadError {}
