//! Port hold-down (`[stateCheck] portStateHoldDown`, upstream's DOWN-blip filter): a port
//! reported healthy that turns unhealthy is held for the hold-down before anything is said.
//! While held it keeps its last healthy snapshot (`ACTIVE`/`LinkUp`), so neither its port
//! event nor its card's homogeneity event is emitted. Held past the hold-down → the
//! snapshot is left as read and the transition is reported once, by [`super::ports`], with
//! the episode counted from the first held poll. Healthy again before that → a blip: nothing
//! is published and [`Blip`] is returned for `nic_health_monitor_port_state_blips_total`.
//!
//! Only that healthy→unhealthy edge is held: recoveries, ports seen for the first time (no
//! record, or the first poll of a boot) and escalations of a port already reported unhealthy
//! never are. A poll where the port is unknown (unreadable) or its device is missing keeps
//! the hold as it is. The hold's start is in the port's record (persisted with it).
use std::borrow::Cow;
use std::collections::BTreeMap;

use time::OffsetDateTime;

use super::StateConfig;
use super::health::{PortHealth, port_health, state_check};
use super::state::{LinkState, Reported, port_key};
use crate::decide::roles::{Classification, device_link_layer};
use crate::model::event::Check;
use crate::model::{Device, PhysState, PortState, Snapshot};

/// A held transition that ended healthy before the hold-down: published nothing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Blip {
    pub check: Check,
    pub device: String,
    pub port: u32,
}

/// A port held this poll (trace, `check` report).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Held {
    pub check: Check,
    pub device: String,
    pub port: u32,
    /// The state as read (`DOWN/Disabled`), which the evaluation does not see yet.
    pub state: String,
    /// Milliseconds left before it is reported (0 < left ≤ hold-down).
    pub left_ms: i64,
}

/// What the hold-down step decided this poll.
#[derive(Debug, Default)]
pub struct Holds {
    pub held: Vec<Held>,
    pub blips: Vec<Blip>,
}

/// Apply the hold-down to `snap` (a copy when a port is held) and update the holds in `st`.
pub(super) fn hold<'a>(
    snap: Cow<'a, Snapshot>,
    st: &mut LinkState,
    roles: &BTreeMap<String, Classification>,
    cfg: &StateConfig,
    first_poll: bool,
    now: OffsetDateTime,
) -> (Cow<'a, Snapshot>, Holds) {
    let mut holds = Holds::default();
    if cfg.port_state_hold_down.is_zero() || first_poll {
        for r in st.port_states.values_mut() {
            r.held_since = None;
        }
        return (snap, holds);
    }
    let monitored = |d: &Device| !d.is_vf() && roles.get(&d.name).map(|c| c.monitored).unwrap_or(false);
    // (device index, port index) of the ports to show as last healthy.
    let mut rewrite = Vec::new();
    for (di, d) in snap.devices.iter().enumerate().filter(|(_, d)| monitored(d)) {
        for (pi, port) in d.ports.iter().enumerate() {
            let Some(ll) = port.link_layer.as_ref().or(device_link_layer(d)) else {
                continue;
            };
            let Some(check) = state_check(ll) else {
                continue;
            };
            let Some(r) = st.port_states.get_mut(&port_key(&d.name, port.number)) else {
                continue;
            };
            match port_health(port, ll) {
                PortHealth::Healthy if r.held_since.is_some() => {
                    r.held_since = None;
                    holds.blips.push(Blip { check, device: d.name.clone(), port: port.number });
                }
                PortHealth::Fatal | PortHealth::NonFatal { .. } if r.reported == Reported::Healthy => {
                    let since = *r.held_since.get_or_insert(now);
                    let due = since + cfg.port_state_hold_down;
                    if now < due {
                        rewrite.push((di, pi));
                        let name = |s: Option<&str>| s.unwrap_or("unknown").to_string();
                        holds.held.push(Held {
                            check,
                            device: d.name.clone(),
                            port: port.number,
                            state: format!(
                                "{}/{}",
                                name(port.state.as_ref().map(|s| s.name())),
                                name(port.phys_state.as_ref().map(|s| s.name()))
                            ),
                            left_ms: (due - now).whole_milliseconds() as i64,
                        });
                    } else {
                        // Due: reported now, the episode counted from the first held poll.
                        r.held_since = None;
                        r.unhealthy_since = Some(since);
                    }
                }
                // Unknown (unreadable), quiet, or already reported unhealthy: the hold,
                // if any, stays as it is.
                _ => {}
            }
        }
    }
    if rewrite.is_empty() {
        return (snap, holds);
    }
    let mut owned = snap.into_owned();
    for (di, pi) in rewrite {
        let p = &mut std::sync::Arc::make_mut(&mut owned.devices[di]).ports[pi];
        p.state = Some(PortState::Active);
        p.phys_state = Some(PhysState::LinkUp);
    }
    (Cow::Owned(owned), holds)
}
