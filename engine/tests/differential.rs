//! Seeded differential test: random operation streams through the engine and the reference
//! model; every answer, digest, counter and holder summary must agree after every step, and
//! `Keyspace::check_invariants` must hold after every step. Every 37 steps the engine is
//! replaced by `rebuild(dump())`, and in between once by `read_image(write_image())`, so both
//! restores are checked for identical answers *and* identical future behaviour (eviction,
//! expiry).
//!
//! A stream is generated up front as data (`common::ops::Step`: one write plus the queries
//! checked after it), so a failing seed is shrunk (delta debugging) to a minimal list of
//! steps, printed as Rust to paste into `replay_minimal_failure` below.
//!
//! `PREFIXLOG_DIFF_SEEDS=N` runs N seeds (default 1500); `PREFIXLOG_DIFF_SEED=S` runs one.

mod common;

use common::ops::{apply_engine, apply_model, keyspace, to_rust, Op, Step};
use common::shrink::{shrink, shrink_within};
use common::RefModel;
use prefixlog_engine::digest::mix64;
use prefixlog_engine::{
    partition_of, BlockHashes, Engine, EngineConfig, HolderKey, Keyspace, KeyspaceId, MatchOptions,
    PlaceOutcome, Tier,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};

const PARTITIONS: u32 = 3;
const WORKERS: u64 = 5;
/// Block locals are drawn from `1..LOCALS`: few, so chains share prefixes.
const LOCALS: u64 = 5;

fn cfg() -> EngineConfig {
    EngineConfig {
        holder_capacity: 24,
        inferred_capacity: 10,
        placement_ttl_ms: 400,
        partitions: PARTITIONS,
        stamp_limit: 6,
        max_blocks_per_lock: 32,
    }
}

/// Long chains: stores and placements of hundreds of blocks, longer than the engine's
/// longest run, with capacities that keep them.
fn long_cfg() -> EngineConfig {
    EngineConfig { holder_capacity: 3000, inferred_capacity: 2000, ..cfg() }
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

/// Chooses operations from the model's state, so most name blocks that are held.
struct Gen {
    rng: ChaCha8Rng,
    t: u64,
    /// Sometimes write hundreds of blocks at once, and remove stretches tail-first.
    long: bool,
    /// Holders on every storage tier (half of them off the GPU), and queries that order,
    /// restrict and weigh tiers.
    tiers: bool,
    /// Worker ids drawn from `0..workers` ([`WORKERS`] but in the crowded test).
    workers: u64,
    /// Block locals drawn from `1..locals` ([`LOCALS`] but in the crowded test).
    locals: u64,
}

impl Gen {
    fn key(&mut self) -> HolderKey {
        let key = HolderKey::new(
            self.rng.random_range(0..self.workers),
            self.rng.random_range(0..2),
            self.rng.random_range(0..2),
        );
        if self.tiers && self.rng.random_bool(0.5) {
            key.on(Tier::ALL[self.rng.random_range(1..4)])
        } else {
            key
        }
    }

    /// A preference order over some tiers (empty: all), and sometimes weights.
    fn tier_options(&mut self) -> (Vec<Tier>, Option<[u32; 4]>) {
        if !self.tiers {
            return (Vec::new(), None);
        }
        let mut order = Vec::new();
        if self.rng.random_bool(0.6) {
            let mut all = Tier::ALL.to_vec();
            while !all.is_empty() && (order.is_empty() || self.rng.random_bool(0.6)) {
                order.push(all.remove(self.rng.random_range(0..all.len())));
            }
        }
        let weights =
            self.rng.random_bool(0.4).then(|| std::array::from_fn(|_| self.rng.random_range(0..1001)));
        (order, weights)
    }

    fn local(&mut self) -> u64 {
        self.rng.random_range(1..self.locals)
    }

    /// A random held path of the holder, if it holds any.
    fn held(&mut self, model: &RefModel, key: &HolderKey) -> Option<Vec<u64>> {
        let n = model.held_count(key);
        (n > 0).then(|| model.held_nth(key, self.rng.random_range(0..n)))
    }

    /// How many blocks a write adds: a few, or in long mode sometimes hundreds.
    fn extension(&mut self, short: u32) -> u32 {
        if self.long && self.rng.random_bool(0.25) {
            self.rng.random_range(100..1100)
        } else {
            self.rng.random_range(0..short)
        }
    }

    fn chain(&mut self, model: &RefModel) -> Vec<u64> {
        // Mostly a prefix of something some holder holds, extended randomly.
        let mut c = Vec::new();
        if self.rng.random_bool(0.7) {
            let k = self.key();
            c = self.held(model, &k).unwrap_or_default();
        }
        for _ in 0..self.extension(4) {
            c.push(self.local());
        }
        c
    }

    fn options(&mut self) -> MatchOptions {
        let candidates = self.rng.random_bool(0.2).then(|| {
            // Any order, duplicates allowed (the engine sorts unsorted lists).
            (0..self.rng.random_range(0..4)).map(|_| self.rng.random_range(0..self.workers + 1)).collect()
        });
        let (tiers, tier_weights) = self.tier_options();
        MatchOptions {
            intervals: self.rng.random_bool(0.5),
            top_k: self.rng.random_bool(0.2).then(|| self.rng.random_range(1..4)),
            lane: self.rng.random_bool(0.2).then(|| self.rng.random_range(0..2)),
            candidates,
            exclude_gapped: self.rng.random_bool(0.2),
            tiers,
            tier_weights,
        }
    }

    fn store(&mut self, model: &RefModel, key: HolderKey, t: u64) -> Op {
        let r = self.rng.random_range(0..10);
        let held = if r < 3 { None } else { self.held(model, &key) };
        let (parent, mut path) = match held {
            None => (None, Vec::new()),
            Some(p) if r < 9 => (Some(ext_of(&key, &p)), p),
            Some(_) => (Some(self.rng.random::<u64>()), vec![99]),
        };
        let mut blocks = Vec::new();
        for _ in 0..self.extension(5) {
            path.push(self.local());
            blocks.push(BlockHashes::new(ext_of(&key, &path), *path.last().unwrap()));
        }
        // Sometimes not a chain: an ext named twice, or the parent named again.
        if !blocks.is_empty() && self.rng.random_bool(0.06) {
            let i = self.rng.random_range(0..blocks.len());
            match parent {
                Some(p) if self.rng.random_bool(0.5) => blocks[i].ext = p,
                _ => blocks.push(BlockHashes::new(blocks[i].ext, self.local())),
            }
        }
        Op::Store { key, parent, blocks, t }
    }

    fn remove(&mut self, model: &RefModel, key: HolderKey, t: u64) -> Op {
        let mut exts = Vec::new();
        if self.long && self.rng.random_bool(0.5) {
            // An engine's eviction: a stretch of one chain, tail first.
            if let Some(p) = self.held(model, &key) {
                let k = self.rng.random_range(1..=p.len().min(60));
                exts.extend((p.len() + 1 - k..=p.len()).rev().map(|n| ext_of(&key, &p[..n])));
            }
        }
        for _ in 0..self.rng.random_range(1..4) {
            match self.held(model, &key) {
                Some(p) if self.rng.random_bool(0.85) => exts.push(ext_of(&key, &p)),
                _ => exts.push(self.rng.random()),
            }
        }
        Op::Remove { key, exts, t }
    }

    fn op(&mut self, model: &RefModel, step: usize) -> Op {
        if step % 37 == 36 {
            return Op::Rebuild;
        }
        if step % 37 == 18 {
            return Op::Image;
        }
        self.t += self.rng.random_range(0..60);
        let (t, key) = (self.t, self.key());
        match self.rng.random_range(0..100) {
            0..=39 => self.store(model, key, t),
            40..=59 => self.remove(model, key, t),
            60..=62 => Op::Clear { key, t },
            63..=64 => Op::DropWorker { worker: key.worker },
            65..=89 => Op::Place { key, locals: self.chain(model), t },
            90..=97 => Op::Expire { t, partition: self.rng.random_range(0..PARTITIONS) },
            98 => Op::SetPartitionGapped { partition: self.rng.random_range(0..PARTITIONS) },
            _ => Op::SetGapped { key, gapped: false },
        }
    }
}

/// A seed's stream: the model is run alongside so operations and queries name held blocks.
fn generate(seed: u64, steps: usize) -> Vec<Step> {
    generate_with(seed, steps, false)
}

fn generate_with(seed: u64, steps: usize, long: bool) -> Vec<Step> {
    generate_gen(
        Gen {
            rng: ChaCha8Rng::seed_from_u64(seed),
            t: 1000,
            long,
            tiers: false,
            workers: WORKERS,
            locals: LOCALS,
        },
        steps,
    )
}

fn generate_gen(mut g: Gen, steps: usize) -> Vec<Step> {
    let long = g.long;
    let mut model = RefModel::new(if long { long_cfg() } else { cfg() });
    (0..steps)
        .map(|i| {
            let op = g.op(&model, i);
            apply_model(&mut model, &op);
            let queries = (0..4).map(|_| (g.chain(&model), g.options())).collect();
            Step { op, queries }
        })
        .collect()
}

macro_rules! ensure_eq {
    ($a:expr, $b:expr, $($what:tt)+) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{}: engine {:?}, model {:?}", format!($($what)+), a, b));
        }
    }};
}

/// Everything observable agrees, and the engine's own invariants hold.
fn compare(ks: &Keyspace, model: &RefModel, queries: &[(Vec<u64>, MatchOptions)]) -> Result<(), String> {
    ks.check_invariants().map_err(|e| format!("invariant: {e}"))?;
    ensure_eq!(ks.digest(), model.digest(), "digest");
    for p in 0..PARTITIONS {
        ensure_eq!(ks.partition_digest(p), model.partition_digest(p), "partition {p} digest");
    }
    ensure_eq!(ks.holder_blocks(), model.holder_blocks(), "holder blocks");
    ensure_eq!(ks.stats(), &model.stats, "stats");
    let summaries = ks.holder_summaries();
    ensure_eq!(summaries.len(), model.holders.len(), "holder count");
    for (s, (k, h)) in summaries.iter().zip(model.holders.iter()) {
        ensure_eq!(s.key, *k, "holder keys");
        let model_summary = (h.blocks.len() as u32, h.fed, h.gapped, h.last_time, h.digest());
        ensure_eq!((s.blocks, s.fed, s.gapped, s.last_time, s.digest), model_summary, "holder {k}");
    }
    for (q, opts) in queries {
        ensure_eq!(ks.match_chain(q, opts), model.match_chain(q, opts), "match {q:?} {opts:?}");
    }
    Ok(())
}

/// A hook run on the engine after each step's write: plants faults for the shrinker's test.
type Fault<'a> = &'a dyn Fn(&mut Keyspace, &Op);

/// Runs the steps through a fresh engine and model; the first disagreement, invariant
/// violation or panic is the error, prefixed with its step number.
fn run(steps: &[Step], fault: Option<Fault>) -> Result<(), String> {
    run_with(steps, fault, &cfg())
}

fn run_with(steps: &[Step], fault: Option<Fault>, cfg: &EngineConfig) -> Result<(), String> {
    let cfg = cfg.clone();
    let mut ks = keyspace(&cfg);
    let mut model = RefModel::new(cfg.clone());
    // A scrub in small steps between the writes, as a running replica's: its cursor spans
    // writes, and no consistent state may ever fail a step.
    let mut scrub = prefixlog_engine::ScrubCursor::default();
    for (i, step) in steps.iter().enumerate() {
        let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
            let want = apply_model(&mut model, &step.op);
            ensure_eq!(apply_engine(&mut ks, &cfg, &step.op)?, want, "verdict of {:?}", step.op);
            if let Some(f) = fault {
                f(&mut ks, &step.op);
            }
            compare(&ks, &model, &step.queries)?;
            for _ in 0..2 {
                ks.scrub_step(&mut scrub, 7).map_err(|e| format!("scrub: {e}"))?;
            }
            Ok(())
        }));
        let outcome = outcome.unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            Err(format!("panic: {}", msg.unwrap_or_default()))
        });
        outcome.map_err(|e| format!("step {i} ({:?}): {e}", step.op))?;
    }
    Ok(())
}

/// The smallest step list (and queries) that still fails, as [`run`] with `fault` judges.
fn minimal_failure(steps: Vec<Step>, fault: Option<Fault>) -> Vec<Step> {
    let fails = |s: &[Step]| run(s, fault).is_err();
    let steps = shrink(steps, fails);
    shrink_within(steps, |s: &mut Step| &mut s.queries, fails)
}

fn run_seed(seed: u64, steps: usize) {
    let stream = generate(seed, steps);
    if let Err(e) = run(&stream, None) {
        let min = minimal_failure(stream, None);
        let again = run(&min, None).expect_err("the shrunk stream fails");
        panic!(
            "seed {seed}: {e}\n\nshrunk to {} steps, failing with: {again}\n\
             paste into replay_minimal_failure (engine/tests/differential.rs):\n{}",
            min.len(),
            to_rust(&min)
        );
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

/// Holders on every tier: a slot's answer combines its tiers (the engine's tier path), the
/// tiers' holdings stay independent (a removal or clear of one tier leaves the others), and
/// queries that order, restrict and weigh tiers agree with the model's position-by-position
/// definition; digests, images and rebuilds carry the tier.
#[test]
fn tiered_holders_match_reference_model() {
    let seeds: u64 =
        std::env::var("PREFIXLOG_DIFF_TIER_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    for seed in 0..seeds {
        let g = Gen {
            rng: ChaCha8Rng::seed_from_u64(70_000 + seed),
            t: 1000,
            long: false,
            tiers: true,
            workers: WORKERS,
            locals: LOCALS,
        };
        let stream = generate_gen(g, 250);
        if let Err(e) = run(&stream, None) {
            let fails = |s: &[Step]| run(s, None).is_err();
            let min = shrink_within(shrink(stream, fails), |s: &mut Step| &mut s.queries, fails);
            panic!("tier seed {seed}: {e}\n\nshrunk to {} steps:\n{}", min.len(), to_rust(&min));
        }
    }
}

/// Crowded runs: 64 workers × 2 dp ranks × 2 lanes over two block locals, so the first
/// blocks are held by more than 64 holders at once and the engine finds a holder among a
/// run's members by key (`Keyspace::member_pos`) rather than by a scan: stores that restamp,
/// removals from the middle of a long list, splits that copy it; with tiers too (a holder
/// key's last field). Fails if no lookup took the keyed path.
#[test]
fn crowded_runs_match_reference_model() {
    let seeds: u64 =
        std::env::var("PREFIXLOG_DIFF_CROWD_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let before = prefixlog_engine::testing::keyed_member_lookups();
    for seed in 0..seeds {
        let tiers = seed % 2 == 1;
        let g = Gen {
            rng: ChaCha8Rng::seed_from_u64(90_000 + seed),
            t: 1000,
            long: false,
            tiers,
            workers: 64,
            locals: 3,
        };
        let stream = generate_gen(g, 2500);
        if let Err(e) = run(&stream, None) {
            let fails = |s: &[Step]| run(s, None).is_err();
            let min = shrink_within(shrink(stream, fails), |s: &mut Step| &mut s.queries, fails);
            panic!("crowded seed {seed}: {e}\n\nshrunk to {} steps:\n{}", min.len(), to_rust(&min));
        }
    }
    let keyed = prefixlog_engine::testing::keyed_member_lookups() - before;
    assert!(keyed >= 100, "only {keyed} member lookups searched a list of more than 64 by key");
}

/// Long chains (stores and placements of hundreds of blocks, tail-first stretch removals):
/// writes cross the engine's longest run, removals take its fast path and its splits.
#[test]
fn long_chains_match_reference_model() {
    // Runs of at most 97 blocks (any limit gives the same answers): these stores cross many.
    prefixlog_engine::testing::set_max_run_for_test(97);
    let seeds: u64 =
        std::env::var("PREFIXLOG_DIFF_LONG_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
    for seed in 0..seeds {
        let stream = generate_with(50_000 + seed, 90, true);
        if let Err(e) = run_with(&stream, None, &long_cfg()) {
            let fails = |s: &[Step]| run_with(s, None, &long_cfg()).is_err();
            let min = shrink_within(shrink(stream, fails), |s: &mut Step| &mut s.queries, fails);
            panic!("long seed {seed}: {e}\n\nshrunk to {} steps:\n{}", min.len(), to_rust(&min));
        }
    }
}

/// The two-copy keyspace (`serve --query-copy`): every step goes through
/// `KeyspaceCell::write`, which applies it to both copies and checks that both gave the same
/// verdict; after every step both copies must dump identically, hold their invariants, and the
/// copy queries read must agree with the model.
#[test]
fn paired_copies_stay_identical_and_match_the_model() {
    let seeds: u64 =
        std::env::var("PREFIXLOG_DIFF_PAIRED_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let cfg = cfg();
    for seed in 0..seeds {
        let cell = prefixlog_engine::KeyspaceCell::paired(keyspace(&cfg));
        let mut model = RefModel::new(cfg.clone());
        for (i, step) in generate(seed, 250).iter().enumerate() {
            let want = apply_model(&mut model, &step.op);
            let got = cell.write(|k| apply_engine(k, &cfg, &step.op));
            assert_eq!(got, Ok(want), "seed {seed} step {i} ({:?}): verdict", step.op);
            let copies = cell.copies();
            assert_eq!(copies.len(), 2);
            assert!(
                copies[0].dump() == copies[1].dump(),
                "seed {seed} step {i} ({:?}): the copies differ",
                step.op
            );
            for (c, copy) in copies.iter().enumerate() {
                copy.check_invariants().unwrap_or_else(|e| panic!("seed {seed} step {i}: copy {c}: {e}"));
            }
            drop(copies);
            if let Err(e) = compare(&cell.read(), &model, &step.queries) {
                panic!("seed {seed} step {i} ({:?}): {e}", step.op);
            }
        }
    }
}

/// Paste a shrunk failure printed by [`run_seed`] here to replay it under a debugger.
#[test]
fn replay_minimal_failure() {
    let steps: Vec<Step> = vec![];
    run(&steps, None).unwrap();
}

/// The shrinker on a planted fault: after any removal by worker 1, the engine silently loses
/// one of worker 1's blocks. Long random streams that hit it shrink to a few steps (a store
/// and the removal), and the shrunk list still fails the same way.
#[test]
fn shrinker_reduces_a_planted_failure() {
    let plant = |ks: &mut Keyspace, op: &Op| {
        if let Op::Remove { key, .. } = op {
            if key.worker == 1 {
                ks.corrupt_for_test(key);
            }
        }
    };
    let mut shrunk = 0;
    for seed in 0..40 {
        let stream = generate(seed, 120);
        if run(&stream, Some(&plant)).is_ok() {
            continue;
        }
        let min = minimal_failure(stream.clone(), Some(&plant));
        assert!(run(&min, Some(&plant)).is_err(), "seed {seed}: the shrunk list fails");
        assert!(run(&min, None).is_ok(), "seed {seed}: without the fault it passes");
        assert!(min.len() <= 3, "seed {seed}: shrunk to {} steps:\n{}", min.len(), to_rust(&min));
        assert!(min.iter().all(|s| s.queries.is_empty()), "queries are not needed to see a digest mismatch");
        shrunk += 1;
    }
    assert!(shrunk >= 10, "the planted fault fired in {shrunk} of 40 streams");
}

/// `KeyspaceDump::retain_partitions`: for each partition, the filtered rebuild digests like
/// the original and keeps doing so (and answering alike for that partition's workers) under
/// the same further operations.
#[test]
fn partition_filtered_dump_rebuilds_and_evolves_like_the_original() {
    let cfg = cfg();
    for seed in 0..200u64 {
        let stream = generate(10_000 + seed, 240);
        let (head, tail) = stream.split_at(120);
        let mut full = keyspace(&cfg);
        for s in head {
            apply_engine(&mut full, &cfg, &s.op).unwrap();
        }
        let dump = full.dump();
        for p in 0..PARTITIONS {
            let workers: Vec<u64> = (0..WORKERS).filter(|&w| partition_of(w, PARTITIONS) == p).collect();
            let filtered = dump.retain_partitions(|q| q == p, PARTITIONS);
            let mut part = Keyspace::rebuild(&filtered, cfg.clone()).expect("a filtered dump rebuilds");
            assert_eq!(part.dump(), filtered, "seed {seed} p {p}: canonical numbering");
            let mut full = Keyspace::rebuild(&dump, cfg.clone()).unwrap();
            for (i, s) in tail.iter().enumerate() {
                let ctx = format!("seed {seed} partition {p} step {i}");
                part.check_invariants().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(part.partition_digest(p), full.partition_digest(p), "{ctx}");
                for (q, o) in &s.queries {
                    let o = MatchOptions { candidates: Some(workers.clone()), ..o.clone() };
                    assert_eq!(part.match_chain(q, &o), full.match_chain(q, &o), "{ctx}: {q:?} {o:?}");
                }
                apply_engine(&mut part, &cfg, &s.op).unwrap();
                apply_engine(&mut full, &cfg, &s.op).unwrap();
            }
            assert_eq!(part.partition_digest(p), full.partition_digest(p), "seed {seed} p {p}: end");
        }
    }
}

/// An op through the [`prefixlog_engine::Engine`]'s own write methods, on keyspace `id`, with
/// the verdicts of [`apply_model`]. Rebuilds and images replace the keyspace, if it exists.
fn apply_through_engine(e: &Engine, id: &KeyspaceId, cfg: &EngineConfig, op: &Op) -> Option<bool> {
    match op {
        Op::Store { key, parent, blocks, t } => return Some(e.store(id, *key, *parent, blocks, *t).is_ok()),
        Op::Remove { key, exts, t } => drop(e.remove(id, *key, exts, *t)),
        Op::Clear { key, t } => drop(e.clear(id, *key, *t)),
        Op::DropWorker { worker } => drop(e.drop_worker(id, *worker)),
        Op::Place { key, locals, t } => {
            return Some(e.place(id, *key, locals, *t) != PlaceOutcome::IgnoredFed)
        }
        Op::Expire { t, partition } => drop(e.expire(id, *t, *partition)),
        Op::SetGapped { .. } | Op::SetPartitionGapped { .. } => {
            if let Some(ks) = e.keyspace(id) {
                ks.write(|k| apply_engine(k, cfg, op)).expect("gap flags apply");
            }
        }
        Op::Rebuild | Op::Image => {
            if let Some(ks) = e.keyspace(id) {
                let mut k = ks.read().clone();
                apply_engine(&mut k, cfg, op).expect("the keyspace restores");
                e.install(k);
            }
        }
    }
    None
}

/// The engine over three keyspaces, each step's write sent to one of them: a keyspace exists
/// exactly while its model has holders (removals, clears, refused stores and empty placements
/// of a keyspace that does not exist create none; the departure of the last holder, by
/// `WorkerRemoved`, expiry or a placement that evicted itself, frees it), every existing
/// keyspace agrees with its model and holds its invariants after every step, and a query of a
/// keyspace that does not exist (any more) finds none.
#[test]
fn keyspaces_exist_exactly_while_they_have_holders() {
    let cfg = cfg();
    let ids: Vec<KeyspaceId> = (0..3).map(|i| KeyspaceId::new(format!("m{i}"), 16, 1)).collect();
    let seeds: u64 =
        std::env::var("PREFIXLOG_DIFF_ENGINE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    let (mut freed, mut not_created) = (0, 0);
    for seed in 0..seeds {
        let engine = Engine::new(cfg.clone());
        let mut models: Vec<RefModel> = ids.iter().map(|_| RefModel::new(cfg.clone())).collect();
        let mut pick = ChaCha8Rng::seed_from_u64(seed ^ 0x6b73);
        for (i, mut step) in generate(20_000 + seed, 250).into_iter().enumerate() {
            let k = pick.random_range(0..ids.len());
            if pick.random_bool(0.1) {
                // Workers leave more often than in the single-keyspace streams: keyspaces empty.
                step.op = Op::DropWorker { worker: pick.random_range(0..WORKERS) };
            }
            let ctx = format!("seed {seed} step {i} keyspace {k} ({:?})", step.op);
            let existed = !models[k].holders.is_empty();
            if !existed {
                // A keyspace that comes into existence starts its counters at zero.
                models[k] = RefModel::new(cfg.clone());
            }
            let want = apply_model(&mut models[k], &step.op);
            if let Op::Clear { key, .. } = &step.op {
                models[k].set_gapped(*key, false); // `Engine::clear` resynchronises the holder
            }
            let got = apply_through_engine(&engine, &ids[k], &cfg, &step.op);
            assert_eq!(got, want, "{ctx}: verdict");
            let live: Vec<KeyspaceId> = ids
                .iter()
                .zip(&models)
                .filter(|(_, m)| !m.holders.is_empty())
                .map(|(id, _)| id.clone())
                .collect();
            assert_eq!(engine.keyspace_ids(), live, "{ctx}: keyspaces");
            freed += usize::from(existed && models[k].holders.is_empty());
            not_created += usize::from(!existed && models[k].holders.is_empty());
            for (id, m) in ids.iter().zip(&models) {
                match engine.keyspace(id) {
                    Some(ks) => {
                        compare(&ks.read(), m, &step.queries).unwrap_or_else(|e| panic!("{ctx}: {id}: {e}"))
                    }
                    None => {
                        for (q, o) in &step.queries {
                            assert_eq!(engine.match_chain(id, q, o), None, "{ctx}: {id} answers");
                        }
                    }
                }
            }
        }
    }
    assert!(freed >= 50 && not_created >= 500, "freed {freed}, not created {not_created}: exercised");
}

/// Engines that name different blocks with one ext, or one block with several (random exts
/// from a small set): the engine keeps one ext per block and holder, the latest, and its
/// invariants (the override maps stay inverse) hold throughout. Before the fix, a rebound ext
/// left a stale entry behind (`rebinding_an_ext_never_strands_a_block` in traps.rs shows the
/// overcount that caused).
#[test]
fn reused_exts_keep_the_override_maps_inverse() {
    for seed in 0..1500u64 {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let cfg = EngineConfig { partitions: 1, ..cfg() };
        let mut k = keyspace(&cfg);
        let mut ops = Vec::new();
        for step in 0..40 {
            let key = HolderKey::new(r.random_range(0..2), 0, r.random_range(0..2));
            let op = match r.random_range(0..10) {
                0..=5 => Op::Store {
                    key,
                    parent: r.random_bool(0.2).then(|| r.random_range(0..30)),
                    blocks: (0..r.random_range(1..4))
                        .map(|_| BlockHashes::new(r.random_range(0..30), r.random_range(0..4)))
                        .collect(),
                    t: 1,
                },
                6..=8 => Op::Remove { key, exts: vec![r.random_range(0..30)], t: 1 },
                _ => Op::Clear { key, t: 1 },
            };
            apply_engine(&mut k, &cfg, &op).unwrap();
            ops.push(Step { op, queries: vec![] });
            if let Err(e) = k.check_invariants() {
                panic!("seed {seed} step {step}: {e}\n{}", to_rust(&ops));
            }
        }
    }
}
