//! Pure decisions over two ethtool snapshots of one port (SPEC §1.11): pre-FEC bit error
//! rate, uncorrectable codewords, PFC storm events, the share of time the fabric paused
//! the port. No clock, no I/O: the caller gives the elapsed time and the port rate.
//!
//! **Why the pre-FEC BER threshold is 1e-4.** A Reed-Solomon FEC over 10-bit symbols
//! corrects up to `t` wrong symbols in a codeword of `n`; a codeword with more is lost
//! (uncorrectable, the frame dropped, RoCE retransmits). With independent bit errors at
//! rate `p`, a symbol is wrong with `ps = 1 - (1 - p)^10` and a codeword is lost with the
//! binomial tail `P(X > t)`, `X ~ Bin(n, ps)` ([`RsCode::codeword_failure`]). Taking a lost
//! codeword in 10^12 as the edge ([`FAILURE_AT_LIMIT`]), the correction limit is:
//! - RS(544,514) "KP4" (t = 15; 50G/100G PAM4 lanes: 200G, 400G, 800G ports): 2.4e-4 — the
//!   figure IEEE 802.3bs/cd gives for KP4;
//! - RS(528,514) "KR4" (t = 7; 25G NRZ lanes: 25G, 100G-4 ports): 2.3e-5.
//!
//! The default threshold sits about 2.4x below each limit: 1e-4 for KP4 (codewords lost at
//! 1.4e-18, six decades below the edge) and 1e-5 for KR4 (1.4e-15, almost three decades).
//! Healthy optics run at 1e-8 and below, three to four decades under the threshold, while a
//! degrading optic or a dirty connector climbs through it by decades, which leaves the
//! operator time between the event and the FEC cliff. Real PAM4 links see error bursts
//! (DFE error propagation) that the independent-error model does not count, which is one
//! more reason not to alarm right at the limit.
use crate::model::ethtool::{EthtoolSnapshot, FecMode, numbered};
use std::time::Duration;

/// A lost codeword in this many is the edge the correction limit is computed for.
pub const FAILURE_AT_LIMIT: f64 = 1e-12;

/// The pre-FEC BER threshold when the FEC code is not known (SPEC §1.11, the `pre_fec_ber`
/// rule's default; `[phyCheck] preFecBerThreshold` sets it): the KP4 one, the FEC of every
/// 200G+ RoCE port. The figures themselves are [`RsCode::default_threshold`]'s.
pub const DEFAULT_PRE_FEC_BER_THRESHOLD: f64 = RsCode::Kp4.default_threshold();

/// Share of time paused by the fabric above which a port is a pause victim (SPEC §1.11).
pub const PAUSE_VICTIM_SHARE: f64 = 0.5;

/// Bits per Reed-Solomon symbol in Ethernet's RS-FECs.
const SYMBOL_BITS: i32 = 10;

/// The Reed-Solomon codes of Ethernet's RS-FEC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RsCode {
    /// RS(528,514), Clause 91, on 25G NRZ lanes.
    Kr4,
    /// RS(544,514), Clause 91/134, on 50G and 100G PAM4 lanes.
    Kp4,
}

impl RsCode {
    /// Symbols per codeword.
    pub const fn n(self) -> u32 {
        match self {
            RsCode::Kr4 => 528,
            RsCode::Kp4 => 544,
        }
    }

    /// Wrong symbols a codeword can carry and still be corrected: (n - 514) / 2.
    pub const fn t(self) -> u32 {
        (self.n() - 514) / 2
    }

    /// The default pre-FEC BER threshold for this code (the module doc says why).
    pub const fn default_threshold(self) -> f64 {
        match self {
            RsCode::Kr4 => 1e-5,
            RsCode::Kp4 => 1e-4,
        }
    }

    /// The probability that a codeword is lost at pre-FEC BER `ber`, with independent bit
    /// errors: `P(X > t)`, `X ~ Bin(n, 1 - (1 - ber)^10)`, summed in log space.
    pub fn codeword_failure(self, ber: f64) -> f64 {
        if ber.is_nan() || ber <= 0.0 {
            return 0.0;
        }
        let ps = -f64::exp_m1(f64::from(SYMBOL_BITS) * f64::ln_1p(-ber.min(1.0)));
        if ps >= 1.0 {
            return 1.0;
        }
        let (n, t) = (f64::from(self.n()), self.t());
        let (ln_p, ln_q) = (ps.ln(), f64::ln_1p(-ps));
        // ln P(X = k), from ln P(X = 0) = n ln q upwards.
        let mut ln_pmf = n * ln_q;
        let mut tail = 0.0;
        for k in 1..=self.n() {
            let k = f64::from(k);
            ln_pmf += ((n - k + 1.0) / k).ln() + ln_p - ln_q;
            if k > f64::from(t) {
                tail += ln_pmf.exp();
            }
        }
        tail.clamp(0.0, 1.0)
    }

    /// The pre-FEC BER at which a codeword in 10^12 is lost ([`FAILURE_AT_LIMIT`]).
    pub fn correction_limit(self) -> f64 {
        // Bisection on log10(BER): the failure probability rises with the BER.
        let (mut lo, mut hi) = (-12.0f64, -1.0f64);
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if self.codeword_failure(10f64.powf(mid)) < FAILURE_AT_LIMIT {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        10f64.powf((lo + hi) / 2.0)
    }
}

/// The RS code a port runs, where it can be told (SPEC §1.11): the lane rate decides — RS-FEC
/// on lanes of 50 Gb/s and more is KP4, on slower lanes KR4. `lanes`: as the RDMA `rate`
/// string names them ([`rate_lanes`]), else the FEC statistics' lanes; without either a port
/// of 25 Gb/s or less is one lane, and 200 Gb/s and faster ports are all PAM4 (KP4). Only a
/// 50G or 100G port of unknown lanes (2x25G or 1x50G; 4x25G, 2x50G or 1x100G) is `None`:
/// the rule's threshold holds there.
pub fn rs_code(mode: Option<FecMode>, rate_bps: f64, lanes: Option<usize>) -> Option<RsCode> {
    if mode != Some(FecMode::Rs) || !rate_bps.is_finite() || rate_bps <= 0.0 {
        return None;
    }
    match lanes.filter(|&l| l > 0).or_else(|| (rate_bps <= 25e9).then_some(1)) {
        Some(l) if rate_bps / l as f64 >= 50e9 => Some(RsCode::Kp4),
        Some(_) => Some(RsCode::Kr4),
        None if rate_bps >= 200e9 => Some(RsCode::Kp4),
        None => None,
    }
}

/// The lanes an RDMA port's `rate` names: its width (`4X` in `100 Gb/sec (4X EDR)`).
pub fn rate_lanes(width: Option<&str>) -> Option<usize> {
    width?.trim().strip_suffix('X')?.parse().ok().filter(|&l| l > 0)
}

/// A port's own pre-FEC BER threshold, where its FEC code sets it: the code's default
/// ([`RsCode::default_threshold`]) unless the operator set the rule's threshold
/// (`threshold_set`: an explicit value holds on every port, whatever it is). `None`: the
/// rule's threshold.
pub fn port_ber_threshold(threshold_set: bool, code: Option<RsCode>) -> Option<f64> {
    code.filter(|_| !threshold_set).map(RsCode::default_threshold)
}

use crate::model::ethtool::stat;
pub use crate::model::ethtool::{corrected_bits, uncorrectable};

/// How a monotonic counter moved between two reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Not readable in one of them.
    Unknown,
    Same,
    Up(u64),
    /// Went backwards: the counter was reset (driver reload, port reset).
    Reset,
}

/// How `prev` → `cur` moved.
pub fn change(prev: Option<u64>, cur: Option<u64>) -> Change {
    match (prev, cur) {
        (Some(p), Some(c)) if c == p => Change::Same,
        (Some(p), Some(c)) if c > p => Change::Up(c - p),
        (Some(_), Some(_)) => Change::Reset,
        _ => Change::Unknown,
    }
}

/// PFC storm prevention events between two reads (mlx5 counts both levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storm {
    /// The NIC has been sending pause frames for longer than its warning time.
    Warning(u64),
    /// Storm prevention disabled pause on the port: the host is not draining its queue.
    Error(u64),
}

/// The storm events between `prev` and `cur`, errors first.
pub fn storms(prev: &EthtoolSnapshot, cur: &EthtoolSnapshot) -> Vec<Storm> {
    let moved = |name| match change(stat(prev, name), stat(cur, name)) {
        Change::Up(n) => Some(n),
        _ => None,
    };
    let error = moved("tx_pause_storm_error_events").map(Storm::Error);
    let warning = moved("tx_pause_storm_warning_events").map(Storm::Warning);
    error.into_iter().chain(warning).collect()
}

/// The share of `elapsed` the fabric held this port paused: the largest increase of a
/// pause duration (µs; `rx_prio<N>_pause_duration` per PFC priority,
/// `rx_global_pause_duration` for link-level pause) over the interval, capped at 1. The
/// largest, not the sum: priorities are paused at the same time, and RoCE runs on one
/// lossless priority. `None` when no duration moved forward or stayed (unknown, or all
/// reset).
pub fn pause_share(prev: &EthtoolSnapshot, cur: &EthtoolSnapshot, elapsed: Duration) -> Option<f64> {
    let (p, c) = (prev.stats.as_ref()?, cur.stats.as_ref()?);
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let paused_us = c
        .iter()
        .filter(|(name, _)| is_pause_duration(name))
        .filter_map(|(name, &now)| match change(p.get(name).copied(), Some(now)) {
            Change::Same => Some(0),
            Change::Up(d) => Some(d),
            _ => None,
        })
        .max()?;
    Some((paused_us as f64 / 1e6 / secs).min(1.0))
}

fn is_pause_duration(name: &str) -> bool {
    name == "rx_global_pause_duration" || numbered(name, "rx_prio", "_pause_duration").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn stats(pairs: &[(&str, u64)]) -> EthtoolSnapshot {
        let m: BTreeMap<String, u64> = pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        EthtoolSnapshot { stats: Some(m), ..Default::default() }
    }

    #[test]
    fn codeword_failure_matches_the_binomial_tail() {
        // Reference values: the exact binomial tail (Python's math.comb, same model).
        for (code, ber, want) in [
            (RsCode::Kp4, 1e-4, 1.36e-18),
            (RsCode::Kp4, 2.4e-4, 8.15e-13),
            (RsCode::Kp4, 1e-3, 1.53e-4),
            (RsCode::Kr4, 1e-5, 1.36e-15),
            (RsCode::Kr4, 2.3e-5, 9.99e-13),
            (RsCode::Kr4, 1e-4, 8.93e-8),
        ] {
            let got = code.codeword_failure(ber);
            assert!((got / want - 1.0).abs() < 0.01, "{code:?} at {ber}: {got:e}, want {want:e}");
        }
        assert_eq!(RsCode::Kp4.codeword_failure(0.0), 0.0);
        assert_eq!(RsCode::Kp4.codeword_failure(f64::NAN), 0.0);
        assert_eq!(RsCode::Kp4.codeword_failure(1.0), 1.0);
        assert!(RsCode::Kp4.codeword_failure(0.5) > 0.99);
    }

    #[test]
    fn limits_and_default_thresholds_leave_headroom() {
        let kp4 = RsCode::Kp4.correction_limit();
        assert!((2.3e-4..2.6e-4).contains(&kp4), "KP4 limit {kp4:e} (IEEE: 2.4e-4)");
        let kr4 = RsCode::Kr4.correction_limit();
        assert!((2.0e-5..2.6e-5).contains(&kr4), "KR4 limit {kr4:e}");
        for code in [RsCode::Kp4, RsCode::Kr4] {
            let (limit, threshold) = (code.correction_limit(), code.default_threshold());
            // At least 2x below the limit in BER, at least 100x below the edge in lost
            // codewords, and three decades or more above a healthy 1e-8 link.
            assert!(threshold * 2.0 < limit, "{code:?}");
            assert!(code.codeword_failure(threshold) < FAILURE_AT_LIMIT / 100.0, "{code:?}");
            assert!(threshold / 1e-8 > 999.0, "{code:?}");
        }
        assert_eq!(RsCode::Kp4.t(), 15);
        assert_eq!(RsCode::Kr4.t(), 7);
    }

    #[test]
    fn which_rs_code_a_port_runs() {
        let rs = Some(FecMode::Rs);
        for (mode, rate, lanes, want) in [
            (rs, 400e9, Some(8), Some(RsCode::Kp4)),
            (rs, 400e9, None, Some(RsCode::Kp4)),
            (rs, 200e9, None, Some(RsCode::Kp4)),
            (rs, 100e9, Some(4), Some(RsCode::Kr4)),
            (rs, 100e9, Some(2), Some(RsCode::Kp4)),
            (rs, 100e9, None, None),
            (rs, 50e9, None, None),
            (rs, 25e9, Some(1), Some(RsCode::Kr4)),
            // A 25G port is one 25G lane, whatever the FEC statistics give (issue #43).
            (rs, 25e9, None, Some(RsCode::Kr4)),
            (rs, 100e9, Some(0), None),
            (rs, 0.0, Some(4), None),
            (Some(FecMode::BaseR), 25e9, Some(1), None),
            (Some(FecMode::Off), 400e9, None, None),
            (None, 400e9, None, None),
        ] {
            assert_eq!(rs_code(mode, rate, lanes), want, "{mode:?} {rate} {lanes:?}");
        }
    }

    #[test]
    fn changes() {
        for (prev, cur, want) in [
            (Some(1), Some(1), Change::Same),
            (Some(1), Some(4), Change::Up(3)),
            (Some(4), Some(1), Change::Reset),
            (None, Some(1), Change::Unknown),
            (Some(1), None, Change::Unknown),
            (Some(0), Some(u64::MAX), Change::Up(u64::MAX)),
        ] {
            assert_eq!(change(prev, cur), want, "{prev:?} -> {cur:?}");
        }
    }

    #[test]
    fn storm_events() {
        let w = "tx_pause_storm_warning_events";
        let e = "tx_pause_storm_error_events";
        for (prev, cur, want) in [
            (stats(&[(w, 0), (e, 0)]), stats(&[(w, 0), (e, 0)]), vec![]),
            (stats(&[(w, 0), (e, 0)]), stats(&[(w, 2), (e, 0)]), vec![Storm::Warning(2)]),
            (stats(&[(w, 1), (e, 0)]), stats(&[(w, 2), (e, 1)]), vec![Storm::Error(1), Storm::Warning(1)]),
            // A reset is not a storm; a counter that appears is not an increase.
            (stats(&[(w, 5), (e, 5)]), stats(&[(w, 0), (e, 0)]), vec![]),
            (stats(&[]), stats(&[(w, 3)]), vec![]),
            (EthtoolSnapshot::default(), stats(&[(e, 3)]), vec![]),
        ] {
            assert_eq!(storms(&prev, &cur), want, "{prev:?} -> {cur:?}");
        }
    }

    #[test]
    fn pause_time_share() {
        let second = Duration::from_secs(1);
        let p3 = "rx_prio3_pause_duration";
        let p4 = "rx_prio4_pause_duration";
        let g = "rx_global_pause_duration";
        for (prev, cur, elapsed, want) in [
            (stats(&[(p3, 0)]), stats(&[(p3, 250_000)]), second, Some(0.25)),
            // The most-paused priority, not the sum.
            (stats(&[(p3, 0), (p4, 0)]), stats(&[(p3, 600_000), (p4, 600_000)]), second, Some(0.6)),
            (stats(&[(p3, 0)]), stats(&[(p3, 3_000_000)]), second, Some(1.0)),
            (stats(&[(g, 100)]), stats(&[(g, 700_100)]), second, Some(0.7)),
            (stats(&[(p3, 7)]), stats(&[(p3, 7)]), second, Some(0.0)),
            (stats(&[(p3, 7)]), stats(&[(p3, 1)]), second, None),
            (stats(&[]), stats(&[(p3, 1)]), second, None),
            (stats(&[(p3, 0)]), stats(&[(p3, 1)]), Duration::ZERO, None),
            (EthtoolSnapshot::default(), stats(&[(p3, 1)]), second, None),
            (stats(&[("rx_prio_pause_duration", 0)]), stats(&[("rx_prio_pause_duration", 9)]), second, None),
        ] {
            assert_eq!(pause_share(&prev, &cur, elapsed), want, "{prev:?} -> {cur:?}");
        }
    }
}
