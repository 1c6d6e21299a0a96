//! The loop's tick: a `timerfd` on `CLOCK_MONOTONIC` the loop waits on through the runtime's
//! epoll, rather than a timer in tokio's wheel. The wheel files a deadline more than 64 ms
//! away in a coarser level and wakes the thread at that level's slot boundary to move it
//! down, then again at the deadline: at the 1 s interval every tick cost two wake-ups (two
//! context switches), at 50 ms ~0.8 more per tick (those whose deadline crossed a 64 ms
//! boundary). The kernel's timer wakes the loop once, at the deadline. Where no timerfd
//! can be had (a sandbox refusing it), tokio's interval is the fallback.
//!
//! Same behaviour as `tokio::time::interval` with `MissedTickBehavior::Delay`: the first
//! tick at once, then every period; a tick taken late is followed by the next one a whole
//! period after it was taken.
use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
use tokio::io::unix::AsyncFd;

/// The loop's tick ([`Tick::tick`] is cancel-safe: a tick is taken only when its wait
/// completes).
pub enum Tick {
    Timerfd(TimerfdTick),
    Tokio(tokio::time::Interval),
}

impl Tick {
    /// A tick every `period` (at least 1 ms), the first at once. Inside a tokio runtime.
    pub fn new(period: Duration) -> Tick {
        let period = period.max(Duration::from_millis(1));
        match TimerfdTick::new(period) {
            Ok(t) => Tick::Timerfd(t),
            Err(e) => {
                tracing::debug!(error = %e, "no timerfd for the loop's tick: tokio's timer ticks it");
                let mut i = tokio::time::interval(period);
                i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                Tick::Tokio(i)
            }
        }
    }

    /// Wait for the next tick.
    pub async fn tick(&mut self) {
        match self {
            Tick::Timerfd(t) => t.tick().await,
            Tick::Tokio(i) => {
                i.tick().await;
            }
        }
    }
}

/// The timerfd kind of [`Tick`]: armed once per tick, for an absolute deadline.
pub struct TimerfdTick {
    fd: AsyncFd<OwnedFd>,
    period: Duration,
    /// The deadline armed, on `CLOCK_MONOTONIC`.
    due: Duration,
}

fn monotonic() -> Duration {
    Duration::from_nanos(crate::read::wake::monotonic_ns())
}

impl TimerfdTick {
    fn new(period: Duration) -> io::Result<TimerfdTick> {
        let fd =
            rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        // SAFETY: the registration is sound as the fd is owned by the `AsyncFd` it is moved
        // into, open and the same until that is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let t = TimerfdTick { fd, period, due: monotonic() };
        // A deadline already passed fires at once: the first tick.
        t.arm()?;
        Ok(t)
    }

    fn arm(&self) -> io::Result<()> {
        let at = Timespec {
            tv_sec: i64::try_from(self.due.as_secs()).unwrap_or(i64::MAX),
            // A zero `it_value` would disarm the timer.
            tv_nsec: i64::from(self.due.subsec_nanos().max(1)),
        };
        let spec = Itimerspec { it_interval: Timespec { tv_sec: 0, tv_nsec: 0 }, it_value: at };
        rustix::time::timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::ABSTIME, &spec)?;
        Ok(())
    }

    async fn tick(&mut self) {
        loop {
            let Ok(mut ready) = self.fd.readable().await else {
                // The runtime cannot watch the fd (it is shutting down): no tick comes.
                return std::future::pending().await;
            };
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| rustix::io::read(fd.get_ref(), &mut expirations).map_err(io::Error::from)) {
                Ok(Ok(_)) => break,
                // Not expired after all (readiness cleared by `try_io`): wait again.
                Err(_) | Ok(Err(_)) => continue,
            }
        }
        let now = monotonic();
        let next = self.due + self.period;
        // Late (a poll longer than the period): the next tick a whole period from now.
        self.due = if next <= now { now + self.period } else { next };
        if let Err(e) = self.arm() {
            tracing::warn!(error = %e, "the loop's tick could not be armed again: retried at the next tick");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn the_first_tick_comes_at_once_then_one_per_period() {
        let mut t = Tick::new(Duration::from_millis(30));
        assert!(matches!(t, Tick::Timerfd(_)), "this kernel gives timerfds");
        let start = Instant::now();
        t.tick().await;
        let first = start.elapsed();
        t.tick().await;
        t.tick().await;
        let two = start.elapsed() - first;
        assert!(two >= Duration::from_millis(59), "two periods took {two:?}");
        // Generous upper bound: the deadlines are absolute, so lateness does not add up.
        assert!(two < Duration::from_millis(1000), "two periods took {two:?}");
    }

    #[tokio::test]
    async fn a_tick_taken_late_is_followed_by_the_next_a_whole_period_later() {
        let mut t = Tick::new(Duration::from_millis(40));
        t.tick().await;
        // Three periods late: one tick is due at once, and the next a period after it.
        std::thread::sleep(Duration::from_millis(120));
        let late = Instant::now();
        t.tick().await;
        assert!(late.elapsed() < Duration::from_millis(1000));
        let taken = Instant::now();
        t.tick().await;
        assert!(taken.elapsed() >= Duration::from_millis(39), "the next came after {:?}", taken.elapsed());
    }

    #[tokio::test]
    async fn a_wait_cancelled_leaves_the_deadline_where_it_was() {
        let mut t = Tick::new(Duration::from_millis(50));
        t.tick().await;
        let first = Instant::now();
        // A wait cancelled (another branch of the loop's select won) neither takes the tick
        // nor moves it.
        let cancelled = tokio::time::timeout(Duration::from_millis(5), t.tick()).await;
        assert!(cancelled.is_err());
        t.tick().await;
        let waited = first.elapsed();
        assert!(waited >= Duration::from_millis(49), "{waited:?}");
        assert!(waited < Duration::from_millis(1000), "{waited:?}");
    }
}
