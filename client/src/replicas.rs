//! One group of interchangeable replicas (the replicas of one shard): endpoint choice,
//! health probing and failover within a deadline.
//!
//! Every endpoint has a lazily connected channel (tonic reconnects it on use). A background task
//! probes each endpoint's `grpc.health.v1` status (SERVING only once the replica has caught up
//! and can prove its state) every `probe_interval`; a query goes to the healthy endpoint with the
//! most applied records (sum of the `applied` offsets of its last answer: the least lagged), and
//! fails over to the next one on a transport error or when the endpoint does not answer within
//! its share of the deadline (what is left, split over the endpoints still to try). A query
//! goes as a unary `Match`, or over the endpoint's long-lived `MatchStream`
//! ([`crate::mux::StreamMux`]) when the client asks for streaming.

use crate::mux::{MuxError, StreamMux};
use prefixlog_proto::v1::{
    prefix_index_client::PrefixIndexClient, prefix_index_server, MatchRequest, MatchResponse,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

/// Why a group could not answer. Every variant means: route without the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The deadline passed (including a consistency token not reached in time).
    Timeout,
    /// No endpoint could be reached.
    Disconnected(String),
    /// Replicas refused for load (RESOURCE_EXHAUSTED).
    Overloaded(String),
    /// The replica rejected the query (unknown keyspace, bad input): fix the gateway's config.
    Rejected { code: Code, message: String },
}

struct Ep {
    url: String,
    client: PrefixIndexClient<Channel>,
    /// Opens its stream on first use only.
    mux: StreamMux,
    health: HealthClient<Channel>,
    healthy: AtomicBool,
    applied_sum: AtomicI64,
    timeouts: AtomicU32,
}

impl Ep {
    async fn ask_unary(&self, req: &MatchRequest, budget: Duration) -> Result<MatchResponse, tonic::Status> {
        let mut r = tonic::Request::new(req.clone());
        r.set_timeout(budget);
        let mut client = self.client.clone();
        match tokio::time::timeout(budget, client.r#match(r)).await {
            Err(_) => Err(tonic::Status::deadline_exceeded("client deadline")),
            Ok(r) => r.map(tonic::Response::into_inner),
        }
    }

    /// The stream's errors as the statuses a unary call would end with, so both paths fail
    /// over alike (a broken stream is a dead or restarting replica: UNAVAILABLE).
    async fn ask_stream(&self, req: &MatchRequest, budget: Duration) -> Result<MatchResponse, tonic::Status> {
        let end = tokio::time::Instant::now() + budget;
        self.mux.ask(req.clone(), end).await.map_err(|e| match e {
            MuxError::Timeout => tonic::Status::deadline_exceeded("client deadline"),
            MuxError::Broken(why) => tonic::Status::unavailable(why),
            MuxError::Status { code, message } => tonic::Status::new(code, message),
            e @ MuxError::TooLarge { .. } => tonic::Status::resource_exhausted(e.to_string()),
        })
    }
}

/// Consecutive timeouts after which an endpoint counts as unhealthy until its next good probe
/// (a single timeout may be one slow query; a black-holed host times out every time).
const TIMEOUTS_UNHEALTHY: u32 = 3;

/// The replicas of one shard. Cheap to share (`Arc`); probing stops when the last `Arc` goes.
pub struct ReplicaGroup {
    eps: Vec<Ep>,
}

/// The client's TLS: one configuration for every endpoint (None: plaintext), and the name to
/// check the certificate against for endpoints that are addresses a discovery seed's name
/// resolved to ([`crate::seeds`]).
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    pub config: Option<ClientTlsConfig>,
    pub server_names: BTreeMap<String, String>,
}

impl ClientTls {
    pub fn new(config: Option<ClientTlsConfig>) -> Self {
        Self { config, server_names: BTreeMap::new() }
    }

    fn for_endpoint(&self, url: &str) -> Option<ClientTlsConfig> {
        let config = self.config.clone()?;
        Some(match self.server_names.get(url) {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        })
    }
}

/// A channel to `url`, lazily connected.
pub(crate) fn channel(url: &str, tls: &ClientTls) -> Result<Channel, tonic::transport::Error> {
    let mut ep = Endpoint::from_shared(url.to_string())?;
    if let Some(t) = tls.for_endpoint(url) {
        ep = ep.tls_config(t)?;
    }
    Ok(ep.tcp_nodelay(true).connect_timeout(Duration::from_secs(1)).connect_lazy())
}

impl ReplicaGroup {
    /// Must be called inside a tokio runtime (starts the background health prober).
    pub fn start(
        endpoints: &[String],
        tls: &ClientTls,
        probe_interval: Duration,
    ) -> Result<Arc<Self>, tonic::transport::Error> {
        let mut eps = Vec::new();
        for url in endpoints {
            let ch = channel(url, tls)?;
            eps.push(Ep {
                url: url.clone(),
                client: PrefixIndexClient::new(ch.clone()),
                mux: StreamMux::new(ch.clone()),
                health: HealthClient::new(ch),
                // Optimistic until the first probe, so the first queries need not wait for it.
                healthy: AtomicBool::new(true),
                applied_sum: AtomicI64::new(0),
                timeouts: AtomicU32::new(0),
            });
        }
        let group = Arc::new(Self { eps });
        tokio::spawn(probe_loop(Arc::downgrade(&group), probe_interval));
        Ok(group)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.eps.iter().map(|e| e.url.clone()).collect()
    }

    /// Endpoints currently considered healthy.
    pub fn healthy_endpoints(&self) -> Vec<String> {
        self.eps.iter().filter(|e| e.healthy.load(Ordering::Relaxed)).map(|e| e.url.clone()).collect()
    }

    /// Queries the best endpoint, failing over to the next on transport errors, all before
    /// `end`, over each endpoint's stream if `streaming`. Returns the answer and the endpoint
    /// that gave it.
    pub async fn ask(
        &self,
        req: &MatchRequest,
        end: Instant,
        streaming: bool,
    ) -> Result<(MatchResponse, String), Unavailable> {
        // Every replica's stream would refuse it (and end, failing its other queries): no
        // failover, the caller gets the refusal.
        if streaming {
            if let Err(e) = MuxError::check_size(req) {
                return Err(Unavailable::Rejected { code: Code::ResourceExhausted, message: e.to_string() });
            }
        }
        let mut last = Unavailable::Disconnected("no endpoints configured".into());
        let order = self.order();
        let mut timed_out: Vec<usize> = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let ep = &self.eps[i];
            let Some(left) = end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                break;
            };
            // Split what is left over the endpoints still to try: a hung replica (accepting
            // connections but not answering: a stuck process, a host going down) costs at most
            // its share, and the next one still gets an answer in within the deadline.
            let budget = left / (order.len() - k) as u32;
            let res =
                if streaming { ep.ask_stream(req, budget).await } else { ep.ask_unary(req, budget).await };
            match res {
                Ok(m) => {
                    ep.timeouts.store(0, Ordering::Relaxed);
                    ep.applied_sum.store(m.applied.iter().map(|o| o.offset.max(0)).sum(), Ordering::Relaxed);
                    // Another replica answered in time: stop preferring the ones that did not,
                    // until their next good probe.
                    for &j in &timed_out {
                        self.eps[j].healthy.store(false, Ordering::Relaxed);
                    }
                    return Ok((m, ep.url.clone()));
                }
                Err(s) => match s.code() {
                    Code::DeadlineExceeded | Code::Cancelled => {
                        if ep.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_UNHEALTHY {
                            ep.healthy.store(false, Ordering::Relaxed);
                        }
                        timed_out.push(i);
                        last = Unavailable::Timeout;
                    }
                    Code::ResourceExhausted => last = Unavailable::Overloaded(s.message().into()),
                    Code::Unavailable | Code::Unknown | Code::Internal => {
                        // A dead or restarting replica: stop choosing it until a probe says
                        // otherwise, and try the next one now.
                        ep.healthy.store(false, Ordering::Relaxed);
                        last = Unavailable::Disconnected(format!("{}: {}", ep.url, s.message()));
                    }
                    code => return Err(Unavailable::Rejected { code, message: s.message().into() }),
                },
            }
        }
        if !timed_out.is_empty() {
            last = Unavailable::Timeout;
        }
        Err(last)
    }

    /// Endpoint indices to try: healthy ones, least lagged first, then the others (a probe may
    /// not have run yet, or may be stale; trying them beats giving up within the deadline).
    fn order(&self) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..self.eps.len()).collect();
        idx.sort_by_key(|&i| {
            let e = &self.eps[i];
            (!e.healthy.load(Ordering::Relaxed), std::cmp::Reverse(e.applied_sum.load(Ordering::Relaxed)))
        });
        idx
    }
}

async fn probe_loop(group: Weak<ReplicaGroup>, every: Duration) {
    // A probe may take longer than the interval on a loaded host; a slow answer is still an
    // answer. Probes of different endpoints run concurrently so one black hole delays none.
    let timeout = every.max(Duration::from_secs(1));
    loop {
        let Some(strong) = group.upgrade() else { return };
        let probes: Vec<_> = (0..strong.eps.len())
            .map(|i| {
                let group = strong.clone();
                tokio::spawn(async move {
                    let ep = &group.eps[i];
                    let mut h = ep.health.clone();
                    let req = HealthCheckRequest { service: prefix_index_server::SERVICE_NAME.into() };
                    let ok = matches!(
                        tokio::time::timeout(timeout, h.check(req)).await,
                        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
                    );
                    if ok {
                        ep.timeouts.store(0, Ordering::Relaxed);
                    }
                    ep.healthy.store(ok, Ordering::Relaxed);
                })
            })
            .collect();
        drop(strong);
        for p in probes {
            let _ = p.await;
        }
        tokio::time::sleep(every).await;
    }
}
