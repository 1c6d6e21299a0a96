//! NIC temperature and firmware health in the metrics (SPEC §1.13): every hwmon sensor of a
//! monitored NIC (input, crit, highest, in °C) and every devlink health reporter (error
//! count, healthy). Read from the poll's snapshot, the same NICs the checks judge; each set
//! replaces the last poll's, so a NIC that went stops being exported.
use super::Metrics;
use super::families::{ReporterLabels, SensorLabels};
use crate::decide::poll::Poll;
use crate::model::devlink::ReporterState;
use crate::model::thermal::celsius;

impl Metrics {
    /// Every sensor of every monitored NIC.
    pub(super) fn observe_thermal(&self, poll: &Poll) {
        let f = &self.f;
        let mut rounds = [&f.nic_temperature, &f.nic_temperature_crit, &f.nic_temperature_highest].map(|f| f.round());
        for (d, sensors) in crate::decide::thermal::judged(&poll.snapshot, &poll.roles) {
            for s in sensors {
                let labels = SensorLabels {
                    device: d.name.clone(),
                    sensor: format!("{}/{}", s.hwmon, s.name()),
                    label: s.label.clone().unwrap_or_default(),
                };
                for (round, v) in rounds.iter_mut().zip([s.input, s.crit, s.highest]) {
                    if let Some(v) = v {
                        round.with(&labels, |g| g.set(celsius(v)));
                    }
                }
            }
        }
    }

    /// Every devlink health reporter of every monitored NIC.
    pub(super) fn observe_devlink(&self, poll: &Poll) {
        let (mut errors, mut healthy) = (self.f.devlink_errors.round(), self.f.devlink_healthy.round());
        for (d, reporters) in crate::decide::firmware::judged(&poll.snapshot, &poll.roles) {
            for r in &reporters.reporters {
                let labels = ReporterLabels { device: d.name.clone(), reporter: r.name.clone() };
                errors.with(&labels, |g| g.set(i64::try_from(r.error_count).unwrap_or(i64::MAX)));
                healthy.with(&labels, |g| g.set(i64::from(r.state == ReporterState::Healthy)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::decide::roles::Classification;
    use crate::model::devlink::{Reporter, Reporters};
    use crate::model::thermal::Sensor;

    #[test]
    fn sensors_and_reporters_are_exported() {
        let mut poll = Poll::default();
        for (name, pci) in [("mlx5_0", "0000:3b:00.0"), ("mlx5_9", "0000:99:00.0")] {
            poll.snapshot.devices.push(Arc::new(crate::model::Device {
                pci_address: Some(pci.into()),
                ..crate::model::Device::pf(name, Vec::new())
            }));
            let sensor = Sensor {
                hwmon: "hwmon2".into(),
                channel: 1,
                label: Some("asic".into()),
                input: Some(61_500),
                crit: Some(105_000),
                highest: None,
            };
            std::sync::Arc::make_mut(&mut poll.snapshot.thermal).insert(pci.into(), vec![sensor]);
            let r = Reporter { name: "fw_fatal".into(), state: ReporterState::Error, error_count: 2, recover_count: 1 };
            poll.snapshot.devlink.insert(pci.into(), Reporters { reporters: vec![r] });
        }
        let monitored = Classification { monitored: true, reason: None, role: None, role_reason: None };
        poll.roles.insert("mlx5_0".into(), monitored);
        let m = Metrics::new("n");
        m.observe_thermal(&poll);
        m.observe_devlink(&poll);
        let text = m.encode();
        for want in [
            r#"nicmon_nic_temperature_celsius{device="mlx5_0",sensor="hwmon2/temp1",label="asic"} 61.5"#,
            r#"nicmon_nic_temperature_crit_celsius{device="mlx5_0",sensor="hwmon2/temp1",label="asic"} 105.0"#,
            r#"nicmon_devlink_health_errors{device="mlx5_0",reporter="fw_fatal"} 2"#,
            r#"nicmon_devlink_health_healthy{device="mlx5_0",reporter="fw_fatal"} 0"#,
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        assert!(!text.contains("nicmon_nic_temperature_highest_celsius{"), "{text}");
        assert!(!text.contains("mlx5_9"), "an unmonitored NIC is not exported: {text}");
    }

    #[test]
    fn the_temperatures_follow_each_new_reading_and_role() {
        let sensor = |input: i64| Sensor {
            hwmon: "hwmon2".into(),
            channel: 1,
            label: Some("asic".into()),
            input: Some(input),
            crit: None,
            highest: None,
        };
        let reading = |input: i64| Arc::new([("0000:3b:00.0".to_string(), vec![sensor(input)])].into());
        let device = Arc::new(crate::model::Device {
            pci_address: Some("0000:3b:00.0".into()),
            ..crate::model::Device::pf("mlx5_0", Vec::new())
        });
        let poll = |thermal: &Arc<crate::model::Thermal>, monitored: bool| Poll {
            snapshot: crate::model::Snapshot {
                devices: vec![device.clone()],
                thermal: thermal.clone(),
                ..Default::default()
            },
            roles: [("mlx5_0".to_string(), Classification { monitored, reason: None, role: None, role_reason: None })]
                .into(),
            ..Default::default()
        };
        let celsius = |v: &str| {
            format!(r#"nicmon_nic_temperature_celsius{{device="mlx5_0",sensor="hwmon2/temp1",label="asic"}} {v}"#)
        };
        let m = Metrics::new("n");
        let first = reading(61_000);
        let p = poll(&first, true);
        m.observe(&p, &p.next);
        assert!(m.encode().contains(&celsius("61.0")), "{}", m.encode());
        assert!(!m.thermal_seen(&poll(&first, true)), "the same reading: seen, nothing set anew");
        // A new reading (the sensors read again): set from it.
        let p = poll(&reading(64_500), true);
        m.observe(&p, &p.next);
        assert!(m.encode().contains(&celsius("64.5")), "{}", m.encode());
        // The same reading, the device no longer monitored: its series go.
        let same = p.snapshot.thermal.clone();
        let p = poll(&same, false);
        m.observe(&p, &p.next);
        assert!(!m.encode().contains("nicmon_nic_temperature_celsius{"), "{}", m.encode());
    }
}
