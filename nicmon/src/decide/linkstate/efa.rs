//! `EFAStateCheck` (AWS Elastic Fabric Adapter): the `efa` driver hard-codes `ACTIVE` /
//! `LinkUp` in its port files, so an EFA port's state comes from its netdev instead:
//! `operstate` other than `up` or `unknown`, or `carrier` `0`, is `DOWN`/`LinkDown` (fatal,
//! like a RoCE port DOWN). A port whose device has no netdev keeps the driver's state, so
//! only disappearance (and its card's homogeneity) applies to it. A netdev whose `carrier`
//! cannot be read as `0`/`1` while `operstate` does not say down leaves the port unknown
//! for this poll (no decision, one note).
use std::borrow::Cow;

use crate::decide::roles::device_link_layer;
use crate::model::{LinkLayer, OperState, PhysState, Port, PortState, Snapshot};

/// What the netdev says of an EFA port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetdevVerdict {
    Up,
    Down,
    /// `carrier` unreadable or not `0`/`1` (and `operstate` not down).
    Unknown,
}

/// `operstate` down: anything but `up` and `unknown` (RFC 2863; `unknown` is what drivers
/// without carrier reporting show while forwarding).
fn operstate_down(o: &OperState) -> bool {
    !matches!(o, OperState::Up | OperState::Unknown)
}

/// The verdict of an EFA port's netdev signals.
pub fn netdev_verdict(port: &Port) -> NetdevVerdict {
    if port.operstate.as_ref().is_some_and(operstate_down) || port.carrier == Some(false) {
        NetdevVerdict::Down
    } else if port.carrier == Some(true) {
        NetdevVerdict::Up
    } else {
        NetdevVerdict::Unknown
    }
}

/// The snapshot with each EFA port's state taken from its netdev (a copy only when an EFA
/// device with a netdev is present); the notes say which ports were left unknown.
pub(super) fn fold_netdev(snap: &Snapshot) -> (Cow<'_, Snapshot>, Vec<String>) {
    let efa_with_netdev =
        |d: &crate::model::Device| d.netdev.is_some() && device_link_layer(d) == Some(&LinkLayer::Efa);
    if !snap.devices.iter().any(|d| efa_with_netdev(d)) {
        return (Cow::Borrowed(snap), Vec::new());
    }
    let mut notes = Vec::new();
    let mut out = snap.clone();
    for d in out.devices.iter_mut().filter(|d| efa_with_netdev(d)) {
        let d = std::sync::Arc::make_mut(d);
        let nd = d.netdev.clone().unwrap_or_default();
        for p in &mut d.ports {
            match netdev_verdict(p) {
                NetdevVerdict::Up => {}
                NetdevVerdict::Down => {
                    p.state = Some(PortState::Down);
                    p.phys_state = Some(PhysState::LinkDown);
                }
                NetdevVerdict::Unknown => {
                    notes.push(format!(
                        "EFA port {} port {}: netdev {nd} carrier is unreadable or not 0/1 (operstate {}) - \
                         state unknown this poll",
                        d.name,
                        p.number,
                        p.operstate.as_ref().map(|o| o.name()).unwrap_or("unreadable")
                    ));
                    // Unknown is not a value (issue #14): the reason goes where the
                    // unknown step finds it (its note, and its event after the grace).
                    let why = format!(
                        "netdev {nd} carrier unreadable or not 0/1, operstate {}",
                        p.operstate.as_ref().map(|o| o.name()).unwrap_or("unreadable")
                    );
                    p.unknown.insert("state".to_string(), why);
                    p.state = None;
                    p.phys_state = None;
                }
            }
        }
    }
    (Cow::Owned(out), notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(oper: Option<OperState>, carrier: Option<bool>) -> Port {
        Port { number: 1, operstate: oper, carrier, ..Port::default() }
    }

    #[test]
    fn verdict_table() {
        use NetdevVerdict::*;
        assert_eq!(netdev_verdict(&port(Some(OperState::Up), Some(true))), Up);
        assert_eq!(netdev_verdict(&port(Some(OperState::Unknown), Some(true))), Up);
        assert_eq!(netdev_verdict(&port(Some(OperState::Down), None)), Down, "admin-down: carrier EINVAL");
        assert_eq!(netdev_verdict(&port(Some(OperState::LowerLayerDown), Some(true))), Down);
        assert_eq!(netdev_verdict(&port(Some(OperState::Dormant), Some(true))), Down);
        assert_eq!(netdev_verdict(&port(Some(OperState::Up), Some(false))), Down);
        assert_eq!(netdev_verdict(&port(Some(OperState::Up), None)), Unknown, "carrier not 0/1");
        assert_eq!(netdev_verdict(&port(None, None)), Unknown);
    }
}
