//! `/query` and `/query_by_hash` answered from the replica through `QueryService::answer` (the
//! path of `prefixlog.v1` Match: validation, limits, the engine's contiguous-prefix rule).
//!
//! The keyspace is the one of the request's model under the route's scheme (token ids: scheme 1,
//! hashed by the replica with the LoRA name as namespace, as `prefixlog bridge` files an
//! adapter's blocks; block hashes: scheme 2). Every query asks for lane 0 (the GPU tier) with
//! `exclude_gapped` (a gapped holder may be credited with blocks it lost).

use super::wire::{score_response, Holder, QueryByHashRequest, QueryRequest, ScoreResponse};
use super::{DEFAULT_ROUTING_GROUP, HASH_SCHEME_DYNAMO_BLOCK, META_ROUTING_GROUP};
use axum::http::StatusCode;
use prefixlog_engine::{partition_of, scheme::SCHEME_XXH3_CHAINED, KeyspaceId};
use prefixlog_proto::v1::match_request::Prompt;
use prefixlog_proto::v1::{BlockHashes, Keyspace, MatchRequest, TokenIds};
use prefixlog_query::QueryService;
use std::collections::HashMap;
use std::time::Duration;

/// Why a query is not answered; each carries the HTTP status upstream would answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("this replica is not ready (catching up with the log); ask another")]
    NotReady,
    /// Upstream's wording, so clients matching on it keep working.
    #[error("no indexer for model={model} routing_group={group}{detail}")]
    NoIndexer { model: String, group: String, detail: String },
    #[error("model {model} has several keyspaces of scheme {scheme} ({keyspaces}); the facade cannot tell which block size the caller uses")]
    Ambiguous { model: String, scheme: u32, keyspaces: String },
    #[error(
        "cache_salt must be absent or null on /query_by_hash: block hashes already computed cannot be salted"
    )]
    SaltedHashes,
    #[error("invalid request body: {0}")]
    Body(String),
    #[error("{}", .0.message())]
    Query(tonic::Status),
}

impl QueryError {
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::NoIndexer { .. } => StatusCode::NOT_FOUND,
            Self::Ambiguous { .. } | Self::SaltedHashes | Self::Body(_) => StatusCode::BAD_REQUEST,
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
            Self::NoIndexer { .. } => tonic::Code::NotFound,
            Self::Ambiguous { .. } | Self::SaltedHashes | Self::Body(_) => tonic::Code::InvalidArgument,
            Self::Query(s) => s.code(),
        }
    }
}

/// What one query asks, whichever route it came by.
struct Ask {
    model: String,
    group: String,
    scheme: u32,
    prompt: Prompt,
    /// Blocks the prompt has (0: nothing to match, the answer is all zeros).
    blocks: usize,
    /// A salt prefixlog holds no blocks under: every count is 0 (not an error).
    salted: bool,
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
        let blocks = req.token_ids.len();
        let ask = Ask {
            model: req.model_name,
            group: group_of(req.routing_group),
            scheme: SCHEME_XXH3_CHAINED,
            prompt: Prompt::Tokens(TokenIds { ids: req.token_ids, namespace }),
            // Tokens, not blocks yet: the block size is the keyspace's (checked in `answer`).
            blocks,
            salted: req.cache_salt.is_some_and(|s| !s.is_empty()),
        };
        self.answer(ask).await
    }

    pub async fn query_by_hash(&self, req: QueryByHashRequest) -> Result<ScoreResponse, QueryError> {
        if req.cache_salt.is_some() {
            return Err(QueryError::SaltedHashes);
        }
        let ask = Ask {
            model: req.model_name,
            group: group_of(req.routing_group),
            scheme: HASH_SCHEME_DYNAMO_BLOCK,
            blocks: req.block_hashes.len(),
            // i64 on the wire, the same 64 bits as the u64 locals the keyspace holds.
            prompt: Prompt::Hashes(BlockHashes {
                local: req.block_hashes.iter().map(|&h| h as u64).collect(),
            }),
            salted: false,
        };
        self.answer(ask).await
    }

    async fn answer(&self, ask: Ask) -> Result<ScoreResponse, QueryError> {
        if !self.query.view().readiness.is_ready() {
            return Err(QueryError::NotReady);
        }
        let ks = self.keyspace(&ask)?;
        let whole_blocks = match ask.prompt {
            Prompt::Tokens(_) => ask.blocks / ks.block_size.max(1) as usize,
            Prompt::Hashes(_) => ask.blocks,
        };
        if ask.salted || whole_blocks == 0 {
            return Ok(score_response(&self.holders(&ks, &ask.group), &[], ks.block_size));
        }
        let req = MatchRequest {
            keyspace: Some(Keyspace {
                model: ks.model.clone(),
                block_size: ks.block_size,
                hash_scheme: ks.scheme,
            }),
            prompt: Some(ask.prompt),
            lane: Some(0),
            exclude_gapped: true,
            ..Default::default()
        };
        let wait: Duration = self.query.wait_for_call(None);
        // Validated (limits, block size) before the holders are collected: an invalid or
        // oversized query costs no walk of the keyspace's holders nor the applier lock.
        let answer = self.query.answer(req, wait).await.map_err(QueryError::Query)?;
        let holders = self.holders(&ks, &ask.group);
        let depths: Vec<(Holder, u32)> =
            answer.scores.iter().filter(|s| s.lane == 0).map(|s| ((s.worker, s.dp_rank), s.depth)).collect();
        Ok(score_response(&holders, &depths, ks.block_size))
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

    /// The keyspace's GPU-lane holders (not gapped) of workers in `group`, from the workers'
    /// recorded metadata (absent = the default group).
    fn holders(&self, ks: &KeyspaceId, group: &str) -> Vec<Holder> {
        let view = self.query.view();
        let Some(cell) = view.engine.keyspace(ks) else { return Vec::new() };
        let summaries = cell.read().holder_summaries();
        let held = summaries
            .into_iter()
            .filter(|h| h.key.lane == 0 && !h.gapped)
            .map(|h| (h.key.worker, h.key.dp_rank));
        let Some(applier) = &view.applier else {
            // No worker metadata: every worker is in the default group.
            return if group == DEFAULT_ROUTING_GROUP { held.collect() } else { Vec::new() };
        };
        let a = applier.lock();
        // One metadata lookup per worker, however many dp ranks it holds under.
        let mut in_group: HashMap<u64, bool> = HashMap::new();
        let mut group_of_worker = |w: u64| {
            *in_group.entry(w).or_insert_with(|| {
                let meta = a.partition(partition_of(w, view.info.partition_count)).workers.get(&w);
                meta.and_then(|m| m.get(META_ROUTING_GROUP)).map_or(DEFAULT_ROUTING_GROUP, String::as_str)
                    == group
            })
        };
        held.filter(|&(w, _)| group_of_worker(w)).collect()
    }
}

fn group_of(g: Option<String>) -> String {
    g.filter(|g| !g.is_empty()).unwrap_or_else(|| DEFAULT_ROUTING_GROUP.to_string())
}
