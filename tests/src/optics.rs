//! Transceiver memory for the testbed: SFF-8636 (QSFP56) and CMIS (OSFP) pages as nicmon's
//! ethtool replay file carries them (`"module": {"pages": {"0": "<hex>", ...}}`: page 0 whole,
//! the others their upper half), written byte by byte at the offsets of SFF-8636 rev 2.10a and
//! CMIS 5.2, with the faults a test needs: Rx LOS, Tx fault, weak receive power, a hot
//! module, CMIS's module Fault state.
use std::path::Path;

/// The memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// QSFP56, SFF-8636, 4 lanes.
    Qsfp56,
    /// OSFP, CMIS, 8 lanes.
    Osfp,
}

/// A module: its form, every lane's receive power (mW), and its latched faults (lanes from 1).
#[derive(Debug, Clone)]
pub struct Module {
    pub form: Form,
    pub rx_power_mw: f64,
    pub rx_los: Vec<usize>,
    pub tx_fault: Vec<usize>,
    /// CMIS module state Fault.
    pub fault: bool,
    /// Case temperature, whole °C (high warning 70 °C on a QSFP56, 75 °C on an OSFP).
    pub temperature_c: i16,
}

impl Module {
    /// A healthy module: 0.8 mW on every lane (low warning 0.1 mW, low alarm 0.05 mW), at
    /// 40 °C (a QSFP56) or 45 °C (an OSFP).
    pub fn healthy(form: Form) -> Module {
        let temperature_c = match form {
            Form::Qsfp56 => 40,
            Form::Osfp => 45,
        };
        Module { form, rx_power_mw: 0.8, rx_los: Vec::new(), tx_fault: Vec::new(), fault: false, temperature_c }
    }

    pub fn lanes(&self) -> usize {
        match self.form {
            Form::Qsfp56 => 4,
            Form::Osfp => 8,
        }
    }

    /// The cable pulled at the far end: no light on any lane.
    pub fn dark(mut self) -> Module {
        self.rx_los = (1..=self.lanes()).collect();
        self.rx_power_mw = 0.0;
        self
    }

    fn put16(page: &mut [u8], at: usize, v: u16) {
        page[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }

    fn mask(lanes: &[usize]) -> u8 {
        lanes.iter().fold(0, |m, l| m | (1u8 << (l - 1)))
    }

    /// The pages, by number.
    pub fn pages(&self) -> Vec<(u8, Vec<u8>)> {
        let rx = (self.rx_power_mw * 10_000.0) as u16;
        // Rx power thresholds: high alarm 3.4, low alarm 0.05, high warning 2.2, low warning 0.1 mW.
        let rx_thresholds = [34_000u16, 500, 22_000, 1000];
        let mut p0 = vec![0u8; 256];
        match self.form {
            Form::Qsfp56 => {
                p0[0] = 0x11;
                p0[3] = Self::mask(&self.rx_los);
                p0[4] = Self::mask(&self.tx_fault);
                Self::put16(&mut p0, 22, (self.temperature_c as u16) << 8);
                Self::put16(&mut p0, 26, 33_000);
                for i in 0..4 {
                    Self::put16(&mut p0, 34 + 2 * i, rx);
                    Self::put16(&mut p0, 42 + 2 * i, 3500);
                    Self::put16(&mut p0, 50 + 2 * i, 10_000);
                }
                let mut p3 = vec![0u8; 128];
                for (i, t) in [75u16, 0, 70, 5].into_iter().enumerate() {
                    Self::put16(&mut p3, 2 * i, t * 256);
                }
                for (i, w) in rx_thresholds.into_iter().enumerate() {
                    Self::put16(&mut p3, 48 + 2 * i, w);
                }
                vec![(0, p0), (3, p3)]
            }
            Form::Osfp => {
                p0[0] = 0x19;
                p0[3] = if self.fault { 5 << 1 } else { 3 << 1 };
                Self::put16(&mut p0, 14, (self.temperature_c as u16) << 8);
                Self::put16(&mut p0, 16, 33_000);
                let mut p2 = vec![0u8; 128];
                for (i, t) in [80u16, 0, 75, 5].into_iter().enumerate() {
                    Self::put16(&mut p2, 2 * i, t * 256);
                }
                for (i, w) in rx_thresholds.into_iter().enumerate() {
                    Self::put16(&mut p2, 64 + 2 * i, w);
                }
                let mut p11 = vec![0u8; 128];
                p11[..4].fill(0x44); // every lane's data path activated
                p11[7] = Self::mask(&self.tx_fault);
                p11[19] = Self::mask(&self.rx_los);
                for i in 0..8 {
                    Self::put16(&mut p11, 26 + 2 * i, 12_000);
                    Self::put16(&mut p11, 42 + 2 * i, 4000);
                    Self::put16(&mut p11, 58 + 2 * i, rx);
                }
                vec![(0, p0), (2, p2), (0x11, p11)]
            }
        }
    }

    /// The replay file's `module` object.
    pub fn json(&self) -> serde_json::Value {
        let pages: serde_json::Map<String, serde_json::Value> = self
            .pages()
            .into_iter()
            .map(|(p, bytes)| (p.to_string(), bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into()))
            .collect();
        serde_json::json!({ "pages": pages })
    }

    /// Write `<dir>/<netdev>.json` with this module (and no other ethtool data).
    pub fn write(&self, dir: &Path, netdev: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let text = serde_json::to_string_pretty(&serde_json::json!({ "module": self.json() })).unwrap();
        std::fs::write(dir.join(format!("{netdev}.json")), text).unwrap();
    }
}
