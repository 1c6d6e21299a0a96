//! RDMA netlink monitor (`NETLINK_RDMA`, group `RDMA_NL_GROUP_NOTIFY`, kernel 6.12+; SPEC
//! §1.15): the RDMA core's own word that an RDMA device was registered or unregistered, or
//! that a netdev was attached to or detached from one of its ports. Each event wakes the
//! agent with the device name as its hint; an unregistration or a detach is flagged as a
//! removal, so the decider may report the device's loss in the poll that confirms it.
//!
//! The messages are `RDMA_NLDEV_CMD_MONITOR` of the `RDMA_NL_NLDEV` client, attributes
//! `RDMA_NLDEV_ATTR_EVENT_TYPE` (u8), `RDMA_NLDEV_ATTR_DEV_NAME` and, for netdev events,
//! `RDMA_NLDEV_ATTR_NDEV_NAME` (`include/uapi/rdma/rdma_netlink.h`). A kernel before 6.12
//! accepts the subscription and sends nothing: the uevents still say the same, later.
use super::{Hint, Wake};
use nicmon_common::Hook;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// `NETLINK_RDMA` (`include/uapi/linux/netlink.h`).
const NETLINK_RDMA: libc::c_int = 20;
/// `RDMA_NL_GROUP_NOTIFY` (`RDMA_NL_GROUP_IWPM = 2, RDMA_NL_GROUP_LS, RDMA_NL_GROUP_NOTIFY`).
const GROUP_NOTIFY: u32 = 4;
/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_MONITOR)`: client 5 in the high bits
/// (`<< 10`), command 28.
const MONITOR_TYPE: u16 = (5 << 10) + 28;
/// `RDMA_NLDEV_ATTR_DEV_NAME`, `RDMA_NLDEV_ATTR_NDEV_NAME`, `RDMA_NLDEV_ATTR_EVENT_TYPE`.
const ATTR_DEV_NAME: u16 = 2;
const ATTR_NDEV_NAME: u16 = 51;
const ATTR_EVENT_TYPE: u16 = 102;

/// `enum rdma_nl_notify_event_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Register,
    Unregister,
    NetdevAttach,
    NetdevDetach,
    Rename,
    NetdevRename,
}

impl Event {
    fn from_code(code: u8) -> Option<Event> {
        Some(match code {
            0 => Event::Register,
            1 => Event::Unregister,
            2 => Event::NetdevAttach,
            3 => Event::NetdevDetach,
            4 => Event::Rename,
            5 => Event::NetdevRename,
            _ => return None,
        })
    }

    /// The device (or its netdev) left.
    pub fn is_removal(self) -> bool {
        matches!(self, Event::Unregister | Event::NetdevDetach)
    }
}

/// One monitor message, as far as the wake-up path cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub event: Event,
    /// The RDMA device (`mlx5_3`).
    pub device: String,
    /// The netdev of a netdev event, when given.
    pub netdev: Option<String>,
}

/// A netlink socket subscribed to the RDMA core's notifications.
pub struct MonitorSocket {
    fd: OwnedFd,
}

impl AsRawFd for MonitorSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl MonitorSocket {
    /// Opens a non-blocking `NETLINK_RDMA` socket joined to `RDMA_NL_GROUP_NOTIFY`. Fails
    /// where the RDMA core is not loaded (`EPROTONOSUPPORT`) or joining needs a capability.
    pub fn open() -> io::Result<Self> {
        let fd = super::nlsock::open(libc::SOCK_RAW, NETLINK_RDMA, 0)?;
        super::nlsock::join(&fd, GROUP_NOTIFY)?;
        Ok(Self { fd })
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A NUL-terminated attribute string, at most 64 bytes (`IB_DEVICE_NAME_MAX`, `IFNAMSIZ`).
fn name(payload: &[u8]) -> Option<String> {
    let end = payload.iter().position(|&b| b == 0).unwrap_or(payload.len());
    let s = std::str::from_utf8(&payload[..end]).ok()?.trim();
    (!s.is_empty() && s.len() <= 64).then(|| s.to_string())
}

/// Parses every monitor message of one datagram (netlink messages back to back, each
/// `nlmsghdr` then attributes). Anything else — another message type, a truncated or
/// malformed message, one without an event type or device name — is skipped.
pub fn parse(buf: &[u8]) -> Vec<Notice> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let (Some(len), Some(kind)) = (u32_at(buf, at), u16_at(buf, at + 4)) {
        let len = len as usize;
        let Some(msg) = buf.get(at..at.saturating_add(len)).filter(|_| len >= 16) else { break };
        if kind == MONITOR_TYPE
            && let Some(n) = notice(&msg[16..])
        {
            out.push(n);
        }
        at = at.saturating_add((len + 3) & !3);
    }
    out
}

/// The notice of one message's attributes.
fn notice(attrs: &[u8]) -> Option<Notice> {
    let (mut event, mut device, mut netdev) = (None, None, None);
    let mut at = 0usize;
    while let (Some(len), Some(kind)) = (u16_at(attrs, at), u16_at(attrs, at + 2)) {
        let len = usize::from(len);
        let payload = attrs.get(at + 4..at + len.max(4))?;
        match kind & 0x3fff {
            ATTR_EVENT_TYPE => event = payload.first().copied().and_then(Event::from_code),
            ATTR_DEV_NAME => device = name(payload),
            ATTR_NDEV_NAME => netdev = name(payload),
            _ => {}
        }
        if len < 4 {
            return None;
        }
        at += (len + 3) & !3;
    }
    Some(Notice { event: event?, device: device?, netdev })
}

impl Notice {
    fn into_wake(self, received: Instant, received_ns: u64) -> Wake {
        Wake {
            hook: Hook::RdmaMonitor,
            kernel_ts_ns: None,
            hint: Hint::Name(self.device),
            removed: self.event.is_removal(),
            received,
            received_ns,
        }
    }
}

/// Spawns the listener task on the current tokio runtime; it sends a [`Wake`] per notice
/// and ends when the receiver is dropped. An overrun (`ENOBUFS`) still wakes, without a hint.
pub fn spawn(socket: MonitorSocket, tx: mpsc::Sender<Wake>) -> io::Result<JoinHandle<()>> {
    super::nlsock::listen(socket.fd, tx, Hook::RdmaMonitor, "RDMA netlink monitor", |buf, at, ns| {
        parse(buf).into_iter().map(|x| x.into_wake(at, ns)).collect()
    })
}

#[cfg(test)]
mod tests;
