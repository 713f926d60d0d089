//! Client certificates bound to names on the SMG facade (issue 50): one replica on an embedded
//! broker, its query port under mutual TLS, a writer file of `san:` lines only. A client is the
//! writer its certificate's subject alternative name (DNS or URI) is bound to: it writes its own
//! holders, another's is PERMISSION_DENIED, and a certificate bound to nothing is
//! PERMISSION_DENIED (`writer_unbound_certificate`). Certificates: `tests/fixtures/tls/`.

use prefixlog_facades::smg::pb::radix_index_client::RadixIndexClient;
use prefixlog_facades::smg::pb::*;
use prefixlog_facades::smg::SmgExtension;
use prefixlog_facades::writers::{WriteRules, WriterPolicy};
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::{Extensions, TlsFiles};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::Code;

const WRITERS: &str = "san:writer-a.example w-a\nsan:spiffe://example.org/writer-b w-b*\n";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tls").join(name)
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// A client of the replica presenting certificate `who` (`writer-a`, `writer-b`, `client`).
async fn client_as(node: &ReplicaNode, who: &str) -> RadixIndexClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem("ca.pem")))
        .domain_name("localhost")
        .identity(Identity::from_pem(pem(&format!("{who}.pem")), pem(&format!("{who}.key"))));
    let url = format!("https://localhost:{}", node.grpc_addr().port());
    let ch = Channel::from_shared(url).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
    RadixIndexClient::new(ch)
}

fn update(holder: &str, seq: u64) -> Update {
    let keyspace = Keyspace {
        model: "llama".into(),
        symbol_kind: SymbolKind::Tokens as i32,
        block_size: 4,
        hash_scheme: 1,
    };
    let stored = Stored { parent_seq_hash: None, blocks: vec![Block { seq_hash: seq, content_hash: seq }] };
    let events = vec![Event { kind: Some(event::Kind::Stored(stored)) }];
    Update { keyspace: Some(keyspace), holder: holder.into(), epoch: 1, seq, events, ..Default::default() }
}

/// One update on a new `Publish` stream: its ack or the status that ended the stream.
async fn publish_once(c: &mut RadixIndexClient<Channel>, u: Update) -> Result<PublishAck, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut acks = c.publish(ReceiverStream::new(rx)).await?.into_inner();
    tx.send(u).await.expect("stream open");
    Ok(acks.message().await?.expect("an ack"))
}

/// The first update, retried while the replica is not ready yet (UNAVAILABLE).
async fn first_publish(c: &mut RadixIndexClient<Channel>, u: Update) -> PublishAck {
    for _ in 0..200 {
        match publish_once(c, u.clone()).await {
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
async fn a_certificate_writes_the_names_its_san_is_bound_to() {
    let kafka = EmbeddedKafka::start("prefixlog.writer-certs", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.writer-certs", 1);
    let rules = WriteRules { writers: WriterPolicy::parse(WRITERS).unwrap(), ..WriteRules::default() };
    let log = Arc::new(prefixlog_ingest::Publisher::new(&spec).unwrap());
    let opts = NodeOptions {
        replica_id: "a".into(),
        ready_lag: 0,
        tls: Some(TlsFiles {
            cert: fixture("server.pem"),
            key: fixture("server.key"),
            client_ca: Some(fixture("ca.pem")),
        }),
        extensions: Extensions(vec![Arc::new(SmgExtension::new(log).with_rules(rules))]),
        ..NodeOptions::default()
    };
    let node = ReplicaNode::start(spec, opts).await.unwrap();

    // writer-a (a DNS SAN) writes w-a, not w-b.
    let mut a = client_as(&node, "writer-a").await;
    assert_eq!(first_publish(&mut a, update("w-a", 1)).await.applied_seq, 1);
    let theirs = publish_once(&mut a, update("w-b", 1)).await.unwrap_err();
    assert_eq!(theirs.code(), Code::PermissionDenied, "{theirs:?}");
    assert_eq!(skipped(&node, "writer_not_allowed"), 1);

    // writer-b (a URI SAN) writes its `w-b*` names, not w-a.
    let mut b = client_as(&node, "writer-b").await;
    assert_eq!(publish_once(&mut b, update("w-b-0", 1)).await.unwrap().applied_seq, 1);
    let theirs = publish_once(&mut b, update("w-a", 2)).await.unwrap_err();
    assert_eq!(theirs.code(), Code::PermissionDenied, "{theirs:?}");

    // A certificate of the same CA whose SAN (DNS:client) is bound to nothing writes nothing.
    let mut unbound = client_as(&node, "client").await;
    let refused = publish_once(&mut unbound, update("w-a", 3)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("client"), "names the certificate's SANs: {refused:?}");
    assert_eq!(skipped(&node, "writer_unbound_certificate"), 1);
    node.shutdown().await.unwrap();
}
