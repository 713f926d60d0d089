//! `prefixlog audit loss` on hand-built logs: every placement judged against the index at the
//! offsets its answer token named, with exact per-decision numbers (ties, tiers, a worker
//! removed between the gateway's answer and its placement, placements with and without the
//! answer token, other partitions and the worker's own stores between answer and placement).

use prefixlog_audit::loss_report::{summary_line, table};
use prefixlog_audit::{judge_range, Decision, LossOptions, Point};
use prefixlog_engine::{HolderKey, KeyspaceId};
use prefixlog_state::memory_log::MemoryLog;
use prefixlog_state::record::{
    encode_kv_events, encode_lifecycle, encode_placement, encode_placement_with_policy,
};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{KvOp, Lifecycle, StateSettings, Tier};
use std::collections::BTreeMap;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

/// Worker `w` stores the chain `locals` on `tier` (ext hash = w * 100 + local), its first batch.
fn store(w: u64, tier: Tier, locals: &[u64]) -> Vec<u8> {
    store_seq(w, 1, tier, locals)
}

/// [`store`] as the worker's batch `seq`.
fn store_seq(w: u64, seq: u64, tier: Tier, locals: &[u64]) -> Vec<u8> {
    let blocks = locals.iter().map(|&l| (w * 100 + l, l)).map(BlockHashes::from).collect();
    encode_kv_events(&ks(), w, 0, 1, seq, false, &[KvOp::Stored { tier, lane: 0, parent_ext: None, blocks }])
}

fn place(w: u64, locals: &[u64], token: &[NextOffset], gateway: &str, policy: &str) -> Vec<u8> {
    encode_placement_with_policy(&ks(), HolderKey::new(w, 0, 0), locals, token, gateway, policy)
}

fn tiers(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|&(t, d)| (t.to_string(), d)).collect()
}

/// One partition. Offsets in comments.
fn log() -> MemoryLog {
    let log = MemoryLog::new(1, StateSettings::default());
    log.push(1, 1_000, store(1, Tier::Gpu, &[1, 2, 3])); // 0
    log.push(2, 1_000, store(2, Tier::Gpu, &[1, 2])); // 1
    log.push(3, 1_000, store(3, Tier::Gpu, &[1, 2, 3])); // 2
    log.push(4, 1_000, store(4, Tier::Host, &[1, 2, 3, 4])); // 3
                                                             // 4: a tie: workers 1, 3 (GPU) and 4 (host) all hold 3 blocks of [1,2,3]; 3 is chosen.
    log.push(3, 2_000, place(3, &[1, 2, 3], &[(0, 4)].map(NextOffset::from), "gw-a", "shared-index"));
    log.push(4, 2_000, encode_lifecycle(4, &Lifecycle::Removed)); // 5
                                                                  // 6: answered at offset 5 (worker 4 still held 4 blocks), placed after its removal.
    log.push(1, 3_000, place(1, &[1, 2, 3, 4], &[(0, 5)].map(NextOffset::from), "gw-a", "shared-index"));
    // 7: no token, a worker holding 2 of the 3 achievable blocks.
    log.push(2, 61_000, place(2, &[1, 2, 3], &[], "gw-b", "round-robin"));
    log.push(5, 61_000, store(5, Tier::Host, &[7, 8, 9])); // 8
                                                           // 9: the best is on the host tier only; the chosen worker holds nothing; no policy named.
    log.push(6, 62_000, encode_placement(&ks(), HolderKey::new(6, 0, 0), &[7, 8, 9], &[], "gw-b"));
    log
}

fn judged() -> prefixlog_audit::LossReport {
    let log = log();
    judge_range(
        None,
        &log,
        &Point::Offsets([(0, 0)].map(NextOffset::from).to_vec()),
        &Point::Offsets(vec![]),
        &LossOptions::default(),
    )
    .expect("judged")
}

fn brief(d: &Decision) -> (i64, u64, u32, u32, Vec<u64>, u32, u64) {
    (d.offset, d.worker, d.chosen_blocks, d.best_blocks, d.best_workers.clone(), d.lost_blocks, d.lost_tokens)
}

#[test]
fn every_placement_is_judged_exactly() {
    let r = judged();
    let got: Vec<_> = r.decisions.iter().map(brief).collect();
    assert_eq!(
        got,
        vec![
            // Tie: three workers hold the whole prompt; the chosen one is among them.
            (4, 3, 3, 3, vec![1, 3, 4], 0, 0),
            // Worker 4 held 4 blocks (host) when the gateway was answered and was removed
            // before the placement: judged at the answer's offsets, it was the best.
            (6, 1, 3, 4, vec![4], 1, 16),
            // Worker 2 holds 2 of 3 blocks; worker 1 also holds the placed block 4 (inferred
            // at offset 6) but the prompt is 3 blocks.
            (7, 2, 2, 3, vec![1, 3], 1, 16),
            // Only worker 5 holds the prompt, on the host tier; the chosen worker holds none.
            (9, 6, 0, 3, vec![5], 3, 48),
        ]
    );
    let d = &r.decisions;
    assert_eq!(d[0].best_per_tier, tiers(&[("gpu", 3), ("host", 3)]));
    assert_eq!(d[0].chosen_per_tier, tiers(&[("gpu", 3)]));
    assert_eq!((d[0].answered_at.clone(), d[0].records_since_answer), (vec![NextOffset::new(0, 4)], 0));
    assert_eq!((d[1].answered_at.clone(), d[1].records_since_answer), (vec![NextOffset::new(0, 5)], 1));
    assert!(d[2].answered_at.is_empty() && d[3].answered_at.is_empty());
    assert_eq!(d[3].best_per_tier, tiers(&[("host", 3)]));
    assert!(d[3].chosen_per_tier.is_empty());
    assert_eq!((d[2].gateway.as_str(), d[2].policy.as_str()), ("gw-b", "round-robin"));
    assert_eq!(d[3].policy, "");
}

/// Only placements are picked out for judging, without decoding the others.
#[test]
fn placements_are_recognised_undecoded() {
    use prefixlog_state::record::is_placement;
    assert!(is_placement(&place(3, &[1, 2], &[(0, 4)].map(NextOffset::from), "g", "p")));
    assert!(is_placement(&encode_placement(&ks(), HolderKey::new(1, 0, 0), &[], &[], "")));
    assert!(!is_placement(&store(1, Tier::Gpu, &[1, 2, 3])));
    assert!(!is_placement(&encode_lifecycle(4, &Lifecycle::Removed)));
    assert!(!is_placement(b"\xff\xff"));
}

#[test]
fn aggregates_and_summary_line() {
    let r = judged();
    assert_eq!(r.replayed, 10);
    assert_eq!(
        (r.total.decisions, r.total.lossy_decisions, r.total.achievable_blocks, r.total.lost_blocks),
        (4, 3, 13, 5)
    );
    assert_eq!((r.total.lost_tokens, r.total.without_token), (80, 2));
    assert_eq!(r.by_gateway["gw-a"].lost_blocks, 1);
    assert_eq!((r.by_gateway["gw-b"].decisions, r.by_gateway["gw-b"].lost_blocks), (2, 4));
    assert_eq!(r.by_policy["round-robin"].lost_blocks, 1);
    assert_eq!(r.by_policy["(none)"].lost_blocks, 3);
    assert_eq!(r.by_worker[&6].lost_tokens, 48);
    assert_eq!(r.by_bucket.keys().copied().collect::<Vec<_>>(), vec![0, 60_000]);
    assert_eq!(r.by_bucket[&60_000].lost_blocks, 4);
    assert_eq!(r.by_keyspace.len(), 1);
    let line = summary_line(&r);
    assert_eq!(
        line,
        "loss: 4 decisions, 5 lost blocks (38.5% of achievable), by policy (none) 100.0%, round-robin 33.3%, shared-index 14.3%"
    );
    assert!(table(&r).ends_with(&format!("{line}\n")));
}

/// The SVG plot: one line per gateway through every bucket, its lost tokens per bucket.
#[test]
fn svg_plots_lost_tokens_per_gateway() {
    let svg = prefixlog_audit::loss_svg::svg(&judged());
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    assert_eq!(svg.matches("<polyline").count(), 2);
    assert!(svg.contains(">gw-a</text>") && svg.contains(">gw-b</text>"));
    // Buckets 0 and 60 s; y axis up to 50 tokens (gw-b lost 64 in bucket 60 s: up to 100).
    // gw-a: 16 tokens in bucket 0, none in bucket 60 s.
    let lines: Vec<&str> = svg.lines().filter(|l| l.starts_with("<polyline")).collect();
    assert!(lines[0].contains(r#"points="70.0,"#), "{}", lines[0]);
    assert!(svg.contains(">100</text>"));
}

/// `--follow`: placements appended while the job runs show up in its counters, scraped as the
/// text exposition.
#[test]
fn follow_exports_counters() {
    use prefixlog_audit::loss_follow::{follow, LossCounters};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let log = std::sync::Arc::new(log());
    let counters = LossCounters::default();
    let registry = prometheus::Registry::new();
    counters.register(&registry).unwrap();
    let stop = AtomicBool::new(false);
    let scrape = || {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&registry.gather(), &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    };
    let wait_for = |line: &str| {
        let t = Instant::now();
        while !scrape().contains(line) {
            assert!(t.elapsed() < Duration::from_secs(10), "never scraped {line:?}:\n{}", scrape());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            let start = Point::Offsets([(0, 0)].map(NextOffset::from).to_vec());
            follow(None, &*log, &start, &counters, &stop, Duration::from_millis(2))
        });
        wait_for(r#"prefixlog_audit_loss_lost_tokens_total{gateway="gw-b",policy="(none)"} 48"#);
        wait_for(r#"prefixlog_audit_loss_decisions_total{gateway="gw-a",policy="shared-index"} 2"#);
        wait_for(r#"prefixlog_audit_loss_lost_blocks_total{gateway="gw-b",policy="round-robin"} 1"#);
        // Appended while following: [7,8,9] routed to worker 2, which holds none of it (worker 5
        // on the host tier and worker 6 by the placement at offset 9 hold all three).
        log.push(2, 63_000, place(2, &[7, 8, 9], &[], "gw-b", "round-robin"));
        wait_for(r#"prefixlog_audit_loss_lost_blocks_total{gateway="gw-b",policy="round-robin"} 4"#);
        wait_for(r#"prefixlog_audit_loss_decisions_total{gateway="gw-b",policy="round-robin"} 2"#);
        stop.store(true, Ordering::Relaxed);
        assert!(job.join().unwrap().is_ok());
    });
}

/// The first worker of `1..` whose records land on partition `p` of 2.
fn worker_on(p: u32) -> u64 {
    (1..).find(|&w| prefixlog_engine::partition_of(w, 2) == p).expect("a worker")
}

/// Two partitions: each placement is judged on every partition at its token's offset there,
/// not wherever the other partition happens to be, and not after the chosen worker's own
/// stores that landed between the answer and the placement.
#[test]
fn judged_at_the_token_offsets_of_every_partition() {
    let (a, b) = (worker_on(0), worker_on(1));
    let log = MemoryLog::new(2, StateSettings::default());
    log.push(a, 1_000, store(a, Tier::Gpu, &[1, 2])); // p0 @0
    log.push(b, 1_000, store(b, Tier::Gpu, &[1, 2, 3])); // p1 @0
    log.push(b, 1_500, encode_lifecycle(b, &Lifecycle::Removed)); // p1 @1
                                                                  // p0 @1: answered before b's removal (p1 at 1): b held the whole prompt.
    log.push(a, 2_000, place(a, &[1, 2, 3], &[(0, 1), (1, 1)].map(NextOffset::from), "gw", "shared-index"));
    // p0 @2: answered after it (p1 at 2): a's 2 blocks are the best (a placement credits no
    // blocks to a worker that publishes its events).
    log.push(a, 2_000, place(a, &[1, 2, 3], &[(0, 2), (1, 2)].map(NextOffset::from), "gw", "shared-index"));
    log.push(b, 2_500, store(b, Tier::Gpu, &[5, 6])); // p1 @2
    log.push(a, 2_600, store_seq(a, 2, Tier::Gpu, &[5, 6])); // p0 @3: a's own stores for the request
                                                             // p0 @4: answered before both stores of [5, 6] (p0 at 3, p1 at 2): nobody held it.
    log.push(a, 2_600, place(a, &[5, 6], &[(0, 3), (1, 2)].map(NextOffset::from), "gw", "shared-index"));
    // p0 @5: no token: p0 at its own offset, p1 as of its log time 2_550 (b's [5, 6] stored).
    log.push(a, 2_550, place(a, &[5, 6, 7], &[], "gw", "round-robin"));
    let r = judge_range(
        None,
        &log,
        &Point::Offsets([(0, 0), (1, 0)].map(NextOffset::from).to_vec()),
        &Point::Offsets(vec![]),
        &LossOptions::default(),
    )
    .expect("judged");
    let got: Vec<_> = r.decisions.iter().map(brief).collect();
    assert_eq!(
        got,
        vec![
            (1, a, 2, 3, vec![b], 1, 16),
            (2, a, 2, 2, vec![a], 0, 0),
            (5, a, 2, 2, vec![a, b], 0, 0),
            (4, a, 0, 0, vec![], 0, 0),
        ]
    );
    let since: Vec<i64> = r.decisions.iter().map(|d| d.records_since_answer).collect();
    assert_eq!(since, vec![0, 0, 0, 1]);
    assert_eq!(r.replayed, 9);
}
