//! Deterministic application of log records to the engine.
//!
//! The [`Applier`] is the only writer of a replica's engine. Its state — the engine plus, per
//! partition, a [`PartitionState`] — is a pure function of the records applied, partition by
//! partition, in offset order, and of the [`StateSettings`]. Different interleavings of
//! partitions give the same per-partition digests (tested), because a worker's records are all
//! in one partition and holders never share mutable state across workers.
//!
//! Offsets are strict: a partition applies exactly its next offset. A higher one is refused
//! ([`NotNext`]): records were lost in between, and only [`Applier::accept_gap`] — an
//! operator's explicit choice — moves past them, marking the partition's holders gapped.
//!
//! Feed policy (one feed = one engine event stream = keyspace × worker × dp rank):
//! - a batch with an older epoch than the feed's is stale: skipped, counted;
//! - a newer epoch (or a `restarted` lifecycle record) clears every lane of the feed first;
//! - within an epoch, `seq <= last` is a duplicate (a bridge retry): skipped, counted;
//! - `seq > last + 1`, or a batch flagged `gap_before`, is a gap: the batch is applied, every
//!   lane of the feed is marked gapped (visible in answers and metrics) until the feed is
//!   resynchronised (a new epoch, or an all-cleared event): a removal lost in the gap would
//!   otherwise leave a block credited that the worker no longer holds;
//! - the first batch of a feed starts it at whatever seq it carries.
//!
//! Log time per partition follows record timestamps, never moving back and moving forward at
//! most `max_log_time_step_ms` per record (a producer with a wrong clock cannot expire every
//! placement at once; cut records are counted). Placement expiry runs whenever a partition's
//! log time enters a new `expiry_interval_ms` bucket, for that partition's holders only, so
//! every replica expires at the same records. Quiet partitions are advanced by tick records.
//!
//! Limits (`crate::limits`): a decoded record that would create more than the settings allow
//! in its partition is refused whole before anything of it is applied, as a bad record. The
//! applier keeps each partition's [`Usage`] (the keyspaces it uses, its holder count) beside
//! the state, so that no record costs work proportional to the whole state: `WorkerRemoved`,
//! `WorkerRestarted`, expiry and digest points visit only the keyspaces of their partition.

use crate::limits::{admit, Usage};
use crate::partition_state::{DigestPoint, Feed, FeedKey, PartitionState};
use crate::record::{decode, KvOp, Lifecycle, Op};
use crate::settings::StateSettings;
use prefixlog_engine::{ApplyError, Engine, HolderKey, KeyspaceId, LogTime, Tier};
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

/// Digest points kept per partition (not state-deciding: only how far back anti-entropy can
/// compare).
pub const DIGEST_HISTORY: usize = 512;

/// What happened to one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// Same (feed, epoch, seq) or lower seq already applied.
    Duplicate,
    /// An epoch older than the feed's current one.
    StaleEpoch,
    Bad(crate::record::BadReason),
    /// The offset is below the partition's next offset (a re-delivery after a seek).
    AlreadyApplied,
}

/// Applying a record failed (a panic: a bug, never input; bad records are refused and
/// counted). The state may hold part of that record: the [`Applier`] is marked with it
/// ([`Applier::mark_failed`]) and no checkpoint is taken of it from then on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("applying partition {partition}'s record at offset {offset} failed: {message}")]
pub struct ApplyFailure {
    pub partition: u32,
    pub offset: i64,
    /// The panic's message.
    pub message: String,
}

/// A partition whose kept [`Usage`] is not what a recount from the engine and its state gives
/// ([`Applier::check_usage`]).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition}: kept {kept:?}, recounted {recounted:?}")]
pub struct UsageMismatch {
    pub partition: u32,
    pub kept: Usage,
    pub recounted: Usage,
}

/// A record offered out of order: the partition's state ends at `expected`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("partition {partition}: offset {offered} offered, the state ends at {expected} (records in between are missing)")]
pub struct NotNext {
    pub partition: u32,
    pub expected: i64,
    pub offered: i64,
}

pub struct Applier {
    engine: Arc<Engine>,
    settings: StateSettings,
    partitions: u32,
    parts: Vec<PartitionState>,
    points: Vec<VecDeque<DigestPoint>>,
    /// Derived from `parts` and the engine, per partition (module doc); never persisted.
    usage: Vec<Usage>,
    /// The first record whose apply failed, if one did: the state may hold part of it.
    failed: Option<ApplyFailure>,
    /// Partitions replaced or restored wholesale so far (not by applying records): with the
    /// offsets, what tells this state from an earlier one at the same offsets (a repaired
    /// partition keeps its offset). Runtime only: not applied state, never persisted.
    replacements: u64,
}

impl Applier {
    /// An empty state for a log of `partitions` partitions applied with `settings`.
    pub fn new(partitions: u32, settings: StateSettings) -> Self {
        Self::with_engine(Arc::new(Engine::new(settings.engine_config(partitions))), settings)
    }

    /// Over an existing engine (a restored checkpoint's); its partition count is the log's.
    /// Keyspaces without holders (older builds created them for removals and clears) are
    /// freed: they hold nothing, and digest to nothing.
    pub fn with_engine(engine: Arc<Engine>, settings: StateSettings) -> Self {
        let partitions = engine.config().partitions;
        engine.release_empty();
        let parts = (0..partitions).map(|_| PartitionState::default()).collect();
        let points = (0..partitions).map(|_| VecDeque::new()).collect();
        let mut a = Self {
            engine,
            settings,
            partitions,
            parts,
            points,
            usage: Vec::new(),
            failed: None,
            replacements: 0,
        };
        a.recount_usage();
        a
    }

    /// Recomputes every partition's [`Usage`] from the engine and the partition states.
    fn recount_usage(&mut self) {
        self.usage =
            (0..self.partitions).map(|p| Usage::of(p, &self.parts[p as usize], &self.engine)).collect();
    }

    /// What partition `p`'s records have created, as the limits count it.
    pub fn usage(&self, p: u32) -> &Usage {
        &self.usage[p as usize]
    }

    /// Whether every partition's [`Usage`] equals a recount from the engine and the partition
    /// states (tests: the incremental bookkeeping is exact). `Err` names the first partition
    /// that differs.
    #[cfg(any(test, feature = "testing"))]
    pub fn check_usage(&self) -> Result<(), UsageMismatch> {
        for p in 0..self.partitions {
            let recounted = Usage::of(p, &self.parts[p as usize], &self.engine);
            if recounted != self.usage[p as usize] {
                return Err(UsageMismatch { partition: p, kept: self.usage[p as usize].clone(), recounted });
            }
        }
        Ok(())
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn settings(&self) -> &StateSettings {
        &self.settings
    }

    pub fn partition_count(&self) -> u32 {
        self.partitions
    }

    pub fn partition(&self, p: u32) -> &PartitionState {
        &self.parts[p as usize]
    }

    pub fn partitions(&self) -> &[PartitionState] {
        &self.parts
    }

    /// The next offset to apply, per partition: the log prefix this state is a function of.
    pub fn offsets(&self) -> Vec<i64> {
        self.parts.iter().map(|p| p.next_offset).collect()
    }

    /// Marks the state as holding part of a record that failed to apply (the caller caught the
    /// panic). Kept until the applier is dropped: nothing may persist this state.
    pub fn mark_failed(&mut self, failure: ApplyFailure) {
        self.failed.get_or_insert(failure);
    }

    /// The first record that failed to apply, if one did ([`Self::mark_failed`]).
    pub fn failure(&self) -> Option<&ApplyFailure> {
        self.failed.as_ref()
    }

    /// Replaces partition states (restoring a checkpoint).
    pub fn restore_partitions(&mut self, parts: Vec<PartitionState>) {
        assert_eq!(parts.len(), self.parts.len(), "a checkpoint of another partition count");
        self.parts = parts;
        self.recount_usage();
        self.replacements += 1;
    }

    /// Partitions replaced or restored wholesale so far ([`Self::replace_partition`],
    /// [`Self::restore_partitions`]): a cache of something derived from this state is valid
    /// while both this and the partitions' offsets are unchanged.
    pub fn replacements(&self) -> u64 {
        self.replacements
    }

    /// Replaces partition `p` — its holders in every keyspace, its state and digest points —
    /// with `src`'s (anti-entropy repair, recovery from a peer's checkpoint).
    pub fn replace_partition(&mut self, p: u32, src: &Applier) {
        assert_eq!(self.partitions, src.partitions, "partition states of logs of different partition counts");
        self.replacements += 1;
        let mut ids: BTreeSet<KeyspaceId> =
            self.usage[p as usize].keyspaces_with_holders().into_iter().collect();
        ids.extend(src.usage[p as usize].keyspaces_with_holders());
        for id in ids {
            let theirs = src.engine.keyspace(&id);
            let dst = self.engine.keyspace_or_create(&id);
            match theirs {
                Some(s) => dst.write(|k| k.replace_group(p, &s.read())),
                None => {
                    let empty = prefixlog_engine::Keyspace::new(id.clone(), self.engine.config().clone());
                    dst.write(|k| k.replace_group(p, &empty))
                }
            }
            self.engine.release_if_empty(&id);
        }
        self.parts[p as usize] = src.parts[p as usize].clone();
        self.points[p as usize] = src.points[p as usize].clone();
        self.usage[p as usize] = Usage::of(p, &self.parts[p as usize], &self.engine);
    }

    /// A copy holding only `partitions`' state (the others empty at offset 0).
    pub fn extract(&self, partitions: &[u32]) -> Applier {
        let mut out = Applier::new(self.partitions, self.settings);
        for &p in partitions {
            out.replace_partition(p, self);
        }
        out
    }

    /// The recorded digest points of partition `p`, oldest first.
    pub fn digest_points(&self, p: u32) -> impl Iterator<Item = &DigestPoint> {
        self.points[p as usize].iter()
    }

    /// Every partition's recorded digest points, oldest first (a checkpoint keeps them, so
    /// anti-entropy compares as far back after a restart as before it).
    pub fn all_digest_points(&self) -> Vec<Vec<DigestPoint>> {
        self.points.iter().map(|h| h.iter().copied().collect()).collect()
    }

    /// Puts back digest points a checkpoint kept ([`Self::all_digest_points`]). Per partition
    /// only points at or below its next offset are taken, in offset order, the newest
    /// [`DIGEST_HISTORY`]: a damaged or foreign list can neither claim offsets this state has
    /// not reached nor grow the history.
    pub fn restore_digest_points(&mut self, points: Vec<Vec<DigestPoint>>) {
        for (p, mut list) in points.into_iter().enumerate().take(self.parts.len()) {
            let next = self.parts[p].next_offset;
            list.retain(|d| d.next_offset <= next);
            list.sort_by_key(|d| d.next_offset);
            list.dedup_by_key(|d| d.next_offset);
            let skip = list.len().saturating_sub(DIGEST_HISTORY);
            self.points[p] = list.into_iter().skip(skip).collect();
        }
    }

    /// Digest of partition `p`: its holders' block sets, feed table and announced workers.
    /// Reads only the keyspaces the partition uses.
    pub fn partition_digest(&self, p: u32) -> u64 {
        let engine = self.engine.partition_digest_of(p, self.usage[p as usize].keyspaces());
        engine.wrapping_add(self.parts[p as usize].digest())
    }

    /// Moves partition `p` past records that are gone from the log (an operator accepted the
    /// gap): reading continues at `to`, and every holder and feed of the partition is marked
    /// gapped, because a removal or clear among the lost records would otherwise leave blocks
    /// credited that their worker no longer holds.
    pub fn accept_gap(&mut self, p: u32, to: i64) {
        let part = &mut self.parts[p as usize];
        part.next_offset = to;
        // The record before `to` was never applied here: nothing to tell the log by.
        part.last_mark = 0;
        part.counters.log_gaps += 1;
        part.feeds.values_mut().for_each(|f| f.gapped = true);
        for id in self.usage[p as usize].keyspaces_with_holders() {
            if let Some(ks) = self.engine.keyspace(&id) {
                ks.write(|ks| ks.set_partition_gapped(p));
            }
        }
    }

    /// Applies the record at (`partition`, `offset`) with timestamp `ts`. Offsets below the
    /// partition's next offset are already applied; above it, refused ([`NotNext`]).
    pub fn apply(
        &mut self,
        partition: u32,
        offset: i64,
        ts: LogTime,
        value: Option<&[u8]>,
    ) -> Result<Outcome, NotNext> {
        let part = &mut self.parts[partition as usize];
        if offset < part.next_offset {
            return Ok(Outcome::AlreadyApplied);
        }
        if offset > part.next_offset {
            return Err(NotNext { partition, expected: part.next_offset, offered: offset });
        }
        self.advance_log_time(partition, ts);
        let t = self.parts[partition as usize].log_time;
        #[cfg(any(test, feature = "testing"))]
        crate::testing::maybe_panic(value);
        let max_blocks = self.settings.max_blocks_per_record as usize;
        let p = partition as usize;
        let admitted = decode(value, partition, self.partitions, max_blocks).and_then(|op| {
            admit(&op, &self.parts[p], &self.usage[p], &self.engine, &self.settings).map(|()| op)
        });
        let outcome = match admitted {
            Err(r) => {
                *self.parts[p].counters.bad.entry(r).or_default() += 1;
                Outcome::Bad(r)
            }
            Ok(op) => self.apply_op(partition, op, t),
        };
        if outcome == Outcome::Applied {
            self.parts[partition as usize].counters.applied += 1;
        }
        // Only now: a record that did not finish applying (a panic above) must not count as
        // applied, or a checkpoint would resume past it.
        let part = &mut self.parts[partition as usize];
        part.next_offset = offset + 1;
        part.last_mark = crate::partition_state::record_mark(ts, value);
        self.maybe_expire(partition);
        self.maybe_record_point(partition);
        Ok(outcome)
    }

    /// Log time follows timestamps forward, by at most the configured step per record. The
    /// first record of a partition sets it (there is nothing to measure a step from).
    fn advance_log_time(&mut self, partition: u32, ts: LogTime) {
        let part = &mut self.parts[partition as usize];
        if part.log_time == 0 {
            part.log_time = ts;
            return;
        }
        let limit = part.log_time.saturating_add(self.settings.max_log_time_step_ms);
        if ts > limit {
            part.counters.log_time_clamped += 1;
        }
        part.log_time = part.log_time.max(ts.min(limit));
    }

    fn maybe_record_point(&mut self, partition: u32) {
        let part = &self.parts[partition as usize];
        let next = part.next_offset;
        if !(next as u64).is_multiple_of(self.settings.digest_interval) {
            return;
        }
        let point = DigestPoint {
            next_offset: next,
            log_time: part.log_time,
            digest: self.partition_digest(partition),
        };
        let h = &mut self.points[partition as usize];
        if h.len() >= DIGEST_HISTORY {
            h.pop_front();
        }
        h.push_back(point);
    }

    fn maybe_expire(&mut self, partition: u32) {
        let part = &mut self.parts[partition as usize];
        let bucket = part.log_time / self.settings.expiry_interval_ms;
        if bucket <= part.expiry_bucket {
            return;
        }
        part.expiry_bucket = bucket;
        let now = part.log_time;
        for id in self.usage[partition as usize].keyspaces_with_holders() {
            self.engine.expire(&id, now, partition);
            self.usage[partition as usize].refresh_holders(partition, &id, &self.engine);
        }
    }

    fn apply_op(&mut self, partition: u32, op: Op, t: LogTime) -> Outcome {
        match op {
            Op::KvEvents { keyspace, worker, dp_rank, epoch, seq, gap_before, events, lanes } => {
                let key = FeedKey { keyspace, worker, dp_rank };
                let out = self.apply_batch(partition, key.clone(), epoch, seq, gap_before, &events, t);
                if out == Outcome::Applied && !lanes.is_empty() {
                    let feed = self.parts[partition as usize].feeds.get_mut(&key).expect("feed exists");
                    for l in lanes {
                        feed.lane_meta.insert(l.lane, l);
                    }
                }
                out
            }
            Op::Placement { keyspace, holder, locals, .. } => {
                self.engine.place(&keyspace, holder, &locals, t);
                self.usage[partition as usize].refresh_holders(partition, &keyspace, &self.engine);
                Outcome::Applied
            }
            Op::Lifecycle { worker, change } => {
                self.apply_lifecycle(partition, worker, change, t);
                Outcome::Applied
            }
            Op::Tick { .. } => Outcome::Applied,
        }
    }

    fn apply_lifecycle(&mut self, partition: u32, worker: u64, change: Lifecycle, t: LogTime) {
        let part = &mut self.parts[partition as usize];
        match change {
            Lifecycle::Added { metadata } => {
                part.workers.insert(worker, metadata);
            }
            Lifecycle::Removed => {
                part.workers.remove(&worker);
                let usage = &mut self.usage[partition as usize];
                for key in feeds_of(part, usage, worker) {
                    part.feeds.remove(&key);
                    usage.remove_feed(&key.keyspace);
                }
                for id in usage.keyspaces_with_holders() {
                    self.engine.drop_worker(&id, worker);
                    usage.refresh_holders(partition, &id, &self.engine);
                }
            }
            Lifecycle::Restarted { new_epoch } => {
                for k in feeds_of(part, &self.usage[partition as usize], worker) {
                    self.new_epoch(partition, &k, new_epoch, t);
                }
            }
        }
    }

    /// Clears every lane of a feed and starts `epoch`.
    fn new_epoch(&mut self, partition: u32, key: &FeedKey, epoch: u64, t: LogTime) {
        let part = &mut self.parts[partition as usize];
        let feed = part.feeds.get_mut(key).expect("feed exists");
        for &lane in &feed.lanes {
            self.engine.clear_slot(&key.keyspace, HolderKey::new(key.worker, key.dp_rank, lane), t);
        }
        *feed = Feed::new(epoch);
        part.counters.epochs += 1;
    }

    /// Dedupe, epoch and gap policy of one batch: `Ok(gap)` when it is to be applied, else the
    /// outcome of skipping it.
    fn admit_batch(
        &mut self,
        partition: u32,
        key: &FeedKey,
        epoch: u64,
        seq: u64,
        gap_before: bool,
        t: LogTime,
    ) -> Result<bool, Outcome> {
        let part = &mut self.parts[partition as usize];
        if !part.feeds.contains_key(key) {
            part.feeds.insert(key.clone(), Feed::new(epoch));
            self.usage[partition as usize].add_feed(&key.keyspace);
        }
        let feed = part.feeds.get_mut(key).expect("feed exists");
        if epoch < feed.epoch {
            part.counters.stale_epochs += 1;
            // An older epoch after a newer one: two writers for one feed (a bridge left
            // running), or a restarted bridge whose epoch (its start time) is behind its
            // predecessor's. Either way the holders no longer follow an accepted stream, and
            // blocks that stream removed would stay credited: flag them until a new epoch or a
            // clear of every lane resynchronises the feed.
            feed.gapped = true;
            let lanes: Vec<u32> = feed.lanes.iter().copied().collect();
            self.mark_gapped(key, &lanes);
            return Err(Outcome::StaleEpoch);
        }
        if epoch > feed.epoch {
            self.new_epoch(partition, key, epoch, t);
        }
        let part = &mut self.parts[partition as usize];
        let feed = part.feeds.get_mut(key).expect("feed exists");
        let gap = match feed.last_seq {
            Some(last) if seq <= last => {
                part.counters.duplicates += 1;
                return Err(Outcome::Duplicate);
            }
            Some(last) => seq > last + 1,
            None => false,
        } || gap_before;
        feed.last_seq = Some(seq);
        if gap {
            part.counters.gaps += 1;
        }
        Ok(gap)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_batch(
        &mut self,
        partition: u32,
        key: FeedKey,
        epoch: u64,
        seq: u64,
        gap_before: bool,
        events: &[KvOp],
        t: LogTime,
    ) -> Outcome {
        let gap = match self.admit_batch(partition, &key, epoch, seq, gap_before, t) {
            Ok(gap) => gap,
            Err(skipped) => return skipped,
        };
        let feed = self.parts[partition as usize].feeds.get_mut(&key).expect("feed exists");
        feed.lanes.extend(events.iter().map(KvOp::lane));
        // All-cleared events for every lane of the feed resynchronise it: the gap is behind them.
        // Clearing some lanes only leaves the feed gapped (each cleared lane is re-flagged with
        // the others below: conservative, never an overcount): a removal for another lane may
        // have been among the lost records.
        let cleared: BTreeSet<u32> =
            events.iter().filter(|e| matches!(e, KvOp::Cleared { .. })).map(KvOp::lane).collect();
        let resynced = !cleared.is_empty() && feed.lanes.iter().all(|l| cleared.contains(l));
        feed.gapped = (feed.gapped || gap) && !resynced;
        let (lanes, gapped): (Vec<u32>, bool) = (feed.lanes.iter().copied().collect(), feed.gapped);
        let RefusedStores { missing, invalid } = self.apply_events(&key, events, t);
        self.usage[partition as usize].refresh_holders(partition, &key.keyspace, &self.engine);
        if gapped {
            self.mark_gapped(&key, &lanes);
        }
        let c = &mut self.parts[partition as usize].counters;
        c.missing_parents += missing;
        c.invalid_stores += invalid;
        Outcome::Applied
    }

    /// Flags the feed's holders of `lanes` gapped (those that exist: a holder with no blocks
    /// credits nothing).
    fn mark_gapped(&self, key: &FeedKey, lanes: &[u32]) {
        if let Some(ks) = self.engine.keyspace(&key.keyspace) {
            ks.write(|ks| {
                for &lane in lanes {
                    for tier in Tier::ALL {
                        ks.set_gapped(HolderKey::new(key.worker, key.dp_rank, lane).on(tier), true);
                    }
                }
            });
        }
    }

    /// Applies a batch's events; counts the stores it refused.
    fn apply_events(&self, key: &FeedKey, events: &[KvOp], t: LogTime) -> RefusedStores {
        let RefusedStores { mut missing, mut invalid } = RefusedStores::default();
        for e in events {
            let h = HolderKey::new(key.worker, key.dp_rank, e.lane());
            match e {
                KvOp::Stored { tier, parent_ext, blocks, .. } => {
                    match self.engine.store(&key.keyspace, h.on(*tier), *parent_ext, blocks, t) {
                        Ok(_) => {}
                        Err(ApplyError::MissingParent { .. }) => missing += 1,
                        Err(_) => invalid += 1,
                    }
                }
                KvOp::Removed { tier, exts, .. } => {
                    self.engine.remove(&key.keyspace, h.on(*tier), exts, t);
                }
                KvOp::Cleared { .. } => {
                    self.engine.clear_slot(&key.keyspace, h, t);
                }
            }
        }
        RefusedStores { missing, invalid }
    }
}

/// Stores of one batch the engine refused: under a parent the holder does not hold
/// (`missing`), or refused whole as no chain (`invalid`).
#[derive(Clone, Copy, Debug, Default)]
struct RefusedStores {
    missing: u64,
    invalid: u64,
}

/// The feeds of `worker` in partition state `part`: one range of the feed table per keyspace
/// the partition uses, not a pass over every feed.
fn feeds_of(part: &PartitionState, usage: &Usage, worker: u64) -> Vec<FeedKey> {
    let mut keys = Vec::new();
    for id in usage.keyspaces() {
        let first = FeedKey { keyspace: id.clone(), worker, dp_rank: 0 };
        let last = FeedKey { keyspace: id.clone(), worker, dp_rank: u32::MAX };
        keys.extend(part.feeds.range(first..=last).map(|(k, _)| k.clone()));
    }
    keys
}
