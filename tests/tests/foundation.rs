//! Discovery, roles and `nicmon check` against the ready-made nodes (issue: foundation).
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, role_counts};

#[test]
fn role_counts_match_the_field_validation_from_metadata_and_from_sysfs() {
    for p in Platform::ALL {
        let node = p.build();
        let with_meta = node.check_json(&[]);
        assert_eq!(with_meta["topology_source"], "metadata", "{}", p.name());
        assert_eq!(role_counts(&with_meta), p.expected_roles(), "{} from metadata", p.name());

        node.remove_metadata();
        let from_sysfs = node.check_json(&[]);
        assert_eq!(from_sysfs["topology_source"], "sysfs", "{}", p.name());
        assert_eq!(role_counts(&from_sysfs), p.expected_roles(), "{} from sysfs", p.name());

        // Same answer per device, not only in total.
        let roles = |r: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
            r["devices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| (d["name"].as_str().unwrap().to_string(), d["role"].clone()))
                .collect()
        };
        assert_eq!(roles(&with_meta), roles(&from_sysfs), "{}: per-device roles differ", p.name());
    }
}

#[test]
fn dgx_node_lists_vfs_unmonitored_and_reads_ports() {
    let node = Platform::DgxH100.build();
    let r = node.check_json(&[]);
    let devs = r["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 28);
    let vfs: Vec<_> = devs.iter().filter(|d| d["is_vf"] == true).collect();
    assert_eq!(vfs.len(), 16);
    for vf in &vfs {
        assert_eq!(vf["monitored"], false);
        assert!(vf["reason"].as_str().unwrap().contains("virtual function"));
        assert_eq!(vf["role"], serde_json::Value::Null);
    }
    let mlx0 = devs.iter().find(|d| d["name"] == "mlx5_0").unwrap();
    assert_eq!(mlx0["monitored"], true);
    assert_eq!(mlx0["role"], "compute");
    assert!(mlx0["role_reason"].as_str().unwrap().starts_with("PIX to GPU"), "{}", mlx0["role_reason"]);
    assert_eq!(mlx0["hca_type"], "MT4129");
    assert_eq!(mlx0["fw_ver"], "28.39.1002");
    assert_eq!(mlx0["netdev"], "ibp0s0");
    assert_eq!(mlx0["card"], mlx0["pci_address"].as_str().unwrap()[..10]);
    let port = &mlx0["ports"][0];
    assert_eq!(port["port"], 1);
    assert_eq!(port["state"], "ACTIVE");
    assert_eq!(port["phys_state"], "LinkUp");
    assert_eq!(port["link_layer"], "InfiniBand");
    assert_eq!(port["rate_gbps"], 400.0);
    assert_eq!(port["healthy"], true);
    assert_eq!(port["counters"]["link_downed"], 0);
    let storage = devs.iter().find(|d| d["name"] == "mlx5_8").unwrap();
    assert_eq!(storage["role"], "storage");
    assert_eq!(storage["ports"][0]["counters"]["carrier_changes"], 2);
}

#[test]
fn odd_sysfs_values_make_single_values_unknown() {
    let node = Platform::H100Oci.build();
    node.write_port_file("mlx5_0", 1, "counters/symbol_error", "N/A (no PMA)\n");
    node.write_port_file("mlx5_0", 1, "rate", "");
    node.write_port_file("mlx5_1", 1, "phys_state", "4: ACTIVE");
    node.write_port_file("mlx5_1", 1, "state", "4: ACTIVE");
    node.remove_port_file("mlx5_3", 1, "hw_counters/roce_slow_restart");
    node.remove_port_file("mlx5_3", 1, "state");
    // A port directory whose name is not a number is ignored.
    std::fs::create_dir_all(node.sys().join(&node.info["mlx5_4"].ib_dir).join("ports/lost+found")).unwrap();
    // A dangling symlink where a counter should be.
    let c = node.sys().join(&node.info["mlx5_4"].ib_dir).join("ports/1/counters/port_rcv_errors");
    std::fs::remove_file(&c).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", &c).unwrap();

    let r = node.check_json(&[]);
    let dev = |n: &str| r["devices"].as_array().unwrap().iter().find(|d| d["name"] == n).unwrap().clone();
    let p0 = &dev("mlx5_0")["ports"][0];
    assert!(p0["counters"].get("symbol_error").is_none());
    assert_eq!(p0["rate_gbps"], serde_json::Value::Null);
    assert_eq!(p0["healthy"], true);
    let p1 = &dev("mlx5_1")["ports"][0];
    assert_eq!(p1["phys_state"], "4: ACTIVE");
    assert_eq!(p1["healthy"], false);
    let p3 = &dev("mlx5_3")["ports"][0];
    assert_eq!(p3["state"], serde_json::Value::Null);
    assert!(p3["counters"].get("roce_slow_restart").is_none());
    assert_eq!(dev("mlx5_4")["ports"].as_array().unwrap().len(), 1);
    assert!(dev("mlx5_4")["ports"][0]["counters"].get("port_rcv_errors").is_none());
}

#[test]
fn einval_counter_is_opened_once_and_not_on_the_next_poll() {
    let node = Platform::H100Oci.build();
    if !node.make_einval("mlx5_0", 1, "counters/port_xmit_wait") {
        eprintln!("skipped: this host has no file that fails read() with EINVAL (/sys/class/net/lo/speed)");
        return;
    }
    if std::process::Command::new("strace").arg("-V").output().is_err() {
        eprintln!("skipped: strace is not installed");
        return;
    }
    let state = node.root().join("state.json");
    let state = state.to_str().unwrap();
    let opens = |tag: &str| -> usize {
        let log = node.root().join(format!("strace-{tag}.log"));
        let meta = node.metadata_path();
        let status = std::process::Command::new("strace")
            .args(["-f", "-e", "trace=open,openat", "-o"])
            .arg(&log)
            .arg(nicmon_tests::nicmon_bin())
            .args(["check", "--format", "json", "--config", "/nonexistent.toml", "--state-file", state])
            .arg("--sysfs")
            .arg(node.sys())
            .arg("--procfs")
            .arg(node.proc())
            .arg("--metadata")
            .arg(&meta)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("strace");
        assert!(status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines().filter(|l| l.contains("mlx5_0/ports/1/counters/port_xmit_wait")).count()
    };
    assert_eq!(opens("first"), 1, "the first poll opens the EINVAL counter once");
    assert_eq!(opens("second"), 0, "the next poll (same boot) must not open it again");
}

#[test]
fn development_machine_without_rdma_says_so_and_exits_0() {
    let node = Node::new("bare");
    let out = node.nicmon("check", &["--config", "/nonexistent.toml"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no RDMA devices found"));
    let out = node.nicmon("check", &["--format", "json", "--config", "/nonexistent.toml"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"], serde_json::json!([]));
    assert_eq!(v["topology_source"], "none");
}

#[test]
fn bad_flags_and_fail_fast_metadata_exit_2_naming_the_file() {
    let node = Platform::H100Oci.build();
    let out = node.nicmon("check", &["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));

    let missing = node.root().join("missing.json");
    let out = node.nicmon("check", &["--metadata-required", "--metadata", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains(missing.to_str().unwrap()), "{err}");

    std::fs::write(node.metadata_path(), "{garbage").unwrap();
    let out = node.nicmon("check", &["--metadata-required", "--metadata", node.metadata_path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("malformed"));
    // Without the flag: the sysfs fallback, exit 0.
    let r = node.check_json(&[]);
    assert_eq!(r["topology_source"], "sysfs");

    let bad_cfg = node.root().join("bad.toml");
    std::fs::write(&bad_cfg, "nicExclusionRegex = \"([\"\n").unwrap();
    let out = node.nicmon("check", &["--config", bad_cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nicExclusionRegex"));
}

#[test]
fn node_without_gpus_groups_by_link_layer() {
    let mut node = Node::new("no-gpu");
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![nicmon_tests::NicSpec::ib("mlx5_0"), nicmon_tests::NicSpec::ib("mlx5_1")]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![nicmon_tests::NicSpec::eth("mlx5_2", "ens2")]);
    let r = node.check_json(&[]);
    assert_eq!(r["topology_source"], "none");
    assert_eq!(role_counts(&r), (0, 2, 1));
}

#[test]
fn exclusion_and_inclusion_override() {
    let node = Platform::H100Oci.build();
    let cfg = node.root().join("c.toml");
    std::fs::write(&cfg, "nicExclusionRegex = \"^mlx5_1$,^mlx5_2$\"\n").unwrap();
    let out = node.nicmon(
        "check",
        &["--format", "json", "--config", cfg.to_str().unwrap(), "--metadata", node.metadata_path().to_str().unwrap()],
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(role_counts(&r), (0, 15, 1));
    let d1 = r["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_1").unwrap();
    assert!(d1["reason"].as_str().unwrap().contains("nicExclusionRegex"));

    std::fs::write(&cfg, "nicInclusionRegexOverride = \"^mlx5_[0-3]$\"\n").unwrap();
    let out = node.nicmon(
        "check",
        &["--format", "json", "--config", cfg.to_str().unwrap(), "--metadata", node.metadata_path().to_str().unwrap()],
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let monitored = r["devices"].as_array().unwrap().iter().filter(|d| d["monitored"] == true).count();
    assert_eq!(monitored, 4);
}
