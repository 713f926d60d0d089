//! Dynamo's standalone-indexer JSON, written field for field from its axum server
//! (github.com/ai-dynamo/dynamo, `lib/kv-router/src/services/indexer/server.rs`, Apache-2.0;
//! checked against ai-dynamo-runtime 1.6.1 by `tests/upstream/test_dynamo_http.py`), and the
//! mapping of the replica's per-holder depths onto its score response.
//!
//! The request structs keep upstream's field order, defaults and struct names: axum's `Json`
//! extractor words a rejected body after them (`missing field`, `invalid type` with the path,
//! `expected struct QueryRequest with 6 elements`), so a client sees the same 422 text.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Upstream's `default_routing_group` (also the default of `tenant_id`).
fn default_group() -> String {
    super::DEFAULT_ROUTING_GROUP.to_string()
}

/// `POST /query`. Unknown fields are ignored, as upstream ignores them; `tenant_id` is read
/// (a non-string is refused as upstream refuses it) and not used.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct QueryRequest {
    pub token_ids: Vec<u32>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(default = "default_group")]
    pub tenant_id: String,
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Dynamo's cache namespace: part of the seed of every block's hash.
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// `POST /query_by_hash`: position-free block hashes, already computed (i64 on the wire).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct QueryByHashRequest {
    pub block_hashes: Vec<i64>,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(default = "default_group")]
    pub tenant_id: String,
    /// Must be absent or null: hashes already computed cannot be salted (upstream: 400).
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// `POST /register`: subscribe to an engine's KV-event stream (one dp rank of an instance).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RegisterRequest {
    pub instance_id: u64,
    pub endpoint: String,
    pub model_name: String,
    #[serde(default = "default_group")]
    pub routing_group: String,
    #[serde(default = "default_group")]
    pub tenant_id: String,
    pub block_size: u32,
    #[serde(default)]
    pub dp_rank: Option<u32>,
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Mooncake RFC #1403's `additionalsalt`: accepted and not used, as upstream.
    #[serde(default, alias = "additionalsalt", rename = "additional_salt")]
    pub additional_salt: Option<String>,
}

/// `POST /unregister`: without `routing_group` the instance is removed whatever its group (and
/// `dp_rank` is not read); with it, one rank when `dp_rank` is given, else every rank.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct UnregisterRequest {
    pub instance_id: u64,
    pub model_name: String,
    #[serde(default)]
    pub routing_group: Option<String>,
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub dp_rank: Option<u32>,
}

/// `POST /register_peer`, `POST /deregister_peer`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PeerRequest {
    pub url: String,
}

/// One instance's counts in tokens (Mooncake RFC #1403 alignment on Dynamo's side).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct InstanceCounts {
    pub longest_matched: u64,
    pub gpu: u64,
    pub dp: BTreeMap<u32, u64>,
    pub cpu: u64,
    pub disk: u64,
}

/// The answer of `/query` and `/query_by_hash` as upstream's types shape it (map keys are
/// decimal strings on the wire): the reference [`ScoreAnswer`] is tested against.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ScoreResponse {
    /// Device tier, instance → dp rank → tokens, matched ranks only (upstream's legacy field).
    pub scores: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Upstream's `OverlapScores.frequencies`, which its standalone indexer leaves empty.
    pub frequencies: Vec<u64>,
    pub instances: BTreeMap<u64, InstanceCounts>,
}

/// A holder the answer lists: `(worker, dp_rank)` of the keyspace's lane 0.
pub type Holder = (u64, u32);

/// One holder's matched prefix, in blocks: on the GPU; on the GPU or in host memory; on any
/// tier (GPU, host, disk, external). Upstream's `gpu`, `cpu` and `disk` (cumulative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierDepths {
    pub gpu: u32,
    pub cpu: u32,
    pub disk: u32,
}

impl TierDepths {
    /// The larger of each depth (the same holder matched in two keyspaces of the indexer).
    pub fn max(self, o: Self) -> Self {
        Self { gpu: self.gpu.max(o.gpu), cpu: self.cpu.max(o.cpu), disk: self.disk.max(o.disk) }
    }
}

/// The score response of the matched holders, as upstream builds it (the reference model of
/// [`ScoreAnswer`]): a holder matching
/// nothing on any tier is not listed; `scores` lists the ranks with a GPU match; an instance's
/// `dp` lists every listed rank's GPU tokens, `gpu`, `cpu` and `disk` are the best rank's, and
/// `longest_matched` the largest of the three.
pub fn score_response(depths: &[(Holder, TierDepths)], block_size: u32) -> ScoreResponse {
    let tokens = |blocks: u32| u64::from(blocks) * u64::from(block_size);
    let mut r = ScoreResponse::default();
    for &((w, dp), d) in depths.iter().filter(|(_, d)| d.disk.max(d.cpu).max(d.gpu) > 0) {
        if d.gpu > 0 {
            r.scores.entry(w).or_default().insert(dp, tokens(d.gpu));
        }
        let i = r.instances.entry(w).or_default();
        i.dp.insert(dp, tokens(d.gpu));
        i.gpu = i.gpu.max(tokens(d.gpu));
        i.cpu = i.cpu.max(tokens(d.cpu));
        i.disk = i.disk.max(tokens(d.disk));
        i.longest_matched = i.gpu.max(i.cpu).max(i.disk);
    }
    r
}

/// The answer of `/query` and `/query_by_hash` as it goes out: the same JSON as
/// [`ScoreResponse`] (pinned by a differential test), written straight from the holders'
/// depths in holder order. Building the response's nested maps for every holder and then
/// serializing them was a fifth of the facade's CPU per query at 256 workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoreAnswer {
    /// By holder, one entry each, every one matching something on some tier.
    depths: Vec<(Holder, TierDepths)>,
    block_size: u32,
}

impl ScoreAnswer {
    /// From the depths of every match (a holder may come twice, from two keyspaces: the longer
    /// of each depth is kept; holders matching nothing are left out, as in [`score_response`]).
    pub fn new(mut depths: Vec<(Holder, TierDepths)>, block_size: u32) -> Self {
        depths.sort_unstable_by_key(|(h, _)| *h);
        depths.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 = kept.1.max(later.1);
            }
            same
        });
        depths.retain(|(_, d)| d.disk.max(d.cpu).max(d.gpu) > 0);
        Self { depths, block_size }
    }

    /// About the bytes of its JSON: each instance takes ~100 (its score and its counts).
    pub fn json_len_hint(&self) -> usize {
        64 + 112 * self.depths.len()
    }

    fn tokens(&self, blocks: u32) -> u64 {
        u64::from(blocks) * u64::from(self.block_size)
    }

    /// Each instance's ranks (consecutive: the depths are in holder order).
    fn instances(&self) -> impl Iterator<Item = &[(Holder, TierDepths)]> {
        self.depths.chunk_by(|a, b| a.0 .0 == b.0 .0)
    }
}

impl Serialize for ScoreAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut m = s.serialize_struct("ScoreResponse", 3)?;
        m.serialize_field("scores", &Scores(self))?;
        m.serialize_field("frequencies", &[0u64; 0])?;
        m.serialize_field("instances", &Instances(self))?;
        m.end()
    }
}

/// `scores`: instance → rank → GPU tokens, ranks with a GPU match only.
struct Scores<'a>(&'a ScoreAnswer);

impl Serialize for Scores<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for ranks in self.0.instances().filter(|r| r.iter().any(|(_, d)| d.gpu > 0)) {
            m.serialize_entry(&ranks[0].0 .0, &Ranks(self.0, ranks, true))?;
        }
        m.end()
    }
}

/// An instance's ranks → GPU tokens (only those with a GPU match when `.2`).
struct Ranks<'a>(&'a ScoreAnswer, &'a [(Holder, TierDepths)], bool);

impl Serialize for Ranks<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for ((_, dp), d) in self.1.iter().filter(|(_, d)| !self.2 || d.gpu > 0) {
            m.serialize_entry(dp, &self.0.tokens(d.gpu))?;
        }
        m.end()
    }
}

/// `instances`: instance → [`InstanceCounts`].
struct Instances<'a>(&'a ScoreAnswer);

impl Serialize for Instances<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeStruct};
        struct Counts<'a>(&'a ScoreAnswer, &'a [(Holder, TierDepths)]);
        impl Serialize for Counts<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let best = self.1.iter().fold(TierDepths::default(), |a, (_, d)| a.max(*d));
                let (gpu, cpu, disk) =
                    (self.0.tokens(best.gpu), self.0.tokens(best.cpu), self.0.tokens(best.disk));
                let mut m = s.serialize_struct("InstanceCounts", 5)?;
                m.serialize_field("longest_matched", &gpu.max(cpu).max(disk))?;
                m.serialize_field("gpu", &gpu)?;
                m.serialize_field("dp", &Ranks(self.0, self.1, false))?;
                m.serialize_field("cpu", &cpu)?;
                m.serialize_field("disk", &disk)?;
                m.end()
            }
        }
        let mut m = s.serialize_map(None)?;
        for ranks in self.0.instances() {
            m.serialize_entry(&ranks[0].0 .0, &Counts(self.0, ranks))?;
        }
        m.end()
    }
}

/// Upstream's error body: `{"error": "..."}`.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
}

/// A JSON response with `status` (a body that cannot be encoded is a 500 naming why).
pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    json_sized(status, body, 128)
}

/// [`json`] into a buffer of `capacity` bytes to start with (a large answer written into a
/// small buffer is copied at every doubling).
pub(super) fn json_sized<T: Serialize>(status: StatusCode, body: &T, capacity: usize) -> Response {
    let mut b = Vec::with_capacity(capacity);
    match serde_json::to_writer(&mut b, body) {
        Ok(()) => (status, [(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `{"status": "ok"}` with `status`, upstream's answer to a write that succeeded.
pub(super) fn ok(status: StatusCode) -> Response {
    json(status, &serde_json::json!({"status": "ok"}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(gpu: u32, cpu: u32, disk: u32) -> TierDepths {
        TierDepths { gpu, cpu, disk }
    }

    #[test]
    fn counts_are_tokens_per_rank_and_unmatched_holders_are_left_out() {
        let depths = [((1, 0), d(3, 3, 3)), ((1, 1), d(2, 2, 2)), ((2, 1), d(0, 0, 0))];
        assert_eq!(
            serde_json::to_value(score_response(&depths, 16)).unwrap(),
            json!({
                "scores": {"1": {"0": 48, "1": 32}},
                "frequencies": [],
                "instances": {
                    "1": {"longest_matched": 48, "gpu": 48, "dp": {"0": 48, "1": 32}, "cpu": 48, "disk": 48}
                }
            })
        );
    }

    /// A rank matching only off the GPU is an instance (with 0 GPU tokens) but no score, as
    /// upstream's instances take every worker any tier matched and its scores the device's.
    #[test]
    fn lower_tiers_are_cumulative_and_list_the_instance_without_a_score() {
        let r = score_response(&[((7, 0), d(1, 3, 4)), ((8, 2), d(0, 2, 2))], 4);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "scores": {"7": {"0": 4}},
                "frequencies": [],
                "instances": {
                    "7": {"longest_matched": 16, "gpu": 4, "dp": {"0": 4}, "cpu": 12, "disk": 16},
                    "8": {"longest_matched": 8, "gpu": 0, "dp": {"2": 0}, "cpu": 8, "disk": 8}
                }
            })
        );
    }

    /// The answer written from the depths is byte for byte the response built from maps, on
    /// seeded random holders: repeated holders (two keyspaces), several ranks, every tier
    /// pattern, unmatched holders.
    #[test]
    fn the_written_answer_is_the_built_response() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..500 {
            let len = next(40) as usize;
            let depths: Vec<(Holder, TierDepths)> = (0..len)
                .map(|_| {
                    let (gpu, up, more) = (next(4) as u32, next(3) as u32, next(3) as u32);
                    ((next(12), next(3) as u32), d(gpu, gpu + up, gpu + up + more))
                })
                .collect();
            let bs = 1 + next(32) as u32;
            let mut merged: BTreeMap<Holder, TierDepths> = BTreeMap::new();
            for &(h, t) in &depths {
                let e = merged.entry(h).or_default();
                *e = e.max(t);
            }
            let built = score_response(&merged.into_iter().collect::<Vec<_>>(), bs);
            let written = ScoreAnswer::new(depths.clone(), bs);
            assert_eq!(
                serde_json::to_string(&written).unwrap(),
                serde_json::to_string(&built).unwrap(),
                "{depths:?}"
            );
        }
        assert_eq!(
            serde_json::to_string(&ScoreAnswer::default()).unwrap(),
            r#"{"scores":{},"frequencies":[],"instances":{}}"#
        );
    }

    #[test]
    fn nothing_matched_is_empty_maps() {
        let v = serde_json::to_value(score_response(&[], 16)).unwrap();
        assert_eq!(v, json!({"scores": {}, "frequencies": [], "instances": {}}));
    }

    #[test]
    fn requests_read_upstream_fields_and_defaults() {
        let q: QueryRequest = serde_json::from_value(json!({
            "token_ids": [1, 2, 3], "model_name": "m", "lora_name": "a", "extra": 1
        }))
        .unwrap();
        assert_eq!((q.routing_group.as_str(), q.tenant_id.as_str()), ("default", "default"));
        assert_eq!((q.lora_name.as_deref(), q.cache_salt), (Some("a"), None));
        let h: QueryByHashRequest =
            serde_json::from_value(json!({"block_hashes": [-1, 7], "model_name": "m", "cache_salt": null}))
                .unwrap();
        assert_eq!((h.block_hashes, h.cache_salt), (vec![-1, 7], None), "null is absent");
        let r: RegisterRequest = serde_json::from_value(json!({
            "instance_id": 3, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16,
            "additionalsalt": "s"
        }))
        .unwrap();
        assert_eq!((r.dp_rank, r.additional_salt.as_deref()), (None, Some("s")));
        // Upstream refuses a null group (a String with a default), and names the path.
        let e = serde_json::from_value::<QueryRequest>(
            json!({"token_ids": [], "model_name": "m", "routing_group": null}),
        );
        assert!(e.unwrap_err().to_string().contains("expected a string"));
    }
}
