//! A port's transceiver as its management memory says (SPEC §1.13): the pages read through
//! ethtool netlink (`ETHTOOL_MSG_MODULE_EEPROM_GET`) or from a replay file, and their
//! decoding for SFF-8636 (QSFP+/QSFP28/QSFP56: [`sff8636`]) and CMIS 4/5 (QSFP-DD, OSFP,
//! QSFP+ CMIS: [`cmis`]) into one [`Module`] that a pure decider can ask questions of
//! ("which lanes have Rx LOS", "is its transmit side fine").
//!
//! **Pages.** `0` is 256 bytes (lower memory 0–127, then upper page 00h); every other page is
//! its upper half, offsets 128–255, bank 0 — so an offset `o` ≥ 128 of page `p` is
//! `pages[p][o - 128]`. Offsets follow SFF-8636 rev 2.10a §6 and CMIS 5.2 §8, checked against
//! ethtool's `qsfp.h`/`cmis.h`/`module-common.h` and against the values FBOSS's independent
//! decoder asserts for its test pages (see the tests).
//!
//! **Units** (both maps, all big-endian): temperature s16 in 1/256 °C; Vcc u16 in 100 µV;
//! optical power u16 in 0.1 µW (0–6.5535 mW); Tx bias u16 in 2 µA (CMIS: times the multiplier
//! page 01h advertises). Thresholds use the monitor's unit.
//!
//! **Unknown is unknown.** A monitor the module does not implement is `None`, never 0 mW: a
//! module without diagnostics (a passive copper cable, flat memory) has no monitors and no
//! thresholds, and thresholds that are all zero (not programmed) are `None`. Flags the module
//! does not implement read as clear. Flags are the module's *latched* flags: set when the
//! condition occurred since the last read, cleared by the read, set again at once while the
//! condition holds. Pure: no I/O, never panics on any bytes.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod cmis;
mod sff8636;

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

    /// Whether page `page`'s upper half was read.
    fn has(&self, page: u8) -> bool {
        self.0.get(&page).is_some_and(|p| p.len() >= if page == 0 { 256 } else { 128 })
    }
}

/// The hex text of the pages, as the replay file writes them.
impl Serialize for Pages {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (p, bytes) in &self.0 {
            m.serialize_entry(&p.to_string(), &hex(bytes))?;
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

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    /// SFF-8636: 4 lanes, thresholds on page 03h.
    Sff8636,
    /// CMIS: up to 8 lanes (bank 0) on page 11h, thresholds on page 02h.
    Cmis,
}

/// Which map decodes identifier `id` (SFF-8024), if nicmon decodes it.
pub fn map_kind(id: u8) -> Option<MapKind> {
    match id {
        0x0C | 0x0D | 0x11 => Some(MapKind::Sff8636),
        0x18 | 0x19 | 0x1E => Some(MapKind::Cmis),
        _ => None,
    }
}

/// Low/high alarm and warning thresholds of one monitor, in its unit.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Thresholds {
    pub high_alarm: f64,
    pub low_alarm: f64,
    pub high_warning: f64,
    pub low_warning: f64,
}

/// One monitor's latched alarm and warning flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags {
    pub high_alarm: bool,
    pub low_alarm: bool,
    pub high_warning: bool,
    pub low_warning: bool,
}

impl Flags {
    /// From a nibble laid out high alarm, low alarm, high warning, low warning from bit
    /// `top` down (SFF-8636's module and lane flags).
    fn descending(byte: Option<u8>, top: u8) -> Flags {
        let b = |n: u8| byte.is_some_and(|v| v & (1 << n) != 0);
        Flags { high_alarm: b(top), low_alarm: b(top - 1), high_warning: b(top - 2), low_warning: b(top - 3) }
    }

    pub fn any(&self) -> bool {
        self.high_alarm || self.low_alarm || self.high_warning || self.low_warning
    }
}

/// One lane's monitors and latched flags. Lanes are numbered from 1 as the module numbers
/// them (a CMIS lane whose data path is deactivated is left out, its number with it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Lane {
    pub number: usize,
    /// Receive and transmit optical power, mW; Tx bias, mA. `None`: not implemented.
    pub rx_power_mw: Option<f64>,
    pub tx_power_mw: Option<f64>,
    pub tx_bias_ma: Option<f64>,
    pub rx_los: bool,
    pub tx_los: bool,
    pub tx_fault: bool,
    pub rx_lol: bool,
    pub tx_lol: bool,
    /// The lane monitors' latched alarm and warning flags.
    pub rx_power_flags: Flags,
    pub tx_power_flags: Flags,
    pub tx_bias_flags: Flags,
}

/// CMIS module state (lower page byte 3, bits 3–1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmisState {
    LowPower,
    PowerUp,
    Ready,
    PowerDown,
    Fault,
    /// A reserved value.
    Other(u8),
}

impl CmisState {
    fn from_code(code: u8) -> CmisState {
        match code {
            1 => CmisState::LowPower,
            2 => CmisState::PowerUp,
            3 => CmisState::Ready,
            4 => CmisState::PowerDown,
            5 => CmisState::Fault,
            c => CmisState::Other(c),
        }
    }

    /// As CMIS names it (`ModuleReady`, `ModuleFault`, ...).
    pub fn name(self) -> String {
        match self {
            CmisState::LowPower => "ModuleLowPwr".into(),
            CmisState::PowerUp => "ModulePwrUp".into(),
            CmisState::Ready => "ModuleReady".into(),
            CmisState::PowerDown => "ModulePwrDn".into(),
            CmisState::Fault => "ModuleFault".into(),
            CmisState::Other(c) => format!("reserved state {c}"),
        }
    }
}

/// A decoded module.
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    /// SFF-8024 identifier (byte 0).
    pub identifier: u8,
    pub kind: MapKind,
    /// Flat memory: no pages beyond 0 (a passive copper cable): no diagnostics.
    pub flat: bool,
    /// Module temperature, °C; supply voltage, V. `None`: not implemented.
    pub temperature_c: Option<f64>,
    pub vcc_v: Option<f64>,
    /// The module's own thresholds (page 03h / 02h), when that page was read and programmed.
    pub temperature_thresholds: Option<Thresholds>,
    pub vcc_thresholds_v: Option<Thresholds>,
    pub rx_power_thresholds_mw: Option<Thresholds>,
    pub tx_power_thresholds_mw: Option<Thresholds>,
    pub tx_bias_thresholds_ma: Option<Thresholds>,
    /// Latched module-level flags.
    pub temperature_flags: Flags,
    pub vcc_flags: Flags,
    /// CMIS module state; `None` for SFF-8636.
    pub cmis_state: Option<CmisState>,
    /// CMIS module fault cause (lower page byte 41) when the state is Fault.
    pub fault_cause: Option<u8>,
    pub lanes: Vec<Lane>,
}

impl Module {
    /// The module's type as people call it (`QSFP28`, `OSFP`, ...). SFF-8024 has one
    /// identifier for QSFP28 and QSFP56 (0x11).
    pub fn type_name(&self) -> &'static str {
        match self.identifier {
            0x0C => "QSFP",
            0x0D => "QSFP+",
            0x11 => "QSFP28",
            0x18 => "QSFP-DD",
            0x19 => "OSFP",
            0x1E => "QSFP+CMIS",
            _ => "module",
        }
    }

    /// CMIS module state Fault.
    pub fn in_fault(&self) -> bool {
        self.cmis_state == Some(CmisState::Fault)
    }

    /// The CMIS fault cause as CMIS 5.2 Table 8-15 names it (`None` when not in Fault).
    pub fn fault_cause_text(&self) -> Option<String> {
        self.fault_cause.map(|c| match c {
            0 => "no fault cause given".to_string(),
            1 => "TEC runaway".to_string(),
            2 => "data memory corrupted".to_string(),
            3 => "program memory corrupted".to_string(),
            c => format!("fault cause {c}"),
        })
    }

    /// The numbers of the lanes for which `f` holds.
    pub fn lanes_where(&self, f: impl Fn(&Lane) -> bool) -> Vec<usize> {
        self.lanes.iter().filter(|l| f(l)).map(|l| l.number).collect()
    }

    pub fn rx_los_lanes(&self) -> Vec<usize> {
        self.lanes_where(|l| l.rx_los)
    }

    pub fn tx_fault_lanes(&self) -> Vec<usize> {
        self.lanes_where(|l| l.tx_fault)
    }

    /// Lanes whose measured receive power is below `limit_mw`.
    pub fn rx_power_below(&self, limit_mw: f64) -> Vec<usize> {
        self.lanes_where(|l| l.rx_power_mw.is_some_and(|p| p < limit_mw))
    }

    /// Lanes whose receive power is below the module's low warning (none without thresholds).
    pub fn rx_power_low_lanes(&self) -> Vec<usize> {
        self.rx_power_thresholds_mw.map(|t| self.rx_power_below(t.low_warning)).unwrap_or_default()
    }

    /// Lanes whose receive power is below the module's low alarm (none without thresholds).
    pub fn rx_power_below_low_alarm(&self) -> Vec<usize> {
        self.rx_power_thresholds_mw.map(|t| self.rx_power_below(t.low_alarm)).unwrap_or_default()
    }

    /// Its own transmit side is fine: no lane with a Tx fault or Tx LOS.
    pub fn tx_fine(&self) -> bool {
        !self.lanes.iter().any(|l| l.tx_fault || l.tx_los)
    }

    /// The lane with the least receive power (the first of equals), among those measured.
    pub fn worst_rx_lane(&self) -> Option<&Lane> {
        self.lanes
            .iter()
            .filter(|l| l.rx_power_mw.is_some())
            .min_by(|a, b| a.rx_power_mw.partial_cmp(&b.rx_power_mw).unwrap_or(std::cmp::Ordering::Equal))
    }

    /// Temperature above the module's high warning: its measured value over the threshold,
    /// or its latched high-warning or high-alarm flag.
    pub fn temperature_over_high_warning(&self) -> bool {
        let measured =
            matches!((self.temperature_c, self.temperature_thresholds), (Some(t), Some(th)) if t > th.high_warning);
        measured || self.temperature_flags.high_warning || self.temperature_flags.high_alarm
    }

    /// Temperature above the module's high alarm (measured or latched).
    pub fn temperature_over_high_alarm(&self) -> bool {
        let measured =
            matches!((self.temperature_c, self.temperature_thresholds), (Some(t), Some(th)) if t > th.high_alarm);
        measured || self.temperature_flags.high_alarm
    }
}

/// Optical power in dBm; `None` for no light (0 mW, where dBm has no value) or no reading.
pub fn dbm(mw: Option<f64>) -> Option<f64> {
    mw.filter(|&p| p > 0.0 && p.is_finite()).map(|p| 10.0 * p.log10())
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

/// The four thresholds at `at` (high alarm, low alarm, high warning, low warning, 2 bytes
/// each) of `page`, in `unit`; `None` when the page was not read or all four are zero.
fn thresholds(p: &Pages, page: u8, at: usize, unit: impl Fn(&Pages, usize) -> Option<f64>) -> Option<Thresholds> {
    if !p.has(page) || (0..8).all(|i| p.byte(page, at + i) == Some(0)) {
        return None;
    }
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
    match map_kind(id)? {
        MapKind::Sff8636 => Some(sff8636::decode(pages, id)),
        MapKind::Cmis => Some(cmis::decode(pages, id)),
    }
}

/// The pages to read after page 0 (whose identifier and memory model decide): SFF-8636
/// page 03h; CMIS pages 01h, 02h and 11h; none for flat memory or a map not decoded here.
pub fn pages_to_read(page0: &[u8]) -> Vec<u8> {
    let (Some(&id), Some(&model)) = (page0.first(), page0.get(2)) else {
        return Vec::new();
    };
    match map_kind(id) {
        Some(MapKind::Sff8636) if model & sff8636::FLAT_MEMORY == 0 => vec![3],
        Some(MapKind::Cmis) if model & cmis::FLAT_MEMORY == 0 => vec![0x01, 0x02, 0x11],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
