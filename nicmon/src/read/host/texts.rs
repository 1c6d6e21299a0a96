//! A batch's texts ([`super::Host::read_files`]): each file's text as read (lossy UTF-8),
//! or why it could not be read, by the file's place in its set.
//!
//! They are the reader's [`Answers`] themselves — one buffer for the batch's bytes, a span
//! per file — not a `String` per file: a quiet poll's batch of a few hundred files costs no
//! allocation per file, neither on the reader thread nor on the polling thread. When the
//! last holder lets them go (a poll's devices are finished from them, and the kept plan
//! keeps them until the next poll's, [`crate::read::discovery`]), their buffers go back to
//! the reader they came from, for a later batch.
use std::sync::{Arc, Mutex};

use super::ReadError;
use super::answers::Answers;

/// Where a batch's buffers go back to once its texts are let go ([`Texts`]); a few at
/// most (a poll has its batch, and the kept last one, in hand at once).
pub(super) type Spares = Arc<Mutex<Vec<Answers>>>;

/// How many batches' buffers wait for the next batches at most.
pub(super) const SPARES: usize = 4;

/// A batch's texts, by index (see the module doc).
#[derive(Debug, Default)]
pub struct Texts {
    answers: Answers,
    home: Option<Spares>,
}

impl Texts {
    /// `answers` whose bytes are UTF-8 in every answer, to go back to `home` once let go.
    pub(super) fn new(answers: Answers, home: Option<Spares>) -> Texts {
        Texts { answers, home }
    }

    /// Texts as given (a batch put together by hand).
    #[cfg(test)]
    pub(super) fn from_results(results: Vec<Result<String, ReadError>>) -> Texts {
        let mut answers = Answers::for_items(results.len());
        for (i, r) in results.into_iter().enumerate() {
            answers.put(i, r.as_ref().map(|s| s.as_bytes()).map_err(Clone::clone));
        }
        Texts { answers, home: None }
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// File `i`'s text or why it could not be read; `None` past the batch (or a file not
    /// answered).
    pub fn get(&self, i: usize) -> Option<Result<&str, &ReadError>> {
        self.answers.get(i).map(|r| r.map(|bytes| std::str::from_utf8(bytes).unwrap_or_default()))
    }

    /// File `i`'s text, or why not (an error cloned; past the batch: not read).
    pub fn text(&self, i: usize) -> Result<&str, ReadError> {
        match self.get(i) {
            Some(Ok(s)) => Ok(s),
            Some(Err(e)) => Err(e.clone()),
            None => Err(ReadError::Io("not read".into())),
        }
    }

    /// Each file's text as a `String` of its own, or why not (a copy).
    #[cfg(test)]
    pub(super) fn owned(&self) -> Vec<Result<String, ReadError>> {
        (0..self.len()).map(|i| self.text(i).map(str::to_owned)).collect()
    }

    /// Whether file `i` read the same here and as file `j` of `other` (both answered).
    pub fn same(&self, i: usize, other: &Texts, j: usize) -> bool {
        matches!((self.answers.get(i), other.answers.get(j)), (Some(a), Some(b)) if a == b)
    }
}

impl Drop for Texts {
    fn drop(&mut self) {
        let Some(home) = self.home.take() else { return };
        if !self.answers.worth_keeping() {
            return;
        }
        let mut spares = home.lock().unwrap_or_else(|p| p.into_inner());
        if spares.len() < SPARES {
            spares.push(std::mem::take(&mut self.answers));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_read_back_as_given_and_compare_by_content() {
        let t = Texts::from_results(vec![Ok("4: ACTIVE\n".into()), Err(ReadError::Missing), Ok(String::new())]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.get(0), Some(Ok("4: ACTIVE\n")));
        assert_eq!(t.text(1), Err(ReadError::Missing));
        assert_eq!(t.text(2), Ok(""));
        assert_eq!(t.get(3), None);
        assert_eq!(t.text(3), Err(ReadError::Io("not read".into())));
        let u = Texts::from_results(vec![Ok("x".into()), Ok("4: ACTIVE\n".into()), Err(ReadError::Missing)]);
        assert!(t.same(0, &u, 1));
        assert!(t.same(1, &u, 2), "the same failure reads the same");
        assert!(!t.same(0, &u, 0));
        assert!(!t.same(3, &u, 0), "a file past the batch is never the same");
    }

    #[test]
    fn let_go_texts_leave_their_buffers_to_their_reader_a_few_at_most() {
        let home: Spares = Arc::default();
        for _ in 0..SPARES + 2 {
            drop(Texts::new(Answers::for_items(2), Some(home.clone())));
        }
        assert_eq!(home.lock().unwrap().len(), SPARES);
        drop(Texts::new(Answers::for_items(super::super::answers::RECYCLE_MAX_ITEMS + 1), Some(home.clone())));
        drop(Texts::from_results(vec![Ok("a".into())]));
        assert_eq!(home.lock().unwrap().len(), SPARES, "a batch too large to keep, or one with no reader, is dropped");
    }
}
