//! A batch's answers: what a reader thread read of each file of a batch, one after another
//! in one buffer, and each file's span of it (or why it could not be read).
//!
//! The reader thread copies each file's bytes from its own scratch page into the batch's
//! buffer: it allocates nothing per file. (It used to hand each file's bytes over in an
//! allocation of its own, which the polling thread freed: every such allocation and free
//! took the slow path of both threads' allocators.) The buffer goes back to the reader
//! once the caller has taken the texts out ([`super::reader::Reader::recycle`]), so a
//! poll's batch reuses the last one's.
use std::ops::Range;

use super::ReadError;

/// The answers of a batch of `len()` items, by index (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Answers {
    bytes: Vec<u8>,
    slots: Vec<Option<Result<Range<usize>, ReadError>>>,
}

/// A batch with more items than this does not leave its buffers to the next one (a device of
/// a thousand ports: tens of thousands of files, read once per poll at most, whose buffers
/// would stay allocated between polls).
pub(super) const RECYCLE_MAX_ITEMS: usize = 4096;

impl Answers {
    /// No answer yet for any of `n` items.
    pub(super) fn for_items(n: usize) -> Answers {
        let mut a = Answers::default();
        a.reset(n);
        a
    }

    /// Forget every answer: no answer yet for any of `n` items (the buffers' room kept).
    pub(super) fn reset(&mut self, n: usize) {
        self.bytes.clear();
        self.slots.clear();
        self.slots.resize_with(n, || None);
    }

    /// How many items the batch has.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether item `i` has its answer.
    pub(super) fn is_answered(&self, i: usize) -> bool {
        self.slots.get(i).is_some_and(Option::is_some)
    }

    /// The first item without an answer (`len()`: every item has one).
    pub(super) fn first_unanswered(&self) -> usize {
        self.slots.iter().position(Option::is_none).unwrap_or(self.slots.len())
    }

    /// Item `i`'s answer: its bytes, or why it could not be read. Outside the batch: ignored.
    pub(super) fn put(&mut self, i: usize, answer: Result<&[u8], ReadError>) {
        if i >= self.slots.len() {
            return;
        }
        let answer = answer.map(|bytes| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(bytes);
            start..self.bytes.len()
        });
        self.slots[i] = Some(answer);
    }

    /// Item `i`'s answer, `None` if it has none yet.
    pub(super) fn get(&self, i: usize) -> Option<Result<&[u8], &ReadError>> {
        let slot = self.slots.get(i)?.as_ref()?;
        Some(match slot {
            Ok(span) => Ok(self.bytes.get(span.clone()).unwrap_or_default()),
            Err(e) => Err(e),
        })
    }

    /// Item `i`'s answer; an item without one was not read.
    pub(super) fn result(&self, i: usize) -> Result<&[u8], ReadError> {
        match self.get(i) {
            Some(Ok(bytes)) => Ok(bytes),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ReadError::Io("not read".into())),
        }
    }

    /// Take the answers `other` has for items this one has none for (the part of a batch
    /// another thread read).
    pub(super) fn take_from(&mut self, other: &Answers) {
        for i in 0..self.slots.len() {
            if self.slots[i].is_none()
                && let Some(answer) = other.get(i)
            {
                self.put(i, answer.map_err(Clone::clone));
            }
        }
    }

    /// `e` as the answer of every item from `from` on.
    pub(super) fn fail_from(&mut self, from: usize, e: &ReadError) {
        for slot in self.slots.iter_mut().skip(from) {
            *slot = Some(Err(e.clone()));
        }
    }

    /// Whether the buffers are small enough to be kept for the next batch
    /// ([`RECYCLE_MAX_ITEMS`]).
    pub(super) fn worth_keeping(&self) -> bool {
        self.slots.capacity() <= RECYCLE_MAX_ITEMS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_item_gets_its_own_bytes_back_in_any_order_and_a_reset_forgets_them() {
        let mut a = Answers::for_items(4);
        a.put(2, Ok(b"up\n"));
        a.put(0, Ok(b""));
        a.put(1, Err(ReadError::Invalid));
        a.put(9, Ok(b"outside"));
        assert_eq!(a.get(0), Some(Ok(&b""[..])));
        assert_eq!(a.get(1), Some(Err(&ReadError::Invalid)));
        assert_eq!(a.get(2), Some(Ok(&b"up\n"[..])));
        assert_eq!(a.get(3), None);
        assert_eq!(a.result(3), Err(ReadError::Io("not read".into())));
        assert_eq!(a.first_unanswered(), 3);
        a.reset(2);
        assert_eq!((a.get(0), a.get(2), a.first_unanswered()), (None, None, 0));
        a.put(1, Ok(b"4: ACTIVE\n"));
        assert_eq!(a.result(1), Ok(&b"4: ACTIVE\n"[..]));
    }

    #[test]
    fn answers_taken_from_another_part_keep_those_already_here() {
        let mut here = Answers::for_items(3);
        here.put(0, Ok(b"first"));
        let mut there = Answers::for_items(3);
        there.put(0, Ok(b"not this"));
        there.put(2, Ok(b"third"));
        here.take_from(&there);
        here.fail_from(1, &ReadError::Missing);
        assert_eq!(here.result(0), Ok(&b"first"[..]));
        assert_eq!(here.result(1), Err(ReadError::Missing));
        assert_eq!(here.result(2), Err(ReadError::Missing));
    }

    proptest! {
        /// Whatever is put, in whatever order, each item reads back the last answer put for it.
        #[test]
        fn each_item_reads_back_the_last_answer_put(
            n in 0usize..8,
            puts in proptest::collection::vec((0usize..10, proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20))), 0..24),
        ) {
            let mut a = Answers::for_items(n);
            let mut expect: Vec<Option<Option<Vec<u8>>>> = vec![None; n];
            for (i, bytes) in &puts {
                a.put(*i, bytes.as_deref().ok_or(ReadError::Missing));
                if *i < n {
                    expect[*i] = Some(bytes.clone());
                }
            }
            for (i, e) in expect.iter().enumerate() {
                let got = a.get(i).map(|r| r.ok().map(<[u8]>::to_vec));
                prop_assert_eq!(&got, e);
            }
            prop_assert_eq!(a.first_unanswered(), expect.iter().position(Option::is_none).unwrap_or(n));
        }
    }
}
