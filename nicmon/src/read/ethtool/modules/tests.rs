//! The pace of module reads as a pure function of time and port state, and the reader on a
//! testbed node (L40S OCI: six RoCE PFs, `rdma0`–`rdma5`) with a stand-in probe.
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::model::ethtool::EthtoolRead;
use crate::read::ethtool::reader::{EthtoolReader, Probe};

fn look(state: PortState, carrier: bool) -> Vec<LinkLook> {
    vec![LinkLook {
        state: Some(state),
        phys_state: Some(PhysState::LinkUp),
        operstate: Some(OperState::Up),
        carrier: Some(carrier),
    }]
}

#[test]
fn a_module_is_due_when_never_read_after_the_interval_or_on_a_state_change() {
    let t0 = Instant::now();
    let interval = Duration::from_secs(60);
    let up = look(PortState::Active, true);
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert!(due(None, &up, t0, interval), "never read");
    assert!(!due(Some((t0, &up)), &up, at(59), interval), "within the interval, the same state");
    assert!(due(Some((t0, &up)), &up, at(60), interval), "the interval has passed");
    let down = look(PortState::Down, false);
    assert!(due(Some((t0, &up)), &down, at(1), interval), "the state changed: at once");
    let no_carrier = look(PortState::Active, false);
    assert!(due(Some((t0, &up)), &no_carrier, at(1), interval), "a carrier change is a change");
    assert!(!due(Some((at(5), &up)), &up, t0, interval), "a clock that went back is not due");
    assert!(due(Some((t0, &up)), &up, t0, Duration::ZERO), "no pace: every poll");
}

/// Answers `rdma0`–`rdma3` with a module (its first byte the read's number), `rdma4` "not
/// supported", `rdma5` a failed read while `broken` is set; counts the module reads.
struct Fake {
    reads: Arc<AtomicUsize>,
    broken: Arc<std::sync::atomic::AtomicBool>,
}

impl Probe for Fake {
    fn read(&mut self, netdev: &str) -> EthtoolRead {
        EthtoolRead::absent(Absent::Unsupported(netdev.into()))
    }

    fn module(&mut self, netdev: &str) -> Result<Pages, Absent> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        match netdev {
            "rdma4" => Err(Absent::Unsupported(format!("{netdev} module page 0x00: the driver does not offer it"))),
            "rdma5" if self.broken.load(Ordering::SeqCst) => {
                Err(Absent::Failed(format!("{netdev}: Input/output error")))
            }
            _ => {
                let mut p0 = vec![0u8; 256];
                p0[0] = 0x11;
                p0[255] = n as u8;
                Ok(Pages([(0, p0)].into()))
            }
        }
    }
}

struct Bench {
    discovered: Snapshot,
    source: EthtoolSource,
    reads: Arc<AtomicUsize>,
    broken: Arc<std::sync::atomic::AtomicBool>,
    t0: Instant,
}

fn bench() -> Bench {
    use nicmon_tests::platforms::Platform;
    let node = Platform::L40sOci.build();
    let host = crate::read::host::Host::new(node.sys(), node.proc());
    let discovered = crate::read::discovery::discover(&host, &crate::read::discovery::ReadPlan::default());
    let reads = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (r, b) = (reads.clone(), broken.clone());
    let probe = Arc::new(move || Box::new(Fake { reads: r.clone(), broken: b.clone() }) as Box<dyn Probe>);
    let source = EthtoolSource::Kernel(EthtoolReader::with_probe(probe));
    Bench { discovered, source, reads, broken, t0: Instant::now() }
}

/// The module's marker byte on `netdev`'s port (`None`: no module).
fn marker(snap: &Snapshot, netdev: &str) -> Option<u8> {
    let d = snap.devices.iter().find(|d| d.netdev.as_deref() == Some(netdev)).unwrap();
    d.ports[0].module.as_ref().map(|m| m.0[&0][255])
}

/// Takes `netdev`'s port down in `snap`.
fn take_down(snap: &mut Snapshot, netdev: &str) -> String {
    let d = snap.devices.iter_mut().find(|d| d.netdev.as_deref() == Some(netdev)).unwrap();
    let p = &mut Arc::make_mut(d).ports[0];
    p.state = Some(PortState::Down);
    p.carrier = Some(false);
    d.name.clone()
}

#[test]
fn modules_are_read_at_their_pace_and_at_once_on_a_state_change() {
    let b = bench();
    let r = ModuleReader::new(Duration::from_secs(60));
    let at = |s: u64| b.t0 + Duration::from_secs(s);
    let poll = |snap: &mut Snapshot, s: u64| r.read(&b.source, snap, |_| true, || Duration::from_secs(5), at(s));
    let mut snap = b.discovered.clone();
    let notes = poll(&mut snap, 0);
    assert_eq!(b.reads.load(Ordering::SeqCst), 6, "every PF's netdev once");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].starts_with("transceiver module of rdma4: not supported: "), "{notes:?}");
    assert!(notes[1].starts_with("transceiver module of rdma5: rdma5: Input/output error"), "{notes:?}");
    let first = marker(&snap, "rdma0");
    assert!(first.is_some() && marker(&snap, "rdma4").is_none() && marker(&snap, "rdma5").is_none());

    // 30 s on, nothing changed: only the failed rdma5 is asked again, the others keep theirs.
    let mut snap = b.discovered.clone();
    assert!(poll(&mut snap, 30).is_empty(), "each said once");
    assert_eq!(b.reads.load(Ordering::SeqCst), 7);
    assert_eq!(marker(&snap, "rdma0"), first);

    // rdma1's link goes down 40 s on: its module is read in that poll, no other.
    let mut snap = b.discovered.clone();
    take_down(&mut snap, "rdma1");
    b.broken.store(false, Ordering::SeqCst);
    poll(&mut snap, 40);
    assert_eq!(b.reads.load(Ordering::SeqCst), 9, "rdma1 (state change) and rdma5 (failed before)");
    assert_eq!(marker(&snap, "rdma1"), Some(8));
    assert_eq!(marker(&snap, "rdma5"), Some(9));
    assert_eq!(marker(&snap, "rdma0"), first);

    // 60 s after the first reads: the others are due, rdma4 (not supported) too, said no more.
    let mut snap = b.discovered.clone();
    take_down(&mut snap, "rdma1");
    assert!(poll(&mut snap, 60).is_empty());
    assert_eq!(b.reads.load(Ordering::SeqCst), 13, "rdma0, rdma2, rdma3, rdma4");
    assert_ne!(marker(&snap, "rdma0"), first);

    // rdma5 fails again after a good read: said again, and unknown (not its old reading).
    b.broken.store(true, Ordering::SeqCst);
    let mut snap = b.discovered.clone();
    take_down(&mut snap, "rdma1");
    let notes = poll(&mut snap, 110);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("rdma5"));
    assert_eq!(marker(&snap, "rdma5"), None);
}

#[test]
fn a_targeted_poll_reads_only_the_changed_supported_modules() {
    let b = bench();
    let r = ModuleReader::new(Duration::from_secs(60));
    let mut snap = b.discovered.clone();
    r.read(&b.source, &mut snap, |_| true, || Duration::from_secs(5), b.t0);
    assert_eq!(b.reads.load(Ordering::SeqCst), 6);
    let at1 = b.t0 + Duration::from_secs(1);
    // The wake-up names rdma2 (down) and rdma3, rdma4 (unchanged; rdma4 not supported).
    let mut targeted = snap.clone();
    let down = take_down(&mut targeted, "rdma2");
    let name = |n: &str| targeted.devices.iter().find(|d| d.netdev.as_deref() == Some(n)).unwrap().name.clone();
    let devices = vec![down, name("rdma3"), name("rdma4")];
    let before3 = marker(&targeted, "rdma3");
    let notes = r.read_changed(&b.source, &mut targeted, &devices, || Duration::from_secs(5), at1);
    assert!(notes.is_empty());
    assert_eq!(b.reads.load(Ordering::SeqCst), 7, "rdma2 alone");
    assert_eq!(marker(&targeted, "rdma2"), Some(7));
    assert_eq!(marker(&targeted, "rdma3"), before3, "the base's reading stands");
    // Its state now read with the module, the full poll after it does not read it again.
    let mut snap = b.discovered.clone();
    take_down(&mut snap, "rdma2");
    r.read(&b.source, &mut snap, |_| true, || Duration::from_secs(5), at1);
    assert_eq!(b.reads.load(Ordering::SeqCst), 8, "rdma5 (failed) alone");
    assert_eq!(marker(&snap, "rdma2"), Some(7));
}

#[test]
fn unmonitored_devices_are_not_read_and_a_replayed_module_is_read_from_its_file() {
    let b = bench();
    let r = ModuleReader::new(Duration::from_secs(60));
    let mut snap = b.discovered.clone();
    r.read(&b.source, &mut snap, |_| false, || Duration::from_secs(5), b.t0);
    assert_eq!(b.reads.load(Ordering::SeqCst), 0);
    assert!(snap.devices.iter().all(|d| d.ports.iter().all(|p| p.module.is_none())));

    let dir = tempfile::tempdir().unwrap();
    let mut p0 = "00".repeat(256);
    p0.replace_range(0..2, "11");
    std::fs::write(dir.path().join("rdma0.json"), format!(r#"{{"module": {{"pages": {{"0": "{p0}"}}}}}}"#)).unwrap();
    std::fs::write(dir.path().join("rdma1.json"), r#"{"module": {"pages": {"0": "11zz"}}}"#).unwrap();
    std::fs::write(dir.path().join("rdma2.json"), r#"{"fec": {"active": "RS"}}"#).unwrap();
    let source = EthtoolSource::Replay(dir.path().to_path_buf());
    let mut snap = b.discovered.clone();
    let notes = r.read(&source, &mut snap, |_| true, || Duration::from_secs(5), b.t0);
    let d0 = snap.devices.iter().find(|d| d.netdev.as_deref() == Some("rdma0")).unwrap();
    assert_eq!(d0.ports[0].module.as_ref().map(|m| m.0[&0][0]), Some(0x11));
    let bad: Vec<&String> = notes.iter().filter(|n| n.contains("rdma1")).collect();
    assert_eq!(bad.len(), 1, "{notes:?}");
    assert!(bad[0].contains("rdma1.json") && bad[0].contains("page 0: not hex"), "one line naming the file: {bad:?}");
    assert!(notes.iter().any(|n| n.contains("rdma2: no module in the replay file")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("rdma3: no replay file")), "{notes:?}");
}

/// A veth pair deleted on drop.
struct Veth(&'static str, &'static str);

impl Veth {
    fn create(a: &'static str, b: &'static str) -> Result<Veth, String> {
        let ip = |args: &[&str]| std::process::Command::new("ip").args(args).output();
        let _ = ip(&["link", "del", a]);
        match ip(&["link", "add", a, "type", "veth", "peer", "name", b]) {
            Ok(o) if o.status.success() => Ok(Veth(a, b)),
            Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["link", "del", self.0]).output();
        let _ = std::process::Command::new("ip").args(["link", "del", self.1]).output();
    }
}

/// A real `ETHTOOL_MSG_MODULE_EEPROM_GET` to this kernel for a veth made here: veth has no
/// module operation, the kernel answers `EOPNOTSUPP`, nicmon says "not supported" once and
/// nothing else, and asks again only at the interval.
#[test]
fn a_veth_answers_not_supported_said_once() {
    let veth = match Veth::create("nmopt0", "nmopt1") {
        Ok(v) => v,
        Err(e) => return println!("veth creation refused ({e}): skipped"),
    };
    let source = EthtoolSource::Kernel(EthtoolReader::default());
    let read = source.read_module(veth.0, Duration::from_secs(10));
    assert!(matches!(&read, Err(Absent::Unsupported(why)) if why.contains("nmopt0")), "{read:?}");

    // Through the paced reader, on a device whose netdev is the veth.
    let mut snap = Snapshot::default();
    let dev =
        Device { netdev: Some(veth.0.into()), ..Device::pf("mlx5_9", vec![Port { number: 1, ..Port::default() }]) };
    snap.devices.push(Arc::new(dev));
    let r = ModuleReader::new(Duration::from_secs(60));
    let t0 = Instant::now();
    let poll = |s: u64| {
        let mut snap = snap.clone();
        let notes = r.read(&source, &mut snap, |_| true, || Duration::from_secs(10), t0 + Duration::from_secs(s));
        (notes, snap.devices[0].ports[0].module.clone())
    };
    let (notes, module) = poll(0);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].starts_with("transceiver module of nmopt0: not supported: "), "{notes:?}");
    assert!(notes[0].contains("the driver does not offer it"), "{notes:?}");
    assert_eq!(module, None);
    assert_eq!(poll(30), (Vec::new(), None), "not asked, nothing said");
    assert_eq!(poll(60), (Vec::new(), None), "asked again at the interval, said no more");
}
