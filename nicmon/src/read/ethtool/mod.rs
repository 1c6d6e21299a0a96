//! Reading a RoCE netdev's ethtool data (SPEC §1.11); the data itself is
//! [`crate::model::ethtool`]. FEC and pause come from the kernel's ethtool generic-netlink
//! family ([`netlink`]), the driver strings from the `SIOCETHTOOL` ioctl ([`ioctl`]), under a
//! deadline on a worker thread ([`reader`]); [`replay`] reads the same data from
//! `<dir>/<netdev>.json`; [`ports`] reads the monitored RoCE ports of a snapshot, paced.
pub mod ioctl;
pub mod netlink;
pub mod ports;
pub mod reader;
pub mod replay;

pub use reader::{EthtoolReader, EthtoolSource};
