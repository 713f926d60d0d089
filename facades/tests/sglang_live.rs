//! The SGLang facade end to end: embedded Kafka, a replica hosting `kv_indexer.v1.KVIndexer`
//! on its query port, and the client generated from the upstream schema. Stores, removals,
//! clears and an engine restart written through `ApplyExternalKvBatch` are answered by
//! `MatchExternalKvPrefix` with the engine's contiguous-prefix rule; host-tier and hybrid
//! reports are never credited; metrics and health carry the facade.

use prefixlog_facades::sglang::pb::kv_indexer_client::KvIndexerClient;
use prefixlog_facades::sglang::pb::*;
use prefixlog_facades::sglang::{SglangConfig, SglangExtension};
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use prefixlog_query::Extensions;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

/// SGLang page hashes of tokens [10, 20, ..., 80] in pages of 2 (docs/compat/sglang.md).
/// `MatchExternalKv` as `(worker_id, address) → [(tier, hashes)]`.
type HeldByTier<'a> = BTreeMap<(&'a str, &'a str), Vec<(i32, Vec<i64>)>>;

const CHAIN: [i64; 4] = [978178666101069530, -895308556211281782, -8033692805846017938, 835415944263129316];

type Client = KvIndexerClient<Channel>;

fn report(tier: TierType, hashes: &[i64]) -> ExternalKvAction {
    ExternalKvAction {
        r#type: ExternalKvActionType::ActionReport as i32,
        tier: tier as i32,
        hashes: hashes.to_vec(),
        ..Default::default()
    }
}

fn action(kind: ExternalKvActionType, hashes: &[i64]) -> ExternalKvAction {
    ExternalKvAction {
        r#type: kind as i32,
        tier: TierType::TierHbm as i32,
        hashes: hashes.to_vec(),
        ..Default::default()
    }
}

/// A request with a deadline long enough for the facade's wait for its own records to be
/// applied (read-your-writes on this replica), on a loaded machine too.
fn req<T>(m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    r.set_timeout(Duration::from_secs(20));
    r
}

async fn apply(
    c: &mut Client,
    worker: &str,
    seq: u64,
    actions: Vec<ExternalKvAction>,
) -> Result<(), tonic::Status> {
    let batch = ApplyExternalKvBatchRequest {
        worker_id: worker.into(),
        seq,
        actions,
        worker_address: format!("http://{worker}:30000"),
        ..Default::default()
    };
    c.apply_external_kv_batch(req(batch)).await.map(|_| ())
}

/// (worker_address, matched blocks) per worker, and the best.
async fn prefix(c: &mut Client, hashes: &[i64]) -> (Vec<(String, u32)>, u32, u32) {
    let r = c
        .match_external_kv_prefix(req(MatchExternalKvPrefixRequest {
            hashes: hashes.to_vec(),
            max_blocks: 0,
        }))
        .await
        .expect("prefix match")
        .into_inner();
    let m = r.matches.into_iter().map(|m| (m.worker_address, m.matched_prefix_blocks)).collect();
    (m, r.best_prefix_blocks, r.blocks_read)
}

async fn serving(addr: &str) -> HealthClient<Channel> {
    let channel = Channel::from_shared(addr.to_string()).unwrap().connect().await.expect("connect");
    let mut h = HealthClient::new(channel);
    // Readiness is a state, not a time: wait for it (bounded only by the test harness).
    loop {
        let r = h.check(HealthCheckRequest { service: "kv_indexer.v1.KVIndexer".into() }).await;
        if r.is_ok_and(|r| r.into_inner().status == 1) {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sgl_router_sees_what_the_bridge_wrote() {
    let kafka = EmbeddedKafka::start("prefixlog.sglang", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.sglang", 2);
    let node = replica(&spec, "a").await;
    let other = replica(&spec, "b").await;
    let _health = serving(&node.endpoint()).await;
    let mut c = KvIndexerClient::connect(node.endpoint()).await.unwrap();

    // Nothing written yet: the keyspace is unknown, which is an empty answer (not NOT_FOUND,
    // which sgl-router would turn into HTTP 503). The facade answers UNAVAILABLE while its
    // replica is not ready, and health may have reported SERVING from an earlier check: a few
    // tries, counted, not timed.
    let mut first = None;
    for _ in 0..100 {
        let r = c
            .match_external_kv_prefix(req(MatchExternalKvPrefixRequest {
                hashes: CHAIN.to_vec(),
                max_blocks: 0,
            }))
            .await;
        match r {
            Err(s) if s.code() == tonic::Code::Unavailable => {
                eprintln!("first prefix match: {s:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => {
                first = Some(r.expect("prefix match").into_inner());
                break;
            }
        }
    }
    let first = first.expect("the facade answered within 100 tries");
    assert!(first.matches.is_empty() && first.best_prefix_blocks == 0 && first.blocks_read == 0, "{first:?}");

    apply(&mut c, "w0", 1, vec![report(TierType::TierHbm, &CHAIN[..3])]).await.unwrap();
    apply(&mut c, "w1", 1, vec![report(TierType::TierHbm, &CHAIN[..1])]).await.unwrap();
    // A host-tier copy counts: upstream's prefix match counts a block held on any tier.
    apply(&mut c, "w2", 1, vec![report(TierType::TierDram, &CHAIN)]).await.unwrap();
    // A chain split over tiers: its head on HBM, its tail offloaded to SSD under a parent that
    // stays on HBM.
    let mut offloaded = report(TierType::TierSsd, &CHAIN[2..]);
    offloaded.parent_block_hash = Some(CHAIN[1]);
    apply(&mut c, "w4", 1, vec![report(TierType::TierHbm, &CHAIN[..2]), offloaded]).await.unwrap();
    // A hybrid model's report is never credited.
    let mut hybrid = report(TierType::TierHbm, &CHAIN);
    hybrid.component_masks = vec![3; 4];
    apply(&mut c, "w3", 1, vec![hybrid]).await.unwrap();
    // Line B: a REPORT continuing a chain names its parent.
    let mut tail = report(TierType::TierHbm, &CHAIN[1..2]);
    tail.parent_block_hash = Some(CHAIN[0]);
    apply(&mut c, "w1", 2, vec![tail]).await.unwrap();

    let w = |n: &str, d: u32| (format!("http://{n}:30000"), d);
    let all_four = vec![w("w2", 4), w("w4", 4), w("w0", 3), w("w1", 2)];
    assert_eq!(prefix(&mut c, &CHAIN).await, (all_four, 4, 4));
    // A chain filed from another first block matches nothing.
    assert_eq!(prefix(&mut c, &CHAIN[1..]).await, (vec![], 0, 3));

    // Removals on two tiers, then a clear (the bridge clears every tier).
    apply(&mut c, "w0", 2, vec![action(ExternalKvActionType::ActionRevoke, &CHAIN[2..3])]).await.unwrap();
    let ssd_revoke = ExternalKvAction {
        tier: TierType::TierSsd as i32,
        ..action(ExternalKvActionType::ActionRevoke, &CHAIN[3..])
    };
    apply(&mut c, "w4", 2, vec![ssd_revoke]).await.unwrap();
    let clear_all = vec![
        action(ExternalKvActionType::ActionClearAllAtTier, &[]),
        ExternalKvAction {
            tier: TierType::TierDram as i32,
            ..action(ExternalKvActionType::ActionClearAllAtTier, &[])
        },
    ];
    apply(&mut c, "w1", 3, clear_all).await.unwrap();
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![w("w2", 4), w("w4", 3), w("w0", 2)], 4, 4));

    // A second replica of the log, once it applied what the first had, answers the same.
    let applied = node.status().offsets();
    assert!(other.status().wait_for(&applied, Duration::from_secs(60)).await, "{applied:?}");
    let _ = serving(&other.endpoint()).await;
    let mut c2 = KvIndexerClient::connect(other.endpoint()).await.unwrap();
    for q in [&CHAIN[..], &CHAIN[..2], &CHAIN[1..]] {
        assert_eq!(prefix(&mut c2, q).await, prefix(&mut c, q).await, "{q:?}");
    }

    // Which hashes each worker holds, counted as hits.
    let m = c
        .match_external_kv(req(MatchExternalKvRequest { hashes: CHAIN.to_vec(), count_as_hit: true }))
        .await
        .unwrap()
        .into_inner();
    let by_worker: HeldByTier = m
        .matches
        .iter()
        .map(|n| {
            let tiers = n.hashes_by_tier.iter().map(|t| (t.tier, t.hashes.clone())).collect();
            ((n.worker_id.as_str(), n.address.as_str()), tiers)
        })
        .collect();
    let (hbm, dram, ssd) = (TierType::TierHbm as i32, TierType::TierDram as i32, TierType::TierSsd as i32);
    let want: HeldByTier = [
        (("w0", "http://w0:30000"), vec![(hbm, CHAIN[..2].to_vec())]),
        (("w2", "http://w2:30000"), vec![(dram, CHAIN.to_vec())]),
        (("w4", "http://w4:30000"), vec![(hbm, CHAIN[..2].to_vec()), (ssd, CHAIN[2..3].to_vec())]),
    ]
    .into_iter()
    .collect();
    assert_eq!(by_worker, want, "{m:?}");
    let hits = c
        .get_external_kv_hit_counts(GetExternalKvHitCountsRequest { hashes: vec![CHAIN[0], CHAIN[3]] })
        .await
        .unwrap()
        .into_inner();
    let counts: Vec<(i64, u64)> = hits.entries.iter().map(|e| (e.hash, e.hit_count_total)).collect();
    assert_eq!(counts, vec![(CHAIN[0], 1), (CHAIN[3], 1)]);

    // Fleet mode (line A): the listed workers are announced, every other one removed.
    apply(&mut c, "w1", 4, vec![report(TierType::TierHbm, &CHAIN[..1])]).await.unwrap();
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![w("w2", 4), w("w4", 3), w("w0", 2), w("w1", 1)], 4, 4));
    let expected = ConfigureExpectedWorkersRequest {
        workers: vec![ExpectedWorker {
            worker_id: "w0".into(),
            worker_address: "http://w0:30001".into(),
            cache_spec: None,
        }],
    };
    let r = c.configure_expected_workers(req(expected)).await.unwrap().into_inner();
    assert_eq!((r.total_workers, r.ready_workers), (1, 1));
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![("http://w0:30001".into(), 2)], 2, 4));
    // A removed worker's next batch announces it again.
    apply(&mut c, "w1", 5, vec![report(TierType::TierHbm, &CHAIN[..1])]).await.unwrap();
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![("http://w0:30001".into(), 2), w("w1", 1)], 2, 4));

    // The engine restarted (its seq went back): a new epoch clears the worker's blocks.
    apply(&mut c, "w0", 0, vec![]).await.unwrap();
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![w("w1", 1)], 1, 4), "w0 cleared, w1 kept");

    // A late retry of an old batch (seq steps back, not near 0) is a duplicate, not a restart:
    // it neither clears the worker nor re-credits a block a later batch revoked.
    apply(&mut c, "w1", 20, vec![report(TierType::TierHbm, &CHAIN[..2])]).await.unwrap();
    apply(&mut c, "w1", 21, vec![action(ExternalKvActionType::ActionRevoke, &CHAIN[1..2])]).await.unwrap();
    let retry = ApplyExternalKvBatchRequest {
        worker_id: "w1".into(),
        seq: 20,
        actions: vec![report(TierType::TierHbm, &CHAIN[..2])],
        worker_address: "http://w1:30000".into(),
        ..Default::default()
    };
    let r = c.apply_external_kv_batch(req(retry)).await.unwrap().into_inner();
    assert!(r.duplicate, "{r:?}");
    assert_eq!(prefix(&mut c, &CHAIN).await, (vec![w("w1", 1)], 1, 4), "CHAIN[1] stays revoked");

    // Refusals keep upstream's statuses.
    let err = apply(&mut c, "", 1, vec![]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = apply(&mut c, "w0", 1, vec![report(TierType::TierHbm, &[])]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = c.match_external_kv_prefix(MatchExternalKvPrefixRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = c.replace_external_kv_snapshot(ReplaceExternalKvSnapshotRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);

    let text = prefixlog_query::metrics::render(node.registry());
    let problems = prefixlog_query::exposition::convention_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}");
    for line in [
        r#"prefixlog_facade_requests_total{code="OK",protocol="sglang",rpc="ApplyExternalKvBatch",shard="all"} 15"#,
        r#"prefixlog_facade_requests_total{code="INVALID_ARGUMENT",protocol="sglang",rpc="ApplyExternalKvBatch",shard="all"} 2"#,
        r#"prefixlog_facade_skipped_total{protocol="sglang",reason="components_unsupported",shard="all"} 1"#,
        r#"prefixlog_facade_skipped_total{protocol="sglang",reason="stale_seq",shard="all"} 1"#,
    ] {
        assert!(
            text.contains(line),
            "{line} missing from:\n{}",
            text.lines().filter(|l| l.contains("facade")).collect::<Vec<_>>().join("\n")
        );
    }
    node.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A replica of `spec`'s log hosting the facade for ("qwen", 2).
async fn replica(spec: &LogSpec, name: &str) -> ReplicaNode {
    let cfg = SglangConfig { model: "qwen".into(), block_size: 2 };
    let ext = SglangExtension::new(cfg, Arc::new(prefixlog_ingest::Publisher::new(spec).unwrap()));
    let opts = NodeOptions {
        replica_id: name.into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(ext)]),
        ..NodeOptions::default()
    };
    ReplicaNode::start(spec.clone(), opts).await.unwrap()
}

/// The facade refuses to start on a shard: sgl-router cannot merge shards' answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_replica_refuses_the_facade() {
    let kafka = EmbeddedKafka::start("prefixlog.sglang.sharded", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.sglang.sharded", 2)
        .with_shard("0/2".parse().unwrap())
        .unwrap();
    let ext = SglangExtension::new(
        SglangConfig { model: "m".into(), block_size: 2 },
        Arc::new(prefixlog_ingest::Publisher::new(&spec).unwrap()),
    );
    let opts = NodeOptions { extensions: Extensions(vec![Arc::new(ext)]), ..NodeOptions::default() };
    let err = ReplicaNode::start(spec, opts).await.err().expect("refused");
    assert!(err.to_string().contains("needs a replica of every partition"), "{err}");
}
