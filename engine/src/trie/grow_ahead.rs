//! Growth ahead of the write lock. A write that needs a bigger table part or a new block chunk
//! would allocate, fault pages in and rehash while holding its keyspace's write lock: 0.1–0.5 ms
//! during which every query on the keyspace waits. [`Trie::grow_ahead`] does that work from a
//! shared borrow (the writer's upgradable read lock: queries read on, no other writer can
//! start) and [`Trie::install`] swaps the results in under the write lock, a few pointer
//! moves. What is grown, and when, depends only on the writes applied, never on timing, so
//! replicas fed the same log still hold identical state.

use crate::trie::blocks::SpareChunk;
use crate::trie::table::{GrownPart, Slot};
use crate::trie::Trie;

/// Built by [`Trie::grow_ahead`] for [`Trie::install`].
pub struct GrownAhead {
    edges: Vec<GrownPart>,
    exts: Vec<GrownPart>,
    chunk: Option<SpareChunk>,
}

/// The arrays [`Trie::install`] replaced: dropped after the write lock is released, because
/// freeing large arrays returns pages to the system (a syscall).
pub struct Replaced {
    _arrays: Vec<Box<[Slot]>>,
    _chunk: Option<SpareChunk>,
}

impl Trie {
    /// Table parts and block storage the next writes are about to need, built without
    /// changing anything. Cheap (two list checks and a comparison) when nothing is needed.
    pub fn grow_ahead(&self) -> GrownAhead {
        GrownAhead {
            edges: self.edges.grow_ahead(),
            exts: self.exts.grow_ahead(),
            chunk: self.blocks.grow_ahead(),
        }
    }

    /// Installs what [`Self::grow_ahead`] built, with no write to the trie in between.
    pub fn install(&mut self, grown: GrownAhead) -> Replaced {
        let mut replaced = self.edges.install(grown.edges);
        replaced.extend(self.exts.install(grown.exts));
        let chunk = grown.chunk.and_then(|c| self.blocks.add_chunk(c));
        Replaced { _arrays: replaced, _chunk: chunk }
    }
}
