//! The Prometheus side: where the rules, their promtool tests and the dashboard live, and the
//! Prometheus binaries that check them (shared by tests/tests/prometheus.rs and `cargo xtask
//! prometheus-rules`).
//!
//! The binaries are Debian's `prometheus` package: `prometheus` and `promtool` on `PATH`
//! where the machine has them, else the package unpacked into `.tools/prometheus` (fetched
//! with `apt-get download` and unpacked with `dpkg-deb -x`: no service is installed or
//! started, nothing outside the repository is written).
use std::path::{Path, PathBuf};
use std::process::Command;

/// The alerting and recording rules.
pub const RULES: &str = "deploy/prometheus/nicmon-rules.yaml";
/// Their `promtool test rules` files.
pub const RULE_TESTS: &str = "deploy/prometheus/tests";
/// The rules as the chart reads them (`.Files.Get`: a chart sees only its own directory);
/// `cargo xtask generate` copies [`RULES`] there.
pub const CHART_RULES: &str = "deploy/helm/nicmon/files/nicmon-rules.yaml";
/// The Grafana dashboard.
pub const DASHBOARD: &str = "deploy/grafana/nicmon-dashboard.json";

/// The two binaries.
#[derive(Debug, Clone)]
pub struct Tools {
    pub prometheus: PathBuf,
    pub promtool: PathBuf,
}

fn unpacked(root: &Path) -> Tools {
    let bin = root.join(".tools/prometheus/usr/bin");
    Tools { prometheus: bin.join("prometheus"), promtool: bin.join("promtool") }
}

/// The binaries when this machine already has them (on `PATH`, or unpacked in `.tools`).
pub fn find_tools(root: &Path) -> Option<Tools> {
    if let (Some(prometheus), Some(promtool)) =
        (crate::debian::on_path("prometheus"), crate::debian::on_path("promtool"))
    {
        return Some(Tools { prometheus, promtool });
    }
    let t = unpacked(root);
    (t.prometheus.is_file() && t.promtool.is_file()).then_some(t)
}

/// The binaries, unpacking Debian's `prometheus` package into `.tools/prometheus` when the
/// machine has none. `Err` says why they cannot be had (no apt, no network, ...).
pub fn ensure_tools(root: &Path) -> Result<Tools, String> {
    if let Some(t) = find_tools(root) {
        return Ok(t);
    }
    let dir = crate::debian::unpack(root, "prometheus", "~20 MB")?;
    find_tools(root).ok_or_else(|| format!("{} has no usr/bin/prometheus and promtool", dir.display()))
}

/// The promtool test files under [`RULE_TESTS`], sorted.
pub fn rule_test_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join(RULE_TESTS);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// `promtool check rules` and `promtool test rules` on the project's rules: their output, or
/// an error with it.
pub fn check_rules(root: &Path, tools: &Tools) -> Result<String, String> {
    let check = output(Command::new(&tools.promtool).current_dir(root).args(["check", "rules", RULES]))?;
    let tests = rule_test_files(root)?;
    if tests.is_empty() {
        return Err(format!("no promtool test files in {RULE_TESTS}"));
    }
    let test = output(Command::new(&tools.promtool).current_dir(root).args(["test", "rules"]).args(&tests))?;
    Ok(format!("{check}{test}"))
}

/// stdout and stderr of `cmd` together (promtool reports on both), or an error with them.
fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: cannot start: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(format!("{cmd:?} failed ({}):\n{text}", out.status)) }
}

/// The series names an exposition (`/metrics`, OpenMetrics text) declares, from its
/// `# TYPE` lines: a gauge's own name, a counter's `_total` (and `_created`), a histogram's
/// `_bucket`, `_sum`, `_count` (and `_created`), a summary's quantiles, `_sum` and `_count`.
/// A family declared without samples (nothing observed yet) is exported all the same.
pub fn exported_series(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_series_follow_the_type_lines() {
        let text = "# HELP a_seconds x\n# TYPE a_seconds histogram\na_seconds_count 1\n\
                    # TYPE b counter\n# TYPE c gauge\nc 1\n# TYPE d info\n# EOF\n";
        let got = exported_series(text);
        for name in ["a_seconds_bucket", "a_seconds_sum", "a_seconds_count", "b_total", "c", "d_info"] {
            assert!(got.contains(name), "{name} missing from {got:?}");
        }
        assert!(!got.contains("a_seconds") && !got.contains("b") && !got.contains("d"), "{got:?}");
    }
}
