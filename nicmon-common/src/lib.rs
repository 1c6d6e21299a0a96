//! Types shared by the kernel programs (`nicmon-ebpf`) and the agent (`nicmon`).
//!
//! `#![no_std]` so the eBPF crate can use it; the `user` feature adds userspace-only
//! impls. Every record layout that crosses the ring buffer is defined here, once.
#![no_std]

/// Size of [`WakeRecord::hint`]: an interface name (`IFNAMSIZ` = 16 with its NUL) or a
/// PCI name (`0000:3b:00.0`) fits.
pub const HINT_LEN: usize = 16;

/// Number of slots in the kernel programs' per-hook globals (indexed by [`Hook`] id).
pub const HOOK_SLOTS: usize = 16;

/// What [`WakeRecord::hint`] holds; the low byte of [`WakeRecord::flags`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HintKind {
    /// No hint: the hint bytes are all zero.
    None = 0,
    /// A NUL-padded name: a netdev name or a device (PCI) name, as the hook's tracepoint
    /// record carries it.
    Name = 1,
    /// An interface index, little-endian, in the first four bytes.
    Ifindex = 2,
}

impl HintKind {
    pub const MASK: u32 = 0xff;

    pub const fn from_flags(flags: u32) -> Option<Self> {
        match flags & Self::MASK {
            0 => Some(Self::None),
            1 => Some(Self::Name),
            2 => Some(Self::Ifindex),
            _ => None,
        }
    }
}

/// One wake-up pushed by a kernel program through the ring buffer: "something about a NIC
/// may have changed, poll now". Never a verdict.
///
/// 32 bytes, 8-byte aligned, no padding: the same bytes on every target.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WakeRecord {
    /// A [`Hook`] id.
    pub hook: u32,
    /// Low byte: [`HintKind`]; the rest is reserved (zero).
    pub flags: u32,
    /// `bpf_ktime_get_ns()`: `CLOCK_MONOTONIC` in nanoseconds.
    pub ts_ns: u64,
    /// Optional hint, see [`HintKind`]; all zero when there is none.
    pub hint: [u8; HINT_LEN],
}

impl WakeRecord {
    pub const SIZE: usize = core::mem::size_of::<Self>();

    pub const fn new(hook: Hook, ts_ns: u64) -> Self {
        Self { hook: hook as u32, flags: HintKind::None as u32, ts_ns, hint: [0; HINT_LEN] }
    }

    /// The record as it crosses the ring buffer (native byte order).
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut out = [0u8; Self::SIZE];
        out[0..4].copy_from_slice(&self.hook.to_ne_bytes());
        out[4..8].copy_from_slice(&self.flags.to_ne_bytes());
        out[8..16].copy_from_slice(&self.ts_ns.to_ne_bytes());
        out[16..].copy_from_slice(&self.hint);
        out
    }

    /// Parses a ring-buffer sample; `None` when it is too short. Bytes past
    /// [`Self::SIZE`] are ignored (a newer kernel program may append fields).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < Self::SIZE {
            return None;
        }
        let mut hint = [0u8; HINT_LEN];
        hint.copy_from_slice(&bytes[16..Self::SIZE]);
        Some(Self {
            hook: u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            flags: u32::from_ne_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            ts_ns: u64::from_ne_bytes([
                bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15],
            ]),
            hint,
        })
    }

    pub fn hint_kind(&self) -> Option<HintKind> {
        HintKind::from_flags(self.flags)
    }
}

/// Every attach point of the wake-up path (SPEC §1.8), by a stable `u32` id that the
/// kernel programs write into [`WakeRecord::hook`] and a stable name used in logs and
/// metric labels. Ids are never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hook {
    /// fentry/kprobe `netif_carrier_off`.
    NetifCarrierOff = 1,
    /// fentry/kprobe `netif_carrier_on`.
    NetifCarrierOn = 2,
    /// fentry/kprobe `netif_carrier_event` (kernel 5.14+).
    NetifCarrierEvent = 3,
    /// fentry/kprobe `linkwatch_fire_event`.
    LinkwatchFireEvent = 4,
    /// Tracepoint `qdisc:qdisc_reset` (the carrier-loss path `dev_deactivate`).
    QdiscReset = 5,
    /// kprobe `ib_dispatch_event` (module `ib_core`).
    IbDispatchEvent = 6,
    /// kprobe `ib_dispatch_event_clients` (module `ib_core`).
    IbDispatchEventClients = 7,
    /// Tracepoint `devlink:devlink_health_report`.
    DevlinkHealthReport = 8,
    /// Tracepoint `devlink:devlink_health_reporter_state_update`.
    DevlinkHealthReporterStateUpdate = 9,
    /// Tracepoint `devlink:devlink_hwerr`.
    DevlinkHwerr = 10,
    /// Tracepoint `mlx5:mlx5_cmd` (module `mlx5_core`).
    Mlx5Cmd = 11,
    /// Tracepoint `mlx5:mlx5_fw` (module `mlx5_core`).
    Mlx5Fw = 12,
    /// Tracepoint `net:net_dev_xmit_timeout`.
    NetDevXmitTimeout = 13,
    /// Tracepoint `ras:aer_event`.
    AerEvent = 14,
    /// Userspace only: an rtnetlink `RTNLGRP_LINK` notification (the carrier wake source
    /// without eBPF).
    Rtnetlink = 100,
}

impl Hook {
    /// Every hook, kernel ones first, in id order.
    pub const ALL: [Hook; 15] = [
        Hook::NetifCarrierOff,
        Hook::NetifCarrierOn,
        Hook::NetifCarrierEvent,
        Hook::LinkwatchFireEvent,
        Hook::QdiscReset,
        Hook::IbDispatchEvent,
        Hook::IbDispatchEventClients,
        Hook::DevlinkHealthReport,
        Hook::DevlinkHealthReporterStateUpdate,
        Hook::DevlinkHwerr,
        Hook::Mlx5Cmd,
        Hook::Mlx5Fw,
        Hook::NetDevXmitTimeout,
        Hook::AerEvent,
        Hook::Rtnetlink,
    ];

    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Stable name (log field, metric label).
    pub const fn name(self) -> &'static str {
        match self {
            Hook::NetifCarrierOff => "netif_carrier_off",
            Hook::NetifCarrierOn => "netif_carrier_on",
            Hook::NetifCarrierEvent => "netif_carrier_event",
            Hook::LinkwatchFireEvent => "linkwatch_fire_event",
            Hook::QdiscReset => "qdisc_reset",
            Hook::IbDispatchEvent => "ib_dispatch_event",
            Hook::IbDispatchEventClients => "ib_dispatch_event_clients",
            Hook::DevlinkHealthReport => "devlink_health_report",
            Hook::DevlinkHealthReporterStateUpdate => "devlink_health_reporter_state_update",
            Hook::DevlinkHwerr => "devlink_hwerr",
            Hook::Mlx5Cmd => "mlx5_cmd",
            Hook::Mlx5Fw => "mlx5_fw",
            Hook::NetDevXmitTimeout => "net_dev_xmit_timeout",
            Hook::AerEvent => "aer_event",
            Hook::Rtnetlink => "rtnetlink",
        }
    }

    pub const fn from_u32(id: u32) -> Option<Self> {
        Some(match id {
            1 => Hook::NetifCarrierOff,
            2 => Hook::NetifCarrierOn,
            3 => Hook::NetifCarrierEvent,
            4 => Hook::LinkwatchFireEvent,
            5 => Hook::QdiscReset,
            6 => Hook::IbDispatchEvent,
            7 => Hook::IbDispatchEventClients,
            8 => Hook::DevlinkHealthReport,
            9 => Hook::DevlinkHealthReporterStateUpdate,
            10 => Hook::DevlinkHwerr,
            11 => Hook::Mlx5Cmd,
            12 => Hook::Mlx5Fw,
            13 => Hook::NetDevXmitTimeout,
            14 => Hook::AerEvent,
            100 => Hook::Rtnetlink,
            _ => return None,
        })
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// Slot of this hook in the kernel programs' per-hook globals, for the kernel hooks.
    pub const fn slot(self) -> Option<usize> {
        let id = self as u32 as usize;
        if id < HOOK_SLOTS { Some(id) } else { None }
    }
}

#[cfg(feature = "user")]
// SAFETY: `WakeRecord` is `repr(C)`, `Copy`, has no padding (asserted below) and every bit
// pattern is a valid value.
unsafe impl aya::Pod for WakeRecord {}

const _: () = assert!(WakeRecord::SIZE == 32);
const _: () = assert!(core::mem::align_of::<WakeRecord>() == 8);
const _: () = assert!(core::mem::offset_of!(WakeRecord, ts_ns) == 8);
const _: () = assert!(core::mem::offset_of!(WakeRecord, hint) == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_compact_and_aligned() {
        assert_eq!(core::mem::size_of::<WakeRecord>(), 32);
        assert_eq!(core::mem::align_of::<WakeRecord>(), 8);
        assert_eq!(core::mem::offset_of!(WakeRecord, hook), 0);
        assert_eq!(core::mem::offset_of!(WakeRecord, flags), 4);
        assert_eq!(core::mem::offset_of!(WakeRecord, ts_ns), 8);
        assert_eq!(core::mem::offset_of!(WakeRecord, hint), 16);
    }

    #[test]
    fn record_roundtrips_through_bytes() {
        let mut hint = [0u8; HINT_LEN];
        hint[..5].copy_from_slice(b"veth0");
        let rec = WakeRecord {
            hook: Hook::QdiscReset.id(),
            flags: HintKind::Name as u32,
            ts_ns: 0x0123_4567_89ab_cdef,
            hint,
        };
        let bytes = rec.to_bytes();
        assert_eq!(WakeRecord::from_bytes(&bytes), Some(rec));
        assert_eq!(rec.hint_kind(), Some(HintKind::Name));
        // The byte image is the in-memory image the kernel program writes.
        // SAFETY: WakeRecord is repr(C) without padding.
        let raw: [u8; 32] = unsafe { core::mem::transmute(rec) };
        assert_eq!(raw, bytes);
    }

    #[test]
    fn short_sample_is_rejected_and_longer_one_accepted() {
        let rec = WakeRecord::new(Hook::AerEvent, 7);
        let bytes = rec.to_bytes();
        assert_eq!(WakeRecord::from_bytes(&bytes[..31]), None);
        let mut longer = [0u8; 40];
        longer[..32].copy_from_slice(&bytes);
        assert_eq!(WakeRecord::from_bytes(&longer), Some(rec));
    }

    #[test]
    fn hook_ids_and_names_roundtrip_and_are_unique() {
        for (i, h) in Hook::ALL.iter().enumerate() {
            assert_eq!(Hook::from_u32(h.id()), Some(*h));
            assert_eq!(Hook::from_name(h.name()), Some(*h));
            for other in &Hook::ALL[i + 1..] {
                assert_ne!(h.id(), other.id());
                assert_ne!(h.name(), other.name());
            }
        }
        assert_eq!(Hook::from_u32(0), None);
        assert_eq!(Hook::from_u32(15), None);
        assert_eq!(Hook::from_name("nope"), None);
    }

    #[test]
    fn kernel_hooks_fit_the_global_slots() {
        for h in Hook::ALL {
            if h != Hook::Rtnetlink {
                assert!(h.slot().is_some(), "{h:?}");
            }
        }
        assert_eq!(Hook::Rtnetlink.slot(), None);
    }

    #[test]
    fn unknown_hint_kind_is_none() {
        assert_eq!(HintKind::from_flags(0x0000_0101), Some(HintKind::Name));
        assert_eq!(HintKind::from_flags(9), None);
    }
}
