//! A gauge family whose series are set as a whole each poll ([`Replaced`]): the series set
//! again keep their gauge — no clear, no label set cloned and no gauge made again per poll —
//! and only those not set again are removed, when the round ends.
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;

type Set<L> = HashSet<L, foldhash::fast::RandomState>;

/// A family set as a whole by [`Replaced::round`]; exported as the family it wraps.
#[derive(Debug)]
pub(super) struct Replaced<L, M = Gauge, C = fn() -> M> {
    family: Family<L, M, C>,
    /// The label sets the last round set.
    last: std::sync::Arc<Mutex<Set<L>>>,
}

impl<L: Clone + Hash + Eq, M: Default> Default for Replaced<L, M> {
    fn default() -> Self {
        Replaced { family: Family::default(), last: Default::default() }
    }
}

impl<L, M, C: Clone> Clone for Replaced<L, M, C> {
    fn clone(&self) -> Self {
        Replaced { family: self.family.clone(), last: self.last.clone() }
    }
}

impl<L: Clone + Hash + Eq, M, C: MetricConstructor<M>> Replaced<L, M, C> {
    /// One poll's set of series: each [`Round::get_or_create`] keeps its series; when the
    /// round is dropped, the series the last round set and this one did not are removed.
    pub(super) fn round(&self) -> Round<'_, L, M, C> {
        Round { family: &self.family, last: self.last.lock().unwrap_or_else(|p| p.into_inner()), now: Set::default() }
    }
}

/// [`Replaced::round`].
pub(super) struct Round<'f, L: Clone + Hash + Eq, M, C: MetricConstructor<M>> {
    family: &'f Family<L, M, C>,
    last: MutexGuard<'f, Set<L>>,
    now: Set<L>,
}

impl<'f, L: Clone + Hash + Eq, M, C: MetricConstructor<M>> Round<'f, L, M, C> {
    /// `f` on the series of `labels` (made if the family has none). The label set is
    /// cloned only for a series the last round did not set.
    pub(super) fn with<R>(&mut self, labels: &L, f: impl FnOnce(&M) -> R) {
        let _ = f(&self.family.get_or_create(labels));
        if !self.now.contains(labels) {
            let owned = self.last.take(labels).unwrap_or_else(|| labels.clone());
            self.now.insert(owned);
        }
    }
}

impl<L: Clone + Hash + Eq, M, C: MetricConstructor<M>> Drop for Round<'_, L, M, C> {
    fn drop(&mut self) {
        // What is left of the last round's set was not set by this one.
        for gone in self.last.drain() {
            self.family.remove(&gone);
        }
        std::mem::swap(&mut *self.last, &mut self.now);
    }
}

impl<L, M, C> EncodeMetric for Replaced<L, M, C>
where
    L: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug,
    M: EncodeMetric + prometheus_client::metrics::TypedMetric,
    C: MetricConstructor<M>,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.family.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.family.metric_type()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_keeps_what_it_sets_and_removes_the_rest() {
        let f: Replaced<(String, u32)> = Replaced::default();
        {
            let mut r = f.round();
            r.with(&("a".into(), 1), |g| g.set(1));
            r.with(&("b".into(), 1), |g| g.set(2));
        }
        let has = |k: &str| f.family.get(&(k.to_string(), 1)).is_some();
        assert!(has("a") && has("b"));
        {
            let mut r = f.round();
            r.with(&("b".into(), 1), |g| g.set(3));
        }
        assert_eq!(f.family.get(&("b".into(), 1)).map(|g| g.get()), Some(3));
        assert!(!has("a"), "not set again: removed");
        drop(f.round());
        assert!(!has("a") && !has("b"), "an empty round removes everything");
    }
}
