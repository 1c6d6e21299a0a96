//! What a poll read of a PF's PCIe link and AER statistics (SPEC §1.10): the kernel's
//! attributes parsed ([`parse`]) and one PF's reading ([`reading`]). Data only.
pub mod parse;
pub mod reading;

pub use parse::{AerCounts, AerSeverity, Speed};
pub use reading::{Aer, PcieLink, PcieReading, UpstreamPort};
