//! `cargo xtask build-ebpf`: provisions the eBPF toolchain on first use and builds the
//! kernel programs into [`OBJECT`] (relative to the repository root), where the agent's
//! build script picks it up.
//!
//! Provisioning (TOOLCHAIN.md): the pinned nightly toolchain [`TOOLCHAIN`] with `rust-src`
//! (for `-Z build-std=core`), and `bpf-linker` built against the nightly sysroot's own
//! libLLVM, installed into `.tools/`. A stamp file records what the linker was built
//! against; a toolchain whose LLVM changed triggers a rebuild, anything else is reused.
use anyhow::{Context, Result, bail, ensure};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the built object lands, relative to the repository root.
pub const OBJECT: &str = "target/ebpf/nicmon-ebpf.o";
/// The dated nightly the kernel programs are built with (also `nicmon-ebpf/rust-toolchain.toml`
/// and `deploy/Dockerfile`; a test keeps the three equal). Pinned because bpf-linker
/// [`BPF_LINKER_VERSION`] supports a fixed range of LLVM majors (this one is LLVM 22.1):
/// a floating `nightly` breaks the build the day its LLVM moves. Move both together.
pub const TOOLCHAIN: &str = "nightly-2026-05-20";
const BPF_TARGET: &str = "bpfel-unknown-none";
pub const BPF_LINKER_VERSION: &str = "0.13.0";

#[derive(clap::Args, Default)]
pub struct Options {
    /// Build the kernel programs with aya-log output (feature `log`).
    #[arg(long)]
    log: bool,
    /// Rebuild bpf-linker even when the stamp says it is current.
    #[arg(long)]
    force_linker: bool,
}

pub fn run(opts: &Options) -> Result<()> {
    let root = repo_root()?;
    ensure_toolchain()?;
    let sysroot = nightly_sysroot()?;
    let llvm = LlvmInfo::discover(&sysroot)?;
    let linker = ensure_bpf_linker(&root, &llvm, opts.force_linker)?;
    let built = build_object(&root, &linker, opts.log)?;
    let dest = root.join(OBJECT);
    publish(&built, &dest)?;
    Ok(())
}

fn step(msg: impl AsRef<str>) {
    eprintln!("build-ebpf: {}", msg.as_ref());
}

pub fn repo_root() -> Result<PathBuf> {
    let manifest = env!("CARGO_MANIFEST_DIR");
    let root = Path::new(manifest).parent().context("xtask has no parent directory")?.to_path_buf();
    ensure!(root.join("nicmon-ebpf/Cargo.toml").is_file(), "nicmon-ebpf/Cargo.toml not found under {}", root.display());
    Ok(root)
}

/// Runs a command, returning its stdout; the error names the command and its stderr.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stderr(Stdio::piped()).output().with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{:?} failed ({}): {}", cmd, out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command with its output going to the terminal.
fn status(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    ensure!(st.success(), "{cmd:?} failed ({st})");
    Ok(())
}

/// A `rustup` command aimed at the nightly toolchain whatever toolchain runs the xtask
/// (cargo exports `RUSTUP_TOOLCHAIN` to its children).
fn rustup() -> Command {
    let mut c = Command::new("rustup");
    c.env_remove("RUSTUP_TOOLCHAIN");
    c
}

/// The pinned toolchain's components: `rust-src` for `-Z build-std=core`, `clippy` for
/// `cargo xtask test`'s lint of the eBPF crate.
const COMPONENTS: [&str; 2] = ["rust-src", "clippy"];

fn ensure_toolchain() -> Result<()> {
    let list = output(rustup().args(["toolchain", "list"]))
        .context("rustup is required to provision the nightly toolchain (https://rustup.rs)")?;
    if !list.lines().any(|l| l.starts_with(&format!("{TOOLCHAIN}-"))) {
        step(format!("installing the {TOOLCHAIN} toolchain with {}", COMPONENTS.join(", ")));
        let mut cmd = rustup();
        cmd.args(["toolchain", "install", TOOLCHAIN, "--profile", "minimal"]);
        for c in COMPONENTS {
            cmd.args(["--component", c]);
        }
        status(&mut cmd)?;
        return Ok(());
    }
    let installed = output(rustup().args(["component", "list", "--installed", "--toolchain", TOOLCHAIN]))?;
    for c in COMPONENTS {
        // Listed as `rust-src`, or with the host triple: `clippy-x86_64-unknown-linux-gnu`.
        if installed.lines().map(str::trim).any(|l| l == c || l.starts_with(&format!("{c}-"))) {
            step(format!("{TOOLCHAIN} toolchain with {c}: present"));
        } else {
            step(format!("adding {c} to the {TOOLCHAIN} toolchain"));
            status(rustup().args(["component", "add", c, "--toolchain", TOOLCHAIN]))?;
        }
    }
    Ok(())
}

fn nightly_rustc() -> Command {
    let mut c = Command::new("rustc");
    c.env("RUSTUP_TOOLCHAIN", TOOLCHAIN);
    c
}

fn nightly_sysroot() -> Result<PathBuf> {
    let s = output(nightly_rustc().args(["--print", "sysroot"]))?;
    Ok(PathBuf::from(s.trim()))
}

/// The LLVM that the nightly rustc uses and ships as a shared library.
struct LlvmInfo {
    major: u32,
    /// `rustc -vV` of the nightly: identifies the toolchain build.
    rustc_version: String,
    /// The `libLLVM*.so*` files of the sysroot's `lib/`.
    libs: Vec<PathBuf>,
}

impl LlvmInfo {
    fn discover(sysroot: &Path) -> Result<Self> {
        let vv = output(nightly_rustc().arg("-vV"))?;
        let llvm = vv
            .lines()
            .find_map(|l| l.strip_prefix("LLVM version: "))
            .context("`rustc -vV` of the nightly toolchain reports no LLVM version")?;
        let major: u32 = llvm
            .split('.')
            .next()
            .and_then(|m| m.trim().parse().ok())
            .with_context(|| format!("unparsable LLVM version {llvm:?}"))?;
        let libdir = sysroot.join("lib");
        let mut libs: Vec<PathBuf> = fs::read_dir(&libdir)
            .with_context(|| format!("cannot list {}", libdir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(OsStr::to_str).is_some_and(|n| n.starts_with("libLLVM") && n.contains(".so"))
            })
            .collect();
        libs.sort();
        ensure!(
            !libs.is_empty(),
            "no libLLVM*.so* in {}: this toolchain does not ship LLVM as a shared library, \
             so bpf-linker cannot be built against it",
            libdir.display()
        );
        Ok(Self { major, rustc_version: vv.trim().to_string(), libs })
    }

    fn stamp(&self) -> String {
        let names: Vec<_> =
            self.libs.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
        format!("bpf-linker {BPF_LINKER_VERSION}\nllvm-{}\n{}\n{}\n", self.major, names.join(" "), self.rustc_version)
    }
}

/// Makes `.tools/bin/bpf-linker` exist and match the nightly's LLVM; returns its path.
fn ensure_bpf_linker(root: &Path, llvm: &LlvmInfo, force: bool) -> Result<PathBuf> {
    let tools = root.join(".tools");
    let bin = tools.join("bin/bpf-linker");
    let stamp_path = tools.join("bpf-linker.stamp");
    let want = llvm.stamp();
    let have = fs::read_to_string(&stamp_path).unwrap_or_default();
    if !force && bin.is_file() && have == want {
        step(format!("bpf-linker {BPF_LINKER_VERSION} (LLVM {}): reusing {}", llvm.major, bin.display()));
        return Ok(bin);
    }
    if bin.is_file() && !force {
        step("the nightly toolchain changed since bpf-linker was built: rebuilding it");
    }

    // bpf-linker links `$LLVM_PREFIX/lib/libLLVM.so` and records that directory as its
    // rpath: a directory of symlinks into the sysroot gives it the toolchain's own LLVM.
    let prefix = tools.join("llvm");
    let lib = prefix.join("lib");
    if lib.exists() {
        fs::remove_dir_all(&lib).with_context(|| format!("cannot clear {}", lib.display()))?;
    }
    fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    let mut versioned = None;
    for src in &llvm.libs {
        let name = src.file_name().context("library without a file name")?;
        std::os::unix::fs::symlink(src, lib.join(name))
            .with_context(|| format!("cannot link {} into {}", src.display(), lib.display()))?;
        let n = name.to_string_lossy();
        if n.starts_with("libLLVM.so.") || (versioned.is_none() && n.ends_with(".so")) {
            versioned = Some(src.clone());
        }
    }
    let target = versioned.context("no libLLVM shared library to link as libLLVM.so")?;
    let plain = lib.join("libLLVM.so");
    if !plain.exists() {
        std::os::unix::fs::symlink(&target, &plain).with_context(|| format!("cannot create {}", plain.display()))?;
    }

    step(format!(
        "building bpf-linker {BPF_LINKER_VERSION} against {} (LLVM {}; takes a minute or two)",
        target.display(),
        llvm.major
    ));
    let mut install = Command::new("cargo");
    install
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR")
        .env("LLVM_PREFIX", &prefix)
        .args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
            "--no-default-features",
            "--features",
            &format!("llvm-{}", llvm.major),
            "--root",
        ])
        .arg(&tools);
    status(&mut install).with_context(|| {
        format!(
            "building bpf-linker failed; bpf-linker {BPF_LINKER_VERSION} must offer feature \
             llvm-{} for this nightly's LLVM",
            llvm.major
        )
    })?;
    ensure!(bin.is_file(), "cargo install did not produce {}", bin.display());
    output(Command::new(&bin).arg("--version"))
        .with_context(|| format!("the freshly built {} does not run", bin.display()))?;
    fs::write(&stamp_path, want).with_context(|| format!("cannot write {}", stamp_path.display()))?;
    step(format!("bpf-linker installed at {}", bin.display()));
    Ok(bin)
}

fn build_object(root: &Path, linker: &Path, log: bool) -> Result<PathBuf> {
    let dir = root.join("nicmon-ebpf");
    step(format!(
        "compiling nicmon-ebpf for {BPF_TARGET} (nightly, -Z build-std=core{})",
        if log { ", feature log" } else { "" }
    ));
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&dir)
        .env("RUSTUP_TOOLCHAIN", TOOLCHAIN)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", linker)
        .args(["build", "--release"]);
    if log {
        cargo.args(["--features", "log"]);
    }
    status(&mut cargo).context("compiling nicmon-ebpf failed")?;
    let built = dir.join(format!("target/{BPF_TARGET}/release/nicmon-ebpf"));
    ensure!(built.is_file(), "the build produced no {}", built.display());
    Ok(built)
}

/// Copies the object to its stable path, only when it changed, so that an unchanged object
/// does not make the agent rebuild.
fn publish(built: &Path, dest: &Path) -> Result<()> {
    let new = fs::read(built).with_context(|| format!("cannot read {}", built.display()))?;
    ensure!(new.starts_with(b"\x7fELF"), "{} is not an ELF object", built.display());
    if fs::read(dest).ok().as_deref() == Some(&new[..]) {
        step(format!("{} is up to date ({} bytes)", dest.display(), new.len()));
        return Ok(());
    }
    let dir = dest.parent().context("object path without a directory")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dest.with_extension("o.tmp");
    fs::write(&tmp, &new).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, dest).with_context(|| format!("cannot rename to {}", dest.display()))?;
    step(format!("wrote {} ({} bytes)", dest.display(), new.len()));
    Ok(())
}
