//! `testbed`: write a simulated node's host tree to a directory, and mutate it.
//!
//! ```text
//! testbed write <platform> <dir>          platforms: a100-oci h100-oci l40s-oci onprem-l40s gb200-nvl4 dgx-h100
//!                                         aws-p5 aws-p4d mi300x-thor2 mi300x-pollara e810 rxe-ci
//! testbed write-sriov <vfs-per-pf> <dir>  the DGX-H100-like node with SR-IOV VFs on its IB PFs
//! testbed list
//! ```
//! The tree has `sys/` (with the NICs' hwmon sensors), `proc/`, `gpu_metadata.json`, the
//! RoCE NICs' transceivers in `ethtool/` and the devlink health reporters in `devlink/`;
//! point nicmon at it with `--sysfs <dir>/sys --procfs <dir>/proc --metadata
//! <dir>/gpu_metadata.json --ethtool-replay <dir>/ethtool --devlink-replay <dir>/devlink`.
use std::process::ExitCode;

use nicmon_tests::platforms::Platform;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["list"] => {
            for p in Platform::ALL.into_iter().chain(Platform::VENDORS) {
                let (m, c, s) = p.expected_roles();
                println!("{:<12} management={m} compute={c} storage={s}", p.name());
            }
            ExitCode::SUCCESS
        }
        ["write", platform, dir] => match Platform::parse(platform) {
            Some(p) => {
                let root = std::path::Path::new(dir);
                if let Err(e) = std::fs::create_dir_all(root) {
                    eprintln!("testbed: cannot create {dir}: {e}");
                    return ExitCode::from(2);
                }
                let node = p.build_at(root);
                let mut flags = format!("--sysfs {dir}/sys --procfs {dir}/proc");
                if p.has_metadata() {
                    flags.push_str(&format!(" --metadata {dir}/gpu_metadata.json"));
                }
                for (flag, at) in [("--ethtool-replay", node.ethtool_dir()), ("--devlink-replay", node.devlink_dir())] {
                    if at.is_dir() {
                        flags.push_str(&format!(" {flag} {}", at.display()));
                    }
                }
                println!("wrote {} to {dir}: {} devices; use {flags}", p.name(), node.info.len());
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("testbed: unknown platform {platform:?}: run `testbed list`");
                ExitCode::from(2)
            }
        },
        ["write-sriov", vfs, dir] => match vfs.parse::<u32>() {
            Ok(vfs) => {
                if let Err(e) = std::fs::create_dir_all(dir) {
                    eprintln!("testbed: cannot create {dir}: {e}");
                    return ExitCode::from(2);
                }
                let node = nicmon_tests::platforms::dgx_h100_with_vfs(vfs, Some(std::path::Path::new(dir)));
                println!(
                    "wrote dgx-h100 with {vfs} VFs per IB PF to {dir}: {} devices; use --sysfs {dir}/sys --procfs {dir}/proc \
                     --metadata {dir}/gpu_metadata.json",
                    node.info.len()
                );
                ExitCode::SUCCESS
            }
            Err(_) => {
                eprintln!("testbed: VFs per PF must be a number, got {vfs:?}");
                ExitCode::from(2)
            }
        },
        _ => {
            eprintln!("usage: testbed write <platform> <dir> | testbed write-sriov <vfs-per-pf> <dir> | testbed list");
            ExitCode::from(2)
        }
    }
}
