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

#[cfg(test)]
mod tests {
    use super::*;

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
