//! The routing policy every mode shares (shared index, gateway-local tree, oracle): route to
//! the worker with the best matched depth minus a cost for its recent load (a simplified form
//! of what KV-aware routers do); ties go to the lowest id. Only the source of the depths
//! differs between modes.

use prefixlog_engine::{EngineConfig, HolderKey, Keyspace, KeyspaceId, MatchOptions};
use prefixlog_workload::{BlockHashes, Fleet};

/// Recent load per worker: requests routed to it, decayed by `DECAY` per request routed
/// anywhere (a stand-in for the queue-depth metric real routers scrape from workers).
pub struct Load {
    v: Vec<f64>,
}

const DECAY: f64 = 0.98;

impl Load {
    pub fn new(workers: usize) -> Self {
        Self { v: vec![0.0; workers] }
    }

    pub fn routed(&mut self, w: u32) {
        for x in &mut self.v {
            *x *= DECAY;
        }
        self.v[w as usize] += 1.0;
    }

    /// The worker with the best `depth - LOAD_COST × load` (ties: the lowest id), where a
    /// worker missing from `depths` (worker, depth) has depth 0. Pure deepest-match would send
    /// every new conversation to the few workers that hold the shared system-prompt blocks.
    pub fn choose(&self, depths: &[(u32, u32)]) -> u32 {
        let mut d = vec![0u32; self.v.len()];
        for &(w, k) in depths {
            if let Some(x) = d.get_mut(w as usize) {
                *x = k;
            }
        }
        let score = |w: usize| f64::from(d[w]) - LOAD_COST * self.v[w];
        (0..self.v.len()).max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a))).unwrap_or(0) as u32
    }
}

/// Blocks of prefix a unit of recent load is worth (one unit = one recent request).
const LOAD_COST: f64 = 16.0;

/// The oracle's depths: what every worker's cache really holds right now.
pub fn oracle_depths(fleet: &Fleet, chain: &[BlockHashes]) -> Vec<(u32, u32)> {
    (0..fleet.len() as u32).map(|w| (w, fleet.cached_prefix(w, chain) as u32)).collect()
}

/// A gateway's own guess: a prefix tree fed only with the gateway's own routing decisions
/// (an engine keyspace of placements, bounded per worker at the worker's cache size).
pub struct LocalTree {
    ks: Keyspace,
}

impl LocalTree {
    pub fn new(capacity_blocks: usize) -> Self {
        let cfg = EngineConfig {
            inferred_capacity: capacity_blocks as u32,
            // Evicted by capacity (LRU of placements), not by age.
            placement_ttl_ms: u64::MAX / 4,
            ..Default::default()
        };
        Self { ks: Keyspace::new(KeyspaceId::new("local", 64, 1), cfg) }
    }

    pub fn depths(&self, locals: &[u64]) -> Vec<(u32, u32)> {
        self.ks
            .match_chain(locals, &MatchOptions::default())
            .into_iter()
            .map(|m| (m.holder.worker as u32, m.depth))
            .collect()
    }

    pub fn routed(&mut self, worker: u32, locals: &[u64], t_ms: u64) {
        self.ks.place(HolderKey::new(u64::from(worker), 0, 0), locals, t_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepest_then_least_loaded() {
        let mut l = Load::new(4);
        l.routed(0);
        l.routed(1);
        assert_eq!(l.choose(&[]), 2);
        assert_eq!(l.choose(&[(1, 30), (3, 2)]), 1);
        assert_eq!(l.choose(&[(0, 30), (1, 30)]), 0); // 0 decayed more
        assert_eq!(l.choose(&[(1, 3)]), 2); // a shallow match does not beat an idle worker
        let mut t = LocalTree::new(100);
        t.routed(2, &[1, 2, 3], 5);
        assert_eq!(t.depths(&[1, 2, 9]), vec![(2, 2)]);
    }
}
