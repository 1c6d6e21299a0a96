//! Escalation (SPEC §1.3, 000 §3.4): when a non-fatal port becomes fatal.
//!
//! Only a port that was healthy earlier in this boot gets here (a port never healthy is
//! deferred as uncabled, see [`super::ports`]). A non-fatal port is fatal
//! - **at once** when its card has fewer active ports than its role group's mode (peer
//!   evidence: the card, not the cable, is at fault) — whatever its non-fatal state
//!   (`ACTIVE` + `LinkErrorRecovery` too), else
//! - **after the grace**, for the escalating states only (logical DOWN while training, INIT,
//!   ARMED; `[stateDetection] escalationGraceSeconds`, default 30 s) of being
//!   continuously unhealthy, counted from the first unhealthy poll.
//!
//! The suffix returned goes at the end of the event's message and says which rule fired.
use time::{Duration, OffsetDateTime};

use super::health::PortHealth;
use super::homogeneity::Cards;

/// Whether an unhealthy port is fatal now, and the message suffix that says why.
/// `since`: the start of this unhealthy episode; `card`: the port's card.
pub(super) fn escalate(
    health: PortHealth,
    card: Option<&str>,
    cards: &Cards,
    since: OffsetDateTime,
    now: OffsetDateTime,
    grace: Duration,
) -> (bool, String) {
    match health {
        PortHealth::Fatal => (true, String::new()),
        PortHealth::NonFatal { escalates } => {
            if let Some(mode) = cards.below(card) {
                let active = cards.active(card);
                (true, format!(" - card {} has {active} active ports, its peers {mode}", card.unwrap_or("?")))
            } else if escalates && now - since >= grace {
                (true, format!(" - still unhealthy after {} s", (now - since).whole_seconds()))
            } else {
                (false, String::new())
            }
        }
        // Healthy, quiet and unknown ports are not escalated (the caller never asks).
        PortHealth::Healthy | PortHealth::Quiet | PortHealth::Unknown => (false, String::new()),
    }
}
