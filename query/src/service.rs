//! The `PrefixIndex` gRPC service: read-only longest-prefix queries over a replica's engine.
//!
//! Every request is validated before it touches the engine (keyspace, scheme, prompt size), so
//! a gateway gets a precise status instead of a silently empty answer. A request may carry a
//! consistency token (per-partition minimum offsets, from the publisher's `Landed`); the
//! service then waits — never longer than the request's own deadline — until the replica has
//! applied those offsets. Nothing here writes: the engine is only read, under its per-keyspace
//! read lock, and all writes reach the replica through Kafka.

use crate::metrics::QueryMetrics;
use prefixlog_engine::scheme;
use prefixlog_engine::{Engine, KeyspaceId, MatchOptions};
use prefixlog_ingest::ReplicaStatus;
use prefixlog_proto::v1::{
    match_request::Prompt, prefix_index_server::PrefixIndex, Interval, MatchRequest, MatchResponse,
    PartitionOffset, WorkerScore,
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
    /// Reported in every response, so a gateway knows which replica answered.
    pub replica_id: String,
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
            replica_id: default_replica_id(),
            max_blocks: 8192,
            max_decoding_message_size: 4 << 20,
            max_concurrent_streams: 256,
            default_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(10),
        }
    }
}

/// The host name, or `replica-<pid>` when it cannot be read.
pub fn default_replica_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("replica-{}", std::process::id()))
}

/// The service. Cheap to clone (all state is shared).
#[derive(Clone)]
pub struct QueryService {
    engine: Arc<Engine>,
    status: Arc<ReplicaStatus>,
    cfg: Arc<QueryConfig>,
    streams: Arc<Semaphore>,
    metrics: Arc<QueryMetrics>,
}

impl QueryService {
    pub fn new(
        engine: Arc<Engine>,
        status: Arc<ReplicaStatus>,
        cfg: QueryConfig,
        metrics: Arc<QueryMetrics>,
    ) -> Self {
        let streams = Arc::new(Semaphore::new(cfg.max_concurrent_streams));
        Self { engine, status, cfg: Arc::new(cfg), streams, metrics }
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
        let ks = req.keyspace.as_ref().ok_or_else(|| Status::invalid_argument("keyspace is required"))?;
        if ks.block_size == 0 {
            return Err(Status::invalid_argument("keyspace.block_size must be > 0"));
        }
        let id = KeyspaceId::new(ks.model.clone(), ks.block_size, ks.hash_scheme);
        let locals = self.locals(&id, req.prompt)?;
        // Wait for the token before looking the keyspace up: a read-your-writes query may be
        // the first to name a keyspace that the awaited record creates.
        let token = self.token(&req.min_offsets)?;
        let mut stale = false;
        if !token.is_empty() && !self.status.wait_for(&token, wait).await {
            if !req.allow_stale {
                return Err(Status::deadline_exceeded(format!(
                    "consistency token not reached within {wait:?}: wanted {:?}, applied {:?}",
                    token,
                    self.status.offsets()
                )));
            }
            stale = true;
        }
        let Some(keyspace) = self.engine.keyspace(&id) else {
            let known: Vec<String> = self.engine.keyspace_ids().iter().map(|k| k.to_string()).collect();
            return Err(Status::not_found(format!(
                "no keyspace {id} on this replica (model/block size/hash scheme must match what the \
                 workers publish); known keyspaces: [{}]",
                known.join(", ")
            )));
        };
        // Offsets read *before* matching: everything up to them is applied, so the answer
        // reflects at least these (possibly a little more).
        let applied = self.status.offsets();
        let opts = MatchOptions {
            intervals: req.intervals,
            top_k: req.top_k.map(|k| k as usize),
            lane: req.lane,
            ..Default::default()
        };
        let matches = keyspace.read().match_chain(&locals, &opts);
        Ok(MatchResponse {
            scores: matches
                .into_iter()
                .map(|m| WorkerScore {
                    worker: m.holder.worker,
                    dp_rank: m.holder.dp_rank,
                    lane: m.holder.lane,
                    depth: m.depth,
                    total_blocks: m.total,
                    inferred: m.inferred,
                    intervals: m.intervals.into_iter().map(|(start, end)| Interval { start, end }).collect(),
                })
                .collect(),
            applied: applied
                .into_iter()
                .enumerate()
                .map(|(p, offset)| PartitionOffset { partition: p as u32, offset })
                .collect(),
            replica_id: self.cfg.replica_id.clone(),
            stale,
            query_blocks: locals.len() as u32,
            request_id: req.request_id,
        })
    }

    /// The prompt's local hashes. Token ids are hashed with the keyspace's scheme; a prompt
    /// shorter than one block is valid and matches nothing (engines cache full blocks only).
    fn locals(&self, id: &KeyspaceId, prompt: Option<Prompt>) -> Result<Vec<u64>, Status> {
        let too_many = |n: usize| {
            Status::invalid_argument(format!(
                "prompt has {n} blocks; this replica's limit is {}",
                self.cfg.max_blocks
            ))
        };
        match prompt {
            None => Err(Status::invalid_argument("empty prompt: set tokens or hashes")),
            Some(Prompt::Hashes(h)) if h.local.is_empty() => {
                Err(Status::invalid_argument("empty prompt: no block hashes"))
            }
            Some(Prompt::Hashes(h)) if h.local.len() > self.cfg.max_blocks => Err(too_many(h.local.len())),
            Some(Prompt::Hashes(h)) => Ok(h.local),
            Some(Prompt::Tokens(t)) => {
                if t.ids.is_empty() {
                    return Err(Status::invalid_argument("empty prompt: no token ids"));
                }
                if !scheme::is_known(id.scheme) {
                    return Err(Status::invalid_argument(format!(
                        "unknown hash scheme {} for token ids (this replica hashes scheme {}); \
                         send precomputed block hashes instead",
                        id.scheme,
                        scheme::SCHEME_XXH3_CHAINED
                    )));
                }
                let n = t.ids.len() / id.block_size as usize;
                if n > self.cfg.max_blocks {
                    return Err(too_many(n));
                }
                Ok(scheme::block_hashes_in(&t.namespace, &t.ids, id.block_size as usize))
            }
        }
    }

    fn token(&self, offs: &[PartitionOffset]) -> Result<Vec<(u32, i64)>, Status> {
        let parts = self.status.partitions.len() as u32;
        offs.iter()
            .map(|o| {
                if o.partition >= parts {
                    Err(Status::invalid_argument(format!(
                        "consistency token names partition {} but the log has {parts}",
                        o.partition
                    )))
                } else {
                    Ok((o.partition, o.offset))
                }
            })
            .collect()
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
