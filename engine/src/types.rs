//! Identifiers, options, results and errors shared by the engine's modules.

use smallvec::SmallVec;
use std::fmt;

/// Log time in milliseconds (a Kafka record timestamp). Never the wall clock.
pub type LogTime = u64;

/// One independently evicted block set: a worker's data-parallel rank, cache lane and storage
/// tier.
///
/// Lanes exist for hybrid models (full attention, sliding window, state checkpoints each keep
/// their own pool); plain models use lane 0. Tiers exist for engines that offload blocks to
/// host memory, disk or a shared pool: each tier's holdings are their own holder, so removing
/// a block from the GPU leaves its host copy credited. (worker, dp rank, lane) without the
/// tier is a *slot*: what a match answers for (see [`HolderMatch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderKey {
    pub worker: u64,
    pub dp_rank: u32,
    pub lane: u32,
    pub tier: Tier,
}

impl HolderKey {
    /// The GPU holder of (worker, dp rank, lane).
    pub const fn new(worker: u64, dp_rank: u32, lane: u32) -> Self {
        Self { worker, dp_rank, lane, tier: Tier::Gpu }
    }

    /// The same slot's holder on `tier`.
    pub const fn on(self, tier: Tier) -> Self {
        Self { tier, ..self }
    }

    /// The first and last keys of `worker` in key order (every dp rank, lane and tier).
    pub const fn range_of_worker(worker: u64) -> (Self, Self) {
        let last = Self { worker, dp_rank: u32::MAX, lane: u32::MAX, tier: Tier::External };
        (Self::new(worker, 0, 0), last)
    }

    /// Whether `other` is a holder of the same slot (worker, dp rank, lane).
    pub fn same_slot(&self, other: &HolderKey) -> bool {
        (self.worker, self.dp_rank, self.lane) == (other.worker, other.dp_rank, other.lane)
    }
}

impl fmt::Display for HolderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {} dp {} lane {}", self.worker, self.dp_rank, self.lane)?;
        if self.tier != Tier::Gpu {
            write!(f, " tier {}", self.tier)?;
        }
        Ok(())
    }
}

/// In `prefixlog-ids` so the gateway client can name them without the engine.
pub use prefixlog_ids::{BlockHashes, KeyspaceId, Tier};

/// Limits and expiry policy of a keyspace. All decisions use log time.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Per-holder bound for event-fed holders (a safety net for lost removal events).
    pub holder_capacity: u32,
    /// Per-holder bound for inferred (placement-only) holders.
    pub inferred_capacity: u32,
    /// Inferred blocks not placed again within this much log time expire.
    pub placement_ttl_ms: u64,
    /// Number of log partitions; holders are grouped by [`partition_of`] for digests.
    pub partitions: u32,
    /// Per-holder operation stamps are renumbered when they reach this value. Only tests set
    /// it low, to exercise renumbering.
    pub stamp_limit: u32,
    /// [`crate::Engine`] applies a store or removal of more blocks than this as several
    /// operations, taking the write lock once per chunk, so no write stalls readers for long.
    /// Part of the applied semantics (each chunk is its own operation record): every replica
    /// of a log must use the same value.
    pub max_blocks_per_lock: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            holder_capacity: 1 << 22,
            inferred_capacity: 1 << 16,
            placement_ttl_ms: 120_000,
            partitions: 1,
            stamp_limit: u32::MAX - 1,
            max_blocks_per_lock: 32,
        }
    }
}

pub use crate::partition::partition_of;

/// How much detail a match computes, and which holders it may report. The default reports
/// every holder with depth >= 1.
#[derive(Clone, Debug, Default)]
pub struct MatchOptions {
    /// Report, per holder, the covered intervals of the query (and holders whose overlap does
    /// not start at position 0). Without it the walk stops as soon as no holder can extend its
    /// contiguous prefix.
    pub intervals: bool,
    /// Keep only the k best holders (by depth, then holder key).
    pub top_k: Option<usize>,
    /// Only holders of this lane.
    pub lane: Option<u32>,
    /// Only holders of these worker ids (every dp rank and lane of each). Any order, duplicates
    /// allowed; a list sorted ascending is used as is, any other is sorted once per query.
    /// `None` means every worker; `Some(vec![])` matches nothing.
    pub candidates: Option<Vec<u64>>,
    /// Leave out holders marked gapped (their state may be missing blocks or hold stale ones).
    pub exclude_gapped: bool,
    /// The tiers that count, in preference order (the first tier holding a position is the
    /// tier of its run). Empty: every tier, in [`Tier::ALL`] order.
    pub tiers: Vec<Tier>,
    /// Per tier (indexed by [`Tier::code`]), what one block held there is worth, in
    /// thousandths. With weights, results are ordered by [`HolderMatch::weighted`] first.
    pub tier_weights: Option<[u32; 4]>,
}

impl MatchOptions {
    /// The tiers that count, in preference order.
    pub fn tier_order(&self) -> &[Tier] {
        if self.tiers.is_empty() {
            &Tier::ALL
        } else {
            &self.tiers
        }
    }
}

/// One slot's answer to a match: (worker, dp rank, lane) over the tiers the query counts.
///
/// A position counts if the slot holds it on any of those tiers; `depth` is the contiguous
/// prefix of such positions. In a keyspace where every holder is on the GPU (the common case,
/// and every keyspace before tiers), each slot has one holder and `tiers` and `runs` are
/// empty: every matched block is on the GPU.
///
/// 64 bytes: a match writes one per worker holding a prefix (hundreds), so the parts most
/// answers lack (intervals, tiers, runs) are behind one pointer, [`MatchDetail`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderMatch {
    /// The slot, with `tier` [`Tier::Gpu`] (the tiers are in `tiers` and `runs`).
    pub holder: HolderKey,
    /// Contiguous matched blocks from position 0, on any counted tier.
    pub depth: u32,
    /// Blocks the slot holds in this keyspace, summed over its counted tiers (a block on two
    /// tiers counts twice).
    pub total: u32,
    /// True when the holder's blocks come from placements, not from its engine's events.
    pub inferred: bool,
    /// The holder's gapped flag: a store of it was refused for a missing parent, or its log
    /// partition had a gap, and it has not been resynchronised since.
    pub gapped: bool,
    /// With tier weights: the sum over `runs` of blocks × the tier's weight (thousandths); for
    /// a GPU-only answer, `depth` × the GPU's weight.
    pub weighted: Option<u64>,
    /// Intervals, tiers and runs; `None` when all three are empty (one representation per
    /// answer: [`HolderMatch::with_detail`]). Equality is derived on purpose: `Some(empty)`
    /// differs from `None`, so the differential tests also catch an answer built another way.
    pub detail: Option<Box<MatchDetail>>,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<HolderMatch>() == 64);

/// The parts of a [`HolderMatch`] only some answers have. Inline up to a size that covers
/// most answers, so that an answer with detail costs one allocation, not one per part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MatchDetail {
    /// Half-open query-position intervals the slot covers (only with `intervals`).
    pub intervals: SmallVec<[(u32, u32); 2]>,
    /// Per counted tier the slot holds blocks on, in preference order: that tier's own
    /// contiguous depth and block count. Empty when only GPU holders exist in the keyspace.
    pub tiers: SmallVec<[TierDepth; 4]>,
    /// The matched prefix as runs, each on the first tier in preference order that holds its
    /// positions; their lengths sum to `depth`. Empty when `tiers` is.
    pub runs: SmallVec<[TierRun; 4]>,
}

impl HolderMatch {
    /// Sets the detail, `None` when every part is empty.
    pub fn with_detail(mut self, detail: MatchDetail) -> Self {
        let empty = detail.intervals.is_empty() && detail.tiers.is_empty() && detail.runs.is_empty();
        self.detail = (!empty).then(|| Box::new(detail));
        self
    }

    /// [`MatchDetail::intervals`] (empty without detail).
    pub fn intervals(&self) -> &[(u32, u32)] {
        self.detail.as_ref().map_or(&[], |d| &d.intervals)
    }

    /// [`MatchDetail::tiers`] (empty without detail).
    pub fn tiers(&self) -> &[TierDepth] {
        self.detail.as_ref().map_or(&[], |d| &d.tiers)
    }

    /// [`MatchDetail::runs`] (empty without detail).
    pub fn runs(&self) -> &[TierRun] {
        self.detail.as_ref().map_or(&[], |d| &d.runs)
    }
}

/// One tier's part of a slot's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierDepth {
    pub tier: Tier,
    /// Contiguous matched blocks from position 0 on this tier alone.
    pub depth: u32,
    /// Blocks the slot holds on this tier in this keyspace.
    pub total: u32,
}

/// A stretch of a matched prefix held on one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierRun {
    pub tier: Tier,
    pub blocks: u32,
}

/// A write that was refused. The state is unchanged apart from what the variant says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The holder does not hold the parent block; the holder, if it exists, is now marked
    /// gapped (a holder that does not exist is not created: it holds nothing to be wrong about).
    #[error("{holder}: parent block {parent_ext:#x} is not held (holder marked gapped)")]
    MissingParent { holder: HolderKey, parent_ext: u64 },
    /// The store names a block twice, or names its own parent among its blocks: it cannot be a
    /// chain, so none of it is applied (counted in `stores_rejected`; the holder is not marked
    /// gapped, since nothing was lost).
    #[error("{holder}: invalid store refused whole: {reason}")]
    InvalidStore { holder: HolderKey, reason: InvalidStoreReason },
}

/// Why a store is not a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidStoreReason {
    /// This ext hash appears more than once among the stored blocks.
    #[error("ext {0:#x} appears twice in the store")]
    RepeatedExt(u64),
    /// The parent's ext hash appears among the stored blocks.
    #[error("the parent ext {0:#x} is also one of the stored blocks")]
    ParentInStore(u64),
}

/// Counters of what writes did; deterministic, part of the applied state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyspaceStats {
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub removes_unknown: u64,
    pub stores_rejected: u64,
    pub placements_ignored: u64,
    pub evicted_capacity: u64,
    pub expired_ttl: u64,
}

impl KeyspaceStats {
    /// The counters in their one serialized order (images and dumps both use it).
    pub fn to_fields(&self) -> [u64; 7] {
        [
            self.blocks_stored,
            self.blocks_removed,
            self.removes_unknown,
            self.stores_rejected,
            self.placements_ignored,
            self.evicted_capacity,
            self.expired_ttl,
        ]
    }

    /// The inverse of [`KeyspaceStats::to_fields`].
    pub fn from_fields(f: [u64; 7]) -> Self {
        let [blocks_stored, blocks_removed, removes_unknown, stores_rejected, placements_ignored, evicted_capacity, expired_ttl] =
            f;
        Self {
            blocks_stored,
            blocks_removed,
            removes_unknown,
            stores_rejected,
            placements_ignored,
            evicted_capacity,
            expired_ttl,
        }
    }
}

/// What broke. Run, block and holder numbers are internal indices.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvariantError {
    /// A run's pin count is not the number of operation records ending at its last block.
    #[error("run {run}: {pins} pins, but {records} records end there")]
    Pins { run: u32, pins: u32, records: u32 },
    /// A holder's block count is not the number of blocks it is a member of.
    #[error("{holder}: counts {counted} blocks, is a member of {members}")]
    HolderBlocks { holder: HolderKey, counted: u32, members: u32 },
    /// A holder's digest is not the sum of its blocks' terms.
    #[error("{holder}: digest {stored:#x}, its blocks sum to {recomputed:#x}")]
    HolderDigest { holder: HolderKey, stored: u64, recomputed: u64 },
    /// A keyspace-level aggregate (`keyspace digest`, `partition N digest`, `holder_blocks`)
    /// is not the sum over its holders.
    #[error("{what}: stored {stored:#x}, recomputed {recomputed:#x}")]
    Aggregate { what: String, stored: u64, recomputed: u64 },
    /// A holder is filed under another partition than its worker maps to.
    #[error("{holder}: filed in partition {group}, belongs in {expected}")]
    HolderPartition { holder: HolderKey, group: u32, expected: u32 },
    /// The holder index and the holder slots disagree.
    #[error("holder slot {slot}: {what}")]
    HolderIndex { slot: u32, what: &'static str },
    /// A derived holder index (key order, holders per partition, the expiry queue) disagrees
    /// with the holders.
    #[error("derived holder index: {0}")]
    DerivedIndex(String),
    /// A run's place in the trie: parent, child count, first child, length, paths, lookup.
    #[error("run {run}: {what}")]
    Link { run: u32, what: &'static str },
    /// Block storage: a block's run, a free mark, an allocation overlap or leak.
    #[error("block {block}: {what}")]
    Block { block: u32, what: &'static str },
    /// The ext table: a bound ext that does not resolve to its block, or a stale entry.
    #[error("block {block}: {what}")]
    Ext { block: u32, what: &'static str },
    /// The edge table holds an entry that is not a live run's non-first child link.
    #[error("run {run}: {what}")]
    Edge { run: u32, what: &'static str },
    /// The free list of run ids and run liveness disagree.
    #[error("run {run}: {what}")]
    FreeList { run: u32, what: &'static str },
    /// A run's membership list: a dead holder, a holder listed twice, or not in key order
    /// (matching lists holders in member order).
    #[error("run {run}, holder slot {holder}: {what}")]
    Member { run: u32, holder: u32, what: &'static str },
    /// A holder's operation records: stamp order, stamp range, leaf, window.
    #[error("{holder}, record stamp {stamp}: {what}")]
    Record { holder: HolderKey, stamp: u32, what: &'static str },
    /// Some block of the holder is not inside the window of the record whose stamp it carries
    /// (every block belongs to exactly one record), or a window covers part of such a run.
    #[error("{holder}: {owned} of {blocks} blocks lie in the window of the record that stamped them")]
    Ownership { holder: HolderKey, owned: u32, blocks: u32 },
    /// `overrides` and `override_of` are not inverse maps of live, held blocks.
    #[error("{holder}, ext {ext:#x}: {what}")]
    Override { holder: HolderKey, ext: u64, what: &'static str },
}

/// `Ok` if `ok`, else the error `err` builds.
pub(crate) fn ensure(ok: bool, err: impl FnOnce() -> InvariantError) -> Result<(), InvariantError> {
    if ok {
        Ok(())
    } else {
        Err(err())
    }
}
