//! The ethtool read path against the real kernel: generic netlink (FEC, pause) and the
//! `SIOCETHTOOL` ioctl (driver statistics) on a veth pair and on `lo`. Neither has a PHY:
//! FEC is "not supported" (a normal answer, not an error), pause is answered or not
//! supported, and what was read replays byte-identically from its replay file.
mod support;

use nicmon::model::ethtool::Absent;

use nicmon::model::ethtool::EthtoolRead;

use nicmon::read::ethtool::EthtoolReader;

use nicmon::read::ethtool::EthtoolSource;

use nicmon::model::ethtool::picked;

use nicmon::read::ethtool::replay;
use std::time::Duration;
use support::{VethPair, is_root, skip};

const TEST: &str = "ethtool_kernel";
const DEADLINE: Duration = Duration::from_secs(10);

/// The kernel has the ethtool netlink family (`CONFIG_ETHTOOL_NETLINK`, 5.6+): a FEC
/// request then reaches the driver, which says it has no FEC. Without the family the
/// answer is "not supported" too, for the kernel's reason; the test says so in one line.
fn has_ethtool_netlink(read: &EthtoolRead) -> bool {
    !matches!(&read.fec, Err(Absent::Unsupported(w)) if w.contains("no ethtool netlink family"))
}

/// Pause: answered (statistics or not) or not supported; never a failure.
fn pause_answered_or_unsupported(read: &EthtoolRead, dev: &str) {
    match &read.pause {
        Ok(_) => {}
        Err(e) => assert!(e.is_unsupported(), "{dev}: pause failed: {e}"),
    }
}

#[test]
fn veth_has_no_fec_and_replays_byte_identically() {
    if !is_root() {
        return skip(TEST, "needs root (veth)");
    }
    let pair = match VethPair::create("e") {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot create a veth pair: {e}")),
    };
    let reader = EthtoolReader::default();
    let read = reader.read(&pair.a, DEADLINE);
    if !has_ethtool_netlink(&read) {
        skip(TEST, "this kernel has no ethtool netlink family: FEC and pause not exercised");
    }
    assert!(read.fec.as_ref().is_err_and(Absent::is_unsupported), "veth FEC: {:?}", read.fec);
    pause_answered_or_unsupported(&read, &pair.a);
    // veth has statistics strings (`peer_ifindex`, per-queue XDP counters), none of nicmon's.
    let stats = read.stats.as_ref().expect("veth statistics strings");
    assert!(stats.keys().all(|k| picked(k)), "{stats:?}");
    // A second read of the same netdev is answered the same way (nothing is left stuck).
    assert_eq!(reader.read(&pair.a, DEADLINE).fec, read.fec);
    assert!(reader.stuck().is_empty());

    // Live read -> replay file -> replayed read: the same snapshot, the same bytes.
    let dir = tempfile::tempdir().unwrap();
    let live = read.snapshot();
    replay::write(dir.path(), &pair.a, &live).unwrap();
    let written = std::fs::read(replay::path(dir.path(), &pair.a).unwrap()).unwrap();
    let replayed = EthtoolSource::Replay(dir.path().to_path_buf()).read(&pair.a, DEADLINE);
    assert_eq!(replayed.snapshot(), live);
    assert_eq!(replay::to_json(&replayed.snapshot()).into_bytes(), written);
    // What was not supported live is not supported replayed.
    assert_eq!(replayed.fec.is_err(), read.fec.is_err());
    assert_eq!(replayed.pause.is_ok(), read.pause.is_ok());
}

#[test]
fn loopback_answers_without_errors() {
    // No root needed: ethtool's GET requests are open to every user.
    let reader = EthtoolReader::default();
    let read = reader.read("lo", DEADLINE);
    assert!(read.fec.as_ref().is_err_and(Absent::is_unsupported), "lo FEC: {:?}", read.fec);
    pause_answered_or_unsupported(&read, "lo");
    match &read.stats {
        Ok(s) => assert!(s.keys().all(|k| picked(k)), "{s:?}"),
        Err(e) => assert!(e.is_unsupported(), "lo statistics: {e}"),
    }
}

#[test]
fn a_netdev_that_is_not_there_is_a_failure_not_unsupported() {
    let reader = EthtoolReader::default();
    let read = reader.read("nmnosuchdev0", DEADLINE);
    let fec_says = |read: &EthtoolRead| matches!(&read.fec, Err(Absent::Failed(_)));
    if !has_ethtool_netlink(&read) {
        skip(TEST, "this kernel has no ethtool netlink family: FEC and pause not exercised");
    } else {
        assert!(fec_says(&read), "{:?}", read.fec);
        assert!(matches!(&read.pause, Err(Absent::Failed(_))), "{:?}", read.pause);
    }
    assert!(matches!(&read.stats, Err(Absent::Failed(_))), "{:?}", read.stats);
}
