//! Where the host trees are read (SPEC §1.9 "Drop-in by image swap").
//!
//! NVSentinel's chart mounts the host's `/sys` and `/proc` under `/nvsentinel` and names the
//! two class directories in its ConfigMap (`sysClassInfinibandPath`, `sysClassNetPath`).
//! nicmon reads one sysfs root, so without `--sysfs` the root is derived from those keys; the
//! procfs root comes from `--procfs`, else the `--boot-id-path` prefix, else
//! `/nvsentinel/proc` when present, else `/proc`. Pure: the one look at the file system is
//! the `exists` predicate the caller passes.
use std::path::{Path, PathBuf};

/// The procfs mount of NVSentinel's chart.
pub const NVSENTINEL_PROC: &str = "/nvsentinel/proc";
/// The boot ID file relative to the procfs root.
pub const BOOT_ID_REL: &str = "sys/kernel/random/boot_id";

/// One resolved path and where it came from (`--sysfs`, `config sysClassNetPath`, `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub path: PathBuf,
    pub source: String,
}

impl Resolved {
    fn new(path: impl Into<PathBuf>, source: impl Into<String>) -> Resolved {
        Resolved { path: path.into(), source: source.into() }
    }
}

/// What the paths are resolved from: the flags and the config's two keys (empty = unset).
#[derive(Debug, Clone, Default)]
pub struct PathInputs<'a> {
    pub sysfs: Option<&'a Path>,
    pub procfs: Option<&'a Path>,
    pub boot_id_path: Option<&'a Path>,
    pub sys_class_infiniband: Option<&'a str>,
    pub sys_class_net: Option<&'a str>,
}

/// The host paths nicmon reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    pub sysfs: Resolved,
    pub procfs: Resolved,
    /// The boot ID file.
    pub boot_id: Resolved,
    /// Config keys that do not change anything (a `--sysfs` given beside them).
    pub warnings: Vec<String>,
}

impl HostPaths {
    /// `class/infiniband` and `class/net` as read (under the sysfs root).
    pub fn class_dirs(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("class/infiniband", self.sysfs.path.join("class/infiniband")),
            ("class/net", self.sysfs.path.join("class/net")),
        ]
    }

    /// One line per path and its source (`nicmon run --check-config`).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let [(_, ib), (_, net)] = self.class_dirs();
        for (what, path, source) in [
            ("sysfs root", &self.sysfs.path, &self.sysfs.source),
            ("  infiniband", &ib, &self.sysfs.source),
            ("  net", &net, &self.sysfs.source),
            ("procfs root", &self.procfs.path, &self.procfs.source),
            ("  net/route", &self.procfs.path.join("net/route"), &self.procfs.source),
            ("boot ID", &self.boot_id.path, &self.boot_id.source),
        ] {
            out.push_str(&format!("{:<19}{} ({source})\n", format!("{what}:"), path.display()));
        }
        out
    }
}

/// Why the host paths cannot be resolved: each names the config keys and values at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathsError {
    /// A `sysClass*Path` key whose value does not end in the class directory it names.
    #[error("config: {key} = {value:?}: expected a path ending in /{rel} (nicmon reads the sysfs root above it)")]
    NotUnderClass { key: &'static str, value: String, rel: &'static str },
    /// Two `sysClass*Path` keys under different sysfs roots.
    #[error(transparent)]
    DifferentRoots(Box<DifferentRoots>),
}

/// Two `sysClass*Path` keys (and their values) under different sysfs roots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "config: {key} = {value:?} and {other_key} = {other_value:?} are under different sysfs roots ({} and {}): \
     nicmon reads one root (or give --sysfs)",
    root.display(),
    other_root.display()
)]
pub struct DifferentRoots {
    pub key: &'static str,
    pub value: String,
    pub root: PathBuf,
    pub other_key: &'static str,
    pub other_value: String,
    pub other_root: PathBuf,
}

/// Resolve the host paths. An error names the key and value that cannot be used.
pub fn resolve(inputs: &PathInputs<'_>, exists: impl Fn(&Path) -> bool) -> Result<HostPaths, PathsError> {
    let keys = [
        ("sysClassInfinibandPath", inputs.sys_class_infiniband, "class/infiniband"),
        ("sysClassNetPath", inputs.sys_class_net, "class/net"),
    ];
    let mut warnings = Vec::new();
    let sysfs = match inputs.sysfs {
        Some(p) => {
            for (key, value, rel) in keys {
                let Some(v) = value.filter(|v| !v.trim().is_empty()) else { continue };
                if Path::new(v.trim_end_matches('/')) != p.join(rel) {
                    warnings.push(format!("config: {key} = {v:?} is not used: --sysfs {} is given", p.display()));
                }
            }
            Resolved::new(p, "--sysfs")
        }
        None => {
            let mut root: Option<(PathBuf, &str, &str)> = None;
            let mut from: Vec<&str> = Vec::new();
            for (key, value, rel) in keys {
                let Some(v) = value.filter(|v| !v.trim().is_empty()) else { continue };
                let r = sysfs_root_of(v, rel).ok_or_else(|| PathsError::NotUnderClass {
                    key,
                    value: v.to_string(),
                    rel,
                })?;
                match &root {
                    Some((other, okey, ov)) if *other != r => {
                        return Err(PathsError::DifferentRoots(Box::new(DifferentRoots {
                            key,
                            value: v.to_string(),
                            root: r,
                            other_key: okey,
                            other_value: ov.to_string(),
                            other_root: other.clone(),
                        })));
                    }
                    Some(_) => {}
                    None => root = Some((r, key, v)),
                }
                from.push(key);
            }
            match root {
                Some((r, _, _)) => Resolved::new(r, format!("config {}", from.join(", "))),
                None => Resolved::new("/sys", "default"),
            }
        }
    };
    let procfs = match (inputs.procfs, inputs.boot_id_path.and_then(procfs_root_of)) {
        (Some(p), _) => Resolved::new(p, "--procfs"),
        (None, Some(p)) => Resolved::new(p, "--boot-id-path prefix"),
        (None, None) if exists(Path::new(NVSENTINEL_PROC)) => Resolved::new(NVSENTINEL_PROC, "present"),
        (None, None) => Resolved::new("/proc", "default"),
    };
    let boot_id = match inputs.boot_id_path {
        Some(p) => Resolved::new(p, "--boot-id-path"),
        None => Resolved::new(procfs.path.join(BOOT_ID_REL), "procfs root"),
    };
    Ok(HostPaths { sysfs, procfs, boot_id, warnings })
}

/// `/nvsentinel/sys/class/net/` with `rel` = `class/net` → `/nvsentinel/sys`.
fn sysfs_root_of(value: &str, rel: &str) -> Option<PathBuf> {
    let p = Path::new(value.trim().trim_end_matches('/'));
    let rel = Path::new(rel);
    if !p.ends_with(rel) {
        return None;
    }
    let mut root = p.to_path_buf();
    for _ in rel.components() {
        root.pop();
    }
    (!root.as_os_str().is_empty()).then_some(root)
}

/// `/nvsentinel/proc/sys/kernel/random/boot_id` → `/nvsentinel/proc`.
fn procfs_root_of(boot_id: &Path) -> Option<PathBuf> {
    let rel = Path::new(BOOT_ID_REL);
    if !boot_id.ends_with(rel) {
        return None;
    }
    let mut root = boot_id.to_path_buf();
    for _ in rel.components() {
        root.pop();
    }
    (!root.as_os_str().is_empty()).then_some(root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn never(_: &Path) -> bool {
        false
    }

    #[test]
    fn upstream_chart_paths() {
        let inputs = PathInputs {
            boot_id_path: Some(Path::new("/nvsentinel/proc/sys/kernel/random/boot_id")),
            sys_class_infiniband: Some("/nvsentinel/sys/class/infiniband"),
            sys_class_net: Some("/nvsentinel/sys/class/net/"),
            ..Default::default()
        };
        let p = resolve(&inputs, never).unwrap();
        assert_eq!(p.sysfs, Resolved::new("/nvsentinel/sys", "config sysClassInfinibandPath, sysClassNetPath"));
        assert_eq!(p.procfs, Resolved::new("/nvsentinel/proc", "--boot-id-path prefix"));
        assert_eq!(p.boot_id.path, Path::new("/nvsentinel/proc/sys/kernel/random/boot_id"));
        assert!(p.warnings.is_empty());
        let text = p.describe();
        assert!(text.contains("/nvsentinel/sys/class/net (config sysClassInfinibandPath, sysClassNetPath)"), "{text}");
        assert!(text.contains("/nvsentinel/proc/net/route (--boot-id-path prefix)"), "{text}");
    }

    #[test]
    fn flags_win_and_defaults_apply() {
        let inputs = PathInputs {
            sysfs: Some(Path::new("/t/sys")),
            procfs: Some(Path::new("/t/proc")),
            boot_id_path: Some(Path::new("/nvsentinel/proc/sys/kernel/random/boot_id")),
            sys_class_net: Some("/nvsentinel/sys/class/net"),
            ..Default::default()
        };
        let p = resolve(&inputs, never).unwrap();
        assert_eq!(p.sysfs, Resolved::new("/t/sys", "--sysfs"));
        assert_eq!(p.procfs, Resolved::new("/t/proc", "--procfs"));
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].contains("sysClassNetPath"), "{:?}", p.warnings);
        let p = resolve(&PathInputs::default(), never).unwrap();
        assert_eq!((p.sysfs.path.as_path(), p.procfs.path.as_path()), (Path::new("/sys"), Path::new("/proc")));
        assert_eq!(p.boot_id.path, Path::new("/proc/sys/kernel/random/boot_id"));
        let p = resolve(&PathInputs::default(), |d| d == Path::new(NVSENTINEL_PROC)).unwrap();
        assert_eq!(p.procfs, Resolved::new(NVSENTINEL_PROC, "present"));
        // An empty key is unset; a boot ID path elsewhere gives no procfs root.
        let inputs = PathInputs {
            sys_class_infiniband: Some(""),
            boot_id_path: Some(Path::new("/tmp/boot_id")),
            ..Default::default()
        };
        let p = resolve(&inputs, never).unwrap();
        assert_eq!(p.sysfs.source, "default");
        assert_eq!(p.procfs.source, "default");
    }

    #[test]
    fn unusable_keys_are_named() {
        let e = resolve(&PathInputs { sys_class_net: Some("/host/net"), ..Default::default() }, never)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sysClassNetPath = \"/host/net\"") && e.contains("class/net"), "{e}");
        let inputs = PathInputs {
            sys_class_infiniband: Some("/a/sys/class/infiniband"),
            sys_class_net: Some("/b/sys/class/net"),
            ..Default::default()
        };
        let e = resolve(&inputs, never).unwrap_err().to_string();
        assert!(e.contains("sysClassNetPath") && e.contains("sysClassInfinibandPath"), "{e}");
        assert!(resolve(&PathInputs { sys_class_net: Some("class/net"), ..Default::default() }, never).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(ib in "\\PC{0,40}", net in "\\PC{0,40}", boot in "\\PC{0,40}") {
            let inputs = PathInputs {
                sys_class_infiniband: Some(&ib),
                sys_class_net: Some(&net),
                boot_id_path: Some(Path::new(&boot)),
                ..Default::default()
            };
            let _ = resolve(&inputs, never);
        }
    }
}
