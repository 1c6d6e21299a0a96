//! Deciding what kernel log records mean: pattern matching, the soft lockup rule,
//! attribution, dedup and the resume cursor. Pure: (state, records, index, patterns, now)
//! in, (events, next state, wake hints) out.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::attribution::{DeviceIndex, Resolution, Target};
use super::pattern::{Outcome, Patterns, SOFT_LOCKUP_FRAME_WINDOW, SOFT_LOCKUP_ID, Scope};
use crate::model::event::{Check, Entity, HealthEvent, RecommendedAction, Stamp};
use crate::model::kmsg::Record;

/// Longest part of a kernel line quoted in an event message.
pub const MAX_QUOTED_LINE: usize = 360;

/// What the watcher persists (embedded in the state file; cleared on a boot ID change).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KmsgState {
    /// Sequence number of the last `/dev/kmsg` record processed in this boot.
    pub last_seq: Option<u64>,
    /// Last event per dedup key (`<pattern>@<card>`, or `<pattern>@<device>` for
    /// device-scoped patterns).
    pub dedup: BTreeMap<String, DedupEntry>,
    /// Records overwritten in the kernel ring before we read them (sequence gaps).
    pub lost_records: u64,
    /// A soft lockup header still waiting for its mlx5 frame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_lockup: Option<PendingLockup>,
}

/// When a dedup key last produced an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DedupEntry {
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The record's monotonic timestamp, when it had one: compares records of one batch
    /// (a replayed file) by the kernel's clock rather than by the one `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts_usec: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingLockup {
    /// The header line.
    pub line: String,
    pub ts_usec: Option<u64>,
    /// Records still allowed before the frame.
    pub records_left: u32,
}

/// "Poll now": a `Link down` line of a monitored NIC (never an event by itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeHint {
    pub pattern: String,
    pub device: String,
    pub netdev: Option<String>,
    pub seq: Option<u64>,
}

/// The result of [`process`].
#[derive(Debug, Clone, PartialEq)]
pub struct Processed {
    pub events: Vec<HealthEvent>,
    pub state: KmsgState,
    pub wake_hints: Vec<WakeHint>,
    /// Records skipped because their sequence number was at or before the cursor.
    pub skipped: usize,
}

/// Match `records` (in arrival order) against `patterns`. Records with a sequence number
/// at or before `state.last_seq` were processed before (resume after a restart in the
/// same boot) and are skipped; plain text records (no sequence number) never are.
pub fn process(
    state: &KmsgState,
    records: &[Record],
    index: &DeviceIndex,
    patterns: &Patterns,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> Processed {
    let mut st = state.clone();
    let mut events = Vec::new();
    let mut wake_hints = Vec::new();
    let mut skipped = 0;

    for rec in records {
        if let Some(seq) = rec.seq {
            if let Some(last) = st.last_seq {
                if seq <= last {
                    skipped += 1;
                    continue;
                }
                st.lost_records = st.lost_records.saturating_add(seq - last - 1);
            }
            st.last_seq = Some(seq);
        }

        if let Some(ev) = soft_lockup(&mut st, rec, index, patterns, now, stamp) {
            events.push(ev);
            continue;
        }

        let Some((pattern, caps)) = patterns.find(&rec.text) else {
            continue;
        };
        let targets = attribute(rec, &caps, index);
        match pattern.outcome {
            Outcome::WakeHint => {
                let netdev = caps.name("netdev").map(|m| m.as_str().to_string());
                wake_hints.extend(targets.into_iter().map(|t| WakeHint {
                    pattern: pattern.id.clone(),
                    device: t.device,
                    netdev: netdev.clone(),
                    seq: rec.seq,
                }));
            }
            Outcome::Event { fatal, action } => {
                for t in targets {
                    // One failure of a card printed by each of its functions is one
                    // event; a port's own failure is its device's.
                    let (key, device) = match pattern.scope {
                        Scope::Card => (format!("{}@{}", pattern.id, t.card), t.card_device),
                        Scope::Device => (format!("{}@{}", pattern.id, t.device), t.device),
                    };
                    if !admit(&mut st, key, pattern.dedup_window_seconds, rec, now) {
                        continue;
                    }
                    let msg = format!("{} on {}: {}", pattern.description, device, quote(&rec.text));
                    events.push(event(&pattern.id, fatal, action, vec![Entity::device(device)], &msg, now, stamp));
                }
            }
        }
    }
    prune(&mut st, patterns, now);
    Processed { events, state: st, wake_hints, skipped }
}

/// The stateful rule: a `BUG: soft lockup` header opens a window of
/// [`SOFT_LOCKUP_FRAME_WINDOW`] records in which a reliable mlx5 NAPI frame confirms it.
/// The trace names no device: the event names every monitored card.
fn soft_lockup(
    st: &mut KmsgState,
    rec: &Record,
    index: &DeviceIndex,
    patterns: &Patterns,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> Option<HealthEvent> {
    let rule = patterns.soft_lockup.as_ref()?;
    if rule.header.is_match(&rec.text) {
        st.pending_lockup = Some(PendingLockup {
            line: rec.text.clone(),
            ts_usec: rec.ts_usec,
            records_left: SOFT_LOCKUP_FRAME_WINDOW,
        });
        return None;
    }
    let pending = st.pending_lockup.as_mut()?;
    if pending.records_left == 0 {
        st.pending_lockup = None;
        return None;
    }
    pending.records_left -= 1;
    if !rule.frame.is_match(&rec.text) {
        return None;
    }
    let header = st.pending_lockup.take()?;
    let targets = index.monitored_cards();
    if targets.is_empty() {
        return None;
    }
    let header_rec = Record { ts_usec: header.ts_usec, ..Record::plain(header.line.clone()) };
    if !admit(st, format!("{SOFT_LOCKUP_ID}@node"), rule.dedup_window_seconds, &header_rec, now) {
        return None;
    }
    let msg = format!("CPU soft lockup in the mlx5 driver ({}): {}", rec.text.trim(), quote(&header.line));
    Some(event(
        SOFT_LOCKUP_ID,
        rule.fatal,
        rule.action,
        targets.into_iter().map(|t| Entity::device(t.card_device)).collect(),
        &msg,
        now,
        stamp,
    ))
}

/// Which monitored NICs a matched line is about. A `source` capture (the device an AER
/// error came from) decides alone: a source that is no monitored NIC, card or bridge above
/// one (a GPU, an NVMe drive) is nobody's here. Otherwise clues in order: the pattern's
/// named captures (`bdf`, `netdev`, `ifindex`), the record's ` DEVICE=`, then every PCI
/// address in the text. The first clue the index knows decides, even when it decides "not
/// ours".
fn attribute(rec: &Record, caps: &regex::Captures<'_>, index: &DeviceIndex) -> Vec<Target> {
    if let Some(m) = caps.name("source") {
        return match index.resolve_bdf(m.as_str()) {
            Resolution::Known(t) => t,
            Resolution::Unknown => Vec::new(),
        };
    }
    let mut clues: Vec<Resolution> = Vec::new();
    if let Some(m) = caps.name("bdf") {
        clues.push(index.resolve_bdf(m.as_str()));
    }
    if let Some(m) = caps.name("netdev") {
        clues.push(index.resolve_netdev(m.as_str()));
    }
    if let Some(n) = caps.name("ifindex").and_then(|m| m.as_str().parse().ok()) {
        clues.push(index.resolve_ifindex(n));
    }
    for r in clues {
        if let Resolution::Known(t) = r {
            return t;
        }
    }
    match &rec.device {
        Some(d) if d.pci().is_some() => {
            if let Resolution::Known(t) = index.resolve_bdf(d.pci().unwrap_or_default()) {
                return t;
            }
        }
        Some(crate::model::kmsg::DeviceRef::Netdev(n)) => {
            if let Resolution::Known(t) = index.resolve_ifindex(*n) {
                return t;
            }
        }
        _ => {}
    }
    for bdf in bdfs_in(&rec.text) {
        if let Resolution::Known(t) = index.resolve_bdf(bdf) {
            return t;
        }
    }
    Vec::new()
}

/// PCI addresses (`dddd:bb:dd.f`, hex) in a text, in order.
fn bdfs_in(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(11)).filter_map(move |i| {
        let w = &b[i..i + 12];
        let hex = |r: std::ops::Range<usize>| w[r].iter().all(u8::is_ascii_hexdigit);
        let ok = (i == 0 || !b[i - 1].is_ascii_alphanumeric())
            && hex(0..4)
            && w[4] == b':'
            && hex(5..7)
            && w[7] == b':'
            && hex(8..10)
            && w[10] == b'.'
            && (b'0'..=b'7').contains(&w[11])
            && b.get(i + 12).is_none_or(|c| !c.is_ascii_alphanumeric());
        ok.then(|| &text[i..i + 12])
    })
}

/// Whether an event for `key` may go out now; records it when so.
fn admit(st: &mut KmsgState, key: String, window: u64, rec: &Record, now: OffsetDateTime) -> bool {
    if let Some(prev) = st.dedup.get(&key) {
        let elapsed_secs: i128 = match (prev.ts_usec, rec.ts_usec) {
            (Some(a), Some(b)) if b >= a => ((b - a) / 1_000_000) as i128,
            _ => (now - prev.at).whole_seconds() as i128,
        };
        if elapsed_secs < window as i128 {
            return false;
        }
    }
    st.dedup.insert(key, DedupEntry { at: now, ts_usec: rec.ts_usec });
    true
}

/// Forget dedup entries older than their window (by the wall clock).
fn prune(st: &mut KmsgState, patterns: &Patterns, now: OffsetDateTime) {
    st.dedup.retain(|key, e| {
        let id = key.split_once('@').map_or(key.as_str(), |(id, _)| id);
        let window = patterns.window_of(id).unwrap_or(patterns.default_window_seconds);
        (now - e.at).whole_seconds() < window as i64
    });
}

fn event(
    id: &str,
    fatal: bool,
    action: RecommendedAction,
    entities: Vec<Entity>,
    msg: &str,
    now: OffsetDateTime,
    stamp: &Stamp,
) -> HealthEvent {
    HealthEvent::new(Check::NICKernelLogCheck, stamp, now, msg)
        .unhealthy(fatal)
        .action(action)
        .entities(entities)
        .error_code(id)
}

/// The kernel line as quoted in a message: trimmed, capped at [`MAX_QUOTED_LINE`] bytes.
/// (`HealthEvent::new` removes `;` and control characters from the whole message.)
fn quote(text: &str) -> String {
    let t = text.trim();
    if t.len() <= MAX_QUOTED_LINE {
        return t.to_string();
    }
    let mut cut = MAX_QUOTED_LINE - 3;
    while !t.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &t[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_pci_addresses_in_text() {
        let v: Vec<&str> =
            bdfs_in("pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:01:00.0")
                .collect();
        assert_eq!(v, ["0000:00:01.0", "0000:01:00.0"]);
        assert_eq!(bdfs_in("x10000:01:00.0 0000:01:00.8 0000:01:00.12").count(), 0);
        assert_eq!(bdfs_in("").count(), 0);
        assert_eq!(bdfs_in("é0000:af:00.2é").collect::<Vec<_>>(), ["0000:af:00.2"]);
    }

    #[test]
    fn quote_caps_on_a_char_boundary() {
        let q = quote(&"é".repeat(400));
        assert!(q.len() <= MAX_QUOTED_LINE && q.ends_with("..."));
    }
}
