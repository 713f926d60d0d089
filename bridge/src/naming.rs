//! How the bridge names a worker for gateways: the metadata of its `WorkerAdded` record
//! (returned by `ListWorkers`), and the worker id of a pod.

use super::{BridgeOptions, EngineSpec};

/// Worker metadata key: the worker's serving URL (an OpenAI-compatible HTTP base URL such as
/// `http://10.0.0.5:8000`): where a gateway routes the requests it chose this worker for.
pub const META_SERVING_URL: &str = "serving_url";
/// Worker metadata key: the pod (or host) the engine runs in.
pub const META_POD: &str = "pod";
/// Worker metadata key: the engine's ZeroMQ KV-event endpoint(s) the bridge subscribes to,
/// comma separated (one per data-parallel rank). Not an address to send requests to.
pub const META_KV_EVENTS: &str = "kv_events_endpoint";

/// A worker id derived from a pod name (`--pod-name` without `--worker-id`): the xxh3 hash of
/// the name with the top bit cleared (ids stay positive as signed 64-bit integers, which some
/// clients use). One pod is one worker; a replaced pod gets a new name, so a new worker whose
/// cache starts empty.
pub fn worker_id_of_pod(pod: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(pod.as_bytes()) & (u64::MAX >> 1)
}

/// A worker's `WorkerAdded` metadata: the operator's entries, plus the model, block size, its
/// serving URL if known, and the engine's KV-event endpoints (comma separated when a worker has
/// several data-parallel ranks).
pub fn worker_metadata<'a>(
    opts: &BridgeOptions,
    worker: u64,
    engines: impl Iterator<Item = &'a EngineSpec>,
) -> std::collections::BTreeMap<String, String> {
    let mut m = opts.worker_metadata.clone();
    m.entry("model".into()).or_insert_with(|| opts.keyspace.model.clone());
    m.entry("block_size".into()).or_insert_with(|| opts.keyspace.block_size.to_string());
    if let Some(url) = opts.serving_urls.get(&worker) {
        m.insert(META_SERVING_URL.into(), url.clone());
    }
    let endpoints: Vec<&str> = engines.map(|e| e.endpoint.as_str()).collect();
    m.entry(META_KV_EVENTS.into()).or_insert_with(|| endpoints.join(","));
    m
}
