//! Which part failed (SPEC §1.13) on a replayed RoCE node (L40S OCI): each port's module
//! memory in its ethtool replay file, a cable pull or a failing optic, and the probable cause
//! the link-down event carries (`metadata.probableCause`, `metadata.evidence`, the message's
//! end). Each `nicmon check --state-file … --now … --ethtool-replay DIR` is one daemon poll.
use nicmon_tests::optics::{Form, Module};
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, Timeline};

/// The device whose netdev is `netdev`.
fn device_of(node: &Node, netdev: &str) -> String {
    node.info.iter().find(|(_, i)| i.netdev.as_deref() == Some(netdev)).map(|(d, _)| d.clone()).unwrap()
}

/// The one unhealthy port event of `dev` in `events`.
fn down_event<'e>(events: &'e [serde_json::Value], dev: &str) -> &'e serde_json::Value {
    let hits: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["isHealthy"] == false && e["checkName"] == "EthernetStateCheck")
        .filter(|e| e["entitiesImpacted"][0]["entityValue"] == dev)
        .collect();
    assert_eq!(hits.len(), 1, "{events:#?}");
    hits[0]
}

/// A cable pull with every lane dark while this end transmits; a module with a Tx fault; a
/// CMIS module in Fault; a port down with a healthy module (nothing decides); and a port
/// without module data: each link-down event names its probable cause.
#[test]
fn a_dead_link_says_which_part_failed() {
    let node = Platform::L40sOci.build();
    let dir = node.root().join("ethtool");
    for i in 0..6 {
        let form = if i % 2 == 0 { Form::Qsfp56 } else { Form::Osfp };
        if i != 5 {
            Module::healthy(form).write(&dir, &format!("rdma{i}"));
        }
    }
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--ethtool-replay".into(), dir.to_str().unwrap().into()];
    // The testbed gives every RoCE PF a module: rdma5 has none here.
    let _ = std::fs::remove_file(dir.join("rdma5.json"));
    let ev = tl.poll(0);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");

    let devs: Vec<String> = (0..6).map(|i| device_of(&node, &format!("rdma{i}"))).collect();
    for d in [0, 1, 2, 3, 5] {
        node.pull_cable(&devs[d], 1);
    }
    // The cable pull darkens the module; these cases write their own (same poll).
    Module::healthy(Form::Qsfp56).dark().write(&dir, "rdma0");
    Module { tx_fault: vec![1, 2], ..Module::healthy(Form::Osfp) }.write(&dir, "rdma1");
    Module::healthy(Form::Qsfp56).write(&dir, "rdma2");
    Module { fault: true, ..Module::healthy(Form::Osfp) }.write(&dir, "rdma3");
    let ev = tl.poll(10);
    let cases = [
        (0, "cable-or-far-end", Some("Rx LOS on 4 of 4 lanes")),
        (1, "optic", Some("Tx fault, lanes 1\u{2013}2")),
        (2, "unknown", None),
        (3, "optic", Some("CMIS module state Fault")),
        (5, "unknown", None),
    ];
    for (i, cause, evidence) in cases {
        let e = down_event(&ev, &devs[i]);
        assert_eq!(e["isFatal"], true, "{e:#}");
        assert_eq!(e["recommendedAction"], "REPLACE_VM", "upstream's fields are unchanged: {e:#}");
        assert_eq!(e["metadata"]["probableCause"], cause, "rdma{i}: {e:#}");
        let msg = e["message"].as_str().unwrap();
        match evidence {
            Some(ev) => {
                assert_eq!(e["metadata"]["evidence"], ev, "rdma{i}");
                assert!(msg.ends_with(&format!(" - probable cause: {cause} ({ev})")), "{msg}");
            }
            None => assert!(msg.ends_with(" - probable cause: unknown"), "{msg}"),
        }
    }
}

/// A malformed module page refuses the replay file in one line naming it, and nicmon runs on.
#[test]
fn a_bad_module_page_is_refused_not_a_panic() {
    let node = Platform::L40sOci.build();
    let dir = node.root().join("ethtool");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rdma0.json"), r#"{"module": {"pages": {"0": "11zz"}}}"#).unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--ethtool-replay".into(), dir.to_str().unwrap().into()];
    let report = tl.report(0);
    assert!(report["events"].as_array().unwrap().iter().all(|e| e["isHealthy"] == true), "{report:#}");
}

/// The events of `dev` port 1 with error code `code`: (healthy, fatal, check, message).
fn optic_events(events: &[serde_json::Value], dev: &str, code: &str) -> Vec<(bool, bool, String, String)> {
    events
        .iter()
        .filter(|e| e["entitiesImpacted"][0]["entityValue"] == dev && e["errorCode"][0] == code)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (e["isHealthy"] == true, e["isFatal"] == true, s("checkName"), s("message"))
        })
        .collect()
}

/// The testbed's own modules (every RoCE PF has one): a cable pull darkens its lanes — the
/// fatal link-down event says `cable-or-far-end (Rx LOS on 4 of 4 lanes)` and a non-fatal
/// `optic_rx_los` comes beside it; the repair clears it. Weak light while up is
/// `optic_rx_power_low`, a rising temperature `optic_temperature`. `nicmon check` shows each
/// port's module in its MODULE column.
#[test]
fn optics_events_rise_and_clear_on_the_testbed_modules() {
    let node = Platform::DgxH100.build();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--ethtool-replay".into(), node.ethtool_dir().to_str().unwrap().into()];
    let ev = tl.poll(0);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");

    node.pull_cable("mlx5_8", 1);
    let ev = tl.poll(10);
    let down = down_event(&ev, "mlx5_8");
    assert_eq!(down["metadata"]["probableCause"], "cable-or-far-end", "{down:#}");
    assert!(
        down["message"].as_str().unwrap().ends_with("probable cause: cable-or-far-end (Rx LOS on 4 of 4 lanes)"),
        "{down:#}"
    );
    let los = optic_events(&ev, "mlx5_8", "optic_rx_los");
    assert_eq!(los.len(), 1, "{ev:#?}");
    let (healthy, fatal, check, msg) = &los[0];
    assert!(!healthy && !fatal && check == "EthernetDegradationCheck", "{los:?}");
    assert!(msg.starts_with("mlx5_8 port 1 QSFP28: Rx loss of signal on 4 of 4 lanes (lanes 1\u{2013}4)"), "{msg}");
    // Still dark: nothing new. Repaired: healthy, with its code.
    assert!(optic_events(&tl.poll(20), "mlx5_8", "optic_rx_los").is_empty());
    node.repair("mlx5_8", 1);
    let ev = tl.poll(30);
    let cleared = optic_events(&ev, "mlx5_8", "optic_rx_los");
    assert_eq!(cleared.len(), 1, "{ev:#?}");
    assert!(cleared[0].0 && cleared[0].3 == "mlx5_8 port 1 QSFP28: receive signal on every lane", "{cleared:?}");

    // Light below the module's low warning (0.1 mW) on a link that is up.
    node.set_module("mlx5_9", |m| Module { rx_power_mw: 0.08, ..m });
    let ev = tl.poll(40);
    let low = optic_events(&ev, "mlx5_9", "optic_rx_power_low");
    assert_eq!(low.len(), 1, "{ev:#?}");
    assert!(!low[0].0 && !low[0].1, "{low:?}");
    assert!(low[0].3.contains("Rx power below the module's low warning -10.0 dBm on lanes 1\u{2013}4"), "{low:?}");
    // The pre-failure sign and its cause: an error-free warning says unknown (rule 7 needs errors).
    let e = ev.iter().find(|e| e["errorCode"][0] == "optic_rx_power_low").unwrap();
    assert_eq!(e["metadata"]["probableCause"], "unknown", "{e:#}");

    // The table: the MODULE column has the type, temperature and worst lane against its warning.
    let out = node.nicmon(
        "check",
        &[
            "--metadata",
            node.metadata_path().to_str().unwrap(),
            "--config",
            "/nonexistent/nicmon.toml",
            "--ethtool-replay",
            node.ethtool_dir().to_str().unwrap(),
        ],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let header = table.lines().next().unwrap();
    assert!(header.contains(" MODULE "), "{table}");
    let row = |dev: &str| table.lines().find(|l| l.starts_with(&format!("{dev} "))).unwrap().to_string();
    assert!(row("mlx5_8").contains("QSFP28 40C -1.0/-10.0"), "{table}");
    assert!(row("mlx5_9").contains("QSFP28 40C -11.0/-10.0"), "{table}");
    let col = header.find("MODULE").unwrap();
    assert_eq!(&row("mlx5_0")[col..col + 2], "- ", "an InfiniBand port has no module read: {table}");
}
