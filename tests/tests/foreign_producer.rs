//! Records compressed by a producer that is not prefixlog's: kafka-python (pure Python, its own
//! record batches and codecs; `python/kafka_fixtures/produce.py`) writes records prefixlog
//! encoded, half of them zstd-compressed and half lz4-compressed, and a replica applies every
//! one of them (every available backend; the embedded broker hands batches back as produced).
//!
//! Needs a Python with kafka-python, lz4 and zstandard: `$PREFIXLOG_VENV/bin/python`, else
//! `~/.cache/prefixlog/venv/bin/python`, else `python3`. Without one the test prints "NOT RUN"
//! and passes; `scripts/test.sh` installs them (scripts/foreign-producer.sh) and sets
//! `PREFIXLOG_FOREIGN_PRODUCER=required`, so in CI a missing Python fails instead.

use prefixlog_engine::{partition_of, KeyspaceId, MatchOptions};
use prefixlog_state::record::{encode_kv_events, worker_key};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{KvOp, Tier};
use prefixlog_tests::{kafka_backends, replicas, unique_topic, KafkaBackend};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

const P: u32 = 4;
const WORKERS: u64 = 8;
/// Batches per worker and codec.
const BATCHES: u64 = 6;

fn ks() -> KeyspaceId {
    KeyspaceId::new("foreign", 16, 1)
}

/// A Python that can import kafka (kafka-python) with its lz4 and zstd codecs.
fn python() -> Option<PathBuf> {
    prefixlog_tests::python_that_runs("import kafka.codec as c; assert c.has_lz4() and c.has_zstd()")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Worker `w`'s block `j` of batch `seq`: (ext, local).
fn block(w: u64, seq: u64, j: u64) -> BlockHashes {
    BlockHashes::new(w << 32 | seq << 8 | j, 1_000_000 * w + 10 * seq + j)
}

/// Batches `seqs` of every worker as produce.py's JSON, in publish order.
fn records(seqs: std::ops::Range<u64>) -> serde_json::Value {
    let mut out = Vec::new();
    for seq in seqs {
        for w in 0..WORKERS {
            // Each batch continues the worker's chain from its previous batch's last block.
            let parent_ext = (seq > 1).then(|| block(w, seq - 1, 3).ext);
            let blocks = (0..4).map(|j| block(w, seq, j)).collect();
            let ops = [KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext, blocks }];
            let value = encode_kv_events(&ks(), w, 0, 1, seq, false, &ops);
            out.push(serde_json::json!({
                "partition": partition_of(w, P),
                "key": hex(&worker_key(w)),
                "value": hex(&value),
                "timestamp_ms": 1_700_000_000_000u64 + seq,
            }));
        }
    }
    serde_json::Value::Array(out)
}

/// Runs produce.py; returns the offsets the records landed at and the compression ratio.
fn produce(
    py: &Path,
    brokers: &str,
    topic: &str,
    codec: &str,
    recs: &serde_json::Value,
) -> (Vec<NextOffset>, f64) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("records.json");
    std::fs::write(&file, recs.to_string()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/kafka_fixtures/produce.py");
    let out =
        std::process::Command::new(py).arg(script).args([brokers, topic, codec]).arg(&file).output().unwrap();
    assert!(out.status.success(), "produce.py {codec}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("produce.py prints JSON");
    let offsets = v["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o[0].as_u64().unwrap() as u32, o[1].as_i64().unwrap()))
        .map(NextOffset::from)
        .collect();
    (offsets, v["compression_rate"].as_f64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_applies_zstd_and_lz4_batches_of_another_producer() {
    let Some(py) = python() else {
        let msg = "NOT RUN: no Python with kafka-python, lz4 and zstandard (scripts/foreign-producer.sh)";
        assert!(std::env::var("PREFIXLOG_FOREIGN_PRODUCER").as_deref() != Ok("required"), "{msg}");
        return eprintln!("[foreign_producer] {msg}");
    };
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        compressed_batches_applied(&py, &b).await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn compressed_batches_applied(py: &Path, b: &KafkaBackend) {
    let topic = unique_topic("prefixlog.foreign");
    b.create_topic(&topic, P).await.unwrap();
    let mut token = BTreeMap::new();
    for (codec, seqs) in [("zstd", 1..1 + BATCHES), ("lz4", 1 + BATCHES..1 + 2 * BATCHES)] {
        let (offsets, rate) = {
            let (py, brokers, topic, recs) =
                (py.to_path_buf(), b.brokers.clone(), topic.clone(), records(seqs));
            tokio::task::spawn_blocking(move || produce(&py, &brokers, &topic, codec, &recs)).await.unwrap()
        };
        assert!(rate < 0.9, "{}: kafka-python's {codec} batches were compressed (ratio {rate})", b.name);
        eprintln!(
            "[foreign_producer] {}: {} records, {codec}, compressed/raw {rate:.2}",
            b.name,
            offsets.len()
        );
        for NextOffset { partition: p, offset: o } in offsets {
            let next = token.entry(p).or_insert(0);
            *next = (*next).max(o + 1);
        }
    }
    let spec = replicas::spec(&b.brokers, &topic, P);
    let replica = replicas::replica(&spec, "foreign").await;
    let token: Vec<NextOffset> = token.into_iter().map(NextOffset::from).collect();
    assert!(
        replica.status().wait_for(&token, Duration::from_secs(60)).await,
        "{}: applied {token:?}",
        b.name
    );
    let status = replica.status();
    let published = WORKERS * BATCHES * 2;
    assert_eq!(status.records_applied.load(Ordering::Acquire), published, "{}: every record applied", b.name);
    assert_eq!(status.records_skipped.load(Ordering::Acquire), 0, "{}: none refused", b.name);
    let a = replica.applier().lock();
    for w in 0..WORKERS {
        let chain: Vec<u64> =
            (1..=2 * BATCHES).flat_map(|s| (0..4).map(move |j| block(w, s, j).local)).collect();
        let hits = a.engine().match_chain(&ks(), &chain, &MatchOptions::default()).unwrap();
        let depth = hits.iter().find(|m| m.holder.worker == w).map_or(0, |m| m.depth);
        assert_eq!(depth as usize, chain.len(), "{}: worker {w} holds its whole chain (both codecs)", b.name);
    }
}
