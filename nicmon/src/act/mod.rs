//! The act layer: send what was decided (in order, through the outbox), persist the next
//! state, export metrics, log.
pub mod courier;
pub mod dispatch;
pub mod logging;
pub mod metrics;
pub mod outbox;
pub mod stall;
pub mod state;
