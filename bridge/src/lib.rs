//! The engine bridge: vLLM / SGLang KV events over ZeroMQ → log records.
//!
//! One [`EngineBridge`] per engine stream (an endpoint of one worker's data-parallel rank):
//! a ZeroMQ SUB socket receives 3-frame messages ([`wire`] decodes both msgpack layouts), a
//! [`session::Session`] classifies each sequence number and translates the events (canonical
//! local hashes from token ids and, for vLLM's `extra_keys`, the keys [`namespace`] derives),
//! and every engine message becomes one `KvEventBatch` record
//! published through the [`prefixlog_ingest::Publisher`], keyed by worker.
//!
//! - Gaps (a bridge joining a running engine included): when a replay endpoint is configured
//!   the missed messages are requested from the engine's ROUTER socket and applied in order
//!   before the message that revealed the gap; where replay cannot cover it (none configured,
//!   a failed replay, a buffer that no longer reaches back), the worker's state is cleared
//!   through the log — a new epoch — and the stream starts over at the first message it has.
//!   A message whose events cannot all be read (undecodable, an unknown event type) does the
//!   same. The worker is never left gapped and never credited with what may be gone.
//! - Restarts: a sequence number that goes back starts a new epoch (replicas clear the
//!   holder); so does, with a replay socket, a replayed copy of the last handled message that
//!   differs from it (an engine that restarted and got past the old sequence number unseen).
//!   The first epoch is the bridge's start time in ms, so a restarted bridge also supersedes
//!   what an earlier bridge published.
//! - Publishing: records are handed to the producer in sequence order as soon as they are
//!   translated and acknowledged in the background (`publish_window` in flight per engine).
//! - Lifecycle: `worker-added` on start, `worker-removed` on clean shutdown if asked. A silent
//!   engine publishes nothing: staleness is the replica's policy. The `worker-added` metadata
//!   names the worker for gateways ([`worker_metadata`]): its serving URL
//!   ([`META_SERVING_URL`]), pod ([`META_POD`]) and the ZeroMQ endpoints it is fed from
//!   ([`META_KV_EVENTS`]), returned by `ListWorkers`.
//! - Transport: this crate's own bounded ZMTP 3.x client ([`zmtp`]: SUB for the events, DEALER
//!   for replay; no libzmq). No frame header makes it reserve more than `max_frame_bytes`; a
//!   peer over a cap, breaking the protocol or not answering heartbeats loses its connection,
//!   counted by why, and the stream reconnects with back-off ([`subscribe`]); messages lost
//!   meanwhile are a sequence gap, handled as above. A subscription silent for
//!   `idle_reconnect` is also re-established (a fallback: heartbeats find a dead peer first).
//!
//! Modules: [`zmtp`] (the transport), [`subscribe`] (the stream's connection), [`wire`]
//! (message decoding), [`session`] (sequence policy and translation), [`namespace`] (extra
//! keys), [`engines`] (several engine streams, feed claims), [`naming`] (worker ids and
//! metadata), [`replay`] (asking an engine for missed messages), `recovery` (gaps, restarts and
//! lost tails recovered by replay, or the stream started over), [`scheme`] (hash schemes),
//! [`metrics`]; [`lmcache`] is the LMCache bridge (LMCache's Kafka cache-event stream →
//! records).

pub mod engines;
pub mod lmcache;
pub mod metrics;
pub mod namespace;
pub mod naming;
mod recovery;
pub mod replay;
pub mod scheme;
pub mod session;
pub mod subscribe;
pub mod wire;
pub mod zmtp;

use bytes::Bytes;
use metrics::BridgeMetrics;
pub use naming::{worker_id_of_pod, worker_metadata, META_KV_EVENTS, META_POD, META_SERVING_URL};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{PublishError, Publisher};
use prefixlog_state::record::{KvBatch, KvOp, Lifecycle};
use prefixlog_state::Landed;
pub use replay::{request_replay, Replayed};
use session::{payload_digest, Arrival, Session};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// One engine stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// The engine's PUB endpoint (e.g. `tcp://10.0.0.5:5557`).
    pub endpoint: String,
    /// The engine's replay ROUTER endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    pub worker: u64,
    /// Overrides the batch's `data_parallel_rank` (default: the batch's, else 0).
    pub dp_rank: Option<u32>,
    /// ZeroMQ subscription prefix (vLLM's `topic`, default empty: everything).
    pub topic: String,
}

impl EngineSpec {
    /// The stream this spec subscribes to, for logs and feed claims: the endpoint, with the
    /// topic prefix when there is one (one endpoint may carry streams under disjoint topics).
    pub fn stream(&self) -> String {
        if self.topic.is_empty() {
            self.endpoint.trim().to_string()
        } else {
            format!("{} topic {:?}", self.endpoint.trim(), self.topic)
        }
    }
}

#[derive(Clone, Debug)]
pub struct BridgeOptions {
    pub keyspace: KeyspaceId,
    /// Epoch of the first session (default: now in ms).
    pub start_epoch: u64,
    /// Re-subscribe after this long without a message.
    pub idle_reconnect: Duration,
    /// Ask the replay socket for what followed the last message after this long without one
    /// (zero: never): a lost tail is found without waiting for the engine's next message.
    pub tail_probe: Duration,
    /// Give up a replay request after this long (then start the stream over).
    pub replay_timeout: Duration,
    /// Most bytes one replay answer may bring (frames of every message together); past it the
    /// replay fails and the stream starts over.
    pub max_replay_bytes: usize,
    /// Most bytes of one ZeroMQ frame (a message: this plus [`zmtp::codec::MESSAGE_ROOM`]);
    /// a peer declaring more loses its connection before anything is reserved.
    pub max_frame_bytes: usize,
    /// Send a heartbeat (ZMTP 3.1 PING) after this long without traffic (zero: never).
    pub heartbeat_interval: Duration,
    /// Drop a connection with no traffic this long after a heartbeat; also bounds connecting,
    /// the handshake and each write.
    pub heartbeat_timeout: Duration,
    /// Log the counters this often (zero: never).
    pub log_interval: Duration,
    /// Records per engine handed to the producer and not yet acknowledged; publishing waits
    /// beyond it. 1 = one record at a time.
    pub publish_window: usize,
    /// Published in each worker's `WorkerAdded` record (besides [`META_KV_EVENTS`], `model`
    /// and `block_size`, which the bridge adds): what `ListWorkers` reports, e.g.
    /// [`META_POD`].
    pub worker_metadata: std::collections::BTreeMap<String, String>,
    /// Each worker's serving URL (where gateways send its requests), published as its
    /// [`META_SERVING_URL`] metadata.
    pub serving_urls: std::collections::BTreeMap<u64, String>,
}

impl BridgeOptions {
    pub fn new(keyspace: KeyspaceId) -> Self {
        Self {
            keyspace,
            start_epoch: now_ms(),
            idle_reconnect: Duration::from_secs(30),
            replay_timeout: Duration::from_secs(5),
            tail_probe: Duration::from_secs(2),
            max_replay_bytes: 256 << 20,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(15),
            log_interval: Duration::from_secs(60),
            publish_window: 256,
            worker_metadata: Default::default(),
            serving_urls: Default::default(),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The default frame cap: 64 MiB, some 30 times the largest batch a vLLM or SGLang step
/// publishes (a step stores at most its scheduled tokens, ~5 bytes each in msgpack, plus a
/// hash per block: a 64k-token step with a 100k-block eviction is about 2 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;

/// One engine stream's bridge.
pub struct EngineBridge {
    spec: EngineSpec,
    opts: BridgeOptions,
    publisher: Publisher,
    metrics: Arc<BridgeMetrics>,
    session: Session,
    /// Records handed to the producer, awaited in order by the acker task.
    acks: Option<mpsc::Sender<InFlight>>,
    acker: Option<tokio::task::JoinHandle<()>>,
    /// Shared with the other engines of this bridge (see [`engines::FeedClaims`]).
    feeds: Arc<engines::FeedClaims>,
    /// [`EngineSpec::stream`], computed once: this stream's name in feed claims and logs.
    stream: String,
    /// The feed rank this stream holds (checked against `feeds` only when it changes).
    claimed: Option<u32>,
    /// Re-subscribed since the last message: the engine may have restarted meanwhile, and its
    /// new numbering may line up with ours (no gap, no sequence going back); the next message
    /// is checked against the replay socket ([`Self::probe_restart`]).
    resubscribed: bool,
    /// The dp rank of this stream's last decoded batch: where a message that cannot be decoded
    /// (and so names no rank) publishes its gap, the feed it would have gone to.
    last_dp: Option<u32>,
}

type Pending = Pin<Box<dyn Future<Output = Result<Landed, PublishError>> + Send>>;

/// A record enqueued in the producer, waiting for the broker's acknowledgement.
struct InFlight {
    ack: Pending,
    seq: u64,
    events: usize,
    start: Instant,
}

/// Awaits acknowledgements in publish order and counts them.
async fn acker(mut rx: mpsc::Receiver<InFlight>, m: Arc<BridgeMetrics>, worker: u64) {
    while let Some(f) = rx.recv().await {
        match f.ack.await {
            Ok(_) => {
                m.record_latency(f.start.elapsed());
                BridgeMetrics::inc(&m.batches_published);
                BridgeMetrics::add(&m.events_published, f.events as u64);
            }
            Err(e) => {
                // Later records still land: replicas see the missing seq as a gap.
                BridgeMetrics::inc(&m.publish_errors);
                tracing::error!(worker, seq = f.seq, error = %e, "bridge: publish failed");
            }
        }
    }
}

impl EngineBridge {
    /// Must be called inside a tokio runtime (it starts the acknowledgement task).
    pub fn new(spec: EngineSpec, opts: BridgeOptions, publisher: Publisher) -> Self {
        let session =
            Session::new(opts.keyspace.block_size, opts.start_epoch).with_scheme(opts.keyspace.scheme);
        let metrics = Arc::new(BridgeMetrics::default());
        let (tx, rx) = mpsc::channel(opts.publish_window.max(1));
        let acker = tokio::spawn(acker(rx, metrics.clone(), spec.worker));
        let stream = spec.stream();
        Self {
            spec,
            opts,
            publisher,
            metrics,
            session,
            acks: Some(tx),
            acker: Some(acker),
            feeds: Arc::default(),
            stream,
            claimed: None,
            resubscribed: false,
            last_dp: None,
        }
    }

    /// Feeds claimed together with other engines (`run` gives all of its engines one set).
    pub fn with_feed_claims(mut self, feeds: Arc<engines::FeedClaims>) -> Self {
        self.feeds = feeds;
        self
    }

    pub fn metrics(&self) -> Arc<BridgeMetrics> {
        self.metrics.clone()
    }

    pub fn spec(&self) -> &EngineSpec {
        &self.spec
    }

    /// Subscribes and forwards until `stop` turns true, then waits for every record's
    /// acknowledgement.
    pub async fn run(mut self, stop: watch::Receiver<bool>) -> anyhow::Result<()> {
        let r = self.subscribe_loop(stop).await;
        self.acks = None;
        if let Some(a) = self.acker.take() {
            a.await?;
        }
        r
    }

    fn log_metrics(&self) {
        let nonzero: Vec<String> = self
            .metrics
            .snapshot()
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        tracing::info!(
            worker = self.spec.worker,
            epoch = self.session.epoch(),
            last_seq = ?self.session.last_seq(),
            "bridge metrics: {}",
            nonzero.join(" ")
        );
    }

    /// Handles one live message.
    pub async fn handle(&mut self, frames: Vec<Bytes>) {
        let m = &self.metrics;
        BridgeMetrics::inc(&m.messages_received);
        let [_, seq, payload] = &frames[..] else {
            BridgeMetrics::inc(&m.messages_undecodable);
            tracing::warn!(frames = frames.len(), "bridge: message without 3 frames skipped");
            return;
        };
        let Ok(seq) = wire::decode_seq(seq) else {
            BridgeMetrics::inc(&m.messages_undecodable);
            tracing::warn!("bridge: message with a bad sequence frame skipped");
            return;
        };
        let digest = payload_digest(payload);
        let from = loop {
            match self.session.classify(seq, digest) {
                Arrival::InOrder => break None,
                Arrival::Duplicate => {
                    BridgeMetrics::inc(&self.metrics.messages_duplicate);
                    return;
                }
                Arrival::Restart => {
                    BridgeMetrics::inc(&self.metrics.epochs);
                    tracing::info!(
                        worker = self.spec.worker,
                        seq,
                        last = ?self.session.last_seq(),
                        new_epoch = self.session.epoch() + 1,
                        "bridge: engine restarted (sequence went back), new epoch"
                    );
                    self.session.restart();
                }
                Arrival::Gap { from } => break Some(from),
            }
        };
        if let Some(from) = from {
            self.fill_gap(from, seq).await;
        } else if std::mem::take(&mut self.resubscribed) {
            self.probe_restart(seq).await;
        }
        self.process(seq, payload).await;
    }

    /// Decodes, translates and publishes message `seq` (the next one of the session). A message
    /// whose events could not all be read (undecodable, an unknown event type, a malformed event:
    /// any of them may have been a removal) starts a new epoch and is published as its first,
    /// empty record, which clears the worker's feed on every replica.
    async fn process(&mut self, seq: u64, payload: &[u8]) {
        let m = self.metrics.clone();
        let digest = payload_digest(payload);
        let (batch, undecodable) = match wire::decode_batch(payload) {
            Ok(b) => (b, false),
            Err(e) => {
                BridgeMetrics::inc(&m.messages_undecodable);
                tracing::warn!(
                    worker = self.spec.worker,
                    seq,
                    reason = e.as_str(),
                    "bridge: undecodable payload"
                );
                (wire::Batch::default(), true)
            }
        };
        let accepted = self.session.accept(seq, digest, &batch, &m);
        let ops = if undecodable || accepted.lost {
            BridgeMetrics::inc(&m.resets_lost);
            tracing::warn!(
                worker = self.spec.worker,
                seq,
                new_epoch = self.session.epoch() + 1,
                "bridge: a message's events could not all be read (any might have been a removal); clearing the worker's state through the log (new epoch) and starting over"
            );
            self.session.reset_after(seq, digest);
            Vec::new()
        } else {
            accepted.ops
        };
        let blocks: usize = ops
            .iter()
            .map(|o| match o {
                KvOp::Stored { blocks, .. } => blocks.len(),
                KvOp::Removed { exts, .. } => exts.len(),
                KvOp::Cleared { .. } => 0,
            })
            .sum();
        if blocks > prefixlog_state::StateSettings::default().max_blocks_per_record as usize {
            // Replicas with the default limit skip it (and then report the feed gapped).
            BridgeMetrics::inc(&m.batches_oversized);
            tracing::error!(
                worker = self.spec.worker,
                seq,
                blocks,
                "bridge: batch over the replicas' default per-record block limit"
            );
        }
        // A decoded batch's feed is the configured rank, else the batch's, else 0. An
        // undecodable message names no rank: its gap goes to this stream's feed as far as the
        // stream has told (the configured rank, else its last batch's); with nothing told yet,
        // to rank 0 without claiming it (a guess must not take a feed from the stream that
        // really writes it).
        let told = if undecodable {
            self.spec.dp_rank.or(self.last_dp)
        } else {
            Some(self.spec.dp_rank.or(batch.dp_rank).unwrap_or(0))
        };
        if !undecodable {
            self.last_dp = told;
        }
        let dp = told.unwrap_or(0);
        let taken = match told {
            Some(dp) if self.claimed != Some(dp) => {
                self.feeds.claim(self.spec.worker, dp, &self.stream).err()
            }
            _ => None,
        };
        if taken.is_none() && told.is_some() {
            self.claimed = told;
        }
        if let Some(owner) = taken {
            // Two streams in one feed: their sequences would read as duplicates and gaps.
            BridgeMetrics::inc(&m.batches_feed_taken);
            tracing::error!(
                worker = self.spec.worker,
                dp_rank = dp,
                seq,
                stream = %self.stream,
                %owner,
                "bridge: not published: this feed (worker, dp rank) is written by another engine stream of this bridge; give each engine its own worker id or dp="
            );
            return;
        }
        let lanes = self.session.take_pending_lanes();
        self.publish(dp, seq, &ops, lanes).await;
    }

    /// Hands the record to the producer now (records enter the partition queue in seq order)
    /// and queues its acknowledgement for the acker; waits only when `publish_window` records
    /// are unacknowledged.
    async fn publish(&self, dp: u32, seq: u64, ops: &[KvOp], lanes: Vec<prefixlog_state::LaneMeta>) {
        let (p, ks, worker, epoch, owned) = (
            self.publisher.clone(),
            self.opts.keyspace.clone(),
            self.spec.worker,
            self.session.epoch(),
            ops.to_vec(),
        );
        // Log time is the bridge's clock (None = now), never the engine's `ts`: a skewed engine
        // clock would move the partition's log time for every worker on it.
        let mut ack: Pending = Box::pin(async move {
            let (events, lanes) = (&owned[..], &lanes[..]);
            // `gap_before` stays false: a gap is filled by replay or starts a new epoch.
            let batch =
                KvBatch { keyspace: &ks, worker, dp_rank: dp, epoch, seq, gap_before: false, events, lanes };
            p.publish_kv_batch(&batch, None).await
        });
        // The first poll runs `FutureProducer::send` up to the enqueue (synchronous), so the
        // order of records in the partition is the order of these calls; librdkafka's
        // idempotent producer keeps it through retries. (A full producer queue would make the
        // enqueue retry later, out of order: the window keeps this bridge far below librdkafka's
        // 100,000-message queue.)
        let start = Instant::now();
        if let Poll::Ready(r) = ack.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            ack = Box::pin(std::future::ready(r));
        }
        let f = InFlight { ack, seq, events: ops.len(), start };
        if let Some(tx) = &self.acks {
            if tx.send(f).await.is_err() {
                tracing::error!(worker, seq, "bridge: acknowledgement task ended");
            }
        }
    }
}

/// Runs one bridge per engine until `stop` turns true: publishes `worker-added` for each worker
/// first and, with `remove_on_exit`, `worker-removed` after. Every engine's metrics go to
/// `exported` as it starts; returns them too.
pub async fn run(
    engines: Vec<EngineSpec>,
    opts: BridgeOptions,
    publisher: Publisher,
    remove_on_exit: bool,
    stop: watch::Receiver<bool>,
    exported: &metrics::BridgeCollector,
) -> anyhow::Result<Vec<(EngineSpec, Arc<BridgeMetrics>)>> {
    engines::check_engines(&engines)?;
    for e in &engines {
        for ep in std::iter::once(&e.endpoint).chain(&e.replay_endpoint) {
            ep.parse::<zmtp::Endpoint>().map_err(|err| anyhow::anyhow!("worker {}: {err}", e.worker))?;
        }
    }
    let mut workers: Vec<u64> = engines.iter().map(|e| e.worker).collect();
    workers.sort_unstable();
    workers.dedup();
    for &w in &workers {
        let metadata = worker_metadata(&opts, w, engines.iter().filter(|e| e.worker == w));
        publisher.publish_lifecycle(w, &Lifecycle::Added { metadata }).await?;
    }
    let mut tasks = Vec::new();
    let mut out = Vec::new();
    let feeds = Arc::new(engines::FeedClaims::default());
    for spec in engines {
        let b =
            EngineBridge::new(spec.clone(), opts.clone(), publisher.clone()).with_feed_claims(feeds.clone());
        exported.add(spec.worker, &spec.endpoint, b.metrics());
        out.push((spec, b.metrics()));
        tasks.push(tokio::spawn(b.run(stop.clone())));
    }
    for t in tasks {
        t.await??;
    }
    if remove_on_exit {
        for &w in &workers {
            publisher.publish_lifecycle(w, &Lifecycle::Removed).await?;
        }
    }
    publisher.flush(Duration::from_secs(10))?;
    Ok(out)
}
