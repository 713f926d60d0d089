//! The `PrefixIndex` gRPC service: read-only longest-prefix queries over a replica's engine.
//!
//! Every request is validated before it touches the engine ([`crate::validate`]), so a
//! gateway gets a precise status instead of a silently empty answer. A request may carry a
//! consistency token (per-partition next offsets: another replica's `applied`, or
//! `Landed::token` of a publish); the service then waits — never longer than the request's own
//! deadline — until every record below them is applied. Nothing here writes: the engine is only
//! read, under its per-keyspace read lock, and all writes reach the replica through Kafka.
//! `Describe` and `ListWorkers` say what the replica serves (its shard) and which workers its
//! partitions announced.

use crate::error::clip;
use crate::error::QueryError;
use crate::health::Readiness;
use crate::metrics::QueryMetrics;
use crate::status::ReplicaStatus;
use crate::validate::{check, unknown_keyspace};
use parking_lot::Mutex;
use prefixlog_engine::{Engine, Keyspace, MatchOptions};
use prefixlog_proto::v1::{
    DescribeResponse, ListWorkersResponse, MatchRequest, MatchResponse, PartitionOffset, WorkerInfo,
    WorkerScore,
};
use prefixlog_state::{Applier, NextOffset};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tonic::{Request, Status};

/// Limits and waits of the query service.
#[derive(Clone, Debug)]
pub struct QueryConfig {
    /// Largest prompt, in blocks (after hashing token ids).
    pub max_blocks: usize,
    /// Largest request message the server decodes (bytes); larger ones get RESOURCE_EXHAUSTED
    /// from tonic before any work is done.
    pub max_decoding_message_size: usize,
    /// Concurrent `MatchStream` calls; one more gets RESOURCE_EXHAUSTED.
    pub max_concurrent_streams: usize,
    /// Requests of one `MatchStream` worked on at once (admitted and not yet answered); the
    /// stream reads no further request until one is answered ([`crate::stream`]).
    pub max_in_flight_per_stream: usize,
    /// How long a consistency-token wait may take when the request carries no `grpc-timeout`
    /// (and for each message of a stream).
    pub default_wait: Duration,
    /// Upper bound on any consistency-token wait, whatever the request's deadline says.
    pub max_wait: Duration,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            max_blocks: 8192,
            max_decoding_message_size: 4 << 20,
            max_concurrent_streams: 256,
            max_in_flight_per_stream: 32,
            default_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(10),
        }
    }
}

/// What the replica is, as every response and `Describe` report it.
#[derive(Clone, Debug)]
pub struct ReplicaInfo {
    /// Reported in every response, so a gateway knows which replica answered.
    pub replica_id: String,
    pub topic: String,
    pub partition_count: u32,
    /// Owned partitions, ascending.
    pub owned: Vec<u32>,
    /// `(index, count)` of `--shard I/N`; `(0, 1)` unsharded.
    pub shard: (u32, u32),
    /// Peer-service addresses of the other replicas of this shard.
    pub peers: Vec<String>,
}

/// The host name, or `replica-<pid>` when it cannot be read.
pub fn default_replica_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("replica-{}", std::process::id()))
}

/// What the service reads: the replica's engine, progress, applier (announced workers) and
/// readiness.
#[derive(Clone)]
pub struct ReplicaView {
    pub engine: Arc<Engine>,
    pub status: Arc<ReplicaStatus>,
    /// For `ListWorkers`; without it the list is empty.
    pub applier: Option<Arc<Mutex<Applier>>>,
    pub info: Arc<ReplicaInfo>,
    pub readiness: Arc<Readiness>,
}

/// The service. Cheap to clone (all state is shared).
#[derive(Clone)]
pub struct QueryService {
    view: ReplicaView,
    cfg: Arc<QueryConfig>,
    streams: Arc<Semaphore>,
    metrics: Arc<QueryMetrics>,
}

impl QueryService {
    pub fn new(view: ReplicaView, cfg: QueryConfig, metrics: Arc<QueryMetrics>) -> Self {
        let streams = Arc::new(Semaphore::new(cfg.max_concurrent_streams));
        Self { view, cfg: Arc::new(cfg), streams, metrics }
    }

    pub fn config(&self) -> &QueryConfig {
        &self.cfg
    }

    /// The same service (replica, metrics, stream bound) with another prompt limit, for a
    /// facade whose upstream accepts longer prompts than `prefixlog.v1` does (the Dynamo HTTP
    /// facade: whatever fits in its 8 MiB body). The limit bounds the hashing of a prompt;
    /// the engine's walk stops at the first block no holder holds.
    pub fn with_max_blocks(&self, max_blocks: usize) -> Self {
        let cfg = QueryConfig { max_blocks, ..(*self.cfg).clone() };
        Self {
            view: self.view.clone(),
            cfg: Arc::new(cfg),
            streams: self.streams.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The replica this service answers from (for the services hosted next to it).
    pub fn view(&self) -> &ReplicaView {
        &self.view
    }

    /// The wait budget of a unary call with this `grpc-timeout` (see [`Self::wait_budget`]).
    pub fn wait_for_call(&self, timeout: Option<Duration>) -> Duration {
        self.wait_budget(timeout)
    }

    pub(crate) fn replica_id(&self) -> &str {
        &self.view.info.replica_id
    }

    /// Answers one request; `wait` bounds the consistency-token wait. A refusal is the gRPC
    /// status of [`Self::answer_typed`]'s error.
    pub async fn answer(&self, req: MatchRequest, wait: Duration) -> Result<MatchResponse, Status> {
        self.answer_typed(req, wait).await.map_err(Status::from)
    }

    /// [`Self::answer`] with the refusal as a [`QueryError`]: for the facades that answer in a
    /// protocol of their own (HTTP, SMG, the endpoint picker) and map the error themselves.
    pub async fn answer_typed(&self, req: MatchRequest, wait: Duration) -> Result<MatchResponse, QueryError> {
        let start = Instant::now();
        let r = self.answer_inner(req, wait).await;
        self.metrics.observe(start.elapsed(), r.as_ref().err().map(QueryError::code));
        r
    }

    async fn answer_inner(&self, req: MatchRequest, wait: Duration) -> Result<MatchResponse, QueryError> {
        let info = &self.view.info;
        let c = check(&req, self.cfg.max_blocks, info.partition_count)?;
        let status = &self.view.status;
        // Wait for the token before looking the keyspace up: a read-your-writes query may be
        // the first to name a keyspace that the awaited record creates.
        // Without a token, `stale` says whether this replica can vouch for its state now (ready,
        // broker heard from within `stale_after`: one atomic load); with one, whether the token
        // was reached.
        let mut stale = c.token.is_empty() && self.view.readiness.answers_stale();
        if !c.token.is_empty() {
            let reached = match self.token_unprovable(&c.token) {
                Some(why) if !req.allow_stale => return Err(QueryError::Unavailable(why)),
                Some(_) => false,
                None => status.wait_for(&c.token, wait).await,
            };
            if !reached {
                if !req.allow_stale {
                    return Err(token_not_reached(&c.token, &status.offsets(), wait));
                }
                stale = true;
            }
        }
        let Some(keyspace) = self.view.engine.keyspace(&c.keyspace) else {
            return Err(unknown_keyspace(&c.keyspace, &self.view.engine.keyspace_ids()));
        };
        // Offsets read *before* matching: everything below them is applied, so the answer
        // reflects at least these (possibly a little more).
        let applied = status.offsets();
        let scores = {
            // Timed: the one place a query can wait for the ingest thread (its write chunks).
            let waiting = Instant::now();
            let g = keyspace.read();
            self.metrics.observe_read_lock_wait(waiting.elapsed());
            scores(&g, &c.locals, &req, c.top_k, &c.candidates)
        };
        self.metrics.observe_match(&c.keyspace, scores.first().map_or(0, |s| s.depth), c.locals.len());
        Ok(MatchResponse {
            scores,
            applied: applied
                .into_iter()
                .map(|NextOffset { partition, offset }| PartitionOffset { partition, offset })
                .collect(),
            replica_id: info.replica_id.clone(),
            stale,
            query_blocks: c.locals.len() as u32,
            request_id: req.request_id,
            partitions: info.owned.clone(),
            partition_count: info.partition_count,
            error: None,
        })
    }

    /// Why this replica cannot truthfully say it reached `token`, if it cannot: a partition the
    /// token names was rewound (the log was recreated: its offsets and this state's are not
    /// comparable, whatever their values), or the token is not reached yet and never will be
    /// here (the log does not continue a named partition, ingest stopped on a bug, or the
    /// replica is stopping). Such a query gets UNAVAILABLE at once, to retry on another
    /// replica, instead of a wait that ends in DEADLINE_EXCEEDED or a false "reached".
    fn token_unprovable(&self, token: &[NextOffset]) -> Option<String> {
        let status = &self.view.status;
        let named = |ps: Vec<u32>| {
            ps.into_iter().filter(|p| token.iter().any(|t| t.partition == *p)).collect::<Vec<_>>()
        };
        let rewound = named(status.rewound());
        if !rewound.is_empty() {
            return Some(format!(
                "the log ends before this replica's state of partitions {rewound:?} (topic recreated?): \
                 the consistency token cannot be compared with what is applied"
            ));
        }
        if status.reached(token) {
            return None;
        }
        if let Some(why) = status.ingest_failure() {
            return Some(clip(
                &format!("consistency token not reached: the ingest thread stopped on a bug ({why})"),
                1000,
            ));
        }
        let failed = status.apply_failures();
        if let Some(f) = failed.iter().find(|f| token.iter().any(|t| t.partition == f.partition)) {
            return Some(clip(&format!("consistency token not reached: {f}"), 1000));
        }
        if self.view.readiness.is_stopping() {
            return Some("consistency token not reached: this replica is stopping".into());
        }
        let broken = named(status.discontinuous());
        (!broken.is_empty()).then(|| {
            format!(
                "consistency token not reached: the log does not continue this replica's state of \
                 partitions {broken:?} (see its error log)"
            )
        })
    }

    pub(crate) fn describe(&self) -> DescribeResponse {
        let info = &self.view.info;
        DescribeResponse {
            replica_id: info.replica_id.clone(),
            topic: info.topic.clone(),
            partition_count: info.partition_count,
            partitions: info.owned.clone(),
            shard: info.shard.0,
            shard_count: info.shard.1,
            peers: info.peers.clone(),
            ready: self.view.readiness.check().0,
            applied: self
                .view
                .status
                .offsets()
                .into_iter()
                .map(|NextOffset { partition, offset }| PartitionOffset { partition, offset })
                .collect(),
        }
    }

    pub(crate) fn list_workers(&self) -> ListWorkersResponse {
        let mut workers = Vec::new();
        if let Some(a) = &self.view.applier {
            let a = a.lock();
            for &p in &self.view.info.owned {
                for (w, meta) in &a.partition(p).workers {
                    workers.push(WorkerInfo {
                        worker: *w,
                        partition: p,
                        metadata: meta.clone().into_iter().collect(),
                    });
                }
            }
        }
        workers.sort_by_key(|w| w.worker);
        ListWorkersResponse {
            workers,
            partitions: self.view.info.owned.clone(),
            partition_count: self.view.info.partition_count,
        }
    }

    /// The wait budget of a unary request: its `grpc-timeout` minus a margin (a fifth, at most
    /// 100 ms) so that DEADLINE_EXCEEDED or the stale answer reaches the client before the
    /// client's own timer fires, also on a loaded machine (20 ms was too tight there: the
    /// client's timer won and the call ended CANCELLED); capped by `max_wait`.
    pub(crate) fn wait_budget(&self, timeout: Option<Duration>) -> Duration {
        match timeout {
            Some(d) => d.saturating_sub((d / 5).min(Duration::from_millis(100))),
            None => self.cfg.default_wait,
        }
        .min(self.cfg.max_wait)
    }

    /// A place for one more `MatchStream` call, or RESOURCE_EXHAUSTED at the limit.
    pub(crate) fn stream_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, QueryError> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            QueryError::ResourceExhausted(format!(
                "too many concurrent MatchStream calls (limit {})",
                self.cfg.max_concurrent_streams
            ))
        })
    }
}

/// The call's `grpc-timeout`, if it has one.
pub fn grpc_timeout<T>(req: &Request<T>) -> Option<Duration> {
    req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(parse_grpc_timeout)
}

/// Partitions shown at most in a DEADLINE_EXCEEDED message (it travels in gRPC metadata).
const UNREACHED_SHOWN: usize = 8;

/// DEADLINE_EXCEEDED for a token not reached in time, naming the owned partitions still
/// behind (a few of them: the message travels in gRPC metadata, 8 KiB soft limit).
fn token_not_reached(token: &[NextOffset], applied: &[NextOffset], wait: Duration) -> QueryError {
    let behind: Vec<String> = token
        .iter()
        .filter_map(|&NextOffset { partition: p, offset: want }| {
            let at = applied.iter().find(|a| a.partition == p)?.offset;
            (at < want).then(|| format!("partition {p} at {at}, wanted {want}"))
        })
        .collect();
    let more = behind.len().saturating_sub(UNREACHED_SHOWN);
    QueryError::TokenNotReached(format!(
        "consistency token not reached within {wait:?} (next offsets): {}{}",
        behind[..behind.len().min(UNREACHED_SHOWN)].join(", "),
        if more > 0 { format!(", and {more} more partitions") } else { String::new() }
    ))
}

/// The holders' scores, best first: the request's lane and interval options, candidates and
/// gap exclusion applied before `top_k`.
fn scores(
    g: &Keyspace,
    locals: &[u64],
    req: &MatchRequest,
    top_k: Option<usize>,
    candidates: &[u64],
) -> Vec<WorkerScore> {
    // The engine filters before `top_k`, so the k best are the k best of what is asked for.
    let (tiers, tier_weights) = crate::tiers::tier_options(req).expect("validated before matching");
    let opts = MatchOptions {
        intervals: req.intervals,
        top_k,
        lane: req.lane,
        // On the wire an empty list means every worker.
        candidates: (!candidates.is_empty()).then(|| candidates.to_vec()),
        exclude_gapped: req.exclude_gapped,
        tiers,
        tier_weights,
    };
    g.match_chain(locals, &opts).into_iter().map(crate::tiers::worker_score).collect()
}

/// Parses a `grpc-timeout` header value (`<up to 8 digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    if num.is_empty() || num.len() > 8 {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_engine::{EngineConfig, KeyspaceId};
    use prefixlog_proto::v1::{match_request::Prompt, BlockHashes, Keyspace as WireKeyspace};
    use std::sync::atomic::Ordering;

    /// A service over an empty engine with keyspace ("m", 4, 1), a 2-partition log owning both.
    fn service() -> (QueryService, Arc<ReplicaStatus>) {
        let engine = Arc::new(Engine::new(EngineConfig::default()));
        engine.keyspace_or_create(&KeyspaceId::new("m", 4, 1));
        let status = Arc::new(ReplicaStatus::new(2, &[0, 1]));
        let info = ReplicaInfo {
            replica_id: "r".into(),
            topic: "t".into(),
            partition_count: 2,
            owned: vec![0, 1],
            shard: (0, 1),
            peers: vec![],
        };
        let view = ReplicaView {
            engine,
            status: status.clone(),
            applier: None,
            info: Arc::new(info),
            readiness: Arc::new(Readiness::new(status.clone(), 0, crate::health::DEFAULT_STALE_AFTER)),
        };
        let metrics = Arc::new(QueryMetrics::new(&prometheus::Registry::new()).unwrap());
        (QueryService::new(view, QueryConfig::default(), metrics), status)
    }

    fn request(partition: u32, offset: i64, allow_stale: bool) -> MatchRequest {
        MatchRequest {
            keyspace: Some(WireKeyspace { model: "m".into(), block_size: 4, hash_scheme: 1 }),
            prompt: Some(Prompt::Hashes(BlockHashes { local: vec![1, 2] })),
            min_offsets: vec![PartitionOffset { partition, offset }],
            allow_stale,
            ..Default::default()
        }
    }

    /// A rewound partition's offsets belong to another log: a token naming it is never
    /// "reached", however large the applied offset (read-your-writes would silently break).
    #[tokio::test]
    async fn a_token_naming_a_rewound_partition_is_unavailable_at_once() {
        let (svc, status) = service();
        status.publish(0, 1000, 0);
        status.partitions[0].rewound.store(true, Ordering::Release);
        let wait = Duration::from_secs(5);
        let started = Instant::now();
        let err = svc.answer(request(0, 11, false), wait).await.expect_err("unprovable");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("[0]") && err.message().contains("recreated"), "{}", err.message());
        assert!(started.elapsed() < wait, "answered without waiting");
        let stale = svc.answer(request(0, 11, true), wait).await.expect("allow_stale answers");
        assert!(stale.stale);
        // The other partition is unaffected.
        status.publish(1, 20, 0);
        assert!(!svc.answer(request(1, 11, false), wait).await.expect("reached").stale);
    }

    /// A token that can no longer be reached (the log does not continue the partition, or the
    /// ingest thread stopped) fails at once instead of waiting out the deadline; one already
    /// reached is still answered.
    #[tokio::test]
    async fn a_token_that_cannot_be_reached_is_unavailable_at_once() {
        let (svc, status) = service();
        status.publish(0, 10, 0);
        status.partitions[0].discontinuous.store(true, Ordering::Release);
        let wait = Duration::from_secs(5);
        assert!(!svc.answer(request(0, 10, false), wait).await.expect("reached before the gap").stale);
        let err = svc.answer(request(0, 11, false), wait).await.expect_err("never reached");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        status.partitions[0].discontinuous.store(false, Ordering::Release);
        status.record_ingest_failure("a bug".into());
        let err = svc.answer(request(1, 1, false), wait).await.expect_err("ingest stopped");
        assert!(err.code() == tonic::Code::Unavailable && err.message().contains("a bug"), "{err:?}");
    }

    /// DEADLINE_EXCEEDED names only the partitions still behind, and a few of them.
    #[test]
    fn deadline_exceeded_names_a_few_partitions_behind() {
        let token: Vec<NextOffset> = (0..300).map(|p| NextOffset::new(p, 50)).collect();
        let applied: Vec<NextOffset> =
            (0..300).map(|p| NextOffset::new(p, if p == 7 { 60 } else { 1 })).collect();
        let s = Status::from(token_not_reached(&token, &applied, Duration::from_millis(5)));
        assert_eq!(s.code(), tonic::Code::DeadlineExceeded);
        assert!(s.message().contains("partition 0 at 1, wanted 50"), "{}", s.message());
        assert!(!s.message().contains("partition 7 "), "{}", s.message());
        assert!(s.message().contains("and 291 more"), "{}", s.message());
        assert!(s.message().len() < 1000, "{}", s.message().len());
    }

    #[test]
    fn grpc_timeout_header() {
        assert_eq!(parse_grpc_timeout("2m"), Some(Duration::from_millis(2)));
        assert_eq!(parse_grpc_timeout("1999u"), Some(Duration::from_micros(1999)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("m"), None);
        assert_eq!(parse_grpc_timeout("123456789n"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
    }
}
