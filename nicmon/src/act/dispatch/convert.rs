//! `event::HealthEvent` → the prost message of the wire contract.
use std::collections::HashMap;

use nicmon_proto::datamodels as pb;
use time::OffsetDateTime;

use crate::model::event::{self, HealthEvent, ProcessingStrategy, RecommendedAction};

/// `HealthEvents.version` and `HealthEvent.version` of everything nicmon sends.
pub const WIRE_VERSION: u32 = 1;

/// One `HealthEvents` batch (`version = 1`) carrying `events` in order.
pub fn to_proto_batch(events: &[HealthEvent]) -> pb::HealthEvents {
    pb::HealthEvents { version: WIRE_VERSION, events: events.iter().map(to_proto).collect() }
}

/// The wire form of one event. Fields the event model does not carry (`id`,
/// `customRecommendedAction`, the quarantine/drain overrides) are left unset, as the
/// existing NIC monitor leaves them.
pub fn to_proto(ev: &HealthEvent) -> pb::HealthEvent {
    pb::HealthEvent {
        version: ev.version,
        agent: ev.agent.to_string(),
        component_class: ev.component_class.to_string(),
        check_name: ev.check_name.to_string(),
        is_fatal: ev.is_fatal,
        is_healthy: ev.is_healthy,
        message: ev.message.clone(),
        recommended_action: recommended_action(ev.recommended_action) as i32,
        error_code: ev.error_code.clone(),
        entities_impacted: ev.entities_impacted.iter().map(entity).collect(),
        metadata: ev.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>(),
        generated_timestamp: Some(timestamp(ev.generated_timestamp)),
        node_name: ev.node_name.clone(),
        quarantine_overrides: None,
        drain_overrides: None,
        processing_strategy: processing_strategy(ev.processing_strategy) as i32,
        id: String::new(),
        custom_recommended_action: String::new(),
    }
}

fn entity(e: &event::Entity) -> pb::Entity {
    pb::Entity { entity_type: e.wire_type().into(), entity_value: e.wire_value() }
}

pub fn timestamp(t: OffsetDateTime) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        // Always in 0..1e9, so the cast cannot truncate.
        nanos: t.nanosecond() as i32,
    }
}

pub fn recommended_action(a: RecommendedAction) -> pb::RecommendedAction {
    use pb::RecommendedAction as W;
    match a {
        RecommendedAction::NONE => W::None,
        RecommendedAction::COMPONENT_RESET => W::ComponentReset,
        RecommendedAction::CONTACT_SUPPORT => W::ContactSupport,
        RecommendedAction::RUN_FIELDDIAG => W::RunFielddiag,
        RecommendedAction::RESTART_VM => W::RestartVm,
        RecommendedAction::RESTART_BM => W::RestartBm,
        RecommendedAction::REPLACE_VM => W::ReplaceVm,
        RecommendedAction::RUN_DCGMEUD => W::RunDcgmeud,
        RecommendedAction::CUSTOM => W::Custom,
        RecommendedAction::UNKNOWN => W::Unknown,
    }
}

pub fn processing_strategy(s: ProcessingStrategy) -> pb::ProcessingStrategy {
    use pb::ProcessingStrategy as W;
    match s {
        ProcessingStrategy::UNSPECIFIED => W::Unspecified,
        ProcessingStrategy::EXECUTE_REMEDIATION => W::ExecuteRemediation,
        ProcessingStrategy::STORE_ONLY => W::StoreOnly,
        ProcessingStrategy::STORE_AND_ANALYSE => W::StoreAndAnalyse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Check, Entity, Stamp};

    const ACTIONS: [RecommendedAction; 10] = [
        RecommendedAction::NONE,
        RecommendedAction::COMPONENT_RESET,
        RecommendedAction::CONTACT_SUPPORT,
        RecommendedAction::RUN_FIELDDIAG,
        RecommendedAction::RESTART_VM,
        RecommendedAction::RESTART_BM,
        RecommendedAction::REPLACE_VM,
        RecommendedAction::RUN_DCGMEUD,
        RecommendedAction::CUSTOM,
        RecommendedAction::UNKNOWN,
    ];
    const STRATEGIES: [ProcessingStrategy; 4] = [
        ProcessingStrategy::UNSPECIFIED,
        ProcessingStrategy::EXECUTE_REMEDIATION,
        ProcessingStrategy::STORE_ONLY,
        ProcessingStrategy::STORE_AND_ANALYSE,
    ];

    #[test]
    fn enum_names_and_numbers_match_the_wire() {
        for a in ACTIONS {
            let w = recommended_action(a);
            assert_eq!(w as i32, a as i32, "{a:?}");
            assert_eq!(serde_json::to_value(a).unwrap(), w.as_str_name(), "{a:?}");
        }
        for s in STRATEGIES {
            let w = processing_strategy(s);
            assert_eq!(w as i32, s as i32, "{s:?}");
            assert_eq!(serde_json::to_value(s).unwrap(), w.as_str_name(), "{s:?}");
        }
    }

    #[test]
    fn every_field_is_carried() {
        let stamp = Stamp { node_name: "gpu-node-7".into(), processing_strategy: ProcessingStrategy::STORE_ONLY };
        let t = time::macros::datetime!(2026-03-04 05:06:07.123456789 UTC);
        let mut ev =
            HealthEvent::new(Check::InfiniBandDegradationCheck, &stamp, t, "mlx5_3 port 1: symbol_error rose by 12")
                .unhealthy(true)
                .entities(vec![Entity::device("mlx5_3"), Entity::port(1)])
                .error_code("symbol_error");
        ev.metadata.insert("card".into(), "0000:3b:00".into());

        let w = to_proto(&ev);
        assert_eq!(w.version, 1);
        assert_eq!(w.agent, "nic-health-monitor");
        assert_eq!(w.component_class, "NIC");
        assert_eq!(w.check_name, "InfiniBandDegradationCheck");
        assert!(w.is_fatal && !w.is_healthy);
        assert_eq!(w.message, "mlx5_3 port 1: symbol_error rose by 12");
        assert_eq!(w.recommended_action, 25);
        assert_eq!(w.error_code, vec!["symbol_error"]);
        assert_eq!(w.entities_impacted.len(), 2);
        assert_eq!(w.entities_impacted[1].entity_type, "NICPort");
        assert_eq!(w.entities_impacted[1].entity_value, "1");
        assert_eq!(w.metadata["card"], "0000:3b:00");
        let ts = w.generated_timestamp.unwrap();
        assert_eq!(ts.seconds, t.unix_timestamp());
        assert_eq!(ts.nanos, 123_456_789);
        assert_eq!(w.node_name, "gpu-node-7");
        assert_eq!(w.processing_strategy, 2);

        let batch = to_proto_batch(std::slice::from_ref(&ev));
        assert_eq!(batch.version, 1);
        assert_eq!(batch.events, vec![w]);
    }
}
