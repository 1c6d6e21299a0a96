//! The kernel log pattern table (`reference/kernel-log-patterns.md`) and its operator
//! configuration (`[kernelLog]`, `[[kernelLog.patterns]]`).
//!
//! Patterns match the kernel's own format strings, never the `func:line` part of mlx5
//! messages (it changes with every build). A regex may name a capture group `bdf`,
//! `netdev` or `ifindex`: attribution then tries that device first. A `source` group is
//! the device a line says an error came from (the AER `... error message received from
//! <BDF>` line, printed by the root port): it decides alone — a GPU, NVMe or other
//! non-NIC source is no NIC's event, even below a switch shared with NICs.
use std::collections::BTreeSet;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::model::event::RecommendedAction;

/// Default dedup window per (pattern, card).
pub const DEFAULT_DEDUP_WINDOW_SECONDS: u64 = 60;
/// How many records after a soft lockup header a mlx5 frame may appear.
pub const SOFT_LOCKUP_FRAME_WINDOW: u32 = 150;
/// Id of the stateful soft lockup rule (header + mlx5 frame).
pub const SOFT_LOCKUP_ID: &str = "soft_lockup_mlx5";
/// Id of the `Link down` line: no event, a wake-up hint.
pub const LINK_DOWN_ID: &str = "link_down_msg";

/// What a matched line leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A health event with this severity.
    Event { fatal: bool, action: RecommendedAction },
    /// No event: ask for an immediate poll.
    WakeHint,
}

/// What a pattern's failure belongs to: the dedup key and the `NIC=` entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The card (firmware, PCIe, power): every PF and VF prints it, one event per card,
    /// entity = the card's first monitored PF.
    Card,
    /// One port/netdev (cable, module, TX queue): one event per device.
    Device,
}

/// One compiled pattern.
#[derive(Debug, Clone)]
pub struct Pattern {
    /// The id: `errorCode` of the events, the name operators override it by.
    pub id: String,
    pub regex: Regex,
    pub outcome: Outcome,
    pub scope: Scope,
    /// Dedup window per (pattern, card or device), seconds; 0 = every match is an event.
    pub dedup_window_seconds: u64,
    /// First words of the event message.
    pub description: String,
}

/// The stateful soft lockup rule: a header line, then within
/// [`SOFT_LOCKUP_FRAME_WINDOW`] records a reliable mlx5 frame.
#[derive(Debug, Clone)]
pub struct SoftLockupRule {
    pub header: Regex,
    pub frame: Regex,
    pub fatal: bool,
    pub action: RecommendedAction,
    pub dedup_window_seconds: u64,
}

/// The effective pattern set: built-ins with operator overrides applied, operator
/// additions first (explicit wins), in table order otherwise. The first matching
/// pattern decides for a line.
#[derive(Debug, Clone)]
pub struct Patterns {
    pub line: Vec<Pattern>,
    pub soft_lockup: Option<SoftLockupRule>,
    /// Window for dedup entries of patterns no longer configured (state pruning).
    pub default_window_seconds: u64,
}

impl Patterns {
    /// The built-in table with default severities.
    pub fn builtin() -> Patterns {
        KmsgConfig::default().compile().expect("built-in kernel log patterns compile")
    }

    pub fn get(&self, id: &str) -> Option<&Pattern> {
        self.line.iter().find(|p| p.id == id)
    }

    /// The first pattern matching `text`, with its captures.
    pub fn find<'t>(&self, text: &'t str) -> Option<(&Pattern, regex::Captures<'t>)> {
        self.line.iter().find_map(|p| p.regex.captures(text).map(|c| (p, c)))
    }

    /// The dedup window of a pattern id (soft lockup included), if configured.
    pub fn window_of(&self, id: &str) -> Option<u64> {
        if id == SOFT_LOCKUP_ID {
            return self.soft_lockup.as_ref().map(|s| s.dedup_window_seconds);
        }
        self.get(id).map(|p| p.dedup_window_seconds)
    }
}

struct Builtin {
    id: &'static str,
    regex: &'static str,
    /// `None`: wake hint, no event.
    severity: Option<(bool, RecommendedAction)>,
    scope: Scope,
    window: u64,
    description: &'static str,
}

const fn ev(
    id: &'static str,
    regex: &'static str,
    fatal: bool,
    action: RecommendedAction,
    description: &'static str,
) -> Builtin {
    Builtin {
        id,
        regex,
        severity: Some((fatal, action)),
        scope: Card,
        window: DEFAULT_DEDUP_WINDOW_SECONDS,
        description,
    }
}

/// A port-level failure.
const fn per_device(b: Builtin) -> Builtin {
    Builtin { scope: Device, ..b }
}

use RecommendedAction::{NONE, REPLACE_VM, RESTART_BM};
use Scope::{Card, Device};

/// `reference/kernel-log-patterns.md`, in precedence order (the more specific first).
const BUILTINS: &[Builtin] = &[
    ev(
        "cmd_timeout",
        r"\(0x[0-9a-fA-F]+\)(?: op_mod\(0x[0-9a-fA-F]+\))?(?: Async,)? timeout\. Will cause a leak of a command resource",
        true,
        RESTART_BM,
        "mlx5 firmware command timed out",
    ),
    ev(
        "health_compromised",
        r"device's health compromised - reached miss count",
        true,
        REPLACE_VM,
        "mlx5 health poll: device health compromised",
    ),
    // `print_health` prints the number on some kernels, not on others.
    ev("fw_fatal_error", r"Fatal error (?:\d+ )?detected", true, REPLACE_VM, "mlx5 firmware fatal error"),
    // Before fw_health_issue: `Health issue observed, unrecoverable hardware error, ...`.
    ev("fw_unrecoverable", r"unrecoverable hardware error", true, REPLACE_VM, "mlx5 unrecoverable hardware error"),
    ev("fw_health_issue", r"Health issue observed, .*severity\(\d+\)", false, NONE, "mlx5 firmware health issue"),
    ev(
        "health_recovery_failed",
        r"health recovery failed|health recovery flow aborted, PCI reads still not working",
        true,
        REPLACE_VM,
        "mlx5 health recovery failed",
    ),
    ev("pci_slot_unavailable", r"PCI slot (?:\d+ )?is unavailable", true, REPLACE_VM, "mlx5 PCI slot unavailable"),
    // PCI error recovery gave up on the card: `wait_vital` never saw the firmware again, or
    // `mlx5_pci_slot_reset` reports its result as `disconnect` (`recovered` is not a match).
    ev(
        "slot_reset_failed",
        r"mlx5_pci_slot_reset\b.*\b(?:wait vital failed with error code|Exit, err = -?\d+, result = \d+, disconnect\b)",
        true,
        REPLACE_VM,
        "mlx5 PCI slot reset failed",
    ),
    // The card never came up: mlx5's own `mlx5_load_one`/`mlx5_init_one` failure, and the
    // driver core's probe failure, whose older wording names the driver and the BDF in
    // the text (no device prefix, no ` DEVICE=`) and whose newer one (`dev_err`) has the
    // device prefix and names the driver in the text. Other drivers' probe failures are
    // not ours.
    ev(
        "load_failed",
        r"mlx5_(?:load|init)_one failed with error code:? -?\d+|(?:^|\s)mlx5_core: probe of (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) failed with error -?\d+|: probe with driver mlx5_core failed with error -?\d+",
        true,
        REPLACE_VM,
        "mlx5 driver failed to load the card",
    ),
    // Every other probe and initialisation failure path of mlx5 (`main.c`: `probe_one`,
    // `wait_fw_init`, `mlx5_function_enable`/`_open`/`_setup`, `mlx5_init_once`,
    // `mlx5_load`, `mlx5_mdev_init`; `dev.c`: an auxiliary driver that did not load),
    // older kernels' `handle_hca_cap failed`: the card did not come up. Only with the
    // `mlx5_core <[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]>:` prefix (the generic wordings are mlx5's only there).
    ev(
        "init_failed",
        r"(?:^|\s)mlx5_core (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): (?:\S+:\d+:\(pid \d+\): )?(?:mlx5_pci_init failed with error code:? -?\d+|Firmware over \d+ MS in (?:pre-initializing|initializing) state, aborting|Failed initializing command interface, aborting|Failed initializing timeouts, aborting|enable hca failed|failed to set issi|failed to allocate (?:boot|init) pages|failed to read dtor|set_hca_ctrl failed|set_hca_cap failed|handle_hca_cap failed|init hca failed|query hca failed|sw objs init failed|Failed allocating uar, aborting|Failed to alloc IRQs|Failed to create EQs|Failed to init flow steering|Failed to set hca defaults|sf table create failed|Failed to init embedded CPU|sriov init failed|fpga device start failed|Device\[\d+\] \([^)]*\) failed to load)",
        true,
        REPLACE_VM,
        "mlx5 card failed to initialise",
    ),
    // pciehp on a slot's downstream port (`pcieport <port>: pciehp: Slot(N): Card not
    // present`; `pciehp <port>:pcie004:` before 4.19): the card left its slot without an
    // orderly removal. Attributed to the cards below that port: a GPU's or an empty
    // slot's hot-plug is no NIC's.
    ev(
        "pcie_surprise_removal",
        r"(?:^|\s)(?:pcieport|pciehp) (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?::pcie\d+)?: (?:pciehp: )?Slot\([^)]*\): Card not present",
        true,
        REPLACE_VM,
        "PCIe card not present in its slot (surprise removal)",
    ),
    // A reset that did not bring the link or the device back (DPC containment, FLR, bus
    // reset; `pci_bridge_wait_for_secondary_bus`): the port's link never came up, or the
    // device never answered (`not ready <n>ms after DPC; giving up`, printed by the device
    // itself). The port's line may carry the DPC driver's prefix (`pcieport <port>: DPC:
    // Data Link Layer Link Active not set in 1000 msec`: the link behind the port did not
    // come back after containment); printed by the port, it is attributed to every
    // monitored card below it. `ready <n>ms after DPC` is the recovery that worked.
    ev(
        "pcie_link_not_restored",
        r"(?:^|\s)\S+ (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): (?:(?:DPC: )?Data Link Layer Link Active not set in \d+ msec|not ready \d+ms after [^;]+; giving up)",
        true,
        REPLACE_VM,
        "PCIe link or device not back after a reset",
    ),
    // Printed by the PCIe port above the card (`pci_info(bridge, ...)` in
    // `drivers/pci/pcie/err.c`; `subordinate device reset failed` is the DPC/reset path;
    // before 5.x the wording was `Device recovery failed`): attributed to every monitored
    // card below that bridge.
    ev(
        "aer_recovery_failed",
        r"(?:^|\s)(?:pcieport|mlx5_core) (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): AER: (?:[Dd]evice recovery failed|subordinate device reset failed)",
        true,
        REPLACE_VM,
        "PCIe error recovery failed",
    ),
    // `severity=` detail lines (wording changed in 6.8; printed by the source device) and
    // the root port's header line: `Uncorrected (Fatal) error received: <BDF>` (old),
    // `Uncorrectable (Fatal) error message received from <BDF>` (6.8+), whose BDF is the
    // source: it alone is named.
    ev(
        "pcie_fatal",
        r"severity=Uncorrect(?:ed|able) \(Fatal\)|Uncorrect(?:ed|able) \(Fatal\) error (?:message )?received(?:: | from )(?:id=\S+ )?(?P<source>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])?",
        true,
        REPLACE_VM,
        "PCIe uncorrectable fatal error",
    ),
    ev(
        "pcie_nonfatal",
        r"severity=Uncorrect(?:ed|able) \(Non-Fatal\)|Uncorrect(?:ed|able) \(Non-Fatal\) error (?:message )?received(?:: | from )(?:id=\S+ )?(?P<source>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])?",
        false,
        NONE,
        "PCIe uncorrectable non-fatal error",
    ),
    // Before 6.8 a WARN without device (`eth1 (mlx5_core)`), since 6.8 `netdev_crit`.
    per_device(ev(
        "netdev_watchdog",
        r"NETDEV WATCHDOG: (?P<netdev>\S+) \(mlx5_core\): transmit queue \d+ timed out|(?:^|\s)mlx5_core [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] [^:]+: NETDEV WATCHDOG: CPU: \d+: transmit queue \d+ timed out",
        false,
        NONE,
        "transmit queue timed out (NETDEV WATCHDOG)",
    )),
    // `netdev_err`: `mlx5_core <BDF> <if>: ...` (mlx4_en prints `TX timeout on queue` too).
    per_device(ev(
        "tx_timeout",
        r"(?:^|\s)mlx5_core [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] [^:]+: TX timeout (?:detected|on queue: \d+)",
        false,
        NONE,
        "mlx5 TX timeout",
    )),
    per_device(ev("rx_timeout", r"RX timeout on channel", false, NONE, "mlx5 RX timeout")),
    ev(
        "insufficient_power",
        r"Detected insufficient power on the PCIe slot",
        false,
        NONE,
        "insufficient power on the PCIe slot",
    ),
    ev(
        "ports_powered_down",
        r"One or more network ports have been powered down due to insufficient/unadvertised power on the PCIe slot",
        true,
        REPLACE_VM,
        "network ports powered down (PCIe slot power)",
    ),
    // Before module_error: the same `Port module event[error]` prefix.
    ev(
        "module_high_temp",
        r"Port module event\[error\]: module \d+, Cable error, High Temperature|High temperature on sensors",
        false,
        NONE,
        "high temperature",
    ),
    per_device(ev("module_error", r"Port module event\[error\]: module \d+, ", false, NONE, "port module error")),
    per_device(ev(
        "module_unplugged",
        r"Port module event: module \d+, Cable unplugged",
        false,
        NONE,
        "cable unplugged",
    )),
    // Other RDMA vendors' firmware-fatal, reset and hang lines (SPEC §1.14), each printed
    // with its driver's `<driver> <BDF>[ <if>]:` prefix (attributed to the card by that BDF,
    // as mlx5's). A firmware fatal condition or a reset that failed stops the RDMA device:
    // every queue pair of the card is lost — fatal, as mlx5's `fw_fatal_error`.
    // bnxt_en (`drivers/net/ethernet/broadcom/bnxt/bnxt.c`): `bnxt_async_event_process`
    // (RESET_NOTIFY; `..., data1: 0x%x, ...` since 6.x), `bnxt_fw_exception`.
    ev(
        "bnxt_fw_fatal",
        r"Firmware fatal reset event(?: received|, data1: 0x[0-9a-fA-F]+)|Detected firmware fatal condition, initiating reset",
        true,
        REPLACE_VM,
        "bnxt_en firmware fatal condition",
    ),
    // `bnxt_fw_reset`, `bnxt_fw_reset_task`: the firmware did not come back.
    ev("bnxt_fw_reset_failed", r"Firmware reset aborted", true, REPLACE_VM, "bnxt_en firmware reset failed"),
    // A reset the firmware announced (an update being activated): the link drops briefly.
    ev(
        "bnxt_fw_reset",
        r"Firmware non-fatal reset event(?: received|, data1: 0x[0-9a-fA-F]+)",
        false,
        NONE,
        "bnxt_en firmware reset",
    ),
    // ice (`drivers/net/ethernet/intel/ice/ice_main.c`: `ice_rebuild`, `ice_tx_timeout`,
    // `ice_probe_recovery_mode`; i40e prints the last two the same way).
    ev("ice_rebuild_failed", r"Rebuild failed, unload and reload driver", true, REPLACE_VM, "ice reset rebuild failed"),
    ev(
        "tx_timeout_unrecoverable",
        r"tx_timeout recovery unsuccessful, device is in unrecoverable state",
        true,
        REPLACE_VM,
        "transmit timeout recovery failed: device unrecoverable",
    ),
    ev(
        "fw_recovery_mode",
        r"Firmware recovery mode detected\. Limiting functionality",
        true,
        REPLACE_VM,
        "NIC firmware in recovery mode",
    ),
    // irdma (`drivers/infiniband/hw/irdma/main.c`, `irdma_iidc_event_handler`,
    // `irdma_request_reset`): `ibdev_*` lines, `ice <BDF> <ibdev>: ...`.
    ev(
        "irdma_critical_error",
        r"critical PE Error, GLPE_CRITERR=0x[0-9a-fA-F]+",
        true,
        REPLACE_VM,
        "irdma critical protocol engine error",
    ),
    ev(
        "irdma_reset_request",
        r"(?:^|\s)(?:ice|i40e|idpf) [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] \S+: Requesting a reset\b",
        false,
        NONE,
        "irdma requested a function reset",
    ),
    // ionic (`drivers/net/ethernet/pensando/ionic/ionic_dev.c` `ionic_heartbeat_check`,
    // `ionic_lif.c` `ionic_lif_handle_fw_up`).
    ev(
        "ionic_fw_heartbeat_stalled",
        r"(?:^|\s)ionic [0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]: FW heartbeat stalled at -?\d+",
        true,
        REPLACE_VM,
        "ionic firmware heartbeat stalled",
    ),
    ev("ionic_fw_restart_failed", r"FW Up: LIFs restart failed", true, REPLACE_VM, "ionic firmware restart failed"),
    Builtin {
        id: "access_reg_failed",
        regex: r"ACCESS_REG\(0x805\)(?: op_mod\(0x[0-9a-fA-F]+\))? failed",
        severity: Some((false, NONE)),
        scope: Card,
        // Reading restricted counters logs this on every read: once a day is plenty.
        window: 24 * 3600,
        description: "mlx5 ACCESS_REG command failed",
    },
    Builtin {
        id: LINK_DOWN_ID,
        regex: r"^mlx5_core (?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) (?P<netdev>\S+): Link down\b",
        severity: None,
        scope: Device,
        window: 0,
        description: "link down",
    },
];

const SOFT_LOCKUP_HEADER: &str = r"BUG: soft lockup - CPU#\d+ stuck for \d+s!";
/// A reliable frame (no `? ` prefix), or the RIP the CPU is stuck at.
const SOFT_LOCKUP_FRAME: &str = r"^\s*(?:RIP: [0-9a-fA-F]{4}:)?(?:mlx5e_napi_poll|mlx5e_poll_ico_cq)\+0x";

/// `[kernelLog]` of the config file (embed as `#[serde(rename = "kernelLog", default)]`):
///
/// ```toml
/// [kernelLog]
/// enabled = true              # watch /dev/kmsg at all
/// dedupWindowSeconds = 60     # per (pattern, card); access_reg_failed keeps 24 h
///
/// [[kernelLog.patterns]]      # override a built-in by name
/// name = "netdev_watchdog"
/// fatal = true                # action defaults to REPLACE_VM when fatal, else NONE
///
/// [[kernelLog.patterns]]      # disable a built-in
/// name = "insufficient_power"
/// enabled = false
///
/// [[kernelLog.patterns]]      # add one; (?P<bdf>..)/(?P<netdev>..) help attribution
/// name = "my_fw_assert"
/// regex = 'mlx5_core (?P<bdf>\S+): .*assert_var'
/// fatal = true
/// action = "RESTART_BM"
/// scope = "card"              # or "device"
/// dedupWindowSeconds = 300
/// description = "firmware assert"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// Watch the kernel log at all.
    pub enabled: bool,
    /// Dedup window per (pattern, card) for patterns that set none.
    pub dedup_window_seconds: u64,
    /// Additions and overrides of the built-in table, by `name`.
    pub patterns: Vec<PatternConfig>,
}

impl Default for KmsgConfig {
    fn default() -> Self {
        KmsgConfig { enabled: true, dedup_window_seconds: DEFAULT_DEDUP_WINDOW_SECONDS, patterns: Vec::new() }
    }
}

/// One `[[kernelLog.patterns]]` entry. With the `name` of a built-in it overrides the
/// fields it sets (`enabled = false` disables it); with a new name it adds a pattern
/// (`regex` required).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatternConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, alias = "isFatal", skip_serializing_if = "Option::is_none")]
    pub fatal: Option<bool>,
    /// A `RecommendedAction` name; default `REPLACE_VM` when fatal, else `NONE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `"card"` (default for new patterns) or `"device"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
}

/// An invalid `[kernelLog]` section; the message names the entry (if the fault is in one)
/// and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The `[[kernelLog.patterns]]` entry at fault; `None` for the section's own keys.
    pub index: Option<usize>,
    pub name: String,
    pub key: &'static str,
    pub problem: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(i) => write!(f, "kernelLog.patterns[{i}] (name {:?})", self.name)?,
            None => f.write_str("kernelLog")?,
        }
        write!(f, ": {}: {}", self.key, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// Longest accepted dedup window (a week): larger values are typos, not intent.
const MAX_WINDOW_SECONDS: u64 = 7 * 24 * 3600;

impl KmsgConfig {
    /// Validate and build the effective pattern set: the built-ins (`BUILTINS`, the
    /// soft lockup rule), then each entry in file order, checked (`Entry::parse`) and
    /// applied as an override of a built-in, or an addition.
    pub fn compile(&self) -> Result<Patterns, ConfigError> {
        if self.dedup_window_seconds > MAX_WINDOW_SECONDS {
            return Err(ConfigError {
                index: None,
                name: String::new(),
                key: "dedupWindowSeconds",
                problem: format!("{} is more than {MAX_WINDOW_SECONDS} (a week)", self.dedup_window_seconds),
            });
        }
        let mut line = self.builtins();
        let mut soft_lockup = Some(self.builtin_soft_lockup());
        let mut added: Vec<Pattern> = Vec::new();
        let mut disabled: BTreeSet<String> = BTreeSet::new();
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        for (index, pc) in self.patterns.iter().enumerate() {
            let entry = Entry::parse(index, pc, &mut seen)?;
            if pc.name == SOFT_LOCKUP_ID {
                if !entry.enabled {
                    soft_lockup = None;
                } else if let Some(rule) = soft_lockup.as_mut() {
                    entry.override_soft_lockup(rule);
                }
            } else if let Some(p) = line.iter_mut().find(|p| p.id == pc.name) {
                if !entry.enabled {
                    disabled.insert(pc.name.clone());
                } else {
                    entry.override_builtin(p)?;
                }
            } else if let Some(p) = entry.added(self.dedup_window_seconds)? {
                added.push(p);
            }
        }
        line.retain(|p| !disabled.contains(&p.id));
        added.extend(line);
        Ok(Patterns { line: added, soft_lockup, default_window_seconds: self.dedup_window_seconds })
    }

    /// The built-in table, compiled, with this section's default window.
    fn builtins(&self) -> Vec<Pattern> {
        BUILTINS
            .iter()
            .map(|b| Pattern {
                id: b.id.to_string(),
                regex: Regex::new(b.regex).expect("built-in regex"),
                outcome: match b.severity {
                    Some((fatal, action)) => Outcome::Event { fatal, action },
                    None => Outcome::WakeHint,
                },
                scope: b.scope,
                dedup_window_seconds: if b.window == DEFAULT_DEDUP_WINDOW_SECONDS {
                    self.dedup_window_seconds
                } else {
                    b.window
                },
                description: b.description.to_string(),
            })
            .collect()
    }

    fn builtin_soft_lockup(&self) -> SoftLockupRule {
        SoftLockupRule {
            header: Regex::new(SOFT_LOCKUP_HEADER).expect("built-in regex"),
            frame: Regex::new(SOFT_LOCKUP_FRAME).expect("built-in regex"),
            fatal: true,
            action: REPLACE_VM,
            dedup_window_seconds: self.dedup_window_seconds,
        }
    }
}

/// One `[[kernelLog.patterns]]` entry with its values checked and compiled.
struct Entry<'a> {
    index: usize,
    config: &'a PatternConfig,
    regex: Option<Regex>,
    action: Option<RecommendedAction>,
    enabled: bool,
}

impl<'a> Entry<'a> {
    /// Check the entry's name (well-formed, not seen before), compile its regex, parse its
    /// action, bound its window.
    fn parse(index: usize, pc: &'a PatternConfig, seen: &mut BTreeSet<&'a str>) -> Result<Entry<'a>, ConfigError> {
        let err = |key: &'static str, problem: String| ConfigError {
            index: Some(index),
            name: pc.name.clone(),
            key,
            problem,
        };
        if pc.name.is_empty() || !pc.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
            return Err(err("name", "must be non-empty and use only letters, digits, '_', '-', '.'".into()));
        }
        if !seen.insert(&pc.name) {
            return Err(err("name", "appears more than once".into()));
        }
        let regex = match &pc.regex {
            Some(r) => {
                Some(Regex::new(r).map_err(|e| err("regex", e.to_string().lines().last().unwrap_or("").into()))?)
            }
            None => None,
        };
        let action = match &pc.action {
            Some(a) => Some(RecommendedAction::parse(a).ok_or_else(|| {
                err(
                    "action",
                    format!(
                        "unknown action {a:?} (NONE, COMPONENT_RESET, CONTACT_SUPPORT, RUN_FIELDDIAG, RESTART_VM, RESTART_BM, REPLACE_VM, RUN_DCGMEUD, CUSTOM, UNKNOWN)"
                    ),
                )
            })?),
            None => None,
        };
        if let Some(w) = pc.dedup_window_seconds
            && w > MAX_WINDOW_SECONDS
        {
            return Err(err("dedupWindowSeconds", format!("{w} is more than {MAX_WINDOW_SECONDS} (a week)")));
        }
        Ok(Entry { index, config: pc, regex, action, enabled: pc.enabled.unwrap_or(true) })
    }

    fn err(&self, key: &'static str, problem: String) -> ConfigError {
        ConfigError { index: Some(self.index), name: self.config.name.clone(), key, problem }
    }

    /// An entry named [`SOFT_LOCKUP_ID`]: the header stays the kernel's; `regex` replaces
    /// the frame regex.
    fn override_soft_lockup(self, rule: &mut SoftLockupRule) {
        let pc = self.config;
        if let Some(r) = self.regex {
            rule.frame = r;
        }
        if let Some(f) = pc.fatal {
            rule.fatal = f;
            if self.action.is_none() {
                rule.action = default_action(f);
            }
        }
        if let Some(a) = self.action {
            rule.action = a;
        }
        if let Some(w) = pc.dedup_window_seconds {
            rule.dedup_window_seconds = w;
        }
    }

    /// An entry named as a built-in: the keys it gives override the built-in's.
    fn override_builtin(self, p: &mut Pattern) -> Result<(), ConfigError> {
        let pc = self.config;
        if let Some(r) = self.regex {
            p.regex = r;
        }
        if let Some(w) = pc.dedup_window_seconds {
            p.dedup_window_seconds = w;
        }
        if let Some(d) = &pc.description {
            p.description = d.clone();
        }
        if let Some(sc) = pc.scope {
            p.scope = sc;
        }
        match p.outcome {
            Outcome::WakeHint if pc.fatal.is_some() || self.action.is_some() => Err(ConfigError {
                index: Some(self.index),
                name: pc.name.clone(),
                key: "fatal",
                problem: format!("{} is a wake-up hint, not an event: it takes no fatal or action", pc.name),
            }),
            Outcome::WakeHint => Ok(()),
            Outcome::Event { fatal: old_fatal, action: old_action } => {
                let fatal = pc.fatal.unwrap_or(old_fatal);
                let action = self.action.unwrap_or(if pc.fatal.is_some() { default_action(fatal) } else { old_action });
                p.outcome = Outcome::Event { fatal, action };
                Ok(())
            }
        }
    }

    /// An entry with a new name: a pattern added (`None` when it is disabled).
    fn added(self, default_window: u64) -> Result<Option<Pattern>, ConfigError> {
        let Some(regex) = self.regex else {
            return Err(self.err("regex", "required for a pattern that is not a built-in".into()));
        };
        if !self.enabled {
            return Ok(None);
        }
        let pc = self.config;
        let fatal = pc.fatal.unwrap_or(false);
        Ok(Some(Pattern {
            id: pc.name.clone(),
            regex,
            outcome: Outcome::Event { fatal, action: self.action.unwrap_or(default_action(fatal)) },
            scope: pc.scope.unwrap_or(Card),
            dedup_window_seconds: pc.dedup_window_seconds.unwrap_or(default_window),
            description: pc.description.clone().unwrap_or_else(|| format!("kernel log pattern {}", pc.name)),
        }))
    }
}

fn default_action(fatal: bool) -> RecommendedAction {
    if fatal { REPLACE_VM } else { NONE }
}

/// The ids of the built-in table (soft lockup included), in table order.
pub fn builtin_ids() -> Vec<&'static str> {
    let mut ids: Vec<&'static str> = BUILTINS.iter().map(|b| b.id).collect();
    ids.insert(ids.len() - 1, SOFT_LOCKUP_ID);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(toml_text: &str) -> KmsgConfig {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn builtins_compile_with_defaults() {
        let p = Patterns::builtin();
        assert_eq!(p.get("access_reg_failed").unwrap().dedup_window_seconds, 86400);
        assert_eq!(p.get("cmd_timeout").unwrap().dedup_window_seconds, 60);
        assert_eq!(p.get("cmd_timeout").unwrap().outcome, Outcome::Event { fatal: true, action: RESTART_BM });
        assert!(p.soft_lockup.is_some());
        assert_eq!(builtin_ids().len(), BUILTINS.len() + 1);
    }

    #[test]
    fn operator_overrides_disables_and_adds() {
        let c = cfg(r#"
            dedupWindowSeconds = 120
            [[patterns]]
            name = "netdev_watchdog"
            fatal = true
            [[patterns]]
            name = "insufficient_power"
            enabled = false
            [[patterns]]
            name = "soft_lockup_mlx5"
            enabled = false
            [[patterns]]
            name = "my_pattern"
            regex = "mlx5_core .*: something bad"
            action = "CONTACT_SUPPORT"
            dedupWindowSeconds = 5
        "#);
        let p = c.compile().unwrap();
        assert_eq!(p.get("netdev_watchdog").unwrap().outcome, Outcome::Event { fatal: true, action: REPLACE_VM });
        assert_eq!(p.get("netdev_watchdog").unwrap().dedup_window_seconds, 120);
        assert!(p.get("insufficient_power").is_none());
        assert!(p.soft_lockup.is_none());
        assert_eq!(p.line[0].id, "my_pattern");
        assert_eq!(p.line[0].outcome, Outcome::Event { fatal: false, action: RecommendedAction::CONTACT_SUPPORT });
        assert_eq!(p.line[0].dedup_window_seconds, 5);
    }

    #[test]
    fn the_documented_toml_shape_parses() {
        #[derive(Deserialize)]
        struct Top {
            #[serde(rename = "kernelLog", default)]
            kernel_log: KmsgConfig,
        }
        let top: Top = toml::from_str(
            r#"
            [kernelLog]
            enabled = true
            dedupWindowSeconds = 60
            [[kernelLog.patterns]]
            name = "netdev_watchdog"
            fatal = true
            [[kernelLog.patterns]]
            name = "insufficient_power"
            enabled = false
            [[kernelLog.patterns]]
            name = "my_fw_assert"
            regex = 'mlx5_core (?P<bdf>\S+): .*assert_var'
            fatal = true
            action = "RESTART_BM"
            scope = "card"
            dedupWindowSeconds = 300
            description = "firmware assert"
            "#,
        )
        .unwrap();
        let p = top.kernel_log.compile().unwrap();
        assert_eq!(p.line[0].id, "my_fw_assert");
        assert_eq!(p.line[0].scope, Scope::Card);
        let empty: Top = toml::from_str("").unwrap();
        assert_eq!(empty.kernel_log, KmsgConfig::default());
    }

    #[test]
    fn validation_errors_name_the_entry_and_key() {
        let e = cfg(r#"
            [[patterns]]
            name = "ok"
            regex = "x"
            [[patterns]]
            name = "broken"
            regex = "mlx5_core (unclosed"
        "#)
        .compile()
        .unwrap_err();
        assert_eq!((e.index, e.name.as_str(), e.key), (Some(1), "broken", "regex"));
        assert!(e.to_string().starts_with("kernelLog.patterns[1] (name \"broken\"): regex: "));
        let e = KmsgConfig { dedup_window_seconds: 99_999_999, ..KmsgConfig::default() }.compile().unwrap_err();
        assert!(e.to_string().starts_with("kernelLog: dedupWindowSeconds: 99999999 is more than"), "{e}");

        let e = cfg(r#"
            [[patterns]]
            name = "cmd_timeout"
            action = "REBOOT"
        "#)
        .compile()
        .unwrap_err();
        assert_eq!(e.key, "action");
        assert!(e.to_string().contains("REBOOT"));

        let e = cfg("[[patterns]]\nname = \"new_one\"\nfatal = true\n").compile().unwrap_err();
        assert_eq!(e.key, "regex");

        let e = cfg("[[patterns]]\nname = \"a b\"\nregex = \"x\"\n").compile().unwrap_err();
        assert_eq!(e.key, "name");

        let e = cfg("[[patterns]]\nname = \"link_down_msg\"\nfatal = true\n").compile().unwrap_err();
        assert_eq!(e.key, "fatal");

        assert!(toml::from_str::<KmsgConfig>("[[patterns]]\nname = \"x\"\nregexp = \"y\"\n").is_err());
    }
}
