//! The health event model: NVSentinel's `HealthEvent` (`reference/platform-connector-contract.md`).
//!
//! Serialises to proto3 JSON form (camelCase field names, enums by name, timestamps as
//! RFC 3339), which is what `nicmon check` prints and the JSON-lines sinks write. The gRPC
//! dispatcher converts it to the prost message.
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// `agent` of every event nicmon sends: the existing NIC monitor's identity (drop-in).
pub const AGENT: &str = "nic-health-monitor";
/// `componentClass` of every event.
pub const COMPONENT_CLASS: &str = "NIC";

/// What a check watches: the decider that files events under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckKind {
    /// Port and device state ([`crate::decide::linkstate`]), one check per link layer.
    PortState,
    /// Counter thresholds ([`crate::decide::counters`]), one check per link layer.
    Counters,
    /// The RDMA character devices ([`crate::decide::chardev`]).
    CharDevices,
    /// The kernel log ([`crate::decide::kmsg`]).
    KernelLog,
    /// The PCIe links and AER statistics of the NICs ([`crate::decide::pcie`]).
    Pcie,
    /// The NICs' hwmon temperature sensors ([`crate::decide::thermal`]).
    Thermal,
    /// The NICs' devlink health reporters ([`crate::decide::firmware`]).
    Firmware,
}

/// The one list of checks: the [`Check`] enum, [`Check::ALL`], each check's name (as the
/// platform and `--checks` spell it) and its [`CheckKind`] are all made from it.
macro_rules! checks {
    ($($(#[$doc:meta])* $name:ident => $kind:ident,)+) => {
        /// The check an event is filed under. The platform keeps one node condition per check.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum Check {
            $($(#[$doc])* $name,)+
        }

        impl Check {
            /// Every check, in declaration order (which is also their order).
            pub const ALL: [Check; [$(stringify!($name)),+].len()] = [$(Check::$name),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Check::$name => stringify!($name),)+
                }
            }

            pub const fn kind(self) -> CheckKind {
                match self {
                    $(Check::$name => CheckKind::$kind,)+
                }
            }
        }
    };
}

checks! {
    InfiniBandStateCheck => PortState,
    EthernetStateCheck => PortState,
    EFAStateCheck => PortState,
    InfiniBandDegradationCheck => Counters,
    EthernetDegradationCheck => Counters,
    EFADegradationCheck => Counters,
    InfiniBandCharDeviceCheck => CharDevices,
    NICKernelLogCheck => KernelLog,
    NICPCIeCheck => Pcie,
    NICThermalCheck => Thermal,
    NICFirmwareCheck => Firmware,
}

impl Check {
    pub fn parse(s: &str) -> Option<Check> {
        Check::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Every check's name, comma-separated (the default of `--checks`).
    pub fn all_names() -> String {
        Check::ALL.map(Check::as_str).join(",")
    }

    /// Whether this check's first poll of a boot waits for readable devices (upstream's
    /// state and counter checks).
    pub fn defers_first_poll(self) -> bool {
        matches!(self.kind(), CheckKind::PortState | CheckKind::Counters)
    }

    /// Whether this check watches devices one by one (port state, character devices): the
    /// checks the `devices_discovered` metric counts devices for.
    pub fn watches_devices(self) -> bool {
        matches!(self.kind(), CheckKind::PortState | CheckKind::CharDevices)
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `RecommendedAction` (enum numbers of the wire contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(non_camel_case_types)]
pub enum RecommendedAction {
    NONE = 0,
    COMPONENT_RESET = 2,
    CONTACT_SUPPORT = 5,
    RUN_FIELDDIAG = 6,
    RESTART_VM = 15,
    RESTART_BM = 24,
    REPLACE_VM = 25,
    RUN_DCGMEUD = 26,
    CUSTOM = 27,
    UNKNOWN = 99,
}

impl RecommendedAction {
    pub fn parse(s: &str) -> Option<Self> {
        use RecommendedAction::*;
        Some(match s {
            "NONE" => NONE,
            "COMPONENT_RESET" => COMPONENT_RESET,
            "CONTACT_SUPPORT" => CONTACT_SUPPORT,
            "RUN_FIELDDIAG" => RUN_FIELDDIAG,
            "RESTART_VM" => RESTART_VM,
            "RESTART_BM" => RESTART_BM,
            "REPLACE_VM" => REPLACE_VM,
            "RUN_DCGMEUD" => RUN_DCGMEUD,
            "CUSTOM" => CUSTOM,
            "UNKNOWN" => UNKNOWN,
            _ => return None,
        })
    }
}

/// `ProcessingStrategy` (enum numbers of the wire contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[allow(non_camel_case_types)]
pub enum ProcessingStrategy {
    UNSPECIFIED = 0,
    #[default]
    EXECUTE_REMEDIATION = 1,
    STORE_ONLY = 2,
    STORE_AND_ANALYSE = 3,
}

impl ProcessingStrategy {
    pub fn parse(s: &str) -> Option<Self> {
        use ProcessingStrategy::*;
        Some(match s {
            "UNSPECIFIED" => UNSPECIFIED,
            "EXECUTE_REMEDIATION" => EXECUTE_REMEDIATION,
            "STORE_ONLY" => STORE_ONLY,
            "STORE_AND_ANALYSE" => STORE_AND_ANALYSE,
            _ => return None,
        })
    }
}

/// What an event is about. Decide names it with typed [`Entity`] values; the layers after
/// decide read it through [`HealthEvent::subject`], never from the wire's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntityKind {
    /// An RDMA device (`NIC=<device>`).
    Device,
    /// A port of a device (`NIC=<device>` + `NICPort=<n>`).
    Port,
    /// A card: the functions of one PCI slot (`NIC=<PCI domain:bus:device>`).
    Card,
    /// The node: no entity on the wire (a check-scoped clear, a poll stall), or several
    /// devices at once (a kernel-log line that names no device, filed against every
    /// monitored card).
    Node,
}

/// An entity an event impacts. On the wire (`entityType`, `entityValue`) a device and a
/// card are both `NIC`: read back from the wire form (the state file's outbox, the journal)
/// a card is a [`Entity::Device`] — what is done with a batch read back (sending it again,
/// reading its ports) never needs the difference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "WireEntity")]
pub enum Entity {
    /// `NIC=<device>`.
    Device(String),
    /// `NICPort=<n>`: a port of the device named beside it.
    Port(u32),
    /// `NIC=<PCI domain:bus:device>`: a card (a port-state check's card-level events).
    Card(String),
}

/// The wire's `entityType` of a device or a card, and of a port.
const NIC: &str = "NIC";
const NIC_PORT: &str = "NICPort";

impl Entity {
    pub fn device(name: impl Into<String>) -> Entity {
        Entity::Device(name.into())
    }
    pub fn port(n: u32) -> Entity {
        Entity::Port(n)
    }
    pub fn card(slot: impl Into<String>) -> Entity {
        Entity::Card(slot.into())
    }

    pub fn kind(&self) -> EntityKind {
        match self {
            Entity::Device(_) => EntityKind::Device,
            Entity::Port(_) => EntityKind::Port,
            Entity::Card(_) => EntityKind::Card,
        }
    }

    /// The wire's `entityType`.
    pub fn wire_type(&self) -> &'static str {
        match self {
            Entity::Device(_) | Entity::Card(_) => NIC,
            Entity::Port(_) => NIC_PORT,
        }
    }

    /// The wire's `entityValue`.
    pub fn wire_value(&self) -> String {
        match self {
            Entity::Device(name) | Entity::Card(name) => name.clone(),
            Entity::Port(n) => n.to_string(),
        }
    }
}

impl Serialize for Entity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Entity", 2)?;
        st.serialize_field("entityType", self.wire_type())?;
        match self {
            Entity::Device(name) | Entity::Card(name) => st.serialize_field("entityValue", name)?,
            Entity::Port(n) => st.serialize_field("entityValue", &n.to_string())?,
        }
        st.end()
    }
}

/// An entity in the wire's shape, as the state file holds it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEntity {
    entity_type: String,
    entity_value: String,
}

/// An entity of the state file that nicmon does not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntityError {
    #[error("NICPort {0:?}: not a port number")]
    Port(String),
    #[error("entity type {0:?}: not one nicmon writes")]
    Type(String),
}

impl TryFrom<WireEntity> for Entity {
    type Error = EntityError;

    fn try_from(w: WireEntity) -> Result<Entity, EntityError> {
        match w.entity_type.as_str() {
            NIC => Ok(Entity::Device(w.entity_value)),
            NIC_PORT => w.entity_value.parse().map(Entity::Port).map_err(|_| EntityError::Port(w.entity_value.clone())),
            other => Err(EntityError::Type(other.to_string())),
        }
    }
}

/// What an event is about, from its typed entities ([`HealthEvent::subject`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject<'a> {
    Device(&'a str),
    Port { device: &'a str, port: u32 },
    Card(&'a str),
    Node,
}

impl Subject<'_> {
    pub fn kind(&self) -> EntityKind {
        match self {
            Subject::Device(_) => EntityKind::Device,
            Subject::Port { .. } => EntityKind::Port,
            Subject::Card(_) => EntityKind::Card,
            Subject::Node => EntityKind::Node,
        }
    }
}

/// One health event, in the shape of the wire contract's `HealthEvent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthEvent {
    pub version: u32,
    /// The agent's name, component class and check name: constants shared by every event
    /// (a reboot's baselines on a node of many ports are tens of thousands of events), or
    /// values read back (a state file, the journal).
    pub agent: Cow<'static, str>,
    pub component_class: Cow<'static, str>,
    pub check_name: Cow<'static, str>,
    pub is_fatal: bool,
    pub is_healthy: bool,
    pub message: String,
    pub recommended_action: RecommendedAction,
    pub error_code: Vec<String>,
    pub entities_impacted: Vec<Entity>,
    pub metadata: BTreeMap<String, String>,
    #[serde(with = "time::serde::rfc3339")]
    pub generated_timestamp: OffsetDateTime,
    pub node_name: String,
    pub processing_strategy: ProcessingStrategy,
}

/// The node-level facts stamped on every event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamp {
    pub node_name: String,
    pub processing_strategy: ProcessingStrategy,
}

impl HealthEvent {
    /// A new event with the agent identity filled in. `message` is sanitised: the
    /// connector builds `"... <message> Recommended Action=<A>;"`, so no `;` may appear.
    pub fn new(check: Check, stamp: &Stamp, now: OffsetDateTime, message: &str) -> HealthEvent {
        HealthEvent {
            version: 1,
            agent: Cow::Borrowed(AGENT),
            component_class: Cow::Borrowed(COMPONENT_CLASS),
            check_name: Cow::Borrowed(check.as_str()),
            is_fatal: false,
            is_healthy: true,
            message: sanitize_message(message),
            recommended_action: RecommendedAction::NONE,
            error_code: Vec::new(),
            entities_impacted: Vec::new(),
            metadata: BTreeMap::new(),
            generated_timestamp: now,
            node_name: stamp.node_name.clone(),
            processing_strategy: stamp.processing_strategy,
        }
    }

    /// Unhealthy; fatal → `REPLACE_VM`, else `NONE`.
    pub fn unhealthy(mut self, fatal: bool) -> HealthEvent {
        self.is_healthy = false;
        self.is_fatal = fatal;
        self.recommended_action = if fatal { RecommendedAction::REPLACE_VM } else { RecommendedAction::NONE };
        self
    }

    pub fn action(mut self, action: RecommendedAction) -> HealthEvent {
        self.recommended_action = action;
        self
    }

    pub fn entities(mut self, entities: Vec<Entity>) -> HealthEvent {
        self.entities_impacted = entities;
        self
    }

    pub fn error_code(mut self, code: impl Into<String>) -> HealthEvent {
        self.error_code = vec![code.into()];
        self
    }

    pub fn check(&self) -> Option<Check> {
        Check::parse(&self.check_name)
    }

    /// What the event is about: a port (its device and number), a device, a card, or the
    /// node (no entity, or several devices).
    pub fn subject(&self) -> Subject<'_> {
        let mut device = None;
        let mut devices = 0;
        let mut port = None;
        let mut card = None;
        for e in &self.entities_impacted {
            match e {
                Entity::Device(d) => {
                    device = device.or(Some(d.as_str()));
                    devices += 1;
                }
                Entity::Port(n) => port = port.or(Some(*n)),
                Entity::Card(c) => card = card.or(Some(c.as_str())),
            }
        }
        match (device, port, card) {
            (Some(device), Some(port), _) => Subject::Port { device, port },
            (_, _, Some(card)) => Subject::Card(card),
            (Some(device), None, None) if devices == 1 => Subject::Device(device),
            _ => Subject::Node,
        }
    }

    /// [`HealthEvent::subject`]'s kind.
    pub fn kind(&self) -> EntityKind {
        self.subject().kind()
    }

    /// The entities as people read them: `NIC=mlx5_0 NICPort=1`.
    pub fn entities_text(&self) -> String {
        let parts: Vec<String> =
            self.entities_impacted.iter().map(|x| format!("{}={}", x.wire_type(), x.wire_value())).collect();
        parts.join(" ")
    }
}

/// Longest message nicmon sends (the node condition text is built from it).
pub const MAX_MESSAGE_LEN: usize = 512;

/// Make `s` safe for the connector's condition text: no `;`, no `Recommended Action=`,
/// no control characters, at most [`MAX_MESSAGE_LEN`] bytes (cut on a char boundary).
pub fn sanitize_message(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| match c {
            ';' => ',',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    while let Some(i) = out.find("Recommended Action=") {
        out.replace_range(i..i + "Recommended Action=".len(), "recommended action: ");
    }
    if out.len() > MAX_MESSAGE_LEN {
        let mut cut = MAX_MESSAGE_LEN - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_removes_separators_and_caps_length() {
        assert_eq!(sanitize_message("a;b\nc"), "a,b c");
        assert!(!sanitize_message("x Recommended Action=REPLACE_VM").contains("Recommended Action="));
        let long = "é".repeat(600);
        let s = sanitize_message(&long);
        assert!(s.len() <= MAX_MESSAGE_LEN && s.ends_with("..."));
    }

    #[test]
    fn every_check_is_named_and_parsed_from_the_one_list() {
        let names = Check::all_names();
        let parsed: Vec<Check> = names.split(',').map(|n| Check::parse(n).unwrap()).collect();
        assert_eq!(parsed, Check::ALL);
        for c in Check::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        let deferring: Vec<&str> =
            Check::ALL.into_iter().filter(|c| c.defers_first_poll()).map(Check::as_str).collect();
        assert_eq!(deferring.len(), 6, "the state and degradation checks: {deferring:?}");
        assert!(Check::InfiniBandCharDeviceCheck.watches_devices() && !Check::NICKernelLogCheck.watches_devices());
        assert_eq!(Check::parse("NICPollStallCheck"), None);
    }

    #[test]
    fn serialises_in_proto3_json_form() {
        let stamp = Stamp { node_name: "n1".into(), processing_strategy: ProcessingStrategy::STORE_ONLY };
        let ev = HealthEvent::new(
            Check::InfiniBandStateCheck,
            &stamp,
            time::macros::datetime!(2026-01-02 03:04:05 UTC),
            "Port mlx5_0 port 1: state DOWN",
        )
        .unhealthy(true)
        .entities(vec![Entity::device("mlx5_0"), Entity::port(1)]);
        let v = serde_json::to_value(&ev).unwrap();
        assert_eq!(v["checkName"], "InfiniBandStateCheck");
        assert_eq!(v["recommendedAction"], "REPLACE_VM");
        assert_eq!(v["processingStrategy"], "STORE_ONLY");
        assert_eq!(v["generatedTimestamp"], "2026-01-02T03:04:05Z");
        assert_eq!(v["entitiesImpacted"][1]["entityType"], "NICPort");
    }

    /// Each kind's wire form is what the derived `{entityType, entityValue}` struct wrote
    /// (the JSON-lines sinks, `nicmon check`, the state file), and it reads back.
    #[test]
    fn entities_keep_the_wire_form() {
        let cases = [
            (Entity::device("mlx5_0"), r#"{"entityType":"NIC","entityValue":"mlx5_0"}"#),
            (Entity::port(2), r#"{"entityType":"NICPort","entityValue":"2"}"#),
            (Entity::card("0000:1a:00"), r#"{"entityType":"NIC","entityValue":"0000:1a:00"}"#),
        ];
        for (e, wire) in &cases {
            assert_eq!(serde_json::to_string(e).unwrap(), *wire);
        }
        let back: Vec<Entity> = cases.iter().map(|(_, w)| serde_json::from_str(w).unwrap()).collect();
        // A card reads back as a device: the wire does not tell them apart.
        assert_eq!(back, [Entity::device("mlx5_0"), Entity::port(2), Entity::device("0000:1a:00")]);
        // Field order and unknown keys do not matter, as for the derived struct.
        let e: Entity = serde_json::from_str(r#"{"entityValue":"3","x":1,"entityType":"NICPort"}"#).unwrap();
        assert_eq!(e, Entity::port(3));
        for bad in [
            r#"{"entityType":"NICPort","entityValue":"one"}"#,
            r#"{"entityType":"GPU","entityValue":"0"}"#,
            r#"{"entityType":"NIC"}"#,
        ] {
            assert!(serde_json::from_str::<Entity>(bad).is_err(), "{bad}");
        }
    }

    /// What an event is about, from its typed entities.
    #[test]
    fn the_subject_of_each_entity_list() {
        let ev = |entities: Vec<Entity>| {
            HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), OffsetDateTime::UNIX_EPOCH, "x")
                .entities(entities)
        };
        let cases = [
            (vec![Entity::device("mlx5_0"), Entity::port(1)], Subject::Port { device: "mlx5_0", port: 1 }),
            (vec![Entity::device("mlx5_0")], Subject::Device("mlx5_0")),
            (vec![Entity::card("0000:1a:00")], Subject::Card("0000:1a:00")),
            (vec![], Subject::Node),
            (vec![Entity::device("mlx5_0"), Entity::device("mlx5_4")], Subject::Node),
        ];
        for (entities, want) in cases {
            let e = ev(entities);
            assert_eq!(e.subject(), want, "{e:?}");
            assert_eq!(e.kind(), want.kind());
        }
        let port = ev(vec![Entity::device("mlx5_0"), Entity::port(1)]);
        assert_eq!(port.entities_text(), "NIC=mlx5_0 NICPort=1");
        let v = serde_json::to_value(&port).unwrap();
        assert_eq!(
            v["entitiesImpacted"],
            serde_json::json!([
                {"entityType": "NIC", "entityValue": "mlx5_0"},
                {"entityType": "NICPort", "entityValue": "1"},
            ])
        );
        let back: HealthEvent = serde_json::from_value(v).unwrap();
        assert_eq!(back, port);
    }
}
