//! The daemon's log lines about a poll's outcome (events, flaps, blips, notes).
use crate::decide::poll::Poll;
use crate::model::event::HealthEvent;

/// Log what a poll found: its notes, flaps and `events` (its events, as batched: in check
/// order).
pub(super) fn poll<'e>(poll: &Poll, events: impl Iterator<Item = &'e HealthEvent>) {
    for n in &poll.notes {
        tracing::info!("{n}");
    }
    log_flaps(&poll.flaps);
    for e in events {
        log_event(e);
    }
}

/// Held port transitions that recovered within `portStateHoldDown` (once committed).
pub(super) fn blips(blips: &[crate::decide::linkstate::Blip]) {
    for b in blips {
        tracing::info!(
            check = %b.check,
            device = %b.device,
            port = b.port,
            "port recovered within portStateHoldDown: blip, not reported"
        );
    }
}

fn log_event(e: &crate::model::event::HealthEvent) {
    let ents = e.entities_text();
    tracing::info!(
        check = %e.check_name,
        healthy = e.is_healthy,
        fatal = e.is_fatal,
        action = ?e.recommended_action,
        entities = %ents,
        error_code = %e.error_code.join(","),
        "{}", e.message
    );
}

/// One line per unhealthy transition flap damping counted: those it held publish nothing,
/// so this line (and the metric) is where they show.
fn log_flaps(flaps: &[crate::decide::linkstate::FlapTransition]) {
    for f in flaps {
        if f.flapping && !f.published {
            tracing::info!(
                device = %f.device, port = f.port, check = %f.check, transitions = f.transitions,
                "port held as flapping: unhealthy transition not published"
            );
        } else if f.flapping {
            tracing::warn!(
                device = %f.device, port = f.port, check = %f.check, transitions = f.transitions,
                "port flapping: one fatal event sent, further transitions held until it settles"
            );
        }
    }
}
