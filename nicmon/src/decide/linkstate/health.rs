//! A port's health from its state, and the texts the state checks' events carry.
use crate::model::event::Check;
use crate::model::{LinkLayer, PhysState, Port, PortState};

/// How unhealthy a port is, before escalation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortHealth {
    Healthy,
    /// Unhealthy but not (yet) fatal. `escalates`: logical DOWN while training, INIT, ARMED —
    /// fatal after the grace, or at once when its card is below its peers.
    NonFatal {
        escalates: bool,
    },
    Fatal,
    /// An Ethernet port in a state that is not reported (INIT, ARMED: sub-second transients).
    Quiet,
    /// State unreadable: no decision this poll.
    Unknown,
}

/// The state check of a link layer.
pub fn state_check(ll: &LinkLayer) -> Option<Check> {
    match ll {
        LinkLayer::InfiniBand => Some(Check::InfiniBandStateCheck),
        LinkLayer::Ethernet => Some(Check::EthernetStateCheck),
        // Its state comes from the netdev (see [`super::efa`]): the efa driver hard-codes
        // ACTIVE/LinkUp in the port files.
        LinkLayer::Efa => Some(Check::EFAStateCheck),
        LinkLayer::Unknown(_) => None,
    }
}

/// The state check of a device whose link layer is known only by name (state file):
/// Ethernet's, EFA's, else InfiniBand's (a disappearance is reported once, under one check:
/// lesson 7).
pub(super) fn state_check_named(link_layer: &str) -> Check {
    if link_layer == LinkLayer::Ethernet.name() {
        Check::EthernetStateCheck
    } else if link_layer == LinkLayer::Efa.name() {
        Check::EFAStateCheck
    } else {
        Check::InfiniBandStateCheck
    }
}

/// Classify a port's state (000 §3, SPEC §1.3).
pub fn port_health(port: &Port, ll: &LinkLayer) -> PortHealth {
    // Unknown is not a value: an unreadable, empty or unparsable state or phys_state is no
    // decision (issue #14), never DOWN and never an escalating "other" state.
    let (Some(state), Some(phys)) = (&port.state, &port.phys_state) else {
        return PortHealth::Unknown;
    };
    if port.unknown_state().is_some() {
        return PortHealth::Unknown;
    }
    if port.is_healthy() {
        return PortHealth::Healthy;
    }
    if *phys == PhysState::Disabled {
        return PortHealth::Fatal;
    }
    if matches!(ll, LinkLayer::Ethernet | LinkLayer::Efa) {
        // RoCE and EFA (state from the netdev): DOWN is fatal (with the operstate in the
        // message); the rest is not reported.
        return if *state == PortState::Down { PortHealth::Fatal } else { PortHealth::Quiet };
    }
    match state {
        // A pulled cable and a brief retrain look alike for a moment: non-fatal, escalating.
        PortState::Down if phys.is_training() => PortHealth::NonFatal { escalates: true },
        PortState::Down => PortHealth::Fatal,
        PortState::Init | PortState::Armed => PortHealth::NonFatal { escalates: true },
        _ => PortHealth::NonFatal { escalates: false },
    }
}

/// A software RDMA device's port (rxe, siw: SPEC §1.14) is never fatal: a fatal state is
/// non-fatal there, and nothing escalates (no card, no peers, a test fabric).
pub fn capped(health: PortHealth, software: bool) -> PortHealth {
    match health {
        PortHealth::Fatal | PortHealth::NonFatal { .. } if software => PortHealth::NonFatal { escalates: false },
        other => other,
    }
}

fn name_or_unknown(s: Option<&str>) -> &str {
    s.unwrap_or("unknown")
}

/// `"Port mlx5_0 port 1: state DOWN, phys_state Disabled"` (000 §13), RoCE with operstate.
pub(super) fn state_text(dev: &str, port: &Port, ll: &LinkLayer) -> String {
    let st = name_or_unknown(port.state.as_ref().map(|s| s.name()));
    let ph = name_or_unknown(port.phys_state.as_ref().map(|s| s.name()));
    match ll {
        LinkLayer::Ethernet => format!(
            "RoCE port {dev} port {}: state {st}, phys_state {ph}, operstate {}",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name()))
        ),
        LinkLayer::Efa => format!(
            "EFA port {dev} port {}: state {st}, phys_state {ph} (netdev operstate {}, carrier {})",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name())),
            carrier_text(port.carrier)
        ),
        _ => format!("Port {dev} port {}: state {st}, phys_state {ph}", port.number),
    }
}

fn carrier_text(c: Option<bool>) -> &'static str {
    match c {
        Some(true) => "1",
        Some(false) => "0",
        None => "unreadable",
    }
}

pub(super) fn healthy_text(dev: &str, port: &Port, ll: &LinkLayer) -> String {
    match ll {
        LinkLayer::Ethernet => format!(
            "RoCE port {dev} port {}: healthy (ACTIVE, LinkUp, operstate {})",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name()))
        ),
        LinkLayer::Efa => format!(
            "EFA port {dev} port {}: healthy (netdev operstate {}, carrier {})",
            port.number,
            name_or_unknown(port.operstate.as_ref().map(|o| o.name())),
            carrier_text(port.carrier)
        ),
        _ => format!("Port {dev} port {}: healthy (ACTIVE, LinkUp)", port.number),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(state: &str, phys: &str) -> Port {
        Port {
            number: 1,
            state: crate::read::parse::port_state(state),
            phys_state: crate::read::parse::phys_state(phys),
            ..Port::default()
        }
    }

    #[test]
    fn port_health_table() {
        let ib = LinkLayer::InfiniBand;
        let eth = LinkLayer::Ethernet;
        assert_eq!(port_health(&port("4: ACTIVE", "5: LinkUp"), &ib), PortHealth::Healthy);
        assert_eq!(port_health(&port("1: DOWN", "3: Disabled"), &ib), PortHealth::Fatal);
        assert_eq!(port_health(&port("1: DOWN", "2: Polling"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(
            port_health(&port("1: DOWN", "6: LinkErrorRecovery"), &ib),
            PortHealth::NonFatal { escalates: true }
        );
        assert_eq!(port_health(&port("1: DOWN", "1: Sleep"), &ib), PortHealth::Fatal);
        assert_eq!(port_health(&port("2: INIT", "5: LinkUp"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(port_health(&port("3: ARMED", "5: LinkUp"), &ib), PortHealth::NonFatal { escalates: true });
        assert_eq!(
            port_health(&port("4: ACTIVE", "6: LinkErrorRecovery"), &ib),
            PortHealth::NonFatal { escalates: false }
        );
        assert_eq!(port_health(&port("1: DOWN", "2: Polling"), &eth), PortHealth::Fatal);
        assert_eq!(port_health(&port("2: INIT", "5: LinkUp"), &eth), PortHealth::Quiet);
        assert_eq!(port_health(&port("", "5: LinkUp"), &ib), PortHealth::Unknown);
        // Unparsable on one side only is still no decision (it used to escalate).
        assert_eq!(port_health(&port("N/A (no PMA)", "5: LinkUp"), &ib), PortHealth::Unknown);
        assert_eq!(port_health(&port("-1", "5: LinkUp"), &ib), PortHealth::Unknown);
        assert_eq!(port_health(&port("1: DOWN", "\u{1}\u{2}"), &ib), PortHealth::Unknown);
        assert_eq!(port_health(&port("4: ACTIVE", "4: ACTIVE"), &ib), PortHealth::Unknown);
        let efa = LinkLayer::Efa;
        let efa_down = Port { phys_state: Some(PhysState::LinkDown), ..port("1: DOWN", "") };
        assert_eq!(port_health(&efa_down, &efa), PortHealth::Fatal);
        // From a sysfs file "LinkDown" is no phys_state name: unknown, no decision.
        assert_eq!(port_health(&port("1: DOWN", "LinkDown"), &efa), PortHealth::Unknown);
        assert_eq!(port_health(&port("4: ACTIVE", "5: LinkUp"), &efa), PortHealth::Healthy);
        assert_eq!(state_check(&efa), Some(Check::EFAStateCheck));
        assert_eq!(state_check_named("EFA"), Check::EFAStateCheck);
        assert_eq!(state_check_named("Ethernet"), Check::EthernetStateCheck);
        assert_eq!(state_check_named("InfiniBand"), Check::InfiniBandStateCheck);
    }
}
