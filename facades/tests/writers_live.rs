//! Writer identity on the SMG facade end to end (issue 50): embedded Kafka, one replica hosting
//! `radix_index.RadixIndex` under a writer token file. A client without a token, or with
//! another writer's token, cannot erase, drop or overwrite a holder it does not own; epoch
//! jumps past the maximum step and names with bidi overrides are refused; every refusal is
//! counted by reason; the owner's holder stays indexed throughout. On the SGLang facade, one
//! writer's empty `ConfigureExpectedWorkers` removes its own workers, never another's.

use prefixlog_facades::sglang::pb as sgl;
use prefixlog_facades::sglang::{SglangConfig, SglangExtension};
use prefixlog_facades::smg::pb::radix_index_client::RadixIndexClient;
use prefixlog_facades::smg::pb::*;
use prefixlog_facades::smg::state::content_hash;
use prefixlog_facades::smg::SmgExtension;
use prefixlog_facades::writers::{WriteRules, WriterPolicy, WriterQuota};
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::Sender;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const STEP: u64 = 1_000;
const TOKENS: &str = "t-a w-a\nt-b w-b bridge-b-*\n";

fn keyspace() -> Keyspace {
    Keyspace { model: "llama".into(), symbol_kind: SymbolKind::Tokens as i32, block_size: 4, hash_scheme: 1 }
}

fn chain() -> Vec<u64> {
    (0..3u32).map(|b| content_hash(&[b * 4, b * 4 + 1, b * 4 + 2, b * 4 + 3])).collect()
}

fn stored() -> Event {
    let blocks =
        chain().into_iter().zip(0xe0..).map(|(c, s)| Block { seq_hash: s, content_hash: c }).collect();
    Event { kind: Some(event::Kind::Stored(Stored { parent_seq_hash: None, blocks })) }
}

/// The chain's query in `model`'s keyspace: the holders it answers, with their matched blocks.
async fn holders_of(c: &mut RadixIndexClient<Channel>, model: &str) -> Vec<(String, u32)> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut matches = c.subscribe(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let ks = Keyspace { model: model.into(), ..keyspace() };
    tx.send(Query { query_id: 1, keyspace: Some(ks), content_hashes: chain() }).await.unwrap();
    let m = matches.message().await.unwrap().expect("an answer");
    m.scores.into_iter().map(|s| (s.holder, s.matched_blocks)).collect()
}

fn update_in(model: &str, holder: &str, epoch: u64, seq: u64) -> Update {
    let ks = Keyspace { model: model.into(), ..keyspace() };
    Update { keyspace: Some(ks), ..update(holder, epoch, seq, vec![stored()]) }
}

fn update(holder: &str, epoch: u64, seq: u64, events: Vec<Event>) -> Update {
    Update { keyspace: Some(keyspace()), holder: holder.into(), epoch, seq, events, ..Default::default() }
}

/// A `Publish` stream sent with `token` (None: no token).
struct Publisher {
    tx: Sender<Update>,
    acks: Streaming<PublishAck>,
}

impl Publisher {
    async fn open(c: &mut RadixIndexClient<Channel>, token: Option<&str>) -> Result<Self, tonic::Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let acks = c.publish(req).await?.into_inner();
        Ok(Self { tx, acks })
    }

    async fn send(&mut self, u: Update) -> Result<PublishAck, tonic::Status> {
        self.tx.send(u).await.expect("stream open");
        Ok(self.acks.message().await?.expect("an ack per update"))
    }
}

/// One update on a new stream of `token`'s: its ack or the status that ended the stream.
async fn publish_once(
    c: &mut RadixIndexClient<Channel>,
    token: &str,
    u: Update,
) -> Result<PublishAck, tonic::Status> {
    Publisher::open(c, Some(token)).await?.send(u).await
}

/// The holders the chain's query answers, with their matched blocks.
async fn holders(c: &mut RadixIndexClient<Channel>) -> Vec<(String, u32)> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut matches = c.subscribe(ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(Query { query_id: 1, keyspace: Some(keyspace()), content_hashes: chain() }).await.unwrap();
    let m = matches.message().await.unwrap().expect("an answer");
    m.scores.into_iter().map(|s| (s.holder, s.matched_blocks)).collect()
}

async fn replica(spec: &LogSpec) -> ReplicaNode {
    replica_with_quota(spec, WriterQuota::default()).await
}

async fn replica_with_quota(spec: &LogSpec, quota: WriterQuota) -> ReplicaNode {
    let writers = WriterPolicy::parse(TOKENS).unwrap().with_quota(quota);
    let rules = WriteRules { writers, max_epoch_step: STEP };
    let log = Arc::new(prefixlog_ingest::Publisher::new(spec).unwrap());
    let smg = SmgExtension::new(log.clone()).with_rules(rules.clone());
    let cfg = SglangConfig { model: "qwen".into(), block_size: 2 };
    let sglang = SglangExtension::new(cfg, log).with_rules(rules);
    let opts = NodeOptions {
        replica_id: "a".into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(smg), Arc::new(sglang)]),
        ..NodeOptions::default()
    };
    ReplicaNode::start(spec.clone(), opts).await.unwrap()
}

/// The owner's first update, retried while the replica is not ready yet (UNAVAILABLE).
async fn first_publish(c: &mut RadixIndexClient<Channel>, u: Update) -> PublishAck {
    for _ in 0..200 {
        match publish_once(c, "t-a", u.clone()).await {
            Ok(a) => return a,
            Err(s) if s.code() == Code::Unavailable => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => panic!("first publish: {s:?}"),
        }
    }
    panic!("the facade took no update within 200 tries");
}

fn skipped(node: &ReplicaNode, reason: &str) -> u64 {
    let families = node.registry().gather();
    let Some(f) = families.iter().find(|f| f.name() == "prefixlog_facade_skipped_total") else { return 0 };
    f.get_metric()
        .iter()
        .filter(|m| m.get_label().iter().any(|l| l.name() == "reason" && l.value() == reason))
        .map(|m| m.get_counter().value() as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_holders_writer_can_erase_or_overwrite_it() {
    let kafka = EmbeddedKafka::start("prefixlog.writers", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writers", 2);
    let node = replica(&spec).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();

    assert_eq!(first_publish(&mut c, update("w-a", 1, 1, vec![stored()])).await.epoch, 1);
    assert_eq!(holders(&mut c).await, vec![("w-a".to_string(), 3)]);

    // No token: the stream is refused before any update is read.
    let none = Publisher::open(&mut c, None).await.err().expect("refused");
    assert_eq!(none.code(), Code::Unauthenticated, "{none:?}");
    let unknown = publish_once(&mut c, "t-x", update("w-a", 2, 1, vec![])).await.unwrap_err();
    assert_eq!(unknown.code(), Code::Unauthenticated, "{unknown:?}");

    // Another writer: an epoch-2^63 clear, a drop and an overwrite of w-a are all refused.
    let cleared = Event { kind: Some(event::Kind::Cleared(true)) };
    let erase = update("w-a", 1 << 63, 1, vec![cleared]);
    let dropped = Update { dropped: true, ..update("w-a", 1, 0, vec![]) };
    let overwrite = update("w-a", 2, 1, vec![]);
    for u in [erase, dropped, overwrite] {
        let s = publish_once(&mut c, "t-b", u).await.unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    }
    assert_eq!(skipped(&node, "writer_not_allowed"), 3);
    assert_eq!(skipped(&node, "writer_no_token") + skipped(&node, "writer_unknown_token"), 2);

    // The owner: an epoch jump past the step is refused (counted); its own holder stays and
    // its next update in the epoch is applied, not dropped as stale.
    let jump = publish_once(&mut c, "t-a", update("w-a", 1 + STEP + 1, 1, vec![])).await.unwrap_err();
    assert_eq!(jump.code(), Code::FailedPrecondition, "{jump:?}");
    assert_eq!(skipped(&node, "epoch_jump"), 1);
    let next = publish_once(&mut c, "t-a", update("w-a", 1, 2, vec![])).await.unwrap();
    assert_eq!((next.epoch, next.applied_seq), (1, 2));
    assert_eq!(holders(&mut c).await, vec![("w-a".to_string(), 3)]);

    // The second writer writes its own names; a name with a bidi override is refused.
    let b = publish_once(&mut c, "t-b", update("bridge-b-0", 5, 1, vec![stored()])).await.unwrap();
    assert_eq!((b.epoch, b.applied_seq), (5, 1));
    let bidi = publish_once(&mut c, "t-b", update("bridge-b-\u{202e}1", 1, 1, vec![])).await.unwrap_err();
    assert_eq!(bidi.code(), Code::InvalidArgument, "{bidi:?}");
    assert_eq!(skipped(&node, "bad_name"), 1);
    let mut held = holders(&mut c).await;
    held.sort();
    assert_eq!(held, vec![("bridge-b-0".to_string(), 3), ("w-a".to_string(), 3)]);
    node.shutdown().await.unwrap();
}

type SglClient = sgl::kv_indexer_client::KvIndexerClient<Channel>;

/// SGLang page hashes (any values: the facade files them as given).
const PAGES: [i64; 2] = [11, 12];

fn with_token<T>(m: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    r.set_timeout(Duration::from_secs(20));
    if let Some(t) = token {
        r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

async fn report(
    c: &mut SglClient,
    token: &str,
    worker: &str,
    seq: u64,
    pages: usize,
) -> Result<(), tonic::Status> {
    let action = sgl::ExternalKvAction {
        r#type: sgl::ExternalKvActionType::ActionReport as i32,
        tier: sgl::TierType::TierHbm as i32,
        hashes: PAGES[..pages].to_vec(),
        ..Default::default()
    };
    let batch = sgl::ApplyExternalKvBatchRequest {
        worker_id: worker.into(),
        seq,
        actions: vec![action],
        worker_address: format!("http://{worker}:30000"),
        ..Default::default()
    };
    c.apply_external_kv_batch(with_token(batch, Some(token))).await.map(|_| ())
}

/// (worker_address, matched pages), best first.
async fn matched(c: &mut SglClient) -> Vec<(String, u32)> {
    let q = sgl::MatchExternalKvPrefixRequest { hashes: PAGES.to_vec(), max_blocks: 0 };
    let r = c.match_external_kv_prefix(with_token(q, None)).await.unwrap().into_inner();
    r.matches.into_iter().map(|m| (m.worker_address, m.matched_prefix_blocks)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writers_empty_fleet_keeps_the_other_writers_workers() {
    let kafka = EmbeddedKafka::start("prefixlog.writers.sgl", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writers.sgl", 2);
    let node = replica(&spec).await;
    let mut c = SglClient::connect(node.endpoint()).await.unwrap();
    for _ in 0..200 {
        match report(&mut c, "t-a", "w-a", 1, 2).await {
            Ok(()) => break,
            Err(s) if s.code() == Code::Unavailable => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => panic!("first batch: {s:?}"),
        }
    }
    report(&mut c, "t-b", "w-b", 1, 1).await.unwrap();
    let (a, b) = (("http://w-a:30000".to_string(), 2), ("http://w-b:30000".to_string(), 1));
    assert_eq!(matched(&mut c).await, vec![a.clone(), b]);

    let empty = || sgl::ConfigureExpectedWorkersRequest { workers: vec![] };
    let none = c.configure_expected_workers(with_token(empty(), None)).await.unwrap_err();
    assert_eq!(none.code(), Code::Unauthenticated, "{none:?}");
    // Another writer's batch for w-a, or a fleet listing it, is refused.
    assert_eq!(report(&mut c, "t-b", "w-a", 2, 1).await.unwrap_err().code(), Code::PermissionDenied);
    let w_a = sgl::ExpectedWorker { worker_id: "w-a".into(), ..Default::default() };
    let listing = sgl::ConfigureExpectedWorkersRequest { workers: vec![w_a] };
    let s = c.configure_expected_workers(with_token(listing, Some("t-b"))).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    // t-b's empty fleet removes w-b only.
    let r = c.configure_expected_workers(with_token(empty(), Some("t-b"))).await.unwrap().into_inner();
    assert_eq!(r.total_workers, 0);
    assert_eq!(matched(&mut c).await, vec![a]);
    assert_eq!(skipped(&node, "writer_not_allowed"), 2);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_fills_its_quota_leaves_room_for_another() {
    let kafka = EmbeddedKafka::start("prefixlog.writers.quota", 2).unwrap();
    // The log's shared limit: two keyspaces per partition. Each writer's quota: one model, two
    // holders; without it writer a's second model would take the last place.
    let settings =
        prefixlog_state::settings::StateSettings { max_keyspaces_per_partition: 2, ..Default::default() };
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writers.quota", 2)
        .with_settings(settings);
    let node = replica_with_quota(&spec, WriterQuota { holders: 2, keyspaces: 1 }).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();

    first_publish(&mut c, update_in("m-a", "w-a", 1, 1)).await;
    // t-a may write only w-a: its quota of holders is tested with t-b's prefix names below.
    let s = publish_once(&mut c, "t-a", update_in("m-a2", "w-a", 1, 2)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a second model past the quota: {s:?}");
    for (i, holder) in ["bridge-b-0", "bridge-b-1"].iter().enumerate() {
        publish_once(&mut c, "t-b", update_in("m-b", holder, 1, 1 + i as u64)).await.unwrap();
    }
    let s = publish_once(&mut c, "t-b", update_in("m-b", "bridge-b-2", 1, 1)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a third holder past the quota: {s:?}");
    assert_eq!((skipped(&node, "writer_quota_keyspaces"), skipped(&node, "writer_quota_holders")), (1, 1));

    // Both writers' models and holders are indexed; a dropped holder frees its place.
    assert_eq!(holders_of(&mut c, "m-a").await, vec![("w-a".to_string(), 3)]);
    let mut b = holders_of(&mut c, "m-b").await;
    b.sort();
    assert_eq!(b, vec![("bridge-b-0".to_string(), 3), ("bridge-b-1".to_string(), 3)]);
    let drop = Update { dropped: true, ..update("bridge-b-0", 1, 0, vec![]) };
    publish_once(&mut c, "t-b", drop).await.unwrap();
    publish_once(&mut c, "t-b", update_in("m-b", "bridge-b-2", 1, 1)).await.unwrap();
    let mut b = holders_of(&mut c, "m-b").await;
    b.sort();
    assert_eq!(b, vec![("bridge-b-1".to_string(), 3), ("bridge-b-2".to_string(), 3)]);
    node.shutdown().await.unwrap();
}

/// `prefixlog_facade_writer_refused_total{writer, reason}`.
fn writer_refused(node: &ReplicaNode, writer: &str, reason: &str) -> u64 {
    let families = node.registry().gather();
    let Some(f) = families.iter().find(|f| f.name() == "prefixlog_facade_writer_refused_total") else {
        return 0;
    };
    let has = |m: &prometheus::proto::Metric, k: &str, v: &str| {
        m.get_label().iter().any(|l| l.name() == k && l.value() == v)
    };
    f.get_metric()
        .iter()
        .filter(|m| has(m, "writer", writer) && has(m, "reason", reason))
        .map(|m| m.get_counter().value() as u64)
        .sum()
}

/// A record the replica would refuse on apply for a shared per-partition limit is refused to
/// its writer (RESOURCE_EXHAUSTED, counted by writer), not acked and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_log_would_refuse_is_refused_to_its_writer() {
    let kafka = EmbeddedKafka::start("prefixlog.writers.shared", 1).unwrap();
    let settings = prefixlog_state::settings::StateSettings {
        max_keyspaces_per_partition: 1,
        max_workers_per_partition: 2,
        ..Default::default()
    };
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writers.shared", 1)
        .with_settings(settings);
    let node = replica(&spec).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();

    first_publish(&mut c, update_in("m-a", "w-a", 1, 1)).await;
    let s = publish_once(&mut c, "t-b", update_in("m-b", "bridge-b-0", 1, 1)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a second keyspace in a partition of one: {s:?}");
    assert!(s.message().contains("too_many_keyspaces"), "{s:?}");
    publish_once(&mut c, "t-b", update_in("m-a", "bridge-b-0", 1, 1)).await.unwrap();
    let s = publish_once(&mut c, "t-b", update_in("m-a", "bridge-b-1", 1, 1)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a third worker in a partition of two: {s:?}");
    assert!(s.message().contains("too_many_workers"), "{s:?}");
    assert_eq!(writer_refused(&node, "w-b", "too_many_keyspaces"), 1);
    assert_eq!(writer_refused(&node, "w-b", "too_many_workers"), 1);
    assert_eq!(writer_refused(&node, "w-a", "too_many_workers"), 0, "counted for the writer refused");
    let mut held = holders_of(&mut c, "m-a").await;
    held.sort();
    assert_eq!(held, vec![("bridge-b-0".to_string(), 3), ("w-a".to_string(), 3)]);
    node.shutdown().await.unwrap();
}

/// A facade restart does not reset the writers' quotas: their use is seeded from the holders
/// the replica applied (named, mapped to writers by the token file's patterns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_survive_a_restart() {
    let kafka = EmbeddedKafka::start("prefixlog.writers.restart", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writers.restart", 1);
    let quota = WriterQuota { holders: 2, keyspaces: 1 };
    let node = replica_with_quota(&spec, quota).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();
    first_publish(&mut c, update_in("m-a", "w-a", 1, 1)).await;
    for (i, holder) in ["bridge-b-0", "bridge-b-1"].iter().enumerate() {
        publish_once(&mut c, "t-b", update_in("m-b", holder, 1, 1 + i as u64)).await.unwrap();
    }
    node.shutdown().await.unwrap();

    let node = replica_with_quota(&spec, quota).await;
    let mut c = RadixIndexClient::connect(node.endpoint()).await.unwrap();
    // The first write after the restart (retried until the replica is ready) is the owner's.
    first_publish(&mut c, update_in("m-a", "w-a", 1, 2)).await;
    let s = publish_once(&mut c, "t-b", update_in("m-b", "bridge-b-2", 1, 1)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a third holder past the quota after a restart: {s:?}");
    let s = publish_once(&mut c, "t-b", update_in("m-c", "bridge-b-0", 1, 3)).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "a second model past the quota after a restart: {s:?}");
    assert_eq!((skipped(&node, "writer_quota_holders"), skipped(&node, "writer_quota_keyspaces")), (1, 1));
    publish_once(&mut c, "t-b", update_in("m-b", "bridge-b-1", 1, 3)).await.expect("a recorded holder");
    node.shutdown().await.unwrap();
}
