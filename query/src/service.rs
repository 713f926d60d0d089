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

use crate::health::Readiness;
use crate::metrics::QueryMetrics;
use crate::validate::{check, unknown_keyspace};
use parking_lot::Mutex;
use prefixlog_engine::{Engine, Keyspace, MatchOptions};
use prefixlog_ingest::{Applier, ReplicaStatus};
use prefixlog_proto::v1::{
    prefix_index_server::PrefixIndex, DescribeRequest, DescribeResponse, Interval, ListWorkersRequest,
    ListWorkersResponse, MatchRequest, MatchResponse, PartitionOffset, WorkerInfo, WorkerScore,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

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

    /// Answers one request; `wait` bounds the consistency-token wait.
    pub async fn answer(&self, req: MatchRequest, wait: Duration) -> Result<MatchResponse, Status> {
        let start = Instant::now();
        let r = self.answer_inner(req, wait).await;
        self.metrics.observe(start.elapsed(), r.as_ref().err().map(|s| s.code()));
        r
    }

    async fn answer_inner(&self, req: MatchRequest, wait: Duration) -> Result<MatchResponse, Status> {
        let info = &self.view.info;
        let c = check(&req, self.cfg.max_blocks, info.partition_count)?;
        let status = &self.view.status;
        // Wait for the token before looking the keyspace up: a read-your-writes query may be
        // the first to name a keyspace that the awaited record creates.
        let mut stale = false;
        if !c.token.is_empty() && !status.wait_for(&c.token, wait).await {
            if !req.allow_stale {
                return Err(Status::deadline_exceeded(format!(
                    "consistency token not reached within {wait:?}: wanted {:?} (next offsets), applied {:?}",
                    c.token,
                    status.offsets()
                )));
            }
            stale = true;
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
        self.metrics.observe_depth(&c.keyspace, scores.first().map_or(0, |s| s.depth));
        Ok(MatchResponse {
            scores,
            applied: applied
                .into_iter()
                .map(|(partition, offset)| PartitionOffset { partition, offset })
                .collect(),
            replica_id: info.replica_id.clone(),
            stale,
            query_blocks: c.locals.len() as u32,
            request_id: req.request_id,
            partitions: info.owned.clone(),
            partition_count: info.partition_count,
        })
    }

    fn describe(&self) -> DescribeResponse {
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
                .map(|(partition, offset)| PartitionOffset { partition, offset })
                .collect(),
        }
    }

    fn list_workers(&self) -> ListWorkersResponse {
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
    fn wait_budget<T>(&self, req: &Request<T>) -> Duration {
        let deadline =
            req.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(parse_grpc_timeout);
        match deadline {
            Some(d) => d.saturating_sub((d / 5).min(Duration::from_millis(100))),
            None => self.cfg.default_wait,
        }
        .min(self.cfg.max_wait)
    }
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
    let opts = MatchOptions {
        intervals: req.intervals,
        top_k,
        lane: req.lane,
        // On the wire an empty list means every worker.
        candidates: (!candidates.is_empty()).then(|| candidates.to_vec()),
        exclude_gapped: req.exclude_gapped,
    };
    g.match_chain(locals, &opts)
        .into_iter()
        .map(|m| WorkerScore {
            worker: m.holder.worker,
            dp_rank: m.holder.dp_rank,
            lane: m.holder.lane,
            depth: m.depth,
            total_blocks: m.total,
            inferred: m.inferred,
            intervals: m.intervals.into_iter().map(|(start, end)| Interval { start, end }).collect(),
            gapped: m.gapped,
        })
        .collect()
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

type MatchStream = Pin<Box<dyn Stream<Item = Result<MatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl PrefixIndex for QueryService {
    async fn r#match(&self, request: Request<MatchRequest>) -> Result<Response<MatchResponse>, Status> {
        let wait = self.wait_budget(&request);
        self.answer(request.into_inner(), wait).await.map(Response::new)
    }

    async fn describe(&self, _: Request<DescribeRequest>) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(QueryService::describe(self)))
    }

    async fn list_workers(
        &self,
        _: Request<ListWorkersRequest>,
    ) -> Result<Response<ListWorkersResponse>, Status> {
        Ok(Response::new(QueryService::list_workers(self)))
    }

    type MatchStreamStream = MatchStream;

    async fn match_stream(
        &self,
        request: Request<Streaming<MatchRequest>>,
    ) -> Result<Response<Self::MatchStreamStream>, Status> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "too many concurrent MatchStream calls (limit {})",
                self.cfg.max_concurrent_streams
            ))
        })?;
        let mut inbound = request.into_inner();
        let svc = self.clone();
        // Answers in request order; a failed query ends the stream with its status (the
        // request_id of earlier answers tells the client which ones succeeded).
        let out = async_stream(move |tx| async move {
            let _permit = permit;
            while let Some(req) = inbound.next().await {
                let r = match req {
                    Ok(req) => svc.answer(req, svc.cfg.default_wait.min(svc.cfg.max_wait)).await,
                    // Same contract as unary calls (see `server::oversize_is_resource_exhausted`).
                    Err(s) if s.code() == tonic::Code::OutOfRange => {
                        Err(Status::resource_exhausted(s.message()))
                    }
                    Err(s) => Err(s),
                };
                let failed = r.is_err();
                if tx.send(r).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(out))
    }
}

/// A stream fed by a spawned task through a small channel (keeps tonic's stream type simple
/// without an extra macro crate).
fn async_stream<F, Fut>(f: F) -> MatchStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<MatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

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
