//! `ApplyExternalKvBatch` → records on the log, through the ingest `Publisher`.
//!
//! Per worker: a `WorkerAdded` record naming it (`sgl.worker_id`, `address`, `sgl.cache_spec`,
//! `sgl.worker_epoch`) before its first batch and whenever one of those changes (the router
//! routes on the address), then one `KvEventBatch` per request with the batch's GPU-tier ops.
//!
//! Sequence and epoch: prefixlog dedupes a feed by `(epoch, seq)` and flags a gap when `seq`
//! skips a number, while upstream applies every batch (the sgl bridge even repeats one `seq`
//! for the parts of a split batch). So the facade numbers its own records, one per request:
//! the feed's next `seq`, read from the replica's state on the worker's first batch (once the
//! replica applied the worker's partition up to its high watermark), then counted here. A new
//! epoch (every lane of the feed cleared) starts when the engine's `seq` goes back below 16 (the
//! engine restarted with an empty cache; known within one facade process) or a line-A
//! `worker_epoch` differs from the recorded one; any other step back is a late retry of an old
//! batch and is acknowledged as a duplicate without being published. Requests of one worker
//! are serialised here; one facade should write a worker (the bridge talks to one endpoint):
//! two facades writing one worker would reuse sequence numbers, and the log would skip one's
//! records as duplicates.

use super::batch::{map_actions, validate, BatchError, Skipped};
use super::pb::{ApplyExternalKvBatchRequest, WorkerCacheSpec};
use super::{SglangConfig, MAX_WORKERS};
use crate::names::{worker_id, SGLANG_SEED};
use crate::writes::{caught_up_for, recorded_metadata_for, Subject, WriteRefused};
use parking_lot::Mutex;
use prefixlog_engine::{partition_of, KeyspaceId};
use prefixlog_query::QueryService;
use prefixlog_state::partition_state::FeedKey;
use prefixlog_state::record::{encode_kv_events, encode_lifecycle};
use prefixlog_state::{token_of, Landed, Lifecycle, LogAppend, LogError};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// Metadata keys of a SGLang worker's `WorkerAdded` record (docs/compat/README.md).
pub const META_WORKER_ID: &str = "sgl.worker_id";
pub const META_ADDRESS: &str = "address";
pub const META_CACHE_SPEC: &str = "sgl.cache_spec";
pub const META_WORKER_EPOCH: &str = "sgl.worker_epoch";

/// Why a batch was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Denied(#[from] crate::writers::WriterDenied),
    /// A refusal the SMG facade shares (collision, not ready, not caught up, publish, metadata).
    #[error(transparent)]
    Refused(#[from] WriteRefused),
    #[error("{0} expected workers; at most {max}", max = super::MAX_EXPECTED_WORKERS)]
    TooManyWorkers(usize),
    #[error("this facade already writes for {MAX_WORKERS} workers; a new one is refused")]
    WorkerTableFull,
    #[error(transparent)]
    SharedLimit(#[from] crate::writes::SharedLimit),
    #[error("the worker's epoch and sequence numbers are exhausted; it cannot be written again")]
    Exhausted,
}

impl From<LogError> for WriteError {
    fn from(e: LogError) -> Self {
        Self::Refused(e.into())
    }
}

impl WriteError {
    pub fn status(&self) -> Status {
        match self {
            Self::Batch(e) => e.status(),
            Self::Denied(e) => e.status(),
            Self::Refused(e) => e.status(),
            Self::Exhausted => Status::failed_precondition(self.to_string()),
            Self::TooManyWorkers(_) | Self::WorkerTableFull | Self::SharedLimit(_) => {
                Status::resource_exhausted(self.to_string())
            }
        }
    }
}

/// What a written batch did.
#[derive(Debug)]
pub struct Written {
    pub skipped: Skipped,
    /// Whether the replica applied the records within the wait (read-your-writes here).
    pub applied: bool,
    /// A stale retry (see [`seq_step`]): nothing was published.
    pub duplicate: bool,
}

/// An engine `seq` below this after a step back is a restart (an engine counts from near 0).
pub const RESTART_SEQ_BELOW: u64 = 16;

/// What an engine `seq` means relative to the worker's last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqStep {
    /// Same or later `seq`: publish in the current epoch.
    Next,
    /// The engine restarted (its cache is empty): a new epoch clears the worker's blocks.
    Restart,
    /// A late retry of an older batch: publish nothing (publishing it would re-credit blocks
    /// a later batch revoked: an overcount).
    Stale,
}

/// A step back is a restart only when the line-A `worker_epoch` changed or the new `seq` is
/// small (a restarted engine counts from near 0); any other step back is a stale retry.
pub fn seq_step(last: Option<u64>, seq: u64, epoch_changed: bool) -> SeqStep {
    match last {
        _ if epoch_changed => SeqStep::Restart,
        Some(last) if seq < last && seq < RESTART_SEQ_BELOW => SeqStep::Restart,
        Some(last) if seq < last => SeqStep::Stale,
        _ => SeqStep::Next,
    }
}

/// A worker's state, locked for one request (`Some` once loaded).
pub(crate) type Locked = tokio::sync::OwnedMutexGuard<Option<WorkerState>>;

/// One worker's writing state in this process.
pub(crate) struct WorkerState {
    name: String,
    epoch: u64,
    next_seq: u64,
    /// The engine `seq` of the worker's last batch (engine restarts show as a step back).
    engine_seq: Option<u64>,
    /// The metadata last published or recorded.
    pub(crate) metadata: Option<BTreeMap<String, String>>,
}

pub struct Writer {
    keyspace: KeyspaceId,
    log: Arc<dyn LogAppend>,
    query: QueryService,
    workers: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Option<WorkerState>>>>>,
}

impl Writer {
    pub fn new(cfg: &SglangConfig, log: Arc<dyn LogAppend>, query: QueryService) -> Self {
        Self { keyspace: cfg.keyspace(), log, query, workers: Mutex::default() }
    }

    /// Appends the batch's records; `wait` bounds the wait for the replica to apply them.
    pub async fn write(
        &self,
        req: &ApplyExternalKvBatchRequest,
        wait: Duration,
    ) -> Result<Written, WriteError> {
        validate(req)?;
        let view = self.query.view();
        if !view.readiness.is_ready() {
            return Err(WriteRefused::NotReady(Subject::Worker).into());
        }
        let (worker, mut guard) = self.lock_worker(&req.worker_id, wait).await?;
        let st = guard.as_mut().expect("loaded by lock_worker");
        let recorded_epoch = st.metadata.as_ref().and_then(|m| m.get(META_WORKER_EPOCH));
        let new_epoch =
            !req.worker_epoch.is_empty() && recorded_epoch.is_some_and(|e| *e != req.worker_epoch);
        let metadata = desired_metadata(st.metadata.as_ref(), req);
        check_metadata_size(&metadata)?;
        let bump = match seq_step(st.engine_seq, req.seq, new_epoch) {
            SeqStep::Stale => {
                return Ok(Written { skipped: Skipped::default(), applied: true, duplicate: true })
            }
            SeqStep::Restart => true,
            SeqStep::Next => false,
        };
        let (ops, skipped) = map_actions(&req.actions);
        let keyspace = (!ops.is_empty() || bump).then_some(&self.keyspace);
        crate::writes::check_shared_limits(&self.query, worker, st.metadata.is_none(), keyspace)?;
        if bump {
            st.new_epoch()?;
        }
        let mut landed: Vec<Landed> = self.announce(worker, st, metadata).await?.into_iter().collect();
        if !ops.is_empty() || bump {
            // Counted before the publish: if it failed but the record landed after all, reusing
            // the number would make the log skip the next batch as a duplicate; a number never
            // used shows as a gap instead (the worker is left out of answers: never overcount).
            let seq = st.take_seq()?;
            landed.push(
                self.log
                    .append(worker, encode_kv_events(&self.keyspace, worker, 0, st.epoch, seq, false, &ops))
                    .await?,
            );
        }
        st.engine_seq = Some(req.seq);
        drop(guard);
        let applied = landed.is_empty() || view.status.wait_for(&token_of(&landed), wait).await;
        Ok(Written { skipped, applied, duplicate: false })
    }

    /// The worker's id and its state, locked (loaded from the replica on its first use here);
    /// a name whose id belongs to another name is refused.
    pub(crate) async fn lock_worker(&self, name: &str, wait: Duration) -> Result<(u64, Locked), WriteError> {
        let worker = worker_id(SGLANG_SEED, name);
        let slot = {
            let mut workers = self.workers.lock();
            if workers.len() >= MAX_WORKERS && !workers.contains_key(&worker) {
                return Err(WriteError::WorkerTableFull);
            }
            workers.entry(worker).or_default().clone()
        };
        let mut guard = slot.lock_owned().await;
        if guard.is_none() {
            self.caught_up(worker, wait).await?;
            *guard = Some(self.recorded(worker, name)?);
        }
        let st = guard.as_ref().expect("set above");
        if st.name != name {
            let other = st.name.clone();
            return Err(WriteRefused::Collision {
                subject: Subject::Worker,
                name: name.into(),
                worker,
                other,
            }
            .into());
        }
        Ok((worker, guard))
    }

    /// Publishes `metadata` for the locked worker unless it is what was last recorded.
    pub(crate) async fn announce(
        &self,
        worker: u64,
        st: &mut WorkerState,
        metadata: BTreeMap<String, String>,
    ) -> Result<Option<Landed>, WriteError> {
        if st.metadata.as_ref() == Some(&metadata) {
            return Ok(None);
        }
        let added = Lifecycle::Added { metadata: metadata.clone() };
        let landed = self.log.append(worker, encode_lifecycle(worker, &added)).await?;
        st.metadata = Some(metadata);
        Ok(Some(landed))
    }

    /// Removes a worker (`WorkerRemoved`: its metadata and every feed go). Its state here is
    /// kept with no metadata, so a later batch announces it again (a removed feed accepts any
    /// next `seq`, so the numbering may go on).
    pub(crate) async fn remove(&self, worker: u64, mut guard: Locked) -> Result<Landed, WriteError> {
        let landed = self.log.append(worker, encode_lifecycle(worker, &Lifecycle::Removed)).await?;
        if let Some(st) = guard.as_mut() {
            st.metadata = None;
        }
        Ok(landed)
    }

    pub(crate) fn query(&self) -> &QueryService {
        &self.query
    }

    pub(crate) fn keyspace(&self) -> &KeyspaceId {
        &self.keyspace
    }

    async fn caught_up(&self, worker: u64, wait: Duration) -> Result<(), WriteError> {
        Ok(caught_up_for(Subject::Worker, &self.query, worker, wait).await?)
    }

    /// A worker's state as the replica recorded it (first batch of the worker in this process).
    fn recorded(&self, worker: u64, name: &str) -> Result<WorkerState, WriteError> {
        let metadata = recorded_metadata_for(Subject::Worker, &self.query, worker, META_WORKER_ID, name)?;
        let view = self.query.view();
        let key = FeedKey { keyspace: self.keyspace.clone(), worker, dp_rank: 0 };
        let feed = view.applier.as_ref().and_then(|a| {
            let a = a.lock();
            let part = a.partition(partition_of(worker, view.info.partition_count));
            part.feeds.get(&key).map(|f| (f.epoch, f.last_seq))
        });
        Ok(WorkerState::new(name, metadata, feed))
    }
}

impl WorkerState {
    fn new(name: &str, metadata: Option<BTreeMap<String, String>>, feed: Option<(u64, Option<u64>)>) -> Self {
        let (epoch, last) = feed.unwrap_or((1, None));
        Self {
            name: name.to_string(),
            epoch: epoch.max(1),
            // At the last number, `take_seq` starts a new epoch.
            next_seq: last.map_or(1, |s| s.saturating_add(1)),
            engine_seq: None,
            metadata,
        }
    }

    /// Starts a new epoch, numbered from 1 (every lane of the feed is cleared on the log).
    fn new_epoch(&mut self) -> Result<(), WriteError> {
        self.epoch = self.epoch.checked_add(1).ok_or(WriteError::Exhausted)?;
        self.next_seq = 1;
        Ok(())
    }

    /// The next record's `seq`, counted. Once the numbers of the epoch run out a new epoch
    /// starts: it clears the worker, which can only undercount; wrapping would reuse numbers.
    fn take_seq(&mut self) -> Result<u64, WriteError> {
        if self.next_seq == u64::MAX {
            self.new_epoch()?;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq)
    }
}

/// Refuses worker metadata the replica would refuse on apply ([`crate::writes::check_metadata_size`]).
pub fn check_metadata_size(metadata: &BTreeMap<String, String>) -> Result<(), WriteError> {
    Ok(crate::writes::check_metadata_size(Subject::Worker, metadata)?)
}

/// The worker's metadata after this request: the recorded one with the request's non-empty
/// fields (an empty address keeps the recorded one: upstream sends it on every batch).
pub fn desired_metadata(
    recorded: Option<&BTreeMap<String, String>>,
    req: &ApplyExternalKvBatchRequest,
) -> BTreeMap<String, String> {
    let mut m = recorded.cloned().unwrap_or_default();
    m.insert(META_WORKER_ID.into(), req.worker_id.clone());
    if !req.worker_address.is_empty() {
        m.insert(META_ADDRESS.into(), req.worker_address.clone());
    }
    if let Some(spec) = &req.cache_spec {
        m.insert(META_CACHE_SPEC.into(), cache_spec_json(spec));
    }
    if !req.worker_epoch.is_empty() {
        m.insert(META_WORKER_EPOCH.into(), req.worker_epoch.clone());
    }
    m
}

/// The cache spec as JSON, field names as in the schema.
pub fn cache_spec_json(s: &WorkerCacheSpec) -> String {
    format!(
        "{{\"version\":{},\"components\":{},\"swa_window_tokens\":{},\"full_tier_mask\":{},\"swa_tier_mask\":{},\"mamba_tier_mask\":{}}}",
        s.version, s.components, s.swa_window_tokens, s.full_tier_mask, s.swa_tier_mask, s.mamba_tier_mask
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_state::settings::{StateSettings, METADATA_ENTRY_BYTES};

    #[test]
    fn metadata_keeps_what_the_request_leaves_empty() {
        let req = |addr: &str, epoch: &str| ApplyExternalKvBatchRequest {
            worker_id: "w".into(),
            worker_address: addr.into(),
            worker_epoch: epoch.into(),
            ..Default::default()
        };
        let first = desired_metadata(None, &req("http://a:1", ""));
        assert_eq!(first.get(META_ADDRESS).map(String::as_str), Some("http://a:1"));
        assert_eq!(first.get(META_WORKER_ID).map(String::as_str), Some("w"));
        assert_eq!(desired_metadata(Some(&first), &req("", "")), first, "nothing changed: no record");
        let moved = desired_metadata(Some(&first), &req("http://b:2", "e1"));
        assert_eq!(moved.get(META_ADDRESS).map(String::as_str), Some("http://b:2"));
        assert_eq!(moved.get(META_WORKER_EPOCH).map(String::as_str), Some("e1"));
        let spec = WorkerCacheSpec { version: 1, components: 1, full_tier_mask: 2, ..Default::default() };
        assert_eq!(
            cache_spec_json(&spec),
            r#"{"version":1,"components":1,"swa_window_tokens":0,"full_tier_mask":2,"swa_tier_mask":0,"mamba_tier_mask":0}"#
        );
    }

    #[test]
    fn a_step_back_is_a_restart_only_near_0_or_with_a_new_epoch() {
        assert_eq!(seq_step(None, 500, false), SeqStep::Next, "first batch");
        assert_eq!(seq_step(Some(7), 7, false), SeqStep::Next, "parts of a split batch");
        assert_eq!(seq_step(Some(7), 8, false), SeqStep::Next);
        assert_eq!(seq_step(Some(101), 100, false), SeqStep::Stale, "late retry of an old batch");
        assert_eq!(seq_step(Some(101), RESTART_SEQ_BELOW, false), SeqStep::Stale);
        assert_eq!(seq_step(Some(101), RESTART_SEQ_BELOW - 1, false), SeqStep::Restart);
        assert_eq!(seq_step(Some(101), 0, false), SeqStep::Restart, "engine counts from 0 again");
        assert_eq!(seq_step(Some(101), 100, true), SeqStep::Restart, "line-A epoch changed");
        assert_eq!(seq_step(Some(101), 200, true), SeqStep::Restart);
    }

    #[test]
    fn metadata_over_the_replicas_limit_is_refused() {
        let req = |addr: String| ApplyExternalKvBatchRequest {
            worker_id: "w".into(),
            worker_address: addr,
            ..Default::default()
        };
        // Two entries: "sgl.worker_id" = "w" and "address" = the address.
        let fixed =
            (META_WORKER_ID.len() + 1 + META_ADDRESS.len()) as u64 + 2 * u64::from(METADATA_ENTRY_BYTES);
        let max = u64::from(StateSettings::default().max_worker_metadata_bytes);
        let at_limit = desired_metadata(None, &req("a".repeat((max - fixed) as usize)));
        assert!(check_metadata_size(&at_limit).is_ok());
        let over = desired_metadata(None, &req("a".repeat((max - fixed + 1) as usize)));
        let err = check_metadata_size(&over).unwrap_err();
        assert!(
            matches!(err, WriteError::Refused(WriteRefused::MetadataTooLarge { bytes, .. }) if bytes == max + 1)
        );
        assert_eq!(err.status().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_new_worker_starts_at_epoch_1_and_a_known_feed_continues() {
        let fresh = WorkerState::new("w", None, None);
        assert_eq!((fresh.epoch, fresh.next_seq), (1, 1));
        let known = WorkerState::new("w", None, Some((3, Some(41))));
        assert_eq!((known.epoch, known.next_seq), (3, 42));
        let cleared = WorkerState::new("w", None, Some((2, None)));
        assert_eq!((cleared.epoch, cleared.next_seq), (2, 1));
    }

    #[test]
    fn numbers_never_wrap() {
        let mut end = WorkerState::new("w", None, Some((3, Some(u64::MAX))));
        assert_eq!(end.take_seq().unwrap(), 1, "a new epoch past the last seq");
        assert_eq!((end.epoch, end.next_seq), (4, 2));
        let mut near = WorkerState::new("w", None, Some((3, Some(u64::MAX - 2))));
        assert_eq!(near.take_seq().unwrap(), u64::MAX - 1);
        assert_eq!(near.take_seq().unwrap(), 1);
        assert_eq!(near.epoch, 4);
        let mut last = WorkerState::new("w", None, Some((u64::MAX, Some(u64::MAX))));
        assert!(matches!(last.take_seq(), Err(WriteError::Exhausted)));
        assert!(matches!(last.new_epoch(), Err(WriteError::Exhausted)));
        assert_eq!(WriteError::Exhausted.status().code(), tonic::Code::FailedPrecondition);
    }
}
