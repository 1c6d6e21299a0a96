//! Link state checks (SPEC §1.3, 000 §3–§9; `InfiniBandStateCheck`, `EthernetStateCheck`,
//! `EFAStateCheck`).
//!
//! Pure: `(previous LinkState, snapshot, roles, config, now) → (events, next LinkState)`.
//! No clock, no I/O, and only the state checks' own memory ([`LinkState`]) in and out.
//! [`evaluate`] runs these named steps, in this order, each in its own file:
//! 0. what the steps see: [`efa`] — EFA ports' state from their netdev; then [`holddown`] —
//!    a port held after a healthy→unhealthy edge keeps its last healthy snapshot;
//! 1. [`disappearance`] — known devices missing for 3 polls (with the PCI probe's verdict),
//!    and their return;
//! 2. [`homogeneity`] — active ports per card against its role group's mode;
//! 3. per port: [`unknown`] — a state that is unknown is no decision, said once after the
//!    grace and cleared when readable; [`ports`] — health boundary crossings, deferral of never-healthy ports, and
//!    [`escalation`] of non-fatal ports to fatal (the 30 s grace, or at once by peers);
//!    with [`flap`] damping (a flapping port is one fatal event, held until it settles);
//!    then [`subnet_manager`] — LID / SM LID changes while ACTIVE;
//! 4. [`homogeneity::card_events`] — a card below its group's mode, and its return;
//! 5. [`speed`] — link speed below the group's rate mode.
use std::collections::{BTreeMap, BTreeSet};

use time::{Duration, OffsetDateTime};

use crate::decide::roles::{Classification, Role, device_link_layer};
use crate::model::event::{Check, HealthEvent, Stamp};
use crate::model::{Device, Snapshot};

pub mod disappearance;
pub mod efa;
pub mod escalation;
pub mod flap;
pub mod health;
pub mod holddown;
pub mod homogeneity;
pub mod ports;
pub mod speed;
pub mod state;
pub mod subnet_manager;
#[cfg(test)]
mod tests;
pub mod unknown;

pub use disappearance::MISSES_BEFORE_REPORT;
pub use flap::{FlapConfig, FlapState};
pub use health::{PortHealth, port_health, state_check};
pub use holddown::{Blip, Held, Holds};
pub use ports::MAX_DEFERRED_POLLS;
pub use state::{KnownDevice, LinkState, PortRecord, Reported, port_key};
pub use unknown::with_known_link_layers;

/// The knobs of the state checks: derived from the config file
/// (`config::Config::state_config`), whose defaults are theirs (`StateConfig::default`).
#[derive(Debug, Clone)]
pub struct StateConfig {
    /// A non-fatal port that was healthy in this boot escalates to fatal after this long.
    pub escalation_grace: Duration,
    pub speed_degradation_fatal: bool,
    /// `[stateCheck] portStateHoldDown`: how long a healthy→unhealthy edge is held (0: off).
    pub port_state_hold_down: Duration,
    /// Flap damping (`[stateCheck] flapThreshold`, `flapWindow`, `flapSettle`).
    pub flap: FlapConfig,
    /// Checks enabled (`--checks`).
    pub checks: BTreeSet<Check>,
}

/// The evaluator's output.
pub struct Outcome {
    pub events: Vec<HealthEvent>,
    pub state: LinkState,
    /// Things worth a log line (deferred ports, settled uncabled ports).
    pub notes: Vec<String>,
    /// Ports held by the hold-down this poll, and held transitions that ended as blips.
    pub holds: Holds,
    /// The unhealthy transitions of ports this poll that flap damping counted.
    pub flaps: Vec<FlapTransition>,
}

/// One unhealthy transition counted by flap damping (for its metric and log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlapTransition {
    pub device: String,
    pub port: u32,
    pub check: Check,
    /// An event went out for it (below the threshold, or the "port flapping" event).
    pub published: bool,
    /// The port is held as flapping after it.
    pub flapping: bool,
    /// Transitions counted so far (in the window, or since the hold began).
    pub transitions: u64,
}

/// What every step reads: this poll's inputs.
pub(crate) struct Ctx<'a> {
    pub snap: &'a Snapshot,
    pub roles: &'a BTreeMap<String, Classification>,
    /// Monitored PFs (management NICs and VFs are never evaluated).
    pub monitored: Vec<&'a Device>,
    pub cfg: &'a StateConfig,
    pub now: OffsetDateTime,
    pub stamp: &'a Stamp,
    /// No usable previous state (the first poll of a boot).
    pub first_poll: bool,
    /// What the kernel said was removed lately (device, netdev or PCI address names).
    pub kernel_removed: &'a BTreeSet<String>,
}

impl Ctx<'_> {
    pub fn enabled(&self, check: Check) -> bool {
        self.cfg.checks.contains(&check)
    }

    pub fn role_of(&self, d: &Device) -> Option<Role> {
        self.roles.get(&d.name).and_then(|c| c.role)
    }
}

/// What the steps write, in order.
#[derive(Default)]
pub(crate) struct Emitted {
    pub events: Vec<HealthEvent>,
    pub notes: Vec<String>,
    pub flaps: Vec<FlapTransition>,
}

impl Emitted {
    /// Keep `ev` when `check` is enabled (`--checks`).
    pub fn push(&mut self, ctx: &Ctx<'_>, check: Check, ev: HealthEvent) {
        if ctx.enabled(check) {
            self.events.push(ev);
        }
    }
}

/// Evaluate the state checks for one poll. `first_poll`: no usable previous state;
/// `kernel_removed`: what the kernel said was removed lately ([`disappearance`]).
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    prev: &LinkState,
    first_poll: bool,
    snap: &Snapshot,
    roles: &BTreeMap<String, Classification>,
    cfg: &StateConfig,
    now: OffsetDateTime,
    stamp: &Stamp,
    kernel_removed: &BTreeSet<String>,
) -> Outcome {
    let mut st = prev.clone();
    let (snap, efa_notes) = efa::fold_netdev(snap);
    let (snap, holds) = holddown::hold(snap, &mut st, roles, cfg, first_poll, now);
    let snap = snap.as_ref();
    let monitored = snap
        .devices
        .iter()
        .filter(|d| !d.is_vf() && roles.get(&d.name).map(|c| c.monitored).unwrap_or(false))
        .map(|d| &**d)
        .collect();
    let ctx = Ctx { snap, roles, monitored, cfg, now, stamp, first_poll, kernel_removed };
    let mut out = Emitted { notes: efa_notes, ..Emitted::default() };

    let missing_cards = disappearance::missing_devices(&ctx, &mut st, &mut out);
    disappearance::present_devices(&ctx, &mut st, &mut out);
    let cards = homogeneity::compare_cards(&ctx, &missing_cards);
    let mut key_buf = String::new();
    for d in &ctx.monitored {
        for port in &d.ports {
            let Some(ll) = port.link_layer.as_ref().or(device_link_layer(d)) else {
                continue;
            };
            let Some(check) = state_check(ll) else {
                continue;
            };
            let pv = ports::PortView { device: d, port, ll, check };
            // The record is taken out of `st` (a copy of the last state) and put back: not
            // copied again, and its key not made again.
            state::write_port_key(&mut key_buf, &d.name, port.number);
            let (key, mut r, is_known) = match st.port_states.remove_entry(key_buf.as_str()) {
                Some((key, r)) => (key, r, true),
                None => (key_buf.clone(), pv.new_record(), false),
            };
            unknown::unknown_state(&ctx, &pv, &mut r, &mut out);
            let blip = holds.blips.iter().any(|b| b.device == d.name && b.port == port.number);
            ports::transition(&ctx, &pv, &cards, &mut r, is_known, blip, &mut out);
            subnet_manager::lid_changes(&ctx, &pv, &r, &mut out);
            ports::remember(port, &mut r);
            st.port_states.insert(key, r);
        }
    }
    homogeneity::card_events(&ctx, &cards, &mut st, &mut out);
    speed::speed(&ctx, &mut st, &mut out);

    Outcome { events: out.events, state: st, notes: out.notes, holds, flaps: out.flaps }
}
