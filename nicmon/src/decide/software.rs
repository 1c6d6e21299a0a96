//! Software RDMA devices (`rxe`, `siw`; SPEC §1.14) are never fatal.
//!
//! They have no PCI function: no card to replace, no firmware, a netdev of any kind below
//! them. What they report says something about the test fabric, not about hardware to
//! remediate. The state checks already judge their ports non-fatal (no escalation, no
//! fatal flapping, a non-fatal disappearance, `linkstate`); this last step holds for every
//! check — a counter rule the operator made fatal included: an unhealthy event about a
//! software device is non-fatal, with the action `NONE`, and says why.
use std::collections::BTreeSet;

use crate::decide::linkstate::LinkState;
use crate::model::Snapshot;
use crate::model::event::{HealthEvent, RecommendedAction, Subject};

/// What a capped event's message ends with.
pub const NOT_FATAL: &str = " - software RDMA device: not fatal";

/// The software devices of this poll, and those the state checks remember (a device gone
/// from the snapshot is still one).
pub fn devices(snapshot: &Snapshot, links: &LinkState) -> BTreeSet<String> {
    let present = snapshot.devices.iter().filter(|d| d.is_software()).map(|d| d.name.clone());
    let known = links.known_devices.iter().filter(|(_, k)| k.software).map(|(n, _)| n.clone());
    present.chain(known).collect()
}

/// Make every fatal event about a software device non-fatal.
pub fn never_fatal(events: &mut [HealthEvent], software: &BTreeSet<String>) {
    if software.is_empty() {
        return;
    }
    for e in events.iter_mut().filter(|e| e.is_fatal) {
        let about = match e.subject() {
            Subject::Port { device, .. } | Subject::Device(device) => software.contains(device),
            Subject::Card(_) | Subject::Node => false,
        };
        if about {
            e.is_fatal = false;
            e.recommended_action = RecommendedAction::NONE;
            e.message.push_str(NOT_FATAL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Check, Entity, Stamp};

    #[test]
    fn fatal_events_about_software_devices_are_not_fatal() {
        let at = time::OffsetDateTime::UNIX_EPOCH;
        let ev = |dev: &str| {
            HealthEvent::new(Check::EthernetDegradationCheck, &Stamp::default(), at, "x")
                .unhealthy(true)
                .entities(vec![Entity::device(dev), Entity::port(1)])
        };
        let mut events = vec![ev("rxe0"), ev("bnxt_re0")];
        never_fatal(&mut events, &["rxe0".to_string()].into());
        assert_eq!((events[0].is_fatal, events[0].recommended_action), (false, RecommendedAction::NONE));
        assert!(events[0].message.ends_with(NOT_FATAL));
        assert_eq!((events[1].is_fatal, events[1].recommended_action), (true, RecommendedAction::REPLACE_VM));
    }
}
