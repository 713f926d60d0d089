//! The node arena of one keyspace: a trie over local hashes with two lookup tables.
//!
//! Every block position is one node (no path compression: a node's holder set differs from
//! its neighbours' often enough under eviction that splitting runs would cost more than it
//! saves). Nodes live in fixed-size chunks with a free list; children are found through one
//! keyspace-wide table keyed by `(parent, local)` and ext hashes through another keyed by a
//! node's canonical ext ([`NodeTable`]: the key lives in the node, the table holds its index
//! and 32 hash bits, so a lookup costs one probe plus one node read on a match).
//!
//! No write may stall readers for long, so nothing here ever reallocates the whole state: the
//! arena grows by one chunk at a time and each table is split into 256 shards, so a resize
//! moves 1/256 of the entries.

use crate::digest::{child_path, fold_mul, ROOT_PATH};
use crate::invariants::{ensure as check, InvariantError};
use crate::table::NodeTable;
use smallvec::SmallVec;

pub const ROOT: u32 = 0;
pub const NIL: u32 = u32::MAX;

/// One holder's membership in a node, with the stamp of the operation that last stored it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub holder: u32,
    pub stamp: u32,
}

/// Aligned to the cache line too: a chunk allocation need not start on one, and a node that
/// straddles two lines costs two misses.
#[repr(align(64))]
pub struct Node {
    pub local: u64,
    /// Chained hash of all locals from the root: the node's position-bound identity.
    pub path: u64,
    /// Canonical ext hash (valid when `has_ext`): the first ext a holder stored it under.
    pub ext: u64,
    pub parent: u32,
    /// The first child created (`NIL` if none): chains are walked without a table probe.
    /// Other children are in the edge table; a child is in exactly one of the two places.
    pub first_child: u32,
    /// The child count in the low 30 bits, then the `has_ext` and `live` flags: packed so a
    /// node is one 64-byte cache line (the arena is most of a keyspace's memory).
    bits: u32,
    /// Operation records whose window ends here; a pinned node is never freed.
    pub pins: u32,
    pub members: SmallVec<[Member; 2]>,
}

const _: () = assert!(std::mem::size_of::<Node>() == 64, "a node is one cache line");

const CHILDREN: u32 = (1 << 30) - 1;
const HAS_EXT: u32 = 1 << 30;
const LIVE: u32 = 1 << 31;

impl Node {
    fn new(local: u64, path: u64, parent: u32) -> Self {
        Self { local, path, ext: 0, parent, first_child: NIL, bits: LIVE, pins: 0, members: SmallVec::new() }
    }

    #[inline]
    pub fn children(&self) -> u32 {
        self.bits & CHILDREN
    }

    /// Whether `ext` holds the node's canonical ext.
    #[inline]
    pub fn has_ext(&self) -> bool {
        self.bits & HAS_EXT != 0
    }

    /// False once freed (the slot waits on the free list).
    #[inline]
    pub fn live(&self) -> bool {
        self.bits & LIVE != 0
    }

    pub fn member(&self, holder: u32) -> Option<usize> {
        self.members.iter().position(|m| m.holder == holder)
    }
}

const K_EDGE: u64 = 0x9e37_79b9_7f4a_7c15;
const K_EXT: u64 = 0xd6e8_feb8_6659_fd93;

#[inline]
fn edge_hash(parent: u32, local: u64) -> u64 {
    fold_mul(local ^ (u64::from(parent) << 29), K_EDGE)
}

#[inline]
fn ext_hash(ext: u64) -> u64 {
    fold_mul(ext, K_EXT)
}

const CHUNK_BITS: u32 = 14;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Nodes in chunks of `CHUNK`; a chunk is allocated once at full size and never moves.
#[derive(Default)]
pub struct Nodes {
    chunks: Vec<Vec<Node>>,
    len: usize,
}

impl Nodes {
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, n: Node) {
        if self.len == self.chunks.len() * CHUNK {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut().expect("chunk").push(n);
        self.len += 1;
    }

    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.chunks.iter().flatten()
    }

    fn capacity(&self) -> usize {
        self.chunks.len() * CHUNK
    }
}

impl Nodes {
    /// The node at `i`, if in range.
    pub fn get(&self, i: u32) -> Option<&Node> {
        ((i as usize) < self.len).then(|| &self[i as usize])
    }
}

impl std::ops::Index<usize> for Nodes {
    type Output = Node;
    #[inline]
    fn index(&self, i: usize) -> &Node {
        &self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

impl std::ops::IndexMut<usize> for Nodes {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Node {
        &mut self.chunks[i >> CHUNK_BITS][i & (CHUNK - 1)]
    }
}

pub struct Arena {
    pub nodes: Nodes,
    free: Vec<u32>,
    edges: NodeTable,
    exts: NodeTable,
    live: usize,
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl Arena {
    pub fn new() -> Self {
        let root = Node::new(0, ROOT_PATH, ROOT);
        let mut nodes = Nodes::default();
        nodes.push(root);
        Self { nodes, free: Vec::new(), edges: NodeTable::default(), exts: NodeTable::default(), live: 0 }
    }

    /// Nodes other than the root.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.live
    }

    #[inline]
    pub fn child(&self, parent: u32, local: u64) -> Option<u32> {
        let fc = self.nodes[parent as usize].first_child;
        if fc != NIL && self.nodes[fc as usize].local == local {
            return Some(fc);
        }
        let children = self.nodes[parent as usize].children();
        if children == 0 || (fc != NIL && children == 1) {
            return None;
        }
        let nodes = &self.nodes;
        self.edges.find(edge_hash(parent, local), |i| {
            let n = &nodes[i as usize];
            n.parent == parent && n.local == local
        })
    }

    /// The child of `parent` with `local`, created if absent.
    pub fn child_or_insert(&mut self, parent: u32, local: u64) -> u32 {
        if let Some(c) = self.child(parent, local) {
            return c;
        }
        let node = Node::new(local, child_path(self.nodes[parent as usize].path, local), parent);
        let idx = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let p = &mut self.nodes[parent as usize];
        debug_assert!(p.children() < CHILDREN);
        p.bits += 1;
        if p.first_child == NIL {
            p.first_child = idx;
        } else {
            self.edges.insert(edge_hash(parent, local), idx);
        }
        self.live += 1;
        idx
    }

    /// Makes room for `nodes` more nodes with `exts` canonical exts and `edges` children
    /// beyond their parent's first, so a rebuild does not rehash its tables as they grow.
    pub fn reserve(&mut self, nodes: usize, exts: usize, edges: usize) {
        self.exts.reserve(exts);
        self.edges.reserve(edges);
        self.nodes.chunks.reserve(nodes / CHUNK + 1);
    }

    /// Hints that `ext` will be looked up soon ([`NodeTable::prefetch`]).
    #[inline]
    pub fn prefetch_ext(&self, ext: u64) {
        self.exts.prefetch(ext_hash(ext));
    }

    /// The node whose canonical ext is `ext`.
    #[inline]
    pub fn by_ext(&self, ext: u64) -> Option<u32> {
        let nodes = &self.nodes;
        self.exts.find(ext_hash(ext), |i| nodes[i as usize].ext == ext)
    }

    /// Makes `ext` the canonical ext of `node` if neither already has one. Returns whether
    /// `ext` now resolves to `node` through the shared table.
    pub fn bind_ext(&mut self, node: u32, ext: u64) -> bool {
        let n = &self.nodes[node as usize];
        if n.has_ext() {
            // A bound node is in the table under its own ext, and only under it.
            return n.ext == ext;
        }
        if self.by_ext(ext).is_some() {
            return false;
        }
        // The insert probes the cache line the lookup just read.
        self.exts.insert(ext_hash(ext), node);
        let n = &mut self.nodes[node as usize];
        n.ext = ext;
        n.bits |= HAS_EXT;
        true
    }

    /// Rebuild: an ext table for `(node, ext)` pairs read from a dump, beside the node pass
    /// (on another core); `ext_of` reads a candidate node's ext back from the same dump.
    /// Fails with the first pair whose ext is already taken.
    pub fn ext_table(
        entries: impl Iterator<Item = (u32, u64)>,
        count: usize,
        ext_of: impl Fn(u32) -> Option<u64>,
    ) -> Result<NodeTable, (u32, u64)> {
        let mut t = NodeTable::default();
        t.reserve(count);
        for (node, ext) in entries {
            let h = ext_hash(ext);
            if t.find(h, |k| ext_of(k) == Some(ext)).is_some() {
                return Err((node, ext));
            }
            t.insert(h, node);
        }
        Ok(t)
    }

    /// Rebuild: `ext` becomes `node`'s canonical ext; [`Self::install_exts`] brings the index.
    pub fn set_ext_unindexed(&mut self, node: u32, ext: u64) {
        let n = &mut self.nodes[node as usize];
        n.ext = ext;
        n.bits |= HAS_EXT;
    }

    /// Rebuild: installs the table from [`Self::ext_table`] for the exts set unindexed.
    pub fn install_exts(&mut self, table: NodeTable) {
        self.exts = table;
    }

    /// Frees `node` and then its ancestors while they are unheld, childless and unpinned.
    pub fn release(&mut self, mut node: u32) {
        while node != ROOT {
            let n = &self.nodes[node as usize];
            if !n.members.is_empty() || n.children() > 0 || n.pins > 0 || !n.live() {
                return;
            }
            let (parent, local, has_ext, ext) = (n.parent, n.local, n.has_ext(), n.ext);
            if self.nodes[parent as usize].first_child == node {
                self.nodes[parent as usize].first_child = NIL;
            } else {
                self.edges.remove(edge_hash(parent, local), node);
            }
            if has_ext {
                self.exts.remove(ext_hash(ext), node);
            }
            let n = &mut self.nodes[node as usize];
            n.bits = 0; // neither live nor bound, no children
            n.members = SmallVec::new();
            self.free.push(node);
            self.live -= 1;
            self.nodes[parent as usize].bits -= 1;
            node = parent;
        }
    }

    /// The `len` nodes ending at `leaf`, leaf first.
    pub fn window(&self, leaf: u32, len: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut n = leaf;
        for _ in 0..len {
            if n == ROOT {
                break;
            }
            out.push(n);
            n = self.nodes[n as usize].parent;
        }
    }

    /// Local hashes from the root down to `node`.
    pub fn chain_to(&self, mut node: u32) -> Vec<u64> {
        let mut v = Vec::new();
        while node != ROOT {
            let n = &self.nodes[node as usize];
            v.push(n.local);
            node = n.parent;
        }
        v.reverse();
        v
    }

    /// Structural invariants: liveness and the free list, parent/child links and counts,
    /// and that both lookup tables hold exactly one entry per indexed node.
    pub fn check_structure(&self) -> Result<(), InvariantError> {
        use InvariantError::{Edge, Ext, FreeList, Link};
        let len = self.nodes.len();
        let mut freed = vec![false; len];
        for &f in &self.free {
            let ok = f != ROOT && (f as usize) < len && !self.nodes[f as usize].live() && !freed[f as usize];
            check(ok, || FreeList { node: f, what: "free entry is out of range, live, or listed twice" })?;
            freed[f as usize] = true;
        }
        let mut children = vec![0u32; len];
        let (mut live, mut exts, mut edges) = (0usize, 0usize, 0usize);
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let node = i as u32;
            if !n.live() {
                check(freed[i], || FreeList { node, what: "dead node not on the free list" })?;
                continue;
            }
            live += 1;
            let p = n.parent as usize;
            check(p < len && self.nodes[p].live(), || Link { node, what: "parent is not a live node" })?;
            children[p] += 1;
            check(self.child(n.parent, n.local) == Some(node), || Link {
                node,
                what: "not found as its parent's child",
            })?;
            if self.nodes[p].first_child != node {
                edges += 1;
            }
            if n.has_ext() {
                exts += 1;
                check(self.by_ext(n.ext) == Some(node), || Ext {
                    node,
                    what: "canonical ext does not resolve to it",
                })?;
            }
        }
        check(live == self.live, || Link { node: ROOT, what: "live count differs from the live nodes" })?;
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.live() {
                continue;
            }
            let node = i as u32;
            check(n.children() == children[i], || Link {
                node,
                what: "child count differs from its children",
            })?;
            let fc = n.first_child;
            let fc_ok = fc == NIL
                || ((fc as usize) < len
                    && self.nodes[fc as usize].live()
                    && self.nodes[fc as usize].parent == node);
            check(fc_ok, || Link { node, what: "first child is not a live child" })?;
        }
        let mut ext_entries = 0;
        for (sig, node) in self.exts.entries() {
            ext_entries += 1;
            let n = self.nodes.get(node);
            let ok =
                n.is_some_and(|n| n.live() && n.has_ext() && NodeTable::signature(ext_hash(n.ext)) == sig);
            check(ok, || Ext { node, what: "ext table entry for a dead, unbound or rehashed node" })?;
        }
        check(ext_entries == exts, || Ext {
            node: ROOT,
            what: "ext table size differs from the bound nodes",
        })?;
        let mut edge_entries = 0;
        for (sig, node) in self.edges.entries() {
            edge_entries += 1;
            let ok = self.nodes.get(node).is_some_and(|n| {
                n.live()
                    && self.nodes[n.parent as usize].first_child != node
                    && NodeTable::signature(edge_hash(n.parent, n.local)) == sig
            });
            check(ok, || Edge { node, what: "edge table entry for a dead, first or rehashed child" })?;
        }
        check(edge_entries == edges, || Edge {
            node: ROOT,
            what: "edge table size differs from the non-first children",
        })
    }

    /// Approximate heap bytes (nodes, member spills and tables), for metrics.
    pub fn heap_bytes(&self) -> usize {
        let spilled: usize = self
            .nodes
            .iter()
            .filter(|n| n.members.spilled())
            .map(|n| n.members.capacity() * std::mem::size_of::<Member>())
            .sum();
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * 4
            + self.edges.heap_bytes()
            + self.exts.heap_bytes()
            + spilled
    }
}
