//! A port's transceiver as its management memory says (SPEC §1.13): the pages read through
//! ethtool netlink (`ETHTOOL_MSG_MODULE_EEPROM_GET`) or from a replay file, and their
//! decoding for SFF-8636 (QSFP+/QSFP28/QSFP56) and CMIS 4/5 (QSFP-DD, OSFP, QSFP+ CMIS).
//!
//! Pages: `0` is 256 bytes (lower memory 0–127, then upper page 00h); every other page is its
//! upper half, offsets 128–255, bank 0 — so an offset `o` ≥ 128 of page `p` is
//! `pages[p][o - 128]`. Offsets and units follow SFF-8636 rev 2.10a §6.2 (lower page 00h:
//! flags 3–6, monitors 22–57; page 03h: thresholds 128–199) and CMIS 5.2 §8.2 (lower page:
//! state 3, module flags 9, monitors 14–17, fault cause 41; page 02h: thresholds 128–199;
//! page 11h: lane flags 135–148, lane monitors 154–201), as ethtool's `qsfp.h`/`cmis.h` name
//! them. Pure: no I/O, never panics on any bytes.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The module's pages by number, as read (bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pages(pub BTreeMap<u8, Vec<u8>>);

/// Length of page `p` in a replay file: page 0 whole, the others their upper half.
pub fn page_len(p: u8) -> usize {
    if p == 0 { 256 } else { 128 }
}

impl Pages {
    /// Byte `offset` of page `page` (`offset` < 128: the lower memory, page 0's first half).
    fn byte(&self, page: u8, offset: usize) -> Option<u8> {
        if offset < 128 {
            return self.0.get(&0)?.get(offset).copied();
        }
        let p = self.0.get(&page)?;
        let at = if page == 0 { offset } else { offset - 128 };
        p.get(at).copied()
    }

    fn u16(&self, page: u8, offset: usize) -> Option<u16> {
        Some(u16::from_be_bytes([self.byte(page, offset)?, self.byte(page, offset + 1)?]))
    }

    fn i16(&self, page: u8, offset: usize) -> Option<i16> {
        self.u16(page, offset).map(|v| v as i16)
    }
}

/// The hex text of the pages, as the replay file writes them.
impl Serialize for Pages {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (p, bytes) in &self.0 {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            m.serialize_entry(&p.to_string(), &hex)?;
        }
        m.end()
    }
}

/// Pages from their hex text: a page number 0–255, even-length hex of the page's length; a
/// page given twice, a bad number, bad hex or a wrong length is an error (the file is refused).
impl<'de> Deserialize<'de> for Pages {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Pages, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Pages;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of page numbers to hex bytes")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Pages, A::Error> {
                use serde::de::Error;
                let mut out = BTreeMap::new();
                while let Some((page, hex)) = map.next_entry::<String, String>()? {
                    let p: u8 = page.parse().map_err(|_| A::Error::custom(format!("page {page:?}: not 0-255")))?;
                    let bytes = unhex(&hex).ok_or_else(|| A::Error::custom(format!("page {p}: not hex")))?;
                    if bytes.len() != page_len(p) {
                        let want = page_len(p);
                        return Err(A::Error::custom(format!("page {p}: {} bytes, want {want}", bytes.len())));
                    }
                    if out.insert(p, bytes).is_some() {
                        return Err(A::Error::custom(format!("page {p} given twice")));
                    }
                }
                Ok(Pages(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// What kind of memory map the module has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// SFF-8636: 4 lanes.
    Sff8636,
    /// CMIS: up to 8 lanes on page 11h.
    Cmis,
}

/// Low/high alarm and warning thresholds of one monitor, in its unit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Thresholds {
    pub high_alarm: f64,
    pub low_alarm: f64,
    pub high_warning: f64,
    pub low_warning: f64,
}

/// One lane's monitors and latched flags.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Lane {
    /// Receive and transmit optical power, mW; Tx bias, mA.
    pub rx_power_mw: Option<f64>,
    pub tx_power_mw: Option<f64>,
    pub tx_bias_ma: Option<f64>,
    pub rx_los: bool,
    pub tx_los: bool,
    pub tx_fault: bool,
    pub rx_lol: bool,
    pub tx_lol: bool,
}

/// A decoded module.
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    /// SFF-8024 identifier (byte 0).
    pub identifier: u8,
    pub kind: MapKind,
    /// Module temperature, °C; supply voltage, V.
    pub temperature_c: Option<f64>,
    pub vcc_v: Option<f64>,
    /// The module's own thresholds (page 03h / 02h), when that page was read.
    pub temperature_thresholds: Option<Thresholds>,
    pub rx_power_thresholds_mw: Option<Thresholds>,
    /// Latched temperature high alarm.
    pub temperature_high_alarm: bool,
    /// CMIS module state (1 LowPwr, 2 PwrUp, 3 Ready, 4 PwrDn, 5 Fault); `None` for SFF-8636.
    pub cmis_state: Option<u8>,
    /// CMIS module fault cause (byte 41) when the state is Fault.
    pub fault_cause: Option<u8>,
    pub lanes: Vec<Lane>,
}

impl Module {
    /// The module's type as people call it (`QSFP28`, `OSFP`, ...).
    pub fn type_name(&self) -> &'static str {
        match self.identifier {
            0x0C => "QSFP",
            0x0D => "QSFP+",
            0x11 => "QSFP28",
            0x18 => "QSFP-DD",
            0x19 => "OSFP",
            0x1E => "QSFP+ CMIS",
            _ => "module",
        }
    }

    /// CMIS module state Fault.
    pub fn in_fault(&self) -> bool {
        self.cmis_state == Some(5)
    }
}

/// 0.1 µW units → mW.
fn power_mw(raw: u16) -> f64 {
    f64::from(raw) / 10_000.0
}

/// 2 µA units → mA.
fn bias_ma(raw: u16) -> f64 {
    f64::from(raw) * 0.002
}

/// 1/256 °C, signed.
fn temperature(raw: i16) -> f64 {
    f64::from(raw) / 256.0
}

/// 100 µV units → V.
fn volts(raw: u16) -> f64 {
    f64::from(raw) / 10_000.0
}

fn thresholds(p: &Pages, page: u8, at: usize, unit: impl Fn(&Pages, usize) -> Option<f64>) -> Option<Thresholds> {
    p.0.get(&page)?;
    Some(Thresholds {
        high_alarm: unit(p, at)?,
        low_alarm: unit(p, at + 2)?,
        high_warning: unit(p, at + 4)?,
        low_warning: unit(p, at + 6)?,
    })
}

fn bit(byte: Option<u8>, n: usize) -> bool {
    byte.is_some_and(|b| b & (1 << n) != 0)
}

/// Decode `pages`; `None` when page 0 is missing or its identifier is not one decoded here.
pub fn decode(pages: &Pages) -> Option<Module> {
    let id = pages.byte(0, 0)?;
    match id {
        0x0C | 0x0D | 0x11 => Some(sff8636(pages, id)),
        0x18 | 0x19 | 0x1E => Some(cmis(pages, id)),
        _ => None,
    }
}

fn sff8636(p: &Pages, id: u8) -> Module {
    let (los, fault, lol) = (p.byte(0, 3), p.byte(0, 4), p.byte(0, 5));
    let lanes = (0..4)
        .map(|i| Lane {
            rx_power_mw: p.u16(0, 34 + 2 * i).map(power_mw),
            tx_bias_ma: p.u16(0, 42 + 2 * i).map(bias_ma),
            tx_power_mw: p.u16(0, 50 + 2 * i).map(power_mw),
            rx_los: bit(los, i),
            tx_los: bit(los, 4 + i),
            tx_fault: bit(fault, i),
            rx_lol: bit(lol, i),
            tx_lol: bit(lol, 4 + i),
        })
        .collect();
    Module {
        identifier: id,
        kind: MapKind::Sff8636,
        temperature_c: p.i16(0, 22).map(temperature),
        vcc_v: p.u16(0, 26).map(volts),
        temperature_thresholds: thresholds(p, 3, 128, |p, o| p.i16(3, o).map(temperature)),
        rx_power_thresholds_mw: thresholds(p, 3, 176, |p, o| p.u16(3, o).map(power_mw)),
        temperature_high_alarm: bit(p.byte(0, 6), 7),
        cmis_state: None,
        fault_cause: None,
        lanes,
    }
}

fn cmis(p: &Pages, id: u8) -> Module {
    let state = p.byte(0, 3).map(|b| (b >> 1) & 0x07);
    // A lane whose data path is deactivated (page 11h bytes 128–131, a nibble per lane,
    // state 1) is not in use: a 4-lane module in an 8-lane form factor.
    let in_use = |i: usize| p.byte(0x11, 128 + i / 2).map(|b| (b >> (4 * (i % 2))) & 0x0F) != Some(1);
    let lanes = match p.0.contains_key(&0x11) {
        false => Vec::new(),
        true => (0..8)
            .filter(|&i| in_use(i))
            .map(|i| Lane {
                tx_power_mw: p.u16(0x11, 154 + 2 * i).map(power_mw),
                tx_bias_ma: p.u16(0x11, 170 + 2 * i).map(bias_ma),
                rx_power_mw: p.u16(0x11, 186 + 2 * i).map(power_mw),
                tx_fault: bit(p.byte(0x11, 135), i),
                tx_los: bit(p.byte(0x11, 136), i),
                tx_lol: bit(p.byte(0x11, 137), i),
                rx_los: bit(p.byte(0x11, 147), i),
                rx_lol: bit(p.byte(0x11, 148), i),
            })
            .collect(),
    };
    Module {
        identifier: id,
        kind: MapKind::Cmis,
        temperature_c: p.i16(0, 14).map(temperature),
        vcc_v: p.u16(0, 16).map(volts),
        temperature_thresholds: thresholds(p, 2, 128, |p, o| p.i16(2, o).map(temperature)),
        rx_power_thresholds_mw: thresholds(p, 2, 192, |p, o| p.u16(2, o).map(power_mw)),
        temperature_high_alarm: bit(p.byte(0, 9), 0),
        cmis_state: state,
        fault_cause: (state == Some(5)).then(|| p.byte(0, 41)).flatten(),
        lanes,
    }
}

#[cfg(test)]
mod tests;
