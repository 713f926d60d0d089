//! `ConfigureExpectedWorkers` (line A: the sgl bridge's fleet mode): the listed workers are
//! announced (address, cache spec) and every other SGLang worker is removed (`WorkerRemoved`:
//! its metadata and feeds go, so its blocks are never answered again).
//!
//! "Other SGLang worker" = a worker whose metadata names an `sgl.worker_id` and which has no
//! feed in another keyspace: a facade serving another model on the same log keeps its workers.
//! Under writer tokens ([`crate::writers`]) a request may list only its own names, and removes
//! only unlisted workers its token may write: an empty list from one writer empties its own
//! workers, never another writer's.

use super::batch::check_worker_id;
use super::pb::{
    ApplyExternalKvBatchRequest, ConfigureExpectedWorkersRequest, ConfigureExpectedWorkersResponse,
    ExpectedWorker,
};
use super::writer::{check_metadata_size, desired_metadata, WriteError, Writer, META_WORKER_ID};
use super::MAX_EXPECTED_WORKERS;
use crate::names::{worker_id, SGLANG_SEED};
use crate::writers::Grant;
use prefixlog_engine::KeyspaceId;
use prefixlog_state::partition_state::FeedKey;
use prefixlog_state::token_of;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Applies the request; also returns how many recorded workers were left alone because their
/// name does not map to their id (`reason="worker_id_mismatch"`).
pub async fn configure(
    w: &Writer,
    req: &ConfigureExpectedWorkersRequest,
    grant: &Grant,
    wait: Duration,
) -> Result<(ConfigureExpectedWorkersResponse, u64), WriteError> {
    // Checked before anything is published: a refused entry leaves the fleet as it was (the
    // recorded metadata may still add a line-A epoch; that is checked per worker below).
    for e in &req.workers {
        check_worker_id(&e.worker_id)?;
        grant.check(&e.worker_id)?;
        grant.admit(worker_id(SGLANG_SEED, &e.worker_id), w.keyspace())?;
        check_metadata_size(&desired_metadata(None, &as_batch(e)))?;
    }
    if req.workers.len() > MAX_EXPECTED_WORKERS {
        return Err(WriteError::TooManyWorkers(req.workers.len()));
    }
    if !w.query().view().readiness.is_ready() {
        return Err(crate::writes::WriteRefused::NotReady(crate::writes::Subject::Worker).into());
    }
    let (mut landed, mut listed) = (Vec::new(), BTreeSet::new());
    for e in &req.workers {
        let (worker, mut guard) = w.lock_worker(&e.worker_id, wait).await?;
        listed.insert(worker);
        let st = guard.as_mut().expect("loaded by lock_worker");
        let metadata = desired_metadata(st.metadata.as_ref(), &as_batch(e));
        check_metadata_size(&metadata)?;
        landed.extend(w.announce(worker, st, metadata).await?);
    }
    let (names, mismatched) = unlisted(w, &listed);
    for name in names.into_iter().filter(|n| grant.allows(n)) {
        let (worker, guard) = w.lock_worker(&name, wait).await?;
        landed.push(w.remove(worker, guard).await?);
        grant.release(worker);
    }
    let status = &w.query().view().status;
    if !landed.is_empty() && !status.wait_for(&token_of(&landed), wait).await {
        tracing::debug!(?wait, "expected workers on the log, not applied here within the wait");
    }
    let response = ConfigureExpectedWorkersResponse {
        total_workers: listed.len() as u32,
        ready_workers: ready(w, &listed),
    };
    Ok((response, mismatched))
}

/// An expected worker as the batch fields its metadata is made of.
fn as_batch(e: &ExpectedWorker) -> ApplyExternalKvBatchRequest {
    ApplyExternalKvBatchRequest {
        worker_id: e.worker_id.clone(),
        worker_address: e.worker_address.clone(),
        cache_spec: e.cache_spec,
        ..Default::default()
    }
}

/// Names of the SGLang workers the replica knows that are not in `listed`, and how many
/// entries were skipped because their name does not map to their worker id.
fn unlisted(w: &Writer, listed: &BTreeSet<u64>) -> (Vec<String>, u64) {
    let view = w.query().view();
    let Some(applier) = &view.applier else { return (Vec::new(), 0) };
    let a = applier.lock();
    let (mut out, mut mismatched) = (Vec::new(), 0);
    for &p in &view.info.owned {
        let part = a.partition(p);
        let (names, n) = unlisted_in(&part.workers, &part.feeds, w.keyspace(), listed);
        out.extend(names);
        mismatched += n;
    }
    (out, mismatched)
}

/// One partition's part of [`unlisted`]: one pass over the feeds (the applier's lock is held),
/// then a lookup per worker. An entry whose `sgl.worker_id` does not map to its own worker id
/// (written by another publisher) is skipped and counted: removing by that name would lock and
/// remove a different worker.
fn unlisted_in<F>(
    workers: &BTreeMap<u64, BTreeMap<String, String>>,
    feeds: &BTreeMap<FeedKey, F>,
    keyspace: &KeyspaceId,
    listed: &BTreeSet<u64>,
) -> (Vec<String>, u64) {
    let elsewhere: BTreeSet<u64> =
        feeds.keys().filter(|k| &k.keyspace != keyspace).map(|k| k.worker).collect();
    let (mut out, mut mismatched) = (Vec::new(), 0);
    for (worker, meta) in workers {
        let Some(name) = meta.get(META_WORKER_ID) else { continue };
        if listed.contains(worker) || elsewhere.contains(worker) {
            continue;
        }
        if worker_id(SGLANG_SEED, name) != *worker {
            mismatched += 1;
            continue;
        }
        out.push(name.clone());
    }
    (out, mismatched)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlisted_keeps_listed_other_models_and_mismatched_names() {
        let ks = |s: &str| KeyspaceId::new(s, 16, 4);
        let meta = |name: &str| BTreeMap::from([(META_WORKER_ID.to_string(), name.to_string())]);
        let id = |name: &str| worker_id(SGLANG_SEED, name);
        let workers = BTreeMap::from([
            (id("listed"), meta("listed")),
            (id("gone"), meta("gone")),
            (id("other-model"), meta("other-model")),
            (id("mine-and-other"), meta("mine-and-other")),
            (id("foreign"), meta("not-its-name")),
            (42, BTreeMap::new()),
        ]);
        let feed = |k: &str, worker| (FeedKey { keyspace: ks(k), worker, dp_rank: 0 }, ());
        let feeds = BTreeMap::from([
            feed("m", id("gone")),
            feed("other", id("other-model")),
            feed("m", id("mine-and-other")),
            feed("other", id("mine-and-other")),
        ]);
        let listed = BTreeSet::from([id("listed")]);
        let (names, mismatched) = unlisted_in(&workers, &feeds, &ks("m"), &listed);
        assert_eq!(names, vec!["gone".to_string()]);
        assert_eq!(mismatched, 1, "the entry named not-its-name is not removed by that name");
    }
}
