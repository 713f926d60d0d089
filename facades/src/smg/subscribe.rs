//! The `Subscribe` stream: one `Match` per `Query`, carrying its `query_id`, answered from the
//! replica through `QueryService::answer` (the path of `prefixlog.v1` Match).
//!
//! Each query asks for lane 0 with intervals and `exclude_gapped` (an SMG client cannot see the
//! gapped flag, and a gapped holder may be credited with blocks it lost). Per holder:
//! `matched_blocks` = the engine's depth (the held run from position 0), `total_blocks`,
//! `event_fed` = not inferred, every held run as `intervals`, `lane_meta` = its `Added.metadata`.
//! Ordered by `matched_blocks` descending, then holder name (as upstream: converged replicas
//! return the same list). Workers with no `smg.holder` name are left out (not SMG holders).
//!
//! `Match` has no error field, so a query that cannot be answered gets an empty `Match` (as
//! upstream answers an unknown keyspace, an unsupported scheme or too many hashes), counted by
//! reason; the stream stays open. Queries are answered concurrently, at most
//! [`MAX_QUERIES_IN_FLIGHT`] per stream; answers go out as they are ready (routed by
//! `query_id`). A reader that does not keep up loses answers (counted, `match_dropped`).

use super::pb::{HolderScore, Interval, Match, Query};
use super::writer::{from_hex, META_HOLDER, META_LANE_META};
use super::{keyspace, LANE, MAX_QUERIES_IN_FLIGHT, MAX_UPDATE_BLOCKS, OUT_BUFFER};
use crate::metrics::FacadeMetrics;
use crate::names::{worker_id, SMG_SEED};
use prefixlog_engine::partition_of;
use prefixlog_proto::v1::{match_request::Prompt, BlockHashes, Keyspace, MatchRequest, MatchResponse};
use prefixlog_query::{QueryError, QueryService};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::{Status, Streaming};

/// What the server sends: answers, and at most one status that ends the stream.
pub type MatchOut = Pin<Box<dyn Stream<Item = Result<Match, Status>> + Send>>;
type Tx = Sender<Result<Match, Status>>;

/// Serves one `Subscribe` call on a task of its own.
/// `place` (one of the facade's stream places) is held until the stream ends.
pub fn serve(
    query: QueryService,
    metrics: FacadeMetrics,
    mut inbound: Streaming<Query>,
    place: OwnedSemaphorePermit,
) -> MatchOut {
    let (tx, rx) = tokio::sync::mpsc::channel(OUT_BUFFER);
    tokio::spawn(async move {
        let _place = place;
        let inflight = Arc::new(Semaphore::new(MAX_QUERIES_IN_FLIGHT));
        let mut code = tonic::Code::Ok;
        while let Some(q) = inbound.next().await {
            let q = match q {
                Ok(q) => q,
                Err(s) => {
                    code = super::inbound_status(s).code();
                    break;
                }
            };
            let Ok(permit) = inflight.clone().try_acquire_owned() else {
                metrics.skipped("subscribe_overloaded", 1);
                send(&tx, &metrics, empty(q.query_id));
                continue;
            };
            let (query, metrics, tx) = (query.clone(), metrics.clone(), tx.clone());
            tokio::spawn(async move {
                let m = answer(&query, &metrics, q).await;
                send(&tx, &metrics, m);
                drop(permit);
            });
        }
        metrics.request("Subscribe", code);
    });
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

fn send(tx: &Tx, metrics: &FacadeMetrics, m: Match) {
    if let Err(TrySendError::Full(_)) = tx.try_send(Ok(m)) {
        metrics.skipped("match_dropped", 1);
    }
}

fn empty(query_id: u64) -> Match {
    Match { query_id, scores: Vec::new() }
}

/// One query's answer (empty, counted by reason, when it cannot be answered).
pub async fn answer(query: &QueryService, metrics: &FacadeMetrics, q: Query) -> Match {
    match ask(query, &q).await {
        Ok(Some(r)) => Match { query_id: q.query_id, scores: scores(query, &r) },
        Ok(None) => empty(q.query_id),
        Err(reason) => {
            metrics.skipped(reason, 1);
            empty(q.query_id)
        }
    }
}

/// The replica's answer (None: nothing to answer from: no hashes, or no such keyspace yet),
/// or the reason it was not asked or failed.
async fn ask(query: &QueryService, q: &Query) -> Result<Option<MatchResponse>, &'static str> {
    let ks = keyspace::map(q.keyspace.as_ref()).map_err(|e| e.reason())?;
    if q.content_hashes.len() > MAX_UPDATE_BLOCKS {
        return Err("query_too_long");
    }
    if q.content_hashes.is_empty() {
        return Ok(None);
    }
    if !query.view().readiness.is_ready() {
        return Err("not_ready");
    }
    // Longer than the replica's limit: cut (depths can only come out shorter).
    let n = q.content_hashes.len().min(query.config().max_blocks);
    let req = MatchRequest {
        tiers: crate::tier_codes(crate::GPU_ONLY),
        keyspace: Some(Keyspace { model: ks.model, block_size: ks.block_size, hash_scheme: ks.scheme }),
        prompt: Some(Prompt::Hashes(BlockHashes { local: q.content_hashes[..n].to_vec() })),
        intervals: true,
        lane: Some(LANE),
        exclude_gapped: true,
        request_id: q.query_id,
        ..Default::default()
    };
    match query.answer_typed(req, query.wait_for_call(None)).await {
        Ok(r) => Ok(Some(r)),
        Err(QueryError::UnknownKeyspace(_)) => Ok(None),
        Err(_) => Err("query_failed"),
    }
}

/// The answer's scores as SMG holder scores, named and ordered.
fn scores(query: &QueryService, r: &MatchResponse) -> Vec<HolderScore> {
    let names = names(query, r.scores.iter().map(|s| s.worker));
    let mut out: Vec<HolderScore> = r
        .scores
        .iter()
        .filter_map(|s| {
            let (holder, lane_meta) = names.get(&s.worker)?;
            Some(HolderScore {
                holder: holder.clone(),
                matched_blocks: s.depth,
                total_blocks: u64::from(s.total_blocks),
                event_fed: !s.inferred,
                intervals: s.intervals.iter().map(|i| Interval { start: i.start, end: i.end }).collect(),
                lane_meta: lane_meta.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| b.matched_blocks.cmp(&a.matched_blocks).then_with(|| a.holder.cmp(&b.holder)));
    out
}

/// `(smg.holder, lane_meta)` of each worker that has an SMG name (one lock). A name that does
/// not map to the worker's id (metadata written by another publisher) is not used: its blocks
/// would be credited to a holder that does not hold them.
fn names(query: &QueryService, workers: impl Iterator<Item = u64>) -> HashMap<u64, (String, Vec<u8>)> {
    let view = query.view();
    let Some(applier) = &view.applier else { return HashMap::new() };
    let a = applier.lock();
    workers
        .filter_map(|w| {
            let m = a.partition(partition_of(w, view.info.partition_count)).workers.get(&w)?;
            let name = m.get(META_HOLDER).filter(|n| worker_id(SMG_SEED, n) == w)?.clone();
            let meta = m.get(META_LANE_META).and_then(|h| from_hex(h)).unwrap_or_default();
            Some((w, (name, meta)))
        })
        .collect()
}
