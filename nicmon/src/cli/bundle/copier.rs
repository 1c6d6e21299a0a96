//! The bounded copier: the only code of a capture that touches the live node. Files are
//! read on a worker thread, each within the per-file limit and all within the capture's
//! budget; a read that does not finish is left behind with its thread.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use super::Limits;
use crate::read::host::open_regular;

/// Read files on a worker thread, in order: regular files only, at most `cap` bytes each.
/// A file whose read has not finished within the per-file limit is
/// `stuck` and left behind with its thread (a read stuck in the kernel cannot be
/// cancelled); a fresh worker goes on with the rest. After the deadline every file left is
/// `time-budget`. `Err` is the failure-link reason.
pub(super) fn read_all(
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

pub(super) fn read_all_with(
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
            None => match e.to_string().strip_prefix(crate::read::host::NOT_REGULAR) {
                Some(kind) => Err(format!("not-regular:{}", kind.trim_start_matches(':').trim())),
                None => Err(format!("errno={}", libc::EIO)),
            },
        },
    }
}
