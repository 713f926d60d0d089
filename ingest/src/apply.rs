//! Deterministic application of log records to the engine.
//!
//! The [`Applier`] is the only writer of a replica's engine. Its state — the engine plus, per
//! partition, the next offset, the log time and the feed table — is a pure function of the
//! records applied, partition by partition, in offset order. Different interleavings of
//! partitions give the same per-partition digests (tested), because a worker's records are all
//! in one partition and holders never share mutable state across workers.
//!
//! Feed policy (one feed = one engine event stream = keyspace × worker × dp rank):
//! - a batch with an older epoch than the feed's is stale: skipped, counted;
//! - a newer epoch (or a `restarted` lifecycle record) clears every lane of the feed first;
//! - within an epoch, `seq <= last` is a duplicate (a bridge retry): skipped, counted;
//! - `seq > last + 1`, or a batch flagged `gap_before`, is a gap: the batch is applied, every
//!   lane of the feed is marked gapped (visible in holder summaries and metrics) until the feed
//!   is resynchronised (a new epoch, or an all-cleared event). Its state stays usable, but a
//!   removal lost in the gap would leave a block credited that the worker no longer holds, so
//!   the gap is made visible rather than hidden (bridges recover gaps through the engine's
//!   replay socket before it comes to this);
//! - the first batch of a feed starts it at whatever seq it carries.
//!
//! Log time per partition is the maximum record timestamp seen (producers' clocks may step
//! back). Placement expiry runs whenever a partition's log time enters a new
//! `expiry_interval_ms` bucket, for that partition's holders only, so every replica expires at
//! the same records. Quiet partitions are advanced by tick records (see `publisher`).

use crate::record::{decode, BadReason, KvOp, LaneMeta, Lifecycle, Op};
use prefixlog_engine::digest::mix64;
use prefixlog_engine::{partition_of, Engine, HolderKey, KeyspaceId, LogTime};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct ApplyConfig {
    pub partitions: u32,
    /// Largest number of blocks one record may carry.
    pub max_blocks_per_record: usize,
    /// Placement expiry granularity, in log time.
    pub expiry_interval_ms: u64,
    /// Record a digest point for a partition every this many offsets (anti-entropy compares
    /// replicas at these points; they are deterministic, so equal offsets mean equal digests).
    pub digest_every: i64,
    /// Digest points kept per partition.
    pub digest_history: usize,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        Self {
            partitions: 16,
            max_blocks_per_record: 16_384,
            expiry_interval_ms: 1_000,
            digest_every: 1_000,
            digest_history: 512,
        }
    }
}

/// What happened to one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    /// Same (feed, epoch, seq) or lower seq already applied.
    Duplicate,
    /// An epoch older than the feed's current one.
    StaleEpoch,
    Bad(BadReason),
    /// The offset is below the partition's next offset (a re-delivery after a seek).
    AlreadyApplied,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FeedKey {
    pub keyspace: KeyspaceId,
    pub worker: u64,
    pub dp_rank: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feed {
    pub epoch: u64,
    pub last_seq: Option<u64>,
    pub lanes: BTreeSet<u32>,
    pub gapped: bool,
    /// What the bridge announced about each lane (kind, window, block size), this epoch.
    pub lane_meta: BTreeMap<u32, LaneMeta>,
}

/// Counters of one partition (deterministic: part of the applied state).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionCounters {
    pub applied: u64,
    pub duplicates: u64,
    pub stale_epochs: u64,
    pub gaps: u64,
    pub epochs: u64,
    pub missing_parents: u64,
    pub bad: BTreeMap<BadReason, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionState {
    /// The next offset to apply.
    pub next_offset: i64,
    /// Max record timestamp applied.
    pub log_time: LogTime,
    pub feeds: BTreeMap<FeedKey, Feed>,
    pub counters: PartitionCounters,
    /// The last placement-expiry bucket (log time / expiry interval) handled.
    pub expiry_bucket: u64,
}

/// A partition's digest after applying every record below `next_offset`. Also a time → offset
/// index entry (audits): the log time at that offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DigestPoint {
    pub next_offset: i64,
    pub log_time: LogTime,
    pub digest: u64,
}

pub struct Applier {
    engine: Arc<Engine>,
    cfg: ApplyConfig,
    parts: Vec<PartitionState>,
    points: Vec<std::collections::VecDeque<DigestPoint>>,
}

impl Applier {
    pub fn new(engine: Arc<Engine>, cfg: ApplyConfig) -> Self {
        assert_eq!(
            engine.config().partitions,
            cfg.partitions,
            "engine and applier must agree on the partition count"
        );
        let parts = (0..cfg.partitions).map(|_| PartitionState::default()).collect();
        let points = (0..cfg.partitions).map(|_| Default::default()).collect();
        Self { engine, cfg, parts, points }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn config(&self) -> &ApplyConfig {
        &self.cfg
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

    /// Replaces partition states (restoring a checkpoint).
    pub fn restore_partitions(&mut self, parts: Vec<PartitionState>) {
        assert_eq!(parts.len(), self.parts.len());
        self.parts = parts;
    }

    /// Replaces partition `p` — its holders in every keyspace, its feed table, counters and
    /// digest points — with `src`'s (anti-entropy repair from a rebuilt applier).
    pub fn replace_partition(&mut self, p: u32, src: &Applier) {
        let mut ids: BTreeSet<KeyspaceId> = self.engine.keyspace_ids().into_iter().collect();
        ids.extend(src.engine.keyspace_ids());
        for id in ids {
            let dst = self.engine.keyspace_or_create(&id);
            match src.engine.keyspace(&id) {
                Some(s) => dst.write().replace_group(p, &s.read()),
                None => dst
                    .write()
                    .replace_group(p, &prefixlog_engine::Keyspace::new(id, self.engine.config().clone())),
            }
        }
        self.parts[p as usize] = src.parts[p as usize].clone();
        self.points[p as usize] = src.points[p as usize].clone();
    }

    /// The recorded digest points of partition `p`, oldest first.
    pub fn digest_points(&self, p: u32) -> impl Iterator<Item = &DigestPoint> {
        self.points[p as usize].iter()
    }

    /// Digest of partition `p`: its holders' block sets and its feed table.
    pub fn partition_digest(&self, p: u32) -> u64 {
        let mut d = self.engine.partition_digest(p);
        for (k, f) in &self.parts[p as usize].feeds {
            let mut h = mix64(k.worker ^ mix64(u64::from(k.dp_rank) ^ mix64(k.keyspace.model.len() as u64)));
            h = mix64(h ^ u64::from(k.keyspace.block_size) << 32 ^ u64::from(k.keyspace.scheme));
            for b in k.keyspace.model.bytes() {
                h = mix64(h ^ u64::from(b));
            }
            h = mix64(h ^ f.epoch ^ mix64(f.last_seq.map_or(u64::MAX, |s| s) ^ u64::from(f.gapped)));
            for m in f.lane_meta.values() {
                h = mix64(
                    h ^ u64::from(m.lane) << 40 ^ u64::from(m.sliding_window) << 8 ^ u64::from(m.block_size),
                );
                for b in m.kind.bytes() {
                    h = mix64(h ^ u64::from(b));
                }
            }
            d = d.wrapping_add(h);
        }
        d
    }

    /// Applies the record at (`partition`, `offset`) with Kafka timestamp `ts`.
    pub fn apply(&mut self, partition: u32, offset: i64, ts: LogTime, value: Option<&[u8]>) -> Outcome {
        let cfg = &self.cfg;
        let part = &mut self.parts[partition as usize];
        if offset < part.next_offset {
            return Outcome::AlreadyApplied;
        }
        part.next_offset = offset + 1;
        part.log_time = part.log_time.max(ts);
        let t = part.log_time;
        let outcome = match decode(value, partition, cfg.partitions, cfg.max_blocks_per_record) {
            Err(r) => {
                *part.counters.bad.entry(r).or_default() += 1;
                Outcome::Bad(r)
            }
            Ok(op) => self.apply_op(partition, op, t),
        };
        if outcome == Outcome::Applied {
            self.parts[partition as usize].counters.applied += 1;
        }
        self.maybe_expire(partition);
        let next = offset + 1;
        if self.cfg.digest_every > 0 && next % self.cfg.digest_every == 0 {
            let point = DigestPoint {
                next_offset: next,
                log_time: self.parts[partition as usize].log_time,
                digest: self.partition_digest(partition),
            };
            let h = &mut self.points[partition as usize];
            if h.len() >= self.cfg.digest_history.max(1) {
                h.pop_front();
            }
            h.push_back(point);
        }
        outcome
    }

    fn maybe_expire(&mut self, partition: u32) {
        let part = &mut self.parts[partition as usize];
        let bucket = part.log_time / self.cfg.expiry_interval_ms.max(1);
        if bucket <= part.expiry_bucket {
            return;
        }
        part.expiry_bucket = bucket;
        let now = part.log_time;
        let n = self.cfg.partitions;
        for ks in self.engine.keyspaces() {
            ks.write().expire(now, |k| partition_of(k.worker, n) == partition);
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
                self.engine.keyspace_or_create(&keyspace).write().place(holder, &locals, t);
                Outcome::Applied
            }
            Op::Lifecycle { worker, change } => {
                match change {
                    Lifecycle::Added => {}
                    Lifecycle::Removed => {
                        for ks in self.engine.keyspaces() {
                            ks.write().drop_worker(worker);
                        }
                        self.parts[partition as usize].feeds.retain(|k, _| k.worker != worker);
                    }
                    Lifecycle::Restarted { new_epoch } => {
                        let keys: Vec<FeedKey> = self.parts[partition as usize]
                            .feeds
                            .keys()
                            .filter(|k| k.worker == worker)
                            .cloned()
                            .collect();
                        for k in keys {
                            self.new_epoch(partition, &k, new_epoch, t);
                        }
                    }
                }
                Outcome::Applied
            }
            Op::Tick { .. } => Outcome::Applied,
        }
    }

    /// Clears every lane of a feed and starts `epoch`.
    fn new_epoch(&mut self, partition: u32, key: &FeedKey, epoch: u64, t: LogTime) {
        let part = &mut self.parts[partition as usize];
        let feed = part.feeds.get_mut(key).expect("feed exists");
        if let Some(ks) = self.engine.keyspace(&key.keyspace) {
            let mut ks = ks.write();
            for &lane in &feed.lanes {
                let h = HolderKey::new(key.worker, key.dp_rank, lane);
                ks.clear(h, t);
                ks.set_gapped(h, false);
            }
        }
        feed.epoch = epoch;
        feed.last_seq = None;
        feed.gapped = false;
        feed.lane_meta.clear();
        part.counters.epochs += 1;
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
        let part = &mut self.parts[partition as usize];
        let feed = part.feeds.entry(key.clone()).or_insert_with(|| Feed {
            epoch,
            last_seq: None,
            lanes: BTreeSet::new(),
            gapped: false,
            lane_meta: BTreeMap::new(),
        });
        if epoch < feed.epoch {
            part.counters.stale_epochs += 1;
            return Outcome::StaleEpoch;
        }
        if epoch > feed.epoch {
            self.new_epoch(partition, &key, epoch, t);
        }
        let part = &mut self.parts[partition as usize];
        let feed = part.feeds.get_mut(&key).expect("feed exists");
        let gap = match feed.last_seq {
            Some(last) if seq <= last => {
                part.counters.duplicates += 1;
                return Outcome::Duplicate;
            }
            Some(last) => seq > last + 1,
            None => false,
        } || gap_before;
        feed.last_seq = Some(seq);
        for e in events {
            let lane = match e {
                KvOp::Stored { lane, .. } | KvOp::Removed { lane, .. } | KvOp::Cleared { lane } => *lane,
            };
            feed.lanes.insert(lane);
        }
        if gap {
            part.counters.gaps += 1;
        }
        // An all-cleared event in the batch resynchronises the feed: the gap is behind it.
        let cleared = events.iter().any(|e| matches!(e, KvOp::Cleared { .. }));
        feed.gapped = (feed.gapped || gap) && !cleared;
        let lanes: Vec<u32> = feed.lanes.iter().copied().collect();
        let gapped = feed.gapped;
        let engine = self.engine.clone();
        let mut missing = 0;
        for e in events {
            match e {
                KvOp::Stored { lane, parent_ext, blocks } => {
                    let h = HolderKey::new(key.worker, key.dp_rank, *lane);
                    if engine.store(&key.keyspace, h, *parent_ext, blocks, t).is_err() {
                        missing += 1;
                    }
                }
                KvOp::Removed { lane, exts } => {
                    engine.remove(&key.keyspace, HolderKey::new(key.worker, key.dp_rank, *lane), exts, t);
                }
                KvOp::Cleared { lane } => {
                    let ks = engine.keyspace_or_create(&key.keyspace);
                    let mut ks = ks.write();
                    let h = HolderKey::new(key.worker, key.dp_rank, *lane);
                    ks.clear(h, t);
                    ks.set_gapped(h, false);
                }
            }
        }
        if gapped {
            let ks = engine.keyspace_or_create(&key.keyspace);
            let mut ks = ks.write();
            for lane in lanes {
                ks.set_gapped(HolderKey::new(key.worker, key.dp_rank, lane), true);
            }
        }
        self.parts[partition as usize].counters.missing_parents += missing;
        Outcome::Applied
    }
}
