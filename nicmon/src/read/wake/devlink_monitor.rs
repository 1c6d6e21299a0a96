//! devlink notifications (generic netlink family `devlink`, multicast group `config`; SPEC
//! §1.15): the kernel's own word that a health reporter changed state or recovered, or that
//! a devlink instance was registered or unregistered. Each wakes the agent with the
//! instance's device name as its hint — for a PCI function its address (`0000:3b:00.0`),
//! the hint the devlink tracepoints give — so the targeted poll reads that function's
//! reporters at once; an unregistration is flagged as a removal.
//!
//! The messages (`include/uapi/linux/devlink.h`, `net/devlink/health.c`, `dev.c`):
//! `DEVLINK_CMD_HEALTH_REPORTER_RECOVER`, which `devlink_recover_notify` sends on every
//! reporter state change and recovery with the reporter's attributes (`BUS_NAME`,
//! `DEV_NAME`, a port reporter's `PORT_INDEX`, then `HEALTH_REPORTER` nested: `NAME`,
//! `STATE`, the counts), and `DEVLINK_CMD_NEW` / `DEVLINK_CMD_DEL` (`devlink_notify`, on
//! register and unregister) with the instance's handle. Every other command of the group
//! (ports, params, regions, traps) is skipped. The family and group ids are the kernel's
//! to choose: resolved at start through `CTRL_CMD_GETFAMILY`
//! ([`EthtoolSocket::open_family`]). A kernel without devlink has no such family: the
//! source is reported as not attached, with that reason.
use super::{Hint, Wake};
use crate::model::devlink::ReporterState;
use crate::read::devlink::netlink::{DEVLINK_GENL_NAME, parse_handle};
use crate::read::ethtool::netlink::EthtoolSocket;
use nicmon_common::Hook;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// `DEVLINK_GENL_MCGRP_CONFIG_NAME`.
const GROUP_CONFIG: &str = "config";
/// `DEVLINK_CMD_NEW`, `DEVLINK_CMD_DEL`, `DEVLINK_CMD_HEALTH_REPORTER_RECOVER`.
const CMD_NEW: u8 = 3;
const CMD_DEL: u8 = 4;
const CMD_HEALTH_REPORTER_RECOVER: u8 = 54;
/// `sizeof(struct nlmsghdr)`, `GENL_HDRLEN`.
const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;
/// How long resolving the family may wait for the kernel's answer (at start and in the probe).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// What a notification says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A devlink instance was registered (`DEVLINK_CMD_NEW`).
    New,
    /// A devlink instance was unregistered (`DEVLINK_CMD_DEL`): its device is going.
    Del,
    /// A health reporter changed state or recovered (`DEVLINK_CMD_HEALTH_REPORTER_RECOVER`).
    Health,
}

impl Event {
    fn from_cmd(cmd: u8) -> Option<Event> {
        Some(match cmd {
            CMD_NEW => Event::New,
            CMD_DEL => Event::Del,
            CMD_HEALTH_REPORTER_RECOVER => Event::Health,
            _ => return None,
        })
    }

    /// The instance (and so, for a PCI function, the device) left.
    pub fn is_removal(self) -> bool {
        self == Event::Del
    }
}

/// One notification, as far as the wake-up path cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub event: Event,
    /// The instance's bus (`pci`, `auxiliary`, `netdevsim`).
    pub bus: String,
    /// The instance's device name (`0000:3b:00.0`, `mlx5_core.eth.0`, `netdevsim10`).
    pub dev: String,
    /// The health reporter (`fw_fatal`, `tx`) and its state, when the message names one.
    pub reporter: Option<(String, ReporterState)>,
}

impl Notice {
    pub(crate) fn into_wake(self, received: Instant, received_ns: u64) -> Wake {
        Wake {
            hook: Hook::DevlinkMonitor,
            kernel_ts_ns: None,
            removed: self.event.is_removal(),
            hint: Hint::Name(self.dev),
            received,
            received_ns,
        }
    }
}

/// A generic netlink socket joined to the devlink family's `config` group.
pub struct MonitorSocket {
    fd: OwnedFd,
    family: u16,
}

impl AsRawFd for MonitorSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl MonitorSocket {
    /// Resolves the devlink family and its `config` group, then opens a non-blocking
    /// `NETLINK_GENERIC` socket joined to it. Fails where the kernel has no devlink (the
    /// family is unknown) or joining is refused.
    pub fn open() -> io::Result<Self> {
        let (family, group) = resolve()?;
        let fd = super::nlsock::open(libc::SOCK_RAW, libc::NETLINK_GENERIC, 0)?;
        super::nlsock::join(&fd, group)?;
        Ok(Self { fd, family })
    }

    /// The devlink family's id: the `nlmsg_type` of its messages.
    pub fn family(&self) -> u16 {
        self.family
    }

    /// One datagram's notices, or the socket's error (`WouldBlock` when none is waiting);
    /// a datagram not from the kernel has none.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Vec<Notice>> {
        let (n, from_kernel) = super::nlsock::recv(&self.fd, buf)?;
        Ok(if from_kernel { parse(&buf[..n], self.family) } else { Vec::new() })
    }
}

/// The devlink family's id and its `config` group's.
fn resolve() -> io::Result<(u16, u32)> {
    let s =
        EthtoolSocket::open_family(DEVLINK_GENL_NAME, RESOLVE_TIMEOUT).map_err(|e| io::Error::other(e.to_string()))?;
    let group = s
        .group(GROUP_CONFIG)
        .ok_or_else(|| io::Error::other(format!("the devlink family has no \"{GROUP_CONFIG}\" multicast group")))?;
    Ok((s.family(), group))
}

/// Parses every notice of one datagram (netlink messages back to back, each `nlmsghdr`, the
/// generic header, then attributes) whose type is the devlink `family`. Anything else — another
/// family or command, a truncated or malformed message, one without a bus or device name —
/// is skipped.
pub fn parse(buf: &[u8], family: u16) -> Vec<Notice> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(hdr) = buf.get(at..at.saturating_add(NLMSG_HDRLEN)) {
        let len = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let kind = u16::from_ne_bytes([hdr[4], hdr[5]]);
        let Some(msg) = buf.get(at..at.saturating_add(len)).filter(|_| len >= NLMSG_HDRLEN) else { break };
        if kind == family
            && let Some(n) = notice(&msg[NLMSG_HDRLEN..])
        {
            out.push(n);
        }
        at = at.saturating_add(len.saturating_add(3) & !3);
    }
    out
}

/// The notice of one message's payload (generic header, then attributes).
fn notice(payload: &[u8]) -> Option<Notice> {
    let event = Event::from_cmd(*payload.first()?)?;
    let h = parse_handle(payload.get(GENL_HDRLEN..)?);
    let reporter = h.reporter.map(|r| (r.name, r.state));
    Some(Notice { event, bus: h.bus?, dev: h.dev?, reporter })
}

/// Spawns the listener task on the current tokio runtime; it sends a [`Wake`] per notice
/// and ends when the receiver is dropped. An overrun (`ENOBUFS`) still wakes, without a hint.
pub fn spawn(socket: MonitorSocket, tx: mpsc::Sender<Wake>) -> io::Result<JoinHandle<()>> {
    let family = socket.family;
    super::nlsock::listen(socket.fd, tx, Hook::DevlinkMonitor, "devlink netlink monitor", move |buf, at, ns| {
        let notices = parse(buf, family);
        for n in &notices {
            let (event, bus, dev, reporter) = (n.event, &n.bus, &n.dev, &n.reporter);
            tracing::debug!(?event, %bus, %dev, ?reporter, "devlink notification");
        }
        notices.into_iter().map(|n| n.into_wake(at, ns)).collect()
    })
}

#[cfg(test)]
mod tests;
