//! `demo --gateway-protocol smg`: the fleet speaks SMG's `radix_index.RadixIndex` to the
//! replicas' SMG facade (`serve --smg-radix-index`), as SMG's gateway and `radix-index-bridge`
//! would, through the client generated from the upstream schema.
//!
//! - Each worker's KV events go over a `Publish` stream of its own, as the bridge sends them:
//!   holder = the worker's URL, epoch 1, `seq` = the worker's batch number (from 1),
//!   `seq_hash` = the event's ext, `content_hash` = its local.
//! - Each gateway keeps one `Subscribe` stream (queries matched to answers by `query_id`, the
//!   demo's deadline per query: no answer in time is "unavailable", fail open) and one
//!   `Publish` stream for its placements (unsequenced, epoch 1, the SMG placement chain).
//!
//! Keyspace: model `trace`, `TOKENS`, block size 64, wire scheme 1 (prefixlog scheme 2).

use parking_lot::Mutex;
use prefixlog_facades::smg::pb::radix_index_client::RadixIndexClient;
use prefixlog_facades::smg::pb::{event, Block, Event, Keyspace, Match, Query, Stored, SymbolKind, Update};
use prefixlog_facades::smg::state::chain_prefix_hash;
use prefixlog_query::tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
use prefixlog_state::KvOp;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The SMG keyspace the demo's fleet writes and its gateways ask.
pub fn keyspace() -> Keyspace {
    Keyspace { model: "trace".into(), symbol_kind: SymbolKind::Tokens as i32, block_size: 64, hash_scheme: 1 }
}

/// A worker's holder name: its URL, as SMG's publishers name holders.
pub fn holder(w: u32) -> String {
    format!("http://demo-worker-{w}:8000")
}

/// The worker a holder name stands for.
fn worker_of(holder: &str) -> Option<u32> {
    holder.strip_prefix("http://demo-worker-")?.strip_suffix(":8000")?.parse().ok()
}

/// Waits until the replica at `endpoint` reports the SMG service serving (it refuses writes
/// before it is ready). Readiness is a state: no time bound here; the demo's caller has one.
pub async fn wait_serving(endpoint: &str) -> anyhow::Result<()> {
    let mut h = HealthClient::new(Channel::from_shared(endpoint.to_string())?.connect().await?);
    loop {
        let req = HealthCheckRequest { service: prefixlog_facades::smg::SERVICE_NAME.into() };
        if h.check(req).await.is_ok_and(|r| r.into_inner().status == 1) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Updates sent into `Publish` streams and acks received: the demo waits for every ack
/// before it reads the replicas' final state.
#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub acked: AtomicU64,
}

impl Counters {
    /// Waits until every update sent was acked, or `timeout` passed (whether they all were).
    pub async fn all_acked(&self, timeout: Duration) -> bool {
        let end = tokio::time::Instant::now() + timeout;
        while self.acked.load(Ordering::Relaxed) < self.sent.load(Ordering::Relaxed) {
            if tokio::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

/// Opens a `Publish` stream; its acks are counted by a task of its own.
async fn publish_stream(endpoint: &str, counters: Arc<Counters>) -> anyhow::Result<mpsc::Sender<Update>> {
    let mut c = RadixIndexClient::connect(endpoint.to_string()).await?;
    let (tx, rx) = mpsc::channel(1024);
    let mut acks = c.publish(ReceiverStream::new(rx)).await?.into_inner();
    tokio::spawn(async move {
        loop {
            match acks.message().await {
                Ok(Some(_)) => {
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => return,
                Err(s) => {
                    tracing::warn!(status = %s, "SMG publish stream ended");
                    return;
                }
            }
        }
    });
    Ok(tx)
}

/// One worker's KV events, `(seq, op)` in order, as `Publish` updates (the bridge's part).
pub async fn worker_feed(
    w: u32,
    mut rx: mpsc::UnboundedReceiver<(u64, KvOp)>,
    endpoint: String,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let tx = publish_stream(&endpoint, counters.clone()).await?;
    while let Some((seq, op)) = rx.recv().await {
        let kind = match op {
            KvOp::Stored { parent_ext, blocks, .. } => event::Kind::Stored(Stored {
                parent_seq_hash: parent_ext,
                blocks: blocks
                    .into_iter()
                    .map(|b| Block { seq_hash: b.ext, content_hash: b.local })
                    .collect(),
            }),
            KvOp::Removed { exts, .. } => {
                event::Kind::Removed(prefixlog_facades::smg::pb::Removed { seq_hashes: exts })
            }
            KvOp::Cleared { .. } => event::Kind::Cleared(true),
        };
        let u = Update {
            keyspace: Some(keyspace()),
            holder: holder(w),
            epoch: 1,
            seq,
            events: vec![Event { kind: Some(kind) }],
            ..Default::default()
        };
        if tx.send(u).await.is_err() {
            anyhow::bail!("worker {w}: the SMG publish stream closed");
        }
        counters.sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Match>>>>;

/// One `Subscribe` stream, its queries matched to their answers by `query_id`.
pub struct SmgSubscriber {
    queries: mpsc::Sender<Query>,
    pending: Pending,
    next_id: AtomicU64,
}

impl SmgSubscriber {
    pub async fn connect(endpoint: &str) -> anyhow::Result<Self> {
        let mut c = RadixIndexClient::connect(endpoint.to_string()).await?;
        let (queries, rx) = mpsc::channel(1024);
        let mut answers = c.subscribe(ReceiverStream::new(rx)).await?.into_inner();
        let pending: Pending = Arc::default();
        let routes = pending.clone();
        tokio::spawn(async move {
            // Late answers (the caller gave up) find no entry and are dropped, as SMG's gateway
            // drops them.
            while let Ok(Some(m)) = answers.message().await {
                if let Some(reply) = routes.lock().remove(&m.query_id) {
                    let _ = reply.send(m);
                }
            }
        });
        Ok(Self { queries, pending, next_id: AtomicU64::new(1) })
    }

    /// The answer to a query for `locals` in the demo's keyspace, or None when none came
    /// within `deadline` (or the stream's queue was full).
    pub async fn ask(&self, locals: &[u64], deadline: Duration) -> Option<Match> {
        let query_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        self.pending.lock().insert(query_id, reply);
        let q = Query { query_id, keyspace: Some(keyspace()), content_hashes: locals.to_vec() };
        let asked = self.queries.try_send(q).is_ok();
        let m = match asked {
            true => tokio::time::timeout(deadline, answer).await.ok().and_then(Result::ok),
            false => None,
        };
        self.pending.lock().remove(&query_id);
        m
    }
}

/// One gateway's SMG connection: a `Subscribe` stream and a `Publish` stream.
pub struct SmgGateway {
    subscriber: SmgSubscriber,
    placements: mpsc::Sender<Update>,
    counters: Arc<Counters>,
}

impl SmgGateway {
    pub async fn connect(endpoint: &str, counters: Arc<Counters>) -> anyhow::Result<Self> {
        let subscriber = SmgSubscriber::connect(endpoint).await?;
        let placements = publish_stream(endpoint, counters.clone()).await?;
        Ok(Self { subscriber, placements, counters })
    }

    /// `(worker, matched blocks)` per holder, or None when no answer came within `deadline`.
    pub async fn query(&self, locals: &[u64], deadline: Duration) -> Option<Vec<(u32, u32)>> {
        let m = self.subscriber.ask(locals, deadline).await?;
        Some(m.scores.iter().filter_map(|s| Some((worker_of(&s.holder)?, s.matched_blocks))).collect())
    }

    /// The gateway's placement: `locals` now (probably) reside on worker `w`.
    pub fn place(&self, w: u32, locals: &[u64]) {
        let mut prev = None;
        let blocks = locals
            .iter()
            .map(|&c| {
                let seq_hash = prev.map_or(c, |p| chain_prefix_hash(p, c));
                prev = Some(seq_hash);
                Block { seq_hash, content_hash: c }
            })
            .collect();
        let u = Update {
            keyspace: Some(keyspace()),
            holder: holder(w),
            epoch: 1,
            seq: 0,
            events: vec![Event { kind: Some(event::Kind::Stored(Stored { parent_seq_hash: None, blocks })) }],
            ..Default::default()
        };
        // Fire and forget, as SMG's gateway publishes placements: dropped when the queue is full.
        if self.placements.try_send(u).is_ok() {
            self.counters.sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names_round_trip() {
        assert_eq!(worker_of(&holder(7)), Some(7));
        assert_eq!(worker_of("http://other:8000"), None);
    }
}
