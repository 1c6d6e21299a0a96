//! Dispatch: delivering health events to where they are consumed.
//!
//! One [`Sink::send`] call delivers one batch (one check's events of one poll cycle) and
//! says whether it was accepted (`Ok(())`), failed in a way a retry may fix, or was rejected
//! for good ([`SendError::is_retryable`]). When a batch is sent, how often, and when it
//! leaves the persisted outbox is decided by the courier (`crate::act::courier`, SPEC §1.7,
//! transactional dispatch), not here: a sink knows nothing of the outbox.
//!
//! - [`grpc`]: the NVSentinel platform connector over its unix socket;
//! - [`direct`]: the deployment platform connector over TCP+TLS (`HEALTH_PUBLISH_TARGET`);
//! - [`lines`]: JSON lines (proto3 JSON form) on stdout or appended to a file;
//! - [`convert`]: the event model → the wire messages.
pub mod convert;
pub mod direct;
pub mod grpc;
pub mod lines;

use std::path::PathBuf;
use std::str::FromStr;

pub use direct::{DirectConfig, DirectSink};
pub use grpc::{
    ConnectPolicy, DEFAULT_SOCKET, GrpcConfig, GrpcSink, RetryPolicy, SocketTarget, TokenError, TokenSource,
};
pub use lines::{FileSink, LineSink};

use crate::model::event::HealthEvent;

/// Why a batch was not delivered. [`SendError::is_retryable`] tells the two kinds apart:
/// a retryable failure may succeed later with the same batch; a permanent one will not
/// (the connector refused this batch).
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The connector could not be reached or did not answer (socket missing, connection
    /// refused/reset, `Unavailable`, `DeadlineExceeded`). Retryable.
    #[error("platform connector at {target} unavailable after {attempts} attempt(s): {last}")]
    Unavailable { target: String, attempts: u32, last: String },
    /// The bearer token could not be read. Retryable once the file is fixed.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The connector answered with a non-retryable status. Permanent.
    #[error("platform connector rejected the batch: {code:?}: {message}")]
    Rejected { code: tonic::Code, message: String },
    /// The batch is larger than the connector receives. Permanent.
    #[error("batch of {bytes} bytes exceeds the connector's {limit}-byte message limit")]
    TooLarge { bytes: usize, limit: usize },
    /// Writing the JSON lines failed. Retryable (disk full, stdout closed, ...).
    #[error("cannot write events to {target}: {source}")]
    Write { target: String, source: std::io::Error },
}

impl SendError {
    /// Whether the same batch may be accepted by a later send.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, SendError::Rejected { .. } | SendError::TooLarge { .. })
    }
}

/// Where events go: `--sink grpc|stdout|file:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    Grpc,
    Stdout,
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkSpecError {
    #[error("unknown sink {0:?}: expected grpc, stdout or file:PATH")]
    Unknown(String),
    #[error("sink \"file:\" needs a path, as in file:/var/log/nicmon/events.jsonl")]
    MissingPath,
}

impl FromStr for SinkSpec {
    type Err = SinkSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "grpc" => Ok(SinkSpec::Grpc),
            "stdout" => Ok(SinkSpec::Stdout),
            _ => match s.strip_prefix("file:") {
                Some("") => Err(SinkSpecError::MissingPath),
                Some(path) => Ok(SinkSpec::File(PathBuf::from(path))),
                None => Err(SinkSpecError::Unknown(s.to_string())),
            },
        }
    }
}

impl std::fmt::Display for SinkSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SinkSpec::Grpc => f.write_str("grpc"),
            SinkSpec::Stdout => f.write_str("stdout"),
            SinkSpec::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

/// The dispatch flags of `nicmon run` (NVSentinel drop-in names), for
/// `#[command(flatten)]`.
#[derive(Debug, Clone, clap::Args)]
pub struct DispatchArgs {
    /// Where events go: grpc (the platform connector), stdout or file:PATH (JSON lines).
    #[arg(long, default_value = "grpc", value_name = "grpc|stdout|file:PATH")]
    pub sink: SinkSpec,
    /// The platform connector's unix socket (unless HEALTH_PUBLISH_TARGET selects direct
    /// publishing to the deployment platform connector over TLS).
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "unix:///PATH")]
    pub platform_connector_socket: SocketTarget,
    /// File holding a bearer token for the connector; re-read on every call.
    #[arg(long, value_name = "FILE")]
    pub platform_connector_token_path: Option<PathBuf>,
}

impl DispatchArgs {
    /// The gRPC sink's configuration, with the contract's connect and retry timings; socket
    /// mode (set [`GrpcConfig::direct`] for direct publishing).
    pub fn grpc_config(&self) -> GrpcConfig {
        let mut config = GrpcConfig::new(self.platform_connector_socket.clone());
        if let Some(path) = &self.platform_connector_token_path {
            config.token = TokenSource::file(path);
        }
        config
    }
}

/// An open sink.
pub enum Sink {
    // Boxed: the gRPC sink carries its whole configuration.
    Grpc(Box<GrpcSink>),
    Direct(Box<DirectSink>),
    Stdout(LineSink<std::io::Stdout>),
    File(FileSink),
}

impl Sink {
    /// Open the sink `spec` names. For `grpc` this runs the initial connect policy and
    /// fails once it is exhausted; use [`Sink::lazy`] to connect on the first send instead.
    pub async fn open(spec: &SinkSpec, grpc: GrpcConfig) -> Result<Sink, SendError> {
        Ok(match spec {
            SinkSpec::Grpc if grpc.direct.is_none() => Sink::Grpc(Box::new(GrpcSink::connect(grpc).await?)),
            _ => Sink::lazy(spec, grpc),
        })
    }

    /// The sink `spec` names, without connecting yet.
    pub fn lazy(spec: &SinkSpec, grpc: GrpcConfig) -> Sink {
        match spec {
            SinkSpec::Grpc => match grpc.direct.clone() {
                Some(direct) => Sink::Direct(Box::new(DirectSink::new(direct))),
                None => Sink::Grpc(Box::new(GrpcSink::new(grpc))),
            },
            SinkSpec::Stdout => Sink::Stdout(LineSink::stdout()),
            SinkSpec::File(path) => Sink::File(FileSink::new(path.clone())),
        }
    }

    /// Deliver `events` as one batch and make it durable where the sink can:
    /// [`Sink::deliver`], then [`Sink::make_durable`]. `Ok(())` = accepted.
    pub async fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        self.deliver(events).await?;
        self.make_durable().await
    }

    /// Deliver `events` as one batch: the connector replied (gRPC), the lines are written
    /// (stdout, file; a file's data is not synced yet).
    pub async fn deliver(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        match self {
            Sink::Grpc(s) => s.send(events).await,
            Sink::Direct(s) => s.send(events).await,
            Sink::Stdout(s) => s.send(events),
            Sink::File(s) => s.deliver(events).await,
        }
    }

    /// Make what [`Sink::deliver`] delivered survive a power loss: the file sink syncs the
    /// file's data; for the others the reply (or the write to a stream) is all there is.
    /// The courier acknowledges a batch only after this (`crate::act::courier`).
    pub async fn make_durable(&mut self) -> Result<(), SendError> {
        match self {
            Sink::File(s) => s.make_durable().await,
            Sink::Grpc(_) | Sink::Direct(_) | Sink::Stdout(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_specs() {
        assert_eq!("grpc".parse(), Ok(SinkSpec::Grpc));
        assert_eq!("stdout".parse(), Ok(SinkSpec::Stdout));
        assert_eq!("file:/var/log/ev.jsonl".parse(), Ok(SinkSpec::File("/var/log/ev.jsonl".into())));
        assert_eq!("file:".parse::<SinkSpec>(), Err(SinkSpecError::MissingPath));
        let e = "kafka".parse::<SinkSpec>().unwrap_err();
        assert_eq!(e.to_string(), "unknown sink \"kafka\": expected grpc, stdout or file:PATH");
        for s in ["grpc", "stdout", "file:/x"] {
            assert_eq!(s.parse::<SinkSpec>().unwrap().to_string(), s);
        }
    }

    #[tokio::test]
    async fn a_file_spec_opens_an_appending_sink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let spec: SinkSpec = format!("file:{}", path.display()).parse().unwrap();
        let grpc = GrpcConfig::new(DEFAULT_SOCKET.parse().unwrap());
        let mut sink = Sink::open(&spec, grpc).await.unwrap();
        let ev = HealthEvent::new(
            crate::model::event::Check::EthernetStateCheck,
            &crate::model::event::Stamp::default(),
            time::OffsetDateTime::UNIX_EPOCH,
            "eth2 down",
        );
        sink.send(std::slice::from_ref(&ev)).await.unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", serde_json::to_string(&ev).unwrap()));
    }

    #[test]
    fn dispatch_flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            dispatch: DispatchArgs,
        }
        let d = Cli::try_parse_from(["nicmon"]).unwrap().dispatch;
        assert_eq!(d.sink, SinkSpec::Grpc);
        assert_eq!(d.platform_connector_socket.to_string(), DEFAULT_SOCKET);
        assert_eq!(d.grpc_config().token, TokenSource::none());

        let d = Cli::try_parse_from([
            "nicmon",
            "--sink",
            "file:/tmp/ev.jsonl",
            "--platform-connector-socket",
            "unix:///run/pc.sock",
            "--platform-connector-token-path",
            "/var/run/secrets/token",
        ])
        .unwrap()
        .dispatch;
        assert_eq!(d.sink, SinkSpec::File("/tmp/ev.jsonl".into()));
        let config = d.grpc_config();
        assert_eq!(config.target.path(), std::path::Path::new("/run/pc.sock"));
        assert_eq!(config.token, TokenSource::file("/var/run/secrets/token"));

        let e = Cli::try_parse_from(["nicmon", "--sink", "kafka"]).err().unwrap();
        assert!(e.to_string().contains("expected grpc, stdout or file:PATH"), "{e}");
    }

    #[test]
    fn only_rejections_are_permanent() {
        let rejected = SendError::Rejected { code: tonic::Code::PermissionDenied, message: "nodeName".into() };
        assert!(!rejected.is_retryable());
        let down =
            SendError::Unavailable { target: DEFAULT_SOCKET.into(), attempts: 5, last: "socket file missing".into() };
        assert!(down.is_retryable());
    }
}
