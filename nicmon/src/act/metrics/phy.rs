//! The RoCE physical layer and lossless fabric in the metrics (SPEC §1.11): each monitored
//! RoCE port's pre-FEC BER and pause time share (the counter engine's last full window,
//! [`CounterState::measured`]), its active FEC mode and uncorrectable blocks (the poll's
//! ethtool data, [`crate::model::Port::ethtool`]) and its ECN/CNP congestion counters
//! (metrics only). Read from typed fields, never from messages; each set replaces the last
//! poll's, so a port that went or lost its data stops being exported.
use super::Metrics;
use super::families::{CounterLabels, FecModeLabels, PortLabels};
use crate::decide::counters::CounterState;
use crate::decide::counters::rule::{ETHTOOL_PREFIX, PAUSE_VICTIM_RULE, PRE_FEC_BER_RULE};
use crate::decide::poll::Poll;
use crate::model::LinkLayer;
use crate::model::ethtool;

/// One RoCE port's physical-layer series; `None`: not exported this poll.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PortPhy<'a> {
    pub(super) device: &'a str,
    pub(super) port: u32,
    pub(super) pre_fec_ber: Option<f64>,
    pub(super) pause_share: Option<f64>,
    pub(super) fec_mode: Option<String>,
    /// The BER its RS-FEC code can still correct, where the code is known.
    pub(super) fec_limit: Option<f64>,
    pub(super) uncorrectable: Option<u64>,
    /// ECN/CNP counters by name ([`ethtool::CONGESTION`]).
    pub(super) congestion: Vec<(&'static str, u64)>,
}

/// The series of every monitored RoCE port of `poll` (pure).
pub(super) fn ports<'a>(poll: &'a Poll, counters: &CounterState) -> Vec<PortPhy<'a>> {
    let mut out = Vec::new();
    for d in poll.snapshot.devices.iter().filter(|d| !d.is_vf()) {
        if !poll.roles.get(&d.name).is_some_and(|c| c.monitored) {
            continue;
        }
        for p in d.ports.iter().filter(|p| p.link_layer == Some(LinkLayer::Ethernet)) {
            let snap = p.ethtool.as_ref();
            // The sysfs `hw_counters/` file (mlx5), else the driver's ethtool statistic.
            let counter = |name: &str| {
                let sysfs = p.counters.get(ethtool::congestion_path(name).as_str());
                sysfs.or_else(|| p.counters.get(format!("{ETHTOOL_PREFIX}{name}").as_str())).copied()
            };
            out.push(PortPhy {
                device: &d.name,
                port: p.number,
                pre_fec_ber: counters.measured(&d.name, p.number, PRE_FEC_BER_RULE),
                pause_share: counters.measured(&d.name, p.number, PAUSE_VICTIM_RULE),
                fec_mode: snap.and_then(|s| s.fec.as_ref()).and_then(|f| f.active).map(|m| m.name()),
                fec_limit: fec_limit(p),
                uncorrectable: snap.and_then(ethtool::uncorrectable),
                congestion: ethtool::CONGESTION.iter().filter_map(|&n| Some((n, counter(n)?))).collect(),
            });
        }
    }
    out
}

/// The correction limit of the RS-FEC code `p` runs, told as the pre-FEC BER rule tells it
/// (the lanes its RDMA `rate` names, else its FEC statistics' lanes).
fn fec_limit(p: &crate::model::Port) -> Option<f64> {
    use crate::decide::phy;
    let fec = p.ethtool.as_ref()?.fec.as_ref()?;
    let named = phy::rate_lanes(p.rate.as_ref().and_then(|r| r.width.as_deref()));
    let lanes = named.or((!fec.lanes.is_empty()).then_some(fec.lanes.len()));
    phy::rs_code(fec.active, p.rate_bps()?, lanes).map(phy::RsCode::correction_limit)
}

impl Metrics {
    /// The RoCE ports' physical-layer series after `poll` (`next`: the checks' state it
    /// produced), replacing the last poll's.
    pub(super) fn observe_phy(&self, poll: &Poll, next: &crate::decide::state::CheckState) {
        self.set_port_phy(&ports(poll, &next.counters));
    }

    fn set_port_phy(&self, ports: &[PortPhy<'_>]) {
        let f = &self.f;
        let (mut ber, mut pause) = (f.port_pre_fec_ber.round(), f.port_pause_share.round());
        let (mut mode, mut limit) = (f.port_fec_mode.round(), f.port_fec_limit.round());
        let (mut uncorrectable, mut congestion) = (f.port_fec_uncorrectable.round(), f.port_congestion.round());
        for p in ports {
            let labels = PortLabels { device: p.device.into(), port: p.port };
            if let Some(v) = p.pre_fec_ber {
                ber.with(&labels, |g| g.set(v));
            }
            if let Some(share) = p.pause_share {
                pause.with(&labels, |g| g.set(share));
            }
            if let Some(v) = p.fec_limit {
                limit.with(&labels, |g| g.set(v));
            }
            if let Some(n) = p.uncorrectable {
                uncorrectable.with(&labels, |g| g.set(n as f64));
            }
            if let Some(m) = &p.fec_mode {
                let labels = FecModeLabels { device: p.device.into(), port: p.port, mode: m.clone() };
                mode.with(&labels, |g| g.set(1));
            }
            for (name, v) in &p.congestion {
                let labels = CounterLabels { device: p.device.into(), port: p.port, counter: (*name).into() };
                congestion.with(&labels, |g| g.set(*v as f64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nicmon_tests::platforms::Platform;
    use time::{Duration, OffsetDateTime};

    use crate::monitor::Monitor;

    use crate::act::metrics::Metrics;
    use crate::act::state::Loaded;
    use crate::decide::state::CheckState;
    use crate::model::ethtool::EthtoolSnapshot;
    use crate::model::ethtool::FecMode;
    use crate::model::ethtool::FecSnapshot;
    use crate::monitor::fixture_options;
    use crate::read::ethtool::replay;

    /// A netdev's replayed ethtool data: KP4 FEC, `bits` corrected, `uncorrectable` blocks,
    /// `paused_us` of PFC pause on the RoCE priority.
    fn write(dir: &std::path::Path, netdev: &str, bits: u64, uncorrectable: u64, paused_us: u64) {
        let snap = EthtoolSnapshot {
            fec: Some(FecSnapshot {
                active: Some(FecMode::Rs),
                corrected_bits: Some(bits),
                uncorrectable_blocks: Some(uncorrectable),
                ..FecSnapshot::default()
            }),
            pause: None,
            stats: Some(BTreeMap::from([("rx_prio3_pause_duration".to_string(), paused_us)])),
            module: None,
        };
        std::fs::write(dir.join(format!("{netdev}.json")), replay::to_json(&snap)).unwrap();
    }

    /// The value of the one series starting with `series` (name and labels), if exported.
    fn value(text: &str, series: &str) -> Option<f64> {
        let mut hits = text.lines().filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '));
        let v = hits.next().map(|v| v.parse().unwrap());
        assert!(hits.next().is_none(), "{series} exported twice");
        v
    }

    /// Two replayed polls a minute apart on a node of 200G RoCE ports: each port's pre-FEC
    /// BER, pause time share, FEC mode, uncorrectable blocks and ECN/CNP counters appear
    /// with the values the ethtool data and sysfs gave; a port whose data went stops
    /// being exported.
    #[test]
    fn a_replayed_roce_port_exports_its_physical_layer() {
        let node = Platform::L40sOci.build();
        let dir = node.root().join("ethtool");
        std::fs::create_dir_all(&dir).unwrap();
        let opts = crate::monitor::MonitorOptions { ethtool_replay: Some(dir.clone()), ..fixture_options(&node) };
        let mut monitor = Monitor::open(&opts).unwrap();
        // The polls below are a minute apart on the clock they are given, not in real time:
        // read the ethtool data at every one (no pace).
        monitor.observer.ethtool_ports = crate::read::ethtool::ports::PortReader::new(std::time::Duration::ZERO);
        let t0 = OffsetDateTime::now_utc();
        let probe = monitor.poll(&CheckState::default(), &Loaded::Missing { reboot: false }, t0, &[]);
        let mut roce: Vec<(String, String)> = probe
            .snapshot
            .devices
            .iter()
            .filter(|d| !d.is_vf() && d.ports.iter().any(|p| p.link_layer == Some(crate::model::LinkLayer::Ethernet)))
            .filter_map(|d| Some((d.name.clone(), d.netdev.clone()?)))
            .collect();
        roce.sort();
        assert!(roce.len() >= 2, "{roce:?}");
        let ((dev, netdev), (gone, gone_netdev)) = (&roce[0], &roce[1]);
        for (_, n) in &roce {
            write(&dir, n, 1_000, 3, 0);
        }
        node.set_counter(dev, 1, "hw_counters/np_cnp_sent", 40);
        node.set_counter(dev, 1, "hw_counters/np_ecn_marked_roce_packets", 90);
        let first = monitor.poll(&probe.next, &Loaded::Resumed, t0 + Duration::seconds(1), &[]);

        // A minute on: BER 1e-9 at 200 Gb/s, a quarter of it paused, two more uncorrectable.
        let bits = (200e9 * 60.0 * 1e-9) as u64;
        write(&dir, netdev, 1_000 + bits, 5, 15_000_000);
        std::fs::remove_file(dir.join(format!("{gone_netdev}.json"))).unwrap();
        let second = monitor.poll(&first.next, &Loaded::Resumed, t0 + Duration::seconds(61), &[]);
        let metrics = Metrics::new("n");
        metrics.observe(&second, &second.next);
        let text = metrics.encode();

        let port = format!(r#"{{device="{dev}",port="1"}}"#);
        let ber = value(&text, &format!("nicmon_port_pre_fec_ber{port}")).expect("BER exported");
        assert!((ber / 1e-9 - 1.0).abs() < 1e-6, "{ber:e}");
        let share = value(&text, &format!("nicmon_port_pause_time_share{port}")).expect("pause share exported");
        assert!((share - 0.25).abs() < 1e-9, "{share}");
        assert_eq!(value(&text, &format!("nicmon_port_fec_uncorrectable_blocks{port}")), Some(5.0));
        let limit = value(&text, &format!("nicmon_port_fec_correction_limit{port}")).expect("FEC limit exported");
        assert!((2.3e-4..2.6e-4).contains(&limit), "200G RS-FEC is KP4: {limit:e}");
        let mode = format!(r#"nicmon_port_fec_mode{{device="{dev}",port="1",mode="RS"}}"#);
        assert_eq!(value(&text, &mode), Some(1.0), "{text}");
        let cnp =
            |c: &str| value(&text, &format!(r#"nicmon_port_congestion{{device="{dev}",port="1",counter="{c}"}}"#));
        assert_eq!((cnp("np_cnp_sent"), cnp("np_ecn_marked_roce_packets")), (Some(40.0), Some(90.0)));
        // Congestion is never an event (the uncorrectable blocks are); the port whose
        // ethtool data went has no FEC series.
        let codes: Vec<&str> = second.events.iter().flat_map(|e| e.error_code.iter().map(String::as_str)).collect();
        assert_eq!(codes, ["fec_uncorrectable"], "{:?}", second.events);
        let gone_port = format!(r#"{{device="{gone}",port="1""#);
        for family in ["nicmon_port_fec_mode", "nicmon_port_fec_uncorrectable_blocks"] {
            assert!(!text.contains(&format!("{family}{gone_port}")), "{family} of {gone}: {text}");
        }
    }
}
