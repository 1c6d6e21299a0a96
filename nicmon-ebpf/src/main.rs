//! nicmon's kernel programs: one small program per attach point (SPEC §1.8). Each one
//! records a [`WakeRecord`] (hook id, `bpf_ktime_get_ns`, optional hint) into the one
//! ring buffer and wakes the agent — nothing else. The agent decides which of them load
//! and attach on the running kernel.
//!
//! No kernel struct offset is compiled in (Rust eBPF has no CO-RE): the only data read
//! is a tracepoint record string field, at the offset the agent found in the tracepoint's
//! `format` file and wrote into [`HINT_LOC`] before loading.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{fentry, kprobe, map, tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use nicmon_common::{HOOK_SLOTS, HintKind, Hook, WakeRecord};

/// The one ring buffer: 64 KiB is 2,000 pending records; a full buffer drops wake-ups,
/// which is harmless (the 1 s poll runs regardless) and counted in [`WAKES_LOST`].
#[map]
static WAKES: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Wake records lost because [`WAKES`] was full (the agent behind by 64 KiB of records),
/// one slot per CPU: the agent reads and sums them. A lost record is harmless for
/// correctness (the 1 s full poll runs regardless); the count says it happened.
#[map]
static WAKES_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Per wake-up key (the hook and its hint: a netdev, an RDMA or a PCI device), when a
/// record was last emitted. A record within [`RATE_WINDOW_NS`] of the previous one of the
/// same key is dropped: a flapping link or a tracepoint hit thousands of times a second
/// wakes the agent at most 1 s / window times a second per key. The first record of a
/// burst always passes (no added latency); the agent polls once more a window after each
/// wake-driven poll (the trailing edge), so the last change of a burst is never missed.
#[map]
static LAST_EMIT: LruHashMap<RateKey, u64> = LruHashMap::with_max_entries(1024, 0);

/// The rate limit's window (the agent's trailing poll waits at least as long:
/// `nicmon_common::RATE_WINDOW_NS`).
const RATE_WINDOW_NS: u64 = nicmon_common::RATE_WINDOW_NS;

/// [`LAST_EMIT`]'s key: the hook id and the hint bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RateKey {
    hook: u32,
    hint: [u8; nicmon_common::HINT_LEN],
}

/// Per hook slot ([`Hook::slot`]): offset in the tracepoint record of the
/// `__data_loc char[]` field to copy as the hint; 0 = send no hint. Written by the agent
/// at load time from `/sys/kernel/tracing/events/<system>/<event>/format`.
#[unsafe(no_mangle)]
static HINT_LOC: [u32; HOOK_SLOTS] = [0; HOOK_SLOTS];

/// The agent's own process (tgid), written by the agent at load time; 0 = unknown. A
/// firmware command that fails while the agent reads a counter fires `mlx5:mlx5_cmd` in the
/// agent's context: that record would wake the agent to read again, so it is dropped here.
#[unsafe(no_mangle)]
static SELF_TGID: u32 = 0;

/// Upper bound of a sane `__data_loc` offset: records are small.
const MAX_DATA_OFFSET: usize = 4096;

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn push<C: EbpfContext>(_ctx: &C, rec: &WakeRecord) -> u32 {
    #[cfg(feature = "log")]
    aya_log_ebpf::info!(_ctx, "nicmon wake: hook {}", rec.hook);
    let key = RateKey { hook: rec.hook, hint: rec.hint };
    // SAFETY: the value is a plain u64 read once; a concurrent update is harmless here.
    if let Some(last) = unsafe { LAST_EMIT.get(key) }
        && rec.ts_ns.wrapping_sub(*last) < RATE_WINDOW_NS
    {
        return 0;
    }
    let _ = LAST_EMIT.insert(key, rec.ts_ns, 0);
    // Force the wake-up: records are rare (rate-limited above) and latency is the point.
    if WAKES.output::<WakeRecord>(rec, BPF_RB_FORCE_WAKEUP as u64).is_err()
        && let Some(lost) = WAKES_LOST.get_ptr_mut(0)
    {
        // SAFETY: this CPU's slot of our own map; a program is not migrated while it runs.
        unsafe { *lost = (*lost).wrapping_add(1) };
    }
    0
}

#[inline(always)]
fn wake<C: EbpfContext>(ctx: &C, hook: Hook) -> u32 {
    push(ctx, &WakeRecord::new(hook, now_ns()))
}

#[inline(always)]
fn wake_tracepoint(ctx: &TracePointContext, hook: Hook) -> u32 {
    let mut rec = WakeRecord::new(hook, now_ns());
    let slot = hook as usize;
    if slot < HOOK_SLOTS {
        // SAFETY: reading our own read-only global.
        let field = unsafe { core::ptr::read_volatile(&HINT_LOC[slot]) } as usize;
        if field != 0 && field < MAX_DATA_OFFSET {
            // __data_loc: low 16 bits = offset of the string from the record start,
            // high 16 bits = its length (with the NUL).
            // SAFETY: bpf_probe_read_kernel of 4 bytes inside the record.
            if let Ok(loc) = unsafe { ctx.read_at::<u32>(field) } {
                let data = (loc & 0xffff) as usize;
                if data != 0 && data < MAX_DATA_OFFSET {
                    // SAFETY: bpf_probe_read_kernel_str into a fixed stack buffer; it
                    // NUL-terminates and never writes past the buffer.
                    let src = unsafe { (ctx.as_ptr() as *const u8).add(data) };
                    if unsafe { bpf_probe_read_kernel_str_bytes(src, &mut rec.hint) }.is_ok() {
                        rec.flags = HintKind::Name as u32;
                    } else {
                        rec.hint = [0; nicmon_common::HINT_LEN];
                    }
                }
            }
        }
    }
    push(ctx, &rec)
}

// --- netdev carrier: fentry (preferred) and kprobe variants of the same hooks ---

#[fentry]
pub fn fentry_netif_carrier_off(ctx: FEntryContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierOff)
}

#[fentry]
pub fn fentry_netif_carrier_on(ctx: FEntryContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierOn)
}

#[fentry]
pub fn fentry_netif_carrier_event(ctx: FEntryContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierEvent)
}

#[fentry]
pub fn fentry_linkwatch_fire_event(ctx: FEntryContext) -> u32 {
    wake(&ctx, Hook::LinkwatchFireEvent)
}

#[kprobe]
pub fn kprobe_netif_carrier_off(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierOff)
}

#[kprobe]
pub fn kprobe_netif_carrier_on(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierOn)
}

#[kprobe]
pub fn kprobe_netif_carrier_event(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::NetifCarrierEvent)
}

#[kprobe]
pub fn kprobe_linkwatch_fire_event(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::LinkwatchFireEvent)
}

// --- RDMA port events: kprobes into ib_core (module code: no fentry with aya) ---

#[kprobe]
pub fn kprobe_ib_dispatch_event(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::IbDispatchEvent)
}

#[kprobe]
pub fn kprobe_ib_dispatch_event_clients(ctx: ProbeContext) -> u32 {
    wake(&ctx, Hook::IbDispatchEventClients)
}

// --- tracepoints ---

#[tracepoint]
pub fn tp_qdisc_reset(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::QdiscReset)
}

#[tracepoint]
pub fn tp_devlink_health_report(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::DevlinkHealthReport)
}

#[tracepoint]
pub fn tp_devlink_health_reporter_state_update(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::DevlinkHealthReporterStateUpdate)
}

#[tracepoint]
pub fn tp_devlink_hwerr(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::DevlinkHwerr)
}

/// Whether the current task belongs to the agent. Only for hooks that run in the context of
/// the task that caused them (a firmware command is issued by its caller): an interrupt
/// that happens to land while the agent runs carries the agent's tgid too, so hooks that
/// can fire from interrupt context (carrier, qdisc) never use this.
#[inline(always)]
fn from_self() -> bool {
    // SAFETY: reading our own read-only global.
    let own = unsafe { core::ptr::read_volatile(&SELF_TGID) };
    own != 0 && (bpf_get_current_pid_tgid() >> 32) as u32 == own
}

#[tracepoint]
pub fn tp_mlx5_cmd(ctx: TracePointContext) -> u32 {
    if from_self() {
        return 0;
    }
    wake_tracepoint(&ctx, Hook::Mlx5Cmd)
}

#[tracepoint]
pub fn tp_mlx5_fw(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::Mlx5Fw)
}

#[tracepoint]
pub fn tp_net_dev_xmit_timeout(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::NetDevXmitTimeout)
}

#[tracepoint]
pub fn tp_aer_event(ctx: TracePointContext) -> u32 {
    wake_tracepoint(&ctx, Hook::AerEvent)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible: the tracing helpers used above are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
