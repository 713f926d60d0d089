//! `Update`s → records on the log, through the ingest `Publisher`; the state an ack reports.
//!
//! Per holder (one prefixlog worker, `dp_rank 0`, lane 0): a `WorkerAdded` record naming it
//! (`smg.holder`, and what `Added` claims: `smg.lane_meta` as hex, `smg.capacity_blocks`,
//! `smg.event_fed`) before its first record and whenever an `Added` changes it.
//!
//! Epochs and sequence numbers are SMG's, passed through: a sequenced update is one
//! `KvEventBatch{epoch, seq}` of the feed `(keyspace, holder, 0)`, so the log's own feed policy
//! applies (a higher epoch clears the feed first; `seq <= last` is a duplicate). The facade
//! gates in front of it, from the feed as its replica applied it, so that upstream's rules hold
//! where prefixlog's differ:
//! - a lower epoch is dropped here and acked with the stored epoch (prefixlog would flag the
//!   feed gapped as "two writers"); `added` / `dropped` still apply, before the gate;
//! - an unsequenced update (placements) with a higher epoch clears the holder first: a
//!   `WorkerRestarted{epoch}` when it has a feed, else `WorkerRemoved` and its `WorkerAdded`
//!   again (placements have no epoch in prefixlog; the facade knows a placement-only holder's
//!   epoch only from updates it saw in this process);
//! - placements for an event-fed holder are not published (the engine would ignore them:
//!   upstream's feed authority).
//!
//! `dropped` is a `WorkerRemoved` (prefixlog has no soft retire: the blocks go at once, so a
//! rejoining holder starts empty; under-match only), also for every known `name#lane` holder
//! when a bare name is dropped. Updates of one holder are serialised here; several facades
//! writing one holder are ordered by the log, not by this gate.

use super::pb::{PublishAck, Update};
use super::update::{self, Skipped, UpdateError};
use super::{LANE, MAX_HOLDERS};
use crate::names::{worker_id, SMG_SEED};
use crate::writes::{caught_up_for, recorded_metadata_for, Subject, WriteRefused};
use parking_lot::Mutex;
use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_query::QueryService;
use prefixlog_state::partition_state::FeedKey;
use prefixlog_state::record::{encode_kv_events, encode_lifecycle, encode_placement};
use prefixlog_state::{token_of, KvOp, Landed, Lifecycle, LogAppend, LogError};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// Metadata keys of an SMG holder's `WorkerAdded` record (docs/compat/README.md).
pub const META_HOLDER: &str = "smg.holder";
pub const META_LANE_META: &str = "smg.lane_meta";
pub const META_CAPACITY: &str = "smg.capacity_blocks";
pub const META_EVENT_FED: &str = "smg.event_fed";
/// The `gateway` of the placements this facade publishes.
pub const GATEWAY: &str = "smg-facade";

/// Why an update was not written (the `Publish` stream ends with its status).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// A refusal the SGLang facade shares (collision, not ready, not caught up, publish, metadata).
    #[error(transparent)]
    Refused(#[from] WriteRefused),
    #[error(
        "epoch {epoch} is more than {max_step} above the holder's epoch {known}: refused (--max-epoch-step)"
    )]
    EpochJump { epoch: u64, known: u64, max_step: u64 },
    #[error("this facade already writes for {MAX_HOLDERS} holders; a new one is refused")]
    HolderTableFull,
    #[error(transparent)]
    SharedLimit(#[from] crate::writes::SharedLimit),
}

impl From<LogError> for WriteError {
    fn from(e: LogError) -> Self {
        Self::Refused(e.into())
    }
}

impl WriteError {
    pub fn status(&self) -> Status {
        match self {
            Self::Update(e) => e.status(),
            Self::Refused(e) => e.status(),
            Self::EpochJump { .. } => Status::failed_precondition(self.to_string()),
            Self::HolderTableFull | Self::SharedLimit(_) => Status::resource_exhausted(self.to_string()),
        }
    }
}

/// What one update did.
#[derive(Debug)]
pub struct Written {
    pub ack: PublishAck,
    /// Records published for it (the ack waits until the replica applied them).
    pub landed: Vec<Landed>,
    pub skipped: Skipped,
    /// Dropped by the epoch gate (lower epoch), or a duplicate `seq`.
    pub stale_epoch: bool,
    pub duplicate: bool,
    /// Placements not published: the holder is event-fed.
    pub fed_placements: u64,
}

/// The facade's view of one feed `(keyspace, holder, 0)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedState {
    /// The holder's epoch here (None: not known: no feed, and no update seen in this process).
    pub epoch: Option<u64>,
    pub last_seq: Option<u64>,
    /// The replica has a feed for it: the holder is event-fed.
    pub fed: bool,
}

/// What the epoch and sequence gate does with an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// A lower epoch: dropped.
    Stale,
    /// `seq <= last` within the epoch: dropped.
    Duplicate,
    /// Applied; `bump`: a higher epoch than the known one (older state is cleared first).
    Apply { bump: bool },
    /// More than the maximum step above the known epoch: refused.
    TooFar { known: u64 },
}

/// The gate of an update with events at `(epoch, seq)` on `feed`, epochs rising at most
/// `max_step` at once (a new holder's epoch must leave `max_step` of room below `u64::MAX`, so
/// none starts where nobody can supersede it).
pub fn gate(feed: &FeedState, max_step: u64, epoch: u64, seq: u64) -> Gate {
    match feed.epoch {
        Some(e) if epoch < e => Gate::Stale,
        Some(e) if epoch - e > max_step => Gate::TooFar { known: e },
        None if epoch > u64::MAX - max_step => Gate::TooFar { known: 0 },
        Some(e) if epoch > e => Gate::Apply { bump: true },
        Some(_) if seq > 0 && feed.last_seq.is_some_and(|l| seq <= l) => Gate::Duplicate,
        _ => Gate::Apply { bump: false },
    }
}

/// One holder's writing state in this process.
pub struct HolderState {
    name: String,
    /// The metadata last published or recorded (None: not announced).
    metadata: Option<BTreeMap<String, String>>,
    feeds: HashMap<KeyspaceId, FeedState>,
}

/// A holder's state, locked for one update (`Some` once loaded).
pub type Locked = tokio::sync::OwnedMutexGuard<Option<HolderState>>;

pub struct Writer {
    log: Arc<dyn LogAppend>,
    query: QueryService,
    holders: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Option<HolderState>>>>>,
    max_epoch_step: u64,
}

impl Writer {
    pub fn new(log: Arc<dyn LogAppend>, query: QueryService) -> Self {
        Self::with_max_epoch_step(log, query, crate::writers::DEFAULT_MAX_EPOCH_STEP)
    }

    /// A writer refusing epoch steps above `max_epoch_step` ([`gate`]).
    pub fn with_max_epoch_step(log: Arc<dyn LogAppend>, query: QueryService, max_epoch_step: u64) -> Self {
        Self { log, query, holders: Mutex::default(), max_epoch_step }
    }

    pub(crate) fn query(&self) -> &QueryService {
        &self.query
    }

    /// Publishes the update's records; `wait` bounds waits for the replica (its state of the
    /// holder before the first write, its apply of a clear before the next update).
    pub async fn write(&self, u: &Update, wait: Duration) -> Result<Written, WriteError> {
        update::validate(u)?;
        let (worker, guard) = self.lock(&u.holder)?;
        self.write_locked(u, worker, guard.await, wait).await
    }

    /// [`Self::write`] with the holder's lock taken (by [`Self::lock`], in update order).
    pub async fn write_locked(
        &self,
        u: &Update,
        worker: u64,
        mut guard: Locked,
        wait: Duration,
    ) -> Result<Written, WriteError> {
        let ks = update::validate(u)?;
        if !self.query.view().readiness.is_ready() {
            return Err(WriteRefused::NotReady(Subject::Holder).into());
        }
        let mapped = update::map_events(u);
        self.load(worker, &u.holder, &mut guard, wait).await?;
        let writes_events = mapped.has_events() || u.seq > 0;
        let announces =
            guard.as_ref().is_some_and(|st| st.metadata.is_none()) && (u.added.is_some() || writes_events);
        let keyspace = writes_events.then_some(&ks);
        crate::writes::check_shared_limits(&self.query, worker, announces, keyspace)?;
        let mut landed = Vec::new();
        let mut lanes = Vec::new();
        if u.dropped {
            landed.push(self.remove(worker, &mut guard).await?);
            lanes = self.lane_holders(&u.holder);
        }
        let st = guard.as_mut().expect("loaded");
        if let Some(added) = &u.added {
            let metadata = with_added(desired_base(st), added);
            landed.extend(self.announce(worker, st, metadata).await?);
        }
        let mut out = Written {
            ack: PublishAck { digest_miss_tip: mapped.digest_miss, ..Default::default() },
            landed: Vec::new(),
            skipped: mapped.skipped,
            stale_epoch: false,
            duplicate: false,
            fed_placements: 0,
        };
        if mapped.has_events() || u.seq > 0 {
            self.write_events(worker, &mut guard, &ks, u, mapped, &mut out, &mut landed, wait).await?;
        }
        let st = guard.as_mut().expect("loaded");
        let feed = self.feed(worker, st, &ks);
        out.ack = PublishAck {
            holder: u.holder.clone(),
            epoch: feed.epoch.unwrap_or(u.epoch),
            applied_seq: feed.last_seq.unwrap_or(0),
            digest_miss_tip: out.ack.digest_miss_tip,
        };
        drop(guard);
        for name in lanes {
            let (w, g) = self.lock(&name)?;
            let mut g = g.await;
            self.load(w, &name, &mut g, wait).await?;
            landed.push(self.remove(w, &mut g).await?);
        }
        out.landed = landed;
        Ok(out)
    }

    /// The gate and the records of an update with events (or a sequence number).
    #[allow(clippy::too_many_arguments)]
    async fn write_events(
        &self,
        worker: u64,
        guard: &mut Locked,
        ks: &KeyspaceId,
        u: &Update,
        mapped: update::Mapped,
        out: &mut Written,
        landed: &mut Vec<Landed>,
        wait: Duration,
    ) -> Result<(), WriteError> {
        let st = guard.as_mut().expect("loaded");
        let mut feed = self.feed(worker, st, ks);
        let bump = match gate(&feed, self.max_epoch_step, u.epoch, u.seq) {
            Gate::TooFar { known } => {
                return Err(WriteError::EpochJump { epoch: u.epoch, known, max_step: self.max_epoch_step })
            }
            Gate::Stale => {
                out.stale_epoch = true;
                return Ok(());
            }
            Gate::Duplicate => {
                out.duplicate = true;
                return Ok(());
            }
            Gate::Apply { bump } => bump,
        };
        if st.metadata.is_none() {
            landed.extend(self.announce(worker, st, desired_base(st)).await?);
        }
        if u.seq > 0 {
            let mut ops = mapped.ops;
            if bump && !feed.fed {
                // A placement-only holder gets a feed: its placements go first (as a first
                // event would drop them anyway, also when this batch has none).
                ops.insert(0, KvOp::Cleared { lane: LANE });
            }
            let record = encode_kv_events(ks, worker, 0, u.epoch, u.seq, false, &ops);
            let l = self.log.append(worker, record).await?;
            landed.push(l);
            feed = FeedState { epoch: Some(u.epoch), last_seq: Some(u.seq), fed: true };
            st.feeds.insert(ks.clone(), feed);
            return Ok(());
        }
        if bump {
            self.clear_for_epoch(worker, guard, ks, u.epoch, feed.fed, landed, wait).await?;
        }
        let st = guard.as_mut().expect("loaded");
        let fed = st.feeds.get(ks).is_some_and(|f| f.fed);
        st.feeds.entry(ks.clone()).or_default().epoch = Some(u.epoch);
        if fed {
            out.fed_placements = mapped.placements.len() as u64;
            return Ok(());
        }
        for locals in &mapped.placements {
            let holder = HolderKey::new(worker, 0, LANE);
            landed.push(self.log.append(worker, encode_placement(ks, holder, locals, &[], GATEWAY)).await?);
        }
        Ok(())
    }

    /// A higher epoch on an unsequenced update: the holder's older state goes. The replica
    /// applies it before the next update of the holder is gated (its feeds are read again).
    #[allow(clippy::too_many_arguments)]
    async fn clear_for_epoch(
        &self,
        worker: u64,
        guard: &mut Locked,
        ks: &KeyspaceId,
        epoch: u64,
        fed: bool,
        landed: &mut Vec<Landed>,
        wait: Duration,
    ) -> Result<(), WriteError> {
        let mut mine = Vec::new();
        if fed {
            mine.push(
                self.log
                    .append(worker, encode_lifecycle(worker, &Lifecycle::Restarted { new_epoch: epoch }))
                    .await?,
            );
        } else {
            let metadata = guard.as_ref().and_then(|s| s.metadata.clone());
            mine.push(self.remove(worker, guard).await?);
            if let Some(m) = metadata {
                let st = guard.as_mut().expect("loaded");
                mine.extend(self.announce(worker, st, m).await?);
            }
        }
        if !self.query.view().status.wait_for(&token_of(&mine), wait).await {
            tracing::debug!(?wait, "epoch clear on the log, not applied here within the wait");
        }
        let st = guard.as_mut().expect("loaded");
        st.feeds.clear();
        st.feeds.insert(ks.clone(), FeedState { epoch: Some(epoch), last_seq: None, fed });
        landed.extend(mine);
        Ok(())
    }

    /// The holder's id and the future of its lock: updates of one holder are applied in the
    /// order their locks were asked for (tokio's mutex is fair).
    pub fn lock(
        &self,
        name: &str,
    ) -> Result<(u64, impl Future<Output = Locked> + Send + 'static), WriteError> {
        let worker = worker_id(SMG_SEED, name);
        let slot = {
            let mut holders = self.holders.lock();
            if holders.len() >= MAX_HOLDERS && !holders.contains_key(&worker) {
                evict_removed(&mut holders);
            }
            if holders.len() >= MAX_HOLDERS && !holders.contains_key(&worker) {
                return Err(WriteError::HolderTableFull);
            }
            holders.entry(worker).or_default().clone()
        };
        Ok((worker, slot.lock_owned()))
    }

    /// Loads the locked holder's state on its first use here (once the replica caught up with
    /// its partition), and refuses a name whose id belongs to another name.
    async fn load(
        &self,
        worker: u64,
        name: &str,
        guard: &mut Locked,
        wait: Duration,
    ) -> Result<(), WriteError> {
        if guard.is_none() {
            self.caught_up(worker, wait).await?;
            **guard = Some(self.recorded(worker, name)?);
        }
        let st = guard.as_ref().expect("set above");
        if st.name != name {
            let other = st.name.clone();
            return Err(WriteRefused::Collision {
                subject: Subject::Holder,
                name: name.into(),
                worker,
                other,
            }
            .into());
        }
        Ok(())
    }

    /// Publishes `metadata` for the holder unless it is what was last recorded.
    async fn announce(
        &self,
        worker: u64,
        st: &mut HolderState,
        metadata: BTreeMap<String, String>,
    ) -> Result<Option<Landed>, WriteError> {
        if st.metadata.as_ref() == Some(&metadata) {
            return Ok(None);
        }
        check_metadata_size(&metadata)?;
        let added = Lifecycle::Added { metadata: metadata.clone() };
        let landed = self.log.append(worker, encode_lifecycle(worker, &added)).await?;
        st.metadata = Some(metadata);
        Ok(Some(landed))
    }

    /// `WorkerRemoved`: the holder's metadata, feeds and blocks go (every keyspace). Its epochs
    /// are kept here, so a later lower epoch is still dropped, until the table is full
    /// ([`evict_removed`]).
    async fn remove(&self, worker: u64, guard: &mut Locked) -> Result<Landed, WriteError> {
        let landed = self.log.append(worker, encode_lifecycle(worker, &Lifecycle::Removed)).await?;
        if let Some(st) = guard.as_mut() {
            st.metadata = None;
            st.feeds.values_mut().for_each(|f| *f = FeedState { epoch: f.epoch, last_seq: None, fed: false });
        }
        Ok(landed)
    }

    /// The feed state of a keyspace, read from the replica on first use.
    fn feed(&self, worker: u64, st: &mut HolderState, ks: &KeyspaceId) -> FeedState {
        if let Some(f) = st.feeds.get(ks) {
            return *f;
        }
        let f = self.recorded_feed(worker, ks);
        st.feeds.insert(ks.clone(), f);
        f
    }

    fn recorded_feed(&self, worker: u64, ks: &KeyspaceId) -> FeedState {
        let view = self.query.view();
        let Some(applier) = &view.applier else { return FeedState::default() };
        let a = applier.lock();
        let part = a.partition(partition_of(worker, view.info.partition_count));
        let key = FeedKey { keyspace: ks.clone(), worker, dp_rank: 0 };
        part.feeds.get(&key).map_or(FeedState::default(), |f| FeedState {
            epoch: Some(f.epoch),
            last_seq: f.last_seq,
            fed: true,
        })
    }

    /// The names of the known holders `name#<lane>` (a worker-level `dropped` applies to them).
    fn lane_holders(&self, name: &str) -> Vec<String> {
        let prefix = format!("{name}#");
        let view = self.query.view();
        let Some(applier) = &view.applier else { return Vec::new() };
        let a = applier.lock();
        let mut out = Vec::new();
        for &p in &view.info.owned {
            for (&w, meta) in &a.partition(p).workers {
                let Some(n) = meta.get(META_HOLDER) else { continue };
                if n.starts_with(&prefix) && worker_id(SMG_SEED, n) == w {
                    out.push(n.clone());
                }
            }
        }
        out
    }

    async fn caught_up(&self, worker: u64, wait: Duration) -> Result<(), WriteError> {
        Ok(caught_up_for(Subject::Holder, &self.query, worker, wait).await?)
    }

    /// A holder as the replica recorded it (its first update in this process).
    fn recorded(&self, worker: u64, name: &str) -> Result<HolderState, WriteError> {
        let metadata = recorded_metadata_for(Subject::Holder, &self.query, worker, META_HOLDER, name)?;
        Ok(HolderState { name: name.to_string(), metadata, feeds: HashMap::new() })
    }
}

/// The holder's metadata as recorded, or just its name.
fn desired_base(st: &HolderState) -> BTreeMap<String, String> {
    let mut m = st.metadata.clone().unwrap_or_default();
    m.insert(META_HOLDER.into(), st.name.clone());
    m
}

/// `m` with what an `Added` claims (empty metadata, capacity 0: "no claim", the recorded
/// value stays; `event_fed` is recorded once claimed).
pub fn with_added(mut m: BTreeMap<String, String>, a: &super::pb::Added) -> BTreeMap<String, String> {
    if !a.metadata.is_empty() {
        m.insert(META_LANE_META.into(), to_hex(&a.metadata));
    }
    if a.capacity_blocks > 0 {
        m.insert(META_CAPACITY.into(), a.capacity_blocks.to_string());
    }
    if a.event_fed {
        m.insert(META_EVENT_FED.into(), "true".into());
    }
    m
}

/// Refuses holder metadata the replica would refuse on apply ([`crate::writes::check_metadata_size`]).
pub fn check_metadata_size(metadata: &BTreeMap<String, String>) -> Result<(), WriteError> {
    Ok(crate::writes::check_metadata_size(Subject::Holder, metadata)?)
}

/// Lower-case hex (metadata values are strings; `Added.metadata` is bytes).
pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A holder's slot in the table.
type Slot = Arc<tokio::sync::Mutex<Option<HolderState>>>;

/// Frees the table of holders that are removed (or were never announced) and that nobody
/// waits for: run when the table is full, so removed holders leave it rather than fill it.
/// Their epochs are forgotten only then (a later update reads the replica's state again).
fn evict_removed(holders: &mut HashMap<u64, Slot>) {
    holders.retain(|_, slot| {
        Arc::strong_count(slot) > 1
            || slot.try_lock().map_or(true, |st| st.as_ref().is_some_and(|s| s.metadata.is_some()))
    });
}

/// The bytes of [`to_hex`] (None: not hex).
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::super::pb::Added;
    use super::*;

    const STEP: u64 = 100;

    #[test]
    fn a_full_table_lets_removed_holders_go_only() {
        let holder = |announced: bool| {
            let metadata = announced.then(BTreeMap::new);
            Arc::new(tokio::sync::Mutex::new(Some(HolderState {
                name: "h".into(),
                metadata,
                feeds: HashMap::new(),
            })))
        };
        let waited_for = holder(false);
        let mut table: HashMap<u64, Slot> = HashMap::from([
            (1, holder(true)),
            (2, holder(false)),
            (3, Arc::new(tokio::sync::Mutex::new(None))),
            (4, waited_for.clone()),
        ]);
        evict_removed(&mut table);
        let mut left: Vec<u64> = table.keys().copied().collect();
        left.sort();
        assert_eq!(left, vec![1, 4], "announced, or someone waits for it");
        drop(waited_for);
    }

    #[test]
    fn the_gate_follows_upstreams_epoch_and_seq_rules() {
        let known = FeedState { epoch: Some(3), last_seq: Some(10), fed: true };
        assert_eq!(gate(&known, STEP, 2, 11), Gate::Stale, "lower epoch dropped");
        assert_eq!(gate(&known, STEP, 2, 0), Gate::Stale);
        assert_eq!(gate(&known, STEP, 4, 1), Gate::Apply { bump: true }, "higher epoch clears");
        assert_eq!(gate(&known, STEP, 3, 10), Gate::Duplicate);
        assert_eq!(gate(&known, STEP, 3, 9), Gate::Duplicate);
        assert_eq!(gate(&known, STEP, 3, 11), Gate::Apply { bump: false });
        assert_eq!(
            gate(&known, STEP, 3, 0),
            Gate::Apply { bump: false },
            "seq 0 is idempotent, never a duplicate"
        );
        let unknown = FeedState::default();
        assert_eq!(gate(&unknown, STEP, 1, 5), Gate::Apply { bump: false }, "a new holder takes the epoch");
        assert_eq!(gate(&unknown, STEP, 0, 0), Gate::Apply { bump: false });
        assert_eq!(gate(&known, STEP, 3 + STEP, 1), Gate::Apply { bump: true }, "the largest step");
        assert_eq!(gate(&known, STEP, 4 + STEP, 1), Gate::TooFar { known: 3 });
        assert_eq!(gate(&known, STEP, u64::MAX, 1), Gate::TooFar { known: 3 }, "no jump to the end");
        assert_eq!(gate(&unknown, STEP, u64::MAX, 1), Gate::TooFar { known: 0 }, "no start at the end");
    }

    #[test]
    fn added_claims_and_no_claims() {
        let base = BTreeMap::from([(META_HOLDER.to_string(), "w".to_string())]);
        let a = Added { capacity_blocks: 10, event_fed: true, metadata: vec![0, 0xab, 0x10] };
        let m = with_added(base.clone(), &a);
        assert_eq!(m.get(META_LANE_META).map(String::as_str), Some("00ab10"));
        assert_eq!(m.get(META_CAPACITY).map(String::as_str), Some("10"));
        assert_eq!(m.get(META_EVENT_FED).map(String::as_str), Some("true"));
        assert_eq!(with_added(m.clone(), &Added::default()), m, "a bare re-announce keeps the claims");
        assert_eq!(with_added(base.clone(), &Added::default()), base);
        assert_eq!(from_hex("00ab10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex(""), Some(vec![]));
        let big = Added { metadata: vec![1; 4096], ..Default::default() };
        assert!(check_metadata_size(&with_added(base, &big)).is_err());
    }
}
