//! The daemon's threads ask the kernel's fair scheduler for a short time slice.
//!
//! A wake-up's poll is a few hundred microseconds of work after a long sleep. The kernel may
//! queue the woken thread on a CPU that is running something else — on a small machine, the
//! very CPU that is still finishing the system call or interrupt that changed the link —
//! and EEVDF lets the running task finish its slice first (the default base slice is
//! 0.75 ms times a factor that grows with the number of CPUs). Since Linux 6.12 a fair task
//! can request its own slice (`sched_attr.sched_runtime`, 0.1–100 ms), and a task with a
//! shorter slice than the running one preempts it when woken: the poll runs at once and
//! then gives the CPU back. The share of CPU each task gets is unchanged (a shorter slice
//! is more, shorter turns, not more time). Older kernels ignore the request.
//!
//! Asked once, on the daemon's main thread before it starts any other: threads inherit it.
//! The runtime's blocking threads, off the latency path, give it back
//! ([`crate::daemon::runtime`]): a sink's sync must not get the CPU ahead of the process
//! reading the line the daemon just wrote.
use std::io;
use std::time::Duration;

/// The slice the daemon's threads request: the kernel's smallest.
pub const DAEMON_SLICE: Duration = Duration::from_micros(100);

/// Request `slice` for the calling thread (and the threads it starts from now on). Returns
/// the slice the kernel now reports for it: `None` where it keeps no slice of its own for a
/// fair task (a kernel before 6.12), or the thread is not in the fair class (a real-time
/// policy set by the operator is left as it is).
pub fn request_slice(slice: Duration) -> io::Result<Option<Duration>> {
    let mut attr = get()?;
    if !matches!(attr.sched_policy as i32, libc::SCHED_OTHER | libc::SCHED_BATCH) {
        return Ok(None);
    }
    attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    // Only the flag this call may carry over; the nice value and policy are kept.
    attr.sched_flags &= libc::SCHED_FLAG_RESET_ON_FORK as u64;
    // SAFETY: sched_setattr(2) on the calling thread (pid 0) with a valid, initialised
    // `sched_attr` whose `size` field names its size; flags 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const libc::sched_attr, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    current_slice()
}

/// Give the calling thread the scheduler's default slice back (a thread off the latency
/// path, started by one that asked for [`DAEMON_SLICE`]).
pub fn default_slice() -> io::Result<()> {
    request_slice(Duration::ZERO).map(|_| ())
}

/// The calling thread's own fair-class slice, if the kernel keeps one (`None`: it reports
/// none).
pub fn current_slice() -> io::Result<Option<Duration>> {
    let attr = get()?;
    Ok((attr.sched_runtime > 0).then(|| Duration::from_nanos(attr.sched_runtime)))
}

fn get() -> io::Result<libc::sched_attr> {
    let size = std::mem::size_of::<libc::sched_attr>();
    let mut attr = libc::sched_attr {
        size: size as u32,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_getattr(2) on the calling thread writes at most `size` bytes into
    // `attr`, which is that large; flags 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut libc::sched_attr, size as u32, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// A helper thread another thread hands work to and then waits for (the reader thread of a
/// poll's reads), with what that waiting thread needs to bring it to its own CPU.
///
/// A helper woken on a CPU that is busy — a kernel thread or a system call running there
/// (a kernel without preemption lets neither be interrupted), or the vCPU preempted by its
/// host — waits there: the kernel does not move a task that ran on that CPU a moment ago
/// ("cache hot") to another, even to the one the waiter leaves idle when it goes to sleep.
/// The waiter, about to sleep on its own CPU, pins the helper there
/// ([`Helper::bring_here`]); the helper takes its own CPU set back when it begins the work
/// ([`Helper::begin_work`]).
#[derive(Default)]
pub struct Helper {
    /// The helper's thread id (0 until [`Helper::register`]).
    tid: std::sync::atomic::AtomicI32,
    /// Pinned by [`Helper::bring_here`] and not restored yet.
    moved: std::sync::atomic::AtomicBool,
    /// The helper's CPU set when it registered.
    home: std::sync::Mutex<Option<libc::cpu_set_t>>,
}

impl Helper {
    /// On the helper's thread, once: its thread id and CPU set.
    pub fn register(&self) {
        use std::sync::atomic::Ordering;
        // SAFETY: sched_getaffinity(2) of the calling thread into a zeroed set of the size
        // passed; gettid(2) has no arguments.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                *self.home.lock().unwrap_or_else(|p| p.into_inner()) = Some(set);
            }
            self.tid.store(libc::gettid(), Ordering::Release);
        }
    }

    /// On the waiting thread: pin the helper to the CPU this thread runs on. `false` when
    /// the helper has not registered or the kernel refused (it stays where it is).
    pub fn bring_here(&self) -> bool {
        use std::sync::atomic::Ordering;
        let tid = self.tid.load(Ordering::Acquire);
        // SAFETY: sched_getcpu(3) has no arguments.
        let cpu = unsafe { libc::sched_getcpu() };
        if tid <= 0 || cpu < 0 || self.home.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
            return false;
        }
        // SAFETY: a zeroed set with one CPU below CPU_SETSIZE (sched_getcpu's answer) set,
        // passed with its size to sched_setaffinity(2) for a thread of this process.
        let pinned = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        if pinned {
            self.moved.store(true, Ordering::Release);
        }
        pinned
    }

    /// On the helper's thread, as it begins the work: its own CPU set back when it was
    /// brought elsewhere (it runs where it is now; no move).
    pub fn begin_work(&self) {
        use std::sync::atomic::Ordering;
        if !self.moved.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Some(home) = *self.home.lock().unwrap_or_else(|p| p.into_inner()) {
            // SAFETY: sched_setaffinity(2) of the calling thread with a set the kernel gave.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &home) };
        }
    }

    /// The helper's thread id (tests).
    #[cfg(test)]
    pub(crate) fn tid(&self) -> i32 {
        self.tid.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The helper's CPU set now (tests).
    #[cfg(test)]
    pub(crate) fn cpus(&self) -> Vec<usize> {
        let tid = self.tid.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: sched_getaffinity(2) of a thread of this process into a zeroed set.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            (0..libc::CPU_SETSIZE as usize).filter(|c| libc::CPU_ISSET(*c, &set)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A helper brought to the waiting thread's CPU runs only there until it begins its
    /// work, and then has its own CPU set back.
    #[test]
    fn a_helper_brought_here_is_pinned_until_it_begins_its_work() {
        let helper = std::sync::Arc::new(Helper::default());
        assert!(!helper.bring_here(), "nothing to bring before the helper registers");
        let (go, begin) = std::sync::mpsc::channel::<()>();
        let (done, began) = std::sync::mpsc::channel::<()>();
        let h = std::sync::Arc::clone(&helper);
        let thread = std::thread::spawn(move || {
            h.register();
            done.send(()).unwrap();
            begin.recv().unwrap();
            h.begin_work();
            done.send(()).unwrap();
            // Alive until its CPU set was looked at.
            let _ = begin.recv();
        });
        began.recv().unwrap();
        let home = helper.cpus();
        assert!(helper.bring_here());
        // One CPU: the one this thread ran on then (it may have moved since).
        let pinned = helper.cpus();
        assert_eq!(pinned.len(), 1, "{pinned:?}");
        if home.len() > 1 {
            assert!(home.contains(&pinned[0]));
        }
        go.send(()).unwrap();
        began.recv().unwrap();
        assert_eq!(helper.cpus(), home, "its own CPU set back once it begins");
        drop(go);
        thread.join().unwrap();
    }

    /// On its own thread (the test harness's threads keep theirs): the slice is requested,
    /// reported back, inherited by a thread started afterwards, and the nice value kept;
    /// the daemon's runtime keeps it on its own thread, not on its blocking threads.
    #[test]
    fn a_requested_slice_is_kept_and_inherited_but_not_by_blocking_threads() {
        std::thread::spawn(|| {
            // SAFETY: plain getpriority(2)/setpriority(2) on the calling thread.
            let nice_set = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) } == 0;
            let kept = request_slice(DAEMON_SLICE).expect("sched_setattr on the calling thread");
            let Some(slice) = kept else {
                eprintln!("skipped: this kernel keeps no slice of its own for a fair task (before Linux 6.12)");
                return;
            };
            assert_eq!(slice, DAEMON_SLICE);
            if nice_set {
                // SAFETY: as above.
                assert_eq!(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }, 3, "the nice value is kept");
            }
            let child = std::thread::spawn(|| current_slice().expect("sched_getattr")).join().unwrap();
            assert_eq!(child, Some(DAEMON_SLICE), "a thread started afterwards inherits it");
            let rt = crate::daemon::runtime().expect("the daemon's runtime");
            let blocking =
                rt.block_on(async { tokio::task::spawn_blocking(|| current_slice().expect("sched_getattr")).await });
            let blocking = blocking.unwrap().expect("the kernel reports the default slice too");
            assert!(blocking > DAEMON_SLICE, "the runtime's blocking threads give it back: {blocking:?}");
            assert_eq!(
                rt.block_on(async { current_slice().unwrap() }),
                Some(DAEMON_SLICE),
                "the loop's thread keeps it"
            );
        })
        .join()
        .unwrap();
    }
}
