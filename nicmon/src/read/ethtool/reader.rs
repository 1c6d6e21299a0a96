//! Reading a netdev's ethtool data under a deadline, from the kernel or a replay directory.
//!
//! The kernel answers ethtool requests in the requesting thread: mlx5 turns FEC, pause and
//! `ETHTOOL_GSTATS` into firmware commands, which can block for seconds. So reads run on a
//! worker thread and the caller waits at most its deadline, as for sysfs
//! ([`crate::read::host`]): a read past it is abandoned (its part is [`Absent::Failed`], unknown
//! for this poll) with its thread, the next read starts a fresh thread, the same netdev is
//! not asked again until the abandoned read has returned, and at most [`MAX_STUCK`] reads
//! may be stuck at once.
use super::ioctl::IoctlSocket;
use super::module;
use super::netlink::{EthtoolSocket, Request, parse_fec, parse_pause};
use super::replay;
use crate::model::ethtool::{Absent, EthtoolRead};
use crate::model::module::Pages;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Reads stuck in the kernel at once, at most (each holds a thread).
pub const MAX_STUCK: usize = 4;

/// Where ethtool data comes from: the kernel, or `--ethtool-replay DIR`.
pub enum EthtoolSource {
    Kernel(EthtoolReader),
    Replay(PathBuf),
}

impl EthtoolSource {
    /// `netdev`'s data, within `timeout`.
    pub fn read(&self, netdev: &str, timeout: Duration) -> EthtoolRead {
        match self {
            EthtoolSource::Kernel(r) => r.read(netdev, timeout),
            EthtoolSource::Replay(dir) => replay::load(dir, netdev),
        }
    }

    /// `netdev`'s transceiver pages ([`module`]), within `timeout`.
    pub fn read_module(&self, netdev: &str, timeout: Duration) -> Result<Pages, Absent> {
        match self {
            EthtoolSource::Kernel(r) => r.read_module(netdev, timeout),
            EthtoolSource::Replay(dir) => replay::load_module(dir, netdev),
        }
    }
}

/// What answers a worker's requests: the kernel, or a stand-in in tests.
pub trait Probe: Send {
    fn read(&mut self, netdev: &str) -> EthtoolRead;

    /// The transceiver's pages; a probe without modules has none to offer.
    fn module(&mut self, netdev: &str) -> Result<Pages, Absent> {
        Err(Absent::Unsupported(format!("{netdev}: no module")))
    }
}

/// Builds a worker thread's [`Probe`] (on that thread).
pub type ProbeFactory = Arc<dyn Fn() -> Box<dyn Probe> + Send + Sync>;

/// The kernel: one generic-netlink socket (opened on first use) and one ioctl socket.
struct Kernel {
    netlink: Option<Result<EthtoolSocket, Absent>>,
    ioctl: Option<IoctlSocket>,
}

/// The worker socket's own receive bound (the caller's deadline is shorter).
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);

impl Probe for Kernel {
    fn read(&mut self, netdev: &str) -> EthtoolRead {
        let netlink = self.netlink.get_or_insert_with(|| EthtoolSocket::open(SOCKET_TIMEOUT));
        let (fec, pause) = match netlink {
            Ok(s) => (
                s.get(Request::Fec, netdev).map(|r| parse_fec(&r)),
                s.get(Request::Pause, netdev).map(|r| parse_pause(&r)),
            ),
            Err(why) => (Err(why.clone()), Err(why.clone())),
        };
        if netlink.as_ref().is_err_and(|e| !e.is_unsupported()) {
            self.netlink = None; // a socket that failed to open is tried again next read
        }
        if self.ioctl.is_none() {
            self.ioctl = IoctlSocket::open().ok();
        }
        let stats = match &self.ioctl {
            Some(s) => s.driver_stats(netdev),
            None => Err(Absent::Failed("ioctl socket: could not open".into())),
        };
        EthtoolRead { fec, pause, stats }
    }

    fn module(&mut self, netdev: &str) -> Result<Pages, Absent> {
        let socket = self.netlink.get_or_insert_with(|| EthtoolSocket::open(SOCKET_TIMEOUT));
        let read = match socket {
            Ok(socket) => module::read_pages(&mut module::Kernel { socket, netdev }),
            Err(why) => Err(why.clone()),
        };
        if self.netlink.as_ref().is_some_and(Result::is_err) && !read.as_ref().is_err_and(Absent::is_unsupported) {
            self.netlink = None; // a socket that failed to open is tried again next read
        }
        read
    }
}

/// Netdevs whose read has not returned, and a signal when one does.
#[derive(Default)]
struct Busy {
    netdevs: Mutex<HashSet<String>>,
    returned: Condvar,
}

impl Busy {
    fn lock(&self) -> MutexGuard<'_, HashSet<String>> {
        self.netdevs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a job asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Read,
    Module,
}

/// A job's answer.
enum Answer {
    Read(EthtoolRead),
    Module(Result<Pages, Absent>),
}

struct Job {
    netdev: String,
    ask: Ask,
    answer: mpsc::SyncSender<Answer>,
}

/// Reads netdevs' ethtool data on a worker thread, with a deadline per read.
pub struct EthtoolReader {
    factory: ProbeFactory,
    worker: Mutex<Option<mpsc::Sender<Job>>>,
    busy: Arc<Busy>,
}

impl Default for EthtoolReader {
    fn default() -> EthtoolReader {
        EthtoolReader::with_probe(Arc::new(|| Box::new(Kernel { netlink: None, ioctl: None }) as Box<dyn Probe>))
    }
}

impl std::fmt::Debug for EthtoolReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EthtoolReader").field("busy", &*self.busy.lock()).finish()
    }
}

impl EthtoolReader {
    /// A reader whose workers ask `factory`'s probes instead of the kernel.
    pub fn with_probe(factory: ProbeFactory) -> EthtoolReader {
        EthtoolReader { factory, worker: Mutex::new(None), busy: Arc::default() }
    }

    /// `netdev`'s ethtool data, waiting at most `timeout`.
    pub fn read(&self, netdev: &str, timeout: Duration) -> EthtoolRead {
        match self.ask(netdev, Ask::Read, timeout) {
            Ok(Answer::Read(read)) => read,
            Ok(Answer::Module(_)) => EthtoolRead::absent(Absent::Failed("the wrong answer".into())),
            Err(why) => EthtoolRead::absent(Absent::Failed(why)),
        }
    }

    /// `netdev`'s transceiver pages, waiting at most `timeout`.
    pub fn read_module(&self, netdev: &str, timeout: Duration) -> Result<Pages, Absent> {
        match self.ask(netdev, Ask::Module, timeout) {
            Ok(Answer::Module(read)) => read,
            Ok(Answer::Read(_)) => Err(Absent::Failed("the wrong answer".into())),
            Err(why) => Err(Absent::Failed(why)),
        }
    }

    /// Hands `ask` for `netdev` to the worker and waits at most `timeout` for its answer.
    fn ask(&self, netdev: &str, ask: Ask, timeout: Duration) -> Result<Answer, String> {
        self.claim(netdev, timeout)?;
        let (answer, answered) = mpsc::sync_channel(1);
        let job = Job { netdev: netdev.to_string(), ask, answer };
        let sent = {
            let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
            let tx = worker.get_or_insert_with(|| self.spawn());
            tx.send(job).map_err(|e| e.0)
        };
        if let Err(job) = sent {
            self.busy.lock().remove(&job.netdev);
            *self.worker.lock().unwrap_or_else(|p| p.into_inner()) = None;
            return Err("the ethtool worker thread is gone".into());
        }
        answered.recv_timeout(timeout).map_err(|_| {
            // Leave the thread to its read: the next read gets a fresh one.
            *self.worker.lock().unwrap_or_else(|p| p.into_inner()) = None;
            format!("{netdev}: no answer within {} ms: abandoned", timeout.as_millis())
        })
    }

    /// Marks `netdev` busy, or says why it cannot be read now.
    fn claim(&self, netdev: &str, timeout: Duration) -> Result<(), String> {
        if timeout.is_zero() {
            return Err("the poll's read deadline had passed: not read".into());
        }
        let mut busy = self.busy.lock();
        if busy.contains(netdev) {
            return Err(format!("{netdev}: an earlier ethtool read has not returned"));
        }
        if busy.len() >= MAX_STUCK {
            return Err(format!("{} ethtool reads are stuck: no reader thread left", busy.len()));
        }
        busy.insert(netdev.to_string());
        Ok(())
    }

    fn spawn(&self) -> mpsc::Sender<Job> {
        let (tx, rx) = mpsc::channel::<Job>();
        let factory = self.factory.clone();
        let busy = self.busy.clone();
        let spawned = std::thread::Builder::new().name("nicmon-ethtool".into()).spawn(move || {
            let mut probe = factory();
            for job in rx {
                let read = match job.ask {
                    Ask::Read => Answer::Read(probe.read(&job.netdev)),
                    Ask::Module => Answer::Module(probe.module(&job.netdev)),
                };
                busy.lock().remove(&job.netdev);
                busy.returned.notify_all();
                let _ = job.answer.send(read); // the caller may have given up
            }
        });
        if spawned.is_err() {
            // The channel's receiver is gone with the closure: the send fails and says so.
            tracing::warn!("could not start an ethtool reader thread");
        }
        tx
    }

    /// Netdevs whose read has not returned.
    pub fn stuck(&self) -> Vec<String> {
        let mut v: Vec<String> = self.busy.lock().iter().cloned().collect();
        v.sort();
        v
    }

    /// Waits until no read is in flight, at most `timeout`; whether none is.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut busy = self.busy.lock();
        while !busy.is_empty() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            busy = self.busy.returned.wait_timeout(busy, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ethtool::PauseSnapshot;

    /// A probe that answers at once, except for netdevs named `stuck*`, which wait for a
    /// release message.
    struct Gate {
        release: Arc<Mutex<mpsc::Receiver<()>>>,
    }

    impl Probe for Gate {
        fn read(&mut self, netdev: &str) -> EthtoolRead {
            if netdev.starts_with("stuck") {
                let _ = self.release.lock().unwrap().recv();
            }
            EthtoolRead {
                fec: Err(Absent::Unsupported(netdev.into())),
                pause: Ok(PauseSnapshot { tx_frames: Some(1), rx_frames: None }),
                stats: Ok(Default::default()),
            }
        }
    }

    fn gated() -> (EthtoolReader, mpsc::Sender<()>) {
        let (tx, rx) = mpsc::channel();
        let release = Arc::new(Mutex::new(rx));
        let reader =
            EthtoolReader::with_probe(Arc::new(move || Box::new(Gate { release: release.clone() }) as Box<dyn Probe>));
        (reader, tx)
    }

    #[test]
    fn answers_within_the_deadline() {
        let (reader, _release) = gated();
        let read = reader.read("eth0", Duration::from_secs(10));
        assert_eq!(read.pause, Ok(PauseSnapshot { tx_frames: Some(1), rx_frames: None }));
        assert!(reader.stuck().is_empty());
    }

    #[test]
    fn a_stuck_read_is_abandoned_and_bounded() {
        let (reader, release) = gated();
        let read = reader.read("stuck0", Duration::from_millis(50));
        assert!(matches!(&read.fec, Err(Absent::Failed(w)) if w.contains("abandoned")), "{read:?}");
        // Other netdevs are read meanwhile, on a fresh thread.
        assert!(reader.read("eth0", Duration::from_secs(10)).pause.is_ok());
        // The stuck netdev is not asked again while its read is out.
        let again = reader.read("stuck0", Duration::from_secs(10));
        assert!(matches!(&again.stats, Err(Absent::Failed(w)) if w.contains("not returned")), "{again:?}");
        for i in 1..MAX_STUCK {
            reader.read(&format!("stuck{i}"), Duration::from_millis(20));
        }
        assert_eq!(reader.stuck().len(), MAX_STUCK);
        let refused = reader.read("eth1", Duration::from_secs(10));
        assert!(matches!(&refused.pause, Err(Absent::Failed(w)) if w.contains("stuck")), "{refused:?}");
        // Once they return, reads go on.
        for _ in 0..MAX_STUCK {
            release.send(()).unwrap();
        }
        assert!(reader.wait_idle(Duration::from_secs(10)));
        let asked = reader.read("stuck0", Duration::from_millis(50));
        assert!(matches!(&asked.pause, Err(Absent::Failed(w)) if w.contains("abandoned")), "{asked:?}");
        release.send(()).unwrap();
        assert!(reader.wait_idle(Duration::from_secs(10)));
        assert!(reader.read("eth1", Duration::from_secs(10)).pause.is_ok());
        assert!(reader.read("eth1", Duration::ZERO).pause.is_err());
    }
}
