//! Audits against live history: answers recorded (with their offsets) while a replica ingests
//! are reproduced exactly; time points agree with offset points; too-old points fail with the
//! documented message; `verify` passes on clean history and catches a tampered checkpoint.

use prefixlog_audit::queries::{answer, Hash, KeyspaceJson, Query};
use prefixlog_audit::{reconstruct, reconstruct_at, verify, AuditError, Point};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{probe_log, EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode};
use prefixlog_snapshot::{capture, CheckpointStore, Retention};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{KvOp, Tier};
use std::time::Duration;

const P: u32 = 4;
const TOPIC: &str = "prefixlog.audit";

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}
fn query(chain: &[u64]) -> Query {
    Query {
        keyspace: KeyspaceJson { model: "m".into(), block_size: 16, hash_scheme: 1 },
        tokens: None,
        hashes: Some(chain.iter().map(|&h| Hash::Num(h)).collect()),
        top_k: None,
        intervals: true,
        tiers: vec![],
        tier_weights: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_reproduces_live_answers_and_verifies_history() {
    let kafka = EmbeddedKafka::start(TOPIC, P).unwrap();
    let log = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), TOPIC, P);
    let publisher = Publisher::new(&log).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Checkpoints only when the test takes them, all kept.
    let opts = NodeOptions {
        data_dir: Some(dir.path().to_path_buf()),
        checkpoints: CheckpointPolicy {
            interval: Duration::ZERO,
            records: 0,
            retention: Retention { keep_last: 100, ..Default::default() },
        },
        ..NodeOptions::default()
    };
    let replica = ReplicaNode::start(log.clone(), opts).await.unwrap();
    let queries: Vec<Vec<u64>> = vec![vec![1, 2, 3, 4], vec![1, 2, 9], vec![7, 8]];
    let mut recorded = Vec::new(); // (offsets, phase time, answers)
    let mut seqs = [0u64; 8];
    for phase in 0..12u64 {
        let t = 10_000 * (phase + 1);
        let mut landed = Vec::new();
        for w in 0..8u64 {
            seqs[w as usize] += 1;
            let chain: Vec<u64> = match (w + phase) % 3 {
                0 => vec![1, 2, 3, 4],
                1 => vec![1, 2, 9],
                _ => vec![7, 8, 1 + phase],
            };
            let blocks: Vec<BlockHashes> =
                chain.iter().map(|&l| (w << 32 | phase << 16 | l, l)).map(BlockHashes::from).collect();
            let ops = [
                KvOp::Cleared { lane: 0 },
                KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks },
            ];
            let l = publisher
                .publish_kv_events(&ks(), w, 0, 1, seqs[w as usize], false, &ops, Some(t as i64))
                .await
                .unwrap();
            landed.push(l.token());
        }
        assert!(replica.status().wait_for(&landed, Duration::from_secs(30)).await);
        // Give the consumer a moment to drain this phase fully, then snapshot answers + offsets
        // atomically under the applier lock.
        tokio::time::sleep(Duration::from_millis(100)).await;
        {
            let a = replica.applier().lock();
            let offsets: Vec<NextOffset> =
                (0..P).map(|p| (p, a.partition(p).next_offset)).map(NextOffset::from).collect();
            let answers: Vec<_> = queries.iter().map(|q| answer(a.engine(), &query(q)).unwrap()).collect();
            recorded.push((offsets, t, answers));
        }
        if phase % 4 == 1 {
            replica.checkpoint_now().unwrap();
        }
    }
    // The audit reads the store beside the live replica.
    let store = CheckpointStore::open_reader(&dir.path().join("checkpoints")).unwrap();
    for (offsets, t, answers) in &recorded {
        let r = reconstruct(Some(&store), &log, &Point::Offsets(offsets.clone()), false).unwrap();
        for (q, want) in queries.iter().zip(answers) {
            assert_eq!(&answer(r.applier.engine(), &query(q)).unwrap(), want, "offsets {offsets:?}");
        }
        // The same point by log time.
        let rt = reconstruct(Some(&store), &log, &Point::Time(*t), false).unwrap();
        assert_eq!(rt.offsets(), r.offsets(), "time {t}");
    }

    // Clean history verifies; a tampered checkpoint does not.
    let clean = verify(&store, &log, 0, u64::MAX, false).unwrap();
    assert!(clean.checked >= 2 && clean.mismatches.is_empty(), "{clean:?}");
    // A checkpoint of a replica whose state diverged from its log: what it recorded for
    // partition 0 is not what the log produces.
    let mut c = capture(replica.applier());
    c.digests[0] ^= 1;
    replica.store().unwrap().write(replica.identity(), &c, 0).unwrap();
    let store = CheckpointStore::open_reader(&dir.path().join("checkpoints")).unwrap();
    let tampered = verify(&store, &log, 0, u64::MAX, false).unwrap();
    assert_eq!(tampered.mismatches.len(), 1, "{tampered:?}");

    // A point before the oldest retained checkpoint, with the log's head dropped by retention.
    let mut truncated = probe_log(&log).unwrap();
    truncated.watermarks.values_mut().for_each(|w| w.low = 1);
    let err =
        reconstruct_at(Some(&store), &log, &truncated, &Point::Time(5_000), false).err().expect("too old");
    assert!(matches!(err, AuditError::TooOld { .. }));
    assert!(err.to_string().contains("Earliest reachable point: checkpoint 1"), "{err}");
}
