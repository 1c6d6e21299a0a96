//! The kernel's ethtool generic-netlink family: `ETHTOOL_MSG_FEC_GET` and
//! `ETHTOOL_MSG_PAUSE_GET`, each with `ETHTOOL_FLAG_STATS`
//! (`Documentation/networking/ethtool-netlink.rst`; constants from
//! `include/uapi/linux/ethtool_netlink.h`). The encoders and parsers are pure functions over
//! bytes; a malformed answer ends the walk (what was read before it is kept) and never panics.
use crate::model::ethtool::{Absent, FecLane, FecMode, FecSnapshot, PauseSnapshot};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;
const NLA_HDRLEN: usize = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = 0x3fff;

const GENL_ID_CTRL: u16 = 16;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `CTRL_ATTR_MCAST_GROUPS`: nested, one nest per group with `CTRL_ATTR_MCAST_GRP_NAME` (1)
/// and `CTRL_ATTR_MCAST_GRP_ID` (2).
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;
const ETHTOOL_GENL_NAME: &str = "ethtool";
const ETHTOOL_GENL_VERSION: u8 = 1;

/// `ETHTOOL_A_*_HEADER` (1 in every ethtool message) and its `ETHTOOL_A_HEADER_*`.
const A_HEADER: u16 = 1;
const A_HEADER_DEV_NAME: u16 = 2;
const A_HEADER_FLAGS: u16 = 3;
const FLAG_STATS: u32 = 1 << 2;

/// What nicmon asks the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Fec,
    Pause,
}

impl Request {
    fn cmd(self) -> u8 {
        match self {
            Request::Fec => 29,   // ETHTOOL_MSG_FEC_GET
            Request::Pause => 21, // ETHTOOL_MSG_PAUSE_GET
        }
    }
}

const FEC_A_ACTIVE: u16 = 4;
const FEC_A_STATS: u16 = 5;
const FEC_STAT_CORRECTED: u16 = 2;
const FEC_STAT_UNCORR: u16 = 3;
const FEC_STAT_CORR_BITS: u16 = 4;
const PAUSE_A_STATS: u16 = 5;
const PAUSE_STAT_TX_FRAMES: u16 = 2;
const PAUSE_STAT_RX_FRAMES: u16 = 3;

/// The attributes of `buf` as (type without flags, value); stops at the first malformed one.
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLA_HDRLEN {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > buf.len() {
            buf = &[];
            return None;
        }
        let value = &buf[NLA_HDRLEN..len];
        buf = buf.get(align4(len)..).unwrap_or(&[]);
        Some((kind, value))
    })
}

/// One netlink message of a datagram, as far as a request's answer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// A reply: its sequence number and its attributes (after the generic header).
    Reply { seq: u32, attrs: &'a [u8] },
    /// `NLMSG_ERROR`: 0 is the acknowledgement, else a negative errno.
    Error { seq: u32, errno: i32 },
    /// `NLMSG_DONE`: the end of a dump, with 0 or a negative errno.
    Done { seq: u32, errno: i32 },
}

/// The messages of one datagram; stops at the first malformed one.
pub fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        loop {
            if buf.len() < NLMSG_HDRLEN {
                return None;
            }
            let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            let kind = u16::from_ne_bytes([buf[4], buf[5]]);
            let seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
            if len < NLMSG_HDRLEN || len > buf.len() {
                buf = &[];
                return None;
            }
            let payload = &buf[NLMSG_HDRLEN..len];
            buf = buf.get(align4(len)..).unwrap_or(&[]);
            if kind == NLMSG_ERROR {
                let errno = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))?;
                return Some(Message::Error { seq, errno });
            }
            if kind == NLMSG_DONE {
                let errno = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
                return Some(Message::Done { seq, errno });
            }
            if kind >= GENL_ID_CTRL
                && let Some(attrs) = payload.get(GENL_HDRLEN..)
            {
                return Some(Message::Reply { seq, attrs });
            }
            // NLMSG_NOOP, NLMSG_DONE, or a message too short to be generic netlink: skip.
        }
    })
}

/// A request message: `cmd` of `family` with the given attributes (already encoded).
pub fn encode(family: u16, cmd: u8, seq: u32, attributes: &[u8]) -> Vec<u8> {
    encode_with(family, (cmd, ETHTOOL_GENL_VERSION), NLM_F_REQUEST | NLM_F_ACK, seq, attributes)
}

/// A request message of any generic-netlink family: `(cmd, version)`, netlink `flags`.
pub fn encode_with(family: u16, (cmd, version): (u8, u8), flags: u16, seq: u32, attributes: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + GENL_HDRLEN + attributes.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.extend_from_slice(&[cmd, version, 0, 0]);
    m.extend_from_slice(attributes);
    m
}

/// Appends one attribute (padded to 4 bytes).
pub fn put_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend_from_slice(&((NLA_HDRLEN + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(out.len()), 0);
}

/// The request header for `netdev` without flags, nested (`ETHTOOL_A_*_HEADER`).
pub fn header_attr(netdev: &str) -> Vec<u8> {
    let mut header = Vec::new();
    let mut name = netdev.as_bytes().to_vec();
    name.push(0);
    put_attr(&mut header, A_HEADER_DEV_NAME, &name);
    let mut out = Vec::new();
    put_attr(&mut out, A_HEADER | NLA_F_NESTED, &header);
    out
}

/// The attributes of a `*_GET` for `netdev` with statistics: the request header, nested.
pub fn request_attrs(netdev: &str) -> Vec<u8> {
    let mut header = Vec::new();
    let mut name = netdev.as_bytes().to_vec();
    name.push(0);
    put_attr(&mut header, A_HEADER_DEV_NAME, &name);
    put_attr(&mut header, A_HEADER_FLAGS, &FLAG_STATS.to_ne_bytes());
    let mut out = Vec::new();
    put_attr(&mut out, A_HEADER | NLA_F_NESTED, &header);
    out
}

fn u32_of(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

fn u64_of(v: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(v.try_into().ok()?))
}

/// An array of `u64` (a FEC statistic: the total, then one per lane); `None` when the
/// length is not a multiple of 8.
fn u64_array(v: &[u8]) -> Option<Vec<u64>> {
    if !v.len().is_multiple_of(8) {
        return None;
    }
    Some(v.chunks_exact(8).filter_map(u64_of).collect())
}

/// `ETHTOOL_MSG_FEC_GET_REPLY`'s attributes. The kernel sends each statistic as an array:
/// the total, then one entry per lane when the driver counts per lane; an empty array
/// when the driver does not give it.
pub fn parse_fec(reply: &[u8]) -> FecSnapshot {
    let mut fec = FecSnapshot::default();
    for (kind, value) in attrs(reply) {
        match kind {
            FEC_A_ACTIVE => fec.active = u32_of(value).map(FecMode::from_link_mode_bit),
            FEC_A_STATS => parse_fec_stats(value, &mut fec),
            _ => {}
        }
    }
    fec
}

fn parse_fec_stats(stats: &[u8], fec: &mut FecSnapshot) {
    type Field = fn(&mut FecLane) -> &mut Option<u64>;
    for (kind, value) in attrs(stats) {
        let Some(array) = u64_array(value) else { continue };
        let (total, lane_field): (&mut Option<u64>, Field) = match kind {
            FEC_STAT_CORRECTED => (&mut fec.corrected_blocks, |l| &mut l.corrected_blocks),
            FEC_STAT_UNCORR => (&mut fec.uncorrectable_blocks, |l| &mut l.uncorrectable_blocks),
            FEC_STAT_CORR_BITS => (&mut fec.corrected_bits, |l| &mut l.corrected_bits),
            _ => continue,
        };
        let Some((first, lanes)) = array.split_first() else { continue };
        *total = Some(*first);
        // The kernel has at most ETHTOOL_MAX_LANES (8); more is a malformed answer.
        for (i, v) in lanes.iter().take(MAX_LANES).enumerate() {
            if fec.lanes.len() <= i {
                fec.lanes.resize(i + 1, FecLane::default());
            }
            *lane_field(&mut fec.lanes[i]) = Some(*v);
        }
    }
}

/// `ETHTOOL_MAX_LANES`.
pub const MAX_LANES: usize = 8;

/// `ETHTOOL_MSG_PAUSE_GET_REPLY`'s attributes: the nested statistics (absent when the
/// driver gives none; each counter only when the driver sets it).
pub fn parse_pause(reply: &[u8]) -> PauseSnapshot {
    let mut pause = PauseSnapshot::default();
    for (kind, value) in attrs(reply) {
        if kind != PAUSE_A_STATS {
            continue;
        }
        for (stat, v) in attrs(value) {
            match stat {
                PAUSE_STAT_TX_FRAMES => pause.tx_frames = u64_of(v),
                PAUSE_STAT_RX_FRAMES => pause.rx_frames = u64_of(v),
                _ => {}
            }
        }
    }
    pause
}

/// The family id in a `CTRL_CMD_GETFAMILY` reply.
pub fn parse_family_id(reply: &[u8]) -> Option<u16> {
    attrs(reply)
        .find(|(k, _)| *k == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, v)| Some(u16::from_ne_bytes(v.try_into().ok()?)))
}

/// The multicast groups in a `CTRL_CMD_GETFAMILY` reply, as (name, id); a malformed group
/// is skipped.
pub fn parse_mcast_groups(reply: &[u8]) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (_, groups) in attrs(reply).filter(|(k, _)| *k == CTRL_ATTR_MCAST_GROUPS) {
        for (_, group) in attrs(groups) {
            let (mut name, mut id) = (None, None);
            for (kind, value) in attrs(group) {
                match kind {
                    CTRL_ATTR_MCAST_GRP_NAME => {
                        let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
                        name = std::str::from_utf8(&value[..end]).ok().map(str::to_string);
                    }
                    CTRL_ATTR_MCAST_GRP_ID => id = u32_of(value),
                    _ => {}
                }
            }
            if let (Some(name), Some(id)) = (name, id) {
                out.push((name, id));
            }
        }
    }
    out
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A `NETLINK_GENERIC` socket and the ethtool family's id on it.
pub struct EthtoolSocket {
    fd: OwnedFd,
    family: u16,
    seq: u32,
    /// The family's multicast groups, (name, id), from its `CTRL_CMD_GETFAMILY` reply.
    groups: Vec<(String, u32)>,
}

/// The errnos that mean "this device or kernel does not offer it".
fn unsupported_errno(errno: i32) -> bool {
    errno == libc::EOPNOTSUPP || errno == libc::ENOTSUP
}

impl EthtoolSocket {
    /// Opens the socket and resolves the ethtool family. A kernel built without ethtool
    /// netlink (`CONFIG_ETHTOOL_NETLINK` off) answers `ENOENT`: unsupported.
    pub fn open(timeout: Duration) -> Result<EthtoolSocket, Absent> {
        EthtoolSocket::open_family(ETHTOOL_GENL_NAME, timeout)
    }

    /// Opens a socket on the generic-netlink family `name` (`ethtool`, `devlink`); a kernel
    /// without it (`ENOENT`) is unsupported.
    pub fn open_family(name: &str, timeout: Duration) -> Result<EthtoolSocket, Absent> {
        let fd = open_socket(timeout).map_err(|e| Absent::Failed(format!("netlink socket: {e}")))?;
        let mut s = EthtoolSocket { fd, family: GENL_ID_CTRL, seq: 0, groups: Vec::new() };
        let mut family_name = name.as_bytes().to_vec();
        family_name.push(0);
        let mut attributes = Vec::new();
        put_attr(&mut attributes, CTRL_ATTR_FAMILY_NAME, &family_name);
        match s.transact(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, &attributes) {
            Ok(reply) => {
                s.family = parse_family_id(&reply).ok_or_else(|| Absent::Failed(format!("no {name} family id")))?;
                s.groups = parse_mcast_groups(&reply);
                Ok(s)
            }
            Err(Answer::Errno(e)) if e == libc::ENOENT => {
                Err(Absent::Unsupported(format!("the kernel has no {name} netlink family")))
            }
            Err(e) => Err(e.into_absent(&format!("{name} family"))),
        }
    }

    /// The family's id (the `nlmsg_type` of its messages).
    pub fn family(&self) -> u16 {
        self.family
    }

    /// The id of the family's multicast group `name` (`config` for devlink), when it has one.
    pub fn group(&self, name: &str) -> Option<u32> {
        self.groups.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
    }

    /// A dump of `(cmd, version)` of the socket's family with `attributes`: every reply's
    /// attributes, at most `max` (more is a malformed answer). An errno ends it as an error.
    pub fn dump(&mut self, (cmd, version): (u8, u8), attributes: &[u8], max: usize) -> Result<Vec<Vec<u8>>, Absent> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = encode_with(self.family, (cmd, version), NLM_F_REQUEST | NLM_F_DUMP, seq, attributes);
        self.send(&msg).map_err(|e| e.into_absent("dump"))?;
        let mut buf = vec![0u8; 32 * 1024];
        let mut replies = Vec::new();
        loop {
            let n = self.recv(&mut buf).map_err(|e| e.into_absent("dump"))?;
            for m in messages(&buf[..n]) {
                match m {
                    Message::Reply { seq: s, attrs } if s == seq => {
                        if replies.len() >= max {
                            return Err(Absent::Failed(format!("dump: more than {max} replies")));
                        }
                        replies.push(attrs.to_vec());
                    }
                    Message::Done { seq: s, errno: 0 } if s == seq => return Ok(replies),
                    Message::Done { seq: s, errno } | Message::Error { seq: s, errno } if s == seq && errno != 0 => {
                        return Err(Answer::Errno(-errno).into_absent("dump"));
                    }
                    _ => {}
                }
            }
        }
    }

    fn send(&self, msg: &[u8]) -> Result<(), Answer> {
        // SAFETY: `msg` is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 { Err(Answer::Io(io::Error::last_os_error())) } else { Ok(()) }
    }

    /// One datagram into `buf`: its length.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, Answer> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC) };
        if n < 0 {
            return Err(Answer::Io(io::Error::last_os_error()));
        }
        let n = n as usize;
        if n > buf.len() {
            return Err(Answer::Malformed(format!("answer of {n} bytes truncated")));
        }
        Ok(n)
    }

    /// `request` for `netdev`, with statistics: the reply's attributes.
    pub fn get(&mut self, request: Request, netdev: &str) -> Result<Vec<u8>, Absent> {
        self.transact(self.family, request.cmd(), &request_attrs(netdev)).map_err(|e| e.into_absent(netdev))
    }

    /// Any `cmd` of the socket's family with `attributes` (already encoded): the reply's
    /// attributes; `what` names the request in an error.
    pub fn call(&mut self, cmd: u8, attributes: &[u8], what: &str) -> Result<Vec<u8>, Absent> {
        self.transact(self.family, cmd, attributes).map_err(|e| e.into_absent(what))
    }

    /// Sends one request and reads until its acknowledgement: the reply's attributes.
    fn transact(&mut self, family: u16, cmd: u8, attributes: &[u8]) -> Result<Vec<u8>, Answer> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = encode(family, cmd, seq, attributes);
        // SAFETY: `msg` is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(Answer::Io(io::Error::last_os_error()));
        }
        let mut buf = vec![0u8; 32 * 1024];
        let mut reply = None;
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_TRUNC) };
            if n < 0 {
                return Err(Answer::Io(io::Error::last_os_error()));
            }
            let n = n as usize;
            if n > buf.len() {
                return Err(Answer::Malformed(format!("answer of {n} bytes truncated")));
            }
            for m in messages(&buf[..n]) {
                match m {
                    Message::Reply { seq: s, attrs } if s == seq => reply = Some(attrs.to_vec()),
                    Message::Error { seq: s, errno: 0 } if s == seq => {
                        return reply.ok_or_else(|| Answer::Malformed("acknowledged without a reply".into()));
                    }
                    Message::Error { seq: s, errno } if s == seq => return Err(Answer::Errno(-errno)),
                    _ => {}
                }
            }
        }
    }
}

/// How a request failed.
#[derive(Debug)]
enum Answer {
    Errno(i32),
    Io(io::Error),
    Malformed(String),
}

impl Answer {
    fn into_absent(self, what: &str) -> Absent {
        match self {
            Answer::Errno(e) if unsupported_errno(e) => {
                Absent::Unsupported(format!("{what}: the driver does not offer it"))
            }
            Answer::Errno(e) => Absent::Failed(format!("{what}: {}", io::Error::from_raw_os_error(e))),
            Answer::Io(e) => Absent::Failed(format!("{what}: {e}")),
            Answer::Malformed(m) => Absent::Failed(format!("{what}: {m}")),
        }
    }
}

/// A blocking `NETLINK_GENERIC` socket whose receive gives up after `timeout` (the worker
/// thread's own bound; the caller's deadline is enforced by [`super::reader`]).
fn open_socket(timeout: Duration) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_GENERIC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().try_into().unwrap_or(libc::time_t::MAX),
        tv_usec: timeout.subsec_micros().into(),
    };
    // SAFETY: `tv` is a valid timeval of the given size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // Extended acks carry the kernel's error text; nicmon reads only the errno.
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A FEC statistic attribute holding `values` (total, then lanes).
    fn stat(kind: u16, values: &[u64]) -> Vec<u8> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut out = Vec::new();
        put_attr(&mut out, kind, &bytes);
        out
    }

    fn fec_reply(active: Option<u32>, stats: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        // What the kernel sends before: the header and the configured modes bitset.
        put_attr(&mut out, A_HEADER | NLA_F_NESTED, &[]);
        put_attr(&mut out, 3, &[1]); // ETHTOOL_A_FEC_AUTO
        if let Some(a) = active {
            put_attr(&mut out, FEC_A_ACTIVE, &a.to_ne_bytes());
        }
        let mut nested = Vec::new();
        put_attr(&mut nested, 1, &[]); // ETHTOOL_A_FEC_STAT_PAD
        for s in stats {
            nested.extend_from_slice(s);
        }
        put_attr(&mut out, FEC_A_STATS | NLA_F_NESTED, &nested);
        out
    }

    #[test]
    fn fec_totals_and_lanes() {
        let reply = fec_reply(
            Some(50),
            &[
                stat(FEC_STAT_CORRECTED, &[256, 255, 1]),
                stat(FEC_STAT_UNCORR, &[145, 128, 17]),
                stat(FEC_STAT_CORR_BITS, &[9_000]),
            ],
        );
        let fec = parse_fec(&reply);
        assert_eq!(fec.active, Some(FecMode::Rs));
        assert_eq!(
            (fec.corrected_blocks, fec.uncorrectable_blocks, fec.corrected_bits),
            (Some(256), Some(145), Some(9_000))
        );
        assert_eq!(
            fec.lanes,
            vec![
                FecLane { corrected_blocks: Some(255), uncorrectable_blocks: Some(128), corrected_bits: None },
                FecLane { corrected_blocks: Some(1), uncorrectable_blocks: Some(17), corrected_bits: None },
            ]
        );
    }

    #[test]
    fn fec_without_statistics_is_unknown_not_zero() {
        // A driver without get_fec_stats: empty arrays; no active mode reported.
        let reply = fec_reply(None, &[stat(FEC_STAT_CORRECTED, &[]), stat(FEC_STAT_UNCORR, &[])]);
        assert_eq!(parse_fec(&reply), FecSnapshot::default());
        // An array that is not whole u64s is ignored, not misread.
        let mut bad = Vec::new();
        put_attr(&mut bad, FEC_STAT_CORRECTED, &[1, 2, 3]);
        assert_eq!(parse_fec(&fec_reply(Some(51), &[bad])).corrected_blocks, None);
    }

    #[test]
    fn pause_statistics() {
        let mut nested = Vec::new();
        put_attr(&mut nested, 1, &[]);
        put_attr(&mut nested, PAUSE_STAT_TX_FRAMES, &7u64.to_ne_bytes());
        put_attr(&mut nested, PAUSE_STAT_RX_FRAMES, &9u64.to_ne_bytes());
        let mut reply = Vec::new();
        put_attr(&mut reply, 2, &[0]); // autoneg
        put_attr(&mut reply, PAUSE_A_STATS | NLA_F_NESTED, &nested);
        assert_eq!(parse_pause(&reply), PauseSnapshot { tx_frames: Some(7), rx_frames: Some(9) });
        assert_eq!(parse_pause(&[]), PauseSnapshot::default());
    }

    #[test]
    fn request_is_a_nested_header_with_the_name_and_the_stats_flag() {
        let a = request_attrs("eth0");
        let (kind, header) = attrs(&a).next().unwrap();
        assert_eq!(kind, A_HEADER);
        assert_eq!(u16::from_ne_bytes([a[2], a[3]]) & NLA_F_NESTED, NLA_F_NESTED);
        let inner: Vec<_> = attrs(header).collect();
        assert_eq!(inner, vec![(A_HEADER_DEV_NAME, &b"eth0\0"[..]), (A_HEADER_FLAGS, &FLAG_STATS.to_ne_bytes()[..])]);
        let m = encode(30, 29, 7, &a);
        assert_eq!(m.len(), u32::from_ne_bytes(m[..4].try_into().unwrap()) as usize);
    }

    /// A `CTRL_CMD_GETFAMILY` reply as the kernel builds it (`ctrl_fill_info`): the id, the
    /// name, then `CTRL_ATTR_MCAST_GROUPS` with one nest per group (index 1, 2, …).
    #[test]
    fn family_reply_gives_the_id_and_the_multicast_groups() {
        let group = |name: &str, id: u32| {
            let mut g = Vec::new();
            put_attr(&mut g, CTRL_ATTR_MCAST_GRP_ID, &id.to_ne_bytes());
            put_attr(&mut g, CTRL_ATTR_MCAST_GRP_NAME, format!("{name}\0").as_bytes());
            g
        };
        let mut groups = Vec::new();
        put_attr(&mut groups, 1 | NLA_F_NESTED, &group("config", 9));
        put_attr(&mut groups, 2 | NLA_F_NESTED, &[1, 2]); // malformed: skipped
        put_attr(&mut groups, 3 | NLA_F_NESTED, &group("other", 12));
        let mut reply = Vec::new();
        put_attr(&mut reply, CTRL_ATTR_FAMILY_ID, &27u16.to_ne_bytes());
        put_attr(&mut reply, CTRL_ATTR_FAMILY_NAME, b"devlink\0");
        put_attr(&mut reply, CTRL_ATTR_MCAST_GROUPS | NLA_F_NESTED, &groups);
        assert_eq!(parse_family_id(&reply), Some(27));
        assert_eq!(parse_mcast_groups(&reply), [("config".to_string(), 9), ("other".to_string(), 12)]);
        assert!(parse_mcast_groups(&reply[..8]).is_empty());
    }

    #[test]
    fn messages_replies_errors_and_truncation() {
        let mut d = encode(30, 30, 5, &[1, 0, 0, 0]);
        let mut err = Vec::new();
        err.extend_from_slice(&36u32.to_ne_bytes());
        err.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err.extend_from_slice(&[0, 0]);
        err.extend_from_slice(&5u32.to_ne_bytes());
        err.extend_from_slice(&[0; 4]);
        err.extend_from_slice(&(-libc::EOPNOTSUPP).to_ne_bytes());
        err.extend_from_slice(&[0; 16]);
        d.extend_from_slice(&err);
        let got: Vec<_> = messages(&d).collect();
        assert_eq!(got.len(), 2);
        assert!(matches!(got[0], Message::Reply { seq: 5, .. }));
        assert_eq!(got[1], Message::Error { seq: 5, errno: -libc::EOPNOTSUPP });
        // A length past the end stops the walk.
        d[0] = 0xff;
        assert_eq!(messages(&d).count(), 0);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_fec(&bytes);
            let _ = parse_pause(&bytes);
            let _ = parse_family_id(&bytes);
            let _ = parse_mcast_groups(&bytes);
            let _ = messages(&bytes).count();
            let _ = attrs(&bytes).count();
        }

        #[test]
        fn fec_parser_never_panics_on_well_framed_garbage(
            parts in proptest::collection::vec((0u16..8, proptest::collection::vec(any::<u8>(), 0..80)), 0..10)
        ) {
            // Well-framed attributes with arbitrary values, nested one level as the kernel does.
            let mut nested = Vec::new();
            for (k, v) in &parts {
                put_attr(&mut nested, *k, v);
            }
            let reply = fec_reply(Some(50), &[nested.clone()]);
            let fec = parse_fec(&reply);
            prop_assert!(fec.lanes.len() <= MAX_LANES);
            let _ = parse_pause(&nested);
        }
    }
}
