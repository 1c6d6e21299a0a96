//! The operators' view: the alert rules (deploy/prometheus/nicmon-rules.yaml) and the
//! Grafana dashboard (deploy/grafana/nicmon-dashboard.json) against a real Prometheus
//! scraping a running nicmon on a simulated node. Every rule and every panel expression
//! must evaluate, and name only series nicmon exports (or the rules record); the faults
//! injected show up where the rules say they do.
//!
//! Prometheus is Debian's package (`cargo xtask prometheus-rules`, run by `cargo xtask
//! test`, unpacks it where missing; this test does the same). Without it and without a way
//! to get it, the real-Prometheus test says so in one line and passes.
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;

use nicmon_tests::daemon::Daemon;
use nicmon_tests::deploy::repo_root;
use nicmon_tests::platforms::Platform;
use nicmon_tests::prom_server::{Prometheus, free_port, http_get, wait_for};
use nicmon_tests::prometheus::{self, DASHBOARD, RULE_TESTS, RULES};
use nicmon_tests::promql::metric_names;
use nicmon_tests::{Node, nicmon_bin};
use serde_json::Value;

const GUIDE: &str = "docs/operator-guide.md";

/// The rules' record names (series the rules themselves make).
fn recorded(rules: &Value) -> BTreeSet<String> {
    groups(rules)
        .flat_map(rules_of)
        .filter(|r| r["type"] == "recording")
        .map(|r| r["name"].as_str().unwrap().into())
        .collect()
}

fn groups(rules: &Value) -> impl Iterator<Item = &Value> {
    rules["groups"].as_array().unwrap().iter()
}

fn rules_of(group: &Value) -> impl Iterator<Item = &Value> {
    group["rules"].as_array().unwrap().iter()
}

/// A dashboard panel's query: where it is, and its expression.
struct PanelQuery {
    what: String,
    expr: String,
}

/// A query variable: `label_values(<selector>, <label>)`.
struct Variable {
    name: String,
    selector: String,
    label: String,
}

/// Every target expression of the dashboard, and its query variables.
fn dashboard_exprs(d: &Value) -> (Vec<PanelQuery>, Vec<Variable>) {
    fn walk(panels: &[Value], out: &mut Vec<PanelQuery>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                let what = format!("panel {:?} target {}", p["title"], t["refId"]);
                out.push(PanelQuery { what, expr: t["expr"].as_str().unwrap().into() });
            }
            walk(p["panels"].as_array().map(Vec::as_slice).unwrap_or_default(), out);
        }
    }
    let mut exprs = Vec::new();
    walk(d["panels"].as_array().unwrap(), &mut exprs);
    let vars = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["query"].as_str().unwrap();
            let inner = q.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')).expect("label_values(...)");
            let (selector, label) = inner.rsplit_once(',').unwrap();
            Variable {
                name: v["name"].as_str().unwrap().to_string(),
                selector: selector.trim().to_string(),
                label: label.trim().to_string(),
            }
        })
        .collect();
    (exprs, vars)
}

/// A dashboard expression as Grafana sends it with every variable at "All".
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
        .replace("$node", ".*")
        .replace("$instance", ".*")
}

/// Whether `expr` evaluates and names only `exported` series: `None`, or what is wrong.
fn expression_failure(prom: &Prometheus, exported: &BTreeSet<String>, what: &str, expr: &str) -> Option<String> {
    let names = prom.query(expr).and_then(|_| prom.format(expr)).and_then(|canonical| metric_names(&canonical));
    match names {
        Ok(names) if names.is_empty() => Some(format!("{what}: names no series: {expr}")),
        Ok(names) => {
            let unknown: Vec<&String> = names.iter().filter(|n| !exported.contains(*n)).collect();
            (!unknown.is_empty()).then(|| format!("{what}: names series nicmon does not export {unknown:?}: {expr}"))
        }
        Err(e) => Some(format!("{what}: {e}: {expr}")),
    }
}

/// Every rule (healthy in Prometheus, its query) and every dashboard expression (panels and
/// variables): the failures, and how many expressions were checked.
fn all_expression_failures(prom: &Prometheus, rules: &Value, exported: &BTreeSet<String>) -> (Vec<String>, usize) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for r in groups(rules).flat_map(rules_of) {
        let what = format!("rule {}", r["name"]);
        if r["health"] != "ok" {
            failures.push(format!("{what}: health {} ({})", r["health"], r["lastError"]));
        }
        failures.extend(expression_failure(prom, exported, &what, r["query"].as_str().unwrap()));
        checked += 1;
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).unwrap();
    let (panels, vars) = dashboard_exprs(&dashboard);
    for q in &panels {
        failures.extend(expression_failure(prom, exported, &q.what, &substitute(&q.expr)));
    }
    for v in &vars {
        failures.extend(expression_failure(prom, exported, &format!("variable {}", v.name), &substitute(&v.selector)));
    }
    (failures, checked + panels.len() + vars.len())
}

/// The running monitor: a DGX-H100 node, nicmon on it (JSON lines on stdout, metrics on
/// loopback), and the exposition it serves.
fn start_nicmon() -> (Node, Daemon, SocketAddr, String) {
    let node = Platform::DgxH100.build();
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let nicmon = Daemon::spawn(
        node.run_command(&nicmon_bin(), "state.json", "gpu-node-7")
            .args(["--no-kmsg", "--no-wake", "--sink", "stdout", "--state-polling-interval", "200ms"])
            .args(["--metrics-bind-address", "127.0.0.1", "--metrics-port", &metrics.port().to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    );
    let exposition = wait_for("nicmon's /metrics", || http_get(metrics, "/metrics").filter(|(c, _)| *c == 200)).1;
    (node, nicmon, metrics, exposition)
}

#[test]
fn every_rule_and_panel_expression_evaluates_against_a_real_prometheus() {
    let tools = match prometheus::ensure_tools(&repo_root()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("SKIP: no Prometheus on this machine and it cannot be installed ({e})");
            return;
        }
    };
    let (node, _nicmon, metrics, exposition) = start_nicmon();
    let prom = Prometheus::start(&tools.prometheus, RULES, metrics);
    wait_for("the first scrape", || {
        prom.query("count(nicmon_port_healthy)").ok().filter(|r| !r["result"].as_array().unwrap().is_empty())
    });

    // A cable pulled (a fatal port event) and a link_downed breach (a fatal counter rule).
    node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
    node.set_counter("mlx5_4", 1, "counters/link_downed", 1);
    let fired = wait_for("NicmonFatalHealthEvent to fire", || {
        let f = prom.firing("NicmonFatalHealthEvent");
        let checks: BTreeSet<String> = f.iter().map(|a| a["labels"]["check"].as_str().unwrap().to_string()).collect();
        checks.is_superset(&["InfiniBandStateCheck".into(), "InfiniBandDegradationCheck".into()].into()).then_some(f)
    });
    assert!(fired.iter().all(|a| a["labels"]["node"] == "gpu-node-7" && a["labels"]["severity"] == "critical"));

    // The rules as the real Prometheus loaded them, each evaluated at least once.
    let rules = wait_for("every rule to be evaluated", || {
        let r = prom.api("rules").ok()?;
        let evaluated = groups(&r).flat_map(rules_of).all(|r| r["health"] != "unknown");
        evaluated.then_some(r)
    });
    let mut exported = prometheus::exported_series(&exposition);
    assert!(exported.contains("nicmon_port_healthy") && exported.contains("nicmon_wakeup_latency_seconds_bucket"));
    exported.extend(recorded(&rules));
    let (failures, checked) = all_expression_failures(&prom, &rules, &exported);
    assert!(failures.is_empty(), "{} of {checked} expressions failed:\n{}", failures.len(), failures.join("\n"));
    assert!(checked > 60, "{checked} expressions");
    assert_faults_show(&prom, &rules, metrics);
}

/// The variables list the node and the scraped instance; the alerts' expressions select the
/// injected faults with the labels their annotations use, and nothing else.
fn assert_faults_show(prom: &Prometheus, rules: &Value, metrics: SocketAddr) {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).unwrap();
    for v in dashboard_exprs(&dashboard).1 {
        let r = prom.query(&substitute(&v.selector)).unwrap();
        let values: BTreeSet<&str> =
            r["result"].as_array().unwrap().iter().filter_map(|s| s["metric"][&v.label].as_str()).collect();
        let want = if v.name == "node" { "gpu-node-7".to_string() } else { metrics.to_string() };
        assert_eq!(values, [want.as_str()].into(), "variable {}", v.name);
    }
    let series = |alert: &str| -> Vec<Value> {
        let rule = groups(rules).flat_map(rules_of).find(|r| r["name"] == alert).unwrap();
        let r = prom.query(rule["query"].as_str().unwrap()).unwrap();
        r["result"].as_array().unwrap().iter().map(|s| s["metric"].clone()).collect()
    };
    let down = series("NicmonPortDown");
    assert_eq!(down.len(), 1, "{down:?}");
    assert_eq!((down[0]["device"].as_str(), down[0]["port"].as_str()), (Some("mlx5_1"), Some("1")));
    assert_eq!(down[0]["instance"], metrics.to_string());
    let breach = series("NicmonLinkErrorsFatal");
    assert_eq!(breach.len(), 1, "{breach:?}");
    for (label, want) in [("node", "gpu-node-7"), ("device", "mlx5_4"), ("port", "1"), ("counter", "link_downed")] {
        assert_eq!(breach[0][label], want, "{breach:?}");
    }
    for quiet in ["NicmonLinkErrors", "NicmonPollStalled", "NicmonAbsent", "NicmonPortFlapping"] {
        assert_eq!(series(quiet), Vec::<Value>::new(), "{quiet}");
    }
}

/// One alert's block of the rules file: its name and the `key: value` lines in it.
fn alert_blocks(rules: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        let t = line.trim_start();
        if let Some(name) = t.strip_prefix("- alert: ") {
            out.push((name.trim().to_string(), String::new()));
        } else if t.starts_with("- record: ") || t.starts_with("- name: ") {
            out.push((String::new(), String::new()));
        } else if let Some((_, block)) = out.last_mut() {
            block.push_str(t);
            block.push('\n');
        }
    }
    out.into_iter().filter(|(name, _)| !name.is_empty()).collect()
}

/// Every alert has a severity, a summary, a description and a runbook that is a section of
/// the operator guide named after it, and a promtool test that expects it to fire.
#[test]
fn every_alert_has_annotations_a_runbook_section_and_a_promtool_test() {
    let root = repo_root();
    let rules = std::fs::read_to_string(root.join(RULES)).unwrap();
    let guide = std::fs::read_to_string(root.join(GUIDE)).unwrap();
    let tests: String =
        prometheus::rule_test_files(&root).unwrap().iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
    let alerts = alert_blocks(&rules);
    assert!(alerts.len() >= 15, "{} alerts", alerts.len());
    for (name, block) in &alerts {
        for key in ["severity: ", "summary: ", "description: ", "runbook_url: "] {
            assert!(block.lines().any(|l| l.starts_with(key)), "{name}: no {key}");
        }
        let anchor = name.to_lowercase();
        assert!(
            block.contains(&format!("runbook_url: \"{GUIDE}#{anchor}\"\n")),
            "{name}: runbook_url is not {GUIDE}#{anchor}"
        );
        assert!(guide.lines().any(|l| l == format!("### {name}")), "{GUIDE} has no \"### {name}\" section");
        let fires = tests.split(&format!("alertname: {name}\n")).skip(1).any(|after| {
            let mut lines = after.lines().map(str::trim);
            lines.next() == Some("exp_alerts:") && lines.next().is_some_and(|l| l.starts_with("- exp_labels:"))
        });
        assert!(fires, "no test in {RULE_TESTS} expects {name} to fire");
        let quiet = tests.contains(&format!("alertname: {name}\n        exp_alerts: []\n"));
        assert!(quiet, "no test in {RULE_TESTS} expects {name} to stay quiet");
    }
}

/// The dashboard imports as is: a Prometheus data-source variable every panel uses, the node
/// and instance variables, unique panel ids and refIds, panels inside the 24-column grid and
/// not overlapping.
#[test]
fn the_dashboard_is_importable_as_is() {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).unwrap();
    assert!(d["uid"].is_string() && d["title"].is_string() && d["schemaVersion"].as_u64() >= Some(36));
    assert!(d.get("__inputs").is_none() && d.get("id").is_none_or(Value::is_null), "no instance-specific ids");
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name} variable"));
    assert_eq!((&var("datasource")["type"], &var("datasource")["query"]), (&"datasource".into(), &"prometheus".into()));
    for name in ["node", "instance"] {
        assert_eq!(var(name)["type"], "query");
        assert_eq!(var(name)["datasource"]["uid"], "${datasource}");
    }
    assert!(var("instance")["query"].as_str().unwrap().contains("$node"), "instances follow the node selection");

    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        let title = &p["title"];
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: duplicate id");
        let g = &p["gridPos"];
        let (x, y, w, h) =
            (g["x"].as_u64().unwrap(), g["y"].as_u64().unwrap(), g["w"].as_u64().unwrap(), g["h"].as_u64().unwrap());
        assert!(w > 0 && h > 0 && x + w <= 24, "{title}: {g}");
        for cell in (x..x + w).flat_map(|cx| (y..y + h).map(move |cy| (cx, cy))) {
            assert!(cells.insert(cell), "{title} overlaps another panel at {cell:?}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert!(
            ["stat", "table", "timeseries", "status-history", "heatmap", "bargauge"]
                .contains(&p["type"].as_str().unwrap()),
            "{title}"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        let refs: BTreeSet<&str> = targets.iter().map(|t| t["refId"].as_str().unwrap()).collect();
        assert_eq!(refs.len(), targets.len(), "{title}: duplicate refId");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(!t["expr"].as_str().unwrap().is_empty(), "{title}");
        }
        assert!(p["description"].as_str().is_some_and(|s| !s.is_empty()), "{title}: no description");
    }
    let titles: Vec<&str> = panels.iter().filter_map(|p| p["title"].as_str()).collect();
    for want in [
        "Port health (nodes × ports)",
        "Events by check",
        "Flapping ports",
        "Error counter rates",
        "Poll duration",
        "Wake-up latency (kernel → nicmon)",
        "eBPF hooks",
        "Dead links by probable cause (fleet, over the range)",
    ] {
        assert!(titles.contains(&want), "no {want:?} panel");
    }
}
