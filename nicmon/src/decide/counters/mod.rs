//! Counter checks (001, SPEC §1.4): which counters to watch and how to judge them.
//!
//! - [`rule`]: a counter rule (path, threshold type, unit, link layers);
//! - [`defaults`]: the default rules (counter, path, threshold, fatality), a const table;
//! - [`config`]: the `[counterDetection]` section, its merge with the defaults and validation;
//! - [`width`]: how far each counter can count (PMA counters saturate);
//! - [`eval`]: the pure evaluator, `(state, readings, rules, now) -> (events, state)`.
pub mod config;
pub mod defaults;
pub mod eval;
pub mod rule;
pub mod width;

#[cfg(test)]
mod tests;

pub use config::{
    CounterConfigError, CounterDetection, CounterEntry, CounterRule, Layers, ThresholdType, VelocityUnit,
    read_path_drivers, read_paths,
};
pub use eval::{
    CounterPort, CounterState, LastValues, RuleFacts, counter_key, evaluate, evaluate_with, missing, parse_counter_key,
    went_unreadable,
};
