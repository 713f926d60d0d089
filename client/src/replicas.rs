//! One group of interchangeable replicas (the replicas of one shard): endpoint choice,
//! health probing and failover within a deadline.
//!
//! Every endpoint has a lazily connected channel (tonic reconnects it on use). A background task
//! probes each endpoint's `grpc.health.v1` status (SERVING only once the replica has caught up
//! and can prove its state) every `probe_interval`; a query goes to the healthy endpoint with the
//! most applied records (sum of the `applied` offsets of its last answer: the least lagged), not
//! one whose last answer is known to be behind the query's token when another is not. It
//! hedges: the next endpoint is asked at once on a transport error (a stopped or restarting
//! replica), and as well when the first has not answered within a quarter of the deadline
//! ([`hedge_delay`]: slow, draining or hung); the first answer wins, each attempt may use the
//! whole deadline. A stale answer (the replica not ready, stopping, or cut off from its broker)
//! is only a fallback: the next replica is asked at once, and the stale answer returned only if
//! none answers better in time. A query goes as a unary `Match`, or over the endpoint's
//! long-lived `MatchStream` ([`crate::mux::StreamMux`]) when the client asks for streaming.

use crate::mux::{MuxError, StreamMux};
use futures_util::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use prefixlog_ids::NextOffset;
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
    /// Next offsets its last answer reflected, per partition (token-aware choice).
    applied: Mutex<Vec<NextOffset>>,
    timeouts: AtomicU32,
}

impl Ep {
    /// Whether this endpoint's last answer was below `token` on some partition it reported.
    /// Unknown (no answer yet, or the partition not reported) is not behind.
    fn known_behind(&self, token: &[NextOffset]) -> bool {
        let applied = self.applied.lock();
        token.iter().any(|t| applied.iter().any(|a| a.partition == t.partition && a.offset < t.offset))
    }

    fn count_timeout(&self) {
        if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_UNHEALTHY {
            self.healthy.store(false, Ordering::Relaxed);
        }
    }

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
                applied: Mutex::new(Vec::new()),
                timeouts: AtomicU32::new(0),
            });
        }
        let group = Arc::new(Self { eps });
        tokio::spawn(probe_loop(Arc::downgrade(&group), probe_interval));
        Ok(group)
    }

    /// Connects to every endpoint and probes it once now, up to `timeout` each (concurrently),
    /// so that the first queries do not pay for a connection inside their deadline. Returns how
    /// many endpoints answered SERVING.
    pub async fn warm_up(&self, timeout: Duration) -> usize {
        let probes = self.eps.iter().map(|ep| async move {
            let ok = probe_once(ep, timeout).await;
            ep.healthy.store(ok, Ordering::Relaxed);
            ok
        });
        futures_util::future::join_all(probes).await.into_iter().filter(|&ok| ok).count()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.eps.iter().map(|e| e.url.clone()).collect()
    }

    /// Endpoints currently considered healthy.
    pub fn healthy_endpoints(&self) -> Vec<String> {
        self.eps.iter().filter(|e| e.healthy.load(Ordering::Relaxed)).map(|e| e.url.clone()).collect()
    }

    /// Queries the best endpoint and hedges: a second endpoint is asked too when the first has
    /// not answered within [`hedge_delay`] (slow, stopping, or hung), and at once when it fails
    /// (refused, restarting). Every attempt may run until `end`; the first answer wins. Over each
    /// endpoint's stream if `streaming`. Without `hedging`, the next endpoint is asked only once
    /// the previous one failed (tests and comparisons). Returns the answer and the endpoint that
    /// gave it.
    pub async fn ask(
        &self,
        req: &MatchRequest,
        end: Instant,
        streaming: bool,
        hedging: bool,
    ) -> Result<(MatchResponse, String), Unavailable> {
        // Every replica's stream would refuse it (and end, failing its other queries): no
        // failover, the caller gets the refusal.
        if streaming {
            if let Err(e) = MuxError::check_size(req) {
                return Err(Unavailable::Rejected { code: Code::ResourceExhausted, message: e.to_string() });
            }
        }
        let order = self.order(req);
        let left = end.saturating_duration_since(Instant::now());
        // Without hedging, a hedge is never due before the deadline.
        let hedge = if hedging { hedge_delay(left) } else { left };
        let mut last = Unavailable::Disconnected("no endpoints configured".into());
        let mut next = 0;
        let mut in_flight = FuturesUnordered::new();
        let mut started: Vec<(usize, Instant)> = Vec::new();
        let mut finished: Vec<usize> = Vec::new();
        let mut fallback: Option<(MatchResponse, String)> = None;
        loop {
            let now = Instant::now();
            let Some(left) = end.checked_duration_since(now).filter(|d| !d.is_zero()) else { break };
            // Launch the next endpoint when nothing is in flight, or when the newest attempt has
            // waited a hedge delay without an answer.
            let hedge_due = started.last().is_some_and(|&(_, t)| now >= t + hedge);
            if next < order.len() && (in_flight.is_empty() || hedge_due) {
                let i = order[next];
                next += 1;
                started.push((i, now));
                in_flight.push(self.attempt(i, req, left, streaming));
                continue;
            }
            if in_flight.is_empty() {
                break;
            }
            let wake = match (next < order.len(), started.last()) {
                (true, Some(&(_, t))) => (t + hedge).min(end),
                _ => end,
            };
            let done = tokio::select! {
                d = in_flight.next() => d,
                _ = tokio::time::sleep_until(wake.into()) => continue,
            };
            let Some((i, res)) = done else { continue };
            finished.push(i);
            match self.settle(i, res) {
                // A stale answer (a replica not ready, stopping, or cut off from its broker)
                // is kept as the fallback while another replica may still answer in time.
                Settled::Answer(m) if m.stale && (next < order.len() || !in_flight.is_empty()) => {
                    fallback.get_or_insert((m, self.eps[i].url.clone()));
                }
                Settled::Answer(m) => {
                    self.slow_while_another_answered(&started, i, hedge);
                    return Ok((m, self.eps[i].url.clone()));
                }
                Settled::Failed(why) => last = why,
                Settled::Final(why) => return Err(why),
            }
        }
        // Whatever is still in flight had until `end`: it timed out.
        for &(i, _) in started.iter().filter(|(i, _)| !finished.contains(i)) {
            self.eps[i].count_timeout();
            last = Unavailable::Timeout;
        }
        fallback.ok_or(last)
    }

    async fn attempt(
        &self,
        i: usize,
        req: &MatchRequest,
        budget: Duration,
        streaming: bool,
    ) -> (usize, Result<MatchResponse, tonic::Status>) {
        let ep = &self.eps[i];
        (i, if streaming { ep.ask_stream(req, budget).await } else { ep.ask_unary(req, budget).await })
    }

    /// What one attempt's result means for the query and for the endpoint's standing.
    fn settle(&self, i: usize, res: Result<MatchResponse, tonic::Status>) -> Settled {
        let ep = &self.eps[i];
        match res {
            Ok(m) => {
                ep.timeouts.store(0, Ordering::Relaxed);
                ep.applied_sum.store(m.applied.iter().map(|o| o.offset.max(0)).sum(), Ordering::Relaxed);
                *ep.applied.lock() =
                    m.applied.iter().map(|o| NextOffset::new(o.partition, o.offset)).collect();
                Settled::Answer(m)
            }
            Err(s) => match s.code() {
                Code::DeadlineExceeded | Code::Cancelled => {
                    ep.count_timeout();
                    Settled::Failed(Unavailable::Timeout)
                }
                Code::ResourceExhausted => Settled::Failed(Unavailable::Overloaded(s.message().into())),
                Code::Unavailable | Code::Unknown | Code::Internal => {
                    // A dead, restarting or stopping replica: stop choosing it until a probe
                    // says otherwise.
                    ep.healthy.store(false, Ordering::Relaxed);
                    Settled::Failed(Unavailable::Disconnected(format!("{}: {}", ep.url, s.message())))
                }
                code => Settled::Final(Unavailable::Rejected { code, message: s.message().into() }),
            },
        }
    }

    /// Another endpoint answered: each one asked earlier that had not answered within a hedge
    /// delay counts a timeout (enough of them in a row, and it is not preferred until its next
    /// good probe).
    fn slow_while_another_answered(&self, started: &[(usize, Instant)], answered: usize, hedge: Duration) {
        let now = Instant::now();
        for &(j, t) in started {
            if j != answered && now >= t + hedge {
                self.eps[j].count_timeout();
            }
        }
    }

    /// Endpoint indices to try: healthy ones first; among them, those not known to be behind
    /// the query's token (their last answer already reached it) before those known behind it;
    /// then the least lagged. The others last (a probe may not have run yet, or may be stale;
    /// trying them beats giving up within the deadline).
    fn order(&self, req: &MatchRequest) -> Vec<usize> {
        let token: Vec<NextOffset> =
            req.min_offsets.iter().map(|o| NextOffset::new(o.partition, o.offset)).collect();
        let mut idx: Vec<usize> = (0..self.eps.len()).collect();
        idx.sort_by_cached_key(|&i| {
            let e = &self.eps[i];
            (
                !e.healthy.load(Ordering::Relaxed),
                e.known_behind(&token),
                std::cmp::Reverse(e.applied_sum.load(Ordering::Relaxed)),
            )
        });
        idx
    }
}

/// How long an attempt may go unanswered before a second endpoint is asked as well: a quarter
/// of the query's deadline (an answer normally takes a small fraction of it), at least 1 ms.
pub fn hedge_delay(deadline: Duration) -> Duration {
    (deadline / 4).max(Duration::from_millis(1)).min(deadline)
}

enum Settled {
    Answer(MatchResponse),
    /// This endpoint could not answer; another may.
    Failed(Unavailable),
    /// No endpoint will answer differently (the query itself was refused).
    Final(Unavailable),
}

/// One `grpc.health.v1` check: whether the endpoint answered SERVING within `timeout`.
async fn probe_once(ep: &Ep, timeout: Duration) -> bool {
    let mut h = ep.health.clone();
    let req = HealthCheckRequest { service: prefix_index_server::SERVICE_NAME.into() };
    matches!(
        tokio::time::timeout(timeout, h.check(req)).await,
        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
    )
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
                    let ok = probe_once(ep, timeout).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_proto::v1::PartitionOffset;

    fn query_after(token: &[(u32, i64)]) -> MatchRequest {
        MatchRequest {
            min_offsets: token
                .iter()
                .map(|&(partition, offset)| PartitionOffset { partition, offset })
                .collect(),
            ..Default::default()
        }
    }

    fn answered(group: &ReplicaGroup, i: usize, applied: &[(u32, i64)]) {
        let ep = &group.eps[i];
        ep.applied_sum.store(applied.iter().map(|a| a.1).sum(), Ordering::Relaxed);
        *ep.applied.lock() = applied.iter().map(|&(p, o)| NextOffset::new(p, o)).collect();
    }

    /// The most applied replica overall is not the one to ask when its last answer was behind
    /// the query's token on the token's partition and another replica's was not.
    #[tokio::test]
    async fn a_replica_known_behind_the_token_goes_after_one_that_is_not() {
        let urls = vec!["http://127.0.0.1:9".to_string(), "http://127.0.0.1:10".to_string()];
        let group = ReplicaGroup::start(&urls, &ClientTls::default(), Duration::from_secs(3600)).unwrap();
        // Replica 0: far ahead on partition 1, behind on partition 0. Replica 1: at partition 0's token.
        answered(&group, 0, &[(0, 5), (1, 1000)]);
        answered(&group, 1, &[(0, 10), (1, 20)]);
        assert_eq!(group.order(&query_after(&[(0, 8)])), vec![1, 0]);
        // Without a token (or one both reached), the least lagged first.
        assert_eq!(group.order(&query_after(&[])), vec![0, 1]);
        assert_eq!(group.order(&query_after(&[(0, 5)])), vec![0, 1]);
        // Health first: an unhealthy replica goes last even when it is not behind.
        group.eps[1].healthy.store(false, Ordering::Relaxed);
        assert_eq!(group.order(&query_after(&[(0, 8)])), vec![0, 1]);
    }

    #[test]
    fn hedge_delay_is_a_quarter_of_the_deadline_within_bounds() {
        assert_eq!(hedge_delay(Duration::from_millis(20)), Duration::from_millis(5));
        assert_eq!(hedge_delay(Duration::from_millis(2)), Duration::from_millis(1));
        assert_eq!(hedge_delay(Duration::from_micros(500)), Duration::from_micros(500));
    }
}
