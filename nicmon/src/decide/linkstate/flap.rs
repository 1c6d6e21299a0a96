//! Flap damping (SPEC §1.3 "Flap damping"): a flapping port is one fatal event, not a storm.
//!
//! Per port, the unhealthy transitions (healthy → unhealthy, as the polls see them) are
//! counted in a sliding window (`[stateCheck] flapThreshold` within `flapWindow`, default 3
//! within 60 s). Below the threshold every transition is reported as without damping (the
//! first DOWN goes out at once, through the fast path). The transition that reaches the
//! threshold reports one fatal "port flapping" event (`errorCode = [PortFlapping]`) instead
//! of its own, and the port is **held**: further transitions publish nothing (they are
//! counted in `nicmon_port_flap_transitions_total` and logged), and a healthy port is
//! reported healthy only once it has stayed healthy for `flapSettle` (default 60 s).
//!
//! Hold-down (upstream's `portStateHoldDown`): a blip that recovers within the hold-down
//! publishes nothing on its own, but it is still an unhealthy transition of the port; the
//! hold-down step is meant to count it here ([`FlapState::unhealthy_transition`]), so that a
//! port blipping repeatedly is reported as flapping instead of staying silent.
//!
//! Everything here is pure and lives in the port's record ([`FlapState`]), so a restart in
//! the middle of a storm resumes the hold instead of starting the storm again.
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

/// `errorCode` of the "port flapping" event.
pub const ERROR_CODE: &str = "PortFlapping";

/// The largest `flapThreshold` accepted (the window keeps at most this many times per port).
pub const MAX_THRESHOLD: u32 = 1000;

/// The knobs (`[stateCheck] flapThreshold`, `flapWindow`, `flapSettle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapConfig {
    /// Unhealthy transitions within `window` that make a port flapping; 0 = damping off.
    pub threshold: u32,
    pub window: Duration,
    /// How long a flapping port must stay healthy before it is reported healthy.
    pub settle: Duration,
}

impl Default for FlapConfig {
    fn default() -> FlapConfig {
        FlapConfig { threshold: 3, window: Duration::seconds(60), settle: Duration::seconds(60) }
    }
}

impl FlapConfig {
    /// Damping off: every transition is reported.
    pub const OFF: FlapConfig = FlapConfig { threshold: 0, window: Duration::ZERO, settle: Duration::ZERO };

    pub fn enabled(&self) -> bool {
        self.threshold > 0 && self.window > Duration::ZERO
    }
}

/// A moment, serialised as RFC 3339 (for the list of transition times).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct At(#[serde(with = "time::serde::rfc3339")] pub OffsetDateTime);

/// A port's flap memory (persisted in its record under `flap`; absent while quiet).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlapState {
    /// The unhealthy transitions still inside the window, oldest first (not held).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<At>,
    /// Held as flapping since (the "port flapping" event's time).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub flapping_since: Option<OffsetDateTime>,
    /// While held: the unhealthy transitions since the hold began, those that reached the
    /// threshold included.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transitions: u64,
    /// While held: healthy since (the settle clock); `None` while unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "time::serde::rfc3339::option")]
    pub healthy_since: Option<OffsetDateTime>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What an unhealthy transition means for the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Below the threshold (or damping off): report it as without damping.
    Report,
    /// It reached the threshold: report one "port flapping" event instead, with this many
    /// transitions within the window; the port is held from now on.
    StartsFlapping { transitions: u64 },
    /// The port is held: publish nothing.
    Held,
}

/// What a healthy poll means for a held port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Not held: report as without damping.
    NotHeld,
    /// Held and not yet healthy for the settle time: publish nothing.
    Settling,
    /// Healthy for the settle time: report healthy once; the hold is over.
    Settled { transitions: u64, stable_for: Duration },
}

impl FlapState {
    pub fn is_flapping(&self) -> bool {
        self.flapping_since.is_some()
    }

    /// Nothing worth persisting.
    pub fn is_quiet(&self) -> bool {
        *self == FlapState::default()
    }

    /// Whether the port was healthy at the previous poll while held.
    pub fn held_and_healthy(&self) -> bool {
        self.is_flapping() && self.healthy_since.is_some()
    }

    /// Transitions as `nicmon check` shows them: since the hold began while held, else
    /// those inside the window (as of the last transition).
    pub fn shown_transitions(&self) -> u64 {
        if self.is_flapping() { self.transitions } else { self.recent.len() as u64 }
    }

    /// The port went from healthy to unhealthy at `now`.
    pub fn unhealthy_transition(&mut self, cfg: &FlapConfig, now: OffsetDateTime) -> Transition {
        if self.is_flapping() {
            self.transitions = self.transitions.saturating_add(1);
            self.healthy_since = None;
            return Transition::Held;
        }
        if !cfg.enabled() {
            self.recent.clear();
            return Transition::Report;
        }
        // A clock stepped backwards leaves times "in the future": they are dropped too.
        self.recent.retain(|t| now - t.0 < cfg.window && t.0 <= now);
        self.recent.push(At(now));
        let keep = cfg.threshold.clamp(1, MAX_THRESHOLD) as usize;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
        if self.recent.len() >= cfg.threshold as usize {
            let transitions = self.recent.len() as u64;
            *self = FlapState { flapping_since: Some(now), transitions, ..FlapState::default() };
            Transition::StartsFlapping { transitions }
        } else {
            Transition::Report
        }
    }

    /// The port is healthy at `now`.
    pub fn healthy(&mut self, cfg: &FlapConfig, now: OffsetDateTime) -> Settle {
        if !self.is_flapping() {
            return Settle::NotHeld;
        }
        let since = *self.healthy_since.get_or_insert(now);
        // A clock stepped backwards restarts the settle clock rather than ending it early.
        if since > now {
            self.healthy_since = Some(now);
            return Settle::Settling;
        }
        if now - since >= cfg.settle {
            let transitions = self.transitions;
            *self = FlapState::default();
            Settle::Settled { transitions, stable_for: now - since }
        } else {
            Settle::Settling
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use time::macros::datetime;

    const T0: OffsetDateTime = datetime!(2026-01-01 00:00:00 UTC);

    fn at(s: i64) -> OffsetDateTime {
        T0 + Duration::seconds(s)
    }

    #[test]
    fn the_third_transition_in_the_window_starts_flapping_and_the_rest_are_held() {
        let cfg = FlapConfig::default();
        let mut f = FlapState::default();
        assert_eq!(f.unhealthy_transition(&cfg, at(0)), Transition::Report);
        assert_eq!(f.healthy(&cfg, at(1)), Settle::NotHeld);
        assert_eq!(f.unhealthy_transition(&cfg, at(2)), Transition::Report);
        assert_eq!(f.unhealthy_transition(&cfg, at(4)), Transition::StartsFlapping { transitions: 3 });
        assert_eq!(f.flapping_since, Some(at(4)));
        assert_eq!(f.healthy(&cfg, at(5)), Settle::Settling);
        assert_eq!(f.unhealthy_transition(&cfg, at(6)), Transition::Held);
        assert_eq!(f.shown_transitions(), 4);
        assert_eq!(f.healthy(&cfg, at(7)), Settle::Settling);
        assert_eq!(f.healthy(&cfg, at(66)), Settle::Settling, "59 s healthy is not enough");
        assert_eq!(f.healthy(&cfg, at(67)), Settle::Settled { transitions: 4, stable_for: Duration::seconds(60) });
        assert!(f.is_quiet());
    }

    #[test]
    fn transitions_outside_the_window_do_not_count() {
        let cfg = FlapConfig::default();
        let mut f = FlapState::default();
        // 60 s apart is outside a 60 s window.
        for t in [0, 40, 100, 130] {
            assert_eq!(f.unhealthy_transition(&cfg, at(t)), Transition::Report, "t={t}");
        }
        assert_eq!(f.recent, vec![At(at(100)), At(at(130))]);
        assert_eq!(f.unhealthy_transition(&cfg, at(150)), Transition::StartsFlapping { transitions: 3 });
    }

    #[test]
    fn a_relapse_while_settling_restarts_the_settle_clock() {
        let cfg = FlapConfig { threshold: 2, window: Duration::seconds(10), settle: Duration::seconds(5) };
        let mut f = FlapState::default();
        f.unhealthy_transition(&cfg, at(0));
        assert_eq!(f.unhealthy_transition(&cfg, at(1)), Transition::StartsFlapping { transitions: 2 });
        assert_eq!(f.healthy(&cfg, at(2)), Settle::Settling);
        assert_eq!(f.unhealthy_transition(&cfg, at(6)), Transition::Held);
        assert_eq!(f.healthy(&cfg, at(7)), Settle::Settling);
        assert_eq!(f.healthy(&cfg, at(11)), Settle::Settling);
        assert!(matches!(f.healthy(&cfg, at(12)), Settle::Settled { transitions: 3, .. }));
    }

    #[test]
    fn off_reports_every_transition() {
        let mut f = FlapState::default();
        for t in 0..100 {
            assert_eq!(f.unhealthy_transition(&FlapConfig::OFF, at(t)), Transition::Report);
            assert_eq!(f.healthy(&FlapConfig::OFF, at(t)), Settle::NotHeld);
        }
        assert!(f.is_quiet());
    }

    #[test]
    fn persisted_form_is_small_and_round_trips() {
        assert_eq!(serde_json::to_string(&FlapState::default()).unwrap(), "{}");
        let mut f = FlapState::default();
        let cfg = FlapConfig::default();
        f.unhealthy_transition(&cfg, at(0));
        let text = serde_json::to_string(&f).unwrap();
        assert_eq!(text, r#"{"recent":["2026-01-01T00:00:00Z"]}"#);
        assert_eq!(serde_json::from_str::<FlapState>(&text).unwrap(), f);
        f.unhealthy_transition(&cfg, at(1));
        f.unhealthy_transition(&cfg, at(2));
        let back: FlapState = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
        assert!(back.is_flapping());
    }

    proptest! {
        /// Any sequence of polls: the window never holds more than the threshold, at most
        /// one "starts flapping" per hold, and a held port is released only after settling.
        #[test]
        fn bounded_and_one_flapping_event_per_hold(
            threshold in 0u32..6,
            window in 0i64..100,
            settle in 0i64..100,
            steps in proptest::collection::vec((any::<bool>(), -5i64..50), 0..200),
        ) {
            let cfg = FlapConfig { threshold, window: Duration::seconds(window), settle: Duration::seconds(settle) };
            let mut f = FlapState::default();
            let mut now = T0;
            let mut held = false;
            for (healthy, dt) in steps {
                now += Duration::seconds(dt);
                if healthy {
                    match f.healthy(&cfg, now) {
                        Settle::Settled { stable_for, .. } => {
                            prop_assert!(held && stable_for >= cfg.settle);
                            held = false;
                        }
                        Settle::Settling => prop_assert!(held),
                        Settle::NotHeld => prop_assert!(!held),
                    }
                } else {
                    match f.unhealthy_transition(&cfg, now) {
                        Transition::StartsFlapping { transitions } => {
                            prop_assert!(!held && transitions == u64::from(threshold));
                            held = true;
                        }
                        Transition::Held => prop_assert!(held),
                        Transition::Report => prop_assert!(!held),
                    }
                }
                prop_assert!(f.recent.len() <= threshold.max(1) as usize);
            }
        }
    }
}
