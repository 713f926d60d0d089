//! What a flood costs in memory, exactly (issue 34): each flood kind (`prefixlog_tests::flood`)
//! applied in-process to an applier with the default limits, with a counting allocator. The
//! records up to the limit cost what the state they create costs (bounded per record, checked
//! against the caps below, which the README states); every record past the limit costs no
//! heap at all (refused whole, only counted). Deterministic: heap bytes, not RSS or time.
//!
//! `PREFIXLOG_FLOOD_RECORDS` sets the records per kind (default 100,000).

use prefixlog_state::{Applier, Outcome, StateSettings};
use prefixlog_tests::flood::FloodKind;
use prefixlog_workload::heap::{live_bytes, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Heap bytes per accepted record each kind may cost with the default limits (the README's
/// figures, rounded up from the measured ones printed by this test).
fn cap(kind: FloodKind) -> f64 {
    match kind {
        // A feed, and every other record an engine keyspace with one holder and block.
        FloodKind::Keyspace => 12_288.0,
        // An inferred holder with one block: holder, indices, a run, table slots.
        FloodKind::Holder => 1_024.0,
        // A fed holder with one block, and the lane in its feed; the keyspace's first table
        // parts (16 to 31 slots each) are shared by only 16 records.
        FloodKind::Lane => 2_560.0,
        // A worker entry with one metadata pair (a B-tree leaf for the pair).
        FloodKind::Worker => 1_024.0,
        // Only the digest-point history (512 points at most).
        FloodKind::Control => 1.0,
    }
}

/// One test (the allocator count is process-wide: two tests at once would blur each other).
#[test]
fn floods_cost_what_the_readme_says() {
    flood_records_past_the_limits_cost_nothing();
    the_largest_items_the_limits_allow();
}

fn flood_records_past_the_limits_cost_nothing() {
    let n: u64 =
        std::env::var("PREFIXLOG_FLOOD_RECORDS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let s = StateSettings::default();
    for kind in FloodKind::ALL {
        let mut a = Applier::new(1, s);
        let accepted = kind.accepted(n, &s);
        let start = live_bytes();
        let mut at_limit = start;
        let mut refused = 0u64;
        for i in 0..n {
            if i == accepted {
                at_limit = live_bytes();
            }
            let (_, v) = kind.record(i);
            match a.apply(0, i as i64, 1_000 + i / 100, Some(&v)).unwrap() {
                Outcome::Applied => assert!(i < accepted, "{kind:?}: record {i} applied past the limit"),
                Outcome::Bad(r) => {
                    assert_eq!(Some(r.as_str()), kind.reason(), "{kind:?}: record {i}");
                    refused += 1;
                }
                other => panic!("{kind:?}: record {i}: {other:?}"),
            }
        }
        if accepted == n {
            at_limit = live_bytes();
        }
        let (state, tail) = ((at_limit - start) as f64, (live_bytes() - at_limit) as f64);
        assert_eq!(refused, n - accepted, "{kind:?}");
        let per_accepted = if accepted > 0 { state / accepted as f64 } else { 0.0 };
        eprintln!(
            "[flood cost] {kind:?}: {accepted} accepted: +{:.1} MiB heap ({per_accepted:.0} B each); {refused} \
             refused: {tail:+.0} B; over all {n}: {:.0} B per record",
            state / 1048576.0,
            (state + tail) / n as f64,
        );
        assert!(per_accepted <= cap(kind), "{kind:?}: {per_accepted:.0} B per accepted record");
        // Past the limit nothing grows but counters and the digest-point history (at most
        // 512 points of 24 bytes per partition, whatever the records).
        assert!(tail <= 16_384.0, "{kind:?}: {refused} refused records took {tail} B");
    }
}

/// Heap bytes per item of the largest items the default limits allow: a worker whose metadata
/// is at the size limit, and a feed with as many lanes as allowed, each announced with a kind of
/// the longest name. With the limits they give the absolute caps per partition the README
/// states.
fn the_largest_items_the_limits_allow() {
    use prefixlog_engine::KeyspaceId;
    use prefixlog_state::record::{encode_lifecycle, worker_for_partition, KvBatch};
    use prefixlog_state::{KvOp, LaneMeta, Lifecycle};
    let s = StateSettings::default();
    let n = 1_000u64;
    // Metadata at the limit: keys and values of 8 bytes, 32 counted per entry.
    let entries = s.max_worker_metadata_bytes as usize / (8 + 8 + 32);
    let mut a = Applier::new(1, s);
    let start = live_bytes();
    for i in 0..n {
        let metadata = (0..entries).map(|e| (format!("key{e:05}"), format!("{i:08}"))).collect();
        let v = encode_lifecycle(i, &Lifecycle::Added { metadata });
        assert_eq!(a.apply(0, i as i64, 1_000, Some(&v)).unwrap(), Outcome::Applied);
    }
    let worker = (live_bytes() - start) as f64 / n as f64;
    // Feeds with every lane announced under the longest kind.
    let kind = "k".repeat(s.max_name_bytes as usize);
    let lanes: Vec<LaneMeta> = (0..s.max_lanes_per_feed)
        .map(|lane| LaneMeta { lane, kind: kind.clone(), sliding_window: 0, block_size: 16 })
        .collect();
    let w = worker_for_partition(0, 1);
    let mut a = Applier::new(1, s);
    let start = live_bytes();
    let ks = KeyspaceId::new("m".repeat(s.max_name_bytes as usize), 16, 1);
    let events: Vec<KvOp> = (0..s.max_lanes_per_feed).map(|lane| KvOp::Cleared { lane }).collect();
    for i in 0..n {
        let b = KvBatch {
            keyspace: &ks,
            worker: w,
            dp_rank: i as u32,
            epoch: 1,
            seq: 1,
            gap_before: false,
            events: &events,
            lanes: &lanes,
        };
        assert_eq!(a.apply(0, i as i64, 1_000, Some(&b.encode())).unwrap(), Outcome::Applied);
    }
    let feeds = a.partition(0).feeds.len() as f64;
    let feed = (live_bytes() - start) as f64 / feeds;
    eprintln!(
        "[flood cost] largest worker ({entries} metadata entries): {worker:.0} B; largest feed ({} lanes, \
         kinds and model of {} bytes): {feed:.0} B ({feeds} feeds)",
        s.max_lanes_per_feed, s.max_name_bytes
    );
    assert!(worker <= 16_384.0, "{worker:.0} B per worker");
    assert!(feed <= 16_384.0, "{feed:.0} B per feed");
}
