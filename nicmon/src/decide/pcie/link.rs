//! Link training (SPEC §1.10): is a card's PCIe link running at what both of its ends can do?
//!
//! Pure. A card's link is judged once (every PF of a card reports the same link); its
//! events name the card's first monitored PF. **Downtrained** = the current speed or width
//! below `min(device max, upstream port max)`: a link limited by its slot (a Gen5 NIC in a
//! Gen4 slot, an x16 card in an x8 slot or bifurcated port) runs at what both ends can do
//! and is not degraded. No decision — the last one stands — while the link is down
//! (`Unknown` speed and no width: the port checks decide about a down link), a figure is
//! unreadable, or the PF hangs from no PCI bridge (nothing to compare with). A link that is
//! up at a speed the kernel has no name for (before 4.17 a Gen4 link reads `Unknown speed`,
//! its width non-zero) is judged by its width alone: below the maximum width it is
//! downtrained, its message saying that the speed is unknown. The card's role-group peers
//! (same role, same model, same capability) say whether it is alone below: the event names
//! the peers' figure when it is.
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Finding, Health};
use crate::decide::roles::Role;
use crate::model::pcie::parse::Speed;
use crate::model::pcie::reading::PcieReading;

/// The error code of the link events.
pub const DOWNTRAINED: &str = "pcie_link_downtrained";

/// What a link can do: the lower of its two ends' maxima (`None` when either is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capability {
    pub width: Option<u8>,
    pub speed: Option<Speed>,
}

/// A link's figures: lanes and speed.
type Figure = (u8, Speed);

/// One figure below what the link can do: `(current, capable)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    pub width: Option<(u8, u8)>,
    pub speed: Option<(Speed, Speed)>,
    /// The current speed is unknown (judged by the width alone).
    pub speed_unknown: bool,
}

impl Shortfall {
    /// `"x8 of x16, 16.0 of 32.0 GT/s"` (the figures that fall short).
    pub fn text(&self) -> String {
        let mut parts = Vec::new();
        if let Some((now, cap)) = self.width {
            parts.push(format!("x{now} of x{cap}"));
        }
        if let Some((now, cap)) = self.speed {
            parts.push(format!("{} of {} GT/s", now.number(), cap.number()));
        }
        if self.speed_unknown {
            parts.push("speed unknown".into());
        }
        parts.join(", ")
    }
}

/// The verdict on one link this poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Training {
    /// At what both ends can do (`speed` `None`: up at a speed the kernel has no name for,
    /// at full width).
    Full { width: u8, speed: Option<Speed> },
    /// Below it, in at least one figure (`speed` `None`: unknown, the width is below).
    Below { width: Option<u8>, speed: Option<Speed>, shortfall: Shortfall },
    /// No decision this poll, and why.
    Unknown(&'static str),
}

impl Training {
    /// The current figures when they are known (for the peer comparison).
    fn current(&self) -> Option<Figure> {
        match self {
            Training::Full { width, speed: Some(speed) } => Some((*width, *speed)),
            Training::Below { width: Some(w), speed: Some(speed), .. } => Some((*w, *speed)),
            _ => None,
        }
    }
}

/// The capability of a PF's link: its maxima and its upstream port's.
pub fn capability(r: &PcieReading) -> Option<Capability> {
    let up = &r.upstream.as_ref()?.link;
    let min = |a: Option<Speed>, b: Option<Speed>| Some(a?.min(b?));
    let min_w = |a: Option<u8>, b: Option<u8>| Some(a?.min(b?));
    Some(Capability { width: min_w(r.link.max_width, up.max_width), speed: min(r.link.max_speed, up.max_speed) })
}

/// Judge one PF's link (SPEC §1.10).
pub fn training(r: &PcieReading) -> Training {
    let speed = r.link.speed;
    if speed.is_none() && r.link.width.is_none() {
        return Training::Unknown("link speed unknown (link down)");
    }
    let Some(cap) = capability(r) else {
        return Training::Unknown("no upstream PCI bridge port");
    };
    let width_short = match (r.link.width, cap.width) {
        (Some(now), Some(c)) => (now < c).then_some((now, c)),
        _ => None,
    };
    let speed_short = match (speed, cap.speed) {
        (Some(now), Some(c)) => (now < c).then_some((now, c)),
        _ => None,
    };
    if width_short.is_some() || speed_short.is_some() {
        let shortfall = Shortfall { width: width_short, speed: speed_short, speed_unknown: speed.is_none() };
        return Training::Below { width: r.link.width, speed, shortfall };
    }
    match (r.link.width, cap.width, cap.speed) {
        (Some(width), Some(_), Some(_)) => Training::Full { width, speed },
        (None, ..) => Training::Unknown("link width unknown"),
        _ => Training::Unknown("maximum link width or speed unknown"),
    }
}

/// One card's link as the decision sees it.
#[derive(Debug, Clone)]
pub struct CardLink<'a> {
    /// `dddd:bb:dd`.
    pub card: &'a str,
    /// The NIC its events name (its first monitored PF).
    pub nic: &'a str,
    pub role: Option<Role>,
    /// The card's model (`hca_type`): peers are cards of the same model.
    pub model: Option<&'a str>,
    /// The reading of its first monitored PF.
    pub reading: &'a PcieReading,
}

/// A card reported as downtrained, and the NIC its event named (its recovery names the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reported {
    pub nic: String,
}

/// What the link decision carries from one poll to the next: the cards reported downtrained.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LinkState {
    #[serde(default)]
    pub downtrained: BTreeMap<String, Reported>,
}

/// The figure most of a card's peers run at (strictly most common among at least two cards
/// of the same role, model and capability, this one included), with the peers' number.
fn peer_figures(cards: &[(&CardLink<'_>, Training)]) -> BTreeMap<String, (usize, Figure)> {
    type Key<'k> = (Option<Role>, Option<&'k str>, Option<Capability>);
    let mut groups: BTreeMap<Key<'_>, Vec<(&str, Figure)>> = BTreeMap::new();
    for (c, t) in cards {
        let (Some(role), Some(cur), Some(cap)) = (c.role, t.current(), capability(c.reading)) else {
            continue;
        };
        groups.entry((Some(role), c.model, Some(cap))).or_default().push((c.card, cur));
    }
    let mut out = BTreeMap::new();
    for members in groups.values().filter(|m| m.len() >= 2) {
        let mut counts: BTreeMap<Figure, usize> = BTreeMap::new();
        for (_, cur) in members {
            *counts.entry(*cur).or_default() += 1;
        }
        let best = counts.values().copied().max().unwrap_or(0);
        let modes: Vec<_> = counts.iter().filter(|(_, n)| **n == best).collect();
        if let [(figure, _)] = modes[..] {
            for (card, _) in members {
                out.insert(card.to_string(), (members.len() - 1, *figure));
            }
        }
    }
    out
}

/// `"x16 Gen5"`; `"x16 (speed unknown)"`.
fn figures(width: u8, speed: Option<Speed>) -> String {
    match speed {
        Some(speed) => format!("x{width} {}", speed.label()),
        None => format!("x{width} (speed unknown)"),
    }
}

fn downtrained_message(c: &CardLink<'_>, t: &Training, peers: Option<&(usize, Figure)>) -> String {
    let Training::Below { width, speed, shortfall } = t else {
        return String::new();
    };
    let mut msg = format!("PCIe link of NIC {} (card {}) downtrained: {}", c.nic, c.card, shortfall.text());
    if let Some(up) = &c.reading.upstream {
        msg.push_str(&format!(" (upstream port {})", up.address));
    }
    let current = width.zip(*speed);
    match peers {
        Some((n, figure)) if Some(*figure) != current && *n > 0 => msg.push_str(&format!(
            ", below its {n} role-group peers of the same model at {}",
            figures(figure.0, Some(figure.1))
        )),
        Some((n, _)) if *n > 0 => msg.push_str(&format!(", as are its {n} role-group peers of the same model")),
        _ => {}
    }
    msg
}

/// Decide the link events of this poll. `reboot`: the state was cleared by a boot-ID change
/// — every card at full training then gets a healthy baseline (a condition left from before
/// the reboot is cleared), as counters do.
pub fn evaluate(prev: &LinkState, cards: &[CardLink<'_>], reboot: bool) -> (Vec<Finding>, LinkState) {
    let mut next = prev.clone();
    let mut out = Vec::new();
    let judged: Vec<(&CardLink<'_>, Training)> = cards.iter().map(|c| (c, training(c.reading))).collect();
    let peers = peer_figures(&judged);
    let mut seen = BTreeSet::new();
    for (c, t) in &judged {
        if !seen.insert(c.card) {
            continue; // one verdict per card
        }
        let reported = next.downtrained.get(c.card).cloned();
        match (t, reported) {
            (Training::Below { .. }, None) => {
                let msg = downtrained_message(c, t, peers.get(c.card));
                out.push(Finding::new(c.nic, DOWNTRAINED, Health::NonFatal, msg));
                next.downtrained.insert(c.card.to_string(), Reported { nic: c.nic.to_string() });
            }
            (Training::Full { width, speed }, Some(r)) => {
                let msg =
                    format!("PCIe link of NIC {} (card {}) trained back to {}", r.nic, c.card, figures(*width, *speed));
                out.push(Finding::new(&r.nic, DOWNTRAINED, Health::Healthy, msg));
                next.downtrained.remove(c.card);
            }
            (Training::Full { width, speed }, None) if reboot => {
                let msg =
                    format!("PCIe link of NIC {} (card {}) at {} after reboot", c.nic, c.card, figures(*width, *speed));
                out.push(Finding::new(c.nic, DOWNTRAINED, Health::Healthy, msg));
            }
            // Still below (reported once), at full as before, or no decision: nothing.
            _ => {}
        }
    }
    (out, next)
}
