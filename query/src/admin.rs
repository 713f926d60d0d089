//! The admin HTTP port (HTTP/1, axum — already in the tree through tonic's router):
//! - `/metrics`: Prometheus text format (see [`crate::metrics`]);
//! - `/healthz`: 200 while the process runs (liveness: restart only a wedged process);
//! - `/readyz`: 200 once the replica is caught up (lag ≤ the ready threshold), 503 before,
//!   with the lag in the body (readiness: route traffic only to caught-up replicas).

use crate::health::Readiness;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus::Registry;
use std::sync::Arc;

pub fn router(registry: Registry, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let r = registry.clone();
                async move {
                    // Scrapes lock each keyspace briefly; keep them off the async workers.
                    let body = tokio::task::spawn_blocking(move || crate::metrics::render(&r))
                        .await
                        .unwrap_or_default();
                    ([("content-type", "text/plain; version=0.0.4")], body)
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let r = readiness.clone();
                async move {
                    let (ready, why) = r.check();
                    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    (code, format!("{}: {why}\n", if ready { "ready" } else { "not ready" }))
                }
            }),
        )
}
