//! The engine: every keyspace of a replica, each in a [`KeyspaceCell`].
//!
//! Locking: one `parking_lot::RwLock` per keyspace copy. With one copy (the default) a write
//! holds the write lock for at most `max_blocks_per_lock` blocks, after growing what those need
//! under the upgradable read lock (`crate::trie::grow_ahead`: queries read on meanwhile), and
//! releases it with `unlock_fair`, which hands the lock to queued readers (a plain unlock lets a
//! busy writer re-acquire before a parked reader wakes, measured as 60 µs median waits during
//! catch-up). With [`Engine::keep_query_copies`] each keyspace has two copies and queries never
//! wait on a write ([`crate::keyspace_cell`]); growth then happens in place, in the copy queries
//! are not reading. Queries of different keyspaces never contend. The keyspace map itself is only write-locked
//! when a keyspace is created, installed or freed.
//!
//! A keyspace exists exactly while it has holders: writes that create no holder (removals and
//! clears of holders that do not exist, refused stores) create no keyspace, and the write
//! methods here free a keyspace whose last holder went ([`Engine::release_if_empty`]). So
//! whether a keyspace exists is a function of the holders, whatever order partitions' records
//! are applied in. A query of a freed keyspace finds none, as for one never written.

use crate::keyspace::store_check::check_store;
use crate::keyspace::{Keyspace, PlaceOutcome};
use crate::keyspace_cell::KeyspaceCell;
use crate::types::{
    ApplyError, BlockHashes, EngineConfig, HolderKey, HolderMatch, KeyspaceId, LogTime, MatchOptions, Tier,
};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub type SharedKeyspace = Arc<KeyspaceCell>;

pub struct Engine {
    cfg: EngineConfig,
    keyspaces: RwLock<BTreeMap<KeyspaceId, SharedKeyspace>>,
    /// Every keyspace has two copies ([`Engine::keep_query_copies`]).
    paired: AtomicBool,
    /// Writes addressed to a keyspace that does not exist and that created nothing.
    without_keyspace: AtomicU64,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        Self {
            cfg,
            keyspaces: RwLock::new(BTreeMap::new()),
            paired: AtomicBool::new(false),
            without_keyspace: AtomicU64::new(0),
        }
    }

    /// From now on every keyspace keeps two copies, so queries never wait on a write, at twice
    /// the engine's memory and write work (`crate::keyspace_cell`). Not a state setting: the copies are
    /// identical, and answers, digests and checkpoints do not change. Call it before the
    /// engine is shared: keyspaces handed out earlier keep their single copy.
    pub fn keep_query_copies(&self) {
        self.paired.store(true, Ordering::Release);
        let mut map = self.keyspaces.write();
        for (id, cell) in std::mem::take(&mut *map) {
            map.insert(id, Arc::new(KeyspaceCell::into_paired(cell)));
        }
    }

    /// Whether keyspaces keep two copies ([`Self::keep_query_copies`]).
    pub fn keeps_query_copies(&self) -> bool {
        self.paired.load(Ordering::Acquire)
    }

    fn cell(&self, ks: Keyspace) -> SharedKeyspace {
        Arc::new(if self.keeps_query_copies() { KeyspaceCell::paired(ks) } else { KeyspaceCell::single(ks) })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The keyspace, if any write has created it.
    pub fn keyspace(&self, id: &KeyspaceId) -> Option<SharedKeyspace> {
        self.keyspaces.read().get(id).cloned()
    }

    /// The keyspace, created empty on first use. A keyspace left without holders must be freed
    /// with [`Self::release_if_empty`] (the write methods below do it).
    pub fn keyspace_or_create(&self, id: &KeyspaceId) -> SharedKeyspace {
        if let Some(k) = self.keyspace(id) {
            return k;
        }
        self.keyspaces
            .write()
            .entry(id.clone())
            .or_insert_with(|| self.cell(Keyspace::new(id.clone(), self.cfg.clone())))
            .clone()
    }

    /// Stores `blocks` under `parent_ext`, in chunks of `max_blocks_per_lock` (each chunk
    /// extends the previous one), releasing the write lock between chunks. Readers may observe
    /// a prefix of the chain in between: an undercount, never an overcount.
    ///
    /// The whole list is checked first ([`ApplyError::InvalidStore`]): a repeat between two
    /// chunks refuses the store before any chunk is applied.
    ///
    /// A store that creates no holder (refused, or under a parent in a keyspace that does not
    /// exist) creates no keyspace either.
    pub fn store(
        &self,
        id: &KeyspaceId,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[BlockHashes],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        let checked = check_store(parent_ext, blocks, &mut Vec::new());
        let existing = self.keyspace(id);
        if existing.is_none() && (checked.is_err() || parent_ext.is_some()) {
            self.without_keyspace.fetch_add(1, Ordering::Relaxed);
            return Err(match (checked, parent_ext) {
                (Err(reason), _) => ApplyError::InvalidStore { holder: key, reason },
                (Ok(()), p) => ApplyError::MissingParent { holder: key, parent_ext: p.expect("a parent") },
            });
        }
        let ks = existing.unwrap_or_else(|| self.keyspace_or_create(id));
        if let Err(reason) = checked {
            return Err(ks.write(|k| k.refuse_store(key, reason)));
        }
        let mut parent = parent_ext;
        let mut added = 0;
        let chunk = self.cfg.max_blocks_per_lock.max(1);
        if blocks.is_empty() {
            return ks.write(|k| k.store_checked(key, parent, blocks, t));
        }
        for c in blocks.chunks(chunk) {
            let r = ks.write_grown_ahead(|k| k.store_checked(key, parent, c, t));
            added += r?;
            parent = c.last().map(|b| b.ext);
        }
        Ok(added)
    }

    /// Removes blocks by ext, in chunks of `max_blocks_per_lock`. Returns `(removed, unknown)`.
    pub fn remove(&self, id: &KeyspaceId, key: HolderKey, exts: &[u64], t: LogTime) -> (u32, u32) {
        let Some(ks) = self.keyspace(id) else {
            self.without_keyspace.fetch_add(1, Ordering::Relaxed);
            return (0, exts.len() as u32);
        };
        let (mut removed, mut unknown) = (0, 0);
        for c in exts.chunks(self.cfg.max_blocks_per_lock.max(1)) {
            let (r, u) = ks.write(|k| k.remove(key, c, t));
            removed += r;
            unknown += u;
        }
        (removed, unknown)
    }

    /// Drops every block of the holder and resynchronises it (its engine cleared its cache):
    /// [`Keyspace::clear`] then clears its gap flag. Returns the blocks dropped.
    pub fn clear(&self, id: &KeyspaceId, key: HolderKey, t: LogTime) -> u32 {
        let Some(ks) = self.keyspace(id) else {
            self.without_keyspace.fetch_add(1, Ordering::Relaxed);
            return 0;
        };
        ks.write(|k| {
            let n = k.clear(key, t);
            k.set_gapped(key, false);
            n
        })
    }

    /// [`Self::clear`] on every tier of `key`'s slot (worker, dp rank, lane), under one lock:
    /// an engine's reset or restart empties whatever it had offloaded too, as far as the index
    /// can know. Returns the blocks dropped.
    pub fn clear_slot(&self, id: &KeyspaceId, key: HolderKey, t: LogTime) -> u32 {
        let Some(ks) = self.keyspace(id) else {
            self.without_keyspace.fetch_add(1, Ordering::Relaxed);
            return 0;
        };
        ks.write(|k| {
            let mut n = 0;
            for tier in Tier::ALL {
                n += k.clear(key.on(tier), t);
                k.set_gapped(key.on(tier), false);
            }
            n
        })
    }

    /// [`Keyspace::place`]; an empty placement creates no keyspace, and a keyspace left without
    /// holders is freed.
    pub fn place(&self, id: &KeyspaceId, key: HolderKey, locals: &[u64], t: LogTime) -> PlaceOutcome {
        let ks = match self.keyspace(id) {
            Some(ks) => ks,
            None if locals.is_empty() => return PlaceOutcome::Placed { added: 0 },
            None => self.keyspace_or_create(id),
        };
        let (out, empty) = ks.write(|k| (k.place(key, locals, t), k.holder_count() == 0));
        if empty {
            self.release_if_empty(id);
        }
        out
    }

    /// [`Keyspace::drop_worker`], freeing the keyspace if no holder is left.
    pub fn drop_worker(&self, id: &KeyspaceId, worker: u64) -> u32 {
        let Some(ks) = self.keyspace(id) else { return 0 };
        let (n, empty) = ks.write(|k| (k.drop_worker(worker), k.holder_count() == 0));
        if empty {
            self.release_if_empty(id);
        }
        n
    }

    /// [`Keyspace::expire`] for partition `group`, freeing the keyspace if no holder is left.
    /// Takes the write lock only when some holder is due.
    pub fn expire(&self, id: &KeyspaceId, now: LogTime, group: u32) -> u64 {
        let Some(ks) = self.keyspace(id) else { return 0 };
        if !ks.read().expiry_due(now, group) {
            return 0;
        }
        let (n, empty) = ks.write(|k| (k.expire(now, group), k.holder_count() == 0));
        if empty {
            self.release_if_empty(id);
        }
        n
    }

    /// Frees the keyspace if it has no holders. Returns whether it did. Queries that already
    /// hold it read on from their copy; later ones find no keyspace. Takes the keyspace map's
    /// write lock: the write methods call it only when their write left no holder.
    pub fn release_if_empty(&self, id: &KeyspaceId) -> bool {
        let mut map = self.keyspaces.write();
        let empty = map.get(id).is_some_and(|k| k.read().holder_count() == 0);
        if empty {
            map.remove(id);
        }
        empty
    }

    /// Frees every keyspace without holders (a state restored from an older build, which
    /// created keyspaces for removals and clears). Returns how many.
    pub fn release_empty(&self) -> usize {
        let mut map = self.keyspaces.write();
        let before = map.len();
        map.retain(|_, k| k.read().holder_count() > 0);
        before - map.len()
    }

    /// Removals, clears and refused stores addressed to a keyspace that did not exist, since
    /// this engine was created: no-ops that created nothing. Not applied state (a count of this
    /// process's work, like a metric).
    pub fn writes_without_keyspace(&self) -> u64 {
        self.without_keyspace.load(Ordering::Relaxed)
    }

    /// Installs a rebuilt keyspace, replacing any existing one.
    pub fn install(&self, ks: Keyspace) {
        let id = ks.id().clone();
        self.keyspaces.write().insert(id, self.cell(ks));
    }

    /// Keyspace ids in order.
    pub fn keyspace_ids(&self) -> Vec<KeyspaceId> {
        self.keyspaces.read().keys().cloned().collect()
    }

    /// All keyspaces in id order.
    pub fn keyspaces(&self) -> Vec<SharedKeyspace> {
        self.keyspaces.read().values().cloned().collect()
    }

    /// Matches in one keyspace; `None` when the keyspace does not exist.
    pub fn match_chain(
        &self,
        id: &KeyspaceId,
        locals: &[u64],
        opts: &MatchOptions,
    ) -> Option<Vec<HolderMatch>> {
        let ks = self.keyspace(id)?;
        let guard = ks.read();
        Some(guard.match_chain(locals, opts))
    }

    /// Digest of every keyspace's holders of partition `p`, combined in keyspace order.
    pub fn partition_digest(&self, p: u32) -> u64 {
        let map = self.keyspaces.read();
        combine(map.iter().map(|(id, ks)| (id, ks.read().partition_digest(p))))
    }

    /// [`Self::partition_digest`] over only the keyspaces `ids` (ascending): the same value when
    /// they include every keyspace where partition `p` has holders, at the cost of those alone.
    pub fn partition_digest_of<'a>(&self, p: u32, ids: impl IntoIterator<Item = &'a KeyspaceId>) -> u64 {
        let map = self.keyspaces.read();
        combine(ids.into_iter().filter_map(|id| Some((id, map.get(id)?.read().partition_digest(p)))))
    }

    /// Digest of the whole engine.
    pub fn digest(&self) -> u64 {
        combine(self.keyspaces.read().iter().map(|(id, ks)| (id, ks.read().digest())))
    }

    /// Resident (holder, block) pairs over all keyspaces.
    pub fn holder_blocks(&self) -> u64 {
        self.keyspaces.read().values().map(|k| k.read().holder_blocks()).sum()
    }
}

/// Keyspace digests combined in keyspace order; keyspaces that digest to 0 count for nothing.
fn combine<'a>(digests: impl Iterator<Item = (&'a KeyspaceId, u64)>) -> u64 {
    digests
        .filter(|&(_, kd)| kd != 0)
        .fold(0u64, |d, (id, kd)| crate::digest::mix64(d ^ keyspace_salt(id)).wrapping_add(kd))
}

fn keyspace_salt(id: &KeyspaceId) -> u64 {
    let mut h = crate::digest::mix64(u64::from(id.block_size) << 32 | u64::from(id.scheme));
    for chunk in id.model.as_bytes().chunks(8) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        h = crate::digest::mix64(h ^ u64::from_le_bytes(b));
    }
    h
}
