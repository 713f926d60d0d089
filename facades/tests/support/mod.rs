//! What the HTTP indexer live tests share: a plain HTTP/1.1 client written from the documented
//! JSON (docs/compat/dynamo-mooncake-http.md), not from the facade's types, and a replica on an
//! embedded broker serving the facade.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

// The engine feeds `prefixlog serve` gives the Dynamo facade (the bridge's engine stream): the
// binary's own source, so `/register` is tested as it runs.
#[path = "../../../prefixlog/src/engine_feeds.rs"]
mod engine_feeds;

use prefixlog_facades::http::{Dialect, HttpIndexerExtension};
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP/1.1 request on a fresh connection: (status, JSON body).
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.unwrap();
    // A refused body may be cut short by the server (413 before reading it): read its answer.
    let _ = s.write_all(body.as_bytes()).await;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, payload) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    (status, serde_json::from_str(payload).unwrap_or(Value::String(payload.into())))
}

/// One raw HTTP/1.1 request (`head` without the final blank line, `body` as is) on a fresh
/// connection: (status, content type, body text).
pub async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String, String) {
    let head =
        format!("{head}\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).expect("utf-8 response");
    let (head, payload) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    let ctype = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_string))
        .unwrap_or_default();
    (status, ctype, payload.to_string())
}

/// `request` once the replica is ready: readiness is a state, not a time, so it is asked until
/// the answer is not 503 (a bounded number of tries, so a replica that never gets ready fails
/// the test instead of hanging it); that answer.
pub async fn when_ready(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    for _ in 0..2400 {
        let (code, v) = http(addr, method, path, body.clone()).await;
        if code != 503 {
            return (code, v);
        }
        assert!(v["error"].is_string(), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{addr}: {method} {path} still answered 503 (not ready) after 2400 tries");
}

/// A replica of every partition of a fresh embedded broker serving the facade in `dialect`.
pub struct Served {
    pub spec: LogSpec,
    pub node: ReplicaNode,
    pub addr: SocketAddr,
    _kafka: EmbeddedKafka,
}

pub async fn serve(topic: &str, partitions: u32, dialect: Dialect) -> Served {
    let kafka = EmbeddedKafka::start(topic, partitions).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), topic, partitions);
    let (node, addr) = replica(&spec, "a", dialect).await;
    Served { spec, node, addr, _kafka: kafka }
}

/// A replica `id` of every partition of `spec` serving the facade in `dialect` (Dynamo's with
/// a producer: `/register` is served).
pub async fn replica(spec: &LogSpec, id: &str, dialect: Dialect) -> (ReplicaNode, SocketAddr) {
    let mut ext = HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap().with_dialect(dialect);
    if dialect == Dialect::Dynamo {
        let publisher = prefixlog_ingest::Publisher::new(spec).unwrap();
        ext = ext.with_feeds(Arc::new(engine_feeds::BridgeFeeds::new(publisher)));
    }
    let addr = ext.addr();
    let opts = NodeOptions {
        replica_id: id.into(),
        ready_lag: 0,
        extensions: Extensions(vec![Arc::new(ext)]),
        ..Default::default()
    };
    (ReplicaNode::start(spec.clone(), opts).await.unwrap(), addr)
}
