//! The hybrid wake-up path (SPEC §1.8): sources that tell the agent "poll now".
//!
//! A [`Wake`] never carries a verdict; the agent answers it with a full sysfs poll. The
//! sources are the embedded eBPF programs ([`ebpf`]: tracepoints, fentry/kprobes, each
//! attached when the kernel allows it, with the reason recorded when not) and the
//! rtnetlink link notifications ([`rtnetlink`]), the carrier source that needs no eBPF.
//! [`WakeSource`] starts what the host allows and says which hooks are live.
mod btf;
pub mod ebpf;
pub mod rtnetlink;
pub mod tracefs;

pub use nicmon_common::Hook;
use std::fmt;
use std::path::PathBuf;
use std::time::Instant;
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

/// One wake-up, as received by the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    pub hook: Hook,
    /// `CLOCK_MONOTONIC` ns when the kernel program ran (eBPF hooks only).
    pub kernel_ts_ns: Option<u64>,
    pub hint: Hint,
    /// When userspace received it.
    pub received: Instant,
    /// `CLOCK_MONOTONIC` ns when userspace received it: comparable with `kernel_ts_ns`.
    pub received_ns: u64,
}

impl Wake {
    /// Kernel-to-userspace latency, when the hook has a kernel timestamp.
    pub fn delivery_latency_ns(&self) -> Option<u64> {
        self.kernel_ts_ns.map(|k| self.received_ns.saturating_sub(k))
    }
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
}

impl Mechanism {
    pub const fn name(self) -> &'static str {
        match self {
            Mechanism::Fentry => "fentry",
            Mechanism::Kprobe => "kprobe",
            Mechanism::Tracepoint => "tracepoint",
            Mechanism::Rtnetlink => "rtnetlink",
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
    /// Mount tracefs at `/sys/kernel/tracing` when it is not mounted.
    pub mount_tracefs: bool,
    /// Use this tracefs instead of looking for one.
    pub tracefs: Option<PathBuf>,
}

impl Default for WakeOptions {
    fn default() -> Self {
        Self { object: EMBEDDED_OBJECT, rtnetlink: true, mount_tracefs: true, tracefs: None }
    }
}

/// The running wake sources. Dropping it detaches every eBPF hook and stops the tasks.
pub struct WakeSource {
    mode: WakeMode,
    hooks: Vec<HookStatus>,
    ebpf_error: Option<String>,
    rx: mpsc::Receiver<Wake>,
    _ebpf: Option<ebpf::EbpfWakes>,
    tasks: Vec<JoinHandle<()>>,
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
                match ebpf::EbpfWakes::load(object, tracefs, tx.clone()) {
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
        let rtnl_live = hooks.iter().any(|h| h.hook == Hook::Rtnetlink && h.attached);
        let mode = match (ebpf_live, rtnl_live) {
            (true, _) => WakeMode::Ebpf,
            (false, true) => WakeMode::RtnetlinkOnly,
            (false, false) => WakeMode::None,
        };
        WakeSource { mode, hooks, ebpf_error, rx, _ebpf: ebpf_wakes, tasks }
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
