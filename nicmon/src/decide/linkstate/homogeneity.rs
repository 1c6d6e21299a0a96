//! Card homogeneity (000 §4.3): within a role group `(role, link layer)` the cards should
//! have the same number of active ports. A card below the group's mode makes its unhealthy
//! ports fatal at once (see [`super::escalation`]) and is reported as a card-level event
//! (alongside any port events), and its end as a healthy one. While a port of the card is
//! held as flapping ([`super::flap`]), from the poll after its "port flapping" event until it
//! has settled, the card stays as it was reported: the flapping port does not make it fall
//! and recover again with every transition.
//!
//! A card with a management NIC among its functions (upstream: a "management NIC sibling")
//! is exempt: its active member is the management NIC, which is not monitored, so its other
//! functions (often uncabled by design) would count short of their peers. It is neither
//! compared nor counted in its group's mode; its ports keep their own checks. A card event
//! outstanding on it is cleared with a healthy event, as upstream does.
use std::collections::{BTreeMap, BTreeSet};

use super::health::state_check;
use super::state::{LinkState, write_port_key};
use super::{Ctx, Emitted};
use crate::decide::roles::{Role, device_link_layer};
use crate::model::LinkLayer;
use crate::model::event::{Entity, HealthEvent};

/// A role group: cards are only compared with cards of the same role and link layer.
pub(super) type Group<'a> = (Role, &'a LinkLayer);

pub(super) struct CardView<'a> {
    pub group: Group<'a>,
    pub active: usize,
}

/// The cards of this poll and which of them are below their group's mode (by the names
/// the snapshot's devices hold: nothing copied).
pub(super) struct Cards<'a> {
    pub views: BTreeMap<&'a str, CardView<'a>>,
    /// Card → its group's mode, for cards below it.
    pub below_mode: BTreeMap<&'a str, usize>,
    /// Cards with a port whose state is unknown this poll: left out of the comparison (no
    /// decision for them, and not counted in their group's mode).
    pub undecided: BTreeSet<&'a str>,
    /// Cards with a management NIC among their functions: exempt from the comparison.
    pub exempt: BTreeSet<&'a str>,
}

impl Cards<'_> {
    /// The mode of active ports `card` falls short of, when it does.
    pub fn below(&self, card: Option<&str>) -> Option<usize> {
        card.and_then(|c| self.below_mode.get(c).copied())
    }

    /// The active ports of `card` this poll.
    pub fn active(&self, card: Option<&str>) -> usize {
        card.and_then(|c| self.views.get(c)).map(|v| v.active).unwrap_or(0)
    }
}

/// The mode of `values` when there are at least two and one value is strictly most common.
pub(super) fn unique_mode<T: Ord + Copy>(values: impl IntoIterator<Item = T>) -> Option<T> {
    let mut counts: BTreeMap<T, usize> = BTreeMap::new();
    let mut n = 0;
    for v in values {
        *counts.entry(v).or_default() += 1;
        n += 1;
    }
    if n < 2 {
        return None;
    }
    let best = counts.values().copied().max()?;
    let mut modes = counts.iter().filter(|(_, c)| **c == best).map(|(v, _)| *v);
    let m = modes.next()?;
    modes.next().is_none().then_some(m)
}

/// Active ports per card, the mode per group (cards with a missing device, and cards with a
/// port whose state is unknown, left out: unknown is neither active nor inactive).
pub(super) fn compare_cards<'a>(ctx: &Ctx<'a>, missing_cards: &BTreeSet<String>) -> Cards<'a> {
    let exempt = management_sibling_cards(ctx);
    let mut views: BTreeMap<&'a str, CardView<'a>> = BTreeMap::new();
    let mut undecided = BTreeSet::new();
    for &d in &ctx.monitored {
        let Some(card) = d.card.as_deref() else {
            continue;
        };
        // A device whose link layer or a port's state is unknown (and not judged with a last
        // known one) cannot be counted: its card is undecided, not short of active ports.
        let ll = device_link_layer(d).filter(|l| !matches!(l, LinkLayer::Unknown(_)));
        if ll.is_none() || d.ports.iter().any(|p| p.unknown_state().is_some()) {
            undecided.insert(card);
        }
        let (Some(role), Some(ll)) = (ctx.role_of(d), ll) else {
            continue;
        };
        let view = views.entry(card).or_insert(CardView { group: (role, ll), active: 0 });
        view.active += d.ports.iter().filter(|p| p.is_healthy()).count();
    }
    let left_out = |card: &str| missing_cards.contains(card) || undecided.contains(card) || exempt.contains(card);
    let mut group_counts: BTreeMap<Group<'a>, Vec<usize>> = BTreeMap::new();
    for (&card, v) in &views {
        if !left_out(card) {
            group_counts.entry(v.group).or_default().push(v.active);
        }
    }
    let group_mode: BTreeMap<Group<'a>, usize> =
        group_counts.iter().filter_map(|(g, counts)| unique_mode(counts.iter().copied()).map(|m| (*g, m))).collect();
    let below_mode = views
        .iter()
        .filter(|(card, _)| !left_out(card))
        .filter_map(|(&card, v)| group_mode.get(&v.group).filter(|m| v.active < **m).map(|m| (card, *m)))
        .collect();
    Cards { views, below_mode, undecided, exempt }
}

/// The cards of management NICs (PFs classified management, so not monitored). VFs never
/// exempt a card.
fn management_sibling_cards<'a>(ctx: &Ctx<'a>) -> BTreeSet<&'a str> {
    ctx.snap
        .devices
        .iter()
        .filter(|d| !d.is_vf() && ctx.role_of(d) == Some(Role::Management))
        .filter_map(|d| d.card.as_deref())
        .collect()
}

/// The check a card event of `card` goes out under: its group's, else (a card with no
/// monitored function left) its management NIC's link layer.
fn card_check(ctx: &Ctx<'_>, cards: &Cards<'_>, card: &str) -> Option<crate::model::event::Check> {
    let ll = match cards.views.get(card) {
        Some(v) => Some(v.group.1),
        None => ctx.snap.devices.iter().filter(|d| d.card.as_deref() == Some(card)).find_map(|d| device_link_layer(d)),
    };
    ll.and_then(state_check)
}

/// Card-level events: a card below its peers' mode is reported once, whether or not port
/// events also cover it (SPEC §1.3, upstream); a reported card back at its peers' count
/// recovers. A card with a port held as flapping since an earlier poll is left as it was
/// reported until that port has settled.
pub(super) fn card_events(ctx: &Ctx<'_>, cards: &Cards<'_>, st: &mut LinkState, out: &mut Emitted) {
    let mut key = String::new();
    let mut flapping = |d: &crate::model::Device, number: u32| {
        write_port_key(&mut key, &d.name, number);
        st.port_states.get(key.as_str()).and_then(|r| r.flap.flapping_since).is_some_and(|since| since < ctx.now)
    };
    let frozen: BTreeSet<&str> = ctx
        .monitored
        .iter()
        .filter(|d| d.ports.iter().any(|p| flapping(d, p.number)))
        .filter_map(|d| d.card.as_deref())
        .collect();
    let mut still_below: BTreeSet<String> =
        st.cards_below_mode.iter().filter(|c| frozen.contains(c.as_str())).cloned().collect();
    for (&card, mode) in cards.below_mode.iter().filter(|(c, _)| !frozen.contains(**c)) {
        let view = &cards.views[card];
        still_below.insert(card.to_string());
        let Some(check) = state_check(view.group.1) else {
            continue;
        };
        if !st.cards_below_mode.contains(card) {
            let msg = format!(
                "Card {card} ({}, {}) has {} active ports, expected {mode} (peer mode)",
                view.group.0.as_str(),
                view.group.1.name(),
                view.active
            );
            out.push(
                ctx,
                check,
                HealthEvent::new(check, ctx.stamp, ctx.now, &msg)
                    .unhealthy(true)
                    .entities(vec![Entity::card(card.to_string())]),
            );
        }
    }
    for card in &st.cards_below_mode {
        if cards.exempt.contains(card.as_str()) {
            // Never compared again: cleared now, or it would be outstanding for good.
            if let Some(check) = card_check(ctx, cards, card) {
                // Upstream's text, its `;` a `,` as in every message (event::sanitize_message).
                let msg = format!("Card {card} exempt from peer comparison (management NIC sibling), clearing anomaly");
                out.push(
                    ctx,
                    check,
                    HealthEvent::new(check, ctx.stamp, ctx.now, &msg).entities(vec![Entity::card(card.clone())]),
                );
            }
            still_below.remove(card);
            continue;
        }
        if still_below.contains(card) {
            continue;
        }
        if cards.undecided.contains(card.as_str()) {
            // No decision this poll: a card event outstanding stays outstanding.
            still_below.insert(card.clone());
            continue;
        }
        if let Some(view) = cards.views.get(card.as_str())
            && let Some(check) = state_check(view.group.1)
        {
            let msg = format!(
                "Card {card} ({}, {}) is back at its peers' active port count",
                view.group.0.as_str(),
                view.group.1.name()
            );
            out.push(
                ctx,
                check,
                HealthEvent::new(check, ctx.stamp, ctx.now, &msg).entities(vec![Entity::card(card.clone())]),
            );
        }
    }
    st.cards_below_mode = still_below;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_mode_needs_two_values_and_no_tie() {
        assert_eq!(unique_mode([2, 2, 1]), Some(2));
        assert_eq!(unique_mode([2, 1]), None);
        assert_eq!(unique_mode([2]), None);
        assert_eq!(unique_mode([1, 1]), Some(1));
    }
}
