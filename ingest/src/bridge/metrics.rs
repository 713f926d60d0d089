//! The bridge's counters: plain atomics (one [`BridgeMetrics`] per engine stream), so an
//! exporter can register them later; [`BridgeMetrics::snapshot`] reads them all at once and the
//! bridge logs that periodically.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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

#[derive(Debug, Default)]
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
    pub publish_errors: AtomicU64,
    /// Sum and max of publish latency (enqueue → broker ack), microseconds.
    pub publish_latency_us_sum: AtomicU64,
    pub publish_latency_us_max: AtomicU64,
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

    pub fn record_latency(&self, us: u64) {
        self.publish_latency_us_sum.fetch_add(us, Relaxed);
        self.publish_latency_us_max.fetch_max(us, Relaxed);
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
            ("publish_errors", g(&self.publish_errors)),
            ("publish_latency_us_sum", g(&self.publish_latency_us_sum)),
            ("publish_latency_us_max", g(&self.publish_latency_us_max)),
        ]
    }

    /// One counter by its snapshot name (tests).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.snapshot().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

type LiveEntry = (u64, String, std::sync::Arc<BridgeMetrics>);

fn live_table() -> &'static std::sync::Mutex<Vec<LiveEntry>> {
    static LIVE: std::sync::OnceLock<std::sync::Mutex<Vec<LiveEntry>>> = std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
}

/// Registers a running engine stream's counters for exporters (the bridge's `/metrics`).
pub fn register_live(worker: u64, endpoint: &str, m: std::sync::Arc<BridgeMetrics>) {
    if let Ok(mut t) = live_table().lock() {
        t.push((worker, endpoint.to_string(), m));
    }
}

/// Every registered stream's counters, as Prometheus text (`prefixlog_bridge_<counter>`,
/// labelled by worker and endpoint).
pub fn render_prometheus() -> String {
    use std::fmt::Write;
    let t = live_table().lock().map(|t| t.clone()).unwrap_or_default();
    type Snap = (u64, String, Vec<(&'static str, u64)>);
    let snaps: Vec<Snap> = t.iter().map(|(w, e, m)| (*w, e.clone(), m.snapshot())).collect();
    let mut out = String::new();
    let names: Vec<&'static str> =
        snaps.first().map(|s| s.2.iter().map(|(n, _)| *n).collect()).unwrap_or_default();
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(out, "# TYPE prefixlog_bridge_{name} counter");
        for (w, e, s) in &snaps {
            let v = s.get(i).map_or(0, |x| x.1);
            let _ = writeln!(out, "prefixlog_bridge_{name}{{worker=\"{w}\",endpoint=\"{e}\"}} {v}");
        }
    }
    out
}
