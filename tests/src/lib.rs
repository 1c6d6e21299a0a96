//! Simulated-node testbed.
