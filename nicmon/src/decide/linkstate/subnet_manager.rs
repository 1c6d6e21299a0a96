//! Subnet Manager failover / heavy sweep evidence (003): an InfiniBand port's LID or SM LID
//! changed while the port stayed ACTIVE. Non-fatal, `SubnetManagerChanged` / `LidChanged`.
use super::ports::PortView;
use super::state::PortRecord;
use super::{Ctx, Emitted};
use crate::model::event::HealthEvent;
use crate::model::{LinkLayer, PortState};

/// Compare the port's LIDs with its record (before [`super::ports::remember`] updates it).
pub(super) fn lid_changes(ctx: &Ctx<'_>, pv: &PortView<'_>, r: &PortRecord, out: &mut Emitted) {
    let port = pv.port;
    let active_now = port.state == Some(PortState::Active);
    let was_active = r.state == Some(crate::model::PortState::Active);
    if !(active_now && was_active && *pv.ll == LinkLayer::InfiniBand) {
        return;
    }
    for (what, old, new) in [("sm_lid", r.sm_lid, port.sm_lid), ("lid", r.lid, port.lid)] {
        if let (Some(o), Some(n)) = (old, new)
            && o != n
        {
            let code = if what == "sm_lid" { "SubnetManagerChanged" } else { "LidChanged" };
            let msg = format!(
                "Port {} port {}: {what} changed from {o:#x} to {n:#x} while ACTIVE (Subnet Manager failover or heavy sweep)",
                pv.device.name, port.number
            );
            pv.emit(ctx, out, HealthEvent::new(pv.check, ctx.stamp, ctx.now, &msg).unhealthy(false).error_code(code));
        }
    }
}
