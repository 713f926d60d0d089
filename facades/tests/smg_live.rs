//! The SMG facade end to end: embedded Kafka, replicas hosting `radix_index.RadixIndex` on
//! their query ports, and the client generated from the upstream schema
//! (`proto/proto/compat/smg/radix_index.proto`). Stores, removals, clears, epochs, placements
//! and drops written through `Publish` are answered by `Subscribe` as a model of each holder's
//! held positions says under the engine's contiguous-prefix rule; every query is sent after
//! the ack of the update it checks; a second replica answers the same.

use prefixlog_facades::names::{worker_id, SMG_SEED};
use prefixlog_facades::smg::pb::radix_index_client::RadixIndexClient;
use prefixlog_facades::smg::pb::*;
use prefixlog_facades::smg::state::content_hash;
use prefixlog_facades::smg::SmgExtension;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use prefixlog_query::tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use prefixlog_query::tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use prefixlog_query::tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use prefixlog_query::tonic_reflection::pb::v1::ServerReflectionRequest;
use prefixlog_query::Extensions;
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Lifecycle, Tier};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Sender;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

const BLOCK: u32 = 4;
/// The engine's block hashes (seq hashes on the event feed) of the chain's four blocks.
const EXT: [u64; 4] = [0xe0, 0xe1, 0xe2, 0xe3];

/// Content hashes of four blocks of 4 tokens (wire scheme v1).
fn chain() -> Vec<u64> {
    (0..4u32).map(|b| content_hash(&[b * 4, b * 4 + 1, b * 4 + 2, b * 4 + 3])).collect()
}

fn keyspace() -> Keyspace {
    Keyspace {
        model: "llama".into(),
        symbol_kind: SymbolKind::Tokens as i32,
        block_size: BLOCK,
        hash_scheme: 1,
    }
}

fn blocks(range: std::ops::Range<usize>) -> Vec<Block> {
    let c = chain();
    range.map(|i| Block { seq_hash: EXT[i], content_hash: c[i] }).collect()
}

fn stored(parent: Option<usize>, range: std::ops::Range<usize>) -> Event {
    let parent_seq_hash = parent.map(|p| EXT[p]);
    Event { kind: Some(event::Kind::Stored(Stored { parent_seq_hash, blocks: blocks(range) })) }
}

fn update(holder: &str, epoch: u64, seq: u64, events: Vec<Event>) -> Update {
    Update { keyspace: Some(keyspace()), holder: holder.into(), epoch, seq, events, ..Default::default() }
}

/// A `Publish` stream: one update, then its ack.
struct Publisher {
    tx: Sender<Update>,
    acks: Streaming<PublishAck>,
}

impl Publisher {
    async fn open(c: &mut RadixIndexClient<Channel>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let acks = c.publish(ReceiverStream::new(rx)).await.expect("publish").into_inner();
        Self { tx, acks }
    }

    async fn send(&mut self, u: Update) -> Result<PublishAck, tonic::Status> {
        self.tx.send(u).await.expect("stream open");
        Ok(self.acks.message().await?.expect("an ack per update"))
    }
}

/// A `Subscribe` stream.
struct Subscriber {
    tx: Sender<Query>,
    matches: Streaming<Match>,
    next_id: u64,
}

impl Subscriber {
    async fn open(c: &mut RadixIndexClient<Channel>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let matches = c.subscribe(ReceiverStream::new(rx)).await.expect("subscribe").into_inner();
        Self { tx, matches, next_id: 100 }
    }

    async fn ask(&mut self, keyspace: Keyspace, hashes: Vec<u64>) -> Match {
        self.next_id += 1;
        let q = Query { query_id: self.next_id, keyspace: Some(keyspace), content_hashes: hashes };
        self.tx.send(q).await.expect("stream open");
        let m = self.matches.message().await.expect("stream ok").expect("an answer per query");
        assert_eq!(m.query_id, self.next_id, "one answer per query, in turn here (one at a time)");
        m
    }

    /// (holder, matched, total, event_fed, intervals, lane_meta) of the chain's answer.
    async fn scores(&mut self) -> Vec<Score> {
        let m = self.ask(keyspace(), chain()).await;
        m.scores
            .into_iter()
            .map(|s| Score {
                holder: s.holder,
                matched: s.matched_blocks,
                total: s.total_blocks,
                fed: s.event_fed,
                intervals: s.intervals.iter().map(|i| (i.start, i.end)).collect(),
                lane_meta: s.lane_meta,
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Score {
    holder: String,
    matched: u32,
    total: u64,
    fed: bool,
    intervals: Vec<(u32, u32)>,
    lane_meta: Vec<u8>,
}

/// What each holder holds of the chain (by position), whether it is event-fed, its lane_meta.
#[derive(Default)]
struct Model(BTreeMap<String, ([bool; 4], bool, Vec<u8>)>);

impl Model {
    fn hold(&mut self, holder: &str, positions: &[usize], fed: bool) {
        let e = self.0.entry(holder.into()).or_default();
        positions.iter().for_each(|&p| e.0[p] = true);
        e.1 = fed;
    }

    fn set(&mut self, holder: &str, held: [bool; 4]) {
        self.0.entry(holder.into()).or_default().0 = held;
    }

    fn drop_holder(&mut self, holder: &str) {
        self.0.remove(holder);
    }

    /// The engine's rule: matched = held run from position 0, intervals = maximal held runs;
    /// holders with nothing held are not listed; by matched descending, then name.
    fn expected(&self) -> Vec<Score> {
        let mut out: Vec<Score> = self
            .0
            .iter()
            .filter(|(_, (held, _, _))| held.iter().any(|&b| b))
            .map(|(name, (held, fed, meta))| {
                let matched = held.iter().take_while(|&&b| b).count() as u32;
                let mut intervals = Vec::new();
                let mut i = 0;
                while i < 4 {
                    if held[i] {
                        let start = i;
                        while i < 4 && held[i] {
                            i += 1;
                        }
                        intervals.push((start as u32, i as u32));
                    } else {
                        i += 1;
                    }
                }
                let total = held.iter().filter(|&&b| b).count() as u64;
                Score { holder: name.clone(), matched, total, fed: *fed, intervals, lane_meta: meta.clone() }
            })
            .collect();
        out.sort_by(|a, b| b.matched.cmp(&a.matched).then_with(|| a.holder.cmp(&b.holder)));
        out
    }
}

fn ack(holder: &str, epoch: u64, applied_seq: u64) -> PublishAck {
    PublishAck { holder: holder.into(), epoch, applied_seq, digest_miss_tip: None }
}

async fn serving(addr: &str) {
    let channel = Channel::from_shared(addr.to_string()).unwrap().connect().await.expect("connect");
    let mut h = HealthClient::new(channel);
    // Readiness is a state, not a time: wait for it (bounded only by the test harness).
    loop {
        let r = h.check(HealthCheckRequest { service: "radix_index.RadixIndex".into() }).await;
        if r.is_ok_and(|r| r.into_inner().status == 1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The services the server's reflection lists.
async fn reflected_services(endpoint: &str) -> Vec<String> {
    let channel = Channel::from_shared(endpoint.to_string()).unwrap().connect().await.unwrap();
    let mut r = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices("*".into())),
    };
    let mut answers = r.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    match answers.message().await.unwrap().and_then(|a| a.message_response) {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("{other:?}"),
    }
}

async fn replica(spec: &LogSpec, name: &str) -> ReplicaNode {
    let ext = SmgExtension::new(Arc::new(prefixlog_ingest::Publisher::new(spec).unwrap()));
    let opts = NodeOptions {
        replica_id: name.into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(ext)]),
        ..NodeOptions::default()
    };
    ReplicaNode::start(spec.clone(), opts).await.unwrap()
}

/// Publishes updates until the replica is ready (a publish before that ends the stream with
/// UNAVAILABLE; health may have reported SERVING from an earlier check): counted tries.
async fn first_publish(c: &mut RadixIndexClient<Channel>, u: Update) -> (Publisher, PublishAck) {
    for _ in 0..100 {
        let mut p = Publisher::open(c).await;
        match p.send(u.clone()).await {
            Ok(a) => return (p, a),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                eprintln!("first publish: {s:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(s) => panic!("first publish: {s:?}"),
        }
    }
    panic!("the facade took no update within 100 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_gateway_and_bridge_through_the_facade() {
    let kafka = EmbeddedKafka::start("prefixlog.smg", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.smg", 2);
    let node = replica(&spec, "a").await;
    let other = replica(&spec, "b").await;
    serving(&node.endpoint()).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();
    let mut sub = Subscriber::open(&mut c).await;
    let mut model = Model::default();
    let (w0, w1) = ("http://w0:8000", "http://w1:8000");

    // Nothing written: an empty answer for the query's id.
    assert!(sub.ask(keyspace(), chain()).await.scores.is_empty());

    // The bridge's first batch for w0: blocks 0..3 from the start of the chain.
    let (mut bridge, a) = first_publish(&mut c, update(w0, 1, 1, vec![stored(None, 0..3)])).await;
    assert_eq!(a, ack(w0, 1, 1));
    model.hold(w0, &[0, 1, 2], true);
    assert_eq!(sub.scores().await, model.expected());

    // The gateway's placement for w1 (unsequenced, a chain from position 0), twice:
    // idempotent.
    let mut gateway = Publisher::open(&mut c).await;
    for _ in 0..2 {
        let a = gateway.send(update(w1, 1, 0, vec![stored(None, 0..2)])).await.unwrap();
        assert_eq!(a, ack(w1, 1, 0));
        model.hold(w1, &[0, 1], false);
        assert_eq!(sub.scores().await, model.expected());
    }

    // A removal in the middle of w0's chain: matched stops before it, a later run remains.
    let removed = Event { kind: Some(event::Kind::Removed(Removed { seq_hashes: vec![EXT[1]] })) };
    assert_eq!(bridge.send(update(w0, 1, 2, vec![removed])).await.unwrap(), ack(w0, 1, 2));
    model.set(w0, [true, false, true, false]);
    assert_eq!(sub.scores().await, model.expected());

    // A duplicate seq and a lower epoch are dropped; the ack shows the stored watermark.
    let again = update(w0, 1, 2, vec![stored(Some(0), 1..2)]);
    assert_eq!(bridge.send(again).await.unwrap(), ack(w0, 1, 2));
    let older = update(w0, 0, 9, vec![stored(None, 0..4)]);
    assert_eq!(bridge.send(older).await.unwrap(), ack(w0, 1, 2));
    assert_eq!(sub.scores().await, model.expected());

    // A higher epoch clears older state first (the engine restarted).
    assert_eq!(bridge.send(update(w0, 2, 1, vec![stored(None, 0..1)])).await.unwrap(), ack(w0, 2, 1));
    model.set(w0, [true, false, false, false]);
    assert_eq!(sub.scores().await, model.expected());
    // A parented store continues the chain; then a clear empties the holder.
    assert_eq!(bridge.send(update(w0, 2, 2, vec![stored(Some(0), 1..4)])).await.unwrap(), ack(w0, 2, 2));
    model.hold(w0, &[1, 2, 3], true);
    assert_eq!(sub.scores().await, model.expected());
    let cleared = Event { kind: Some(event::Kind::Cleared(true)) };
    assert_eq!(bridge.send(update(w0, 2, 3, vec![cleared])).await.unwrap(), ack(w0, 2, 3));
    model.set(w0, [false; 4]);
    assert_eq!(sub.scores().await, model.expected());

    // Placements: a higher epoch clears the older placement; a lower one is dropped.
    assert_eq!(gateway.send(update(w1, 2, 0, vec![stored(None, 0..1)])).await.unwrap(), ack(w1, 2, 0));
    model.set(w1, [true, false, false, false]);
    assert_eq!(sub.scores().await, model.expected());
    assert_eq!(gateway.send(update(w1, 1, 0, vec![stored(None, 0..4)])).await.unwrap(), ack(w1, 2, 0));
    assert_eq!(sub.scores().await, model.expected());
    // Placements for an event-fed holder are not credited (feed authority).
    gateway.send(update(w0, 2, 0, vec![stored(None, 0..4)])).await.unwrap();
    assert_eq!(sub.scores().await, model.expected());

    // Added: metadata echoed as lane_meta; a bare re-announce keeps it.
    let w3 = "http://w3:8000";
    let mut announce = update(w3, 1, 0, vec![stored(None, 0..2)]);
    announce.added = Some(Added { capacity_blocks: 100, event_fed: false, metadata: b"tp=2".to_vec() });
    gateway.send(announce).await.unwrap();
    model.hold(w3, &[0, 1], false);
    model.0.get_mut(w3).unwrap().2 = b"tp=2".to_vec();
    let mut bare = update(w3, 1, 0, vec![]);
    bare.added = Some(Added::default());
    gateway.send(bare).await.unwrap();
    assert_eq!(sub.scores().await, model.expected());

    // Dropped: the holder leaves answers, and so do its lanes (`name#lane`).
    let lane = format!("{w3}#1");
    gateway.send(update(&lane, 1, 0, vec![stored(None, 0..3)])).await.unwrap();
    model.hold(&lane, &[0, 1, 2], false);
    assert_eq!(sub.scores().await, model.expected());
    let mut drop_w3 = update(w3, 1, 0, vec![]);
    drop_w3.dropped = true;
    gateway.send(drop_w3).await.unwrap();
    model.drop_holder(w3);
    model.drop_holder(&lane);
    assert_eq!(sub.scores().await, model.expected());

    // A digest cannot be confirmed: the ack names the tip, so the publisher resends the chain.
    let digest = StoredDigest { parent_seq_hash: None, tip_seq_hash: 77, len: 1 };
    let a = gateway
        .send(update(w1, 2, 0, vec![Event { kind: Some(event::Kind::StoredDigest(digest)) }]))
        .await
        .unwrap();
    assert_eq!(a.digest_miss_tip, Some(77));

    // A query in another keyspace, a bad scheme, or no hashes: empty answers, the stream stays.
    let mut bytes = keyspace();
    bytes.symbol_kind = SymbolKind::Bytes as i32;
    assert!(sub.ask(bytes, chain()).await.scores.is_empty());
    let mut scheme2 = keyspace();
    scheme2.hash_scheme = 2;
    assert!(sub.ask(scheme2.clone(), chain()).await.scores.is_empty());
    assert!(sub.ask(keyspace(), vec![]).await.scores.is_empty());
    assert_eq!(sub.scores().await, model.expected(), "the stream still answers");

    // A burst of queries sent before any answer is read: every query gets exactly one answer
    // carrying its id (answers beyond the in-flight bound come back empty at once).
    let burst: Vec<u64> = (1000..1200).collect();
    for &query_id in &burst {
        let q = Query { query_id, keyspace: Some(keyspace()), content_hashes: chain() };
        sub.tx.send(q).await.unwrap();
    }
    let mut ids = Vec::new();
    for _ in &burst {
        ids.push(sub.matches.message().await.unwrap().expect("an answer per query").query_id);
    }
    ids.sort_unstable();
    assert_eq!(ids, burst);

    // The state as updates and digests.
    let digests = c.digests(PullRequest {}).await.unwrap().into_inner().holders;
    let d: Vec<(String, u64, u64, bool, u64)> =
        digests.iter().map(|d| (d.holder.clone(), d.epoch, d.last_seq, d.event_fed, d.blocks)).collect();
    assert_eq!(d, vec![(w1.to_string(), 0, 0, false, 1)], "w0 holds nothing; placements keep no epoch");
    assert_eq!(digests[0].digest_xor, chain()[0]);
    let mut pull = c.pull(PullRequest {}).await.unwrap().into_inner();
    let u = pull.message().await.unwrap().expect("w1's state");
    assert_eq!((u.holder.as_str(), u.seq), (w1, 0));
    let Some(event::Kind::Stored(s)) = &u.events[0].kind else { panic!("{u:?}") };
    assert_eq!((s.parent_seq_hash, s.blocks[0].content_hash), (None, chain()[0]));
    assert_eq!(s.blocks[0].seq_hash, chain()[0], "a placement's seq hash starts at its content hash");
    assert!(pull.message().await.unwrap().is_none());
    let refs = vec![HolderRef { keyspace: Some(keyspace()), holder: w0.into() }];
    let mut none = c.pull_holders(PullHoldersRequest { holders: refs }).await.unwrap().into_inner();
    assert!(none.message().await.unwrap().is_none(), "w0 holds nothing");

    // Many updates sent back to back, several holders and several per holder: one ack per
    // update, in stream order, each with its own holder's watermark.
    let names: Vec<String> = (0..6).map(|i| format!("http://p{i}:8000")).collect();
    let mut sent = Vec::new();
    for round in 1..=3u64 {
        for (i, name) in names.iter().enumerate() {
            let n = (i % 3) + 1;
            let u = update(name, 1, round, vec![stored(None, 0..n)]);
            bridge.tx.send(u).await.unwrap();
            sent.push((name.clone(), round));
            model.hold(name, &(0..n).collect::<Vec<_>>(), true);
        }
    }
    for (name, round) in sent {
        let a = bridge.acks.message().await.unwrap().expect("an ack per update");
        assert_eq!(a, ack(&name, 1, round));
    }
    assert_eq!(sub.scores().await, model.expected());

    // One event-fed holder's state: its feed's epoch and seq, its chain under its own exts.
    let refs = vec![HolderRef { keyspace: Some(keyspace()), holder: names[2].clone() }];
    let mut one = c.pull_holders(PullHoldersRequest { holders: refs }).await.unwrap().into_inner();
    let u = one.message().await.unwrap().expect("p2's state");
    let fed = u.added.as_ref().map(|a| a.event_fed);
    assert_eq!((u.holder.as_str(), u.epoch, u.seq, fed), (names[2].as_str(), 1, 3, Some(true)));
    let expected = vec![Event {
        kind: Some(event::Kind::Stored(Stored { parent_seq_hash: None, blocks: blocks(0..3) })),
    }];
    assert_eq!(u.events, expected);
    assert!(one.message().await.unwrap().is_none(), "only the holder asked for");

    // A second replica of the log, once it applied what the first had, answers the same.
    let applied = node.status().offsets();
    assert!(other.status().wait_for(&applied, Duration::from_secs(60)).await, "{applied:?}");
    serving(&other.endpoint()).await;
    let mut c2 = RadixIndexClient::connect(other.endpoint()).await.unwrap();
    let mut sub2 = Subscriber::open(&mut c2).await;
    let ch = chain();
    for q in [ch.clone(), ch[..2].to_vec(), ch[1..].to_vec()] {
        let (a, b) = (sub.ask(keyspace(), q.clone()).await, sub2.ask(keyspace(), q).await);
        assert_eq!(a.scores, b.scores);
    }

    // An unsupported hash scheme ends the publish stream (as upstream).
    let err = gateway.send(Update { keyspace: Some(scheme2), ..update(w1, 2, 0, vec![]) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");

    // A holder whose worker id is recorded for a worker of another publisher is refused, never
    // merged into it.
    let taken = "http://taken:8000";
    let worker = worker_id(SMG_SEED, taken);
    let other_publisher = prefixlog_ingest::Publisher::new(&spec).unwrap();
    let meta = BTreeMap::from([("address".to_string(), "10.0.0.9:8000".to_string())]);
    let landed =
        other_publisher.publish_lifecycle(worker, &Lifecycle::Added { metadata: meta }).await.unwrap();
    assert!(node.status().wait_for(&[landed.token()], Duration::from_secs(60)).await);
    // Another publisher's record moved the log: the replica is ready again once it has read the
    // new high watermark (with ready_lag 0 it is not ready for that moment), and the facade
    // writes only for a ready replica.
    serving(&node.endpoint()).await;
    let mut p = Publisher::open(&mut c).await;
    let err = p.send(update(taken, 1, 0, vec![stored(None, 0..2)])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("a worker of another publisher"), "{err:?}");
    assert_eq!(sub.scores().await, model.expected(), "nothing credited to either");

    // A worker of another publisher that names itself like an SMG holder in its metadata, with
    // blocks in the SMG keyspace: its name does not map to its id, so it is never answered as
    // that holder.
    let impostor = worker_id(SMG_SEED, "http://impostor:8000") ^ 1;
    let meta = BTreeMap::from([("smg.holder".to_string(), w1.to_string())]);
    other_publisher.publish_lifecycle(impostor, &Lifecycle::Added { metadata: meta }).await.unwrap();
    let ks = prefixlog_engine::KeyspaceId::new("llama", BLOCK, 2);
    let ops = [KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: EXT.iter().copied().zip(chain()).map(BlockHashes::from).collect(),
    }];
    let landed = other_publisher.publish_kv_events(&ks, impostor, 0, 1, 1, false, &ops, None).await.unwrap();
    assert!(node.status().wait_for(&[landed.token()], Duration::from_secs(60)).await);
    // Another publisher's record moved the log: the replica is ready again once it has read the
    // new high watermark (with ready_lag 0 it is not ready for that moment), and the facade
    // writes only for a ready replica.
    serving(&node.endpoint()).await;
    assert_eq!(sub.scores().await, model.expected(), "the impostor is not answered as {w1}");

    // Reflection lists the service (grpcurl works without the .proto).
    assert!(reflected_services(&node.endpoint()).await.contains(&"radix_index.RadixIndex".to_string()));

    drop((bridge, gateway, sub, sub2));
    let text = prefixlog_query::metrics::render(node.registry());
    let problems = prefixlog_query::exposition::convention_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}");
    for line in [
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="stale_epoch",shard="all"} 2"#,
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="duplicate_seq",shard="all"} 1"#,
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="digest_unconfirmed",shard="all"} 1"#,
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="placement_for_event_fed",shard="all"} 1"#,
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="unsupported_hash_scheme",shard="all"} 1"#,
        r#"prefixlog_facade_requests_total{code="OK",protocol="smg",rpc="Digests",shard="all"} 1"#,
        r#"prefixlog_facade_skipped_total{protocol="smg",reason="holder_collision",shard="all"} 1"#,
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

/// The facade refuses to start on a shard: SMG's gateway cannot merge shards' answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_replica_refuses_the_facade() {
    let kafka = EmbeddedKafka::start("prefixlog.smg.sharded", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.smg.sharded", 2)
        .with_shard("0/2".parse().unwrap())
        .unwrap();
    let ext = SmgExtension::new(Arc::new(prefixlog_ingest::Publisher::new(&spec).unwrap()));
    let opts = NodeOptions { extensions: Extensions(vec![Arc::new(ext)]), ..NodeOptions::default() };
    let err = ReplicaNode::start(spec, opts).await.err().expect("refused");
    assert!(err.to_string().contains("needs a replica of every partition"), "{err}");
}
