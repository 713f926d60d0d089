//! The gateway client: ask the index under a hard deadline, across every shard, and fail open.
//!
//! A gateway must keep routing whatever the index does, so [`IndexClient::match_prompt`] never
//! returns an error: it returns scores, an empty answer, or [`MatchOutcome::Unavailable`] with
//! a reason (timeout, disconnected, overloaded, rejected) that the gateway may log and then
//! route without the index.
//!
//! Shards: the client asks one group of replicas per shard ([`crate::shards`]: a static map,
//! or one discovered with `Describe` from seeds — every address each seed's name resolves to,
//! [`crate::seeds`] — and refreshed in the background), all in parallel under
//! the request's one deadline, and merges the answers. A shard that cannot answer in time makes
//! the answer *partial* ([`Answer::partial`], naming the missing partitions): the workers of the
//! shards that answered are still scored, exactly. Within a shard, [`crate::replicas`] picks
//! the least lagged healthy replica and fails over.

use crate::replicas::ClientTls;
pub use crate::replicas::Unavailable;
use crate::seeds::{expand, system_resolver, Resolver};
use crate::shards::{choose_layout, describe_all, merge, ShardMap, ShardReply};
use parking_lot::RwLock;
use prefixlog_ids::{KeyspaceId, Landed, NextOffset, Tier};
use prefixlog_proto::v1::{self, MatchRequest, WorkerScore};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tonic::transport::ClientTlsConfig;

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
    pub min_offsets: Vec<NextOffset>,
    /// Non-empty: score only these workers.
    pub candidates: Vec<u64>,
    /// Leave out holders whose event stream had a gap.
    pub exclude_gapped: bool,
    pub allow_stale: bool,
    /// For token prompts: the namespace (LoRA adapter name) the request runs under; "" = base.
    /// Hash prompts carry their namespace in the hashes already (`scheme::block_hashes_in`).
    pub namespace: String,
    /// The storage tiers that count, in preference order (empty: every tier).
    pub tiers: Vec<Tier>,
    /// Per tier, what a block held there is worth in thousandths; non-empty: answers are
    /// ordered by `weighted_score` first.
    pub tier_weights: Vec<(Tier, u32)>,
    /// For token prompts: vLLM's `cache_salt` the request runs with ("" = none).
    pub cache_salt: String,
    /// For token prompts: per-block keys as (block index, multimodal identifiers), e.g. the
    /// identifier of an image on every block its placeholder tokens overlap.
    pub extra: Vec<(u32, Vec<String>)>,
    /// For token prompts: the multimodal inputs as (identifier, offset, length) of their
    /// placeholder tokens in the prompt (vLLM >= 0.34 keys blocks by identifier and offset).
    pub mm_inputs: Vec<(String, u64, u64)>,
    /// For token prompts: vLLM's hash lookahead (tokens after each block its hash covers).
    pub lookahead: u32,
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
            tiers: vec![],
            tier_weights: vec![],
            cache_salt: String::new(),
            extra: vec![],
            mm_inputs: vec![],
            lookahead: 0,
        }
    }

    /// Count only these storage tiers, the first holding a position winning its run.
    pub fn tiers(mut self, order: impl IntoIterator<Item = Tier>) -> Self {
        self.tiers = order.into_iter().collect();
        self
    }

    /// Weigh a block held on `tier` by `per_mille` thousandths (e.g. host 600).
    pub fn weigh(mut self, tier: Tier, per_mille: u32) -> Self {
        self.tier_weights.push((tier, per_mille));
        self
    }

    /// Only these workers (e.g. the pods this gateway may route to).
    pub fn candidates(mut self, workers: impl IntoIterator<Item = u64>) -> Self {
        self.candidates = workers.into_iter().collect();
        self
    }

    /// Read your writes from another replica's answer: its `applied` offsets, unchanged.
    pub fn at_least(mut self, applied: &[NextOffset]) -> Self {
        self.min_offsets.extend_from_slice(applied);
        self
    }

    /// A token prompt under a LoRA adapter (or another namespace): matched only against
    /// blocks that engines stored under the same adapter.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// A token prompt run with vLLM's `cache_salt`: matched only against blocks engines
    /// stored under the same salt (`scheme::block_hashes_with`).
    pub fn cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.cache_salt = salt.into();
        self
    }

    /// The multimodal identifiers of the inputs overlapping block `block` of a token prompt
    /// (may be called once per block, or more: the identifiers are merged).
    pub fn mm_ids(mut self, block: u32, ids: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.extra.push((block, ids.into_iter().map(Into::into).collect()));
        self
    }

    /// A multimodal input of a token prompt: its identifier and where its placeholder tokens sit
    /// (`offset`, `length`); the replica keys every block they overlap, as vLLM >= 0.34 does.
    pub fn mm_input(mut self, id: impl Into<String>, offset: u64, length: u64) -> Self {
        self.mm_inputs.push((id.into(), offset, length));
        self
    }

    /// vLLM's hash lookahead of the engines (`num_hash_lookahead_tokens`, speculative decoding).
    pub fn lookahead(mut self, tokens: u32) -> Self {
        self.lookahead = tokens;
        self
    }

    /// Read-your-writes: the answer reflects at least these landed records (what
    /// `prefixlog_ingest::Publisher` returned, e.g. for a placement this gateway published).
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
                    cache_salt: self.cache_salt.clone(),
                    extra: self
                        .extra
                        .iter()
                        .map(|(block, ids)| v1::BlockExtraKeys { block: *block, mm_ids: ids.clone() })
                        .collect(),
                    mm_inputs: self
                        .mm_inputs
                        .iter()
                        .map(|(id, offset, length)| v1::MultimodalInput {
                            id: id.clone(),
                            offset: *offset,
                            length: *length,
                        })
                        .collect(),
                    lookahead: self.lookahead,
                }),
                Prompt::Hashes(h) => v1::match_request::Prompt::Hashes(v1::BlockHashes { local: h.clone() }),
            }),
            intervals: self.intervals,
            top_k: self.top_k,
            lane: self.lane,
            min_offsets: self
                .min_offsets
                .iter()
                .map(|&NextOffset { partition, offset }| v1::PartitionOffset { partition, offset })
                .collect(),
            allow_stale: self.allow_stale,
            request_id: 0,
            candidate_workers: self.candidates.clone(),
            exclude_gapped: self.exclude_gapped,
            // Set per stream by the multiplexer.
            in_band_errors: false,
            unordered: false,
            timeout_us: 0,
            tiers: self.tiers.iter().map(|t| t.code() as i32).collect(),
            tier_weights: self
                .tier_weights
                .iter()
                .map(|&(t, per_mille)| v1::TierWeight { tier: t.code() as i32, per_mille })
                .collect(),
        }
    }
}

/// The index's answer (merged over shards).
#[derive(Clone, Debug)]
pub struct Answer {
    /// Best first (depth descending, then worker, dp rank, lane).
    pub scores: Vec<WorkerScore>,
    /// Next offset per partition when the shards answered (pass as `answered_at`, or as the
    /// next query's consistency token with [`MatchQuery::at_least`]).
    pub applied: Vec<NextOffset>,
    /// The replicas that answered, one per shard, comma separated.
    pub replica_id: String,
    /// Some shard's answer was stale: with a consistency token, the token was not reached
    /// (`allow_stale`); without one, the replica was not ready or its broker had been
    /// unreachable for longer than its `--stale-after`.
    pub stale: bool,
    /// The endpoints that answered, one per shard, comma separated.
    pub endpoint: String,
    /// Some shard did not answer in time: workers of `missing_partitions` are not scored.
    pub partial: bool,
    pub missing_partitions: Vec<u32>,
}

#[derive(Clone, Debug)]
pub enum MatchOutcome {
    /// At least one worker holds a prefix.
    Scores(Answer),
    /// No worker holds any prefix of the prompt.
    Empty(Answer),
    Unavailable(Unavailable),
}

/// The map could not be discovered.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("no complete shard layout among {answered} endpoints that answered Describe (of {asked}, from {seeds} seeds): every shard of some N needs a ready replica")]
    Incomplete { seeds: usize, asked: usize, answered: usize },
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
}

struct Inner {
    map: RwLock<Arc<ShardMap>>,
    deadline: Duration,
    tls: Option<ClientTlsConfig>,
    probe_interval: Duration,
    /// What discovery resolves and asks (empty for a static map).
    seeds: Vec<String>,
    resolver: Resolver,
}

/// A fail-open client over one or more shards of replicas. Cheap to clone.
#[derive(Clone)]
pub struct IndexClient {
    inner: Arc<Inner>,
    /// Queries over each replica's long-lived `MatchStream` instead of unary calls.
    streaming: bool,
    /// A second replica is asked when the first is slow ([`crate::replicas::hedge_delay`]).
    hedging: bool,
}

const PROBE: Duration = Duration::from_millis(200);
/// How often a discovered map is refreshed (new shards that became ready, lost replicas).
const REDISCOVER: Duration = Duration::from_secs(5);

impl IndexClient {
    /// One shard (an unsharded index) of replica `endpoints` like `http://10.0.0.5:50151`. Must
    /// be called inside a tokio runtime (starts the background health prober). Fails only on a
    /// malformed endpoint URL.
    pub fn new(endpoints: Vec<String>, default_deadline: Duration) -> Result<Self, tonic::transport::Error> {
        Self::with_probe_interval(endpoints, default_deadline, PROBE)
    }

    pub fn with_probe_interval(
        endpoints: Vec<String>,
        default_deadline: Duration,
        probe_interval: Duration,
    ) -> Result<Self, tonic::transport::Error> {
        Self::build(vec![(vec![], endpoints)], default_deadline, probe_interval, ClientTls::default(), vec![])
    }

    /// Like [`Self::new`], over TLS (`https://` endpoints): `tls` carries the CA to trust and,
    /// for replicas that require mutual TLS, this gateway's certificate.
    pub fn with_tls(
        endpoints: Vec<String>,
        default_deadline: Duration,
        tls: ClientTlsConfig,
    ) -> Result<Self, tonic::transport::Error> {
        Self::build(vec![(vec![], endpoints)], default_deadline, PROBE, ClientTls::new(Some(tls)), vec![])
    }

    /// A static shard map: one list of replica endpoints per shard.
    pub fn with_shards(
        shards: Vec<Vec<String>>,
        default_deadline: Duration,
    ) -> Result<Self, tonic::transport::Error> {
        let groups = shards.into_iter().map(|eps| (vec![], eps)).collect();
        Self::build(groups, default_deadline, PROBE, ClientTls::default(), vec![])
    }

    /// A shard map discovered from `Describe`, refreshed every few seconds: the client uses the
    /// finest sharding whose every shard has a ready replica, so it moves to new shards once
    /// they are all ready. `seeds` are endpoints like `http://prefixlog:50151`: every
    /// address each one's host name resolves to is asked (a headless Service names every
    /// replica of every shard), again on every refresh, so replicas that come and go are seen.
    pub async fn discover(seeds: Vec<String>, default_deadline: Duration) -> Result<Self, DiscoveryError> {
        Self::discover_with(seeds, default_deadline, None, system_resolver()).await
    }

    /// [`Self::discover`] with TLS (`https://` seeds; the certificate of an address a seed
    /// resolved to is checked against the seed's host name) and a resolver of your own.
    pub async fn discover_with(
        seeds: Vec<String>,
        default_deadline: Duration,
        tls: Option<ClientTlsConfig>,
        resolver: Resolver,
    ) -> Result<Self, DiscoveryError> {
        let (layout, tls_names) = discover_layout(&seeds, tls.as_ref(), &resolver).await?;
        let inner = Arc::new(Inner {
            map: RwLock::new(Arc::new(ShardMap::start(&layout, &tls_names, PROBE)?)),
            deadline: default_deadline,
            tls,
            probe_interval: PROBE,
            seeds,
            resolver,
        });
        tokio::spawn(rediscover_loop(Arc::downgrade(&inner)));
        Ok(Self { inner, streaming: false, hedging: true })
    }

    fn build(
        groups: Vec<(Vec<u32>, Vec<String>)>,
        deadline: Duration,
        probe_interval: Duration,
        tls: ClientTls,
        seeds: Vec<String>,
    ) -> Result<Self, tonic::transport::Error> {
        let map = ShardMap::start(&groups, &tls, probe_interval)?;
        let inner = Arc::new(Inner {
            map: RwLock::new(Arc::new(map)),
            deadline,
            tls: tls.config,
            probe_interval,
            seeds,
            resolver: system_resolver(),
        });
        Ok(Self { inner, streaming: false, hedging: true })
    }

    /// Sends the queries over one long-lived `MatchStream` per replica ([`crate::mux`]):
    /// cheaper per query for the replica; same answers, deadlines and failover.
    pub fn streaming(self, on: bool) -> Self {
        Self { streaming: on, ..self }
    }

    /// Hedging on (the default) or off: off, a query waits for its replica's answer or failure
    /// (up to the deadline) before asking the next one, so one slow replica makes decisions
    /// blind. For tests and comparisons.
    pub fn hedging(self, on: bool) -> Self {
        Self { hedging: on, ..self }
    }

    /// `(partitions, endpoints)` of every shard the client asks (partitions empty until known).
    pub fn shards(&self) -> Vec<(Vec<u32>, Vec<String>)> {
        self.inner.map.read().layout()
    }

    /// Endpoints currently considered healthy, over all shards.
    /// Connects to every replica of every shard and probes each once, up to `timeout` (all
    /// concurrently): a gateway calls it before taking traffic, so its first queries find
    /// open connections and a current health verdict. Returns how many endpoints are SERVING.
    pub async fn warm_up(&self, timeout: Duration) -> usize {
        let map = self.inner.map.read().clone();
        let warms = map.groups.iter().map(|g| g.replicas.warm_up(timeout));
        futures_util::future::join_all(warms).await.into_iter().sum()
    }

    pub fn healthy_endpoints(&self) -> Vec<String> {
        self.inner.map.read().groups.iter().flat_map(|g| g.replicas.healthy_endpoints()).collect()
    }

    /// [`Self::match_with_deadline`] with the client's default deadline.
    pub async fn match_prompt(&self, q: &MatchQuery) -> MatchOutcome {
        self.match_with_deadline(q, self.inner.deadline).await
    }

    /// Asks every shard in parallel, all within `deadline`, and merges.
    pub async fn match_with_deadline(&self, q: &MatchQuery, deadline: Duration) -> MatchOutcome {
        let end = Instant::now() + deadline;
        let req = Arc::new(q.to_request());
        let map = self.inner.map.read().clone();
        let (streaming, hedging) = (self.streaming, self.hedging);
        let asks = (0..map.groups.len()).map(|i| {
            let (map, req) = (map.clone(), req.clone());
            tokio::spawn(async move {
                let g = &map.groups[i];
                let result = g.replicas.ask(&req, end, streaming, hedging).await;
                if let Ok((resp, _)) = &result {
                    if !resp.partitions.is_empty() {
                        *g.partitions.lock() = resp.partitions.clone();
                    }
                }
                ShardReply { shard: i, partitions: g.partitions.lock().clone(), result }
            })
        });
        let mut replies = Vec::with_capacity(map.groups.len());
        for a in asks.collect::<Vec<_>>() {
            if let Ok(r) = a.await {
                replies.push(r);
            }
        }
        match merge(replies, q.top_k) {
            Err(why) => MatchOutcome::Unavailable(why),
            Ok(m) => {
                if m.duplicate_workers > 0 {
                    tracing::warn!(
                        n = m.duplicate_workers,
                        "a worker scored by two shards: overlapping shard map"
                    );
                }
                let a = Answer {
                    partial: !m.missing_shards.is_empty(),
                    missing_partitions: m.missing_partitions,
                    scores: m.scores,
                    applied: m.applied,
                    replica_id: m.replica_ids.join(","),
                    stale: m.stale,
                    endpoint: m.endpoints.join(","),
                };
                if a.scores.is_empty() {
                    MatchOutcome::Empty(a)
                } else {
                    MatchOutcome::Scores(a)
                }
            }
        }
    }
}

/// Type of a discovered layout: each shard's partitions and endpoints.
type Layout = Vec<(Vec<u32>, Vec<String>)>;

/// Resolves the seeds, asks every address `Describe` and chooses the layout; also returns the
/// TLS for the layout's endpoints (the server names of resolved addresses).
async fn discover_layout(
    seeds: &[String],
    tls: Option<&ClientTlsConfig>,
    resolver: &Resolver,
) -> Result<(Layout, ClientTls), DiscoveryError> {
    let expanded = expand(seeds, resolver).await;
    let tls = ClientTls { config: tls.cloned(), server_names: expanded.server_names };
    let described = describe_all(&expanded.endpoints, &tls, Duration::from_secs(2)).await;
    let layout = choose_layout(&described).ok_or(DiscoveryError::Incomplete {
        seeds: seeds.len(),
        asked: expanded.endpoints.len(),
        answered: described.len(),
    })?;
    Ok((layout, tls))
}

/// Re-reads the shard layout; replaces the map when it changed.
async fn rediscover_loop(inner: Weak<Inner>) {
    loop {
        tokio::time::sleep(REDISCOVER).await;
        let Some(inner) = inner.upgrade() else { return };
        let Ok((layout, tls)) = discover_layout(&inner.seeds, inner.tls.as_ref(), &inner.resolver).await
        else {
            continue;
        };
        let same = {
            let cur = inner.map.read().layout();
            cur.len() == layout.len() && cur.iter().zip(&layout).all(|(a, b)| a.0 == b.0 && a.1 == b.1)
        };
        if same {
            continue;
        }
        match ShardMap::start(&layout, &tls, inner.probe_interval) {
            Ok(map) => {
                tracing::info!(shards = layout.len(), "shard map changed: now asking {layout:?}");
                *inner.map.write() = Arc::new(map);
            }
            Err(e) => tracing::warn!(error = %e, "shard map refresh failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The namespace inputs reach the request's `TokenIds`, block by block.
    #[test]
    fn token_queries_carry_salt_and_multimodal_ids() {
        let q = MatchQuery::new(KeyspaceId::new("m", 4, 1), Prompt::Tokens(vec![1; 8]))
            .namespace("lora")
            .cache_salt("tenant")
            .mm_ids(1, ["img-a", "img-b"])
            .mm_input("img-c", 3, 7)
            .lookahead(1);
        let Some(v1::match_request::Prompt::Tokens(t)) = q.to_request().prompt else { panic!("tokens") };
        assert_eq!(t.mm_inputs, vec![v1::MultimodalInput { id: "img-c".into(), offset: 3, length: 7 }]);
        assert_eq!(t.lookahead, 1);
        assert_eq!((t.namespace.as_str(), t.cache_salt.as_str()), ("lora", "tenant"));
        assert_eq!(
            t.extra,
            vec![v1::BlockExtraKeys { block: 1, mm_ids: vec!["img-a".into(), "img-b".into()] }]
        );
    }
}
