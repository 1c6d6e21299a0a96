//! What `nicmon check` and `nicmon topology` print (SPEC §2): a stable JSON object for
//! machines, a table for people.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::decide::chardev::Finding;
use crate::decide::linkstate::{LinkState, port_key};
use crate::decide::pcie::link;
use crate::decide::roles::{Classification, Role};
use crate::model::Snapshot;
use crate::model::driver::RdmaDriver;
use crate::model::event::HealthEvent;
use crate::model::pcie::parse::AerSeverity;
use crate::model::pcie::parse::Speed;
use crate::model::pcie::reading::PcieReading;
use crate::model::topology::Topology;

#[derive(Debug, Serialize)]
pub struct Report {
    pub node_name: String,
    pub boot_id: Option<String>,
    pub devices: Vec<DeviceReport>,
    pub topology_source: &'static str,
    pub topology_notes: Vec<String>,
    /// The InfiniBand character devices expected this poll (and latched ones still held):
    /// present or not, misses so far, whether a missing-node event is outstanding.
    pub char_devices: Vec<Finding>,
    /// Ports whose healthy→unhealthy transition `[stateCheck] portStateHoldDown` holds this
    /// poll, and held transitions that recovered in time (blips: nothing published).
    pub held_ports: Vec<crate::decide::linkstate::Held>,
    pub blips: Vec<crate::decide::linkstate::Blip>,
    pub events: Vec<HealthEvent>,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub name: String,
    pub monitored: bool,
    pub reason: Option<String>,
    pub pci_address: Option<String>,
    pub card: Option<String>,
    pub numa_node: Option<i32>,
    pub hca_type: Option<String>,
    pub fw_ver: Option<String>,
    pub board_id: Option<String>,
    pub is_vf: bool,
    pub netdev: Option<String>,
    pub role: Option<Role>,
    pub role_reason: Option<String>,
    /// The RDMA driver recognised (SPEC §1.14): `bnxt_re`, `ionic`, `irdma`, `rxe`, `siw`;
    /// absent for mlx5 and EFA devices (their report predates it) and unrecognised ones.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdma_driver: Option<&'static str>,
    /// A software RDMA device (rxe, siw): never fatal. Absent (false) for hardware.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub software: bool,
    pub ports: Vec<PortReport>,
    /// Device attributes that were unknown (`numa_node`), and why.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
    /// The PF's PCIe link and AER totals (SPEC §1.10); `null` for VFs and devices not read.
    pub pcie: Option<PcieReport>,
    /// The PCI function's hwmon sensors (millidegrees Celsius), SPEC §1.13.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sensors: Vec<crate::model::thermal::Sensor>,
    /// The PCI function's devlink health reporters, SPEC §1.13.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devlink: Vec<crate::model::devlink::Reporter>,
}

/// A PF's PCIe link as `nicmon check` shows it.
#[derive(Debug, Serialize)]
pub struct PcieReport {
    /// `"x16 Gen5"` (`"down"` while the link is down).
    pub link: String,
    pub width: Option<u8>,
    /// GT/s (`32.0`); `null` while the link is down.
    pub speed_gts: Option<f64>,
    /// What the link can do: the lower of both ends' maxima (`null` when unknown, or no
    /// upstream port).
    pub capable_width: Option<u8>,
    pub capable_speed_gts: Option<f64>,
    /// The upstream bridge port (the other end of the link).
    pub upstream_port: Option<String>,
    /// `TOTAL_ERR_COR`, `TOTAL_ERR_NONFATAL`, `TOTAL_ERR_FATAL` (`null` without AER).
    pub aer_correctable: Option<u64>,
    pub aer_nonfatal: Option<u64>,
    pub aer_fatal: Option<u64>,
}

impl PcieReport {
    fn of(r: &PcieReading) -> PcieReport {
        let gts = |s: Option<Speed>| s.map(|s| f64::from(s.mts()) / 1000.0);
        let cap = link::capability(r);
        let total = |s: AerSeverity| r.aer.get(s).map(|c| c.total);
        PcieReport {
            link: r.link.label(),
            width: r.link.width,
            speed_gts: gts(r.link.speed),
            capable_width: cap.and_then(|c| c.width),
            capable_speed_gts: gts(cap.and_then(|c| c.speed)),
            upstream_port: r.upstream.as_ref().map(|u| u.address.clone()),
            aer_correctable: total(AerSeverity::Correctable),
            aer_nonfatal: total(AerSeverity::NonFatal),
            aer_fatal: total(AerSeverity::Fatal),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct PortReport {
    pub port: u32,
    pub link_layer: Option<String>,
    pub state: Option<String>,
    pub phys_state: Option<String>,
    pub rate_gbps: Option<f64>,
    pub healthy: bool,
    pub operstate: Option<String>,
    /// The netdev's carrier (`None`: no netdev, or unreadable).
    pub carrier: Option<bool>,
    pub lid: Option<u32>,
    pub sm_lid: Option<u32>,
    /// Counter file name → value; unreadable ones absent.
    pub counters: BTreeMap<String, u64>,
    /// Attributes that were unknown (`state`, `phys_state`, `link_layer`), and why.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
    /// Held as flapping (flap damping): one fatal event sent, transitions not published.
    pub flapping: bool,
    /// Unhealthy transitions: since the hold began while flapping, else those in the window.
    pub flap_transitions: u64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub flapping_since: Option<time::OffsetDateTime>,
    /// The port's last transitions, oldest first (see [`crate::model::history`]).
    pub history: Vec<crate::model::history::Transition>,
    /// A RoCE port's physical layer (SPEC §1.11); absent where no ethtool data was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phy: Option<PhyReport>,
    /// The port's transceiver as last read (SPEC §1.13); absent where none was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleReport>,
}

/// A port's transceiver, briefly: what the MODULE column shows.
#[derive(Debug, Serialize, PartialEq)]
pub struct ModuleReport {
    /// `QSFP28`, `OSFP`, ...
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub temperature_c: Option<f64>,
    /// The lane with the least receive power, its power (dBm; `None`: no light) and the
    /// module's low warning (dBm).
    pub worst_lane: Option<usize>,
    pub worst_rx_power_dbm: Option<f64>,
    pub rx_power_low_warning_dbm: Option<f64>,
    /// Lanes with a latched Rx LOS / Tx fault; CMIS module state Fault.
    pub rx_los_lanes: Vec<usize>,
    pub tx_fault_lanes: Vec<usize>,
    pub fault: bool,
}

impl ModuleReport {
    pub fn of(m: &crate::model::module::Module) -> ModuleReport {
        use crate::model::module::dbm;
        let worst = m.worst_rx_lane();
        ModuleReport {
            kind: m.type_name(),
            temperature_c: m.temperature_c,
            worst_lane: worst.map(|l| l.number),
            worst_rx_power_dbm: worst.and_then(|l| dbm(l.rx_power_mw)),
            rx_power_low_warning_dbm: dbm(m.rx_power_thresholds_mw.map(|t| t.low_warning)),
            rx_los_lanes: m.rx_los_lanes(),
            tx_fault_lanes: m.tx_fault_lanes(),
            fault: m.in_fault(),
        }
    }

    /// For the table: `OSFP 45C -3.0/-10.0` (type, temperature, worst lane's Rx power
    /// against its low warning, dBm), `OSFP 45C LOS` with no light on any lane.
    pub fn cell(&self) -> String {
        let mut cell = self.kind.to_string();
        if let Some(t) = self.temperature_c {
            let _ = write!(cell, " {t:.0}C");
        }
        let warn = self.rx_power_low_warning_dbm.map_or("?".to_string(), |w| format!("{w:.1}"));
        match (self.worst_lane, self.worst_rx_power_dbm) {
            (_, Some(p)) => {
                let _ = write!(cell, " {p:.1}/{warn}");
            }
            (Some(_), None) => cell.push_str(" dark"),
            (None, None) => {}
        }
        if self.fault {
            cell.push_str(" FAULT");
        } else if !self.tx_fault_lanes.is_empty() {
            cell.push_str(" TXFAULT");
        } else if !self.rx_los_lanes.is_empty() {
            cell.push_str(" LOS");
        }
        cell
    }
}

/// A RoCE port's physical layer and lossless fabric, as the last windows measured them.
#[derive(Debug, Serialize, PartialEq)]
pub struct PhyReport {
    /// The active FEC (`RS`, `BASER`, `LLRS`, `off`); `None`: not given.
    pub fec_mode: Option<String>,
    /// Pre-FEC bit error rate over the last full window (`None`: no window yet).
    pub pre_fec_ber: Option<f64>,
    /// Share of the last window the fabric held the port paused.
    pub pause_share: Option<f64>,
}

impl PhyReport {
    /// For the table: `FEC RS, pre-FEC BER 1.2e-9, paused 3%`.
    pub fn line(&self) -> String {
        let ber = self.pre_fec_ber.map_or("-".to_string(), |b| format!("{b:.1e}"));
        let mut line = format!("FEC {}, pre-FEC BER {ber}", self.fec_mode.as_deref().unwrap_or("?"));
        if let Some(share) = self.pause_share {
            let _ = write!(line, ", paused {:.0}%", share * 100.0);
        }
        line
    }
}

/// The display name of a configured counter path: its file name; an ethtool counter keeps
/// its `ethtool/` prefix (a driver statistic may share a sysfs counter's name).
pub fn counter_display_name(path: &str) -> &str {
    if path.starts_with(crate::decide::counters::rule::ETHTOOL_PREFIX) {
        return path;
    }
    path.rsplit('/').next().unwrap_or(path)
}

impl Report {
    pub fn new(
        node_name: &str,
        boot_id: Option<String>,
        snapshot: &Snapshot,
        topo: &Topology,
        roles: &BTreeMap<String, Classification>,
        events: Vec<HealthEvent>,
    ) -> Report {
        let devices = snapshot
            .devices
            .iter()
            .map(|d| {
                let c = roles.get(&d.name);
                DeviceReport {
                    name: d.name.clone(),
                    monitored: c.map(|c| c.monitored).unwrap_or(false),
                    reason: c.and_then(|c| c.reason.as_deref().map(String::from)),
                    pci_address: d.pci_address.clone(),
                    card: d.card.clone(),
                    numa_node: d.numa_node,
                    hca_type: d.hca_type.clone(),
                    fw_ver: d.fw_ver.clone(),
                    board_id: d.board_id.clone(),
                    is_vf: d.is_vf(),
                    netdev: d.netdev.clone(),
                    role: c.and_then(|c| c.role),
                    role_reason: c.and_then(|c| c.role_reason.clone()),
                    rdma_driver: d
                        .rdma_driver
                        .filter(|r| !matches!(r, RdmaDriver::Mlx5 | RdmaDriver::Efa))
                        .map(RdmaDriver::name),
                    software: d.is_software(),
                    ports: d
                        .ports
                        .iter()
                        .map(|p| PortReport {
                            port: p.number,
                            link_layer: p.link_layer.as_ref().map(|l| l.name().to_string()),
                            state: p.state.as_ref().map(|s| s.name().to_string()),
                            phys_state: p.phys_state.as_ref().map(|s| s.name().to_string()),
                            rate_gbps: p.rate.as_ref().map(|r| r.gbps),
                            healthy: p.is_healthy(),
                            operstate: p.operstate.as_ref().map(|o| o.name().to_string()),
                            carrier: p.carrier,
                            lid: p.lid,
                            sm_lid: p.sm_lid,
                            counters: p
                                .counters
                                .iter()
                                .map(|(k, v)| (counter_display_name(k).to_string(), *v))
                                .collect(),
                            unknown: p.unknown.clone(),
                            flapping: false,
                            flap_transitions: 0,
                            flapping_since: None,
                            phy: p.ethtool.as_ref().map(|e| PhyReport {
                                fec_mode: e.fec.as_ref().and_then(|f| f.active).map(|m| m.name()),
                                pre_fec_ber: None,
                                pause_share: None,
                            }),
                            history: Vec::new(),
                            module: p
                                .module
                                .as_deref()
                                .and_then(crate::model::module::decode)
                                .map(|m| ModuleReport::of(&m)),
                        })
                        .collect(),
                    unknown: d.unknown.clone(),
                    pcie: d.pcie.as_ref().map(PcieReport::of),
                    sensors: d.pci_address.as_ref().and_then(|a| snapshot.thermal.get(a)).cloned().unwrap_or_default(),
                    devlink: d
                        .pci_address
                        .as_ref()
                        .and_then(|a| snapshot.devlink.get(a))
                        .map(|r| r.reporters.clone())
                        .unwrap_or_default(),
                }
            })
            .collect();
        Report {
            node_name: node_name.to_string(),
            boot_id,
            devices,
            topology_source: topo.source.as_str(),
            topology_notes: topo.notes.clone(),
            char_devices: Vec::new(),
            held_ports: Vec::new(),
            blips: Vec::new(),
            events,
        }
    }

    /// Fill in each RoCE port's last measured pre-FEC BER and pause share from the counter
    /// checks' state after the poll.
    pub fn with_phy(mut self, counters: &crate::decide::counters::CounterState) -> Report {
        use crate::decide::counters::rule::{PAUSE_VICTIM_RULE, PRE_FEC_BER_RULE};
        for d in &mut self.devices {
            for p in &mut d.ports {
                if let Some(phy) = &mut p.phy {
                    phy.pre_fec_ber = counters.measured(&d.name, p.port, PRE_FEC_BER_RULE);
                    phy.pause_share = counters.measured(&d.name, p.port, PAUSE_VICTIM_RULE);
                }
            }
        }
        self
    }

    /// Fill in each port's flap damping state from the state checks' memory after the poll.
    pub fn with_flaps(mut self, links: &LinkState) -> Report {
        for d in &mut self.devices {
            for p in &mut d.ports {
                if let Some(r) = links.port_states.get(&port_key(&d.name, p.port)) {
                    p.flapping = r.flap.is_flapping();
                    p.flap_transitions = r.flap.shown_transitions();
                    p.flapping_since = r.flap.flapping_since;
                }
            }
        }
        self
    }

    /// Fill in each port's last transitions from the history after the poll.
    pub fn with_history(mut self, history: &crate::model::history::History) -> Report {
        for d in &mut self.devices {
            for p in &mut d.ports {
                p.history = history
                    .0
                    .get(&crate::model::history::key(&d.name, p.port))
                    .map(|l| l.iter().map(|t| crate::model::history::Transition::clone(t)).collect())
                    .unwrap_or_default();
            }
        }
        self
    }

    /// One line per port: role, health, rate — then the character devices, held ports,
    /// topology and events.
    pub fn table(&self) -> String {
        let mut out = String::new();
        self.port_lines(&mut out);
        self.char_device_lines(&mut out);
        self.hold_lines(&mut out);
        self.topology_lines(&mut out);
        self.event_lines(&mut out);
        out
    }

    /// The header, then one line per port (one per device without ports).
    fn port_lines(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{:<14} {:>4}  {:<10} {:<10} {:<8} {:<26} {:>7}  {:<9} {:<9} {:<26} NOTE",
            "DEVICE", "PORT", "ROLE", "LINK", "STATE", "PHYS_STATE", "GB/S", "PCIE", "HEALTH", "MODULE"
        );
        for d in &self.devices {
            let role = d.role.map(Role::as_str).unwrap_or("-");
            let note = if d.monitored {
                d.role_reason.clone().unwrap_or_default()
            } else {
                format!("not monitored: {}", d.reason.clone().unwrap_or_default())
            };
            // The driver where it is not mlx5's or EFA's (a software device's role says it).
            let note = match d.rdma_driver.filter(|_| !d.software) {
                Some(driver) => format!("[{driver}] {note}"),
                None => note,
            };
            let pcie = d.pcie.as_ref().map(|p| p.link.as_str()).unwrap_or("-");
            if d.ports.is_empty() {
                let _ = writeln!(
                    out,
                    "{:<14} {:>4}  {:<10} {:<10} {:<8} {:<26} {:>7}  {:<9} {:<9} {:<26} {}",
                    d.name, "-", role, "-", "-", "-", "-", pcie, "-", "-", note
                );
            }
            for p in &d.ports {
                let health = if !d.monitored {
                    "-"
                } else if p.flapping {
                    "FLAPPING"
                } else if p.healthy {
                    "healthy"
                } else {
                    "UNHEALTHY"
                };
                let rate = p.rate_gbps.map(|r| format!("{r}")).unwrap_or_else(|| "?".into());
                let note = match p.flapping_since {
                    Some(since) if p.flapping => format!(
                        "flapping since {}: {} transitions, held until stable; {note}",
                        since.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
                        p.flap_transitions
                    ),
                    _ => note.clone(),
                };
                let note = match &p.phy {
                    Some(phy) => format!("{}; {note}", phy.line()),
                    None => note,
                };
                let module = p.module.as_ref().map_or("-".to_string(), ModuleReport::cell);
                let _ = writeln!(
                    out,
                    "{:<14} {:>4}  {:<10} {:<10} {:<8} {:<26} {:>7}  {:<9} {:<9} {:<26} {}",
                    d.name,
                    p.port,
                    role,
                    p.link_layer.as_deref().unwrap_or("?"),
                    p.state.as_deref().unwrap_or("?"),
                    p.phys_state.as_deref().unwrap_or("?"),
                    rate,
                    pcie,
                    health,
                    module,
                    note
                );
            }
        }
    }

    /// The character devices not present (missing, or held unreadable).
    fn char_device_lines(&self, out: &mut String) {
        for c in self.char_devices.iter().filter(|c| c.present != Some(true)) {
            let at = c.port.map(|p| format!(" port {p}")).unwrap_or_default();
            let status = match (c.present, c.reported_missing) {
                (_, true) => "MISSING (reported)".to_string(),
                (Some(false), false) => format!("missing for {} poll(s)", c.misses),
                _ => "not readable: held".to_string(),
            };
            let _ = writeln!(out, "char device {} of {}{at}: {status}", c.kind.name(), c.device);
        }
    }

    /// Ports held by the hold-down, and blips.
    fn hold_lines(&self, out: &mut String) {
        for h in &self.held_ports {
            let _ = writeln!(
                out,
                "held: {} port {} {} ({}) - reported in {:.3} s unless it recovers (portStateHoldDown)",
                h.device,
                h.port,
                h.state,
                h.check,
                h.left_ms as f64 / 1e3
            );
        }
        for b in &self.blips {
            let _ = writeln!(
                out,
                "blip: {} port {} ({}) recovered within portStateHoldDown: not reported",
                b.device, b.port, b.check
            );
        }
    }

    fn topology_lines(&self, out: &mut String) {
        let _ = writeln!(out, "topology source: {}", self.topology_source);
        for n in &self.topology_notes {
            let _ = writeln!(out, "note: {n}");
        }
    }

    fn event_lines(&self, out: &mut String) {
        if self.events.is_empty() {
            let _ = writeln!(out, "events: none");
        } else {
            let _ = writeln!(out, "events:");
            for e in &self.events {
                let what = if e.is_healthy {
                    "healthy"
                } else if e.is_fatal {
                    "FATAL"
                } else {
                    "non-fatal"
                };
                let ents = e.entities_text();
                let _ = writeln!(
                    out,
                    "  {:<9} {:<27} [{}] {} ({:?})",
                    what, e.check_name, ents, e.message, e.recommended_action
                );
            }
        }
    }
}
