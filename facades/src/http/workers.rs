//! `GET /workers?model_name=&routing_group=` in Dynamo's shape (github.com/ai-dynamo/dynamo,
//! Apache-2.0; docs/compat/dynamo-mooncake-http.md), built from the workers' recorded metadata:
//! the `WorkerAdded` records the replica's applier keeps per partition (what `ListWorkers`
//! answers). Served in both dialects (Mooncake names no such route).
//!
//! Bounded: every partition's worker table holds at most `max_workers_per_partition` workers
//! (default 4,096) with at most `max_worker_metadata_bytes` of metadata each (default 4 KiB),
//! so one answer is at most that many entries per partition; the applier lock is held only to
//! copy the matching entries.

use super::{DEFAULT_ROUTING_GROUP, META_ROUTING_GROUP};
use serde::Serialize;
use std::collections::BTreeMap;

/// The metadata key of the worker's model (written by `prefixlog bridge`).
pub const META_MODEL: &str = "model";
/// The metadata key of the worker's block size in tokens (written by `prefixlog bridge`).
pub const META_BLOCK_SIZE: &str = "block_size";
/// The metadata key of the engine's ZeroMQ KV-event endpoints the bridge subscribes to, comma
/// separated, one per data-parallel rank (the bridge's `META_KV_EVENTS`).
pub const META_KV_EVENTS: &str = "kv_events_endpoint";

/// `source` of a worker whose events come from the bridge's ZeroMQ subscription (it recorded
/// the engine's KV-event endpoints), as upstream's indexer subscribes itself.
pub const SOURCE_ZMQ: &str = "zmq";
/// `source` of a worker whose events are written to the log by another publisher (a facade, a
/// `prefixlog.v1` client): no endpoint is recorded.
pub const SOURCE_LOG: &str = "log";
/// `status` of every listed worker: it is announced (its `WorkerAdded` not followed by a
/// removal). Upstream's `pending`/`failed`/`paused` describe its own ZeroMQ listeners, which
/// this replica does not run.
pub const STATUS_ACTIVE: &str = "active";

/// The query string of `GET /workers`; an absent or empty filter matches every worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkersQuery {
    pub model_name: Option<String>,
    pub routing_group: Option<String>,
}

/// One entry of the `GET /workers` array.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct WorkerInfo {
    pub instance_id: u64,
    pub source: &'static str,
    pub status: &'static str,
    /// Metadata `model`; `""` when the worker recorded none.
    pub model_name: String,
    /// Metadata `routing_group`; absent: `"default"`.
    pub routing_group: String,
    /// Metadata `block_size`; 0 when the worker recorded none (or not a number).
    pub block_size: u32,
    /// Position → metadata `kv_events_endpoint`'s entry there (comma separated): the bridge
    /// writes one per engine in `--engine` order, one engine per dp rank as a rule (an engine
    /// whose rank is overridden or sent in its batches may serve another rank).
    pub endpoints: BTreeMap<u32, String>,
    /// Upstream's per-rank listener state: this replica runs no listeners, always empty.
    pub listeners: BTreeMap<u32, serde_json::Value>,
}

impl WorkersQuery {
    /// From a URL query string (percent-decoded; unknown keys ignored; a repeated key: the last).
    pub fn parse(query: &str) -> Self {
        let mut q = Self::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "model_name" => q.model_name = Some(v.into_owned()),
                "routing_group" => q.routing_group = Some(v.into_owned()),
                _ => {}
            }
        }
        q
    }

    /// The entry of `worker` if it passes the filters.
    pub fn entry(&self, worker: u64, meta: &BTreeMap<String, String>) -> Option<WorkerInfo> {
        let get = |k: &str| meta.get(k).map(String::as_str);
        let model = get(META_MODEL).unwrap_or("");
        let group = get(META_ROUTING_GROUP).unwrap_or(DEFAULT_ROUTING_GROUP);
        let wanted = |filter: &Option<String>, value: &str| {
            filter.as_deref().filter(|f| !f.is_empty()).is_none_or(|f| f == value)
        };
        if !wanted(&self.model_name, model) || !wanted(&self.routing_group, group) {
            return None;
        }
        let kv = get(META_KV_EVENTS).filter(|e| !e.is_empty());
        let endpoints = kv
            .map(|e| (0u32..).zip(e.split(',').map(|s| s.trim().to_string())).collect())
            .unwrap_or_default();
        Some(WorkerInfo {
            instance_id: worker,
            source: if kv.is_some() { SOURCE_ZMQ } else { SOURCE_LOG },
            status: STATUS_ACTIVE,
            model_name: model.to_string(),
            routing_group: group.to_string(),
            block_size: get(META_BLOCK_SIZE).and_then(|b| b.parse().ok()).unwrap_or(0),
            endpoints,
            listeners: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_bridge_worker_is_listed_in_upstream_shape() {
        let m = meta(&[
            ("model", "llama"),
            ("block_size", "16"),
            ("kv_events_endpoint", "tcp://10.0.0.5:5557,tcp://10.0.0.5:5558"),
            ("serving_url", "http://10.0.0.5:8000"),
        ]);
        let e = WorkersQuery::default().entry(7, &m).unwrap();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({
                "instance_id": 7, "source": "zmq", "status": "active", "model_name": "llama",
                "routing_group": "default", "block_size": 16,
                "endpoints": {"0": "tcp://10.0.0.5:5557", "1": "tcp://10.0.0.5:5558"},
                "listeners": {}
            })
        );
    }

    #[test]
    fn a_worker_without_endpoints_is_from_the_log_with_unknowns_as_documented() {
        let e = WorkersQuery::default().entry(3, &meta(&[("routing_group", "blue")])).unwrap();
        assert_eq!((e.source, e.model_name.as_str(), e.block_size), ("log", "", 0));
        assert_eq!((e.routing_group.as_str(), e.endpoints.len()), ("blue", 0));
    }

    #[test]
    fn filters_match_model_and_group_and_empty_ones_match_all() {
        let m = meta(&[("model", "llama"), ("routing_group", "blue")]);
        let q = |model: Option<&str>, group: Option<&str>| WorkersQuery {
            model_name: model.map(String::from),
            routing_group: group.map(String::from),
        };
        assert!(q(Some("llama"), Some("blue")).entry(1, &m).is_some());
        assert!(q(Some(""), None).entry(1, &m).is_some());
        assert!(q(Some("gpt"), None).entry(1, &m).is_none());
        assert!(q(None, Some("default")).entry(1, &m).is_none());
        assert!(q(None, Some("default")).entry(1, &meta(&[])).is_some(), "absent group is default");
    }

    #[test]
    fn the_query_string_is_percent_decoded_and_unknown_keys_ignored() {
        let q = WorkersQuery::parse("model_name=meta%2Fllama+3&x=1&routing_group=blue");
        assert_eq!(
            (q.model_name.as_deref(), q.routing_group.as_deref()),
            (Some("meta/llama 3"), Some("blue"))
        );
        assert_eq!(WorkersQuery::parse(""), WorkersQuery::default());
    }
}
