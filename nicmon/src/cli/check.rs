//! `nicmon check` and `nicmon topology`: one poll, printed (SPEC §2).
//!
//! A driver of the same read → decide → act layers the daemon uses: with a state file,
//! one invocation is exactly one daemon cycle.
use std::path::{Path, PathBuf};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::decide::settings::Config;

use crate::act::state;
use crate::act::state::Loaded;
use crate::act::state::State;
use crate::cli::report::Report;
use crate::config::ConfigError;
use crate::decide::roles;
use crate::monitor::Monitor;
use crate::monitor::MonitorOptions;
use crate::monitor::OpenError;
use crate::read::discovery::{self, ReadPlan};
use crate::read::host::Host;
use crate::read::kmsg;
use crate::read::topology;
use crate::read::topology::MetadataError;

/// Why `nicmon check` or `nicmon topology` failed. A kind that wraps a cause names the
/// operation and the path; the cause is its [`source`](std::error::Error::source) (the
/// command line prints the chain).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The start-up of the poll (config, checks, required metadata).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The config file (`nicmon topology`).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The required GPU metadata file (`nicmon topology`).
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The `--kmsg` file of kernel log records.
    #[error("--kmsg {}", path.display())]
    KernelLog {
        path: PathBuf,
        #[source]
        why: std::io::Error,
    },
    /// The report could not be serialised.
    #[error("serialising the report")]
    Report(#[source] serde_json::Error),
    /// The topology could not be serialised.
    #[error(transparent)]
    Topology(serde_json::Error),
    /// The report could not be written.
    #[error("writing the report to stdout")]
    Stdout(#[source] std::io::Error),
    /// The state file could not be written after the report.
    #[error("state file {}: cannot write", path.display())]
    SaveState {
        path: PathBuf,
        #[source]
        why: std::io::Error,
    },
}

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
pub fn run_check(args: &CheckArgs, emit: impl FnOnce(String) -> Result<(), CheckError>) -> Result<(), CheckError> {
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
        Some(p) => kmsg::read_file(p).map_err(|why| CheckError::KernelLog { path: p.clone(), why })?,
        None => Vec::new(),
    };
    let obs = monitor.observe(&prev.checks, !records.is_empty());
    monitor.resolve_topology(&topology_from, &obs.snapshot)?;
    let poll = monitor.decide(&prev.checks, &loaded, obs, now, &records);
    for n in &poll.notes {
        tracing::info!("{n}");
    }
    let mut report = Report::new(
        &monitor.decider.stamp.node_name,
        boot_id,
        &poll.snapshot,
        &monitor.decider.topology,
        &poll.roles,
        poll.events,
    )
    .with_flaps(&poll.next.links)
    .with_history(&poll.next.history)
    .with_phy(&poll.next.counters);
    report.char_devices = poll.char_devices;
    report.held_ports = poll.holds.held;
    report.blips = poll.holds.blips;
    if poll.snapshot.devices.is_empty() {
        tracing::warn!("{}", no_devices_note(&monitor.observer.host));
    }
    let out = if args.json {
        serde_json::to_string_pretty(&report).map_err(CheckError::Report)? + "\n"
    } else if poll.snapshot.devices.is_empty() {
        format!("{}\n", no_devices_note(&monitor.observer.host))
    } else {
        report.table()
    };
    // Act in order: the output (this cycle's events) first, then the state. A cycle whose
    // output failed is not saved, so the next invocation reports its events again.
    emit(out)?;
    if let Some(p) = &args.state_file {
        let next = State { checks: poll.next, ..prev };
        state::file::save(p, &next).map_err(|why| CheckError::SaveState { path: p.clone(), why })?;
    }
    Ok(())
}

/// The `emit` of [`run_check`] for the command line: the report on stdout, flushed.
pub fn to_stdout(out: String) -> Result<(), CheckError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush()).map_err(CheckError::Stdout)
}

pub fn run_topology(
    sysfs: &Path,
    procfs: &Path,
    metadata: &Path,
    metadata_required: bool,
    config: &Path,
    json: bool,
) -> Result<String, CheckError> {
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
        return Ok(serde_json::to_string_pretty(&v).map_err(CheckError::Topology)? + "\n");
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
        let why = c.role_reason.clone().or_else(|| c.reason.as_deref().map(String::from)).unwrap_or_default();
        let mon = if c.monitored { "monitored" } else { "not monitored" };
        let link = roles::device_link_layer(d).map(|l| l.name().to_string()).unwrap_or_else(|| "?".into());
        out.push_str(&format!("{:<14} {:<11} {:<10} {:<14} {}\n", d.name, role, link, mon, why));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use nicmon_tests::platforms::Platform;

    fn args(node: &nicmon_tests::Node) -> CheckArgs {
        CheckArgs {
            monitor: crate::monitor::fixture_options(node),
            state_file: None,
            now: None,
            kmsg: None,
            json: false,
        }
    }

    /// Each failure is its own kind, naming the operation and the path; the cause is the
    /// source, not repeated in the text.
    #[test]
    fn a_failure_names_its_operation_and_path() {
        let node = Platform::H100Oci.build();
        let missing = node.root().join("no-such-kmsg");
        let err = run_check(&CheckArgs { kmsg: Some(missing.clone()), ..args(&node) }, |_| Ok(())).unwrap_err();
        assert!(matches!(&err, CheckError::KernelLog { path, .. } if *path == missing), "{err:?}");
        assert_eq!(err.to_string(), format!("--kmsg {}", missing.display()));
        assert!(err.source().is_some_and(|s| s.to_string().contains("missing")), "{:?}", err.source());

        // A state file under a regular file: its directory cannot be made.
        std::fs::write(node.root().join("a-file"), "").unwrap();
        let unwritable = node.root().join("a-file/state.json");
        let err =
            run_check(&CheckArgs { state_file: Some(unwritable.clone()), ..args(&node) }, |_| Ok(())).unwrap_err();
        assert!(matches!(&err, CheckError::SaveState { path, .. } if *path == unwritable), "{err:?}");
        assert_eq!(err.to_string(), format!("state file {}: cannot write", unwritable.display()));

        let bad = node.root().join("bad.toml");
        std::fs::write(&bad, "stateDetection = 3\n").unwrap();
        let mut opts = args(&node);
        opts.monitor.config = bad.clone();
        let err = run_check(&opts, |_| Ok(())).unwrap_err();
        assert!(matches!(err, CheckError::Open(OpenError::Config(_))), "{err:?}");
        assert_eq!(err.to_string(), format!("config {}: stateDetection: expected a table", bad.display()));
        assert!(err.source().is_none(), "a config error is rendered whole");
    }

    /// A failed output is the caller's error, and the state is not saved after it.
    #[test]
    fn a_failed_output_is_not_followed_by_a_save() {
        let node = Platform::H100Oci.build();
        let state = node.root().join("state.json");
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let err =
            run_check(&CheckArgs { state_file: Some(state.clone()), ..args(&node) }, |_| Err(CheckError::Stdout(full)))
                .unwrap_err();
        assert!(matches!(err, CheckError::Stdout(_)), "{err:?}");
        assert_eq!(err.to_string(), "writing the report to stdout");
        assert!(!state.exists(), "no state saved after a failed output");
    }
}
