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
    let ev = tl.poll(0);
    assert!(ev.iter().all(|e| e["isHealthy"] == true), "{ev:#?}");

    Module::healthy(Form::Qsfp56).dark().write(&dir, "rdma0");
    Module { tx_fault: vec![1, 2], ..Module::healthy(Form::Osfp) }.write(&dir, "rdma1");
    Module { fault: true, ..Module::healthy(Form::Osfp) }.write(&dir, "rdma3");
    let devs: Vec<String> = (0..6).map(|i| device_of(&node, &format!("rdma{i}"))).collect();
    for d in [0, 1, 2, 3, 5] {
        node.pull_cable(&devs[d], 1);
    }
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
