//! NIC temperature and firmware health (SPEC §1.13, `NICThermalCheck`, `NICFirmwareCheck`):
//! each test drives a testbed node — mlx5 PFs with an `asic` and a module (`sensor64`)
//! hwmon sensor and devlink replay files (`fw`, `fw_fatal`; RoCE PFs also `tx`, `rx`) —
//! through `nicmon check --state-file … --now … --devlink-replay DIR` cycles (each one
//! daemon poll) or a running `nicmon run` with the file sink, and asserts the events. The
//! kernel log is fed from a private file (`--kmsg`, `--kmsg-path`), never the real one.
use std::process::Stdio;
use std::time::{Duration, Instant};

use nicmon_tests::platforms::Platform;
use nicmon_tests::{Node, Timeline, brief, nicmon_bin};

type Brief = (String, bool, bool, String, String);

fn of(events: &[serde_json::Value], check: &str) -> Vec<Brief> {
    events
        .iter()
        .filter(|e| e["checkName"] == check && !e["entitiesImpacted"].as_array().unwrap().is_empty())
        .map(brief)
        .collect()
}

fn ev(check: &str, healthy: bool, fatal: bool, dev: &str, code: &str) -> Brief {
    (check.into(), healthy, fatal, format!("NIC={dev}"), code.into())
}

/// A timeline with the node's devlink replay directory, past its first (baseline) poll.
fn started(node: &Node) -> Timeline<'_> {
    let mut tl = Timeline::new(node);
    tl.extra = vec!["--devlink-replay".into(), node.devlink_dir().to_string_lossy().into_owned()];
    let first = tl.poll(0);
    assert!(of(&first, "NICThermalCheck").is_empty() && of(&first, "NICFirmwareCheck").is_empty(), "{first:#?}");
    tl
}

/// One poll at `t` with `line` as the kernel log record that arrived since the last one.
fn poll_with_kmsg(tl: &mut Timeline, t: i64, line: &str) -> Vec<serde_json::Value> {
    let file = tl.node.root().join(format!("kmsg-{t}.txt"));
    std::fs::write(&file, format!("{line}\n")).unwrap();
    let keep = tl.extra.clone();
    tl.extra.extend(["--kmsg".into(), file.to_string_lossy().into_owned()]);
    let ev = tl.poll(t);
    tl.extra = keep;
    ev
}

#[test]
fn a_hot_asic_is_one_non_fatal_nic_overheating_cleared_two_degrees_below_the_line() {
    let node = Platform::DgxH100.build();
    let tl = started(&node);
    // The report carries every sensor of the monitored PFs.
    let report = tl.report(1);
    assert!(of(report["events"].as_array().unwrap(), "NICThermalCheck").is_empty());
    let d = report["devices"].as_array().unwrap().iter().find(|d| d["name"] == "mlx5_3").unwrap();
    assert_eq!(d["sensors"][0]["label"], "asic", "{d:#}");
    assert_eq!(d["sensors"][0]["input"], 55_000);
    assert_eq!(d["sensors"][0]["crit"], 105_000);
    assert_eq!(d["sensors"][1]["label"], "sensor64");
    assert_eq!(d["devlink"][1]["name"], "fw_fatal", "{d:#}");
    assert_eq!(d["devlink"][1]["error_count"], 0);
    // crit 105 °C, margin 5 °C: 100 °C is overheating.
    node.set_temperature("mlx5_3", 1, 100_000);
    let events = tl.poll(2);
    assert_eq!(of(&events, "NICThermalCheck"), [ev("NICThermalCheck", false, false, "mlx5_3", "nic_overheating")]);
    let e = events.iter().find(|e| e["checkName"] == "NICThermalCheck").unwrap();
    assert_eq!(e["recommendedAction"], "NONE");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("asic (temp1) 100.0 °C, critical 105.0 °C"), "{msg}");
    // Still hot, then just under the line: nothing new (hysteresis 2 °C).
    node.set_temperature("mlx5_3", 1, 99_000);
    assert!(of(&tl.poll(3), "NICThermalCheck").is_empty());
    node.set_temperature("mlx5_3", 1, 97_500);
    assert_eq!(of(&tl.poll(4), "NICThermalCheck"), [ev("NICThermalCheck", true, false, "mlx5_3", "nic_overheating")]);
    // The module sensor counts too (crit 75 °C).
    node.set_temperature("mlx5_8", 2, 71_000);
    let events = tl.poll(5);
    assert_eq!(of(&events, "NICThermalCheck"), [ev("NICThermalCheck", false, false, "mlx5_8", "nic_overheating")]);
    assert!(events.iter().any(|e| e["message"].as_str().unwrap().contains("sensor64 (temp2) 71.0 °C")));
}

#[test]
fn a_thermal_margin_from_the_config_file() {
    let node = Platform::DgxH100.build();
    let config = node.root().join("nicmon.toml");
    std::fs::write(&config, "[thermalCheck]\nmarginCelsius = 10\n").unwrap();
    let mut tl = Timeline::new(&node);
    tl.extra = vec!["--config".into(), config.to_string_lossy().into_owned()];
    assert!(of(&tl.poll(0), "NICThermalCheck").is_empty());
    node.set_temperature("mlx5_0", 1, 96_000);
    assert_eq!(of(&tl.poll(1), "NICThermalCheck"), [ev("NICThermalCheck", false, false, "mlx5_0", "nic_overheating")]);
}

#[test]
fn fw_fatal_is_one_fatal_event_per_card_devlink_first_then_the_kernel_log() {
    let node = Platform::DgxH100.build();
    let mut tl = started(&node);
    // mlx5_8 and mlx5_9 are the two PFs of one card.
    node.bump_reporter("mlx5_8", "fw_fatal", 1);
    let events = tl.poll(10);
    assert_eq!(of(&events, "NICFirmwareCheck"), [ev("NICFirmwareCheck", false, true, "mlx5_8", "fw_fatal")]);
    let e = events.iter().find(|e| e["checkName"] == "NICFirmwareCheck").unwrap();
    assert_eq!(e["recommendedAction"], "REPLACE_VM");
    // The card's other PF reports it too, and the kernel log prints it: no second fatal.
    node.bump_reporter("mlx5_9", "fw_fatal", 1);
    let bdf = node.info["mlx5_9"].bdf.clone();
    let line = format!("mlx5_core {bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count");
    let events = poll_with_kmsg(&mut tl, 20, &line);
    assert!(of(&events, "NICFirmwareCheck").is_empty(), "{events:#?}");
    assert!(of(&events, "NICKernelLogCheck").is_empty(), "{events:#?}");
    // Another card's fatal is its own.
    node.bump_reporter("mlx5_2", "fw_fatal", 1);
    assert_eq!(of(&tl.poll(30), "NICFirmwareCheck"), [ev("NICFirmwareCheck", false, true, "mlx5_2", "fw_fatal")]);
}

#[test]
fn fw_fatal_is_one_fatal_event_per_card_kernel_log_first_then_devlink() {
    let node = Platform::DgxH100.build();
    let mut tl = started(&node);
    let bdf = node.info["mlx5_8"].bdf.clone();
    let line = format!("mlx5_core {bdf}: poll_health:795:(pid 0): Fatal error 1 detected");
    let events = poll_with_kmsg(&mut tl, 10, &line);
    assert_eq!(of(&events, "NICKernelLogCheck"), [ev("NICKernelLogCheck", false, true, "mlx5_8", "fw_fatal_error")]);
    // devlink's reporter catches up a poll later: nothing more within the window.
    node.bump_reporter("mlx5_8", "fw_fatal", 1);
    assert!(of(&tl.poll(11), "NICFirmwareCheck").is_empty());
    // After the window, a new firmware fatal is sent again.
    node.bump_reporter("mlx5_8", "fw_fatal", 1);
    assert_eq!(of(&tl.poll(100), "NICFirmwareCheck"), [ev("NICFirmwareCheck", false, true, "mlx5_8", "fw_fatal")]);
}

#[test]
fn fw_tx_and_rx_errors_are_non_fatal_and_clear_after_five_healthy_minutes() {
    let node = Platform::DgxH100.build();
    let tl = started(&node);
    node.bump_reporter("mlx5_3", "fw", 2);
    node.bump_reporter("mlx5_10", "tx", 1);
    node.bump_reporter("mlx5_11", "rx", 1);
    let events = tl.poll(10);
    assert_eq!(
        of(&events, "NICFirmwareCheck"),
        [
            ev("NICFirmwareCheck", false, false, "mlx5_10", "tx_timeout"),
            ev("NICFirmwareCheck", false, false, "mlx5_11", "rx_error"),
            ev("NICFirmwareCheck", false, false, "mlx5_3", "fw_error"),
        ]
    );
    let fw = events.iter().find(|e| e["errorCode"][0] == "fw_error").unwrap();
    assert!(fw["message"].as_str().unwrap().contains("fw: error count 0 → 2"), "{fw:#}");
    node.recover_reporter("mlx5_3", "fw");
    node.recover_reporter("mlx5_10", "tx");
    assert!(of(&tl.poll(200), "NICFirmwareCheck").is_empty(), "not yet five minutes");
    // mlx5_11's rx is still in error: it stays raised.
    assert_eq!(
        of(&tl.poll(311), "NICFirmwareCheck"),
        [
            ev("NICFirmwareCheck", true, false, "mlx5_10", "tx_timeout"),
            ev("NICFirmwareCheck", true, false, "mlx5_3", "fw_error")
        ]
    );
}

#[test]
fn without_devlink_replay_files_firmware_health_is_not_supported_and_quiet() {
    let node = Platform::DgxH100.build();
    let mut tl = Timeline::new(&node);
    let empty = node.root().join("no-devlink");
    std::fs::create_dir_all(&empty).unwrap();
    tl.extra = vec!["--devlink-replay".into(), empty.to_string_lossy().into_owned()];
    assert!(of(&tl.poll(0), "NICFirmwareCheck").is_empty());
    // A file that is not the format: refused (a note, unit-tested with the reader), the
    // check goes on and the other functions are judged.
    let bdf = node.info["mlx5_0"].bdf.clone();
    std::fs::write(empty.join(format!("{bdf}.json")), "{\"reporters\": 7}").unwrap();
    assert!(of(&tl.poll(1), "NICFirmwareCheck").is_empty());
}

/// `nicmon run` with the file sink, a private kernel log file and the devlink replay: a hot
/// sensor gives `nic_overheating`, a firmware fatal both devlink and the kernel log see gives
/// one fatal event, and cooling down clears the temperature.
#[test]
fn run_reports_overheating_and_one_firmware_fatal_per_card() {
    let node = Platform::DgxH100.build();
    let sink = node.root().join("events.jsonl");
    let kmsg = node.root().join("kmsg.txt");
    std::fs::write(&kmsg, "").unwrap();
    let config = node.root().join("nicmon.toml");
    std::fs::write(&config, "[thermalCheck]\nreadInterval = \"100ms\"\n").unwrap();
    let mut child = node
        .daemon_command(&nicmon_bin(), "run", Some(&config), "state.json", "gpu-node-7")
        .args(["--no-wake", "--no-metrics", "--state-polling-interval", "100ms"])
        .args(["--kmsg-path", kmsg.to_str().unwrap()])
        .args(["--devlink-replay", node.devlink_dir().to_str().unwrap()])
        .arg("--sink")
        .arg(format!("file:{}", sink.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn nicmon run");
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&sink)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let wait = |what: &str, ok: &dyn Fn(&[serde_json::Value]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok(&lines()) {
            assert!(Instant::now() < deadline, "{what}: {:#?}", lines());
            std::thread::sleep(Duration::from_millis(20)); // polling a file another process writes
        }
    };
    wait("baselines", &|ev| ev.iter().filter(|e| e["isHealthy"] == true).count() >= 12);

    node.set_temperature("mlx5_5", 1, 104_000);
    wait("overheating", &|ev| of(ev, "NICThermalCheck").iter().any(|b| b.4 == "nic_overheating" && !b.1));

    let bdf = node.info["mlx5_8"].bdf.clone();
    node.bump_reporter("mlx5_8", "fw_fatal", 1);
    let line = format!("mlx5_core {bdf}: poll_health:801:(pid 0): device's health compromised - reached miss count\n");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&kmsg)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()))
        .unwrap();
    let fatals =
        |ev: &[serde_json::Value]| -> Vec<Brief> { ev.iter().filter(|e| e["isFatal"] == true).map(brief).collect() };
    wait("the firmware fatal", &|ev| !fatals(ev).is_empty());
    node.set_temperature("mlx5_5", 1, 60_000);
    wait("cooled", &|ev| of(ev, "NICThermalCheck").iter().any(|b| b.1));
    // Both sources had their poll meanwhile: still exactly one fatal for the card.
    let fatal = fatals(&lines());
    assert_eq!(fatal.len(), 1, "{fatal:#?}");
    assert!(fatal[0].3 == "NIC=mlx5_8", "{fatal:#?}");
    assert!(fatal[0].0 == "NICFirmwareCheck" || fatal[0].0 == "NICKernelLogCheck", "{fatal:#?}");
    // SAFETY: the pid of the child this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}
