//! Firmware health (SPEC §1.13): the devlink health reporters of a PCI function (mlx5: `fw`,
//! `fw_fatal`, and per netdev `tx`, `rx`; bnxt_en and qed: `fw_fatal`). The same types are
//! the `--devlink-replay` file's JSON: `{"reporters": [{"name": "fw_fatal", "state":
//! "healthy"|"error", "error_count": N, "recover_count": N}]}`. Plain data, no I/O.
use serde::{Deserialize, Serialize};

/// A reporter's state (`DEVLINK_ATTR_HEALTH_REPORTER_STATE`: 0 healthy, 1 error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReporterState {
    Healthy,
    Error,
}

impl ReporterState {
    /// The kernel's number (`DEVLINK_HEALTH_REPORTER_STATE_*`); another number is none.
    pub fn from_kernel(v: u8) -> Option<ReporterState> {
        match v {
            0 => Some(ReporterState::Healthy),
            1 => Some(ReporterState::Error),
            _ => None,
        }
    }
}

/// One devlink health reporter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reporter {
    pub name: String,
    pub state: ReporterState,
    pub error_count: u64,
    pub recover_count: u64,
}

/// Every reporter of one PCI function, sorted by name: the replay file's content.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Reporters {
    pub reporters: Vec<Reporter>,
}

impl Reporters {
    /// The reporter named `name`.
    pub fn get(&self, name: &str) -> Option<&Reporter> {
        self.reporters.iter().find(|r| r.name == name)
    }

    /// Sorted by name, one per name (the first kept), names cleaned (printable ASCII, at
    /// most 64 bytes): what a read hands on.
    pub fn normalised(mut self) -> Reporters {
        for r in &mut self.reporters {
            r.name = r.name.chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
        }
        self.reporters.retain(|r| !r.name.is_empty());
        self.reporters.sort_by(|a, b| a.name.cmp(&b.name));
        self.reporters.dedup_by(|a, b| a.name == b.name);
        self
    }
}

/// The reporters nicmon judges and what a rise of each one's `error_count` means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReporterRule {
    pub reporter: &'static str,
    /// The event's error code.
    pub code: &'static str,
    pub fatal: bool,
}

/// The one table of judged reporters (SPEC §1.13).
pub const REPORTER_RULES: [ReporterRule; 4] = [
    ReporterRule { reporter: "fw_fatal", code: "fw_fatal", fatal: true },
    ReporterRule { reporter: "fw", code: "fw_error", fatal: false },
    ReporterRule { reporter: "tx", code: "tx_timeout", fatal: false },
    ReporterRule { reporter: "rx", code: "rx_error", fatal: false },
];

/// The rule of reporter `name`.
pub fn rule(name: &str) -> Option<&'static ReporterRule> {
    REPORTER_RULES.iter().find(|r| r.reporter == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_json_reads_and_writes() {
        let text = r#"{"reporters": [{"name": "fw_fatal", "state": "error", "error_count": 2, "recover_count": 1},
            {"name": "fw", "state": "healthy", "error_count": 0, "recover_count": 0}]}"#;
        let r: Reporters = serde_json::from_str(text).unwrap();
        let r = r.normalised();
        assert_eq!(r.reporters[0].name, "fw");
        let fatal = r.get("fw_fatal").unwrap();
        assert_eq!((fatal.state, fatal.error_count, fatal.recover_count), (ReporterState::Error, 2, 1));
        let back: Reporters = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(serde_json::from_str::<Reporters>(r#"{"reporters": [{"name": "fw", "state": "odd"}]}"#).is_err());
        assert!(
            serde_json::from_str::<Reporters>(
                r#"{"reporters": [{"name": "fw", "state": "error", "error_count": -1, "recover_count": 0}]}"#
            )
            .is_err()
        );
        assert_eq!(ReporterState::from_kernel(1), Some(ReporterState::Error));
        assert_eq!(ReporterState::from_kernel(7), None);
        assert_eq!(rule("fw_fatal").map(|r| r.fatal), Some(true));
        assert_eq!(rule("tx").map(|r| r.code), Some("tx_timeout"));
        assert!(rule("vnic").is_none());
    }
}
