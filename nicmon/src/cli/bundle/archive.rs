//! The bundle's tar archive (deterministic: sorted, no times) and the staging tree the
//! capture passes read (laid out as a bundle unpacks).
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::error::BundleError;
use super::{EthtoolFiles, MANIFEST, Manifest, Node, Nodes, PROC, SYS, SideFile, top};
use crate::read::host::{FAILURE_LINK_PREFIX, Tree};

/// Write the entries added since the last call into a staging tree laid out as a bundle
/// unpacks (the same kinds as [`archive`] writes; replay tests compare the two).
pub(super) fn write_staging(nodes: &Nodes, dirty: BTreeSet<(Tree, String)>, dir: &Path) -> Result<(), BundleError> {
    for key in dirty {
        let Some(node) = nodes.get(&key) else { continue };
        let path = dir.join(top(key.0)).join(&key.1);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|why| BundleError::Staging { path: parent.into(), why })?;
        }
        if !matches!(node, Node::Dir { .. }) && std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path).map_err(|why| BundleError::Staging { path: path.clone(), why })?;
        }
        let done = match node {
            Node::Dir { .. } => std::fs::create_dir_all(&path),
            Node::File(bytes) => std::fs::write(&path, bytes),
            Node::ListedOnly => std::fs::write(&path, b""),
            Node::Link(target) => std::os::unix::fs::symlink(target, &path),
            Node::Failed(why) => std::os::unix::fs::symlink(format!("{FAILURE_LINK_PREFIX}{why}"), &path),
        };
        done.map_err(|why| BundleError::Staging { path, why })?;
    }
    Ok(())
}

/// The tar archive of everything captured (uncompressed; deterministic: sorted, no times).
pub(super) fn archive(
    nodes: &Nodes,
    side: &BTreeMap<&'static str, SideFile>,
    replays: &[(&str, &EthtoolFiles)],
    manifest: Option<&Manifest>,
) -> Result<Vec<u8>, BundleError> {
    let mut b = tar::Builder::new(Vec::new());
    let dir = |b: &mut tar::Builder<Vec<u8>>, path: &str| -> Result<(), BundleError> {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, path, std::io::empty()).map_err(|why| BundleError::Add { path: path.into(), why })
    };
    dir(&mut b, SYS)?;
    dir(&mut b, PROC)?;
    if let Some(m) = manifest {
        let bytes = serde_json::to_vec_pretty(m).map_err(BundleError::WriteManifest)?;
        append_file(&mut b, MANIFEST, &bytes)?;
    }
    for (name, f) in side {
        if let Ok(bytes) = f {
            append_file(&mut b, name, bytes)?;
        }
    }
    // The replay directories (`ethtool/<netdev>.json`, `devlink/<BDF>.json`).
    for (top, files) in replays.iter().filter(|(_, f)| !f.is_empty()) {
        dir(&mut b, top)?;
        for (name, bytes) in files.iter() {
            append_file(&mut b, &format!("{top}/{name}.json"), bytes)?;
        }
    }
    for ((tree, rel), node) in nodes {
        let path = format!("{}/{rel}", top(*tree));
        match node {
            Node::Dir { .. } => dir(&mut b, &path)?,
            Node::File(bytes) => append_file(&mut b, &path, bytes)?,
            Node::ListedOnly => append_file(&mut b, &path, &[])?,
            Node::Link(target) => append_link(&mut b, &path, target)?,
            Node::Failed(why) => append_link(&mut b, &path, &format!("{FAILURE_LINK_PREFIX}{why}"))?,
        }
    }
    b.into_inner().map_err(BundleError::Finish)
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn append_file(b: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) -> Result<(), BundleError> {
    let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
    b.append_data(&mut h, path, bytes).map_err(|why| BundleError::Add { path: path.into(), why })
}

fn append_link(b: &mut tar::Builder<Vec<u8>>, path: &str, target: &str) -> Result<(), BundleError> {
    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
    b.append_link(&mut h, path, target).map_err(|why| BundleError::AddLink {
        path: path.into(),
        target: target.into(),
        why,
    })
}
