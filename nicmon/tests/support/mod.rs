//! Shared by the wake-up integration tests: a veth pair that is deleted on drop, and the
//! one-line skip notices.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A veth pair with names unique to this process and test, removed on drop.
pub struct VethPair {
    pub a: String,
    pub b: String,
}

impl VethPair {
    /// Creates the pair (both ends up). `Err` says why it could not.
    pub fn create(tag: &str) -> Result<VethPair, String> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        // IFNAMSIZ: at most 15 characters.
        let base = format!("nm{tag}{}{n}", std::process::id() % 100_000);
        let pair = VethPair { a: format!("{base}a"), b: format!("{base}b") };
        assert!(pair.a.len() <= 15, "interface name too long: {}", pair.a);
        ip(&["link", "add", &pair.a, "type", "veth", "peer", "name", &pair.b])?;
        ip(&["link", "set", &pair.a, "up"])?;
        ip(&["link", "set", &pair.b, "up"])?;
        Ok(pair)
    }

    pub fn set_down(&self, which: &str) {
        ip(&["link", "set", which, "down"]).expect("ip link set down");
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.a]);
    }
}

pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

pub fn is_root() -> bool {
    // SAFETY: no arguments, no side effects.
    unsafe { libc::geteuid() == 0 }
}

/// Prints the one line that says why a test did not run. Written to the stderr handle
/// directly: the test harness captures only `print!`/`eprint!`, and a skip must be seen.
pub fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}
