//! The RoCE physical layer and lossless-fabric data of a netdev, as its driver reports it
//! through ethtool (SPEC §1.11): FEC (active mode, corrected/uncorrectable blocks,
//! corrected bits, per lane where given), pause frame statistics, and the driver's own
//! statistics strings that nicmon needs (mlx5's PHY, PFC-storm and pause-duration counters).
//!
//! None of it is in sysfs: FEC and pause come from the kernel's ethtool generic-netlink
//! family ([`netlink`]), the driver strings from the `SIOCETHTOOL` ioctl ([`ioctl`]). The
//! rust-netlink `ethtool` crate was considered and not used: it is async-only (a
//! `netlink-proto` connection on a runtime), it parses each FEC statistic as one `u64`
//! (the kernel sends an array: the total, then one entry per lane, so a per-lane answer
//! fails to parse), and it has no ioctl string statistics. The wire format is small and
//! stable uAPI, so [`netlink`] is a typed wrapper over a raw socket, like
//! [`crate::read::wake::rtnetlink`].
//!
//! Reads run on a worker thread under a deadline, like the sysfs reads ([`reader`]): a
//! driver that blocks in a firmware command cannot stall the poll. Unsupported (veth, lo,
//! virtio, a kernel without ethtool netlink) is [`Absent::Unsupported`], a normal answer that
//! the caller reports once, never an error per poll. [`replay`] reads the same data from
//! `<dir>/<netdev>.json` (the testbed, host trees, support bundles); [`phy`] holds the pure
//! decisions over two snapshots (pre-FEC BER, uncorrectable blocks, PFC storms, pause share).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The FEC encoding active on a link (`ETHTOOL_A_FEC_ACTIVE`, a link-mode bit index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FecMode {
    /// No FEC (`ETHTOOL_LINK_MODE_FEC_NONE_BIT`).
    Off,
    /// Reed-Solomon: RS(528,514) "KR4" on 25G NRZ lanes, RS(544,514) "KP4" on 50G+ PAM4 lanes.
    Rs,
    /// BASE-R (Fire code).
    BaseR,
    /// Low-latency Reed-Solomon, RS(272,257+1).
    Llrs,
    /// A link-mode bit this build does not name.
    Other(u32),
}

/// Link-mode bit indexes of the FEC modes (`include/uapi/linux/ethtool.h`).
const FEC_MODES: &[(u32, FecMode, &str)] =
    &[(49, FecMode::Off, "off"), (50, FecMode::Rs, "RS"), (51, FecMode::BaseR, "BASER"), (74, FecMode::Llrs, "LLRS")];

/// The replay spelling of a link-mode bit this build does not name: `bit<N>`.
const OTHER_PREFIX: &str = "bit";

impl FecMode {
    /// The mode of link-mode bit `bit`.
    pub fn from_link_mode_bit(bit: u32) -> FecMode {
        FEC_MODES.iter().find(|(b, _, _)| *b == bit).map_or(FecMode::Other(bit), |(_, m, _)| *m)
    }

    /// The replay file's spelling (`RS`, `BASER`, `LLRS`, `off`, `bit<N>`).
    pub fn name(self) -> String {
        match FEC_MODES.iter().find(|(_, m, _)| *m == self) {
            Some((_, _, name)) => (*name).to_string(),
            None => match self {
                FecMode::Other(bit) => format!("{OTHER_PREFIX}{bit}"),
                _ => unreachable!("every named mode is in FEC_MODES"),
            },
        }
    }

    /// Parses [`FecMode::name`]'s spelling.
    pub fn from_name(s: &str) -> Option<FecMode> {
        if let Some((_, m, _)) = FEC_MODES.iter().find(|(_, _, n)| *n == s) {
            return Some(*m);
        }
        let bit: u32 = s.strip_prefix(OTHER_PREFIX)?.parse().ok()?;
        // `bit50` is `RS`: one spelling per mode keeps a replayed file byte-identical.
        match FecMode::from_link_mode_bit(bit) {
            FecMode::Other(b) if b.to_string() == s[OTHER_PREFIX.len()..] => Some(FecMode::Other(b)),
            _ => None,
        }
    }
}

impl Serialize for FecMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for FecMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FecMode, D::Error> {
        let s = String::deserialize(d)?;
        FecMode::from_name(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown FEC mode {s:?}")))
    }
}

/// FEC counters of one lane (PCS instance), where the driver gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FecLane {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncorrectable_blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_bits: Option<u64>,
}

/// What `ETHTOOL_MSG_FEC_GET` with statistics answered. A statistic the driver does not
/// give is `None` (the kernel then sends it empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FecSnapshot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<FecMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncorrectable_blocks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_bits: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<FecLane>,
}

/// What `ETHTOOL_MSG_PAUSE_GET` with statistics answered (IEEE 802.3 pause frames; PFC's
/// per-priority counters are driver strings).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseSnapshot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_frames: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_frames: Option<u64>,
}

/// One netdev's ethtool data. `None`: not supported, or not read this time (unknown is
/// unknown; [`EthtoolRead`] says which). Its JSON form is the replay file ([`replay`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EthtoolSnapshot {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fec: Option<FecSnapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseSnapshot>,
    /// The picked driver statistics ([`picked`]); `Some` and empty: the driver has
    /// statistics strings, none of them nicmon's. A name given twice is an error, never
    /// the last one's count.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "unique_stats")]
    pub stats: Option<BTreeMap<String, u64>>,
    /// The port's transceiver memory (SPEC §1.13): `{"pages": {"0": "<hex>", ...}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleRead>,
}

/// A transceiver's pages as read ([`crate::model::module`] decodes them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRead {
    pub pages: crate::model::module::Pages,
}

/// `stats` of a snapshot's JSON, refusing a statistic named twice (a map would keep the
/// last count: a file nicmon cannot understand must say nothing, not one of its values).
/// `null` is `None`, as for the other parts.
fn unique_stats<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<BTreeMap<String, u64>>, D::Error> {
    struct Unique(BTreeMap<String, u64>);
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Unique;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of statistic names to counts")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((name, count)) = map.next_entry::<String, u64>()? {
                if out.contains_key(&name) {
                    return Err(serde::de::Error::custom(format!("statistic {name:?} given twice")));
                }
                out.insert(name, count);
            }
            Ok(Unique(out))
        }
    }
    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
            d.deserialize_map(Visit)
        }
    }
    Ok(Option::<Unique>::deserialize(d)?.map(|u| u.0))
}

/// Why one part of a netdev's ethtool data is not there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Absent {
    /// The driver or kernel does not offer it (veth, lo, virtio; no ethtool netlink): a
    /// property of the device, reported once.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// It is offered and the read failed (the netdev went, a deadline passed, a malformed
    /// answer): unknown for this poll.
    #[error("{0}")]
    Failed(String),
}

impl Absent {
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Absent::Unsupported(_))
    }
}

/// One netdev's ethtool read, part by part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthtoolRead {
    pub fec: Result<FecSnapshot, Absent>,
    pub pause: Result<PauseSnapshot, Absent>,
    pub stats: Result<BTreeMap<String, u64>, Absent>,
}

impl EthtoolRead {
    /// Every part absent for the same reason.
    pub fn absent(why: Absent) -> EthtoolRead {
        EthtoolRead { fec: Err(why.clone()), pause: Err(why.clone()), stats: Err(why) }
    }

    /// The parts that were read (the transceiver's pages are read on their own:
    /// [`crate::read::ethtool::modules`]).
    pub fn snapshot(&self) -> EthtoolSnapshot {
        EthtoolSnapshot {
            fec: self.fec.as_ref().ok().cloned(),
            pause: self.pause.as_ref().ok().cloned(),
            stats: self.stats.as_ref().ok().cloned(),
            module: None,
        }
    }
}

/// How a driver statistic nicmon keeps is named.
#[derive(Debug, Clone, Copy)]
enum Pick {
    Exact(&'static str),
    /// `<prefix><decimal digits><suffix>` (a lane or a priority).
    Numbered(&'static str, &'static str),
}

/// The driver statistics nicmon keeps (mlx5's names, and bnxt_en's for its PHY where the
/// standard FEC statistics lack them; other drivers' are simply absent).
const PICKED: &[Pick] = &[
    // PHY: pre-FEC bit errors, post-FEC symbol errors, per-lane errors, receive discards.
    Pick::Exact("rx_corrected_bits_phy"),
    Pick::Exact("rx_pcs_symbol_err_phy"),
    // bnxt_en's port statistics (`bnxt_ethtool.c`, `bnxt_port_stats_ext_arr`): its netlink
    // FEC statistics give blocks, not the corrected bits the pre-FEC BER needs.
    Pick::Exact(BNXT_CORRECTED_BITS),
    Pick::Exact(BNXT_UNCORRECTABLE_BLOCKS),
    Pick::Numbered("rx_err_lane_", "_phy"),
    Pick::Exact("rx_discards_phy"),
    // PFC storm prevention and the time the fabric paused this port, per priority (µs).
    Pick::Exact("tx_pause_storm_warning_events"),
    Pick::Exact("tx_pause_storm_error_events"),
    Pick::Numbered("rx_prio", "_pause_duration"),
    // The same for link-level (non-PFC) pause.
    Pick::Exact("rx_global_pause_duration"),
    // ECN/CNP: [`CONGESTION`].
];

/// The ECN/CNP congestion counters (metrics only: congestion is not a NIC fault). mlx5
/// gives them as the RDMA port's `hw_counters/<name>` (sysfs, read on RoCE ports while
/// `[phyCheck]` is enabled); picked here too for drivers that put them in their ethtool
/// statistics.
pub const CONGESTION: &[&str] = &["np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled"];

/// The RDMA port directory's file of a [`CONGESTION`] counter.
pub fn congestion_path(name: &str) -> String {
    format!("hw_counters/{name}")
}

/// Whether nicmon keeps the driver statistic `name`.
pub fn picked(name: &str) -> bool {
    CONGESTION.contains(&name)
        || PICKED.iter().any(|p| match *p {
            Pick::Exact(n) => n == name,
            Pick::Numbered(prefix, suffix) => name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(suffix))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        })
}

/// The number in a [`Pick::Numbered`] name `<prefix>N<suffix>` (a priority, a lane).
pub fn numbered(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    let n = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Prefix of a counter read from the port's netdev's ethtool data rather than a file
/// (SPEC §1.11): `ethtool/<driver statistic>` (`ethtool/tx_pause_storm_error_events`) or
/// one of the port-level values [`crate::read::ethtool::ports`] derives
/// (`ethtool/fec_corrected_bits`, `ethtool/fec_uncorrectable`, `ethtool/pause_duration`).
pub const ETHTOOL_PREFIX: &str = "ethtool/";

/// bnxt_en's pre-FEC corrected bits and post-FEC uncorrectable blocks (`ethtool -S`).
const BNXT_CORRECTED_BITS: &str = "rx_corrected_bits";
const BNXT_UNCORRECTABLE_BLOCKS: &str = "rx_fec_uncorrectable_blocks";

/// A port's corrected-bit counter: the FEC statistics', else mlx5's `rx_corrected_bits_phy`,
/// else bnxt_en's `rx_corrected_bits`.
pub fn corrected_bits(s: &EthtoolSnapshot) -> Option<u64> {
    s.fec
        .as_ref()
        .and_then(|f| f.corrected_bits)
        .or_else(|| stat(s, "rx_corrected_bits_phy"))
        .or_else(|| stat(s, BNXT_CORRECTED_BITS))
}

/// A port's post-FEC error counter: uncorrectable FEC blocks, else mlx5's
/// `rx_pcs_symbol_err_phy`, else bnxt_en's `rx_fec_uncorrectable_blocks`.
pub fn uncorrectable(s: &EthtoolSnapshot) -> Option<u64> {
    s.fec
        .as_ref()
        .and_then(|f| f.uncorrectable_blocks)
        .or_else(|| stat(s, "rx_pcs_symbol_err_phy"))
        .or_else(|| stat(s, BNXT_UNCORRECTABLE_BLOCKS))
}

/// A driver statistic of the snapshot, by its ethtool name.
pub fn stat(s: &EthtoolSnapshot, name: &str) -> Option<u64> {
    s.stats.as_ref()?.get(name).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_named_counters_and_no_others() {
        for name in [
            "rx_corrected_bits_phy",
            "rx_pcs_symbol_err_phy",
            "rx_err_lane_0_phy",
            "rx_err_lane_7_phy",
            "tx_pause_storm_warning_events",
            "tx_pause_storm_error_events",
            "rx_prio3_pause_duration",
            "rx_global_pause_duration",
            "rx_discards_phy",
            "np_ecn_marked_roce_packets",
            "np_cnp_sent",
            "rp_cnp_handled",
        ] {
            assert!(picked(name), "{name}");
        }
        for name in [
            "rx_err_lane__phy",
            "rx_err_lane_x_phy",
            "rx_prio3_pause",
            "tx_prio3_pause_duration",
            "rx_prio_pause_duration",
            "rx_packets_phy",
            "peer_ifindex",
            "",
        ] {
            assert!(!picked(name), "{name}");
        }
        assert_eq!(numbered("rx_prio3_pause_duration", "rx_prio", "_pause_duration"), Some(3));
        assert_eq!(numbered("rx_prio_pause_duration", "rx_prio", "_pause_duration"), None);
    }

    #[test]
    fn bnxt_en_statistics_stand_in_for_missing_fec_statistics() {
        let with = |fec: Option<FecSnapshot>, stats: &[(&str, u64)]| EthtoolSnapshot {
            fec,
            stats: Some(stats.iter().map(|(k, v)| (k.to_string(), *v)).collect()),
            ..EthtoolSnapshot::default()
        };
        let bnxt = [("rx_corrected_bits", 700), ("rx_fec_uncorrectable_blocks", 3)];
        assert!(bnxt.iter().all(|(n, _)| picked(n)));
        // bnxt_en's netlink FEC statistics: blocks, no corrected bits.
        let blocks = FecSnapshot { uncorrectable_blocks: Some(2), ..FecSnapshot::default() };
        let s = with(Some(blocks), &bnxt);
        assert_eq!((corrected_bits(&s), uncorrectable(&s)), (Some(700), Some(2)));
        assert_eq!((corrected_bits(&with(None, &bnxt)), uncorrectable(&with(None, &bnxt))), (Some(700), Some(3)));
        // mlx5's names first.
        let both = with(None, &[("rx_corrected_bits_phy", 5), ("rx_corrected_bits", 700)]);
        assert_eq!(corrected_bits(&both), Some(5));
    }

    #[test]
    fn fec_mode_names_round_trip() {
        for (bit, name) in [(49, "off"), (50, "RS"), (51, "BASER"), (74, "LLRS"), (80, "bit80")] {
            let m = FecMode::from_link_mode_bit(bit);
            assert_eq!(m.name(), name);
            assert_eq!(FecMode::from_name(name), Some(m));
        }
        for bad in ["rs", "bit50", "bit", "bit-1", "bit080", "None", ""] {
            assert_eq!(FecMode::from_name(bad), None, "{bad}");
        }
    }
}
