//! The decide layer (pure): functions of a snapshot, the previous state, the settings and
//! the time — no clock, no I/O. [`poll`] is one poll's decision; each check owns its state.
pub mod cause;
pub mod chardev;
pub mod counters;
pub mod firmware;
pub mod kmsg;
pub mod linkstate;
pub mod optics;
pub mod pcie;
pub mod phy;
pub mod poll;
pub mod roles;
pub mod settings;
pub mod software;
pub mod state;
pub mod thermal;
