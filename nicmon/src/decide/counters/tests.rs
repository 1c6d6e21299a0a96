//! Counter scenarios with controlled time: one node, a fault timeline, the events expected.
use std::collections::BTreeMap;

use proptest::prelude::*;
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

use super::config::default_rules;
use super::*;
use crate::model::LinkLayer;
use crate::model::event::{Check, HealthEvent, RecommendedAction, Stamp};

const T0: OffsetDateTime = datetime!(2026-03-01 12:00:00 UTC);

/// One monitored port polled by a driver that owns the counter state, like the daemon.
struct Node {
    device: &'static str,
    port: u32,
    link_layer: LinkLayer,
    rules: Vec<CounterRule>,
    state: CounterState,
    stamp: Stamp,
    /// The port's rate in bit/s (pre-FEC BER rules).
    rate_bps: Option<f64>,
    /// How old the port's ethtool counters are at the poll.
    ethtool_age: std::time::Duration,
}

impl Node {
    fn new(link_layer: LinkLayer) -> Node {
        Node {
            device: "mlx5_0",
            port: 1,
            link_layer,
            rules: default_rules(),
            state: CounterState::default(),
            stamp: Stamp { node_name: "gpu-node-1".into(), ..Stamp::default() },
            rate_bps: None,
            ethtool_age: Default::default(),
        }
    }

    fn ib() -> Node {
        Node::new(LinkLayer::InfiniBand)
    }

    /// Poll at `T0 + secs` with these counter values (by rule path).
    fn poll_ms(&mut self, ms: i64, counters: &[(&str, u64)], reboot: bool) -> Vec<HealthEvent> {
        let counters: BTreeMap<std::sync::Arc<str>, u64> = counters.iter().map(|(k, v)| ((*k).into(), *v)).collect();
        let ports = [CounterPort {
            device: self.device,
            port: self.port,
            link_layer: Some(&self.link_layer),
            driver: Some(crate::model::driver::RdmaDriver::Mlx5),
            counters: &counters,
            rate_bps: self.rate_bps,
            ber_threshold: None,
            ethtool_age: self.ethtool_age,
        }];
        let now = T0 + Duration::milliseconds(ms);
        let (events, next) = evaluate(&self.state, &ports, &self.rules, now, reboot, &self.stamp);
        self.state = next;
        events
    }

    fn poll(&mut self, secs: i64, counters: &[(&str, u64)]) -> Vec<HealthEvent> {
        self.poll_ms(secs * 1000, counters, false)
    }

    /// The pod restarts: the state goes through the state file.
    fn restart(&mut self) {
        let json = serde_json::to_string(&self.state).unwrap();
        self.state = serde_json::from_str(&json).unwrap();
    }
}

const LINK_DOWNED: &str = "counters/link_downed";
const SYMBOL_ERROR: &str = "counters/symbol_error";

fn assert_unhealthy(ev: &HealthEvent, check: Check, code: &str, fatal: bool) {
    assert_eq!(ev.check(), Some(check), "{ev:?}");
    assert_eq!(ev.error_code, vec![code.to_string()]);
    assert!(!ev.is_healthy);
    assert_eq!(ev.is_fatal, fatal);
    let action = if fatal { RecommendedAction::REPLACE_VM } else { RecommendedAction::NONE };
    assert_eq!(ev.recommended_action, action);
}

fn assert_healthy(ev: &HealthEvent, check: Check, code: &str, message: &str) {
    assert_eq!(ev.check(), Some(check), "{ev:?}");
    assert_eq!(ev.error_code, vec![code.to_string()]);
    assert!(ev.is_healthy && !ev.is_fatal);
    assert_eq!(ev.recommended_action, RecommendedAction::NONE);
    assert_eq!(ev.message, message);
}

/// 001 §6.4, with an optional pod restart between the breach and the admin reset.
fn link_downed_timeline(restart: impl Fn(&mut Node)) {
    let mut n = Node::ib();
    assert!(n.poll(0, &[(LINK_DOWNED, 0)]).is_empty());

    let ev = n.poll(5, &[(LINK_DOWNED, 1)]);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_unhealthy(&ev[0], Check::InfiniBandDegradationCheck, "link_downed", true);
    assert_eq!(
        ev[0].message,
        "Port mlx5_0 port 1: link_downed - Port Training State Machine failed - QP disconnect \
         (value=1, delta=1, rate=0.20/sec)"
    );
    assert_eq!(ev[0].entities_impacted[0].wire_value(), "mlx5_0");
    assert_eq!(ev[0].entities_impacted[1].wire_type(), "NICPort");
    assert_eq!(ev[0].entities_impacted[1].wire_value(), "1");
    assert_eq!(ev[0].node_name, "gpu-node-1");
    assert_eq!(ev[0].generated_timestamp, T0 + Duration::seconds(5));

    assert!(n.poll(10, &[(LINK_DOWNED, 1)]).is_empty(), "latched");
    restart(&mut n);
    assert!(n.poll(15, &[(LINK_DOWNED, 1)]).is_empty(), "still latched");

    // The admin clears the counters (perfquery -x).
    let ev = n.poll(20, &[(LINK_DOWNED, 0)]);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_healthy(
        &ev[0],
        Check::InfiniBandDegradationCheck,
        "link_downed",
        "Counter link_downed recovered on port mlx5_0 port 1",
    );
    assert!(n.poll(25, &[(LINK_DOWNED, 0)]).is_empty());
    assert!(n.state.breach_flags.is_empty());

    // A new link down after the recovery is reported again.
    let ev = n.poll(30, &[(LINK_DOWNED, 1)]);
    assert_eq!(ev.len(), 1);
    assert_unhealthy(&ev[0], Check::InfiniBandDegradationCheck, "link_downed", true);
}

#[test]
fn link_downed_breach_latch_and_admin_reset() {
    link_downed_timeline(|_| {});
}

#[test]
fn link_downed_recovery_survives_a_restart() {
    link_downed_timeline(Node::restart);
}

/// A poll whose counters read as at the last one shares the last values with the state
/// before it (nothing copied); a moved counter gives the next state its own map, and the
/// state before keeps what it had.
#[test]
fn the_last_values_are_shared_until_a_counter_moves() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 1), (SYMBOL_ERROR, 5)]);
    let quiet = n.state.clone();
    assert!(n.poll(1, &[(LINK_DOWNED, 1), (SYMBOL_ERROR, 5)]).is_empty());
    assert!(n.state.last_values.same_as(&quiet.last_values), "a quiet poll copied the last values");
    let before = n.state.clone();
    n.poll(2, &[(LINK_DOWNED, 1), (SYMBOL_ERROR, 6)]);
    assert!(!n.state.last_values.same_as(&before.last_values));
    assert_eq!(n.state.last_values.get("mlx5_0:1:symbol_error"), Some(6));
    assert_eq!(before.last_values.get("mlx5_0:1:symbol_error"), Some(5), "the state before was changed");
    assert_eq!(n.state.last_values.get("mlx5_0:1:link_downed"), Some(1));
    // Through the state file: the same values.
    let json = serde_json::to_string(&n.state).unwrap();
    let back: CounterState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.last_values, n.state.last_values);
    assert!(json.contains(r#""last_values":{"mlx5_0:1:link_downed":1,"mlx5_0:1:symbol_error":6,"#), "{json}");
}

#[test]
fn link_downed_recovery_after_a_restart_without_last_values() {
    // A state file that kept only snapshots (001 §6.6): the snapshot is the fallback.
    link_downed_timeline(|n| {
        n.restart();
        n.state.last_values.clear();
    });
}

#[test]
fn reset_during_downtime_is_seen_against_the_snapshot() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 3)]);
    assert_eq!(n.poll(1, &[(LINK_DOWNED, 4)]).len(), 1);
    n.restart();
    n.state.last_values.clear();
    // Reset to 0 and one new link down while the pod was away: still below the snapshot.
    let ev = n.poll(60, &[(LINK_DOWNED, 1)]);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].is_healthy);
}

#[test]
fn ethernet_ports_use_the_ethernet_degradation_check() {
    let mut n = Node::new(LinkLayer::Ethernet);
    let cc = "/sys/class/net/{interface}/carrier_changes";
    assert!(n.poll(0, &[(cc, 10)]).is_empty());
    assert!(n.poll(1, &[(cc, 12)]).is_empty(), "2 is not > 2");
    let ev = n.poll(2, &[(cc, 15)]);
    assert_eq!(ev.len(), 1);
    assert_unhealthy(&ev[0], Check::EthernetDegradationCheck, "carrier_changes", false);
    assert_eq!(
        ev[0].message,
        "Port mlx5_0 port 1: carrier_changes - Link instability - carrier state changes \
         (value=15, delta=3, rate=3.00/sec)"
    );
    let ev = n.poll(3, &[(cc, 0)]);
    assert_healthy(
        &ev[0],
        Check::EthernetDegradationCheck,
        "carrier_changes",
        "Counter carrier_changes recovered on port mlx5_0 port 1",
    );
}

#[test]
fn efa_counters_apply_to_efa_ports_only() {
    const NO_COMPLETION: &str = "/sys/class/infiniband/{device}/hw_counters/no_completion_cmds";
    let mut efa = Node::new(LinkLayer::Efa);
    efa.device = "rdmap79s0";
    assert!(efa.poll(0, &[(NO_COMPLETION, 0), (LINK_DOWNED, 0), ("hw_counters/rx_drops", 0)]).is_empty());
    // A mlx5 counter on an EFA port is not evaluated (it is not one of its layers).
    let ev = efa.poll(1, &[(NO_COMPLETION, 1), (LINK_DOWNED, 5), ("hw_counters/rx_drops", 0)]);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_unhealthy(&ev[0], Check::EFADegradationCheck, "efa_no_completion_cmds", true);
    assert_eq!(ev[0].entities_text(), "NIC=rdmap79s0 NICPort=1");
    assert_eq!(ev[0].recommended_action, RecommendedAction::REPLACE_VM);
    // The EFA rules are not evaluated on an InfiniBand port.
    let mut ib = Node::ib();
    assert!(ib.poll(0, &[(NO_COMPLETION, 0)]).is_empty());
    assert!(ib.poll(1, &[(NO_COMPLETION, 9)]).is_empty());
}

/// `symbol_error` rising 200 over one hour at a steady pace: 001's fatal 120/hour rule
/// fires once the hour has elapsed and not before; the 10/sec rule never does.
fn symbol_error_steady(poll_every: i64) {
    let mut n = Node::ib();
    let value = |t: i64| (t * 200 / 3600) as u64;
    let mut fired = Vec::new();
    let mut t = 0;
    while t <= 2 * 3600 {
        for ev in n.poll(t, &[(SYMBOL_ERROR, value(t))]) {
            fired.push((t, ev));
        }
        t += poll_every;
    }
    assert_eq!(fired.len(), 1, "{fired:#?}");
    let (at, ev) = &fired[0];
    let first_poll_after_hour = (3600 + poll_every - 1) / poll_every * poll_every;
    assert_eq!(*at, first_poll_after_hour);
    assert_unhealthy(ev, Check::InfiniBandDegradationCheck, "symbol_error_fatal", true);
    assert!(
        ev.message.starts_with("Port mlx5_0 port 1: symbol_error_fatal - Symbol errors exceed IBTA BER threshold"),
        "{}",
        ev.message
    );
    assert!(ev.message.contains("/hour)"), "{}", ev.message);
}

#[test]
fn symbol_error_fatal_fires_after_one_hour_polling_every_second() {
    symbol_error_steady(1);
}

#[test]
fn symbol_error_fatal_fires_after_one_hour_polling_every_10_seconds() {
    symbol_error_steady(10);
}

#[test]
fn symbol_error_fatal_fires_after_one_hour_polling_every_7_seconds() {
    symbol_error_steady(7);
}

#[test]
fn symbol_error_fatal_message_shows_the_hourly_rate() {
    let mut n = Node::ib();
    n.poll(0, &[(SYMBOL_ERROR, 0)]);
    assert!(n.poll(3599, &[(SYMBOL_ERROR, 199)]).is_empty());
    let ev = n.poll(3600, &[(SYMBOL_ERROR, 200)]);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].message.ends_with("(value=200, delta=200, rate=200.00/hour)"), "{}", ev[0].message);
}

#[test]
fn velocity_window_survives_a_restart() {
    let mut n = Node::ib();
    n.poll(0, &[(SYMBOL_ERROR, 0)]);
    n.poll(1800, &[(SYMBOL_ERROR, 100)]);
    n.restart();
    n.state.last_values.clear();
    assert!(n.poll(3599, &[(SYMBOL_ERROR, 150)]).is_empty());
    let ev = n.poll(3600, &[(SYMBOL_ERROR, 150)]);
    assert_eq!(ev.len(), 1, "the hour started before the restart");
    assert_eq!(ev[0].error_code, ["symbol_error_fatal"]);
}

#[test]
fn symbol_error_burst_fires_the_non_fatal_rule() {
    let mut n = Node::ib();
    n.poll(0, &[(SYMBOL_ERROR, 1000)]);
    let mut fired = Vec::new();
    // +100 within 5 s, polled every second: 20/sec.
    for t in 1..=10 {
        let v = 1000 + (t.min(5) * 20) as u64;
        fired.extend(n.poll(t, &[(SYMBOL_ERROR, v)]));
    }
    assert_eq!(fired.len(), 1, "{fired:#?}");
    assert_unhealthy(&fired[0], Check::InfiniBandDegradationCheck, "symbol_error", false);
    assert_eq!(
        fired[0].message,
        "Port mlx5_0 port 1: symbol_error - PHY bit errors before FEC - physical layer \
         degradation (value=1020, delta=20, rate=20.00/sec)"
    );
}

#[test]
fn symbol_error_exactly_at_threshold_does_not_fire() {
    // Polled every 10 s: +100 in 10 s is 10/sec, not > 10/sec; +101 is.
    let mut n = Node::ib();
    n.poll(0, &[(SYMBOL_ERROR, 0)]);
    assert!(n.poll(10, &[(SYMBOL_ERROR, 100)]).is_empty());
    let ev = n.poll(20, &[(SYMBOL_ERROR, 201)]);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].message.ends_with("rate=10.10/sec)"), "{}", ev[0].message);
}

#[test]
fn velocity_does_not_extrapolate_short_samples() {
    // 5 errors in 200 ms is 25/sec extrapolated; within the 1 s window it is only 5.
    let mut n = Node::ib();
    n.poll_ms(0, &[(SYMBOL_ERROR, 0)], false);
    assert!(n.poll_ms(200, &[(SYMBOL_ERROR, 5)], false).is_empty());
    assert!(n.poll_ms(1000, &[(SYMBOL_ERROR, 5)], false).is_empty());
}

#[test]
fn missing_counters_fail_open() {
    let mut n = Node::new(LinkLayer::Ethernet);
    // A ConnectX-5: no hw_counters/roce_slow_restart.
    let present = [(LINK_DOWNED, 0), (SYMBOL_ERROR, 0), ("hw_counters/rnr_nak_retry_err", 0)];
    assert!(n.poll(0, &present).is_empty());
    assert!(n.poll(1, &present).is_empty());
    assert!(n.poll(2, &[]).is_empty());
    let counters: BTreeMap<std::sync::Arc<str>, u64> = present.iter().map(|(k, v)| ((*k).into(), *v)).collect();
    let ports = [CounterPort {
        device: "mlx5_0",
        port: 1,
        link_layer: Some(&LinkLayer::Ethernet),
        driver: Some(crate::model::driver::RdmaDriver::Mlx5),
        counters: &counters,
        rate_bps: None,
        ber_threshold: None,
        ethtool_age: Default::default(),
    }];
    let gone = missing(&ports, &n.rules);
    assert!(gone.contains(&("mlx5_0".into(), 1, "roce_slow_restart".into())));
    assert!(!gone.iter().any(|(_, _, c)| c == "link_downed"));
    // symbol_error feeds two rules; the EFA rules do not apply to a RoCE port.
    let applicable = n.rules.iter().filter(|r| ports[0].applies(r)).count();
    assert_eq!(gone.len(), applicable - 4);
    assert!(!gone.iter().any(|(_, _, c)| c.starts_with("efa_")));
}

#[test]
fn saturated_link_downed_reports_once_and_needs_a_reset() {
    let mut n = Node::ib();
    let ev = n.poll(0, &[(LINK_DOWNED, 255)]);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_unhealthy(&ev[0], Check::InfiniBandDegradationCheck, "link_downed", false);
    assert!(ev[0].message.contains("counter reset is needed"), "{}", ev[0].message);
    assert!(ev[0].message.contains("8-bit"), "{}", ev[0].message);
    for t in 1..5 {
        assert!(n.poll(t, &[(LINK_DOWNED, 255)]).is_empty());
    }
    n.restart();
    assert!(n.poll(5, &[(LINK_DOWNED, 255)]).is_empty());
    assert_eq!(n.state.saturated_count(), 1);

    // The reset ends the episode and clears the condition.
    let ev = n.poll(6, &[(LINK_DOWNED, 0)]);
    assert_eq!(ev.len(), 1);
    assert_healthy(
        &ev[0],
        Check::InfiniBandDegradationCheck,
        "link_downed",
        "Counter link_downed recovered on port mlx5_0 port 1",
    );
    assert_eq!(n.state.saturated_count(), 0);
    let ev = n.poll(7, &[(LINK_DOWNED, 1)]);
    assert_eq!(ev.len(), 1);
    assert_unhealthy(&ev[0], Check::InfiniBandDegradationCheck, "link_downed", true);
}

#[test]
fn reaching_saturation_emits_no_threshold_event() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 250)]);
    let ev = n.poll(1, &[(LINK_DOWNED, 255)]);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert!(!ev[0].is_fatal);
    assert!(ev[0].message.contains("CounterSaturated"));
    assert!(n.state.breach_flags.is_empty());
}

#[test]
fn saturation_of_a_breached_counter_is_still_reported() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 250)]);
    assert!(n.poll(1, &[(LINK_DOWNED, 251)])[0].is_fatal);
    let ev = n.poll(2, &[(LINK_DOWNED, 255)]);
    assert_eq!(ev.len(), 1);
    assert!(!ev[0].is_fatal && ev[0].message.contains("reset is needed"));
    // One recovery for both conditions of the counter.
    let ev = n.poll(3, &[(LINK_DOWNED, 0)]);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].is_healthy);
    assert!(n.state.breach_flags.is_empty() && n.state.saturation_flags.is_empty());
}

#[test]
fn a_wide_data_counter_passing_u32_max_ends_the_episode() {
    let mut n = Node::ib();
    n.rules = vec![CounterRule {
        name: "port_xmit_data".into(),
        path: "counters/port_xmit_data".into(),
        enabled: true,
        is_fatal: false,
        threshold_type: ThresholdType::Delta,
        threshold: 1e18,
        velocity_unit: None,
        description: String::new(),
        layers: Default::default(),
        measure: Default::default(),
        error_code: None,
        threshold_set: false,
        drivers: Default::default(),
        alias: None,
    }];
    let p = "counters/port_xmit_data";
    assert_eq!(n.poll(0, &[(p, u32::MAX as u64)]).len(), 1);
    let ev = n.poll(1, &[(p, u32::MAX as u64 + 1000)]);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].is_healthy);
    assert!(n.poll(2, &[(p, u32::MAX as u64 + 5000)]).is_empty());
}

#[test]
fn reboot_emits_one_healthy_baseline_per_port_and_counter() {
    let mut n = Node::ib();
    let counters = [(LINK_DOWNED, 0), (SYMBOL_ERROR, 0), ("hw_counters/rnr_nak_retry_err", 0)];
    let ev = n.poll_ms(0, &counters, true);
    // symbol_error and symbol_error_fatal both read counters/symbol_error.
    let codes: Vec<&str> = ev.iter().map(|e| e.error_code[0].as_str()).collect();
    assert_eq!(codes, ["link_downed", "rnr_nak_retry_err", "symbol_error", "symbol_error_fatal"]);
    assert_healthy(
        &ev[0],
        Check::InfiniBandDegradationCheck,
        "link_downed",
        "Counter link_downed healthy after reboot on port mlx5_0 port 1",
    );
    // Later polls of the same boot: no second baseline; delta rules work from the baseline.
    assert!(n.poll_ms(1000, &counters, true).is_empty());
    let ev = n.poll_ms(2000, &[(LINK_DOWNED, 1)], true);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].is_fatal);
}

#[test]
fn reboot_after_a_latched_breach_starts_over() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 0)]);
    assert_eq!(n.poll(1, &[(LINK_DOWNED, 1)]).len(), 1);
    // Boot ID changed: the caller clears the state.
    n.state = CounterState::default();
    let ev = n.poll_ms(100_000, &[(LINK_DOWNED, 0)], true);
    assert_eq!(ev.len(), 1);
    assert!(ev[0].is_healthy);
    assert!(ev[0].message.contains("healthy after reboot"));
}

#[test]
fn reboot_baseline_then_saturation_when_the_counter_is_at_its_maximum() {
    let mut n = Node::ib();
    let ev = n.poll_ms(0, &[(LINK_DOWNED, 255)], true);
    assert_eq!(ev.len(), 2);
    assert!(ev[0].is_healthy && !ev[1].is_healthy);
    assert!(ev[1].message.contains("reset is needed"));
}

#[test]
fn clock_stepping_back_restarts_the_velocity_window() {
    let mut n = Node::ib();
    n.poll(100, &[(SYMBOL_ERROR, 0)]);
    assert!(n.poll(50, &[(SYMBOL_ERROR, 0)]).is_empty());
    assert_eq!(n.state.counter_snapshots["mlx5_0:1:symbol_error_fatal"].timestamp, T0 + Duration::seconds(50));
    // Delta rules with zero elapsed time still evaluate; the rate is unknown.
    n.poll(50, &[(LINK_DOWNED, 0)]);
    let ev = n.poll(50, &[(LINK_DOWNED, 1)]);
    assert!(ev[0].message.ends_with("rate=n/a)"), "{}", ev[0].message);
}

#[test]
fn disabled_rules_are_not_evaluated() {
    let mut n = Node::ib();
    n.rules.iter_mut().for_each(|r| r.enabled = r.name != "link_downed");
    n.poll(0, &[(LINK_DOWNED, 0)]);
    assert!(n.poll(1, &[(LINK_DOWNED, 9)]).is_empty());
    assert!(n.state.counter_snapshots.is_empty());
}

#[test]
fn state_json_shape_is_stable() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 0)]);
    n.poll(5, &[(LINK_DOWNED, 1)]);
    let v = serde_json::to_value(&n.state).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "counter_snapshots": {
                "mlx5_0:1:link_downed": {"value": 1, "timestamp": "2026-03-01T12:00:05Z"}
            },
            "last_values": {"mlx5_0:1:link_downed": 1},
            "breach_flags": {
                "mlx5_0:1:link_downed": {
                    "breached": true,
                    "check_name": "InfiniBandDegradationCheck",
                    "is_fatal": true,
                    "since": "2026-03-01T12:00:05Z"
                }
            },
            "saturation_flags": {}
        })
    );
    // Older or partial state files load.
    let s: CounterState = serde_json::from_str("{}").unwrap();
    assert_eq!(s, CounterState::default());
}

// ---- properties ----

fn toml_fragment() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("name"),
        Just("path"),
        Just("enabled"),
        Just("isFatal"),
        Just("thresholdType"),
        Just("threshold"),
        Just("velocityUnit"),
        Just("description"),
        Just("bogus"),
    ];
    let value = prop_oneof![
        Just("\"link_downed\"".to_string()),
        Just("\"symbol_error\"".to_string()),
        Just("\"x\"".to_string()),
        Just("\"\"".to_string()),
        Just("\"counters/x\"".to_string()),
        Just("\"/sys/class/net/{interface}/y\"".to_string()),
        Just("\"velocity\"".to_string()),
        Just("\"delta\"".to_string()),
        Just("\"hour\"".to_string()),
        Just("true".to_string()),
        Just("nan".to_string()),
        Just("-inf".to_string()),
        Just("[1, 2]".to_string()),
        Just("{ a = 1 }".to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        "[a-z{}/._ -]{0,12}".prop_map(|s| format!("{s:?}")),
    ];
    prop::collection::vec(
        prop::collection::vec((key, value), 0..6).prop_map(|kvs| {
            let mut s = String::from("[[counterDetection.counters]]\n");
            for (k, v) in kvs {
                s.push_str(&format!("{k} = {v}\n"));
            }
            s
        }),
        0..5,
    )
    .prop_map(|entries| entries.concat())
}

#[derive(serde::Deserialize)]
struct Top {
    #[serde(rename = "counterDetection", default)]
    _counter_detection: Option<CounterDetection>,
}

/// A poll of the property test: time step in ms (may go back), reboot flag, one value per
/// counter path (None = unreadable).
type Poll = (i64, bool, Vec<Option<u64>>);

const PROP_PATHS: [&str; 5] = [
    LINK_DOWNED,
    SYMBOL_ERROR,
    "counters/excessive_buffer_overrun_errors",
    "counters/port_xmit_data",
    "hw_counters/rnr_nak_retry_err",
];

fn value() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        Just(None),
        (0u64..20).prop_map(Some),
        (0u64..300).prop_map(Some),
        prop::sample::select(vec![15u64, 255, 65535, u32::MAX as u64, u64::MAX]).prop_map(Some),
        any::<u64>().prop_map(Some),
    ]
}

#[test]
fn counter_keys_split_back_into_their_parts() {
    assert_eq!(parse_counter_key(&counter_key("mlx5_0", 1, "link_downed")), Some(("mlx5_0", 1, "link_downed")));
    for port in [0, 9, 10, 255, 1000, u32::MAX] {
        assert_eq!(counter_key("mlx5_0", port, "x"), format!("mlx5_0:{port}:x"));
    }
    assert_eq!(parse_counter_key("mlx5_0:x:link_downed"), None);
    assert_eq!(parse_counter_key("nocolon"), None);
}

proptest! {
    #[test]
    fn config_parsing_never_panics(s in "\\PC{0,200}", frag in toml_fragment()) {
        let _ = toml::from_str::<Top>(&s);
        if let Ok(t) = toml::from_str::<Top>(&frag)
            && let Some(cd) = t._counter_detection
            && let Ok(rules) = cd.rules()
        {
            for r in &rules {
                prop_assert!(r.threshold.is_finite() && r.threshold >= 0.0);
                prop_assert_eq!(
                    r.velocity_unit.is_some(),
                    r.threshold_type == ThresholdType::Velocity
                );
            }
            let _ = read_paths(&rules);
        }
    }

    #[test]
    fn evaluation_never_panics_and_latches(
        polls in prop::collection::vec(
            (-5_000i64..4_000_000, any::<bool>(), prop::collection::vec(value(), 5)),
            1..40,
        ),
        restart_at in 0usize..40,
    ) {
        let polls: Vec<Poll> = polls;
        let mut rules = default_rules();
        rules.push(CounterRule {
            name: "port_xmit_data".into(),
            path: "counters/port_xmit_data".into(),
            enabled: true,
            is_fatal: false,
            threshold_type: ThresholdType::Velocity,
            threshold: 0.0,
            velocity_unit: Some(VelocityUnit::Minute),
            description: String::new(),
            layers: Default::default(),
            measure: Default::default(),
            error_code: None,
            threshold_set: false,
            drivers: Default::default(),
            alias: None,
        });
        let mut state = CounterState::default();
        let mut now = T0;
        // Per error code: is a threshold breach outstanding (no recovery since)?
        let mut open: BTreeMap<String, bool> = BTreeMap::new();
        for (i, (step, reboot, values)) in polls.into_iter().enumerate() {
            now += Duration::milliseconds(step);
            let counters: BTreeMap<std::sync::Arc<str>, u64> = PROP_PATHS
                .iter()
                .zip(values)
                .filter_map(|(p, v)| v.map(|v| ((*p).into(), v)))
                .collect();
            let ll = LinkLayer::InfiniBand;
            let ports = [CounterPort { device: "mlx5_0", port: 1, link_layer: Some(&ll), driver: Some(crate::model::driver::RdmaDriver::Mlx5), counters: &counters, rate_bps: None, ber_threshold: None, ethtool_age: Default::default() }];
            let (events, next) = evaluate(&state, &ports, &rules, now, reboot, &Stamp::default());
            for e in &events {
                prop_assert_eq!(e.error_code.len(), 1);
                prop_assert_eq!(e.check(), Some(Check::InfiniBandDegradationCheck));
                let code = e.error_code[0].clone();
                let threshold_breach = !e.is_healthy && !e.message.contains("CounterSaturated");
                if threshold_breach {
                    prop_assert!(!open.get(&code).copied().unwrap_or(false), "breach while latched: {:?}", e);
                    open.insert(code, true);
                } else if e.is_healthy {
                    open.insert(code, false);
                }
            }
            prop_assert!(events.len() <= 2 * rules.len());
            state = next;
            if i == restart_at {
                let json = serde_json::to_string(&state).unwrap();
                let back: CounterState = serde_json::from_str(&json).unwrap();
                prop_assert_eq!(&back, &state);
                state = back;
            }
        }
    }
}

#[test]
fn a_counter_that_goes_unreadable_is_said_once_per_episode() {
    let mut n = Node::ib();
    n.poll(0, &[(LINK_DOWNED, 0), (SYMBOL_ERROR, 0)]);
    let empty = BTreeMap::new();
    let readable: BTreeMap<std::sync::Arc<str>, u64> = [(SYMBOL_ERROR.into(), 0)].into();
    let unreadable = |n: &mut Node, counters: &BTreeMap<std::sync::Arc<str>, u64>| {
        let ports = [CounterPort {
            device: n.device,
            port: n.port,
            link_layer: Some(&n.link_layer),
            driver: Some(crate::model::driver::RdmaDriver::Mlx5),
            counters,
            rate_bps: None,
            ber_threshold: None,
            ethtool_age: Default::default(),
        }];
        let prev = n.state.clone();
        let gone = went_unreadable(&prev, &mut n.state, &ports, &n.rules);
        gone.into_iter().map(|(d, p, r)| format!("{d}:{p}:{r}")).collect::<Vec<_>>()
    };
    // link_downed reads N/A: said once (one rule reads it), the others stay quiet.
    assert_eq!(unreadable(&mut n, &readable), vec!["mlx5_0:1:link_downed"]);
    assert!(unreadable(&mut n, &readable).is_empty(), "said once per episode");
    // Readable again, then everything unreadable: each readable rule said once.
    n.poll(2, &[(LINK_DOWNED, 0), (SYMBOL_ERROR, 0)]);
    let all = unreadable(&mut n, &empty);
    assert!(all.contains(&"mlx5_0:1:link_downed".to_string()) && all.iter().any(|k| k.ends_with("symbol_error")));
    assert!(n.poll(3, &[(LINK_DOWNED, 0)]).is_empty(), "readable again at its old value: no event");
}

mod roce_phy {
    //! The RoCE physical-layer rules (SPEC §1.11) through the same engine.
    use super::*;

    const BITS: &str = "ethtool/fec_corrected_bits";
    const PAUSE: &str = "ethtool/pause_duration";

    /// A 400G RoCE port: 2.4e13 bits a minute.
    fn roce() -> Node {
        Node { rate_bps: Some(400e9), ..Node::new(LinkLayer::Ethernet) }
    }

    fn codes(events: &[HealthEvent]) -> Vec<(String, bool)> {
        events.iter().map(|e| (e.error_code.join(","), e.is_healthy)).collect()
    }

    #[test]
    fn pre_fec_ber_breaches_once_and_clears_when_it_falls() {
        let mut n = roce();
        assert!(n.poll_ms(0, &[(BITS, 0)], false).is_empty());
        // Healthy, 1e-9: 24,000 bits a minute.
        assert!(n.poll_ms(60_000, &[(BITS, 24_000)], false).is_empty());
        let ber = n.state.measured("mlx5_0", 1, "pre_fec_ber").unwrap();
        assert!((ber / 1e-9 - 1.0).abs() < 1e-9, "{ber:e}");
        // 1.5e-4: above 1e-4, one non-fatal event with the BER in its message.
        let e = n.poll_ms(120_000, &[(BITS, 24_000 + 3_600_000_000)], false);
        assert_eq!(codes(&e), [("pre_fec_ber".to_string(), false)]);
        assert!(!e[0].is_fatal);
        assert!(e[0].message.contains("BER 1.50e-4"), "{}", e[0].message);
        // Still high: latched, nothing new; halfway through a window: nothing.
        assert!(n.poll_ms(180_000, &[(BITS, 24_000 + 7_200_000_000)], false).is_empty());
        assert!(n.poll_ms(200_000, &[(BITS, 24_000 + 7_200_000_100)], false).is_empty());
        // Falls back to 1e-8: one healthy event for the same error code.
        let e = n.poll_ms(240_000, &[(BITS, 24_000 + 7_200_240_000)], false);
        assert_eq!(codes(&e), [("pre_fec_ber".to_string(), true)]);
        assert!(n.poll_ms(300_000, &[(BITS, 24_000 + 7_200_480_000)], false).is_empty());
    }

    #[test]
    fn pre_fec_ber_without_a_port_rate_is_not_judged() {
        let mut n = Node { rate_bps: None, ..roce() };
        n.poll_ms(0, &[(BITS, 0)], false);
        assert!(n.poll_ms(60_000, &[(BITS, u64::from(u32::MAX))], false).is_empty());
        assert_eq!(n.state.measured("mlx5_0", 1, "pre_fec_ber"), None);
    }

    #[test]
    fn a_port_threshold_of_its_fec_code_holds_over_the_rule() {
        // KR4 (25G lanes) defaults to 1e-5: 5e-5 breaches there and not under KP4's 1e-4.
        for (port_threshold, want) in [(None, 0), (Some(1e-5), 1)] {
            let mut n = Node { rate_bps: Some(100e9), ..roce() };
            let counters = |v: u64| -> BTreeMap<std::sync::Arc<str>, u64> { [(BITS.into(), v)].into() };
            let (c0, c1) = (counters(0), counters(300_000_000));
            let mut events = Vec::new();
            for (secs, c) in [(0, &c0), (60, &c1)] {
                let ports = [CounterPort {
                    device: "mlx5_0",
                    port: 1,
                    link_layer: Some(&LinkLayer::Ethernet),
                    driver: Some(crate::model::driver::RdmaDriver::Mlx5),
                    counters: c,
                    rate_bps: n.rate_bps,
                    ber_threshold: port_threshold,
                    ethtool_age: Default::default(),
                }];
                let (e, next) = evaluate(&n.state, &ports, &n.rules, T0 + Duration::seconds(secs), false, &n.stamp);
                n.state = next;
                events.extend(e);
            }
            assert_eq!(events.len(), want, "{port_threshold:?}: {events:?}");
        }
    }

    #[test]
    fn a_reset_or_reboot_is_handled_like_the_other_counters() {
        let mut n = roce();
        n.poll_ms(0, &[(BITS, 1_000)], false);
        assert_eq!(codes(&n.poll_ms(60_000, &[(BITS, 6_000_000_000)], false)), [("pre_fec_ber".to_string(), false)]);
        // The driver reset the counter: a recovery, the window restarts from the new value.
        assert_eq!(codes(&n.poll_ms(70_000, &[(BITS, 10)], false)), [("pre_fec_ber".to_string(), true)]);
        assert!(n.poll_ms(130_000, &[(BITS, 20)], false).is_empty());
        // A reboot: state cleared, one healthy baseline per RoCE rule the port has.
        let mut r = roce();
        let e = r.poll_ms(0, &[(BITS, 5), (PAUSE, 9)], true);
        assert_eq!(codes(&e), [("pre_fec_ber".to_string(), true), ("pause_victim".to_string(), true)]);
    }

    #[test]
    fn pause_victim_over_half_a_minute_and_back() {
        let mut n = roce();
        n.poll_ms(0, &[(PAUSE, 0)], false);
        // Paused 20 s of 60: a busy congested fabric, no event.
        assert!(n.poll_ms(60_000, &[(PAUSE, 20_000_000)], false).is_empty());
        // Paused 45 s of 60: a victim.
        let e = n.poll_ms(120_000, &[(PAUSE, 65_000_000)], false);
        assert_eq!(codes(&e), [("pause_victim".to_string(), false)]);
        assert!(!e[0].is_fatal);
        let share = n.state.measured("mlx5_0", 1, "pause_victim").unwrap();
        assert!((share - 0.75).abs() < 1e-12, "{share}");
        assert_eq!(codes(&n.poll_ms(180_000, &[(PAUSE, 66_000_000)], false)), [("pause_victim".to_string(), true)]);
    }

    #[test]
    fn storms_and_uncorrectable_blocks_are_non_fatal_and_latch() {
        let mut n = roce();
        let (w, e, u) = (
            "ethtool/tx_pause_storm_warning_events",
            "ethtool/tx_pause_storm_error_events",
            "ethtool/fec_uncorrectable",
        );
        n.poll_ms(0, &[(w, 0), (e, 0), (u, 0)], false);
        let got = n.poll_ms(10_000, &[(w, 1), (e, 0), (u, 3)], false);
        assert_eq!(codes(&got), [("fec_uncorrectable".to_string(), false), ("pfc_storm".to_string(), false)]);
        assert!(got.iter().all(|e| !e.is_fatal && e.recommended_action == RecommendedAction::NONE));
        assert!(n.poll_ms(20_000, &[(w, 2), (e, 0), (u, 9)], false).is_empty(), "latched");
        // Storm prevention then disabled pause: the same error code, the message says which.
        let got = n.poll_ms(30_000, &[(w, 2), (e, 1), (u, 9)], false);
        assert_eq!(codes(&got), [("pfc_storm".to_string(), false)]);
        assert!(got[0].message.contains("pfc_storm_error - PFC storm error"), "{}", got[0].message);
        assert!(!got[0].is_fatal);
        // The rules keep their own state: the error rule latched under its own key.
        assert!(n.state.is_breached("mlx5_0:1:pfc_storm_error") && n.state.is_breached("mlx5_0:1:pfc_storm"));
        // On an InfiniBand port none of these rules applies.
        let mut ib = Node::ib();
        ib.poll_ms(0, &[(w, 0), (u, 0)], false);
        assert!(ib.poll_ms(10_000, &[(w, 5), (u, 5)], false).is_empty());
    }

    #[test]
    fn storm_stages_share_one_code_and_recover_once() {
        let (w, e) = ("ethtool/tx_pause_storm_warning_events", "ethtool/tx_pause_storm_error_events");
        let mut n = roce();
        n.poll_ms(0, &[(w, 4), (e, 2)], false);
        assert_eq!(codes(&n.poll_ms(10_000, &[(w, 5), (e, 2)], false)), [("pfc_storm".to_string(), false)]);
        assert_eq!(codes(&n.poll_ms(20_000, &[(w, 5), (e, 3)], false)), [("pfc_storm".to_string(), false)]);
        // The driver reloads: both counters restart, both rules recover, and the code is
        // cleared once (the first recovery is held while its sibling is still breached).
        let got = n.poll_ms(30_000, &[(w, 0), (e, 0)], false);
        assert_eq!(codes(&got), [("pfc_storm".to_string(), true)]);
        assert!(n.state.breach_flags.is_empty());
        // Only the warning resets while the error is latched: no healthy event for the
        // code, which would clear the error's condition.
        n.poll_ms(40_000, &[(w, 1), (e, 0)], false);
        n.poll_ms(50_000, &[(w, 1), (e, 1)], false);
        assert!(n.poll_ms(60_000, &[(w, 0), (e, 1)], false).is_empty(), "the error still holds pfc_storm");
        assert_eq!(codes(&n.poll_ms(70_000, &[(w, 0), (e, 0)], false)), [("pfc_storm".to_string(), true)]);
        // A reboot: one baseline for the code, not one per rule.
        let mut r = roce();
        assert_eq!(codes(&r.poll_ms(0, &[(w, 0), (e, 0)], true)), [("pfc_storm".to_string(), true)]);
    }

    #[test]
    fn kept_ethtool_readings_are_judged_at_their_read_time() {
        // 400G: 2.4e13 bits a minute. Read at 0 s; the poll at 70 s gets the reading taken
        // at 50 s (kept, 20 s old): only 50 s of the window have been read, no BER yet.
        let mut n = roce();
        n.poll_ms(0, &[(BITS, 0)], false);
        n.ethtool_age = std::time::Duration::from_secs(20);
        assert!(n.poll_ms(70_000, &[(BITS, 1_000_000)], false).is_empty());
        assert_eq!(n.state.measured("mlx5_0", 1, "pre_fec_ber"), None);
        // Read again at 75 s: the window is 0 s to 75 s, the BER over exactly that.
        n.ethtool_age = std::time::Duration::ZERO;
        assert!(n.poll_ms(75_000, &[(BITS, 3_000_000)], false).is_empty());
        let ber = n.state.measured("mlx5_0", 1, "pre_fec_ber").unwrap();
        let want = 3_000_000.0 / (400e9 * 75.0);
        assert!((ber / want - 1.0).abs() < 1e-12, "{ber:e}, want {want:e}");
        // The same reading again at a later poll: nothing moves.
        n.ethtool_age = std::time::Duration::from_secs(5);
        assert!(n.poll_ms(80_000, &[(BITS, 3_000_000)], false).is_empty());
        let snap = n.state.counter_snapshots["mlx5_0:1:pre_fec_ber"];
        assert_eq!(snap.timestamp, T0 + Duration::seconds(75));
        // Counters read from sysfs keep the poll's time.
        n.poll_ms(80_000, &[(BITS, 3_000_000), (LINK_DOWNED, 0)], false);
        assert_eq!(n.state.counter_snapshots["mlx5_0:1:link_downed"].timestamp, T0 + Duration::seconds(80));
    }
}

/// A counter breach is about the port whose counter rose.
#[test]
fn a_breach_is_about_its_port() {
    let mut n = Node::ib();
    assert!(n.poll(0, &[(LINK_DOWNED, 0)]).is_empty());
    let ev = n.poll(5, &[(LINK_DOWNED, 1)]);
    assert_eq!(ev.len(), 1, "{ev:#?}");
    assert_eq!(ev[0].subject(), crate::model::event::Subject::Port { device: "mlx5_0", port: 1 });
}

/// The rules' facts made once (the daemon's) judge as those made at each call; facts made
/// from another rule set (here: the pause-storm stages' shared code disabled) are not used.
#[test]
fn facts_made_once_judge_as_facts_made_each_call() {
    let (w, e) = ("ethtool/tx_pause_storm_warning_events", "ethtool/tx_pause_storm_error_events");
    let rules = default_rules();
    let mut other = rules.clone();
    for r in other.iter_mut().filter(|r| r.path == w) {
        r.enabled = false;
    }
    let ll = LinkLayer::Ethernet;
    let stamp = Stamp::default();
    let polls: [&[(&str, u64)]; 4] = [&[(w, 4), (e, 2)], &[(w, 5), (e, 3)], &[(w, 0), (e, 3)], &[(w, 0), (e, 0)]];
    for facts in [RuleFacts::of(&rules), RuleFacts::of(&other)] {
        let (mut a, mut b) = (CounterState::default(), CounterState::default());
        for (i, values) in polls.iter().enumerate() {
            let counters: BTreeMap<std::sync::Arc<str>, u64> = values.iter().map(|(k, v)| ((*k).into(), *v)).collect();
            let ports = [CounterPort {
                device: "mlx5_0",
                port: 1,
                link_layer: Some(&ll),
                driver: Some(crate::model::driver::RdmaDriver::Mlx5),
                counters: &counters,
                rate_bps: None,
                ber_threshold: None,
                ethtool_age: Default::default(),
            }];
            let now = T0 + Duration::seconds(10 * i as i64);
            let (ea, na) = evaluate(&a, &ports, &rules, now, i == 0, &stamp);
            let (eb, nb) = evaluate_with(&b, &ports, &rules, &facts, now, i == 0, &stamp);
            assert_eq!(ea, eb, "poll {i}");
            assert_eq!(na, nb, "poll {i}");
            (a, b) = (na, nb);
        }
    }
}
