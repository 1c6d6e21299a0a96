//! Types shared by the kernel programs (`nicmon-ebpf`) and the agent (`nicmon`).
//!
//! `#![no_std]` so the eBPF crate can use it; the `user` feature adds userspace-only
//! impls. Every record layout that crosses the ring buffer is defined here, once.
#![no_std]
