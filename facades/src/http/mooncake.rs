//! Mooncake conductor's `/query` JSON, written field for field from its design doc
//! (github.com/kvcache-ai/Mooncake, `docs/source/design/conductor/indexer-api-design.md`, which
//! consolidates RFC #1403; Apache-2.0; docs/compat/dynamo-mooncake-http.md), and the mapping of
//! the replica's per-holder depths onto its per-tenant, per-instance answer.

use super::wire::Holder;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /query` of the Mooncake dialect. Unknown fields are ignored.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct MooncakeQuery {
    pub model: String,
    #[serde(default)]
    pub lora_name: Option<String>,
    /// Deprecated upstream ("do not use together with `lora_name`"): read and ignored, since a
    /// numeric adapter id names no namespace prefixlog files blocks under.
    #[serde(default)]
    pub lora_id: Option<serde_json::Value>,
    pub token_ids: Vec<u32>,
    /// Absent or empty: `"default"`.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// Set: only that instance; absent or empty: every instance of the tenant.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Required upstream: with the model, it names the keyspace.
    pub block_size: u32,
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// One instance's hits, in tokens. Upstream's media are per medium ("matched prefix tokens
/// available on each medium"), not cumulative: `GPU`, `CPU` and `DISK` are the prefixes held
/// on prefixlog's gpu, host and disk tiers alone, and `longest_matched` ("longest continuous
/// prefix hit in tokens across all tracked media and DP ranks") the prefix held on any of
/// them, as is each `DP` rank's entry.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct InstanceHits {
    pub longest_matched: u64,
    #[serde(rename = "GPU")]
    pub gpu: u64,
    #[serde(rename = "DP")]
    pub dp: BTreeMap<u32, u64>,
    #[serde(rename = "CPU")]
    pub cpu: u64,
    #[serde(rename = "DISK")]
    pub disk: u64,
}

/// `{"<tenant>": {"<instance_id>": InstanceHits}}`.
pub type MooncakeResponse = BTreeMap<String, BTreeMap<String, InstanceHits>>;

/// A holder's matched prefix in blocks: on any of the three tiers, and on each alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MediaDepths {
    pub any: u32,
    pub gpu: u32,
    pub host: u32,
    pub disk: u32,
}

/// The answer for `tenant` given each listed holder's instance name and each matched holder's
/// depths in blocks. Every listed holder appears (0 unless matched); holders of one instance
/// (several workers naming the same `instance_id`) share its entry, per dp rank and medium the
/// best; depths of holders not listed are dropped (another tenant or instance).
pub fn mooncake_response(
    tenant: &str,
    holders: &[(Holder, String)],
    depths: &[(Holder, MediaDepths)],
    block_size: u32,
) -> MooncakeResponse {
    let depth_of: BTreeMap<Holder, MediaDepths> = depths.iter().copied().collect();
    let tokens = |blocks: u32| u64::from(blocks) * u64::from(block_size);
    let mut instances: BTreeMap<String, InstanceHits> = BTreeMap::new();
    for (holder, name) in holders {
        let d = depth_of.get(holder).copied().unwrap_or_default();
        let hits = instances.entry(name.clone()).or_default();
        let rank = hits.dp.entry(holder.1).or_insert(0);
        *rank = (*rank).max(tokens(d.any));
        hits.longest_matched = hits.longest_matched.max(tokens(d.any));
        hits.gpu = hits.gpu.max(tokens(d.gpu));
        hits.cpu = hits.cpu.max(tokens(d.host));
        hits.disk = hits.disk.max(tokens(d.disk));
    }
    BTreeMap::from([(tenant.to_string(), instances)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hits_are_tokens_per_instance_under_the_tenant_with_upstream_names() {
        let holders = [((1, 0), "a".to_string()), ((1, 1), "a".to_string()), ((2, 0), "7".to_string())];
        let r = mooncake_response("t", &holders, &[((1, 0), gpu(2)), ((1, 1), gpu(3)), ((9, 0), gpu(5))], 16);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"t": {
                "a": {"longest_matched": 48, "GPU": 48, "DP": {"0": 32, "1": 48}, "CPU": 0, "DISK": 0},
                "7": {"longest_matched": 0, "GPU": 0, "DP": {"0": 0}, "CPU": 0, "DISK": 0}
            }})
        );
    }

    #[test]
    fn workers_sharing_an_instance_name_merge_per_rank_by_the_best() {
        let holders = [((1, 0), "x".to_string()), ((2, 0), "x".to_string()), ((2, 1), "x".to_string())];
        let r = mooncake_response("default", &holders, &[((1, 0), gpu(1)), ((2, 0), gpu(4))], 2);
        let x = &r["default"]["x"];
        assert_eq!((x.gpu, x.dp.clone()), (8, BTreeMap::from([(0, 8), (1, 0)])));
    }

    fn gpu(blocks: u32) -> MediaDepths {
        MediaDepths { any: blocks, gpu: blocks, ..Default::default() }
    }

    /// Media are each medium's own prefix; `longest_matched` and `DP` the prefix on any.
    #[test]
    fn media_are_per_medium_and_the_longest_match_spans_them() {
        let holders = [((1, 0), "a".to_string()), ((1, 1), "a".to_string())];
        let offloaded = MediaDepths { any: 5, gpu: 1, host: 3, disk: 0 };
        let r = mooncake_response("t", &holders, &[((1, 0), offloaded), ((1, 1), gpu(2))], 4);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"t": {"a": {"longest_matched": 20, "GPU": 8, "DP": {"0": 20, "1": 8}, "CPU": 12, "DISK": 0}}})
        );
    }

    #[test]
    fn nothing_held_is_the_tenant_with_no_instances() {
        let v = serde_json::to_value(mooncake_response("default", &[], &[], 16)).unwrap();
        assert_eq!(v, json!({"default": {}}));
    }

    #[test]
    fn requests_read_upstream_field_names() {
        let q: MooncakeQuery = serde_json::from_value(json!({
            "model": "m", "lora_name": "a", "lora_id": 3, "token_ids": [1, 2],
            "tenant_id": "t", "instance_id": "i", "block_size": 64, "cache_salt": "s"
        }))
        .unwrap();
        assert_eq!((q.model.as_str(), q.block_size, q.token_ids.clone()), ("m", 64, vec![1, 2]));
        assert_eq!((q.tenant_id.as_deref(), q.instance_id.as_deref()), (Some("t"), Some("i")));
        assert_eq!((q.lora_name.as_deref(), q.cache_salt.as_deref()), (Some("a"), Some("s")));
        let bare: MooncakeQuery =
            serde_json::from_value(json!({"model": "m", "token_ids": [], "block_size": 4})).unwrap();
        assert_eq!((bare.tenant_id, bare.instance_id, bare.lora_name), (None, None, None));
        // block_size names the keyspace: required, as upstream; Dynamo's field names are not read.
        assert!(serde_json::from_value::<MooncakeQuery>(json!({"model": "m", "token_ids": []})).is_err());
        assert!(serde_json::from_value::<MooncakeQuery>(
            json!({"model_name": "m", "token_ids": [], "block_size": 4})
        )
        .is_err());
    }
}
