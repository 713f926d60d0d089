//! The Dynamo dialect's `/query` and `/query_by_hash`, answered as upstream's standalone
//! indexer answers them (github.com/ai-dynamo/dynamo, Apache-2.0; docs/compat/dynamo-mooncake-http.md).
//!
//! - **Indexer.** Upstream keeps one index per `(model_name, routing_group)`, with one block
//!   size, and answers 404 for a pair it has no index of. Here the pair names the workers of
//!   the model in that routing group: those announced with metadata `model` = the model and
//!   `routing_group` (absent: `"default"`) = the group, and those holding blocks in a keyspace
//!   of the model (scheme 1 or 2) with that group. None: 404 with upstream's words. Their
//!   block size is the announced one (metadata `block_size`), else their keyspaces'; several:
//!   400 (upstream refuses the second at `/register`, `prefixlog bridge` cannot be refused).
//! - **Keyspaces.** The model's keyspaces of that block size: scheme 2 (Dynamo's block hash:
//!   `/register`ed workers and `prefixlog bridge --hash-scheme 2`) and scheme 1 (the bridge's
//!   default). `/query` hashes the tokens for each (scheme 2 with Dynamo's seed for
//!   `lora_name` and `cache_salt`; scheme 1 with the LoRA name as namespace and the salt as
//!   vLLM keys it) and takes each holder's longer match (both are exact: never more than the
//!   worker holds). `/query_by_hash` carries scheme-2 hashes: only the scheme-2 keyspace.
//! - **Tiers.** One match over the gpu, host, disk and external tiers (in that preference);
//!   from its runs, per holder: `gpu` the prefix on the GPU, `cpu` the prefix held on the GPU
//!   or in host memory, `disk` the prefix on any tier (upstream's cumulative counts).

use super::reader::{Meta, QueryError, Reader, StateAt};
use super::wire::{Holder, QueryByHashRequest, QueryRequest, ScoreAnswer, TierDepths};
use super::{DEFAULT_ROUTING_GROUP, META_ROUTING_GROUP};
use super::{META_BLOCK_SIZE, META_MODEL};
use parking_lot::Mutex;
use prefixlog_engine::scheme::{dynamo_block_hashes, dynamo_seed, SCHEME_DYNAMO_BLOCK, SCHEME_XXH3_CHAINED};
use prefixlog_engine::{KeyspaceId, Tier};
use prefixlog_proto::v1::match_request::Prompt;
use prefixlog_proto::v1::{BlockHashes, TokenIds, WorkerScore};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// The tiers a Dynamo answer counts, in preference order (upstream: device, host-pinned,
/// disk, external).
const TIERS: [Tier; 4] = [Tier::Gpu, Tier::Host, Tier::Disk, Tier::External];

/// Most `(model, routing_group)` pairs whose indexer is kept between queries; past it the
/// cache starts again (any client may name any pair).
const MAX_CACHED_INDEXERS: usize = 64;

/// What `(model, routing_group)` names here: its block size (none: no worker says one, so
/// nothing can match), the model's keyspaces of that size, and which workers are in the group.
struct Indexer {
    block_size: Option<u32>,
    keyspaces: Vec<KeyspaceId>,
    members: GroupMembers,
}

/// The workers of one routing group: those whose metadata names it, and, for the default
/// group, every worker without metadata (or without a `routing_group` in it).
struct GroupMembers {
    named: HashSet<u64>,
    /// Workers whose metadata names another group (only the default group needs them).
    elsewhere: HashSet<u64>,
    default: bool,
}

impl GroupMembers {
    fn contains(&self, worker: u64) -> bool {
        self.named.contains(&worker) || (self.default && !self.elsewhere.contains(&worker))
    }
}

/// The indexers resolved per `(model, routing_group)`, each with the [`StateAt`] it was
/// resolved at (the owned partitions' offsets and the applier's count of wholesale partition
/// replacements: a repaired or recovered partition may keep its offset): workers, their
/// metadata and the keyspaces change only by applying records or by such a replacement, so an
/// indexer resolved at the same key is the same. Resolving one walks every worker's metadata,
/// which cost more than the match on a 256-worker fleet. Any record applied starts the cache
/// again, so it serves a log at rest, or between applied batches, best.
#[derive(Default)]
pub(super) struct IndexerCache(Mutex<HashMap<IndexerName, (StateAt, Arc<Indexer>)>>);

/// `(model_name, routing_group)`.
type IndexerName = (String, String);

impl Reader {
    pub async fn query(&self, req: QueryRequest) -> Result<ScoreAnswer, QueryError> {
        self.ready()?;
        let ix = self.indexer(&req.model_name, &req.routing_group)?;
        let Some(bs) = ix.block_size else { return Ok(ScoreAnswer::default()) };
        let (lora, salt) = (req.lora_name.unwrap_or_default(), req.cache_salt.unwrap_or_default());
        let mut depths = Vec::new();
        for ks in &ix.keyspaces {
            let prompt = match ks.scheme {
                SCHEME_DYNAMO_BLOCK => {
                    let local = dynamo_block_hashes(dynamo_seed(&lora, &salt), &req.token_ids, bs as usize);
                    Prompt::Hashes(BlockHashes { local })
                }
                _ => Prompt::Tokens(TokenIds {
                    ids: req.token_ids.clone(),
                    namespace: lora.clone(),
                    cache_salt: salt.clone(),
                    ..Default::default()
                }),
            };
            if req.token_ids.len() >= bs as usize {
                self.merge(&mut depths, ks, prompt, &ix.members).await?;
            }
        }
        Ok(ScoreAnswer::new(depths, bs))
    }

    pub async fn query_by_hash(&self, req: QueryByHashRequest) -> Result<ScoreAnswer, QueryError> {
        if req.cache_salt.is_some() {
            return Err(QueryError::SaltedHashes);
        }
        self.ready()?;
        let ix = self.indexer(&req.model_name, &req.routing_group)?;
        let Some(bs) = ix.block_size else { return Ok(ScoreAnswer::default()) };
        let mut depths = Vec::new();
        for ks in ix.keyspaces.iter().filter(|k| k.scheme == SCHEME_DYNAMO_BLOCK) {
            // i64 on the wire, the same 64 bits as the u64 locals the keyspace holds.
            let local: Vec<u64> = req.block_hashes.iter().map(|&h| h as u64).collect();
            if !local.is_empty() {
                self.merge(&mut depths, ks, Prompt::Hashes(BlockHashes { local }), &ix.members).await?;
            }
        }
        Ok(ScoreAnswer::new(depths, bs))
    }

    /// Matches `prompt` in `ks` and adds each holder of the group's depths ([`ScoreAnswer::new`]
    /// keeps the longer of a holder's two).
    async fn merge(
        &self,
        depths: &mut Vec<(Holder, TierDepths)>,
        ks: &KeyspaceId,
        prompt: Prompt,
        members: &GroupMembers,
    ) -> Result<(), QueryError> {
        let scores = self.scores(ks, prompt, &TIERS).await?;
        depths.extend(
            scores
                .iter()
                .filter(|s| members.contains(s.worker))
                .map(|s| ((s.worker, s.dp_rank), tier_depths(s))),
        );
        Ok(())
    }

    /// The indexer `(model, group)` names (module doc), or upstream's 404: from the cache
    /// when nothing was applied since it was resolved ([`IndexerCache`]).
    fn indexer(&self, model: &str, group: &str) -> Result<Arc<Indexer>, QueryError> {
        let Some(at) = self.state_at() else { return self.resolve(model, group).map(Arc::new) };
        let key = (model.to_string(), group.to_string());
        if let Some((seen_at, ix)) = self.indexers().0.lock().get(&key) {
            if *seen_at == at {
                return Ok(ix.clone());
            }
        }
        let ix = Arc::new(self.resolve(model, group)?);
        let mut cache = self.indexers().0.lock();
        if cache.len() >= MAX_CACHED_INDEXERS && !cache.contains_key(&key) {
            cache.clear();
        }
        cache.insert(key, (at, ix.clone()));
        Ok(ix)
    }

    /// The indexer `(model, group)` names, resolved from the workers' metadata and keyspaces.
    fn resolve(&self, model: &str, group: &str) -> Result<Indexer, QueryError> {
        let ids: Vec<KeyspaceId> = self
            .service()
            .view()
            .engine
            .keyspace_ids()
            .into_iter()
            .filter(|k| {
                k.model == model && (k.scheme == SCHEME_DYNAMO_BLOCK || k.scheme == SCHEME_XXH3_CHAINED)
            })
            .collect();
        let (mut announced, mut sizes) = (false, BTreeSet::new());
        let mut members = GroupMembers {
            named: HashSet::new(),
            elsewhere: HashSet::new(),
            default: group == DEFAULT_ROUTING_GROUP,
        };
        self.each_worker(|w, m| {
            if group_of(Some(m)) != group {
                if members.default {
                    members.elsewhere.insert(w);
                }
                return;
            }
            members.named.insert(w);
            if m.get(META_MODEL).is_some_and(|x| x == model) {
                announced = true;
                sizes.extend(m.get(META_BLOCK_SIZE).and_then(|b| b.parse::<u32>().ok()));
            }
        });
        if sizes.is_empty() {
            sizes.extend(ids.iter().filter(|k| self.group_holds(k, group)).map(|k| k.block_size));
        }
        if sizes.is_empty() && !announced {
            return Err(QueryError::NoIndexer { model: model.to_string(), group: group.to_string() });
        }
        if sizes.len() > 1 {
            let sizes = sizes.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            return Err(QueryError::Ambiguous { model: model.into(), group: group.into(), sizes });
        }
        let block_size = sizes.first().copied();
        let keyspaces = ids.into_iter().filter(|k| Some(k.block_size) == block_size).collect();
        Ok(Indexer { block_size, keyspaces, members })
    }

    /// Whether a worker of `group` holds blocks (on any lane and tier) in `ks`.
    fn group_holds(&self, ks: &KeyspaceId, group: &str) -> bool {
        let Some(cell) = self.service().view().engine.keyspace(ks) else { return false };
        let workers: BTreeSet<u64> =
            cell.read().holder_summaries().into_iter().map(|h| h.key.worker).collect();
        let groups = self.label_workers(workers, |_, m| Some(group_of(m) == group));
        groups.values().any(|&mine| mine)
    }
}

/// A worker's routing group: metadata `routing_group`, absent (or no metadata) `"default"`.
fn group_of(m: Meta<'_>) -> &str {
    m.and_then(|m| m.get(META_ROUTING_GROUP)).map_or(DEFAULT_ROUTING_GROUP, String::as_str)
}

/// A holder's prefix on the GPU, on the GPU or host, and on any tier (module doc). A keyspace
/// whose holders are all on the GPU answers without tiers or runs: all of it is GPU.
fn tier_depths(s: &WorkerScore) -> TierDepths {
    if s.runs.is_empty() {
        return TierDepths { gpu: s.depth, cpu: s.depth, disk: s.depth };
    }
    let tier = |code: i32| Tier::from_code(code as u32);
    let gpu = s.tiers.iter().find(|t| tier(t.tier) == Some(Tier::Gpu)).map_or(0, |t| t.depth);
    let cpu = s
        .runs
        .iter()
        .take_while(|r| matches!(tier(r.tier), Some(Tier::Gpu | Tier::Host)))
        .map(|r| r.blocks)
        .sum();
    TierDepths { gpu, cpu, disk: s.depth }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_proto::v1::{TierDepth, TierRun};

    fn run(t: Tier, blocks: u32) -> TierRun {
        TierRun { tier: t.code() as i32, blocks }
    }

    #[test]
    fn tier_depths_are_cumulative_from_the_runs() {
        let gpu_only = WorkerScore { depth: 5, ..Default::default() };
        assert_eq!(tier_depths(&gpu_only), TierDepths { gpu: 5, cpu: 5, disk: 5 });
        let s = WorkerScore {
            depth: 7,
            tiers: vec![TierDepth { tier: Tier::Gpu.code() as i32, depth: 2, total_blocks: 3 }],
            runs: vec![run(Tier::Gpu, 2), run(Tier::Host, 1), run(Tier::Gpu, 1), run(Tier::Disk, 3)],
            ..Default::default()
        };
        assert_eq!(tier_depths(&s), TierDepths { gpu: 2, cpu: 4, disk: 7 });
        let host_first = WorkerScore { depth: 2, runs: vec![run(Tier::Host, 2)], ..Default::default() };
        assert_eq!(tier_depths(&host_first), TierDepths { gpu: 0, cpu: 2, disk: 2 });
    }
}
