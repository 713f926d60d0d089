//! The HTTP server (axum, HTTP/1) and the extension that runs it on a port of its own next to
//! a replica. Every request to `/query`, `/query_by_hash` and `/workers` is counted by route and
//! outcome (`prefixlog_facade_requests_total{protocol="dynamo-http"|"mooncake-http"}`).

use super::limit::{in_flight_gauge, limit, Gate, Limits};
use super::reader::{QueryError, Reader};
use super::wire::{json, ErrorBody};
use super::workers::WorkersQuery;
use super::{Dialect, MAX_BODY_BYTES};
use crate::metrics::FacadeMetrics;
use crate::start::{every_partition, StartError};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{middleware, Router};
use parking_lot::Mutex;
use prefixlog_query::extension::{Extension, ExtensionContext, ExtensionError};
use prefixlog_query::QueryService;
use serde::Serialize;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use tokio::task::AbortHandle;
use tonic::service::RoutesBuilder;

/// How start-up errors name this facade.
const FACADE: &str = "the HTTP indexer facade (--http-indexer-addr)";

struct App {
    reader: Reader,
    metrics: FacadeMetrics,
}

/// The routes of `dialect`: `POST /query`, `POST /query_by_hash` (Mooncake: 501, see
/// [`QueryError::SeqHashes`]), `GET /workers` (Dynamo's shape in both), `GET /health`; all but
/// `/health` are bounded by `gate` (requests in flight, time per request: [`super::limit`]).
pub fn router(query: QueryService, metrics: FacadeMetrics, gate: Gate, dialect: Dialect) -> Router {
    let app = Arc::new(App { reader: Reader::new(query), metrics });
    let routes = match dialect {
        Dialect::Dynamo => {
            Router::new().route("/query", post(query_tokens)).route("/query_by_hash", post(query_hashes))
        }
        Dialect::Mooncake => Router::new()
            .route("/query", post(query_mooncake))
            .route("/query_by_hash", post(query_seq_hashes)),
    };
    routes
        .route("/workers", get(list_workers))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Outermost: a permit is taken before the body is read.
        .layer(middleware::from_fn_with_state(gate, limit))
        .route("/health", get(|| async { json(StatusCode::OK, &serde_json::json!({"status": "ok"})) }))
        .with_state(app)
}

async fn query_tokens(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match parse(&body) {
        Ok(req) => app.reader.query(req).await,
        Err(e) => Err(e),
    };
    app.respond("query", r)
}

async fn query_hashes(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match parse(&body) {
        Ok(req) => app.reader.query_by_hash(req).await,
        Err(e) => Err(e),
    };
    app.respond("query_by_hash", r)
}

async fn query_mooncake(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match parse(&body) {
        Ok(req) => app.reader.query_mooncake(req).await,
        Err(e) => Err(e),
    };
    app.respond("query", r)
}

/// Refused without reading the body: whatever it holds, the hashes cannot be matched.
async fn query_seq_hashes(State(app): State<Arc<App>>) -> Response {
    app.respond::<()>("query_by_hash", Err(QueryError::SeqHashes))
}

async fn list_workers(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let q = WorkersQuery::parse(q.as_deref().unwrap_or(""));
    app.respond("workers", app.reader.workers(&q))
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, QueryError> {
    serde_json::from_slice(body).map_err(|e| QueryError::Body(e.to_string()))
}

impl App {
    fn respond<T: Serialize>(&self, route: &str, r: Result<T, QueryError>) -> Response {
        self.metrics.request(route, r.as_ref().err().map_or(tonic::Code::Ok, QueryError::code));
        match r {
            Ok(body) => json(StatusCode::OK, &body),
            Err(e) => json(e.http_status(), &ErrorBody { error: &e.to_string() }),
        }
    }
}

/// Serves [`router`] on its own port for as long as the replica runs
/// (`prefixlog serve --http-indexer-addr ... [--http-dialect mooncake]`). It adds no gRPC routes
/// to the query port; it is an extension to be built from the replica's `QueryService` and
/// metrics registry.
pub struct HttpIndexerExtension {
    addr: SocketAddr,
    limits: Limits,
    dialect: Dialect,
    listener: Mutex<Option<TcpListener>>,
    task: Mutex<Option<AbortHandle>>,
}

impl HttpIndexerExtension {
    /// Binds `addr` now, so a taken port fails the start before the replica restores its state
    /// (port 0: any free port, see [`Self::addr`]).
    pub fn bind(addr: SocketAddr) -> Result<Self, StartError> {
        let listener = TcpListener::bind(addr).map_err(|source| StartError::Bind {
            facade: FACADE,
            what: "HTTP",
            addr,
            source,
        })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            facade: FACADE,
            what: "HTTP",
            addr,
            source,
        })?;
        Ok(Self {
            addr,
            limits: Limits::default(),
            dialect: Dialect::default(),
            listener: Mutex::new(Some(listener)),
            task: Mutex::default(),
        })
    }

    /// Other bounds than the defaults (64 requests in flight, 10 s per request).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Another dialect than Dynamo's.
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Extension for HttpIndexerExtension {
    /// Reported by the query port's `grpc.health.v1` with the replica's readiness, as every
    /// extension is (this one is HTTP: the name only identifies it there).
    fn service_name(&self) -> &str {
        "prefixlog.facades.DynamoHttpIndexer"
    }

    fn add_to(&self, ctx: &ExtensionContext<'_>, _: &mut RoutesBuilder) -> Result<(), ExtensionError> {
        every_partition(ctx, FACADE)?;
        let listener = self.listener.lock().take().ok_or(StartError::AlreadyServed { facade: FACADE })?;
        let bind = |source| StartError::Bind { facade: FACADE, what: "HTTP", addr: self.addr, source };
        listener.set_nonblocking(true).map_err(bind)?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(bind)?;
        let metrics_err = |source| StartError::Metrics { facade: FACADE, source };
        let protocol = self.dialect.protocol();
        let metrics = FacadeMetrics::new(ctx.registry, protocol).map_err(metrics_err)?;
        let in_flight = in_flight_gauge(ctx.registry, protocol).map_err(metrics_err)?;
        let gate = Gate::new(self.limits, metrics.clone(), in_flight);
        let app = router(ctx.query.clone(), metrics, gate, self.dialect);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "HTTP indexer facade stopped");
            }
        });
        *self.task.lock() = Some(task.abort_handle());
        Ok(())
    }
}

impl Drop for HttpIndexerExtension {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}
