//! CMIS 4.0/5.x (QSFP-DD 0x18, OSFP 0x19, QSFP+ CMIS 0x1E): lower page (state 3, module
//! flags 9, monitors 14–17, fault cause 41, the first application's lane counts 88), page
//! 01h (what the module implements), page 02h (thresholds 128–199) and page 11h (lane flags
//! 135–152, lane monitors 154–201), bank 0: lanes 1–8, bit `n−1` of each flag byte.
use super::{
    CmisState, Flags, Lane, MapKind, Module, Pages, Thresholds, bias_ma, bit, power_mw, temperature, thresholds, volts,
};

/// Lower page byte 2 bit 7: flat memory (no pages 01h, 02h, 11h: no diagnostics).
pub(super) const FLAT_MEMORY: u8 = 1 << 7;
/// Lower page: module state (bits 3–1), module flags (temperature bits 0–3, Vcc bits 4–7:
/// high alarm, low alarm, high warning, low warning), monitors, fault cause.
const STATE: usize = 3;
const MODULE_FLAGS: usize = 9;
const TEMPERATURE: usize = 14;
const VCC: usize = 16;
const FAULT_CAUSE: usize = 41;
/// The first application descriptor's lane counts: host lanes in bits 7–4, media lanes 3–0.
const FIRST_APP_LANES: usize = 88;
/// Page 01h: module monitors implemented (byte 159: temperature bit 0, Vcc bit 1); lane
/// monitors implemented (byte 160: Tx bias bit 0, Tx power bit 1, Rx power bit 2) and the
/// Tx bias multiplier (bits 4–3: ×1, ×2, ×4).
const ADVERTISING: u8 = 0x01;
const MODULE_MONITORS: usize = 159;
const LANE_MONITORS: usize = 160;
/// Page 02h thresholds: temperature 128, Vcc 136, Tx power 176, Tx bias 184, Rx power 192.
const THRESHOLDS: u8 = 0x02;
/// Page 11h lane flags and monitors.
const LANES: u8 = 0x11;
const TX_FAULT: usize = 135;
const TX_LOS: usize = 136;
const TX_LOL: usize = 137;
const TX_POWER_FLAGS: usize = 139;
const TX_BIAS_FLAGS: usize = 143;
const RX_LOS: usize = 147;
const RX_LOL: usize = 148;
const RX_POWER_FLAGS: usize = 149;
const TX_POWER: usize = 154;
const TX_BIAS: usize = 170;
const RX_POWER: usize = 186;

/// Lane `i`'s (from 0) flags of the four bytes at `at` (high alarm, low alarm, high
/// warning, low warning).
fn lane_flags(p: &Pages, at: usize, i: usize) -> Flags {
    let b = |k: usize| bit(p.byte(LANES, at + k), i);
    Flags { high_alarm: b(0), low_alarm: b(1), high_warning: b(2), low_warning: b(3) }
}

/// What page 01h says is implemented; everything, at ×1, when it was not read.
struct Implemented {
    temperature: bool,
    vcc: bool,
    tx_bias: bool,
    tx_power: bool,
    rx_power: bool,
    bias_multiplier: f64,
}

fn implemented(p: &Pages) -> Implemented {
    let (module, lane) = match p.has(ADVERTISING) {
        true => (p.byte(ADVERTISING, MODULE_MONITORS).unwrap_or(0), p.byte(ADVERTISING, LANE_MONITORS).unwrap_or(0)),
        false => (0xFF, 0x07),
    };
    Implemented {
        temperature: module & 1 != 0,
        vcc: module & 2 != 0,
        tx_bias: lane & 1 != 0,
        tx_power: lane & 2 != 0,
        rx_power: lane & 4 != 0,
        // CMIS 5.2 Table 8-79: the bias monitor "times the multiplier" of Table 8-47.
        bias_multiplier: match (lane >> 3) & 3 {
            1 => 2.0,
            2 => 4.0,
            _ => 1.0,
        },
    }
}

/// The media lanes of the module's first application (1–8), else 8.
fn media_lanes(p: &Pages) -> usize {
    p.byte(0, FIRST_APP_LANES).map(|b| usize::from(b & 0x0F)).filter(|n| (1..=8).contains(n)).unwrap_or(8)
}

fn lanes(p: &Pages, has: &Implemented) -> Vec<Lane> {
    if !p.has(LANES) {
        return Vec::new();
    }
    let bias = |raw: u16| bias_ma(raw) * has.bias_multiplier;
    (0..media_lanes(p))
        .map(|i| Lane {
            number: i + 1,
            tx_power_mw: p.u16(LANES, TX_POWER + 2 * i).map(power_mw).filter(|_| has.tx_power),
            tx_bias_ma: p.u16(LANES, TX_BIAS + 2 * i).map(bias).filter(|_| has.tx_bias),
            rx_power_mw: p.u16(LANES, RX_POWER + 2 * i).map(power_mw).filter(|_| has.rx_power),
            tx_fault: bit(p.byte(LANES, TX_FAULT), i),
            tx_los: bit(p.byte(LANES, TX_LOS), i),
            tx_lol: bit(p.byte(LANES, TX_LOL), i),
            rx_los: bit(p.byte(LANES, RX_LOS), i),
            rx_lol: bit(p.byte(LANES, RX_LOL), i),
            tx_power_flags: lane_flags(p, TX_POWER_FLAGS, i),
            tx_bias_flags: lane_flags(p, TX_BIAS_FLAGS, i),
            rx_power_flags: lane_flags(p, RX_POWER_FLAGS, i),
        })
        .collect()
}

pub(super) fn decode(p: &Pages, id: u8) -> Module {
    let flat = bit(p.byte(0, 2), 7);
    let state = p.byte(0, STATE).map(|b| CmisState::from_code((b >> 1) & 0x07));
    let has = implemented(p);
    let flags = p.byte(0, MODULE_FLAGS);
    let nibble = |top: usize| Flags {
        high_alarm: bit(flags, top),
        low_alarm: bit(flags, top + 1),
        high_warning: bit(flags, top + 2),
        low_warning: bit(flags, top + 3),
    };
    let m = has.bias_multiplier;
    // A flat memory has no diagnostics (ethtool shows none): its pages beyond 0 and its
    // monitor bytes are not the module's.
    let paged = |th: Option<Thresholds>| th.filter(|_| !flat);
    let t = THRESHOLDS;
    Module {
        identifier: id,
        kind: MapKind::Cmis,
        flat,
        temperature_c: p.i16(0, TEMPERATURE).map(temperature).filter(|_| !flat && has.temperature),
        vcc_v: p.u16(0, VCC).map(volts).filter(|_| !flat && has.vcc),
        temperature_thresholds: paged(thresholds(p, t, 128, |p, o| p.i16(THRESHOLDS, o).map(temperature))),
        vcc_thresholds_v: paged(thresholds(p, t, 136, |p, o| p.u16(THRESHOLDS, o).map(volts))),
        tx_power_thresholds_mw: paged(thresholds(p, t, 176, |p, o| p.u16(THRESHOLDS, o).map(power_mw))),
        tx_bias_thresholds_ma: paged(thresholds(p, t, 184, |p, o| p.u16(THRESHOLDS, o).map(|r| bias_ma(r) * m))),
        rx_power_thresholds_mw: paged(thresholds(p, t, 192, |p, o| p.u16(THRESHOLDS, o).map(power_mw))),
        temperature_flags: nibble(0),
        vcc_flags: nibble(4),
        cmis_state: state,
        fault_cause: (state == Some(CmisState::Fault)).then(|| p.byte(0, FAULT_CAUSE)).flatten(),
        lanes: if flat { Vec::new() } else { lanes(p, &has) },
    }
}
