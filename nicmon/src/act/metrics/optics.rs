//! Transceivers in the metrics (SPEC §1.13): per lane of each monitored port's module its
//! receive and transmit power, Tx bias, latched Rx LOS and Tx fault, and the module's own
//! receive-power thresholds; per module its temperature, high warning and supply voltage.
//! From the poll's snapshot (the last reading of each module: reads are paced); each set
//! replaces the last poll's, so a port whose module went stops being exported.
use super::Metrics;
use super::families::{LaneLabels, ModuleLabels};
use crate::decide::poll::Poll;
use crate::model::module::dbm;

impl Metrics {
    /// Every lane and module of every monitored port whose module decodes.
    pub(super) fn observe_optics(&self, poll: &Poll) {
        let f = &self.f;
        let per_lane = [
            &f.optic_rx_power,
            &f.optic_rx_power_low_warning,
            &f.optic_rx_power_low_alarm,
            &f.optic_tx_power,
            &f.optic_tx_bias,
        ];
        let mut per_lane = per_lane.map(|f| f.round());
        let (mut rx_los, mut tx_fault) = (f.optic_rx_los.round(), f.optic_tx_fault.round());
        let mut per_module =
            [&f.optic_temperature, &f.optic_temperature_high_warning, &f.optic_supply].map(|f| f.round());
        for j in crate::decide::optics::judged(&poll.snapshot, &poll.roles) {
            let (device, port, m) = (&j.device.name, j.port.number, &j.module);
            let module = ModuleLabels { device: device.clone(), port, module: m.type_name().to_string() };
            let warning = m.temperature_thresholds.map(|t| t.high_warning);
            for (round, v) in per_module.iter_mut().zip([m.temperature_c, warning, m.vcc_v]) {
                if let Some(v) = v {
                    round.with(&module, |g| g.set(v));
                }
            }
            let rx = m.rx_power_thresholds_mw;
            for l in &m.lanes {
                let lane =
                    LaneLabels { device: device.clone(), port, lane: u32::try_from(l.number).unwrap_or(u32::MAX) };
                // In `per_lane`'s order.
                let values = [
                    dbm(l.rx_power_mw),
                    dbm(rx.map(|t| t.low_warning)),
                    dbm(rx.map(|t| t.low_alarm)),
                    dbm(l.tx_power_mw),
                    l.tx_bias_ma,
                ];
                for (round, v) in per_lane.iter_mut().zip(values) {
                    if let Some(v) = v {
                        round.with(&lane, |g| g.set(v));
                    }
                }
                rx_los.with(&lane, |g| g.set(i64::from(l.rx_los)));
                tx_fault.with(&lane, |g| g.set(i64::from(l.tx_fault)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::decide::roles::Classification;
    use crate::model::module::Pages;
    use crate::model::{Device, Port};

    /// A QSFP28 at 40 °C, lanes at 0.5 mW (lane 2 dark, Rx LOS), low warning 0.1 mW.
    fn pages() -> Pages {
        let put16 = |p: &mut [u8], at: usize, v: u16| p[at..at + 2].copy_from_slice(&v.to_be_bytes());
        let mut p0 = vec![0u8; 256];
        p0[0] = 0x11;
        p0[3] = 0b0010;
        put16(&mut p0, 22, 40 * 256);
        put16(&mut p0, 26, 33_000);
        for i in 0..4 {
            put16(&mut p0, 34 + 2 * i, if i == 1 { 0 } else { 5000 });
            put16(&mut p0, 42 + 2 * i, 3500);
        }
        let mut p3 = vec![0u8; 128];
        for (i, t) in [75u16, 0, 70, 5].into_iter().enumerate() {
            put16(&mut p3, 2 * i, t * 256);
        }
        for (i, w) in [34_000u16, 500, 22_000, 1000].into_iter().enumerate() {
            put16(&mut p3, 48 + 2 * i, w);
        }
        Pages([(0, p0), (3, p3)].into())
    }

    #[test]
    fn lanes_and_modules_are_exported() {
        let mut poll = Poll::default();
        for name in ["mlx5_0", "mlx5_9"] {
            let port = Port { number: 1, module: Some(Arc::new(pages())), ..Port::default() };
            poll.snapshot.devices.push(Arc::new(Device::pf(name, vec![port])));
        }
        let monitored = Classification { monitored: true, reason: None, role: None, role_reason: None };
        poll.roles.insert("mlx5_0".into(), monitored);
        let m = Metrics::new("n");
        m.observe_optics(&poll);
        let text = m.encode();
        for want in [
            r#"nicmon_optic_rx_power_dbm{device="mlx5_0",port="1",lane="1"} -3.010299956639812"#,
            r#"nicmon_optic_rx_power_low_warning_dbm{device="mlx5_0",port="1",lane="2"} -10.0"#,
            r#"nicmon_optic_rx_los{device="mlx5_0",port="1",lane="2"} 1"#,
            r#"nicmon_optic_rx_los{device="mlx5_0",port="1",lane="1"} 0"#,
            r#"nicmon_optic_tx_bias_milliamperes{device="mlx5_0",port="1",lane="4"} 7.0"#,
            r#"nicmon_optic_temperature_celsius{device="mlx5_0",port="1",module="QSFP28"} 40.0"#,
            r#"nicmon_optic_temperature_high_warning_celsius{device="mlx5_0",port="1",module="QSFP28"} 70.0"#,
            r#"nicmon_optic_supply_volts{device="mlx5_0",port="1",module="QSFP28"} 3.3"#,
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        assert!(
            !text.contains(r#"nicmon_optic_rx_power_dbm{device="mlx5_0",port="1",lane="2"}"#),
            "no light, no dBm: {text}"
        );
        assert!(!text.contains("mlx5_9"), "an unmonitored NIC is not exported: {text}");
    }
}
