//! A platform connector for tests and the demo: serves `datamodels.PlatformConnector` on
//! a unix socket (the node-local connector) or on TCP with TLS (the deployment platform
//! connector, [`Connector::start_tls`]) and records every call it receives (with the
//! `authorization` and `idempotency-key` headers). It can be told to answer with an error
//! status. It runs on its own thread and runtime, so synchronous tests can use it.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nicmon_proto::datamodels::{self as pb, platform_connector_server as server};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Identity, ServerTlsConfig};
use tonic::{Code, Request, Response, Status};

/// One call: accepted (its events count as delivered) or answered with an error.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub authorization: Option<String>,
    pub idempotency_key: Option<String>,
    /// `None` when accepted; the status code it was answered with otherwise.
    pub refused: Option<Code>,
    pub batch: pb::HealthEvents,
}

#[derive(Default)]
struct Log {
    calls: Vec<Received>,
    /// Answers for the next calls, in order (then: `always`).
    answers: std::collections::VecDeque<Code>,
    /// The answer once `answers` is used up (`None`: accept).
    always: Option<Code>,
}

#[derive(Clone, Default)]
struct Recorder {
    log: Arc<(Mutex<Log>, Condvar)>,
}

#[tonic::async_trait]
impl server::PlatformConnector for Recorder {
    async fn health_event_occurred_v1(&self, request: Request<pb::HealthEvents>) -> Result<Response<()>, Status> {
        let header = |name: &str| request.metadata().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (authorization, idempotency_key) = (header("authorization"), header("idempotency-key"));
        let (lock, cv) = &*self.log;
        let mut log = lock.lock().unwrap();
        let refused = log.answers.pop_front().or(log.always);
        log.calls.push(Received {
            at: Instant::now(),
            authorization,
            idempotency_key,
            refused,
            batch: request.into_inner(),
        });
        cv.notify_all();
        match refused {
            Some(code) => Err(Status::new(code, "refused by the test connector")),
            None => Ok(Response::new(())),
        }
    }
}

/// A CA and a server certificate it signed (for `localhost` and `127.0.0.1`), PEM files in a
/// directory: what cert-manager mounts for the deployment platform connector.
pub struct TestPki {
    pub dir: PathBuf,
    pub ca_file: PathBuf,
    cert_pem: String,
    key_pem: String,
}

impl TestPki {
    /// Generate a fresh CA and server certificate, writing `ca.crt` under `dir`.
    pub fn generate(dir: &Path) -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "nicmon test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        TestPki { dir: dir.to_path_buf(), ca_file, cert_pem: leaf.pem(), key_pem: key.serialize_pem() }
    }
}

/// A running connector. Dropping or [`Connector::stop`] shuts it down and leaves the
/// socket file behind, as a crashed connector does.
pub struct Connector {
    pub socket: PathBuf,
    /// `127.0.0.1:<port>` of a TLS connector ([`Connector::start_tls`]).
    pub address: Option<std::net::SocketAddr>,
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
        Connector { socket: socket.to_path_buf(), address: None, recorder, stop: Some(stop), thread: Some(thread) }
    }

    /// The deployment platform connector: gRPC over TCP on 127.0.0.1 (a free port) with TLS,
    /// presenting `pki`'s server certificate. Returns once it accepts.
    pub fn start_tls(pki: &TestPki) -> Connector {
        let recorder = Recorder::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let rec = recorder.clone();
        let identity = Identity::from_pem(&pki.cert_pem, &pki.key_pem);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                tonic::transport::Server::builder()
                    .tls_config(ServerTlsConfig::new().identity(identity))
                    .unwrap()
                    .add_service(server::PlatformConnectorServer::new(rec))
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let address = ready_rx.recv().expect("connector thread failed to bind");
        Connector {
            socket: pki.dir.join("unused.sock"),
            address: Some(address),
            recorder,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Answer the next calls with these error codes, in order; later calls are accepted.
    pub fn refuse_next(&self, codes: &[Code]) {
        self.recorder.log.0.lock().unwrap().answers.extend(codes.iter().copied());
    }

    /// Answer every call with `code` from now on (after the answers `refuse_next` queued),
    /// until [`Connector::accept_all`].
    pub fn refuse_all(&self, code: Code) {
        self.recorder.log.0.lock().unwrap().always = Some(code);
    }

    /// Accept every call from now on (the answers `refuse_next` queued and `refuse_all`'s
    /// are dropped).
    pub fn accept_all(&self) {
        let mut log = self.recorder.log.0.lock().unwrap();
        log.answers.clear();
        log.always = None;
    }

    /// Block until `pred(every call so far)` holds or `timeout` passes.
    pub fn wait_for_calls(&self, timeout: Duration, pred: impl Fn(&[Received]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.recorder.log;
        let mut log = lock.lock().unwrap();
        loop {
            if pred(&log.calls) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            log = cv.wait_timeout(log, deadline - now).unwrap().0;
        }
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

    /// Every call received so far (accepted and refused).
    pub fn received(&self) -> Vec<Received> {
        self.recorder.log.0.lock().unwrap().calls.clone()
    }

    /// Every event accepted so far, in arrival order.
    pub fn events(&self) -> Vec<pb::HealthEvent> {
        self.received().into_iter().filter(|r| r.refused.is_none()).flat_map(|r| r.batch.events).collect()
    }

    /// Block until `pred(events so far)` holds or `timeout` passes; woken by each arrival.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&[pb::HealthEvent]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.recorder.log;
        let mut log = lock.lock().unwrap();
        loop {
            let events: Vec<pb::HealthEvent> =
                log.calls.iter().filter(|r| r.refused.is_none()).flat_map(|r| r.batch.events.clone()).collect();
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
