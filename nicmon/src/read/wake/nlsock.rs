//! The netlink sockets of the userspace wake sources ([`super::rtnetlink`], [`super::uevent`],
//! [`super::rdma_monitor`], [`super::devlink_monitor`]): opened non-blocking, bound to (or
//! joined to) multicast groups, read one datagram at a time with the sender's port id.
use super::{Hint, Hook, Wake, monotonic_ns};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A non-blocking `AF_NETLINK` socket of `kind` (`SOCK_RAW`, `SOCK_DGRAM`) and `protocol`,
/// bound with the group mask `groups` (0: none).
pub(super) fn open(kind: libc::c_int, protocol: libc::c_int, groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, kind | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, protocol) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_nl is valid; fields set below.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_groups = groups;
    // SAFETY: `addr` is a valid sockaddr_nl of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Joins the multicast group `group` (`NETLINK_ADD_MEMBERSHIP`: any group number, where the
/// bind mask of [`open`] holds only the first 32).
pub(super) fn join(fd: &OwnedFd, group: u32) -> io::Result<()> {
    // SAFETY: `group` is a valid u32 for the option's length.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            (&raw const group).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// One datagram into `buf`: its length, and whether the kernel sent it (sender port id 0).
pub(super) fn recv(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, bool)> {
    // SAFETY: an all-zero sockaddr_nl is valid; the kernel fills it.
    let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    // SAFETY: `buf` is valid for writes of its length, `from` for `len` bytes.
    let n = unsafe {
        libc::recvfrom(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0, (&raw mut from).cast(), &mut len)
    };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok((n as usize, from.nl_pid == 0)) }
}

/// Spawns the listener task of a netlink wake source on the current tokio runtime: each
/// datagram the kernel sent (others are ignored) becomes the wake-ups `decode` makes of it,
/// given when it arrived (`Instant`, `CLOCK_MONOTONIC` ns). An overrun (`ENOBUFS`) still
/// wakes, as `hook` without a hint. The task ends when the receiver is dropped, or with a
/// warning naming `what` when the socket fails.
pub(super) fn listen<F>(
    fd: OwnedFd,
    tx: mpsc::Sender<Wake>,
    hook: Hook,
    what: &'static str,
    decode: F,
) -> io::Result<JoinHandle<()>>
where
    F: Fn(&[u8], Instant, u64) -> Vec<Wake> + Send + 'static,
{
    let fd = super::register_readable(fd)?;
    Ok(tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return;
            };
            loop {
                let wakes = match recv(guard.get_inner(), &mut buf) {
                    Ok((n, true)) => decode(&buf[..n], Instant::now(), monotonic_ns()),
                    Ok((_, false)) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => vec![Wake {
                        hook,
                        kernel_ts_ns: None,
                        hint: Hint::None,
                        removed: false,
                        received: Instant::now(),
                        received_ns: monotonic_ns(),
                    }],
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "{what} stopped");
                        return;
                    }
                };
                for wake in wakes {
                    if !super::deliver(&tx, wake) {
                        return;
                    }
                }
            }
        }
    }))
}
