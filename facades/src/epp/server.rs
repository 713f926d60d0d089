//! The `ExternalProcessor` gRPC service on its own port, `grpc.health.v1` on another, and
//! [`EppExtension`], which serves both for the lifetime of a replica
//! (`prefixlog serve --epp-addr ... --epp-health-addr ...`).
//!
//! Health services (GIE's): `liveness` is SERVING while the process answers; `readiness` and
//! `envoy.service.ext_proc.v3.ExternalProcessor` follow the replica's readiness (the picker
//! still answers, failing open, while the replica is not ready: the gateway's probes decide
//! whether to ask it).

use super::exchange::{Exchange, Step};
use super::pb::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use super::pb::{ProcessingRequest, ProcessingResponse};
use super::picker::{PickMetrics, Picker};
use super::policy::Loads;
use super::tokenize::Tokenizers;
use super::{BodyMode, Limits, Weights, PROTOCOL, SERVICE_NAME};
use crate::metrics::FacadeMetrics;
use crate::start::{every_partition, StartError};
use parking_lot::Mutex;
use prefixlog_query::extension::{Extension, ExtensionContext, ExtensionError};
use prefixlog_query::health::Readiness;
use prefixlog_query::tonic_health::ServingStatus;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::RoutesBuilder;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// What the picker serves and how.
#[derive(Clone, Default)]
pub struct EppConfig {
    pub tokenizers: Tokenizers,
    pub weights: Weights,
    pub limits: Limits,
    /// The request body mode when Envoy does not announce one.
    pub body_mode: BodyMode,
}

/// The service. Cheap to clone.
#[derive(Clone)]
pub struct EppService {
    picker: Picker,
    metrics: FacadeMetrics,
    streams: Arc<Semaphore>,
    body_mode: BodyMode,
}

impl EppService {
    pub fn into_server(self) -> ExternalProcessorServer<Self> {
        // Buffered mode sends a whole body in one message.
        let max = self.picker.limits.max_body_bytes + (1 << 20);
        ExternalProcessorServer::new(self).max_decoding_message_size(max)
    }
}

#[tonic::async_trait]
impl ExternalProcessor for EppService {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.metrics.request("Process", tonic::Code::ResourceExhausted);
            let max = self.picker.limits.max_streams;
            return Err(Status::resource_exhausted(format!(
                "more than {max} requests in flight at this endpoint picker"
            )));
        };
        // Small: Envoy reads as it goes, and a body's chunks are bounded.
        let (tx, rx) = mpsc::channel(16);
        let ex = Exchange::new(self.picker.clone(), self.metrics.clone(), self.body_mode);
        let timeout = self.picker.limits.message_timeout;
        tokio::spawn(run(ex, request.into_inner(), tx, permit, timeout));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Tx = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// One stream, to its end: Envoy's close, an error, an immediate response, or a stall while
/// the request is read. The exchange (and its load lease) and the permit go with it.
async fn run(
    ex: Exchange,
    inbound: Streaming<ProcessingRequest>,
    tx: Tx,
    permit: OwnedSemaphorePermit,
    timeout: Duration,
) {
    exchange(ex, inbound, tx, timeout).await;
    // Only now: once the stream's place is free again, its load lease is given back too.
    drop(permit);
}

async fn exchange(mut ex: Exchange, mut inbound: Streaming<ProcessingRequest>, tx: Tx, timeout: Duration) {
    loop {
        let next = if ex.reading_request() {
            match tokio::time::timeout(timeout, inbound.message()).await {
                Ok(n) => n,
                Err(_) => {
                    let msg = format!(
                        "no message from the data plane within {timeout:?} while reading the request"
                    );
                    let _ = tx.send(Err(Status::deadline_exceeded(msg))).await;
                    return;
                }
            }
        } else {
            inbound.message().await
        };
        let m = match next {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(s) => {
                tracing::debug!(status = %s, routed = ?ex.routed_to(), "endpoint picker: stream ended");
                return;
            }
        };
        match ex.on(m).await {
            Step::Reply(rs) => {
                for r in rs {
                    if tx.send(Ok(r)).await.is_err() {
                        return;
                    }
                }
            }
            Step::Done(r) => {
                let _ = tx.send(Ok(r)).await;
                return;
            }
            Step::Close(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        }
    }
}

/// Serves the picker and its health on their own ports next to a replica.
pub struct EppExtension {
    addr: SocketAddr,
    health_addr: SocketAddr,
    cfg: EppConfig,
    listeners: Mutex<Option<(TcpListener, TcpListener)>>,
    tasks: Mutex<Vec<AbortHandle>>,
    picks: Mutex<Option<PickMetrics>>,
}

/// How start-up errors name this facade.
const FACADE: &str = "the endpoint picker (--epp-addr)";

fn bind(what: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let err = |source| StartError::Bind { facade: FACADE, what, addr, source };
    let l = TcpListener::bind(addr).map_err(err)?;
    let bound = l.local_addr().map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    Ok((l, bound))
}

impl EppExtension {
    /// Binds both ports now, so a taken port fails the start before the replica restores its
    /// state (port 0: any free port, see [`Self::addr`] and [`Self::health_addr`]).
    pub fn bind(addr: SocketAddr, health_addr: SocketAddr, cfg: EppConfig) -> Result<Self, StartError> {
        let (l, addr) = bind("ext_proc", addr)?;
        let (h, health_addr) = bind("health", health_addr)?;
        Ok(Self {
            addr,
            health_addr,
            cfg,
            listeners: Mutex::new(Some((l, h))),
            tasks: Mutex::default(),
            picks: Mutex::default(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    /// The picks counters, once serving (tests).
    pub fn picks(&self) -> Option<PickMetrics> {
        self.picks.lock().clone()
    }

    fn spawn_servers(&self, svc: EppService, readiness: Arc<Readiness>) -> Result<(), StartError> {
        let (l, h) = self.listeners.lock().take().ok_or(StartError::AlreadyServed { facade: FACADE })?;
        let max_streams = svc.picker.limits.max_streams;
        let tokio_listener = |l: TcpListener, what, addr| {
            tokio::net::TcpListener::from_std(l).map_err(|source| StartError::Bind {
                facade: FACADE,
                what,
                addr,
                source,
            })
        };
        let l = TcpIncoming::from(tokio_listener(l, "ext_proc", self.addr)?);
        let h = TcpIncoming::from(tokio_listener(h, "health", self.health_addr)?);
        let (reporter, health) = prefixlog_query::tonic_health::server::health_reporter();
        let mut tasks = self.tasks.lock();
        tasks.push(
            tokio::spawn(async move {
                use prefixlog_query::server::{H2_KEEPALIVE_INTERVAL, H2_KEEPALIVE_TIMEOUT};
                // Envoy opens one stream per HTTP request in flight: the picker's own cap
                // (`max_streams`) bounds them; keepalive finds dead data planes.
                let r = tonic::transport::Server::builder()
                    .max_concurrent_streams(u32::try_from(max_streams).unwrap_or(u32::MAX))
                    .http2_keepalive_interval(Some(H2_KEEPALIVE_INTERVAL))
                    .http2_keepalive_timeout(Some(H2_KEEPALIVE_TIMEOUT))
                    .add_service(svc.into_server())
                    .serve_with_incoming(l)
                    .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "endpoint picker stopped");
                }
            })
            .abort_handle(),
        );
        tasks.push(
            tokio::spawn(async move {
                if let Err(e) =
                    tonic::transport::Server::builder().add_service(health).serve_with_incoming(h).await
                {
                    tracing::error!(error = %e, "endpoint picker health port stopped");
                }
            })
            .abort_handle(),
        );
        tasks.push(tokio::spawn(report_health(reporter, readiness)).abort_handle());
        Ok(())
    }
}

/// Keeps the health services at the replica's readiness, read every 50 ms as the query port's
/// own health driver checks it ([`Readiness::is_ready`]: a not-ready verdict is evaluated
/// again on each read).
async fn report_health(
    reporter: prefixlog_query::tonic_health::server::HealthReporter,
    readiness: Arc<Readiness>,
) {
    reporter.set_service_status("liveness", ServingStatus::Serving).await;
    let mut last = None;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let ready = readiness.is_ready();
        if last == Some(ready) {
            continue;
        }
        let s = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
        reporter.set_service_status("readiness", s).await;
        reporter.set_service_status(SERVICE_NAME, s).await;
        last = Some(ready);
    }
}

impl Extension for EppExtension {
    /// Also reported by the query port's `grpc.health.v1` with the replica's readiness.
    fn service_name(&self) -> &str {
        SERVICE_NAME
    }

    fn add_to(&self, ctx: &ExtensionContext<'_>, _: &mut RoutesBuilder) -> Result<(), ExtensionError> {
        every_partition(ctx, FACADE)?;
        let metrics = FacadeMetrics::new(ctx.registry, PROTOCOL)
            .map_err(|source| StartError::Metrics { facade: FACADE, source })?;
        let picks = PickMetrics::new(ctx.registry)
            .map_err(|source| StartError::Metrics { facade: FACADE, source })?;
        let picker = Picker {
            query: ctx.query.clone(),
            tokenizers: self.cfg.tokenizers.clone(),
            loads: Loads::default(),
            weights: self.cfg.weights,
            limits: self.cfg.limits,
            metrics: picks.clone(),
            body_bytes: Arc::new(Semaphore::new(super::MAX_BUFFERED_BODY_BYTES)),
        };
        let streams = Arc::new(Semaphore::new(self.cfg.limits.max_streams.max(1)));
        let svc = EppService { picker, metrics, streams, body_mode: self.cfg.body_mode };
        self.spawn_servers(svc, ctx.query.view().readiness.clone())?;
        *self.picks.lock() = Some(picks);
        Ok(())
    }
}

impl Drop for EppExtension {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}
