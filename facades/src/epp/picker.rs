//! One request's decision: which endpoints may take it, what the index says they hold, the
//! pick ([`super::policy`]).
//!
//! The index is asked through `QueryService::answer` with the prompt's token ids, so the
//! replica hashes them exactly as a `prefixlog.v1` Match with token ids would, in the model's
//! one keyspace of hash scheme 1 (its block size is the keyspace's), lane 0 (the GPU tier),
//! `exclude_gapped` (a gapped holder may be credited with blocks it lost), and the candidates'
//! workers only. The index is an optimisation, never a dependency: a replica that is not ready,
//! a failed or slow query fails open to the least-loaded eligible endpoint (counted, logged).
//! Only "no eligible endpoint" is an error (503).

use super::endpoints::{candidates, restrict, Candidates};
use super::policy::{Depths, Lease, Loads, Route};
use super::prompt::{Ask, Prompt};
use super::tokenize::Tokenizers;
use super::{Limits, Weights, PROTOCOL};
use prefixlog_engine::scheme::SCHEME_XXH3_CHAINED;
use prefixlog_engine::KeyspaceId;
use prefixlog_proto::v1::match_request::Prompt as MatchPrompt;
use prefixlog_proto::v1::{Keyspace, MatchRequest, TokenIds};
use prefixlog_query::{QueryError, QueryService};
use prometheus::{IntCounterVec, Opts, Registry};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Why a request gets no endpoint; each is answered with an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum PickError {
    #[error("{0}")]
    Body(#[from] super::prompt::BodyError),
    #[error("model {model} is not served by this endpoint picker (served: {served})")]
    UnknownModel { model: String, served: String },
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the endpoint picker holds {0} bytes of request bodies already; retry later")]
    Busy(usize),
    #[error("no eligible endpoint: {0}")]
    NoEndpoint(&'static str),
}

impl PickError {
    /// The HTTP status of the immediate response (GIE: 503 when nothing can be picked).
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Body(_) => 400,
            Self::UnknownModel { .. } => 404,
            Self::TooLarge(_) => 413,
            Self::Busy(_) => 503,
            Self::NoEndpoint(_) => 503,
        }
    }

    /// The gRPC code the facade metrics count it under.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::Body(_) => tonic::Code::InvalidArgument,
            Self::UnknownModel { .. } => tonic::Code::NotFound,
            Self::TooLarge(_) | Self::Busy(_) => tonic::Code::ResourceExhausted,
            Self::NoEndpoint(_) => tonic::Code::Unavailable,
        }
    }
}

/// Picks per route (`prefixlog_epp_picks_total{protocol="gie-epp",route}`).
#[derive(Clone)]
pub struct PickMetrics {
    picks: IntCounterVec,
}

impl PickMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let picks = IntCounterVec::new(
            Opts::new(
                "prefixlog_epp_picks_total",
                "Endpoints picked by the GIE endpoint picker, by route (index, balanced, no_prompt, fail_open)",
            )
            .const_label("protocol", PROTOCOL),
            &["route"],
        )?;
        r.register(Box::new(picks.clone()))?;
        Ok(Self { picks })
    }

    /// Picks by `route` so far (tests).
    pub fn picks_of(&self, route: Route) -> u64 {
        self.picks.with_label_values(&[route.as_str()]).get()
    }
}

/// The picker of one replica. Cheap to clone.
#[derive(Clone)]
pub struct Picker {
    pub query: QueryService,
    pub tokenizers: Tokenizers,
    pub loads: Loads,
    pub weights: Weights,
    pub limits: Limits,
    pub metrics: PickMetrics,
    /// One permit per body byte held by any stream ([`super::MAX_BUFFERED_BODY_BYTES`]).
    pub body_bytes: std::sync::Arc<tokio::sync::Semaphore>,
}

/// The index's view of one prompt, per worker.
enum Answer {
    Depths(HashMap<u64, u32>, usize),
    NoPrompt,
    Unavailable(String),
}

impl Picker {
    /// Picks an endpoint for `ask` (None: a request without body, routed on load alone) among
    /// the known endpoints, restricted to `hint` when the data plane sent one.
    pub async fn pick(
        &self,
        ask: Option<Ask>,
        hint: Option<&[SocketAddr]>,
    ) -> Result<(Lease, Route), PickError> {
        if let Some(a) = &ask {
            if !self.tokenizers.knows(&a.model) {
                let served = self.tokenizers.models().join(", ");
                return Err(PickError::UnknownModel { model: a.model.clone(), served });
            }
        }
        let model = ask.as_ref().map(|a| a.model.as_str());
        let eligible = restrict(candidates(self.query.view(), model), hint);
        if eligible.is_empty() {
            let why = if hint.is_some() {
                "none of the subset hint's endpoints is a known worker"
            } else {
                "no known worker with a serving URL"
            };
            return Err(PickError::NoEndpoint(why));
        }
        let depths = match ask {
            None => Depths::NoPrompt,
            Some(a) => self.depths(a, &eligible).await,
        };
        let endpoints: Vec<SocketAddr> = eligible.keys().copied().collect();
        let (lease, route) =
            self.loads.pick(&endpoints, &depths, &self.weights).ok_or(PickError::NoEndpoint("empty"))?;
        self.metrics.picks.with_label_values(&[route.as_str()]).inc();
        Ok((lease, route))
    }

    /// Per endpoint, the best depth of its workers.
    async fn depths(&self, ask: Ask, eligible: &Candidates) -> Depths {
        let workers: Vec<u64> = eligible.values().flatten().copied().collect();
        match self.answer(ask, workers).await {
            Answer::NoPrompt => Depths::NoPrompt,
            Answer::Unavailable(why) => {
                if fail_open_log_due() {
                    tracing::warn!(%why, "endpoint picker: index unavailable, failing open to the least-loaded endpoint (logged at most every 10 s; every pick is counted in prefixlog_epp_picks_total{{route=\"fail_open\"}})");
                }
                Depths::Unavailable
            }
            Answer::Depths(by_worker, blocks) => {
                let depth = eligible
                    .iter()
                    .map(|(e, ws)| {
                        (*e, ws.iter().filter_map(|w| by_worker.get(w)).copied().max().unwrap_or(0))
                    })
                    .collect();
                Depths::Matched { depth, blocks }
            }
        }
    }

    async fn answer(&self, ask: Ask, workers: Vec<u64>) -> Answer {
        let view = self.query.view();
        if !view.readiness.is_ready() {
            return Answer::Unavailable("this replica is not ready (catching up with the log)".into());
        }
        let ks = match self.keyspace(&ask.model) {
            Ok(Some(ks)) => ks,
            // Nothing indexed for the model yet: every depth is 0.
            Ok(None) => return Answer::Depths(HashMap::new(), 0),
            Err(why) => return Answer::Unavailable(why),
        };
        let mut ids = match ask.prompt {
            Prompt::Tokens(ids) => ids,
            Prompt::Text(text) => match self.tokenizers.encode(&ask.model, text).await {
                Some(Ok(ids)) => ids,
                Some(Err(e)) => return Answer::Unavailable(e.to_string()),
                None => return Answer::Unavailable(format!("no tokenizer for {}", ask.model)),
            },
        };
        let bs = ks.block_size.max(1) as usize;
        // The replica answers at most max_blocks; the prompt's first ones decide the prefix.
        ids.truncate(self.query.config().max_blocks * bs);
        let blocks = ids.len() / bs;
        if blocks == 0 {
            return Answer::NoPrompt;
        }
        self.ask_index(&ks, ids, workers, blocks).await
    }

    async fn ask_index(&self, ks: &KeyspaceId, ids: Vec<u32>, workers: Vec<u64>, blocks: usize) -> Answer {
        let req = MatchRequest {
            tiers: crate::tier_codes(crate::GPU_ONLY),
            keyspace: Some(Keyspace {
                model: ks.model.clone(),
                block_size: ks.block_size,
                hash_scheme: ks.scheme,
            }),
            prompt: Some(MatchPrompt::Tokens(TokenIds { ids, ..Default::default() })),
            candidate_workers: workers,
            lane: Some(0),
            exclude_gapped: true,
            ..Default::default()
        };
        let t: Duration = self.limits.index_timeout;
        match tokio::time::timeout(t, self.query.answer_typed(req, t)).await {
            Err(_) => Answer::Unavailable(format!("the index did not answer within {t:?}")),
            Ok(Err(QueryError::UnknownKeyspace(_))) => Answer::Depths(HashMap::new(), blocks),
            Ok(Err(e)) => Answer::Unavailable(format!("{}: {}", e.code(), e.message())),
            Ok(Ok(r)) => {
                let mut by_worker: HashMap<u64, u32> = HashMap::new();
                for s in r.scores.iter().filter(|s| s.lane == 0) {
                    let d = by_worker.entry(s.worker).or_default();
                    *d = (*d).max(s.depth);
                }
                Answer::Depths(by_worker, blocks)
            }
        }
    }

    /// The model's keyspace of token-id hashes (scheme 1). None: the replica holds none yet.
    /// Several (block sizes) cannot be told apart from a request: an error (fails open).
    fn keyspace(&self, model: &str) -> Result<Option<KeyspaceId>, String> {
        let mut of_model: Vec<KeyspaceId> = (self.query.view().engine.keyspace_ids().into_iter())
            .filter(|k| k.model == model && k.scheme == SCHEME_XXH3_CHAINED)
            .collect();
        match of_model.len() {
            0 => Ok(None),
            1 => Ok(of_model.pop()),
            n => Err(format!(
                "model {model} has {n} keyspaces of hash scheme 1 (block sizes); cannot tell which"
            )),
        }
    }
}

/// Fail-open warnings are logged at most once per this long: a replica catching up under load
/// would otherwise log one line per request (each pick is counted in the metrics).
const FAIL_OPEN_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a fail-open warning may be logged now (process-wide, at most once per
/// [`FAIL_OPEN_LOG_EVERY`]).
fn fail_open_log_due() -> bool {
    static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let due = last.is_none_or(|t| t.elapsed() >= FAIL_OPEN_LOG_EVERY);
    if due {
        *last = Some(std::time::Instant::now());
    }
    due
}
