//! Work per write follows what the write changes, never the size of the keyspace:
//! `drop_worker` visits the worker's holders only, `expire` only the holders of its partition
//! with something due (issue 34: `WorkerRemoved` sorted every keyspace's holders, and every new
//! expiry bucket visited every holder). Measured with `Keyspace::holders_visited`, a count of
//! holders these operations looked at, so the tests do not depend on timing.

use prefixlog_engine::{partition_of, BlockHashes, EngineConfig, HolderKey, Keyspace, KeyspaceId};

const P: u32 = 16;
const TTL: u64 = 1_000;

fn keyspace(inferred_capacity: u32) -> Keyspace {
    let cfg = EngineConfig { partitions: P, placement_ttl_ms: TTL, inferred_capacity, ..Default::default() };
    Keyspace::new(KeyspaceId::new("m", 16, 1), cfg)
}

/// 2,000 fed workers (2 dp ranks each) and 2,000 placed ones, everything at log time 1,000.
fn crowded() -> Keyspace {
    let mut k = keyspace(1 << 16);
    for w in 0..2_000u64 {
        for dp in 0..2 {
            k.store(
                HolderKey::new(w, dp, 0),
                None,
                &[(w << 8 | u64::from(dp), w)].map(BlockHashes::from),
                1_000,
            )
            .unwrap();
        }
        k.place(HolderKey::new(10_000 + w, 0, 0), &[w, 1], 1_000);
    }
    k
}

#[test]
fn dropping_a_worker_visits_only_its_holders() {
    let mut k = crowded();
    let before = (k.holder_count(), k.holders_visited());
    k.drop_worker(17);
    assert_eq!(k.holders_visited() - before.1, 2, "the worker's two holders, nothing else");
    assert_eq!(k.holder_count(), before.0 - 2);
    k.drop_worker(123_456);
    assert_eq!(k.holders_visited() - before.1, 2, "an unknown worker costs a lookup");
    k.check_invariants().unwrap();
}

#[test]
fn expiry_visits_only_due_holders_of_its_partition() {
    let mut k = crowded();
    let in_p0 = (10_000..12_000u64).filter(|&w| partition_of(w, P) == 0).count() as u64;
    assert!(in_p0 > 50);
    // Not due yet: nothing visited, however many holders the partition has.
    assert_eq!(k.expire(1_000 + TTL - 1, 0), 0);
    assert_eq!(k.holders_visited(), 0);
    // Due: exactly partition 0's placed holders, each forgotten.
    let holders = k.holder_count();
    assert_eq!(k.expire(1_000 + TTL, 0), 2 * in_p0);
    assert_eq!(k.holders_visited(), in_p0);
    assert_eq!(k.holder_count(), holders - in_p0 as usize);
    // Again at a later time: none left to visit in partition 0.
    assert_eq!(k.expire(1_000 + 5 * TTL, 0), 0);
    assert_eq!(k.holders_visited(), in_p0);
    k.check_invariants().unwrap();
}

/// A holder whose oldest record went early (evicted for capacity) keeps its earlier place in
/// the queue: it is visited once when that comes due, found with nothing to expire, and filed
/// again under its oldest remaining record, which expires on time.
#[test]
fn expiry_entries_are_revalidated_lazily() {
    let mut k = keyspace(3);
    let h = HolderKey::new(1, 0, 0);
    let p = partition_of(1, P);
    k.place(h, &[1, 2], 100);
    k.place(h, &[3, 4], 200);
    k.place(h, &[5, 6], 300); // over 3 blocks: each placement evicts the one before
    assert_eq!(k.holder(&h).unwrap().blocks, 2);
    assert_eq!(k.expire(100 + TTL, p), 0, "filed at 100, nothing due");
    assert_eq!(k.holders_visited(), 1);
    assert_eq!(k.expire(299 + TTL, p), 0, "filed again at 300: not visited before it");
    assert_eq!(k.holders_visited(), 1);
    assert_eq!(k.expire(300 + TTL, p), 2);
    assert_eq!(k.holders_visited(), 2);
    assert!(k.holder(&h).is_none());
    k.check_invariants().unwrap();
}

/// Placements with log time going backwards (never from the applier, whose log time per
/// partition only moves forward, but the engine does not rely on it) keep the queue entry at or
/// before the oldest record, so nothing expires late.
#[test]
fn an_earlier_placement_moves_the_entry_earlier() {
    let mut k = keyspace(1 << 16);
    let h = HolderKey::new(2, 0, 0);
    let p = partition_of(2, P);
    k.place(h, &[1], 500);
    k.place(h, &[2], 100);
    k.check_invariants().unwrap();
    assert_eq!(k.expire(100 + TTL, p), 0, "the front record (500) is not due: expiry is oldest-first");
    assert_eq!(k.holders_visited(), 1);
    assert_eq!(k.expire(500 + TTL, p), 2);
}
