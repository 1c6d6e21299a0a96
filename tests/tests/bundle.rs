//! Support bundles (issue #19): `nicmon bundle` on a node, `nicmon check --bundle` anywhere,
//! the same output as the live run at the same `--now`.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, nicmon_bin};

const NODE: &str = "gpu-node-7";

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

/// The host-path flags of `check` and `bundle` on this node.
fn host_flags(node: &Node, state: &Path) -> Vec<String> {
    let p = |p: PathBuf| p.to_str().unwrap().to_string();
    vec![
        "--sysfs".into(),
        p(node.sys()),
        "--procfs".into(),
        p(node.proc()),
        "--metadata".into(),
        p(node.metadata_path()),
        "--config".into(),
        "/nonexistent/nicmon.toml".into(),
        "--state-file".into(),
        p(state.to_path_buf()),
    ]
}

fn nicmon(args: &[String]) -> Command {
    let mut cmd = Command::new(nicmon_bin());
    cmd.args(args).env_remove("NODE_NAME").env("RUST_LOG", "info").arg("--log-json");
    cmd
}

/// `nicmon bundle` of the node, bounded by `timeout` so a hang fails the test.
fn bundle(node: &Node, state: &Path, out: &Path) -> Output {
    let mut args: Vec<String> = vec!["bundle".into()];
    args.extend(host_flags(node, state));
    args.extend(["--node-name", NODE, "--no-kmsg", "--no-metrics", "-o"].map(String::from));
    args.push(out.to_str().unwrap().into());
    let out = Command::new("timeout")
        .arg("120")
        .arg(nicmon_bin())
        .args(&args)
        .env_remove("NODE_NAME")
        .output()
        .expect("running nicmon bundle");
    ok(out, "nicmon bundle")
}

fn live_check(node: &Node, state: &Path, now: &str) -> Output {
    let mut args: Vec<String> = vec!["check".into()];
    args.extend(host_flags(node, state));
    args.extend(["--node-name", NODE, "--format", "json", "--now", now].map(String::from));
    ok(nicmon(&args).output().unwrap(), "live nicmon check")
}

fn replay_check(file: &Path, now: &str) -> Output {
    let args: Vec<String> =
        ["check", "--bundle", file.to_str().unwrap(), "--format", "json", "--now", now].map(String::from).to_vec();
    ok(nicmon(&args).output().unwrap(), "nicmon check --bundle")
}

/// The messages a run logged (poll notes, topology notes), without timestamps or paths.
fn messages(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["fields"]["message"].as_str().map(str::to_string))
        .collect()
}

/// A file of the bundle archive.
fn bundle_file(file: &Path, name: &str) -> Option<Vec<u8>> {
    let f = std::fs::File::open(file).unwrap();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some(name) {
            let mut v = Vec::new();
            e.read_to_end(&mut v).unwrap();
            return Some(v);
        }
    }
    None
}

/// Replay log messages name the bundle's temporary tree where the live run named the node's
/// files (the printed report names the node's): map one to the other.
fn as_node(messages: Vec<String>, node: &Node) -> Vec<String> {
    let meta = format!("{}:", node.metadata_path().display());
    messages
        .into_iter()
        .map(|m| {
            m.split(' ')
                .map(|w| if w.contains("nicmon-bundle-") && w.ends_with("/metadata.json:") { meta.as_str() } else { w })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn assert_same(node: &Node, live: &Output, replay: &Output, what: &str) {
    if live.stdout != replay.stdout {
        let dir = std::env::temp_dir();
        std::fs::write(dir.join("bundle-live.json"), &live.stdout).unwrap();
        std::fs::write(dir.join("bundle-replay.json"), &replay.stdout).unwrap();
        panic!("{what}: replay differs from the live run (see {}/bundle-{{live,replay}}.json)", dir.display());
    }
    assert_eq!(messages(live), as_node(messages(replay), node), "{what}: logged notes differ");
}

#[test]
fn every_platform_replays_byte_identical_to_the_live_run() {
    for p in Platform::ALL {
        let node = p.build();
        let state = node.root().join("state.json");
        let file = node.root().join("bundle.tar.gz");

        // First cycle: no state file yet.
        bundle(&node, &state, &file);
        let t0 = "2026-03-01T10:00:00Z";
        let live = live_check(&node, &state, t0);
        let replay = replay_check(&file, t0);
        assert_same(&node, &live, &replay, &format!("{} first cycle", p.name()));
        let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
        assert_eq!(report["node_name"], NODE);
        assert!(!report["devices"].as_array().unwrap().is_empty(), "{}", p.name());

        // Second cycle, state included, after a fault: the replay decides the same events.
        let pf = node.pfs().into_iter().next().unwrap();
        node.pull_cable(&pf, 1);
        bundle(&node, &state, &file);
        let t1 = "2026-03-01T10:00:05Z";
        let live = live_check(&node, &state, t1);
        let replay = replay_check(&file, t1);
        assert_same(&node, &live, &replay, &format!("{} after pulling {pf}'s cable", p.name()));
        let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
        let dev = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == pf.as_str()).unwrap();
        assert_eq!(dev["ports"][0]["healthy"], false, "{}: the pulled cable is not in the replay", p.name());

        // Without the metadata file: the sysfs fallback, and its note naming the node's path.
        node.remove_metadata();
        bundle(&node, &state, &file);
        let topo_live = {
            let mut a: Vec<String> = vec!["topology".into()];
            a.extend(host_flags(&node, &state)[..8].iter().cloned());
            a.extend(["--format", "json"].map(String::from));
            ok(nicmon(&a).output().unwrap(), "live topology")
        };
        let topo_replay = ok(
            nicmon(&["topology", "--bundle", file.to_str().unwrap(), "--format", "json"].map(String::from))
                .output()
                .unwrap(),
            "topology --bundle",
        );
        assert_eq!(
            String::from_utf8_lossy(&topo_live.stdout),
            String::from_utf8_lossy(&topo_replay.stdout),
            "{} topology",
            p.name()
        );
        let t2 = "2026-03-01T10:00:10Z";
        let live = live_check(&node, &state, t2);
        let replay = replay_check(&file, t2);
        assert_same(&node, &live, &replay, &format!("{} without metadata", p.name()));
        let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
        assert_eq!(report["topology_source"], "sysfs", "{}", p.name());

        let size = std::fs::metadata(&file).unwrap().len();
        eprintln!("{}: bundle {size} bytes", p.name());
        if p == Platform::DgxH100 {
            assert!(size < 1 << 20, "the DGX-H100 bundle is {size} bytes, over 1 MiB");
        }
    }
}

#[test]
fn dangling_link_einval_counter_and_fifo_replay_with_the_same_notes() {
    let node = Platform::H100Oci.build();
    // A dangling symlink where a counter should be.
    let ib = node.sys().join(&node.info["mlx5_4"].ib_dir);
    let dangling = ib.join("ports/1/counters/port_rcv_errors");
    std::fs::remove_file(&dangling).unwrap();
    std::os::unix::fs::symlink("../../../nonexistent/target", &dangling).unwrap();
    // A FIFO: a read that would block forever without O_NONBLOCK.
    let fifo = node.sys().join(&node.info["mlx5_2"].ib_dir).join("ports/1/counters/link_downed");
    std::fs::remove_file(&fifo).unwrap();
    // mkfifo(3) through the `mkfifo` command keeps this test crate free of unsafe code.
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success(), "mkfifo {}", fifo.display());
    let einval = node.make_einval("mlx5_0", 1, "counters/symbol_error");
    if !einval {
        eprintln!("no EINVAL file on this host (/sys/class/net/lo/speed): the EINVAL part is not covered");
    }
    let state = node.root().join("state.json");
    let file = node.root().join("bundle.tar.gz");
    bundle(&node, &state, &file);

    let t = "2026-03-01T10:00:00Z";
    let live = live_check(&node, &state, t);
    let replay = replay_check(&file, t);
    assert_same(&node, &live, &replay, "faulty tree");
    let notes = messages(&replay);
    for c in ["link_downed", "port_rcv_errors"] {
        assert!(notes.iter().any(|n| n.contains(&format!("counter {c} absent on"))), "no note for {c}: {notes:?}");
    }
    let manifest: serde_json::Value = serde_json::from_slice(&bundle_file(&file, "manifest.json").unwrap()).unwrap();
    let failures = manifest["failures"].as_array().unwrap();
    let why = |path: &Path| {
        failures.iter().find(|f| f["path"] == path.to_str().unwrap()).map(|f| f["why"].as_str().unwrap().to_string())
    };
    assert_eq!(why(&fifo).as_deref(), Some("not-regular:a FIFO"), "{failures:?}");
    if einval {
        assert!(notes.iter().any(|n| n.contains("counter symbol_error absent on")), "{notes:?}");
        let p = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1/counters/symbol_error");
        assert_eq!(why(&p).as_deref(), Some("errno=22"), "{failures:?}");
        // The next cycle remembers it (the state file's EINVAL memo) in both.
        let t = "2026-03-01T10:00:01Z";
        bundle(&node, &state, &file);
        assert_same(&node, &live_check(&node, &state, t), &replay_check(&file, t), "faulty tree, second cycle");
    }
    assert_eq!(manifest["complete"], true);
}

/// The PCIe files (link figures of the NIC and its upstream port, AER statistics) travel in
/// the bundle: a replay shows the same links and decides the same PCIe events.
#[test]
fn pcie_links_and_aer_counts_replay_from_the_bundle() {
    use nicmon_tests::pcie::AerFile;
    let node = Platform::DgxH100.build();
    let state = node.root().join("state.json");
    let file = node.root().join("bundle.tar.gz");
    let t0 = "2026-03-01T10:00:00Z";
    live_check(&node, &state, t0);

    node.set_pcie_link("mlx5_2", Some((8, 5)));
    node.set_slot_capability("mlx5_5", 16, 4);
    node.set_aer("mlx5_6", AerFile::Fatal, &[("SDES", 1)]);
    node.set_aer("mlx5_0", AerFile::Correctable, &[("BadTLP", 3)]);
    node.remove_aer("mlx5_7");
    bundle(&node, &state, &file);
    let t1 = "2026-03-01T10:00:05Z";
    let live = live_check(&node, &state, t1);
    let replay = replay_check(&file, t1);
    assert_same(&node, &live, &replay, "PCIe faults");

    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let dev = |n: &str| report["devices"].as_array().unwrap().iter().find(|d| d["name"] == n).unwrap().clone();
    assert_eq!(dev("mlx5_2")["pcie"]["link"], "x8 Gen5");
    assert_eq!(dev("mlx5_5")["pcie"]["capable_speed_gts"], 16.0, "the upstream port's maximum is in the bundle");
    assert_eq!(dev("mlx5_0")["pcie"]["aer_correctable"], 3);
    assert!(dev("mlx5_7")["pcie"]["aer_fatal"].is_null());
    let pcie: Vec<(String, String)> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["checkName"] == "NICPCIeCheck")
        .map(|e| {
            (
                e["entitiesImpacted"][0]["entityValue"].as_str().unwrap().into(),
                e["errorCode"][0].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        pcie,
        vec![("mlx5_2".to_string(), "pcie_link_downtrained".to_string()), ("mlx5_6".into(), "aer_fatal".into())],
        "{:#?}",
        report["events"]
    );
}

/// The port history travels: `check --format json` carries each port's transitions, the
/// bundle's state file holds them, and `nicmon history --bundle` prints them anywhere.
#[test]
fn the_port_history_is_in_check_json_and_in_the_bundle() {
    let node = Platform::DgxH100.build();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let check = |now: &str| {
        let mut args = vec!["check".to_string()];
        args.extend(host_flags(&node, &state));
        args.extend(["--node-name", NODE, "--format", "json", "--now", now].map(String::from));
        let out = ok(nicmon(&args).output().unwrap(), "nicmon check");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    check("2026-01-01T00:00:00Z");
    node.pull_cable("mlx5_3", 1);
    let report = check("2026-01-01T00:00:01.250Z");
    let port = &report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_3").unwrap()["ports"][0];
    let seen: Vec<(&str, i64, &str)> = port["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["state"].as_str().unwrap(), t["at_ms"].as_i64().unwrap(), t["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(seen, [("ACTIVE", 1_767_225_600_000, "reported"), ("DOWN", 1_767_225_601_250, "reported")]);

    let file = dir.path().join("node.tar.gz");
    bundle(&node, &state, &file);
    let mut history = nicmon(&["history".into(), "mlx5_3".into(), "--bundle".into(), file.to_str().unwrap().into()]);
    let text = String::from_utf8(ok(history.output().unwrap(), "nicmon history").stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[1].starts_with("2026-01-01T00:00:01.250Z  mlx5_3/1"), "{text}");
    assert!(
        lines[1].contains("DOWN/Polling") && lines[1].contains("reported, probable cause: unknown  (no wake-up)"),
        "{text}"
    );
}

#[test]
fn roce_ethtool_data_is_captured_and_replayed_byte_identically() {
    // A RoCE node whose netdevs' ethtool data is replayed from a directory (the testbed's
    // stand-in for netlink): the bundle holds each as ethtool/<netdev>.json, byte for byte,
    // and `check --bundle` replays the same report as the live run.
    let node = Platform::L40sOci.build();
    let dir = node.root().join("ethtool");
    std::fs::create_dir_all(&dir).unwrap();
    let text = "{\n  \"fec\": {\n    \"active\": \"RS\",\n    \"corrected_blocks\": 40,\n    \"uncorrectable_blocks\": 2,\n    \
                \"corrected_bits\": 12000,\n    \"lanes\": [\n      {\n        \"corrected_blocks\": 40,\n        \
                \"uncorrectable_blocks\": 2\n      }\n    ]\n  },\n  \"pause\": {\n    \"tx_frames\": 5,\n    \
                \"rx_frames\": 7\n  },\n  \"stats\": {\n    \"rx_prio3_pause_duration\": 900,\n    \
                \"tx_pause_storm_warning_events\": 0\n  }\n}\n";
    for i in [0, 3] {
        std::fs::write(dir.join(format!("rdma{i}.json")), text).unwrap();
    }
    // The testbed gives rdma1 a module: here it offers nothing at all.
    std::fs::remove_file(dir.join("rdma1.json")).unwrap();
    let state = node.root().join("state.json");
    let replay_flag = ["--ethtool-replay".to_string(), dir.to_str().unwrap().to_string()];
    let file = node.root().join("b.tar.gz");
    let mut args: Vec<String> = vec!["bundle".into()];
    args.extend(host_flags(&node, &state));
    args.extend(replay_flag.iter().cloned());
    args.extend(["--node-name", NODE, "--no-kmsg", "--no-metrics", "-o"].map(String::from));
    args.push(file.to_str().unwrap().into());
    ok(nicmon(&args).output().unwrap(), "nicmon bundle");
    for i in [0, 3] {
        assert_eq!(bundle_file(&file, &format!("ethtool/rdma{i}.json")).as_deref(), Some(text.as_bytes()), "rdma{i}");
    }
    assert_eq!(bundle_file(&file, "ethtool/rdma1.json"), None, "no data, no file");
    let now = "2026-03-01T12:00:00Z";
    let mut live: Vec<String> = vec!["check".into()];
    live.extend(host_flags(&node, &state));
    live.extend(replay_flag.iter().cloned());
    live.extend(["--node-name", NODE, "--format", "json", "--now", now].map(String::from));
    let live = ok(nicmon(&live).output().unwrap(), "live nicmon check");
    let replay = replay_check(&file, now);
    assert_same(&node, &live, &replay, "RoCE ethtool");
    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let d0 = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_0").unwrap();
    assert_eq!(d0["ports"][0]["phy"]["fec_mode"], "RS");
    assert_eq!(d0["ports"][0]["counters"]["ethtool/fec_uncorrectable"], 2);
}

/// A bundle is untrusted: one whose tree holds a link to a file of the replaying host is
/// refused in one line, and nothing of that file is printed.
#[test]
fn a_bundle_linking_out_to_a_host_file_is_refused_in_one_line() {
    let node = Platform::DgxH100.build();
    let state = node.root().join("state.json");
    let file = node.root().join("bundle.tar.gz");
    bundle(&node, &state, &file);
    let secret = node.root().join("host-secret");
    std::fs::write(&secret, "s3cret-host-line\n").unwrap();
    // The same bundle with each device's fw_ver a link to the host file.
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&file).unwrap()));
    let mut out = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let mut linked = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().into_owned();
        let mut h = e.header().clone();
        if path.ends_with("fw_ver") {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            out.append_link(&mut h, &path, &secret).unwrap();
            linked.push(path);
            continue;
        }
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        match e.header().link_name().unwrap() {
            Some(target) => out.append_link(&mut h, &path, target).unwrap(),
            None => out.append_data(&mut h, &path, &data[..]).unwrap(),
        }
    }
    assert!(!linked.is_empty(), "no fw_ver in the bundle");
    let evil = node.root().join("evil.tar.gz");
    std::fs::write(&evil, out.into_inner().unwrap().finish().unwrap()).unwrap();
    for format in ["json", "table"] {
        let args = ["check", "--bundle", evil.to_str().unwrap(), "--format", format].map(String::from);
        let run = nicmon(&args).output().unwrap();
        assert!(!run.status.success(), "{format}: the bundle was replayed");
        let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(!stdout.contains("s3cret") && !stderr.contains("s3cret"), "{format}: the host file was read");
        let line =
            format!("entry {} refused: a link to {}, which leaves the bundle", linked[0].display(), secret.display());
        assert!(stderr.contains(&line), "{format}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{format}: {stderr}");
    }
}

#[test]
fn nic_sensors_and_devlink_reporters_are_captured_and_replayed_byte_identically() {
    // A node with a hot ASIC and a firmware reporter in error: the bundle holds the hwmon
    // files of the monitored NICs in its sys tree and devlink/<BDF>.json byte for byte, and
    // `check --bundle` replays the live run's report and events.
    let node = Platform::DgxH100.build();
    node.set_temperature("mlx5_0", 1, 104_000);
    node.bump_reporter("mlx5_0", "fw", 1);
    let bdf = node.info["mlx5_0"].bdf.clone();
    let source = std::fs::read(node.devlink_dir().join(format!("{bdf}.json"))).unwrap();
    let state = node.root().join("state.json");
    let replay_flag = ["--devlink-replay".to_string(), node.devlink_dir().to_str().unwrap().to_string()];
    let file = node.root().join("b.tar.gz");
    let mut args: Vec<String> = vec!["bundle".into()];
    args.extend(host_flags(&node, &state));
    args.extend(replay_flag.iter().cloned());
    args.extend(["--node-name", NODE, "--no-kmsg", "--no-metrics", "-o"].map(String::from));
    args.push(file.to_str().unwrap().into());
    ok(nicmon(&args).output().unwrap(), "nicmon bundle");
    assert_eq!(bundle_file(&file, &format!("devlink/{bdf}.json")).as_deref(), Some(source.as_slice()));
    let hwmon = node.hwmon_dir("mlx5_0");
    let rel = hwmon.strip_prefix(node.root()).unwrap().to_str().unwrap().to_string();
    assert_eq!(bundle_file(&file, &format!("{rel}/temp1_input")).as_deref(), Some(&b"104000\n"[..]));
    assert_eq!(bundle_file(&file, &format!("{rel}/temp2_label")).as_deref(), Some(&b"sensor64\n"[..]));
    let now = "2026-03-01T12:00:00Z";
    let mut live: Vec<String> = vec!["check".into()];
    live.extend(host_flags(&node, &state));
    live.extend(replay_flag.iter().cloned());
    live.extend(["--node-name", NODE, "--format", "json", "--now", now].map(String::from));
    let live = ok(nicmon(&live).output().unwrap(), "live nicmon check");
    let replay = replay_check(&file, now);
    assert_same(&node, &live, &replay, "sensors and reporters");
    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let codes: Vec<(&str, &str)> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["isHealthy"] == false)
        .map(|e| (e["checkName"].as_str().unwrap(), e["errorCode"][0].as_str().unwrap()))
        .collect();
    assert!(codes.contains(&("NICThermalCheck", "nic_overheating")), "{codes:?}");
    assert!(codes.contains(&("NICFirmwareCheck", "fw_error")), "{codes:?}");
}

#[test]
fn transceiver_pages_are_captured_and_replayed_byte_identically() {
    // A RoCE cable pulled (its module dark) and a module with a Tx fault: the bundle's
    // ethtool/<netdev>.json holds each module's pages as read, and `check --bundle` replays
    // the live run's report and events (the optics events and the probable cause).
    let node = Platform::DgxH100.build();
    node.pull_cable("mlx5_8", 1);
    node.set_module("mlx5_9", |m| nicmon_tests::optics::Module { tx_fault: vec![1], ..m });
    let state = node.root().join("state.json");
    let replay_flag = ["--ethtool-replay".to_string(), node.ethtool_dir().to_str().unwrap().to_string()];
    let file = node.root().join("b.tar.gz");
    let mut args: Vec<String> = vec!["bundle".into()];
    args.extend(host_flags(&node, &state));
    args.extend(replay_flag.iter().cloned());
    args.extend(["--node-name", NODE, "--no-kmsg", "--no-metrics", "-o"].map(String::from));
    args.push(file.to_str().unwrap().into());
    ok(nicmon(&args).output().unwrap(), "nicmon bundle");
    for dev in ["mlx5_8", "mlx5_9", "mlx5_10"] {
        let nd = node.info[dev].netdev.clone().unwrap();
        let source: serde_json::Value =
            serde_json::from_slice(&std::fs::read(node.ethtool_dir().join(format!("{nd}.json"))).unwrap()).unwrap();
        let captured = bundle_file(&file, &format!("ethtool/{nd}.json")).unwrap_or_else(|| panic!("{nd} not captured"));
        let captured: serde_json::Value = serde_json::from_slice(&captured).unwrap();
        assert_eq!(captured["module"], source["module"], "{dev}");
    }
    let now = "2026-03-01T12:00:00Z";
    let mut live: Vec<String> = vec!["check".into()];
    live.extend(host_flags(&node, &state));
    live.extend(replay_flag.iter().cloned());
    live.extend(["--node-name", NODE, "--format", "json", "--now", now].map(String::from));
    let live = ok(nicmon(&live).output().unwrap(), "live nicmon check");
    let replay = replay_check(&file, now);
    assert_same(&node, &live, &replay, "transceivers");
    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let codes: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["isHealthy"] == false)
        .filter_map(|e| e["errorCode"][0].as_str())
        .collect();
    assert!(codes.contains(&"optic_rx_los") && codes.contains(&"optic_tx_fault"), "{codes:?}");
}
