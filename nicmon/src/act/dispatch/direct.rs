//! Direct publishing: NVSentinel's *deployment* platform connector over TCP, with TLS, a
//! bearer token and a per-batch `idempotency-key` (`HEALTH_PUBLISH_TARGET` and companions;
//! upstream `commons/pkg/healthpub`, `reference/nvsentinel-upstream.md` §8).
//!
//! Upstream's rules, and where nicmon's outbox (SPEC §1.7) changes their meaning:
//! - **Rejection.** `InvalidArgument`, `PermissionDenied` and `Unimplemented` would be answered
//!   the same way on every retry: the batch is rejected for good (the dispatcher drops it, as
//!   for the socket). A batch larger than the server receives (4 MiB) is rejected unsent.
//! - **Retry window** (`HEALTH_PUBLISH_RETRY_WINDOW`, default 5m). Every other failure
//!   (transport, `Unavailable`, auth, ...) is retried with backoff (2 s × 1.5, ±10 %, at most
//!   30 s) until the window ends. Upstream then drops the batch and re-emits from its
//!   uncommitted state; nicmon has already committed the state with the batch in its outbox,
//!   so the send reports "unavailable", the batch stays first in the outbox and the next send
//!   opens a new window. Nothing is lost; the idempotency key (derived from the batch's
//!   content, so the same after a restart) lets the platform store it once.
//! - **Bounded queue** (1024 batches / 64 MiB). The outbox is the queue: a poll whose batches
//!   would not fit is not committed and runs again later (`crate::act::outbox::QueueBounds`), which
//!   is upstream's "queue full: do not record as reported".
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nicmon_proto::client::PlatformConnectorClient;
use nicmon_proto::datamodels as pb;
use prost::Message;
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::SendError;
use super::convert::to_proto_batch;
use super::grpc::{TokenSource, describe};
use crate::config::upstream::{go_bool, go_duration};
use crate::model::event::HealthEvent;

pub const ENV_TARGET: &str = "HEALTH_PUBLISH_TARGET";
pub const ENV_TOKEN_PATH: &str = "HEALTH_PUBLISH_TOKEN_PATH";
pub const ENV_TLS_CA_FILE: &str = "HEALTH_PUBLISH_TLS_CA_FILE";
pub const ENV_TLS_SERVER_NAME: &str = "HEALTH_PUBLISH_TLS_SERVER_NAME";
pub const ENV_INSECURE: &str = "HEALTH_PUBLISH_INSECURE";
pub const ENV_RETRY_WINDOW: &str = "HEALTH_PUBLISH_RETRY_WINDOW";
pub const ENV_QUEUE_MAX_BATCHES: &str = "HEALTH_PUBLISH_QUEUE_MAX_BATCHES";
pub const ENV_QUEUE_MAX_BYTES: &str = "HEALTH_PUBLISH_QUEUE_MAX_BYTES";

/// The gRPC metadata key the deployment platform connector requires on every direct send.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The server's default receive limit: a larger batch would be refused on every attempt.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// How the connection is secured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// TLS, the server certificate verified against `ca_file` for `server_name`. The CA file
    /// is read again whenever a connection is opened, so a rotated CA is picked up.
    Tls { ca_file: PathBuf, server_name: String },
    /// Plaintext (`HEALTH_PUBLISH_INSECURE=true` without a CA file): development only, the
    /// token crosses the network in the clear.
    Insecure,
}

/// Upstream's bounded queue when `HEALTH_PUBLISH_QUEUE_MAX_BATCHES` is unset.
pub const DEFAULT_QUEUE_MAX_BATCHES: usize = 1024;
/// Upstream's bounded queue when `HEALTH_PUBLISH_QUEUE_MAX_BYTES` is unset.
pub const DEFAULT_QUEUE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// A `HEALTH_PUBLISH_*` variable with a value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct EnvError {
    pub var: &'static str,
    pub value: String,
    pub why: String,
}

/// Everything the direct sink needs; [`DirectConfig::from_env`] reads it as upstream does.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectConfig {
    /// `HEALTH_PUBLISH_TARGET` as given.
    pub target: String,
    /// `host:port` to connect to.
    pub authority: String,
    pub transport: Transport,
    /// `HEALTH_PUBLISH_TOKEN_PATH`, re-read for every call (the kubelet rotates it).
    pub token: TokenSource,
    pub retry_window: Duration,
    /// `HEALTH_PUBLISH_QUEUE_MAX_BATCHES` and `HEALTH_PUBLISH_QUEUE_MAX_BYTES`: the bound the
    /// outbox keeps to (`crate::act::outbox::QueueBounds::for_sink`).
    pub queue_max_batches: usize,
    pub queue_max_bytes: usize,
    pub initial_backoff: Duration,
    pub backoff_factor: f64,
    pub backoff_jitter: f64,
    pub max_backoff: Duration,
    /// Bound of one call (the server writes to its datastore inside it).
    pub rpc_timeout: Duration,
    /// The last attempt of a window starts at least this long before its end.
    pub final_attempt_window: Duration,
}

impl DirectConfig {
    /// The direct-mode configuration from the environment (`get` looks a variable up), or
    /// `None` when `HEALTH_PUBLISH_TARGET` is unset or empty (socket mode). Every value is
    /// checked here, so a bad one stops the start rather than the first send.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<DirectConfig>, EnvError> {
        let var = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let Some(target) = var(ENV_TARGET) else {
            return Ok(None);
        };
        let err =
            |var: &'static str, value: &str, why: &str| EnvError { var, value: value.to_string(), why: why.into() };

        let authority = authority_of(&target).ok_or_else(|| err(ENV_TARGET, &target, "expected host:port"))?;
        let final_attempt_window = Duration::from_secs(1);
        let retry_window = match var(ENV_RETRY_WINDOW) {
            None => Duration::from_secs(300),
            Some(raw) => {
                let d = go_duration(&raw).map_err(|e| err(ENV_RETRY_WINDOW, &raw, &e.to_string()))?;
                if d <= final_attempt_window {
                    return Err(err(ENV_RETRY_WINDOW, &raw, "must be longer than 1s (the final attempt's share)"));
                }
                d
            }
        };
        let positive = |name: &'static str, default: usize| -> Result<usize, EnvError> {
            match var(name) {
                None => Ok(default),
                Some(raw) => match raw.parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(err(name, &raw, "must be a positive integer")),
                },
            }
        };
        let queue_max_batches = positive(ENV_QUEUE_MAX_BATCHES, DEFAULT_QUEUE_MAX_BATCHES)?;
        let queue_max_bytes = positive(ENV_QUEUE_MAX_BYTES, DEFAULT_QUEUE_MAX_BYTES)?;
        if queue_max_bytes < MAX_MESSAGE_BYTES {
            let raw = queue_max_bytes.to_string();
            return Err(err(
                ENV_QUEUE_MAX_BYTES,
                &raw,
                "below the 4194304-byte message limit: no full batch would fit",
            ));
        }
        // The server accepts no batch without a token: missing is a start-up error.
        let token_path = var(ENV_TOKEN_PATH).ok_or_else(|| {
            err(ENV_TOKEN_PATH, "", &format!("required when {ENV_TARGET} is set: every direct send carries a token"))
        })?;
        let insecure = match var(ENV_INSECURE) {
            None => false,
            Some(raw) => go_bool(&raw).map_err(|e| err(ENV_INSECURE, &raw, &e.to_string()))?,
        };
        let transport = match var(ENV_TLS_CA_FILE) {
            Some(ca) => {
                let server_name = match var(ENV_TLS_SERVER_NAME) {
                    Some(n) => n,
                    None => host_of(&authority).to_string(),
                };
                if server_name.is_empty() || server_name.contains(['/', ' ']) {
                    return Err(err(
                        ENV_TARGET,
                        &target,
                        &format!("no TLS server name in it: set {ENV_TLS_SERVER_NAME}"),
                    ));
                }
                read_ca(&PathBuf::from(&ca)).map_err(|why| err(ENV_TLS_CA_FILE, &ca, &why.to_string()))?;
                Transport::Tls { ca_file: PathBuf::from(ca), server_name }
            }
            None if insecure => Transport::Insecure,
            None => {
                return Err(err(
                    ENV_TLS_CA_FILE,
                    "",
                    &format!("required unless {ENV_INSECURE}=true: the token must not cross the network in plaintext"),
                ));
            }
        };
        Ok(Some(DirectConfig {
            target,
            authority,
            transport,
            token: TokenSource::file(token_path),
            retry_window,
            queue_max_batches,
            queue_max_bytes,
            initial_backoff: Duration::from_secs(2),
            backoff_factor: 1.5,
            backoff_jitter: 0.1,
            max_backoff: Duration::from_secs(30),
            rpc_timeout: Duration::from_secs(30),
            final_attempt_window,
        }))
    }

    /// The process environment's direct-mode configuration.
    pub fn from_process_env() -> Result<Option<DirectConfig>, EnvError> {
        DirectConfig::from_env(|name| std::env::var(name).ok())
    }
}

/// `host:port` of a gRPC target: a resolver scheme (`dns:///`) is stripped; a target without
/// a port gets gRPC's default, 443.
fn authority_of(target: &str) -> Option<String> {
    let mut rest = target;
    if let Some(i) = rest.find("://") {
        rest = &rest[i + 3..];
        if let Some(slash) = rest.rfind('/') {
            rest = &rest[slash + 1..];
        }
    }
    if rest.is_empty() || rest.contains(['/', ' ', '@', '?', '#']) {
        return None;
    }
    let has_port = match rest.rsplit_once(':') {
        Some((host, port)) => {
            // `[v6]:port`, or `host:port`; a bare IPv6 address has more than one colon.
            let v6_bare = !host.starts_with('[') && host.contains(':');
            if v6_bare {
                false
            } else {
                if host.is_empty() || port.parse::<u16>().is_err() {
                    return None;
                }
                true
            }
        }
        None => false,
    };
    Some(match has_port {
        true => rest.to_string(),
        false if rest.contains(':') && !rest.starts_with('[') => format!("[{rest}]:443"),
        false => format!("{rest}:443"),
    })
}

/// The host part of `host:port` (brackets of an IPv6 address removed).
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The most nicmon reads of a CA bundle (a system bundle of every public CA is ~200 KiB).
const CA_MAX_BYTES: usize = 4 << 20;

/// The CA bundle, checked to hold at least one PEM certificate.
/// Why a CA bundle cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    #[error("cannot read the CA bundle: {0}")]
    Read(crate::model::ReadError),
    #[error("no PEM certificate in the CA bundle")]
    NoPem,
}

/// Why the direct connection cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{ENV_TARGET} {target:?}: {error}")]
    Target { target: String, error: tonic::transport::Error },
    #[error("{}: {error}", .path.display())]
    Ca { path: PathBuf, error: CaError },
    #[error("TLS settings for {uri}: {error}")]
    Tls { uri: String, error: tonic::transport::Error },
}

fn read_ca(path: &std::path::Path) -> Result<Vec<u8>, CaError> {
    // Only a regular file, bounded, under a deadline (a FIFO named here must not block).
    let pem = crate::read::host::read_file(path, CA_MAX_BYTES).map_err(CaError::Read)?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(CaError::NoPem);
    }
    Ok(pem)
}

/// The batch's idempotency key: derived from its content (the events as persisted in the
/// outbox), so every retry, also after a restart, carries the same key, and two batches that
/// differ in anything carry different ones. Within the server's `^[A-Za-z0-9._:-]{1,128}$`.
pub fn idempotency_key(events: &[HealthEvent]) -> String {
    let mut h = Sha256::new();
    // HealthEvent serializes deterministically (ordered maps), unlike the wire message.
    h.update(serde_json::to_vec(events).unwrap_or_default());
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("nicmon-{hex}")
}

/// Whether the server would answer `code` the same way on every retry of the batch.
pub fn is_permanent_rejection(code: Code) -> bool {
    matches!(code, Code::InvalidArgument | Code::PermissionDenied | Code::Unimplemented)
}

enum Failure {
    Permanent(tonic::Status),
    Retryable(String),
}

/// A client of the deployment platform connector.
pub struct DirectSink {
    config: DirectConfig,
    client: Option<PlatformConnectorClient<Channel>>,
}

impl DirectSink {
    pub fn new(config: DirectConfig) -> DirectSink {
        DirectSink { config, client: None }
    }

    pub fn config(&self) -> &DirectConfig {
        &self.config
    }

    /// Deliver `events` as one batch within one retry window. `Ok(())`: the server stored it.
    pub async fn send(&mut self, events: &[HealthEvent]) -> Result<(), SendError> {
        if events.is_empty() {
            return Ok(());
        }
        let batch = to_proto_batch(events);
        let bytes = batch.encoded_len();
        if bytes > MAX_MESSAGE_BYTES {
            return Err(SendError::TooLarge { bytes, limit: MAX_MESSAGE_BYTES });
        }
        let key = idempotency_key(events);
        let c = &self.config;
        let deadline = Instant::now() + c.retry_window;
        let mut backoff = c.initial_backoff;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let last = match self.call(&batch, &key, self.config.rpc_timeout.min(remaining)).await {
                Ok(()) => return Ok(()),
                Err(Failure::Permanent(status)) => {
                    return Err(SendError::Rejected { code: status.code(), message: status.message().to_string() });
                }
                Err(Failure::Retryable(why)) => why,
            };
            let c = &self.config;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining <= c.final_attempt_window {
                return Err(SendError::Unavailable {
                    target: c.target.clone(),
                    attempts,
                    last: format!("retry window of {:?} ended; last error: {last}", c.retry_window),
                });
            }
            tracing::debug!(attempt = attempts, key = %key, "direct send failed, retrying: {last}");
            let jittered = backoff.mul_f64(1.0 + c.backoff_jitter * fastrand::f64());
            tokio::time::sleep(jittered.min(remaining - c.final_attempt_window)).await;
            backoff = backoff.mul_f64(c.backoff_factor).min(c.max_backoff);
        }
    }

    async fn call(&mut self, batch: &pb::HealthEvents, key: &str, timeout: Duration) -> Result<(), Failure> {
        // A token that cannot be read now may be readable after the kubelet's next rotation:
        // retried, as upstream retries auth failures.
        let auth = self.config.token.authorization().map_err(|e| Failure::Retryable(e.to_string()))?;
        if self.client.is_none() {
            self.client = Some(self.open().map_err(|e| Failure::Retryable(e.to_string()))?);
        }
        let client = self.client.as_mut().expect("opened above");
        let mut request = tonic::Request::new(batch.clone());
        request.set_timeout(timeout);
        if let Some(value) = auth {
            request.metadata_mut().insert("authorization", value);
        }
        let key = key.parse().map_err(|_| Failure::Retryable(format!("idempotency key {key:?} is not ASCII")))?;
        request.metadata_mut().insert(IDEMPOTENCY_KEY, key);
        match tokio::time::timeout(timeout, client.health_event_occurred_v1(request)).await {
            Err(_) => {
                self.client = None;
                Err(Failure::Retryable(format!("no answer within {timeout:?} (deadline exceeded)")))
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) if is_permanent_rejection(status.code()) => Err(Failure::Permanent(status)),
            Ok(Err(status)) => {
                // Open a fresh connection (and re-read the CA) for the next attempt.
                self.client = None;
                Err(Failure::Retryable(describe(&status)))
            }
        }
    }

    /// A lazily connecting channel to the target (connected by the first call).
    fn open(&self) -> Result<PlatformConnectorClient<Channel>, OpenError> {
        let c = &self.config;
        let scheme = match c.transport {
            Transport::Tls { .. } => "https",
            Transport::Insecure => "http",
        };
        let uri = format!("{scheme}://{}", c.authority);
        let mut endpoint = Endpoint::from_shared(uri.clone())
            .map_err(|error| OpenError::Target { target: c.target.to_string(), error })?
            .connect_timeout(c.rpc_timeout.min(Duration::from_secs(20)));
        if let Transport::Tls { ca_file, server_name } = &c.transport {
            let pem = read_ca(ca_file).map_err(|error| OpenError::Ca { path: ca_file.clone(), error })?;
            let tls =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)).domain_name(server_name.clone());
            endpoint = endpoint.tls_config(tls).map_err(|error| OpenError::Tls { uri: uri.clone(), error })?;
        }
        let client =
            PlatformConnectorClient::new(endpoint.connect_lazy()).max_encoding_message_size(MAX_MESSAGE_BYTES + 1024);
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::event::{Check, Stamp};

    use nicmon_tests::blocking::{fifo_in, promptly};

    /// A FIFO named as the CA bundle is refused before it is opened.
    #[test]
    fn a_fifo_ca_bundle_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_in(dir.path(), "ca.pem");
        let why = promptly(move || read_ca(&fifo)).unwrap_err().to_string();
        assert!(why.contains("not a regular file (a FIFO)"), "{why}");
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    fn ca_file() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
        let p = path.to_str().unwrap().to_string();
        (dir, p)
    }

    #[test]
    fn no_target_is_socket_mode() {
        assert_eq!(DirectConfig::from_env(env(&[])), Ok(None));
        assert_eq!(DirectConfig::from_env(env(&[(ENV_TARGET, "  ")])), Ok(None));
    }

    #[test]
    fn upstream_chart_settings() {
        let (_dir, ca) = ca_file();
        let c = DirectConfig::from_env(env(&[
            (ENV_TARGET, "platform-connector-deployment.nvsentinel.svc.cluster.local:50051"),
            (ENV_TOKEN_PATH, "/var/run/secrets/nvsentinel/token"),
            (ENV_TLS_CA_FILE, &ca),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.authority, "platform-connector-deployment.nvsentinel.svc.cluster.local:50051");
        assert_eq!(
            c.transport,
            Transport::Tls {
                ca_file: ca.clone().into(),
                server_name: "platform-connector-deployment.nvsentinel.svc.cluster.local".into()
            }
        );
        assert_eq!(c.token, TokenSource::file("/var/run/secrets/nvsentinel/token"));
        assert_eq!(c.retry_window, Duration::from_secs(300));
        assert_eq!((c.queue_max_batches, c.queue_max_bytes), (1024, 67_108_864));

        let c = DirectConfig::from_env(env(&[
            (ENV_TARGET, "dns:///pc.example:443"),
            (ENV_TOKEN_PATH, "/t"),
            (ENV_INSECURE, "true"),
            (ENV_RETRY_WINDOW, "90s"),
            (ENV_QUEUE_MAX_BATCHES, "8"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((c.authority.as_str(), &c.transport), ("pc.example:443", &Transport::Insecure));
        assert_eq!((c.retry_window, c.queue_max_batches), (Duration::from_secs(90), 8));
    }

    #[test]
    fn bad_settings_name_the_variable() {
        let (_dir, ca) = ca_file();
        let base = [(ENV_TARGET, "pc:50051"), (ENV_TOKEN_PATH, "/t"), (ENV_TLS_CA_FILE, ca.as_str())];
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[(ENV_TARGET, "pc:50051"), (ENV_TLS_CA_FILE, ca.as_str())], ENV_TOKEN_PATH),
            (&[(ENV_TARGET, "pc:50051"), (ENV_TOKEN_PATH, "/t")], ENV_TLS_CA_FILE),
            (&[(ENV_TARGET, "pc:50051"), (ENV_TOKEN_PATH, "/t"), (ENV_INSECURE, "yes")], ENV_INSECURE),
            (
                &[(ENV_TARGET, "pc:50051"), (ENV_TOKEN_PATH, "/t"), (ENV_TLS_CA_FILE, "/nonexistent/ca.crt")],
                ENV_TLS_CA_FILE,
            ),
            (&[(ENV_TARGET, "pc:notaport"), (ENV_TOKEN_PATH, "/t"), (ENV_INSECURE, "true")], ENV_TARGET),
        ];
        for (vars, var) in cases {
            let e = DirectConfig::from_env(env(vars)).unwrap_err();
            assert_eq!(e.var, *var, "{e}");
            assert!(e.to_string().starts_with(var), "{e}");
        }
        for (var, value) in [
            (ENV_RETRY_WINDOW, "1s"),
            (ENV_RETRY_WINDOW, "5"),
            (ENV_QUEUE_MAX_BATCHES, "0"),
            (ENV_QUEUE_MAX_BYTES, "-1"),
            (ENV_QUEUE_MAX_BYTES, "1024"),
        ] {
            let mut vars = base.to_vec();
            vars.push((var, value));
            let e = DirectConfig::from_env(env(&vars)).unwrap_err();
            assert_eq!((e.var, e.value.as_str()), (var, value), "{e}");
        }
    }

    #[test]
    fn authorities() {
        for (target, want) in [
            ("pc:50051", Some("pc:50051")),
            ("pc", Some("pc:443")),
            ("dns:///pc.ns.svc:50051", Some("pc.ns.svc:50051")),
            ("10.0.0.1:50051", Some("10.0.0.1:50051")),
            ("[::1]:50051", Some("[::1]:50051")),
            ("::1", Some("[::1]:443")),
            ("pc:99999", None),
            (":50051", None),
            ("a b:1", None),
        ] {
            assert_eq!(authority_of(target).as_deref(), want, "{target}");
        }
        assert_eq!(host_of("[::1]:50051"), "::1");
        assert_eq!(host_of("pc.ns:50051"), "pc.ns");
    }

    fn batch(id: u64, text: &str) -> crate::act::outbox::PendingBatch {
        let ev =
            HealthEvent::new(Check::InfiniBandStateCheck, &Stamp::default(), time::OffsetDateTime::UNIX_EPOCH, text);
        crate::act::outbox::PendingBatch { id, check: Check::InfiniBandStateCheck, events: vec![ev] }
    }

    #[test]
    fn keys_are_stable_per_batch_and_differ_between_batches() {
        let a = batch(1, "mlx5_0 port 1 down");
        let b = batch(2, "mlx5_1 port 1 down");
        let key = idempotency_key(&a.events);
        assert_eq!(key, idempotency_key(&a.clone().events));
        assert_ne!(key, idempotency_key(&b.events));
        assert!(key.len() <= 128 && key.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c)), "{key}");
    }

    #[test]
    fn rejections_for_good() {
        for code in [Code::InvalidArgument, Code::PermissionDenied, Code::Unimplemented] {
            assert!(is_permanent_rejection(code), "{code:?}");
        }
        for code in [Code::Unavailable, Code::Unauthenticated, Code::ResourceExhausted, Code::Internal, Code::Unknown] {
            assert!(!is_permanent_rejection(code), "{code:?}");
        }
    }
}
