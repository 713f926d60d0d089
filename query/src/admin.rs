//! The admin HTTP port (HTTP/1, axum — already in the tree through tonic's router):
//! - `/metrics`: Prometheus text format (see [`crate::metrics`]);
//! - `/healthz`: 200 while the process runs (liveness: restart only a wedged process);
//! - `/readyz`: 200 once the replica is caught up (lag ≤ the ready threshold), 503 before,
//!   with the reason in the body (readiness: route traffic only to caught-up replicas).
//!
//! A replica binds the port *before* it restores its state ([`AdminPort::bind`]), so a restore
//! that takes minutes is visible (`/metrics` has the start-up phase, `/readyz` says what it is
//! doing, `/healthz` answers the startup probe); once it serves, the port's readiness is switched
//! to the replica's ([`AdminPort::serve_readiness`]). The bridge uses the same port.
//!
//! Connections are bounded by [`crate::listen`] with its defaults (a header within 5 s, idle
//! connections closed after 5 s, 1,024 connections, 256 per peer address).

use crate::health::Readiness;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use parking_lot::RwLock;
use prometheus::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// What `/readyz` reports: (ready, why).
pub trait ReadyCheck: Send + Sync {
    fn check(&self) -> (bool, String);
}

impl ReadyCheck for Readiness {
    fn check(&self) -> (bool, String) {
        Readiness::check(self)
    }
}

/// Always ready, with a fixed reason (a process with nothing to catch up on: the bridge).
pub struct AlwaysReady(pub &'static str);

impl ReadyCheck for AlwaysReady {
    fn check(&self) -> (bool, String) {
        (true, self.0.to_string())
    }
}

/// The readiness `/readyz` currently reports, switchable while the port runs.
type Switch = Arc<RwLock<Arc<dyn ReadyCheck>>>;

pub fn router(registry: Registry, readiness: Arc<dyn ReadyCheck>) -> Router {
    switched_router(registry, Arc::new(RwLock::new(readiness)))
}

fn switched_router(registry: Registry, readiness: Switch) -> Router {
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
                let r = readiness.read().clone();
                async move {
                    let (ready, why) = r.check();
                    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    (code, format!("{}: {why}\n", if ready { "ready" } else { "not ready" }))
                }
            }),
        )
}

/// A running admin port. Dropping it stops it.
pub struct AdminPort {
    addr: SocketAddr,
    readiness: Switch,
    task: JoinHandle<()>,
}

impl AdminPort {
    /// Binds `addr` and serves `registry` and `readiness` on the current tokio runtime.
    pub async fn bind(
        addr: SocketAddr,
        registry: Registry,
        readiness: Arc<dyn ReadyCheck>,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let readiness: Switch = Arc::new(RwLock::new(readiness));
        let refused = crate::listen::counted_refusals(&registry, "admin");
        let app = switched_router(registry, readiness.clone());
        let limits = crate::listen::ConnLimits::default();
        let task = tokio::spawn(crate::listen::serve(listener, app, limits, "admin", refused));
        Ok(Self { addr, readiness, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on `/readyz` reports `readiness`.
    pub fn serve_readiness(&self, readiness: Arc<dyn ReadyCheck>) {
        *self.readiness.write() = readiness;
    }
}

impl Drop for AdminPort {
    fn drop(&mut self) {
        self.task.abort();
    }
}
