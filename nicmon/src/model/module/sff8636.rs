//! SFF-8636 rev 2.10a (QSFP+, QSFP28, QSFP56: identifiers 0x0C, 0x0D, 0x11): lower page 00h
//! (flags 3–14, monitors 22–57), upper page 00h (diagnostic type, byte 220) and upper page
//! 03h (thresholds 128–199). Always 4 lanes; lane `n`'s monitor is 2 bytes at its block's
//! start + 2(n−1).
use super::{Flags, Lane, MapKind, Module, Pages, Thresholds, bias_ma, bit, power_mw, temperature, thresholds, volts};

/// Lower page byte 2 bit 2: flat memory (upper page 00h only, no page 03h).
pub(super) const FLAT_MEMORY: u8 = 1 << 2;
/// Upper page 00h byte 220, diagnostic monitoring type: bit 2, Tx power measured.
const DIAG_TYPE: usize = 220;
const TX_POWER_MEASURED: u8 = 1 << 2;

/// Latched flags: byte 3 Rx LOS (bits 0–3 = lanes 1–4) and Tx LOS (bits 4–7); byte 4 Tx
/// fault (bits 0–3); byte 5 Rx CDR LOL (bits 0–3) and Tx CDR LOL (bits 4–7); byte 6
/// temperature and byte 7 Vcc (high alarm bit 7, low alarm 6, high warning 5, low warning 4).
const LOS: usize = 3;
const FAULT: usize = 4;
const LOL: usize = 5;
const TEMPERATURE_FLAGS: usize = 6;
const VCC_FLAGS: usize = 7;
/// Lane monitor flags, two lanes a byte (the odd lane in bits 7–4): Rx power 9–10, Tx bias
/// 11–12, Tx power 13–14.
const RX_POWER_FLAGS: usize = 9;
const TX_BIAS_FLAGS: usize = 11;
const TX_POWER_FLAGS: usize = 13;
/// Monitors: temperature 22, Vcc 26; per lane Rx power 34, Tx bias 42, Tx power 50.
const TEMPERATURE: usize = 22;
const VCC: usize = 26;
const RX_POWER: usize = 34;
const TX_BIAS: usize = 42;
const TX_POWER: usize = 50;
/// Page 03h thresholds: temperature 128, Vcc 144, Rx power 176, Tx bias 184, Tx power 192.
const THRESHOLDS: u8 = 3;

/// Lane `i`'s (from 0) nibble of a two-lanes-a-byte flag block at `at`.
fn lane_flags(p: &Pages, at: usize, i: usize) -> Flags {
    Flags::descending(p.byte(0, at + i / 2), if i.is_multiple_of(2) { 7 } else { 3 })
}

pub(super) fn decode(p: &Pages, id: u8) -> Module {
    let flat = bit(p.byte(0, 2), 2);
    // No diagnostics (a passive copper cable) reads 0 or 0xFFFF as its temperature; ethtool
    // takes that as "no monitors" too.
    let dom = p.u16(0, TEMPERATURE).is_some_and(|t| t != 0 && t != 0xFFFF);
    let tx_measured = dom && p.byte(0, DIAG_TYPE).is_some_and(|b| b & TX_POWER_MEASURED != 0);
    let (los, fault, lol) = (p.byte(0, LOS), p.byte(0, FAULT), p.byte(0, LOL));
    let lanes = (0..4)
        .map(|i| Lane {
            number: i + 1,
            rx_power_mw: p.u16(0, RX_POWER + 2 * i).map(power_mw).filter(|_| dom),
            tx_bias_ma: p.u16(0, TX_BIAS + 2 * i).map(bias_ma).filter(|_| dom),
            tx_power_mw: p.u16(0, TX_POWER + 2 * i).map(power_mw).filter(|_| tx_measured),
            rx_los: bit(los, i),
            tx_los: bit(los, 4 + i),
            tx_fault: bit(fault, i),
            rx_lol: bit(lol, i),
            tx_lol: bit(lol, 4 + i),
            rx_power_flags: lane_flags(p, RX_POWER_FLAGS, i),
            tx_bias_flags: lane_flags(p, TX_BIAS_FLAGS, i),
            tx_power_flags: lane_flags(p, TX_POWER_FLAGS, i),
        })
        .collect();
    // A flat memory has no page 03h: whatever a replay file says of it is not the module's.
    let t = THRESHOLDS;
    let paged = |th: Option<Thresholds>| th.filter(|_| !flat);
    Module {
        identifier: id,
        kind: MapKind::Sff8636,
        flat,
        temperature_c: p.i16(0, TEMPERATURE).map(temperature).filter(|_| dom),
        vcc_v: p.u16(0, VCC).map(volts).filter(|_| dom),
        temperature_thresholds: paged(thresholds(p, t, 128, |p, o| p.i16(THRESHOLDS, o).map(temperature))),
        vcc_thresholds_v: paged(thresholds(p, t, 144, |p, o| p.u16(THRESHOLDS, o).map(volts))),
        rx_power_thresholds_mw: paged(thresholds(p, t, 176, |p, o| p.u16(THRESHOLDS, o).map(power_mw))),
        tx_bias_thresholds_ma: paged(thresholds(p, t, 184, |p, o| p.u16(THRESHOLDS, o).map(bias_ma))),
        tx_power_thresholds_mw: paged(thresholds(p, t, 192, |p, o| p.u16(THRESHOLDS, o).map(power_mw))),
        temperature_flags: Flags::descending(p.byte(0, TEMPERATURE_FLAGS), 7),
        vcc_flags: Flags::descending(p.byte(0, VCC_FLAGS), 7),
        cmis_state: None,
        fault_cause: None,
        lanes,
    }
}
