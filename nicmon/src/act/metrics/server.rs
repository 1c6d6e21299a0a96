//! The HTTP endpoint: `/metrics` (Prometheus) and `/healthz` (the poll loop's liveness).
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::Metrics;

/// How many poll intervals may pass without a completed cycle before `/healthz` fails.
pub const STALL_INTERVALS: u32 = 3;

/// When the poll loop last completed a cycle. The loop calls
/// [`Liveness::cycle_completed`]; `/healthz` asks [`Liveness::is_alive`].
#[derive(Clone, Debug)]
pub struct Liveness {
    interval: Duration,
    last: Arc<Mutex<Instant>>,
}

impl Liveness {
    /// Counts as alive for `STALL_INTERVALS` intervals from now (the first poll's grace).
    pub fn new(interval: Duration) -> Liveness {
        Liveness::since(interval, Instant::now())
    }

    /// As if the last cycle completed at `last` (tests pass an instant in the past).
    pub fn since(interval: Duration, last: Instant) -> Liveness {
        Liveness { interval, last: Arc::new(Mutex::new(last)) }
    }

    pub fn cycle_completed(&self) {
        self.cycle_completed_at(Instant::now());
    }

    pub fn cycle_completed_at(&self, at: Instant) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }

    /// Time since the last completed cycle, as seen at `now`.
    pub fn age_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(*self.last.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn is_alive_at(&self, now: Instant) -> bool {
        // Checked: the interval comes from a flag (a huge one means "never stalled").
        self.interval.checked_mul(STALL_INTERVALS).is_none_or(|window| self.age_at(now) <= window)
    }

    pub fn is_alive(&self) -> bool {
        self.is_alive_at(Instant::now())
    }
}

/// A running metrics endpoint.
pub struct MetricsServer {
    pub addr: SocketAddr,
    pub task: JoinHandle<()>,
}

/// How often a metrics address that could not be bound is tried again.
pub const REBIND_EVERY: Duration = Duration::from_secs(30);

/// Listen on `addr` (`--metrics-bind-address`, `--metrics-port`) and serve in a background
/// task. An address that cannot be bound (the port taken by another process) does not stop
/// the monitor (as upstream): it is logged, the monitor runs without metrics, and
/// the address is tried again every `every` in the background; once bound, `/healthz` says
/// the endpoint came late and why.
pub async fn start_or_retry(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    every: Duration,
) -> JoinHandle<()> {
    let first = match TcpListener::bind(addr).await {
        Ok(listener) => return serve(listener, metrics, liveness, None).task,
        Err(e) => e,
    };
    tracing::warn!(
        %addr,
        "metrics endpoint: cannot listen: {first}: running without /metrics and /healthz, trying again every {every:?}"
    );
    let note: Arc<str> = format!("metrics endpoint listening late: the first bind of {addr} failed: {first}").into();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Ok(listener) = TcpListener::bind(addr).await {
                tracing::info!(%addr, "metrics endpoint listening");
                let _ = serve(listener, metrics, liveness, Some(note)).task.await;
                return;
            }
        }
    })
}

/// The endpoint on a thread of its own, with its own single-threaded runtime
/// ([`ServerThread::start`]): the daemon's loop runs each poll on its thread from start to
/// end, and a scrape or a liveness probe never waits for one. Dropping it stops the
/// endpoint.
pub struct ServerThread {
    /// Dropped with the daemon: the endpoint's thread then ends.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl ServerThread {
    /// [`start_or_retry`] on a new thread; returns once the first bind was tried (as
    /// [`start_or_retry`] does).
    pub async fn start(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        liveness: Liveness,
        every: Duration,
    ) -> std::io::Result<ServerThread> {
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("nicmon-metrics".into()).spawn(move || {
            rt.block_on(async move {
                let task = start_or_retry(addr, metrics, liveness, every).await;
                let _ = ready_tx.send(());
                // Until the daemon drops its end of `stop` (or the endpoint's task ends).
                tokio::select! {
                    _ = stopped => {}
                    _ = task => {}
                }
            });
        })?;
        let _ = ready.await;
        Ok(ServerThread { _stop: stop })
    }
}

/// Serve on an already bound listener (tests bind port 0); `note`: a line `/healthz` adds.
pub fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    liveness: Liveness,
    note: Option<Arc<str>>,
) -> MetricsServer {
    let addr = listener.local_addr().expect("a bound listener has an address");
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving what we can.
                    tracing::warn!("metrics endpoint: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            let liveness = liveness.clone();
            let note = note.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = respond(&req, &metrics, &liveness, note.as_deref());
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(e) =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await
                {
                    tracing::debug!("metrics endpoint: connection ended: {e}");
                }
            });
        }
    });
    MetricsServer { addr, task }
}

fn respond(
    req: &Request<Incoming>,
    metrics: &Metrics,
    liveness: &Liveness,
    note: Option<&str>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => Response::builder()
            .header(hyper::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")
            .body(Full::new(Bytes::from(metrics.encode())))
            .expect("static headers are valid"),
        "/healthz" => {
            let age = liveness.age_at(Instant::now());
            // Stuck host reads do not stall the loop (they are abandoned at their
            // deadline): the status stays 200 and the body names them, after the kernel
            // log's line.
            let mut body = if liveness.is_alive() {
                "ok\n".to_string()
            } else {
                format!("poll loop stalled: last cycle completed {age:.1?} ago\n")
            };
            body.push_str(&kernel_log_line(metrics));
            for line in metrics.stuck_reads().into_iter().chain(note.map(str::to_string)) {
                body.push_str(&line);
                body.push('\n');
            }
            let status = if liveness.is_alive() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
            text(status, body)
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /metrics or /healthz\n".into()),
    }
}

/// `/healthz`'s second line: `nicmon_kernel_log_watching` and, at 0, why. A kernel log
/// that cannot be read does not fail liveness (a restart would not fix it), but it is
/// said where the probe and an operator look.
fn kernel_log_line(metrics: &Metrics) -> String {
    match metrics.kernel_log_watching() {
        (true, _) => "kernel_log_watching 1\n".into(),
        (false, why) => format!("kernel_log_watching 0 ({why})\n"),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .expect("static headers are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_says_whether_the_kernel_log_is_watched() {
        let m = Metrics::new("n");
        m.set_kernel_log_watching(false, "/dev/kmsg: Operation not permitted");
        assert_eq!(kernel_log_line(&m), "kernel_log_watching 0 (/dev/kmsg: Operation not permitted)\n");
        m.set_kernel_log_watching(true, "");
        assert_eq!(kernel_log_line(&m), "kernel_log_watching 1\n");
    }

    async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn a_taken_port_is_tried_again_and_healthz_says_it_came_late() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let m = Arc::new(Metrics::new("n"));
        let live = Liveness::new(Duration::from_secs(60));
        let task = start_or_retry(addr, m, live, Duration::from_millis(20)).await;
        assert!(!task.is_finished(), "a taken port is not the end of the endpoint");
        drop(taken);
        let deadline = Instant::now() + Duration::from_secs(20);
        let body = loop {
            match get(addr, "/healthz").await {
                Ok(body) if body.contains("200 OK") => break body,
                _ => assert!(Instant::now() < deadline, "never bound after the port was freed"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // the next connect attempt
        };
        assert!(body.contains(&format!("metrics endpoint listening late: the first bind of {addr} failed")), "{body}");
        task.abort();
    }

    #[test]
    fn liveness_window_is_three_intervals() {
        let now = Instant::now();
        let l = Liveness::since(Duration::from_secs(1), now);
        assert!(l.is_alive_at(now + Duration::from_secs(3)));
        assert!(!l.is_alive_at(now + Duration::from_millis(3001)));
        l.cycle_completed_at(now + Duration::from_secs(10));
        assert!(l.is_alive_at(now + Duration::from_secs(11)));
    }

    #[test]
    fn a_huge_interval_does_not_overflow() {
        let now = Instant::now();
        let l = Liveness::since(Duration::MAX, now);
        assert!(l.is_alive_at(now + Duration::from_secs(86_400)));
        let l = Liveness::since(Duration::from_secs(u64::MAX / 2), now);
        assert!(l.is_alive_at(now + Duration::from_secs(86_400)));
    }
}
