//! Loads the embedded kernel programs with aya and attaches them hook by hook: a hook
//! the kernel refuses or lacks is recorded with the reason and the others carry on.
//! Then drains the ring buffer into the wake-up channel.
use super::{Hint, HookStatus, Mechanism, Wake, monotonic_ns, tracefs};
use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::{FEntry, KProbe, ProgramError, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use nicmon_common::{HOOK_SLOTS, HintKind, Hook, WakeRecord};
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Name of the ring buffer map and of the hint-offset global in the object.
const RING_MAP: &str = "WAKES";
/// Name of the per-CPU count of wake records lost to a full ring buffer.
const LOST_MAP: &str = "WAKES_LOST";
const HINT_GLOBAL: &str = "HINT_LOC";
/// The kernel programs' copy of the agent's tgid: `mlx5:mlx5_cmd` records caused by the
/// agent's own reads are dropped in the kernel (no wake storm from a failing counter read).
const SELF_GLOBAL: &str = "SELF_TGID";

/// How one hook attaches. Program names are the function names in `nicmon-ebpf`.
struct Attach {
    hook: Hook,
    target: Target,
}

enum Target {
    /// A kernel function: fentry when available (vmlinux only), else kprobe.
    Function {
        name: &'static str,
        fentry: Option<&'static str>,
        kprobe: &'static str,
        /// The module that provides it, when it is not in vmlinux.
        module: Option<&'static str>,
    },
    Tracepoint {
        system: &'static str,
        event: &'static str,
        program: &'static str,
        /// The `__data_loc char[]` field sent as the hint.
        hint_field: Option<&'static str>,
        module: Option<&'static str>,
    },
}

const fn carrier(hook: Hook, name: &'static str, fentry: &'static str, kprobe: &'static str) -> Attach {
    Attach { hook, target: Target::Function { name, fentry: Some(fentry), kprobe, module: None } }
}

const fn tp(
    hook: Hook,
    system: &'static str,
    event: &'static str,
    program: &'static str,
    hint_field: Option<&'static str>,
    module: Option<&'static str>,
) -> Attach {
    Attach { hook, target: Target::Tracepoint { system, event, program, hint_field, module } }
}

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// SPEC §1.8, in attach order.
const ATTACH: [Attach; 14] = [
    carrier(Hook::NetifCarrierOff, "netif_carrier_off", "fentry_netif_carrier_off", "kprobe_netif_carrier_off"),
    carrier(Hook::NetifCarrierOn, "netif_carrier_on", "fentry_netif_carrier_on", "kprobe_netif_carrier_on"),
    carrier(Hook::NetifCarrierEvent, "netif_carrier_event", "fentry_netif_carrier_event", "kprobe_netif_carrier_event"),
    carrier(
        Hook::LinkwatchFireEvent,
        "linkwatch_fire_event",
        "fentry_linkwatch_fire_event",
        "kprobe_linkwatch_fire_event",
    ),
    tp(Hook::QdiscReset, "qdisc", "qdisc_reset", "tp_qdisc_reset", Some("dev"), None),
    Attach {
        hook: Hook::IbDispatchEvent,
        target: Target::Function {
            name: "ib_dispatch_event",
            fentry: None,
            kprobe: "kprobe_ib_dispatch_event",
            module: Some("ib_core"),
        },
    },
    Attach {
        hook: Hook::IbDispatchEventClients,
        target: Target::Function {
            name: "ib_dispatch_event_clients",
            fentry: None,
            kprobe: "kprobe_ib_dispatch_event_clients",
            module: Some("ib_core"),
        },
    },
    tp(
        Hook::DevlinkHealthReport,
        "devlink",
        "devlink_health_report",
        "tp_devlink_health_report",
        Some("dev_name"),
        None,
    ),
    tp(
        Hook::DevlinkHealthReporterStateUpdate,
        "devlink",
        "devlink_health_reporter_state_update",
        "tp_devlink_health_reporter_state_update",
        Some("dev_name"),
        None,
    ),
    tp(Hook::DevlinkHwerr, "devlink", "devlink_hwerr", "tp_devlink_hwerr", Some("dev_name"), None),
    tp(Hook::Mlx5Cmd, "mlx5", "mlx5_cmd", "tp_mlx5_cmd", None, Some("mlx5_core")),
    tp(Hook::Mlx5Fw, "mlx5", "mlx5_fw", "tp_mlx5_fw", None, Some("mlx5_core")),
    tp(Hook::NetDevXmitTimeout, "net", "net_dev_xmit_timeout", "tp_net_dev_xmit_timeout", Some("name"), None),
    tp(Hook::AerEvent, "ras", "aer_event", "tp_aer_event", Some("dev_name"), None),
];

/// Why the kernel programs could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {0}")]
    Object(#[source] Box<aya::EbpfError>),
    #[error("the eBPF object has no ring buffer map {RING_MAP}")]
    NoRingBuffer,
    #[error("the eBPF ring buffer {RING_MAP} cannot be used: {0}")]
    RingBuffer(#[source] aya::maps::MapError),
    #[error("registering the eBPF ring buffer with tokio failed: {0}")]
    Reactor(#[source] io::Error),
}

/// Why a hook did not attach by one mechanism: the step that failed, what it named and
/// the kernel's answer. A hook's reasons are rendered once, into [`HookStatus::reason`]
/// (several joined by `; `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// No stand-in BTF for the fentry programs: reading or indexing the kernel's BTF
    /// (`/sys/kernel/btf/vmlinux`) failed.
    #[error("fentry unavailable: {0}")]
    NoBtf(String),
    /// The kernel refuses fentry programs outright (lockdown, an LSM policy, a capability).
    #[error("fentry refused: EPERM")]
    FentryRefused,
    /// The kernel has no kprobes.
    #[error("kprobes unavailable: CONFIG_KPROBES off (no kprobe PMU, no kprobe_events)")]
    NoKprobes,
    /// The kprobe's function is not in `/proc/kallsyms`.
    #[error("kprobe: {function} not in /proc/kallsyms ({})", match .module {
        Some(m) => format!("module {m} not loaded"),
        None => "not in this kernel, or inlined".to_string(),
    })]
    NotInKallsyms { function: String, module: Option<String> },
    /// No tracefs to find the tracepoint in (why).
    #[error("tracepoint {system}:{event}: {why}")]
    NoTracefs { system: String, event: String, why: String },
    /// The tracepoint is not in tracefs.
    #[error("tracepoint {system}:{event} not present {}", match .module {
        Some(m) => format!("(module {m} not loaded)"),
        None => "in this kernel".to_string(),
    })]
    NoTracepoint { system: String, event: String, module: Option<String> },
    /// The eBPF object lacks the program.
    #[error("program {0} missing from the eBPF object")]
    MissingProgram(String),
    /// The object's program is not of the mechanism's type.
    #[error("{mechanism} program {program}: {why}")]
    ProgramType { mechanism: &'static str, program: String, why: String },
    /// A BPF syscall failed: loading the program (`refused`) or attaching it (`attach
    /// failed`); `answer` is the errno's name, with the call or the verifier's first line.
    #[error("{mechanism} {step}: {answer}")]
    Syscall { mechanism: &'static str, step: &'static str, answer: String },
}

/// A hook's reasons as its status says them.
fn reasons(errors: &[AttachError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// The loaded kernel programs. Holds the [`Ebpf`] object: dropping it detaches every hook.
pub struct EbpfWakes {
    _ebpf: Ebpf,
    hooks: Vec<HookStatus>,
    tasks: Vec<JoinHandle<()>>,
    /// The kernel programs' per-CPU count of records lost to a full ring buffer (`None`:
    /// the object has no such map, or it cannot be used; said once at load).
    lost: Option<PerCpuArray<MapData, u64>>,
}

impl Drop for EbpfWakes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl EbpfWakes {
    /// Loads `object`, attaches every hook it can and starts draining the ring buffer into
    /// `tx` (on the current tokio runtime). `tracefs` is where tracepoints live, or why
    /// there is none (then every tracepoint hook reports that reason). `early`: what a
    /// hinted record does as soon as it is drained ([`super::EarlyWake`], set there later).
    pub fn load(
        object: &[u8],
        tracefs: Result<PathBuf, tracefs::TracefsError>,
        tx: mpsc::Sender<Wake>,
        early: super::EarlyWakeSlot,
    ) -> Result<EbpfWakes, LoadError> {
        Self::load_with_ring(object, tracefs, tx, None, early)
    }

    /// [`Self::load`], the ring buffer sized `ring_bytes` (a power-of-two multiple of the
    /// page size) instead of the object's 64 KiB when given.
    fn load_with_ring(
        object: &[u8],
        tracefs: Result<PathBuf, tracefs::TracefsError>,
        tx: mpsc::Sender<Wake>,
        ring_bytes: Option<u32>,
        early: super::EarlyWakeSlot,
    ) -> Result<EbpfWakes, LoadError> {
        raise_memlock_limit();

        let mut hint_loc = [0u32; HOOK_SLOTS];
        if let Ok(tfs) = &tracefs {
            for a in &ATTACH {
                if let (Target::Tracepoint { system, event, hint_field: Some(field), .. }, Some(slot)) =
                    (&a.target, a.hook.slot())
                {
                    hint_loc[slot] = tracefs::data_loc_offset(tfs, system, event, field).unwrap_or(0);
                }
            }
        }

        // The object has no CO-RE relocations, so the loader needs no target BTF.
        let tgid = std::process::id();
        let mut loader = loader_without_kernel_btf();
        loader.btf(None).override_global(HINT_GLOBAL, &hint_loc, true).override_global(SELF_GLOBAL, &tgid, true);
        if let Some(bytes) = ring_bytes {
            loader.map_max_entries(RING_MAP, bytes);
        }
        let mut ebpf = loader.load(object).map_err(|e| LoadError::Object(Box::new(e)))?;
        let ring = ebpf.take_map(RING_MAP).ok_or(LoadError::NoRingBuffer)?;
        let ring = RingBuf::try_from(ring).map_err(LoadError::RingBuffer)?;
        let lost = match ebpf.take_map(LOST_MAP).map(PerCpuArray::try_from) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                tracing::warn!(map = LOST_MAP, error = %e, "lost wake records cannot be counted");
                None
            }
            None => {
                tracing::warn!(map = LOST_MAP, "the eBPF object does not count lost wake records");
                None
            }
        };

        let mut tasks = Vec::new();
        // Only an object built with the `log` feature has the aya-log map.
        if let Ok(logger) = aya_log::EbpfLogger::init_with_logger(&mut ebpf, TracingLog) {
            match super::register_readable(logger) {
                Ok(fd) => tasks.push(tokio::spawn(drive_logger(fd))),
                Err(e) => tracing::warn!(error = %e, "eBPF log output unavailable"),
            }
        }

        let probes = KernelFacts::read(tracefs.as_deref().ok());
        // Kernel BTF is needed only for the fentry programs' attach targets, and only their ids.
        let btf = fentry_btf();
        let hooks = ATTACH.iter().map(|a| attach(&mut ebpf, a, &btf, &tracefs, &probes)).collect();
        drop(btf);
        let fd = super::register_readable(ring).map_err(LoadError::Reactor)?;
        tasks.push(tokio::spawn(drain(fd, tx, early)));
        Ok(EbpfWakes { _ebpf: ebpf, hooks, tasks, lost })
    }

    pub fn hooks(&self) -> &[HookStatus] {
        &self.hooks
    }

    /// Wake records the kernel programs lost since they were loaded because the ring
    /// buffer was full, summed over CPUs. `None` when they cannot be counted (no such map
    /// in the object, or the read failed: logged at debug level).
    pub fn lost_records(&self) -> Option<u64> {
        let map = self.lost.as_ref()?;
        match map.get(&0, 0) {
            Ok(per_cpu) => Some(sum_per_cpu(&per_cpu)),
            Err(e) => {
                tracing::debug!(map = LOST_MAP, error = %e, "reading the lost wake records failed");
                None
            }
        }
    }
}

/// The total of a per-CPU counter's slots. Each slot only grows (wrapping at `u64::MAX`,
/// which a count of records never reaches), so the sum does too.
pub fn sum_per_cpu(per_cpu: &[u64]) -> u64 {
    per_cpu.iter().fold(0u64, |sum, n| sum.wrapping_add(*n))
}

/// An [`EbpfLoader`] whose constructor has not parsed the kernel's BTF.
///
/// aya 0.14's `EbpfLoader::new()` reads and parses the whole of `/sys/kernel/btf/vmlinux`
/// (~19 MiB of heap for a 5 MiB file; aya issue #1172, fixed in releases that need a newer
/// Rust) before `.btf(None)` can say that it is not wanted. So the constructor runs on a
/// short-lived thread of its own under a seccomp filter, installed on that thread only,
/// that answers `open`/`openat`/`openat2` with `ENOENT`: the read fails, aya records "no
/// kernel BTF" (what `.btf(None)` sets anyway) and nothing is parsed. The filter ends with
/// the thread. Where it cannot be installed the constructor runs unfiltered (the parse is
/// then paid once, and freed).
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    let built = std::thread::Builder::new().name("nicmon-ebpf-loader".into()).spawn(|| {
        if let Err(e) = deny_open_on_this_thread() {
            tracing::debug!(error = %e, "seccomp filter unavailable: aya parses the kernel BTF once");
        }
        EbpfLoader::new()
    });
    match built.map(|t| t.join()) {
        Ok(Ok(loader)) => loader,
        _ => EbpfLoader::new(),
    }
}

/// Installs, on the calling thread only, a seccomp filter under which every file open
/// fails with `ENOENT`. Irreversible for the thread: call it on one that ends soon.
fn deny_open_on_this_thread() -> io::Result<()> {
    // `struct seccomp_data`: the syscall number at offset 0, the audit architecture at 4.
    const NR: u32 = 0;
    const ARCH: u32 = 4;
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return Err(io::Error::new(io::ErrorKind::Unsupported, "no seccomp filter for this architecture"));

    #[cfg(target_arch = "x86_64")]
    let opens = [libc::SYS_open, libc::SYS_openat, libc::SYS_openat2];
    #[cfg(target_arch = "aarch64")]
    let opens = [libc::SYS_openat, libc::SYS_openat2];
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
        let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt,
            jf,
            k,
        };
        let n = opens.len() as u8;
        let mut prog = vec![
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, ARCH),
            jeq(AUDIT_ARCH, 0, n + 1), // another ABI: allow
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, NR),
        ];
        for (i, nr) in opens.iter().enumerate() {
            prog.push(jeq(*nr as u32, n - i as u8, 0)); // to the ENOENT return
        }
        prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
        prog.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::ENOENT as u32));
        let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
        // SAFETY: plain prctl calls; `fprog` points at `prog`, alive for the call. Without
        // SECCOMP_FILTER_FLAG_TSYNC the filter applies to the calling thread only.
        unsafe {
            // Variadic: pass full-width arguments.
            let (one, zero): (libc::c_ulong, libc::c_ulong) = (1, 0);
            let mode = libc::c_ulong::from(libc::SECCOMP_MODE_FILTER);
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, one, zero, zero, zero) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, mode, &fprog as *const libc::sock_fprog) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Drains the ring buffer on every readiness edge. The buffer is emptied before the
/// readiness is cleared: clearing with records left loses the edge (TOOLCHAIN.md).
async fn drain(mut fd: AsyncFd<RingBuf<MapData>>, tx: mpsc::Sender<Wake>, early: super::EarlyWakeSlot) {
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        let ring = guard.get_inner_mut();
        // At most one early wake-up per readiness edge.
        let mut woke_reader = false;
        while let Some(item) = ring.next() {
            let (received, received_ns) = (Instant::now(), monotonic_ns());
            let Some(wake) = wake_from_sample(&item, received, received_ns) else {
                continue;
            };
            if !woke_reader && let Some(e) = early.get() {
                woke_reader = e.on_record(&wake.hint, received_ns);
            }
            if !super::deliver(&tx, wake) {
                return;
            }
        }
        guard.clear_ready();
    }
}

/// Decodes one ring-buffer sample; `None` for a short sample or an unknown hook id.
pub fn wake_from_sample(sample: &[u8], received: Instant, received_ns: u64) -> Option<Wake> {
    let rec = WakeRecord::from_bytes(sample)?;
    let hook = Hook::from_u32(rec.hook)?;
    let hint = match rec.hint_kind() {
        Some(HintKind::Name) => {
            let end = rec.hint.iter().position(|&b| b == 0).unwrap_or(rec.hint.len());
            match std::str::from_utf8(&rec.hint[..end]) {
                Ok(s) if !s.is_empty() => Hint::Name(s.to_owned()),
                _ => Hint::None,
            }
        }
        Some(HintKind::Ifindex) => {
            Hint::Ifindex(u32::from_ne_bytes([rec.hint[0], rec.hint[1], rec.hint[2], rec.hint[3]]))
        }
        Some(HintKind::None) | None => Hint::None,
    };
    Some(Wake { hook, kernel_ts_ns: Some(rec.ts_ns), hint, removed: false, received, received_ns })
}

/// What the running kernel offers for attaching, read once.
struct KernelFacts {
    /// kprobes exist: the `kprobe` perf PMU or tracefs `kprobe_events`.
    kprobes: bool,
    /// `/proc/kallsyms`: function name → module (`None` for vmlinux), for the functions
    /// this module probes. Empty when unreadable.
    symbols: HashMap<String, Option<String>>,
    kallsyms_readable: bool,
}

impl KernelFacts {
    fn read(tracefs: Option<&Path>) -> Self {
        let kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists()
            || tracefs.is_some_and(|t| t.join("kprobe_events").exists());
        let wanted: Vec<&str> = ATTACH
            .iter()
            .filter_map(|a| match a.target {
                Target::Function { name, .. } => Some(name),
                Target::Tracepoint { .. } => None,
            })
            .collect();
        // Streamed: the file is ~5 MB on a distribution kernel.
        let symbols =
            std::fs::File::open("/proc/kallsyms").and_then(|f| parse_kallsyms(io::BufReader::new(f), &wanted));
        let kallsyms_readable = symbols.is_ok();
        let symbols = symbols.unwrap_or_default();
        Self { kprobes, symbols, kallsyms_readable }
    }
}

/// Picks the `wanted` function symbols out of `/proc/kallsyms` text
/// (`<addr> <type> <name>[\t[<module>]]`), read line by line.
fn parse_kallsyms(mut text: impl io::BufRead, wanted: &[&str]) -> io::Result<HashMap<String, Option<String>>> {
    let mut found = HashMap::new();
    let mut line = String::new();
    loop {
        line.clear();
        if text.read_line(&mut line)? == 0 {
            break;
        }
        let mut parts = line.split_whitespace();
        let (Some(_addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if !matches!(kind, "t" | "T") || !wanted.contains(&name) {
            continue;
        }
        let module = parts.next().map(|m| m.trim_start_matches('[').trim_end_matches(']').to_owned());
        found.insert(name.to_owned(), module);
    }
    Ok(found)
}

fn attach(
    ebpf: &mut Ebpf,
    a: &Attach,
    btf: &Result<Btf, AttachError>,
    tracefs: &Result<PathBuf, tracefs::TracefsError>,
    facts: &KernelFacts,
) -> HookStatus {
    let status = match a.target {
        Target::Function { name, fentry, kprobe, module } => {
            attach_function(ebpf, name, fentry, kprobe, module, btf, facts)
        }
        Target::Tracepoint { system, event, program, module, .. } => {
            attach_tracepoint(ebpf, system, event, program, module, tracefs)
        }
    };
    let status = match status {
        Ok((via, refused)) => {
            let reason = (!refused.is_empty()).then(|| reasons(&refused));
            HookStatus { hook: a.hook, attached: true, via: Some(via), reason }
        }
        Err(errors) => HookStatus { hook: a.hook, attached: false, via: None, reason: Some(reasons(&errors)) },
    };
    match status.attached {
        true => tracing::debug!(hook = a.hook.name(), "{status}"),
        false => tracing::info!(hook = a.hook.name(), "{status}"),
    }
    status
}

/// The BTF the fentry programs attach against: the kernel's ids of their target functions
/// only (see [`super::btf`]); or why there is none, which every fentry hook then reports.
fn fentry_btf() -> Result<Btf, AttachError> {
    let names: Vec<&str> = ATTACH
        .iter()
        .filter_map(|a| match a.target {
            Target::Function { name, fentry: Some(_), .. } => Some(name),
            _ => None,
        })
        .collect();
    let ids = std::fs::File::open(VMLINUX_BTF)
        .map_err(|e| format!("cannot read {VMLINUX_BTF}: {e}"))
        .and_then(|f| super::btf::func_ids(f, &names).map_err(|e| format!("{VMLINUX_BTF}: {e}")))
        .map_err(|e| {
            tracing::info!("fentry unavailable: {e}");
            AttachError::NoBtf(e)
        })?;
    // The stand-in costs 72 bytes per kernel type below the largest id (~7 MiB on a
    // distribution kernel): not built where the kernel refuses fentry programs outright.
    if let Some(&id) = ids.values().min() {
        fentry_refused(id)?;
    }
    super::btf::stand_in(&ids).map_err(|e| AttachError::NoBtf(e.to_string()))
}

/// [`AttachError::FentryRefused`] when the kernel refuses, with `EPERM`, a two-instruction
/// fentry program on the kernel function with BTF id `btf_id` (kernel lockdown, an LSM
/// policy, a missing capability: every fentry program would be refused the same way).
/// Any other answer, success included, is `Ok`: the real programs then find out for
/// themselves.
fn fentry_refused(btf_id: u32) -> Result<(), AttachError> {
    use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type};
    // r0 = 0; exit (an fentry program must return 0).
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    // SAFETY: bpf_attr is plain data; all zero is its documented "unset" state.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writes to the BPF_PROG_LOAD member of the zeroed union.
    unsafe {
        let load = &mut attr.__bindgen_anon_3;
        load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
        load.expected_attach_type = bpf_attach_type::BPF_TRACE_FENTRY as u32;
        load.insn_cnt = insns.len() as u32;
        load.insns = insns.as_ptr() as u64;
        load.license = license.as_ptr() as u64;
        load.attach_btf_id = btf_id;
    }
    // SAFETY: attr is a valid BPF_PROG_LOAD attribute whose pointers outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_PROG_LOAD as libc::c_long,
            &attr as *const bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) });
        return Ok(());
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EPERM) => Err(AttachError::FentryRefused),
        _ => Ok(()),
    }
}

/// `Ok((mechanism, why the preferred mechanisms were refused))` or `Err(every reason)`.
fn attach_function(
    ebpf: &mut Ebpf,
    name: &str,
    fentry: Option<&str>,
    kprobe: &str,
    module: Option<&str>,
    btf: &Result<Btf, AttachError>,
    facts: &KernelFacts,
) -> Result<(Mechanism, Vec<AttachError>), Vec<AttachError>> {
    let mut refused = Vec::new();
    if let Some(prog) = fentry {
        match try_fentry(ebpf, prog, name, btf) {
            Ok(()) => return Ok((Mechanism::Fentry, Vec::new())),
            Err(e) => refused.push(e),
        }
    }
    let kprobe_result = if !facts.kprobes {
        Err(AttachError::NoKprobes)
    } else if facts.kallsyms_readable && !facts.symbols.contains_key(name) {
        Err(AttachError::NotInKallsyms { function: name.to_string(), module: module.map(str::to_string) })
    } else {
        try_kprobe(ebpf, kprobe, name)
    };
    match kprobe_result {
        Ok(()) => Ok((Mechanism::Kprobe, refused)),
        Err(e) => {
            refused.push(e);
            Err(refused)
        }
    }
}

fn try_fentry(ebpf: &mut Ebpf, prog: &str, function: &str, btf: &Result<Btf, AttachError>) -> Result<(), AttachError> {
    let btf = btf.as_ref().map_err(AttachError::clone)?;
    let p: &mut FEntry = program(ebpf, prog)?.try_into().map_err(|e| program_type("fentry", prog, e))?;
    p.load(function, btf).map_err(|e| describe("fentry", "refused", &e))?;
    p.attach().map_err(|e| describe("fentry", "attach failed", &e))?;
    Ok(())
}

fn try_kprobe(ebpf: &mut Ebpf, prog: &str, function: &str) -> Result<(), AttachError> {
    let p: &mut KProbe = program(ebpf, prog)?.try_into().map_err(|e| program_type("kprobe", prog, e))?;
    p.load().map_err(|e| describe("kprobe", "refused", &e))?;
    p.attach(function, 0).map_err(|e| describe("kprobe", "attach failed", &e))?;
    Ok(())
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    system: &str,
    event: &str,
    prog: &str,
    module: Option<&str>,
    tracefs: &Result<PathBuf, tracefs::TracefsError>,
) -> Result<(Mechanism, Vec<AttachError>), Vec<AttachError>> {
    let named = || (system.to_string(), event.to_string());
    let tfs = tracefs.as_ref().map_err(|why| {
        let (system, event) = named();
        vec![AttachError::NoTracefs { system, event, why: why.to_string() }]
    })?;
    if !tracefs::event_dir(tfs, system, event).is_dir() {
        let (system, event) = named();
        return Err(vec![AttachError::NoTracepoint { system, event, module: module.map(str::to_string) }]);
    }
    let attached = (|| {
        let p: &mut TracePoint = program(ebpf, prog)?.try_into().map_err(|e| program_type("tracepoint", prog, e))?;
        p.load().map_err(|e| describe("tracepoint", "refused", &e))?;
        p.attach(system, event).map_err(|e| describe("tracepoint", "attach failed", &e))?;
        Ok(())
    })();
    attached.map(|()| (Mechanism::Tracepoint, Vec::new())).map_err(|e| vec![e])
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program, AttachError> {
    ebpf.program_mut(name).ok_or_else(|| AttachError::MissingProgram(name.to_string()))
}

/// The object's program `prog` is not a `mechanism` program.
fn program_type(mechanism: &'static str, prog: &str, e: ProgramError) -> AttachError {
    AttachError::ProgramType { mechanism, program: prog.to_string(), why: e.to_string() }
}

/// "fentry refused: EPERM", with the verifier's first line when it said something.
fn describe(mechanism: &'static str, step: &'static str, e: &ProgramError) -> AttachError {
    let answer = match e {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            let first = log.lines().map(str::trim).find(|l| !l.is_empty());
            match first {
                Some(l) => format!("{} ({l})", errno_name(io_error)),
                None => errno_name(io_error),
            }
        }
        ProgramError::SyscallError(s) => format!("{} in {}", errno_name(&s.io_error), s.call),
        other => other.to_string(),
    };
    AttachError::Syscall { mechanism, step, answer }
}

/// The errno's symbolic name when it is one the BPF syscalls commonly return.
fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::E2BIG) => "E2BIG",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::ENOSPC) => "ENOSPC",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::ESRCH) => "ESRCH",
        Some(524) => "ENOTSUPP",
        _ => return e.to_string(),
    };
    name.to_string()
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones ignore it.
fn raise_memlock_limit() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid pointer to a rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "cannot raise RLIMIT_MEMLOCK");
    }
}

/// Forwards aya-log records (kernel programs built with the `log` feature) to `tracing`.
struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let msg = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "nicmon::ebpf", "{msg}"),
            log::Level::Warn => tracing::warn!(target: "nicmon::ebpf", "{msg}"),
            log::Level::Info => tracing::info!(target: "nicmon::ebpf", "{msg}"),
            log::Level::Debug => tracing::debug!(target: "nicmon::ebpf", "{msg}"),
            log::Level::Trace => tracing::trace!(target: "nicmon::ebpf", "{msg}"),
        }
    }

    fn flush(&self) {}
}

async fn drive_logger(mut fd: AsyncFd<aya_log::EbpfLogger<TracingLog>>) {
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons a hook's status gives, as people and tests read them.
    #[test]
    fn attach_errors_say_the_step_what_it_named_and_the_answer() {
        let named = |s: &str| s.to_string();
        let cases = [
            (
                AttachError::NoBtf(named("cannot read /sys/kernel/btf/vmlinux: x")),
                "fentry unavailable: cannot read /sys/kernel/btf/vmlinux: x",
            ),
            (AttachError::FentryRefused, "fentry refused: EPERM"),
            (
                AttachError::NotInKallsyms { function: named("f"), module: Some(named("mlx5_core")) },
                "kprobe: f not in /proc/kallsyms (module mlx5_core not loaded)",
            ),
            (
                AttachError::NotInKallsyms { function: named("f"), module: None },
                "kprobe: f not in /proc/kallsyms (not in this kernel, or inlined)",
            ),
            (
                AttachError::NoTracefs { system: named("mlx5"), event: named("e"), why: named("no tracefs") },
                "tracepoint mlx5:e: no tracefs",
            ),
            (
                AttachError::NoTracepoint {
                    system: named("mlx5"),
                    event: named("e"),
                    module: Some(named("mlx5_core")),
                },
                "tracepoint mlx5:e not present (module mlx5_core not loaded)",
            ),
            (
                AttachError::NoTracepoint { system: named("net"), event: named("e"), module: None },
                "tracepoint net:e not present in this kernel",
            ),
            (
                AttachError::Syscall {
                    mechanism: "kprobe",
                    step: "attach failed",
                    answer: named("EBUSY in perf_event_open"),
                },
                "kprobe attach failed: EBUSY in perf_event_open",
            ),
        ];
        for (e, text) in cases {
            assert_eq!(e.to_string(), text);
        }
        assert_eq!(
            reasons(&[AttachError::FentryRefused, AttachError::NoKprobes]),
            "fentry refused: EPERM; kprobes unavailable: CONFIG_KPROBES off (no kprobe PMU, no kprobe_events)"
        );
    }

    #[test]
    fn every_kernel_hook_has_an_attach_point() {
        for h in Hook::ALL {
            let n = ATTACH.iter().filter(|a| a.hook == h).count();
            assert_eq!(n, usize::from(!h.is_userspace()), "{h:?}");
        }
    }

    #[test]
    fn sample_decodes_to_a_wake() {
        let mut rec = WakeRecord::new(Hook::QdiscReset, 42);
        rec.flags = HintKind::Name as u32;
        rec.hint[..5].copy_from_slice(b"veth0");
        let now = Instant::now();
        let w = wake_from_sample(&rec.to_bytes(), now, 50).unwrap();
        assert_eq!(w.hook, Hook::QdiscReset);
        assert_eq!(w.kernel_ts_ns, Some(42));
        assert_eq!(w.hint, Hint::Name("veth0".into()));
        assert_eq!(w.delivery_latency_ns(), Some(8));

        let mut rec = WakeRecord::new(Hook::AerEvent, 1);
        rec.flags = HintKind::Ifindex as u32;
        rec.hint[..4].copy_from_slice(&7u32.to_ne_bytes());
        assert_eq!(wake_from_sample(&rec.to_bytes(), now, 1).unwrap().hint, Hint::Ifindex(7));
    }

    #[test]
    fn bad_samples_are_dropped() {
        let now = Instant::now();
        assert_eq!(wake_from_sample(&[0u8; 8], now, 0), None);
        let mut rec = WakeRecord::new(Hook::QdiscReset, 1);
        rec.hook = 77;
        assert_eq!(wake_from_sample(&rec.to_bytes(), now, 0), None);
        let mut rec = WakeRecord::new(Hook::QdiscReset, 1);
        rec.flags = HintKind::Name as u32;
        rec.hint = [0xff; 16];
        assert_eq!(wake_from_sample(&rec.to_bytes(), now, 0).unwrap().hint, Hint::None);
    }

    #[test]
    fn the_open_filter_holds_on_its_own_thread_only() {
        let filtered = std::thread::spawn(|| {
            deny_open_on_this_thread().map(|()| std::fs::File::open("/proc/self/status").map(drop))
        })
        .join()
        .unwrap();
        match filtered {
            Err(e) => eprintln!("SKIP: seccomp filter refused here: {e}"),
            Ok(open) => assert_eq!(open.unwrap_err().kind(), io::ErrorKind::NotFound),
        }
        std::fs::File::open("/proc/self/status").expect("this thread opens files as before");
    }

    #[test]
    fn the_loader_holds_no_kernel_btf() {
        let loader = format!("{:?}", loader_without_kernel_btf());
        let has_kernel_btf = std::fs::metadata("/sys/kernel/btf/vmlinux").is_ok();
        if has_kernel_btf && deny_open_on_this_thread_works() {
            assert!(loader.contains("btf: None"), "{}", &loader[..loader.len().min(300)]);
        } else {
            eprintln!("SKIP: no kernel BTF or no seccomp here");
        }
    }

    fn deny_open_on_this_thread_works() -> bool {
        std::thread::spawn(|| deny_open_on_this_thread().is_ok()).join().unwrap()
    }

    /// The probe that spares the stand-in BTF says "refused" exactly when aya's real load of
    /// an fentry program on the same function is refused the same way.
    #[test]
    fn the_fentry_probe_agrees_with_a_real_fentry_load() {
        let (Some(object), Ok(f)) = (crate::read::wake::EMBEDDED_OBJECT, std::fs::File::open(VMLINUX_BTF)) else {
            eprintln!("SKIP: no embedded eBPF object or no kernel BTF");
            return;
        };
        let ids = crate::read::wake::btf::func_ids(f, &["netif_carrier_off"]).unwrap();
        let Some(&id) = ids.get("netif_carrier_off") else {
            eprintln!("SKIP: netif_carrier_off not in this kernel's BTF");
            return;
        };
        let mut ebpf = match loader_without_kernel_btf().btf(None).load(object) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("SKIP: the eBPF object cannot be loaded here: {e}");
                return;
            }
        };
        let probe = fentry_refused(id).map_err(|e| e.to_string());
        let btf = crate::read::wake::btf::stand_in(&ids).map_err(|e| AttachError::NoBtf(e.to_string()));
        let real =
            try_fentry(&mut ebpf, "fentry_netif_carrier_off", "netif_carrier_off", &btf).map_err(|e| e.to_string());
        match probe {
            Err(reason) => assert_eq!(real, Err(reason)),
            Ok(()) => assert_ne!(real, Err("fentry refused: EPERM".to_string())),
        }
    }

    /// A veth pair deleted on drop (through its peer, whose name never changes).
    struct VethPair {
        a: String,
        b: String,
    }

    impl VethPair {
        fn create(tag: &str) -> Result<VethPair, String> {
            let (a, b) = (format!("{tag}a"), format!("{tag}b"));
            let _ =
                std::process::Command::new("ip").args(["link", "del", &b]).stderr(std::process::Stdio::null()).status();
            let ok = std::process::Command::new("ip")
                .args(["link", "add", &a, "type", "veth", "peer", "name", &b])
                .status()
                .map_err(|e| format!("ip: {e}"))?;
            if !ok.success() {
                return Err(format!("ip link add {a} type veth peer name {b}: {ok}"));
            }
            Ok(VethPair { a, b })
        }

        /// Run `commands` through one `ip -batch` and wait for it.
        fn batch(&self, commands: &str) -> Result<(), String> {
            use std::io::Write;
            let mut child = std::process::Command::new("ip")
                .args(["-force", "-batch", "-"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("ip -batch: {e}"))?;
            child.stdin.take().ok_or("no stdin")?.write_all(commands.as_bytes()).map_err(|e| e.to_string())?;
            let status = child.wait().map_err(|e| e.to_string())?;
            if status.success() { Ok(()) } else { Err(format!("ip -batch: {status}")) }
        }
    }

    impl Drop for VethPair {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["link", "del", &self.b]).status();
        }
    }

    /// The kernel programs count what they cannot queue. Loaded with a 4 KiB ring buffer
    /// (about 100 records) that nothing drains (the drain task runs on this test's
    /// single-threaded runtime, which is never yielded to), the count reads 0; then a veth
    /// taken down 300 times under 300 names (each down resets its qdisc: a `qdisc_reset`
    /// record whose hint, the name, is new every time, so the in-kernel rate limit passes
    /// each one) overflows the buffer, and the count reads what was dropped.
    #[tokio::test]
    async fn the_kernel_programs_count_the_records_a_full_ring_buffer_drops() {
        let Some(object) = crate::read::wake::EMBEDDED_OBJECT else {
            eprintln!("SKIP: no embedded eBPF object (cargo xtask build-ebpf)");
            return;
        };
        let (tx, _rx) = mpsc::channel(crate::read::wake::CHANNEL_CAPACITY);
        let mut wakes =
            match EbpfWakes::load_with_ring(object, tracefs::locate(false), tx, Some(4096), Default::default()) {
                Ok(w) => w,
                Err(e) => {
                    eprintln!("SKIP: the eBPF object cannot be loaded here: {e}");
                    return;
                }
            };
        assert_eq!(wakes.lost_records(), Some(0), "hooks: {:?}", wakes.hooks());

        let qdisc_reset = wakes.hooks().iter().any(|h| h.hook == Hook::QdiscReset && h.attached);
        match (qdisc_reset, VethPair::create(&format!("nml{}", std::process::id() % 100000))) {
            (false, _) => eprintln!("SKIP overflow: qdisc_reset not attached here"),
            (_, Err(e)) => eprintln!("SKIP overflow: cannot create a veth pair here ({e})"),
            (true, Ok(veth)) => {
                const DOWNS: usize = 300;
                let mut cmds = format!("link set dev {} up\nlink set dev {} up\n", veth.b, veth.a);
                let mut name = veth.a.clone();
                for i in 0..DOWNS {
                    let next = format!("{}{i}", veth.b);
                    cmds.push_str(&format!("link set dev {name} down\nlink set dev {name} name {next}\n"));
                    cmds.push_str(&format!("link set dev {next} up\n"));
                    name = next;
                }
                cmds.push_str(&format!("link set dev {name} down\nlink set dev {name} name {}\n", veth.a));
                veth.batch(&cmds).unwrap();
                let lost = wakes.lost_records().unwrap();
                eprintln!("{DOWNS} veth downs into a 4 KiB ring buffer nobody drains: {lost} records lost");
                // At most ~100 records fit; at least one per down was emitted.
                assert!(lost >= (DOWNS - 110) as u64, "lost {lost} of at least {DOWNS} records");
            }
        }

        // Every CPU's slot counts: set each to a different value, read back the sum.
        let cpus = aya::util::nr_cpus().unwrap();
        let values: Vec<u64> = (1..=cpus as u64).collect();
        let map = wakes.lost.as_mut().expect("the object has the map");
        map.set(0, aya::maps::PerCpuValues::try_from(values.clone()).unwrap(), 0).unwrap();
        assert_eq!(wakes.lost_records(), Some(values.iter().sum()));
    }

    #[test]
    fn kallsyms_lines_give_function_and_module() {
        let text = "ffffffff81000000 T netif_carrier_off\n\
                    0000000000000000 t ib_dispatch_event\t[ib_core]\n\
                    ffffffff81000010 D netif_carrier_on\n\
                    ffffffff81000020 T unrelated\n";
        let s =
            parse_kallsyms(text.as_bytes(), &["netif_carrier_off", "ib_dispatch_event", "netif_carrier_on"]).unwrap();
        assert_eq!(s.get("netif_carrier_off"), Some(&None));
        assert_eq!(s.get("ib_dispatch_event"), Some(&Some("ib_core".into())));
        assert!(!s.contains_key("netif_carrier_on"), "data symbol");
        assert!(!s.contains_key("unrelated"));
    }
}
