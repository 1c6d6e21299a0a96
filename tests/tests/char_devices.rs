//! `InfiniBandCharDeviceCheck` scenarios: a node whose ports are ACTIVE/LinkUp but whose
//! `/dev/infiniband` nodes are missing. Each test drives a testbed node through successive
//! `nicmon check --state-file … --now …` cycles (one daemon poll each).
use std::path::Path;

use nicmon_tests::platforms::Platform;
use nicmon_tests::{Timeline, brief};

type Brief = (String, bool, bool, String, String);

fn char_events(events: &[serde_json::Value]) -> Vec<Brief> {
    events.iter().map(brief).filter(|b| b.0 == "InfiniBandCharDeviceCheck").collect()
}

fn fatal(ents: &str, code: &str) -> Brief {
    ("InfiniBandCharDeviceCheck".into(), false, true, ents.into(), code.into())
}

fn healthy(ents: &str, code: &str) -> Brief {
    ("InfiniBandCharDeviceCheck".into(), true, false, ents.into(), code.into())
}

/// One cycle with info logs and optionally a config file: (exit code, report, stderr).
fn cycle(tl: &Timeline, t: i64, config: Option<&Path>) -> (Option<i32>, serde_json::Value, String) {
    let node = tl.node;
    let config = config.map(|p| p.to_str().unwrap().to_string()).unwrap_or("/nonexistent/nicmon.toml".into());
    let out = std::process::Command::new(nicmon_tests::nicmon_bin())
        .arg("check")
        .args(["--sysfs".as_ref(), node.sys().as_os_str()])
        .args(["--procfs".as_ref(), node.proc().as_os_str()])
        .args(["--metadata".as_ref(), node.metadata_path().as_os_str()])
        .args(["--config", &config, "--format", "json", "--node-name", "node-a"])
        .args(["--state-file".as_ref(), tl.state_file.as_os_str()])
        .args(["--now", &tl.at(t)])
        .env("RUST_LOG", "info")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_default();
    (out.status.code(), report, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn finding<'a>(report: &'a serde_json::Value, kind: &str, dev: &str, port: Option<u32>) -> &'a serde_json::Value {
    report["char_devices"]
        .as_array()
        .expect("char_devices")
        .iter()
        .find(|f| f["kind"] == kind && f["device"] == dev && f["port"] == serde_json::json!(port))
        .unwrap_or_else(|| panic!("no {kind} finding for {dev} {port:?}: {:#}", report["char_devices"]))
}

#[test]
fn umad_loss_on_one_port_is_fatal_after_three_polls_and_recovers_when_seen_again() {
    // H100 OCI: 16 IB compute PFs (uverbs + umad each), 2 RoCE storage NICs (none expected).
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    let r = tl.report(0);
    assert!(char_events(r["events"].as_array().unwrap()).is_empty());
    let findings = r["char_devices"].as_array().unwrap();
    assert_eq!(findings.len(), 32, "{findings:#?}");
    assert!(findings.iter().all(|f| f["present"] == true && f["misses"] == 0));
    assert!(!findings.iter().any(|f| f["device"] == "mlx5_2"), "RoCE devices expect no MAD nodes");

    node.remove_char_node("umad", "mlx5_3", Some(1));
    for t in 1..=2 {
        let r = tl.report(t);
        assert!(r["events"].as_array().unwrap().is_empty(), "poll {t}: {:#}", r["events"]);
        let f = finding(&r, "umad", "mlx5_3", Some(1));
        assert_eq!((f["present"].clone(), f["misses"].clone()), (false.into(), t.into()));
    }
    let r = tl.report(3);
    let ev = r["events"].as_array().unwrap();
    assert_eq!(char_events(ev), vec![fatal("NIC=mlx5_3 NICPort=1", "umad")]);
    assert_eq!(ev.len(), 1, "ports stay ACTIVE/LinkUp: nothing else");
    assert_eq!(ev[0]["recommendedAction"], "REPLACE_VM");
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(msg.contains("umad missing from class/infiniband_mad") && msg.contains("/dev/infiniband/umad"), "{msg}");
    assert_eq!(finding(&r, "umad", "mlx5_3", Some(1))["reported_missing"], true);
    assert!(tl.poll(4).is_empty(), "latched: reported once");

    // The table says it too.
    let table = node.nicmon(
        "check",
        &["--metadata", node.metadata_path().to_str().unwrap(), "--state-file", tl.state_file.to_str().unwrap()],
    );
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("char device umad of mlx5_3 port 1: MISSING (reported)"), "{table}");

    node.restore_char_node("umad", "mlx5_3", Some(1));
    assert_eq!(char_events(&tl.poll(5)), vec![healthy("NIC=mlx5_3 NICPort=1", "umad")]);
    assert!(tl.poll(6).is_empty());

    // A uverbs loss names the device only.
    node.remove_char_node("uverbs", "mlx5_0", None);
    let mut fired = Vec::new();
    for t in 7..=9 {
        fired.extend(char_events(&tl.poll(t)).into_iter().map(|b| (t, b)));
    }
    assert_eq!(fired, vec![(9, fatal("NIC=mlx5_0", "uverbs"))]);
}

#[test]
fn issm_is_expected_only_when_configured_always() {
    let node = Platform::H100Oci.build();
    let always = node.root().join("always.toml");
    std::fs::write(&always, "[charDeviceCheck]\nissm = \"always\"\n").unwrap();
    let never = node.root().join("never.toml");
    std::fs::write(&never, "[charDeviceCheck]\nissm = \"never\"\n").unwrap();
    node.remove_char_node("issm", "mlx5_4", Some(1));

    // Default (never): the missing issm is not looked for.
    let tl = Timeline::new(&node);
    for t in 0..5 {
        let (code, r, err) = cycle(&tl, t, None);
        assert_eq!(code, Some(0), "{err}");
        assert!(char_events(r["events"].as_array().unwrap()).is_empty());
        assert!(!r["char_devices"].as_array().unwrap().iter().any(|f| f["kind"] == "issm"));
    }

    // always: one issm per IB port, the missing one fatal after 3 polls.
    let mut fired = Vec::new();
    for t in 5..10 {
        let (code, r, err) = cycle(&tl, t, Some(&always));
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(r["char_devices"].as_array().unwrap().iter().filter(|f| f["kind"] == "issm").count(), 16);
        fired.extend(char_events(r["events"].as_array().unwrap()).into_iter().map(|b| (t, b)));
    }
    assert_eq!(fired, vec![(7, fatal("NIC=mlx5_4 NICPort=1", "issm"))]);

    // Back to never while the issm fault is latched: one check-scoped clear (no entities,
    // 1 s earlier), and the issm latch is gone.
    let (_, r, _) = cycle(&tl, 10, Some(&never));
    let ev = r["events"].as_array().unwrap();
    assert_eq!(char_events(ev), vec![("InfiniBandCharDeviceCheck".into(), true, false, String::new(), String::new())]);
    assert_eq!(ev[0]["generatedTimestamp"], tl.at(9));
    assert!(cycle(&tl, 11, Some(&never)).1["events"].as_array().unwrap().is_empty());

    // A bad value stops nicmon with exit 2 and names the key.
    let bad = node.root().join("bad.toml");
    std::fs::write(&bad, "[charDeviceCheck]\nissm = \"auto\"\n").unwrap();
    let (code, _, err) = cycle(&tl, 12, Some(&bad));
    assert_eq!(code, Some(2));
    assert!(err.contains("charDeviceCheck.issm = \"auto\""), "{err}");
}

#[test]
fn a_class_directory_that_is_a_file_holds_the_check_and_siblings_are_monitored() {
    let node = Platform::H100Oci.build();
    let tl = Timeline::new(&node);
    cycle(&tl, 0, None);
    node.class_dir_as_file("infiniband_mad");
    node.remove_char_node("uverbs", "mlx5_1", None);

    let mut fired = Vec::new();
    let mut notes = 0;
    for t in 1..=4 {
        let (code, r, err) = cycle(&tl, t, None);
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        notes += err.matches("class/infiniband_mad cannot be listed").count();
        if t == 1 {
            assert!(err.contains("not a directory"), "{err}");
            assert_eq!(finding(&r, "umad", "mlx5_0", Some(1))["present"], serde_json::Value::Null, "held");
        }
        fired.extend(char_events(r["events"].as_array().unwrap()).into_iter().map(|b| (t, b)));
    }
    assert_eq!(notes, 1, "one clear note when the hold starts");
    // An unusable class directory holds the whole check: the uverbs loss is not counted
    // while infiniband_mad is a file.
    assert!(fired.is_empty(), "{fired:?}");
    // Port monitoring goes on.
    node.pull_cable("mlx5_5", 1);
    let ev = tl.poll(5);
    assert_eq!(
        ev.iter().map(brief).filter(|b| b.0 == "InfiniBandStateCheck" && !b.1 && b.3.contains("NICPort")).count(),
        1,
        "{ev:#?}"
    );

    // The directory comes back with every umad: nothing to recover; the uverbs loss is now
    // counted from its first miss and reported after three polls.
    node.restore_class_dir("infiniband_mad");
    node.repair("mlx5_5", 1);
    assert!(char_events(&tl.poll(6)).is_empty());
    assert!(char_events(&tl.poll(7)).is_empty());
    assert_eq!(char_events(&tl.poll(8)), vec![fatal("NIC=mlx5_1", "uverbs")]);
}

#[test]
fn an_absent_mad_directory_is_not_a_mass_failure() {
    // A node without ib_umad loaded: no infiniband_mad at all.
    let node = Platform::DgxH100.build();
    node.remove_class_dir("infiniband_mad");
    let tl = Timeline::new(&node);
    for t in 0..5 {
        assert!(char_events(&tl.poll(t)).is_empty());
    }
}
