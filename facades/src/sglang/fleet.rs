//! `ConfigureExpectedWorkers` (line A: the sgl bridge's fleet mode): the listed workers are
//! announced (address, cache spec) and every other SGLang worker is removed (`WorkerRemoved`:
//! its metadata and feeds go, so its blocks are never answered again).
//!
//! "Other SGLang worker" = a worker whose metadata names an `sgl.worker_id` and which has no
//! feed in another keyspace: a facade serving another model on the same log keeps its workers.

use super::batch::check_worker_id;
use super::pb::{
    ApplyExternalKvBatchRequest, ConfigureExpectedWorkersRequest, ConfigureExpectedWorkersResponse,
};
use super::writer::{desired_metadata, WriteError, Writer, META_WORKER_ID};
use prefixlog_ingest::partition_state::FeedKey;
use prefixlog_ingest::token_of;
use std::collections::BTreeSet;
use std::time::Duration;

/// Most workers one request may list.
pub const MAX_EXPECTED_WORKERS: usize = 65_536;

pub async fn configure(
    w: &Writer,
    req: &ConfigureExpectedWorkersRequest,
    wait: Duration,
) -> Result<ConfigureExpectedWorkersResponse, WriteError> {
    for e in &req.workers {
        check_worker_id(&e.worker_id)?;
    }
    if req.workers.len() > MAX_EXPECTED_WORKERS {
        return Err(WriteError::TooManyWorkers(req.workers.len()));
    }
    if !w.query().view().readiness.is_ready() {
        return Err(WriteError::NotReady);
    }
    let (mut landed, mut listed) = (Vec::new(), BTreeSet::new());
    for e in &req.workers {
        let (worker, mut guard) = w.lock_worker(&e.worker_id, wait).await?;
        listed.insert(worker);
        let st = guard.as_mut().expect("loaded by lock_worker");
        let as_batch = ApplyExternalKvBatchRequest {
            worker_id: e.worker_id.clone(),
            worker_address: e.worker_address.clone(),
            cache_spec: e.cache_spec,
            ..Default::default()
        };
        let metadata = desired_metadata(st.metadata.as_ref(), &as_batch);
        landed.extend(w.announce(worker, st, metadata).await?);
    }
    for name in unlisted(w, &listed) {
        let (worker, guard) = w.lock_worker(&name, wait).await?;
        landed.push(w.remove(worker, guard).await?);
    }
    let status = &w.query().view().status;
    if !landed.is_empty() && !status.wait_for(&token_of(&landed), wait).await {
        tracing::debug!(?wait, "expected workers on the log, not applied here within the wait");
    }
    Ok(ConfigureExpectedWorkersResponse {
        total_workers: listed.len() as u32,
        ready_workers: ready(w, &listed),
    })
}

/// Names of the SGLang workers the replica knows that are not in `listed`.
fn unlisted(w: &Writer, listed: &BTreeSet<u64>) -> Vec<String> {
    let view = w.query().view();
    let Some(applier) = &view.applier else { return Vec::new() };
    let a = applier.lock();
    let mut out = Vec::new();
    for &p in &view.info.owned {
        let part = a.partition(p);
        for (worker, meta) in &part.workers {
            let Some(name) = meta.get(META_WORKER_ID) else { continue };
            let elsewhere = part.feeds.keys().any(|k| k.worker == *worker && &k.keyspace != w.keyspace());
            if !listed.contains(worker) && !elsewhere {
                out.push(name.clone());
            }
        }
    }
    out
}

/// Listed workers whose feed exists and is not gapped.
fn ready(w: &Writer, listed: &BTreeSet<u64>) -> u32 {
    let view = w.query().view();
    let Some(applier) = &view.applier else { return 0 };
    let a = applier.lock();
    let n = listed
        .iter()
        .filter(|&&worker| {
            let key = FeedKey { keyspace: w.keyspace().clone(), worker, dp_rank: 0 };
            let part = a.partition(prefixlog_engine::partition_of(worker, view.info.partition_count));
            part.feeds.get(&key).is_some_and(|f| !f.gapped)
        })
        .count();
    n as u32
}
