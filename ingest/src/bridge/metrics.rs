//! The bridge's metrics: plain atomic counters and a publish-latency histogram per engine
//! stream ([`BridgeMetrics`]); [`BridgeMetrics::snapshot`] reads the counters at once (the
//! bridge logs that periodically), and [`BridgeCollector`] exports every stream's metrics to a
//! Prometheus registry as `prefixlog_bridge_<counter>_total{worker,endpoint}` and
//! `prefixlog_bridge_publish_latency_seconds{worker,endpoint}`.

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{LabelPair, MetricFamily};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Why a decoded event was not published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// Token count is not `hashes × keyspace block size` (or the event's block size differs).
    TokenCount,
    /// Token ids not representable as u32 (bigram pairs, negative, too large).
    Tokens,
    /// The parent's local hash is unknown to the bridge (stored before it started, or lost in a
    /// gap): the blocks cannot be hashed canonically.
    UnknownParent,
    /// A storage medium other than the GPU cache (offload tiers are not indexed).
    Medium,
    /// A known event type with a missing or mistyped field.
    Malformed,
    /// The engine's hash covers more than the token ids and the LoRA adapter's name (cache
    /// salt, multimodal inputs, or an adapter given only by integer id): the same tokens are a
    /// different cache entry, which the canonical token hash cannot tell apart, so indexing it
    /// could credit blocks the worker does not hold. (Adapters given by name are indexed under
    /// their own namespace.)
    Namespaced,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::TokenCount,
        Refusal::Tokens,
        Refusal::UnknownParent,
        Refusal::Medium,
        Refusal::Malformed,
        Refusal::Namespaced,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TokenCount => "token_count",
            Refusal::Tokens => "tokens",
            Refusal::UnknownParent => "unknown_parent",
            Refusal::Medium => "medium",
            Refusal::Malformed => "malformed",
            Refusal::Namespaced => "namespaced",
        }
    }
}

#[derive(Debug)]
pub struct BridgeMetrics {
    /// ZeroMQ messages received (live and replayed).
    pub messages_received: AtomicU64,
    /// Messages that could not be decoded at all (bad frames, not msgpack, not a batch).
    pub messages_undecodable: AtomicU64,
    /// Messages skipped as duplicates (same seq and payload already handled).
    pub messages_duplicate: AtomicU64,
    /// Events inside decoded batches.
    pub events_received: AtomicU64,
    /// Events translated and published.
    pub events_published: AtomicU64,
    /// Events of a type this build does not know (ignored).
    pub events_unknown_type: AtomicU64,
    /// Unknown fields ignored (batch and event level).
    pub fields_ignored: AtomicU64,
    pub refused_token_count: AtomicU64,
    pub refused_tokens: AtomicU64,
    pub refused_unknown_parent: AtomicU64,
    pub refused_medium: AtomicU64,
    pub refused_malformed: AtomicU64,
    pub refused_namespaced: AtomicU64,
    /// Sequence gaps detected.
    pub gaps: AtomicU64,
    /// Gaps that could not be filled and were published (`gap_before`).
    pub gaps_published: AtomicU64,
    /// Replay requests answered (end marker received).
    pub replays_ok: AtomicU64,
    /// Replay requests that failed or timed out.
    pub replays_failed: AtomicU64,
    /// Batches recovered through replay.
    pub replayed_batches: AtomicU64,
    /// New epochs started (engine restarts).
    pub epochs: AtomicU64,
    /// Subscriber reconnects (idle or error).
    pub reconnects: AtomicU64,
    /// Records published.
    pub batches_published: AtomicU64,
    /// Records carrying more blocks than replicas accept by default (they will skip them).
    pub batches_oversized: AtomicU64,
    /// Batches not published because another engine stream of this bridge writes their feed
    /// (same worker and resolved dp rank).
    pub batches_feed_taken: AtomicU64,
    pub publish_errors: AtomicU64,
    /// Publish latency (enqueue → broker acknowledgement), seconds.
    pub publish_latency: prometheus::Histogram,
}

impl Default for BridgeMetrics {
    fn default() -> Self {
        let z = || AtomicU64::new(0);
        Self {
            messages_received: z(),
            messages_undecodable: z(),
            messages_duplicate: z(),
            events_received: z(),
            events_published: z(),
            events_unknown_type: z(),
            fields_ignored: z(),
            refused_token_count: z(),
            refused_tokens: z(),
            refused_unknown_parent: z(),
            refused_medium: z(),
            refused_malformed: z(),
            refused_namespaced: z(),
            gaps: z(),
            gaps_published: z(),
            replays_ok: z(),
            replays_failed: z(),
            replayed_batches: z(),
            epochs: z(),
            reconnects: z(),
            batches_published: z(),
            batches_oversized: z(),
            batches_feed_taken: z(),
            publish_errors: z(),
            publish_latency: prometheus::Histogram::with_opts(latency_opts()).expect("valid histogram"),
        }
    }
}

fn latency_opts() -> prometheus::HistogramOpts {
    // 100 µs .. ~13 s, doubling.
    let buckets = prometheus::exponential_buckets(1e-4, 2.0, 18).expect("valid buckets");
    prometheus::HistogramOpts::new(
        "prefixlog_bridge_publish_latency_seconds",
        "Publish latency of a bridge's records, enqueue to broker acknowledgement",
    )
    .buckets(buckets)
}

impl BridgeMetrics {
    pub fn refused(&self, r: Refusal) -> &AtomicU64 {
        match r {
            Refusal::TokenCount => &self.refused_token_count,
            Refusal::Tokens => &self.refused_tokens,
            Refusal::UnknownParent => &self.refused_unknown_parent,
            Refusal::Medium => &self.refused_medium,
            Refusal::Malformed => &self.refused_malformed,
            Refusal::Namespaced => &self.refused_namespaced,
        }
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    pub fn record_latency(&self, d: std::time::Duration) {
        self.publish_latency.observe(d.as_secs_f64());
    }

    /// Every counter as (name, value), for logs and exporters.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Relaxed);
        vec![
            ("messages_received", g(&self.messages_received)),
            ("messages_undecodable", g(&self.messages_undecodable)),
            ("messages_duplicate", g(&self.messages_duplicate)),
            ("events_received", g(&self.events_received)),
            ("events_published", g(&self.events_published)),
            ("events_unknown_type", g(&self.events_unknown_type)),
            ("fields_ignored", g(&self.fields_ignored)),
            ("refused_token_count", g(&self.refused_token_count)),
            ("refused_tokens", g(&self.refused_tokens)),
            ("refused_unknown_parent", g(&self.refused_unknown_parent)),
            ("refused_medium", g(&self.refused_medium)),
            ("refused_malformed", g(&self.refused_malformed)),
            ("refused_namespaced", g(&self.refused_namespaced)),
            ("gaps", g(&self.gaps)),
            ("gaps_published", g(&self.gaps_published)),
            ("replays_ok", g(&self.replays_ok)),
            ("replays_failed", g(&self.replays_failed)),
            ("replayed_batches", g(&self.replayed_batches)),
            ("epochs", g(&self.epochs)),
            ("reconnects", g(&self.reconnects)),
            ("batches_published", g(&self.batches_published)),
            ("batches_oversized", g(&self.batches_oversized)),
            ("batches_feed_taken", g(&self.batches_feed_taken)),
            ("publish_errors", g(&self.publish_errors)),
        ]
    }

    /// One counter by its snapshot name (tests).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.snapshot().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Exports every running engine stream's metrics (register one per process; the bridge adds
/// streams as it starts them).
#[derive(Default)]
pub struct BridgeCollector {
    streams: Mutex<Vec<(u64, String, Arc<BridgeMetrics>)>>,
}

impl BridgeCollector {
    pub fn add(&self, worker: u64, endpoint: &str, m: Arc<BridgeMetrics>) {
        self.streams.lock().push((worker, endpoint.to_string(), m));
    }

    /// Registers it in `registry` (shared: the bridge keeps adding to it).
    pub fn register(self: &Arc<Self>, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(Exported(self.clone())))
    }

    fn counters() -> Vec<prometheus::IntCounterVec> {
        BridgeMetrics::default()
            .snapshot()
            .into_iter()
            .map(|(name, _)| {
                let opts = prometheus::Opts::new(
                    format!("prefixlog_bridge_{name}_total"),
                    format!("Bridge: {}", name.replace('_', " ")),
                );
                prometheus::IntCounterVec::new(opts, &["worker", "endpoint"]).expect("valid metric")
            })
            .collect()
    }

    fn latency_desc() -> prometheus::HistogramVec {
        prometheus::HistogramVec::new(latency_opts(), &["worker", "endpoint"]).expect("valid metric")
    }
}

struct Exported(Arc<BridgeCollector>);

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value.to_string());
    l
}

impl Collector for Exported {
    fn desc(&self) -> Vec<&Desc> {
        static DESCS: std::sync::OnceLock<Vec<Desc>> = std::sync::OnceLock::new();
        DESCS
            .get_or_init(|| {
                let mut d: Vec<Desc> =
                    BridgeCollector::counters().iter().flat_map(|c| c.desc().into_iter().cloned()).collect();
                d.extend(BridgeCollector::latency_desc().desc().into_iter().cloned());
                d
            })
            .iter()
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let streams = self.0.streams.lock().clone();
        let counters = BridgeCollector::counters();
        let mut latency: Option<MetricFamily> = None;
        for (w, e, m) in &streams {
            let w = w.to_string();
            for (c, (_, v)) in counters.iter().zip(m.snapshot()) {
                c.with_label_values(&[w.as_str(), e.as_str()]).inc_by(v);
            }
            // The histogram has no labels of its own: add this stream's.
            for mut mf in m.publish_latency.collect() {
                for metric in mf.mut_metric() {
                    let mut labels = metric.take_label();
                    labels.extend([label("endpoint", e), label("worker", &w)]);
                    metric.set_label(labels);
                }
                match latency.as_mut() {
                    Some(all) => all.mut_metric().extend(mf.take_metric()),
                    None => latency = Some(mf),
                }
            }
        }
        let mut out: Vec<MetricFamily> = counters.iter().flat_map(|c| c.collect()).collect();
        out.extend(latency);
        out
    }
}
