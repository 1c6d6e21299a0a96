//! Reading a RoCE netdev's ethtool data (SPEC §1.11); the data itself is
//! [`crate::model::ethtool`]. FEC and pause come from the kernel's ethtool generic-netlink
//! family ([`netlink`]), the driver strings from the `SIOCETHTOOL` ioctl ([`ioctl`]), under a
//! deadline on a worker thread ([`reader`]); [`replay`] reads the same data from
//! `<dir>/<netdev>.json`; [`ports`] reads the monitored RoCE ports of a snapshot, paced.
//! A port's transceiver memory ([`module`]: `ETHTOOL_MSG_MODULE_EEPROM_GET`) is read on its
//! own pace by [`modules`], for every monitored port with a netdev (SPEC §1.13).
pub mod ioctl;
pub mod module;
pub mod modules;
pub mod netlink;
pub mod ports;
pub mod reader;
pub mod replay;

pub use reader::{EthtoolReader, EthtoolSource};
