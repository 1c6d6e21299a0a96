//! How far a counter can count, by counter file (`reference/sysfs-formats.md`, 004).
//!
//! The PMA PortCounters under `counters/` are 4-, 8-, 16- or 32-bit and **saturate**: once
//! at their maximum they stay there until reset, so no threshold on them can ever breach
//! again. Such a value is reported as saturated (SPEC §1.4), not evaluated.
//!
//! Decisions for the counters the table does not cover:
//! - `port_{xmit,rcv}_{data,packets}` are 32-bit, or 64-bit when the device advertises
//!   extended width, which a counter file does not tell. A value above `u32::MAX` proves a
//!   64-bit counter and is never saturated; a value of exactly `u32::MAX` is treated as
//!   saturated (the real dumps show exactly that: all four at 4294967295 on an HCA without
//!   extended width). A 64-bit counter read at exactly that value on its way up is a
//!   one-poll coincidence whose episode ends at the next poll.
//! - `port_{xmit,rcv}_{unicast,multicast}_packets` exist only with extended width: 64-bit.
//! - `hw_counters/*` are mlx5 firmware queue/congestion counters printed with `%llu`, not
//!   PMA counters; nothing documents saturation for them: no saturation check. A wrap, if
//!   one ever happens, reads as a value below the last one, which the evaluator already
//!   treats as a reset.
//! - `carrier_changes` is the kernel's 32-bit `carrier_up_count + carrier_down_count`; a
//!   software counter that wraps (printed with `%d`, so past 2^31 it turns negative and
//!   fails to parse, i.e. it becomes unreadable), never saturates: no saturation check.
//! - Anything else (operator-added paths): unknown width, no saturation check.

/// How a counter behaves at the end of its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// A PMA counter of this many bits that stops at `2^bits - 1`.
    Saturating(u32),
    /// A counter of this many bits that wraps to 0 (seen as a reset).
    Wrapping(u32),
}

impl Width {
    pub fn bits(self) -> u32 {
        match self {
            Width::Saturating(b) | Width::Wrapping(b) => b,
        }
    }

    /// The value a saturating counter sticks at.
    pub fn saturation_value(self) -> Option<u64> {
        match self {
            Width::Saturating(b) if b >= 64 => Some(u64::MAX),
            Width::Saturating(b) => Some((1u64 << b) - 1),
            Width::Wrapping(_) => None,
        }
    }
}

/// The width of the counter a rule path names (`counters/link_downed`,
/// `/sys/class/net/{interface}/carrier_changes`), or `None` when not known.
pub fn width(path: &str) -> Option<Width> {
    let file = path.rsplit('/').next().unwrap_or(path);
    let in_pma = path.strip_prefix("counters/").is_some_and(|rest| !rest.contains('/'));
    if in_pma {
        let bits = match file {
            "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => 4,
            "link_error_recovery" | "link_downed" | "port_xmit_constraint_errors" | "port_rcv_constraint_errors" => 8,
            "symbol_error"
            | "port_rcv_errors"
            | "port_rcv_remote_physical_errors"
            | "port_rcv_switch_relay_errors"
            | "port_xmit_discards"
            | "VL15_dropped" => 16,
            "port_xmit_data" | "port_rcv_data" | "port_xmit_packets" | "port_rcv_packets" | "port_xmit_wait" => 32,
            "port_unicast_xmit_packets"
            | "port_unicast_rcv_packets"
            | "port_multicast_xmit_packets"
            | "port_multicast_rcv_packets" => return Some(Width::Wrapping(64)),
            _ => return None,
        };
        return Some(Width::Saturating(bits));
    }
    if path.starts_with("/sys/class/net/") && file == "carrier_changes" {
        return Some(Width::Wrapping(32));
    }
    None
}

/// The value at which the counter at `path` is saturated, if it saturates.
pub fn saturation_value(path: &str) -> Option<u64> {
    width(path).and_then(Width::saturation_value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_of_reference_table() {
        let cases = [
            ("counters/local_link_integrity_errors", Some(15)),
            ("counters/excessive_buffer_overrun_errors", Some(15)),
            ("counters/link_downed", Some(255)),
            ("counters/link_error_recovery", Some(255)),
            ("counters/port_rcv_constraint_errors", Some(255)),
            ("counters/symbol_error", Some(65535)),
            ("counters/port_rcv_errors", Some(65535)),
            ("counters/port_xmit_discards", Some(65535)),
            ("counters/VL15_dropped", Some(65535)),
            ("counters/port_xmit_wait", Some(4294967295)),
            ("counters/port_rcv_data", Some(4294967295)),
            ("counters/port_unicast_xmit_packets", None),
            ("hw_counters/rnr_nak_retry_err", None),
            ("hw_counters/link_downed", None),
            ("/sys/class/net/{interface}/carrier_changes", None),
            ("/sys/class/net/{interface}/statistics/carrier_changes", None),
            ("counters/unknown_thing", None),
            ("counters/sub/link_downed", None),
        ];
        for (path, max) in cases {
            assert_eq!(saturation_value(path), max, "{path}");
        }
        assert_eq!(width("/sys/class/net/{interface}/carrier_changes"), Some(Width::Wrapping(32)));
        assert_eq!(width("counters/link_downed").map(Width::bits), Some(8));
    }
}
