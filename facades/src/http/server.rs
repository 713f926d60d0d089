//! The HTTP server (axum, HTTP/1) and the extension that runs it on a port of its own next to
//! a replica, under the connection bounds of `prefixlog_query::listen` (refusals counted as
//! `prefixlog_facade_skipped_total{reason="connections_total"|"connections_per_peer"}`). Every request but `/health` is bounded ([`super::limit`]) and counted by route
//! and outcome (`prefixlog_facade_requests_total{protocol="dynamo-http"|"mooncake-http"}`).
//!
//! Dynamo's routes read their bodies as axum's `Json` extractor does (`super::json_body`) and
//! query strings with its `Query`, as upstream's server does: a body without `Content-Type: application/json` is 415,
//! one that is not JSON 400, one of the wrong shape 422, each with axum's text; `/query` and
//! `/query_by_hash` take bodies up to 8 MiB, the other routes up to axum's default 2 MiB.

use super::feeds::EngineFeeds;
use super::json_body::UpstreamJson;
use super::limit::{in_flight_gauge, limit, BodyLimits, Gate, Limits};
use super::listeners::{Listeners, Live};
use super::reader::{QueryError, Reader};
use super::register::{RegisterError, Registrar};
use super::registration::Registration;
use super::wire::UnregisterRequest;
use super::wire::{
    json, json_sized, ok, ErrorBody, PeerRequest, QueryByHashRequest, QueryRequest, RegisterRequest,
    ScoreAnswer,
};
use super::workers::{WorkerInfo, WorkersQuery};
use super::{Dialect, MAX_BODY_BYTES};
use crate::metrics::FacadeMetrics;
use crate::start::{every_partition, StartError};
use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Router};
use parking_lot::Mutex;
use prefixlog_query::extension::{Extension, ExtensionContext, ExtensionError};
use prefixlog_query::listen::{ConnLimits, OnRefused};
use prefixlog_query::QueryService;
use serde::Serialize;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::AbortHandle;
use tonic::service::RoutesBuilder;

/// How start-up errors name this facade.
const FACADE: &str = "the HTTP indexer facade (--http-indexer-addr)";
/// How often the replica checks that it subscribes to exactly its registrations.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Most peers `/register_peer` keeps, and the longest URL it takes.
const MAX_PEERS: usize = 256;
const MAX_PEER_URL_BYTES: usize = 2048;

struct App {
    reader: Reader,
    metrics: FacadeMetrics,
    /// `/register` and `/unregister` (the Dynamo dialect with a publisher).
    registrar: Option<Arc<Registrar>>,
    /// `/register_peer`'s list: kept and listed, not used (replicas recover from the log).
    peers: Mutex<Vec<String>>,
}

/// The routes of `dialect`, all but `/health` bounded by `gate` (requests in flight, time per
/// request: [`super::limit`]). `registrar` serves `/register` and `/unregister` (Dynamo
/// dialect; without one they answer 501).
pub fn router(
    query: QueryService,
    metrics: FacadeMetrics,
    gate: Gate,
    dialect: Dialect,
    registrar: Option<Arc<Registrar>>,
) -> Router {
    let app = Arc::new(App { reader: Reader::new(query), metrics, registrar, peers: Mutex::default() });
    let routes = match dialect {
        Dialect::Dynamo => dynamo_routes(),
        Dialect::Mooncake => Router::new()
            .route("/query", post(query_mooncake))
            .route("/query_by_hash", post(query_seq_hashes))
            .route("/workers", get(list_workers))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES)),
    };
    let health = match dialect {
        Dialect::Dynamo => get(|| async { StatusCode::OK }),
        Dialect::Mooncake => get(|| async { json(StatusCode::OK, &serde_json::json!({"status": "ok"})) }),
    };
    routes
        // Outermost: the body is read (bounded), then a place is taken.
        .layer(middleware::from_fn_with_state(gate, limit))
        .route("/health", health)
        .with_state(app)
}

fn dynamo_routes() -> Router<Arc<App>> {
    let large = || DefaultBodyLimit::max(MAX_BODY_BYTES);
    Router::new()
        .route("/query", post(query_tokens).layer(large()))
        .route("/query_by_hash", post(query_hashes).layer(large()))
        .route("/workers", get(list_workers))
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/dump", get(dump))
        .route("/register_peer", post(register_peer))
        .route("/deregister_peer", post(deregister_peer))
        .route("/peers", get(list_peers))
        .route("/reopen_logs", post(|| async { ok(StatusCode::OK) }))
}

async fn query_tokens(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<QueryRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("query", e),
    };
    let r = app.reader.query(req).await;
    app.respond_score("query", r)
}

async fn query_hashes(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<QueryByHashRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("query_by_hash", e),
    };
    let r = app.reader.query_by_hash(req).await;
    app.respond_score("query_by_hash", r)
}

async fn query_mooncake(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let r = match serde_json::from_slice(&body) {
        Ok(req) => app.reader.query_mooncake(req).await,
        Err(e) => Err(QueryError::Body(e.to_string())),
    };
    app.respond("query", r)
}

/// Refused without reading the body: whatever it holds, the hashes cannot be matched.
async fn query_seq_hashes(State(app): State<Arc<App>>) -> Response {
    app.respond::<()>("query_by_hash", Err(QueryError::SeqHashes))
}

async fn list_workers(
    State(app): State<Arc<App>>,
    q: Result<Query<WorkersQuery>, QueryRejection>,
) -> Response {
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return app.rejected("workers", e),
    };
    let r = app.reader.ready().map(|()| app.workers(&q));
    app.respond("workers", r)
}

async fn register(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<RegisterRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("register", e),
    };
    let Some(registrar) = &app.registrar else { return app.no_registrar("register") };
    let r = registrar.register(req).await;
    app.written("register", r, StatusCode::CREATED)
}

async fn unregister(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<UnregisterRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("unregister", e),
    };
    let Some(registrar) = &app.registrar else { return app.no_registrar("unregister") };
    let r = registrar.unregister(req).await;
    app.written("unregister", r, StatusCode::OK)
}

async fn dump(State(app): State<Arc<App>>) -> Response {
    if let Err(e) = app.reader.ready() {
        return app.respond::<()>("dump", Err(e));
    }
    match super::dump::dump(app.reader.service()) {
        Ok(v) => app.respond::<serde_json::Value>("dump", Ok(v)),
        Err(e) => {
            app.metrics.request("dump", tonic::Code::ResourceExhausted);
            json(StatusCode::SERVICE_UNAVAILABLE, &ErrorBody { error: &e.to_string() })
        }
    }
}

async fn register_peer(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<PeerRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("peers", e),
    };
    let mut peers = app.peers.lock();
    if req.url.len() > MAX_PEER_URL_BYTES || (peers.len() >= MAX_PEERS && !peers.contains(&req.url)) {
        drop(peers);
        app.metrics.request("peers", tonic::Code::InvalidArgument);
        let msg = format!("at most {MAX_PEERS} peers of at most {MAX_PEER_URL_BYTES} bytes are kept");
        return json(StatusCode::BAD_REQUEST, &ErrorBody { error: &msg });
    }
    if !peers.contains(&req.url) {
        peers.push(req.url);
    }
    drop(peers);
    app.metrics.request("peers", tonic::Code::Ok);
    ok(StatusCode::CREATED)
}

async fn deregister_peer(
    State(app): State<Arc<App>>,
    body: Result<UpstreamJson<PeerRequest>, JsonRejection>,
) -> Response {
    let UpstreamJson(req) = match body {
        Ok(b) => b,
        Err(e) => return app.rejected("peers", e),
    };
    let removed = {
        let mut peers = app.peers.lock();
        let before = peers.len();
        peers.retain(|p| *p != req.url);
        peers.len() < before
    };
    if removed {
        app.metrics.request("peers", tonic::Code::Ok);
        ok(StatusCode::OK)
    } else {
        app.metrics.request("peers", tonic::Code::NotFound);
        json(StatusCode::NOT_FOUND, &ErrorBody { error: "peer not found" })
    }
}

async fn list_peers(State(app): State<Arc<App>>) -> Response {
    let peers = app.peers.lock().clone();
    app.respond("peers", Ok(peers))
}

impl App {
    fn respond<T: Serialize>(&self, route: &str, r: Result<T, QueryError>) -> Response {
        self.metrics.request(route, r.as_ref().err().map_or(tonic::Code::Ok, QueryError::code));
        match r {
            Ok(body) => json(StatusCode::OK, &body),
            Err(e) => json(e.http_status(), &ErrorBody { error: &e.to_string() }),
        }
    }

    /// [`Self::respond`] for a score answer, into a buffer of about its size.
    fn respond_score(&self, route: &str, r: Result<ScoreAnswer, QueryError>) -> Response {
        match r {
            Ok(a) => {
                self.metrics.request(route, tonic::Code::Ok);
                json_sized(StatusCode::OK, &a, a.json_len_hint())
            }
            Err(e) => self.respond::<()>(route, Err(e)),
        }
    }

    /// Upstream's answer to a body or query string its extractor refused (axum's own text).
    fn rejected(&self, route: &str, e: impl IntoResponse) -> Response {
        self.metrics.request(route, tonic::Code::InvalidArgument);
        e.into_response()
    }

    fn written(&self, route: &str, r: Result<(), RegisterError>, done: StatusCode) -> Response {
        self.metrics.request(route, r.as_ref().err().map_or(tonic::Code::Ok, RegisterError::code));
        match r {
            Ok(()) => ok(done),
            Err(e) => json(e.http_status(), &ErrorBody { error: &e.to_string() }),
        }
    }

    fn no_registrar(&self, route: &str) -> Response {
        self.metrics.request(route, tonic::Code::Unimplemented);
        let msg = "this facade has no log producer: registrations are not served";
        json(StatusCode::NOT_IMPLEMENTED, &ErrorBody { error: msg })
    }

    /// `GET /workers`: every announced worker of every partition passing the filters, by id. A
    /// rank this replica is the registrar of and does not subscribe to yet is `pending`.
    fn workers(&self, q: &WorkersQuery) -> Vec<WorkerInfo> {
        let listeners = self.registrar.as_ref().map(|r| r.listeners());
        let mut out = Vec::new();
        self.reader.each_worker(|w, meta| {
            let mine = listeners
                .is_some_and(|l| Registration::from_meta(meta).is_some_and(|r| r.registrar == l.replica()));
            let pending = || Live { status: "pending", last_error: None };
            out.extend(
                q.entry(w, meta, |dp| listeners.and_then(|l| l.live(w, dp)).or_else(|| mine.then(pending))),
            );
        });
        out.sort_by_key(|w| w.instance_id);
        out
    }
}

/// Serves [`router`] on its own port for as long as the replica runs
/// (`prefixlog serve --http-indexer-addr ... [--http-dialect mooncake]`). It adds no gRPC routes
/// to the query port; it is an extension to be built from the replica's `QueryService` and
/// metrics registry.
pub struct HttpIndexerExtension {
    addr: SocketAddr,
    limits: Limits,
    bodies: BodyLimits,
    connections: ConnLimits,
    dialect: Dialect,
    feeds: Option<Arc<dyn EngineFeeds>>,
    listener: Mutex<Option<TcpListener>>,
    tasks: Mutex<Vec<AbortHandle>>,
    listeners: Mutex<Option<Arc<Listeners>>>,
}

impl HttpIndexerExtension {
    /// Binds `addr` now, so a taken port fails the start before the replica restores its state
    /// (port 0: any free port, see [`Self::addr`]).
    pub fn bind(addr: SocketAddr) -> Result<Self, StartError> {
        let bind = |source| StartError::Bind { facade: FACADE, what: "HTTP", addr, source };
        let listener = TcpListener::bind(addr).map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        Ok(Self {
            addr,
            limits: Limits::default(),
            bodies: BodyLimits::default(),
            connections: ConnLimits::default(),
            dialect: Dialect::default(),
            feeds: None,
            listener: Mutex::new(Some(listener)),
            tasks: Mutex::default(),
            listeners: Mutex::default(),
        })
    }

    /// Other bounds than the defaults (64 requests in flight, 10 s per request).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Other body bounds than the defaults (10 s per body, 512 MiB of bodies at once).
    pub fn with_bodies(mut self, bodies: BodyLimits) -> Self {
        self.bodies = bodies;
        self
    }

    /// Other connection bounds than the defaults (5 s to send a header, 1,024 connections,
    /// 256 per peer address).
    pub fn with_connections(mut self, connections: ConnLimits) -> Self {
        self.connections = connections;
        self
    }

    /// Another dialect than Dynamo's.
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// Serves `/register` and `/unregister` (Dynamo dialect): registrations are written to the
    /// log, and the registered engines' events are published, by `feeds`.
    pub fn with_feeds(mut self, feeds: Arc<dyn EngineFeeds>) -> Self {
        self.feeds = Some(feeds);
        self
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The registrar of the Dynamo dialect, and the loop that keeps its subscriptions what
    /// the log says (started here).
    fn registrar(&self, ctx: &ExtensionContext<'_>) -> Result<Option<Arc<Registrar>>, StartError> {
        let (Dialect::Dynamo, Some(feeds)) = (self.dialect, &self.feeds) else { return Ok(None) };
        feeds
            .register_metrics(ctx.registry)
            .map_err(|source| StartError::Metrics { facade: FACADE, source })?;
        let listeners = Arc::new(Listeners::new(ctx.query.clone(), feeds.clone()));
        let registrar = Arc::new(Registrar::new(ctx.query.clone(), listeners.clone()));
        let r = registrar.clone();
        let task = tokio::spawn(async move {
            loop {
                r.reconcile().await;
                tokio::time::sleep(RECONCILE_EVERY).await;
            }
        });
        self.tasks.lock().push(task.abort_handle());
        *self.listeners.lock() = Some(listeners);
        Ok(Some(registrar))
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
        let gate = Gate::new(self.limits, metrics.clone(), in_flight).with_bodies(self.bodies);
        let registrar = self.registrar(ctx)?;
        let app = router(ctx.query.clone(), metrics.clone(), gate, self.dialect, registrar);
        let counted = prefixlog_query::listen::counted_refusals(ctx.registry, "http_indexer");
        let refused: OnRefused = Arc::new(move |why| {
            counted(why);
            metrics.skipped(why.reason(), 1);
        });
        let task = tokio::spawn(prefixlog_query::listen::serve(
            listener,
            app,
            self.connections,
            "http-indexer",
            refused,
        ));
        self.tasks.lock().push(task.abort_handle());
        Ok(())
    }
}

impl Drop for HttpIndexerExtension {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        if let Some(l) = self.listeners.lock().take() {
            l.abort_all();
        }
    }
}
