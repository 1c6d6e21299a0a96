//! The gRPC sink: `datamodels.PlatformConnector/HealthEventOccurredV1` over a unix socket,
//! with the connect, retry and auth behaviour of the existing monitors
//! (`reference/platform-connector-contract.md`).
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use nicmon_proto::client::PlatformConnectorClient;
use nicmon_proto::datamodels as pb;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Status};

use super::SendError;
use super::convert::to_proto_batch;
use crate::model::event::HealthEvent;

/// Default of `--platform-connector-socket`.
pub const DEFAULT_SOCKET: &str = "unix:///var/run/nvsentinel.sock";

/// Where the connector listens: the path of its unix socket.
///
/// Accepts the gRPC target forms `unix:///abs/path`, `unix:/abs/path`, `unix:rel/path`
/// and a bare path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketTarget {
    path: PathBuf,
}

impl SocketTarget {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("platform connector socket {given:?}: {why} (expected unix:///path/to/socket)")]
pub struct TargetError {
    given: String,
    why: &'static str,
}

impl FromStr for SocketTarget {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| TargetError { given: s.to_string(), why };
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            // `unix://` must be followed by an absolute path (no authority).
            if !rest.starts_with('/') {
                return Err(err("unix:// needs an absolute path"));
            }
            rest
        } else if let Some(rest) = s.strip_prefix("unix:") {
            rest
        } else if s.contains("://") {
            return Err(err("only unix sockets are supported"));
        } else {
            s
        };
        if path.is_empty() {
            return Err(err("empty socket path"));
        }
        Ok(SocketTarget { path: PathBuf::from(path) })
    }
}

impl std::fmt::Display for SocketTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

/// The initial connect: `attempts` tries of at most `attempt_timeout` each, waiting
/// `wait_step × n` after the n-th failure (linearly growing), the socket file checked
/// before each try.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectPolicy {
    pub attempts: u32,
    pub attempt_timeout: Duration,
    pub wait_step: Duration,
}

impl Default for ConnectPolicy {
    fn default() -> Self {
        ConnectPolicy { attempts: 10, attempt_timeout: Duration::from_secs(5), wait_step: Duration::from_secs(1) }
    }
}

impl ConnectPolicy {
    /// Wait after the `n`-th failed attempt (1-based).
    pub fn wait_after(&self, n: u32) -> Duration {
        self.wait_step * n
    }
}

/// Retries of one `send`: up to `attempts` calls; before call k+1 a wait of
/// `initial_backoff × factor^(k-1)`, stretched by up to `jitter` (a fraction).
/// Each call is bounded by `call_timeout` (a timeout counts as `DeadlineExceeded`).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub initial_backoff: Duration,
    pub factor: f64,
    pub jitter: f64,
    pub call_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial_backoff: Duration::from_secs(2),
            factor: 1.5,
            jitter: 0.1,
            call_timeout: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Wait before retry `k` (0-based: the wait after the first failed call is `k = 0`),
    /// given `unit`, a random number in `[0, 1)`.
    pub fn backoff(&self, k: u32, unit: f64) -> Duration {
        let base = self.initial_backoff.as_secs_f64() * self.factor.powi(k as i32);
        Duration::from_secs_f64(base * (1.0 + self.jitter * unit.clamp(0.0, 1.0)))
    }
}

/// The optional bearer token (`--platform-connector-token-path`). The file is re-read on
/// every call: the token is rotated underneath a running monitor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenSource {
    path: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token file {path}: {source}")]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("token file {path} is empty")]
    Empty { path: PathBuf },
    #[error("token file {path} holds characters not allowed in a gRPC header")]
    Invalid { path: PathBuf },
}

/// The most nicmon reads of a token file (a bearer token is well under a kilobyte).
const TOKEN_MAX_BYTES: usize = 64 << 10;

impl TokenSource {
    pub fn none() -> TokenSource {
        TokenSource { path: None }
    }

    pub fn file(path: impl Into<PathBuf>) -> TokenSource {
        TokenSource { path: Some(path.into()) }
    }

    /// The token file, if one is configured.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The `authorization` header value for this call, if a token file is configured.
    pub fn authorization(&self) -> Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>, TokenError> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        // Only a regular file, bounded, under a deadline: a FIFO or a device named as the
        // token file must not block a send.
        let raw = crate::read::host::read_file(path, TOKEN_MAX_BYTES)
            .map_err(|e| TokenError::Unreadable { path: path.clone(), source: e.to_io() })?;
        let raw = String::from_utf8_lossy(&raw);
        let token = raw.trim();
        if token.is_empty() {
            return Err(TokenError::Empty { path: path.clone() });
        }
        format!("Bearer {token}").parse().map(Some).map_err(|_| TokenError::Invalid { path: path.clone() })
    }
}

/// Everything the gRPC sink needs; `GrpcConfig::new(target)` has the contract's timings.
#[derive(Debug, Clone)]
pub struct GrpcConfig {
    pub target: SocketTarget,
    pub token: TokenSource,
    pub connect: ConnectPolicy,
    pub retry: RetryPolicy,
    /// Direct publishing (`HEALTH_PUBLISH_TARGET`): when set, it replaces the socket.
    pub direct: Option<super::DirectConfig>,
}

impl GrpcConfig {
    pub fn new(target: SocketTarget) -> GrpcConfig {
        GrpcConfig {
            target,
            token: TokenSource::none(),
            connect: ConnectPolicy::default(),
            retry: RetryPolicy::default(),
            direct: None,
        }
    }
}

/// A client of the platform connector. Holds at most one connection; a connection that
/// failed is dropped and a new one is opened by the next call.
pub struct GrpcSink {
    config: GrpcConfig,
    client: Option<PlatformConnectorClient<Channel>>,
}

/// Why one call did not go through, and whether another call may.
enum Failure {
    Token(TokenError),
    Retryable(String),
    Permanent(Status),
}

impl GrpcSink {
    /// A sink that connects on its first `send`.
    pub fn new(config: GrpcConfig) -> GrpcSink {
        GrpcSink { config, client: None }
    }

    /// Connect now, with the initial connect policy. Fails with
    /// [`SendError::Unavailable`] once the policy's attempts are used up.
    pub async fn connect(config: GrpcConfig) -> Result<GrpcSink, SendError> {
        let mut sink = GrpcSink::new(config);
        let policy = sink.config.connect.clone();
        let mut last = String::new();
        for n in 1..=policy.attempts {
            match open(&sink.config.target, policy.attempt_timeout).await {
                Ok(client) => {
                    sink.client = Some(client);
                    return Ok(sink);
                }
                Err(why) => {
                    tracing::warn!(
                        target = %sink.config.target,
                        attempt = n,
                        of = policy.attempts,
                        "platform connector not reachable: {why}"
                    );
                    last = why.to_string();
                }
            }
            if n < policy.attempts {
                tokio::time::sleep(policy.wait_after(n)).await;
            }
        }
        Err(SendError::Unavailable { target: sink.config.target.to_string(), attempts: policy.attempts, last })
    }

    pub fn config(&self) -> &GrpcConfig {
        &self.config
    }

    /// Deliver `events` as ONE `HealthEvents` batch, retrying transient failures per the
    /// retry policy. `Ok(())` means the connector accepted the batch. An empty slice is
    /// accepted without a call.
    pub async fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        if events.is_empty() {
            return Ok(());
        }
        let batch = to_proto_batch(events);
        let policy = self.config.retry.clone();
        let mut last = String::new();
        for k in 0..policy.attempts {
            if k > 0 {
                tokio::time::sleep(policy.backoff(k - 1, fastrand::f64())).await;
            }
            match self.call(&batch).await {
                Ok(()) => return Ok(()),
                Err(Failure::Token(e)) => return Err(SendError::Token(e)),
                Err(Failure::Permanent(status)) => {
                    return Err(SendError::Rejected { code: status.code(), message: status.message().to_string() });
                }
                Err(Failure::Retryable(why)) => {
                    tracing::debug!(attempt = k + 1, "send to platform connector failed: {why}");
                    self.client = None;
                    last = why.to_string();
                }
            }
        }
        Err(SendError::Unavailable { target: self.config.target.to_string(), attempts: policy.attempts, last })
    }

    async fn call(&mut self, batch: &pb::HealthEvents) -> Result<(), Failure> {
        // The token first: an unreadable token file is the operator's to fix (no point in
        // retrying within this send), and nothing was sent, so the batch stays with the caller.
        let auth = self.config.token.authorization().map_err(Failure::Token)?;
        let timeout = self.config.retry.call_timeout;
        if self.client.is_none() {
            self.client =
                Some(open(&self.config.target, timeout).await.map_err(|e| Failure::Retryable(e.to_string()))?);
        } else if !self.config.target.path().exists() {
            // Contract: a missing socket file means "connector unavailable".
            return Err(Failure::Retryable(format!(
                "socket file {} does not exist",
                self.config.target.path().display()
            )));
        }
        let client = self.client.as_mut().expect("connected above");
        let mut request = tonic::Request::new(batch.clone());
        if let Some(value) = auth {
            request.metadata_mut().insert("authorization", value);
        }
        match tokio::time::timeout(timeout, client.health_event_occurred_v1(request)).await {
            Err(_) => Err(Failure::Retryable(format!("no answer within {timeout:?} (deadline exceeded)"))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) if is_retryable(&status) => Err(Failure::Retryable(describe(&status))),
            Ok(Err(status)) => Err(Failure::Permanent(status)),
        }
    }
}

/// Open a connection to the socket at `target`, checking first that the file exists.
/// Why the connector's socket could not be connected to.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("socket file {} does not exist", .0.display())]
    NoSocket(std::path::PathBuf),
    #[error("connect timed out after {0:?}")]
    TimedOut(Duration),
    /// The transport's error and its causes, in one line.
    #[error("{0}")]
    Failed(String),
}

async fn open(target: &SocketTarget, timeout: Duration) -> Result<PlatformConnectorClient<Channel>, ConnectError> {
    let path = target.path().to_path_buf();
    if !path.exists() {
        return Err(ConnectError::NoSocket(path));
    }
    // The URI only names the HTTP/2 authority; the connector below ignores it.
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    match tokio::time::timeout(timeout, endpoint.connect_with_connector(connector)).await {
        Err(_) => Err(ConnectError::TimedOut(timeout)),
        Ok(Err(e)) => Err(ConnectError::Failed(crate::act::logging::error_chain(&e))),
        Ok(Ok(channel)) => Ok(PlatformConnectorClient::new(channel)),
    }
}

/// Contract: retry on `Unavailable`, `DeadlineExceeded`, EOF, "connection reset",
/// "broken pipe"; every other status is permanent.
pub fn is_retryable(status: &Status) -> bool {
    if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) {
        return true;
    }
    let text = describe(status).to_lowercase();
    ["eof", "connection reset", "broken pipe"].iter().any(|needle| text.contains(needle))
}

/// A status's code, message and causes on one line.
pub(super) fn describe(status: &Status) -> String {
    let mut s = format!("{:?}: {}", status.code(), status.message());
    crate::act::logging::push_causes(&mut s, status);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    use nicmon_tests::blocking::{fifo_in, promptly};

    /// A FIFO named as the token file is refused before it is opened: a send is not blocked.
    #[test]
    fn a_fifo_token_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let token = TokenSource::file(fifo_in(dir.path(), "token"));
        let why = promptly(move || token.authorization().map(|_| ()).map_err(|e| e.to_string())).unwrap_err();
        assert!(why.contains("token") && why.contains("not a regular file (a FIFO)"), "{why}");
    }

    #[test]
    fn socket_targets() {
        let ok = [
            (DEFAULT_SOCKET, "/var/run/nvsentinel.sock"),
            ("unix:/tmp/x.sock", "/tmp/x.sock"),
            ("unix:rel.sock", "rel.sock"),
            ("/run/pc.sock", "/run/pc.sock"),
        ];
        for (given, path) in ok {
            let t: SocketTarget = given.parse().unwrap();
            assert_eq!(t.path(), Path::new(path), "{given}");
        }
        for bad in ["", "unix://", "unix://host/x.sock", "tcp://1.2.3.4:5", "unix:"] {
            let e = bad.parse::<SocketTarget>().unwrap_err();
            assert!(e.to_string().contains("expected unix:///"), "{bad}: {e}");
        }
        assert_eq!(DEFAULT_SOCKET.parse::<SocketTarget>().unwrap().to_string(), DEFAULT_SOCKET);
    }

    #[test]
    fn backoff_grows_by_the_factor_within_the_jitter() {
        let p = RetryPolicy::default();
        let secs: Vec<f64> = (0..4).map(|k| p.backoff(k, 0.0).as_secs_f64()).collect();
        assert_eq!(secs, vec![2.0, 3.0, 4.5, 6.75]);
        assert!((p.backoff(0, 0.999).as_secs_f64() - 2.2).abs() < 0.01);
        let c = ConnectPolicy::default();
        assert_eq!(c.wait_after(1), Duration::from_secs(1));
        assert_eq!(c.wait_after(3), Duration::from_secs(3));
    }

    #[test]
    fn retryable_statuses() {
        assert!(is_retryable(&Status::unavailable("down")));
        assert!(is_retryable(&Status::deadline_exceeded("slow")));
        assert!(is_retryable(&Status::unknown("transport: unexpected EOF")));
        assert!(is_retryable(&Status::internal("Connection reset by peer")));
        assert!(is_retryable(&Status::unknown("write: broken pipe")));
        assert!(!is_retryable(&Status::permission_denied("nodeName mismatch")));
        assert!(!is_retryable(&Status::invalid_argument("bad event")));
        assert!(!is_retryable(&Status::unauthenticated("no token")));
    }

    #[test]
    fn token_is_trimmed_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  abc.def \n").unwrap();
        let v = TokenSource::file(&path).authorization().unwrap().unwrap();
        assert_eq!(v.to_str().unwrap(), "Bearer abc.def");

        std::fs::write(&path, "\n").unwrap();
        let e = TokenSource::file(&path).authorization().unwrap_err();
        assert!(matches!(e, TokenError::Empty { .. }));

        let missing = dir.path().join("missing");
        let e = TokenSource::file(&missing).authorization().unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(TokenSource::none().authorization().unwrap().is_none());
    }
}
