//! The queue that hands batches to a reader thread: one sender (the reader pool's slot for
//! the thread), one receiver (the thread). Unlike `std::sync::mpsc`, whose sender wakes a
//! sleeping receiver while it still holds the channel's inner lock — so that the receiver,
//! just woken, often sleeps once more on that lock before it runs (two context switches
//! per batch where one will do; issue 47, "poll cost") — [`Tx::send`] releases its lock
//! before it wakes the receiver.
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

struct Queue<T> {
    inner: Mutex<Inner<T>>,
    ready: Condvar,
}

struct Inner<T> {
    items: VecDeque<T>,
    /// The other end is gone.
    closed: bool,
}

impl<T> Queue<T> {
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// The sending end.
pub(super) struct Tx<T>(Arc<Queue<T>>);

/// The receiving end.
pub(super) struct Rx<T>(Arc<Queue<T>>);

/// Why [`Rx::try_recv`] gave nothing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Empty {
    /// Nothing queued now.
    Now,
    /// Nothing queued, and the sender is gone.
    Closed,
}

/// A queue's two ends.
pub(super) fn queue<T>() -> (Tx<T>, Rx<T>) {
    let q =
        Arc::new(Queue { inner: Mutex::new(Inner { items: VecDeque::new(), closed: false }), ready: Condvar::new() });
    (Tx(q.clone()), Rx(q))
}

impl<T> Tx<T> {
    /// Queue `item`; given back when the receiver is gone.
    pub(super) fn send(&self, item: T) -> Result<(), T> {
        {
            let mut q = self.0.lock();
            if q.closed {
                return Err(item);
            }
            q.items.push_back(item);
        }
        // Outside the lock: the receiver woken takes it at once.
        self.0.ready.notify_one();
        Ok(())
    }
}

impl<T> Rx<T> {
    /// The next item, waiting for it; `None` once the sender is gone and nothing is queued.
    pub(super) fn recv(&self) -> Option<T> {
        let mut q = self.0.lock();
        loop {
            if let Some(item) = q.items.pop_front() {
                return Some(item);
            }
            if q.closed {
                return None;
            }
            q = self.0.ready.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next item if one is queued.
    pub(super) fn try_recv(&self) -> Result<T, Empty> {
        let mut q = self.0.lock();
        match q.items.pop_front() {
            Some(item) => Ok(item),
            None if q.closed => Err(Empty::Closed),
            None => Err(Empty::Now),
        }
    }
}

impl<T> Drop for Tx<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl<T> Drop for Rx<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_arrive_in_order_and_a_gone_receiver_gives_them_back() {
        let (tx, rx) = queue();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!((rx.recv(), rx.try_recv()), (Some(1), Ok(2)));
        assert_eq!(rx.try_recv(), Err(Empty::Now));
        drop(rx);
        assert_eq!(tx.send(3), Err(3));
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_a_send_and_ends_with_the_sender() {
        let (tx, rx) = queue();
        let t = std::thread::spawn(move || (rx.recv(), rx.recv()));
        tx.send("batch").unwrap();
        drop(tx);
        assert_eq!(t.join().unwrap(), (Some("batch"), None));
    }
}
