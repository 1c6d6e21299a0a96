//! PCIe health of each monitored PF (SPEC §1.10, `NICPCIeCheck`).
//!
//! - [`parse`]: the kernel's PCIe attributes (`current_link_speed`, `aer_dev_*`, ...);
//! - [`reading`]: what a poll read of a PF: its link, its upstream bridge port's maxima
//!   and its AER statistics (data; the poll reads them in [`crate::read::discovery`]'s batch);
//! - [`read`]: the same read one-off, through [`crate::read::host::Host`];
//! - [`link`]: link training — downtrained against what both ends can do, role-group peers;
//! - [`aer`]: the AER totals through the counter engine;
//! - [`check`]: one poll of `NICPCIeCheck`: the monitored PFs through both deciders.
//!
//! The deciders are pure and return [`Finding`]s: events not yet filed under a check.
use time::OffsetDateTime;

use crate::model::event::{Check, Entity, HealthEvent, Stamp};

pub mod aer;
pub mod check;
pub mod link;

#[cfg(test)]
mod tests;

pub use crate::model::pcie::{Aer, AerCounts, AerSeverity, PcieLink, PcieReading, Speed, UpstreamPort};
pub use aer::{AerPort, AerState, AerThresholds};
pub use check::{Outcome, PcieState};
pub use link::{CardLink, LinkState, Training};

/// The health an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    NonFatal,
    /// `REPLACE_VM`.
    Fatal,
}

/// One PCIe event, decided but not yet filed under its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The NIC it names (`NIC=<device>`).
    pub nic: String,
    pub error_code: &'static str,
    pub health: Health,
    pub message: String,
}

impl Finding {
    pub fn new(nic: &str, error_code: &'static str, health: Health, message: String) -> Finding {
        Finding { nic: nic.to_string(), error_code, health, message }
    }

    /// The health event, filed under `check`.
    pub fn event(&self, check: Check, stamp: &Stamp, now: OffsetDateTime) -> HealthEvent {
        let ev = HealthEvent::new(check, stamp, now, &self.message)
            .entities(vec![Entity::device(self.nic.clone())])
            .error_code(self.error_code);
        match self.health {
            Health::Healthy => ev,
            Health::NonFatal => ev.unhealthy(false),
            Health::Fatal => ev.unhealthy(true),
        }
    }
}
