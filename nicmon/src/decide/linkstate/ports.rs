//! Port transitions (000 §3.4): one event per health boundary crossing of a port, and one
//! more when a non-fatal port escalates to fatal ([`super::escalation`]). A port never
//! healthy in this boot is deferred as "maybe uncabled" for up to [`MAX_DEFERRED_POLLS`]
//! polls and reported only through its card (lesson 1, lesson 11).
use super::escalation::escalate;
use super::flap::{self, FlapState, Settle, Transition};
use super::health::{PortHealth, capped, healthy_text, port_health, state_text};
use super::homogeneity::Cards;
use super::state::{PortRecord, Reported};
use super::{Ctx, Emitted, FlapTransition};
use crate::model::event::{Check, Entity, HealthEvent};
use crate::model::{Device, LinkLayer, Port};

/// A port deferred as "maybe uncabled" on the first poll is decided within this many polls.
pub const MAX_DEFERRED_POLLS: u32 = 3;

/// One port of this poll, with what its step functions share.
pub(super) struct PortView<'a> {
    pub device: &'a Device,
    pub port: &'a Port,
    pub ll: &'a LinkLayer,
    pub check: Check,
}

impl PortView<'_> {
    /// `ev` about this port, if its check is enabled.
    pub fn emit(&self, ctx: &Ctx<'_>, out: &mut Emitted, ev: HealthEvent) {
        out.push(
            ctx,
            self.check,
            ev.entities(vec![Entity::device(self.device.name.clone()), Entity::port(self.port.number)]),
        );
    }

    /// The record of a port seen for the first time.
    pub fn new_record(&self) -> PortRecord {
        PortRecord {
            device: self.device.name.clone(),
            port: self.port.number,
            link_layer: self.ll.clone(),
            state: None,
            phys_state: None,
            reported: Reported::Nothing,
            was_healthy: false,
            unhealthy_since: None,
            deferred_polls: 0,
            speed_degraded: false,
            lid: None,
            sm_lid: None,
            unknown_since: None,
            unknown_reported: false,
            held_since: None,
            flap: FlapState::default(),
        }
    }
}

/// Decide this port's health against its record `r`; `known`: the record existed before
/// this poll; `blip`: the hold-down step found a held transition of this port healthy again
/// this poll ([`super::holddown`]).
pub(super) fn transition(
    ctx: &Ctx<'_>,
    pv: &PortView<'_>,
    cards: &Cards,
    r: &mut PortRecord,
    known: bool,
    blip: bool,
    out: &mut Emitted,
) {
    let health = capped(port_health(pv.port, pv.ll), pv.device.is_software());
    match health {
        PortHealth::Unknown | PortHealth::Quiet => {}
        PortHealth::Healthy => healthy(ctx, pv, r, blip, out),
        // No usable previous state, or never healthy in this boot.
        PortHealth::Fatal | PortHealth::NonFatal { .. } if ctx.first_poll || !known || !r.was_healthy => {
            defer_never_healthy(pv, cards, r, out)
        }
        PortHealth::Fatal | PortHealth::NonFatal { .. } => unhealthy(ctx, pv, cards, health, r, out),
    }
}

/// A healthy port: reported when it crosses the boundary, or once it has settled after
/// flapping.
fn healthy(ctx: &Ctx<'_>, pv: &PortView<'_>, r: &mut PortRecord, blip: bool, out: &mut Emitted) {
    let (d, port, ll) = (pv.device, pv.port, pv.ll);
    if blip {
        blip_transition(ctx, pv, r, out);
    }
    match r.flap.healthy(&ctx.cfg.flap, ctx.now) {
        // Held as flapping: healthy is reported only once it has settled.
        Settle::Settling => {
            r.was_healthy = true;
            r.unhealthy_since = None;
            return;
        }
        Settle::Settled { transitions, stable_for } => {
            let msg = format!(
                "{} - stable for {} s after flapping ({transitions} transitions)",
                healthy_text(&d.name, port, ll),
                stable_for.whole_seconds()
            );
            pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg));
        }
        Settle::NotHeld if r.reported != Reported::Healthy => {
            pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &healthy_text(&d.name, port, ll)));
        }
        Settle::NotHeld => {}
    }
    r.reported = Reported::Healthy;
    r.was_healthy = true;
    r.unhealthy_since = None;
    r.deferred_polls = 0;
}

/// An unhealthy port never healthy in this boot (or without a usable previous state) is
/// reported only through its card (peer evidence, lesson 1); otherwise it is treated as
/// uncabled, decided within [`MAX_DEFERRED_POLLS`] polls (lesson 11).
fn defer_never_healthy(pv: &PortView<'_>, cards: &Cards, r: &mut PortRecord, out: &mut Emitted) {
    if r.deferred_polls < MAX_DEFERRED_POLLS {
        r.deferred_polls += 1;
        if r.deferred_polls == MAX_DEFERRED_POLLS && cards.below(pv.device.card.as_deref()).is_none() {
            out.notes.push(format!(
                "{}: treated as uncabled (never healthy in this boot, card at its peers' mode)",
                state_text(&pv.device.name, pv.port, pv.ll)
            ));
        }
    }
}

/// An unhealthy port that was healthy in this boot: flap damping first, then one event per
/// boundary crossing, fatal at once or after the escalation grace ([`escalate`]).
fn unhealthy(
    ctx: &Ctx<'_>,
    pv: &PortView<'_>,
    cards: &Cards,
    health: PortHealth,
    r: &mut PortRecord,
    out: &mut Emitted,
) {
    let (d, port, ll) = (pv.device, pv.port, pv.ll);
    let since = r.unhealthy_since.unwrap_or(ctx.now);
    r.unhealthy_since = Some(since);
    // Healthy at the previous poll (held or not): this poll is an unhealthy transition.
    if (r.reported == Reported::Healthy || r.flap.held_and_healthy()) && !passes_flap_damping(ctx, pv, r, out) {
        return;
    }
    if r.flap.is_flapping() {
        return;
    }
    let (fatal, why) = escalate(health, d.card.as_deref(), cards, since, ctx.now, ctx.cfg.escalation_grace);
    let now_reported = if fatal { Reported::Fatal } else { Reported::NonFatal };
    let crosses = match r.reported {
        Reported::Healthy | Reported::Nothing => true,
        Reported::NonFatal => fatal,
        Reported::Fatal => false,
    };
    if crosses {
        let msg = format!("{}{why}", state_text(&d.name, port, ll));
        pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg).unhealthy(fatal));
        r.reported = now_reported;
    }
}

/// Flap damping of an unhealthy transition: whether it passes, to be reported as usual
/// (else the port starts flapping, with one fatal event, or the transition is held).
fn passes_flap_damping(ctx: &Ctx<'_>, pv: &PortView<'_>, r: &mut PortRecord, out: &mut Emitted) -> bool {
    match r.flap.unhealthy_transition(&ctx.cfg.flap, ctx.now) {
        Transition::Report => {
            flap_counted(pv, r, true, out);
            true
        }
        Transition::StartsFlapping { transitions } => {
            let msg = format!(
                "{} - port flapping: {transitions} transitions in {} s, held until healthy for {} s",
                state_text(&pv.device.name, pv.port, pv.ll),
                ctx.cfg.flap.window.whole_seconds(),
                ctx.cfg.flap.settle.whole_seconds()
            );
            let fatal = !pv.device.is_software();
            let ev = HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg).unhealthy(fatal).error_code(flap::ERROR_CODE);
            pv.emit(ctx, out, ev);
            r.reported = Reported::Fatal;
            flap_counted(pv, r, true, out);
            false
        }
        Transition::Held => {
            flap_counted(pv, r, false, out);
            false
        }
    }
}

/// A blip (a transition held by `portStateHoldDown` that recovered in time) publishes
/// nothing on its own, but it is an unhealthy transition of the port for flap damping: a
/// port blipping again and again is reported as flapping, and the blip of a port already
/// held as flapping restarts its settle clock.
fn blip_transition(ctx: &Ctx<'_>, pv: &PortView<'_>, r: &mut PortRecord, out: &mut Emitted) {
    match r.flap.unhealthy_transition(&ctx.cfg.flap, ctx.now) {
        Transition::Report | Transition::Held => flap_counted(pv, r, false, out),
        Transition::StartsFlapping { transitions } => {
            let msg = format!(
                "{} - port flapping: {transitions} transitions in {} s (each recovered within \
                 portStateHoldDown), held until healthy for {} s",
                port_text(pv),
                ctx.cfg.flap.window.whole_seconds(),
                ctx.cfg.flap.settle.whole_seconds()
            );
            let fatal = !pv.device.is_software();
            let ev = HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg).unhealthy(fatal).error_code(flap::ERROR_CODE);
            pv.emit(ctx, out, ev);
            r.reported = Reported::Fatal;
            flap_counted(pv, r, true, out);
        }
    }
}

/// The port, named as its events name it (`RoCE port mlx5_2 port 1`).
fn port_text(pv: &PortView<'_>) -> String {
    let text = state_text(&pv.device.name, pv.port, pv.ll);
    match text.split_once(':') {
        Some((name, _)) => name.to_string(),
        None => text,
    }
}

/// Say that flap damping counted an unhealthy transition of this port (metric, log line).
fn flap_counted(pv: &PortView<'_>, r: &PortRecord, published: bool, out: &mut Emitted) {
    out.flaps.push(FlapTransition {
        device: pv.device.name.clone(),
        port: pv.port.number,
        check: pv.check,
        published,
        flapping: r.flap.is_flapping(),
        transitions: r.flap.shown_transitions(),
    });
}

/// Remember what was seen of the port this poll.
pub(super) fn remember(port: &Port, r: &mut PortRecord) {
    r.state = port.state.clone();
    r.phys_state = port.phys_state.clone();
    r.lid = port.lid.or(r.lid);
    r.sm_lid = port.sm_lid.or(r.sm_lid);
}
