//! The outbox: the health events detected and not yet delivered — data, and the rule that
//! lets them in. What moves them (the sender, the journal, acknowledgements, the saves) is
//! [`crate::courier`].
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
use serde::{Deserialize, Serialize};

use crate::dispatch::{GrpcConfig, SinkSpec};
use crate::event::{Check, HealthEvent};

/// One check's events of one poll cycle, waiting for the sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingBatch {
    /// Increasing id: acknowledgements name it.
    pub id: u64,
    pub check: Check,
    pub events: Vec<HealthEvent>,
}

/// The batches not yet accepted, oldest first; persisted in the state file as its
/// `outbox` and `next_batch_id` keys.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outbox {
    #[serde(default, rename = "outbox")]
    batches: Vec<PendingBatch>,
    /// The id of the last batch queued.
    #[serde(default, rename = "next_batch_id")]
    last_id: u64,
}

impl Outbox {
    /// `events` as one batch per check, in [`Check::ALL`] order, with the ids they would
    /// get if queued now (nothing is queued).
    pub fn batches_for(&self, events: &[HealthEvent]) -> Vec<PendingBatch> {
        let mut new = Vec::new();
        let mut id = self.last_id;
        for check in Check::ALL {
            let batch: Vec<HealthEvent> = events.iter().filter(|e| e.check() == Some(check)).cloned().collect();
            if batch.is_empty() {
                continue;
            }
            id += 1;
            new.push(PendingBatch { id, check, events: batch });
        }
        new
    }

    /// Append `events` as one batch per check, in [`Check::ALL`] order; returns the new
    /// batches. In the daemon only the courier queues, through [`Outbox::commit`] (it keeps
    /// the checks' state and the outbox moving together).
    pub fn enqueue(&mut self, events: &[HealthEvent]) -> Vec<PendingBatch> {
        let new = self.batches_for(events);
        if let Some(last) = new.last() {
            self.last_id = last.id;
        }
        self.batches.extend(new.iter().cloned());
        new
    }

    /// The commit rule: queue one poll's `events` whole, or — when `bounds` refuses them —
    /// nothing. Returns the new batches.
    pub fn commit(
        &mut self,
        bounds: Option<&QueueBounds>,
        events: &[HealthEvent],
    ) -> Result<Vec<PendingBatch>, QueueFull> {
        if let Some(bounds) = bounds {
            bounds.admit(&self.batches, &self.batches_for(events))?;
        }
        Ok(self.enqueue(events))
    }

    /// The batch with this id was accepted (or dropped as permanently rejected): it leaves.
    pub fn ack(&mut self, id: u64) {
        self.batches.retain(|b| b.id != id);
    }

    /// The batches still owed to the sink, oldest first.
    pub fn pending(&self) -> &[PendingBatch] {
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
                self.batches.push(b.clone());
            }
        }
    }

    /// The id of the last batch queued.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }
}

/// The most serialized bytes the outbox holds, whatever the sink.
pub const OUTBOX_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The outbox's bound for the socket and JSON-lines sinks: upstream's 1024 batches, and
/// [`OUTBOX_MAX_BYTES`].
pub const OUTBOX_BOUNDS: QueueBounds =
    QueueBounds { max_batches: crate::dispatch::direct::DEFAULT_QUEUE_MAX_BATCHES, max_bytes: OUTBOX_MAX_BYTES };

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

/// Serialized size of a batch on the wire.
pub fn wire_size(events: &[HealthEvent]) -> usize {
    use prost::Message;
    crate::dispatch::convert::to_proto_batch(events).encoded_len()
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
    pub fn admit(&self, queued: &[PendingBatch], new: &[PendingBatch]) -> Result<(), QueueFull> {
        if new.is_empty() {
            return Ok(());
        }
        let queued_bytes: usize = queued.iter().map(|b| wire_size(&b.events)).sum();
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
    use crate::event::Stamp;

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
