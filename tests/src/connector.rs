//! A platform connector for tests and the demo: serves `datamodels.PlatformConnector` on
//! a unix socket and records every batch it receives (with the `authorization` header).
//! It runs on its own thread and runtime, so synchronous tests can use it.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nicmon_proto::datamodels::{self as pb, platform_connector_server as server};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// One accepted call.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub authorization: Option<String>,
    pub batch: pb::HealthEvents,
}

#[derive(Default)]
struct Log {
    calls: Vec<Received>,
}

#[derive(Clone, Default)]
struct Recorder {
    log: Arc<(Mutex<Log>, Condvar)>,
}

#[tonic::async_trait]
impl server::PlatformConnector for Recorder {
    async fn health_event_occurred_v1(&self, request: Request<pb::HealthEvents>) -> Result<Response<()>, Status> {
        let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
        let (lock, cv) = &*self.log;
        lock.lock().unwrap().calls.push(Received { at: Instant::now(), authorization, batch: request.into_inner() });
        cv.notify_all();
        Ok(Response::new(()))
    }
}

/// A running connector. Dropping or [`Connector::stop`] shuts it down and leaves the
/// socket file behind, as a crashed connector does.
pub struct Connector {
    pub socket: PathBuf,
    recorder: Recorder,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Connector {
    /// Listen on `socket` (removed first if present). Returns once the socket accepts.
    pub fn start(socket: &Path) -> Connector {
        Connector::start_with(socket, Recorder::default())
    }

    fn start_with(socket: &Path, recorder: Recorder) -> Connector {
        let _ = std::fs::remove_file(socket);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let path = socket.to_path_buf();
        let rec = recorder.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                ready_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(server::PlatformConnectorServer::new(rec))
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        ready_rx.recv().expect("connector thread failed to bind");
        Connector { socket: socket.to_path_buf(), recorder, stop: Some(stop), thread: Some(thread) }
    }

    /// Start again on the same socket, keeping what was received so far.
    pub fn restart(mut self) -> Connector {
        self.shutdown();
        let rec = self.recorder.clone();
        Connector::start_with(&self.socket.clone(), rec)
    }

    /// `unix://<socket>`, for `--platform-connector-socket`.
    pub fn target(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Every call received so far.
    pub fn received(&self) -> Vec<Received> {
        self.recorder.log.0.lock().unwrap().calls.clone()
    }

    /// Every event received so far, in arrival order.
    pub fn events(&self) -> Vec<pb::HealthEvent> {
        self.received().into_iter().flat_map(|r| r.batch.events).collect()
    }

    /// Block until `pred(events so far)` holds or `timeout` passes; woken by each arrival.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&[pb::HealthEvent]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.recorder.log;
        let mut log = lock.lock().unwrap();
        loop {
            let events: Vec<pb::HealthEvent> = log.calls.iter().flat_map(|r| r.batch.events.clone()).collect();
            if pred(&events) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            log = cv.wait_timeout(log, deadline - now).unwrap().0;
        }
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stop serving (the socket file stays).
    pub fn stop(mut self) {
        self.shutdown();
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        self.shutdown();
    }
}
