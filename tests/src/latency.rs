//! Detection latency harness: a testbed RoCE NIC whose netdev is a real veth on this host.
//! At time T the harness sets the fixture port to `DOWN` and takes the veth's carrier down;
//! the latency is T → the event's `generatedTimestamp` (the poll that produced it) and
//! T → the event's line seen in the file sink (delivered), for the three wake paths: eBPF,
//! rtnetlink only, polling only. [`storm`]: the daemon's CPU while a veth flaps as fast as
//! the kernel allows.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::{NicSpec, Node};

/// Which wake-up path the daemon may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ebpf,
    Rtnetlink,
    Polling,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Rtnetlink => "rtnetlink",
            Mode::Polling => "polling",
        }
    }
    fn flags(self) -> &'static [&'static str] {
        match self {
            // The ring buffer alone: rtnetlink would see the same carrier change.
            Mode::Ebpf => &["--no-rtnetlink"],
            Mode::Rtnetlink => &["--no-ebpf"],
            Mode::Polling => &["--no-wake"],
        }
    }
}

/// A veth pair, both ends up; deleted on drop.
pub struct Veth {
    pub a: String,
    pub b: String,
    batch: Child,
    stdin: ChildStdin,
}

impl Veth {
    /// Create `<tag>a`/`<tag>b` (tag ≤ 13 chars). Fails when `ip` or veth is unavailable.
    pub fn create(tag: &str) -> Result<Veth, String> {
        let (a, b) = (format!("{tag}a"), format!("{tag}b"));
        let _ = Command::new("ip").args(["link", "del", &a]).stderr(Stdio::null()).status();
        let ok = Command::new("ip")
            .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
            .status()
            .map_err(|e| format!("ip: {e}"))?;
        if !ok.success() {
            return Err(format!("ip link add {a} type veth failed ({ok})"));
        }
        // A running `ip -batch -` turns each carrier change into a pipe write: no process
        // start-up inside the measured interval.
        let mut batch = Command::new("ip")
            .args(["-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("ip -batch: {e}"))?;
        let stdin = batch.stdin.take().ok_or("no stdin")?;
        let mut v = Veth { a, b, batch, stdin };
        v.ip(&format!("link set {} up", v.b));
        v.ip(&format!("link set {} up", v.a));
        Ok(v)
    }

    /// Send one `ip` command to the batch process.
    pub fn ip(&mut self, cmd: &str) {
        let _ = writeln!(self.stdin, "{cmd}");
        let _ = self.stdin.flush();
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = self.batch.kill();
        let _ = self.batch.wait();
        let _ = Command::new("ip").args(["link", "del", &self.a]).stderr(Stdio::null()).status();
    }
}

/// Latencies of one mode, in milliseconds.
#[derive(Debug, Clone)]
pub struct Samples {
    pub mode: Mode,
    /// Fault → the event's `generatedTimestamp`.
    pub ms: Vec<f64>,
    /// Fault → the event's line seen in the sink (an upper bound by the 100 µs watch step).
    pub delivered_ms: Vec<f64>,
    pub hooks_log: String,
}

impl Samples {
    pub fn percentile(&self, p: f64) -> f64 {
        percentile(&self.ms, p)
    }
    pub fn delivered_percentile(&self, p: f64) -> f64 {
        percentile(&self.delivered_ms, p)
    }
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn events(sink: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(sink).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn is_for(e: &serde_json::Value, healthy: bool) -> bool {
    e["checkName"] == "EthernetStateCheck"
        && e["isHealthy"] == healthy
        && e["entitiesImpacted"].as_array().map(|a| a.iter().any(|x| x["entityValue"] == "mlx5_0")).unwrap_or(false)
}

/// Wait (bounded) until the sink holds more than `seen` matching events; returns the new one.
fn wait_event(sink: &Path, healthy: bool, seen: usize, timeout: Duration) -> Option<serde_json::Value> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let ev: Vec<_> = events(sink).into_iter().filter(|e| is_for(e, healthy)).collect();
        if ev.len() > seen {
            return ev.into_iter().nth(seen);
        }
        std::thread::sleep(Duration::from_micros(100)); // reading a file another process appends to
    }
    None
}

fn ts_of(e: &serde_json::Value) -> Option<SystemTime> {
    let t =
        time::OffsetDateTime::parse(e["generatedTimestamp"].as_str()?, &time::format_description::well_known::Rfc3339)
            .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(t.unix_timestamp_nanos()).ok()?))
}

/// Run the daemon `bin` in `mode` and measure `reps` faults. `interval` is the poll interval.
pub fn measure(bin: &Path, mode: Mode, reps: usize, interval: &str, tag: &str) -> Result<Samples, String> {
    let mut veth = Veth::create(tag)?;
    let mut node = Node::new(&format!("lat-{}", mode.name()));
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", &veth.a)]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::eth("mlx5_1", "fixture1")]);
    node.use_host_netdev(&veth.a);
    let sink: PathBuf = node.root().join("events.jsonl");
    let log = node.root().join("nicmon.log");
    // Every rep is a DOWN and an UP of the same port: flap damping would hold them all after
    // the third, so it is off here (the flap test measures the damped path).
    let config = node.root().join("nicmon.toml");
    std::fs::write(&config, "[stateCheck]\nflapThreshold = 0\n").map_err(|e| e.to_string())?;
    let mut child = node
        .daemon_command(bin, "run", Some(&config), "state.json", "lat")
        .args(["--no-kmsg", "--no-metrics", "--state-polling-interval", interval])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(mode.flags())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).map_err(|e| e.to_string())?))
        .spawn()
        .map_err(|e| format!("spawn nicmon: {e}"))?;
    let result = (|| {
        wait_event(&sink, true, 0, Duration::from_secs(30)).ok_or("no baseline event from nicmon")?;
        let state = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1");
        let (mut ms, mut delivered) = (Vec::new(), Vec::new());
        for i in 0..reps {
            // Spread the fault over the poll phase (pacing, not synchronisation).
            std::thread::sleep(Duration::from_millis(150 + (i as u64 * 397) % 850));
            let t = SystemTime::now();
            std::fs::write(state.join("state"), "1: DOWN\n").map_err(|e| e.to_string())?;
            std::fs::write(state.join("phys_state"), "3: Disabled\n").map_err(|e| e.to_string())?;
            veth.ip(&format!("link set {} down", veth.a));
            let ev = wait_event(&sink, false, i, Duration::from_secs(10)).ok_or(format!("rep {i}: no fatal event"))?;
            delivered.push(t.elapsed().unwrap_or_default().as_secs_f64() * 1e3);
            let at = ts_of(&ev).ok_or("event without a timestamp")?;
            ms.push(at.duration_since(t).unwrap_or_default().as_secs_f64() * 1e3);
            std::fs::write(state.join("state"), "4: ACTIVE\n").map_err(|e| e.to_string())?;
            std::fs::write(state.join("phys_state"), "5: LinkUp\n").map_err(|e| e.to_string())?;
            veth.ip(&format!("link set {} up", veth.a));
            wait_event(&sink, true, i + 1, Duration::from_secs(10)).ok_or(format!("rep {i}: no recovery event"))?;
        }
        Ok::<_, String>((ms, delivered))
    })();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let hooks_log = std::fs::read_to_string(&log).unwrap_or_default();
    let (ms, delivered_ms) = result?;
    Ok(Samples { mode, ms, delivered_ms, hooks_log })
}

/// What [`cpu_storm`] measured.
#[derive(Debug, Clone)]
pub struct CpuStorm {
    /// Carrier changes made.
    pub toggles: u64,
    pub seconds: f64,
    /// The daemon's CPU over the storm, % of one core.
    pub cpu_pct: f64,
}

fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    let f: Vec<&str> = stat.rsplit_once(')').ok_or("bad stat")?.1.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or("bad stat field");
    Ok(n(11)? + n(12)?)
}

/// Run the daemon `bin` in `mode` and flap a veth it watches as fast as `ip -batch` can for
/// `seconds`; returns the daemon's CPU share over that time.
pub fn cpu_storm(bin: &Path, mode: Mode, seconds: u64, tag: &str) -> Result<CpuStorm, String> {
    let mut veth = Veth::create(tag)?;
    let mut node = Node::new(&format!("storm-{}", mode.name()));
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", &veth.a)]);
    node.use_host_netdev(&veth.a);
    let sink: PathBuf = node.root().join("events.jsonl");
    let mut child = node
        .run_command(bin, "state.json", "storm")
        .args(["--no-kmsg", "--no-metrics", "--state-polling-interval", "1s"])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(mode.flags())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn nicmon: {e}"))?;
    let result = (|| {
        wait_event(&sink, true, 0, Duration::from_secs(30)).ok_or("no baseline event from nicmon")?;
        let pid = child.id();
        let c0 = cpu_ticks(pid)?;
        let t0 = Instant::now();
        let mut toggles = 0u64;
        while t0.elapsed() < Duration::from_secs(seconds) {
            // Queue a few hundred changes at a time: `ip -batch` applies them back to back.
            for _ in 0..200 {
                veth.ip(&format!("link set {} down", veth.a));
                veth.ip(&format!("link set {} up", veth.a));
                toggles += 2;
            }
            std::thread::sleep(Duration::from_millis(20)); // keeps the pipe from filling up
        }
        let wall = t0.elapsed().as_secs_f64();
        let c1 = cpu_ticks(pid)?;
        Ok::<_, String>(CpuStorm { toggles, seconds: wall, cpu_pct: (c1 - c0) as f64 / 100.0 / wall * 100.0 })
    })();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    result
}

/// What a flap storm on the veth-backed port produced.
#[derive(Debug)]
pub struct Storm {
    /// Every event for `mlx5_0` the sink received, in order.
    pub events: Vec<serde_json::Value>,
    /// The first DOWN → the first fatal event's timestamp, in milliseconds.
    pub first_fatal_ms: f64,
    /// Unhealthy transitions made (DOWNs).
    pub downs: usize,
    /// How many events the sink held for `mlx5_0` when the storm ended, and after the
    /// final healthy event plus `quiet` (nothing may follow it).
    pub at_storm_end: usize,
    pub log: String,
}

fn spawn_daemon(bin: &Path, node: &Node, config: &Path, sink: &Path, log: &Path, mode: Mode) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| e.to_string())?;
    node.daemon_command(bin, "run", Some(config), "state.json", "flap")
        .args(["--no-kmsg", "--no-metrics", "--state-polling-interval", "5s"])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(mode.flags())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("spawn nicmon: {e}"))
}

fn port_events(sink: &Path) -> Vec<serde_json::Value> {
    events(sink)
        .into_iter()
        .filter(|e| e["entitiesImpacted"].as_array().is_some_and(|a| a.iter().any(|x| x["entityValue"] == "mlx5_0")))
        .collect()
}

/// Flap the veth-backed RoCE port `mlx5_0` (DOWN `half_period`, UP `half_period`) for
/// `storm`, killing the daemon with SIGKILL and starting it again half-way; then leave it
/// up until the final healthy event, and `quiet` longer. Flap damping: the default
/// threshold and window, `settle` as given. Poll interval 5 s: a first fatal within a
/// fraction of it came through the wake path.
pub fn flap_storm(
    bin: &Path,
    mode: Mode,
    tag: &str,
    storm: Duration,
    half_period: Duration,
    settle: &str,
    quiet: Duration,
) -> Result<Storm, String> {
    let mut veth = Veth::create(tag)?;
    let mut node = Node::new(&format!("flap-{}", mode.name()));
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", &veth.a)]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::eth("mlx5_1", "fixture1")]);
    node.use_host_netdev(&veth.a);
    let sink: PathBuf = node.root().join("events.jsonl");
    let log = node.root().join("nicmon.log");
    let config = node.root().join("nicmon.toml");
    std::fs::write(
        &config,
        format!("[stateCheck]\nflapThreshold = 3\nflapWindow = \"60s\"\nflapSettle = {settle:?}\n"),
    )
    .map_err(|e| e.to_string())?;
    let mut child = spawn_daemon(bin, &node, &config, &sink, &log, mode)?;
    let state = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1");
    let result = (|| {
        wait_event(&sink, true, 0, Duration::from_secs(30)).ok_or("no baseline event from nicmon")?;
        let set = |s: &str, p: &str| -> Result<(), String> {
            std::fs::write(state.join("state"), s).map_err(|e| e.to_string())?;
            std::fs::write(state.join("phys_state"), p).map_err(|e| e.to_string())
        };
        let start = Instant::now();
        let first_down = SystemTime::now();
        let mut downs = 0;
        let mut restarted = false;
        while start.elapsed() < storm {
            set("1: DOWN\n", "3: Disabled\n")?;
            veth.ip(&format!("link set {} down", veth.a));
            downs += 1;
            std::thread::sleep(half_period); // the flap's own rhythm, not synchronisation
            set("4: ACTIVE\n", "5: LinkUp\n")?;
            veth.ip(&format!("link set {} up", veth.a));
            std::thread::sleep(half_period);
            if !restarted && start.elapsed() >= storm / 2 {
                // A crash mid-storm: the hold must survive it.
                let _ = child.kill();
                let _ = child.wait();
                child = spawn_daemon(bin, &node, &config, &sink, &log, mode)?;
                restarted = true;
            }
        }
        let at_storm_end = port_events(&sink).len();
        let first_fatal = wait_event(&sink, false, 0, Duration::from_secs(1)).ok_or("no fatal event at all")?;
        let at = ts_of(&first_fatal).ok_or("event without a timestamp")?;
        let first_fatal_ms = at.duration_since(first_down).unwrap_or_default().as_secs_f64() * 1e3;
        // The final healthy event: after the settle time and at most one poll interval.
        let deadline = Instant::now() + Duration::from_secs(60);
        while port_events(&sink).last().is_none_or(|e| e["isHealthy"] != true || e["checkName"] != "EthernetStateCheck")
            || port_events(&sink).len() == at_storm_end
        {
            if Instant::now() > deadline {
                return Err(format!("no healthy event after the storm: {:#?}", port_events(&sink)));
            }
            std::thread::sleep(Duration::from_millis(20)); // reading a file another process appends to
        }
        std::thread::sleep(quiet); // nothing may follow the final healthy event
        Ok::<_, String>((first_fatal_ms, downs, at_storm_end))
    })();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let (first_fatal_ms, downs, at_storm_end) = result.map_err(|e| format!("{e}\n{log}"))?;
    Ok(Storm { events: port_events(&sink), first_fatal_ms, downs, at_storm_end, log })
}
