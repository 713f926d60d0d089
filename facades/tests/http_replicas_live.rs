//! Two replicas of one log behind the HTTP indexer facade answer alike, in both dialects: the
//! same records give the same JSON, byte for byte, and a record acknowledged on the log is in
//! the answer of a replica that has applied its consistency token.

mod support;

use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_facades::http::{Dialect, HttpIndexerExtension};
use prefixlog_ingest::Publisher;
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use prefixlog_state::record::{KvOp, Tier};
use prefixlog_state::token_of;
use prefixlog_state::BlockHashes;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use support::{serve, when_ready};

const BLOCK: u32 = 4;

/// A second replica of `spec`'s log serving the facade in `dialect`.
async fn second(spec: &prefixlog_ingest::LogSpec, dialect: Dialect) -> (ReplicaNode, SocketAddr) {
    let ext = HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap().with_dialect(dialect);
    let addr = ext.addr();
    let opts = NodeOptions {
        replica_id: "b".into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(ext)]),
        ..Default::default()
    };
    (ReplicaNode::start(spec.clone(), opts).await.unwrap(), addr)
}

/// `chain` stored after `parent` (None: from the root); the engine's ext hashes are the locals.
fn stored(parent: Option<u64>, chain: &[u64]) -> Vec<KvOp> {
    vec![KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: parent,
        blocks: chain.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
    }]
}

async fn both(a: SocketAddr, b: SocketAddr, path: &str, body: &Value) -> Value {
    let (ca, va) = when_ready(a, "POST", path, Some(body.clone())).await;
    let (cb, vb) = when_ready(b, "POST", path, Some(body.clone())).await;
    assert_eq!((ca, cb), (200, 200), "{va} {vb}");
    assert_eq!(va, vb, "two replicas of one log answer alike");
    va
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_answer_alike_and_a_landed_record_is_answered_after_its_token() {
    for (dialect, topic) in
        [(Dialect::Dynamo, "prefixlog.http2r.d"), (Dialect::Mooncake, "prefixlog.http2r.m")]
    {
        let a = serve(topic, 2, dialect).await;
        let (b, b_addr) = second(&a.spec, dialect).await;
        let tokens: Vec<u32> = (200..224).collect();
        let chain = scheme::block_hashes(&tokens, BLOCK as usize);
        let ks = KeyspaceId::new("llama", BLOCK, 1);
        let p = Publisher::new(&a.spec).unwrap();
        let mut landed = Vec::new();
        for (w, n) in [(1u64, 2usize), (2, 5), (3, 1), (4, 6)] {
            landed.push(
                p.publish_kv_events(&ks, w, 0, 1, 1, false, &stored(None, &chain[..n]), None).await.unwrap(),
            );
        }
        let token = token_of(&landed);
        for node in [&a.node, &b] {
            assert!(node.status().wait_for(&token, Duration::from_secs(60)).await);
        }
        let query = match dialect {
            Dialect::Dynamo => json!({"token_ids": tokens, "model_name": "llama"}),
            Dialect::Mooncake => json!({"token_ids": tokens, "model": "llama", "block_size": BLOCK}),
        };
        let before = both(a.addr, b_addr, "/query", &query).await;

        // Worker 3 stores its whole chain; once replica b has applied that record's token, its
        // answer has it, and replica a's is the same once a has too.
        let more = p
            .publish_kv_events(&ks, 3, 0, 1, 2, false, &stored(Some(chain[0]), &chain[1..]), None)
            .await
            .unwrap();
        let token = token_of(&[more]);
        assert!(b.status().wait_for(&token, Duration::from_secs(60)).await);
        let (_, vb) = when_ready(b_addr, "POST", "/query", Some(query.clone())).await;
        let whole = u64::from(BLOCK) * chain.len() as u64;
        let worker3 = match dialect {
            Dialect::Dynamo => &vb["instances"]["3"]["gpu"],
            Dialect::Mooncake => &vb["default"]["3"]["GPU"],
        };
        assert_eq!(worker3.as_u64(), Some(whole), "{vb}");
        assert_ne!(vb, before, "the new record changed the answer");
        assert!(a.node.status().wait_for(&token, Duration::from_secs(60)).await);
        assert_eq!(both(a.addr, b_addr, "/query", &query).await, vb);
        b.kill().await;
    }
}
