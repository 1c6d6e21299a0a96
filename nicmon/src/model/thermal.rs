//! NIC temperature (SPEC §1.13): the hwmon sensors of a monitored PCI function, as the
//! kernel's hwmon ABI gives them (`temp<N>_input`, `_crit`, `_highest` in millidegrees
//! Celsius, `_label` a name). mlx5 (6.5+) registers one hwmon device per PCI function: `temp1`
//! is the ASIC (label `asic`), the further channels the modules' sensors (`module<N>`).
//! Plain data and the parsing of the files' text: no I/O.
use serde::{Deserialize, Serialize};

/// One temperature channel of a hwmon device, in millidegrees Celsius. A value the file did
/// not give (absent, unreadable, not a number) is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sensor {
    /// The hwmon device it belongs to (`hwmon3`).
    pub hwmon: String,
    /// The channel number `N` of `temp<N>_*`.
    pub channel: u32,
    /// `temp<N>_label` (`asic`, `module0`); `None` without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest: Option<i64>,
}

/// The per-channel files a sensor is read from, in [`Sensor`]'s order.
pub const SENSOR_FILES: [&str; 4] = ["input", "crit", "highest", "label"];

impl Sensor {
    /// `temp<N>`: the sensor's name within its hwmon device.
    pub fn name(&self) -> String {
        format!("temp{}", self.channel)
    }

    /// The label, else the sensor's name.
    pub fn display(&self) -> String {
        self.label.clone().unwrap_or_else(|| self.name())
    }

    /// A sensor from the texts of its files ([`SENSOR_FILES`]; `None`: not readable).
    pub fn from_texts(hwmon: &str, channel: u32, texts: [Option<&str>; 4]) -> Sensor {
        let [input, crit, highest, label] = texts;
        Sensor {
            hwmon: hwmon.to_string(),
            channel,
            label: label.and_then(parse_label),
            input: input.and_then(parse_millidegrees),
            crit: crit.and_then(parse_millidegrees),
            highest: highest.and_then(parse_millidegrees),
        }
    }

    /// Whether the reading is at or above its critical temperature less `margin`
    /// (millidegrees). Unknown (no input or no crit) is not.
    pub fn at_or_over(&self, margin: i64) -> bool {
        match (self.input, self.crit) {
            (Some(t), Some(c)) => t >= c.saturating_sub(margin),
            _ => false,
        }
    }
}

/// Degrees Celsius of a millidegree value, for messages and metrics.
pub fn celsius(millidegrees: i64) -> f64 {
    millidegrees as f64 / 1000.0
}

/// A hwmon millidegree value (`"45000\n"`): a decimal integer, possibly negative, within
/// ±10⁹ m°C; anything else is no value.
pub fn parse_millidegrees(text: &str) -> Option<i64> {
    let t = text.trim();
    let digits = t.strip_prefix('-').unwrap_or(t);
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<i64>().ok().filter(|v| v.abs() <= 1_000_000_000)
}

/// A hwmon label: its first line, trimmed, printable ASCII only, at most 64 bytes; an empty
/// one is none.
pub fn parse_label(text: &str) -> Option<String> {
    let line = text.lines().next().unwrap_or("").trim();
    let clean: String = line.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').take(64).collect();
    (!clean.is_empty()).then_some(clean)
}

/// The channel of a `temp<N>_input` file name (`temp12_input` → 12).
pub fn input_channel(file: &str) -> Option<u32> {
    let n = file.strip_prefix("temp")?.strip_suffix("_input")?;
    if n.is_empty() || n.len() > 4 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn files_parse() {
        assert_eq!(parse_millidegrees("45000\n"), Some(45_000));
        assert_eq!(parse_millidegrees("-5000"), Some(-5_000));
        assert_eq!(parse_millidegrees(""), None);
        assert_eq!(parse_millidegrees("N/A"), None);
        assert_eq!(parse_millidegrees("-"), None);
        assert_eq!(parse_millidegrees("99999999999"), None);
        assert_eq!(parse_label("asic\n"), Some("asic".into()));
        assert_eq!(parse_label("  \n"), None);
        assert_eq!(parse_label("mod\u{7}ule0"), Some("module0".into()));
        assert_eq!(input_channel("temp1_input"), Some(1));
        assert_eq!(input_channel("temp12_input"), Some(12));
        assert_eq!(input_channel("temp_input"), None);
        assert_eq!(input_channel("temp1_crit"), None);
        assert_eq!(input_channel("in0_input"), None);
    }

    #[test]
    fn at_or_over_the_margin() {
        let s = |input, crit| Sensor { hwmon: "hwmon0".into(), channel: 1, label: None, input, crit, highest: None };
        assert!(s(Some(100_000), Some(105_000)).at_or_over(5_000));
        assert!(!s(Some(99_999), Some(105_000)).at_or_over(5_000));
        assert!(s(Some(105_000), Some(105_000)).at_or_over(0));
        assert!(!s(None, Some(105_000)).at_or_over(5_000));
        assert!(!s(Some(200_000), None).at_or_over(5_000));
    }

    proptest! {
        #[test]
        fn junk_never_panics(t in "\\PC{0,40}", f in "\\PC{0,20}") {
            let _ = parse_millidegrees(&t);
            let _ = parse_label(&t);
            let _ = input_channel(&f);
            let s = Sensor::from_texts("hwmon0", 1, [Some(&t), Some(&t), Some(&t), Some(&t)]);
            let _ = s.at_or_over(i64::MAX);
        }
    }
}
