//! node_exporter, the side-by-side peer of `cargo xtask bench`: Debian's
//! `prometheus-node-exporter` (on `PATH`, else unpacked into `.tools/prometheus-node-exporter`
//! without installing its service) with only its `infiniband` collector, reading the same
//! testbed tree as nicmon (`--path.sysfs`, `--path.procfs`). Each scrape runs the collector
//! once; its own figure for that run is `node_scrape_collector_duration_seconds{collector=
//! "infiniband"}`.
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

const PACKAGE: &str = "prometheus-node-exporter";

/// The node_exporter binary: on `PATH`, in `.tools`, or unpacked there now.
pub fn ensure(root: &Path) -> Result<PathBuf> {
    if let Some(p) = nicmon_tests::debian::on_path(PACKAGE).or_else(|| nicmon_tests::debian::on_path("node_exporter")) {
        return Ok(p);
    }
    let unpacked = root.join(".tools").join(PACKAGE).join("usr/bin").join(PACKAGE);
    if !unpacked.is_file() {
        nicmon_tests::debian::unpack(root, PACKAGE, "~4 MB").map_err(|e| anyhow!("node_exporter: {e}"))?;
    }
    if !unpacked.is_file() {
        bail!("node_exporter: {} missing after unpacking Debian's {PACKAGE}", unpacked.display());
    }
    Ok(unpacked)
}

/// A running node_exporter on a testbed tree, killed on drop.
struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn scrape(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

fn start(bin: &Path, tree: &Path) -> Result<Running> {
    let port = free_port()?;
    let child = Command::new(bin)
        .arg(format!("--path.sysfs={}", tree.join("sys").display()))
        .arg(format!("--path.procfs={}", tree.join("proc").display()))
        .args(["--collector.disable-defaults", "--collector.infiniband"])
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut r = Running { child, port };
    let t0 = Instant::now();
    // Ready when it answers: a connection refused means it is still starting.
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = r.child.try_wait()? {
            bail!("{} exited at start ({st})", bin.display());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("{} does not answer on 127.0.0.1:{port} after 10 s", bin.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(r)
}

/// The value of `name{collector="infiniband"}` in an exposition.
fn collector_value(body: &str, name: &str) -> Option<f64> {
    let key = format!("{name}{{collector=\"infiniband\"}}");
    body.lines().find_map(|l| l.strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok())
}

/// The infiniband collector's duration (ms) in each of `scrapes` scrapes of a node_exporter
/// reading `tree`, sorted; an error when the collector fails on the tree.
pub fn collector_ms(bin: &Path, tree: &Path, scrapes: usize) -> Result<Vec<f64>> {
    let r = start(bin, tree)?;
    let mut ms = Vec::with_capacity(scrapes);
    for i in 0..scrapes + 5 {
        let body = scrape(r.port)?;
        if collector_value(&body, "node_scrape_collector_success") != Some(1.0) {
            bail!("node_exporter's infiniband collector failed on {}", tree.display());
        }
        let secs = collector_value(&body, "node_scrape_collector_duration_seconds")
            .context("node_exporter: no node_scrape_collector_duration_seconds{collector=\"infiniband\"}")?;
        // The first five warm its caches as nicmon's warm-up polls do.
        if i >= 5 {
            ms.push(secs * 1000.0);
        }
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::collector_value;

    #[test]
    fn reads_the_infiniband_collector_line_only() {
        let body = "node_scrape_collector_duration_seconds{collector=\"cpu\"} 0.5\n\
                    node_scrape_collector_duration_seconds{collector=\"infiniband\"} 0.0123\n\
                    node_scrape_collector_success{collector=\"infiniband\"} 1\n";
        assert_eq!(collector_value(body, "node_scrape_collector_duration_seconds"), Some(0.0123));
        assert_eq!(collector_value(body, "node_scrape_collector_success"), Some(1.0));
        assert_eq!(collector_value("", "node_scrape_collector_success"), None);
    }
}
