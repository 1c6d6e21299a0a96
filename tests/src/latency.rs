//! Detection latency harness: a testbed RoCE NIC whose netdev is a real veth on this host.
//! The harness sets the fixture port to `DOWN`, then takes the veth down in-process
//! (`SIOCSIFFLAGS`), T being taken right before that syscall; the latency is T → the event's `generatedTimestamp` (the poll that produced it) and
//! T → the event's line seen in the file sink (delivered), for the three wake paths: eBPF,
//! rtnetlink only, polling only. [`storm`]: the daemon's CPU while a veth flaps as fast as
//! the kernel allows.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::NicSpec;

use crate::Node;

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

    /// Set `dev` administratively up or down in-process (`SIOCSIFFLAGS` on a datagram
    /// socket): a veth taken down loses its carrier, and its peer's too. Returns the
    /// wall-clock instant taken right before the syscall, so no process start-up or pipe
    /// hop is inside a latency measured from it.
    pub fn set_up(&self, dev: &str, up: bool) -> Result<(SystemTime, u64), String> {
        set_link_up(dev, up)
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

fn ifreq_for(dev: &str) -> Result<libc::ifreq, String> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = dev.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(format!("interface name {dev:?} too long"));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// `SIOCGIFFLAGS` / `SIOCSIFFLAGS` on `dev`: IFF_UP set or cleared. Returns the instant
/// taken right before the setting syscall, wall clock and `CLOCK_MONOTONIC` (ns; the
/// clock of the kernel's and `nicmon trace`'s timestamps).
pub fn set_link_up(dev: &str, up: bool) -> Result<(SystemTime, u64), String> {
    // SAFETY: plain socket(2); the descriptor is closed below on every path.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    let result = (|| {
        let mut req = ifreq_for(dev)?;
        // SAFETY: req is a valid ifreq naming dev; the kernel fills ifru_flags.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) } < 0 {
            return Err(format!("SIOCGIFFLAGS {dev}: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        let iff_up = libc::IFF_UP as libc::c_short;
        req.ifr_ifru.ifru_flags = if up { flags | iff_up } else { flags & !iff_up };
        let t = (SystemTime::now(), monotonic_ns());
        // SAFETY: as above; the kernel reads ifru_flags.
        if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) } < 0 {
            return Err(format!("SIOCSIFFLAGS {dev}: {}", std::io::Error::last_os_error()));
        }
        Ok(t)
    })();
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    result
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Where one fault's time went, in milliseconds, from `nicmon trace`'s lines (the first
/// wake-up after T whose poll produced the event, and the sender's line for its batch).
#[derive(Debug, Clone, Default)]
pub struct Stages {
    /// T → the kernel program's timestamp (the syscall itself, up to the hook).
    pub to_kernel: f64,
    /// Kernel → the agent received the record.
    pub kernel_to_agent: f64,
    /// Received → the poll started (coalescing / rate limit / loop busy).
    pub wait: f64,
    /// The poll that found it: read + decide.
    pub poll: f64,
    /// Decided → the batch handed to the sender task.
    pub handoff: f64,
    /// Handed → the sender task took it.
    pub to_sender: f64,
    /// The sink's delivery (the file sink: the write returned; gRPC: the reply).
    pub sink: f64,
    /// Delivered → the harness saw the line (its inotify wake-up and `fstat`).
    pub seen: f64,
    /// Delivered → durable (the file sink's `fdatasync`), off the delivery path: the
    /// acknowledgement waits for it, the line does not.
    pub sync: f64,
    /// T → the fault's own carrier-changing system call (the harness's) returned. Not a
    /// stage of the path: the harness looks for the line only after it, so where the call
    /// returns after the line was written, the call (finishing on the daemon's CPU) is
    /// what the delivered time waited for.
    pub call: f64,
}

impl Stages {
    /// T → the sink delivered the batch (the line written; gRPC: the connector's reply),
    /// on the daemon's monotonic clock: the harness's look not in it.
    pub fn accepted(&self) -> f64 {
        self.to_kernel + self.kernel_to_agent + self.wait + self.poll + self.handoff + self.to_sender + self.sink
    }

    /// T → the harness saw the line, on the monotonic clock.
    pub fn delivered(&self) -> f64 {
        self.accepted() + self.seen
    }

    /// The fault's own system call returned after the daemon had written the line.
    pub fn call_after_line(&self) -> bool {
        self.call > self.accepted()
    }

    /// The monitor's own part: the kernel program's record (its `bpf_ktime_get_ns` stamp)
    /// → the harness saw the line in the sink, both on CLOCK_MONOTONIC. The fault's own path
    /// in the kernel before the hook (`to_kernel`) is not in it.
    pub fn monitor_part(&self) -> f64 {
        self.delivered() - self.to_kernel
    }
}

impl Stages {
    pub const NAMES: [&'static str; 9] = [
        "T->kernel",
        "kernel->agent",
        "wait",
        "poll",
        "hand-off",
        "->sender",
        "sink write",
        "written->seen",
        "(fdatasync, off path)",
    ];
    pub fn values(&self) -> [f64; 9] {
        [
            self.to_kernel,
            self.kernel_to_agent,
            self.wait,
            self.poll,
            self.handoff,
            self.to_sender,
            self.sink,
            self.seen,
            self.sync,
        ]
    }
}

fn fields(line: &str) -> std::collections::HashMap<&str, &str> {
    line.split_whitespace().filter_map(|t| t.split_once('=')).collect()
}

/// The stages of the fault made at monotonic `t_ns` (its system call returned at
/// `returned_ns`; the harness saw the line at `seen_ns`).
fn stages_of(trace: &str, t_ns: u64, returned_ns: u64, seen_ns: u64) -> Option<Stages> {
    let wake = trace.lines().filter(|l| l.starts_with("wake ")).map(fields).find(|f| {
        f.get("kernel_ns").and_then(|v| v.parse::<u64>().ok()).is_some_and(|k| k >= t_ns)
            && f.get("events").is_some_and(|e| *e != "0")
    })?;
    let num = |f: &std::collections::HashMap<&str, &str>, k: &str| f.get(k).and_then(|v| v.parse::<f64>().ok());
    let kernel = num(&wake, "kernel_ns")?;
    let batch = wake.get("last_batch")?;
    let sent = trace.lines().filter(|l| l.starts_with("sent ")).map(fields).find(|f| f.get("batch") == Some(batch))?;
    let (handed, taken, accepted) = (num(&sent, "handed_ns")?, num(&sent, "sender_ns")?, num(&sent, "accepted_ns")?);
    let durable = num(&sent, "durable_ns").unwrap_or(accepted);
    Some(Stages {
        to_kernel: (kernel - t_ns as f64) / 1e6,
        kernel_to_agent: num(&wake, "kernel->agent_ms")?,
        wait: num(&wake, "coalesce_wait_ms")?,
        poll: num(&wake, "poll_ms")?,
        handoff: num(&wake, "handoff_ms")?,
        to_sender: (taken - handed) / 1e6,
        sink: (accepted - taken) / 1e6,
        seen: (seen_ns as f64 - accepted) / 1e6,
        sync: (durable - accepted) / 1e6,
        call: returned_ns.saturating_sub(t_ns) as f64 / 1e6,
    })
}

/// Latencies of one mode, in milliseconds.
#[derive(Debug, Clone)]
pub struct Samples {
    pub mode: Mode,
    /// Fault → the event's `generatedTimestamp`.
    pub ms: Vec<f64>,
    /// Fault → the event's line seen in the sink (the harness's look right after the write).
    pub delivered_ms: Vec<f64>,
    /// Per fault, where the time went (faults served by a wake-up; `nicmon trace`).
    pub stages: Vec<Stages>,
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

pub fn percentile(v: &[f64], p: f64) -> f64 {
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

/// When the harness saw an event's line in the sink: the instant right after the `fstat`
/// that found the file grown to include it (the line was readable by then), wall clock and
/// `CLOCK_MONOTONIC` ns.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub wall: SystemTime,
    pub mono_ns: u64,
}

/// The sink file another process appends to, followed: woken by inotify when it is written
/// (no sleep between looks), and only the bytes appended since the last look read — up to
/// the length the `fstat` saw, so a line found was in the file at [`Seen`]'s instant.
struct SinkWatch {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// The file's watch (or, until it exists, its directory's); `None` without inotify:
    /// looked at every 100 µs.
    inotify: Option<inotify::Inotify>,
    watching_file: bool,
    offset: u64,
    partial: Vec<u8>,
    /// Every event parsed so far, each with the look that found it.
    events: Vec<(serde_json::Value, Seen)>,
}

impl SinkWatch {
    fn new(path: &Path) -> SinkWatch {
        let mut w = SinkWatch {
            path: path.to_path_buf(),
            file: None,
            inotify: inotify::Inotify::init().ok(),
            watching_file: false,
            offset: 0,
            partial: Vec::new(),
            events: Vec::new(),
        };
        w.arm();
        w
    }

    /// Watch the file once it exists (its writes), its directory before (its creation).
    fn arm(&mut self) {
        let Some(i) = self.inotify.as_mut() else { return };
        if self.watching_file {
            return;
        }
        if self.path.exists() {
            if i.watches().add(&self.path, inotify::WatchMask::MODIFY).is_ok() {
                self.watching_file = true;
            }
        } else if let Some(dir) = self.path.parent() {
            let _ = i.watches().add(dir, inotify::WatchMask::CREATE | inotify::WatchMask::MOVED_TO);
        }
    }

    /// Read what was appended since the last look; returns whether anything was.
    fn look(&mut self) -> bool {
        use std::os::unix::fs::FileExt;
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
            self.arm();
        }
        let Some(f) = &self.file else { return false };
        let Ok(len) = f.metadata().map(|m| m.len()) else { return false };
        let seen = Seen { wall: SystemTime::now(), mono_ns: monotonic_ns() };
        if len <= self.offset {
            return false;
        }
        let mut buf = vec![0u8; (len - self.offset) as usize];
        let Ok(()) = f.read_exact_at(&mut buf, self.offset) else { return false };
        self.offset = len;
        self.partial.extend_from_slice(&buf);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else { return true };
        let whole: Vec<u8> = self.partial.drain(..=end).collect();
        for line in whole.split(|b| *b == b'\n') {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
                self.events.push((v, seen));
            }
        }
        true
    }

    /// Block until the file may have changed, or `timeout`.
    fn wait(&mut self, timeout: Duration) {
        let Some(i) = self.inotify.as_mut() else {
            std::thread::sleep(Duration::from_micros(100).min(timeout)); // no inotify: look again soon
            return;
        };
        use std::os::fd::AsRawFd;
        let mut fd = libc::pollfd { fd: i.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: one live pollfd.
        if unsafe { libc::poll(&mut fd, 1, ms) } > 0 {
            let mut buf = [0u8; 1024];
            while i.read_events(&mut buf).is_ok_and(|ev| ev.count() > 0) {}
        }
    }

    /// Wait (bounded) until the sink holds more than `seen` matching events; returns the
    /// next one and when it was seen.
    fn wait_event(&mut self, healthy: bool, seen: usize, timeout: Duration) -> Option<(serde_json::Value, Seen)> {
        let deadline = Instant::now() + timeout;
        loop {
            self.look();
            if let Some(e) = self.events.iter().filter(|(e, _)| is_for(e, healthy)).nth(seen) {
                return Some(e.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.wait(left);
        }
    }
}

/// Wait (bounded) until the sink holds more than `seen` matching events; returns the new one.
fn wait_event(sink: &Path, healthy: bool, seen: usize, timeout: Duration) -> Option<serde_json::Value> {
    SinkWatch::new(sink).wait_event(healthy, seen, timeout).map(|(e, _)| e)
}

fn ts_of(e: &serde_json::Value) -> Option<SystemTime> {
    let t =
        time::OffsetDateTime::parse(e["generatedTimestamp"].as_str()?, &time::format_description::well_known::Rfc3339)
            .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(t.unix_timestamp_nanos()).ok()?))
}

/// Run the daemon `bin` in `mode` and measure `reps` faults. `interval` is the poll interval.
pub fn measure(bin: &Path, mode: Mode, reps: usize, interval: &str, tag: &str) -> Result<Samples, String> {
    let veth = Veth::create(tag)?;
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
    let trace = node.root().join("trace.txt");
    // Trace mode: the daemon itself, plus one line per wake-up and poll and one per batch
    // sent (stdout): the per-stage breakdown.
    let mut child = node
        .daemon_command(bin, "trace", Some(&config), "state.json", "lat")
        .args(["--no-kmsg", "--no-metrics", "--state-polling-interval", interval])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(mode.flags())
        .env("RUST_LOG", "info")
        .stdout(Stdio::from(std::fs::File::create(&trace).map_err(|e| e.to_string())?))
        .stderr(Stdio::from(std::fs::File::create(&log).map_err(|e| e.to_string())?))
        .spawn()
        .map_err(|e| format!("spawn nicmon: {e}"))?;
    let result = (|| {
        let mut watch = SinkWatch::new(&sink);
        watch.wait_event(true, 0, Duration::from_secs(30)).ok_or("no baseline event from nicmon")?;
        let state = node.sys().join(&node.info["mlx5_0"].ib_dir).join("ports/1");
        let (mut ms, mut delivered, mut marks) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..reps {
            // Spread the fault over the poll phase (pacing, not synchronisation).
            std::thread::sleep(Duration::from_millis(150 + (i as u64 * 397) % 850));
            // The fixture port first (the poll the carrier change wakes reads it), then T
            // taken right before the carrier-changing syscall itself.
            std::fs::write(state.join("state"), "1: DOWN\n").map_err(|e| e.to_string())?;
            std::fs::write(state.join("phys_state"), "3: Disabled\n").map_err(|e| e.to_string())?;
            let (t, t_ns) = veth.set_up(&veth.a, false)?;
            let returned_ns = monotonic_ns();
            let (ev, seen) =
                watch.wait_event(false, i, Duration::from_secs(10)).ok_or(format!("rep {i}: no fatal event"))?;
            delivered.push(seen.wall.duration_since(t).unwrap_or_default().as_secs_f64() * 1e3);
            marks.push((t_ns, returned_ns, seen.mono_ns));
            let at = ts_of(&ev).ok_or("event without a timestamp")?;
            ms.push(at.duration_since(t).unwrap_or_default().as_secs_f64() * 1e3);
            std::fs::write(state.join("state"), "4: ACTIVE\n").map_err(|e| e.to_string())?;
            std::fs::write(state.join("phys_state"), "5: LinkUp\n").map_err(|e| e.to_string())?;
            veth.set_up(&veth.a, true)?;
            watch.wait_event(true, i + 1, Duration::from_secs(10)).ok_or(format!("rep {i}: no recovery event"))?;
        }
        Ok::<_, String>((ms, delivered, marks))
    })();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let hooks_log = std::fs::read_to_string(&log).unwrap_or_default();
    let (ms, delivered_ms, marks) = result?;
    let trace = std::fs::read_to_string(&trace).unwrap_or_default();
    let stages = marks.iter().filter_map(|(t, returned, seen)| stages_of(&trace, *t, *returned, *seen)).collect();
    Ok(Samples { mode, ms, delivered_ms, stages, hooks_log })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace with one wake-up (kernel program 30 µs after T) whose batch 7 was written
    /// 400 µs after T.
    const TRACE: &str = "wake hook=qdisc_reset kernel_ns=1000030000 events=1 last_batch=7 kernel->agent_ms=0.150 \
                         coalesce_wait_ms=0.020 poll_ms=0.150 handoff_ms=0.030\n\
                         sent batch=7 handed_ns=1000380000 sender_ns=1000385000 accepted_ns=1000400000 durable_ns=1000900000\n";

    #[test]
    fn a_fault_whose_call_returned_after_the_line_is_told_apart() {
        let t = 1_000_000_000;
        let late = stages_of(TRACE, t, t + 550_000, t + 600_000).expect("the wake-up and its batch are found");
        assert!((late.accepted() - 0.4).abs() < 1e-9, "{late:?}");
        assert!((late.delivered() - 0.6).abs() < 1e-9, "{late:?}");
        assert!((late.call - 0.55).abs() < 1e-9);
        assert!(late.call_after_line());
        let early = stages_of(TRACE, t, t + 180_000, t + 460_000).expect("found");
        assert!(!early.call_after_line());
        assert!((early.seen - 0.06).abs() < 1e-9);
        // A wake-up from before T is not this fault's.
        assert!(stages_of(TRACE, t + 40_000, t + 180_000, t + 460_000).is_none());
    }
}

/// What [`device_loss`] measured: one RoCE NIC whose netdev is a real veth leaves the tree
/// and the host deletes its veth.
#[derive(Debug, Clone)]
pub struct DeviceLoss {
    /// T (right before the veth's deletion is handed to `ip`) → the fatal disappearance
    /// event's line in the sink, ms.
    pub delivered_ms: f64,
    /// T → the event's `generatedTimestamp`, ms.
    pub generated_ms: f64,
    /// The event's message.
    pub message: String,
    /// The daemon's log (start-up line with the wake hooks).
    pub log: String,
}

/// Run the daemon `bin` (`extra` flags, poll `interval`) over a node whose `mlx5_0` has the
/// veth `<tag>a` as its netdev; once it reported the node healthy, remove `mlx5_0` from the
/// fixture tree (its `class/infiniband` entry and its directory, its `class/net` link) and
/// delete the veth; measure until the fatal disappearance event of `mlx5_0` is in the sink.
pub fn device_loss(bin: &Path, extra: &[&str], interval: &str, tag: &str) -> Result<DeviceLoss, String> {
    let mut veth = Veth::create(tag)?;
    let mut node = Node::new("device-loss");
    let rc = node.root_complex(0, 0);
    let rp = node.root_port(&rc, 1);
    node.card(&rp, 0, vec![NicSpec::eth("mlx5_0", &veth.a)]);
    let rp2 = node.root_port(&rc, 2);
    node.card(&rp2, 0, vec![NicSpec::eth("mlx5_1", "fixture1")]);
    node.use_host_netdev(&veth.a);
    let sink: PathBuf = node.root().join("events.jsonl");
    let log = node.root().join("nicmon.log");
    let mut child = node
        .daemon_command(bin, "run", None, "state.json", "loss")
        .args(["--no-kmsg", "--no-metrics", "--state-polling-interval", interval])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).map_err(|e| e.to_string())?))
        .spawn()
        .map_err(|e| format!("spawn nicmon: {e}"))?;
    let result = (|| {
        let mut watch = SinkWatch::new(&sink);
        watch.wait_event(true, 0, Duration::from_secs(30)).ok_or("no baseline event from nicmon")?;
        // Pacing only: let the daemon settle into its interval after the baseline.
        std::thread::sleep(Duration::from_millis(300));
        let ib_dir = node.sys().join(&node.info["mlx5_0"].ib_dir);
        std::fs::remove_file(node.sys().join("class/infiniband/mlx5_0")).map_err(|e| e.to_string())?;
        std::fs::remove_dir_all(&ib_dir).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(node.sys().join(format!("class/net/{}", veth.a)));
        let t = SystemTime::now();
        let a = veth.a.clone();
        veth.ip(&format!("link del {a}"));
        let (ev, seen) = watch.wait_event(false, 0, Duration::from_secs(15)).ok_or("no fatal event for mlx5_0")?;
        let at = ts_of(&ev).ok_or("event without a timestamp")?;
        Ok::<_, String>(DeviceLoss {
            delivered_ms: seen.wall.duration_since(t).unwrap_or_default().as_secs_f64() * 1e3,
            generated_ms: at.duration_since(t).unwrap_or_default().as_secs_f64() * 1e3,
            message: ev["message"].as_str().unwrap_or_default().to_string(),
            log: String::new(),
        })
    })();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    result.map(|r| DeviceLoss { log, ..r })
}
