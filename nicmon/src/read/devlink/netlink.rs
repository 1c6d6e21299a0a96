//! The kernel's devlink generic-netlink family: `DEVLINK_CMD_HEALTH_REPORTER_GET` as a dump
//! of every devlink instance's reporters (`include/uapi/linux/devlink.h`). The socket and
//! the message framing are the ethtool reader's ([`crate::read::ethtool::netlink`]); the
//! parser is a pure function over bytes that never panics.
use std::collections::BTreeMap;
use std::time::Duration;

use crate::model::devlink::{Reporter, ReporterState, Reporters};
use crate::model::ethtool::Absent;
use crate::read::ethtool::netlink::{EthtoolSocket, attrs};

pub const DEVLINK_GENL_NAME: &str = "devlink";
const DEVLINK_GENL_VERSION: u8 = 1;
const CMD_HEALTH_REPORTER_GET: u8 = 52;
const ATTR_BUS_NAME: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_HEALTH_REPORTER: u16 = 114;
const ATTR_HR_NAME: u16 = 115;
const ATTR_HR_STATE: u16 = 116;
const ATTR_HR_ERR_COUNT: u16 = 117;
const ATTR_HR_RECOVER_COUNT: u16 = 118;

/// Replies of one dump, at most (a host has a few reporters per function).
const MAX_REPLIES: usize = 16 * 1024;

/// One reply: the devlink instance (`pci/0000:3b:00.0` → bus `pci`, name `0000:3b:00.0`) and
/// its reporter; `None` when a part is missing or malformed.
pub fn parse_reply(reply: &[u8]) -> Option<(String, String, Reporter)> {
    let h = parse_handle(reply);
    Some((h.bus?, h.dev?, h.reporter?))
}

/// What a devlink message's attributes say about its instance and reporter, each part as
/// far as it is present and well formed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Handle {
    /// `DEVLINK_ATTR_BUS_NAME` (`pci`, `auxiliary`, `netdevsim`).
    pub bus: Option<String>,
    /// `DEVLINK_ATTR_DEV_NAME` (`0000:3b:00.0`).
    pub dev: Option<String>,
    /// `DEVLINK_ATTR_HEALTH_REPORTER`, nested.
    pub reporter: Option<Reporter>,
}

/// The instance and reporter of a devlink message's attributes (a reply, or a notification
/// such as `DEVLINK_CMD_HEALTH_REPORTER_RECOVER`, `DEVLINK_CMD_DEL`).
pub fn parse_handle(attributes: &[u8]) -> Handle {
    let mut h = Handle::default();
    for (kind, value) in attrs(attributes) {
        match kind {
            ATTR_BUS_NAME => h.bus = c_string(value),
            ATTR_DEV_NAME => h.dev = c_string(value),
            ATTR_HEALTH_REPORTER => h.reporter = parse_reporter(value),
            _ => {}
        }
    }
    h
}

fn parse_reporter(nested: &[u8]) -> Option<Reporter> {
    let (mut name, mut state, mut errors, mut recovers) = (None, None, None, None);
    for (kind, value) in attrs(nested) {
        match kind {
            ATTR_HR_NAME => name = c_string(value),
            ATTR_HR_STATE => state = value.first().copied().and_then(ReporterState::from_kernel),
            ATTR_HR_ERR_COUNT => errors = u64_of(value),
            ATTR_HR_RECOVER_COUNT => recovers = u64_of(value),
            _ => {}
        }
    }
    Some(Reporter { name: name?, state: state?, error_count: errors?, recover_count: recovers.unwrap_or(0) })
}

fn u64_of(v: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(v.try_into().ok()?))
}

/// A NUL-terminated attribute string, printable ASCII, at most 64 bytes.
fn c_string(v: &[u8]) -> Option<String> {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    let s = std::str::from_utf8(&v[..end]).ok()?;
    (!s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_graphic())).then(|| s.to_string())
}

/// The reporters of every devlink instance, by instance (`pci/0000:3b:00.0`,
/// `auxiliary/mlx5_core.eth.0`: mlx5's netdev reporters `tx`, `rx` live on the Ethernet
/// auxiliary device's instance in newer kernels), from a dump's replies.
pub fn by_instance(replies: &[Vec<u8>]) -> BTreeMap<String, Reporters> {
    let mut out: BTreeMap<String, Reporters> = BTreeMap::new();
    for (bus, dev, r) in replies.iter().filter_map(|r| parse_reply(r)) {
        out.entry(format!("{bus}/{dev}")).or_default().reporters.push(r);
    }
    out.into_iter().map(|(k, v)| (k, v.normalised())).collect()
}

/// Dumps every devlink health reporter of the host. A kernel without devlink is
/// unsupported; no devlink instance at all is an empty answer.
pub fn dump(timeout: Duration) -> Result<BTreeMap<String, Reporters>, Absent> {
    let mut s = EthtoolSocket::open_family(DEVLINK_GENL_NAME, timeout)?;
    let replies = s.dump((CMD_HEALTH_REPORTER_GET, DEVLINK_GENL_VERSION), &[], MAX_REPLIES)?;
    Ok(by_instance(&replies))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::ethtool::netlink::put_attr;
    use proptest::prelude::*;

    fn reply(bus: &str, dev: &str, name: &str, state: u8, errs: u64, recs: u64) -> Vec<u8> {
        let z = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            v.push(0);
            v
        };
        let mut nested = Vec::new();
        put_attr(&mut nested, ATTR_HR_NAME, &z(name));
        put_attr(&mut nested, ATTR_HR_STATE, &[state]);
        put_attr(&mut nested, ATTR_HR_ERR_COUNT, &errs.to_ne_bytes());
        put_attr(&mut nested, ATTR_HR_RECOVER_COUNT, &recs.to_ne_bytes());
        put_attr(&mut nested, 119, &7u64.to_ne_bytes()); // DUMP_TS: ignored
        let mut out = Vec::new();
        put_attr(&mut out, ATTR_BUS_NAME, &z(bus));
        put_attr(&mut out, ATTR_DEV_NAME, &z(dev));
        put_attr(&mut out, ATTR_HEALTH_REPORTER | (1 << 15), &nested);
        out
    }

    #[test]
    fn replies_group_by_instance() {
        let replies = vec![
            reply("pci", "0000:3b:00.0", "fw_fatal", 1, 2, 1),
            reply("pci", "0000:3b:00.0", "fw", 0, 0, 0),
            reply("pci", "0000:3b:00.1", "tx", 0, 5, 5),
            reply("auxiliary", "mlx5_core.eth.0", "tx", 0, 1, 1),
            reply("pci", "0000:3b:00.0", "rx", 9, 0, 0), // unknown state: dropped
        ];
        let m = by_instance(&replies);
        assert_eq!(m.len(), 3);
        assert_eq!(m["auxiliary/mlx5_core.eth.0"].reporters.len(), 1);
        let f = &m["pci/0000:3b:00.0"];
        assert_eq!(f.reporters.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["fw", "fw_fatal"]);
        let fatal = f.get("fw_fatal").unwrap();
        assert_eq!((fatal.state, fatal.error_count, fatal.recover_count), (ReporterState::Error, 2, 1));
        assert_eq!(m["pci/0000:3b:00.1"].get("tx").unwrap().error_count, 5);
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_reply(&bytes);
            let _ = by_instance(&[bytes]);
        }
    }
}
