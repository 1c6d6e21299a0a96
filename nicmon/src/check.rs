//! `nicmon check` and `nicmon topology`: one poll, printed (SPEC §2).
//!
//! A driver of the same read → decide → act layers the daemon uses: with a state file,
//! one invocation is exactly one daemon cycle.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::Config;
use crate::cycle::{Monitor, MonitorOptions};
use crate::discovery::{self, ReadPlan};
use crate::host::Host;
use crate::kmsg;
use crate::report::Report;
use crate::roles;
use crate::state::{self, Loaded, State};
use crate::topology;

/// Where NVSentinel's metadata collector writes the GPU metadata.
pub const DEFAULT_METADATA_PATH: &str = "/var/lib/nvsentinel/gpu_metadata.json";

pub struct CheckArgs {
    /// What every polling command shares (host roots, config, metadata, checks, stamp).
    pub monitor: MonitorOptions,
    pub state_file: Option<PathBuf>,
    /// The time of the poll (`--now`, checked by [`parse_now`]); `None` is the wall clock.
    pub now: Option<OffsetDateTime>,
    pub kmsg: Option<PathBuf>,
    pub json: bool,
}

/// The node name: the flag, else `$NODE_NAME`, else the host name.
pub fn node_name(flag: Option<&str>) -> String {
    if let Some(n) = flag.filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    if let Ok(n) = std::env::var("NODE_NAME")
        && !n.is_empty()
    {
        return n;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        return String::from_utf8_lossy(&buf[..end]).into_owned();
    }
    "unknown".into()
}

fn no_devices_note(host: &Host) -> String {
    format!("no RDMA devices found under {}", host.sys("class/infiniband").display())
}

/// How far before the poll's time the report may date an event: the clear after a reboot
/// or a scope change is backdated 1 s.
const EARLIEST_EVENT: time::Duration = time::Duration::seconds(1);

/// `--now` (clap's value parser): an RFC 3339 time the report can print — it and the
/// backdated clear before it (RFC 3339 has four-digit years, so 0000-01-01T00:00:00Z is
/// refused: its clear would fall in year -1).
pub fn parse_now(s: &str) -> std::result::Result<OffsetDateTime, String> {
    let t = OffsetDateTime::parse(s, &Rfc3339)
        .map_err(|e| format!("{e}: expected an RFC 3339 time such as 2026-01-01T00:00:00Z"))?;
    let printable = |t: OffsetDateTime| t.format(&Rfc3339).is_ok();
    match t.checked_sub(EARLIEST_EVENT) {
        Some(first) if printable(first) && printable(t) => Ok(t),
        _ => Err(format!(
            "the report cannot print {s}: the time and the clear backdated {EARLIEST_EVENT} before it must fall \
             within RFC 3339's years 0000-9999"
        )),
    }
}

/// One poll: `emit` writes the report (the caller's output); the state is saved only after it
/// succeeded, so the next invocation reports a cycle whose output failed again.
pub fn run_check(args: &CheckArgs, emit: impl FnOnce(String) -> Result<()>) -> Result<()> {
    let now = args.now.unwrap_or_else(OffsetDateTime::now_utc);
    // One read of the tree: the topology is resolved from this cycle's observation.
    let (mut monitor, topology_from) = Monitor::open_unresolved(&args.monitor)?;
    let boot_id = monitor.boot_id.clone();
    let (prev, loaded) = match &args.state_file {
        Some(p) => state::file::load(p, boot_id.as_deref()),
        None => (State::fresh(boot_id.clone()), Loaded::Missing { reboot: false }),
    };
    match &loaded {
        Loaded::Corrupt(why) => tracing::warn!("{why}: starting fresh"),
        Loaded::Rebooted { previous } => {
            tracing::info!(
                previous = previous.as_deref().unwrap_or("none"),
                "boot ID changed: state from the previous boot cleared"
            )
        }
        _ => {}
    }
    let records = match &args.kmsg {
        Some(p) => kmsg::read_file(p).with_context(|| format!("--kmsg {}", p.display()))?,
        None => Vec::new(),
    };
    let obs = monitor.observe(&prev.checks, !records.is_empty());
    monitor.resolve_topology(&topology_from, &obs.snapshot)?;
    let poll = monitor.decide(&prev.checks, &loaded, obs, now, &records);
    for n in &poll.notes {
        tracing::info!("{n}");
    }
    let mut report =
        Report::new(&monitor.stamp.node_name, boot_id, &poll.snapshot, &monitor.topology, &poll.roles, poll.events)
            .with_flaps(&poll.next.links)
            .with_history(&poll.next.history)
            .with_phy(&poll.next.counters);
    report.char_devices = poll.char_devices;
    report.held_ports = poll.holds.held;
    report.blips = poll.holds.blips;
    if poll.snapshot.devices.is_empty() {
        tracing::warn!("{}", no_devices_note(&monitor.host));
    }
    let out = if args.json {
        serde_json::to_string_pretty(&report).context("serialising the report")? + "\n"
    } else if poll.snapshot.devices.is_empty() {
        format!("{}\n", no_devices_note(&monitor.host))
    } else {
        report.table()
    };
    // Act in order: the output (this cycle's events) first, then the state. A cycle whose
    // output failed is not saved, so the next invocation reports its events again.
    emit(out)?;
    if let Some(p) = &args.state_file {
        let next = State { checks: poll.next, ..prev };
        state::file::save(p, &next).with_context(|| format!("state file {}: cannot write", p.display()))?;
    }
    Ok(())
}

/// The `emit` of [`run_check`] for the command line: the report on stdout, flushed.
pub fn to_stdout(out: String) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()).context("writing the report to stdout")
}

pub fn run_topology(
    sysfs: &Path,
    procfs: &Path,
    metadata: &Path,
    metadata_required: bool,
    config: &Path,
    json: bool,
) -> Result<String> {
    let config = Config::load(config)?;
    let host = Host::new(sysfs, procfs);
    let snapshot = discovery::discover(&host, &ReadPlan::default());
    let topo = topology::resolve(&host, &snapshot, Some(metadata), metadata_required)?;
    let roles = roles::classify(&snapshot, &topo, &config.filters);
    if json {
        let rows: Vec<serde_json::Value> = snapshot
            .devices
            .iter()
            .map(|d| {
                let c = &roles[&d.name];
                serde_json::json!({
                    "name": d.name, "card": d.card, "numa_node": d.numa_node,
                    "link_layer": roles::device_link_layer(d).map(|l| l.name()),
                    "monitored": c.monitored, "reason": c.reason, "role": c.role, "role_reason": c.role_reason,
                    "levels": topo.levels.get(&d.name).map(|r| r.iter().map(|l| l.name()).collect::<Vec<_>>()),
                })
            })
            .collect();
        let v = serde_json::json!({"topology_source": topo.source.as_str(), "gpus": topo.gpus,
            "notes": topo.notes, "devices": rows});
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    if snapshot.devices.is_empty() {
        return Ok(format!("{}\n", no_devices_note(&host)));
    }
    let mut out = format!("topology source: {} ({} GPUs)\n", topo.source.as_str(), topo.gpus.len());
    for n in &topo.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    for d in &snapshot.devices {
        let c = &roles[&d.name];
        let role = c.role.map(|r| r.as_str()).unwrap_or("-");
        let why = c.role_reason.clone().or_else(|| c.reason.clone()).unwrap_or_default();
        let mon = if c.monitored { "monitored" } else { "not monitored" };
        let link = roles::device_link_layer(d).map(|l| l.name().to_string()).unwrap_or_else(|| "?".into());
        out.push_str(&format!("{:<14} {:<11} {:<10} {:<14} {}\n", d.name, role, link, mon, why));
    }
    Ok(out)
}
