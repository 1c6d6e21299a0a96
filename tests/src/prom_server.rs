//! A real Prometheus server on loopback for the operators'-view tests (tests/tests/prometheus.rs,
//! tests/tests/prometheus_alerts.rs): it scrapes one nicmon every second and evaluates the
//! project's rules every second; its HTTP API answers queries and lists the alerts.
//!
//! Every wait here is on a condition, polled, with a generous deadline: under load (a
//! 2-core VM running other tests) Prometheus may answer late or not at all for a while, and
//! a scrape may miss its 1 s timeout. A probe that gets no answer is "not yet", never a
//! failure.
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::Daemon;
use crate::deploy::repo_root;

/// The longest any condition is waited for.
pub const WAIT: Duration = Duration::from_secs(180);

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` over HTTP/1.0: the status code and the body (`None` while nothing listens).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Polls `probe` (an HTTP endpoint: nothing to be woken by) until it returns `Some`, at
/// most [`WAIT`].
pub fn wait_for<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    wait_within(WAIT, what, probe)
}

/// [`wait_for`] with its own deadline.
pub fn wait_within<T>(limit: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out ({limit:?}) waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A Prometheus server on loopback, killed when dropped.
pub struct Prometheus {
    _process: Daemon,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scraping `target` every second, evaluating the rules file `rules` (relative to the
    /// repository, or absolute) every second.
    pub fn start(bin: &Path, rules: impl AsRef<Path>, target: SocketAddr) -> Prometheus {
        Prometheus::start_all(bin, rules, &[target])
    }

    /// [`Prometheus::start`] scraping every one of `targets` (one job, an `instance` each).
    pub fn start_all(bin: &Path, rules: impl AsRef<Path>, targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: nicmon\n    static_configs:\n      - targets: [{}]\n",
                repo_root().join(rules).display(),
                targets.join(", ")
            ),
        )
        .unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let process = Daemon::spawn(
            Command::new(bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
        );
        let p = Prometheus { _process: process, addr, _dir: dir };
        wait_for("Prometheus to be ready", || http_get(addr, "/-/ready").filter(|(c, _)| *c == 200));
        p
    }

    /// `GET /api/v1/<path>`: the response's `data`, or Prometheus' error.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (code, body) = http_get(self.addr, &format!("/api/v1/{path}")).ok_or("Prometheus is not answering")?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("HTTP {code}: {e}: {body}"))?;
        if v["status"] != "success" {
            return Err(format!("HTTP {code}: {}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"].clone())
    }

    /// An instant query's result vector (or scalar).
    pub fn query(&self, expr: &str) -> Result<Value, String> {
        self.api(&format!("query?query={}", percent_encode(expr)))
    }

    /// `expr` as Prometheus prints it (parsed, then formatted): proves it parses.
    pub fn format(&self, expr: &str) -> Result<String, String> {
        self.api(&format!("format_query?query={}", percent_encode(expr)))?
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "format_query: not a string".to_string())
    }

    /// Every active alert (pending or firing); `None` while Prometheus does not answer.
    pub fn alerts(&self) -> Option<Vec<Value>> {
        let alerts = self.api("alerts").ok()?;
        alerts["alerts"].as_array().cloned()
    }

    /// The firing instances of `alert` (empty while Prometheus does not answer).
    pub fn firing(&self, alert: &str) -> Vec<Value> {
        self.alerts()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == alert && a["state"] == "firing")
            .collect()
    }

    /// Whether Prometheus has scraped `expr` (a selector) at least once.
    pub fn has(&self, expr: &str) -> bool {
        self.query(expr).is_ok_and(|r| r["result"].as_array().is_some_and(|a| !a.is_empty()))
    }
}
