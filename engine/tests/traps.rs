//! The overcounting traps other implementations fell into, plus determinism and rebuild.

use prefixlog_engine::{
    ApplyError, BlockHashes, Engine, EngineConfig, HolderKey, HolderMatch, InvalidStoreReason, Keyspace,
    KeyspaceId, MatchOptions, PlaceOutcome,
};

const A: HolderKey = HolderKey::new(1, 0, 0);
const B: HolderKey = HolderKey::new(2, 0, 0);
const C: HolderKey = HolderKey::new(3, 0, 0);

fn ks() -> Keyspace {
    Keyspace::new(KeyspaceId::new("m", 16, 1), EngineConfig::default())
}

/// ext of a block in these tests: worker-independent, derived from the chain.
fn ext(chain: &[u64]) -> u64 {
    chain.iter().fold(0xabcdu64, |h, &l| h.wrapping_mul(31).wrapping_add(l))
}

fn store_chain(ks: &mut Keyspace, h: HolderKey, chain: &[u64]) {
    let blocks: Vec<BlockHashes> =
        (0..chain.len()).map(|i| (ext(&chain[..=i]), chain[i])).map(BlockHashes::from).collect();
    ks.store(h, None, &blocks, 1).unwrap();
}

fn depth(ks: &Keyspace, q: &[u64], h: HolderKey) -> u32 {
    ks.match_chain(q, &MatchOptions::default()).iter().find(|m| m.holder == h).map_or(0, |m| m.depth)
}

fn full(ks: &Keyspace, q: &[u64], h: HolderKey) -> Option<HolderMatch> {
    ks.match_chain(q, &MatchOptions { intervals: true, ..Default::default() })
        .into_iter()
        .find(|m| m.holder == h)
}

#[test]
fn trap1_same_size_sets_are_not_same_members() {
    let mut k = ks();
    store_chain(&mut k, A, &[1, 2]);
    store_chain(&mut k, B, &[1, 3]);
    k.remove(A, &[ext(&[1])], 2);
    assert_eq!(depth(&k, &[1, 2], A), 0, "A lost its head block");
    assert_eq!(depth(&k, &[1, 2], B), 1, "B holds 1 but not 2");
    // A still holds [1,2] at position 1: visible as an interval, not as depth.
    let a = full(&k, &[1, 2], A).unwrap();
    assert_eq!((a.depth, a.total, a.intervals()), (0, 1, &[(1, 2)][..]));
}

#[test]
fn trap2_hole_stops_credit_while_others_keep_node_alive() {
    let mut k = ks();
    store_chain(&mut k, A, &[1, 2, 3, 4]);
    store_chain(&mut k, B, &[1, 2, 3, 4]);
    // A evicts a middle block; B keeps the node alive.
    k.remove(A, &[ext(&[1, 2])], 2);
    assert_eq!(depth(&k, &[1, 2, 3, 4], A), 1);
    assert_eq!(depth(&k, &[1, 2, 3, 4], B), 4);
    assert_eq!(full(&k, &[1, 2, 3, 4], A).unwrap().intervals(), [(0, 1), (2, 4)]);
    // Head eviction.
    k.remove(B, &[ext(&[1])], 3);
    assert_eq!(depth(&k, &[1, 2, 3, 4], B), 0);
    assert_eq!(full(&k, &[1, 2, 3, 4], B).unwrap().intervals(), [(1, 4)]);
}

#[test]
fn trap3_restore_after_remove_clear_and_shared_drop() {
    let mut k = ks();
    store_chain(&mut k, A, &[1, 2, 3]);
    k.remove(A, &[ext(&[1, 2])], 2);
    assert_eq!(depth(&k, &[1, 2, 3], A), 1);
    // Re-store the middle block under its parent: the chain is whole again.
    k.store(A, Some(ext(&[1])), &[(ext(&[1, 2]), 2)].map(BlockHashes::from), 3).unwrap();
    assert_eq!(depth(&k, &[1, 2, 3], A), 3);
    assert_eq!(k.holder(&A).unwrap().blocks, 3);

    let before = k.digest();
    k.clear(A, 4);
    assert_eq!(depth(&k, &[1, 2, 3], A), 0);
    assert_eq!(k.holder(&A).unwrap().blocks, 0);
    store_chain(&mut k, A, &[1, 2, 3]);
    assert_eq!(k.digest(), before, "clear then re-store restores the digest");

    store_chain(&mut k, B, &[1, 2, 9]);
    k.drop_worker(A.worker);
    assert!(k.holder(&A).is_none());
    assert_eq!(depth(&k, &[1, 2, 3], A), 0);
    assert_eq!(depth(&k, &[1, 2, 3], B), 2, "shared blocks survive the drop");
    assert_eq!(depth(&k, &[1, 2, 9], B), 3);
}

#[test]
fn missing_parent_is_rejected_and_marks_gap() {
    let mut k = ks();
    store_chain(&mut k, A, &[1]);
    let err = k.store(A, Some(0xdead), &[(5, 5)].map(BlockHashes::from), 2).unwrap_err();
    assert_eq!(err, ApplyError::MissingParent { holder: A, parent_ext: 0xdead });
    let s = k.holder(&A).unwrap();
    assert!(s.gapped);
    assert_eq!(s.blocks, 1, "rejected store changes no blocks");
    assert_eq!(k.stats().stores_rejected, 1);
}

#[test]
fn trap4_store_naming_its_parent_is_refused_whole() {
    // Stored as the chain [1,1,2,3] and credited depth 4, this would overcount.
    let mut k = ks();
    k.store(A, None, &[(100, 1)].map(BlockHashes::from), 1).unwrap();
    let (digest, blocks) = (k.digest(), k.holder(&A).unwrap().blocks);
    let err = k.store(A, Some(100), &[(100, 1), (200, 2), (300, 3)].map(BlockHashes::from), 2).unwrap_err();
    let reason = InvalidStoreReason::ParentInStore(100);
    assert_eq!(err, ApplyError::InvalidStore { holder: A, reason });
    assert_eq!(depth(&k, &[1, 1, 2, 3], A), 1);
    assert_eq!((k.digest(), k.holder(&A).unwrap().blocks), (digest, blocks), "nothing applied");
    assert!(!k.holder(&A).unwrap().gapped, "nothing was lost, so no gap");
    assert_eq!(k.holder(&A).unwrap().last_time, 1, "the refused store is not a write");
    assert_eq!(k.stats().stores_rejected, 1);

    let err = k.store(B, None, &[(5, 1), (6, 2), (5, 3)].map(BlockHashes::from), 3).unwrap_err();
    let reason = InvalidStoreReason::RepeatedExt(5);
    assert_eq!(err, ApplyError::InvalidStore { holder: B, reason });
    assert!(k.holder(&B).is_none(), "a refused store creates no holder");
    assert_eq!(k.stats().stores_rejected, 2);
    k.check_invariants().unwrap();
}

#[test]
fn engine_checks_the_whole_store_before_cutting_it_into_chunks() {
    let e = Engine::new(EngineConfig { max_blocks_per_lock: 4, ..Default::default() });
    let id = KeyspaceId::new("m", 16, 1);
    // Ext 1 repeats in the third chunk: no chunk is applied.
    let blocks: Vec<BlockHashes> =
        (1..=10u64).map(|i| (if i == 9 { 1 } else { i }, i)).map(BlockHashes::from).collect();
    let err = e.store(&id, A, None, &blocks, 1).unwrap_err();
    let reason = InvalidStoreReason::RepeatedExt(1);
    assert_eq!(err, ApplyError::InvalidStore { holder: A, reason });
    assert!(e.keyspace(&id).is_none(), "a refused store creates no keyspace");
    assert_eq!(e.writes_without_keyspace(), 1);
    let fine: Vec<BlockHashes> = (1..=10u64).map(|i| (i, i)).map(BlockHashes::from).collect();
    assert_eq!(e.store(&id, A, None, &fine, 2), Ok(10));
    assert_eq!(
        e.store(&id, A, Some(10), &[(11, 11), (10, 12)].map(BlockHashes::from), 3).unwrap_err(),
        ApplyError::InvalidStore { holder: A, reason: InvalidStoreReason::ParentInStore(10) }
    );
    assert_eq!(e.keyspace(&id).unwrap().read().stats().stores_rejected, 1, "counted where it exists");
}

#[test]
fn gapped_holders_are_flagged_and_can_be_left_out_and_candidates_filter() {
    let mut k =
        Keyspace::new(KeyspaceId::new("m", 16, 1), EngineConfig { partitions: 4, ..Default::default() });
    for h in [A, B, C] {
        store_chain(&mut k, h, &[1, 2]);
    }
    k.store(B, Some(0xdead), &[(7, 7)].map(BlockHashes::from), 2).unwrap_err();
    let all = k.match_chain(&[1, 2], &MatchOptions::default());
    let flags: Vec<(HolderKey, bool)> = all.iter().map(|m| (m.holder, m.gapped)).collect();
    assert_eq!(flags, vec![(A, false), (B, true), (C, false)]);
    let o = MatchOptions { exclude_gapped: true, ..Default::default() };
    let kept: Vec<HolderKey> = k.match_chain(&[1, 2], &o).iter().map(|m| m.holder).collect();
    assert_eq!(kept, vec![A, C]);
    let o = MatchOptions {
        candidates: Some(vec![C.worker, 99, B.worker]),
        intervals: true,
        ..Default::default()
    };
    let picked: Vec<HolderKey> = k.match_chain(&[1, 2], &o).iter().map(|m| m.holder).collect();
    assert_eq!(picked, vec![B, C], "unsorted candidate lists work");
    let none = MatchOptions { candidates: Some(vec![]), ..Default::default() };
    assert!(k.match_chain(&[1, 2], &none).is_empty());

    // A log gap in A's partition marks A (and any other holder there) gapped, nobody else.
    let p = prefixlog_engine::partition_of(A.worker, 4);
    k.set_gapped(B, false);
    k.set_partition_gapped(p);
    for h in [A, B, C] {
        let same = prefixlog_engine::partition_of(h.worker, 4) == p;
        assert_eq!(k.holder(&h).unwrap().gapped, same, "{h}");
    }
}

#[test]
fn store_is_idempotent() {
    let mut k = ks();
    store_chain(&mut k, A, &[1, 2]);
    let d = k.digest();
    store_chain(&mut k, A, &[1, 2]);
    assert_eq!(k.digest(), d);
    assert_eq!(k.holder(&A).unwrap().blocks, 2);
}

#[test]
fn placements_never_override_event_feed_and_expire_by_log_time() {
    let cfg = EngineConfig { placement_ttl_ms: 1000, ..Default::default() };
    let mut k = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg);
    store_chain(&mut k, A, &[1]);
    assert_eq!(k.place(A, &[1, 2, 3], 10), PlaceOutcome::IgnoredFed);
    assert_eq!(depth(&k, &[1, 2, 3], A), 1);

    assert_eq!(k.place(B, &[1, 2, 3], 10), PlaceOutcome::Placed { added: 3 });
    let b = full(&k, &[1, 2, 3], B).unwrap();
    assert!(b.inferred);
    assert_eq!(b.depth, 3);
    k.expire(1009, 0);
    assert_eq!(depth(&k, &[1, 2, 3], B), 3, "not yet expired");
    k.expire(1010, 0);
    assert_eq!(depth(&k, &[1, 2, 3], B), 0, "expired at t + ttl");
    assert!(k.holder(&B).is_none(), "empty inferred holder forgotten");

    // The first event replaces inferred state with truth.
    k.place(C, &[1, 2, 3], 2000);
    k.store(C, None, &[(ext(&[7]), 7)].map(BlockHashes::from), 2001).unwrap();
    assert_eq!(depth(&k, &[1, 2, 3], C), 0);
    assert!(!full(&k, &[7], C).unwrap().inferred);
}

#[test]
fn capacity_cuts_oldest_operations_first_with_hysteresis() {
    let cfg = EngineConfig { holder_capacity: 8, ..Default::default() };
    let mut k = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg);
    store_chain(&mut k, A, &[1, 2, 3]); // oldest
    store_chain(&mut k, A, &[4, 5, 6]);
    store_chain(&mut k, A, &[1, 2, 3]); // refreshes [1,2,3]: [4,5,6] is now the oldest
    store_chain(&mut k, A, &[7, 8, 9]); // 9 blocks > 8: cut to 7 (8 - 8/8)
    assert_eq!(k.holder(&A).unwrap().blocks, 6);
    assert_eq!(depth(&k, &[4, 5, 6], A), 0);
    assert_eq!(depth(&k, &[1, 2, 3], A), 3);
    assert_eq!(depth(&k, &[7, 8, 9], A), 3);
    assert_eq!(k.stats().evicted_capacity, 3);
}

#[test]
fn top_k_and_lanes() {
    let mut k = ks();
    store_chain(&mut k, A, &[1, 2, 3]);
    store_chain(&mut k, B, &[1, 2]);
    let lane1 = HolderKey::new(3, 0, 1);
    store_chain(&mut k, lane1, &[1]);
    let top = k.match_chain(&[1, 2, 3], &MatchOptions { top_k: Some(2), ..Default::default() });
    assert_eq!(top.iter().map(|m| (m.holder, m.depth)).collect::<Vec<_>>(), vec![(A, 3), (B, 2)]);
    let l1 = k.match_chain(&[1, 2, 3], &MatchOptions { lane: Some(1), ..Default::default() });
    assert_eq!(l1.iter().map(|m| (m.holder, m.depth)).collect::<Vec<_>>(), vec![(lane1, 1)]);
}

fn stream(k: &mut Keyspace, seed: u64) {
    let mut x = seed;
    for i in 0..3000u64 {
        x = prefixlog_engine::digest::mix64(x + i);
        let h = HolderKey::new(x % 7, 0, (x >> 8) as u32 % 2);
        let chain: Vec<u64> = (0..1 + (x >> 16) % 6).map(|j| 1 + ((x >> (20 + j)) % 3)).collect();
        match (x >> 40) % 4 {
            0 | 1 => store_chain(k, h, &chain),
            2 => {
                k.remove(h, &[ext(&chain)], i);
            }
            _ => {
                k.place(HolderKey::new(100 + x % 3, 0, 0), &chain, i);
            }
        }
    }
}

#[test]
fn same_stream_twice_gives_identical_state_and_rebuild_is_exact() {
    let (mut a, mut b) = (ks(), ks());
    stream(&mut a, 42);
    stream(&mut b, 42);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.dump(), b.dump());
    let r = Keyspace::rebuild(&a.dump(), EngineConfig::default()).unwrap();
    assert_eq!(r.digest(), a.digest());
    assert_eq!(r.holder_summaries(), a.holder_summaries());
    for q in [&[1u64, 2, 3][..], &[2, 2], &[3, 1, 1, 2]] {
        let o = MatchOptions { intervals: true, ..Default::default() };
        assert_eq!(r.match_chain(q, &o), a.match_chain(q, &o));
    }
    let mut c = ks();
    stream(&mut c, 43);
    assert_ne!(c.digest(), a.digest(), "a different stream digests differently");
}

#[test]
fn corrupt_dump_is_refused_not_panicking() {
    let mut a = ks();
    stream(&mut a, 1);
    let mut d = a.dump();
    d.nodes[0].parent = 5;
    assert!(Keyspace::rebuild(&d, EngineConfig::default()).is_err());
    let mut d = a.dump();
    d.holders[0].members.push((u32::MAX, 1));
    assert!(Keyspace::rebuild(&d, EngineConfig::default()).is_err());
}

#[test]
fn engine_keyspaces_are_independent_and_digested_per_partition() {
    let e = Engine::new(EngineConfig { partitions: 4, ..Default::default() });
    let k1 = KeyspaceId::new("m", 16, 1);
    let k2 = KeyspaceId::new("m", 32, 1);
    e.keyspace_or_create(&k1).write(|k| store_chain(k, A, &[1, 2]));
    assert!(e.match_chain(&k2, &[1, 2], &MatchOptions::default()).is_none());
    assert_eq!(e.match_chain(&k1, &[1, 2], &MatchOptions::default()).unwrap()[0].depth, 2);
    let p = prefixlog_engine::partition_of(A.worker, 4);
    assert_ne!(e.partition_digest(p), 0);
    for q in (0..4).filter(|&q| q != p) {
        assert_eq!(e.partition_digest(q), 0);
    }
}

#[test]
fn queries_run_while_a_writer_applies() {
    // Readers and a writer on one keyspace, with one copy and with two: answers stay
    // consistent snapshots (depth never exceeds the query or the holder's total), and nothing
    // deadlocks.
    for paired in [false, true] {
        let e = std::sync::Arc::new(Engine::new(EngineConfig::default()));
        if paired {
            e.keep_query_copies();
        }
        let id = KeyspaceId::new("m", 16, 1);
        let ks = e.keyspace_or_create(&id);
        assert_eq!(ks.is_paired(), paired);
        let writer = std::thread::spawn(move || {
            for i in 0..20_000u64 {
                let chain = [1, 2, 3, 4 + i % 5];
                let blocks: Vec<BlockHashes> =
                    (0..4).map(|j| (ext(&chain[..=j]), chain[j])).map(BlockHashes::from).collect();
                let h = HolderKey::new(i % 8, 0, 0);
                ks.write(|k| k.store(h, None, &blocks, i)).unwrap();
                if i % 3 == 0 {
                    ks.write(|k| k.remove(h, &[ext(&chain[..2])], i));
                }
            }
        });
        let mut answers = 0;
        // At least one query, after the writer is done at the latest: this thread may be
        // descheduled for the whole writer run on a loaded 2-core machine.
        loop {
            let done = writer.is_finished();
            for m in e.match_chain(&id, &[1, 2, 3, 4], &MatchOptions::default()).unwrap() {
                assert!(m.depth <= 4 && m.depth <= m.total);
                answers += 1;
            }
            if done {
                break;
            }
        }
        writer.join().unwrap();
        assert!(answers > 0);
    }
}

#[test]
fn replace_group_moves_a_partition_exactly() {
    // Two keyspaces fed the same stream; corrupt one partition's holders in the second, then
    // transplant that partition from the first: digests, answers and future behaviour agree.
    let cfg = EngineConfig { partitions: 3, holder_capacity: 12, ..Default::default() };
    let mut good = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg.clone());
    let mut bad = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg.clone());
    for k in [&mut good, &mut bad] {
        stream(k, 5);
        // Placed holders in every partition: the transplant files them for expiry too.
        for w in 40..46 {
            k.place(HolderKey::new(w, 0, 0), &[1, w], 10 + w);
        }
    }
    assert_eq!(good.digest(), bad.digest());
    let victim = bad.holder_summaries().into_iter().find(|h| h.blocks > 0).unwrap().key;
    assert!(bad.corrupt_for_test(&victim));
    assert_ne!(good.digest(), bad.digest());
    let g = prefixlog_engine::partition_of(victim.worker, 3);
    bad.replace_group(g, &good);
    bad.check_invariants().unwrap();
    for p in 0..3 {
        assert_eq!(bad.partition_digest(p), good.partition_digest(p), "partition {p}");
    }
    assert_eq!(bad.holder_summaries(), good.holder_summaries());
    stream(&mut good, 6);
    stream(&mut bad, 6);
    assert_eq!(bad.digest(), good.digest(), "future behaviour (eviction, ext resolution) agrees");
    for p in 0..3 {
        let expired = (good.expire(200_000, p), bad.expire(200_000, p));
        assert_eq!(expired.0, expired.1, "partition {p}: expiry agrees");
    }
    assert!(good.holder_summaries().iter().all(|h| h.fed), "every placed holder expired");
    assert_eq!(bad.holder_summaries(), good.holder_summaries());
    bad.check_invariants().unwrap();
    let o = MatchOptions { intervals: true, ..Default::default() };
    assert_eq!(bad.match_chain(&[1, 2, 3], &o), good.match_chain(&[1, 2, 3], &o));
}

/// An engine that names a second block with an ext it used for a first one (hash collisions,
/// or a buggy bridge) rebinds the ext. Before the fix the first block kept a stale entry in
/// the holder's override maps; removing that block (by its canonical ext) then dropped the
/// override of the *second* one, so a later removal of the second block by the rebound ext
/// found nothing and the block stayed credited: an overcount.
#[test]
fn rebinding_an_ext_never_strands_a_block() {
    let mut k = ks();
    // B binds the canonical exts: block [1] is 100, block [2] is 200.
    k.store(B, None, &[(100, 1)].map(BlockHashes::from), 1).unwrap();
    k.store(B, None, &[(200, 2)].map(BlockHashes::from), 1).unwrap();
    // A names both blocks 7 in turn (overrides: the canonical exts are taken).
    k.store(A, None, &[(7, 1)].map(BlockHashes::from), 2).unwrap();
    k.store(A, None, &[(7, 2)].map(BlockHashes::from), 3).unwrap();
    k.check_invariants().unwrap();
    // A evicts block [1] by its canonical ext, then block [2] by the ext it last gave it.
    assert_eq!(k.remove(A, &[100], 4), (1, 0));
    assert_eq!(k.remove(A, &[7], 5), (1, 0), "7 still names block [2] for A");
    assert_eq!(depth(&k, &[2], A), 0, "A no longer holds [2]");
    assert_eq!(k.holder(&A).unwrap().blocks, 0);
    k.check_invariants().unwrap();
}
