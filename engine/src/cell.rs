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

use crate::ahead::{GrownAhead, Replaced};
use crate::keyspace::Keyspace;
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockUpgradableReadGuard, RwLockWriteGuard};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};

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
        self.copies.len() == 2
    }

    /// The state as of the last write made visible. With two copies this never waits on a
    /// write: the writer locks only the copy readers have been sent away from.
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
        let first = write(&mut self.copies[back].write());
        self.front.store(back, Ordering::Release);
        // Waits for the queries still reading the old front; new ones read the new front.
        let second = write(&mut self.copies[front].write());
        assert_eq!(first, second, "the two copies of keyspace {} diverged", self.copies[front].read().id());
        first
    }

    /// [`Self::write`] for a store chunk. With one copy, what the write will need to grow is
    /// built first under the upgradable read lock, while queries read on (`crate::ahead`),
    /// and the write lock only swaps it in. With two copies queries do not read the copy being
    /// written, so it grows in place.
    pub fn write_grown_ahead<R: PartialEq + Debug>(&self, write: impl FnMut(&mut Keyspace) -> R) -> R {
        if self.is_paired() {
            return self.write(write);
        }
        let g = self.copies[0].upgradable_read();
        let grown: GrownAhead = g.trie.grow_ahead();
        let mut g = RwLockUpgradableReadGuard::upgrade(g);
        let replaced: Replaced = g.trie.install(grown);
        let mut write = write;
        let r = write(&mut g);
        RwLockWriteGuard::unlock_fair(g);
        drop(replaced); // the old arrays are freed outside the lock
        r
    }

    /// Every copy, for checks: with two, they must be identical. May wait on a write.
    pub fn copies(&self) -> impl Iterator<Item = RwLockReadGuard<'_, Keyspace>> {
        self.copies.iter().map(|c| c.read())
    }

    /// The same keyspace with two copies (a clone of this one's state).
    pub(crate) fn to_paired(&self) -> Self {
        Self::paired(self.read().clone())
    }
}
