//! What the query routes share: readiness, typed errors with their HTTP status, the match
//! through `QueryService::answer` (the path of `prefixlog.v1` Match: validation, the engine's
//! contiguous-prefix rule), and Mooncake's `/query`.
//!
//! Every query asks for lane 0 with `exclude_gapped` (a gapped holder may be credited with
//! blocks it lost). The Dynamo dialect ([`super::dynamo`]) counts the gpu, host, disk and
//! external tiers as upstream's cumulative `gpu`, `cpu` and `disk`; the Mooncake dialect
//! names its keyspace `(model, block_size, scheme 1)` and counts the gpu, host and disk tiers,
//! its `GPU`, `CPU` and `DISK` media.

use super::mooncake::{mooncake_response, MediaDepths, MooncakeQuery, MooncakeResponse};
use super::wire::Holder;
use super::{DEFAULT_TENANT, META_INSTANCE, META_TENANT};
use axum::http::StatusCode;
use prefixlog_engine::{partition_of, scheme::SCHEME_XXH3_CHAINED, KeyspaceId, Tier};
use prefixlog_proto::v1::match_request::Prompt;
use prefixlog_proto::v1::{Keyspace, MatchRequest, TokenIds, WorkerScore};
use prefixlog_query::{QueryError as Refused, QueryService};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A worker's recorded metadata (`None`: this replica keeps none).
pub(super) type Meta<'a> = Option<&'a BTreeMap<String, String>>;

/// Why a request is not answered; each carries the HTTP status upstream would answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("this replica is not ready (catching up with the log); ask another")]
    NotReady,
    /// Upstream's wording.
    #[error("no indexer for model={model} routing_group={group}")]
    NoIndexer { model: String, group: String },
    #[error(
        "no indexer for model={model} block_size={block_size} (no keyspace of hash scheme 1 on this replica)"
    )]
    NoKeyspace { model: String, block_size: u32 },
    /// Workers of one routing group announced, or hold blocks under, several block sizes
    /// (upstream refuses the second at `/register`; `prefixlog bridge` cannot be refused).
    #[error("model={model} routing_group={group} has workers of several block sizes ({sizes}); the facade cannot tell which one the caller uses")]
    Ambiguous { model: String, group: String, sizes: String },
    /// Upstream's wording.
    #[error("cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt")]
    SaltedHashes,
    /// Mooncake's `seq_hashes` are rolling sequence hashes under a seed its doc leaves open;
    /// prefixlog matches by its own chained block hashes, not by those (issue 38).
    #[error("/query_by_hash is not served in the Mooncake dialect: its seq_hashes are rolling sequence hashes, which this index does not match by (its chain hashes are its own); send token_ids to /query")]
    SeqHashes,
    #[error("invalid request body: {0}")]
    Body(String),
    #[error("{}", .0.message())]
    Query(prefixlog_query::QueryError),
}

impl QueryError {
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::NoIndexer { .. } | Self::NoKeyspace { .. } => StatusCode::NOT_FOUND,
            Self::Ambiguous { .. } | Self::SaltedHashes | Self::Body(_) => StatusCode::BAD_REQUEST,
            Self::SeqHashes => StatusCode::NOT_IMPLEMENTED,
            Self::Query(e) => match e {
                Refused::InvalidArgument(_) => StatusCode::BAD_REQUEST,
                Refused::UnknownKeyspace(_) => StatusCode::NOT_FOUND,
                Refused::ResourceExhausted(_) => StatusCode::TOO_MANY_REQUESTS,
                Refused::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                Refused::TokenNotReached(_) => StatusCode::GATEWAY_TIMEOUT,
            },
        }
    }

    /// The gRPC code the facade metrics count it under (one `code` label for every facade).
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::NotReady => tonic::Code::Unavailable,
            Self::NoIndexer { .. } | Self::NoKeyspace { .. } => tonic::Code::NotFound,
            Self::Ambiguous { .. } | Self::SaltedHashes | Self::Body(_) => tonic::Code::InvalidArgument,
            Self::SeqHashes => tonic::Code::Unimplemented,
            Self::Query(e) => e.code(),
        }
    }
}

/// What the workers' metadata and the keyspaces are a function of: the next offset to apply of
/// every owned partition (in partition order) and the applier's count of wholesale partition
/// replacements (a repaired partition may keep its offset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StateAt {
    next_offsets: Vec<i64>,
    replacements: u64,
}

pub struct Reader {
    query: QueryService,
    /// The Dynamo dialect's indexers per `(model, routing_group)`.
    indexers: super::dynamo::IndexerCache,
}

impl Reader {
    /// Answers from `query`, with a prompt limit of [`super::MAX_PROMPT_BLOCKS`] (what fits in
    /// the body upstream accepts) instead of `prefixlog.v1`'s.
    pub fn new(query: QueryService) -> Self {
        Self { query: query.with_max_blocks(super::MAX_PROMPT_BLOCKS), indexers: Default::default() }
    }

    pub(super) fn indexers(&self) -> &super::dynamo::IndexerCache {
        &self.indexers
    }

    /// Where the applied state is ([`StateAt`]), read under the applier lock (none when the
    /// replica keeps no applier).
    pub(super) fn state_at(&self) -> Option<StateAt> {
        let view = self.query.view();
        let a = view.applier.as_ref()?.lock();
        let next_offsets = view.info.owned.iter().map(|&p| a.partition(p).next_offset).collect();
        Some(StateAt { next_offsets, replacements: a.replacements() })
    }

    pub fn service(&self) -> &QueryService {
        &self.query
    }

    pub(super) fn ready(&self) -> Result<(), QueryError> {
        if self.query.view().readiness.is_ready() {
            Ok(())
        } else {
            Err(QueryError::NotReady)
        }
    }

    /// Calls `f` with every announced worker of every partition and its metadata, under the
    /// applier lock (nothing when the replica keeps no applier).
    pub(super) fn each_worker(&self, mut f: impl FnMut(u64, &BTreeMap<String, String>)) {
        let view = self.query.view();
        let Some(applier) = &view.applier else { return };
        let a = applier.lock();
        for &p in &view.info.owned {
            for (&w, meta) in &a.partition(p).workers {
                f(w, meta);
            }
        }
    }

    /// `label(worker, its metadata)` of each of `workers`, one lookup each (`None` entries are
    /// left out).
    pub(super) fn label_workers<T>(
        &self,
        workers: impl IntoIterator<Item = u64>,
        label: impl Fn(u64, Meta) -> Option<T>,
    ) -> HashMap<u64, T> {
        let view = self.query.view();
        let guard = view.applier.as_ref().map(|a| a.lock());
        let count = view.info.partition_count;
        let mut out = HashMap::new();
        for w in workers {
            if out.contains_key(&w) {
                continue;
            }
            let meta = guard.as_ref().and_then(|a| a.partition(partition_of(w, count)).workers.get(&w));
            if let Some(t) = label(w, meta) {
                out.insert(w, t);
            }
        }
        out
    }

    /// The lane-0 scores of every slot of `ks` matching `prompt` on `tiers` (not gapped).
    pub(super) async fn scores(
        &self,
        ks: &KeyspaceId,
        prompt: Prompt,
        tiers: &[Tier],
    ) -> Result<Vec<WorkerScore>, QueryError> {
        let req = MatchRequest {
            tiers: crate::tier_codes(tiers.iter().copied()),
            keyspace: Some(Keyspace {
                model: ks.model.clone(),
                block_size: ks.block_size,
                hash_scheme: ks.scheme,
            }),
            prompt: Some(prompt),
            lane: Some(0),
            exclude_gapped: true,
            ..Default::default()
        };
        let wait: Duration = self.query.wait_for_call(None);
        let answer = self.query.answer_typed(req, wait).await.map_err(QueryError::Query)?;
        Ok(answer.scores.into_iter().filter(|s| s.lane == 0).collect())
    }

    /// Mooncake's `/query`: the keyspace `(model, block_size, scheme 1)`; the instances of the
    /// request's tenant (worker metadata `tenant_id`, absent = `"default"`), named by metadata
    /// `instance_id` (absent: the decimal worker id), only the requested one if it names one.
    pub async fn query_mooncake(&self, req: MooncakeQuery) -> Result<MooncakeResponse, QueryError> {
        self.ready()?;
        let ks = KeyspaceId::new(req.model.clone(), req.block_size, SCHEME_XXH3_CHAINED);
        if self.query.view().engine.keyspace(&ks).is_none() {
            return Err(QueryError::NoKeyspace { model: req.model, block_size: req.block_size });
        }
        let tenant = non_empty_or(req.tenant_id, DEFAULT_TENANT);
        let instance = req.instance_id.filter(|i| !i.is_empty());
        let whole_blocks = req.token_ids.len() / req.block_size.max(1) as usize;
        let namespace = req.lora_name.unwrap_or_default();
        let cache_salt = req.cache_salt.unwrap_or_default();
        let prompt =
            Prompt::Tokens(TokenIds { ids: req.token_ids, namespace, cache_salt, ..Default::default() });
        let depths: Vec<(Holder, MediaDepths)> = if whole_blocks == 0 {
            Vec::new()
        } else {
            let scores = self.scores(&ks, prompt, &MOONCAKE_MEDIA).await?;
            scores.iter().map(|s| ((s.worker, s.dp_rank), media_depths(s))).collect()
        };
        let holders = self.holders_labelled(&ks, &MOONCAKE_MEDIA, |worker, m: Meta| {
            let get = |k: &str| m.and_then(|m| m.get(k)).map(String::as_str).filter(|v| !v.is_empty());
            let name = get(META_INSTANCE).map_or_else(|| worker.to_string(), str::to_string);
            let mine = get(META_TENANT).unwrap_or(DEFAULT_TENANT) == tenant
                && instance.as_ref().is_none_or(|i| *i == name);
            mine.then_some(name)
        });
        Ok(mooncake_response(&tenant, &holders, &depths, ks.block_size))
    }

    /// The keyspace's lane-0 slots with a holder (not gapped) on one of `tiers` that `label`
    /// keeps, each with its label, computed once per worker from its recorded metadata (`None`
    /// when the replica keeps no metadata or the worker recorded none).
    fn holders_labelled<T: Clone>(
        &self,
        ks: &KeyspaceId,
        tiers: &[Tier],
        label: impl Fn(u64, Meta) -> Option<T>,
    ) -> Vec<(Holder, T)> {
        let Some(cell) = self.query.view().engine.keyspace(ks) else { return Vec::new() };
        let summaries = cell.read().holder_summaries();
        let mut held: Vec<Holder> = summaries
            .into_iter()
            .filter(|h| h.key.lane == 0 && tiers.contains(&h.key.tier) && !h.gapped)
            .map(|h| (h.key.worker, h.key.dp_rank))
            .collect();
        held.dedup(); // in key order: a slot's tiers are neighbours
        let labels = self.label_workers(held.iter().map(|h| h.0), label);
        held.into_iter().filter_map(|h| Some((h, labels.get(&h.0)?.clone()))).collect()
    }
}

/// Mooncake's media, `GPU`, `CPU` and `DISK`, as storage tiers.
const MOONCAKE_MEDIA: [Tier; 3] = [Tier::Gpu, Tier::Host, Tier::Disk];

/// A score's depths: on any counted tier, and on each alone (a keyspace with GPU holders only
/// answers without per-tier depths: all of it is on the GPU).
fn media_depths(s: &WorkerScore) -> MediaDepths {
    let mut d = MediaDepths { any: s.depth, ..Default::default() };
    if s.tiers.is_empty() {
        d.gpu = s.depth;
    }
    for t in &s.tiers {
        match Tier::from_code(t.tier as u32) {
            Some(Tier::Gpu) => d.gpu = t.depth,
            Some(Tier::Host) => d.host = t.depth,
            Some(Tier::Disk) => d.disk = t.depth,
            Some(Tier::External) | None => {}
        }
    }
    d
}

fn non_empty_or(v: Option<String>, default: &str) -> String {
    v.filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused query answers the HTTP status upstream would, counted under the query's own
    /// code, with the message the gRPC status would carry.
    #[test]
    fn refused_queries_map_to_http_statuses() {
        let cases = [
            (Refused::InvalidArgument("top_k".into()), StatusCode::BAD_REQUEST),
            (Refused::UnknownKeyspace("x".repeat(5000)), StatusCode::NOT_FOUND),
            (Refused::ResourceExhausted("streams".into()), StatusCode::TOO_MANY_REQUESTS),
            (Refused::Unavailable("gap".into()), StatusCode::SERVICE_UNAVAILABLE),
            (Refused::TokenNotReached("late".into()), StatusCode::GATEWAY_TIMEOUT),
        ];
        for (refused, http) in cases {
            let e = QueryError::Query(refused.clone());
            assert_eq!(e.http_status(), http, "{refused:?}");
            assert_eq!(e.code(), refused.code());
            assert_eq!(e.to_string(), tonic::Status::from(refused).message());
        }
    }
}
