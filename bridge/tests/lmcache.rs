//! The LMCache bridge's translation, end to end through a replica's applier: LMCache-shaped
//! JSON records (the envelope `KafkaCacheEventSink` writes, chunk hashes computed as LMCache's
//! blake3 `TokenHasher` does) → records → `Applier` → matches by token ids.

use prefixlog_bridge::lmcache::chunks::lmcache_chunk_hashes;
use prefixlog_bridge::lmcache::{is_current, newest_incarnations, Config, LmMetrics, Output, Translator};
use prefixlog_engine::scheme::{block_hashes_with, Namespace, SCHEME_XXH3_CHAINED};
use prefixlog_engine::{HolderMatch, KeyspaceId, MatchOptions, Tier};
use prefixlog_state::record::{encode_lifecycle, KvBatch, KvOp, Lifecycle};
use prefixlog_state::{Applier, Outcome, StateSettings};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const CS: usize = 4;
const MODEL: &str = "llama";

fn prompt(base: u32, chunks: usize) -> Vec<u32> {
    (0..(chunks * CS) as u32).map(|i| base + i).collect()
}

fn hex(h: &[u8]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// `kv_rank` as `ObjectKey.ComputeKVRank` packs it (one node).
fn kv_rank(world: i64, rank: i64) -> i64 {
    (world << 24) | (rank << 16) | (world << 8) | rank
}

/// Entries for chunks `range` of `tokens` (store entries carry their tokens and offset).
fn entries(tokens: &[u32], range: std::ops::Range<usize>, world: i64, rank: i64, salt: &str) -> Vec<Value> {
    let hashes = lmcache_chunk_hashes(tokens, CS);
    range
        .map(|i| {
            json!({"key": {"chunk_hash_hex": hex(&hashes[i]), "model_name": MODEL, "kv_rank": kv_rank(world, rank),
                           "object_group_id": 0, "cache_salt": salt},
                   "size_bytes": 100, "token_ids": &tokens[i * CS..(i + 1) * CS], "token_offset": i * CS})
        })
        .collect()
}

fn record(
    instance: &str,
    incarnation: u64,
    seq: u64,
    event: &str,
    tier: &str,
    backend: &str,
    entries: Vec<Value>,
) -> Vec<u8> {
    json!({"batches": [{"instance_id": instance, "incarnation": incarnation, "seq": seq, "event_type": event,
                        "tier": tier, "backend": backend, "entries": entries, "shared": false, "ts": 1.0,
                        "capacity_bytes": 0, "capacity_revision": 0}]})
    .to_string()
    .into_bytes()
}

fn ks() -> KeyspaceId {
    KeyspaceId::new(MODEL, CS as u32, SCHEME_XXH3_CHAINED)
}

/// (depth, (tier, depth) of each tier matching from position 0, gapped).
type Held = (u32, Vec<(Tier, u32)>, bool);

/// A bridge and a one-partition replica behind it.
struct Rig {
    t: Translator,
    applier: Applier,
    offset: i64,
    outcomes: Vec<Outcome>,
}

impl Rig {
    fn new() -> Self {
        Self::with(Config::new(CS as u32))
    }

    fn with(cfg: Config) -> Self {
        Self {
            t: Translator::new(cfg, LmMetrics::default()),
            applier: Applier::new(1, StateSettings::default()),
            offset: 0,
            outcomes: Vec::new(),
        }
    }

    fn offer(&mut self, value: &[u8]) -> Vec<Output> {
        let out = self.t.offer_record(value).expect("decodable");
        for o in &out {
            self.apply(o);
        }
        out
    }

    fn apply(&mut self, o: &Output) {
        if let Some((worker, metadata)) = &o.announce {
            self.put(&encode_lifecycle(*worker, &Lifecycle::Added { metadata: metadata.clone() }));
        }
        for r in &o.records {
            let b = KvBatch {
                keyspace: &r.keyspace,
                worker: r.worker,
                dp_rank: 0,
                epoch: r.epoch,
                seq: r.seq,
                gap_before: r.gap_before,
                events: &r.ops,
                lanes: &[],
            };
            self.put(&b.encode());
        }
    }

    fn put(&mut self, v: &[u8]) {
        let out = self.applier.apply(0, self.offset, 1_000 + self.offset as u64, Some(v)).unwrap();
        self.outcomes.push(out);
        self.offset += 1;
    }

    fn scores(&self, tokens: &[u32], salt: &str) -> Vec<HolderMatch> {
        let locals = block_hashes_with(&Namespace { cache_salt: salt, ..Default::default() }, tokens, CS);
        self.applier.engine().match_chain(&ks(), &locals, &MatchOptions::default()).unwrap_or_default()
    }

    /// What `instance`'s worker holds of `tokens`.
    fn of(&self, instance: &str, tokens: &[u32], salt: &str) -> Option<Held> {
        let w = prefixlog_bridge::worker_id_of_pod(instance);
        self.scores(tokens, salt).into_iter().find(|m| m.holder.worker == w).map(|m| {
            (m.depth, m.tiers().iter().filter(|t| t.depth > 0).map(|t| (t.tier, t.depth)).collect(), m.gapped)
        })
    }

    fn refused(&self, reason: &str) -> u64 {
        LmMetrics::get(&self.t.metrics().refused, reason)
    }
}

#[test]
fn stores_and_deletes_of_two_instances_are_answered_on_their_tiers() {
    let mut r = Rig::new();
    let p = prompt(10, 3);
    r.offer(&record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")));
    r.offer(&record("b", 200, 1, "store", "l2", "fs", entries(&p, 0..2, 1, 0, "")));
    assert_eq!(r.of("a", &p, ""), Some((3, vec![(Tier::Host, 3)], false)));
    assert_eq!(r.of("b", &p, ""), Some((2, vec![(Tier::External, 2)], false)));
    // a evicts its last chunk from L1; b's L2 keeps its chunks.
    r.offer(&record("a", 100, 2, "delete", "l1", "dram", entries(&p, 2..3, 1, 0, "")));
    assert_eq!(r.of("a", &p, "").unwrap().0, 2);
    // A prompt that shares only the first chunk matches one chunk deep.
    let mut other = p.clone();
    other[CS + 1] += 1000;
    assert_eq!(r.of("a", &other, "").unwrap().0, 1);
    assert!(r.outcomes.iter().all(|o| *o == Outcome::Applied), "{:?}", r.outcomes);
}

#[test]
fn duplicates_and_stale_incarnations_publish_nothing() {
    let mut r = Rig::new();
    let p = prompt(10, 2);
    let first = record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..2, 1, 0, ""));
    assert_eq!(r.offer(&first).len(), 1);
    let again = r.offer(&first);
    assert!(again.is_empty(), "{again:?}");
    r.offer(&record("a", 101, 1, "store", "l1", "dram", entries(&p, 0..1, 1, 0, "")));
    assert!(r.offer(&record("a", 100, 2, "delete", "l1", "dram", entries(&p, 0..1, 1, 0, ""))).is_empty());
    let m = r.t.metrics();
    assert_eq!(LmMetrics::get(&m.batches, "duplicate"), 1);
    assert_eq!(LmMetrics::get(&m.batches, "stale"), 1);
    // The stale delete did not apply: the new incarnation's chunk is still held.
    assert_eq!(r.of("a", &p, "").unwrap().0, 1);
}

#[test]
fn a_new_incarnation_drops_the_old_ones_l1_chunks_and_keeps_its_l2() {
    let mut r = Rig::new();
    let (p, q) = (prompt(10, 3), prompt(500, 2));
    r.offer(&record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")));
    r.offer(&record("a", 100, 2, "store", "l2", "s3", entries(&q, 0..2, 1, 0, "")));
    assert_eq!(r.of("a", &p, "").unwrap().0, 3);
    // The restarted instance's first batch is an access: it carries the L2 chunks over.
    let out = r.offer(&record("a", 160, 1, "access", "l1", "", vec![]));
    assert_eq!(out[0].records[0].epoch, 160);
    assert_eq!(r.of("a", &p, ""), None, "L1 chunks of the old incarnation are gone");
    assert_eq!(r.of("a", &q, ""), Some((2, vec![(Tier::External, 2)], false)));
    assert_eq!(LmMetrics::get(&r.t.metrics().chunks, "carried_over"), 2);
    // Its new stores count again.
    r.offer(&record("a", 160, 2, "store", "l1", "dram", entries(&p, 0..1, 1, 0, "")));
    assert_eq!(r.of("a", &p, "").unwrap().0, 1);
}

#[test]
fn a_gap_clears_the_instance_and_starts_over() {
    let mut r = Rig::new();
    let p = prompt(10, 3);
    r.offer(&record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..2, 1, 0, "")));
    // seq 2 is lost (it might have deleted chunk 0); seq 3 stores chunk 2 under chunk 1.
    let out = r.offer(&record("a", 100, 3, "store", "l1", "dram", entries(&p, 2..3, 1, 0, "")));
    let rec = &out[0].records[0];
    assert!(rec.gap_before);
    assert_eq!(rec.ops, vec![KvOp::Cleared { lane: 0 }], "cleared, and chunk 2 has no known parent");
    assert_eq!(r.of("a", &p, ""), None);
    assert_eq!(r.refused("unknown_parent"), 1);
    assert_eq!(LmMetrics::get(&r.t.metrics().streams, "gap"), 1);
    // Restored from the start, it is credited again and not gapped (the clear resynchronised).
    r.offer(&record("a", 100, 4, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")));
    assert_eq!(r.of("a", &p, ""), Some((3, vec![(Tier::Host, 3)], false)));
}

#[test]
fn a_chunk_counts_once_every_kv_rank_is_stored_and_stops_at_any_ranks_delete() {
    let mut r = Rig::new();
    let p = prompt(10, 2);
    r.offer(&record("a", 1, 1, "store", "l1", "dram", entries(&p, 0..2, 2, 0, "")));
    assert_eq!(r.of("a", &p, ""), None, "rank 1 missing");
    r.offer(&record("a", 1, 2, "store", "l1", "dram", entries(&p, 0..2, 2, 1, "")));
    assert_eq!(r.of("a", &p, "").unwrap().0, 2);
    r.offer(&record("a", 1, 3, "delete", "l1", "dram", entries(&p, 1..2, 2, 0, "")));
    assert_eq!(r.of("a", &p, "").unwrap().0, 1);
}

#[test]
fn chunks_whose_hash_cannot_be_reproduced_are_refused() {
    let mut r = Rig::new();
    let p = prompt(10, 2);
    // Tokens that are not the chunk's.
    let mut e = entries(&p, 0..1, 1, 0, "");
    e[0]["token_ids"] = json!([1, 2, 3, 4]);
    r.offer(&record("a", 1, 1, "store", "l1", "dram", e));
    // No tokens (the emitter's binding cache lost them), a second chunk without its first.
    let mut e = entries(&p, 0..1, 1, 0, "");
    e[0]["token_ids"] = json!([]);
    r.offer(&record("a", 1, 2, "store", "l1", "dram", e));
    r.offer(&record("a", 1, 3, "store", "l1", "dram", entries(&p, 1..2, 1, 0, "")));
    // Shared pools are no one instance's.
    let shared =
        String::from_utf8(record("a", 1, 4, "store", "l2", "s3", entries(&p, 0..1, 1, 0, ""))).unwrap();
    r.offer(shared.replace("\"shared\":false", "\"shared\":true").as_bytes());
    // A hash of another algorithm (Python's builtin hash: 8 bytes) cannot be verified.
    let mut e = entries(&p, 0..1, 1, 0, "");
    e[0]["key"]["chunk_hash_hex"] = json!("00112233445566ff");
    r.offer(&record("a", 1, 5, "store", "l1", "dram", e));
    assert_eq!(r.of("a", &p, ""), None);
    for reason in ["hash_mismatch", "no_tokens", "unknown_parent", "shared", "hash_length"] {
        assert_eq!(r.refused(reason), 1, "{reason}");
    }
}

#[test]
fn a_later_store_finds_its_parent_among_earlier_chunks_and_salts_stay_apart() {
    let mut r = Rig::new();
    let p = prompt(10, 3);
    let q: Vec<u32> = p[..CS].iter().copied().chain(prompt(900, 1)).collect();
    r.offer(&record("a", 1, 1, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")));
    // A second prompt with the same first chunk stores only its new chunk (a prefix hit).
    r.offer(&record("a", 1, 2, "store", "l1", "dram", entries(&q, 1..2, 1, 0, "")));
    assert_eq!(r.of("a", &q, "").unwrap().0, 2);
    // Salted chunks answer only a query with the salt.
    r.offer(&record("a", 1, 3, "store", "l2", "fs", entries(&p, 0..2, 1, 0, "tenant-1")));
    assert_eq!(r.of("a", &p, "tenant-1"), Some((2, vec![(Tier::External, 2)], false)));
    assert_eq!(r.of("a", &p, "tenant-2"), None);
    assert_eq!(r.of("a", &p, "").unwrap().1, vec![(Tier::Host, 3)]);
}

#[test]
fn the_translation_is_a_function_of_the_stream() {
    let p = prompt(10, 3);
    let stream = [
        record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")),
        record("b", 5, 1, "store", "l2", "fs", entries(&p, 0..2, 1, 0, "")),
        record("a", 100, 2, "delete", "l1", "dram", entries(&p, 1..3, 1, 0, "")),
        record("a", 100, 2, "delete", "l1", "dram", entries(&p, 1..3, 1, 0, "")),
        record("a", 101, 1, "store", "l2", "fs", entries(&p, 0..1, 1, 0, "")),
    ];
    let run = || {
        let mut t = Translator::new(Config::new(CS as u32), LmMetrics::default());
        stream.iter().flat_map(|v| t.offer_record(v).unwrap()).collect::<Vec<_>>()
    };
    let (first, again) = (run(), run());
    assert_eq!(first, again);
    // A restarted bridge republishes the same (epoch, seq) records of each instance's newest
    // incarnation: a replica that applied the first run skips every one as a duplicate.
    let newest = newest_incarnations(stream.iter().map(|v| &v[..]));
    assert_eq!(newest, BTreeMap::from([("a".to_string(), 101), ("b".to_string(), 5)]));
    let mut r = Rig::new();
    first.iter().for_each(|o| r.apply(o));
    let applied = r.outcomes.len();
    again.iter().filter(|o| is_current(o, &newest)).for_each(|o| r.apply(o));
    let kv = |o: &&Outcome| !matches!(o, Outcome::Applied);
    assert!(
        r.outcomes[applied..].iter().filter(kv).all(|o| *o == Outcome::Duplicate),
        "{:?}",
        &r.outcomes[applied..]
    );
    assert_eq!(r.outcomes[applied..].iter().filter(|o| **o == Outcome::Duplicate).count(), 2);
    // Unfiltered, a's records of incarnation 100 would reach a feed at epoch 101: stale, and
    // the instance marked gapped.
    again.iter().for_each(|o| r.apply(o));
    assert!(r.outcomes.contains(&Outcome::StaleEpoch));
    assert!(r.of("a", &p, "").unwrap().2, "gapped by the stale epoch");
}

#[test]
fn what_a_restart_carries_over_is_bounded_and_gds_is_the_disk_tier() {
    let mut cfg = Config::new(CS as u32);
    cfg.carry_over = 1;
    let mut r = Rig::with(cfg);
    let (p, q) = (prompt(10, 2), prompt(500, 1));
    r.offer(&record("a", 100, 1, "store", "l2", "valkey", entries(&p, 0..2, 1, 0, "")));
    r.offer(&record("a", 100, 2, "store", "l1", "gds", entries(&q, 0..1, 1, 0, "")));
    assert_eq!(r.of("a", &q, "").unwrap().1, vec![(Tier::Disk, 1)]);
    r.offer(&record("a", 101, 1, "config", "l1", "dram", vec![]));
    // One chunk carried over (the first, parents first); the second lost its credit.
    assert_eq!(r.of("a", &p, ""), Some((1, vec![(Tier::External, 1)], false)));
    assert_eq!(r.of("a", &q, ""), None);
    let m = r.t.metrics();
    assert_eq!(
        (LmMetrics::get(&m.chunks, "carried_over"), LmMetrics::get(&m.chunks, "carry_over_dropped")),
        (1, 1)
    );
}

/// A bridge restarted on a topic that no longer starts where an earlier run read: what it
/// rebuilt may lack chunks the earlier run credited (a delete of one would publish nothing).
/// `start_over` makes the instance's next batch clear it through the log, so it is exact again
/// and never left gapped.
#[test]
fn starting_over_clears_what_an_earlier_run_may_have_credited() {
    let (p, q) = (prompt(10, 3), prompt(900, 1));
    // The earlier run credited chunks 0..3 (seq 1) and q (seq 2); retention deleted seq 1 since.
    let mut earlier = Rig::new();
    earlier.offer(&record("a", 100, 1, "store", "l1", "dram", entries(&p, 0..3, 1, 0, "")));
    let seq2 = record("a", 100, 2, "store", "l1", "dram", entries(&q, 0..1, 1, 0, ""));
    earlier.offer(&seq2);
    let mut r = Rig { t: Translator::new(Config::new(CS as u32), LmMetrics::default()), ..earlier };
    // The restarted bridge reads the topic from seq 2: its translation (a gap, to this fresh
    // bridge) is a duplicate to the replica, so its clear changes nothing there.
    r.offer(&seq2);
    assert_eq!(r.outcomes.last(), Some(&Outcome::Duplicate));
    assert_eq!(r.of("a", &p, "").unwrap().0, 3, "still credited");
    // Caught up: the next batch, a live delete of chunk 2 it never saw stored, starts over.
    r.t.start_over("a");
    let out = r.offer(&record("a", 100, 3, "delete", "l1", "dram", entries(&p, 2..3, 1, 0, "")));
    assert_eq!(out[0].records[0].ops.first(), Some(&KvOp::Cleared { lane: 0 }));
    assert_eq!(r.of("a", &p, ""), None, "the earlier run's chunks are cleared");
    assert_eq!(r.outcomes.last(), Some(&Outcome::Applied));
    r.offer(&record("a", 100, 4, "store", "l1", "dram", entries(&q, 0..1, 1, 0, "")));
    assert_eq!(r.of("a", &q, ""), Some((1, vec![(Tier::Host, 1)], false)), "exact again, not gapped");
}
