//! What a poll read of a PF's PCIe state: its link figures, the maxima of the port at the
//! other end of its link (the upstream bridge port), and its AER statistics. Data only (the
//! poll's read is [`crate::read::discovery`]'s, a one-off read [`crate::read::pcie`]'s); an unreadable
//! or unparsable value is unknown (`None`), never a healthy-looking one.
use serde::{Deserialize, Serialize};

use super::parse::{self, AerCounts, AerSeverity, Speed};
use crate::model::read_error::ReadError;

/// The link figures of one PCI function (`current_link_*`, `max_link_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PcieLink {
    /// `None` while the link is down (`Unknown`) or when unreadable.
    pub speed: Option<Speed>,
    /// Lanes; `None` while the link is down (`0`) or when unreadable.
    pub width: Option<u8>,
    pub max_speed: Option<Speed>,
    pub max_width: Option<u8>,
}

impl PcieLink {
    /// The figures from the four files' texts (each as read; `None`: not read).
    pub fn from_texts(
        speed: Option<&str>,
        width: Option<&str>,
        max_speed: Option<&str>,
        max_width: Option<&str>,
    ) -> PcieLink {
        let sp = |r: Option<&str>| r.and_then(parse::link_speed);
        let wd = |r: Option<&str>| r.and_then(parse::link_width);
        PcieLink { speed: sp(speed), width: wd(width), max_speed: sp(max_speed), max_width: wd(max_width) }
    }

    /// `"x16 Gen5"` (what `nicmon check` shows), `"x16 ?"` / `"down"` when unknown.
    pub fn label(&self) -> String {
        match (self.width, self.speed) {
            (None, None) => "down".to_string(),
            (w, s) => format!(
                "{} {}",
                w.map(|w| format!("x{w}")).unwrap_or_else(|| "x?".into()),
                s.map(Speed::label).unwrap_or_else(|| "?".into())
            ),
        }
    }
}

/// The AER statistics of one PCI function, per severity; a file that is absent, unreadable
/// or not understood is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Aer {
    pub correctable: Option<AerCounts>,
    pub nonfatal: Option<AerCounts>,
    pub fatal: Option<AerCounts>,
}

impl Aer {
    pub fn get(&self, s: AerSeverity) -> Option<&AerCounts> {
        match s {
            AerSeverity::Correctable => self.correctable.as_ref(),
            AerSeverity::NonFatal => self.nonfatal.as_ref(),
            AerSeverity::Fatal => self.fatal.as_ref(),
        }
    }

    /// The file of severity `s` as read (`None`: absent, unreadable or not understood).
    pub fn slot(&mut self, s: AerSeverity) -> &mut Option<AerCounts> {
        match s {
            AerSeverity::Correctable => &mut self.correctable,
            AerSeverity::NonFatal => &mut self.nonfatal,
            AerSeverity::Fatal => &mut self.fatal,
        }
    }

    /// Whether any of the three files said something: a kernel without AER (or with
    /// firmware-first error handling) has none of them.
    pub fn available(&self) -> bool {
        AerSeverity::ALL.into_iter().any(|s| self.get(s).is_some())
    }

    /// The `TOTAL_ERR_*` of each severity that was read.
    pub fn totals(&self) -> impl Iterator<Item = (AerSeverity, u64)> + '_ {
        AerSeverity::ALL.into_iter().filter_map(|s| self.get(s).map(|c| (s, c.total)))
    }
}

/// The port at the other end of a PF's link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpstreamPort {
    /// Its PCI address (`0000:17:01.0`).
    pub address: String,
    pub link: PcieLink,
}

/// What one poll read of a PF's PCIe state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PcieReading {
    pub link: PcieLink,
    /// `None` when the PF hangs from no PCI bridge (a root-bus device, as in many VMs) or
    /// its place in the tree could not be resolved: there is then no link to judge.
    pub upstream: Option<UpstreamPort>,
    pub aer: Aer,
}

/// The link files of a PCI function, relative to its directory, in [`PcieLink::from_texts`]
/// order.
pub const LINK_FILES: [&str; 4] = ["current_link_speed", "current_link_width", "max_link_speed", "max_link_width"];

/// The AER file of severity `s` as read: `None` when absent, unreadable or not understood.
pub fn aer_file(raw: Result<&str, &ReadError>, s: AerSeverity) -> Option<AerCounts> {
    raw.ok().and_then(|raw| parse::aer_counts(raw, s))
}
