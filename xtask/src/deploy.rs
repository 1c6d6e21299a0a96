//! `cargo xtask deploy-tools` and `cargo xtask generate` (see nicmon_tests::deploy and
//! nicmon_tests::prometheus).
use std::process::Command;

use anyhow::{Context, Result, anyhow};
use nicmon_tests::deploy::{self, GUIDE, MANIFESTS};
use nicmon_tests::prometheus::{CHART_RULES, RULES};

pub fn tools() -> Result<()> {
    let python = deploy::ensure_tools(&deploy::repo_root()).map_err(|e| anyhow!(e))?;
    eprintln!("deploy-tools: ready ({})", python.display());
    Ok(())
}

pub fn generate() -> Result<()> {
    let root = deploy::repo_root();
    let (from, to) = (root.join(RULES), root.join(CHART_RULES));
    std::fs::copy(&from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    eprintln!("generate: wrote {}", to.display());
    let python = deploy::ensure_tools(&root).map_err(|e| anyhow!(e))?;
    for m in &MANIFESTS {
        let text = deploy::render_manifest(&python, m).map_err(|e| anyhow!(e))?;
        let path = root.join("deploy/manifests").join(m.file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("generate: wrote {}", path.display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let help = deploy::capture(
        Command::new(cargo).current_dir(&root).args(["run", "--quiet", "-p", "nicmon", "--", "run", "--help"]),
        "nicmon run --help",
    )
    .map_err(|e| anyhow!(e))?;
    let path = root.join(GUIDE);
    let guide = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    std::fs::write(&path, deploy::guide_with_cli(&guide, &help).map_err(|e| anyhow!(e))?)?;
    eprintln!("generate: updated the command-line reference in {}", path.display());
    Ok(())
}
