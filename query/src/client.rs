//! The gateway client: ask the index under a hard deadline, and fail open.
//!
//! A gateway must keep routing whatever the index does, so [`IndexClient::match_prompt`] never
//! returns an error: it returns scores, an empty answer, or [`MatchOutcome::Unavailable`] with
//! a reason (timeout, disconnected, overloaded, rejected) that the gateway may log and then
//! route without the index.
//!
//! Endpoint choice: every replica endpoint has a lazily connected channel (tonic reconnects it
//! on use). A background task probes each endpoint's `grpc.health.v1` status (SERVING only once
//! the replica has caught up) every `probe_interval`; a query goes to the healthy endpoint with
//! the most applied records (sum of the `applied` offsets of its last answer: the least lagged),
//! and fails over to the next one on a transport error or when the endpoint does not answer
//! within its share of the deadline (what is left, split over the endpoints still to try).

use prefixlog_engine::{HolderKey, KeyspaceId};
use prefixlog_ingest::{Landed, PublishError, Publisher};
use prefixlog_proto::v1::{self, prefix_index_client::PrefixIndexClient, MatchRequest, WorkerScore};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};

/// The prompt: token ids (the replica hashes them with the keyspace's scheme) or canonical
/// block hashes computed by the gateway (`prefixlog_engine::scheme::block_hashes`).
#[derive(Clone, Debug)]
pub enum Prompt {
    Tokens(Vec<u32>),
    Hashes(Vec<u64>),
}

/// One query. Build with [`MatchQuery::new`] and the builder methods.
#[derive(Clone, Debug)]
pub struct MatchQuery {
    pub keyspace: KeyspaceId,
    pub prompt: Prompt,
    pub top_k: Option<u32>,
    pub lane: Option<u32>,
    pub intervals: bool,
    /// Consistency token in next offsets: answer only after every record below these
    /// (partition, offset)s is applied (see [`MatchQuery::after`], [`MatchQuery::at_least`]).
    pub min_offsets: Vec<(u32, i64)>,
    /// Non-empty: score only these workers.
    pub candidates: Vec<u64>,
    /// Leave out holders whose event stream had a gap.
    pub exclude_gapped: bool,
    pub allow_stale: bool,
    /// For token prompts: the namespace (LoRA adapter name) the request runs under; "" = base.
    /// Hash prompts carry their namespace in the hashes already (`scheme::block_hashes_in`).
    pub namespace: String,
}

impl MatchQuery {
    pub fn new(keyspace: KeyspaceId, prompt: Prompt) -> Self {
        Self {
            keyspace,
            prompt,
            top_k: None,
            lane: None,
            intervals: false,
            min_offsets: vec![],
            candidates: vec![],
            exclude_gapped: false,
            allow_stale: false,
            namespace: String::new(),
        }
    }

    /// Only these workers (e.g. the pods this gateway may route to).
    pub fn candidates(mut self, workers: impl IntoIterator<Item = u64>) -> Self {
        self.candidates = workers.into_iter().collect();
        self
    }

    /// Read your writes from another replica's answer: its `applied` offsets, unchanged.
    pub fn at_least(mut self, applied: &[(u32, i64)]) -> Self {
        self.min_offsets.extend_from_slice(applied);
        self
    }

    /// A token prompt under a LoRA adapter (or another namespace): matched only against
    /// blocks that engines stored under the same adapter.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Read-your-writes: the answer reflects at least these landed records.
    pub fn after(mut self, landed: &[Landed]) -> Self {
        self.min_offsets.extend(landed.iter().map(Landed::token));
        self
    }

    pub fn top_k(mut self, k: u32) -> Self {
        self.top_k = Some(k);
        self
    }

    fn to_request(&self) -> MatchRequest {
        MatchRequest {
            keyspace: Some(v1::Keyspace {
                model: self.keyspace.model.clone(),
                block_size: self.keyspace.block_size,
                hash_scheme: self.keyspace.scheme,
            }),
            prompt: Some(match &self.prompt {
                Prompt::Tokens(t) => v1::match_request::Prompt::Tokens(v1::TokenIds {
                    ids: t.clone(),
                    namespace: self.namespace.clone(),
                }),
                Prompt::Hashes(h) => v1::match_request::Prompt::Hashes(v1::BlockHashes { local: h.clone() }),
            }),
            intervals: self.intervals,
            top_k: self.top_k,
            lane: self.lane,
            min_offsets: self
                .min_offsets
                .iter()
                .map(|&(partition, offset)| v1::PartitionOffset { partition, offset })
                .collect(),
            allow_stale: self.allow_stale,
            request_id: 0,
            candidate_workers: self.candidates.clone(),
            exclude_gapped: self.exclude_gapped,
        }
    }
}

/// A replica's answer.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Best first (depth descending, then worker, dp rank, lane).
    pub scores: Vec<WorkerScore>,
    /// Next offset per partition at the replica when it answered (pass as `answered_at`).
    pub applied: Vec<(u32, i64)>,
    pub replica_id: String,
    pub stale: bool,
    pub endpoint: String,
}

/// Why the index could not answer. Every variant means: route without the index.
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

#[derive(Clone, Debug)]
pub enum MatchOutcome {
    /// At least one worker holds a prefix.
    Scores(Answer),
    /// No worker holds any prefix of the prompt.
    Empty(Answer),
    Unavailable(Unavailable),
}

struct Ep {
    url: String,
    client: PrefixIndexClient<Channel>,
    health: HealthClient<Channel>,
    healthy: AtomicBool,
    applied_sum: AtomicI64,
    timeouts: AtomicU32,
}

struct Inner {
    eps: Vec<Ep>,
    deadline: Duration,
}

/// A fail-open client over several replica endpoints. Cheap to clone.
#[derive(Clone)]
pub struct IndexClient {
    inner: Arc<Inner>,
    publisher: Option<(Publisher, String)>,
}

/// Consecutive timeouts after which an endpoint counts as unhealthy until its next good probe
/// (a single timeout may be one slow query; a black-holed host times out every time).
const TIMEOUTS_UNHEALTHY: u32 = 3;

impl IndexClient {
    /// `endpoints` like `http://10.0.0.5:50151`. Must be called inside a tokio runtime (starts
    /// the background health prober). Fails only on a malformed endpoint URL.
    pub fn new(endpoints: Vec<String>, default_deadline: Duration) -> Result<Self, tonic::transport::Error> {
        Self::with_probe_interval(endpoints, default_deadline, Duration::from_millis(200))
    }

    pub fn with_probe_interval(
        endpoints: Vec<String>,
        default_deadline: Duration,
        probe_interval: Duration,
    ) -> Result<Self, tonic::transport::Error> {
        Self::build(endpoints, default_deadline, probe_interval, None)
    }

    /// Like [`Self::new`], over TLS (`https://` endpoints): `tls` carries the CA to trust and,
    /// for replicas that require mutual TLS, this gateway's certificate.
    pub fn with_tls(
        endpoints: Vec<String>,
        default_deadline: Duration,
        tls: tonic::transport::ClientTlsConfig,
    ) -> Result<Self, tonic::transport::Error> {
        Self::build(endpoints, default_deadline, Duration::from_millis(200), Some(tls))
    }

    fn build(
        endpoints: Vec<String>,
        default_deadline: Duration,
        probe_interval: Duration,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Result<Self, tonic::transport::Error> {
        let mut eps = Vec::new();
        for url in endpoints {
            let mut ep = Endpoint::from_shared(url.clone())?;
            if let Some(t) = &tls {
                ep = ep.tls_config(t.clone())?;
            }
            let ch = ep.tcp_nodelay(true).connect_timeout(Duration::from_secs(1)).connect_lazy();
            eps.push(Ep {
                url,
                client: PrefixIndexClient::new(ch.clone()),
                health: HealthClient::new(ch),
                // Optimistic until the first probe, so the first queries need not wait for it.
                healthy: AtomicBool::new(true),
                applied_sum: AtomicI64::new(0),
                timeouts: AtomicU32::new(0),
            });
        }
        let inner = Arc::new(Inner { eps, deadline: default_deadline });
        tokio::spawn(probe_loop(Arc::downgrade(&inner), probe_interval));
        Ok(Self { inner, publisher: None })
    }

    /// Adds the publisher used by [`Self::publish_placement`] (`gateway` names this gateway in
    /// the placement records).
    pub fn with_publisher(self, publisher: Publisher, gateway: impl Into<String>) -> Self {
        Self { publisher: Some((publisher, gateway.into())), ..self }
    }

    /// Endpoints currently considered healthy.
    pub fn healthy_endpoints(&self) -> Vec<String> {
        self.inner.eps.iter().filter(|e| e.healthy.load(Ordering::Relaxed)).map(|e| e.url.clone()).collect()
    }

    /// [`Self::match_with_deadline`] with the client's default deadline.
    pub async fn match_prompt(&self, q: &MatchQuery) -> MatchOutcome {
        self.match_with_deadline(q, self.inner.deadline).await
    }

    /// Queries the best endpoint, failing over to the next on transport errors, all within
    /// `deadline`.
    pub async fn match_with_deadline(&self, q: &MatchQuery, deadline: Duration) -> MatchOutcome {
        let end = Instant::now() + deadline;
        let req = q.to_request();
        let mut last = Unavailable::Disconnected("no endpoints configured".into());
        let order = self.order();
        let mut timed_out: Vec<usize> = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let ep = &self.inner.eps[i];
            let Some(left) = end.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                break;
            };
            // Split what is left over the endpoints still to try: a hung replica (accepting
            // connections but not answering: a stuck process, a host going down) costs at most
            // its share, and the next one still gets an answer in within the deadline.
            let budget = left / (order.len() - k) as u32;
            let mut r = tonic::Request::new(req.clone());
            r.set_timeout(budget);
            let mut client = ep.client.clone();
            let res = match tokio::time::timeout(budget, client.r#match(r)).await {
                Err(_) => Err(tonic::Status::deadline_exceeded("client deadline")),
                Ok(r) => r,
            };
            match res {
                Ok(resp) => {
                    let m = resp.into_inner();
                    ep.timeouts.store(0, Ordering::Relaxed);
                    ep.applied_sum.store(m.applied.iter().map(|o| o.offset.max(0)).sum(), Ordering::Relaxed);
                    // Another replica answered in time: stop preferring the ones that did not,
                    // until their next good probe.
                    for &j in &timed_out {
                        self.inner.eps[j].healthy.store(false, Ordering::Relaxed);
                    }
                    let a = Answer {
                        applied: m.applied.iter().map(|o| (o.partition, o.offset)).collect(),
                        scores: m.scores,
                        replica_id: m.replica_id,
                        stale: m.stale,
                        endpoint: ep.url.clone(),
                    };
                    return if a.scores.is_empty() {
                        MatchOutcome::Empty(a)
                    } else {
                        MatchOutcome::Scores(a)
                    };
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
                    code => {
                        return MatchOutcome::Unavailable(Unavailable::Rejected {
                            code,
                            message: s.message().into(),
                        })
                    }
                },
            }
        }
        if !timed_out.is_empty() {
            last = Unavailable::Timeout;
        }
        MatchOutcome::Unavailable(last)
    }

    /// Endpoint indices to try: healthy ones, least lagged first, then the others (a probe may
    /// not have run yet, or may be stale; trying them beats giving up within the deadline).
    fn order(&self) -> Vec<usize> {
        let eps = &self.inner.eps;
        let mut idx: Vec<usize> = (0..eps.len()).collect();
        idx.sort_by_key(|&i| {
            let e = &eps[i];
            (!e.healthy.load(Ordering::Relaxed), std::cmp::Reverse(e.applied_sum.load(Ordering::Relaxed)))
        });
        idx
    }

    /// Publishes "I routed this chain to `holder`" and returns where it landed: pass it to
    /// [`MatchQuery::after`] so the next query sees the placement. `answered_at` is the
    /// [`Answer::applied`] the routing decision was based on (for audits), if any.
    pub async fn publish_placement(
        &self,
        keyspace: &KeyspaceId,
        holder: HolderKey,
        locals: &[u64],
        answered_at: &[(u32, i64)],
    ) -> Result<Landed, PublishError> {
        let (p, gw) = self.publisher.as_ref().expect("IndexClient::with_publisher was not called");
        p.publish_placement(keyspace, holder, locals, answered_at, gw, None).await
    }
}

async fn probe_loop(inner: Weak<Inner>, every: Duration) {
    // A probe may take longer than the interval on a loaded host; a slow answer is still an
    // answer. Probes of different endpoints run concurrently so one black hole delays none.
    let timeout = every.max(Duration::from_secs(1));
    loop {
        let Some(strong) = inner.upgrade() else { return };
        let probes: Vec<_> = (0..strong.eps.len())
            .map(|i| {
                let inner = strong.clone();
                tokio::spawn(async move {
                    let ep = &inner.eps[i];
                    let mut h = ep.health.clone();
                    let req = HealthCheckRequest { service: crate::health::SERVICE_NAME.into() };
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
