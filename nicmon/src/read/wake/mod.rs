//! The hybrid wake-up path (SPEC §1.8): sources that tell the agent "poll now".
//!
//! A [`Wake`] never carries a verdict; the agent answers it with a full sysfs poll. The
//! sources are the embedded eBPF programs ([`ebpf`]: tracepoints, fentry/kprobes, each
//! attached when the kernel allows it, with the reason recorded when not) and the
//! rtnetlink link notifications ([`rtnetlink`]), the carrier source that needs no eBPF, and
//! the kernel's uevents ([`uevent`]: a device, netdev or PCI function added or removed), the
//! RDMA netlink monitor ([`rdma_monitor`]) and devlink's notifications ([`devlink_monitor`]:
//! a health reporter's state change or recovery, an instance registered or unregistered).
//! [`WakeSource`] starts what the host allows and says which hooks are live.
mod btf;
pub mod devlink_monitor;
pub mod ebpf;
mod nlsock;
pub mod rdma_monitor;
pub mod rtnetlink;
pub mod tracefs;
pub mod uevent;

pub use nicmon_common::Hook;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The kernel programs built by `cargo xtask build-ebpf`, when they were built before the
/// agent; `None` in a polling-only build.
pub const EMBEDDED_OBJECT: Option<&[u8]> = {
    #[cfg(nicmon_ebpf)]
    {
        Some(include_bytes!(env!("NICMON_EBPF_OBJECT_PATH")))
    }
    #[cfg(not(nicmon_ebpf))]
    {
        None
    }
};

/// Whether this build carries the kernel programs (for `nicmon version`, the startup log
/// and the metrics).
pub const EBPF_EMBEDDED: bool = EMBEDDED_OBJECT.is_some();

/// Capacity of the wake-up channel. Wake-ups are idempotent ("poll now"): when the agent
/// is this far behind, more of them add nothing and are dropped.
pub const CHANNEL_CAPACITY: usize = 1024;

/// What a hinted wake record does the moment the ring buffer is drained, before the loop
/// sees it: the targeted poll it will cause reads on a reader thread, and waking that
/// thread takes ~0.1 ms when its vCPU is idle — started here, the wake-up overlaps the
/// loop's own way to the poll. Gated by the loop, so a storm of records it rate-limits
/// (no targeted poll follows them soon) wakes nothing.
pub struct EarlyWake {
    /// Wakes the reader thread ([`crate::read::host::Host::read_waker`]).
    pub wake: Box<dyn Fn() + Send + Sync>,
    /// `CLOCK_MONOTONIC` ns before which a hinted record wakes nothing (the loop's rate
    /// limit); `u64::MAX`: none (no full poll yet: no targeted poll can follow).
    pub not_before_ns: Arc<AtomicU64>,
}

impl EarlyWake {
    /// A record with `hint` arrived at `now_ns`: wake when it names something and the gate
    /// is open. Whether it woke.
    pub fn on_record(&self, hint: &Hint, now_ns: u64) -> bool {
        let open =
            matches!(hint, Hint::Name(_) | Hint::Ifindex(_)) && now_ns >= self.not_before_ns.load(Ordering::Relaxed);
        if open {
            (self.wake)();
        }
        open
    }
}

/// Where a [`WakeSource`]'s drain finds its [`EarlyWake`] once the daemon sets it.
pub type EarlyWakeSlot = Arc<OnceLock<EarlyWake>>;

/// One wake-up, as received by the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    pub hook: Hook,
    /// `CLOCK_MONOTONIC` ns when the kernel program ran (eBPF hooks only).
    pub kernel_ts_ns: Option<u64>,
    pub hint: Hint,
    /// The kernel said the hinted object was removed (a uevent `remove`, an rtnetlink
    /// `RTM_DELLINK`, the RDMA monitor's unregister, a devlink `DEVLINK_CMD_DEL`): the
    /// decider may report a known device's loss at once (SPEC §1.15).
    pub removed: bool,
    /// When userspace received it.
    pub received: Instant,
    /// `CLOCK_MONOTONIC` ns when userspace received it: comparable with `kernel_ts_ns`.
    pub received_ns: u64,
}

/// The hooks of `woke`, each once, in the order they first woke.
pub fn hook_names(woke: &[Wake]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for w in woke {
        if !names.iter().any(|n| n == w.hook.name()) {
            names.push(w.hook.name().to_string());
        }
    }
    names
}

impl Wake {
    /// Kernel-to-userspace latency, when the hook has a kernel timestamp.
    pub fn delivery_latency_ns(&self) -> Option<u64> {
        self.kernel_ts_ns.map(|k| self.received_ns.saturating_sub(k))
    }
}

/// Whether `hook` is one of the devlink health tracepoints or the devlink netlink monitor
/// (their hint is the PCI address of the function whose reporter fired): its wake-up reads
/// the reporters at once.
pub fn is_devlink(hook: Hook) -> bool {
    matches!(
        hook,
        Hook::DevlinkHealthReport | Hook::DevlinkHealthReporterStateUpdate | Hook::DevlinkHwerr | Hook::DevlinkMonitor
    )
}

/// What a wake-up says about where to look; advisory only (the poll reads everything).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Hint {
    None,
    /// A netdev name (`qdisc_reset`, `net_dev_xmit_timeout`, rtnetlink) or a device name
    /// such as a PCI address (`devlink_*`, `aer_event`).
    Name(String),
    Ifindex(u32),
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hint::None => f.write_str("-"),
            Hint::Name(n) => f.write_str(n),
            Hint::Ifindex(i) => write!(f, "ifindex {i}"),
        }
    }
}

/// How a hook is (or would be) attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Fentry,
    Kprobe,
    Tracepoint,
    Rtnetlink,
    Uevent,
    RdmaNetlink,
    DevlinkNetlink,
}

impl Mechanism {
    pub const fn name(self) -> &'static str {
        match self {
            Mechanism::Fentry => "fentry",
            Mechanism::Kprobe => "kprobe",
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::Rtnetlink => "rtnetlink",
            Mechanism::Uevent => "uevent",
            Mechanism::RdmaNetlink => "rdma netlink",
            Mechanism::DevlinkNetlink => "devlink netlink",
        }
    }
}

/// The outcome of attaching one hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookStatus {
    pub hook: Hook,
    pub attached: bool,
    /// How it is attached, when it is.
    pub via: Option<Mechanism>,
    /// Why it is not attached, or which preferred mechanism was refused before the one
    /// that worked (e.g. `"fentry refused: EPERM"`); `None` when the first choice worked.
    pub reason: Option<String>,
}

impl fmt::Display for HookStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.via, &self.reason) {
            (Some(via), None) => write!(f, "{}: attached ({})", self.hook.name(), via.name()),
            (Some(via), Some(r)) => {
                write!(f, "{}: attached ({}; {r})", self.hook.name(), via.name())
            }
            (None, r) => {
                write!(f, "{}: not attached ({})", self.hook.name(), r.as_deref().unwrap_or("no reason recorded"))
            }
        }
    }
}

/// Which sources are live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WakeMode {
    /// The eBPF programs (at least one hook attached), plus rtnetlink when it opened.
    Ebpf,
    /// No eBPF hook: rtnetlink link notifications only.
    RtnetlinkOnly,
    /// No wake source: the 1 s poll alone.
    None,
}

impl WakeMode {
    pub const fn name(self) -> &'static str {
        match self {
            WakeMode::Ebpf => "ebpf",
            WakeMode::RtnetlinkOnly => "rtnetlink",
            WakeMode::None => "none",
        }
    }
}

/// What to start.
#[derive(Clone, Debug)]
pub struct WakeOptions {
    /// The kernel programs to load; `None` disables eBPF.
    pub object: Option<&'static [u8]>,
    pub rtnetlink: bool,
    /// Listen to kobject uevents ([`uevent`]).
    pub uevent: bool,
    /// Listen to the RDMA netlink monitor ([`rdma_monitor`]).
    pub rdma_monitor: bool,
    /// Listen to devlink notifications ([`devlink_monitor`]).
    pub devlink_monitor: bool,
    /// Mount tracefs at `/sys/kernel/tracing` when it is not mounted.
    pub mount_tracefs: bool,
    /// Use this tracefs instead of looking for one.
    pub tracefs: Option<PathBuf>,
}

impl Default for WakeOptions {
    fn default() -> Self {
        Self {
            object: EMBEDDED_OBJECT,
            rtnetlink: true,
            uevent: true,
            rdma_monitor: true,
            devlink_monitor: true,
            mount_tracefs: true,
            tracefs: None,
        }
    }
}

/// The running wake sources. Dropping it detaches every eBPF hook and stops the tasks.
pub struct WakeSource {
    mode: WakeMode,
    hooks: Vec<HookStatus>,
    ebpf_error: Option<String>,
    rx: mpsc::Receiver<Wake>,
    ebpf: Option<ebpf::EbpfWakes>,
    tasks: Vec<JoinHandle<()>>,
    /// The uevent listener's task, by its index in `tasks`.
    uevent_task: Option<usize>,
    early: EarlyWakeSlot,
}

impl WakeSource {
    /// Starts the sources `opts` asks for, as far as the host allows; never fails (a
    /// source that cannot start is reported through [`Self::hooks`] and
    /// [`Self::ebpf_error`]). Must be called within a tokio runtime.
    pub fn start(opts: &WakeOptions) -> WakeSource {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let mut hooks = Vec::new();
        let mut tasks = Vec::new();
        let mut ebpf_error = None;
        let mut ebpf_wakes = None;
        let early = EarlyWakeSlot::default();

        match opts.object {
            None => {
                ebpf_error = Some(if EBPF_EMBEDDED {
                    "eBPF disabled".to_string()
                } else {
                    "eBPF object not embedded (built without `cargo xtask build-ebpf`)".to_string()
                })
            }
            Some(object) => {
                let tracefs = match &opts.tracefs {
                    Some(p) => Ok(p.clone()),
                    None => tracefs::locate(opts.mount_tracefs),
                };
                match ebpf::EbpfWakes::load(object, tracefs, tx.clone(), early.clone()) {
                    Ok(w) => {
                        hooks.extend(w.hooks().iter().cloned());
                        ebpf_wakes = Some(w);
                    }
                    Err(e) => ebpf_error = Some(e.to_string()),
                }
            }
        }
        let ebpf_live = hooks.iter().any(|h| h.attached);

        if opts.rtnetlink {
            let started = rtnetlink::LinkSocket::open().and_then(|s| rtnetlink::spawn(s, tx.clone()));
            hooks.push(match started {
                Ok(task) => {
                    tasks.push(task);
                    HookStatus { hook: Hook::Rtnetlink, attached: true, via: Some(Mechanism::Rtnetlink), reason: None }
                }
                Err(e) => HookStatus {
                    hook: Hook::Rtnetlink,
                    attached: false,
                    via: None,
                    reason: Some(format!("rtnetlink socket: {e}")),
                },
            });
        }
        // Each listener that starts: its task's index.
        let mut userspace = |on: bool, hook, via, what: &str, started: &dyn Fn() -> std::io::Result<JoinHandle<()>>| {
            if !on {
                return None;
            }
            let (status, at) = match started() {
                Ok(task) => {
                    tasks.push(task);
                    (HookStatus { hook, attached: true, via: Some(via), reason: None }, Some(tasks.len() - 1))
                }
                Err(e) => (HookStatus { hook, attached: false, via: None, reason: Some(format!("{what}: {e}")) }, None),
            };
            hooks.push(status);
            at
        };
        let uevent_task = userspace(opts.uevent, Hook::Uevent, Mechanism::Uevent, "uevent socket", &|| {
            uevent::UeventSocket::open().and_then(|s| uevent::spawn(s, tx.clone()))
        });
        userspace(opts.rdma_monitor, Hook::RdmaMonitor, Mechanism::RdmaNetlink, "RDMA netlink socket", &|| {
            rdma_monitor::MonitorSocket::open().and_then(|s| rdma_monitor::spawn(s, tx.clone()))
        });
        userspace(opts.devlink_monitor, Hook::DevlinkMonitor, Mechanism::DevlinkNetlink, "devlink netlink", &|| {
            devlink_monitor::MonitorSocket::open().and_then(|s| devlink_monitor::spawn(s, tx.clone()))
        });
        let rtnl_live = hooks.iter().any(|h| h.hook == Hook::Rtnetlink && h.attached);
        let mode = match (ebpf_live, rtnl_live) {
            (true, _) => WakeMode::Ebpf,
            (false, true) => WakeMode::RtnetlinkOnly,
            (false, false) => WakeMode::None,
        };
        WakeSource { mode, hooks, ebpf_error, rx, ebpf: ebpf_wakes, tasks, uevent_task, early }
    }

    /// Whether the kernel's uevents are heard now: the listener started and has not stopped
    /// (a socket error other than an overrun ends it, with a warning).
    pub fn uevents_heard(&self) -> bool {
        self.uevent_task.and_then(|i| self.tasks.get(i)).is_some_and(|t| !t.is_finished())
    }

    pub fn mode(&self) -> WakeMode {
        self.mode
    }

    /// Every hook that was tried, attached or not, with the reasons.
    pub fn hooks(&self) -> &[HookStatus] {
        &self.hooks
    }

    /// The hooks that can wake the agent.
    pub fn live_hooks(&self) -> impl Iterator<Item = Hook> + '_ {
        self.hooks.iter().filter(|h| h.attached).map(|h| h.hook)
    }

    /// Why eBPF is not in use at all, when it is not (individual hooks: [`Self::hooks`]).
    pub fn ebpf_error(&self) -> Option<&str> {
        self.ebpf_error.as_deref()
    }

    /// Wake records the kernel programs lost to a full ring buffer since they were
    /// loaded; `None` without eBPF or when they cannot be counted.
    pub fn lost_records(&self) -> Option<u64> {
        self.ebpf.as_ref()?.lost_records()
    }

    /// Set what a hinted eBPF record does as soon as it is drained (once; later calls are
    /// ignored).
    pub fn set_early_wake(&self, early: EarlyWake) {
        let _ = self.early.set(early);
    }

    /// The next wake-up; `None` only when every source has stopped.
    pub async fn recv(&mut self) -> Option<Wake> {
        self.rx.recv().await
    }

    /// A wake-up already waiting, if any (to coalesce a burst).
    pub fn try_recv(&mut self) -> Option<Wake> {
        self.rx.try_recv().ok()
    }
}

impl Drop for WakeSource {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// How often at most a warning says that wake records were lost in the kernel.
pub const LOST_WARN_EVERY: Duration = Duration::from_secs(60);

/// The count of wake records the kernel programs lost to a full ring buffer, as the agent
/// follows it: what is new at each reading (for the metric) and when to say so in the log
/// (at most once per [`LOST_WARN_EVERY`], with the count since the last line).
#[derive(Debug, Default)]
pub struct LostWakes {
    /// The last total read.
    total: u64,
    /// The total the last warning covered.
    warned: u64,
    last_warning: Option<Instant>,
}

/// What one reading of the lost-record count means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostUpdate {
    /// Lost since the previous reading (what the metric grows by).
    pub new: u64,
    /// Lost since the programs were loaded.
    pub total: u64,
    /// A warning is due: lost since the last one.
    pub warn: Option<u64>,
}

impl LostWakes {
    /// Take a reading (`total`: the kernel's count, summed over CPUs) at `now`. The kernel's
    /// count only grows; a smaller one (it cannot happen while the programs stay loaded) is
    /// taken as no news.
    pub fn update(&mut self, total: u64, now: Instant) -> LostUpdate {
        let new = total.saturating_sub(self.total);
        self.total = self.total.max(total);
        let due = self.last_warning.is_none_or(|t| now.saturating_duration_since(t) >= LOST_WARN_EVERY);
        let warn = (self.total > self.warned && due).then(|| {
            let since = self.total - self.warned;
            self.warned = self.total;
            self.last_warning = Some(now);
            since
        });
        LostUpdate { new, total: self.total, warn }
    }

    /// The last total read.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Whether each userspace wake source can be opened on this host (its socket opened and
/// closed again), with the kernel's refusal where not: what `nicmon version` says.
pub fn probe_userspace() -> Vec<(Hook, Result<(), String>)> {
    let said = |r: std::io::Result<()>, what: &str| r.map_err(|e| format!("{what}: {e}"));
    vec![
        (Hook::Rtnetlink, said(rtnetlink::LinkSocket::open().map(drop), "rtnetlink socket")),
        (Hook::Uevent, said(uevent::UeventSocket::open().map(drop), "uevent socket")),
        (Hook::RdmaMonitor, said(rdma_monitor::MonitorSocket::open().map(drop), "RDMA netlink socket")),
        (Hook::DevlinkMonitor, said(devlink_monitor::MonitorSocket::open().map(drop), "devlink netlink")),
    ]
}

/// Sends a wake-up; a full channel drops it (see [`CHANNEL_CAPACITY`]). `false` when the
/// receiver is gone and the source should stop.
fn deliver(tx: &mpsc::Sender<Wake>, wake: Wake) -> bool {
    !matches!(tx.try_send(wake), Err(mpsc::error::TrySendError::Closed(_)))
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Registers `inner`'s fd with the tokio reactor for readability. Only for the types of
/// this module, each of which owns its fd for its whole life (an `OwnedFd`, or aya's
/// `MapData` inside a ring buffer), which is what makes the registration sound.
fn register_readable<T: std::os::fd::AsRawFd>(inner: T) -> std::io::Result<tokio::io::unix::AsyncFd<T>> {
    // SAFETY: see above — the fd stays open and the same until the AsyncFd is dropped.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The uevent listener answers for the device listing while it runs: heard once started
    /// (where this host gives the socket), not when it is off.
    #[tokio::test]
    async fn uevents_are_heard_while_their_listener_runs() {
        let only = |uevent| WakeOptions {
            object: None,
            rtnetlink: false,
            uevent,
            rdma_monitor: false,
            devlink_monitor: false,
            mount_tracefs: false,
            tracefs: None,
        };
        assert!(!WakeSource::start(&only(false)).uevents_heard());
        let w = WakeSource::start(&only(true));
        let attached = w.live_hooks().any(|h| h == Hook::Uevent);
        if !attached {
            return println!("uevent socket refused here: only the off case is checked");
        }
        assert!(w.uevents_heard());
    }

    /// A record wakes the reader early only when it names something and the loop's gate
    /// is open: never before the first full poll, nor inside the rate limit's gap.
    #[test]
    fn an_early_wake_needs_a_hint_and_an_open_gate() {
        let woken = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&woken);
        let gate = Arc::new(AtomicU64::new(u64::MAX));
        let early = EarlyWake {
            wake: Box::new(move || {
                count.fetch_add(1, Ordering::Relaxed);
            }),
            not_before_ns: Arc::clone(&gate),
        };
        let name = Hint::Name("eth0".into());
        assert!(!early.on_record(&name, 1_000), "no full poll yet");
        gate.store(0, Ordering::Relaxed);
        assert!(!early.on_record(&Hint::None, 1_000), "a record naming nothing");
        assert!(early.on_record(&name, 1_000));
        assert!(early.on_record(&Hint::Ifindex(3), 1_000));
        gate.store(2_000, Ordering::Relaxed);
        assert!(!early.on_record(&name, 1_999), "inside the rate limit's gap");
        assert!(early.on_record(&name, 2_000));
        assert_eq!(woken.load(Ordering::Relaxed), 3);
    }

    /// The metric grows by what is new at each reading; the warning comes at the first
    /// loss, then at most once a minute with the count since the previous line.
    #[test]
    fn lost_records_give_deltas_and_a_warning_at_most_once_a_minute() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut l = LostWakes::default();
        assert_eq!(l.update(0, at(0)), LostUpdate { new: 0, total: 0, warn: None }, "nothing lost: no line");
        assert_eq!(
            l.update(5, at(1)),
            LostUpdate { new: 5, total: 5, warn: Some(5) },
            "the first loss is said at once"
        );
        assert_eq!(l.update(7, at(2)), LostUpdate { new: 2, total: 7, warn: None }, "within the minute: counted only");
        assert_eq!(l.update(7, at(30)), LostUpdate { new: 0, total: 7, warn: None });
        assert_eq!(l.update(10, at(60)), LostUpdate { new: 3, total: 10, warn: None }, "59 s after the line");
        assert_eq!(l.update(10, at(61)), LostUpdate { new: 0, total: 10, warn: Some(5) }, "the losses since the line");
        assert_eq!(l.update(10, at(200)), LostUpdate { new: 0, total: 10, warn: None }, "no new loss: no line");
        assert_eq!(l.update(4, at(201)), LostUpdate { new: 0, total: 10, warn: None }, "a smaller count is no news");
        assert_eq!(l.update(11, at(202)), LostUpdate { new: 1, total: 11, warn: Some(1) });
        assert_eq!(l.total(), 11);
    }

    #[test]
    fn per_cpu_slots_are_summed() {
        assert_eq!(ebpf::sum_per_cpu(&[]), 0);
        assert_eq!(ebpf::sum_per_cpu(&[0, 3, 0, 4]), 7);
        assert_eq!(ebpf::sum_per_cpu(&[u64::MAX, 1]), 0, "wraps instead of panicking");
    }
}
