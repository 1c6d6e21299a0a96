//! The read layer: the host (sysfs, procfs, `/dev/kmsg`, ethtool, the kernel's wake-ups)
//! into plain snapshots ([`crate::model`]). No decisions here.
pub mod devlink;
pub mod discovery;
pub mod ethtool;
pub mod host;
pub mod hwmon;
pub mod kmsg;
pub mod observe;
pub mod parse;
pub mod paths;
pub mod pcie;
pub mod sched;
pub mod topology;
pub mod wake;
