//! One keyspace behind its lock, or behind two: [`KeyspaceCell`].
//!
//! With one copy (the default) a write takes the keyspace's write lock per chunk, so a query
//! may wait for one chunk, and for longer whenever the writer loses its CPU while it holds the
//! lock (on a small or virtual machine that is most of the long waits). With two copies
//! (`Engine::keep_query_copies`, `serve --query-copy`) queries never wait on a write: the writer
//! applies each write to the copy queries are not reading, makes that copy the one they read,
//! and then applies the same write to the other. Both copies receive the same writes in the
//! same order, so they stay identical (writes are deterministic); the cost is twice the
//! engine's memory and twice its write work, paid by the ingest thread, not by queries.

use crate::keyspace::Keyspace;
use crate::trie::grow_ahead::{GrownAhead, Replaced};
use crate::types::KeyspaceStats;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockUpgradableReadGuard, RwLockWriteGuard};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A keyspace with one copy or two (see the module doc). Readers get a read guard of the copy
/// queries read; writers pass a closure that is applied to every copy.
pub struct KeyspaceCell {
    copies: Box<[RwLock<Keyspace>]>,
    /// The copy readers take (always 0 with one copy).
    front: AtomicUsize,
    /// With two copies, one write at a time: the two applications of a write must not
    /// interleave with another write's.
    writer: Mutex<()>,
}

impl KeyspaceCell {
    /// One copy: writes and queries share its lock.
    pub fn single(ks: Keyspace) -> Self {
        Self::from_copies(vec![ks])
    }

    /// Two identical copies: queries never wait on a write.
    pub fn paired(ks: Keyspace) -> Self {
        let copy = ks.clone();
        Self::from_copies(vec![ks, copy])
    }

    fn from_copies(copies: Vec<Keyspace>) -> Self {
        Self {
            copies: copies.into_iter().map(RwLock::new).collect(),
            front: AtomicUsize::new(0),
            writer: Mutex::new(()),
        }
    }

    /// Whether queries read a copy that writes never lock while they read it.
    pub fn is_paired(&self) -> bool {
        self.copy_count() == 2
    }

    /// How many copies of the keyspace this cell keeps in memory (1 or 2).
    pub fn copy_count(&self) -> usize {
        self.copies.len()
    }

    /// The state as of the last write made visible. With two copies this never waits on a
    /// write: the writer only locks a copy after pointing readers at the other one (a reader
    /// that looked at `front` just before may still take the copy the writer wants next; then
    /// the writer waits for it, not the other way round).
    pub fn read(&self) -> RwLockReadGuard<'_, Keyspace> {
        if !self.is_paired() {
            return self.copies[0].read();
        }
        loop {
            // A failed try means the writer took this copy after the reader looked at `front`;
            // `front` then already names the other one.
            if let Some(g) = self.copies[self.front.load(Ordering::Acquire)].try_read() {
                return g;
            }
            std::hint::spin_loop();
        }
    }

    /// Applies `write` to every copy, in the same order for every write, and returns its result
    /// (the same from each copy: writes are deterministic).
    ///
    /// # Panics
    /// If the two copies disagree afterwards (result, digest, holder-blocks or counters): a bug,
    /// and queries would flip between two states. The replica's ingest thread turns the panic
    /// into "not ready" (`ReplicaStatus::ingest_failure`).
    pub fn write<R: PartialEq + Debug>(&self, mut write: impl FnMut(&mut Keyspace) -> R) -> R {
        if !self.is_paired() {
            let mut g = self.copies[0].write();
            let r = write(&mut g);
            RwLockWriteGuard::unlock_fair(g);
            return r;
        }
        let _one_writer = self.writer.lock();
        let front = self.front.load(Ordering::Acquire);
        let back = 1 - front;
        let first = {
            let mut g = self.copies[back].write();
            let r = write(&mut g);
            (r, Outline::of(&g))
        };
        self.front.store(back, Ordering::Release);
        // Waits for the queries still reading the old front; new ones read the new front.
        let second = {
            let mut g = self.copies[front].write();
            let r = write(&mut g);
            (r, Outline::of(&g))
        };
        assert_eq!(first, second, "the two copies of keyspace {} diverged", self.copies[front].read().id());
        first.0
    }

    /// [`Self::write`] for a store chunk. With one copy, what the write will need to grow is
    /// built first under the upgradable read lock, while queries read on
    /// (`crate::trie::grow_ahead`), and the write lock only swaps it in. With two copies queries
    /// do not read the copy being written, so it grows in place.
    pub fn write_grown_ahead<R: PartialEq + Debug>(&self, mut write: impl FnMut(&mut Keyspace) -> R) -> R {
        if self.is_paired() {
            return self.write(write);
        }
        let g = self.copies[0].upgradable_read();
        let grown: GrownAhead = g.trie.grow_ahead();
        let mut g = RwLockUpgradableReadGuard::upgrade(g);
        let replaced: Replaced = g.trie.install(grown);
        let r = write(&mut g);
        RwLockWriteGuard::unlock_fair(g);
        drop(replaced); // the old arrays are freed outside the lock
        r
    }

    /// Every copy, for checks: with two, they must be identical. Waits for a write in progress,
    /// so both are taken between the same two writes.
    pub fn copies(&self) -> Vec<RwLockReadGuard<'_, Keyspace>> {
        let _no_writer = self.writer.lock();
        self.copies.iter().map(|c| c.read()).collect()
    }

    /// Tests only: changes the copy queries are not reading, and only it, to plant a divergence
    /// (`None` with one copy).
    #[cfg(any(test, feature = "testing"))]
    pub fn write_back_copy_for_test<R>(&self, write: impl FnOnce(&mut Keyspace) -> R) -> Option<R> {
        if !self.is_paired() {
            return None;
        }
        let _one_writer = self.writer.lock();
        let back = 1 - self.front.load(Ordering::Acquire);
        Some(write(&mut self.copies[back].write()))
    }

    /// The same keyspace with two copies. Takes the state over without a clone when nothing
    /// else holds `cell` (at start, as `Engine::keep_query_copies` is meant to be called), so
    /// the pair costs one clone, not two.
    pub(crate) fn into_paired(cell: Arc<Self>) -> Self {
        match Arc::try_unwrap(cell) {
            Ok(c) if c.is_paired() => c,
            Ok(c) => {
                let first = c.copies.into_vec().swap_remove(0).into_inner();
                Self::paired(first)
            }
            Err(shared) => Self::paired(shared.read().clone()),
        }
    }
}

/// What both copies must agree on after every write, besides its result: fields the keyspace
/// keeps up to date anyway, so comparing them costs nothing.
#[derive(Debug, PartialEq)]
struct Outline {
    digest: u64,
    holder_blocks: u64,
    stats: KeyspaceStats,
}

impl Outline {
    fn of(ks: &Keyspace) -> Self {
        Self { digest: ks.digest(), holder_blocks: ks.holder_blocks(), stats: ks.stats().clone() }
    }
}
