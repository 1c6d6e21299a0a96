//! A filesystem that can be frozen (`fsfreeze`, the FIFREEZE ioctl): while frozen, every
//! write to it blocks in the kernel, uninterruptibly, until it is thawed — what a hung disk
//! or NFS server, or a snapshot tool's freeze, does to a writer; reads go on. A small ext4
//! image on a loop device, mounted in a temporary directory. Needs root (mount), a loop
//! device, `mkfs.ext4` and `fsfreeze`.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The mounted image. Dropping it unmounts it (thaw first: [`Frozen`] borrows it).
pub struct FreezableFs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{what}: {} {}", o.status, String::from_utf8_lossy(&o.stderr).trim())),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

impl FreezableFs {
    /// `None` (with a line saying why) where it cannot be made.
    pub fn new() -> Option<FreezableFs> {
        let dir = tempfile::tempdir().ok()?;
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        let made = std::fs::File::create(&image)
            .and_then(|f| f.set_len(16 << 20))
            .and_then(|()| std::fs::create_dir(&mnt))
            .map_err(|e| e.to_string())
            .and_then(|()| run("mkfs.ext4", Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image)))
            .and_then(|()| run("mount -o loop", Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mnt)));
        match made {
            Ok(()) => Some(FreezableFs { mnt, _dir: dir }),
            Err(e) => {
                eprintln!("skipped: no freezable filesystem on this machine ({e})");
                None
            }
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// Freeze it until the guard is dropped.
    pub fn freeze(&self) -> Frozen<'_> {
        run("fsfreeze --freeze", Command::new("fsfreeze").arg("--freeze").arg(&self.mnt)).unwrap();
        Frozen(self)
    }
}

impl Drop for FreezableFs {
    fn drop(&mut self) {
        if let Err(e) = run("umount", Command::new("umount").arg(&self.mnt)) {
            eprintln!("cannot unmount {}: {e}", self.mnt.display());
        }
    }
}

/// The filesystem frozen; thawed when dropped (a panicking test included: a writer blocked
/// on it cannot even be killed until then).
pub struct Frozen<'a>(&'a FreezableFs);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if let Err(e) = run("fsfreeze --unfreeze", Command::new("fsfreeze").arg("--unfreeze").arg(&self.0.mnt)) {
            eprintln!("cannot thaw {}: {e}", self.0.mnt.display());
        }
    }
}
