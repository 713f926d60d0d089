//! Scrubbing (`Keyspace::scrub_step`): a membership no write made — an overcount that every
//! digest still agrees with — is found within one pass and named by partition; a repair by
//! transplant (`replace_group`) removes it; steps stay within their budget; and the longest
//! read-lock hold of a step on a large keyspace is measured (printed, not asserted: CI
//! machines vary). The differential test (`differential.rs`) runs small steps between all of
//! its writes and never sees a finding on a consistent keyspace.

use prefixlog_engine::{
    partition_of, BlockHashes, EngineConfig, HolderKey, Keyspace, KeyspaceCell, KeyspaceId, MatchOptions,
    ScrubCursor,
};
use std::time::{Duration, Instant};

const P: u32 = 4;

fn cfg() -> EngineConfig {
    EngineConfig { partitions: P, holder_capacity: 1 << 20, ..Default::default() }
}

/// `workers` workers, each storing `chains` chains of `len` blocks that share a prefix with
/// other workers' and, for every other worker, the whole chain (so runs have several
/// members and windows cross several runs), and one chain of its own.
fn fill(k: &mut Keyspace, workers: u64, chains: u64, len: u64) {
    for w in 0..workers {
        let own: Vec<BlockHashes> = (0..4)
            .map(|j| (w << 40 | 0xffff << 16 | j, 500_000 + w * 10 + j))
            .map(BlockHashes::from)
            .collect();
        k.store(HolderKey::new(w, 0, 0), None, &own, 0).unwrap();
    }
    for c in 0..chains {
        for w in 0..workers {
            let shared = c % 7;
            let blocks: Vec<BlockHashes> = (0..len)
                .map(|j| {
                    let local = if j < 3 {
                        1 + shared * 10 + j
                    } else {
                        1_000_000 * (w % (workers / 2).max(1)) + c * 1_000 + j
                    };
                    BlockHashes::new(w << 40 | c << 16 | j, local)
                })
                .collect();
            k.store(HolderKey::new(w, 0, 0), None, &blocks, c).unwrap();
        }
    }
}

/// Steps with `budget` until a pass completes; the first finding, and the largest step.
fn pass(k: &Keyspace, budget: u64) -> (Result<(), prefixlog_engine::ScrubFinding>, u64, usize) {
    let mut cursor = ScrubCursor::default();
    let (mut largest, mut steps) = (0, 0);
    loop {
        steps += 1;
        match k.scrub_step(&mut cursor, budget) {
            Err(f) => return (Err(f), largest, steps),
            Ok(s) => {
                largest = largest.max(s.work);
                if s.pass_done {
                    return (Ok(()), largest, steps);
                }
            }
        }
    }
}

#[test]
fn a_membership_no_write_made_is_found_named_and_repaired() {
    let (mut good, mut bad) = (
        Keyspace::new(KeyspaceId::new("m", 16, 1), cfg()),
        Keyspace::new(KeyspaceId::new("m", 16, 1), cfg()),
    );
    fill(&mut good, 9, 30, 12);
    fill(&mut bad, 9, 30, 12);
    for budget in [50, 1 << 30] {
        assert!(pass(&bad, budget).0.is_ok(), "a consistent keyspace passes (budget {budget})");
    }
    let victim = HolderKey::new(5, 0, 0);
    let q = partition_of(victim.worker, P);
    let chain = bad.corrupt_membership_for_test(&victim).expect("a top-level run the victim does not hold");
    // Every digest still agrees — anti-entropy cannot see it — but queries overcount.
    assert_eq!(bad.digest(), good.digest());
    assert_eq!(
        (0..P).map(|p| bad.partition_digest(p)).collect::<Vec<_>>(),
        (0..P).map(|p| good.partition_digest(p)).collect::<Vec<_>>()
    );
    let depth = |k: &Keyspace| {
        k.match_chain(&chain, &MatchOptions::default())
            .iter()
            .find(|m| m.holder == victim)
            .map_or(0, |m| m.depth)
    };
    assert_eq!(depth(&good), 0);
    assert!(depth(&bad) > 0, "the corruption credits the victim with blocks it never stored");
    for budget in [1, 50, 1 << 30] {
        let (found, _, _) = pass(&bad, budget);
        let f = found.expect_err("found within one pass");
        assert_eq!(f.partitions, vec![q], "budget {budget}: {f}");
    }
    // The repair: the victim's partition transplanted from a consistent copy.
    bad.replace_group(q, &good);
    assert!(pass(&bad, 50).0.is_ok(), "consistent after the transplant");
    bad.check_invariants().unwrap();
    assert_eq!(depth(&bad), 0, "no overcount after the repair");
    assert_eq!(bad.holder_summaries(), good.holder_summaries());
    let o = MatchOptions { intervals: true, ..Default::default() };
    assert_eq!(bad.match_chain(&chain, &o), good.match_chain(&chain, &o));
}

#[test]
fn both_copies_of_a_paired_keyspace_are_scrubbed() {
    let mut k = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg());
    fill(&mut k, 6, 10, 8);
    let cell = KeyspaceCell::paired(k);
    let victim = HolderKey::new(2, 0, 0);
    assert!(cell.write_back_copy_for_test(|k| k.corrupt_membership_for_test(&victim)).flatten().is_some());
    let found: Vec<bool> = cell.copies().iter().map(|c| pass(c, 40).0.is_err()).collect();
    assert_eq!(found.iter().filter(|&&f| f).count(), 1, "the damaged copy, and only it: {found:?}");
}

#[test]
fn steps_stay_within_their_budget_and_the_longest_hold_is_measured() {
    let mut k = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg());
    fill(&mut k, 40, 600, 24);
    let size = k.scrub_size();
    assert!(size > 200_000, "a large keyspace: {size} units");
    for budget in [1_000u64, 10_000, 20_000, 100_000] {
        let (found, largest, steps) = pass(&k, budget);
        assert!(found.is_ok());
        // A step stops at the first run, record or override that reaches the budget: one item
        // over it at most (here a run with 40 members and their windows, or one record's window;
        // half the holders have an override per block).
        assert!(largest <= budget + 2_000, "budget {budget}: a step did {largest} units");
        assert!(steps as u64 >= size / (budget + 2_000), "budget {budget}: {steps} steps for {size} units");
        // The measurement: the longest step, as a read-lock hold would last.
        let mut cursor = ScrubCursor::default();
        let mut took = Vec::new();
        loop {
            let t = Instant::now();
            let s = k.scrub_step(&mut cursor, budget).unwrap();
            took.push(t.elapsed());
            if s.pass_done {
                break;
            }
        }
        let total: Duration = took.iter().sum();
        took.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "[scrub] {size} units, budget {budget}: {steps} steps, median {:.3} ms, p99 {:.3} ms, longest {:.3} ms, \
             a whole pass {:.1} ms",
            ms(took[took.len() / 2]),
            ms(took[took.len() * 99 / 100]),
            ms(*took.last().unwrap()),
            ms(total)
        );
    }
}
