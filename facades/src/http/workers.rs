//! `GET /workers?model_name=&routing_group=` in Dynamo's shape (github.com/ai-dynamo/dynamo,
//! Apache-2.0; docs/compat/dynamo-mooncake-http.md), built from the workers' recorded metadata:
//! the `WorkerAdded` records the replica's applier keeps per partition (what `ListWorkers`
//! answers). Served in both dialects (Mooncake names no such route).
//!
//! - A worker registered through `/register` ([`super::registration`]) is listed as upstream
//!   lists it: its ranks' endpoints and listeners, each listener's status the subscription's
//!   on the replica that runs it ([`super::listeners`]; `pending` there until it runs),
//!   `active` on the others (the log says it is registered; only its registrar knows more).
//! - A worker `prefixlog bridge` announced (it recorded `kv_events_endpoint`) is listed with
//!   one endpoint and one `active` listener per engine, in `--engine` order.
//! - Any other worker (written to the log by another publisher) is listed with source `log`
//!   and no endpoints nor listeners.
//!
//! Bounded: every partition's worker table holds at most `max_workers_per_partition` workers
//! (default 4,096) with at most `max_worker_metadata_bytes` of metadata each (default 4 KiB),
//! so one answer is at most that many entries per partition; the applier lock is held only to
//! copy the matching entries.

use super::listeners::Live;
use super::registration::Registration;
use super::{DEFAULT_ROUTING_GROUP, META_BLOCK_SIZE, META_KV_EVENTS, META_MODEL, META_ROUTING_GROUP};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `source` of a worker whose events come from a ZeroMQ subscription (a registration's, or
/// `prefixlog bridge`'s), as upstream's indexer subscribes itself.
pub const SOURCE_ZMQ: &str = "zmq";
/// `source` of a worker whose events are written to the log by another publisher (a facade, a
/// `prefixlog.v1` client): no endpoint is recorded.
pub const SOURCE_LOG: &str = "log";
/// Upstream's listener status of a subscription that runs.
pub const STATUS_ACTIVE: &str = "active";

/// The query string of `GET /workers` (axum's `Query`, as upstream): a filter given, even
/// empty, must equal the worker's value; `tenant_id` is read and not used.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct WorkersQuery {
    pub model_name: Option<String>,
    pub routing_group: Option<String>,
    #[serde(default)]
    pub tenant_id: Option<String>,
}

/// One listener of a worker: an engine stream a subscription reads.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ListenerInfo {
    pub endpoint: String,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One entry of the `GET /workers` array.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct WorkerInfo {
    pub instance_id: u64,
    pub source: &'static str,
    /// Upstream's aggregate of the listeners' statuses (`failed` over `pending` over `active`).
    pub status: &'static str,
    /// Metadata `model`; `""` when the worker recorded none.
    pub model_name: String,
    /// Metadata `routing_group`; absent: `"default"`.
    pub routing_group: String,
    /// Metadata `block_size`; 0 when the worker recorded none (or not a number).
    pub block_size: u32,
    /// dp rank (a registration) or position in `kv_events_endpoint` (a bridge) → endpoint.
    pub endpoints: BTreeMap<u32, String>,
    pub listeners: BTreeMap<u32, ListenerInfo>,
}

impl WorkersQuery {
    /// The entry of `worker` if it passes the filters; `live(dp)` is the state of the
    /// subscription to one of its registered ranks if this replica runs it.
    pub fn entry(
        &self,
        worker: u64,
        meta: &BTreeMap<String, String>,
        live: impl Fn(u32) -> Option<Live>,
    ) -> Option<WorkerInfo> {
        let get = |k: &str| meta.get(k).map(String::as_str);
        let model = get(META_MODEL).unwrap_or("");
        let group = get(META_ROUTING_GROUP).unwrap_or(DEFAULT_ROUTING_GROUP);
        let passes = |filter: &Option<String>, value: &str| filter.as_deref().is_none_or(|f| f == value);
        if !passes(&self.model_name, model) || !passes(&self.routing_group, group) {
            return None;
        }
        let listeners = listeners(meta, live);
        let source = if listeners.is_empty() { SOURCE_LOG } else { SOURCE_ZMQ };
        Some(WorkerInfo {
            instance_id: worker,
            source,
            status: aggregate(listeners.values().map(|l| l.status)),
            model_name: model.to_string(),
            routing_group: group.to_string(),
            block_size: get(META_BLOCK_SIZE).and_then(|b| b.parse().ok()).unwrap_or(0),
            endpoints: listeners.iter().map(|(&k, l)| (k, l.endpoint.clone())).collect(),
            listeners,
        })
    }
}

/// A worker's listeners: a registration's ranks, else the bridge's endpoints by position.
fn listeners(
    meta: &BTreeMap<String, String>,
    live: impl Fn(u32) -> Option<Live>,
) -> BTreeMap<u32, ListenerInfo> {
    if let Some(reg) = Registration::from_meta(meta) {
        return reg
            .ranks
            .into_iter()
            .map(|(dp, r)| {
                let l = live(dp).unwrap_or(Live { status: STATUS_ACTIVE, last_error: None });
                (dp, ListenerInfo { endpoint: r.endpoint, status: l.status, last_error: l.last_error })
            })
            .collect();
    }
    let Some(kv) = meta.get(META_KV_EVENTS).filter(|e| !e.is_empty()) else { return BTreeMap::new() };
    (0u32..)
        .zip(kv.split(','))
        .map(|(i, e)| {
            (i, ListenerInfo { endpoint: e.trim().to_string(), status: STATUS_ACTIVE, last_error: None })
        })
        .collect()
}

/// Upstream's `ListenerStatus::aggregate`: any failed, else any pending, else any active, else
/// paused (no listeners: `paused`, as upstream's empty aggregate; only a `log` worker has none).
fn aggregate<'a>(statuses: impl Iterator<Item = &'a str>) -> &'static str {
    let (mut pending, mut active) = (false, false);
    for s in statuses {
        match s {
            "failed" => return "failed",
            "pending" => pending = true,
            "active" => active = true,
            _ => {}
        }
    }
    if pending {
        "pending"
    } else if active {
        "active"
    } else {
        "paused"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn all() -> WorkersQuery {
        WorkersQuery::default()
    }

    #[test]
    fn a_bridge_worker_is_listed_in_upstream_shape() {
        let m = meta(&[
            ("model", "llama"),
            ("block_size", "16"),
            ("kv_events_endpoint", "tcp://10.0.0.5:5557,tcp://10.0.0.5:5558"),
            ("serving_url", "http://10.0.0.5:8000"),
        ]);
        let e = all().entry(7, &m, |_| None).unwrap();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({
                "instance_id": 7, "source": "zmq", "status": "active", "model_name": "llama",
                "routing_group": "default", "block_size": 16,
                "endpoints": {"0": "tcp://10.0.0.5:5557", "1": "tcp://10.0.0.5:5558"},
                "listeners": {
                    "0": {"endpoint": "tcp://10.0.0.5:5557", "status": "active"},
                    "1": {"endpoint": "tcp://10.0.0.5:5558", "status": "active"}
                }
            })
        );
    }

    #[test]
    fn a_registration_lists_its_ranks_with_the_subscriptions_state() {
        let mut r = Registration::new("m", "g", 4, "a");
        r.ranks.insert(0, super::super::registration::Rank { endpoint: "tcp://h:1".into(), replay: None });
        r.ranks.insert(2, super::super::registration::Rank { endpoint: "tcp://h:3".into(), replay: None });
        let failed = |dp| (dp == 2).then(|| Live { status: "failed", last_error: Some("boom".into()) });
        let e = all().entry(5, &r.to_meta(), failed).unwrap();
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({
                "instance_id": 5, "source": "zmq", "status": "failed", "model_name": "m",
                "routing_group": "g", "block_size": 4,
                "endpoints": {"0": "tcp://h:1", "2": "tcp://h:3"},
                "listeners": {
                    "0": {"endpoint": "tcp://h:1", "status": "active"},
                    "2": {"endpoint": "tcp://h:3", "status": "failed", "last_error": "boom"}
                }
            })
        );
    }

    #[test]
    fn a_worker_without_endpoints_is_from_the_log_with_unknowns_as_documented() {
        let e = all().entry(3, &meta(&[("routing_group", "blue")]), |_| None).unwrap();
        assert_eq!((e.source, e.model_name.as_str(), e.block_size), ("log", "", 0));
        assert_eq!((e.routing_group.as_str(), e.endpoints.len(), e.status), ("blue", 0, "paused"));
    }

    /// As upstream: a filter given must equal the value, even empty.
    #[test]
    fn filters_match_model_and_group_exactly() {
        let m = meta(&[("model", "llama"), ("routing_group", "blue")]);
        let q = |model: Option<&str>, group: Option<&str>| WorkersQuery {
            model_name: model.map(String::from),
            routing_group: group.map(String::from),
            tenant_id: None,
        };
        assert!(q(Some("llama"), Some("blue")).entry(1, &m, |_| None).is_some());
        assert!(q(Some(""), None).entry(1, &m, |_| None).is_none());
        assert!(q(Some("gpt"), None).entry(1, &m, |_| None).is_none());
        assert!(q(None, Some("default")).entry(1, &m, |_| None).is_none());
        assert!(q(None, Some("default")).entry(1, &meta(&[]), |_| None).is_some(), "absent group is default");
        assert!(q(Some(""), None).entry(1, &meta(&[]), |_| None).is_some(), "absent model is \"\"");
    }
}
