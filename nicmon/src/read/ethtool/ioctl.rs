//! The driver's own statistics (`ethtool -S`): the `SIOCETHTOOL` ioctl's
//! `ETHTOOL_GSSET_INFO` (how many `ETH_SS_STATS` strings), `ETHTOOL_GSTRINGS` (their names,
//! 32 bytes each) and `ETHTOOL_GSTATS` (their values, in the same order). Only the names
//! [`crate::model::ethtool::picked`] keeps are returned.
use crate::model::ethtool::{Absent, picked};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETH_SS_STATS: u32 = 1;
const ETH_GSTRING_LEN: usize = 32;
/// The kernel fills as many entries as the driver has *now*; a driver can grow its set
/// between two calls (more channels), so the buffers have room for more than counted.
fn capacity(counted: usize) -> usize {
    counted * 2 + 64
}
/// No driver has anywhere near this many statistics (mlx5 has a few thousand).
const MAX_STATS: usize = 1 << 16;

/// A datagram socket to issue `SIOCETHTOOL` on.
pub struct IoctlSocket {
    fd: OwnedFd,
}

impl IoctlSocket {
    pub fn open() -> io::Result<IoctlSocket> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd nobody else owns.
        Ok(IoctlSocket { fd: unsafe { OwnedFd::from_raw_fd(raw) } })
    }

    /// `SIOCETHTOOL` on `netdev` with the command buffer `data` (its first `u32` is the command).
    fn ethtool(&self, netdev: &str, data: &mut [u64]) -> io::Result<()> {
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let name = netdev.as_bytes();
        if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_data = data.as_mut_ptr().cast();
        // SAFETY: `req` names the device and points at `data`, which is as large as the
        // command can fill (the callers size it; see `capacity`).
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
        if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// The picked statistics of `netdev`.
    pub fn driver_stats(&self, netdev: &str) -> Result<BTreeMap<String, u64>, Absent> {
        let fail = |what: &str, e: io::Error| match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Absent::Unsupported(format!("{netdev}: the driver has no statistics strings")),
            _ => Absent::Failed(format!("{netdev}: {what}: {e}")),
        };
        // struct ethtool_sset_info { u32 cmd; u32 reserved; u64 sset_mask; u32 data[]; }
        let mut info = [0u64; 3];
        set_u32(&mut info, 0, ETHTOOL_GSSET_INFO);
        info[1] = 1 << ETH_SS_STATS;
        self.ethtool(netdev, &mut info).map_err(|e| fail("ETHTOOL_GSSET_INFO", e))?;
        if info[1] & (1 << ETH_SS_STATS) == 0 {
            return Err(Absent::Unsupported(format!("{netdev}: the driver has no statistics strings")));
        }
        let counted = get_u32(&info, 4) as usize;
        if counted > MAX_STATS {
            return Err(Absent::Failed(format!("{netdev}: {counted} statistics")));
        }
        let cap = capacity(counted);
        // struct ethtool_gstrings { u32 cmd; u32 string_set; u32 len; u8 data[]; }
        let mut strings = vec![0u64; (12 + cap * ETH_GSTRING_LEN).div_ceil(8)];
        set_u32(&mut strings, 0, ETHTOOL_GSTRINGS);
        set_u32(&mut strings, 1, ETH_SS_STATS);
        self.ethtool(netdev, &mut strings).map_err(|e| fail("ETHTOOL_GSTRINGS", e))?;
        // struct ethtool_stats { u32 cmd; u32 n_stats; u64 data[]; }
        let mut stats = vec![0u64; 1 + cap];
        set_u32(&mut stats, 0, ETHTOOL_GSTATS);
        self.ethtool(netdev, &mut stats).map_err(|e| fail("ETHTOOL_GSTATS", e))?;
        let names = parse_strings(bytes_of(&strings)).map_err(|m| Absent::Failed(format!("{netdev}: {m}")))?;
        let values = parse_values(bytes_of(&stats)).map_err(|m| Absent::Failed(format!("{netdev}: {m}")))?;
        pick(&names, &values).map_err(|m| Absent::Failed(format!("{netdev}: {m}")))
    }
}

fn set_u32(buf: &mut [u64], index: usize, v: u32) {
    let bytes = bytes_of_mut(buf);
    bytes[index * 4..index * 4 + 4].copy_from_slice(&v.to_ne_bytes());
}

fn get_u32(buf: &[u64], index: usize) -> u32 {
    let b = bytes_of(buf);
    u32::from_ne_bytes([b[index * 4], b[index * 4 + 1], b[index * 4 + 2], b[index * 4 + 3]])
}

fn bytes_of(buf: &[u64]) -> &[u8] {
    // SAFETY: any u64 slice is valid as bytes of 8x its length; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), std::mem::size_of_val(buf)) }
}

fn bytes_of_mut(buf: &mut [u64]) -> &mut [u8] {
    // SAFETY: as `bytes_of`; every byte pattern is a valid u64.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast(), std::mem::size_of_val(buf)) }
}

/// An ioctl answer that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("short answer")]
    Short,
    #[error("{len} statistics names, room for {room}")]
    Names { len: usize, room: usize },
    #[error("{len} statistics values, room for {room}")]
    Values { len: usize, room: usize },
    #[error("{names} statistics names but {values} values (the set changed): not read")]
    Mismatch { names: usize, values: usize },
}

/// The names in an `ethtool_gstrings` answer (`len` at byte 8, then 32-byte names,
/// NUL-padded). Names that are not UTF-8 are kept lossily (none is picked).
pub fn parse_strings(buf: &[u8]) -> Result<Vec<String>, AnswerError> {
    let len = buf.get(8..12).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or(AnswerError::Short)? as usize;
    let body = &buf[12..];
    if len > body.len() / ETH_GSTRING_LEN {
        return Err(AnswerError::Names { len, room: body.len() / ETH_GSTRING_LEN });
    }
    Ok(body
        .chunks_exact(ETH_GSTRING_LEN)
        .take(len)
        .map(|s| {
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        })
        .collect())
}

/// The values in an `ethtool_stats` answer (`n_stats` at byte 4, then `u64`s).
pub fn parse_values(buf: &[u8]) -> Result<Vec<u64>, AnswerError> {
    let n = buf.get(4..8).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).ok_or(AnswerError::Short)? as usize;
    let body = &buf[8..];
    if n > body.len() / 8 {
        return Err(AnswerError::Values { len: n, room: body.len() / 8 });
    }
    Ok(body.chunks_exact(8).take(n).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default())).collect())
}

/// The picked statistics: names and values pair up by position, so two answers of
/// different lengths (the driver's set changed between the calls) are not paired at all.
pub fn pick(names: &[String], values: &[u64]) -> Result<BTreeMap<String, u64>, AnswerError> {
    if names.len() != values.len() {
        return Err(AnswerError::Mismatch { names: names.len(), values: values.len() });
    }
    Ok(names.iter().zip(values).filter(|(n, _)| picked(n)).map(|(n, v)| (n.clone(), *v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn strings_answer(names: &[&str]) -> Vec<u8> {
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&(names.len() as u32).to_ne_bytes());
        for n in names {
            let mut s = n.as_bytes().to_vec();
            s.resize(ETH_GSTRING_LEN, 0);
            b.extend_from_slice(&s);
        }
        b
    }

    fn values_answer(values: &[u64]) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        b.extend_from_slice(&(values.len() as u32).to_ne_bytes());
        b.extend(values.iter().flat_map(|v| v.to_ne_bytes()));
        b
    }

    #[test]
    fn mlx5_names_are_picked_by_position() {
        let names = parse_strings(&strings_answer(&[
            "rx_packets",
            "rx_corrected_bits_phy",
            "rx_prio3_pause_duration",
            "tx_pause_storm_error_events",
        ]))
        .unwrap();
        let values = parse_values(&values_answer(&[1, 2, 3, 4])).unwrap();
        let got = pick(&names, &values).unwrap();
        let want: BTreeMap<String, u64> = [
            ("rx_corrected_bits_phy".to_string(), 2),
            ("rx_prio3_pause_duration".to_string(), 3),
            ("tx_pause_storm_error_events".to_string(), 4),
        ]
        .into();
        assert_eq!(got, want);
    }

    #[test]
    fn a_set_that_changed_between_calls_is_not_paired() {
        let names = parse_strings(&strings_answer(&["rx_corrected_bits_phy", "x"])).unwrap();
        let values = parse_values(&values_answer(&[1, 2, 3])).unwrap();
        assert!(pick(&names, &values).is_err());
        // A count larger than the buffer is an error, not a read past it.
        let mut b = strings_answer(&["a"]);
        b[8..12].copy_from_slice(&5u32.to_ne_bytes());
        assert!(parse_strings(&b).is_err());
        assert!(parse_values(&[0; 3]).is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let names = parse_strings(&bytes);
            let values = parse_values(&bytes);
            if let (Ok(n), Ok(v)) = (names, values) {
                let _ = pick(&n, &v);
            }
        }
    }
}
