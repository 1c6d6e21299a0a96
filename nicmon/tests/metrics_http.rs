//! The metrics endpoint over real HTTP: `/metrics` and `/healthz`.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicmon::act::metrics::{Liveness, Metrics, server};
use nicmon::model::event::Check;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// `GET path` → (status code, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

async fn start(metrics: Arc<Metrics>, liveness: Liveness) -> server::MetricsServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    server::serve(listener, metrics, liveness, None)
}

#[tokio::test]
async fn metrics_lists_the_dashboard_names() {
    let metrics = Arc::new(Metrics::new("gpu-node-1"));
    metrics.set_devices_discovered(Check::InfiniBandStateCheck, 8);
    metrics.observe_poll(Duration::from_millis(3), 1_790_000_000.0);
    metrics.state_check_error(Check::InfiniBandStateCheck, "mlx5_3", 1);
    metrics.counter_threshold_breach("symbol_error", "mlx5_0", 1, true);
    metrics.set_ebpf(true, false);
    let srv = start(metrics, Liveness::new(Duration::from_secs(1))).await;

    let (status, body) = get(srv.addr, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "nic_health_monitor_devices_discovered",
        "nic_health_monitor_health_events_sent_total",
        "nic_health_monitor_poll_cycle_duration_seconds_bucket",
        "nic_health_monitor_poll_cycle_last_completed_timestamp_seconds{node=\"gpu-node-1\",category=\"state\"} 1790000000.0",
        "nic_health_monitor_first_poll_deferred_total{node=\"gpu-node-1\",check=\"InfiniBandStateCheck\"} 0",
        "nic_health_monitor_state_check_errors_total",
        "nic_health_monitor_counter_threshold_breaches_total",
        "nicmon_events_sent_total",
        "nicmon_poll_duration_seconds_bucket",
        "nicmon_ebpf_embedded 1",
        "nicmon_ebpf_available 0",
        "nicmon_kmsg_records_lost_total 0",
    ] {
        assert!(body.contains(name), "missing {name}:\n{body}");
    }
    assert_eq!(get(srv.addr, "/nope").await.0, 404);
    srv.task.abort();
}

#[tokio::test]
async fn healthz_follows_the_poll_loop() {
    let metrics = Arc::new(Metrics::new("n"));
    let interval = Duration::from_secs(1);
    // The last cycle completed 10 intervals ago: stalled.
    let liveness = Liveness::since(interval, Instant::now().checked_sub(interval * 10).unwrap());
    let srv = start(metrics, liveness.clone()).await;

    let (status, body) = get(srv.addr, "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("stalled"), "{body}");

    liveness.cycle_completed();
    // The second line: whether the kernel log is watched (not yet, in this test).
    assert_eq!(get(srv.addr, "/healthz").await, (200, "ok\nkernel_log_watching 0 (not started)\n".to_string()));
    srv.task.abort();
}
