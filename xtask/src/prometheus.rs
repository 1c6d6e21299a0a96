//! `cargo xtask prometheus-rules`: the alerting and recording rules pass `promtool check
//! rules` and the project's `promtool test rules` (see nicmon_tests::prometheus), and the
//! chart's copy of them is current.
use anyhow::{Result, anyhow, bail};
use nicmon_tests::prometheus::{self, CHART_RULES, RULES};

pub fn run() -> Result<()> {
    let root = nicmon_tests::deploy::repo_root();
    let tools = prometheus::ensure_tools(&root).map_err(|e| anyhow!("prometheus-rules: {e}"))?;
    eprintln!("prometheus-rules: {}", tools.promtool.display());
    let report = prometheus::check_rules(&root, &tools).map_err(|e| anyhow!(e))?;
    eprint!("{report}");
    if std::fs::read(root.join(RULES))? != std::fs::read(root.join(CHART_RULES)).unwrap_or_default() {
        bail!("{CHART_RULES} differs from {RULES}: run `cargo xtask generate`");
    }
    Ok(())
}
