//! kobject uevent listener (`NETLINK_KOBJECT_UEVENT`, SPEC §1.15): the kernel's own word
//! that an RDMA device, a netdev or a PCI function was added or removed. Each `add` or
//! `remove` of the `infiniband`, `net` and `pci` subsystems wakes the agent with a hint (the
//! device name, the interface name or the PCI address); a `remove` is flagged, so the
//! decider may report a device's loss in the poll that confirms it instead of after three.
//! An `add`, `remove` or `move` of an InfiniBand character device (`infiniband_verbs`,
//! `infiniband_mad`: `uverbsN`, `umadN`, `issmN`) wakes it without a hint: a sign that their
//! class directories' listings moved (`read::host::walks`), polled by a full poll.
use super::{Hint, Wake};
use nicmon_common::Hook;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The kernel's multicast group of `NETLINK_KOBJECT_UEVENT` (udev re-broadcasts on 2).
const KERNEL_GROUP: u32 = 1;

/// A netlink socket subscribed to the kernel's uevents.
pub struct UeventSocket {
    fd: OwnedFd,
}

impl AsRawFd for UeventSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl UeventSocket {
    /// Opens a non-blocking `NETLINK_KOBJECT_UEVENT` socket bound to the kernel's group.
    pub fn open() -> io::Result<Self> {
        let fd = super::nlsock::open(libc::SOCK_DGRAM, libc::NETLINK_KOBJECT_UEVENT, KERNEL_GROUP)?;
        Ok(Self { fd })
    }
}

/// `add` or `remove`: the only actions kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Add,
    Remove,
    Move,
}

/// The subsystems kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsystem {
    Infiniband,
    Net,
    Pci,
    /// `infiniband_verbs` or `infiniband_mad`: a character device's class entry.
    CharClass,
}

/// One uevent, as far as the wake-up path cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uevent {
    pub action: Action,
    pub subsystem: Subsystem,
    /// The RDMA device name (`mlx5_3`), the interface name or the PCI address.
    pub name: String,
}

/// Parses one kernel uevent datagram (`ACTION@DEVPATH\0KEY=VALUE\0...`). `None` for
/// anything else: another action or subsystem, a udev (`libudev`) message, a malformed
/// one, or one without the key that names the object.
pub fn parse_uevent(buf: &[u8]) -> Option<Uevent> {
    let mut fields = buf.split(|&b| b == 0).filter(|f| !f.is_empty());
    let header = fields.next()?;
    if !header.contains(&b'@') {
        return None;
    }
    let (mut action, mut devpath, mut subsystem, mut interface, mut slot) = (None, None, None, None, None);
    for field in fields {
        let Some(eq) = field.iter().position(|&b| b == b'=') else { continue };
        let Ok(value) = std::str::from_utf8(&field[eq + 1..]) else { continue };
        match &field[..eq] {
            b"ACTION" => action = Some(value),
            b"DEVPATH" => devpath = Some(value),
            b"SUBSYSTEM" => subsystem = Some(value),
            b"INTERFACE" => interface = Some(value),
            b"PCI_SLOT_NAME" => slot = Some(value),
            _ => {}
        }
    }
    let action = match action? {
        "add" => Action::Add,
        "remove" => Action::Remove,
        // A rename (an RDMA device or netdev renamed by udev): the new name is the hint.
        "move" => Action::Move,
        _ => return None,
    };
    let (subsystem, name) = match subsystem? {
        "infiniband" => (Subsystem::Infiniband, devpath?.rsplit('/').next()?),
        "net" => (Subsystem::Net, interface?),
        "pci" => (Subsystem::Pci, slot?),
        "infiniband_verbs" | "infiniband_mad" => (Subsystem::CharClass, devpath?.rsplit('/').next()?),
        _ => return None,
    };
    let name = name.trim();
    if name.is_empty() || name.len() > 255 {
        return None;
    }
    Some(Uevent { action, subsystem, name: name.to_string() })
}

impl Uevent {
    fn into_wake(self, received: Instant, received_ns: u64) -> Wake {
        Wake {
            hook: Hook::Uevent,
            kernel_ts_ns: None,
            // A character device's entry names no device or netdev: a sign, not a hint.
            hint: match self.subsystem {
                Subsystem::CharClass => Hint::None,
                _ => Hint::Name(self.name),
            },
            removed: self.action == Action::Remove && self.subsystem != Subsystem::CharClass,
            received,
            received_ns,
        }
    }
}

/// Spawns the listener task on the current tokio runtime; it sends a [`Wake`] per kept
/// uevent and ends when the receiver is dropped. A socket overrun (`ENOBUFS`: some uevents
/// were lost) still wakes, without a hint.
pub fn spawn(socket: UeventSocket, tx: mpsc::Sender<Wake>) -> io::Result<JoinHandle<()>> {
    super::nlsock::listen(socket.fd, tx, Hook::Uevent, "uevent listener", |buf, at, ns| {
        parse_uevent(buf).map(|event| event.into_wake(at, ns)).into_iter().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A uevent as the kernel formats it: the header, then `KEY=VALUE`, each NUL-ended.
    fn kernel_uevent(action: &str, devpath: &str, subsystem: &str, extra: &[&str]) -> Vec<u8> {
        let mut m = format!("{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0SUBSYSTEM={subsystem}\0");
        for e in extra {
            m.push_str(e);
            m.push('\0');
        }
        m.push_str("SEQNUM=4711\0");
        m.into_bytes()
    }

    #[test]
    fn net_remove_names_the_interface() {
        let m = kernel_uevent("remove", "/devices/virtual/net/veth0", "net", &["INTERFACE=veth0", "IFINDEX=7"]);
        assert_eq!(
            parse_uevent(&m),
            Some(Uevent { action: Action::Remove, subsystem: Subsystem::Net, name: "veth0".into() })
        );
    }

    #[test]
    fn infiniband_remove_names_the_device_by_its_devpath() {
        let m = kernel_uevent(
            "remove",
            "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/mlx5_0",
            "infiniband",
            &["NAME=mlx5_0"],
        );
        assert_eq!(
            parse_uevent(&m),
            Some(Uevent { action: Action::Remove, subsystem: Subsystem::Infiniband, name: "mlx5_0".into() })
        );
    }

    #[test]
    fn pci_add_and_remove_name_the_slot() {
        let extra = [
            "DRIVER=mlx5_core",
            "PCI_CLASS=20000",
            "PCI_ID=15B3:101D",
            "PCI_SUBSYS_ID=15B3:0040",
            "PCI_SLOT_NAME=0000:3b:00.0",
            "MODALIAS=pci:v000015B3d0000101Dsv000015B3sd00000040bc02sc00i00",
        ];
        let m = kernel_uevent("remove", "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "pci", &extra);
        assert_eq!(
            parse_uevent(&m),
            Some(Uevent { action: Action::Remove, subsystem: Subsystem::Pci, name: "0000:3b:00.0".into() })
        );
        let m = kernel_uevent("add", "/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", "pci", &extra);
        assert_eq!(parse_uevent(&m).map(|u| u.action), Some(Action::Add));
    }

    #[test]
    fn a_rename_names_the_new_name() {
        let m = kernel_uevent(
            "move",
            "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/ibp59s0",
            "infiniband",
            &[],
        );
        assert_eq!(
            parse_uevent(&m),
            Some(Uevent { action: Action::Move, subsystem: Subsystem::Infiniband, name: "ibp59s0".into() })
        );
    }

    /// A character device's class entry coming or going (`ib_uverbs` or `ib_umad` unloaded,
    /// a device unregistering) is a sign without a hint, never the kernel's word of a loss.
    #[test]
    fn a_character_device_entry_is_a_sign_without_a_hint() {
        let m = kernel_uevent(
            "remove",
            "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband_verbs/uverbs3",
            "infiniband_verbs",
            &["MAJOR=231", "MINOR=195", "DEVNAME=infiniband/uverbs3"],
        );
        let event = parse_uevent(&m);
        assert_eq!(
            event,
            Some(Uevent { action: Action::Remove, subsystem: Subsystem::CharClass, name: "uverbs3".into() })
        );
        let wake = event.unwrap().into_wake(Instant::now(), 1);
        assert_eq!((wake.hint, wake.removed), (Hint::None, false));
        let m = kernel_uevent(
            "add",
            "/devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband_mad/umad3",
            "infiniband_mad",
            &[],
        );
        assert_eq!(parse_uevent(&m).map(|e| e.subsystem), Some(Subsystem::CharClass));
    }

    #[test]
    fn other_actions_subsystems_and_udev_messages_are_dropped() {
        let change = kernel_uevent("change", "/devices/virtual/net/veth0", "net", &["INTERFACE=veth0"]);
        assert_eq!(parse_uevent(&change), None);
        let block = kernel_uevent("remove", "/devices/virtual/block/loop0", "block", &["DEVNAME=loop0"]);
        assert_eq!(parse_uevent(&block), None);
        let queue = kernel_uevent("add", "/devices/virtual/net/veth0/queues/rx-0", "queues", &[]);
        assert_eq!(parse_uevent(&queue), None);
        let no_ifname = kernel_uevent("remove", "/devices/virtual/net/veth0", "net", &[]);
        assert_eq!(parse_uevent(&no_ifname), None);
        let mut udev = b"libudev\0".to_vec();
        udev.extend_from_slice(b"ACTION=remove\0SUBSYSTEM=net\0INTERFACE=veth0\0");
        assert_eq!(parse_uevent(&udev), None);
        assert_eq!(parse_uevent(b""), None);
        assert_eq!(parse_uevent(b"\0\0\0"), None);
    }

    proptest! {
        /// Any bytes: never a panic; truncations of a real payload: never a panic either.
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..200) {
            let _ = parse_uevent(&bytes);
            let m = kernel_uevent("remove", "/devices/virtual/net/veth0", "net", &["INTERFACE=veth0"]);
            let _ = parse_uevent(&m[..cut.min(m.len())]);
        }
    }

    /// As root: a veth created and deleted here is announced by the kernel; its `remove`
    /// arrives as a wake-up naming it, flagged as a removal.
    #[tokio::test]
    async fn a_deleted_veth_arrives_as_a_removal_wake() {
        let socket = match UeventSocket::open() {
            Ok(s) => s,
            Err(e) => return println!("uevent socket refused ({e}): skipped"),
        };
        let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output();
        match ip(&["link", "add", "nmuev0", "type", "veth", "peer", "name", "nmuev1"]) {
            Ok(o) if o.status.success() => {}
            other => return println!("veth creation refused ({other:?}): skipped"),
        }
        let (tx, mut rx) = mpsc::channel(1024);
        let task = spawn(socket, tx).unwrap();
        let deleted = ip(&["link", "del", "nmuev0"]);
        let _ = ip(&["link", "del", "nmuev1"]);
        assert!(deleted.is_ok_and(|o| o.status.success()), "veth deletion");
        let found = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while let Some(w) = rx.recv().await {
                if w.removed && w.hint == Hint::Name("nmuev0".into()) {
                    return Some(w);
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        task.abort();
        let w = found.expect("the remove of nmuev0 as a wake-up");
        assert_eq!(w.hook, Hook::Uevent);
    }
}
