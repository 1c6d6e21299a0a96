//! The outbox: the health events detected and not yet delivered — data, and the rule that
//! lets them in. What moves them (the sender, the journal, acknowledgements, the saves) is
//! [`crate::act::courier`].
//!
//! - **Batches.** A poll's events are formed into **one batch per check** (in
//!   [`Check::ALL`] order), each with the next increasing id ([`Outbox::batches_for`]);
//!   acknowledgements name that id, and only an acknowledgement removes a batch
//!   ([`Outbox::ack`]). The outbox is part of the state file (its `outbox` and
//!   `next_batch_id` keys), so what is owed survives a restart.
//! - **The bound** ([`QueueBounds`]): at most so many batches and serialized bytes wait.
//!   Direct publishing's bounded queue (`HEALTH_PUBLISH_QUEUE_*`, upstream's 1024 batches /
//!   64 MiB) with its bytes capped at [`OUTBOX_MAX_BYTES`]; every other sink
//!   [`OUTBOX_BOUNDS`]. The outbox lives in the state file (read up to 16 MiB) and in the
//!   daemon's memory (peak RSS ≤ 32 MiB), hence the cap.
//! - **The commit rule** ([`Outbox::commit`]): a poll's batches are queued all or none. A
//!   poll whose batches do not all fit behind those queued is refused whole ([`QueueFull`]):
//!   nothing is queued, the checks' state does not advance, and the poll runs again — which
//!   is upstream's "queue full: do not record as reported". So nothing queued is dropped,
//!   and once there is room the poll queues the newest state of every (check, entity)
//!   against what was last committed.
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::act::dispatch::{GrpcConfig, SinkSpec};
use crate::model::event::{Check, HealthEvent};

/// One check's events of one poll cycle, waiting for the sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingBatch {
    /// Increasing id: acknowledgements name it.
    pub id: u64,
    pub check: Check,
    pub events: Vec<HealthEvent>,
}

/// The batches not yet accepted, oldest first; persisted in the state file as its
/// `outbox` and `next_batch_id` keys. A queued batch is shared with the sender (and the
/// journal), never copied: a reboot's baselines on a device with 1,000 ports are one batch
/// of ~14,000 events.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outbox {
    #[serde(default, rename = "outbox")]
    batches: Vec<Arc<PendingBatch>>,
    /// The id of the last batch queued.
    #[serde(default, rename = "next_batch_id")]
    last_id: u64,
}

impl Outbox {
    /// The outbox the state file's `outbox` and `next_batch_id` keys hold.
    pub(crate) fn from_parts(batches: Vec<Arc<PendingBatch>>, last_id: u64) -> Outbox {
        Outbox { batches, last_id }
    }

    /// `events` as one batch per check, in [`Check::ALL`] order, with the ids they would
    /// get if queued now (nothing is queued).
    pub fn batches_for(&self, events: &[HealthEvent]) -> Vec<PendingBatch> {
        let mut new = Vec::new();
        let mut id = self.last_id;
        for check in Check::ALL {
            // Sized exactly (a reboot's baselines on a device with 1,000 ports are ~14,000
            // events: a vector grown by doubling could hold twice their size).
            let n = events.iter().filter(|e| e.check() == Some(check)).count();
            if n == 0 {
                continue;
            }
            let mut batch = Vec::with_capacity(n);
            batch.extend(events.iter().filter(|e| e.check() == Some(check)).cloned());
            id += 1;
            new.push(PendingBatch { id, check, events: batch });
        }
        new
    }

    /// [`Outbox::batches_for`] of `events` taken whole: each event moves into its batch (a
    /// reboot's baselines on a node of many ports are tens of thousands: not copied).
    pub fn batches_of(&self, mut events: Vec<HealthEvent>) -> Vec<PendingBatch> {
        let index = |e: &HealthEvent| e.check().and_then(|c| Check::ALL.iter().position(|x| *x == c));
        let mut counts = vec![0usize; Check::ALL.len()];
        for i in events.iter().filter_map(index) {
            counts[i] += 1;
        }
        // The largest check's events stay where they are (the poll's vector, compacted in
        // order); the others move to vectors sized exactly, as in `batches_for`.
        let largest = (0..counts.len()).max_by_key(|&i| counts[i]).unwrap_or_default();
        let mut by_check: Vec<Vec<HealthEvent>> =
            counts.iter().enumerate().map(|(i, &n)| Vec::with_capacity(if i == largest { 0 } else { n })).collect();
        for e in events.extract_if(.., |e| index(e) != Some(largest)) {
            if let Some(i) = index(&e) {
                by_check[i].push(e);
            }
        }
        events.shrink_to_fit();
        by_check[largest] = events;
        let mut id = self.last_id;
        Check::ALL
            .into_iter()
            .zip(by_check)
            .filter(|(_, events)| !events.is_empty())
            .map(|(check, events)| {
                id += 1;
                PendingBatch { id, check, events }
            })
            .collect()
    }

    /// Append `events` as one batch per check, in [`Check::ALL`] order; returns the new
    /// batches. In the daemon only the courier queues, through [`Outbox::commit`] (it keeps
    /// the checks' state and the outbox moving together).
    pub fn enqueue(&mut self, events: &[HealthEvent]) -> Vec<PendingBatch> {
        let new = self.batches_for(events);
        self.queue(new).iter().map(|b| PendingBatch::clone(b)).collect()
    }

    /// Append `new` (from [`Outbox::batches_for`]); returns them, shared with the outbox.
    fn queue(&mut self, new: Vec<PendingBatch>) -> Vec<Arc<PendingBatch>> {
        if let Some(last) = new.last() {
            self.last_id = last.id;
        }
        let new: Vec<Arc<PendingBatch>> = new.into_iter().map(Arc::new).collect();
        self.batches.extend(new.iter().cloned());
        new
    }

    /// The commit rule: queue one poll's `events` whole, or — when `bounds` refuses them —
    /// nothing. Returns the new batches (shared with the outbox, not copies).
    pub fn commit(
        &mut self,
        bounds: Option<&QueueBounds>,
        events: &[HealthEvent],
    ) -> Result<Vec<Arc<PendingBatch>>, QueueFull> {
        let new = self.batches_for(events);
        if let Some(bounds) = bounds {
            bounds.admit(&self.batches, &new)?;
        }
        Ok(self.queue(new))
    }

    /// [`Outbox::commit`] of `events` taken whole ([`Outbox::batches_of`]): the batches
    /// made — queued (shared with the outbox) unless the bound refused them.
    pub fn commit_events(
        &mut self,
        bounds: Option<&QueueBounds>,
        events: Vec<HealthEvent>,
    ) -> (Vec<Arc<PendingBatch>>, Result<(), QueueFull>) {
        let new = self.batches_of(events);
        if let Some(Err(full)) = bounds.map(|b| b.admit(&self.batches, &new)) {
            return (new.into_iter().map(Arc::new).collect(), Err(full));
        }
        (self.queue(new), Ok(()))
    }

    /// The batch with this id was accepted (or dropped as permanently rejected): it leaves.
    pub fn ack(&mut self, id: u64) {
        self.batches.retain(|b| b.id != id);
    }

    /// The batches still owed to the sink, oldest first.
    pub fn pending(&self) -> &[Arc<PendingBatch>] {
        &self.batches
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Batches sent but not saved (the courier's journal's, ids above [`Outbox::last_id`]):
    /// queued again, in order.
    pub fn restore(&mut self, batches: &[PendingBatch]) {
        for b in batches {
            if b.id > self.last_id {
                self.last_id = b.id;
                self.batches.push(Arc::new(b.clone()));
            }
        }
    }

    /// The id of the last batch queued.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// What tells this outbox from another of this process: a queued batch never changes
    /// and ids are not reused, so the ids (and the last one given) are the whole outbox.
    pub fn ids(&self) -> OutboxIds {
        OutboxIds { last: self.last_id, batches: self.batches.iter().map(|b| b.id).collect() }
    }

    /// `self.ids() == *ids`, without making them.
    pub fn has_ids(&self, ids: &OutboxIds) -> bool {
        self.last_id == ids.last
            && self.batches.len() == ids.batches.len()
            && self.batches.iter().zip(&ids.batches).all(|(b, id)| b.id == *id)
    }
}

/// [`Outbox::ids`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OutboxIds {
    last: u64,
    batches: Vec<u64>,
}

/// The most serialized bytes the outbox holds, whatever the sink.
pub const OUTBOX_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The outbox's bound for the socket and JSON-lines sinks: upstream's 1024 batches, and
/// [`OUTBOX_MAX_BYTES`].
pub const OUTBOX_BOUNDS: QueueBounds =
    QueueBounds { max_batches: crate::act::dispatch::direct::DEFAULT_QUEUE_MAX_BATCHES, max_bytes: OUTBOX_MAX_BYTES };

/// The bounded queue: at most `max_batches` batches and `max_bytes` serialized bytes waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    pub max_batches: usize,
    pub max_bytes: usize,
}

/// The queue cannot take a poll's batches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "outbox full: {queued_batches} batch(es) / {queued_bytes} bytes queued, {new_batches} more \
     would exceed {} batches / {} bytes",
    bounds.max_batches,
    bounds.max_bytes
)]
pub struct QueueFull {
    pub queued_batches: usize,
    pub queued_bytes: usize,
    pub new_batches: usize,
    pub bounds: QueueBounds,
}

/// Serialized size of a batch on the wire, one event converted at a time (a batch is never
/// held whole in its wire form).
pub fn wire_size(events: &[HealthEvent]) -> usize {
    use crate::act::dispatch::convert::{to_proto, to_proto_batch};
    use prost::Message;
    /// `HealthEvents.events` (`proto/datamodels/health_event.proto`).
    const EVENTS_TAG: u32 = 2;
    let each: usize = events.iter().map(|ev| prost::encoding::message::encoded_len(EVENTS_TAG, &to_proto(ev))).sum();
    to_proto_batch(&[]).encoded_len() + each
}

impl QueueBounds {
    /// The bound for the sink `spec` names (the module's notes).
    pub fn for_sink(spec: &SinkSpec, grpc: &GrpcConfig) -> QueueBounds {
        let (max_batches, max_bytes) = match (spec, &grpc.direct) {
            (SinkSpec::Grpc, Some(d)) => (d.queue_max_batches, d.queue_max_bytes),
            _ => (OUTBOX_BOUNDS.max_batches, OUTBOX_BOUNDS.max_bytes),
        };
        QueueBounds { max_batches, max_bytes: max_bytes.min(OUTBOX_MAX_BYTES) }
    }

    /// Whether `new` (one poll's batches, all or none) fits behind `queued`.
    pub fn admit<Q: std::borrow::Borrow<PendingBatch>>(
        &self,
        queued: &[Q],
        new: &[PendingBatch],
    ) -> Result<(), QueueFull> {
        if new.is_empty() {
            return Ok(());
        }
        let queued_bytes: usize = queued.iter().map(|b| wire_size(&b.borrow().events)).sum();
        let new_bytes: usize = new.iter().map(|b| wire_size(&b.events)).sum();
        if queued.len() + new.len() > self.max_batches || queued_bytes + new_bytes > self.max_bytes {
            return Err(QueueFull {
                queued_batches: queued.len(),
                queued_bytes,
                new_batches: new.len(),
                bounds: *self,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::Stamp;

    fn ev(check: Check) -> HealthEvent {
        HealthEvent::new(check, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, "x")
    }

    #[test]
    fn one_batch_per_check_in_check_order_and_ack_removes() {
        let mut o = Outbox::default();
        let new =
            o.enqueue(&[ev(Check::NICKernelLogCheck), ev(Check::InfiniBandStateCheck), ev(Check::NICKernelLogCheck)]);
        assert_eq!(
            new.iter().map(|b| (b.id, b.check, b.events.len())).collect::<Vec<_>>(),
            vec![(1, Check::InfiniBandStateCheck, 1), (2, Check::NICKernelLogCheck, 2)]
        );
        assert!(o.enqueue(&[]).is_empty());
        assert_eq!(o.len(), 2);
        o.ack(1);
        assert_eq!(o.pending().iter().map(|b| b.id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(o.enqueue(&[ev(Check::EthernetStateCheck)])[0].id, 3, "ids keep increasing");
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["next_batch_id"], 3);
        assert_eq!(json["outbox"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn events_taken_whole_make_the_same_batches_as_copied() {
        let mut o = Outbox::default();
        o.enqueue(&[ev(Check::EFAStateCheck)]);
        let checks = [Check::NICKernelLogCheck, Check::InfiniBandStateCheck, Check::InfiniBandDegradationCheck];
        for n in [0usize, 1, 2, 7, 40] {
            // Messages tell the events apart, so order within a batch is checked too.
            let events: Vec<HealthEvent> = (0..n)
                .map(|i| {
                    HealthEvent::new(
                        checks[i * 7 % 3],
                        &Stamp::default(),
                        time::OffsetDateTime::UNIX_EPOCH,
                        &i.to_string(),
                    )
                })
                .collect();
            let mut unknown = ev(Check::InfiniBandStateCheck);
            unknown.check_name = "NoSuchCheck".into();
            let with_unknown: Vec<HealthEvent> = events.iter().cloned().chain([unknown]).collect();
            assert_eq!(o.batches_of(with_unknown.clone()), o.batches_for(&with_unknown), "{n} events");
            let (mut a, mut b) = (o.clone(), o.clone());
            let (new, queued) = a.commit_events(Some(&OUTBOX_BOUNDS), events.clone());
            assert_eq!(queued, Ok(()));
            assert_eq!(Ok(new), b.commit(Some(&OUTBOX_BOUNDS), &events));
            assert_eq!(a, b);
        }
    }

    #[test]
    fn wire_size_is_the_whole_batch_encoded_length() {
        use prost::Message;
        for n in [0usize, 1, 2, 300] {
            let events: Vec<HealthEvent> = (0..n)
                .map(|i| {
                    let text = format!("event {i} {}", "y".repeat(i % 200));
                    HealthEvent::new(
                        Check::InfiniBandDegradationCheck,
                        &Stamp::default(),
                        time::OffsetDateTime::now_utc(),
                        &text,
                    )
                })
                .collect();
            assert_eq!(
                wire_size(&events),
                crate::act::dispatch::convert::to_proto_batch(&events).encoded_len(),
                "{n} events"
            );
        }
    }

    #[test]
    fn a_committed_batch_is_shared_with_the_outbox_not_copied() {
        let mut o = Outbox::default();
        let new = o.commit(Some(&OUTBOX_BOUNDS), &[ev(Check::InfiniBandStateCheck)]).unwrap();
        assert!(Arc::ptr_eq(&new[0], &o.pending()[0]));
    }

    fn batch(id: u64, text: &str) -> PendingBatch {
        let ev =
            HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, text);
        PendingBatch { id, check: Check::InfiniBandStateCheck, events: vec![ev] }
    }

    #[test]
    fn the_queue_admits_whole_polls_within_its_bounds() {
        let one = wire_size(&batch(1, "x").events);
        let bounds = QueueBounds { max_batches: 3, max_bytes: 10 * one };
        let queued = vec![batch(1, "x"), batch(2, "x")];
        assert_eq!(bounds.admit(&queued, &[batch(3, "x")]), Ok(()));
        assert_eq!(bounds.admit(&queued, &[]), Ok(()));
        let e = bounds.admit(&queued, &[batch(3, "x"), batch(4, "x")]).unwrap_err();
        assert_eq!((e.queued_batches, e.new_batches), (2, 2));
        assert!(e.to_string().starts_with("outbox full: 2 batch(es)"), "{e}");
        let tight = QueueBounds { max_batches: 100, max_bytes: 2 * one };
        assert!(tight.admit(&queued, &[batch(3, "x")]).is_err());
    }
}
