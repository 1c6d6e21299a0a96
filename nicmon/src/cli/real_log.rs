//! Writing into the host's real kernel log, safely — for self-tests only.
//!
//! On a GPU node the kernel log is read by more than nicmon: NVSentinel's syslog monitor,
//! node-problem-detector, vendor agents. A test (or a demo) that writes a driver-shaped line
//! into `/dev/kmsg` can make one of them cordon, drain or replace the node. So nothing of
//! nicmon's writes a fault there: the demo and the daemon tests feed faults through a
//! private stand-in (a FIFO at `--kmsg-path`, see [`crate::read::kmsg`]). The one thing that
//! needs the real device is the check that the tail reads it, and that writes only through
//! [`write_marked`], which refuses any text that is not uniquely marked as nicmon's
//! self-test, that any of nicmon's patterns would match, or that contains a word another
//! monitor watches for ([`KNOWN_MONITOR_WORDS`]). A test scans the sources so that no
//! other code path writes to the device.
use std::io::{self, Write};

use crate::decide::kmsg::pattern::Patterns;
use crate::read::kmsg::DEV_KMSG;

/// Every line written by [`write_marked`] starts with this.
pub const MARKER: &str = "nicmon-selftest";

/// Words (case-insensitive) that kernel-log consumers match on: driver and subsystem names
/// (mlx5, AER, NVRM/Xid, ...), and the generic failure words of syslog rules.
pub const KNOWN_MONITOR_WORDS: &[&str] = &[
    "mlx",
    "mellanox",
    "aer",
    "pcie",
    "pcieport",
    "nvrm",
    "xid",
    "sxid",
    "nvidia",
    "nvlink",
    "nvswitch",
    "gpu",
    "infiniband",
    "ib_",
    "rdma",
    "roce",
    "netdev",
    "watchdog",
    "lockup",
    "hung",
    "oops",
    "bug",
    "panic",
    "call trace",
    "rip:",
    "segfault",
    "oom",
    "out of memory",
    "mce",
    "machine check",
    "edac",
    "error",
    "err",
    "fail",
    "fatal",
    "crit",
    "alert",
    "emerg",
    "warn",
    "timeout",
    "timed out",
    "down",
    "health",
    "firmware",
    "reset",
    "link",
    "pci",
    "bus",
    "device",
    "ecc",
    "thermal",
];

/// A line refused for the real kernel log: the line, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?}: {why}")]
pub struct Refused {
    pub text: String,
    pub why: RefusedWhy,
}

/// Why a line may not go into the real kernel log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefusedWhy {
    #[error("does not start with the marker {MARKER:?}")]
    NoMarker,
    #[error("the marker needs a unique suffix ({MARKER}-<id>)")]
    NoSuffix,
    #[error("one line, no priority prefix")]
    NotOneLine,
    #[error("matches nicmon's pattern {0}")]
    Pattern(String),
    #[error("contains {0:?}, which kernel-log monitors match on")]
    MonitorWord(&'static str),
}

/// Why `text` must not go into the real kernel log, or `Ok` when it may.
pub fn check(text: &str, patterns: &Patterns) -> Result<(), Refused> {
    let refuse = |why| Err(Refused { text: text.to_string(), why });
    let Some(rest) = text.strip_prefix(MARKER) else {
        return refuse(RefusedWhy::NoMarker);
    };
    if rest.len() < 8 || !rest.starts_with('-') {
        return refuse(RefusedWhy::NoSuffix);
    }
    if text.contains(['\n', '\r', '<']) {
        return refuse(RefusedWhy::NotOneLine);
    }
    if let Some((p, _)) = patterns.find(text) {
        return refuse(RefusedWhy::Pattern(p.id.to_string()));
    }
    let lower = text.to_lowercase();
    if let Some(w) = KNOWN_MONITOR_WORDS.iter().find(|w| lower.contains(*w)) {
        return refuse(RefusedWhy::MonitorWord(w));
    }
    Ok(())
}

/// Write `text` into the real kernel log at priority 6 (info), if [`check`] allows it.
pub fn write_marked(text: &str) -> io::Result<()> {
    check(text, &Patterns::builtin()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut f = std::fs::OpenOptions::new().write(true).open(DEV_KMSG)?;
    f.write_all(format!("<6>{text}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_harmless_lines_pass() {
        let p = Patterns::builtin();
        check("nicmon-selftest-4242-17000: tail round trip", &p).unwrap();
        for bad in [
            "tail round trip",
            "nicmon-selftest: x",
            "nicmon-selftest-1234567 mlx5_core 0000:10:00.0: poll_health:801:(pid 0): device's health compromised",
            "nicmon-selftest-1234567 NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
            "nicmon-selftest-1234567 pcieport 0000:00:01.0: AER: Multiple Uncorrected (Fatal) error received",
            "nicmon-selftest-1234567 an Error happened",
            "nicmon-selftest-1234567 ok\n<3>mlx5_core",
        ] {
            assert!(check(bad, &p).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn write_marked_refuses_before_opening_the_device() {
        let e = write_marked("mlx5_core 0000:10:00.0: Fatal error 1 detected").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }
}
