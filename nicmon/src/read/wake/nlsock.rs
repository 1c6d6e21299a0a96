//! The netlink sockets of the userspace wake sources ([`super::rtnetlink`], [`super::uevent`],
//! [`super::rdma_monitor`]): opened non-blocking, bound to multicast groups, read one
//! datagram at a time with the sender's port id.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
