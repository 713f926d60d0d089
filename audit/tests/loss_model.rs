//! `judge_range` against a reference model on seeded random logs: every placement judged by
//! rebuilding, for each partition, a fresh state of that partition's records before the offset
//! the placement is judged at there (its token's offset; its own offset on its own partition;
//! as of its log time elsewhere) and matching the prompt against every holder. The judge
//! applies each partition once and asks only for the best holders where the chosen worker
//! cannot be; both must give the same decisions, ties (more than the top-k walk returns),
//! tiers, two keyspaces, removals and stale tokens included.

use prefixlog_audit::{judge_range, Decision, LossOptions, Placed, Point, Tally};
use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_state::memory_log::MemoryLog;
use prefixlog_state::record::{encode_kv_events, encode_lifecycle, encode_placement_with_policy};
use prefixlog_state::{Applier, BlockHashes, KvOp, Lifecycle, NextOffset, StateSettings, Tier};

const PARTITIONS: u32 = 3;

/// Two models, so that placements of several keyspaces are judged side by side.
fn ks(model: u64) -> KeyspaceId {
    KeyspaceId::new(if model == 0 { "m" } else { "n" }, 16, 1)
}

/// splitmix64: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A prompt from a small tree of chains, so that workers share prefixes and tie often.
fn prompt(rng: &mut Rng) -> Vec<u64> {
    let branch = rng.below(3);
    let len = 1 + rng.below(6);
    (0..len).map(|i| if i < 2 { i + 1 } else { 10 * branch + i }).collect()
}

/// A random log: `workers` workers storing, removing blocks, leaving; placements with tokens
/// taken from the log's ends a little while back (stale ones included) or none.
fn random_log(seed: u64, workers: u64, tiered: bool) -> MemoryLog {
    let mut rng = Rng(seed);
    let log = MemoryLog::new(PARTITIONS, StateSettings::default());
    let mut seq = vec![0u64; workers as usize + 1];
    let mut ends_seen: Vec<Vec<i64>> = vec![log.ends()];
    for t in 0..400u64 {
        let w = 1 + rng.below(workers);
        let time = 1_000 + t * 10;
        match rng.below(10) {
            0..=5 => {
                seq[w as usize] += 1;
                let tier = if tiered && rng.below(6) == 0 { Tier::Host } else { Tier::Gpu };
                let locals = prompt(&mut rng);
                let blocks = locals.iter().map(|&l| BlockHashes::from((w * 1_000 + l, l))).collect();
                let op = KvOp::Stored { tier, lane: 0, parent_ext: None, blocks };
                let model = u64::from(rng.below(4) == 0);
                log.push(w, time, encode_kv_events(&ks(model), w, 0, 1, seq[w as usize], false, &[op]));
            }
            6 if rng.below(4) == 0 => {
                log.push(w, time, encode_lifecycle(w, &Lifecycle::Removed));
            }
            _ => {
                let back = rng.below(ends_seen.len().min(8) as u64) as usize;
                let ends = &ends_seen[ends_seen.len() - 1 - back];
                let token: Vec<NextOffset> = if rng.below(5) == 0 {
                    vec![]
                } else {
                    ends.iter().enumerate().map(|(p, &o)| NextOffset::new(p as u32, o)).collect()
                };
                let holder = HolderKey::new(w, 0, 0);
                let model = u64::from(rng.below(4) == 0);
                let value =
                    encode_placement_with_policy(&ks(model), holder, &prompt(&mut rng), &token, "gw", "p");
                log.push(w, time, value);
            }
        }
        ends_seen.push(log.ends());
    }
    log
}

/// The reference: partition `q` rebuilt from nothing up to (not including) its `upto`-th
/// record, for every partition, each matched with every holder.
fn reference(records: &[Vec<(i64, u64, Vec<u8>)>], pl: &Placed) -> Decision {
    let mut tally = Tally::default();
    for (q, recs) in records.iter().enumerate() {
        let q = q as u32;
        let upto = match pl.answered_on(q) {
            Some(o) => recs.partition_point(|r| r.0 < o),
            None if q == pl.partition => recs.partition_point(|r| r.0 < pl.offset),
            // The first record stamped after the placement's log time, log times being in
            // order here.
            None => recs.partition_point(|r| r.1 <= pl.log_time),
        };
        let mut state = Applier::new(PARTITIONS, StateSettings::default());
        for (offset, time, value) in &recs[..upto] {
            state.apply(q, *offset, *time, Some(value)).expect("applied");
        }
        tally.add(pl.holder, &pl.matches(&state));
    }
    let since = pl.answered_on(pl.partition).map_or(0, |o| (pl.offset - o).max(0));
    pl.clone().decide(tally, since)
}

fn check(seed: u64, workers: u64, tiered: bool) {
    let log = random_log(seed, workers, tiered);
    let records: Vec<Vec<(i64, u64, Vec<u8>)>> = (0..PARTITIONS).map(|p| log.records_of(p)).collect();
    let start = Point::Offsets((0..PARTITIONS).map(|p| NextOffset::new(p, 0)).collect());
    let report =
        judge_range(None, &log, &start, &Point::Offsets(vec![]), &LossOptions::default()).expect("judged");
    let mut placed = Vec::new();
    for (q, recs) in records.iter().enumerate() {
        for (offset, time, value) in recs {
            placed.extend(Placed::of_record(PARTITIONS, q as u32, *offset, *time, Some(value)));
        }
    }
    assert!(placed.len() > 50, "seed {seed}: only {} placements", placed.len());
    assert_eq!(report.decisions.len(), placed.len(), "seed {seed}");
    let mut ties_past_top_k = 0;
    for d in &report.decisions {
        let pl = placed.iter().find(|p| p.partition == d.partition && p.offset == d.offset).expect("placed");
        let want = reference(&records, pl);
        assert_eq!(d, &want, "seed {seed}, placement at {}:{}", d.partition, d.offset);
        ties_past_top_k += usize::from(d.best_workers.len() > 8);
        assert_eq!(partition_of(d.worker, PARTITIONS), d.partition);
    }
    if !tiered && workers >= 48 {
        assert!(ties_past_top_k > 0, "seed {seed}: no decision had more ties than the top-k walk returns");
    }
}

#[test]
fn judge_equals_a_fresh_replay_per_placement_gpu_only() {
    for seed in 1..=6 {
        check(seed, 48, false);
    }
}

#[test]
fn judge_equals_a_fresh_replay_per_placement_with_tiers() {
    for seed in 11..=18 {
        check(seed, 10 + seed % 4 * 20, true);
    }
}

#[test]
fn judge_equals_a_fresh_replay_per_placement_few_workers() {
    for seed in 21..=24 {
        check(seed, 5, false);
    }
}
