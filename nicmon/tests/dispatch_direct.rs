//! The direct sink (`HEALTH_PUBLISH_TARGET`) against an in-process connector on TCP: the
//! retry window, the rejection rules and the headers. (TLS end to end: tests/tests/dropin.rs.)
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nicmon::act::dispatch::direct::{
    DEFAULT_QUEUE_MAX_BATCHES, DEFAULT_QUEUE_MAX_BYTES, DirectConfig, IDEMPOTENCY_KEY, Transport,
};
use nicmon::act::dispatch::{DirectSink, SendError, TokenSource};
use nicmon::model::event::{Check, HealthEvent, Stamp};
use nicmon_proto::datamodels::{self as pb, platform_connector_server as server};
use tokio::sync::oneshot;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Code, Request, Response, Status};

/// One call's (authorization, idempotency-key) headers.
type Headers = (Option<String>, Option<String>);

/// Every call's headers; answers `Err(answer)` while set.
#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<Headers>>>,
    answer: Arc<Mutex<Option<Code>>>,
}

#[tonic::async_trait]
impl server::PlatformConnector for Fake {
    async fn health_event_occurred_v1(&self, request: Request<pb::HealthEvents>) -> Result<Response<()>, Status> {
        let h = |k: &str| request.metadata().get(k).map(|v| v.to_str().unwrap().to_string());
        self.calls.lock().unwrap().push((h("authorization"), h(IDEMPOTENCY_KEY)));
        match *self.answer.lock().unwrap() {
            Some(code) => Err(Status::new(code, "scripted")),
            None => Ok(Response::new(())),
        }
    }
}

async fn serve(fake: Fake) -> (String, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(server::PlatformConnectorServer::new(fake))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (addr, stop)
}

/// Plaintext (the insecure switch), a token file, and a window of 300 ms with 5 ms backoff.
fn config(addr: &str, token: &std::path::Path) -> DirectConfig {
    DirectConfig {
        target: addr.to_string(),
        authority: addr.to_string(),
        transport: Transport::Insecure,
        token: TokenSource::file(token),
        retry_window: Duration::from_millis(300),
        queue_max_batches: DEFAULT_QUEUE_MAX_BATCHES,
        queue_max_bytes: DEFAULT_QUEUE_MAX_BYTES,
        initial_backoff: Duration::from_millis(5),
        backoff_factor: 1.5,
        backoff_jitter: 0.1,
        max_backoff: Duration::from_millis(20),
        rpc_timeout: Duration::from_secs(5),
        final_attempt_window: Duration::from_millis(10),
    }
}

fn events() -> Vec<HealthEvent> {
    vec![HealthEvent::new(
        Check::InfiniBandStateCheck,
        &Stamp::default(),
        time::OffsetDateTime::UNIX_EPOCH,
        "mlx5_3 down",
    )]
}

#[tokio::test]
async fn retried_within_the_window_with_one_key_then_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0k\n").unwrap();
    let fake = Fake::default();
    *fake.answer.lock().unwrap() = Some(Code::Unavailable);
    let (addr, stop) = serve(fake.clone()).await;
    let mut sink = DirectSink::new(config(&addr, &token));

    let started = Instant::now();
    let e = sink.send(&events()).await.unwrap_err();
    let took = started.elapsed();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("retry window of 300ms ended"), "{e}");
    assert!(took >= Duration::from_millis(280) && took < Duration::from_secs(3), "{took:?}");
    let calls = fake.calls.lock().unwrap().clone();
    assert!(calls.len() >= 3, "retried: {calls:?}");
    assert!(calls.iter().all(|c| c == &calls[0]), "one key, one token: {calls:?}");
    assert_eq!(calls[0].0.as_deref(), Some("Bearer t0k"));

    // The server recovers: the same batch is stored under the same key.
    *fake.answer.lock().unwrap() = None;
    sink.send(&events()).await.unwrap();
    let last = fake.calls.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last, calls[0]);
    let _ = stop.send(());
}

#[tokio::test]
async fn permanent_codes_end_the_send_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0k").unwrap();
    for code in [Code::InvalidArgument, Code::PermissionDenied, Code::Unimplemented] {
        let fake = Fake::default();
        *fake.answer.lock().unwrap() = Some(code);
        let (addr, stop) = serve(fake.clone()).await;
        let mut sink = DirectSink::new(config(&addr, &token));
        let e = sink.send(&events()).await.unwrap_err();
        assert!(matches!(e, SendError::Rejected { code: c, .. } if c == code), "{e}");
        assert!(!e.is_retryable());
        assert_eq!(fake.calls.lock().unwrap().len(), 1, "{code:?}: one attempt");
        let _ = stop.send(());
    }
}

#[tokio::test]
async fn an_unreadable_token_is_retried_and_nothing_is_sent_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let (addr, stop) = serve(fake.clone()).await;
    let mut sink = DirectSink::new(config(&addr, &dir.path().join("missing-token")));
    let e = sink.send(&events()).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert!(e.to_string().contains("missing-token"), "{e}");
    assert!(fake.calls.lock().unwrap().is_empty(), "no call without a token");
    let _ = stop.send(());
}
