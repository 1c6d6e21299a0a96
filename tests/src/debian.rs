//! Tools taken from Debian's packages without installing them: `apt-get download` and
//! `dpkg-deb -x` into `.tools/<package>` (no service is installed or started, nothing outside
//! the repository is written). Used for `prometheus`/`promtool` (the rules' tests) and
//! `prometheus-node-exporter` (the peer in `cargo xtask bench`).
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::deploy::capture;

/// `name` on `PATH`, if it is there.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// Unpacks Debian's `package` into `<root>/.tools/<package>` (replacing what was there) and
/// returns that directory. `size` is said in the progress line. `Err` says why it cannot be
/// had (no apt, no network, ...).
pub fn unpack(root: &Path, package: &str, size: &str) -> Result<PathBuf, String> {
    let dir = root.join(".tools").join(package);
    let download = root.join(".tools").join(format!("{package}.download"));
    eprintln!("{package}: unpacking Debian's {package} package into {} ({size} download)", dir.display());
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download).map_err(|e| format!("{}: {e}", download.display()))?;
    let what = format!("apt-get download {package}");
    let fetch = || capture(Command::new("apt-get").current_dir(&download).args(["download", package]), &what);
    if let Err(first) = fetch() {
        // A machine whose package lists were never fetched: fetch them (root only) and retry.
        capture(Command::new("apt-get").args(["update", "-qq"]), "apt-get update")
            .map_err(|e| format!("{first}; {e}"))?;
        fetch()?;
    }
    let deb = std::fs::read_dir(&download)
        .map_err(|e| format!("{}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("{what} left no .deb in {}", download.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    capture(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir), "dpkg-deb -x")?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(dir)
}
