//! The query RPCs, answered from the replica's state through `QueryService::answer` (the path
//! of `prefixlog.v1` Match: limits, consistency, the engine's contiguous-prefix rule).
//!
//! Every query asks for lane 0 with `exclude_gapped` (upstream clients cannot see the gapped
//! flag, and a gapped holder may be credited with blocks it lost), on SGLang's three tiers:
//! a prefix match counts a block held on any of them, as upstream's does for a worker without
//! a cache spec, and `MatchExternalKv` lists each tier's hashes. A replica
//! that is not ready answers UNAVAILABLE (sgl-router then asks its next indexer, or routes on
//! load); a keyspace the replica does not hold yet answers empty (NOT_FOUND would make the
//! router fail every request with HTTP 503).

use super::pb::{
    ExternalKvNodeMatch, ExternalKvPrefixMatch, GetExternalKvHitCountsRequest,
    GetExternalKvHitCountsResponse, HitCountEntry, MatchExternalKvPrefixRequest,
    MatchExternalKvPrefixResponse, MatchExternalKvRequest, MatchExternalKvResponse, TierHashes, TierType,
};
use super::writer::{META_ADDRESS, META_WORKER_ID};
use super::{
    SglangConfig, MAX_HIT_COUNTED, MAX_MATCH_HASHES, MAX_PREFIX_INFLIGHT, SGLANG_LANE, SGLANG_TIERS,
};
use parking_lot::Mutex;
use prefixlog_engine::{partition_of, KeyspaceId, Tier};
use prefixlog_proto::v1::{match_request::Prompt, BlockHashes, Keyspace, MatchRequest, MatchResponse};
use prefixlog_query::{QueryError, QueryService};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tonic::Status;

/// How a worker is named in answers: `(worker_id, address)` from its `WorkerAdded` metadata.
type Names = HashMap<u64, (String, String)>;

pub struct Reader {
    keyspace: KeyspaceId,
    query: QueryService,
    inflight: Arc<Semaphore>,
    /// `count_as_hit` counters: per facade process, not applied state (they would make
    /// replicas differ), reset on restart.
    hits: Mutex<HashMap<i64, u64>>,
}

/// What a hit count update could not count (the counter map is full).
pub struct HitsDropped(pub u64);

impl Reader {
    pub fn new(cfg: &SglangConfig, query: QueryService) -> Self {
        Self {
            keyspace: cfg.keyspace(),
            query,
            inflight: Arc::new(Semaphore::new(MAX_PREFIX_INFLIGHT)),
            hits: Mutex::default(),
        }
    }

    /// Per worker, the longest run of `hashes` from the first that it holds (what sgl-router
    /// routes on).
    pub async fn match_prefix(
        &self,
        req: &MatchExternalKvPrefixRequest,
        wait: Duration,
    ) -> Result<MatchExternalKvPrefixResponse, Status> {
        if req.hashes.is_empty() {
            return Err(Status::invalid_argument("hashes must not be empty"));
        }
        let _permit = self.inflight.try_acquire().map_err(|_| {
            Status::resource_exhausted(format!("more than {MAX_PREFIX_INFLIGHT} prefix queries in flight"))
        })?;
        let mut n = req.hashes.len().min(self.query.config().max_blocks);
        if req.max_blocks > 0 {
            n = n.min(req.max_blocks as usize);
        }
        let Some(answer) = self.ask(&req.hashes[..n], &SGLANG_TIERS, false, wait).await? else {
            return Ok(MatchExternalKvPrefixResponse::default());
        };
        let mut depth: BTreeMap<u64, u32> = BTreeMap::new();
        for s in answer.scores.iter().filter(|s| s.depth > 0) {
            let d = depth.entry(s.worker).or_default();
            *d = (*d).max(s.depth);
        }
        let names = self.names(depth.keys().copied());
        let mut matches: Vec<ExternalKvPrefixMatch> = depth
            .into_iter()
            .filter_map(|(w, d)| {
                let (worker_id, address) = names.get(&w)?;
                (!address.is_empty()).then(|| ExternalKvPrefixMatch {
                    worker_address: address.clone(),
                    matched_prefix_blocks: d,
                    worker_id: worker_id.clone(),
                })
            })
            .collect();
        matches.sort_by(|a, b| {
            b.matched_prefix_blocks.cmp(&a.matched_prefix_blocks).then_with(|| a.worker_id.cmp(&b.worker_id))
        });
        Ok(MatchExternalKvPrefixResponse {
            best_prefix_blocks: matches.first().map_or(0, |m| m.matched_prefix_blocks),
            matches,
            blocks_read: n as u32,
        })
    }

    /// Per worker, which of `hashes` it holds. The hashes are read as one chain from the first
    /// (a page hash names its whole prefix, and the index files blocks by their path), so a
    /// hash listed out of its chain is not found: an under-report, never an over-report.
    pub async fn match_hashes(
        &self,
        req: &MatchExternalKvRequest,
        wait: Duration,
    ) -> Result<(MatchExternalKvResponse, HitsDropped), Status> {
        check_hash_list(&req.hashes, false)?;
        let n = req.hashes.len().min(self.query.config().max_blocks);
        let hashes = &req.hashes[..n];
        // Per worker and SGLang tier, which positions it holds: one query per tier, with intervals.
        let mut held: BTreeMap<u64, Vec<Vec<bool>>> = BTreeMap::new();
        for t in 0..SGLANG_TIERS.len() {
            let Some(answer) = self.ask(hashes, &SGLANG_TIERS[t..=t], true, wait).await? else {
                return Ok((MatchExternalKvResponse::default(), HitsDropped(0)));
            };
            for s in &answer.scores {
                let rows = held.entry(s.worker).or_insert_with(|| vec![vec![false; n]; SGLANG_TIERS.len()]);
                for i in &s.intervals {
                    let row = &mut rows[t][(i.start as usize).min(n)..(i.end as usize).min(n)];
                    row.iter_mut().for_each(|b| *b = true);
                }
            }
        }
        held.retain(|_, rows| rows.iter().flatten().any(|&b| b));
        let names = self.names(held.keys().copied());
        let mut hit = vec![false; n];
        let matches = held
            .into_iter()
            .map(|(w, rows)| {
                let (worker_id, address) =
                    names.get(&w).cloned().unwrap_or_else(|| (w.to_string(), String::new()));
                let hashes_by_tier = rows
                    .iter()
                    .zip(SGLANG_TIERS)
                    .filter(|(row, _)| row.iter().any(|&b| b))
                    .map(|(row, (sgl, _))| {
                        row.iter().zip(hit.iter_mut()).for_each(|(b, h)| *h |= *b);
                        let mine = row.iter().zip(hashes).filter(|(b, _)| **b).map(|(_, h)| *h).collect();
                        TierHashes { tier: sgl as i32, hashes: mine, ..Default::default() }
                    })
                    .collect();
                ExternalKvNodeMatch { worker_id, address, hashes_by_tier }
            })
            .collect();
        let dropped = if req.count_as_hit {
            self.count_hits(hit.iter().zip(hashes).filter(|(b, _)| **b).map(|(_, h)| *h))
        } else {
            HitsDropped(0)
        };
        Ok((MatchExternalKvResponse { matches }, dropped))
    }

    /// The `count_as_hit` counts of `hashes` (every counted hash, up to the request limit,
    /// when `hashes` is empty).
    pub fn hit_counts(
        &self,
        req: &GetExternalKvHitCountsRequest,
    ) -> Result<GetExternalKvHitCountsResponse, Status> {
        check_hash_list(&req.hashes, true)?;
        let hits = self.hits.lock();
        let entries = if req.hashes.is_empty() {
            let mut all: Vec<HitCountEntry> = hits
                .iter()
                .map(|(&hash, &hit_count_total)| HitCountEntry { hash, hit_count_total })
                .collect();
            all.sort_by_key(|e| e.hash);
            all.truncate(MAX_MATCH_HASHES);
            all
        } else {
            let count = |h: &i64| hits.get(h).copied().unwrap_or(0);
            req.hashes.iter().map(|&hash| HitCountEntry { hash, hit_count_total: count(&hash) }).collect()
        };
        Ok(GetExternalKvHitCountsResponse { entries })
    }

    fn count_hits(&self, hashes: impl Iterator<Item = i64>) -> HitsDropped {
        let mut hits = self.hits.lock();
        let mut dropped = 0;
        for h in hashes {
            let full = hits.len() >= MAX_HIT_COUNTED;
            match hits.get_mut(&h) {
                Some(c) => *c += 1,
                None if full => dropped += 1,
                None => {
                    hits.insert(h, 1);
                }
            }
        }
        HitsDropped(dropped)
    }

    /// The replica's answer for `hashes` as a prompt (None: it holds no such keyspace yet).
    async fn ask(
        &self,
        hashes: &[i64],
        tiers: &[(TierType, Tier)],
        intervals: bool,
        wait: Duration,
    ) -> Result<Option<MatchResponse>, Status> {
        if !self.query.view().readiness.is_ready() {
            return Err(Status::unavailable(
                "this replica is not ready (catching up with the log); ask another",
            ));
        }
        let ks = &self.keyspace;
        let req = MatchRequest {
            tiers: crate::tier_codes(tiers.iter().map(|&(_, t)| t)),
            keyspace: Some(Keyspace {
                model: ks.model.clone(),
                block_size: ks.block_size,
                hash_scheme: ks.scheme,
            }),
            prompt: Some(Prompt::Hashes(BlockHashes { local: hashes.iter().map(|&h| h as u64).collect() })),
            intervals,
            lane: Some(SGLANG_LANE),
            exclude_gapped: true,
            ..Default::default()
        };
        match self.query.answer_typed(req, wait).await {
            Ok(r) => Ok(Some(r)),
            Err(QueryError::UnknownKeyspace(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `(sgl.worker_id, address)` of each worker, from its recorded metadata (one lock).
    fn names(&self, workers: impl Iterator<Item = u64>) -> Names {
        let view = self.query.view();
        let Some(applier) = &view.applier else { return Names::new() };
        let a = applier.lock();
        workers
            .filter_map(|w| {
                let m = a.partition(partition_of(w, view.info.partition_count)).workers.get(&w)?;
                let id = m.get(META_WORKER_ID).cloned().unwrap_or_else(|| w.to_string());
                Some((w, (id, m.get(META_ADDRESS).cloned().unwrap_or_default())))
            })
            .collect()
    }
}

fn check_hash_list(hashes: &[i64], empty_ok: bool) -> Result<(), Status> {
    if hashes.is_empty() && !empty_ok {
        return Err(Status::invalid_argument("hashes must not be empty"));
    }
    if hashes.len() > MAX_MATCH_HASHES {
        return Err(Status::resource_exhausted(format!(
            "{} hashes; at most {MAX_MATCH_HASHES}",
            hashes.len()
        )));
    }
    Ok(())
}
