//! Table tests of the PCIe deciders (link training, AER through the counter engine).
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

use super::aer::{self, AerPort, AerState, AerThresholds};
use super::link::{self, CardLink, LinkState, Training};
use super::{Finding, Health};
use crate::decide::counters::VelocityUnit;
use crate::decide::roles::Role;
use crate::model::event::{Check, RecommendedAction, Stamp};
use crate::model::pcie::parse::{AerSeverity, Speed, aer_counts};
use crate::model::pcie::reading::{Aer, PcieLink, PcieReading, UpstreamPort};

const T0: OffsetDateTime = datetime!(2026-03-01 12:00:00 UTC);

fn link(width: Option<u8>, speed: Option<Speed>, max_width: u8, max_speed: Speed) -> PcieLink {
    PcieLink { width, speed, max_width: Some(max_width), max_speed: Some(max_speed) }
}

/// A PF whose link runs at `width`/`speed`, the card able to do x16 Gen5, in a slot able to
/// do `slot_width`/`slot_speed`.
fn reading(width: u8, speed: Speed, slot_width: u8, slot_speed: Speed) -> PcieReading {
    PcieReading {
        link: link(Some(width), Some(speed), 16, Speed::GEN5),
        upstream: Some(UpstreamPort {
            address: "0000:19:08.0".into(),
            link: link(Some(width), Some(speed), slot_width, slot_speed),
        }),
        aer: Aer::default(),
    }
}

fn full() -> PcieReading {
    reading(16, Speed::GEN5, 16, Speed::GEN5)
}

fn card<'a>(card: &'a str, nic: &'a str, r: &'a PcieReading) -> CardLink<'a> {
    CardLink { card, nic, role: Some(Role::Compute), model: Some("MT4129"), reading: r }
}

#[test]
fn training_against_what_both_ends_can_do() {
    let no_upstream = PcieReading { upstream: None, ..full() };
    let link_down =
        PcieReading { link: link(None, None, 16, Speed::GEN5), ..reading(16, Speed::GEN5, 16, Speed::GEN5) };
    let mut slot_unknown = full();
    slot_unknown.upstream.as_mut().unwrap().link.max_width = None;
    let mut width_unknown = full();
    width_unknown.link.width = None;
    let cases: Vec<(&str, PcieReading, Option<&str>)> = vec![
        ("Gen5 x16 everywhere", full(), None),
        ("x8 of x16", reading(8, Speed::GEN5, 16, Speed::GEN5), Some("x8 of x16")),
        ("Gen4 of Gen5", reading(16, Speed::GEN4, 16, Speed::GEN5), Some("16.0 of 32.0 GT/s")),
        ("both", reading(8, Speed::GEN4, 16, Speed::GEN5), Some("x8 of x16, 16.0 of 32.0 GT/s")),
        ("Gen5 NIC in a Gen4 slot, at Gen4", reading(16, Speed::GEN4, 16, Speed::GEN4), None),
        ("x16 card in an x8 slot, at x8", reading(8, Speed::GEN5, 8, Speed::GEN5), None),
        ("Gen4 slot, trained at Gen3", reading(16, Speed::GEN3, 16, Speed::GEN4), Some("8.0 of 16.0 GT/s")),
        ("x1 of x16, Gen1", reading(1, Speed::GEN1, 16, Speed::GEN5), Some("x1 of x16, 2.5 of 32.0 GT/s")),
    ];
    for (what, r, below) in cases {
        let t = link::training(&r);
        match (below, &t) {
            (None, Training::Full { .. }) => {}
            (Some(text), Training::Below { shortfall, .. }) => assert_eq!(shortfall.text(), text, "{what}"),
            _ => panic!("{what}: {t:?}"),
        }
    }
    for (what, r) in [
        ("no upstream port", no_upstream),
        ("link down", link_down),
        ("slot width unknown", slot_unknown),
        ("width unknown", width_unknown),
    ] {
        assert!(matches!(link::training(&r), Training::Unknown(_)), "{what}: {:?}", link::training(&r));
    }
    // A figure below is below even when the other one is unknown.
    let mut half = reading(16, Speed::GEN4, 16, Speed::GEN5);
    half.link.width = None;
    assert!(matches!(link::training(&half), Training::Below { .. }));
}

/// Before 4.17 a Gen4 link that is up reads `Unknown speed`: its width is judged alone
/// (SPEC §1.10) — below the width both ends can do it is downtrained, the message saying
/// the speed is unknown; at full width it is at what can be judged (a retrain clears it).
#[test]
fn an_unknown_speed_is_judged_by_the_width_alone() {
    let mut x8 = reading(8, Speed::GEN4, 16, Speed::GEN4);
    x8.link.speed = None;
    match link::training(&x8) {
        Training::Below { width: Some(8), speed: None, shortfall } => {
            assert_eq!(shortfall.text(), "x8 of x16, speed unknown")
        }
        t => panic!("{t:?}"),
    }
    // The slot's width is what both ends can do: an x8 slot is no shortfall.
    let mut x8_slot = reading(8, Speed::GEN4, 8, Speed::GEN4);
    x8_slot.link.speed = None;
    assert!(matches!(link::training(&x8_slot), Training::Full { width: 8, speed: None }));
    let mut x16 = full();
    x16.link.speed = None;
    assert!(matches!(link::training(&x16), Training::Full { width: 16, speed: None }));
    let (f, st) = link::evaluate(&LinkState::default(), &[card("0000:1a:00", "mlx5_0", &x8)], false);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].error_code, f[0].health), ("pcie_link_downtrained", Health::NonFatal));
    assert!(f[0].message.contains("x8 of x16, speed unknown"), "{}", f[0].message);
    let (f, st) = link::evaluate(&st, &[card("0000:1a:00", "mlx5_0", &x16)], false);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].health, Health::Healthy);
    assert!(f[0].message.contains("trained back to x16 (speed unknown)"), "{}", f[0].message);
    assert!(st.downtrained.is_empty());
    // Unknown speed and no width: the link is down, no decision.
    let mut down = x8.clone();
    down.link.width = None;
    assert!(matches!(link::training(&down), Training::Unknown(_)));
}

#[test]
fn a_downtrained_card_is_reported_once_and_clears_when_it_retrains() {
    let good = full();
    let x8 = reading(8, Speed::GEN5, 16, Speed::GEN5);
    let (f, st) = link::evaluate(&LinkState::default(), &[card("0000:1a:00", "mlx5_0", &good)], false);
    assert!(f.is_empty() && st.downtrained.is_empty());
    let (f, st) = link::evaluate(&st, &[card("0000:1a:00", "mlx5_0", &x8)], false);
    assert_eq!(f.len(), 1);
    assert_eq!(
        (f[0].nic.as_str(), f[0].error_code, f[0].health),
        ("mlx5_0", "pcie_link_downtrained", Health::NonFatal)
    );
    assert!(f[0].message.contains("mlx5_0") && f[0].message.contains("0000:1a:00"), "{}", f[0].message);
    assert!(f[0].message.contains("x8 of x16"), "{}", f[0].message);
    // Still x8: said once.
    let (f, st) = link::evaluate(&st, &[card("0000:1a:00", "mlx5_0", &x8)], false);
    assert!(f.is_empty());
    // The link goes down: no decision, the report stands.
    let down = PcieReading { link: link(None, None, 16, Speed::GEN5), ..x8.clone() };
    let (f, st) = link::evaluate(&st, &[card("0000:1a:00", "mlx5_0", &down)], false);
    assert!(f.is_empty() && st.downtrained.contains_key("0000:1a:00"));
    // Retrained: one healthy event naming the same NIC.
    let (f, st) = link::evaluate(&st, &[card("0000:1a:00", "mlx5_0", &good)], false);
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].health, f[0].error_code), (Health::Healthy, "pcie_link_downtrained"));
    assert!(f[0].message.contains("x16 Gen5"), "{}", f[0].message);
    assert!(st.downtrained.is_empty());
}

#[test]
fn slot_limited_links_are_not_degraded() {
    let gen4_slot = reading(16, Speed::GEN4, 16, Speed::GEN4);
    let x8_slot = reading(8, Speed::GEN5, 8, Speed::GEN5);
    let cards = [card("0000:1a:00", "mlx5_0", &gen4_slot), card("0000:2a:00", "mlx5_1", &x8_slot)];
    let (f, st) = link::evaluate(&LinkState::default(), &cards, false);
    assert!(f.is_empty(), "{f:?}");
    assert!(st.downtrained.is_empty());
}

#[test]
fn one_card_below_its_peers_is_named_as_such() {
    let good = full();
    let x8 = reading(8, Speed::GEN5, 16, Speed::GEN5);
    let other_model = full();
    let mut cards: Vec<CardLink> = (0..4).map(|_| card("", "", &good)).collect();
    let names =
        [("0000:1a:00", "mlx5_0"), ("0000:2a:00", "mlx5_1"), ("0000:3a:00", "mlx5_2"), ("0000:4a:00", "mlx5_3")];
    for (c, (card_name, nic)) in cards.iter_mut().zip(names) {
        c.card = card_name;
        c.nic = nic;
    }
    cards[2].reading = &x8;
    let mut odd = card("0000:5a:00", "mlx5_4", &other_model);
    odd.model = Some("MT4123");
    cards.push(odd);
    let (f, _) = link::evaluate(&LinkState::default(), &cards, false);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].nic, "mlx5_2");
    assert!(f[0].message.contains("below its 3 role-group peers of the same model at x16 Gen5"), "{}", f[0].message);

    // Every card of the group at x8 (a platform setting, not one card): each is reported,
    // and the message says its peers are alike.
    let all: Vec<CardLink> = names.iter().map(|(c, n)| card(c, n, &x8)).collect();
    let (f, _) = link::evaluate(&LinkState::default(), &all, false);
    assert_eq!(f.len(), 4);
    assert!(f[0].message.contains("as are its 3 role-group peers"), "{}", f[0].message);
}

#[test]
fn one_verdict_per_card_and_reboot_baselines() {
    let x8 = reading(8, Speed::GEN5, 16, Speed::GEN5);
    let good = full();
    // Two PFs of one card: one event.
    let pfs = [card("0000:1a:00", "mlx5_0", &x8), card("0000:1a:00", "mlx5_1", &x8)];
    let (f, _) = link::evaluate(&LinkState::default(), &pfs, false);
    assert_eq!(f.len(), 1);
    // After a reboot: a card at full training gets a healthy baseline, a downtrained one its
    // event, an undecidable one nothing.
    let down = PcieReading { link: link(None, None, 16, Speed::GEN5), ..full() };
    let cards =
        [card("0000:1a:00", "mlx5_0", &good), card("0000:2a:00", "mlx5_1", &x8), card("0000:3a:00", "mlx5_2", &down)];
    let (f, _) = link::evaluate(&LinkState::default(), &cards, true);
    let got: Vec<(&str, Health)> = f.iter().map(|f| (f.nic.as_str(), f.health)).collect();
    assert_eq!(got, vec![("mlx5_0", Health::Healthy), ("mlx5_1", Health::NonFatal)]);
}

fn aer_files(cor: &str, nonfatal: &str, fatal: &str) -> Aer {
    Aer {
        correctable: aer_counts(cor, AerSeverity::Correctable),
        nonfatal: aer_counts(nonfatal, AerSeverity::NonFatal),
        fatal: aer_counts(fatal, AerSeverity::Fatal),
    }
}

fn quiet() -> Aer {
    aer_files("RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n", "DLP 0\nTOTAL_ERR_NONFATAL 0\n", "MalfTLP 0\nTOTAL_ERR_FATAL 0\n")
}

fn aer_poll(prev: &AerState, aer: &Aer, now: OffsetDateTime) -> (Vec<Finding>, AerState, Vec<String>) {
    let ports = [AerPort { nic: "mlx5_0", address: Some("0000:1a:00.0"), aer }];
    let out = aer::evaluate(prev, &ports, &AerThresholds::default(), now, false);
    (out.findings, out.state, out.notes)
}

#[test]
fn aer_fatal_and_nonfatal_totals_rising() {
    let (f, st, _) = aer_poll(&AerState::default(), &quiet(), T0);
    assert!(f.is_empty());
    let fatal = aer_files(
        "RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n",
        "DLP 0\nTOTAL_ERR_NONFATAL 0\n",
        "MalfTLP 1\nTOTAL_ERR_FATAL 1\n",
    );
    let (f, st, _) = aer_poll(&st, &fatal, T0 + Duration::seconds(1));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].error_code, f[0].health, f[0].nic.as_str()), ("aer_fatal", Health::Fatal, "mlx5_0"));
    assert!(f[0].message.contains("TOTAL_ERR_FATAL +1") && f[0].message.contains("MalfTLP +1"), "{}", f[0].message);
    let ev = f[0].event(Check::NICKernelLogCheck, &Stamp::default(), T0);
    assert_eq!((ev.is_fatal, ev.recommended_action), (true, RecommendedAction::REPLACE_VM));
    assert_eq!(ev.error_code, vec!["aer_fatal".to_string()]);
    // Latched: another fatal error says nothing more.
    let more = aer_files(
        "RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n",
        "DLP 2\nTOTAL_ERR_NONFATAL 2\n",
        "MalfTLP 2\nTOTAL_ERR_FATAL 2\n",
    );
    let (f, st, _) = aer_poll(&st, &more, T0 + Duration::seconds(2));
    // ... but the non-fatal total rose: one non-fatal event naming its bit.
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].error_code, f[0].health), ("aer_nonfatal", Health::NonFatal));
    assert!(f[0].message.contains("DLP +2"), "{}", f[0].message);
    // A reset (the device re-enumerated): the latches are released, healthy events.
    let (f, _, _) = aer_poll(&st, &quiet(), T0 + Duration::seconds(3));
    let mut got: Vec<(&str, Health)> = f.iter().map(|f| (f.error_code, f.health)).collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got, vec![("aer_fatal", Health::Healthy), ("aer_nonfatal", Health::Healthy)]);
}

/// A fatal file with its total line twice (5, then 9) is not understood: no `aer_fatal`
/// "+4" (a REPLACE_VM from a file nicmon cannot read), and the baseline stands.
#[test]
fn a_total_line_given_twice_is_no_fatal_rise() {
    let five = aer_files("TOTAL_ERR_COR 0\n", "TOTAL_ERR_NONFATAL 0\n", "MalfTLP 5\nTOTAL_ERR_FATAL 5\n");
    let (f, st, _) = aer_poll(&AerState::default(), &five, T0);
    assert!(f.is_empty(), "{f:?}");
    let twice =
        aer_files("TOTAL_ERR_COR 0\n", "TOTAL_ERR_NONFATAL 0\n", "MalfTLP 5\nTOTAL_ERR_FATAL 5\nTOTAL_ERR_FATAL 9\n");
    assert_eq!(twice.fatal, None, "not understood: unknown");
    let (f, st, _) = aer_poll(&st, &twice, T0 + Duration::seconds(1));
    assert!(f.is_empty(), "{f:?}");
    let (f, _, _) = aer_poll(&st, &five, T0 + Duration::seconds(2));
    assert!(f.is_empty(), "{f:?}");
}

fn correctable(bad_tlp: u64, rx: u64) -> Aer {
    aer_files(
        &format!("RxErr {rx}\nBadTLP {bad_tlp}\nTOTAL_ERR_COR {}\n", bad_tlp + rx),
        "DLP 0\nTOTAL_ERR_NONFATAL 0\n",
        "MalfTLP 0\nTOTAL_ERR_FATAL 0\n",
    )
}

#[test]
fn correctable_errors_judged_by_velocity() {
    // A historic count at startup is no event; a trickle (a handful a minute) is none either.
    let (f, st, _) = aer_poll(&AerState::default(), &correctable(500, 0), T0);
    assert!(f.is_empty());
    let (f, st, _) = aer_poll(&st, &correctable(503, 0), T0 + Duration::seconds(30));
    assert!(f.is_empty(), "window not full");
    let (f, st, _) = aer_poll(&st, &correctable(505, 0), T0 + Duration::seconds(60));
    assert!(f.is_empty(), "5/min is below 60/min: {f:?}");
    // A burst: 118 BadTLP and 2 RxErr in the next minute.
    let (f, st, _) = aer_poll(&st, &correctable(600, 0), T0 + Duration::seconds(90));
    assert!(f.is_empty(), "window not full yet");
    let (f, st, _) = aer_poll(&st, &correctable(623, 2), T0 + Duration::seconds(120));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].error_code, f[0].health), ("aer_correctable", Health::NonFatal));
    assert!(f[0].message.contains("BadTLP +118") && f[0].message.contains("RxErr +2"), "{}", f[0].message);
    assert!(f[0].message.contains("120.00/min, above 60/min"), "{}", f[0].message);
    // Latched while the burst goes on.
    let (f, _, _) = aer_poll(&st, &correctable(900, 2), T0 + Duration::seconds(180));
    assert!(f.is_empty());
}

#[test]
fn correctable_threshold_and_unit_are_the_configs() {
    let t = AerThresholds { correctable: 10.0, correctable_unit: VelocityUnit::Second };
    let rules = aer::rules(&t);
    let cor = rules.iter().find(|r| r.name == "aer_correctable").unwrap();
    assert_eq!((cor.threshold, cor.velocity_unit), (10.0, Some(VelocityUnit::Second)));
    let ports = |aer| [AerPort { nic: "mlx5_0", address: None, aer }];
    let a = correctable(0, 0);
    let out = aer::evaluate(&AerState::default(), &ports(&a), &t, T0, false);
    let b = correctable(11, 0);
    let out = aer::evaluate(&out.state, &ports(&b), &t, T0 + Duration::seconds(1), false);
    assert_eq!(out.findings.len(), 1, "11/sec is above 10/sec");
    assert!(out.findings[0].message.contains("11.00/sec, above 10/sec"), "{}", out.findings[0].message);
}

#[test]
fn no_aer_files_no_event_said_once() {
    let none = Aer::default();
    let (f, st, notes) = aer_poll(&AerState::default(), &none, T0);
    assert!(f.is_empty());
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("mlx5_0") && notes[0].contains("not available"), "{notes:?}");
    let (f, st, notes) = aer_poll(&st, &none, T0 + Duration::seconds(1));
    assert!(f.is_empty() && notes.is_empty());
    // AER appears (module loaded): checked from then on; gone again: said again.
    let (_, st, notes) = aer_poll(&st, &quiet(), T0 + Duration::seconds(2));
    assert!(notes.is_empty() && st.unavailable.is_empty());
    let (_, _, notes) = aer_poll(&st, &none, T0 + Duration::seconds(3));
    assert_eq!(notes.len(), 1);
}

#[test]
fn aer_reboot_baselines() {
    let ports = [AerPort { nic: "mlx5_0", address: None, aer: &quiet() }];
    let out = aer::evaluate(&AerState::default(), &ports, &AerThresholds::default(), T0, true);
    let mut codes: Vec<&str> = out.findings.iter().map(|f| f.error_code).collect();
    codes.sort();
    assert_eq!(codes, vec!["aer_correctable", "aer_fatal", "aer_nonfatal"]);
    assert!(out.findings.iter().all(|f| f.health == Health::Healthy));
}

mod on_the_testbed {
    use nicmon_tests::pcie::AerFile;
    use nicmon_tests::platforms::Platform;

    use super::*;
    use crate::read::discovery;
    use crate::read::host::Host;
    use crate::read::pcie as read;

    #[test]
    fn a_pf_and_the_port_at_the_other_end_of_its_link() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let bdf = node.info["mlx5_0"].bdf.clone();
        let up = discovery::upstream_port(&host, &bdf).expect("a switch port above the NIC");
        assert_eq!(node.upstream_port_dir("mlx5_0").file_name().unwrap().to_str(), Some(up.as_str()));
        let r = read::read(&host, &bdf);
        assert_eq!(r.link, link(Some(16), Some(Speed::GEN5), 16, Speed::GEN5));
        assert_eq!(r.link.label(), "x16 Gen5");
        assert_eq!(r.upstream.as_ref().map(|u| u.link.max_width), Some(Some(16)));
        assert!(r.aer.available());
        assert_eq!(r.aer.totals().map(|(_, t)| t).sum::<u64>(), 0);
        assert!(matches!(link::training(&r), Training::Full { width: 16, speed: Some(Speed::GEN5) }));
        // A root complex is no PCI function: a port hanging from it has no upstream port.
        let rp = node.upstream_port_dir("mlx5_0");
        let mut top = rp.as_path();
        while top.parent().and_then(|p| p.file_name()).is_some_and(|n| n.to_string_lossy().starts_with("0000:")) {
            top = top.parent().unwrap();
        }
        let root_port = top.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(discovery::upstream_port(&host, &root_port), None, "{root_port}");
    }

    #[test]
    fn testbed_knobs_read_back() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let bdf = node.info["mlx5_0"].bdf.clone();
        node.set_pcie_link("mlx5_0", Some((8, 5)));
        let r = read::read(&host, &bdf);
        match link::training(&r) {
            Training::Below { shortfall, .. } => assert_eq!(shortfall.text(), "x8 of x16"),
            t => panic!("{t:?}"),
        }
        node.set_slot_capability("mlx5_0", 16, 4);
        let r = read::read(&host, &bdf);
        assert_eq!(r.link.label(), "x16 Gen4");
        assert!(matches!(link::training(&r), Training::Full { .. }), "a Gen4 slot: not degraded");
        node.set_pcie_link("mlx5_0", None);
        let r = read::read(&host, &bdf);
        assert_eq!((r.link.speed, r.link.width, r.link.label().as_str()), (None, None, "down"));
        node.set_aer("mlx5_0", AerFile::Fatal, &[("MalfTLP", 1)]);
        let r = read::read(&host, &bdf);
        assert_eq!(r.aer.fatal.as_ref().map(|c| (c.total, c.bit("MalfTLP"))), Some((1, Some(1))));
        node.remove_aer("mlx5_0");
        assert!(!read::read(&host, &bdf).aer.available());
    }
}

/// A card's PCIe finding is filed against the NIC that names it: a device entity (the
/// wire's `NIC=<device>`), not the card's PCI slot.
#[test]
fn a_pcie_event_is_about_the_nic_naming_the_card() {
    use crate::model::event::Subject;
    let x8 = reading(8, Speed::GEN5, 16, Speed::GEN5);
    let (f, _) = link::evaluate(&LinkState::default(), &[card("0000:1a:00", "mlx5_0", &x8)], false);
    assert_eq!(f.len(), 1);
    let e = f[0].event(Check::NICPCIeCheck, &Stamp::default(), T0);
    assert_eq!(e.subject(), Subject::Device("mlx5_0"));
    assert_eq!(e.entities_text(), "NIC=mlx5_0");
}
