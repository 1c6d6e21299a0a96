//! What the real-Prometheus alert tests share (tests/tests/prometheus_alerts.rs,
//! tests/tests/prometheus_monitor_alerts.rs): the binaries, nicmon's first poll, the alerts
//! Prometheus holds, the wait for an expected set to fire and the checks of what fired,
//! a quiet window, and the shipped rules with their `for:` holds shortened.
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::deploy::repo_root;
use crate::prom_server::{Prometheus, WAIT, http_get, wait_for};
use crate::prometheus::{self, RULES};

/// The operator guide, where every runbook is.
pub const GUIDE: &str = "docs/operator-guide.md";

/// What a fault must fire: the alert, the value of its code label (`error_code`, `counter`,
/// `attribute`, `check` or `source`, whichever the alert has; `""`: none checked), device
/// and port (`""`: the alert has no such label).
pub type Expected = (&'static str, &'static str, &'static str, &'static str);

/// The labels an alert's code may be in, in the order they are looked for.
const CODE_LABELS: [&str; 5] = ["error_code", "counter", "attribute", "check", "source"];

/// The last poll's completion time, exported once a poll completed.
pub const POLL_DONE: &str = "nic_health_monitor_poll_cycle_last_completed_timestamp_seconds{";

/// The Prometheus binaries, or `None` (with a line saying why) where they cannot be had.
pub fn tools() -> Option<prometheus::Tools> {
    match prometheus::ensure_tools(&repo_root()) {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!("SKIP: no Prometheus on this machine and it cannot be installed ({e})");
            None
        }
    }
}

/// Waits until nicmon at `metrics` has completed a poll (every baseline taken).
pub fn wait_first_poll(metrics: SocketAddr) {
    wait_for("nicmon's first poll", || {
        let (code, body) = http_get(metrics, "/metrics")?;
        (code == 200 && body.lines().any(|l| l.starts_with(POLL_DONE) && !l.ends_with(" 0"))).then_some(())
    });
}

/// An alert's label (`""` when it has none).
pub fn label<'a>(a: &'a Value, name: &str) -> &'a str {
    a["labels"][name].as_str().unwrap_or("")
}

/// The alert's code: the first of [`CODE_LABELS`] it has.
fn code_of(a: &Value) -> &str {
    CODE_LABELS.iter().map(|l| label(a, l)).find(|v| !v.is_empty()).unwrap_or("")
}

fn matches(a: &Value, &(alert, code, dev, port): &Expected) -> bool {
    label(a, "alertname") == alert
        && label(a, "device") == dev
        && label(a, "port") == port
        && (code.is_empty() || code_of(a) == code)
}

/// Waits until every expected alert fires for its fault; returns every firing alert of
/// the expected names, and says how long after `since` (the faults, or Prometheus' start)
/// each expected one was first seen firing.
pub fn wait_all_firing(prom: &Prometheus, since: Instant, expected: &[Expected]) -> Vec<Value> {
    let mut seen: Vec<Option<f64>> = vec![None; expected.len()];
    let names: BTreeSet<&str> = expected.iter().map(|e| e.0).collect();
    let deadline = Instant::now() + WAIT;
    let fired = loop {
        let firing: Vec<Value> = prom
            .alerts()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["state"] == "firing" && names.contains(label(a, "alertname")))
            .collect();
        for (e, t) in expected.iter().zip(&mut seen) {
            if t.is_none() && firing.iter().any(|a| matches(a, e)) {
                *t = Some(since.elapsed().as_secs_f64());
            }
        }
        if seen.iter().all(Option::is_some) {
            break firing;
        }
        let missing: Vec<&Expected> = expected.iter().zip(&seen).filter(|(_, t)| t.is_none()).map(|(e, _)| e).collect();
        assert!(Instant::now() < deadline, "timed out ({WAIT:?}) waiting for {missing:?} to fire");
        std::thread::sleep(Duration::from_millis(200));
    };
    for (&(alert, code, dev, port), t) in expected.iter().zip(&seen) {
        eprintln!("{alert} ({code} {dev}/{port}) firing after {:.1} s", t.unwrap_or_default());
    }
    fired
}

/// Each alert fires for its own faults only, naming node (or instance), device and port,
/// with its runbook; and no alert beyond the expected ones and `also` (alerts the setup
/// makes fire besides, e.g. `NicmonFatalHealthEvent` for fatal port events) fires.
pub fn assert_alerts(
    prom: &Prometheus,
    instance: SocketAddr,
    node: &str,
    fired: &[Value],
    expected: &[Expected],
    also: &[&str],
) {
    let guide = std::fs::read_to_string(repo_root().join(GUIDE)).unwrap();
    for a in fired.iter().filter(|a| label(a, "instance") == instance.to_string()) {
        let alert = label(a, "alertname");
        assert!(expected.iter().any(|e| matches(a, e)), "{alert} fires for its faults only: {a:#}");
        if !label(a, "node").is_empty() {
            assert_eq!(label(a, "node"), node, "{alert}: {a:#}");
        }
        let runbook = a["annotations"]["runbook_url"].as_str().unwrap_or("");
        assert_eq!(runbook, format!("{GUIDE}#{}", alert.to_lowercase()), "{alert}: runbook");
        assert!(guide.lines().any(|l| l == format!("### {alert}")), "{GUIDE} has no section for {alert}");
        let summary = a["annotations"]["summary"].as_str().unwrap_or("");
        let dev = label(a, "device");
        assert!(summary.contains(dev), "{alert}: summary {summary:?} names no {dev}");
        assert!(
            summary.contains(node) || summary.contains(&instance.to_string()),
            "{alert}: summary {summary:?} names neither {node} nor {instance}"
        );
    }
    let names: BTreeSet<&str> = expected.iter().map(|e| e.0).chain(also.iter().copied()).collect();
    let others: Vec<Value> = prom
        .alerts()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["state"] == "firing" && label(a, "instance") == instance.to_string())
        .filter(|a| !names.contains(label(a, "alertname")))
        .collect();
    assert_eq!(others, Vec::<Value>::new(), "alerts firing beyond the injected faults");
}

/// Waits until every rule of the groups named is evaluated without error.
pub fn wait_rules_evaluated(prom: &Prometheus, groups: &[&str]) {
    wait_for("every rule of the groups evaluated", || {
        let r = prom.api("rules").ok()?;
        let all = r["groups"].as_array()?;
        let mine: Vec<&Value> = all.iter().filter(|g| groups.iter().any(|n| g["name"] == *n)).collect();
        (mine.len() == groups.len()
            && mine.iter().all(|g| g["rules"].as_array().is_some_and(|r| r.iter().all(|r| r["health"] == "ok"))))
        .then_some(())
    });
}

/// No alert named in `names` is active (pending or firing) for `instance` at any of
/// Prometheus' answers during `window`: the quiet case.
pub fn assert_quiet_for(prom: &Prometheus, instance: SocketAddr, names: &[&str], window: Duration) {
    let end = Instant::now() + window;
    let mut answers = 0;
    while Instant::now() < end {
        if let Some(alerts) = prom.alerts() {
            answers += 1;
            let active: Vec<&Value> = alerts
                .iter()
                .filter(|a| names.contains(&label(a, "alertname")) && label(a, "instance") == instance.to_string())
                .collect();
            assert!(active.is_empty(), "a healthy node: {active:#?}");
        }
        // Not a synchronisation: the window is sampled at Prometheus' evaluation rate.
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(answers > 0, "Prometheus never answered during the quiet window");
}

/// The hold every shortened `for:` becomes.
pub const SHORT_FOR: &str = "5s";

/// A copy of the shipped rules in `dir` in which every `for: <duration>` is `for:
/// [SHORT_FOR]` and nothing else changes; its path.
pub fn rules_with_short_holds(dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(repo_root().join(RULES)).unwrap();
    let mut out = String::with_capacity(shipped.len());
    let mut rewritten = 0;
    for line in shipped.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        if line.trim_start().starts_with("for: ") {
            out.push_str(&format!("{indent}for: {SHORT_FOR}\n"));
            rewritten += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(rewritten >= 10, "{rewritten} `for:` lines in {RULES}");
    let path = dir.join("nicmon-rules-short-holds.yaml");
    std::fs::write(&path, out).unwrap();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holds_are_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let short = std::fs::read_to_string(rules_with_short_holds(dir.path())).unwrap();
        let shipped = std::fs::read_to_string(repo_root().join(RULES)).unwrap();
        assert_eq!(short.lines().count(), shipped.lines().count());
        for (s, o) in short.lines().zip(shipped.lines()) {
            if s != o {
                assert!(o.trim_start().starts_with("for: ") && s.trim_start() == "for: 5s", "{o:?} -> {s:?}");
            }
        }
    }
}
