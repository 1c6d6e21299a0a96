//! Parsers for the PCIe attributes of a PCI function (`/sys/bus/pci/devices/<BDF>/`).
//!
//! Pure functions of the file's text; none panics on any input (proptests below). What the
//! kernel prints (`drivers/pci/pci-sysfs.c`, `drivers/pci/probe.c`, `drivers/pci/pcie/aer.c`):
//! - `current_link_speed`, `max_link_speed`: `pci_speed_string()` — `"2.5 GT/s PCIe"`,
//!   `"5.0 GT/s PCIe"`, `"8.0 GT/s PCIe"`, `"16.0 GT/s PCIe"`, `"32.0 GT/s PCIe"`,
//!   `"64.0 GT/s PCIe"`, and `"Unknown"` (the link is down, or a speed the kernel has no
//!   name for). Kernels up to 5.6 printed `"8 GT/s"` / `"Unknown speed"` (no ` PCIe`, no
//!   `.0`): both are read. A speed is unknown, never a value, when it is `Unknown`;
//! - `current_link_width`, `max_link_width`: `"%u"` lanes; `0` while the link is down
//!   (unknown, not a value);
//! - `aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`: one `NAME count` line per
//!   error bit the kernel has a name for (`RxErr 0`, `BadTLP 3`, ...), a
//!   `dev_cor_errs_bit[N] count` line for an unnamed bit that counted, and last
//!   `TOTAL_ERR_COR|TOTAL_ERR_NONFATAL|TOTAL_ERR_FATAL count`. A file without its total line is
//!   not understood (unknown), never a zero.
use std::fmt;

/// A PCIe link speed, in MT/s per lane (`32.0 GT/s` = 32000), so speeds compare exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Speed(u32);

impl Speed {
    pub const GEN1: Speed = Speed(2_500);
    pub const GEN2: Speed = Speed(5_000);
    pub const GEN3: Speed = Speed(8_000);
    pub const GEN4: Speed = Speed(16_000);
    pub const GEN5: Speed = Speed(32_000);
    pub const GEN6: Speed = Speed(64_000);
    const GENERATIONS: [Speed; 6] = [Speed::GEN1, Speed::GEN2, Speed::GEN3, Speed::GEN4, Speed::GEN5, Speed::GEN6];

    /// A speed of `mts` MT/s per lane (0 is no speed).
    pub fn from_mts(mts: u32) -> Option<Speed> {
        (mts > 0).then_some(Speed(mts))
    }

    pub fn mts(self) -> u32 {
        self.0
    }

    /// The PCIe generation of this speed (`32.0 GT/s` → 5), when it is one.
    pub fn generation(self) -> Option<u8> {
        Speed::GENERATIONS.iter().position(|g| *g == self).map(|i| i as u8 + 1)
    }

    /// The speed of PCIe generation `n` (1..=6).
    pub fn of_generation(n: u8) -> Option<Speed> {
        Speed::GENERATIONS.get(usize::from(n).checked_sub(1)?).copied()
    }

    /// `"32.0"`: GT/s with one decimal, as the kernel prints it.
    pub fn number(self) -> String {
        format!("{}.{}", self.0 / 1000, (self.0 % 1000) / 100)
    }

    /// `"32.0 GT/s"` — the kernel's figure without its ` PCIe` suffix.
    pub fn gts(self) -> String {
        format!("{} GT/s", self.number())
    }

    /// `"Gen5"`, or the GT/s figure for a speed that is no generation.
    pub fn label(self) -> String {
        match self.generation() {
            Some(g) => format!("Gen{g}"),
            None => self.gts(),
        }
    }
}

/// Serialised as the kernel prints it without its suffix (`"32.0 GT/s"`).
impl serde::Serialize for Speed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.gts())
    }
}

impl<'de> serde::Deserialize<'de> for Speed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Speed, D::Error> {
        let s = String::deserialize(d)?;
        link_speed(&s).ok_or_else(|| serde::de::Error::custom(format!("not a PCIe link speed: {s:?}")))
    }
}

impl fmt::Display for Speed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.gts())
    }
}

/// `current_link_speed` / `max_link_speed`: `"32.0 GT/s PCIe"` (or `"32 GT/s"` before 5.7).
/// `None` for `Unknown`, `Unknown speed`, a PCI-X/AGP name, or anything else.
pub fn link_speed(raw: &str) -> Option<Speed> {
    let t = raw.trim();
    let t = t.strip_suffix("PCIe").map(str::trim_end).unwrap_or(t);
    let num = t.strip_suffix("GT/s")?.trim_end();
    Speed::from_mts(decimal_thousandths(num)?)
}

/// `"2.5"` → 2500, `"16"` → 16000, `"16.0"` → 16000: a decimal number of GT/s in MT/s.
/// At most three decimals, no sign, no exponent; `None` past `u32`.
fn decimal_thousandths(s: &str) -> Option<u32> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| !d.is_empty() && d.len() <= 9 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(int) || (s.contains('.') && !digits(frac)) || frac.len() > 3 {
        return None;
    }
    let int: u32 = int.parse().ok()?;
    let mut frac_value = 0u32;
    for (i, b) in frac.bytes().enumerate() {
        frac_value += u32::from(b - b'0') * [100, 10, 1][i];
    }
    int.checked_mul(1000)?.checked_add(frac_value)
}

/// `current_link_width` / `max_link_width`: `"%u"` lanes. `None` for `0` (the link is down)
/// or anything that is not a lane count (an `x16` spelling is read too).
pub fn link_width(raw: &str) -> Option<u8> {
    let t = raw.trim();
    let t = t.strip_prefix('x').or_else(|| t.strip_prefix('X')).unwrap_or(t);
    if t.is_empty() || t.len() > 3 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<u8>().ok().filter(|w| (1..=32).contains(w))
}

/// The three AER statistics files of a PCI function, declared once: file name, the total's
/// line, the severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AerSeverity {
    Correctable,
    NonFatal,
    Fatal,
}

impl AerSeverity {
    pub const ALL: [AerSeverity; 3] = [AerSeverity::Correctable, AerSeverity::NonFatal, AerSeverity::Fatal];

    /// The sysfs file, relative to the function's directory.
    pub fn file(self) -> &'static str {
        match self {
            AerSeverity::Correctable => "aer_dev_correctable",
            AerSeverity::NonFatal => "aer_dev_nonfatal",
            AerSeverity::Fatal => "aer_dev_fatal",
        }
    }

    /// The name of the file's last line.
    pub fn total_line(self) -> &'static str {
        match self {
            AerSeverity::Correctable => "TOTAL_ERR_COR",
            AerSeverity::NonFatal => "TOTAL_ERR_NONFATAL",
            AerSeverity::Fatal => "TOTAL_ERR_FATAL",
        }
    }

    /// The error code of this severity's events (SPEC §1.10).
    pub fn error_code(self) -> &'static str {
        match self {
            AerSeverity::Correctable => "aer_correctable",
            AerSeverity::NonFatal => "aer_nonfatal",
            AerSeverity::Fatal => "aer_fatal",
        }
    }

    /// The severity whose [`AerSeverity::error_code`] is `code`.
    pub fn of_error_code(code: &str) -> Option<AerSeverity> {
        AerSeverity::ALL.into_iter().find(|s| s.error_code() == code)
    }
}

/// One AER statistics file: the count per error bit, in the kernel's order, and its total.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct AerCounts {
    /// `(name, count)` per line before the total (`("BadTLP", 3)`, `("dev_cor_errs_bit[1]", 2)`);
    /// shared: the AER decision keeps a window's bits without copying them.
    pub bits: std::sync::Arc<[(String, u64)]>,
    /// The `TOTAL_ERR_*` line.
    pub total: u64,
}

impl AerCounts {
    /// The count of the bit named `name` (absent: not printed, which for a named bit of this
    /// kernel means it never counted).
    pub fn bit(&self, name: &str) -> Option<u64> {
        self.bits.iter().find(|(n, _)| n == name).map(|(_, c)| *c)
    }

    /// The bits whose count rose since `before`, with the rise: `[("BadTLP", 3)]`. A bit
    /// absent before counts from 0; a bit whose count fell (a reset) is not a rise.
    pub fn moved_since(&self, before: &AerCounts) -> Vec<(String, u64)> {
        self.bits
            .iter()
            .filter_map(|(name, now)| {
                let then = before.bit(name).unwrap_or(0);
                (*now > then).then(|| (name.clone(), now - then))
            })
            .collect()
    }
}

/// `aer_dev_*` of `severity`. `None` when the total line is missing or not a number, the
/// total is for another severity, or a line's name (the total's or a bit's) is given twice:
/// a file that cannot be understood says nothing (which of two counts would be the value?).
/// Lines that are not `NAME count` are skipped.
pub fn aer_counts(raw: &str, severity: AerSeverity) -> Option<AerCounts> {
    let mut bits: Vec<(String, u64)> = Vec::new();
    let mut total = None;
    for line in raw.lines() {
        let Some((name, count)) = line.trim().rsplit_once(|c: char| c.is_ascii_whitespace()) else {
            continue;
        };
        let (name, count) = (name.trim(), count.trim());
        let Some(count) = count.parse::<u64>().ok().filter(|_| count.bytes().all(|b| b.is_ascii_digit())) else {
            continue;
        };
        if name.starts_with("TOTAL_") {
            if name != severity.total_line() || total.replace(count).is_some() {
                return None;
            }
        } else if !name.is_empty() && name.len() <= 64 && !name.contains(char::is_whitespace) {
            // A file has a few dozen lines at most (the bound on the read): a scan is
            // cheaper than a set.
            if bits.iter().any(|(n, _)| n == name) {
                return None;
            }
            bits.push((name.to_string(), count));
        }
    }
    Some(AerCounts { bits: bits.into(), total: total? })
}

/// Names the bits that moved: `"BadTLP +3, RxErr +1"`; empty when none did.
pub fn moved_text(moved: &[(String, u64)]) -> String {
    moved.iter().map(|(n, d)| format!("{n} +{d}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_kernels_speed_strings() {
        let cases = [
            ("2.5 GT/s PCIe\n", Some(Speed::GEN1), Some(1)),
            ("5.0 GT/s PCIe\n", Some(Speed::GEN2), Some(2)),
            ("8.0 GT/s PCIe\n", Some(Speed::GEN3), Some(3)),
            ("16.0 GT/s PCIe\n", Some(Speed::GEN4), Some(4)),
            ("32.0 GT/s PCIe\n", Some(Speed::GEN5), Some(5)),
            ("64.0 GT/s PCIe\n", Some(Speed::GEN6), Some(6)),
            // Kernels up to 5.6.
            ("2.5 GT/s\n", Some(Speed::GEN1), Some(1)),
            ("5 GT/s\n", Some(Speed::GEN2), Some(2)),
            ("8 GT/s\n", Some(Speed::GEN3), Some(3)),
            ("16 GT/s\n", Some(Speed::GEN4), Some(4)),
            ("32 GT/s", Some(Speed::GEN5), Some(5)),
            // A speed pci_speed_string() has no generation for yet reads as a value.
            ("128.0 GT/s PCIe\n", Speed::from_mts(128_000), None),
        ];
        for (raw, speed, generation) in cases {
            assert_eq!(link_speed(raw), speed, "{raw:?}");
            assert_eq!(link_speed(raw).and_then(Speed::generation), generation, "{raw:?}");
        }
        for raw in ["Unknown\n", "Unknown speed\n", "", "\n", "133 MHz PCI-X 533\n", "8x AGP\n", "GT/s", "-8 GT/s"] {
            assert_eq!(link_speed(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn speeds_print_like_the_kernel() {
        assert_eq!(Speed::GEN5.gts(), "32.0 GT/s");
        assert_eq!(Speed::GEN1.gts(), "2.5 GT/s");
        assert_eq!(Speed::GEN4.to_string(), "16.0 GT/s");
        assert_eq!(Speed::GEN5.label(), "Gen5");
        assert_eq!(Speed::from_mts(128_000).unwrap().label(), "128.0 GT/s");
        assert_eq!(Speed::of_generation(4), Some(Speed::GEN4));
        assert_eq!(Speed::of_generation(0), None);
        assert_eq!(Speed::of_generation(7), None);
        assert!(Speed::GEN4 < Speed::GEN5);
        let json = serde_json::to_string(&Speed::GEN5).unwrap();
        assert_eq!(json, "\"32.0 GT/s\"");
        assert_eq!(serde_json::from_str::<Speed>(&json).unwrap(), Speed::GEN5);
        assert!(serde_json::from_str::<Speed>("\"Unknown\"").is_err());
    }

    #[test]
    fn widths() {
        for (raw, want) in [("16\n", Some(16)), ("8", Some(8)), ("1\n", Some(1)), ("x16\n", Some(16)), ("32", Some(32))]
        {
            assert_eq!(link_width(raw), want, "{raw:?}");
        }
        // 0 while the link is down: unknown.
        for raw in ["0\n", "", "sixteen", "-8", "64", "255", "+8", "16 lanes", "0x10"] {
            assert_eq!(link_width(raw), None, "{raw:?}");
        }
    }

    const CORRECTABLE: &str = "RxErr 0\nBadTLP 3\nBadDLLP 0\nRollover 0\nTimeout 1\nNonFatalErr 0\nCorrIntErr 0\n\
                               HeaderOF 0\nTOTAL_ERR_COR 4\n";
    const FATAL: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\n\
                         MalfTLP 1\nECRC 0\nUnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\n\
                         TLPBlockedErr 0\nPoisonTLPBlocked 0\nTOTAL_ERR_FATAL 1\n";

    #[test]
    fn aer_files_as_the_kernel_prints_them() {
        let c = aer_counts(CORRECTABLE, AerSeverity::Correctable).unwrap();
        assert_eq!(c.total, 4);
        assert_eq!(c.bit("BadTLP"), Some(3));
        assert_eq!(c.bit("Timeout"), Some(1));
        assert_eq!(c.bits.len(), 8);
        let f = aer_counts(FATAL, AerSeverity::Fatal).unwrap();
        assert_eq!((f.total, f.bit("MalfTLP")), (1, Some(1)));
        // An unnamed bit that counted.
        let raw = "RxErr 0\ndev_cor_errs_bit[1] 2\nTOTAL_ERR_COR 2\n";
        let c = aer_counts(raw, AerSeverity::Correctable).unwrap();
        assert_eq!(c.bit("dev_cor_errs_bit[1]"), Some(2));
        // Non-fatal file of an idle device.
        let raw = "Undefined 0\nDLP 0\nTOTAL_ERR_NONFATAL 0";
        assert_eq!(aer_counts(raw, AerSeverity::NonFatal).map(|c| c.total), Some(0));
    }

    #[test]
    fn aer_files_that_say_nothing() {
        // No total, the total of another file, empty, garbage: unknown, never zero.
        assert_eq!(aer_counts("RxErr 0\nBadTLP 3\n", AerSeverity::Correctable), None);
        assert_eq!(aer_counts(CORRECTABLE, AerSeverity::Fatal), None);
        assert_eq!(aer_counts("", AerSeverity::Fatal), None);
        assert_eq!(aer_counts("TOTAL_ERR_COR lots\n", AerSeverity::Correctable), None);
        assert_eq!(aer_counts("TOTAL_ERR_COR -1\n", AerSeverity::Correctable), None);
        // A line that is not `NAME count` is skipped, the rest stands.
        let c = aer_counts("garbage\nBadTLP x\nRxErr 2\nTOTAL_ERR_COR 2\n", AerSeverity::Correctable).unwrap();
        assert_eq!(&*c.bits, [("RxErr".to_string(), 2)]);
    }

    #[test]
    fn aer_files_with_a_line_given_twice_say_nothing() {
        // Which of two totals (or two counts of one bit) is the value? Neither: unknown.
        let fatal_twice = format!("{FATAL}TOTAL_ERR_FATAL 9\n").replace("TOTAL_ERR_FATAL 1\n", "TOTAL_ERR_FATAL 5\n");
        assert_eq!(aer_counts(&fatal_twice, AerSeverity::Fatal), None);
        assert_eq!(aer_counts("TOTAL_ERR_COR 5\nTOTAL_ERR_COR 5\n", AerSeverity::Correctable), None);
        assert_eq!(aer_counts("BadTLP 1\nRxErr 0\nBadTLP 3\nTOTAL_ERR_COR 4\n", AerSeverity::Correctable), None);
        assert_eq!(
            aer_counts("dev_cor_errs_bit[1] 1\ndev_cor_errs_bit[1] 2\nTOTAL_ERR_COR 3\n", AerSeverity::Correctable),
            None
        );
        // A line that is skipped (not `NAME count`) is no second line of its name.
        let c = aer_counts("BadTLP x\nBadTLP 3\nTOTAL_ERR_COR 3\n", AerSeverity::Correctable).unwrap();
        assert_eq!((c.bit("BadTLP"), c.total), (Some(3), 3));
    }

    #[test]
    fn moved_bits() {
        let before = aer_counts("RxErr 1\nBadTLP 0\nTOTAL_ERR_COR 1\n", AerSeverity::Correctable).unwrap();
        let after = aer_counts("RxErr 2\nBadTLP 3\ndev_cor_errs_bit[1] 1\nTOTAL_ERR_COR 6\n", AerSeverity::Correctable)
            .unwrap();
        let moved = after.moved_since(&before);
        assert_eq!(moved_text(&moved), "RxErr +1, BadTLP +3, dev_cor_errs_bit[1] +1");
        assert!(before.moved_since(&after).is_empty(), "a reset is no rise");
        assert_eq!(moved_text(&[]), "");
    }

    #[test]
    fn severities_declared_once() {
        for s in AerSeverity::ALL {
            assert_eq!(AerSeverity::of_error_code(s.error_code()), Some(s));
            assert!(s.file().starts_with("aer_dev_") && s.total_line().starts_with("TOTAL_ERR_"));
        }
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = link_speed(&s);
            let _ = link_width(&s);
            for sev in AerSeverity::ALL {
                let _ = aer_counts(&s, sev);
            }
        }

        #[test]
        fn near_miss_values_never_panic(
            int in "[0-9]{0,12}", frac in "[0-9.]{0,6}", unit in "(GT/s|GT/s PCIe| GT/s|gt/s|)",
            name in "[A-Za-z_\\[\\]0-9]{0,20}", count in "[-0-9x]{0,24}",
        ) {
            let speed = format!("{int}.{frac} {unit}");
            if let Some(s) = link_speed(&speed) {
                prop_assert!(s.mts() > 0);
                prop_assert!(!s.gts().is_empty());
            }
            let _ = link_width(&int);
            let raw = format!("{name} {count}\nTOTAL_ERR_COR {count}\n");
            if let Some(c) = aer_counts(&raw, AerSeverity::Correctable) {
                prop_assert_eq!(Some(c.total), count.parse::<u64>().ok());
            }
        }

        #[test]
        fn printed_speeds_read_back(mts in 1u32..1_000_000) {
            let s = Speed::from_mts(mts / 100 * 100 + 100).unwrap();
            prop_assert_eq!(link_speed(&format!("{} PCIe\n", s.gts())), Some(s));
        }
    }
}
