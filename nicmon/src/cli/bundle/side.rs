//! The files a bundle holds beside the trees: the side files nicmon reads (metadata,
//! config, state, boot ID), the kernel log records of the last 24 h that concern this
//! node, `nicmon version` and the running daemon's wake-up hook status.
use std::path::Path;
use std::time::{Duration, Instant};

use super::copier::read_all;
use super::error::BundleError;
use super::replay::Replay;
use super::{Limits, SideFile};
use crate::decide::kmsg::DeviceIndex;
use crate::decide::kmsg::Resolution;
use crate::decide::settings::Config;
use crate::model::kmsg::HostLinks;
use crate::read::discovery::{self, ReadPlan};
use crate::read::host::Host;

/// Kernel-log records older than this are not included.
const KMSG_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// Read a file outside the trees (metadata, config, state): its bytes or why not.
pub(super) fn side_file(path: &Path, limits: &Limits, deadline: Instant) -> SideFile {
    match read_all(vec![path.to_path_buf()], limits.file_bytes, limits, deadline).remove(0) {
        Ok(b) => Ok(b),
        Err(why) => Err(match why.strip_prefix("errno=").and_then(|n| n.parse().ok()) {
            Some(n) => format!("missing: {}: {}", path.display(), std::io::Error::from_raw_os_error(n)),
            None => format!("not captured: {}: {why}", path.display()),
        }),
    }
}

/// `nicmon version`'s text: the version, whether the eBPF programs are built in, and which
/// userspace wake sources this host lets nicmon open (the eBPF hooks are probed when the
/// daemon starts: its start-up line and `nicmon_wake_hook_attached` say which attached).
pub fn version_text() -> String {
    let mut out = format!(
        "nicmon {}\neBPF programs: {}\n",
        env!("CARGO_PKG_VERSION"),
        if crate::read::wake::EBPF_EMBEDDED {
            "built in"
        } else {
            "not built in (polling and rtnetlink only; run `cargo xtask build-ebpf` and rebuild)"
        }
    );
    for (hook, probe) in crate::read::wake::probe_userspace() {
        let said = match probe {
            Ok(()) => "available".to_string(),
            Err(why) => format!("not available ({why})"),
        };
        out.push_str(&format!("wake source {}: {said}\n", hook.name()));
    }
    out
}

/// The kernel log records of the last 24 h that a pattern matches or that name a NIC of
/// this node, in `/dev/kmsg` format. `/dev/kmsg` is read without blocking, from its oldest
/// record; a regular file (records or plain lines) is read whole.
pub(super) fn kernel_log(
    path: &Path,
    staging: &Replay,
    config: &Config,
    limits: &Limits,
    deadline: Instant,
) -> Result<(String, usize), BundleError> {
    let raw: Vec<Vec<u8>> = if std::fs::metadata(path).map(|m| m.is_file()).unwrap_or(false) {
        let bytes = read_all(vec![path.to_path_buf()], limits.total_bytes, limits, deadline)
            .remove(0)
            .map_err(|why| BundleError::KernelLogFile { path: path.into(), why })?;
        split_records(&bytes)
    } else {
        read_kmsg_device(path).map_err(|why| BundleError::KernelLogDevice { path: path.into(), why })?
    };
    let host = Host::new(staging.sysfs(), staging.procfs());
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let links = HostLinks::read(&host, &snapshot, Vec::new());
    let index = DeviceIndex::from_snapshot(&snapshot, |_| true, &links);
    let now_us = crate::read::wake::monotonic_ns() / 1000;
    let oldest = now_us.saturating_sub(KMSG_WINDOW.as_micros() as u64);
    let mut out = String::new();
    let mut n = 0;
    for r in raw {
        let rec = crate::model::kmsg::parse_record(&r);
        if rec.ts_usec.is_some_and(|t| t < oldest) {
            continue;
        }
        let named = match &rec.device {
            Some(crate::model::kmsg::DeviceRef::Netdev(i)) => index.resolve_ifindex(*i),
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
pub(super) fn split_records(bytes: &[u8]) -> Vec<Vec<u8>> {
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
pub(super) fn wake_hooks(port: u16) -> String {
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
        Err(e) => {
            format!(
                "the daemon's metrics at http://127.0.0.1:{port}/metrics could not be read: {}\n",
                crate::act::logging::error_chain(&e)
            )
        }
    }
}

/// Why the daemon's metrics could not be fetched: whatever failed on the way (a socket, HTTP,
/// the status), shown with its causes ([`crate::act::logging::error_chain`]).
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// The runtime or the connection (a socket error).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Http(#[from] hyper::Error),
    #[error(transparent)]
    Request(#[from] hyper::http::Error),
    #[error("HTTP {0}")]
    Status(hyper::StatusCode),
    #[error("no answer within 3 s")]
    Timeout,
}

fn fetch_metrics(port: u16) -> Result<String, FetchError> {
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
                return Err(FetchError::Status(resp.status()));
            }
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, FetchError>(String::from_utf8_lossy(&body).into_owned())
        })
        .await
        .map_err(|_| FetchError::Timeout)?
    })
}
