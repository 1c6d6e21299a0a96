//! `nicmon run`: the daemon. One poll → evaluate → queue → dispatch → commit cycle at a
//! time, on a 1 s tick and on every wake-up (eBPF, rtnetlink, kernel log), until SIGTERM
//! or SIGINT — which finish the cycle, flush what can be sent, save and exit.
//!
//! Transactional dispatch through an outbox kept in the state file: each cycle's events
//! are appended as one batch per check and the state is saved *before* anything is sent; a
//! dispatcher task sends batches strictly in order and acknowledges each one the connector
//! accepted; only then is it removed from the outbox. A connector outage, or a restart
//! during one, loses nothing; an unacknowledged batch may be sent twice (at-least-once).
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::counters;
use crate::cycle::{Monitor, Poll};
use crate::discovery::{self, ReadPlan};
use crate::dispatch::{GrpcConfig, Sink, SinkSpec};
use crate::event::{Check, Stamp};
use crate::host::Host;
use crate::kmsg::{Delivery, KmsgTail, Record, Start};
use crate::linkstate::StateConfig;
use crate::metrics::Metrics;
use crate::metrics::server::{self as metrics_server, Liveness};
use crate::state::{self, Loaded, PendingBatch, State};
use crate::topology;
use crate::wake::{WakeOptions, WakeSource};

/// Wake-ups within this window after the first one are served by the same poll.
pub const COALESCE: Duration = Duration::from_millis(1);

/// How long a signal waits for queued batches to be delivered. With the last poll (at most
/// [`crate::host::Deadlines::poll`]) and the final save, exit comes within 5 s of SIGTERM
/// whatever is stuck; what was not delivered stays in the outbox for the next start.
pub const SHUTDOWN_FLUSH: Duration = Duration::from_secs(2);

/// Everything `nicmon run` needs, resolved from flags.
pub struct RunOptions {
    pub sysfs: PathBuf,
    pub procfs: PathBuf,
    pub config: PathBuf,
    pub metadata: PathBuf,
    pub metadata_required: bool,
    pub state_file: PathBuf,
    pub boot_id_path: Option<PathBuf>,
    pub interval: Duration,
    pub checks: BTreeSet<Check>,
    pub stamp: Stamp,
    pub sink: SinkSpec,
    pub grpc: GrpcConfig,
    /// `None` disables the HTTP endpoint.
    pub metrics_port: Option<u16>,
    /// `--metrics-bind-address`.
    pub metrics_bind_address: std::net::IpAddr,
    /// `None` disables the kernel log watcher.
    pub kmsg_path: Option<PathBuf>,
    pub wake: WakeOptions,
    /// Disable every wake source (polling only).
    pub no_wake: bool,
    /// Trace mode: print each wake-up and the poll it caused.
    pub trace: bool,
}

/// Parse `--checks`: comma-separated names. Unknown names are returned, to be logged and
/// skipped (000 §12.1).
pub fn parse_checks(list: &str) -> (BTreeSet<Check>, Vec<String>) {
    let mut known = BTreeSet::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Check::parse(name) {
            Some(c) => {
                known.insert(c);
            }
            None => unknown.push(name.to_string()),
        }
    }
    (known, unknown)
}

/// An acknowledgement from the dispatcher: the batch with this id was accepted (or
/// permanently rejected and dropped).
struct Ack {
    id: u64,
}

/// Send batches in order; retry a failing head batch forever (with the policy's backoff
/// inside each send and a pause between sends), never skip ahead.
async fn dispatcher(
    mut sink: Sink,
    mut rx: mpsc::UnboundedReceiver<PendingBatch>,
    acks: mpsc::UnboundedSender<Ack>,
    metrics: Arc<Metrics>,
    pause: Duration,
) {
    while let Some(batch) = rx.recv().await {
        loop {
            let result = sink.send(&batch.events).await;
            metrics.record_dispatch(batch.check, &batch.events, &result);
            match result {
                Ok(()) => {
                    tracing::debug!(check = %batch.check, events = batch.events.len(), "batch accepted");
                    let _ = acks.send(Ack { id: batch.id });
                    break;
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(check = %batch.check, error = %e, "connector unavailable: batch kept, retrying");
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    // A permanent rejection will not succeed by retrying; keeping it would
                    // block every later batch forever.
                    tracing::error!(check = %batch.check, error = %e, events = ?batch.events, "batch rejected permanently: dropped");
                    let _ = acks.send(Ack { id: batch.id });
                    break;
                }
            }
        }
    }
}

fn save(path: &std::path::Path, state: &State) {
    if let Err(e) = state::save(path, state) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the state file");
    }
}

/// Run the daemon until a signal.
pub async fn run(opts: RunOptions) -> Result<()> {
    let config = Config::load(&opts.config)?;
    for w in config.warnings.iter().chain(&config.path_warnings(&opts.sysfs)) {
        tracing::warn!("{w}");
    }
    let host = Host::new(&opts.sysfs, &opts.procfs).with_boot_id_path(opts.boot_id_path.clone());
    let boot_id = host.boot_id().ok();
    if boot_id.is_none() {
        tracing::warn!("boot ID unreadable: reboots cannot be told from restarts");
    }
    let (mut st, mut loaded) = state::load(&opts.state_file, boot_id.as_deref());
    match &loaded {
        Loaded::Corrupt(why) => tracing::warn!("{why}: starting fresh"),
        Loaded::Rebooted { .. } => tracing::info!("boot ID changed: state from the previous boot cleared"),
        Loaded::Missing => tracing::info!(path = %opts.state_file.display(), "no state file: first start"),
        Loaded::Resumed => tracing::info!(pending = st.outbox.len(), "resuming from the state file"),
    }

    let snapshot0 = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snapshot0, Some(&opts.metadata), opts.metadata_required)?;
    for n in &topo.notes {
        tracing::warn!("{n}");
    }
    tracing::info!(
        source = topo.source.as_str(),
        gpus = topo.gpus.len(),
        devices = snapshot0.devices.len(),
        "topology"
    );
    if snapshot0.devices.is_empty() {
        tracing::warn!("no RDMA devices found under {}: polling anyway", host.sys("class/infiniband").display());
    }
    let counter_paths = counters::read_paths(&config.counter_rules);
    let monitor = Monitor {
        state_config: StateConfig {
            escalation_grace: time::Duration::seconds(config.escalation_grace_secs as i64),
            speed_degradation_fatal: config.speed_degradation_fatal,
            checks: opts.checks.clone(),
        },
        host,
        topology: topo,
        stamp: opts.stamp.clone(),
        counter_paths,
        config,
    };

    let metrics = Arc::new(Metrics::new(&monitor.stamp.node_name));
    metrics.set_topology_source(monitor.topology.source.as_str());
    let liveness = Liveness::new(opts.interval.max(Duration::from_secs(1)));
    let _server = match opts.metrics_port {
        Some(port) => Some(
            metrics_server::start((opts.metrics_bind_address, port).into(), metrics.clone(), liveness.clone())
                .await
                .with_context(|| {
                    format!("--metrics-bind-address {} --metrics-port {port}: cannot listen", opts.metrics_bind_address)
                })?,
        ),
        None => None,
    };

    // Wake sources.
    let mut wakes = if opts.no_wake {
        None
    } else {
        let w = WakeSource::start(&opts.wake);
        // Loading the eBPF object parses the kernel's BTF (tens of MiB, freed again);
        // hand that memory back to the OS instead of keeping it resident.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free heap pages; no memory in use is touched.
        unsafe {
            libc::malloc_trim(0);
        }
        for h in w.hooks() {
            if let Some(via) = h.via
                && h.attached
            {
                tracing::info!(hook = h.hook.name(), via = ?via, "wake-up hook attached");
            } else {
                tracing::info!(
                    hook = h.hook.name(),
                    reason = h.reason.as_deref().unwrap_or("-"),
                    "wake-up hook not attached"
                );
            }
            metrics.set_ebpf_hook_attached(h.hook.name(), h.attached);
        }
        if let Some(e) = w.ebpf_error() {
            tracing::warn!("eBPF unavailable: {e}");
        }
        metrics.set_ebpf(crate::wake::EBPF_EMBEDDED, w.mode() == crate::wake::WakeMode::Ebpf);
        tracing::info!(mode = w.mode().name(), "wake-up path");
        Some(w)
    };

    // Kernel log: resume after the persisted cursor (same boot), else at the end.
    let (ktx, mut krx) = mpsc::unbounded_channel::<Delivery>();
    let _tail: Option<KmsgTail> = match &opts.kmsg_path {
        Some(p) if opts.checks.contains(&Check::NICKernelLogCheck) && monitor.config.kernel_log.enabled => {
            match KmsgTail::spawn(p, Start::from_cursor(st.kmsg.last_seq), move |d| ktx.send(d).is_ok()) {
                Ok(t) => {
                    tracing::info!(path = %p.display(), "kernel log watched");
                    metrics.set_kernel_log_watching(true, "");
                    Some(t)
                }
                Err(e) => {
                    metrics.set_kernel_log_watching(false, &format!("{}: {e}", p.display()));
                    let hint = match e.kind() {
                        std::io::ErrorKind::PermissionDenied => {
                            "; reading it needs CAP_SYSLOG and, in a container, a device cgroup that allows \
                             /dev/kmsg (the chart's securityContext.privileged=true fallback)"
                        }
                        _ => "",
                    };
                    tracing::warn!(path = %p.display(), error = %e, "kernel log watcher not started{hint}");
                    None
                }
            }
        }
        _ => {
            let why = match &opts.kmsg_path {
                None => "--no-kmsg",
                Some(_) if !monitor.config.kernel_log.enabled => "[kernelLog] enabled = false",
                Some(_) => "NICKernelLogCheck not in --checks",
            };
            metrics.set_kernel_log_watching(false, &format!("off: {why}"));
            None
        }
    };

    // Dispatch.
    let sink = Sink::lazy(&opts.sink, opts.grpc.clone());
    let queue_bounds = opts.sink.queue_bounds(&opts.grpc);
    let (btx, brx) = mpsc::unbounded_channel::<PendingBatch>();
    let (atx, mut arx) = mpsc::unbounded_channel::<Ack>();
    let pause = opts.grpc.retry.initial_backoff.max(Duration::from_millis(50));
    let dispatch_task = tokio::spawn(dispatcher(sink, brx, atx, metrics.clone(), pause));
    for b in &st.outbox {
        let _ = btx.send(b.clone());
    }

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(opts.interval.min(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending_records: Vec<Record> = Vec::new();
    let mut trace_latencies: std::collections::BTreeMap<&'static str, Vec<f64>> = Default::default();
    tracing::info!(node = %monitor.stamp.node_name, interval = ?opts.interval, "nicmon running");

    loop {
        let mut woke: Vec<crate::wake::Wake> = Vec::new();
        let mut stop = false;
        tokio::select! {
            _ = tick.tick() => {}
            Some(w) = async { match wakes.as_mut() { Some(w) => w.recv().await, None => std::future::pending().await } } => {
                woke.push(w);
                // Coalesce a burst into one poll.
                tokio::time::sleep(COALESCE).await;
                if let Some(ws) = wakes.as_mut() {
                    while let Some(w) = ws.try_recv() { woke.push(w); }
                }
            }
            Some(d) = krx.recv() => {
                match d {
                    Delivery::Records(r) => pending_records.extend(r),
                    Delivery::Failed(e) => {
                        tracing::warn!(error = %e, "kernel log watcher stopped");
                        metrics.set_kernel_log_watching(false, &format!("watcher stopped: {e}"));
                    }
                }
            }
            Some(ack) = arx.recv() => {
                st.outbox.retain(|b| b.id != ack.id);
                while let Ok(a) = arx.try_recv() { st.outbox.retain(|b| b.id != a.id); }
                save(&opts.state_file, &st);
                continue;
            }
            _ = tokio::signal::ctrl_c() => { stop = true; }
            _ = sigterm.recv() => { stop = true; }
        }
        while let Ok(d) = krx.try_recv() {
            if let Delivery::Records(r) = d {
                pending_records.extend(r);
            }
        }
        let woke_at = Instant::now();
        let started = Instant::now();
        let records = std::mem::take(&mut pending_records);
        let poll = monitor.poll(&st, &loaded, OffsetDateTime::now_utc(), &records);
        let elapsed = started.elapsed();
        metrics.observe_poll(elapsed);
        for w in &woke {
            metrics.wakeup(w.hook.name());
        }
        for n in &poll.notes {
            tracing::info!("{n}");
        }
        if opts.trace {
            print_trace(&woke, woke_at, &poll, elapsed);
            let end = crate::wake::monotonic_ns();
            for w in &woke {
                if let Some(k) = w.kernel_ts_ns {
                    trace_latencies.entry(w.hook.name()).or_default().push(end.saturating_sub(k) as f64 / 1e6);
                }
            }
        }
        update_metrics(&metrics, &poll);

        // Queue this cycle's events (one batch per check), save, then hand to the dispatcher.
        let mut next = poll.next;
        let mut new_batches = Vec::new();
        for check in Check::ALL {
            let events: Vec<_> = poll.events.iter().filter(|e| e.check() == Some(check)).cloned().collect();
            if events.is_empty() {
                continue;
            }
            for e in &events {
                log_event(e);
            }
            next.next_batch_id += 1;
            new_batches.push(PendingBatch { id: next.next_batch_id, check, events });
        }
        if let Some(bounds) = queue_bounds
            && let Err(full) = bounds.admit(&st.outbox, &new_batches)
        {
            // Direct publishing's bounded queue: a poll whose events do not fit is not
            // committed (its state does not advance) and runs again on the next cycle.
            tracing::warn!("{full}: this poll is not committed and runs again");
            pending_records.splice(0..0, records);
            liveness.cycle_completed();
            if stop {
                break;
            }
            continue;
        }
        next.outbox.extend(new_batches.iter().cloned());
        save(&opts.state_file, &next);
        for b in new_batches {
            let _ = btx.send(b);
        }
        st = next;
        loaded = Loaded::Resumed;
        liveness.cycle_completed();

        if stop {
            tracing::info!("signal received: flushing and exiting");
            break;
        }
    }

    // Flush: give the dispatcher a bounded time to deliver what is queued.
    drop(btx);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_FLUSH;
    while !st.outbox.is_empty() {
        match tokio::time::timeout_at(deadline, arx.recv()).await {
            Ok(Some(a)) => st.outbox.retain(|b| b.id != a.id),
            _ => break,
        }
    }
    save(&opts.state_file, &st);
    if !st.outbox.is_empty() {
        tracing::warn!(
            pending = st.outbox.len(),
            "exiting with undelivered batches: they are sent after the next start"
        );
    }
    dispatch_task.abort();
    if opts.trace {
        println!("{}", trace_summary(&trace_latencies));
    }
    Ok(())
}

/// Per-hook counts and kernel→poll-end latency percentiles (trace mode's exit summary).
pub fn trace_summary(lat: &std::collections::BTreeMap<&'static str, Vec<f64>>) -> String {
    let mut out = String::from("trace summary (kernel timestamp -> poll finished, ms):\n");
    if lat.is_empty() {
        out.push_str("  no wake-ups\n");
    }
    for (hook, v) in lat {
        let mut v = v.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        out.push_str(&format!(
            "  {hook:<28} count={:<6} p50={:.3} p99={:.3} max={:.3}\n",
            v.len(),
            pct(0.5),
            pct(0.99),
            v[v.len() - 1]
        ));
    }
    out
}

fn log_event(e: &crate::event::HealthEvent) {
    let ents = e.entities_text();
    tracing::info!(
        check = %e.check_name,
        healthy = e.is_healthy,
        fatal = e.is_fatal,
        action = ?e.recommended_action,
        entities = %ents,
        error_code = %e.error_code.join(","),
        "{}", e.message
    );
}

fn update_metrics(metrics: &Metrics, poll: &Poll) {
    let mut by_role: std::collections::BTreeMap<&str, usize> = Default::default();
    for c in poll.roles.values() {
        if let Some(r) = c.role {
            *by_role.entry(r.as_str()).or_default() += 1;
        }
    }
    metrics.set_devices_by_role(by_role);
    let mut ports = Vec::new();
    for d in &poll.snapshot.devices {
        if poll.roles.get(&d.name).map(|c| c.monitored).unwrap_or(false) {
            for p in &d.ports {
                ports.push((d.name.as_str(), p.number, p.is_healthy()));
            }
        }
    }
    let monitored = ports.len();
    metrics.set_port_health(ports);
    metrics.set_devices_discovered(Check::InfiniBandStateCheck, monitored);
    metrics.set_read_health(poll.reads_abandoned, &poll.stuck_reads);
    metrics.kmsg_records_lost(poll.next.kmsg.lost_records);
    let saturated: Vec<(String, u32, String)> = poll
        .next
        .counters
        .saturation_flags
        .keys()
        .filter_map(|k| {
            let mut it = k.splitn(3, ':');
            let (d, p, c) = (it.next()?, it.next()?.parse().ok()?, it.next()?);
            Some((d.to_string(), p, c.to_string()))
        })
        .collect();
    metrics.set_saturated_counters(saturated.iter().map(|(d, p, c)| (d.as_str(), *p, c.as_str())));
    for e in poll.events.iter().filter(|e| !e.is_healthy) {
        let dev = e.entities_impacted.iter().find(|x| x.entity_type == "NIC").map(|x| x.entity_value.as_str());
        let port = e
            .entities_impacted
            .iter()
            .find(|x| x.entity_type == "NICPort")
            .and_then(|x| x.entity_value.parse().ok())
            .unwrap_or(0);
        let Some(check) = e.check() else { continue };
        match check {
            Check::InfiniBandStateCheck | Check::EthernetStateCheck | Check::InfiniBandCharDeviceCheck => {
                metrics.state_check_error(check, dev.unwrap_or(""), port)
            }
            Check::InfiniBandDegradationCheck | Check::EthernetDegradationCheck | Check::EFADegradationCheck
                if !e.message.contains("CounterSaturated") =>
            {
                let counter = e.error_code.first().map(String::as_str).unwrap_or("");
                metrics.counter_threshold_breach(counter, dev.unwrap_or(""), port, e.is_fatal)
            }
            _ => {}
        }
    }
}

/// One trace line per wake-up and poll: the hook, the kernel timestamp, when the agent
/// woke, when the poll ended, the events it produced and the latencies between them.
fn print_trace(woke: &[crate::wake::Wake], woke_at: Instant, poll: &Poll, elapsed: Duration) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let poll_end_ns = crate::wake::monotonic_ns();
    for w in woke {
        let kernel = w.kernel_ts_ns.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        let k2wake = w.delivery_latency_ns().map(|n| format!("{:.3}", n as f64 / 1e6)).unwrap_or_else(|| "-".into());
        let k2end = w
            .kernel_ts_ns
            .map(|t| format!("{:.3}", poll_end_ns.saturating_sub(t) as f64 / 1e6))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "wake hook={} kernel_ns={} hint={:?} kernel->agent_ms={} coalesce_wait_ms={:.3} poll_ms={:.3} kernel->poll_end_ms={} events={}",
            w.hook.name(),
            kernel,
            w.hint,
            k2wake,
            woke_at.duration_since(w.received).as_secs_f64() * 1e3,
            elapsed.as_secs_f64() * 1e3,
            k2end,
            poll.events.len()
        );
    }
    for e in &poll.events {
        let ents = e.entities_text();
        let _ = writeln!(
            out,
            "  event {} healthy={} fatal={} [{}] {}",
            e.check_name, e.is_healthy, e.is_fatal, ents, e.message
        );
    }
}
