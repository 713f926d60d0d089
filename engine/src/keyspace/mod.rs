//! One keyspace: [`Keyspace`], a trie and its holders, and what it says about them (counts,
//! holder summaries and chains).
//!
//! Writes are deterministic functions of their arguments and the current state; the only
//! notion of time is the log time passed in. The keyspace's behaviour, by concern:
//! - `writes`: store, remove, clear, place, and the capacity bound;
//! - `store_check`: refusing stores that cannot be a chain, before anything changes;
//! - `members`: which holders are members of which runs, and the operation records that own
//!   those memberships (eviction, compaction, stamp renumbering);
//! - `holders`: the holders themselves and their derived indices (key order, holders per
//!   partition, the expiry queue, tier slots);
//! - `departures`: how holders leave (their worker removed, placements expired, inferred
//!   holders forgotten once empty);
//! - `aggregates`: the keyspace and partition digests and resident holder-blocks, summed over
//!   holders once per operation;
//! - `faults` (tests only): hooks that damage a keyspace as a bug or a flipped bit would.
//!
//! Matching (`crate::matching`), persistence (`crate::persist`) and checks (`crate::check`) are
//! more of the keyspace's behaviour, in folders of their own above this one.

mod aggregates;
mod departures;
#[cfg(any(test, feature = "testing"))]
mod faults;
pub(crate) mod holders;
pub(crate) mod members;
pub(crate) mod store_check;
mod writes;

use crate::trie::insert::Stretch;
use crate::trie::{Segment, Trie};
use crate::types::{EngineConfig, HolderKey, KeyspaceId, KeyspaceStats, LogTime};
use holders::Holders;

/// What a placement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaceOutcome {
    /// Recorded as inferred state; `added` blocks were new.
    Placed { added: u32 },
    /// The holder has an event feed, whose truth placements never override.
    IgnoredFed,
}

/// Digest and counters of one holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderSummary {
    pub key: HolderKey,
    pub blocks: u32,
    pub digest: u64,
    pub fed: bool,
    pub gapped: bool,
    pub last_time: LogTime,
}

/// A fresh [`Keyspace::instance`].
fn next_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[derive(Clone)]
pub struct Keyspace {
    pub(crate) id: KeyspaceId,
    pub(crate) cfg: EngineConfig,
    pub(crate) trie: Trie,
    pub(crate) holders: Holders,
    pub(crate) stats: KeyspaceStats,
    /// Sum of every holder's digest term (`digest::holder_term`), kept by `aggregates`.
    pub(crate) digest: u64,
    /// The same per partition group.
    pub(crate) group_digests: Vec<u64>,
    pub(crate) holder_blocks: u64,
    /// Scratch: record windows, walked paths, a store's locals, `check_store`'s set.
    pub(crate) window: Vec<Segment>,
    stretches: Vec<Stretch>,
    locals: Vec<u64>,
    ext_scratch: Vec<u64>,
    /// The ext hashes of a removal.
    hash_scratch: Vec<u64>,
    /// Holders visited by `drop_worker` and `expire` (not state: a measure of their work).
    pub(crate) visited: u64,
    /// Which keyspace this is to a scrub spanning steps: new for every keyspace made (a rebuild
    /// or an image read makes a new one), kept by a clone (the two copies of a paired cell).
    pub(crate) instance: u64,
    /// Operations settled so far (see `Holder::last_write`). Not state.
    pub(crate) write_seq: u64,
}

impl Keyspace {
    pub fn new(id: KeyspaceId, cfg: EngineConfig) -> Self {
        let groups = cfg.partitions.max(1) as usize;
        Self {
            id,
            cfg,
            trie: Trie::new(),
            holders: Holders::default(),
            stats: KeyspaceStats::default(),
            digest: 0,
            group_digests: vec![0; groups],
            holder_blocks: 0,
            window: Vec::new(),
            stretches: Vec::new(),
            locals: Vec::new(),
            ext_scratch: Vec::new(),
            hash_scratch: Vec::new(),
            visited: 0,
            instance: next_instance(),
            write_seq: 0,
        }
    }

    pub fn id(&self) -> &KeyspaceId {
        &self.id
    }

    pub fn stats(&self) -> &KeyspaceStats {
        &self.stats
    }

    pub fn holder_count(&self) -> usize {
        self.holders.len()
    }

    /// Holders `drop_worker` and `expire` have visited since this copy was made: their work,
    /// which must follow what they change, not the size of the keyspace. Not applied state.
    pub fn holders_visited(&self) -> u64 {
        self.visited
    }

    /// Holders whose worker lives in log partition `p` (under `EngineConfig::partitions`).
    pub fn holders_in_partition(&self, p: u32) -> u32 {
        self.holders.in_group(p)
    }

    /// Block positions in the trie (each held by one or more holders, or an unheld ancestor
    /// or record end of held ones).
    pub fn node_count(&self) -> usize {
        self.trie.live_blocks()
    }

    pub fn heap_bytes(&self) -> usize {
        self.trie.heap_bytes()
    }

    pub fn holder(&self, key: &HolderKey) -> Option<HolderSummary> {
        self.holders.get(key).map(|i| self.summary(i))
    }

    /// Every holder, in key order.
    pub fn holder_summaries(&self) -> Vec<HolderSummary> {
        self.holders.sorted().into_iter().map(|i| self.summary(i)).collect()
    }

    fn summary(&self, i: u32) -> HolderSummary {
        let h = self.holders.at(i);
        HolderSummary {
            key: h.key,
            blocks: h.blocks,
            digest: h.digest,
            fed: h.fed,
            gapped: h.gapped,
            last_time: h.last_time,
        }
    }

    /// Every chain of locals (root to block) the holder holds, sorted. For audits and tests.
    pub fn holder_chains(&self, key: &HolderKey) -> Vec<Vec<u64>> {
        let Some(h) = self.holders.get(key) else { return Vec::new() };
        let mut out = Vec::new();
        for r in 1..self.trie.runs.slots() {
            let run = &self.trie.runs[r];
            if run.live() && run.member(h).is_some() {
                out.extend((run.start..run.start + run.len).map(|b| self.trie.chain_to(b)));
            }
        }
        out.sort();
        out
    }

    /// Whether any holder of partition `p` is in this keyspace.
    pub fn has_partition(&self, p: u32) -> bool {
        self.holders.slots.iter().flatten().any(|h| h.group == p)
    }
}
