//! The routes answered from the replica: `/query` and `/query_by_hash` through
//! `QueryService::answer` (the path of `prefixlog.v1` Match: validation, limits, the engine's
//! contiguous-prefix rule), `/workers` from the workers' recorded metadata.
//!
//! Dynamo dialect: the keyspace is the one of the request's model under the route's scheme
//! (token ids: scheme 1, hashed by the replica with the LoRA name as namespace, as `prefixlog
//! bridge` files an adapter's blocks; block hashes: scheme 2). Mooncake dialect: the request
//! names the keyspace, `(model, block_size, scheme 1)`. Every query asks for lane 0 with
//! `exclude_gapped` (a gapped holder may be credited with blocks it lost): the Dynamo dialect
//! for the GPU tier (its `cpu` and `disk` are not mapped), the Mooncake dialect for the gpu,
//! host and disk tiers, its `GPU`, `CPU` and `DISK` media.

use super::mooncake::{mooncake_response, MediaDepths, MooncakeQuery, MooncakeResponse};
use super::wire::{score_response, Holder, QueryByHashRequest, QueryRequest, ScoreResponse};
use super::workers::{WorkerInfo, WorkersQuery};
use super::{DEFAULT_ROUTING_GROUP, DEFAULT_TENANT, HASH_SCHEME_DYNAMO_BLOCK, META_INSTANCE};
use super::{META_ROUTING_GROUP, META_TENANT};
use axum::http::StatusCode;
use prefixlog_engine::{partition_of, scheme::SCHEME_XXH3_CHAINED, KeyspaceId, Tier};
use prefixlog_proto::v1::match_request::Prompt;
use prefixlog_proto::v1::{BlockHashes, Keyspace, MatchRequest, TokenIds};
use prefixlog_query::QueryService;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A worker's recorded metadata (`None`: this replica keeps none).
type Meta<'a> = Option<&'a BTreeMap<String, String>>;

/// Why a request is not answered; each carries the HTTP status upstream would answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("this replica is not ready (catching up with the log); ask another")]
    NotReady,
    /// Upstream's wording, so clients matching on it keep working.
    #[error("no indexer for model={model} routing_group={group}{detail}")]
    NoIndexer { model: String, group: String, detail: String },
    #[error(
        "no indexer for model={model} block_size={block_size} (no keyspace of hash scheme 1 on this replica)"
    )]
    NoKeyspace { model: String, block_size: u32 },
    #[error("model {model} has several keyspaces of scheme {scheme} ({keyspaces}); the facade cannot tell which block size the caller uses")]
    Ambiguous { model: String, scheme: u32, keyspaces: String },
    #[error(
        "cache_salt must be absent or null on /query_by_hash: block hashes already computed cannot be salted"
    )]
    SaltedHashes,
    /// Mooncake's `seq_hashes` are rolling sequence hashes under a seed its doc leaves open;
    /// prefixlog matches by its own chained block hashes, not by those (issue 38).
    #[error("/query_by_hash is not served in the Mooncake dialect: its seq_hashes are rolling sequence hashes, which this index does not match by (its chain hashes are its own); send token_ids to /query")]
    SeqHashes,
    #[error("invalid request body: {0}")]
    Body(String),
    #[error("{}", .0.message())]
    Query(tonic::Status),
}

impl QueryError {
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::NoIndexer { .. } | Self::NoKeyspace { .. } => StatusCode::NOT_FOUND,
            Self::Ambiguous { .. } | Self::SaltedHashes | Self::Body(_) => StatusCode::BAD_REQUEST,
            Self::SeqHashes => StatusCode::NOT_IMPLEMENTED,
            Self::Query(s) => match s.code() {
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
                tonic::Code::NotFound => StatusCode::NOT_FOUND,
                tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
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
            Self::Query(s) => s.code(),
        }
    }
}

/// What one Dynamo query asks, whichever route it came by.
struct Ask {
    model: String,
    group: String,
    scheme: u32,
    prompt: Prompt,
    /// Blocks the prompt has (0: nothing to match, the answer is all zeros).
    blocks: usize,
}

pub struct Reader {
    query: QueryService,
}

impl Reader {
    pub fn new(query: QueryService) -> Self {
        Self { query }
    }

    pub async fn query(&self, req: QueryRequest) -> Result<ScoreResponse, QueryError> {
        let namespace = req.lora_name.unwrap_or_default();
        // vLLM's salt keys the prompt's first block (scheme::block_hashes_with), as the bridge
        // indexes salted blocks.
        let cache_salt = req.cache_salt.unwrap_or_default();
        let blocks = req.token_ids.len();
        let ask = Ask {
            model: req.model_name,
            group: non_empty_or(req.routing_group, DEFAULT_ROUTING_GROUP),
            scheme: SCHEME_XXH3_CHAINED,
            prompt: Prompt::Tokens(TokenIds {
                ids: req.token_ids,
                namespace,
                cache_salt,
                ..Default::default()
            }),
            // Tokens, not blocks yet: the block size is the keyspace's (checked in `answer`).
            blocks,
        };
        self.answer(ask).await
    }

    pub async fn query_by_hash(&self, req: QueryByHashRequest) -> Result<ScoreResponse, QueryError> {
        if req.cache_salt.is_some() {
            return Err(QueryError::SaltedHashes);
        }
        let ask = Ask {
            model: req.model_name,
            group: non_empty_or(req.routing_group, DEFAULT_ROUTING_GROUP),
            scheme: HASH_SCHEME_DYNAMO_BLOCK,
            blocks: req.block_hashes.len(),
            // i64 on the wire, the same 64 bits as the u64 locals the keyspace holds.
            prompt: Prompt::Hashes(BlockHashes {
                local: req.block_hashes.iter().map(|&h| h as u64).collect(),
            }),
        };
        self.answer(ask).await
    }

    async fn answer(&self, ask: Ask) -> Result<ScoreResponse, QueryError> {
        self.ready()?;
        let ks = self.keyspace(&ask)?;
        let whole_blocks = match ask.prompt {
            Prompt::Tokens(_) => ask.blocks / ks.block_size.max(1) as usize,
            Prompt::Hashes(_) => ask.blocks,
        };
        let skip = whole_blocks == 0;
        let depths = if skip { Vec::new() } else { self.depths(&ks, ask.prompt, &crate::GPU_ONLY).await? };
        let depths: Vec<(Holder, u32)> = depths.into_iter().map(|(h, d)| (h, d.any)).collect();
        let group = ask.group;
        let in_group = |_, m: Meta| {
            let g = m.and_then(|m| m.get(META_ROUTING_GROUP)).map_or(DEFAULT_ROUTING_GROUP, String::as_str);
            (g == group).then_some(())
        };
        let holders: Vec<Holder> =
            self.holders_labelled(&ks, &crate::GPU_ONLY, in_group).into_iter().map(|(h, ())| h).collect();
        Ok(score_response(&holders, &depths, ks.block_size))
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
        let skip = whole_blocks == 0;
        let namespace = req.lora_name.unwrap_or_default();
        let cache_salt = req.cache_salt.unwrap_or_default();
        let prompt =
            Prompt::Tokens(TokenIds { ids: req.token_ids, namespace, cache_salt, ..Default::default() });
        let depths = if skip { Vec::new() } else { self.depths(&ks, prompt, &MOONCAKE_MEDIA).await? };
        let holders = self.holders_labelled(&ks, &MOONCAKE_MEDIA, |worker, m: Meta| {
            let get = |k: &str| m.and_then(|m| m.get(k)).map(String::as_str).filter(|v| !v.is_empty());
            let name = get(META_INSTANCE).map_or_else(|| worker.to_string(), str::to_string);
            let mine = get(META_TENANT).unwrap_or(DEFAULT_TENANT) == tenant
                && instance.as_ref().is_none_or(|i| *i == name);
            mine.then_some(name)
        });
        Ok(mooncake_response(&tenant, &holders, &depths, ks.block_size))
    }

    /// `GET /workers`: every announced worker of every partition passing the filters, by id.
    pub fn workers(&self, q: &WorkersQuery) -> Result<Vec<WorkerInfo>, QueryError> {
        self.ready()?;
        let view = self.query.view();
        let Some(applier) = &view.applier else { return Ok(Vec::new()) };
        let a = applier.lock();
        let mut out: Vec<WorkerInfo> = view
            .info
            .owned
            .iter()
            .flat_map(|&p| a.partition(p).workers.iter())
            .filter_map(|(&w, meta)| q.entry(w, meta))
            .collect();
        drop(a);
        out.sort_by_key(|w| w.instance_id);
        Ok(out)
    }

    fn ready(&self) -> Result<(), QueryError> {
        if self.query.view().readiness.is_ready() {
            Ok(())
        } else {
            Err(QueryError::NotReady)
        }
    }

    /// The contiguous depth of every lane-0 slot of `ks` that matches `prompt` on `tiers`: on
    /// any of them, and on each alone.
    async fn depths(
        &self,
        ks: &KeyspaceId,
        prompt: Prompt,
        tiers: &[Tier],
    ) -> Result<Vec<(Holder, MediaDepths)>, QueryError> {
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
        // Validated (limits, block size) before the holders are collected: an invalid or
        // oversized query costs no walk of the keyspace's holders nor the applier lock.
        let answer = self.query.answer(req, wait).await.map_err(QueryError::Query)?;
        Ok(answer
            .scores
            .iter()
            .filter(|s| s.lane == 0)
            .map(|s| ((s.worker, s.dp_rank), media_depths(s)))
            .collect())
    }

    /// The one keyspace of the model under the route's scheme.
    fn keyspace(&self, ask: &Ask) -> Result<KeyspaceId, QueryError> {
        let all = self.query.view().engine.keyspace_ids();
        let mut of_model: Vec<KeyspaceId> =
            all.into_iter().filter(|k| k.model == ask.model && k.scheme == ask.scheme).collect();
        match of_model.len() {
            1 => Ok(of_model.remove(0)),
            0 => Err(QueryError::NoIndexer {
                model: ask.model.clone(),
                group: ask.group.clone(),
                detail: format!(" (no keyspace of hash scheme {} on this replica)", ask.scheme),
            }),
            _ => Err(QueryError::Ambiguous {
                model: ask.model.clone(),
                scheme: ask.scheme,
                keyspaces: of_model
                    .iter()
                    .map(|k| format!("block_size {}", k.block_size))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
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
        let view = self.query.view();
        let Some(cell) = view.engine.keyspace(ks) else { return Vec::new() };
        let summaries = cell.read().holder_summaries();
        let mut held: Vec<Holder> = summaries
            .into_iter()
            .filter(|h| h.key.lane == 0 && tiers.contains(&h.key.tier) && !h.gapped)
            .map(|h| (h.key.worker, h.key.dp_rank))
            .collect();
        held.dedup(); // in key order: a slot's tiers are neighbours
        let guard = view.applier.as_ref().map(|a| a.lock());
        let count = view.info.partition_count;
        // One metadata lookup per worker, however many dp ranks it holds under.
        let mut of_worker: HashMap<u64, Option<T>> = HashMap::new();
        let mut out = Vec::new();
        for (w, dp) in held {
            let t = of_worker.entry(w).or_insert_with(|| {
                let meta = guard.as_ref().and_then(|a| a.partition(partition_of(w, count)).workers.get(&w));
                label(w, meta)
            });
            if let Some(t) = t {
                out.push(((w, dp), t.clone()));
            }
        }
        out
    }
}

/// Mooncake's media, `GPU`, `CPU` and `DISK`, as storage tiers.
const MOONCAKE_MEDIA: [Tier; 3] = [Tier::Gpu, Tier::Host, Tier::Disk];

/// A score's depths: on any counted tier, and on each alone (a keyspace with GPU holders only
/// answers without per-tier depths: all of it is on the GPU).
fn media_depths(s: &prefixlog_proto::v1::WorkerScore) -> MediaDepths {
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
