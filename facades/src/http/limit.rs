//! Bounds on the work the HTTP port accepts: requests in flight (each may buffer a body of up
//! to `MAX_BODY_BYTES`), the time a body may take to arrive, the bytes of bodies being received
//! at once, and the time one request may take. Without them many or slow clients grow memory
//! without bound, or hold every place.
//!
//! A request's body is read in full first, within [`BodyLimits::timeout`] (408 past it) and
//! within a byte budget shared by every request being received ([`BodyLimits::budget_bytes`]:
//! 503 past it); only then is a place taken, with `try_acquire`: one over the bound is refused
//! at once with 429, never queued. A slow body therefore never holds a place a complete
//! request could use. One over its time (from its place) is answered 504. All are counted in
//! the facade metrics under their gRPC code (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED). The places
//! taken are the gauge `prefixlog_facade_http_in_flight{protocol}`: at the bound, the port
//! answers 429.
//!
//! Bodies are read up to `MAX_BODY_BYTES` and one byte more: the routes' own body limits (and
//! their 413 answers, axum's) apply to what is passed on.

use super::wire::ErrorBody;
use super::MAX_BODY_BYTES;
use crate::metrics::FacadeMetrics;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use prometheus::{IntGauge, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests in flight per server by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Time one request may take by default, its body included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a request's body may take to arrive by default (from its header).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of bodies being received or held at once by default (64 bodies of 8 MiB).
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 512 << 20;

/// The bounds on bodies of one server.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub timeout: Duration,
    pub budget_bytes: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self { timeout: DEFAULT_BODY_TIMEOUT, budget_bytes: DEFAULT_BODY_BUDGET_BYTES }
    }
}

/// The bounds of one server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_in_flight: usize,
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_in_flight: DEFAULT_MAX_IN_FLIGHT, request_timeout: DEFAULT_REQUEST_TIMEOUT }
    }
}

/// The middleware's state: one semaphore per server, and the gauge of its permits taken.
#[derive(Clone)]
pub struct Gate {
    permits: Arc<Semaphore>,
    timeout: Duration,
    /// One permit per body byte received and not yet answered.
    body_bytes: Arc<Semaphore>,
    body_timeout: Duration,
    metrics: FacadeMetrics,
    in_flight: IntGauge,
}

impl Gate {
    /// A gate of `limits` whose places taken are `in_flight` (see [`in_flight_gauge`]).
    pub fn new(limits: Limits, metrics: FacadeMetrics, in_flight: IntGauge) -> Self {
        let permits = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
        let bodies = BodyLimits::default();
        let body_bytes = Arc::new(Semaphore::new(bodies.budget_bytes));
        Self {
            permits,
            timeout: limits.request_timeout,
            body_bytes,
            body_timeout: bodies.timeout,
            metrics,
            in_flight,
        }
    }

    /// Other body bounds than the defaults (10 s, 512 MiB).
    pub fn with_bodies(mut self, bodies: BodyLimits) -> Self {
        self.body_bytes = Arc::new(Semaphore::new(bodies.budget_bytes.min(Semaphore::MAX_PERMITS)));
        self.body_timeout = bodies.timeout;
        self
    }
}

/// Registers `protocol`'s gauge of requests holding a place in `r`.
pub fn in_flight_gauge(r: &Registry, protocol: &str) -> prometheus::Result<IntGauge> {
    let opts = Opts::new(
        "prefixlog_facade_http_in_flight",
        "Requests holding one of an HTTP facade's bounded places (at the bound it answers 429)",
    )
    .const_label("protocol", protocol);
    let gauge = IntGauge::with_opts(opts)?;
    r.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

/// One place taken: counted in the gauge until dropped, with the permit it holds.
struct Place {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    in_flight: IntGauge,
}

impl Place {
    fn take(permit: tokio::sync::OwnedSemaphorePermit, in_flight: &IntGauge) -> Self {
        in_flight.inc();
        Self { permit: Some(permit), in_flight: in_flight.clone() }
    }
}

impl Drop for Place {
    /// The permit first, then the gauge: the gauge never reads a place free that is not.
    fn drop(&mut self) {
        drop(self.permit.take());
        self.in_flight.dec();
    }
}

/// Why a body was not read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error("request body not received within {0:?}")]
    Slow(Duration),
    #[error("too many request bytes being received on this indexer; retry later")]
    Budget,
    #[error("request body not read: {0}")]
    Read(String),
}

impl BodyError {
    fn answer(&self, gate: &Gate, route: &str) -> Response {
        let (status, code) = match self {
            Self::Slow(_) => (StatusCode::REQUEST_TIMEOUT, tonic::Code::DeadlineExceeded),
            Self::Budget => (StatusCode::SERVICE_UNAVAILABLE, tonic::Code::ResourceExhausted),
            Self::Read(_) => (StatusCode::BAD_REQUEST, tonic::Code::InvalidArgument),
        };
        gate.metrics.request(route, code);
        let mut r = super::wire::json(status, &ErrorBody { error: &self.to_string() });
        // The rest of the body is not read: the connection cannot carry another request.
        r.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        r
    }
}

/// Reads `body` up to `MAX_BODY_BYTES + 1` bytes, each byte taken from the shared budget (the
/// permits are held until the answer).
async fn read_body(gate: &Gate, body: Body) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyError> {
    let mut stream = body.into_data_stream();
    let mut held: Option<OwnedSemaphorePermit> = None;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Read(e.to_string()))?;
        let n = u32::try_from(chunk.len()).map_err(|_| BodyError::Budget)?;
        let permit = gate.body_bytes.clone().try_acquire_many_owned(n).map_err(|_| BodyError::Budget)?;
        match &mut held {
            Some(h) => h.merge(permit),
            None => held = Some(permit),
        }
        bytes.extend_from_slice(&chunk);
        if bytes.len() > MAX_BODY_BYTES {
            break;
        }
    }
    Ok((Bytes::from(bytes), held))
}

/// `axum::middleware::from_fn_with_state(gate, limit)`.
pub async fn limit(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
    let (parts, body) = req.into_parts();
    let (req, _bytes) = if declared_len(&parts) > Some(MAX_BODY_BYTES as u64) {
        // Refused by the route's body limit at once, unread.
        (Request::from_parts(parts, body), None)
    } else {
        let read = tokio::time::timeout(gate.body_timeout, read_body(&gate, body)).await;
        match read.unwrap_or(Err(BodyError::Slow(gate.body_timeout))) {
            Ok((body, bytes)) => (Request::from_parts(parts, Body::from(body)), bytes),
            Err(e) => return e.answer(&gate, route),
        }
    };
    let Ok(permit) = gate.permits.clone().try_acquire_owned() else {
        gate.metrics.request(route, tonic::Code::ResourceExhausted);
        let msg = "too many requests in flight on this indexer; retry later";
        return super::wire::json(StatusCode::TOO_MANY_REQUESTS, &ErrorBody { error: msg });
    };
    let _place = Place::take(permit, &gate.in_flight);
    match tokio::time::timeout(gate.timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => {
            gate.metrics.request(route, tonic::Code::DeadlineExceeded);
            let msg = format!("request not answered within {:?}", gate.timeout);
            super::wire::json(StatusCode::GATEWAY_TIMEOUT, &ErrorBody { error: &msg })
        }
    }
}

/// The body length the request's `Content-Length` declares, if any.
fn declared_len(parts: &axum::http::request::Parts) -> Option<u64> {
    let v = parts.headers.get(axum::http::header::CONTENT_LENGTH)?;
    v.to_str().ok()?.parse().ok()
}

/// The `rpc` label of a path (a fixed set, so clients cannot grow the label's values).
fn route_label(path: &str) -> &'static str {
    match path {
        "/query" => "query",
        "/query_by_hash" => "query_by_hash",
        "/workers" => "workers",
        "/register" => "register",
        "/unregister" => "unregister",
        "/dump" => "dump",
        "/register_peer" | "/deregister_peer" | "/peers" => "peers",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::post;
    use axum::Router;
    use prometheus::Registry;
    use tokio::sync::oneshot;
    use tower::ServiceExt;

    fn post_query() -> Request {
        Request::builder().method("POST").uri("/query").body(Body::empty()).unwrap()
    }

    fn gate(limits: Limits) -> (Gate, FacadeMetrics, IntGauge) {
        let r = Registry::new();
        let metrics = FacadeMetrics::new(&r, "test").unwrap();
        let in_flight = in_flight_gauge(&r, "test").unwrap();
        (Gate::new(limits, metrics.clone(), in_flight.clone()), metrics, in_flight)
    }

    /// A router whose first request holds its place until `release` is sent (or its future is
    /// dropped), after telling `entered`; later requests are answered at once. Bound of 1.
    fn holding_app() -> (Router, IntGauge, FacadeMetrics, oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (gate, metrics, in_flight) =
            gate(Limits { max_in_flight: 1, request_timeout: Duration::from_secs(3600) });
        let (entered_tx, entered_rx) = oneshot::channel::<()>();
        let (release_tx, release_rx) = oneshot::channel::<()>();
        let held = Arc::new(parking_lot::Mutex::new(Some((entered_tx, release_rx))));
        let app = Router::new()
            .route(
                "/query",
                post(move || {
                    let held = held.lock().take();
                    async move {
                        if let Some((entered, release)) = held {
                            let _ = entered.send(());
                            let _ = release.await;
                        }
                        "ok"
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(gate, limit));
        (app, in_flight, metrics, entered_rx, release_tx)
    }

    #[tokio::test]
    async fn a_request_over_the_bound_is_refused_with_429_at_once() {
        let (app, in_flight, metrics, entered, release) = holding_app();
        let first = tokio::spawn(app.clone().oneshot(post_query()));
        entered.await.unwrap();
        assert_eq!(in_flight.get(), 1, "the first request holds the only place");
        let second = app.clone().oneshot(post_query()).await.unwrap();
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        let body = axum::body::to_bytes(second.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("too many requests"), "{v}");
        assert_eq!(metrics.requests_of("query", tonic::Code::ResourceExhausted), 1);

        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        assert_eq!(in_flight.get(), 0, "the place is given back");
        // The permit is back: the next request is served.
        assert_eq!(app.oneshot(post_query()).await.unwrap().status(), StatusCode::OK);
    }

    /// A request dropped before its answer (the client went away, the connection closed) gives
    /// its place back: the gauge reads 0 and the only place serves the next request.
    #[tokio::test]
    async fn a_request_dropped_midway_gives_its_place_back() {
        let (app, in_flight, _, entered, _release) = holding_app();
        let first = tokio::spawn(app.clone().oneshot(post_query()));
        entered.await.unwrap();
        assert_eq!(in_flight.get(), 1);
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(in_flight.get(), 0, "the dropped request's place is given back");
        assert_eq!(app.oneshot(post_query()).await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_request_over_its_time_is_answered_504() {
        let (gate, metrics, in_flight) =
            gate(Limits { max_in_flight: 4, request_timeout: Duration::from_millis(10) });
        // Never answers: only the timeout ends it (the outcome is asserted, not the time).
        let app = Router::new()
            .route("/query", post(std::future::pending::<&'static str>))
            .layer(axum::middleware::from_fn_with_state(gate, limit));
        let r = app.oneshot(post_query()).await.unwrap();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(in_flight.get(), 0, "a request over its time gives its place back");
        assert_eq!(metrics.requests_of("query", tonic::Code::DeadlineExceeded), 1);
    }

    /// A body still arriving holds no place: with one place, a complete request is answered
    /// while another's body trickles; the trickling one is answered 408 at its deadline.
    #[tokio::test]
    async fn a_slow_body_holds_no_place_and_is_answered_408() {
        let (gate, metrics, in_flight) =
            gate(Limits { max_in_flight: 1, request_timeout: Duration::from_secs(3600) });
        let bodies = BodyLimits { timeout: Duration::from_millis(300), ..BodyLimits::default() };
        let app = Router::new()
            .route("/query", post(|body: Bytes| async move { format!("{}", body.len()) }))
            .layer(axum::middleware::from_fn_with_state(gate.with_bodies(bodies), limit));
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        tx.send(Ok(Bytes::from_static(b"{"))).await.unwrap();
        let slow = Request::builder()
            .method("POST")
            .uri("/query")
            .body(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
            .unwrap();
        let slow = tokio::spawn(app.clone().oneshot(slow));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(in_flight.get(), 0, "a body being received takes no place");
        let full = Request::builder().method("POST").uri("/query").body(Body::from("abc")).unwrap();
        let r = app.clone().oneshot(full).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(&axum::body::to_bytes(r.into_body(), 64).await.unwrap()[..], b"3");
        let r = slow.await.unwrap().unwrap();
        assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(metrics.requests_of("query", tonic::Code::DeadlineExceeded), 1);
        drop(tx);
    }

    #[tokio::test]
    async fn bodies_over_the_shared_byte_budget_are_answered_503() {
        let (gate, metrics, _) = gate(Limits::default());
        let bodies = BodyLimits { budget_bytes: 4, ..BodyLimits::default() };
        let app = Router::new()
            .route("/query", post(|body: Bytes| async move { format!("{}", body.len()) }))
            .layer(axum::middleware::from_fn_with_state(gate.with_bodies(bodies), limit));
        let req =
            |b: &'static str| Request::builder().method("POST").uri("/query").body(Body::from(b)).unwrap();
        assert_eq!(app.clone().oneshot(req("abcd")).await.unwrap().status(), StatusCode::OK);
        assert_eq!(
            app.clone().oneshot(req("abcde")).await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(metrics.requests_of("query", tonic::Code::ResourceExhausted), 1);
        // The first body's bytes were given back with its answer.
        assert_eq!(app.oneshot(req("abcd")).await.unwrap().status(), StatusCode::OK);
    }
}
