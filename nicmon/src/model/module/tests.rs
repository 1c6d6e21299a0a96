//! Each field against the byte layout of SFF-8636 rev 2.10a and CMIS 5.2 (offsets as
//! ethtool's `qsfp.h`, `cmis.h` and `module-common.h` name them), on pages built byte by
//! byte; then pages other decoders have decoded (FBOSS's test pages and the values its own
//! decoder asserts for them; lower pages of real modules); then any bytes (proptest).
use proptest::prelude::*;

use super::*;

fn put16(page: &mut [u8], at: usize, v: u16) {
    page[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn put(page: &mut [u8], at: usize, bytes: &[u8]) {
    page[at..at + bytes.len()].copy_from_slice(bytes);
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn all_close(got: &[Option<f64>], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| g.is_some_and(|g| close(g, *w)))
}

fn th(t: Option<Thresholds>) -> [f64; 4] {
    let t = t.expect("thresholds");
    [t.high_alarm, t.low_alarm, t.high_warning, t.low_warning]
}

fn th_close(t: Option<Thresholds>, want: [f64; 4]) -> bool {
    th(t).iter().zip(want).all(|(g, w)| close(*g, w))
}

/// `lanes` of `m` as their numbers.
fn numbers(m: &Module, f: fn(&Lane) -> bool) -> Vec<usize> {
    m.lanes_where(f)
}

/// A QSFP28 at 35.5 °C, 3.3 V, lanes' Rx power 0.5/0.6/0.7/0.8 mW, bias 7 mA, Tx 1 mW (Tx
/// power measured: byte 220 bit 2); page 03h: temperature 75/-5/70/0 °C, Vcc 3.6/3.0/3.5/3.1 V,
/// Rx power 3.4/0.04/2.2/0.1 mW, Tx bias 15/2/12/4 mA, Tx power 2/0.2/1.5/0.3 mW.
fn qsfp28() -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x11;
    p0[220] = 0x0C;
    put16(&mut p0, 22, (35.5 * 256.0) as u16);
    put16(&mut p0, 26, 33_000);
    for (i, rx) in [5000u16, 6000, 7000, 8000].into_iter().enumerate() {
        put16(&mut p0, 34 + 2 * i, rx);
        put16(&mut p0, 42 + 2 * i, 3500);
        put16(&mut p0, 50 + 2 * i, 10_000);
    }
    let mut p3 = vec![0u8; 128];
    let block = |p3: &mut Vec<u8>, at: usize, v: [u16; 4]| {
        for (i, x) in v.into_iter().enumerate() {
            put16(p3, at - 128 + 2 * i, x);
        }
    };
    block(&mut p3, 128, [75 * 256, (-5i16 * 256) as u16, 70 * 256, 0]);
    block(&mut p3, 144, [36_000, 30_000, 35_000, 31_000]);
    block(&mut p3, 176, [34_000, 400, 22_000, 1000]);
    block(&mut p3, 184, [7500, 1000, 6000, 2000]);
    block(&mut p3, 192, [20_000, 2000, 15_000, 3000]);
    Pages([(0, p0), (3, p3)].into())
}

#[test]
fn sff8636_monitors_and_thresholds_decode_in_their_units() {
    let m = decode(&qsfp28()).unwrap();
    assert_eq!((m.type_name(), m.kind, m.lanes.len(), m.flat), ("QSFP28", MapKind::Sff8636, 4, false));
    assert_eq!(m.temperature_c, Some(35.5));
    assert!(close(m.vcc_v.unwrap(), 3.3));
    let rx: Vec<Option<f64>> = m.lanes.iter().map(|l| l.rx_power_mw).collect();
    assert!(all_close(&rx, &[0.5, 0.6, 0.7, 0.8]), "{rx:?}");
    assert!(m.lanes.iter().all(|l| close(l.tx_bias_ma.unwrap(), 7.0) && l.tx_power_mw == Some(1.0)));
    assert_eq!(m.lanes.iter().map(|l| l.number).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(th(m.temperature_thresholds), [75.0, -5.0, 70.0, 0.0]);
    assert!(th_close(m.vcc_thresholds_v, [3.6, 3.0, 3.5, 3.1]));
    assert!(th_close(m.rx_power_thresholds_mw, [3.4, 0.04, 2.2, 0.1]));
    assert!(th_close(m.tx_bias_thresholds_ma, [15.0, 2.0, 12.0, 4.0]));
    assert!(th_close(m.tx_power_thresholds_mw, [2.0, 0.2, 1.5, 0.3]));
    assert!(!m.lanes.iter().any(|l| l.rx_los || l.tx_fault || l.tx_los) && !m.temperature_flags.any());
    assert_eq!((m.cmis_state, m.fault_cause), (None, None));
}

#[test]
fn sff8636_latched_flags_name_their_lanes() {
    let mut pages = qsfp28();
    let p0 = pages.0.get_mut(&0).unwrap();
    p0[3] = 0b0010_0101; // Rx LOS lanes 1 and 3, Tx LOS lane 2
    p0[4] = 0b0000_1000; // Tx fault lane 4
    p0[5] = 0b0001_0010; // Rx LOL lane 2, Tx LOL lane 1
    p0[6] = 0b1010_0000; // temperature high alarm and high warning
    p0[7] = 0b0001_0000; // Vcc low warning
    p0[9] = 0b0000_0100; // lane 2 Rx power low alarm
    p0[10] = 0b0001_0000; // lane 3 Rx power low warning
    p0[12] = 0b0000_1000; // lane 4 Tx bias high alarm
    p0[13] = 0b0100_0000; // lane 1 Tx power low alarm
    let m = decode(&pages).unwrap();
    assert_eq!(numbers(&m, |l| l.rx_los), [1, 3]);
    assert_eq!(m.rx_los_lanes(), [1, 3]);
    assert_eq!(numbers(&m, |l| l.tx_los), [2]);
    assert_eq!(m.tx_fault_lanes(), [4]);
    assert_eq!(numbers(&m, |l| l.rx_lol), [2]);
    assert_eq!(numbers(&m, |l| l.tx_lol), [1]);
    assert_eq!(numbers(&m, |l| l.rx_power_flags.low_alarm), [2]);
    assert_eq!(numbers(&m, |l| l.rx_power_flags.low_warning), [3]);
    assert_eq!(numbers(&m, |l| l.tx_bias_flags.high_alarm), [4]);
    assert_eq!(numbers(&m, |l| l.tx_power_flags.low_alarm), [1]);
    let t = m.temperature_flags;
    assert!(t.high_alarm && t.high_warning && !t.low_alarm && !t.low_warning);
    assert_eq!(m.vcc_flags, Flags { low_warning: true, ..Flags::default() });
    assert!(!m.tx_fine());
}

#[test]
fn without_page_3_there_are_no_thresholds() {
    let mut pages = qsfp28();
    pages.0.remove(&3);
    let m = decode(&pages).unwrap();
    assert_eq!((m.temperature_thresholds, m.rx_power_thresholds_mw), (None, None));
    assert_eq!(m.lanes[0].rx_power_mw, Some(0.5), "the monitors are on page 0");
    assert!(m.rx_power_low_lanes().is_empty(), "no threshold, no low lane");
}

#[test]
fn sff8636_without_diagnostics_has_no_monitors() {
    // A passive copper cable: flat memory, temperature reads 0 (ethtool's test too).
    let mut pages = qsfp28();
    let p0 = pages.0.get_mut(&0).unwrap();
    p0[2] = 0x04;
    put16(p0, 22, 0);
    let m = decode(&pages).unwrap();
    assert!(m.flat);
    assert_eq!((m.temperature_c, m.vcc_v), (None, None));
    assert!(m.lanes.iter().all(|l| l.rx_power_mw.is_none() && l.tx_bias_ma.is_none() && l.tx_power_mw.is_none()));
    assert_eq!(m.rx_power_thresholds_mw, None, "a flat memory has no page 03h, whatever the file says");
    assert!(m.rx_power_below(0.1).is_empty(), "no reading is not 0 mW");
    // Tx power not measured (byte 220 bit 2 clear): unknown, the others read.
    let mut pages = qsfp28();
    pages.0.get_mut(&0).unwrap()[220] = 0x08;
    let m = decode(&pages).unwrap();
    assert!(m.lanes.iter().all(|l| l.tx_power_mw.is_none() && l.rx_power_mw.is_some()));
    // Thresholds never programmed (all zero): none.
    let mut pages = qsfp28();
    pages.0.get_mut(&3).unwrap()[176 - 128..184 - 128].fill(0);
    assert_eq!(decode(&pages).unwrap().rx_power_thresholds_mw, None);
}

/// An OSFP in state Fault (cause 2) whose first application uses 4 media lanes; page 01h:
/// every monitor, Tx bias ×2; page 11h flags and monitors; page 02h thresholds.
fn osfp() -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x19;
    p0[3] = 5 << 1;
    p0[9] = 0b0100_0001; // temperature high alarm; Vcc high warning
    p0[41] = 2;
    p0[88] = 0x84; // 8 host lanes, 4 media lanes
    put16(&mut p0, 14, (-2i16 * 256) as u16);
    put16(&mut p0, 16, 32_500);
    let mut p1 = vec![0u8; 128];
    p1[159 - 128] = 0x03;
    p1[160 - 128] = 0x07 | (1 << 3);
    let mut p2 = vec![0u8; 128];
    for (i, t) in [80i16, -5, 75, 0].into_iter().enumerate() {
        put16(&mut p2, 2 * i, (t * 256) as u16);
    }
    for (i, v) in [36_000u16, 30_000, 35_000, 31_000].into_iter().enumerate() {
        put16(&mut p2, 136 - 128 + 2 * i, v);
    }
    for (i, w) in [30_000u16, 1000, 25_000, 2000].into_iter().enumerate() {
        put16(&mut p2, 176 - 128 + 2 * i, w);
    }
    for (i, b) in [6000u16, 500, 5000, 1000].into_iter().enumerate() {
        put16(&mut p2, 184 - 128 + 2 * i, b);
    }
    for (i, w) in [50_000u16, 500, 40_000, 1500].into_iter().enumerate() {
        put16(&mut p2, 192 - 128 + 2 * i, w);
    }
    let mut p11 = vec![0u8; 128];
    p11[135 - 128] = 0b0000_0011; // Tx fault lanes 1-2
    p11[136 - 128] = 0b0000_0100; // Tx LOS lane 3
    p11[137 - 128] = 0b0000_0010; // Tx LOL lane 2
    p11[140 - 128] = 0b0000_1000; // Tx power low alarm lane 4
    p11[146 - 128] = 0b0000_0001; // Tx bias low warning lane 1
    p11[147 - 128] = 0b0000_1000; // Rx LOS lane 4
    p11[148 - 128] = 0b0000_0001; // Rx LOL lane 1
    p11[152 - 128] = 0b0000_0110; // Rx power low warning lanes 2-3
    for i in 0..8 {
        put16(&mut p11, 154 - 128 + 2 * i, 12_000);
        put16(&mut p11, 170 - 128 + 2 * i, 2000);
        put16(&mut p11, 186 - 128 + 2 * i, 1000 * (i as u16 + 1));
    }
    Pages([(0, p0), (1, p1), (2, p2), (0x11, p11)].into())
}

#[test]
fn cmis_state_flags_monitors_and_thresholds_decode() {
    let m = decode(&osfp()).unwrap();
    assert_eq!((m.type_name(), m.kind), ("OSFP", MapKind::Cmis));
    assert_eq!((m.cmis_state, m.in_fault(), m.fault_cause), (Some(CmisState::Fault), true, Some(2)));
    assert_eq!(m.fault_cause_text().as_deref(), Some("data memory corrupted"));
    assert_eq!(m.cmis_state.unwrap().name(), "ModuleFault");
    assert_eq!(m.temperature_c, Some(-2.0));
    assert!(close(m.vcc_v.unwrap(), 3.25));
    assert!(m.temperature_flags.high_alarm && !m.temperature_flags.high_warning);
    assert!(m.vcc_flags.high_warning && !m.vcc_flags.high_alarm);
    assert_eq!(
        m.lanes.iter().map(|l| l.number).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "the first application's media lanes"
    );
    let rx: Vec<Option<f64>> = m.lanes.iter().map(|l| l.rx_power_mw).collect();
    assert!(all_close(&rx, &[0.1, 0.2, 0.3, 0.4]));
    // Bias: 2000 × 2 µA × 2 (page 01h's multiplier) = 8 mA.
    assert!(m.lanes.iter().all(|l| l.tx_power_mw == Some(1.2) && close(l.tx_bias_ma.unwrap(), 8.0)));
    let flags: Vec<(bool, bool, bool, bool, bool)> =
        m.lanes.iter().map(|l| (l.tx_fault, l.tx_los, l.tx_lol, l.rx_los, l.rx_lol)).collect();
    assert_eq!(
        flags,
        [
            (true, false, false, false, true),
            (true, false, true, false, false),
            (false, true, false, false, false),
            (false, false, false, true, false)
        ]
    );
    assert_eq!(numbers(&m, |l| l.tx_power_flags.low_alarm), [4]);
    assert_eq!(numbers(&m, |l| l.tx_bias_flags.low_warning), [1]);
    assert_eq!(numbers(&m, |l| l.rx_power_flags.low_warning), [2, 3]);
    assert_eq!(th(m.temperature_thresholds), [80.0, -5.0, 75.0, 0.0]);
    assert!(th_close(m.vcc_thresholds_v, [3.6, 3.0, 3.5, 3.1]));
    assert!(th_close(m.tx_power_thresholds_mw, [3.0, 0.1, 2.5, 0.2]));
    assert!(th_close(m.tx_bias_thresholds_ma, [24.0, 2.0, 20.0, 4.0]), "{:?}", m.tx_bias_thresholds_ma);
    assert!(th_close(m.rx_power_thresholds_mw, [5.0, 0.05, 4.0, 0.15]));
}

#[test]
fn cmis_page_01h_says_what_is_implemented() {
    // Rx power not implemented (byte 160 bit 2 clear), no temperature monitor (159 bit 0).
    let mut pages = osfp();
    let p1 = pages.0.get_mut(&1).unwrap();
    p1[159 - 128] = 0x02;
    p1[160 - 128] = 0x03;
    let m = decode(&pages).unwrap();
    assert!(m.lanes.iter().all(|l| l.rx_power_mw.is_none() && l.tx_power_mw.is_some()));
    assert!(close(m.lanes[0].tx_bias_ma.unwrap(), 4.0), "×1 without the multiplier bits");
    assert_eq!(m.temperature_c, None);
    assert!(m.vcc_v.is_some());
    // Page 01h not read: everything is taken to be there, at ×1.
    let mut pages = osfp();
    pages.0.remove(&1);
    let m = decode(&pages).unwrap();
    assert!(m.lanes.iter().all(|l| l.rx_power_mw.is_some() && close(l.tx_bias_ma.unwrap(), 4.0)));
    // No application advertised: the 8 lanes of bank 0.
    let mut pages = osfp();
    pages.0.get_mut(&0).unwrap()[88] = 0;
    assert_eq!(decode(&pages).unwrap().lanes.len(), 8);
    // Flat memory (a passive copper cable): no diagnostics at all.
    let mut pages = osfp();
    pages.0.get_mut(&0).unwrap()[2] = 0x80;
    let m = decode(&pages).unwrap();
    assert!(m.flat && m.lanes.is_empty() && m.temperature_c.is_none() && m.rx_power_thresholds_mw.is_none());
    // Not in Fault: no fault cause, whatever byte 41 holds.
    let mut pages = osfp();
    pages.0.get_mut(&0).unwrap()[3] = 3 << 1;
    let m = decode(&pages).unwrap();
    assert_eq!((m.cmis_state, m.fault_cause, m.fault_cause_text()), (Some(CmisState::Ready), None, None));
}

#[test]
fn questions_a_decider_asks() {
    let m = decode(&osfp()).unwrap();
    // Rx power 0.1..0.4 mW against low warning 0.15 and low alarm 0.05.
    assert_eq!(m.rx_power_low_lanes(), [1]);
    assert!(m.rx_power_below_low_alarm().is_empty());
    assert_eq!(m.rx_power_below(0.25), [1, 2]);
    assert_eq!(m.worst_rx_lane().map(|l| l.number), Some(1));
    assert!(!m.tx_fine(), "Tx fault on lanes 1-2");
    assert!(m.temperature_over_high_warning() && m.temperature_over_high_alarm(), "latched high alarm");
    let q = decode(&qsfp28()).unwrap();
    assert!(q.tx_fine() && q.rx_power_low_lanes().is_empty() && !q.temperature_over_high_warning());
    assert_eq!(q.worst_rx_lane().map(|l| l.number), Some(1));
    // Over the high warning by its reading alone (no flag): 72 °C against 70.
    let mut hot = qsfp28();
    put16(hot.0.get_mut(&0).unwrap(), 22, 72 * 256);
    let h = decode(&hot).unwrap();
    assert!(h.temperature_over_high_warning() && !h.temperature_over_high_alarm());
    assert_eq!(dbm(Some(1.0)), Some(0.0));
    assert!(close(dbm(Some(0.5)).unwrap(), -3.010299956639812));
    assert_eq!((dbm(Some(0.0)), dbm(None)), (None, None));
}

#[test]
fn the_pages_to_read_follow_page_0() {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x11;
    assert_eq!(pages_to_read(&p0), [3]);
    p0[2] = 0x04;
    assert!(pages_to_read(&p0).is_empty(), "SFF-8636 flat memory");
    p0[0] = 0x18;
    p0[2] = 0;
    assert_eq!(pages_to_read(&p0), [1, 2, 0x11]);
    p0[2] = 0x80;
    assert!(pages_to_read(&p0).is_empty(), "CMIS flat memory");
    p0[0] = 0x03;
    assert!(pages_to_read(&p0).is_empty(), "an SFP is not decoded here");
    assert!(pages_to_read(&[]).is_empty());
}

/// FBOSS's SFF-8636 CWDM4 test pages (`fboss/qsfp_service/module/tests/FakeTransceiverImpl.cpp`,
/// `kSffPageLower`, `kSffPage0`, `kSffPage3`: made-up bytes, not a real module's), the bytes
/// that matter set at their offsets, and the values FBOSS's own decoder asserts for them
/// (`SffTest.cpp`, `cwdm4TransceiverInfoTest`): an independent reading of the same layout.
fn fboss_sff() -> Pages {
    let mut p0 = vec![0u8; 256];
    put(&mut p0, 0, &[0x0d, 0x00, 0x02, 0xab, 0xbc, 0xcd, 0xc0, 0x30, 0x00, 0xc5, 0xf3, 0xc5, 0x3c, 0xc5, 0x03]);
    put(&mut p0, 22, &[0x1f, 0x04, 0x00, 0x00, 0x80, 0xdd]);
    let lanes = [
        0x12, 0x23, 0x23, 0x34, 0x13, 0x31, 0x12, 0x12, 0x14, 0x14, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x41, 0x41,
        0x42, 0x42, 0x43, 0x43, 0x44, 0x44,
    ];
    put(&mut p0, 34, &lanes);
    p0[220] = 0x0a;
    let mut p3 = vec![0u8; 128];
    put(&mut p3, 0, &[0x4b, 0x00, 0xfb, 0x00, 0x46, 0x00, 0x00, 0x00]);
    put(&mut p3, 16, &[0x94, 0x70, 0x6e, 0xf0, 0x86, 0xc4, 0x7b, 0x0c]);
    let lane_thresholds = [
        0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x11, 0x12, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x11, 0x22,
        0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
    ];
    put(&mut p3, 48, &lane_thresholds);
    Pages([(0, p0), (3, p3)].into())
}

#[test]
fn fboss_sff_pages_decode_as_fboss_decodes_them() {
    let m = decode(&fboss_sff()).unwrap();
    assert_eq!(m.type_name(), "QSFP+");
    assert!(close(m.temperature_c.unwrap(), 31.015625) && close(m.vcc_v.unwrap(), 3.2989));
    let get = |f: fn(&Lane) -> Option<f64>| m.lanes.iter().map(f).collect::<Vec<_>>();
    assert!(all_close(&get(|l| l.tx_bias_ma), &[10.28, 8.738, 17.476, 26.214]));
    assert!(all_close(&get(|l| l.rx_power_mw), &[0.4643, 0.9012, 0.4913, 0.4626]));
    // Byte 220 = 0x0a: Tx power not measured, so nicmon says unknown where FBOSS reads the
    // bytes anyway; with the bit set, the same values as FBOSS's.
    assert!(get(|l| l.tx_power_mw).iter().all(Option::is_none));
    let mut measured = fboss_sff();
    measured.0.get_mut(&0).unwrap()[220] |= 0x04;
    let tx: Vec<Option<f64>> = decode(&measured).unwrap().lanes.iter().map(|l| l.tx_power_mw).collect();
    assert!(all_close(&tx, &[1.6705, 1.6962, 1.7219, 1.7476]));
    let flags = |f: fn(&Lane) -> bool| m.lanes.iter().map(f).collect::<Vec<bool>>();
    assert_eq!(flags(|l| l.tx_los), [false, true, false, true]);
    assert_eq!(flags(|l| l.rx_los), [true, true, false, true]);
    assert_eq!(flags(|l| l.tx_lol), [false, false, true, true]);
    assert_eq!(flags(|l| l.rx_lol), [true, false, true, true]);
    assert_eq!(flags(|l| l.tx_fault), [false, false, true, true]);
    assert_eq!(flags(|l| l.tx_power_flags.high_alarm), [true, false, false, false]);
    assert_eq!(flags(|l| l.tx_power_flags.low_alarm), [true, true, false, false]);
    assert_eq!(flags(|l| l.tx_power_flags.high_warning), [false, false, false, true]);
    assert_eq!(flags(|l| l.tx_power_flags.low_warning), [false, true, false, true]);
    assert_eq!(flags(|l| l.rx_power_flags.high_alarm), [true, false, true, false]);
    assert_eq!(flags(|l| l.rx_power_flags.low_alarm), [true, true, true, false]);
    assert_eq!(flags(|l| l.rx_power_flags.high_warning), [false, false, true, true]);
    assert_eq!(flags(|l| l.rx_power_flags.low_warning), [false, true, true, true]);
    assert_eq!(flags(|l| l.tx_bias_flags.high_alarm), [true, false, false, true]);
    assert_eq!(flags(|l| l.tx_bias_flags.low_alarm), [true, true, false, true]);
    assert_eq!(flags(|l| l.tx_bias_flags.high_warning), [false, false, true, false]);
    assert_eq!(flags(|l| l.tx_bias_flags.low_warning), [false, true, true, false]);
    let f = |x: Flags| [x.high_alarm, x.low_alarm, x.high_warning, x.low_warning];
    assert_eq!(f(m.temperature_flags), [true, true, false, false]);
    assert_eq!(f(m.vcc_flags), [false, false, true, true]);
    assert_eq!(th(m.temperature_thresholds), [75.0, -5.0, 70.0, 0.0]);
    assert!(th_close(m.vcc_thresholds_v, [3.80, 2.84, 3.45, 3.15]));
    assert!(th_close(m.rx_power_thresholds_mw, [0.6683, 0.7197, 0.7711, 0.437]));
    assert!(th_close(m.tx_power_thresholds_mw, [0.4386, 1.3124, 2.1862, 3.06]));
    assert!(th_close(m.tx_bias_thresholds_ma, [0.034, 17.51, 34.986, 52.462]));
}

/// FBOSS's CMIS 200G test pages (the same file: `kCmisPageLower`, `kCmisPage1`, `kCmisPage2`,
/// `kCmisPage11`), the bytes that matter at their offsets; the values FBOSS's decoder asserts
/// (`CmisTest.cpp`, `transceiverInfoTest`).
fn fboss_cmis() -> Pages {
    let mut p0 = vec![0u8; 256];
    put(&mut p0, 0, &[0x1e, 0x40, 0x00, 0x07]);
    p0[9] = 0x5b;
    put(&mut p0, 14, &[0x28, 0x45, 0x80, 0xfc]);
    p0[88] = 0x44;
    let mut p1 = vec![0u8; 128];
    put(&mut p1, 151 - 128, &[0x38]);
    put(&mut p1, 159 - 128, &[0x03, 0x07]);
    let mut p2 = vec![0u8; 128];
    put(&mut p2, 0, &[0x46, 0x00, 0x0a, 0x00, 0x46, 0x00, 0x0a, 0x00, 0x8b, 0x42, 0x76, 0x8e, 0x8b, 0x42, 0x76, 0x8e]);
    let lane_thresholds = [
        0xb6, 0xb6, 0x07, 0x71, 0xb6, 0xb6, 0x07, 0x71, 0x92, 0x7c, 0x1d, 0x4c, 0x92, 0x7c, 0x1d, 0x4c, 0xb6, 0xb6,
        0x00, 0x01, 0xb6, 0xb6, 0x00, 0x01,
    ];
    put(&mut p2, 48, &lane_thresholds);
    let mut p11 = vec![0u8; 128];
    put(&mut p11, 0, &[0x24, 0x35]);
    let lane_flags =
        [0x0a, 0x0b, 0x0c, 0x0d, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x05, 0x06, 0x0a, 0x0b, 0x0c, 0x0d];
    put(&mut p11, 135 - 128, &lane_flags);
    put(&mut p11, 154 - 128, &[0x53, 0x34, 0x51, 0x0c, 0x50, 0x20, 0x52, 0x23]);
    put(&mut p11, 170 - 128, &[0x5e, 0x9d, 0x61, 0xd1, 0x68, 0x86, 0x61, 0xb6]);
    put(&mut p11, 186 - 128, &[0x0f, 0xc0, 0x0f, 0x81, 0x16, 0xb4, 0x14, 0x38]);
    Pages([(0, p0), (1, p1), (2, p2), (0x11, p11)].into())
}

#[test]
fn fboss_cmis_pages_decode_as_fboss_decodes_them() {
    let m = decode(&fboss_cmis()).unwrap();
    assert_eq!((m.type_name(), m.cmis_state, m.lanes.len()), ("QSFP+CMIS", Some(CmisState::Ready), 4));
    assert!(close(m.temperature_c.unwrap(), 40.26953125) && close(m.vcc_v.unwrap(), 3.3020));
    let get = |f: fn(&Lane) -> Option<f64>| m.lanes.iter().map(f).collect::<Vec<_>>();
    assert!(all_close(&get(|l| l.tx_bias_ma), &[48.442, 50.082, 53.516, 50.028]));
    assert!(all_close(&get(|l| l.tx_power_mw), &[2.13, 2.0748, 2.0512, 2.1027]));
    assert!(all_close(&get(|l| l.rx_power_mw), &[0.4032, 0.3969, 0.5812, 0.5176]));
    let flags = |f: fn(&Lane) -> bool| m.lanes.iter().map(f).collect::<Vec<bool>>();
    assert_eq!(flags(|l| l.tx_los), [true, true, false, true]);
    assert_eq!(flags(|l| l.rx_los), [true, false, true, false]);
    assert_eq!(flags(|l| l.tx_lol), [false, false, true, true]);
    assert_eq!(flags(|l| l.rx_lol), [false, true, true, false]);
    assert_eq!(flags(|l| l.tx_fault), [false, true, false, true]);
    assert_eq!(flags(|l| l.tx_power_flags.high_alarm), [false, true, false, false]);
    assert_eq!(flags(|l| l.tx_power_flags.high_warning), [false, false, true, false]);
    assert_eq!(flags(|l| l.tx_power_flags.low_alarm), [true, true, false, false]);
    assert_eq!(flags(|l| l.tx_power_flags.low_warning), [true, false, true, false]);
    assert_eq!(flags(|l| l.rx_power_flags.high_alarm), [false, true, false, true]);
    assert_eq!(flags(|l| l.rx_power_flags.high_warning), [false, false, true, true]);
    assert_eq!(flags(|l| l.rx_power_flags.low_alarm), [true, true, false, true]);
    assert_eq!(flags(|l| l.rx_power_flags.low_warning), [true, false, true, true]);
    assert_eq!(flags(|l| l.tx_bias_flags.high_alarm), [false, true, true, false]);
    assert_eq!(flags(|l| l.tx_bias_flags.high_warning), [false, false, false, true]);
    assert_eq!(flags(|l| l.tx_bias_flags.low_alarm), [true, true, true, false]);
    assert_eq!(flags(|l| l.tx_bias_flags.low_warning), [true, false, false, true]);
    let f = |x: Flags| [x.high_alarm, x.low_alarm, x.high_warning, x.low_warning];
    assert_eq!(f(m.temperature_flags), [true, true, false, true]);
    assert_eq!(f(m.vcc_flags), [true, false, true, false]);
    // Thresholds (FBOSS does not assert these for this module): by hand from the bytes.
    assert_eq!(th(m.temperature_thresholds), [70.0, 10.0, 70.0, 10.0]);
    assert!(th_close(m.vcc_thresholds_v, [3.565, 3.035, 3.565, 3.035]));
    assert!(th_close(m.tx_power_thresholds_mw, [4.6774, 0.1905, 4.6774, 0.1905]));
    assert!(th_close(m.tx_bias_thresholds_ma, [75.0, 15.0, 75.0, 15.0]));
    assert!(th_close(m.rx_power_thresholds_mw, [4.6774, 0.0001, 4.6774, 0.0001]));
}

/// Lower memory of a QSFP28 as FBOSS's `fboss2 show transceiver eeprom` prints it in its
/// sample output (`fboss/cli/fboss2/commands/show/transceiver/eeprom/CmdShowTransceiverEeprom.cpp`,
/// `sampleModel`), the monitor bytes at their offsets; decoded here by hand.
#[test]
fn a_qsfp28_lower_page_from_fboss2_decodes() {
    let mut p0 = vec![0u8; 256];
    put(&mut p0, 0, &[0x11, 0x07, 0x02]);
    put(&mut p0, 22, &[0x2a, 0xb6, 0x00, 0x00, 0x82, 0x55]);
    let lanes = [
        0x21, 0x7c, 0x26, 0x37, 0x1d, 0xaf, 0x1d, 0x67, 0x5c, 0x21, 0x5c, 0x21, 0x5c, 0x21, 0x5c, 0x21, 0x1d, 0x73,
        0x1c, 0x02, 0x21, 0x80, 0x23, 0xc2,
    ];
    put(&mut p0, 34, &lanes);
    let m = decode(&Pages([(0, p0)].into())).unwrap();
    assert!(close(m.temperature_c.unwrap(), 42.7109375) && close(m.vcc_v.unwrap(), 3.3365));
    let rx: Vec<Option<f64>> = m.lanes.iter().map(|l| l.rx_power_mw).collect();
    assert!(all_close(&rx, &[0.8572, 0.9783, 0.7599, 0.7527]));
    assert!(m.lanes.iter().all(|l| close(l.tx_bias_ma.unwrap(), 47.17)));
    assert!(m.lanes.iter().all(|l| l.tx_power_mw.is_none()), "upper page 00h not given: Tx power not advertised");
    assert!(m.tx_fine() && m.rx_los_lanes().is_empty() && m.temperature_thresholds.is_none());
}

/// The lower memory of a real QSFP28 (an mlx5 port, `ethtool -m ens1f1` hex output posted
/// to netdev on 2024-05-16, "ethtool module info only reports hex info"): 29.05 °C, 3.3157 V,
/// no light on any lane.
#[test]
fn a_real_qsfp28_lower_page_from_netdev_decodes() {
    let dump = ["11 07 00 00 00 00 00 00 00 00 00 00 00 00 00 00", "00 00 00 00 00 00 1d 0e 00 00 81 85 00 00 00 00"];
    let mut p0 = unhex(&dump.concat().replace(' ', "")).unwrap();
    p0.resize(256, 0);
    let m = decode(&Pages([(0, p0)].into())).unwrap();
    assert_eq!(m.type_name(), "QSFP28");
    assert!(close(m.temperature_c.unwrap(), 29.0546875) && close(m.vcc_v.unwrap(), 3.3157));
    assert!(m.lanes.iter().all(|l| l.rx_power_mw == Some(0.0)));
    assert_eq!(m.rx_power_below(0.01), [1, 2, 3, 4]);
}

#[test]
fn a_module_not_decoded_here_or_without_page_0_is_none() {
    let mut sfp = vec![0u8; 256];
    sfp[0] = 0x03; // SFP: SFF-8472, not decoded
    assert_eq!(decode(&Pages([(0, sfp)].into())), None);
    assert_eq!(decode(&Pages::default()), None);
}

#[test]
fn pages_round_trip_as_hex_and_bad_pages_are_refused() {
    let pages = osfp();
    let text = serde_json::to_string(&pages).unwrap();
    assert!(text.starts_with("{\"0\":\"1900"), "{}", &text[..20]);
    assert!(text.contains("\"17\":"), "page 11h is \"17\": {text}");
    assert_eq!(serde_json::from_str::<Pages>(&text).unwrap(), pages);
    for bad in [r#"{"0":"00"}"#, r#"{"3":"zz"}"#, r#"{"256":""}"#, r#"{"x":""}"#, r#"{"0":"0"}"#, r#"{"0":"é"}"#] {
        assert!(serde_json::from_str::<Pages>(bad).is_err(), "{bad}");
    }
    let twice = format!(r#"{{"3":"{0}","3":"{0}"}}"#, "00".repeat(128));
    assert!(serde_json::from_str::<Pages>(&twice).unwrap_err().to_string().contains("given twice"));
}

proptest! {
    #[test]
    fn any_pages_decode_without_panicking(
        p0 in proptest::collection::vec(any::<u8>(), 0..300),
        p1 in proptest::collection::vec(any::<u8>(), 0..140),
        p3 in proptest::collection::vec(any::<u8>(), 0..140),
        p11 in proptest::collection::vec(any::<u8>(), 0..140),
        id in prop_oneof![Just(0x0Du8), Just(0x11), Just(0x18), Just(0x19), Just(0x1E), any::<u8>()],
        which in proptest::collection::vec(any::<bool>(), 4),
    ) {
        let mut p0 = p0;
        if let Some(b) = p0.first_mut() {
            *b = id;
        }
        let _ = pages_to_read(&p0);
        let mut pages = Pages([(0, p0)].into());
        for (on, (n, p)) in which.iter().zip([(1u8, p1), (2, p3.clone()), (3, p3), (0x11, p11)]) {
            if *on {
                pages.0.insert(n, p);
            }
        }
        if let Some(m) = decode(&pages) {
            prop_assert!(m.lanes.len() <= 8);
            let _ = (m.worst_rx_lane(), m.rx_power_low_lanes(), m.tx_fine(), m.temperature_over_high_warning());
            for l in &m.lanes {
                let _ = dbm(l.rx_power_mw);
            }
        }
    }

    #[test]
    fn any_text_parses_or_fails_without_panicking(s in ".{0,300}") {
        let _ = serde_json::from_str::<Pages>(&s);
        let _ = serde_json::from_str::<Pages>(&format!("{{\"0\":{s:?}}}"));
    }
}
