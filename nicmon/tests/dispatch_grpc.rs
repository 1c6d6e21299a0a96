//! The gRPC sink against an in-process platform connector on a unix socket.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nicmon::act::dispatch::convert::to_proto;
use nicmon::act::dispatch::{ConnectPolicy, GrpcConfig, GrpcSink, RetryPolicy, SendError, SocketTarget, TokenSource};
use nicmon::model::event::{Check, Entity, HealthEvent, ProcessingStrategy, RecommendedAction, Stamp};
use nicmon_proto::datamodels::{self as pb, platform_connector_server as server};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

/// What the fake connector saw: each call's `authorization` header and batch.
#[derive(Default)]
struct Seen {
    calls: Vec<(Option<String>, pb::HealthEvents)>,
}

/// A platform connector that records every call and answers with the next scripted
/// status (then `Ok`).
#[derive(Clone, Default)]
struct FakeConnector {
    seen: Arc<Mutex<Seen>>,
    script: Arc<Mutex<Vec<Status>>>,
}

#[tonic::async_trait]
impl server::PlatformConnector for FakeConnector {
    async fn health_event_occurred_v1(&self, request: Request<pb::HealthEvents>) -> Result<Response<()>, Status> {
        let auth = request.metadata().get("authorization").map(|v| v.to_str().unwrap().to_string());
        self.seen.lock().unwrap().calls.push((auth, request.into_inner()));
        let mut script = self.script.lock().unwrap();
        if script.is_empty() { Ok(Response::new(())) } else { Err(script.remove(0)) }
    }
}

impl FakeConnector {
    fn calls(&self) -> Vec<(Option<String>, pb::HealthEvents)> {
        self.seen.lock().unwrap().calls.clone()
    }
    fn fail_next(&self, status: Status) {
        self.script.lock().unwrap().push(status);
    }
}

/// A running fake connector; `stop` shuts it down and leaves the socket file behind,
/// as a crashed connector does.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn serve(socket: &Path, connector: FakeConnector) -> Running {
    let _ = std::fs::remove_file(socket);
    // Bound before returning: connects succeed from here on.
    let listener = UnixListener::bind(socket).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server::PlatformConnectorServer::new(connector))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Running { stop, task }
}

/// The contract's policies, shrunk to milliseconds.
fn config(socket: &Path) -> GrpcConfig {
    GrpcConfig {
        target: format!("unix://{}", socket.display()).parse().unwrap(),
        token: TokenSource::none(),
        connect: ConnectPolicy {
            attempts: 3,
            attempt_timeout: Duration::from_secs(5),
            wait_step: Duration::from_millis(5),
        },
        retry: RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(5),
            factor: 1.5,
            jitter: 0.1,
            call_timeout: Duration::from_secs(5),
        },
        direct: None,
    }
}

/// mlx5_3 port 1 went down on gpu-node-7, and its card-level companion event.
fn batch() -> Vec<HealthEvent> {
    let stamp = Stamp { node_name: "gpu-node-7".into(), processing_strategy: ProcessingStrategy::STORE_AND_ANALYSE };
    let t = time::macros::datetime!(2026-05-06 07:08:09.5 UTC);
    let mut down =
        HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "Port mlx5_3 port 1: state DOWN, phys_state Disabled")
            .unhealthy(true)
            .entities(vec![Entity::device("mlx5_3"), Entity::port(1)])
            .error_code("PORT_DOWN");
    down.metadata.insert("role".into(), "compute".into());
    let card = HealthEvent::new(Check::InfiniBandStateCheck, &stamp, t, "Card 0000:3b:00 degraded")
        .unhealthy(false)
        .action(RecommendedAction::CONTACT_SUPPORT)
        .entities(vec![Entity::card("0000:3b:00")]);
    vec![down, card]
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("nvsentinel.sock")
}

#[tokio::test]
async fn a_batch_arrives_with_every_field_intact() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let connector = FakeConnector::default();
    let running = serve(&socket, connector.clone());

    let mut sink = GrpcSink::connect(config(&socket)).await.unwrap();
    sink.send(&batch()).await.unwrap();

    let calls = connector.calls();
    assert_eq!(calls.len(), 1, "one batch per send");
    let (auth, got) = &calls[0];
    assert_eq!(auth, &None, "no token configured");
    assert_eq!(got.version, 1);
    assert_eq!(got.events.len(), 2);
    let ev = &got.events[0];
    assert_eq!(ev.version, 1);
    assert_eq!(ev.agent, "nic-health-monitor");
    assert_eq!(ev.component_class, "NIC");
    assert_eq!(ev.check_name, "InfiniBandStateCheck");
    assert!(ev.is_fatal);
    assert!(!ev.is_healthy);
    assert_eq!(ev.message, "Port mlx5_3 port 1: state DOWN, phys_state Disabled");
    assert_eq!(ev.recommended_action(), pb::RecommendedAction::ReplaceVm);
    assert_eq!(ev.error_code, vec!["PORT_DOWN"]);
    let entities: Vec<_> =
        ev.entities_impacted.iter().map(|e| (e.entity_type.as_str(), e.entity_value.as_str())).collect();
    assert_eq!(entities, vec![("NIC", "mlx5_3"), ("NICPort", "1")]);
    assert_eq!(ev.metadata.get("role").map(String::as_str), Some("compute"));
    let ts = ev.generated_timestamp.unwrap();
    assert_eq!((ts.seconds, ts.nanos), (1_778_051_289, 500_000_000));
    assert_eq!(ev.node_name, "gpu-node-7");
    assert_eq!(ev.processing_strategy(), pb::ProcessingStrategy::StoreAndAnalyse);
    assert_eq!(got.events[1].recommended_action(), pb::RecommendedAction::ContactSupport);
    // And nothing else changed on the way.
    let sent: Vec<_> = batch().iter().map(to_proto).collect();
    assert_eq!(got.events, sent);

    running.stop().await;
}

#[tokio::test]
async fn the_token_file_is_read_on_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let connector = FakeConnector::default();
    let running = serve(&socket, connector.clone());

    let mut cfg = config(&socket);
    cfg.token = TokenSource::file(&token);
    let mut sink = GrpcSink::connect(cfg).await.unwrap();
    sink.send(&batch()).await.unwrap();
    std::fs::write(&token, "  rotated-token  ").unwrap();
    sink.send(&batch()).await.unwrap();

    let auths: Vec<_> = connector.calls().into_iter().map(|(a, _)| a).collect();
    assert_eq!(auths, vec![Some("Bearer first-token".to_string()), Some("Bearer rotated-token".to_string())]);

    // An unreadable token: nothing is sent, the error names the file, the batch stays.
    std::fs::remove_file(&token).unwrap();
    let err = sink.send(&batch()).await.unwrap_err();
    assert!(matches!(err, SendError::Token(_)), "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains(&token.display().to_string()), "{err}");
    assert_eq!(connector.calls().len(), 2);

    running.stop().await;
}

#[tokio::test]
async fn while_the_connector_is_down_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let events = batch();

    // No socket file at all: "connector unavailable".
    let mut sink = GrpcSink::new(config(&socket));
    let err = sink.send(&events).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(matches!(err, SendError::Unavailable { attempts: 3, .. }), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");

    // The connector comes up: the same batch arrives, once.
    let connector = FakeConnector::default();
    let running = serve(&socket, connector.clone());
    sink.send(&events).await.unwrap();
    assert_eq!(connector.calls().len(), 1);

    // It crashes, leaving its socket file behind: connection refused is retryable too.
    running.stop().await;
    assert!(socket.exists());
    let err = sink.send(&events).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");

    // It restarts: the unacknowledged batch is delivered.
    let restarted = FakeConnector::default();
    let running = serve(&socket, restarted.clone());
    sink.send(&events).await.unwrap();
    let calls = restarted.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].1.events, events.iter().map(to_proto).collect::<Vec<_>>());

    running.stop().await;
}

#[tokio::test]
async fn transient_statuses_are_retried_within_one_send() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let connector = FakeConnector::default();
    connector.fail_next(Status::unavailable("connector busy"));
    connector.fail_next(Status::unknown("read: connection reset by peer"));
    let running = serve(&socket, connector.clone());

    let mut sink = GrpcSink::connect(config(&socket)).await.unwrap();
    sink.send(&batch()).await.unwrap();
    assert_eq!(connector.calls().len(), 3, "two failures, then accepted");

    running.stop().await;
}

#[tokio::test]
async fn a_permanent_status_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let connector = FakeConnector::default();
    connector.fail_next(Status::permission_denied("nodeName gpu-node-7 differs from the connector's node"));
    let running = serve(&socket, connector.clone());

    let mut sink = GrpcSink::connect(config(&socket)).await.unwrap();
    let err = sink.send(&batch()).await.unwrap_err();
    assert!(!err.is_retryable());
    match &err {
        SendError::Rejected { code, message } => {
            assert_eq!(*code, Code::PermissionDenied);
            assert!(message.contains("nodeName"));
        }
        other => panic!("expected a rejection, got {other}"),
    }
    assert_eq!(connector.calls().len(), 1, "not retried");

    running.stop().await;
}

#[tokio::test]
async fn initial_connect_gives_up_after_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let err = match GrpcSink::connect(config(&socket)).await {
        Ok(_) => panic!("connected to a socket that does not exist"),
        Err(e) => e,
    };
    assert!(matches!(err, SendError::Unavailable { attempts: 3, .. }), "{err}");
    assert!(err.to_string().contains("nvsentinel.sock"), "{err}");
}

#[test]
fn the_default_target_is_the_daemonset_socket() {
    let t: SocketTarget = nicmon::act::dispatch::DEFAULT_SOCKET.parse().unwrap();
    assert_eq!(t.path(), Path::new("/var/run/nvsentinel.sock"));
}
