//! Embeds the kernel programs when `cargo xtask build-ebpf` has built them.
//!
//! With the object at `<repo>/target/ebpf/nicmon-ebpf.o` (or at `$NICMON_EBPF_OBJECT`),
//! sets `cfg(nicmon_ebpf)` and `NICMON_EBPF_OBJECT_PATH` for `include_bytes!`; without
//! it the agent builds anyway and runs on polling (+ rtnetlink) alone.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nicmon_ebpf)");
    println!("cargo::rerun-if-env-changed=NICMON_EBPF_OBJECT");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let object = env::var_os("NICMON_EBPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/ebpf/nicmon-ebpf.o"));
    // Watch the object's directory rather than the object: a missing file would make
    // cargo re-run this script (and rebuild the agent) on every build. Creating the
    // directory keeps it watchable; a later build-ebpf changes it.
    if let Some(dir) = object.parent() {
        let _ = fs::create_dir_all(dir);
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    let is_elf = fs::read(&object).map(|b| b.starts_with(b"\x7fELF")).unwrap_or(false);
    if is_elf {
        let object = object.canonicalize().unwrap_or(object);
        println!("cargo::rustc-cfg=nicmon_ebpf");
        println!("cargo::rustc-env=NICMON_EBPF_OBJECT_PATH={}", object.display());
    }
}
