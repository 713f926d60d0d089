//! Match queries against reconstructed state, JSON in and out, and state summaries.

use prefixlog_engine::{Engine, HolderKey, KeyspaceId, MatchOptions, Tier};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct KeyspaceJson {
    pub model: String,
    pub block_size: u32,
    #[serde(default = "scheme_1")]
    pub hash_scheme: u32,
}

fn scheme_1() -> u32 {
    prefixlog_engine::scheme::SCHEME_XXH3_CHAINED
}

impl KeyspaceJson {
    pub fn id(&self) -> KeyspaceId {
        KeyspaceId::new(self.model.clone(), self.block_size, self.hash_scheme)
    }
}

/// A 64-bit hash as a JSON number or a `"0x…"` string.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Hash {
    Num(u64),
    Hex(String),
}

impl Hash {
    fn value(&self) -> Result<u64, QueryError> {
        match self {
            Hash::Num(n) => Ok(*n),
            Hash::Hex(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16)
                .map_err(|source| QueryError::BadHash { hash: s.clone(), source }),
        }
    }
}

/// Why a query was not answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("bad hash {hash:?}: {source}")]
    BadHash {
        hash: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("unknown hash scheme {0}")]
    UnknownScheme(u32),
    #[error("a query needs exactly one of `tokens` or `hashes`")]
    TokensOrHashes,
    #[error("no keyspace {keyspace} (known: {})", .known.join(", "))]
    NoKeyspace { keyspace: KeyspaceId, known: Vec<String> },
    #[error("unknown storage tier {0:?} (gpu, host, disk, external)")]
    UnknownTier(String),
}

/// One query: the prompt as token ids or as canonical block hashes.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Query {
    pub keyspace: KeyspaceJson,
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    #[serde(default)]
    pub hashes: Option<Vec<Hash>>,
    #[serde(default)]
    pub top_k: Option<usize>,
    #[serde(default)]
    pub intervals: bool,
    /// The storage tiers that count, in preference order (names; empty: all), as a live
    /// query's `tiers`.
    #[serde(default)]
    pub tiers: Vec<String>,
    /// Per tier name, a matched block's weight in thousandths, as a live query's
    /// `tier_weights`.
    #[serde(default)]
    pub tier_weights: BTreeMap<String, u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerScore {
    pub worker: u64,
    pub dp_rank: u32,
    pub lane: u32,
    pub depth: u32,
    pub total: u32,
    pub inferred: bool,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub intervals: Vec<(u32, u32)>,
    /// Per counted tier: (name, its own depth, its blocks); empty when every holder is on the
    /// GPU (as in a live answer).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tiers: Vec<(String, u32, u32)>,
    /// The matched prefix as (tier name, blocks) runs.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub runs: Vec<(String, u32)>,
    /// With tier weights: Σ run blocks × weight.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub weighted_score: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Answer {
    pub query_blocks: usize,
    pub workers: Vec<WorkerScore>,
}

impl Query {
    /// The chain of local hashes this query asks about.
    pub fn locals(&self) -> Result<Vec<u64>, QueryError> {
        match (&self.tokens, &self.hashes) {
            (Some(t), None) => {
                if !prefixlog_engine::scheme::is_known(self.keyspace.hash_scheme) {
                    return Err(QueryError::UnknownScheme(self.keyspace.hash_scheme));
                }
                Ok(prefixlog_engine::scheme::block_hashes(t, self.keyspace.block_size as usize))
            }
            (None, Some(h)) => h.iter().map(Hash::value).collect(),
            _ => Err(QueryError::TokensOrHashes),
        }
    }
}

/// Answers a query against an engine.
pub fn answer(engine: &Engine, q: &Query) -> Result<Answer, QueryError> {
    let locals = q.locals()?;
    let id = q.keyspace.id();
    let tier = |name: &String| Tier::from_name(name).ok_or_else(|| QueryError::UnknownTier(name.clone()));
    let tiers = q.tiers.iter().map(tier).collect::<Result<Vec<_>, _>>()?;
    let tier_weights = if q.tier_weights.is_empty() {
        None
    } else {
        let mut w = [0u32; 4];
        for (name, &per_mille) in &q.tier_weights {
            w[tier(name)?.code() as usize] = per_mille;
        }
        Some(w)
    };
    let opts =
        MatchOptions { intervals: q.intervals, top_k: q.top_k, tiers, tier_weights, ..Default::default() };
    let known = || engine.keyspace_ids().iter().map(|k| k.to_string()).collect();
    let res = engine
        .match_chain(&id, &locals, &opts)
        .ok_or_else(|| QueryError::NoKeyspace { keyspace: id.clone(), known: known() })?;
    Ok(Answer {
        query_blocks: locals.len(),
        workers: res
            .into_iter()
            .map(|m| WorkerScore {
                worker: m.holder.worker,
                dp_rank: m.holder.dp_rank,
                lane: m.holder.lane,
                depth: m.depth,
                total: m.total,
                inferred: m.inferred,
                intervals: m.intervals().to_vec(),
                tiers: m.tiers().iter().map(|t| (t.tier.name().to_string(), t.depth, t.total)).collect(),
                runs: m.runs().iter().map(|r| (r.tier.name().to_string(), r.blocks)).collect(),
                weighted_score: m.weighted,
            })
            .collect(),
    })
}

/// Blocks per (keyspace, worker), summed over dp ranks and lanes.
pub fn worker_blocks(engine: &Engine) -> BTreeMap<(KeyspaceId, u64), u64> {
    let mut out = BTreeMap::new();
    for ks in engine.keyspaces() {
        let g = ks.read();
        for h in g.holder_summaries() {
            *out.entry((g.id().clone(), h.key.worker)).or_insert(0) += u64::from(h.blocks);
        }
    }
    out
}

/// Every chain a holder holds, as hex local hashes from the root.
pub fn holder_blocks(engine: &Engine, ks: &KeyspaceId, h: HolderKey) -> Vec<Vec<String>> {
    engine
        .keyspace(ks)
        .map(|k| k.read().holder_chains(&h))
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.into_iter().map(|l| format!("{l:#018x}")).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_engine::EngineConfig;
    use prefixlog_state::BlockHashes;

    /// An audit query orders, restricts and weighs tiers as a live query does, and names an
    /// unknown tier instead of guessing.
    #[test]
    fn tier_options_are_read_by_name() {
        let engine = Engine::new(EngineConfig::default());
        let id = KeyspaceId::new("m", 16, 1);
        engine.store(&id, HolderKey::new(3, 0, 0), None, &[(11, 1)].map(BlockHashes::from), 1).unwrap();
        engine
            .store(
                &id,
                HolderKey::new(3, 0, 0).on(Tier::Host),
                None,
                &[(11, 1), (12, 2)].map(BlockHashes::from),
                1,
            )
            .unwrap();
        let q = |tiers: &[&str], weights: &[(&str, u32)]| Query {
            keyspace: KeyspaceJson { model: "m".into(), block_size: 16, hash_scheme: 1 },
            tokens: None,
            hashes: Some(vec![Hash::Num(1), Hash::Num(2)]),
            top_k: None,
            intervals: false,
            tiers: tiers.iter().map(|t| t.to_string()).collect(),
            tier_weights: weights.iter().map(|&(t, w)| (t.to_string(), w)).collect(),
        };
        let a = answer(&engine, &q(&[], &[("gpu", 1000), ("host", 600)])).unwrap();
        let w = &a.workers[0];
        assert_eq!(
            (w.depth, w.runs.clone(), w.weighted_score),
            (2, vec![("gpu".into(), 1), ("host".into(), 1)], Some(1600))
        );
        let a = answer(&engine, &q(&["GPU"], &[])).unwrap();
        assert_eq!((a.workers[0].depth, a.workers[0].runs.clone()), (1, vec![("gpu".into(), 1)]));
        assert!(
            matches!(answer(&engine, &q(&["tape"], &[])), Err(QueryError::UnknownTier(t)) if t == "tape")
        );
    }
}
