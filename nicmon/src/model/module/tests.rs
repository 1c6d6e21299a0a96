//! Each field against the byte layout of SFF-8636 rev 2.10a and CMIS 5.2 (offsets as
//! ethtool's `qsfp.h` and `cmis.h` name them), on pages built byte by byte.
use proptest::prelude::*;

use super::*;

fn put16(page: &mut [u8], at: usize, v: u16) {
    page[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// A QSFP28 at 35.5 °C, 3.3 V, lanes' Rx power 0.5/0.6/0.7/0.8 mW, bias 7 mA, Tx 1 mW;
/// page 03h: temperature 75/-5/70/0 °C, Rx power 3.4/0.04/2.2/0.1 mW.
fn qsfp28() -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x11;
    put16(&mut p0, 22, (35.5 * 256.0) as u16);
    put16(&mut p0, 26, 33_000);
    for (i, rx) in [5000u16, 6000, 7000, 8000].into_iter().enumerate() {
        put16(&mut p0, 34 + 2 * i, rx);
        put16(&mut p0, 42 + 2 * i, 3500);
        put16(&mut p0, 50 + 2 * i, 10_000);
    }
    let mut p3 = vec![0u8; 128];
    for (i, t) in [75i16, -5, 70, 0].into_iter().enumerate() {
        put16(&mut p3, 2 * i, (t * 256) as u16);
    }
    for (i, w) in [34_000u16, 400, 22_000, 1000].into_iter().enumerate() {
        put16(&mut p3, 176 - 128 + 2 * i, w);
    }
    Pages([(0, p0), (3, p3)].into())
}

#[test]
fn sff8636_monitors_and_thresholds_decode_in_their_units() {
    let m = decode(&qsfp28()).unwrap();
    assert_eq!((m.type_name(), m.kind, m.lanes.len()), ("QSFP28", MapKind::Sff8636, 4));
    assert_eq!(m.temperature_c, Some(35.5));
    assert!((m.vcc_v.unwrap() - 3.3).abs() < 1e-9);
    let rx: Vec<f64> = m.lanes.iter().map(|l| l.rx_power_mw.unwrap()).collect();
    assert_eq!(rx, [0.5, 0.6, 0.7, 0.8]);
    assert!(m.lanes.iter().all(|l| (l.tx_bias_ma.unwrap() - 7.0).abs() < 1e-9 && l.tx_power_mw == Some(1.0)));
    let t = m.temperature_thresholds.unwrap();
    assert_eq!((t.high_alarm, t.low_alarm, t.high_warning, t.low_warning), (75.0, -5.0, 70.0, 0.0));
    let r = m.rx_power_thresholds_mw.unwrap();
    assert_eq!((r.high_alarm, r.low_alarm, r.high_warning, r.low_warning), (3.4, 0.04, 2.2, 0.1));
    assert!(!m.lanes.iter().any(|l| l.rx_los || l.tx_fault || l.tx_los) && !m.temperature_high_alarm);
}

#[test]
fn sff8636_latched_flags_name_their_lanes() {
    let mut pages = qsfp28();
    let p0 = pages.0.get_mut(&0).unwrap();
    p0[3] = 0b0010_0101; // Rx LOS lanes 1 and 3, Tx LOS lane 2
    p0[4] = 0b0000_1000; // Tx fault lane 4
    p0[5] = 0b0001_0010; // Rx LOL lane 2, Tx LOL lane 1
    p0[6] = 0x80; // temperature high alarm
    let m = decode(&pages).unwrap();
    let lanes = |f: fn(&Lane) -> bool| -> Vec<usize> {
        m.lanes.iter().enumerate().filter(|(_, l)| f(l)).map(|(i, _)| i + 1).collect()
    };
    assert_eq!(lanes(|l| l.rx_los), [1, 3]);
    assert_eq!(lanes(|l| l.tx_los), [2]);
    assert_eq!(lanes(|l| l.tx_fault), [4]);
    assert_eq!(lanes(|l| l.rx_lol), [2]);
    assert_eq!(lanes(|l| l.tx_lol), [1]);
    assert!(m.temperature_high_alarm);
}

#[test]
fn without_page_3_there_are_no_thresholds() {
    let mut pages = qsfp28();
    pages.0.remove(&3);
    let m = decode(&pages).unwrap();
    assert_eq!((m.temperature_thresholds, m.rx_power_thresholds_mw), (None, None));
    assert_eq!(m.lanes[0].rx_power_mw, Some(0.5), "the monitors are on page 0");
}

/// An OSFP in state Fault (cause 2), 4 of its 8 lanes in use; page 11h flags and monitors,
/// page 02h thresholds.
fn osfp() -> Pages {
    let mut p0 = vec![0u8; 256];
    p0[0] = 0x19;
    p0[3] = 5 << 1;
    p0[9] = 0x01;
    p0[41] = 2;
    put16(&mut p0, 14, (-2i16 * 256) as u16);
    put16(&mut p0, 16, 32_500);
    let mut p2 = vec![0u8; 128];
    for (i, w) in [50_000u16, 500, 40_000, 1500].into_iter().enumerate() {
        put16(&mut p2, 192 - 128 + 2 * i, w);
    }
    let mut p11 = vec![0u8; 128];
    p11[0] = 0x44; // lanes 1-2 activated
    p11[1] = 0x44; // lanes 3-4 activated
    p11[2] = 0x11; // lanes 5-6 deactivated
    p11[3] = 0x11; // lanes 7-8 deactivated
    p11[135 - 128] = 0b0000_0011; // Tx fault lanes 1-2
    p11[136 - 128] = 0b0000_0100; // Tx LOS lane 3
    p11[147 - 128] = 0b0000_1000; // Rx LOS lane 4
    p11[148 - 128] = 0b0000_0001; // Rx LOL lane 1
    for i in 0..8 {
        put16(&mut p11, 154 - 128 + 2 * i, 12_000);
        put16(&mut p11, 170 - 128 + 2 * i, 4000);
        put16(&mut p11, 186 - 128 + 2 * i, 1000 * (i as u16 + 1));
    }
    Pages([(0, p0), (2, p2), (0x11, p11)].into())
}

#[test]
fn cmis_state_flags_monitors_and_thresholds_decode() {
    let m = decode(&osfp()).unwrap();
    assert_eq!((m.type_name(), m.kind), ("OSFP", MapKind::Cmis));
    assert_eq!((m.cmis_state, m.in_fault(), m.fault_cause), (Some(5), true, Some(2)));
    assert_eq!(m.temperature_c, Some(-2.0));
    assert!((m.vcc_v.unwrap() - 3.25).abs() < 1e-9 && m.temperature_high_alarm);
    assert_eq!(m.lanes.len(), 4, "the deactivated lanes are not in use");
    let rx: Vec<f64> = m.lanes.iter().map(|l| l.rx_power_mw.unwrap()).collect();
    assert_eq!(rx, [0.1, 0.2, 0.3, 0.4]);
    assert!(m.lanes.iter().all(|l| l.tx_power_mw == Some(1.2) && (l.tx_bias_ma.unwrap() - 8.0).abs() < 1e-9));
    let flags: Vec<(bool, bool, bool, bool)> =
        m.lanes.iter().map(|l| (l.tx_fault, l.tx_los, l.rx_los, l.rx_lol)).collect();
    assert_eq!(
        flags,
        [
            (true, false, false, true),
            (true, false, false, false),
            (false, true, false, false),
            (false, false, true, false)
        ]
    );
    let r = m.rx_power_thresholds_mw.unwrap();
    assert_eq!((r.high_alarm, r.low_alarm, r.high_warning, r.low_warning), (5.0, 0.05, 4.0, 0.15));
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
    assert_eq!(serde_json::from_str::<Pages>(&text).unwrap(), pages);
    for bad in [r#"{"0":"00"}"#, r#"{"3":"zz"}"#, r#"{"256":""}"#, r#"{"x":""}"#, r#"{"0":"0"}"#] {
        assert!(serde_json::from_str::<Pages>(bad).is_err(), "{bad}");
    }
    let twice = format!(r#"{{"3":"{0}","3":"{0}"}}"#, "00".repeat(128));
    assert!(serde_json::from_str::<Pages>(&twice).unwrap_err().to_string().contains("given twice"));
}

proptest! {
    #[test]
    fn any_pages_decode_without_panicking(
        p0 in proptest::collection::vec(any::<u8>(), 0..300),
        p3 in proptest::collection::vec(any::<u8>(), 0..140),
        p11 in proptest::collection::vec(any::<u8>(), 0..140),
        id in prop_oneof![Just(0x0Du8), Just(0x11), Just(0x18), Just(0x19), any::<u8>()],
    ) {
        let mut p0 = p0;
        if let Some(b) = p0.first_mut() {
            *b = id;
        }
        let pages = Pages([(0, p0), (2, p3.clone()), (3, p3), (0x11, p11)].into());
        let _ = decode(&pages);
    }

    #[test]
    fn any_text_parses_or_fails_without_panicking(s in ".{0,300}") {
        let _ = serde_json::from_str::<Pages>(&s);
        let _ = serde_json::from_str::<Pages>(&format!("{{\"0\":{s:?}}}"));
    }
}
