//! Flap damping (SPEC §1.3): a port that flaps for 30 s is a handful of events — the first
//! fatal, one "port flapping" fatal, one healthy after it settled — not one per transition.
//! Each `Timeline` poll is a `nicmon check --state-file … --now …` process: every poll is
//! also a restart of the monitor from its state file.
use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, Timeline, brief};

const PORT: &str = "NIC=mlx5_2 NICPort=1";
/// mlx5_2's card: below its storage peers while the port is down, so each reported DOWN and
/// recovery of the port comes with the card's event (SPEC §1.3).
const CARD: &str = "NIC=0000:0c:00";

fn down(node: &Node, link_downed: u64) {
    node.set_port("mlx5_2", 1, "1: DOWN", "3: Disabled");
    node.set_operstate("rdma2", "down");
    node.set_counter("mlx5_2", 1, "counters/link_downed", link_downed);
}

fn up(node: &Node) {
    node.set_port("mlx5_2", 1, "4: ACTIVE", "5: LinkUp");
    node.set_operstate("rdma2", "up");
}

fn port_report(report: &serde_json::Value) -> serde_json::Value {
    let dev = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_2").unwrap();
    dev["ports"][0].clone()
}

fn briefs(ev: &[serde_json::Value]) -> Vec<(String, bool, bool, String, String)> {
    ev.iter().map(brief).collect()
}

#[test]
fn thirty_seconds_of_flapping_is_three_transitions_one_flapping_event_and_one_healthy() {
    let node = Platform::L40sOci.build();
    node.set_counter("mlx5_2", 1, "counters/link_downed", 0);
    let tl = Timeline::new(&node);
    assert_eq!(tl.poll(0).len(), 6, "baseline: one healthy event per monitored port");

    // The first DOWN is reported at once, as without damping (and link_downed breaches once),
    // with its card's event.
    down(&node, 1);
    let ev = tl.poll(1);
    assert_eq!(
        briefs(&ev),
        vec![
            ("EthernetStateCheck".into(), false, true, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), false, true, CARD.into(), String::new()),
            ("EthernetDegradationCheck".into(), false, true, PORT.into(), "link_downed".into()),
        ],
        "{ev:#?}"
    );
    assert_eq!(
        ev[0]["message"],
        "RoCE port mlx5_2 port 1: state DOWN, phys_state Disabled, operstate down - probable cause: unknown"
    );
    up(&node);
    assert_eq!(
        briefs(&tl.poll(2)),
        vec![
            ("EthernetStateCheck".into(), true, false, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), true, false, CARD.into(), String::new()),
        ]
    );
    let report = tl.report(3);
    assert_eq!(report["events"].as_array().unwrap().len(), 0);
    assert_eq!(port_report(&report)["flapping"], false);
    assert_eq!(port_report(&report)["flap_transitions"], 1);

    // Second transition: still below the threshold (3 in 60 s).
    down(&node, 2);
    assert_eq!(
        briefs(&tl.poll(4)),
        vec![
            ("EthernetStateCheck".into(), false, true, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), false, true, CARD.into(), String::new()),
        ]
    );
    up(&node);
    assert_eq!(tl.poll(5).len(), 2);

    // The third reaches it: one fatal "port flapping" event instead of a plain one (and the
    // card's, which then stays below until the port has settled).
    down(&node, 3);
    let ev = tl.poll(6);
    assert_eq!(
        briefs(&ev),
        vec![
            ("EthernetStateCheck".into(), false, true, PORT.into(), "PortFlapping".into()),
            ("EthernetStateCheck".into(), false, true, CARD.into(), String::new()),
        ],
        "{ev:#?}"
    );
    assert_eq!(ev[0]["recommendedAction"], "REPLACE_VM");
    assert_eq!(
        ev[0]["message"],
        "RoCE port mlx5_2 port 1: state DOWN, phys_state Disabled, operstate down - port flapping: \
         3 transitions in 60 s, held until healthy for 60 s - probable cause: unknown"
    );
    assert_eq!(ev[0]["generatedTimestamp"], tl.at(6));

    // The rest of the 30 s storm publishes nothing: no state event, no second counter event.
    let mut link_downed = 3;
    for t in 7..=35 {
        if t % 2 == 1 {
            up(&node);
        } else {
            link_downed += 1;
            down(&node, link_downed);
        }
        let report = tl.report(t);
        assert_eq!(report["events"].as_array().unwrap().len(), 0, "t={t}: {report:#}");
        let p = port_report(&report);
        assert_eq!(p["flapping"], true, "t={t}");
        assert_eq!(p["flapping_since"], tl.at(6));
    }
    // The three that started the hold, then one every 2 s from t=8 to t=34.
    let report = tl.report(36);
    assert_eq!(port_report(&report)["flap_transitions"], 3 + (34 - 6) / 2);

    // `nicmon check` as a table says so too.
    let now = tl.at(37);
    let meta = node.metadata_path();
    let out = node.nicmon(
        "check",
        &[
            "--state-file",
            tl.state_file.to_str().unwrap(),
            "--now",
            &now,
            "--metadata",
            meta.to_str().unwrap(),
            "--config",
            "/nonexistent.toml",
            "--node-name",
            "node-a",
        ],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table.lines().find(|l| l.starts_with("mlx5_2 ")).unwrap();
    assert!(line.contains("FLAPPING") && line.contains(&format!("flapping since {}", tl.at(6))), "{table}");

    // Healthy since t=35: not reported until it has been healthy for the settle time.
    assert!(tl.poll(60).is_empty());
    assert!(tl.poll(94).is_empty(), "59 s healthy is not settled");
    let ev = tl.poll(95);
    assert_eq!(
        briefs(&ev),
        vec![
            ("EthernetStateCheck".into(), true, false, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), true, false, CARD.into(), String::new()),
        ]
    );
    assert_eq!(
        ev[0]["message"],
        "RoCE port mlx5_2 port 1: healthy (ACTIVE, LinkUp, operstate up) - stable for 60 s after flapping \
         (17 transitions)"
    );
    assert_eq!(port_report(&tl.report(96))["flapping"], false);

    // Nothing fatal after settling; a later single fault is reported as usual.
    assert!(tl.poll(200).is_empty());
    down(&node, link_downed);
    assert_eq!(
        briefs(&tl.poll(201)),
        vec![
            ("EthernetStateCheck".into(), false, true, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), false, true, CARD.into(), String::new()),
        ]
    );
}

#[test]
fn a_relapse_while_settling_restarts_the_settle_clock_and_publishes_nothing() {
    let node = Platform::L40sOci.build();
    let tl = Timeline::new(&node);
    tl.poll(0);
    for t in [1, 3, 5] {
        down(&node, 0);
        tl.poll(t);
        up(&node);
        tl.poll(t + 1);
    }
    assert_eq!(port_report(&tl.report(7))["flapping"], true);
    assert!(tl.poll(50).is_empty());
    down(&node, 0);
    assert!(tl.poll(60).is_empty(), "a relapse while held publishes nothing");
    up(&node);
    assert!(tl.poll(61).is_empty());
    assert!(tl.poll(120).is_empty(), "59 s since the relapse");
    assert_eq!(
        briefs(&tl.poll(121)),
        vec![
            ("EthernetStateCheck".into(), true, false, PORT.into(), String::new()),
            ("EthernetStateCheck".into(), true, false, CARD.into(), String::new()),
        ]
    );
}

#[test]
fn damping_off_reports_every_transition() {
    let node = Platform::L40sOci.build();
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(&cfg, "[stateCheck]\nflapThreshold = 0\n").unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--config".into(), cfg.to_str().unwrap().into()];
    tl.poll(0);
    for i in 0..5 {
        down(&node, 0);
        let ev = tl.poll(1 + 2 * i);
        assert_eq!(
            briefs(&ev),
            vec![
                ("EthernetStateCheck".into(), false, true, PORT.into(), String::new()),
                ("EthernetStateCheck".into(), false, true, CARD.into(), String::new()),
            ]
        );
        up(&node);
        assert_eq!(tl.poll(2 + 2 * i).len(), 2);
    }
    assert_eq!(port_report(&tl.report(20))["flapping"], false);
}

#[test]
fn an_invalid_flap_setting_stops_with_the_key_named() {
    let node = Platform::L40sOci.build();
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(&cfg, "[stateCheck]\nflapWindow = \"forever\"\n").unwrap();
    let out = node.nicmon("check", &["--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stateCheck.flapWindow = \"forever\""), "{err}");
}

/// Hold-down and flap damping together: each blip shorter than `portStateHoldDown` publishes
/// nothing on its own but counts as an unhealthy transition, so a port blipping again and
/// again is still reported as flapping; once held as flapping, its edges (short or long)
/// publish nothing until it has settled.
#[test]
fn blips_under_the_hold_down_still_count_as_flapping() {
    let node = Platform::L40sOci.build();
    let cfg = node.root().join("nicmon.toml");
    std::fs::write(&cfg, "[stateCheck]\nportStateHoldDown = \"10s\"\n").unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--config".into(), cfg.to_str().unwrap().into()];
    assert_eq!(tl.poll(0).len(), 6);

    // Two blips: held, then healthy again within 10 s → nothing published, each counted.
    for (i, t) in [1, 5].into_iter().enumerate() {
        down(&node, 0);
        let r = tl.report(t);
        assert!(r["events"].as_array().unwrap().is_empty(), "held: {r:#}");
        assert_eq!(r["held_ports"].as_array().unwrap().len(), 1, "{r:#}");
        up(&node);
        let r = tl.report(t + 2);
        assert!(r["events"].as_array().unwrap().is_empty(), "a blip publishes nothing: {r:#}");
        assert_eq!(r["blips"].as_array().unwrap().len(), 1, "{r:#}");
        let p = port_report(&r);
        assert_eq!((p["flapping"].as_bool(), p["flap_transitions"].as_u64()), (Some(false), Some(i as u64 + 1)));
    }

    // The third blip within the window: one fatal "port flapping" event (the port is up, so
    // its card is not below and sends nothing).
    down(&node, 0);
    assert!(tl.poll(9).is_empty(), "held");
    up(&node);
    let ev = tl.poll(11);
    assert_eq!(
        briefs(&ev),
        vec![("EthernetStateCheck".into(), false, true, PORT.into(), "PortFlapping".into())],
        "{ev:#?}"
    );
    assert_eq!(
        ev[0]["message"],
        "RoCE port mlx5_2 port 1 - port flapping: 3 transitions in 60 s (each recovered within portStateHoldDown), \
         held until healthy for 60 s - probable cause: unknown"
    );
    assert_eq!(port_report(&tl.report(12))["flapping"], true);

    // Held as flapping: a DOWN longer than the hold-down publishes nothing, neither the
    // port's event nor its card's, and it is not held by the hold-down either.
    down(&node, 0);
    for t in [13, 20, 30] {
        let r = tl.report(t);
        assert!(r["events"].as_array().unwrap().is_empty(), "t={t}: {r:#}");
        assert!(r["held_ports"].as_array().unwrap().is_empty(), "t={t}: {r:#}");
    }
    // A short one while held is no blip and publishes nothing.
    up(&node);
    assert!(tl.poll(31).is_empty());
    down(&node, 0);
    assert!(tl.poll(32).is_empty());
    up(&node);
    let r = tl.report(33);
    assert!(r["events"].as_array().unwrap().is_empty(), "{r:#}");
    assert_eq!(port_report(&r)["flap_transitions"], 5);

    // Settled 60 s after the last DOWN: the port's healthy event only (its card never fell).
    assert!(tl.poll(92).is_empty(), "59 s healthy");
    let ev = tl.poll(93);
    assert_eq!(briefs(&ev), vec![("EthernetStateCheck".into(), true, false, PORT.into(), String::new())], "{ev:#?}");
    assert!(ev[0]["message"].as_str().unwrap().contains("after flapping (5 transitions)"), "{ev:#?}");

    // Afterwards a blip is a blip again.
    down(&node, 0);
    assert!(tl.poll(100).is_empty());
    up(&node);
    let r = tl.report(101);
    assert!(r["events"].as_array().unwrap().is_empty(), "{r:#}");
    assert_eq!(r["blips"].as_array().unwrap().len(), 1);
}
