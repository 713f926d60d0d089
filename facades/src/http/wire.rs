//! Dynamo's standalone-indexer JSON, written field for field from its axum server
//! (github.com/ai-dynamo/dynamo, Apache-2.0; docs/compat/dynamo-mooncake-http.md), and the
//! mapping of the replica's per-holder depths onto its score response.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /query`. Unknown fields (`tenant_id`, ...) are ignored, as upstream ignores them.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct QueryRequest {
    pub token_ids: Vec<u32>,
    pub model_name: String,
    #[serde(default)]
    pub routing_group: Option<String>,
    #[serde(default)]
    pub lora_name: Option<String>,
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// `POST /query_by_hash`: position-free block hashes, already computed (i64 on the wire).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct QueryByHashRequest {
    pub block_hashes: Vec<i64>,
    pub model_name: String,
    #[serde(default)]
    pub routing_group: Option<String>,
    /// Must be absent or null: hashes already computed cannot be salted (upstream: 400).
    #[serde(default)]
    pub cache_salt: Option<serde_json::Value>,
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

/// The answer of `/query` and `/query_by_hash`. Map keys are decimal strings on the wire.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ScoreResponse {
    /// Device tier, instance → dp rank → tokens (upstream's legacy field).
    pub scores: BTreeMap<u64, BTreeMap<u32, u64>>,
    /// Upstream's `OverlapScores.frequencies`: prefixlog has no equivalent, always empty.
    pub frequencies: Vec<u64>,
    pub instances: BTreeMap<u64, InstanceCounts>,
}

/// A holder the answer lists: `(worker, dp_rank)` of the keyspace's GPU lane.
pub type Holder = (u64, u32);

/// The score response of `holders` (each listed, with 0 unless matched) given each matched
/// holder's contiguous depth in blocks. Depths of holders not listed are dropped (another
/// routing group). This dialect asks for the GPU tier only (`crate::GPU_ONLY`), so `cpu`
/// and `disk`, which upstream defines as cumulative over `gpu`, equal `gpu`: never more than
/// what was asked.
pub fn score_response(holders: &[Holder], depths: &[(Holder, u32)], block_size: u32) -> ScoreResponse {
    let mut scores: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
    for &(w, dp) in holders {
        scores.entry(w).or_default().insert(dp, 0);
    }
    for &((w, dp), depth) in depths {
        if let Some(t) = scores.get_mut(&w).and_then(|m| m.get_mut(&dp)) {
            *t = (*t).max(u64::from(depth) * u64::from(block_size));
        }
    }
    let instances = scores
        .iter()
        .map(|(&w, dp)| {
            let gpu = dp.values().copied().max().unwrap_or(0);
            (w, InstanceCounts { longest_matched: gpu, gpu, dp: dp.clone(), cpu: gpu, disk: gpu })
        })
        .collect();
    ScoreResponse { scores, frequencies: Vec::new(), instances }
}

/// Upstream's error body: `{"error": "..."}`.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
}

/// A JSON response with `status` (a body that cannot be encoded is a 500 naming why).
pub(super) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(b) => (status, [(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_are_tokens_per_rank_and_unmatched_holders_are_zeros() {
        let holders = [(1, 0), (1, 1), (2, 1)];
        let r = score_response(&holders, &[((1, 0), 3), ((1, 1), 2)], 16);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "scores": {"1": {"0": 48, "1": 32}, "2": {"1": 0}},
                "frequencies": [],
                "instances": {
                    "1": {"longest_matched": 48, "gpu": 48, "dp": {"0": 48, "1": 32}, "cpu": 48, "disk": 48},
                    "2": {"longest_matched": 0, "gpu": 0, "dp": {"1": 0}, "cpu": 0, "disk": 0}
                }
            })
        );
    }

    #[test]
    fn depths_of_holders_not_listed_are_dropped() {
        let r = score_response(&[(2, 0)], &[((1, 0), 5), ((2, 1), 5)], 4);
        assert_eq!(r.instances.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(r.instances[&2].gpu, 0);
    }

    #[test]
    fn nothing_held_is_empty_maps() {
        let v = serde_json::to_value(score_response(&[], &[], 16)).unwrap();
        assert_eq!(v, json!({"scores": {}, "frequencies": [], "instances": {}}));
    }

    #[test]
    fn requests_read_upstream_field_names_and_ignore_tenant() {
        let q: QueryRequest = serde_json::from_value(json!({
            "token_ids": [1, 2, 3], "model_name": "m", "lora_name": "a", "tenant_id": "t"
        }))
        .unwrap();
        assert_eq!(q.token_ids, vec![1, 2, 3]);
        assert_eq!((q.lora_name.as_deref(), q.routing_group, q.cache_salt), (Some("a"), None, None));
        let h: QueryByHashRequest =
            serde_json::from_value(json!({"block_hashes": [-1, 7], "model_name": "m", "cache_salt": null}))
                .unwrap();
        assert_eq!(h.block_hashes, vec![-1, 7]);
        assert_eq!(h.cache_salt, None, "null is absent");
        assert!(serde_json::from_value::<QueryRequest>(json!({"model_name": "m"})).is_err());
    }
}
