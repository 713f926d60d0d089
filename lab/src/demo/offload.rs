//! The demo's host tier (`--host-capacity`): each simulated worker offloads the blocks its GPU
//! cache evicts to a host-memory LRU of its own, as vLLM's CPU offload does, and a request
//! served there reloads its host hits into the GPU (the GPU cache stores them again; the host
//! copies stay). Host stores are published on the `host` tier before the GPU removal that
//! caused them (the copy is made while the block is still on the GPU), host evictions as
//! removals on the `host` tier.

use prefixlog_state::{BlockHashes, KvOp, Tier};
use prefixlog_workload::{Event, Fleet};
use std::collections::{BTreeMap, HashMap};

/// What a routed request found on a worker: its matched prefix split by tier (GPU first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierHit {
    pub gpu: u32,
    pub host: u32,
}

impl TierHit {
    /// The hit weighed by tier cost in thousandths, as the gateways ask: a GPU block 1000, a
    /// host block `host_weight` (a host hit saves most of a prefill, but loading it back costs).
    pub fn weighted(self, host_weight: u32) -> u64 {
        u64::from(self.gpu) * u64::from(GPU_WEIGHT) + u64::from(self.host) * u64::from(host_weight)
    }
}

/// A GPU block's weight (per mille): the unit the others are measured in.
pub const GPU_WEIGHT: u32 = 1000;

/// One worker's host LRU: ext → last-use stamp, and stamp → ext.
#[derive(Default)]
struct Lru {
    stamp_of: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
}

pub struct HostTier {
    caches: Vec<Lru>,
    capacity: usize,
    /// ext → (local, parent ext) of every block seen stored on a GPU: what a host store names.
    known: HashMap<u64, (u64, Option<u64>)>,
    clock: u64,
}

impl HostTier {
    /// `capacity` blocks per worker; 0: no host tier.
    pub fn new(workers: usize, capacity: usize) -> Self {
        Self {
            caches: (0..workers).map(|_| Lru::default()).collect(),
            capacity,
            known: HashMap::new(),
            clock: 0,
        }
    }

    pub fn holds(&self, worker: u32, ext: u64) -> bool {
        self.caches[worker as usize].stamp_of.contains_key(&ext)
    }

    /// The contiguous prefix of `chain` the worker holds on its GPU or its host, each position
    /// credited to the GPU when both hold it.
    pub fn hit(&self, gpu: &Fleet, worker: u32, chain: &[BlockHashes]) -> TierHit {
        let mut h = TierHit::default();
        for &BlockHashes { ext, .. } in chain {
            if gpu.holds(worker, ext) {
                h.gpu += 1;
            } else if self.holds(worker, ext) {
                h.host += 1;
            } else {
                break;
            }
        }
        h
    }

    /// Serves `chain` on `worker`: the GPU cache's events, with the offloads they cause, as
    /// KV ops in publish order.
    pub fn serve(&mut self, gpu: &mut Fleet, worker: u32, chain: &[BlockHashes]) -> Vec<KvOp> {
        self.touch(worker, chain);
        let mut ops = Vec::new();
        let events = gpu.serve(worker, chain);
        for ev in events {
            match ev {
                Event::Stored { parent_ext, blocks, .. } => {
                    let parents = std::iter::once(parent_ext).chain(blocks.iter().map(|b| Some(b.ext)));
                    for (&BlockHashes { ext, local }, parent) in blocks.iter().zip(parents) {
                        self.known.insert(ext, (local, parent));
                    }
                    ops.push(KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext, blocks });
                }
                Event::Removed { exts, .. } => {
                    if self.capacity > 0 {
                        self.offload(gpu, worker, &exts, &mut ops);
                    }
                    ops.push(KvOp::Removed { tier: Tier::Gpu, lane: 0, exts });
                }
            }
        }
        ops
    }

    /// Refreshes the host copies of the request's blocks (a host hit is a use).
    fn touch(&mut self, worker: u32, chain: &[BlockHashes]) {
        let c = &mut self.caches[worker as usize];
        for &BlockHashes { ext, .. } in chain.iter().rev() {
            if let Some(old) = c.stamp_of.get_mut(&ext) {
                c.by_stamp.remove(old);
                self.clock += 1;
                *old = self.clock;
                c.by_stamp.insert(self.clock, ext);
            }
        }
    }

    /// Copies the GPU's evicted blocks to the host (parents first, consecutive blocks of one
    /// chain in one store), evicting the host's least recently used blocks past its capacity.
    /// A block whose parent is on neither tier is not copied: its store would name a parent
    /// the worker does not hold (a gap, to a replica).
    fn offload(&mut self, gpu: &Fleet, worker: u32, evicted: &[u64], ops: &mut Vec<KvOp>) {
        let mut stores: Vec<KvOp> = Vec::new();
        // The GPU evicts tail first: reversed, each block comes after its parent.
        for &ext in evicted.iter().rev() {
            let c = &mut self.caches[worker as usize];
            if c.stamp_of.contains_key(&ext) {
                continue;
            }
            let Some(&(local, parent)) = self.known.get(&ext) else { continue };
            if parent.is_some_and(|p| !gpu.holds(worker, p) && !c.stamp_of.contains_key(&p)) {
                continue;
            }
            self.clock += 1;
            c.stamp_of.insert(ext, self.clock);
            c.by_stamp.insert(self.clock, ext);
            match stores.last_mut() {
                Some(KvOp::Stored { blocks, .. }) if blocks.last().map(|b| Some(b.ext)) == Some(parent) => {
                    blocks.push(BlockHashes { ext, local });
                }
                _ => stores.push(KvOp::Stored {
                    tier: Tier::Host,
                    lane: 0,
                    parent_ext: parent,
                    blocks: vec![BlockHashes { ext, local }],
                }),
            }
        }
        ops.extend(stores);
        let c = &mut self.caches[worker as usize];
        let over = c.stamp_of.len().saturating_sub(self.capacity);
        if over > 0 {
            let mut exts = Vec::with_capacity(over);
            for _ in 0..over {
                let (_, e) = c.by_stamp.pop_first().expect("the host cache holds blocks");
                c.stamp_of.remove(&e);
                exts.push(e);
            }
            ops.push(KvOp::Removed { tier: Tier::Host, lane: 0, exts });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_engine::{HolderKey, Keyspace, KeyspaceId, MatchOptions};

    fn chain(base: u64, n: u64) -> Vec<BlockHashes> {
        (0..n).map(|i| BlockHashes::new(base + i, 1000 + base + i)).collect()
    }

    /// The ops a worker publishes, applied to an engine keyspace, give the engine the same
    /// combined hit, split the same way, as the simulation's own caches.
    fn engine_hit(ks: &Keyspace, c: &[BlockHashes]) -> TierHit {
        let locals: Vec<u64> = c.iter().map(|b| b.local).collect();
        let m = ks.match_chain(&locals, &MatchOptions::default());
        let Some(m) = m.first() else { return TierHit::default() };
        if m.runs().is_empty() {
            return TierHit { gpu: m.depth, host: 0 }; // every holder on the GPU
        }
        let mut h = TierHit::default();
        for r in m.runs() {
            match r.tier {
                Tier::Gpu => h.gpu += r.blocks,
                Tier::Host => h.host += r.blocks,
                t => panic!("no {t} tier in the demo"),
            }
        }
        h
    }

    fn apply(ks: &mut Keyspace, ops: &[KvOp], t: u64) {
        for op in ops {
            match op {
                KvOp::Stored { tier, parent_ext, blocks, .. } => {
                    ks.store(HolderKey::new(0, 0, 0).on(*tier), *parent_ext, blocks, t)
                        .expect("a chain the worker holds");
                }
                KvOp::Removed { tier, exts, .. } => {
                    ks.remove(HolderKey::new(0, 0, 0).on(*tier), exts, t);
                }
                KvOp::Cleared { .. } => unreachable!(),
            }
        }
    }

    #[test]
    fn evicted_blocks_are_offloaded_and_the_published_ops_say_so() {
        let (mut gpu, mut host) = (Fleet::new(1, 4), HostTier::new(1, 6));
        let mut ks = Keyspace::new(KeyspaceId::new("m", 16, 1), Default::default());
        let (a, b, c) = (chain(10, 4), chain(20, 4), chain(30, 4));
        let mut t = 1;
        for ch in [&a, &b, &c, &a, &b] {
            t += 1;
            let ops = host.serve(&mut gpu, 0, ch);
            apply(&mut ks, &ops, t);
            for x in [&a, &b, &c] {
                assert_eq!(engine_hit(&ks, x), host.hit(&gpu, 0, x), "after serving {:?}", ch[0]);
            }
        }
        // a and b were evicted to the host (6 blocks room: a's went when c's came), b is back on
        // the GPU; a is on the host only as far as its copies survived.
        assert_eq!(host.hit(&gpu, 0, &b), TierHit { gpu: 4, host: 0 });
        assert!(host.hit(&gpu, 0, &c).host > 0, "c was offloaded when b came back");
    }
}
