//! A port flapping for 30 s on a real veth, through the wake path (eBPF when built in):
//! a handful of events, the first DOWN as fast as ever, one "port flapping" event, a
//! restart mid-storm that re-emits nothing, one healthy event after it settled.
use std::time::Duration;

use nicmon_tests::latency::{Mode, flap_storm};
use nicmon_tests::nicmon_bin;

fn ebpf_built_in() -> bool {
    let out = std::process::Command::new(nicmon_bin()).arg("version").output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("eBPF programs: built in")
}

#[test]
fn a_thirty_second_flap_storm_is_a_handful_of_events() {
    let mode = if ebpf_built_in() {
        Mode::Ebpf
    } else {
        eprintln!("flap_storm: eBPF programs not built in (cargo xtask build-ebpf): using rtnetlink wake-ups");
        Mode::Rtnetlink
    };
    let tag = format!("nmf{}", std::process::id() % 100000);
    let storm = match flap_storm(
        &nicmon_bin(),
        mode,
        &tag,
        Duration::from_secs(30),
        Duration::from_millis(100),
        "3s",
        Duration::from_secs(6),
    ) {
        Ok(s) => s,
        Err(e) if e.starts_with("ip") => {
            eprintln!("SKIPPED flap_storm: cannot create a veth pair here ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let brief = |e: &serde_json::Value| {
        (
            e["checkName"].as_str().unwrap_or("").to_string(),
            e["isHealthy"] == true,
            e["isFatal"] == true,
            e["errorCode"].as_array().map(|c| c.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(",")),
        )
    };
    let state: Vec<_> = storm.events.iter().filter(|e| e["checkName"] == "EthernetStateCheck").map(brief).collect();
    eprintln!(
        "flap_storm ({}): {} DOWNs in 30 s, first fatal after {:.2} ms, {} events: {state:?}",
        mode.name(),
        storm.downs,
        storm.first_fatal_ms,
        storm.events.len()
    );
    assert!(storm.downs >= 100, "the storm flapped {} times", storm.downs);
    // The baseline, then at most: fatal, healthy, fatal, healthy, flapping, healthy.
    assert!(state[0].1, "baseline first: {state:?}");
    assert!(state.len() <= 7, "an event storm: {state:#?}");
    assert_eq!(state[1], ("EthernetStateCheck".into(), false, true, Some(String::new())), "{state:?}");
    let flapping: Vec<_> = state.iter().filter(|s| s.3.as_deref() == Some("PortFlapping")).collect();
    assert_eq!(flapping.len(), 1, "one flapping event, none re-emitted by the restart: {state:#?}");
    assert!(flapping[0].2 && !flapping[0].1);
    assert!(state.last().unwrap().1, "healthy after settling: {state:?}");
    let settled = storm.events.iter().rev().find(|e| e["checkName"] == "EthernetStateCheck").unwrap();
    assert!(settled["message"].as_str().unwrap().contains("after flapping"), "{settled:#}");
    // Counters that move with each flap (carrier_changes) add at most one breach each.
    let mut codes: Vec<String> = storm
        .events
        .iter()
        .filter(|e| e["checkName"] == "EthernetDegradationCheck" && e["isHealthy"] == false)
        .map(|e| e["errorCode"][0].as_str().unwrap_or("").to_string())
        .collect();
    let n = codes.len();
    codes.dedup();
    assert_eq!(codes.len(), n, "a counter breached twice: {:#?}", storm.events);
    // The first DOWN went through the wake path (the poll interval is 5 s).
    assert!(storm.first_fatal_ms < 250.0, "first fatal after {:.1} ms\n{}", storm.first_fatal_ms, storm.log);
    // Nothing after the final healthy event; only that one after the storm ended.
    assert_eq!(storm.events.len(), storm.at_storm_end + 1, "{:#?}", &storm.events[storm.at_storm_end..]);
    assert!(storm.log.contains("port held as flapping"), "held transitions are logged");
}
