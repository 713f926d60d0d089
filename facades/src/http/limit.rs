//! Bounds on the work the HTTP port accepts: requests in flight (each may buffer a body of up
//! to `MAX_BODY_BYTES`) and the time one request may take, body included. Without them many or
//! slow clients grow memory without bound.
//!
//! The bound is taken with `try_acquire` before the body is read: one request over it is
//! refused at once with 429, never queued; one over its time is answered 504. Both are counted
//! in the facade metrics under their gRPC code (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED). The
//! places taken are the gauge `prefixlog_facade_http_in_flight{protocol}`: at the bound, the
//! port answers 429.

use super::wire::ErrorBody;
use crate::metrics::FacadeMetrics;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{IntGauge, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Requests in flight per server by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Time one request may take by default, its body included.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

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
    metrics: FacadeMetrics,
    in_flight: IntGauge,
}

impl Gate {
    /// A gate of `limits` whose places taken are `in_flight` (see [`in_flight_gauge`]).
    pub fn new(limits: Limits, metrics: FacadeMetrics, in_flight: IntGauge) -> Self {
        let permits = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
        Self { permits, timeout: limits.request_timeout, metrics, in_flight }
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

/// `axum::middleware::from_fn_with_state(gate, limit)`.
pub async fn limit(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
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
}
