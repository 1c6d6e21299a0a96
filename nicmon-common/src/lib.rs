//! Types shared by the kernel programs (`nicmon-ebpf`) and the agent (`nicmon`).
//!
//! `#![no_std]` so the eBPF crate can use it; the `user` feature adds userspace-only
//! impls. Every record layout that crosses the ring buffer is defined here, once.
#![no_std]

/// Size of [`WakeRecord::hint`]: an interface name (`IFNAMSIZ` = 16 with its NUL) or a
/// PCI name (`0000:3b:00.0`) fits.
pub const HINT_LEN: usize = 16;

/// The kernel programs' per-key rate limit: a wake-up record within this many ns of the
/// previous one with the same hook and hint is dropped (the agent's trailing poll follows
/// each wake-driven poll by at least this much).
pub const RATE_WINDOW_NS: u64 = 20_000_000;

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

/// Declares [`Hook`] from one table — variant, id, name — so the enum, [`Hook::ALL`],
/// [`Hook::name`] and [`Hook::from_u32`] cannot drift apart.
macro_rules! hooks {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal;)*) => {
        /// Every attach point of the wake-up path (SPEC §1.8), by a stable `u32` id that the
        /// kernel programs write into [`WakeRecord::hook`] and a stable name used in logs and
        /// metric labels. Ids are never reused.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Hook {
            $($(#[$doc])* $variant = $id,)*
        }

        impl Hook {
            /// Every hook, kernel ones first, in id order.
            pub const ALL: [Hook; [$($id),*].len()] = [$(Hook::$variant),*];

            /// Stable name (log field, metric label).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Hook::$variant => $name,)*
                }
            }

            pub const fn from_u32(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(Hook::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

hooks! {
    /// fentry/kprobe `netif_carrier_off`.
    NetifCarrierOff = 1, "netif_carrier_off";
    /// fentry/kprobe `netif_carrier_on`.
    NetifCarrierOn = 2, "netif_carrier_on";
    /// fentry/kprobe `netif_carrier_event` (kernel 5.14+).
    NetifCarrierEvent = 3, "netif_carrier_event";
    /// fentry/kprobe `linkwatch_fire_event`.
    LinkwatchFireEvent = 4, "linkwatch_fire_event";
    /// Tracepoint `qdisc:qdisc_reset` (the carrier-loss path `dev_deactivate`).
    QdiscReset = 5, "qdisc_reset";
    /// kprobe `ib_dispatch_event` (module `ib_core`).
    IbDispatchEvent = 6, "ib_dispatch_event";
    /// kprobe `ib_dispatch_event_clients` (module `ib_core`).
    IbDispatchEventClients = 7, "ib_dispatch_event_clients";
    /// Tracepoint `devlink:devlink_health_report`.
    DevlinkHealthReport = 8, "devlink_health_report";
    /// Tracepoint `devlink:devlink_health_reporter_state_update`.
    DevlinkHealthReporterStateUpdate = 9, "devlink_health_reporter_state_update";
    /// Tracepoint `devlink:devlink_hwerr`.
    DevlinkHwerr = 10, "devlink_hwerr";
    /// Tracepoint `mlx5:mlx5_cmd` (module `mlx5_core`).
    Mlx5Cmd = 11, "mlx5_cmd";
    /// Tracepoint `mlx5:mlx5_fw` (module `mlx5_core`).
    Mlx5Fw = 12, "mlx5_fw";
    /// Tracepoint `net:net_dev_xmit_timeout`.
    NetDevXmitTimeout = 13, "net_dev_xmit_timeout";
    /// Tracepoint `ras:aer_event`.
    AerEvent = 14, "aer_event";
    /// Userspace only: an rtnetlink `RTNLGRP_LINK` notification (the carrier wake source
    /// without eBPF).
    Rtnetlink = 100, "rtnetlink";
    /// Userspace only: a kobject uevent (`NETLINK_KOBJECT_UEVENT`) `add`/`remove` of an
    /// `infiniband`, `net` or `pci` device (SPEC §1.15).
    Uevent = 101, "uevent";
    /// Userspace only: an RDMA netlink monitor notification (`RDMA_NL_GROUP_NOTIFY`, 6.12+):
    /// an RDMA device registered or unregistered, a netdev attached or detached.
    RdmaMonitor = 102, "rdma_monitor";
    /// Userspace only: a devlink notification (generic netlink family `devlink`, group
    /// `config`): a health reporter's state change or recovery, an instance registered or
    /// unregistered.
    DevlinkMonitor = 103, "devlink_monitor";
}

impl Hook {
    pub const fn id(self) -> u32 {
        self as u32
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }

    /// A wake source of userspace (a netlink socket), with no kernel program behind it.
    pub const fn is_userspace(self) -> bool {
        self.slot().is_none()
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
            if !h.is_userspace() {
                assert!(h.slot().is_some(), "{h:?}");
            }
        }
        assert_eq!(Hook::Rtnetlink.slot(), None);
        assert_eq!(Hook::Uevent.slot(), None);
        assert!(Hook::Uevent.is_userspace() && Hook::Rtnetlink.is_userspace() && !Hook::AerEvent.is_userspace());
    }

    #[test]
    fn unknown_hint_kind_is_none() {
        assert_eq!(HintKind::from_flags(0x0000_0101), Some(HintKind::Name));
        assert_eq!(HintKind::from_flags(9), None);
    }
}
