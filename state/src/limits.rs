//! Bounded state, decided by the log: what a record may create, per partition.
//!
//! Every resource a record can create has a limit in [`StateSettings`]: keyspaces a
//! partition's feeds and holders are in, feeds, lanes per feed, holders, announced workers,
//! worker metadata bytes, and the length of the names a record carries (model, lane kind).
//! [`admit`] looks at a decoded record and the partition's state *before anything is applied*
//! and refuses a record that would pass a limit whole, with a [`BadReason`] per limit; the
//! applier counts, logs and dead-letters it like any other bad record. Every limit counts
//! within one partition, from that partition's state alone, so every replica refuses the same
//! records whatever the interleaving of partitions and whichever partitions it owns.
//!
//! The check is conservative where being exact would cost a dry run: a store with no parent
//! for a holder that does not exist counts as a new holder even if the engine will refuse it
//! (an ext named twice), and a placement for a new holder counts even if it evicts itself.
//!
//! [`Usage`] is what the checks and the per-partition work of the applier (`WorkerRemoved`,
//! expiry, digests) need to know without looking at the whole engine: the keyspaces each
//! partition uses and its holder count. It is derived state: never persisted, rebuilt from the
//! engine and the partition state on restore and on replacement ([`Usage::of`]).

use crate::partition_state::{FeedKey, PartitionState};
use crate::record::{BadReason, KvOp, Op};
use crate::settings::{StateSettings, METADATA_ENTRY_BYTES};
use prefixlog_engine::{Engine, HolderKey, KeyspaceId};
use std::collections::BTreeMap;

/// A partition's holders and feeds in one keyspace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct InUse {
    holders: u32,
    feeds: u32,
}

/// What one partition's records have created, as the limits count it (module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Keyspaces where the partition has feeds or holders.
    keyspaces: BTreeMap<KeyspaceId, InUse>,
    /// The partition's holders over all keyspaces.
    holders: u64,
}

impl Usage {
    /// Recomputed from scratch: partition `p`'s feeds, and its holders in every keyspace of
    /// `engine` (a pass over all keyspaces: restore and replacement only).
    pub fn of(p: u32, part: &PartitionState, engine: &Engine) -> Self {
        let mut u = Usage::default();
        for ks in engine.keyspaces() {
            let k = ks.read();
            u.set_holders(k.id(), k.holders_in_partition(p));
        }
        for key in part.feeds.keys() {
            u.add_feed(&key.keyspace);
        }
        u
    }

    /// The keyspaces the partition uses, in order.
    pub fn keyspaces(&self) -> impl Iterator<Item = &KeyspaceId> {
        self.keyspaces.keys()
    }

    /// The keyspaces where the partition has holders, in order.
    pub fn keyspaces_with_holders(&self) -> Vec<KeyspaceId> {
        self.keyspaces.iter().filter(|(_, u)| u.holders > 0).map(|(id, _)| id.clone()).collect()
    }

    pub fn uses(&self, id: &KeyspaceId) -> bool {
        self.keyspaces.contains_key(id)
    }

    pub fn holders(&self) -> u64 {
        self.holders
    }

    /// Records that the partition now has `n` holders in keyspace `id`.
    pub fn set_holders(&mut self, id: &KeyspaceId, n: u32) {
        let before = self.keyspaces.get(id).map_or(0, |u| u.holders);
        self.holders = self.holders + u64::from(n) - u64::from(before);
        self.update(id, |u| u.holders = n);
    }

    /// [`Self::set_holders`] from the engine's count after a write to `id`.
    pub fn refresh_holders(&mut self, p: u32, id: &KeyspaceId, engine: &Engine) {
        let n = engine.keyspace(id).map_or(0, |k| k.read().holders_in_partition(p));
        self.set_holders(id, n);
    }

    pub fn add_feed(&mut self, id: &KeyspaceId) {
        self.update(id, |u| u.feeds += 1);
    }

    pub fn remove_feed(&mut self, id: &KeyspaceId) {
        self.update(id, |u| u.feeds -= 1);
    }

    /// Changes a keyspace's counts, dropping it from the set once nothing is left.
    fn update(&mut self, id: &KeyspaceId, f: impl FnOnce(&mut InUse)) {
        let mut u = self.keyspaces.get(id).copied().unwrap_or_default();
        f(&mut u);
        if u == InUse::default() {
            self.keyspaces.remove(id);
        } else {
            self.keyspaces.insert(id.clone(), u);
        }
    }
}

/// `Err(reason)` when applying `op` to the partition of state `part` would pass a limit of `s`
/// (module doc).
/// Reads only the partition's state, its [`Usage`] and the holders of the keyspace `op` names.
pub fn admit(
    op: &Op,
    part: &PartitionState,
    usage: &Usage,
    engine: &Engine,
    s: &StateSettings,
) -> Result<(), BadReason> {
    let holder_exists = |id: &KeyspaceId, key: HolderKey| {
        engine.keyspace(id).is_some_and(|k| k.read().holder(&key).is_some())
    };
    match op {
        Op::KvEvents { keyspace, worker, dp_rank, epoch, seq, events, lanes, .. } => {
            check_name(&keyspace.model, s)?;
            lanes.iter().try_for_each(|l| check_name(&l.kind, s))?;
            let key = FeedKey { keyspace: keyspace.clone(), worker: *worker, dp_rank: *dp_rank };
            let feed = part.feeds.get(&key);
            if let Some(f) = feed {
                let duplicate = *epoch == f.epoch && f.last_seq.is_some_and(|last| *seq <= last);
                if *epoch < f.epoch || duplicate {
                    return Ok(()); // skipped by the feed policy: creates nothing
                }
            }
            check_new_keyspace(keyspace, usage, s)?;
            if feed.is_none() && part.feeds.len() >= s.max_feeds_per_partition as usize {
                return Err(BadReason::TooManyFeeds);
            }
            // The feed's lanes after the batch: a newer epoch starts the feed afresh.
            let kept = feed.filter(|f| *epoch == f.epoch);
            let mut after: Vec<u32> =
                kept.map_or(Vec::new(), |f| f.lanes.iter().chain(f.lane_meta.keys()).copied().collect());
            after.extend(events.iter().map(KvOp::lane).chain(lanes.iter().map(|l| l.lane)));
            after.sort_unstable();
            after.dedup();
            if after.len() > s.max_lanes_per_feed as usize {
                return Err(BadReason::TooManyLanes);
            }
            // Each tier of a lane is a holder of its own.
            let mut created: Vec<HolderKey> = events
                .iter()
                .filter_map(|e| match e {
                    KvOp::Stored { tier, lane, parent_ext: None, .. } => {
                        Some(HolderKey::new(*worker, *dp_rank, *lane).on(*tier))
                    }
                    _ => None,
                })
                .filter(|&key| !holder_exists(keyspace, key))
                .collect();
            created.sort_unstable();
            created.dedup();
            check_new_holders(created.len(), usage, s)
        }
        Op::Placement { keyspace, holder, locals, .. } => {
            check_name(&keyspace.model, s)?;
            if locals.is_empty() || holder_exists(keyspace, *holder) {
                return Ok(());
            }
            check_new_keyspace(keyspace, usage, s)?;
            check_new_holders(1, usage, s)
        }
        Op::Lifecycle { worker, change: crate::record::Lifecycle::Added { metadata } } => {
            let bytes: u64 = metadata
                .iter()
                .map(|(k, v)| (k.len() + v.len()) as u64 + u64::from(METADATA_ENTRY_BYTES))
                .sum();
            if bytes > u64::from(s.max_worker_metadata_bytes) {
                return Err(BadReason::MetadataTooLarge);
            }
            if !part.workers.contains_key(worker)
                && part.workers.len() >= s.max_workers_per_partition as usize
            {
                return Err(BadReason::TooManyWorkers);
            }
            Ok(())
        }
        Op::Lifecycle { .. } | Op::Tick { .. } => Ok(()),
    }
}

fn check_name(name: &str, s: &StateSettings) -> Result<(), BadReason> {
    if name.len() > s.max_name_bytes as usize {
        return Err(BadReason::NameTooLong);
    }
    Ok(())
}

/// A keyspace the partition does not use yet must fit under the limit.
fn check_new_keyspace(id: &KeyspaceId, usage: &Usage, s: &StateSettings) -> Result<(), BadReason> {
    if !usage.uses(id) && usage.keyspaces.len() >= s.max_keyspaces_per_partition as usize {
        return Err(BadReason::TooManyKeyspaces);
    }
    Ok(())
}

fn check_new_holders(n: usize, usage: &Usage, s: &StateSettings) -> Result<(), BadReason> {
    if usage.holders + n as u64 > u64::from(s.max_holders_per_partition) {
        return Err(BadReason::TooManyHolders);
    }
    Ok(())
}
