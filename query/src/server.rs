//! Running the query port and the admin port of a replica.
//!
//! The gRPC server carries `PrefixIndex`, the `Echo` benchmark baseline, `grpc.health.v1`
//! (driven by [`Readiness`]) and server reflection (v1 and v1alpha, so `grpcurl` works without
//! `.proto` files), optionally over TLS or mutual TLS.
//!
//! The port's HTTP/2 connections are bounded ([`H2_MAX_CONCURRENT_STREAMS`] streams each,
//! keepalive pings every [`H2_KEEPALIVE_INTERVAL`], a connection that does not answer one within
//! [`H2_KEEPALIVE_TIMEOUT`] closed) and get windows large enough for the stream protocols' own
//! bursts ([`H2_CONNECTION_WINDOW`], [`H2_STREAM_WINDOW`]): h2 closes a connection with
//! ENHANCE_YOUR_CALM when more small DATA frames wait unread than half its connection window
//! pays for, so a small window loses a fast publisher's connection during a pause of its reader.

use crate::admin::AdminPort;
use crate::extension::{ExtensionContext, Extensions};
use crate::health::Readiness;
use crate::metrics::{QueryMetrics, StateCollector};
use crate::service::{QueryConfig, QueryService, ReplicaInfo, ReplicaView};
use crate::status::ReplicaStatus;
use parking_lot::Mutex;
use prefixlog_engine::Engine;
use prefixlog_proto::v1::echo_server::{Echo, EchoServer};
use prefixlog_proto::v1::prefix_index_server::PrefixIndexServer;
use prefixlog_proto::v1::EchoMessage;
use prefixlog_state::Applier;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tonic::codegen::http;
use tonic::{Request, Response, Status};

/// Streams one connection of the query port may have open at once.
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Idle connections are pinged this often…
pub const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// …and closed when a ping is not answered within this.
pub const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 connection window (bytes a client may send unread on one connection). h2's budget
/// of small DATA frames waiting unread is half of it: 8 MiB, about 40,000 frames of an SMG
/// update's size, which a publisher does not reach while its stream is being read.
pub const H2_CONNECTION_WINDOW: u32 = 16 << 20;
/// HTTP/2 stream window (bytes unread on one stream). Small enough that one stream of the
/// smallest messages (about 20 bytes a DATA frame, each charged 256 less its size) cannot
/// exhaust the connection's budget of small frames on its own (512 KiB / 20 × 236 ≈ 6 MiB).
pub const H2_STREAM_WINDOW: u32 = 512 << 10;

/// Connections the query port keeps open at once, in all and per peer address (one more is
/// closed at once). Gateways and publishers hold a few long-lived connections each.
pub const QUERY_PORT_CONNECTIONS: crate::listen::ConnLimits = crate::listen::ConnLimits {
    header_timeout: crate::listen::DEFAULT_HEADER_TIMEOUT,
    max_connections: 4096,
    max_connections_per_peer: 256,
};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// gRPC listen address (port 0: any free port; see [`RunningServer::grpc_addr`]).
    pub grpc_addr: SocketAddr,
    /// Admin HTTP listen address; `None` runs no admin port.
    pub admin_addr: Option<SocketAddr>,
    /// Caught up (SERVING, `/readyz` 200) at total lag ≤ this many records.
    pub ready_lag: i64,
    /// Answers without a consistency token say `stale` once the broker has not answered for
    /// longer than this ([`crate::health`]).
    pub stale_after: Duration,
    pub query: QueryConfig,
    /// Serve gRPC over TLS (and require client certificates when `client_ca` is set: mTLS).
    pub tls: Option<TlsFiles>,
    /// More services on this port (the protocol facades).
    pub extensions: Extensions,
}

/// PEM files for the gRPC port.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// With a client CA, only clients presenting a certificate it signed may connect (mTLS).
    pub client_ca: Option<std::path::PathBuf>,
}

/// Why the query server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("registering the query metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("binding the {what} port {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading TLS file {}: {source}", .path.display())]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS on the gRPC port: {0}")]
    Tls(#[from] tonic::transport::Error),
    #[error("adding the {service} service to the query port: {source}")]
    Extension {
        service: String,
        #[source]
        source: crate::extension::ExtensionError,
    },
}

impl TlsFiles {
    fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, ServerError> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|source| ServerError::TlsFile { path: p.to_path_buf(), source })
        };
        let identity = tonic::transport::Identity::from_pem(read(&self.cert)?, read(&self.key)?);
        let mut cfg = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            cfg = cfg.client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?));
        }
        Ok(cfg)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            grpc_addr: ([127, 0, 0, 1], 50151).into(),
            admin_addr: Some(([127, 0, 0, 1], 9151).into()),
            ready_lag: 1000,
            stale_after: crate::health::DEFAULT_STALE_AFTER,
            query: QueryConfig::default(),
            tls: None,
            extensions: Extensions::default(),
        }
    }
}

/// The benchmark baseline: returns its input.
#[derive(Clone, Copy, Default)]
pub struct EchoService;

#[tonic::async_trait]
impl Echo for EchoService {
    async fn echo(&self, request: Request<EchoMessage>) -> Result<Response<EchoMessage>, Status> {
        Ok(Response::new(request.into_inner()))
    }
}

/// tonic refuses a request over `max_decoding_message_size` with OUT_OF_RANGE; the gRPC
/// convention (grpc-go, grpc-java) and our API contract say RESOURCE_EXHAUSTED. The refusal is
/// a trailers-only response, so the status is in the headers and can be rewritten here.
fn oversize_is_resource_exhausted<B>(mut r: http::Response<B>) -> http::Response<B> {
    let h = r.headers_mut();
    let oversize = h.get("grpc-status").is_some_and(|v| v == "11")
        && h.get("grpc-message").and_then(|m| m.to_str().ok()).is_some_and(|m| {
            m.contains("message%20length%20too%20large") || m.contains("message length too large")
        });
    if oversize {
        h.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    r
}

/// A running query server. Dropping it (or [`RunningServer::kill`]) stops accepting, sends
/// every connection a GOAWAY and stops the admin port and health updates.
pub struct RunningServer {
    pub grpc_addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub readiness: Arc<Readiness>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    grpc: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    admin: Option<AdminPort>,
}

/// What the server serves: one replica's state, and the registry its metrics go to.
pub struct Served {
    pub engine: Arc<Engine>,
    pub status: Arc<ReplicaStatus>,
    /// Per-reason skip counts and announced workers; without it those are empty.
    pub applier: Option<Arc<Mutex<Applier>>>,
    pub info: ReplicaInfo,
    pub registry: prometheus::Registry,
    /// An admin port bound earlier (serving `registry` already, e.g. during a restore): the
    /// server switches its `/readyz` to the replica's readiness instead of binding
    /// [`ServerConfig::admin_addr`].
    pub admin: Option<AdminPort>,
}

impl Served {
    /// An engine served on its own, with every partition owned and nothing ingesting (tests of
    /// the query port, benchmarks of the query path).
    pub fn engine_only(engine: Arc<Engine>, replica_id: &str) -> Self {
        let partitions = engine.config().partitions;
        let owned: Vec<u32> = (0..partitions).collect();
        Self {
            status: Arc::new(ReplicaStatus::new(partitions, &owned)),
            engine,
            applier: None,
            info: ReplicaInfo {
                replica_id: replica_id.to_string(),
                topic: String::new(),
                partition_count: partitions,
                owned,
                shard: (0, 1),
                peers: Vec::new(),
            },
            registry: prometheus::Registry::new(),
            admin: None,
        }
    }
}

impl RunningServer {
    /// Stops accepting and lets in-flight calls finish, for at most `grace`; then drops the rest.
    pub async fn shutdown(mut self, grace: Duration) {
        self.readiness.set_stopping();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(g) = self.grpc.take() {
            let abort = g.abort_handle();
            if tokio::time::timeout(grace, g).await.is_err() {
                tracing::warn!(
                    ?grace,
                    "in-flight queries did not finish within the grace period; dropping them"
                );
                abort.abort();
            }
        }
        self.kill();
    }

    pub fn kill(&mut self) {
        // tonic serves each connection on its own task, so aborting the accept loop alone
        // would leave open connections answering; the shutdown signal closes them too.
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.admin = None;
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Binds both ports and starts serving on the current tokio runtime.
pub async fn start(cfg: ServerConfig, served: Served) -> Result<RunningServer, ServerError> {
    let Served { engine, status, applier, info, registry, admin } = served;
    let readiness = Arc::new(Readiness::new(status.clone(), cfg.ready_lag, cfg.stale_after));
    let query_metrics = Arc::new(QueryMetrics::new(&registry)?);
    registry.register(Box::new(StateCollector::new(
        engine.clone(),
        status.clone(),
        applier.clone(),
        readiness.clone(),
    )))?;
    registry.register(Box::new(status.apply_latency.clone()))?;
    let (reporter, health) = tonic_health::server::health_reporter();

    let extension_schemas: Vec<&'static [u8]> =
        cfg.extensions.0.iter().filter_map(|e| e.file_descriptor_set()).collect();
    let reflection = || {
        let b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(prefixlog_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        extension_schemas.iter().fold(b, |b, fds| b.register_encoded_file_descriptor_set(fds))
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let max_msg = cfg.query.max_decoding_message_size;
    let view = ReplicaView { engine, status, applier, info: Arc::new(info), readiness: readiness.clone() };
    let svc = QueryService::new(view, cfg.query, query_metrics);
    let mut routes = tonic::service::RoutesBuilder::default();
    routes
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(PrefixIndexServer::new(svc.clone()).max_decoding_message_size(max_msg))
        .add_service(EchoServer::new(EchoService));
    let ctx = ExtensionContext { query: &svc, registry: &registry };
    for ext in &cfg.extensions.0 {
        ext.add_to(&ctx, &mut routes)
            .map_err(|source| ServerError::Extension { service: ext.service_name().into(), source })?;
        readiness.add_health_service(ext.service_name());
        tracing::info!(service = ext.service_name(), "serving on the query port too");
    }
    // Started once nothing above can fail any more (a refused extension leaves no task behind).
    let tasks = vec![tokio::spawn(readiness.clone().drive(reporter, Duration::from_millis(50)))];

    let bind = |source| ServerError::Bind { what: "gRPC", addr: cfg.grpc_addr, source };
    let listener = tokio::net::TcpListener::bind(cfg.grpc_addr).await.map_err(bind)?;
    let grpc_addr = listener.local_addr().map_err(bind)?;
    // Nagle would add up to 40 ms to small responses on some stacks; queries are latency-bound.
    let refused = crate::listen::counted_refusals(&registry, "query");
    let incoming = crate::listen::admitted(listener, QUERY_PORT_CONNECTIONS, "query", refused);
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &cfg.tls {
        builder = builder.tls_config(tls.server_config()?)?;
    }
    let router = builder
        .tcp_nodelay(true)
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .http2_keepalive_interval(Some(H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(H2_KEEPALIVE_TIMEOUT))
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .layer(tower::util::MapResponseLayer::new(oversize_is_resource_exhausted))
        .add_routes(routes.routes());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Kept apart from `tasks`: aborting it would drop the shutdown before connections are told
    // to go, so it is only awaited (graceful) or left to end with its shutdown signal.
    let grpc = tokio::spawn(async move {
        let signal = async move {
            let _ = stopped.await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, signal).await {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });

    let admin =
        match (admin, cfg.admin_addr) {
            (Some(port), _) => Some(port),
            (None, Some(a)) => Some(
                AdminPort::bind(a, registry, readiness.clone())
                    .await
                    .map_err(|source| ServerError::Bind { what: "admin", addr: a, source })?,
            ),
            (None, None) => None,
        };
    if let Some(port) = &admin {
        port.serve_readiness(readiness.clone());
    }
    let admin_addr = admin.as_ref().map(AdminPort::addr);
    tracing::info!(%grpc_addr, admin = ?admin_addr, "query service listening");
    Ok(RunningServer { grpc_addr, admin_addr, readiness, stop: Some(stop), grpc: Some(grpc), tasks, admin })
}
