//! The two-copy keyspace (`KeyspaceCell::paired`, `serve --query-copy`): a query is answered
//! while a write holds the copy it writes, from the state before that write, and from the
//! state after it once the writer has moved on to the other copy (with one copy the same
//! query would wait for the write: here, forever, since the write waits for the query); and
//! an engine paired after it holds state keeps that state and later writes in both copies.

use prefixlog_engine::{
    BlockHashes, Engine, EngineConfig, HolderKey, Keyspace, KeyspaceCell, KeyspaceId, MatchOptions,
};
use std::sync::mpsc;
use std::time::Duration;

fn depth_of_worker_1(cell: &KeyspaceCell) -> u32 {
    let answer = cell.read().match_chain(&[1, 2, 3], &MatchOptions::default());
    answer.iter().find(|m| m.holder.worker == 1).map_or(0, |m| m.depth)
}

#[test]
fn a_query_is_answered_while_a_write_holds_its_copy() {
    let cell = KeyspaceCell::paired(Keyspace::new(KeyspaceId::new("m", 16, 1), EngineConfig::default()));
    let h = HolderKey::new(1, 0, 0);
    let mut seen = Vec::new();
    std::thread::scope(|s| {
        let stored = cell.write(|k| {
            // The writer holds this copy's write lock here. A query on another thread must
            // still be answered: ask one and wait for it (bounded, so a regression fails
            // rather than hangs).
            let (tx, rx) = mpsc::channel();
            let cell = &cell;
            s.spawn(move || tx.send(depth_of_worker_1(cell)).unwrap());
            let depth = rx.recv_timeout(Duration::from_secs(60)).expect("a query waited on the writer");
            seen.push(depth);
            k.store(h, None, &[(11, 1), (12, 2), (13, 3)].map(BlockHashes::from), 1)
        });
        assert_eq!(stored, Ok(3));
    });
    // First application: the query read the copy not yet written (depth 0); second: the
    // written copy had become the one queries read (depth 3).
    assert_eq!(seen, vec![0, 3]);
    assert_eq!(depth_of_worker_1(&cell), 3);
}

/// Stores of `worker`'s chains of `len` blocks, one per `seed`.
fn store_chains(e: &Engine, id: &KeyspaceId, worker: u64, seeds: std::ops::Range<u64>, len: u64) {
    for s in seeds {
        let blocks: Vec<BlockHashes> =
            (0..len).map(|i| (worker << 40 | s << 20 | i, s * 1_000 + i)).map(BlockHashes::from).collect();
        e.store(id, HolderKey::new(worker, 0, 0), None, &blocks, s).unwrap();
    }
}

/// Both copies dump the same and hold their invariants, and the engine answers and digests as
/// the single-copy `reference` does.
fn assert_paired_like(e: &Engine, reference: &Engine, id: &KeyspaceId) {
    let cell = e.keyspace(id).unwrap();
    assert!(cell.is_paired());
    let copies = cell.copies();
    assert!(copies[0].dump() == copies[1].dump(), "the copies differ");
    for c in &copies {
        c.check_invariants().unwrap();
    }
    drop(copies);
    assert_eq!(e.digest(), reference.digest());
    for p in 0..4 {
        assert_eq!(e.partition_digest(p), reference.partition_digest(p));
    }
    let q: Vec<u64> = (0..40).map(|i| 3_000 + i).collect();
    assert_eq!(
        e.match_chain(id, &q, &MatchOptions::default()),
        reference.match_chain(id, &q, &MatchOptions::default())
    );
}

/// Pairing an engine that already holds state (a restored checkpoint, at start), then writing
/// on, and moving a partition in from another keyspace (repair): the copies stay identical and
/// agree with an engine that never had two.
#[test]
fn pairing_a_populated_engine_keeps_its_state_and_later_writes() {
    let cfg = EngineConfig { partitions: 4, ..Default::default() };
    let id = KeyspaceId::new("m", 16, 1);
    let (paired, reference) = (Engine::new(cfg.clone()), Engine::new(cfg.clone()));
    for e in [&paired, &reference] {
        for w in 0..6 {
            store_chains(e, &id, w, 0..20, 70);
        }
    }
    paired.keep_query_copies();
    assert!(paired.keeps_query_copies());
    assert_paired_like(&paired, &reference, &id);
    for e in [&paired, &reference] {
        store_chains(e, &id, 7, 0..10, 90);
        e.remove(&id, HolderKey::new(2, 0, 0), &[2 << 40 | 3 << 20 | 5], 50);
    }
    assert_paired_like(&paired, &reference, &id);
    // Repair: partition p of another keyspace (with a holder the engines lack) moves in.
    let source = Engine::new(cfg);
    store_chains(&source, &id, 11, 0..5, 40);
    let src = source.keyspace(&id).unwrap();
    let p = prefixlog_engine::partition_of(11, 4);
    for e in [&paired, &reference] {
        e.keyspace(&id).unwrap().write(|k| k.replace_group(p, &src.read()));
    }
    assert_paired_like(&paired, &reference, &id);
}
