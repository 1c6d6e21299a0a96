//! rtnetlink `RTNLGRP_LINK` listener: the carrier wake source that needs no eBPF. The
//! kernel multicasts `RTM_NEWLINK`/`RTM_DELLINK` on every link change (carrier, operstate,
//! flags), so a wake-up follows a carrier loss within the netlink delivery latency.
use super::{Hint, Wake, monotonic_ns};
use nicmon_common::Hook;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const NLMSG_HDRLEN: usize = 16;
const IFINFOMSG_LEN: usize = 16;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const IFLA_IFNAME: u16 = 3;

/// A netlink socket subscribed to `RTNLGRP_LINK`.
pub struct LinkSocket {
    fd: OwnedFd,
}

impl AsRawFd for LinkSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl LinkSocket {
    /// Opens a non-blocking `NETLINK_ROUTE` socket bound to the `RTNLGRP_LINK` group.
    pub fn open() -> io::Result<Self> {
        let fd = super::nlsock::open(libc::SOCK_RAW, libc::NETLINK_ROUTE, libc::RTMGRP_LINK as u32)?;
        Ok(Self { fd })
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    }
}

/// One link notification, as far as the wake-up path cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkNotice {
    pub ifindex: u32,
    pub ifname: Option<String>,
    pub deleted: bool,
}

/// Parses one datagram of rtnetlink messages; anything malformed ends the walk (the
/// messages before it are kept). Messages other than `RTM_NEWLINK`/`RTM_DELLINK` are
/// skipped.
pub fn parse_link_messages(mut buf: &[u8]) -> Vec<LinkNotice> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        let payload = &buf[NLMSG_HDRLEN..len];
        if (kind == RTM_NEWLINK || kind == RTM_DELLINK) && payload.len() >= IFINFOMSG_LEN {
            let ifindex = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            out.push(LinkNotice {
                ifindex,
                ifname: find_ifname(&payload[IFINFOMSG_LEN..]),
                deleted: kind == RTM_DELLINK,
            });
        }
        buf = buf.get(align4(len)..).unwrap_or(&[]);
    }
    out
}

fn find_ifname(mut attrs: &[u8]) -> Option<String> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == IFLA_IFNAME {
            let value = &attrs[4..len];
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            return std::str::from_utf8(&value[..end]).ok().map(str::to_owned);
        }
        attrs = attrs.get(align4(len)..).unwrap_or(&[]);
    }
    None
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

impl LinkNotice {
    fn into_wake(self, received: Instant, received_ns: u64) -> Wake {
        // `RTM_DELLINK` naming the link is the kernel's word that the netdev is gone.
        let removed = self.deleted && self.ifname.is_some();
        let hint = match self.ifname {
            Some(name) => Hint::Name(name),
            None => Hint::Ifindex(self.ifindex),
        };
        Wake { hook: Hook::Rtnetlink, kernel_ts_ns: None, hint, removed, received, received_ns }
    }
}

/// Spawns the listener task on the current tokio runtime; it sends a [`Wake`] per link
/// notification and ends when the receiver is dropped. A socket overrun (`ENOBUFS`: some
/// notifications were lost) still wakes, without a hint.
pub fn spawn(socket: LinkSocket, tx: mpsc::Sender<Wake>) -> io::Result<JoinHandle<()>> {
    let fd = super::register_readable(socket)?;
    Ok(tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return;
            };
            loop {
                match guard.get_inner().recv(&mut buf) {
                    Ok(n) => {
                        let (received, received_ns) = (Instant::now(), monotonic_ns());
                        for notice in parse_link_messages(&buf[..n]) {
                            if !super::deliver(&tx, notice.into_wake(received, received_ns)) {
                                return;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        let wake = Wake {
                            hook: Hook::Rtnetlink,
                            kernel_ts_ns: None,
                            hint: Hint::None,
                            removed: false,
                            received: Instant::now(),
                            received_ns: monotonic_ns(),
                        };
                        if !super::deliver(&tx, wake) {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "rtnetlink listener stopped");
                        return;
                    }
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nlmsg(kind: u16, ifindex: u32, name: Option<&str>) -> Vec<u8> {
        let mut payload = vec![0u8; IFINFOMSG_LEN];
        payload[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        if let Some(name) = name {
            let alen = 4 + name.len() + 1;
            payload.extend_from_slice(&(alen as u16).to_ne_bytes());
            payload.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
            payload.extend_from_slice(name.as_bytes());
            payload.push(0);
            payload.resize(align4(payload.len()), 0);
        }
        let len = NLMSG_HDRLEN + payload.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(&payload);
        m
    }

    #[test]
    fn parses_new_and_del_link_with_names() {
        let mut dgram = nlmsg(RTM_NEWLINK, 7, Some("eth0"));
        dgram.extend(nlmsg(RTM_DELLINK, 9, None));
        dgram.extend(nlmsg(20 /* RTM_NEWADDR */, 1, Some("lo")));
        assert_eq!(
            parse_link_messages(&dgram),
            vec![
                LinkNotice { ifindex: 7, ifname: Some("eth0".into()), deleted: false },
                LinkNotice { ifindex: 9, ifname: None, deleted: true },
            ]
        );
    }

    #[test]
    fn malformed_input_never_panics() {
        assert!(parse_link_messages(&[]).is_empty());
        assert!(parse_link_messages(&[0xff; 15]).is_empty());
        let mut m = nlmsg(RTM_NEWLINK, 3, Some("ib0"));
        m[0] = 0xff; // length past the buffer
        assert!(parse_link_messages(&m).is_empty());
        let mut m = nlmsg(RTM_NEWLINK, 3, Some("ib0"));
        m[NLMSG_HDRLEN + IFINFOMSG_LEN] = 200; // attribute length past the message
        assert_eq!(parse_link_messages(&m)[0].ifname, None);
        for cut in 0..m.len() {
            let _ = parse_link_messages(&m[..cut]);
        }
    }
}
