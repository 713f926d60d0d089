//! Writer identity on the SMG facade end to end (issue 50): embedded Kafka, one replica hosting
//! `radix_index.RadixIndex` under a writer token file. A client without a token, or with
//! another writer's token, cannot erase, drop or overwrite a holder it does not own; epoch
//! jumps past the maximum step and names with bidi overrides are refused; every refusal is
//! counted by reason; the owner's holder stays indexed throughout.

use prefixlog_facades::smg::pb::radix_index_client::RadixIndexClient;
use prefixlog_facades::smg::pb::*;
use prefixlog_facades::smg::state::content_hash;
use prefixlog_facades::smg::SmgExtension;
use prefixlog_facades::writers::{WriteRules, WriterPolicy};
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
    let rules = WriteRules { writers: WriterPolicy::parse(TOKENS).unwrap(), max_epoch_step: STEP };
    let ext = SmgExtension::new(Arc::new(prefixlog_ingest::Publisher::new(spec).unwrap())).with_rules(rules);
    let opts = NodeOptions {
        replica_id: "a".into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(ext)]),
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
