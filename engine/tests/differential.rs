//! Seeded differential test: random operation streams through the engine and the reference
//! model; every answer, digest, counter and holder summary must agree after every step.
//! Every 37 steps the engine is replaced by `rebuild(dump())`, so rebuild is checked for
//! identical answers *and* identical future behaviour (eviction, expiry).
//!
//! `PREFIXLOG_DIFF_SEEDS=N` runs N seeds (default 1500); `PREFIXLOG_DIFF_SEED=S` runs one.

mod common;

use common::RefModel;
use prefixlog_engine::digest::mix64;
use prefixlog_engine::{EngineConfig, HolderKey, Keyspace, KeyspaceId, MatchOptions, PlaceOutcome};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn cfg() -> EngineConfig {
    EngineConfig {
        holder_capacity: 24,
        inferred_capacity: 10,
        placement_ttl_ms: 400,
        partitions: 3,
        stamp_limit: 6,
        max_blocks_per_lock: 32,
    }
}

/// Ext namespace of a holder: most share one (engines with a fixed hash seed), workers
/// divisible by 3 have their own (per-process seeds), which exercises ext overrides.
fn ext_of(key: &HolderKey, path: &[u64]) -> u64 {
    let ns = if key.worker.is_multiple_of(3) {
        mix64(key.worker ^ u64::from(key.lane) << 40 ^ u64::from(key.dp_rank) << 20)
    } else {
        7
    };
    path.iter().fold(mix64(ns), |h, &l| mix64(h.rotate_left(13) ^ l))
}

struct Gen {
    rng: ChaCha8Rng,
    t: u64,
}

impl Gen {
    fn key(&mut self) -> HolderKey {
        HolderKey::new(self.rng.random_range(0..5), self.rng.random_range(0..2), self.rng.random_range(0..2))
    }
    fn local(&mut self) -> u64 {
        self.rng.random_range(1..5)
    }
    fn chain(&mut self, model: &RefModel) -> Vec<u64> {
        // Mostly a prefix of something some holder holds, extended randomly.
        let mut c = Vec::new();
        if self.rng.random_bool(0.7) {
            let k = self.key();
            let held = model.held_paths(&k);
            if !held.is_empty() {
                c = held[self.rng.random_range(0..held.len())].clone();
            }
        }
        for _ in 0..self.rng.random_range(0..4) {
            c.push(self.local());
        }
        c
    }
}

fn check(ks: &Keyspace, model: &RefModel, g: &mut Gen, step: usize, seed: u64) {
    let ctx = || format!("seed {seed} step {step}");
    assert_eq!(ks.digest(), model.digest(), "digest, {}", ctx());
    for p in 0..3 {
        assert_eq!(ks.partition_digest(p), model.partition_digest(p), "partition {p} digest, {}", ctx());
    }
    assert_eq!(ks.holder_blocks(), model.holder_blocks(), "holder blocks, {}", ctx());
    assert_eq!(ks.stats(), &model.stats, "stats, {}", ctx());
    let summaries = ks.holder_summaries();
    assert_eq!(summaries.len(), model.holders.len(), "holders, {}", ctx());
    for (s, (k, h)) in summaries.iter().zip(model.holders.iter()) {
        assert_eq!(s.key, *k, "{}", ctx());
        assert_eq!(
            (s.blocks, s.fed, s.gapped, s.last_time),
            (h.blocks.len() as u32, h.fed, h.gapped, h.last_time),
            "holder {k}, {}",
            ctx()
        );
        assert_eq!(s.digest, h.digest(), "holder {k} digest, {}", ctx());
    }
    for _ in 0..4 {
        let q = g.chain(model);
        let opts = MatchOptions {
            intervals: g.rng.random_bool(0.5),
            top_k: g.rng.random_bool(0.2).then(|| g.rng.random_range(1..4)),
            lane: g.rng.random_bool(0.2).then(|| g.rng.random_range(0..2)),
        };
        assert_eq!(
            ks.match_chain(&q, &opts),
            model.match_chain(&q, &opts),
            "match {q:?} {opts:?}, {}",
            ctx()
        );
    }
}

fn run_seed(seed: u64, steps: usize) {
    let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed), t: 1000 };
    let id = KeyspaceId::new("m", 16, 1);
    let mut ks = Keyspace::new(id, cfg());
    let mut model = RefModel::new(cfg());
    for step in 0..steps {
        g.t += g.rng.random_range(0..60);
        let t = g.t;
        let key = g.key();
        match g.rng.random_range(0..100) {
            0..=39 => {
                let held = model.held_paths(&key);
                let r = g.rng.random_range(0..10);
                let (parent, mut path) = if r < 3 || held.is_empty() {
                    (None, Vec::new())
                } else if r < 9 {
                    let p = held[g.rng.random_range(0..held.len())].clone();
                    (Some(ext_of(&key, &p)), p)
                } else {
                    (Some(g.rng.random::<u64>()), vec![99])
                };
                let mut blocks = Vec::new();
                for _ in 0..g.rng.random_range(0..5) {
                    path.push(g.local());
                    blocks.push((ext_of(&key, &path), *path.last().unwrap()));
                }
                let ok_ref = model.store(key, parent, &blocks, t);
                let ok = ks.store(key, parent, &blocks, t).is_ok();
                assert_eq!(ok, ok_ref, "store result, seed {seed} step {step}");
            }
            40..=59 => {
                let held = model.held_paths(&key);
                let mut exts = Vec::new();
                for _ in 0..g.rng.random_range(1..4) {
                    if !held.is_empty() && g.rng.random_bool(0.85) {
                        exts.push(ext_of(&key, &held[g.rng.random_range(0..held.len())]));
                    } else {
                        exts.push(g.rng.random());
                    }
                }
                model.remove(key, &exts, t);
                ks.remove(key, &exts, t);
            }
            60..=62 => {
                model.clear(key, t);
                ks.clear(key, t);
            }
            63..=64 => {
                model.drop_worker(key.worker);
                ks.drop_worker(key.worker);
            }
            65..=89 => {
                let chain = g.chain(&model);
                let placed_ref = model.place(key, &chain, t);
                let placed = ks.place(key, &chain, t) != PlaceOutcome::IgnoredFed;
                assert_eq!(placed, placed_ref, "place result, seed {seed} step {step}");
            }
            _ => {
                model.expire(t);
                ks.expire(t, |_| true);
            }
        }
        if step % 37 == 36 {
            let dump = ks.dump();
            ks = Keyspace::rebuild(&dump, cfg()).expect("own dump rebuilds");
            assert_eq!(ks.dump(), dump, "dump of a rebuild, seed {seed} step {step}");
        }
        check(&ks, &model, &mut g, step, seed);
    }
}

#[test]
fn engine_matches_reference_model() {
    if let Ok(s) = std::env::var("PREFIXLOG_DIFF_SEED") {
        run_seed(s.parse().expect("PREFIXLOG_DIFF_SEED is a number"), 400);
        return;
    }
    let seeds: u64 = std::env::var("PREFIXLOG_DIFF_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1500);
    for seed in 0..seeds {
        run_seed(seed, 250);
    }
}
