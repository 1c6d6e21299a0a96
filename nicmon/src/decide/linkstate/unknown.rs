//! Unknown is not a value (issue #14): a port whose `state` or `phys_state` is unreadable,
//! empty or unparsable gets no state decision while it is so (see [`super::health`]) and is
//! left out of its card's comparison (see [`super::homogeneity`]). This step says so:
//! - a log note when a port's state becomes unknown, and when it is readable again;
//! - unknown for longer than the escalation grace → **one non-fatal event** naming the
//!   attribute and why (unless a fatal event for the port is outstanding: it stands);
//! - readable again after that event → one healthy event clearing it; the port's own
//!   transition step then reports what it reads now.
//!
//! A port whose `link_layer` is unknown is judged with its last known link layer
//! ([`with_known_link_layers`]), so it is decided, not unknown.
use super::ports::PortView;
use super::state::{LinkState, PortRecord, Reported, port_key};
use super::{Ctx, Emitted};
use crate::model::event::HealthEvent;
use crate::model::{LinkLayer, Snapshot};

/// Note, report and clear the unknown episodes of one port. Runs before the port's
/// transition step.
pub(super) fn unknown_state(ctx: &Ctx<'_>, pv: &PortView<'_>, r: &mut PortRecord, out: &mut Emitted) {
    let who = format!("Port {} port {}", pv.device.name, pv.port.number);
    match pv.port.unknown_state() {
        Some((attr, why)) => {
            let since = *r.unknown_since.get_or_insert_with(|| {
                out.notes.push(format!("{who}: {attr} unknown ({why}): no state decision until it is readable"));
                ctx.now
            });
            let lasted = ctx.now - since;
            if !r.unknown_reported && r.reported != Reported::Fatal && lasted >= ctx.cfg.escalation_grace {
                let msg = format!(
                    "{who}: {attr} unknown ({why}) for {} s - no state decision until it is readable",
                    lasted.whole_seconds()
                );
                pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg).unhealthy(false));
                r.unknown_reported = true;
            }
        }
        None => {
            if r.unknown_since.take().is_some() {
                out.notes.push(format!("{who}: state readable again"));
            }
            if r.unknown_reported {
                r.unknown_reported = false;
                let msg = format!("{who}: state readable again");
                pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg));
                // The platform now holds "healthy" for the port: the transition step
                // reports from there (an unhealthy port crosses again).
                r.reported = Reported::Healthy;
            }
        }
    }
}

/// `snap` with each port whose `link_layer` is unknown given its last known one (from the
/// port's record, else its device's), so that what is readable is still judged. The reason
/// stays in the port's `unknown` map, saying which link layer it was judged with.
pub fn with_known_link_layers(prev: &LinkState, mut snap: Snapshot) -> Snapshot {
    let unknown = |p: &crate::model::Port| matches!(p.link_layer, None | Some(LinkLayer::Unknown(_)));
    for d in snap.devices.iter_mut().filter(|d| d.ports.iter().any(unknown)) {
        let d = std::sync::Arc::make_mut(d);
        for p in &mut d.ports {
            if !unknown(p) {
                continue;
            }
            let last = prev
                .port_states
                .get(&port_key(&d.name, p.number))
                .map(|r| r.link_layer.clone())
                .or_else(|| prev.known_devices.get(&d.name).map(|k| LinkLayer::from_name(&k.link_layer)));
            let ll = match last {
                Some(ll @ (LinkLayer::InfiniBand | LinkLayer::Ethernet)) => ll,
                _ => continue,
            };
            let why = p.unknown.get("link_layer").cloned().unwrap_or_else(|| "unknown".to_string());
            p.unknown.insert("link_layer".to_string(), format!("{why}; judged as {} (last known)", ll.name()));
            p.link_layer = Some(ll);
        }
    }
    snap
}
