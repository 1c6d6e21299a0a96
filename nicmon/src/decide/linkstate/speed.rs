//! Link speed (`LinkSpeedDegraded`): a healthy port whose rate is below its role group's
//! rate mode (no static target: the peers set it). Non-fatal unless
//! `[stateDetection] speedDegradationFatal`; one event when it falls below, one when back.
use std::collections::BTreeMap;

use super::health::state_check;
use super::homogeneity::{Group, unique_mode};
use super::state::{LinkState, write_port_key};
use super::{Ctx, Emitted};
use crate::decide::roles::device_link_layer;
use crate::model::event::{Entity, HealthEvent};

/// A rate in Mb/s, as an exact key for the mode.
fn rate_key(gbps: f64) -> u64 {
    (gbps * 1000.0).round() as u64
}

pub(super) fn speed(ctx: &Ctx<'_>, st: &mut LinkState, out: &mut Emitted) {
    let mut rates: BTreeMap<Group<'_>, Vec<u64>> = BTreeMap::new();
    let mut key = String::new();
    // A software device's rate is its netdev's, whatever that is: it has no peers.
    let hardware: Vec<_> = ctx.monitored.iter().filter(|d| !d.is_software()).collect();
    for d in &hardware {
        let (Some(role), Some(ll)) = (ctx.role_of(d), device_link_layer(d)) else {
            continue;
        };
        for p in d.ports.iter().filter(|p| p.is_healthy()) {
            if let Some(r) = &p.rate {
                rates.entry((role, ll)).or_default().push(rate_key(r.gbps));
            }
        }
    }
    for d in &hardware {
        let (Some(role), Some(ll)) = (ctx.role_of(d), device_link_layer(d)) else {
            continue;
        };
        let Some(check) = state_check(ll) else {
            continue;
        };
        let mode = rates.get(&(role, ll)).and_then(|v| unique_mode(v.iter().copied()));
        for p in d.ports.iter().filter(|p| p.is_healthy()) {
            let (Some(mode), Some(rate)) = (mode, &p.rate) else {
                continue;
            };
            write_port_key(&mut key, &d.name, p.number);
            let Some(r) = st.port_states.get_mut(key.as_str()) else {
                continue;
            };
            let below = rate_key(rate.gbps) < mode;
            let ents = vec![Entity::device(d.name.clone()), Entity::port(p.number)];
            let mode_gbps = mode as f64 / 1000.0;
            if below && !r.speed_degraded {
                r.speed_degraded = true;
                let msg = format!(
                    "Port {} port {}: link speed {} Gb/s is below its group's {} Gb/s ({}, {}) - LinkSpeedDegraded",
                    d.name,
                    p.number,
                    rate.gbps,
                    mode_gbps,
                    role.as_str(),
                    ll.name()
                );
                out.push(
                    ctx,
                    check,
                    HealthEvent::new(check, ctx.stamp, ctx.now, &msg)
                        .unhealthy(ctx.cfg.speed_degradation_fatal)
                        .error_code("LinkSpeedDegraded")
                        .entities(ents),
                );
            } else if !below && r.speed_degraded {
                r.speed_degraded = false;
                let msg = format!(
                    "Port {} port {}: link speed {} Gb/s is back at its group's rate",
                    d.name, p.number, rate.gbps
                );
                out.push(
                    ctx,
                    check,
                    HealthEvent::new(check, ctx.stamp, ctx.now, &msg).error_code("LinkSpeedDegraded").entities(ents),
                );
            }
        }
    }
}
