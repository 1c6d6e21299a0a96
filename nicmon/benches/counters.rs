//! The counter engine alone (`decide::counters::evaluate`) on the plain node's shape: 12 PF
//! ports (8 InfiniBand, 4 RoCE), each with the 12 counters a steady poll of that node reads,
//! the default rules, values unchanged from poll to poll (a quiet node). Prints the median
//! time of one evaluation as the daemon makes it (the rules' facts made once), the same
//! with the facts made at each call (`evaluate`), with no port, with only the rules of the
//! counters read, and the copy of the state.
//! Run with `cargo bench -p nicmon --bench counters` (`NICMON_BENCH_POLLS`, default 20000).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use nicmon::decide::counters::{CounterPort, CounterRule, CounterState, RuleFacts, evaluate, evaluate_with};
use nicmon::decide::settings::Config;
use nicmon::model::LinkLayer;
use nicmon::model::driver::RdmaDriver;
use nicmon::model::event::Stamp;
use time::{Duration, OffsetDateTime};

const READ: [&str; 12] = [
    "counters/symbol_error",
    "counters/port_xmit_wait",
    "counters/port_xmit_discards",
    "counters/port_rcv_errors",
    "counters/local_link_integrity_errors",
    "counters/link_error_recovery",
    "counters/link_downed",
    "counters/excessive_buffer_overrun_errors",
    "hw_counters/roce_slow_restart",
    "hw_counters/rnr_nak_retry_err",
    "hw_counters/out_of_sequence",
    "hw_counters/local_ack_timeout_err",
];

fn main() {
    let polls: i64 = std::env::var("NICMON_BENCH_POLLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let rules = Config::default().counter_rules;
    let names: Vec<String> = (0..12).map(|i| format!("mlx5_{i}")).collect();
    let readings: Vec<BTreeMap<Arc<str>, u64>> =
        names.iter().map(|_| READ.iter().map(|p| (Arc::from(*p), 7)).collect()).collect();
    let (ib, eth) = (LinkLayer::InfiniBand, LinkLayer::Ethernet);
    let ports: Vec<CounterPort<'_>> = names
        .iter()
        .zip(&readings)
        .enumerate()
        .map(|(i, (device, counters))| CounterPort {
            device,
            port: 1,
            link_layer: Some(if i < 8 { &ib } else { &eth }),
            driver: Some(RdmaDriver::Mlx5),
            counters,
            rate_bps: Some(4e11),
            ber_threshold: None,
            ethtool_age: Default::default(),
        })
        .collect();
    let few: Vec<CounterRule> = rules.iter().filter(|r| READ.contains(&r.path.as_str())).cloned().collect();
    let all = run(&ports, &rules, polls, true);
    let per_call = run(&ports, &rules, polls, false);
    let none = run(&[], &rules, polls, true);
    let only = run(&ports, &few, polls, true);
    let (_, state) =
        evaluate(&CounterState::default(), &ports, &rules, OffsetDateTime::UNIX_EPOCH, false, &Stamp::default());
    let judged = state.counter_snapshots.len();
    let copy = median_us(polls, || drop(std::hint::black_box(state.clone())));
    println!(
        "counter engine, 12 ports x {} counters read, {} rules ({judged} counters judged per poll): \
         evaluate median {all:.1} us ({:.0} ns per counter judged); with the rules' facts made at \
         each call {per_call:.1} us; no port {none:.1} us; only the {} rules of the counters read {only:.1} us; \
         the state's copy {copy:.1} us",
        READ.len(),
        rules.len(),
        all * 1000.0 / judged as f64,
        few.len(),
    );
}

/// Median microseconds of one evaluation over batches of polls, each a second after the
/// last; `once`: the rules' facts made once (as the daemon), else at each call.
fn run(ports: &[CounterPort<'_>], rules: &[CounterRule], polls: i64, once: bool) -> f64 {
    let stamp = Stamp::default();
    let facts = RuleFacts::of(rules);
    let mut state = CounterState::default();
    let mut now = OffsetDateTime::UNIX_EPOCH;
    median_us(polls, || {
        let (_, next) = match once {
            true => evaluate_with(&state, ports, rules, &facts, now, false, &stamp),
            false => evaluate(&state, ports, rules, now, false, &stamp),
        };
        state = next;
        now += Duration::seconds(1);
    })
}

/// Median microseconds of `f` over 20 batches of `polls / 20` calls.
fn median_us(polls: i64, mut f: impl FnMut()) -> f64 {
    let batch = (polls / 20).max(1);
    let mut per: Vec<f64> = (0..20)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / batch as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    per[per.len() / 2]
}
