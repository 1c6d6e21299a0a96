//! Replaying a bundle: unpack it into a temporary directory and run `check` or `topology`
//! on its trees, showing the node's paths in the output.
use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::BundleError;
use super::unpack::{MANIFEST_BYTES, unpack_into};
use super::{BOOT_ID, CONFIG, ETHTOOL, FORMAT, KMSG, MANIFEST, METADATA, Manifest, PROC, STATE, SYS};
use crate::cli::check::{self, CheckArgs, CheckError};

/// A bundle unpacked into a temporary directory (removed on drop).
pub struct Replay {
    pub(super) dir: tempfile::TempDir,
    pub manifest: Option<Manifest>,
}

impl Replay {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn sysfs(&self) -> PathBuf {
        self.path(SYS)
    }

    pub fn procfs(&self) -> PathBuf {
        self.path(PROC)
    }

    /// The metadata file (absent when the node had none: the same fallback applies).
    pub fn metadata(&self) -> PathBuf {
        self.path(METADATA)
    }

    pub fn config(&self) -> PathBuf {
        self.path(CONFIG)
    }

    pub fn state_file(&self) -> Option<PathBuf> {
        Some(self.path(STATE)).filter(|p| p.exists())
    }

    pub fn boot_id_path(&self) -> Option<PathBuf> {
        Some(self.path(BOOT_ID)).filter(|p| p.exists())
    }

    /// The kernel log records the bundle holds, for `--kmsg`.
    pub fn kmsg(&self) -> Option<PathBuf> {
        Some(self.path(KMSG)).filter(|p| p.exists())
    }

    /// The devlink replay directory (`None`: the bundle has none).
    pub fn devlink(&self) -> Option<PathBuf> {
        Some(self.path(super::DEVLINK)).filter(|p| p.is_dir())
    }

    /// The ethtool replay directory (`None`: the bundle has none).
    pub fn ethtool(&self) -> Option<PathBuf> {
        Some(self.path(ETHTOOL)).filter(|p| p.is_dir())
    }

    /// Output with the replay tree's paths shown as the node's (notes name the metadata
    /// file, messages name the sysfs root), so a replay prints what the node printed.
    pub fn show_as_node(&self, out: String) -> String {
        let Some(m) = &self.manifest else { return out };
        let hp = &m.host_paths;
        let mut pairs = vec![
            (self.metadata(), hp.metadata.clone()),
            (self.config(), hp.config.clone()),
            (self.sysfs(), hp.sysfs.clone()),
            (self.procfs(), hp.procfs.clone()),
        ];
        if let Some(s) = &hp.state_file {
            pairs.push((self.path(STATE), s.clone()));
        }
        pairs.iter().fold(out, |acc, (from, to)| acc.replace(&*from.to_string_lossy(), &to.to_string_lossy()))
    }
}

/// Unpack a tar stream into a fresh temporary directory (within the bounds of
/// [`unpack_into`]: a bundle is untrusted input).
pub(super) fn unpack_from(reader: impl Read, what: &str) -> Result<Replay, BundleError> {
    let dir = tempfile::Builder::new().prefix("nicmon-bundle-").tempdir().map_err(BundleError::TempDir)?;
    unpack_into(reader, dir.path(), what)?;
    // A regular file within its bound (the unpacker's too), never opened if it is not one.
    let manifest = match crate::read::host::read_file(&dir.path().join(MANIFEST), MANIFEST_BYTES as usize) {
        Ok(b) => Some(
            serde_json::from_slice::<Manifest>(&b)
                .map_err(|why| BundleError::InvalidManifest { what: what.into(), why })?,
        ),
        Err(_) => None,
    };
    if let Some(m) = &manifest
        && m.format != FORMAT
    {
        return Err(BundleError::Format { what: what.into(), format: m.format });
    }
    Ok(Replay { dir, manifest })
}

/// Unpack a bundle file (`.tar.gz`) for a replay.
pub fn unpack(file: &Path) -> Result<Replay, BundleError> {
    // Checked to be a regular file before it is opened: a FIFO must not block.
    let f = crate::read::host::open_regular(file).map_err(|why| BundleError::Open { path: file.into(), why })?;
    let shown = format!("bundle {}", file.display());
    let replay = unpack_from(flate2::read::GzDecoder::new(f), &shown)?;
    if replay.manifest.is_none() {
        return Err(BundleError::NoManifest { what: shown });
    }
    Ok(replay)
}

/// `nicmon check --bundle`: the same cycle as `check`, on the bundle's trees, with its
/// state (on a copy) and its node name unless `--node-name` was given (`node_flag_given`).
/// `--kmsg` is the caller's; `kmsg_from_bundle` feeds the bundle's own kernel-log records.
pub fn replay_check(
    file: &Path,
    mut args: CheckArgs,
    node_flag_given: bool,
    kmsg_from_bundle: bool,
    emit: impl FnOnce(String) -> Result<(), CheckError>,
) -> Result<(), BundleError> {
    let replay = unpack(file)?;
    let m = replay.manifest.as_ref().expect("unpack checks the manifest");
    args.monitor.sysfs = replay.sysfs();
    args.monitor.procfs = replay.procfs();
    args.monitor.metadata = Some(replay.metadata());
    args.monitor.config = replay.config();
    args.state_file = replay.state_file();
    args.monitor.boot_id_path = replay.boot_id_path();
    // A bundle is not this host: its ethtool data is its own. Without one nothing is read
    // (the replay tree is not the live sysfs), as on a node whose ethtool data was not read.
    args.monitor.ethtool_replay = replay.ethtool();
    args.monitor.devlink_replay = replay.devlink();
    if !node_flag_given {
        args.monitor.stamp.node_name = m.node_name.clone();
    }
    if kmsg_from_bundle {
        args.kmsg = replay.kmsg();
    }
    Ok(check::run_check(&args, |out| emit(replay.show_as_node(out)))?)
}

/// `nicmon topology --bundle`.
pub fn replay_topology(file: &Path, metadata_required: bool, json: bool) -> Result<String, BundleError> {
    let replay = unpack(file)?;
    let out = check::run_topology(
        &replay.sysfs(),
        &replay.procfs(),
        &replay.metadata(),
        metadata_required,
        &replay.config(),
        json,
    )?;
    Ok(replay.show_as_node(out))
}
