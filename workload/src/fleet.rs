//! Per-worker LRU block caches that emit engine-style KV events.

use prefixlog_ids::BlockHashes;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// A KV event as an engine would publish it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Stored { worker: u32, parent_ext: Option<u64>, blocks: Vec<BlockHashes> },
    Removed { worker: u32, exts: Vec<u64> },
}

/// One worker's cache: ext → last-use stamp, and stamp → ext for LRU order.
#[derive(Default)]
struct WorkerCache {
    stamp_of: FxHashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

/// A fleet of LRU caches. Eviction order follows vLLM: a request's blocks are released tail
/// first, so a chain's last block is evicted before its parent and a parent is never evicted
/// while a child it prefixes is still cached.
pub struct Fleet {
    workers: Vec<WorkerCache>,
    capacity: usize,
    clock: u64,
}

impl Fleet {
    pub fn new(workers: usize, capacity_blocks: usize) -> Self {
        Self {
            workers: (0..workers).map(|_| WorkerCache::default()).collect(),
            capacity: capacity_blocks.max(1),
            clock: 0,
        }
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// True when the fleet has no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Whether the worker's cache holds the block `ext`.
    pub fn holds(&self, worker: u32, ext: u64) -> bool {
        self.workers[worker as usize].stamp_of.contains_key(&ext)
    }

    /// How many leading blocks of `chain` the worker holds (the prefix it would reuse).
    pub fn cached_prefix(&self, worker: u32, chain: &[BlockHashes]) -> usize {
        let w = &self.workers[worker as usize];
        chain.iter().take_while(|b| w.stamp_of.contains_key(&b.ext)).count()
    }

    /// Serves `chain` on `worker`: reuses the cached prefix, evicts LRU blocks to make room,
    /// stores the rest. Returns the events in publish order (removals first). Chains longer
    /// than the capacity are truncated to it, as an engine would refuse to cache past its pool.
    pub fn serve(&mut self, worker: u32, chain: &[BlockHashes]) -> Vec<Event> {
        let chain = &chain[..chain.len().min(self.capacity)];
        let hit = self.cached_prefix(worker, chain);
        let cap = self.capacity;
        let w = &mut self.workers[worker as usize];
        // Touch tail-first so that, within this request, the head is the most recent.
        let n = chain.len() as u64;
        let base = self.clock;
        self.clock += n;
        for (i, BlockHashes { ext: e, .. }) in chain[..hit].iter().enumerate() {
            let s = base + (n - 1 - i as u64);
            if let Some(old) = w.stamp_of.insert(*e, s) {
                w.by_stamp.remove(&old);
            }
            w.by_stamp.insert(s, *e);
        }
        let mut events = Vec::new();
        let need = chain.len() - hit;
        let over = (w.stamp_of.len() + need).saturating_sub(cap);
        if over > 0 {
            let mut exts = Vec::with_capacity(over);
            for _ in 0..over {
                let (s, e) = w.by_stamp.pop_first().expect("cache holds blocks");
                debug_assert!(s < base, "evicting a block of the current request");
                w.stamp_of.remove(&e);
                exts.push(e);
            }
            events.push(Event::Removed { worker, exts });
        }
        if need > 0 {
            for (i, BlockHashes { ext: e, .. }) in chain.iter().enumerate().skip(hit) {
                let s = base + (n - 1 - i as u64);
                w.stamp_of.insert(*e, s);
                w.by_stamp.insert(s, *e);
            }
            events.push(Event::Stored {
                worker,
                parent_ext: hit.checked_sub(1).map(|p| chain[p].ext),
                blocks: chain[hit..].to_vec(),
            });
        }
        events
    }
}
